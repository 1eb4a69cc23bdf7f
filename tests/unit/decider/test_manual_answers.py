"""Decider rules for the answer to a repeated manual trigger (docs/design.md §3).

The same request key (and params) answers the same run and that run's true state: while the
state holds the run, its state; once the run has left the state (only the newest finished
run and a bounded number of DEAD ones are kept), the final state its key's entry recorded
when it left. Never a guess.
"""

from __future__ import annotations

from typing import Any

from chronolog.commands.state import DEAD_KEPT
from support.decider import GivenWhenThen, Story


def _trigger(gwt: GivenWhenThen, s: Story, key: str, n: int) -> Any:
    env = gwt.envelope(gwt.m.TriggerRun(request_key=key), command_id=f"c-{key}-{n}")
    return s.when(env, gwt.T0 + gwt.sec(n))


def _run_to_success(gwt: GivenWhenThen, s: Story, key: str, n: int) -> str:
    run_id: str = _trigger(gwt, s, key, n).body["run_id"]
    claimed = s.claim(run_id, gwt.T0 + gwt.sec(n))
    s.given(gwt.complete(claimed), gwt.T0 + gwt.sec(n))
    return run_id


def test_a_repeated_trigger_answers_succeeded_after_its_run_left_the_state(
        gwt: GivenWhenThen) -> None:
    s = gwt.story().create(gwt.T0)
    paid = _run_to_success(gwt, s, "pay-run", 1)
    _run_to_success(gwt, s, "later-run", 2)  # the newest finished run now: "pay-run" left
    assert s.state.run(paid) is None
    again = _trigger(gwt, s, "pay-run", 3)
    assert (again.status, again.events) == ("ok", [])
    assert again.body == {"run_id": paid, "state": "SUCCEEDED"}


def test_a_repeated_trigger_answers_cancelled_after_its_run_left_the_state(
        gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    cancelled = _trigger(gwt, s, "pay-run", 1).body["run_id"]
    s.given(m.CancelRun(run_id=cancelled), gwt.T0 + gwt.sec(1))
    _run_to_success(gwt, s, "later-run", 2)
    assert s.state.run(cancelled) is None
    again = _trigger(gwt, s, "pay-run", 3)
    assert (again.events, again.body) == ([], {"run_id": cancelled, "state": "CANCELLED"})


def test_a_repeated_trigger_of_one_skipped_for_overlap_answers_skipped(
        gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="skip")
    busy = _trigger(gwt, s, "first", 1).body["run_id"]
    skipped = _trigger(gwt, s, "pay-run", 2)
    assert gwt.names(skipped) == ["OccurrenceSkipped"]
    assert skipped.body == {"run_id": gwt.one(skipped, m.OccurrenceSkipped).run_id,
                            "state": "SKIPPED"}
    s.given(gwt.complete(s.claim(busy, gwt.T0 + gwt.sec(3))), gwt.T0 + gwt.sec(3))
    _run_to_success(gwt, s, "later-run", 4)  # runs come and go: the skipped one was never held
    again = _trigger(gwt, s, "pay-run", 5)
    assert (again.events, again.body) == ([], skipped.body)


def test_a_repeated_trigger_of_a_run_skipped_past_its_start_deadline_answers_skipped(
        gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, every=3600.0, start_deadline=10.0)
    late = _trigger(gwt, s, "pay-run", 1).body["run_id"]
    s.given(m.Tick(), gwt.T0 + gwt.sec(20))  # never claimed: skipped, not started
    _run_to_success(gwt, s, "later-run", 21)
    assert s.state.run(late) is None
    again = _trigger(gwt, s, "pay-run", 22)
    assert (again.events, again.body) == ([], {"run_id": late, "state": "SKIPPED"})


def test_a_repeated_trigger_answers_dead_after_its_run_left_the_dead_ones_kept(
        gwt: GivenWhenThen) -> None:
    s = gwt.story().create(gwt.T0)
    first = s.dead("pay-run", gwt.T0 + gwt.sec(1))
    for i in range(DEAD_KEPT):  # the DEAD runs kept for a redrive are bounded: it leaves
        s.dead(f"other-{i}", gwt.T0 + gwt.sec(2))
    assert s.state.run(first) is None
    again = _trigger(gwt, s, "pay-run", 3)
    assert (again.events, again.body) == ([], {"run_id": first, "state": "DEAD"})


def test_a_repeated_trigger_of_a_held_run_answers_its_current_state(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(gwt.T0)
    run_id = _trigger(gwt, s, "pay-run", 1).body["run_id"]
    s.claim(run_id, gwt.T0 + gwt.sec(1))
    again = _trigger(gwt, s, "pay-run", 2)
    assert (again.events, again.body) == ([], {"run_id": run_id, "state": "LEASED"})


def test_the_final_state_recorded_for_a_key_is_folded_again_on_replay(
        gwt: GivenWhenThen) -> None:
    s = gwt.story().create(gwt.T0)
    paid = _run_to_success(gwt, s, "pay-run", 1)
    _run_to_success(gwt, s, "later-run", 2)
    replayed = s.replayed()
    assert replayed.snapshot() == s.state.snapshot()
    assert (replayed.manual or {})["pay-run"].final == "SUCCEEDED"
    assert (replayed.manual or {})["pay-run"].run_id == paid
