"""Decider rules for attempts and runs: claim, heartbeat, lease, complete, fail, retry,
dead-letter, redrive, reconciliation, cancel and effects.

One test per rule (docs/design.md §5, §8), named after the rule.
"""

from __future__ import annotations

from typing import Any

from chronolog.commands.decider import retry_delay
from support.decider import GivenWhenThen


def _leased(gwt: GivenWhenThen, **overrides: Any) -> tuple[Any, Any]:
    """A story with one run claimed at T0 (lease 30 s unless overridden)."""
    s = gwt.story().create(gwt.T0, **overrides)
    [occ] = s.materialize(gwt.T0)
    return s, s.claim(occ.run_id, gwt.T0)


def test_claim_advances_the_fence_and_leases_the_attempt(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    [occ] = s.materialize(gwt.T0)
    d = s.when(m.ClaimRun(run_id=occ.run_id, attempt=1, worker_id="w1"), gwt.T0 + gwt.sec(2))
    assert gwt.names(d) == ["FenceAdvanced", "AttemptClaimed"]
    claimed = gwt.one(d, m.AttemptClaimed)
    assert (claimed.fence, claimed.attempt, claimed.lease_until) == (1, 1, gwt.T0 + gwt.sec(32))
    assert d.body["fence"] == 1 and d.body["params"] == {"n": 1}


def test_claim_on_a_leased_or_terminal_run_is_refused(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    dup = s.when(m.ClaimRun(run_id=claimed.run_id, attempt=1, worker_id="w2"), gwt.T0)
    assert (dup.status, dup.events) == ("conflict", [])
    s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(1))
    late = s.when(m.ClaimRun(run_id=claimed.run_id, attempt=1, worker_id="w2"), gwt.T0)
    assert (late.status, late.events) == ("conflict", [])


def test_fences_strictly_increase_per_schedule_across_runs(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(gwt.T0, lease=600)
    fences = []
    for k in range(3):
        [occ] = s.materialize(gwt.T0 + gwt.sec(60 * k))
        fences.append(s.claim(occ.run_id, gwt.T0 + gwt.sec(60 * k)).fence)
    assert fences == [1, 2, 3]


def test_heartbeat_with_current_fence_extends_the_lease(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    d = s.when(gwt.heartbeat(claimed), gwt.T0 + gwt.sec(20))
    assert gwt.one(d, m.LeaseExtended).lease_until == gwt.T0 + gwt.sec(50)
    assert d.body["cancel_requested"] is False


def test_heartbeat_with_stale_fence_is_stale_fence(gwt: GivenWhenThen) -> None:
    s, claimed = _leased(gwt)
    d = s.when(gwt.heartbeat(claimed, fence=claimed.fence + 7), gwt.T0 + gwt.sec(5))
    assert (d.status, d.events) == ("stale_fence", [])


def test_heartbeat_never_revives_an_expired_epoch(gwt: GivenWhenThen) -> None:
    s, claimed = _leased(gwt)
    d = s.when(gwt.heartbeat(claimed), gwt.T0 + gwt.sec(31))  # lease ended at T0+30
    assert d.status == "stale_fence"
    assert "LeaseExtended" not in gwt.names(d)
    assert gwt.names(d)[:2] == ["LeaseExpired", "FenceAdvanced"]
    assert s.state.fence == claimed.fence + 1
    assert s.when(gwt.heartbeat(claimed), gwt.T0 + gwt.sec(32)).status == "stale_fence"


def test_lease_expiry_advances_the_fence_at_once(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(30)).events == []  # lease_until itself is inside
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(30.001))
    assert gwt.names(d) == ["LeaseExpired", "FenceAdvanced", "OccurrenceReady"]
    assert gwt.one(d, m.FenceAdvanced).fence == claimed.fence + 1
    assert gwt.one(d, m.OccurrenceReady).attempt == 2
    assert s.run(claimed.run_id).state == "READY"


def test_complete_with_current_fence_inside_the_lease_publishes_the_result(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(30))  # now == lease_until: inside
    published = gwt.one(d, m.ResultPublished)
    assert (published.fence, published.checksum) == (claimed.fence, "sha256:aa")
    assert s.run(claimed.run_id).state == "SUCCEEDED"


def test_stale_completion_is_rejected_and_recorded(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.when(m.Tick(), gwt.T0 + gwt.sec(31))  # lease expired, fence advanced, READY again
    second = s.claim(claimed.run_id, gwt.T0 + gwt.sec(32), worker="w2")
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(33))
    assert d.status == "stale_fence"
    rejected = gwt.one(d, m.CompletionRejected)
    assert (rejected.fence, rejected.current_fence, rejected.reason) == (
        claimed.fence, second.fence, "stale_fence")
    assert "ResultPublished" not in gwt.names(d)


def test_completion_after_the_lease_is_rejected_and_expires_the_lease(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(31))
    assert d.status == "stale_fence"
    assert gwt.names(d)[:3] == ["CompletionRejected", "LeaseExpired", "FenceAdvanced"]
    assert gwt.one(d, m.CompletionRejected).reason == "lease_expired"


def test_repeated_completion_with_same_checksum_returns_saved_result(gwt: GivenWhenThen) -> None:
    s, claimed = _leased(gwt)
    first = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5))
    again = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(500))  # even after the lease
    assert (again.status, again.events) == ("ok", [])
    assert again.body["result"] == first.body["result"] == {
        "checksum": "sha256:aa", "size": 3, "uri": None, "inline": {"ok": True}}


