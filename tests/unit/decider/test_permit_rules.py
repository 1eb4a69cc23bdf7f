"""Decider rules of concurrency limits (``chronolog.commands.permits``): a run with a
concurrency key asks the key's aggregate for a permit when it becomes READY, may be claimed
only once granted, and gives the permit back in the decision that ends its attempt; the
key's aggregate grants at most ``limit`` permits at once, first come first served.

Given (history) / when (command) / then (events, commands sent, status).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chronolog.commands.aggregate import Decision
from chronolog.commands.quota import decide_quota, evolve_quota
from chronolog.commands.state import QuotaState
from chronolog.domain import messages as m
from chronolog.domain.ids import limit_id
from support.decider import GivenWhenThen

KEY_SPEC = {"key": "customer-{n}", "limit": 2}


def _processor(gwt: GivenWhenThen, payload: object, schedule_id: str = "s1",
               command_id: str = "quota:p") -> m.CommandEnvelope:
    return gwt.envelope(payload, schedule_id=schedule_id, principal="processor",
                        command_id=command_id)


def _ready(gwt: GivenWhenThen, **spec: Any) -> tuple[Any, str, Decision]:
    """A schedule with a concurrency key whose first run was just made READY."""
    s = gwt.story().create(concurrency=KEY_SPEC, **spec)
    d = s.given(m.Tick(), gwt.T0 + gwt.sec(60))
    run_id = gwt.one(d, m.OccurrenceMaterialized).run_id
    return s, run_id, d


def _acquires(d: Decision) -> list[Any]:
    return [x for x in d.sends if isinstance(x.payload, m.AcquirePermit)]


def _releases(d: Decision) -> list[Any]:
    return [x for x in d.sends if isinstance(x.payload, m.ReleasePermit)]


def _grant(gwt: GivenWhenThen, s: Any, run_id: str) -> Decision:
    run = s.run(run_id)
    return s.given(_processor(gwt, m.GrantPermit(key=run.concurrency[0], run_id=run_id,
                                                 ask=run.permit)), gwt.T0 + gwt.sec(61))


# --------------------------------------------------------------------- the schedule's side


def test_a_run_made_ready_asks_its_keys_aggregate_for_a_permit(gwt: GivenWhenThen) -> None:
    _, run_id, d = _ready(gwt)
    waits = gwt.one(d, m.RunAwaitsPermit)
    assert (waits.run_id, waits.key, waits.limit) == (run_id, "customer-1", 2)
    [send] = _acquires(d)
    assert send.schedule_id == limit_id("customer-1")
    assert (send.payload.run_id, send.payload.ask, send.payload.limit) == (run_id, waits.ask, 2)
    assert gwt.names(d).index("RunAwaitsPermit") > gwt.names(d).index("OccurrenceMaterialized")


def test_a_run_waiting_for_its_permit_cannot_be_claimed(gwt: GivenWhenThen) -> None:
    s, run_id, _ = _ready(gwt)
    d = s.when(m.ClaimRun(run_id=run_id, attempt=1, worker_id="w1"), gwt.T0 + gwt.sec(61))
    assert d.status == "conflict" and "concurrency key 'customer-1'" in d.reason
    assert d.events == []


def test_the_grant_lets_the_run_be_claimed(gwt: GivenWhenThen) -> None:
    s, run_id, _ = _ready(gwt)
    d = _grant(gwt, s, run_id)
    assert gwt.names(d) == ["RunPermitted"]
    assert s.claim(run_id, gwt.T0 + gwt.sec(62)).run_id == run_id
    assert _grant(gwt, s, run_id).events == []  # the same grant again changes nothing


def test_a_run_that_finishes_gives_its_permit_back(gwt: GivenWhenThen) -> None:
    s, run_id, _ = _ready(gwt)
    _grant(gwt, s, run_id)
    ask = s.run(run_id).permit
    c = s.claim(run_id, gwt.T0 + gwt.sec(62))
    d = s.given(gwt.complete(c), gwt.T0 + gwt.sec(63))
    assert gwt.names(d)[-1] == "RunPermitReturned" and gwt.one(d, m.RunPermitReturned).ask == ask
    [send] = _releases(d)
    assert (send.schedule_id, send.payload.run_id, send.payload.ask) == (
        limit_id("customer-1"), run_id, ask)


def test_a_failed_attempt_gives_its_permit_back_and_asks_again_when_ready(
        gwt: GivenWhenThen) -> None:
    s, run_id, _ = _ready(gwt)
    _grant(gwt, s, run_id)
    first = s.run(run_id).permit
    failed = s.fail(s.claim(run_id, gwt.T0 + gwt.sec(62)), gwt.T0 + gwt.sec(63))
    assert "RunPermitReturned" in gwt.names(failed) and len(_releases(failed)) == 1
    assert s.run(run_id).state == "RETRY_WAIT" and s.run(run_id).permit is None
    retry_at = gwt.one(failed, m.RetryScheduled).retry_at
    d = s.given(gwt.envelope(m.Tick(), command_id="tick-2"), retry_at)
    assert gwt.names(d) == ["OccurrenceReady", "RunAwaitsPermit"]
    assert gwt.one(d, m.RunAwaitsPermit).ask != first and len(_acquires(d)) == 1


def test_a_run_cancelled_while_it_waits_withdraws_its_request(gwt: GivenWhenThen) -> None:
    s, run_id, _ = _ready(gwt)
    ask = s.run(run_id).permit
    d = s.given(m.CancelRun(run_id=run_id), gwt.T0 + gwt.sec(61))
    assert gwt.names(d)[-1] == "RunPermitReturned" and len(_releases(d)) == 1
    late = s.when(_processor(gwt, m.GrantPermit(key="customer-1", run_id=run_id, ask=ask)),
                  gwt.T0 + gwt.sec(62))
    assert late.events == [] and [x.payload.ask for x in _releases(late)] == [ask]


def test_only_the_processor_grants_a_permit(gwt: GivenWhenThen) -> None:
    s, run_id, _ = _ready(gwt)
    d = s.when(m.GrantPermit(key="customer-1", run_id=run_id, ask=s.run(run_id).permit),
               gwt.T0 + gwt.sec(61))
    assert d.status == "forbidden" and d.events == []


def test_the_tenants_rule_for_the_job_type_applies_when_the_schedule_has_none(
        gwt: GivenWhenThen) -> None:
    rules = {"report": m.ConcurrencySpec(key="reports", limit=1)}
    s = gwt.story().create()
    d = s.given(m.Tick(), gwt.T0 + gwt.sec(60), gwt.TenantContext(job_concurrency=rules))
    assert (gwt.one(d, m.RunAwaitsPermit).key, gwt.one(d, m.RunAwaitsPermit).limit) == (
        "reports", 1)


def test_a_schedule_without_a_key_asks_for_nothing(gwt: GivenWhenThen) -> None:
    s = gwt.story().create()
    d = s.given(m.Tick(), gwt.T0 + gwt.sec(60))
    assert "RunAwaitsPermit" not in gwt.names(d) and d.sends == []


def test_a_manual_runs_key_is_rendered_from_its_own_params(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(concurrency=KEY_SPEC)
    d = s.given(m.TriggerRun(request_key="r1", params={"n": "vip"}), gwt.T0 + gwt.sec(1))
    assert gwt.one(d, m.RunAwaitsPermit).key == "customer-vip"


def test_a_key_naming_a_param_the_job_lacks_is_refused(gwt: GivenWhenThen) -> None:
    with pytest.raises(ValidationError,
                       match=r"concurrency\.key uses \{region\}, but job\.params has no region"):
        gwt.spec(concurrency={"key": "r-{region}", "limit": 1})
    with pytest.raises(ValidationError, match=r"brace"):
        gwt.spec(concurrency={"key": "r-{n", "limit": 1})


def test_the_permit_events_replay_to_the_same_state(gwt: GivenWhenThen) -> None:
    s, run_id, _ = _ready(gwt)
    _grant(gwt, s, run_id)
    s.claim(run_id, gwt.T0 + gwt.sec(62))
    assert s.replayed().snapshot() == s.state.snapshot()


# --------------------------------------------------------------------- the key's aggregate


def _key_state(key: str = "k") -> QuotaState:
    return QuotaState("acme", limit_id(key))


def _decide(gwt: GivenWhenThen, q: QuotaState, payload: Any, cid: str = "quota:p") -> Decision:
    d = decide_quota(q, _processor(gwt, payload, schedule_id=q.schedule_id, command_id=cid),
                     gwt.T0, None)
    for e in d.events:
        evolve_quota(q, e)
    return d


def _acquire(run: str, limit: int = 2, key: str = "k") -> m.AcquirePermit:
    return m.AcquirePermit(key=key, run_id=run, schedule_id=f"s-{run}", ask=f"a-{run}",
                           limit=limit)


def _release(run: str, key: str = "k") -> m.ReleasePermit:
    return m.ReleasePermit(key=key, run_id=run, schedule_id=f"s-{run}", ask=f"a-{run}")


def test_permits_are_granted_up_to_the_limit_then_queued_in_order(gwt: GivenWhenThen) -> None:
    q = _key_state()
    for run in ("r1", "r2"):
        d = _decide(gwt, q, _acquire(run))
        assert gwt.names(d) == ["PermitGranted"]
        [grant] = d.sends
        assert (grant.schedule_id, grant.payload.run_id, grant.payload.ask) == (
            f"s-{run}", run, f"a-{run}")
    queued = [_decide(gwt, q, _acquire(r)) for r in ("r3", "r4")]
    assert [gwt.one(d, m.PermitQueued).position for d in queued] == [1, 2]
    assert all(d.sends == [] for d in queued)
    d = _decide(gwt, q, _release("r1"))
    assert gwt.names(d) == ["PermitReleased", "PermitGranted"]
    assert gwt.one(d, m.PermitGranted).run_id == "r3"  # the head of the line
    assert set(q.holders) == {"r2", "r3"} and [w[0] for w in q.waiting] == ["r4"]


def test_an_acquire_asked_again_is_answered_again_without_an_event(gwt: GivenWhenThen) -> None:
    q = _key_state()
    _decide(gwt, q, _acquire("r1"))
    again = _decide(gwt, q, _acquire("r1"))
    assert again.events == [] and [s.payload.run_id for s in again.sends] == ["r1"]


def test_a_queued_request_given_back_leaves_the_line(gwt: GivenWhenThen) -> None:
    q = _key_state()
    _decide(gwt, q, _acquire("r1", limit=1))
    _decide(gwt, q, _acquire("r2", limit=1))
    d = _decide(gwt, q, _release("r2"))
    assert gwt.one(d, m.PermitReleased).held is False and q.waiting == []
    assert _decide(gwt, q, _release("r2")).events == []  # nothing held: nothing changes


def test_a_request_for_another_key_is_refused(gwt: GivenWhenThen) -> None:
    d = _decide(gwt, _key_state("k"), _acquire("r1", key="other"))
    assert d.status == "invalid" and d.field == "key" and d.events == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(1, 3)), max_size=60))
def test_the_holders_never_outnumber_the_limit(steps: list[tuple[bool, int, int]]) -> None:
    """Any order of requests and releases: never more permits held than the limit of any
    grant, and every request granted, queued or given back — none lost."""
    gwt = GivenWhenThen()
    q = _key_state()
    asked: set[str] = set()
    for acquire, n, limit in steps:
        run = f"r{n}"
        d = _decide(gwt, q, _acquire(run, limit) if acquire else _release(run))
        for e in d.events:
            if isinstance(e, m.PermitGranted):
                assert e.holders <= e.limit  # the permits held once this one is granted
        if acquire:
            asked.add(run)
        else:
            asked.discard(run)
        assert set(q.holders) | {w[0] for w in q.waiting} == asked
        limits = [w[3] for w in q.waiting]
        assert not q.waiting or len(q.holders) >= limits[0]  # the head waits for a reason
