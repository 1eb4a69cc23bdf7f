"""Decider rules for a backlog: more than one instant of a schedule due at one decision.

After a restart, a resume or a processor takeover the misfire policy decides, whatever the
grace: ``latest`` runs only the newest and records the older ones as ``coalesced``; ``skip``
runs only the newest and only within the grace; ``all`` runs each instant in order within
the catch-up bounds, one after another. The grace keeps its meaning for a single instant.

Under ``latest`` an occurrence from before a gap that never started is coalesced into the
newest instant: after a backlog, and after one instant due at the first Tick after a
take-over (``Tick.resumed``); ``skip`` and ``all`` keep it in place.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronolog.commands.aggregate import Decision
from chronolog.commands.backlog import plan_due
from chronolog.commands.decider import decide, fold
from chronolog.commands.state import initial_state
from chronolog.domain import messages as msg
from support.decider import GivenWhenThen


def _finished_first_run(gwt: GivenWhenThen, **spec: object) -> object:
    """Given: an ``every 2s`` schedule created at T0 whose first run has finished at T0+1s."""
    s = gwt.story().create(gwt.T0, every=2.0, **spec)
    [first] = s.materialize(gwt.T0)
    claimed = s.claim(first.run_id, gwt.T0)
    s.given(gwt.complete(claimed), gwt.T0 + gwt.sec(1))
    return s


def _ticked_after_downtime(gwt: GivenWhenThen, s: object, down: float) -> object:
    """When: the node comes back ``down`` seconds after T0 and ticks."""
    return s.when(gwt.m.Tick(), gwt.T0 + gwt.sec(down))  # type: ignore[attr-defined]


def _instants(gwt: GivenWhenThen, first: int, last: int) -> list[datetime]:
    return [gwt.T0 + gwt.sec(k) for k in range(first, last + 1, 2)]


def test_latest_after_downtime_runs_only_the_newest_instant_and_coalesces_the_older(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = _finished_first_run(gwt, overlap="skip")  # misfire latest, grace 60 s (defaults)
    d = _ticked_after_downtime(gwt, s, 35)  # T0+2 .. T0+34 due, all within the grace
    [ran] = gwt.all(d, m.OccurrenceMaterialized)
    assert (ran.scheduled_at, ran.state) == (gwt.T0 + gwt.sec(34), "READY")
    skipped = gwt.all(d, m.OccurrenceSkipped)
    assert [e.scheduled_at for e in skipped] == _instants(gwt, 2, 32)
    assert {e.reason for e in skipped} == {"coalesced"}
    assert s.state.next_run_at == gwt.T0 + gwt.sec(36)


def test_latest_records_a_long_coalesced_run_as_one_range_event(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = _finished_first_run(gwt)
    d = _ticked_after_downtime(gwt, s, 601)  # ten minutes down: 300 instants due
    [rng] = gwt.all(d, m.OccurrenceSkipped)
    assert (rng.reason, rng.count, rng.scheduled_at, rng.through) == (
        "coalesced", 299, gwt.T0 + gwt.sec(2), gwt.T0 + gwt.sec(598))
    assert rng.next_run_at == gwt.T0 + gwt.sec(600)
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == [
        gwt.T0 + gwt.sec(600)]


def test_latest_runs_the_newest_of_a_backlog_whatever_the_grace(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = _finished_first_run(gwt, misfire={"policy": "latest", "grace": 0})
    d = _ticked_after_downtime(gwt, s, 35)  # the newest (T0+34) is 1 s late, past the grace
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == [
        gwt.T0 + gwt.sec(34)]


def test_latest_skips_even_the_newest_when_it_is_older_than_max_age(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, cron="0 * * * *", misfire={"policy": "latest", "max_age": 600})
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(3 * 3600 + 1800))  # 09:00 .. 12:00 due
    assert gwt.all(d, m.OccurrenceMaterialized) == []
    reasons = [e.reason for e in gwt.all(d, m.OccurrenceSkipped)]
    assert reasons == ["coalesced"] * 3 + ["misfire_max_age"]
    assert s.state.next_run_at == gwt.T0 + gwt.sec(4 * 3600)


def test_skip_after_downtime_runs_only_the_newest_instant_within_the_grace(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = _finished_first_run(gwt, misfire="skip")  # grace 60 s: every missed instant is in it
    d = _ticked_after_downtime(gwt, s, 35)
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == [
        gwt.T0 + gwt.sec(34)]
    skipped = gwt.all(d, m.OccurrenceSkipped)
    assert [e.scheduled_at for e in skipped] == _instants(gwt, 2, 32)
    assert {e.reason for e in skipped} == {"misfire"}


def test_skip_after_downtime_runs_nothing_when_the_newest_is_past_the_grace(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = _finished_first_run(gwt, misfire={"policy": "skip", "grace": 0.5})
    d = _ticked_after_downtime(gwt, s, 35)  # the newest is 1 s late
    assert gwt.all(d, m.OccurrenceMaterialized) == []
    assert sum(e.count for e in gwt.all(d, m.OccurrenceSkipped)) == 17
    assert s.state.next_run_at == gwt.T0 + gwt.sec(36)  # the schedule goes on


def test_all_after_downtime_runs_every_instant_in_order_one_after_another(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = _finished_first_run(gwt, misfire="all", overlap="skip")
    d = _ticked_after_downtime(gwt, s, 35)
    ran = gwt.all(d, m.OccurrenceMaterialized)
    assert [e.scheduled_at for e in ran] == _instants(gwt, 2, 34)
    assert gwt.all(d, m.OccurrenceSkipped) == []  # none is skipped for overlapping another
    assert [e.state for e in ran] == ["READY"] + ["PENDING"] * 16
    # when the first finishes, the next one in order is released
    claimed = s.claim(ran[0].run_id, gwt.T0 + gwt.sec(36))
    done = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(37))
    assert gwt.one(done, m.OccurrenceReady).run_id == ran[1].run_id


def test_all_catch_up_waits_behind_a_running_previous_run(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=2.0, misfire="all", overlap="skip", lease=600)
    [first] = s.materialize(gwt.T0)
    s.claim(first.run_id, gwt.T0)  # still running when the node comes back
    d = _ticked_after_downtime(gwt, s, 9)
    assert [(e.scheduled_at, e.state) for e in gwt.all(d, m.OccurrenceMaterialized)] == [
        (t, "PENDING") for t in _instants(gwt, 2, 8)]


def test_all_catch_up_runs_side_by_side_under_overlap_allow(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = _finished_first_run(gwt, misfire="all", overlap="allow")
    d = _ticked_after_downtime(gwt, s, 9)
    assert [e.state for e in gwt.all(d, m.OccurrenceMaterialized)] == ["READY"] * 4


def test_all_catch_up_is_bounded_by_max_catchup_whatever_the_grace(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = _finished_first_run(gwt, misfire={"policy": "all", "max_catchup": 5})
    d = _ticked_after_downtime(gwt, s, 35)  # 17 due, all within the 60 s grace
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == _instants(gwt, 26, 34)
    skipped = gwt.all(d, m.OccurrenceSkipped)
    assert {e.reason for e in skipped} == {"misfire_max_catchup"}
    assert sum(e.count for e in skipped) == 12


def test_latest_newest_instant_meets_the_overlap_policy_of_a_running_previous_run(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    for overlap, outcome in (("skip", "overlap"), ("buffer_one", "PENDING"),
                             ("cancel_previous", "READY")):
        s = gwt.story().create(gwt.T0, every=2.0, overlap=overlap, lease=600)
        [first] = s.materialize(gwt.T0)
        s.claim(first.run_id, gwt.T0)
        d = _ticked_after_downtime(gwt, s, 9)
        skipped = gwt.all(d, m.OccurrenceSkipped)
        assert [e.reason for e in skipped][:3] == ["coalesced"] * 3, overlap
        newest = [e for e in d.events if getattr(e, "scheduled_at", None) == gwt.T0 + gwt.sec(8)]
        [event] = newest
        got = event.reason if isinstance(event, m.OccurrenceSkipped) else event.state
        assert got == outcome, overlap


def test_grace_keeps_its_meaning_for_a_single_late_instant(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=600.0, misfire={"policy": "skip", "grace": 60})
    s.materialize(gwt.T0)
    on_time = s.when(m.Tick(), gwt.T0 + gwt.sec(630))  # 30 s late: within the grace
    assert len(gwt.all(on_time, m.OccurrenceMaterialized)) == 1
    late = s.when(m.Tick(), gwt.T0 + gwt.sec(1290))  # 90 s late: a misfire
    assert [e.reason for e in gwt.all(late, m.OccurrenceSkipped)] == ["misfire"]


def test_a_backlog_decision_replays_to_the_same_state(gwt: GivenWhenThen) -> None:
    s = _finished_first_run(gwt, misfire="all")
    _ticked_after_downtime(gwt, s, 601)
    assert s.replayed().snapshot() == s.state.snapshot()


# -- property: whatever the policy, grace and downtime ------------------------------------

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(["latest", "skip", "all"]),
    grace=st.sampled_from([0, 1, 5, 60]),
    max_catchup=st.integers(1, 30),
    every=st.sampled_from([1, 2, 7, 60]),
    down=st.integers(0, 400),
)
def test_a_backlog_runs_what_the_plan_says_and_accounts_for_every_due_instant(
    policy: str, grace: int, max_catchup: int, every: int, down: int
) -> None:
    spec = msg.ScheduleSpec.model_validate(
        {"every": every, "job": {"type": "j"}, "overlap": "allow",
         "misfire": {"policy": policy, "grace": grace, "max_catchup": max_catchup}})
    env = msg.CommandEnvelope(command_id="c", type="CreateSchedule", tenant="t", principal="p",
                              schedule_id="s", issued_at=T0,
                              payload=msg.CreateSchedule(spec=spec))
    created = decide(initial_state("t", "s"), env, T0)
    state = fold("t", "s", created.events)
    now = T0 + timedelta(seconds=down)
    assert state.policy is not None
    plan = plan_due("s", state.policy, state.trigger, state.next_run_at, now)
    tick = msg.CommandEnvelope(command_id="t", type="Tick", tenant="t", principal="p",
                               schedule_id="s", issued_at=now, payload=msg.Tick())
    d = decide(state, tick, now)
    ran = [e.scheduled_at for e in d.events if isinstance(e, msg.OccurrenceMaterialized)]
    skipped = [e for e in d.events if isinstance(e, msg.OccurrenceSkipped)]
    # the decider does what the plan (the API's resume preview) says
    assert ran == [p.instant for p in plan.items if p.runs]
    # every due instant is accounted for exactly once
    assert len(ran) + sum(e.count for e in skipped) == len(plan.items) == down // every + 1
    if len(plan.items) > 1 and policy in ("latest", "skip"):
        assert ran in ([], [plan.items[-1].instant])
        if policy == "latest":
            assert ran and {e.reason for e in skipped} <= {"coalesced"}
    if policy == "all":
        assert len(ran) == min(max_catchup, len(plan.items))


# -- an occurrence from before a gap that never started ------------------------------------
# A gap is a backlog (several instants due at one decision), or one instant due at the first
# Tick after the processor took the partition over (``Tick(resumed=True)``); the rules below
# hold for both.

GAPS = {
    # a backlog: down 35 s, T0+2 .. T0+34 due, the newest is T0+34
    "a backlog": (35, False, 34),
    # one missed instant: down 3 s, T0+2 due at the first Tick after a take-over
    "one instant after a take-over": (3, True, 2),
}


def _after_gap(gwt: GivenWhenThen, s: Any, gap: str) -> Decision:
    """When: the gap ends and the schedule's Tick decides what is due."""
    down, resumed, _ = GAPS[gap]
    return s.when(gwt.m.Tick(resumed=resumed), gwt.T0 + gwt.sec(down))  # type: ignore[no-any-return]


