-- 0011_hot_updates: a run's claim and its publish are heap-only (HOT) updates
-- (docs/design.md §9, "Bytes per run").
--
-- A run is inserted when it is materialized, then updated at its claim and at its publish;
-- its attempt is inserted at the claim and updated when it ends. An UPDATE is HOT (no new
-- entry in any index; the old version pruned within its page, without a vacuum) only if it
-- changes no column an index holds or its predicate names, and the new version fits in the
-- old one's page. After 0010 the publish still set indexed columns: runs.finished_at
-- (runs_finished, runs_finished_by_tenant) and attempts.outcome (the predicate of
-- attempts_open), so every run left a dead version in each heap and a second entry in every
-- index of both tables until a vacuum. Now:
--
-- * runs_finished and runs_finished_by_tenant go: retention finds a tenant's expired runs
--   through runs_by_tenant (tenant, scheduled_at, run_id), as a finished run's finished_at
--   is never before its scheduled_at (a run does not start before its instant), so
--   `finished_at < cutoff` implies `scheduled_at < cutoff`, a range of that index; whole
--   days still go by dropping their partitions;
-- * attempts_open goes: the open attempts (no outcome yet) and their lease ends are
--   open_attempts, kept by the projector in the batch's transaction as ready_runs (0005)
--   keeps the READY runs; /metrics counts the expired leases there;
-- * the day partitions of runs and attempts leave room in each page for the updated
--   version of the rows inserted in it (fillfactor; the partitions made from now on get it
--   where they are created, chronolog.projections.partitions), so an update finds room in
--   its row's page; a full page makes an update non-HOT whatever the indexes.

DROP INDEX IF EXISTS runs_finished_by_tenant;
DROP INDEX IF EXISTS runs_finished;
DROP INDEX IF EXISTS attempts_open;

CREATE TABLE IF NOT EXISTS open_attempts (
    run_id      text        NOT NULL,
    attempt     integer     NOT NULL,
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (run_id, attempt)
);
CREATE INDEX IF NOT EXISTS open_attempts_lease ON open_attempts (lease_until);
INSERT INTO open_attempts (run_id, attempt, lease_until)
SELECT run_id, attempt, lease_until FROM attempts
 WHERE outcome IS NULL AND lease_until IS NOT NULL
ON CONFLICT DO NOTHING;

-- the rows already written keep their pages; the fillfactor applies to the pages filled
-- from now on
DO $$
DECLARE part regclass;
BEGIN
    FOR part IN SELECT inhrelid::regclass FROM pg_inherits
                 WHERE inhparent IN ('runs'::regclass, 'attempts'::regclass) LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 45)', part);
    END LOOP;
END $$;
