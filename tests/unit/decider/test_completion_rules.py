"""Decider rules for the end of a schedule: with no further instant it becomes COMPLETED.

A fired one-shot, an ``end`` passed or ``maxCount`` reached: the decision that handles the
last instant (or a Tick that finds none left) emits ScheduleCompleted. COMPLETED is terminal:
it leaves the quota (``exists`` is false), its runs go on to finish, only delete applies.
"""

from __future__ import annotations

from chronolog.commands.decider import next_wakeup
from chronolog.domain.ids import run_id_for
from support.decider import GivenWhenThen


def test_a_one_shot_completes_when_its_instant_is_materialized(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, at=gwt.T0 + gwt.sec(60))
    assert s.state.status == "ACTIVE" and s.state.exists
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60))
    assert gwt.names(d) == ["OccurrenceMaterialized", "ScheduleCompleted"]
    done = gwt.one(d, m.ScheduleCompleted)
    assert (done.reason, done.completed_at, done.last_scheduled_at, done.count) == (
        "at", gwt.T0 + gwt.sec(60), gwt.T0 + gwt.sec(60), 1)
    assert s.state.status == "COMPLETED" and not s.state.exists  # out of the quota count
    assert s.replayed().snapshot() == s.state.snapshot()


def test_a_schedule_completes_when_max_count_is_reached(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, max_count=2)
    assert gwt.all(s.when(m.Tick(), gwt.T0), m.ScheduleCompleted) == []
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60))
    assert gwt.one(d, m.ScheduleCompleted).reason == "max_count"
    assert s.state.status == "COMPLETED"


def test_a_schedule_completes_when_its_end_has_passed(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, end=gwt.T0 + gwt.sec(150))
    s.materialize(gwt.T0)
    s.materialize(gwt.T0 + gwt.sec(60))
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(120))  # 09:02 is the last instant before the end
    assert gwt.names(d) == ["OccurrenceMaterialized", "ScheduleCompleted"]
    assert gwt.one(d, m.ScheduleCompleted).reason == "end"


def test_a_one_shot_skipped_by_its_misfire_policy_still_completes(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, at=gwt.T0 + gwt.sec(60), misfire={"policy": "skip", "grace": 5})
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(600))
    assert gwt.names(d) == ["OccurrenceSkipped", "ScheduleCompleted"]
    assert gwt.one(d, m.ScheduleCompleted).count == 0


def test_a_fixed_delay_schedule_completes_when_its_last_run_finishes(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, delay=60.0, max_count=1)
    [run] = s.materialize(gwt.T0)
    assert s.state.status == "ACTIVE"  # its next instant would be planned when the run ends
    claimed = s.claim(run.run_id, gwt.T0)
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(5))
    assert gwt.names(d)[-1] == "ScheduleCompleted"
    assert gwt.one(d, m.ScheduleCompleted).reason == "max_count"


def test_the_runs_of_a_completed_schedule_still_finish(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(gwt.T0, at=gwt.T0)
    [run] = s.materialize(gwt.T0)
    assert s.state.status == "COMPLETED"
    claimed = s.claim(run.run_id, gwt.T0 + gwt.sec(1))
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(2))
    assert d.ok and gwt.names(d) == ["ResultPublished"]


def test_no_occurrence_is_materialized_after_completed(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, max_count=1)
    s.materialize(gwt.T0)
    assert s.state.status == "COMPLETED"
    assert next_wakeup(s.state) is None
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(3600)).events == []


def test_a_completed_schedule_refuses_revise_pause_resume_and_trigger(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, at=gwt.T0)
    s.materialize(gwt.T0)
    now = gwt.T0 + gwt.sec(10)
    for command in (m.ReviseSchedule(expected_revision=1, spec=gwt.spec(every=60.0)),
                    m.PauseSchedule(), m.ResumeSchedule(), m.TriggerRun(request_key="k")):
        d = s.when(command, now)
        assert (d.status, d.body.get("state"), d.events) == ("conflict", "COMPLETED", []), command
        assert "COMPLETED" in d.reason


def test_a_completed_schedule_can_be_deleted(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, at=gwt.T0)
    s.materialize(gwt.T0)
    d = s.when(m.DeleteSchedule(), gwt.T0 + gwt.sec(10))
    assert d.ok and gwt.names(d)[-1] == "ScheduleDeleted"
    assert s.state.status == "DELETED"


def test_a_pause_that_handles_the_last_instant_completes_instead_of_pausing(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, at=gwt.T0 + gwt.sec(60))
    d = s.when(m.PauseSchedule(), gwt.T0 + gwt.sec(61))
    assert gwt.names(d) == ["OccurrenceMaterialized", "ScheduleCompleted"]
    assert d.ok and d.body["state"] == "COMPLETED"


def test_a_paused_schedule_whose_end_passed_completes_on_resume(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, end=gwt.T0 + gwt.sec(90), misfire="skip")
    s.materialize(gwt.T0)
    s.given(m.PauseSchedule(), gwt.T0 + gwt.sec(1))
    d = s.when(m.ResumeSchedule(), gwt.T0 + gwt.sec(600))
    assert gwt.names(d) == ["ScheduleResumed", "OccurrenceSkipped", "ScheduleCompleted"]
    assert gwt.one(d, m.ScheduleCompleted).reason == "end"


def test_a_tick_completes_a_schedule_that_ended_in_a_log_written_before_completed_existed(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    spec = gwt.spec(at=gwt.T0)
    state = gwt.given(
        m.ScheduleCreated(revision=1, spec=spec, created_at=gwt.T0, anchor=gwt.T0,
                          next_run_at=gwt.T0, next_due_at=gwt.T0),
        m.OccurrenceMaterialized(run_id=run_id_for(gwt.TENANT, "s1", gwt.T0),
                                 scheduled_at=gwt.T0, due_at=gwt.T0, revision=1, job=spec.job,
                                 state="READY", sequence=1),
    )
    assert state.status == "ACTIVE" and state.next_run_at is None
    wake = next_wakeup(state)
    assert wake is not None and wake <= gwt.T0 + gwt.sec(3600)
    d = gwt.when(state, m.Tick(), gwt.T0 + gwt.sec(3600))
    assert gwt.names(d) == ["ScheduleCompleted"]
