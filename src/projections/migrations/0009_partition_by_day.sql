-- 0009_partition_by_day: runs and attempts partitioned by day of the run's scheduled_at
-- (docs/design.md §9 "Retention", chronolog.projections.partitions), so retention drops a
-- whole day where a DELETE would visit ten million rows.
--
-- The key is the run's scheduled_at: set by the event that creates the run and never changed
-- (a run is one occurrence), so a row never moves between partitions, and the run's attempts
-- carry the same value (attempts.scheduled_at, filled by the store from the run's row) to sit
-- in the same day. A primary key of a partitioned table must hold the partition key:
-- (run_id, scheduled_at) and (run_id, attempt, scheduled_at). A run ID stays one row because
-- the store writes a run by run_id first and inserts only the run IDs it did not find (one
-- projector writes a run: its events are on one partition of the log).
--
-- Partitions: runs_pYYYYMMDD / attempts_pYYYYMMDD for [day 00:00 UTC, next day 00:00 UTC), and
-- runs_default / attempts_default for any day without one (an insert never fails). This
-- migration makes a partition for every day the rows it converts are in; the projector and
-- `chronolog replay` make them ahead of time from then on. Every row is copied: nothing lost.

ALTER TABLE runs RENAME TO runs_unpartitioned;
ALTER TABLE runs_unpartitioned DROP CONSTRAINT runs_pkey;
DROP INDEX runs_history, runs_ready, runs_by_tenant, runs_finished_by_tenant, runs_finished;

CREATE TABLE runs (LIKE runs_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                   INCLUDING GENERATED)
    PARTITION BY RANGE (scheduled_at);
ALTER TABLE runs ADD PRIMARY KEY (run_id, scheduled_at);

ALTER TABLE attempts RENAME TO attempts_unpartitioned;
ALTER TABLE attempts_unpartitioned DROP CONSTRAINT attempts_pkey;
DROP INDEX attempts_open;

-- scheduled_at: the run's (the partition key; an attempt without a run row, whose run was
-- pruned, takes its claimed_at)
CREATE TABLE attempts (LIKE attempts_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                       scheduled_at timestamptz NOT NULL)
    PARTITION BY RANGE (scheduled_at);
ALTER TABLE attempts ADD PRIMARY KEY (run_id, attempt, scheduled_at);

-- the default partitions, their partial indexes named after the parent's (an EXPLAIN names
-- them), attached to the parent's indexes below
CREATE TABLE runs_default PARTITION OF runs DEFAULT;
CREATE INDEX runs_finished_by_tenant_default ON runs_default (tenant, finished_at)
    WHERE finished_at IS NOT NULL AND state IN ('SUCCEEDED', 'DEAD', 'CANCELLED', 'SKIPPED');
CREATE INDEX runs_finished_default ON runs_default (finished_at)
    WHERE finished_at IS NOT NULL AND state IN ('SUCCEEDED', 'DEAD', 'CANCELLED', 'SKIPPED');
CREATE TABLE attempts_default PARTITION OF attempts DEFAULT;

-- the indexes of 0001, 0004 and 0008, now on every partition
CREATE INDEX runs_history ON runs (tenant, schedule_id, scheduled_at DESC, run_id DESC);
CREATE INDEX runs_ready ON runs (ready_at) WHERE state = 'READY';
CREATE INDEX runs_by_tenant ON runs (tenant, scheduled_at DESC, run_id DESC);
CREATE INDEX runs_finished_by_tenant ON runs (tenant, finished_at)
    WHERE finished_at IS NOT NULL AND state IN ('SUCCEEDED', 'DEAD', 'CANCELLED', 'SKIPPED');
CREATE INDEX runs_finished ON runs (finished_at)
    WHERE finished_at IS NOT NULL AND state IN ('SUCCEEDED', 'DEAD', 'CANCELLED', 'SKIPPED');
CREATE INDEX attempts_open ON attempts (lease_until) WHERE outcome IS NULL;

-- a day partition per day the existing rows are in
DO $$
DECLARE
    d date;
BEGIN
    FOR d IN SELECT DISTINCT (scheduled_at AT TIME ZONE 'UTC')::date FROM runs_unpartitioned
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF runs FOR VALUES FROM (%L) TO (%L)',
                       'runs_p' || to_char(d, 'YYYYMMDD'),
                       d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
        EXECUTE format('CREATE TABLE %I PARTITION OF attempts FOR VALUES FROM (%L) TO (%L)',
                       'attempts_p' || to_char(d, 'YYYYMMDD'),
                       d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
    END LOOP;
END
$$;

INSERT INTO runs (run_id, tenant, schedule_id, scheduled_at, due_at, revision, trigger,
                  request_key, state, attempt, job_type, params, resource_class, priority,
                  sequence, start_deadline_at, materialized_at, ready_at, retry_at, started_at,
                  finished_at, result_checksum, result_size, result_uri, result_inline,
                  result_attempt, skipped_reason, skipped_through, skipped_count,
                  cancellation_requested, cancel_reason, dead_reason, dead_message,
                  last_error_class, last_error, reconciliation, reconciliation_resolution,
                  updated_at)
SELECT run_id, tenant, schedule_id, scheduled_at, due_at, revision, trigger,
       request_key, state, attempt, job_type, params, resource_class, priority,
       sequence, start_deadline_at, materialized_at, ready_at, retry_at, started_at,
       finished_at, result_checksum, result_size, result_uri, result_inline,
       result_attempt, skipped_reason, skipped_through, skipped_count,
       cancellation_requested, cancel_reason, dead_reason, dead_message,
       last_error_class, last_error, reconciliation, reconciliation_resolution,
       updated_at
  FROM runs_unpartitioned;

INSERT INTO attempts (run_id, attempt, tenant, schedule_id, fence, worker_id, claimed_at,
                      lease_until, outcome, error_class, error, finished_at, updated_at,
                      scheduled_at)
SELECT a.run_id, a.attempt, a.tenant, a.schedule_id, a.fence, a.worker_id, a.claimed_at,
       a.lease_until, a.outcome, a.error_class, a.error, a.finished_at, a.updated_at,
       COALESCE(r.scheduled_at, a.claimed_at)
  FROM attempts_unpartitioned a LEFT JOIN runs_unpartitioned r ON r.run_id = a.run_id;

DROP TABLE runs_unpartitioned, attempts_unpartitioned;
