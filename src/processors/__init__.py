"""Partition-owning processors: ownership, restore, timers, batching, transactions."""
