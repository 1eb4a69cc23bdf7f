-- 0008_retention: the indexes the read model's retention deletes by
-- (chronolog.projections.retention, docs/design.md §9 "Retention"): finished runs by tenant
-- and finish time (a tenant with its own window), and by finish time alone (every tenant
-- on the deployment's window). Partial: live runs, which are never pruned, are not in them.

CREATE INDEX IF NOT EXISTS runs_finished_by_tenant ON runs (tenant, finished_at)
    WHERE finished_at IS NOT NULL AND state IN ('SUCCEEDED', 'DEAD', 'CANCELLED', 'SKIPPED');
CREATE INDEX IF NOT EXISTS runs_finished ON runs (finished_at)
    WHERE finished_at IS NOT NULL AND state IN ('SUCCEEDED', 'DEAD', 'CANCELLED', 'SKIPPED');

-- attempts are deleted by run (their primary key leads with run_id); effects by run use
-- effects_by_run (0001).
