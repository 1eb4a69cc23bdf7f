-- 0006_event_counters: counters of the facts the alerts watch (docs/alerts.md), kept by the
-- projector in run_counters like the run outcomes: expired leases, rejected completions and
-- effect outcomes, by tenant, resource class and job type.

ALTER TABLE run_counters DROP CONSTRAINT run_counters_metric_check;
ALTER TABLE run_counters ADD CONSTRAINT run_counters_metric_check CHECK (metric IN (
    'finished', 'skipped', 'lateness', 'lateness_sum', 'ready',
    'lease_expired',  -- LeaseExpired events; label ''
    'rejected',       -- CompletionRejected events; label: the reason
    'effect'));       -- EffectSucceeded / EffectFailed / EffectUncertain; label: the outcome

-- A read model projected before this migration starts from its rows (in shard 0): expired
-- leases are exact (an attempt's lease_expired outcome never changes); effects are counted
-- by their state now (an uncertain effect resolved since counts as its resolution, where a
-- replay counts the uncertain outcome too); rejected completions left no row and start at 0.

INSERT INTO run_counters (shard, metric, tenant, resource_class, job_type, label, value)
SELECT 0, 'lease_expired', a.tenant, COALESCE(r.resource_class, 'default'),
       COALESCE(r.job_type, ''), '', count(*)
  FROM attempts a LEFT JOIN runs r ON r.run_id = a.run_id
 WHERE a.outcome = 'lease_expired'
 GROUP BY 2, 3, 4, 5;

INSERT INTO run_counters (shard, metric, tenant, resource_class, job_type, label, value)
SELECT 0, 'effect', e.tenant, COALESCE(r.resource_class, 'default'), COALESCE(r.job_type, ''),
       lower(e.state), count(*)
  FROM effects e LEFT JOIN runs r ON r.run_id = e.run_id
 WHERE e.state IN ('SUCCEEDED', 'FAILED', 'UNCERTAIN')
 GROUP BY 2, 3, 4, 5, 6;
