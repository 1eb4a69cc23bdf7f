"""One router per resource: schedules, runs, workers, preview, ops (health, metrics)."""
