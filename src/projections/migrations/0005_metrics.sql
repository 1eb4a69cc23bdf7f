-- 0005_metrics: the run counters and READY runs that /metrics reads (README "Metrics").
--
-- Written only by the projector, from the events, in the same transaction as the batch's rows
-- and offsets (chronolog.projections.store), so a scrape reads a handful of rows and never
-- scans runs, and a replay from offset 0 rebuilds the same sums. A counter is the sum of its
-- rows over `shard`: a batch adds to the rows of the lowest partition it projects, so
-- projectors on disjoint partitions never write the same row.

CREATE TABLE run_counters (
    shard          integer NOT NULL,
    metric         text    NOT NULL CHECK (metric IN (
                       'finished',       -- runs that reached an outcome; label: the outcome
                       'skipped',        -- skipped instants; label: the reason
                       'lateness',       -- first claims; label: the bucket's upper bound (s)
                       'lateness_sum',   -- the sum of their lateness, in microseconds
                       'ready')),        -- READY runs now (tenant '')
    tenant         text    NOT NULL,
    resource_class text    NOT NULL,
    job_type       text    NOT NULL,     -- '' for lateness and lateness_sum
    label          text    NOT NULL,
    value          bigint  NOT NULL,
    PRIMARY KEY (shard, metric, tenant, resource_class, job_type, label)
);

-- The READY runs (what runs holds WHERE state = 'READY'): the oldest of a resource class is
-- one probe of this index.
CREATE TABLE ready_runs (
    run_id         text        PRIMARY KEY,
    resource_class text        NOT NULL,
    job_type       text        NOT NULL,
    ready_at       timestamptz NOT NULL
);

CREATE INDEX ready_runs_oldest ON ready_runs (resource_class, ready_at);

-- A read model projected before this migration starts from its rows (in shard 0). The READY
-- runs and the lateness of first claims are exact; outcomes are counted by each run's state
-- now (a run redriven after it was DEAD counts once, where a replay counts both outcomes).

INSERT INTO ready_runs (run_id, resource_class, job_type, ready_at)
SELECT run_id, COALESCE(resource_class, 'default'), COALESCE(job_type, ''),
       COALESCE(ready_at, updated_at)
  FROM runs WHERE state = 'READY';

INSERT INTO run_counters (shard, metric, tenant, resource_class, job_type, label, value)
SELECT 0, 'ready', '', resource_class, job_type, '', count(*)
  FROM ready_runs GROUP BY resource_class, job_type;

-- a run's labels are its own; an instant that never became a run has its schedule's
CREATE TEMPORARY TABLE backfill_outcomes ON COMMIT DROP AS
SELECT r.tenant,
       COALESCE(r.resource_class, s.spec->>'resource_class', 'default') AS resource_class,
       COALESCE(r.job_type, s.spec->'job'->>'type', '') AS job_type,
       CASE WHEN r.state = 'SUCCEEDED' THEN 'succeeded'
            WHEN r.state = 'RECONCILING' AND r.result_checksum IS NOT NULL THEN 'succeeded'
            WHEN r.state = 'DEAD' THEN 'dead'
            WHEN r.state = 'CANCELLED' THEN 'cancelled'
            WHEN r.state = 'SKIPPED' THEN 'skipped' END AS outcome,
       r.skipped_reason,
       CASE WHEN r.state = 'SKIPPED' THEN GREATEST(r.skipped_count, 1) ELSE 1 END AS n
  FROM runs r LEFT JOIN schedules s ON s.tenant = r.tenant AND s.schedule_id = r.schedule_id;

INSERT INTO run_counters (shard, metric, tenant, resource_class, job_type, label, value)
SELECT 0, 'finished', tenant, resource_class, job_type, outcome, sum(n)
  FROM backfill_outcomes WHERE outcome IS NOT NULL
 GROUP BY tenant, resource_class, job_type, outcome;

INSERT INTO run_counters (shard, metric, tenant, resource_class, job_type, label, value)
SELECT 0, 'skipped', tenant, resource_class, job_type, skipped_reason, sum(n)
  FROM backfill_outcomes WHERE outcome = 'skipped' AND skipped_reason IS NOT NULL
 GROUP BY tenant, resource_class, job_type, skipped_reason;

-- start lateness of every run that was claimed: its first claim minus its due time
CREATE TEMPORARY TABLE backfill_lateness ON COMMIT DROP AS
SELECT tenant, COALESCE(resource_class, 'default') AS resource_class,
       (EXTRACT(EPOCH FROM (started_at - COALESCE(due_at, scheduled_at))) * 1000000)::bigint AS us
  FROM runs WHERE started_at IS NOT NULL;

INSERT INTO run_counters (shard, metric, tenant, resource_class, job_type, label, value)
SELECT 0, 'lateness', l.tenant, l.resource_class, '',
       COALESCE((SELECT b.le FROM (VALUES
           ('0.005', 5000), ('0.01', 10000), ('0.025', 25000), ('0.05', 50000),
           ('0.1', 100000), ('0.25', 250000), ('0.5', 500000), ('1.0', 1000000),
           ('2.5', 2500000), ('5.0', 5000000), ('10.0', 10000000), ('30.0', 30000000),
           ('60.0', 60000000), ('120.0', 120000000), ('300.0', 300000000),
           ('600.0', 600000000), ('1800.0', 1800000000), ('3600.0', 3600000000))
           AS b(le, us) WHERE l.us <= b.us ORDER BY b.us LIMIT 1), '+Inf') AS le,
       count(*)
  FROM backfill_lateness l
 GROUP BY l.tenant, l.resource_class, le;

INSERT INTO run_counters (shard, metric, tenant, resource_class, job_type, label, value)
SELECT 0, 'lateness_sum', tenant, resource_class, '', '', sum(us)
  FROM backfill_lateness GROUP BY tenant, resource_class;
