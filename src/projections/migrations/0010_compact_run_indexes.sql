-- 0010_compact_run_indexes: the indexes of runs, fewer and smaller (docs/design.md §9
-- "The read model", "Bytes per run").
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
--   split left two half-empty pages).

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
CREATE INDEX runs_history ON runs (tenant, schedule_id, scheduled_at, run_id);
CREATE INDEX runs_by_tenant ON runs (tenant, scheduled_at, run_id);
