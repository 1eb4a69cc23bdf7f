"""The audit: a pure checker of the log's guarantees over a sequence of events (no I/O)."""
