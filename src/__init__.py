"""chronolog: an event-sourced job scheduler on an append-only log."""