def test_repeated_completion_with_other_checksum_is_conflict(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5))
    d = s.when(gwt.complete(claimed, checksum="sha256:bb"), gwt.T0 + gwt.sec(6))
    assert d.status == "conflict"
    assert gwt.one(d, m.CompletionRejected).reason == "checksum_conflict"
    assert s.run(claimed.run_id).checksum == "sha256:aa"


def test_effects_are_intended_with_the_result(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, effects=[
        {"kind": "email", "destination": "d-email"},
        {"kind": "webhook", "name": "hook", "destination": "d-webhook"}])
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5))
    assert gwt.names(d) == ["ResultPublished", "EffectIntended", "EffectIntended"]
    ids = [e.effect_id for e in gwt.all(d, m.EffectIntended)]
    assert ids == [f"send-{claimed.run_id}", f"hook-{claimed.run_id}"]
    assert {e.checksum for e in gwt.all(d, m.EffectIntended)} == {"sha256:aa"}


def test_transient_failure_schedules_a_retry_with_deterministic_backoff(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, retry={"max_attempts": 5, "initial_backoff": 10, "multiplier": 3})
    d = s.fail(claimed, gwt.T0 + gwt.sec(5))
    retry = gwt.one(d, m.RetryScheduled)
    pol = s.state.policy
    expected = retry_delay(pol, claimed.run_id, 1, 1)
    assert 5 <= expected < 10  # jitter in [50%, 100%] of the first step
    assert (retry.attempt, retry.retry_at) == (2, gwt.T0 + gwt.sec(5) + gwt.sec(expected))
    # same inputs, same answer (no randomness)
    s2, claimed2 = _leased(gwt, retry={"max_attempts": 5, "initial_backoff": 10, "multiplier": 3})
    assert gwt.one(s2.fail(claimed2, gwt.T0 + gwt.sec(5)), m.RetryScheduled) == retry
    # the retry is released by a Tick at retry_at, not before
    assert s.when(m.Tick(), retry.retry_at - gwt.sec(0.001)).events == []
    assert gwt.names(s.when(m.Tick(), retry.retry_at)) == ["OccurrenceReady"]


def test_retry_backoff_grows_and_is_capped(gwt: GivenWhenThen) -> None:
    s, _ = _leased(gwt, retry={"initial_backoff": 1, "multiplier": 2, "max_backoff": 8,
                              "max_attempts": 50})
    pol = s.state.policy
    steps = [retry_delay(pol, "r", a, a) for a in range(1, 10)]
    for a, step in enumerate(steps, start=1):
        base = min(8, 2 ** (a - 1))
        assert base / 2 <= step < base


def test_retry_is_bounded_by_max_attempts(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, retry={"max_attempts": 2, "initial_backoff": 1})
    retry = gwt.one(s.fail(claimed, gwt.T0 + gwt.sec(1)), m.RetryScheduled)
    s.when(m.Tick(), retry.retry_at)
    second = s.claim(claimed.run_id, retry.retry_at)
    assert second.attempt == 2
    d = s.fail(second, retry.retry_at + gwt.sec(1))
    dead = gwt.one(d, m.OccurrenceDeadLettered)
    assert dead.reason == "max_attempts"
    assert s.run(claimed.run_id).state == "DEAD"


