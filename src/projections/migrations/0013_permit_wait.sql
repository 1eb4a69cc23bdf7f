-- 0013_permit_wait: a READY run that waits for a permit of its concurrency key shows it
-- (docs/tour.md, "Concurrency limits"): runs.permit_wait holds the key and its limit as
-- the run's RunAwaitsPermit recorded them, and is cleared when the run is granted the
-- permit or gives it back.
--
-- The new column has no default: adding it rewrites nothing.

ALTER TABLE runs ADD COLUMN IF NOT EXISTS permit_wait jsonb;
