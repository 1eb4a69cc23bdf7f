"""One router per resource: schedules, runs, workers, dlq (dead letters), preview, ops (health,
metrics)."""