def test_retry_is_bounded_by_max_age(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, retry={"max_attempts": 10, "initial_backoff": 100, "max_age": 60},
                         lease=600)
    d = s.fail(claimed, gwt.T0 + gwt.sec(10))  # the retry would land past T0 + 60
    assert gwt.one(d, m.OccurrenceDeadLettered).reason == "max_age"


def test_permanent_failure_goes_dead(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    d = s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="permanent")
    assert gwt.names(d) == ["AttemptFailed", "OccurrenceDeadLettered"]
    assert gwt.one(d, m.OccurrenceDeadLettered).reason == "permanent_error"


def test_ambiguous_failure_goes_reconciling(gwt: GivenWhenThen) -> None:
    s, claimed = _leased(gwt)
    d = s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="ambiguous")
    assert gwt.names(d) == ["AttemptFailed", "ReconciliationRequired"]
    assert s.run(claimed.run_id).state == "RECONCILING"


def test_fail_with_stale_fence_is_stale_fence(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    d = s.when(m.FailRun(run_id=claimed.run_id, attempt=1, fence=claimed.fence + 1,
                         worker_id="w1"), gwt.T0 + gwt.sec(1))
    assert (d.status, d.events) == ("stale_fence", [])


def test_redrive_keeps_run_id_and_history(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="permanent")
    d = s.when(m.RedriveRun(run_id=claimed.run_id), gwt.T0 + gwt.sec(100))
    redriven = gwt.one(d, m.OccurrenceRedriven)
    assert (redriven.run_id, redriven.attempt) == (claimed.run_id, 2)
    run = s.run(claimed.run_id)
    assert (run.state, run.scheduled_at, run.revision) == ("READY", gwt.T0, 1)
    again = s.claim(claimed.run_id, gwt.T0 + gwt.sec(101))
    assert again.attempt == 2 and again.fence > claimed.fence
    assert [type(e).__name__ for e in s.history if getattr(e, "run_id", None) == claimed.run_id
            ].count("AttemptClaimed") == 2


def test_redrive_of_a_run_not_dead_is_conflict(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    d = s.when(m.RedriveRun(run_id=claimed.run_id), gwt.T0)
    assert (d.status, d.events) == ("conflict", [])


def test_redrive_respects_the_overlap_guard(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, overlap="skip", lease=600)
    s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="permanent")
    [b] = s.materialize(gwt.T0 + gwt.sec(60))
    s.claim(b.run_id, gwt.T0 + gwt.sec(60))
    d = s.when(m.RedriveRun(run_id=claimed.run_id), gwt.T0 + gwt.sec(61))
    assert d.status == "conflict"
    assert [r.state for r in s.state.runs.values()].count("LEASED") == 1


def test_reconciliation_resolved_as_delivered_succeeds_the_run(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="ambiguous")
    d = s.when(m.ResolveReconciliation(run_id=claimed.run_id, decision="delivered"), gwt.T0)
    assert gwt.names(d) == ["ReconciliationResolved"]
    assert s.run(claimed.run_id).state == "SUCCEEDED"


def test_reconciliation_resolved_as_retry_keeps_the_identity(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="ambiguous")
    d = s.when(m.ResolveReconciliation(run_id=claimed.run_id, decision="retry"), gwt.T0)
    assert gwt.names(d) == ["ReconciliationResolved", "OccurrenceReady"]
    assert gwt.one(d, m.OccurrenceReady).run_id == claimed.run_id
    assert s.claim(claimed.run_id, gwt.T0 + gwt.sec(2)).attempt == 2


def test_reconciliation_resolved_as_abandon_dead_letters_the_run(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="ambiguous")
    d = s.when(m.ResolveReconciliation(run_id=claimed.run_id, decision="abandon"), gwt.T0)
    assert gwt.one(d, m.OccurrenceDeadLettered).reason == "reconciliation_abandoned"


def test_uncertain_effect_goes_to_reconciliation_and_is_never_blindly_retried(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, effects=[{"kind": "email", "destination": "d-email"}])
    s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5))
    effect_id = f"send-{claimed.run_id}"
    d = s.when(m.RecordEffectOutcome(run_id=claimed.run_id, effect_id=effect_id,
                                     outcome="uncertain"), gwt.T0 + gwt.sec(6))
    assert gwt.names(d) == ["EffectUncertain", "ReconciliationRequired"]
    assert s.run(claimed.run_id).state == "RECONCILING"
    d = s.when(m.ResolveReconciliation(run_id=claimed.run_id, decision="retry",
                                       effect_id=effect_id), gwt.T0 + gwt.sec(7))
    assert gwt.names(d) == ["ReconciliationResolved", "EffectIntended"]
    assert gwt.one(d, m.EffectIntended).attempt == 2


