"""The EventLog port and its adapters: SqliteEventLog, KafkaEventLog, MemoryEventLog (tests)."""
