"""Pure domain: ids, time, recurrence, messages and the codec (no I/O)."""