def test_two_uncertain_effects_are_each_reconciled(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, effects=[{"kind": "email", "destination": "d-email"},
                                       {"kind": "webhook", "destination": "d-webhook"}])
    s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5))
    ids = [f"send-{claimed.run_id}", f"webhook-{claimed.run_id}"]
    for eid in ids:
        s.given(m.RecordEffectOutcome(run_id=claimed.run_id, effect_id=eid, outcome="uncertain"),
                gwt.T0 + gwt.sec(6))
    for eid in ids:
        d = s.when(m.ResolveReconciliation(run_id=claimed.run_id, decision="delivered",
                                           effect_id=eid), gwt.T0 + gwt.sec(7))
        assert d.ok, (eid, d.reason)
    run = s.run(claimed.run_id)
    assert run.state == "SUCCEEDED"
    assert {v[0] for v in run.effects.values()} == {"SUCCEEDED"}


def test_cancel_on_ready_is_accepted_at_once(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    [occ] = s.materialize(gwt.T0)
    d = s.when(m.CancelRun(run_id=occ.run_id, reason="no longer needed"), gwt.T0)
    assert gwt.names(d) == ["OccurrenceCancelled"]
    assert d.body["outcome"] == "cancelled"


def test_cancel_on_pending_is_accepted_at_once(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, _claimed = _leased(gwt, overlap="buffer_one", lease=600)
    [pending] = s.materialize(gwt.T0 + gwt.sec(60))
    d = s.when(m.CancelRun(run_id=pending.run_id), gwt.T0 + gwt.sec(61))
    assert gwt.names(d) == ["OccurrenceCancelled"]
    assert s.state.pending is None


def test_cancel_on_leased_is_recorded_as_requested_and_told_through_the_heartbeat(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    d = s.when(m.CancelRun(run_id=claimed.run_id), gwt.T0 + gwt.sec(1))
    assert gwt.names(d) == ["CancellationRequested"]
    assert d.body["outcome"] == "requested"
    assert s.run(claimed.run_id).state == "LEASED"
    hb = s.when(gwt.heartbeat(claimed), gwt.T0 + gwt.sec(2))
    assert hb.body["cancel_requested"] is True


def test_cancel_on_terminal_is_refused_as_too_late(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(1))
    d = s.when(m.CancelRun(run_id=claimed.run_id), gwt.T0 + gwt.sec(2))
    assert (d.status, d.events) == ("conflict", [])
    assert "too late" in d.reason


def test_cancel_requested_then_lease_expiry_cancels_instead_of_retrying(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.when(m.CancelRun(run_id=claimed.run_id), gwt.T0 + gwt.sec(1))
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(31))
    assert gwt.names(d) == ["LeaseExpired", "FenceAdvanced", "OccurrenceCancelled"]


def test_definite_effect_outcome_after_uncertainty_ends_the_reconciliation(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, effects=[{"kind": "email", "destination": "d-email"}])
    s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5))
    effect_id = f"send-{claimed.run_id}"
    s.given(m.RecordEffectOutcome(run_id=claimed.run_id, effect_id=effect_id, outcome="uncertain"),
            gwt.T0 + gwt.sec(6))
    d = s.when(m.RecordEffectOutcome(run_id=claimed.run_id, effect_id=effect_id,
                                     outcome="succeeded"), gwt.T0 + gwt.sec(7))
    assert gwt.names(d) == ["EffectSucceeded"]
    assert (s.run(claimed.run_id).state, s.run(claimed.run_id).reconcile) == ("SUCCEEDED", None)


def test_crash_trace_one_run_two_owners(gwt: GivenWhenThen) -> None:
    """The crash-and-redelivery timeline (docs/design.md §5), step by step (times from 12:00:00)."""
    m = gwt.m
    t = lambda sec: gwt.T0 + gwt.sec(sec)  # noqa: E731
    s = gwt.story().create(gwt.T0, lease=4)
    [run] = s.materialize(t(0))                                     # 0.000 READY
    a = s.claim(run.run_id, t(1.0), worker="A")                     # 1.000 A leases to 5.000
    assert a.lease_until == t(5.0)
    dup = s.when(m.ClaimRun(run_id=run.run_id, attempt=1, worker_id="B"), t(2.0))
    assert (dup.status, dup.events) == ("conflict", [])             # 2.000 B cannot lease
    expired = s.when(m.Tick(), t(5.1))                              # 5.100 lease expired
    assert gwt.names(expired) == ["LeaseExpired", "FenceAdvanced", "OccurrenceReady"]
    b = s.claim(run.run_id, t(5.2), worker="B")                     # 5.200 B, higher fence
    assert b.fence > a.fence and b.attempt == 2 and b.run_id == a.run_id
    late = s.when(gwt.complete(a, checksum="sha256:receipt900"), t(5.3))
    assert late.status == "stale_fence"                             # 5.300 A rejected
    assert gwt.one(late, m.CompletionRejected).reason == "stale_fence"
    ok = s.when(gwt.complete(b, checksum="sha256:receipt900"), t(5.5))
    assert gwt.one(ok, m.ResultPublished).fence == b.fence          # 5.500 SUCCEEDED
    c = s.when(m.ClaimRun(run_id=run.run_id, attempt=2, worker_id="C"), t(6.0))
    assert (c.status, c.events, c.body["state"]) == ("conflict", [], "SUCCEEDED")  # 6.000 ack
    assert [type(e).__name__ for e in s.history].count("ResultPublished") == 1


def test_redriven_run_gets_a_fresh_max_age_budget(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt, retry={"max_attempts": 5, "max_age": 3600})
    s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="permanent")
    redrive_at = gwt.T0 + gwt.sec(7200)  # long after the original max age
    d = s.when(m.RedriveRun(run_id=claimed.run_id), redrive_at)
    assert gwt.one(d, m.OccurrenceRedriven).redriven_at == redrive_at
    again = s.claim(claimed.run_id, redrive_at + gwt.sec(1))
    failed = s.when(m.FailRun(run_id=claimed.run_id, attempt=again.attempt, fence=again.fence,
                              worker_id="w1", error_class="transient"), redrive_at + gwt.sec(2))
    assert gwt.names(failed) == ["AttemptFailed", "RetryScheduled"]


