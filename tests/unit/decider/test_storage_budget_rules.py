"""Decider rules for a result over the tenant's storage budget: the processor decides that
it does not fit (``TenantContext.result_refusal``); the decider never publishes it — the
attempt fails with the refusal's message, retried or dead-lettered by the policy, and the
worker is answered ``quota`` naming ``storage_budget``."""

from __future__ import annotations

from typing import Any

from support.decider import GivenWhenThen

TOO_MUCH = "over the storage budget of tenant 'acme' (storage_budget = 65536 bytes an hour)"


def _leased(gwt: GivenWhenThen, **overrides: Any) -> tuple[Any, Any]:
    s = gwt.story().create(gwt.T0, **overrides)
    [occ] = s.materialize(gwt.T0)
    return s, s.claim(occ.run_id, gwt.T0)


def test_a_result_over_the_storage_budget_fails_the_attempt_and_is_retried(
        gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, retry={"max_attempts": 3, "initial_backoff": 10})
    over = gwt.TenantContext(result_refusal=("transient", TOO_MUCH))
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5), over)
    assert (d.status, d.field, d.reason) == ("quota", "storage_budget", TOO_MUCH)
    assert gwt.all(d, m.ResultPublished) == []
    failed = gwt.one(d, m.AttemptFailed)
    assert (failed.error_class, failed.message) == ("transient", TOO_MUCH)
    assert gwt.one(d, m.RetryScheduled).attempt == 2
    assert s.run(claimed.run_id).state == "RETRY_WAIT"
    assert s.replayed().snapshot() == s.state.snapshot()


def test_a_result_larger_than_the_whole_budget_dead_letters_the_run(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, retry={"max_attempts": 3})
    never = gwt.TenantContext(result_refusal=("permanent", TOO_MUCH))
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5), never)
    assert d.status == "quota"
    assert gwt.one(d, m.OccurrenceDeadLettered).message == TOO_MUCH
    assert gwt.all(d, m.RetryScheduled) == []


def test_a_stale_completion_is_refused_as_stale_whatever_the_budget(gwt: GivenWhenThen) -> None:
    s, claimed = _leased(gwt)
    over = gwt.TenantContext(result_refusal=("transient", TOO_MUCH))
    d = s.when(gwt.complete(claimed, fence=claimed.fence + 5), gwt.T0 + gwt.sec(5), over)
    assert d.status == "stale_fence"
    assert gwt.all(d, gwt.m.AttemptFailed) == []
