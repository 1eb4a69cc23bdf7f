"""chronolog: an event-sourced job scheduler on an append-only log."""

__version__ = "0.1.0"
