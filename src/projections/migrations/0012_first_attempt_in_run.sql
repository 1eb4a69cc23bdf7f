-- 0012_first_attempt_in_run: a run's first attempt is columns of its run row, not a row of
-- attempts (docs/design.md §9, "Bytes per run").
--
-- Nearly every run has one attempt. As a row of attempts it cost a heap tuple (a 24-byte
-- header, the run ID again, and its columns), an entry in attempts_pkey (the run ID a
-- third time) and, at its end, a second version of both; the run row is written at the
-- claim and at the publish anyway, so the same columns there cost only their own bytes.
-- Now:
--
-- * runs.first_fence, first_worker_id, first_lease_until, first_outcome,
--   first_error_class, first_error, first_finished_at hold attempt 1; its claim time is
--   runs.started_at (a run's first claim is its attempt 1's, and nothing else sets it);
-- * attempts holds attempts 2 and later (a run that was retried), and the attempts 1 of
--   the rows written before this migration, which retention removes in time;
-- * the attempts 1 still open (in open_attempts) move into their run rows here, so the
--   events that end them update the columns the read query shows.
--
-- The new columns have no default: adding them rewrites nothing.

ALTER TABLE runs
    ADD COLUMN IF NOT EXISTS first_fence bigint,
    ADD COLUMN IF NOT EXISTS first_worker_id text,
    ADD COLUMN IF NOT EXISTS first_lease_until timestamptz,
    ADD COLUMN IF NOT EXISTS first_outcome text,
    ADD COLUMN IF NOT EXISTS first_error_class text,
    ADD COLUMN IF NOT EXISTS first_error text,
    ADD COLUMN IF NOT EXISTS first_finished_at timestamptz;

WITH open_first AS (
    DELETE FROM attempts AS a
     USING open_attempts AS o
     WHERE o.attempt = 1 AND a.run_id = o.run_id AND a.attempt = 1
    RETURNING a.run_id, a.fence, a.worker_id, a.lease_until
)
UPDATE runs AS r
   SET first_fence = f.fence, first_worker_id = f.worker_id,
       first_lease_until = f.lease_until
  FROM open_first AS f
 WHERE r.run_id = f.run_id;
