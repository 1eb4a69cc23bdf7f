-- 0010_compact_read_model: runs and attempts with fewer and smaller indexes and without the
-- columns nothing reads (docs/design.md §9, "Bytes per run").
--
-- An UPDATE of a row is HOT (heap-only: no new entry in any index, and the old version is
-- pruned within its page without a vacuum) only if it changes no column an index holds or
-- its predicate names. A run is inserted when it is materialized, then updated when its
-- attempt is claimed and when its result is published; `state` was in the predicates of
-- runs_ready and runs_finished*, so every one of those updates wrote a new entry in every
-- index of runs (the primary key and both lists included) and left a dead row. Now:
--
-- * runs_ready goes: the READY runs by when they became ready are ready_runs (0005), which
--   the projector keeps in the same transaction; the queries that used it read ready_runs;
-- * runs_finished and runs_finished_by_tenant hold the rows with a finished_at, whatever
--   their state (retention's deletes still ask for a finished state: a RECONCILING run
--   that had finished is in the index and left by that condition). A claim changes no
--   indexed column: it is HOT when its page has room;
-- * runs_history and runs_by_tenant are ascending: a backward scan gives the lists'
--   newest-first order and their (scheduled_at, run_id) cursor conditions alike, and new
--   runs, the newest, go to the right end of their key range, where a full page splits
--   leaving itself full (the descending indexes put them at the left end, where every
--   split left two half-empty pages);
-- * runs_history leaves the run ID out of its key: a schedule has one run per instant (two
--   only when manual triggers share one), so the lists' (scheduled_at, run_id) order puts
--   the few rows of one instant in order after the index; runs_by_tenant keeps it, as a
--   tenant's schedules often share an instant.

DROP INDEX IF EXISTS runs_ready;

DROP INDEX IF EXISTS runs_finished_by_tenant;
DROP INDEX IF EXISTS runs_finished;
-- the default partition's named after the parent's, as in 0009 (an EXPLAIN names them);
-- the parent's indexes below attach them
CREATE INDEX runs_finished_by_tenant_default ON runs_default (tenant, finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX runs_finished_default ON runs_default (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_finished_by_tenant ON runs (tenant, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;

DROP INDEX IF EXISTS runs_history;
DROP INDEX IF EXISTS runs_by_tenant;
CREATE INDEX runs_history ON runs (tenant, schedule_id, scheduled_at);
CREATE INDEX runs_by_tenant ON runs (tenant, scheduled_at, run_id);

-- Columns no query reads, each written in every version of every row:
-- * runs.lateness_ms (generated, stored): the run's document computes it as it is read, from
--   the same columns and with the same expression;
-- * runs.materialized_at: when the run was materialized (the log has it: its
--   OccurrenceMaterialized event);
-- * attempts.tenant, attempts.schedule_id: the run's (an attempt is read by its run ID, after
--   its run, which is tenant-scoped; deleted by run ID);
-- * attempts.updated_at: the time of the attempt's last event, which nothing shows (its
--   claimed_at, lease_until and finished_at are its times).
-- A dropped column's bytes stay in the rows written before this migration until they are
-- written again or their day is dropped; the rows written after it are smaller.

ALTER TABLE runs DROP COLUMN lateness_ms, DROP COLUMN materialized_at;
ALTER TABLE attempts DROP COLUMN tenant, DROP COLUMN schedule_id, DROP COLUMN updated_at;