def test_reconciliation_retry_on_a_deleted_schedule_is_conflict(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s, claimed = _leased(gwt)
    s.fail(claimed, gwt.T0 + gwt.sec(1), error_class="ambiguous")
    s.given(m.DeleteSchedule(), gwt.T0 + gwt.sec(2))
    d = s.when(m.ResolveReconciliation(run_id=claimed.run_id, decision="retry"), gwt.T0)
    assert (d.status, d.events) == ("conflict", [])


def test_only_the_attempts_assignee_may_complete_or_fail_it(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    run = s.materialize(gwt.T0)[0]
    c = s.claim(run.run_id, gwt.T0 + gwt.sec(1), worker="legit")
    now = gwt.T0 + gwt.sec(2)
    for cmd in (m.CompleteRun(run_id=c.run_id, attempt=c.attempt, fence=c.fence,
                              worker_id="rogue", checksum="sha256:00", size=0),
                m.FailRun(run_id=c.run_id, attempt=c.attempt, fence=c.fence,
                          worker_id="rogue", error_class="permanent")):
        d = s.when(cmd, now)  # the right fence and attempt, another worker
        assert (d.status, d.field, d.events) == ("forbidden", "worker_id", [])
        assert "assignee" in d.reason
    assert s.run(c.run_id).state == "LEASED"
    d = s.when(m.CompleteRun(run_id=c.run_id, attempt=c.attempt, fence=c.fence,
                             worker_id="legit", checksum="sha256:00", size=0), now)
    assert d.status == "ok" and gwt.names(d)[0] == "ResultPublished"