def _newest(gwt: GivenWhenThen, gap: str) -> datetime:
    return gwt.T0 + gwt.sec(GAPS[gap][2])


@pytest.mark.parametrize("gap", GAPS)
def test_latest_coalesces_an_occurrence_from_before_the_gap_that_never_started(
    gwt: GivenWhenThen, gap: str,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=2.0, overlap="skip")
    [first] = s.materialize(gwt.T0)  # READY when the node stopped; no worker took it
    d = _after_gap(gwt, s, gap)
    stale = [e for e in gwt.all(d, m.OccurrenceSkipped) if e.materialized]
    assert [(e.run_id, e.reason) for e in stale] == [(first.run_id, "coalesced")]
    [ran] = gwt.all(d, m.OccurrenceMaterialized)  # the newest is not blocked by it
    assert (ran.scheduled_at, ran.state) == (_newest(gwt, gap), "READY")
    assert s.replayed().snapshot() == s.state.snapshot()


@pytest.mark.parametrize("gap", GAPS)
def test_latest_leaves_a_started_run_from_before_the_gap_and_a_manual_run_alone(
    gwt: GivenWhenThen, gap: str,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=2.0, overlap="buffer_all", lease=600)
    [first] = s.materialize(gwt.T0)
    s.claim(first.run_id, gwt.T0)
    manual = gwt.one(s.given(m.TriggerRun(request_key="by-hand"), gwt.T0 + gwt.sec(1)),
                     m.OccurrenceMaterialized)
    d = _after_gap(gwt, s, gap)
    assert [e for e in gwt.all(d, m.OccurrenceSkipped) if e.materialized] == []
    assert s.run(first.run_id).state == "LEASED" and s.run(manual.run_id).state == "PENDING"
    newest = gwt.all(d, m.OccurrenceMaterialized)[-1]  # it waits behind them
    assert (newest.scheduled_at, newest.state) == (_newest(gwt, gap), "PENDING")


