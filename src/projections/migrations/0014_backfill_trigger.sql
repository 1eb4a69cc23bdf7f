-- 0014_backfill_trigger: a run's trigger may be 'backfill' (a backfill's run, docs/design.md
-- §22) besides 'schedule' and 'manual'.
--
-- The check is replaced whole; adding it back reads every row of runs once (no row
-- changes, no rewrite).

ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_trigger_check;
ALTER TABLE runs ADD CONSTRAINT runs_trigger_check
    CHECK (trigger IN ('schedule', 'manual', 'backfill'));
