-- 0011_hot_updates: a run's claim and its publish change no indexed column, so each is a
-- heap-only (HOT) update when its page has room, and otherwise leaves index entries that
-- PostgreSQL can delete bottom-up (docs/design.md §9, "Bytes per run").
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
-- * the partitions keep the default fillfactor (100): one that leaves room in each page for
--   the updated versions makes the publish HOT, but the rows of a page are published in one
--   batch, so the page must hold both versions of each of them, and once the old ones are
--   pruned the page stays too full for an insert (the reserve is kept): the heap keeps two
--   versions' room per run for ever (measured: 1,049 bytes a run at fillfactor 45, 734 at
--   100, steady state, docs/performance.md). At 100 a publish that does not fit its page
--   writes its new version elsewhere with new index entries, and autovacuum makes the dead
--   version's room and entries reusable by the runs that follow.

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