@pytest.mark.parametrize("gap", GAPS)
def test_latest_leaves_an_unstarted_run_alone_under_overlap_allow(
    gwt: GivenWhenThen, gap: str,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=2.0, overlap="allow")
    [first] = s.materialize(gwt.T0)
    d = _after_gap(gwt, s, gap)
    assert [e for e in gwt.all(d, m.OccurrenceSkipped) if e.materialized] == []
    assert s.run(first.run_id).state == "READY"
    newest = gwt.all(d, m.OccurrenceMaterialized)[-1]  # beside it
    assert (newest.scheduled_at, newest.state) == (_newest(gwt, gap), "READY")


@pytest.mark.parametrize("policy", ["skip", "all"])
def test_skip_and_all_keep_an_unstarted_run_from_before_one_missed_instant_in_place(
    gwt: GivenWhenThen, policy: str,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=2.0, overlap="skip", misfire=policy)
    [first] = s.materialize(gwt.T0)
    d = _after_gap(gwt, s, "one instant after a take-over")
    assert s.run(first.run_id).state == "READY"  # it keeps the guard ...
    assert gwt.all(d, m.OccurrenceMaterialized) == []
    [skipped] = gwt.all(d, m.OccurrenceSkipped)  # ... against the on-time instant
    assert (skipped.scheduled_at, skipped.reason) == (gwt.T0 + gwt.sec(2), "overlap")


def test_one_late_instant_at_a_tick_that_is_no_resume_leaves_an_unstarted_run_in_place(
    gwt: GivenWhenThen,
) -> None:
    """No take-over: the run may wait for a busy worker pool, not across a gap."""
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=2.0, overlap="skip")
    [first] = s.materialize(gwt.T0)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(3))
    assert s.run(first.run_id).state == "READY"
    [skipped] = gwt.all(d, m.OccurrenceSkipped)
    assert (skipped.scheduled_at, skipped.reason) == (gwt.T0 + gwt.sec(2), "overlap")


def test_a_resumed_tick_with_no_instant_due_coalesces_nothing(gwt: GivenWhenThen) -> None:
    """A take-over that finds a lease expiring but no instant due: the run before it has no
    newer instant to be coalesced into."""
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=60.0, overlap="skip")
    [first] = s.materialize(gwt.T0)
    d = s.when(m.Tick(resumed=True), gwt.T0 + gwt.sec(30))
    assert d.events == [] and s.run(first.run_id).state == "READY"
