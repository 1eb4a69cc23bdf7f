"""A completion, failure or resolution whose run is retired at once (bounded terminal runs)
still answers, with the state the event that ended the run gave.

The decider keeps only a few terminal runs per schedule, oldest-materialized first out. When
the run being completed is the oldest of more than that many terminal runs, folding its own
ResultPublished retires it; the reply body must not need the run any more (it crashed the
processor with AttributeError on None before).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chronolog.commands.decider import decide, evolve
from chronolog.commands.state import DEAD_KEPT, RECENT_TERMINAL_KEPT, initial_state
from chronolog.domain import messages as m

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _do(st: Any, payload: Any, i: int) -> Any:
    env = m.CommandEnvelope(command_id=f"c{i}", type=payload.type, tenant="acme",
                            schedule_id="s", issued_at=T0, payload=payload)
    dec = decide(st, env, T0 + timedelta(seconds=1))
    for ev in dec.events:
        evolve(st, ev)
    return dec


def _claimed_runs(n: int) -> tuple[Any, list[tuple[str, int]]]:
    st = initial_state("acme", "s")
    spec = m.ScheduleSpec.model_validate({"at": "2027-01-01T00:00:00Z", "overlap": "allow",
                                          "job": {"type": "noop"}})
    assert _do(st, m.CreateSchedule(spec=spec), 0).status == "ok"
    runs = []
    for i in range(n):
        run_id = _do(st, m.TriggerRun(request_key=f"k{i}"), 100 + i).body["run_id"]
        body = _do(st, m.ClaimRun(run_id=run_id, attempt=1, worker_id="w"), 200 + i).body
        runs.append((run_id, body["fence"]))
    return st, runs


def test_completing_the_oldest_of_many_terminal_runs() -> None:
    st, runs = _claimed_runs(RECENT_TERMINAL_KEPT + 2)
    for i, (run_id, fence) in enumerate(runs[1:] + runs[:1]):
        dec = _do(st, m.CompleteRun(run_id=run_id, attempt=1, fence=fence, worker_id="w",
                                    checksum=f"h{i}", size=1, inline=i), 300 + i)
        assert dec.status == "ok", dec.reason
        assert dec.body["state"] == "SUCCEEDED" and dec.body["checksum"] == f"h{i}"
        assert dec.body["result"]["inline"] == i


def test_failing_a_cancel_requested_run_that_is_the_oldest_of_many_terminal_runs() -> None:
    st, runs = _claimed_runs(RECENT_TERMINAL_KEPT + 2)
    for i, (run_id, fence) in enumerate(runs[1:]):
        _do(st, m.CompleteRun(run_id=run_id, attempt=1, fence=fence, worker_id="w",
                              checksum="h", size=1), 300 + i)
    run_id, fence = runs[0]
    assert _do(st, m.CancelRun(run_id=run_id), 399).body["outcome"] == "requested"
    dec = _do(st, m.FailRun(run_id=run_id, attempt=1, fence=fence, worker_id="w",
                            error_class="transient", message="cancelled"), 400)
    assert dec.status == "ok" and dec.body["state"] == "CANCELLED"


def test_abandoning_a_reconciliation_whose_run_is_retired_at_once_answers_dead() -> None:
    st, runs = _claimed_runs(DEAD_KEPT + 1)
    (run_id, fence), *others = runs
    _do(st, m.FailRun(run_id=run_id, attempt=1, fence=fence, worker_id="w",
                      error_class="ambiguous", message="unknown"), 300)
    for i, (other, other_fence) in enumerate(others):  # as many DEAD runs as are kept
        _do(st, m.FailRun(run_id=other, attempt=1, fence=other_fence, worker_id="w",
                          error_class="permanent", message="no"), 301 + i)
    dec = _do(st, m.ResolveReconciliation(run_id=run_id, decision="abandon"), 400)
    assert st.run(run_id) is None  # the oldest of the DEAD ones: retired by its own end
    assert dec.status == "ok" and dec.body == {"run_id": run_id, "state": "DEAD"}
    again = _do(st, m.TriggerRun(request_key="k0"), 401)
    assert again.body == {"run_id": run_id, "state": "DEAD"}
