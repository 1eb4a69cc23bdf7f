"""Decider rules for a cancel or redrive of a run the state no longer holds.

A run leaves the schedule's state once finished (only the newest finished run and a bounded
number of DEAD ones are kept). A cancel or redrive of such a run is a conflict that says so
— naming its final state when the state remembers it (a manual trigger's request key keeps
it) — never ``not_found``, which stays the answer for a run ID the schedule never had. A
scheduled run is recognized by the instant the sender read for it (``scheduled_at``): its
run ID is a hash of that instant.
"""

from __future__ import annotations

from typing import Any

import pytest

from chronolog.commands.state import DEAD_KEPT
from chronolog.domain.ids import run_id_for
from support.decider import GivenWhenThen, Story

GONE = "run has finished and is no longer held by the processor: it can no longer be "


def _finish_two_scheduled_runs(gwt: GivenWhenThen) -> tuple[Story, Any]:
    """Two scheduled runs run to success: the first one has left the state."""
    s = gwt.story().create(gwt.T0)
    [first] = s.materialize(gwt.T0)
    s.given(gwt.complete(s.claim(first.run_id, gwt.T0)), gwt.T0 + gwt.sec(1))
    [second] = s.materialize(gwt.T0 + gwt.sec(60))
    s.given(gwt.complete(s.claim(second.run_id, gwt.T0 + gwt.sec(60))), gwt.T0 + gwt.sec(61))
    assert s.state.run(first.run_id) is None
    return s, first


def _trigger(gwt: GivenWhenThen, s: Story, key: str, n: int) -> str:
    env = gwt.envelope(gwt.m.TriggerRun(request_key=key), command_id=f"c-{key}-{n}")
    run_id: str = s.given(env, gwt.T0 + gwt.sec(n)).body["run_id"]
    return run_id


def _run_to_success(gwt: GivenWhenThen, s: Story, key: str, n: int) -> str:
    run_id = _trigger(gwt, s, key, n)
    s.given(gwt.complete(s.claim(run_id, gwt.T0 + gwt.sec(n))), gwt.T0 + gwt.sec(n))
    return run_id


@pytest.mark.parametrize("command,verb", [("CancelRun", "cancelled"),
                                          ("RedriveRun", "redriven")])
def test_a_scheduled_run_let_go_is_a_conflict_saying_it_finished(
        gwt: GivenWhenThen, command: str, verb: str) -> None:
    s, first = _finish_two_scheduled_runs(gwt)
    d = s.when(getattr(gwt.m, command)(run_id=first.run_id, scheduled_at=first.scheduled_at),
               gwt.T0 + gwt.sec(120))
    assert (d.status, d.reason, d.events) == ("conflict", GONE + verb, [])


@pytest.mark.parametrize("command", ["CancelRun", "RedriveRun"])
def test_a_run_id_never_had_stays_not_found(gwt: GivenWhenThen, command: str) -> None:
    s, first = _finish_two_scheduled_runs(gwt)
    later = gwt.T0 + gwt.sec(600)  # an instant of the rule not materialized yet
    for run_id, at in (("r_nothing", first.scheduled_at), ("r_nothing", None),
                       (run_id_for(gwt.TENANT, s.schedule_id, later), later)):
        d = s.when(getattr(gwt.m, command)(run_id=run_id, scheduled_at=at),
                   gwt.T0 + gwt.sec(120))
        assert (d.status, d.reason, d.events) == ("not_found", "no such run", [])


def test_a_manual_run_let_go_names_its_final_state(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    cancelled = _trigger(gwt, s, "pay-run", 1)
    s.given(m.CancelRun(run_id=cancelled), gwt.T0 + gwt.sec(1))
    _run_to_success(gwt, s, "later-run", 2)  # the newest finished run now: the other left
    assert s.state.run(cancelled) is None
    d = s.when(m.CancelRun(run_id=cancelled), gwt.T0 + gwt.sec(3))
    assert (d.status, d.events, d.body) == ("conflict", [], {"state": "CANCELLED"})
    assert d.reason == ("run is CANCELLED and no longer held by the processor: it can no "
                        "longer be cancelled")
    d = s.when(m.RedriveRun(run_id=cancelled), gwt.T0 + gwt.sec(3))
    assert (d.status, d.events, d.body) == ("conflict", [], {"state": "CANCELLED"})
    assert d.reason == "only a DEAD run can be redriven; run is CANCELLED"


def test_a_dead_run_past_those_kept_is_a_conflict_naming_dead(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(gwt.T0)
    first = s.dead("pay-run", gwt.T0 + gwt.sec(1))
    for i in range(DEAD_KEPT):  # the DEAD runs kept for a redrive are bounded: it leaves
        s.dead(f"other-{i}", gwt.T0 + gwt.sec(2))
    assert s.state.run(first) is None
    d = s.when(gwt.m.RedriveRun(run_id=first), gwt.T0 + gwt.sec(3))
    assert (d.status, d.events, d.body) == ("conflict", [], {"state": "DEAD"})
    assert d.reason == ("run is DEAD and no longer held by the processor: it can no longer "
                        "be redriven")
