"""Decider rules bounding retries: the ceiling on ``retry.maxAttempts`` and the floor under
the wait before a retry (the tenant's policy enters as ``TenantContext`` data; the wait is
written into ``RetryScheduled.retry_at``).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chronolog.domain.limits import (
    DEFAULT_EXECUTION_TIMEOUT_SECONDS,
    MAX_RETRY_ATTEMPTS,
    MIN_RETRY_BACKOFF_SECONDS,
)
from support.decider import GivenWhenThen


def test_a_schedule_asking_for_more_attempts_than_the_ceiling_is_invalid(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    over = gwt.spec(retry={"max_attempts": MAX_RETRY_ATTEMPTS + 1})
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=over), gwt.T0, gwt.TenantContext())
    assert (d.status, d.events, d.field) == ("invalid", [], "retry.maxAttempts"), d.reason
    assert "1000" not in d.reason and str(MAX_RETRY_ATTEMPTS + 1) in d.reason
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(retry={"max_attempts": 1000})),
                 gwt.T0, gwt.TenantContext())
    assert (d.status, d.field) == ("invalid", "retry.maxAttempts")
    at_ceiling = gwt.spec(retry={"max_attempts": MAX_RETRY_ATTEMPTS})
    assert gwt.when(gwt.given(), m.CreateSchedule(spec=at_ceiling), gwt.T0).ok
    # a tenant's lower ceiling, and a revision held to it as well
    strict = gwt.TenantContext(max_attempts=5)
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(retry={"max_attempts": 6})),
                 gwt.T0, strict)
    assert (d.status, d.field) == ("invalid", "retry.maxAttempts")
    s = gwt.story().create(gwt.T0)
    d = s.when(m.ReviseSchedule(spec=gwt.spec(retry={"max_attempts": 6}), expected_revision=1),
               gwt.T0, strict)
    assert (d.status, d.events, d.field) == ("invalid", [], "retry.maxAttempts")


def _failed_once(gwt: GivenWhenThen, initial_backoff: float, tenant: object) -> object:
    m = gwt.m
    s = gwt.story().create(gwt.T0, retry={"max_attempts": 5, "initial_backoff": initial_backoff})
    [occ] = s.materialize(gwt.T0)
    claimed = s.claim(occ.run_id, gwt.T0)
    d = s.when(m.FailRun(run_id=claimed.run_id, attempt=claimed.attempt, fence=claimed.fence,
                         worker_id=claimed.worker_id, error_class="transient", message="boom"),
               gwt.T0 + gwt.sec(1), tenant)  # type: ignore[arg-type]
    return gwt.one(d, m.RetryScheduled)


def test_a_retry_waits_at_least_the_floor_even_with_a_zero_initial_backoff(
    gwt: GivenWhenThen,
) -> None:
    retry = _failed_once(gwt, 0, gwt.TenantContext())
    assert retry.retry_at == gwt.T0 + gwt.sec(1) + gwt.sec(MIN_RETRY_BACKOFF_SECONDS)
    # a tenant's higher floor
    retry = _failed_once(gwt, 0, gwt.TenantContext(min_backoff=30.0))
    assert retry.retry_at == gwt.T0 + gwt.sec(31)


@settings(max_examples=50, deadline=None)
@given(backoff=st.floats(min_value=0, max_value=600), floor=st.floats(min_value=1, max_value=60))
def test_no_retry_is_scheduled_sooner_than_the_tenants_floor(backoff: float,
                                                             floor: float) -> None:
    gwt = GivenWhenThen()
    retry = _failed_once(gwt, backoff, gwt.TenantContext(min_backoff=floor))
    wait = (retry.retry_at - (gwt.T0 + gwt.sec(1))).total_seconds()
    assert wait >= floor - 1e-6


def test_a_claim_writes_the_attempts_execution_timeout_into_the_event_and_the_body(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    tenant = gwt.TenantContext(execution_timeout=600.0, job_timeouts={"report": 3600.0})
    for job, expected in (({"type": "echo"}, 600.0),  # the tenant's
                          ({"type": "report"}, 3600.0),  # the tenant's for the job type
                          ({"type": "echo", "timeout": 5}, 5.0),  # the job's own, shorter
                          ({"type": "echo", "timeout": 7200}, 600.0)):  # never above
        s = gwt.story().create(gwt.T0, job=job)
        [occ] = s.materialize(gwt.T0)
        d = s.when(m.ClaimRun(run_id=occ.run_id, attempt=1, worker_id="w1"), gwt.T0, tenant)
        assert gwt.one(d, m.AttemptClaimed).timeout == expected, job
        assert d.body["timeout"] == expected
        assert s.replayed().run(occ.run_id).state == "LEASED"  # replay reads it, computes nothing
    # without a tenants file: the node's default
    s = gwt.story().create(gwt.T0)
    [occ] = s.materialize(gwt.T0)
    d = s.when(m.ClaimRun(run_id=occ.run_id, attempt=1, worker_id="w1"), gwt.T0)
    assert gwt.one(d, m.AttemptClaimed).timeout == DEFAULT_EXECUTION_TIMEOUT_SECONDS


def test_a_retry_over_the_tenants_budget_is_delayed_and_the_delay_written(
    gwt: GivenWhenThen,
) -> None:
    on_time = _failed_once(gwt, 0, gwt.TenantContext())
    delayed = _failed_once(gwt, 0, gwt.TenantContext(retry_delay=42.0))
    assert delayed.retry_at - on_time.retry_at == gwt.sec(42)
    assert delayed.attempt == on_time.attempt == 2  # delayed, not dropped
