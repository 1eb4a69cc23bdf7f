"""Decider rules for the schedule lifecycle: create, revise, pause/resume, delete, tenant policy.

One test per rule (docs/design.md §2-§3), each named after the rule; given (history) / when
(command) / then (events and status).
"""

from __future__ import annotations

from support.decider import GivenWhenThen


def test_create_emits_schedule_created_with_the_first_instant(gwt: GivenWhenThen) -> None:
    m = gwt.m
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(cron="0 10 * * *")), gwt.T0)
    assert d.status == "ok"
    created = gwt.one(d, m.ScheduleCreated)
    assert created.revision == 1
    assert created.next_run_at == gwt.T0.replace(hour=10)
    assert created.anchor == gwt.T0


def test_create_with_same_request_key_and_spec_is_idempotent(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    d = s.when(m.CreateSchedule(spec=gwt.spec(), request_key="create-1"), gwt.T0 + gwt.sec(5))
    assert d.status == "ok"
    assert d.events == []
    assert d.body["revision"] == 1


def test_create_retried_after_a_revision_is_still_idempotent(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    s.given(m.ReviseSchedule(spec=gwt.spec(every=120.0), expected_revision=1), gwt.T0 + gwt.sec(1))
    d = s.when(m.CreateSchedule(spec=gwt.spec(), request_key="create-1"), gwt.T0 + gwt.sec(2))
    assert (d.status, d.events) == ("ok", [])
    assert d.body["revision"] == 2


def test_create_with_same_request_key_other_spec_is_conflict(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    d = s.when(m.CreateSchedule(spec=gwt.spec(every=120.0), request_key="create-1"), gwt.T0)
    assert d.status == "conflict"
    assert d.events == []
    assert d.body["revision"] == 1


def test_create_on_a_taken_schedule_id_without_the_key_is_conflict(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    d = s.when(m.CreateSchedule(spec=gwt.spec(), request_key="another"), gwt.T0)
    assert d.status == "conflict"


def test_create_with_job_type_not_allowed_is_forbidden(gwt: GivenWhenThen) -> None:
    m = gwt.m
    tenant = gwt.TenantContext(allowed_jobs=frozenset({"etl"}))
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec()), gwt.T0, tenant)
    assert (d.status, d.events, d.field) == ("forbidden", [], "job.type")


def test_a_rule_firing_more_often_than_the_tenants_minimum_interval_is_invalid(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    default = gwt.TenantContext()  # one second
    for kind, value in (("every", 0.001), ("delay", 0.5)):
        spec = gwt.spec(**{"every": None, kind: value})
        d = gwt.when(gwt.given(), m.CreateSchedule(spec=spec), gwt.T0, default)
        assert (d.status, d.events, d.field) == ("invalid", [], kind), d.reason
    assert gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(every=1.0)), gwt.T0, default).ok
    slow = gwt.TenantContext(min_interval=120.0)
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(every=None, cron="* 3 * * *")),
                 gwt.T0, slow)
    assert (d.status, d.events, d.field) == ("invalid", [], "cron"), d.reason
    ok = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(every=None, cron="*/5 * * * *")),
                  gwt.T0, slow)
    assert ok.ok, ok.reason
    # a revision is held to the same minimum
    s = gwt.story().create(gwt.T0)
    d = s.when(m.ReviseSchedule(spec=gwt.spec(every=60.0), expected_revision=1), gwt.T0, slow)
    assert (d.status, d.events, d.field) == ("invalid", [], "every")


def test_revise_with_job_type_not_allowed_is_forbidden(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    tenant = gwt.TenantContext(allowed_jobs=frozenset({"report"}))
    d = s.when(m.ReviseSchedule(spec=gwt.spec(job={"type": "rm-rf"}), expected_revision=1),
               gwt.T0, tenant)
    assert (d.status, d.events) == ("forbidden", [])


def test_create_of_a_one_shot_in_the_past_is_invalid(gwt: GivenWhenThen) -> None:
    m = gwt.m
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(at=gwt.T0 - gwt.sec(3600))), gwt.T0)
    assert (d.status, d.field) == ("invalid", "at")


def test_revise_with_stale_revision_is_conflict_carrying_current_revision(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    s.given(m.ReviseSchedule(spec=gwt.spec(every=120.0), expected_revision=1), gwt.T0)
    d = s.when(m.ReviseSchedule(spec=gwt.spec(every=300.0), expected_revision=1), gwt.T0)
    assert d.status == "conflict"
    assert d.events == []
    assert d.body["revision"] == 2


def test_revision_changes_only_unmaterialized_occurrences(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="allow")
    [first] = s.materialize(gwt.T0)
    d = s.when(m.ReviseSchedule(spec=gwt.spec(every=60.0,
                                              job={"type": "report", "params": {"n": 2}}),
                                expected_revision=1), gwt.T0 + gwt.sec(30))
    revised = gwt.one(d, m.ScheduleRevised)
    assert revised.revision == 2
    # the materialized occurrence keeps its revision and parameters...
    run = s.run(first.run_id)
    assert (run.revision, run.job.params) == (1, {"n": 1})
    # ...and no instant is reused: the next one is strictly after the materialized one
    assert revised.next_run_at is not None and revised.next_run_at > first.scheduled_at
    [second] = s.materialize(gwt.T0 + gwt.sec(60))
    assert (second.revision, second.job.params) == (2, {"n": 2})
    assert second.scheduled_at == gwt.T0 + gwt.sec(60)


def test_revise_never_silently_drops_an_instant_already_due(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="allow")
    s.materialize(gwt.T0)
    # 09:01 is due but no Tick has run yet when the revision arrives at 09:01:30
    d = s.when(m.ReviseSchedule(spec=gwt.spec(every=300.0), expected_revision=1),
               gwt.T0 + gwt.sec(90))
    at_0901 = gwt.T0 + gwt.sec(60)
    accounted = [e for e in s.history
                 if isinstance(e, (m.OccurrenceMaterialized, m.OccurrenceSkipped))
                 and e.scheduled_at == at_0901]
    assert len(accounted) == 1, gwt.names(d)


def test_pause_stops_materialization_and_pause_twice_is_a_no_op(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    s.materialize(gwt.T0)
    d = s.when(m.PauseSchedule(reason="maintenance"), gwt.T0 + gwt.sec(1))
    assert gwt.names(d) == ["SchedulePaused"]
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(600)).events == []
    assert s.when(m.PauseSchedule(), gwt.T0 + gwt.sec(601)).events == []


def test_pause_first_settles_instants_already_due(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    s.materialize(gwt.T0)
    # 09:01 is due but not yet ticked when the pause arrives: it is not "missed while paused"
    d = s.when(m.PauseSchedule(), gwt.T0 + gwt.sec(65))
    assert gwt.names(d) == ["OccurrenceMaterialized", "SchedulePaused"]
    assert gwt.one(d, m.OccurrenceMaterialized).scheduled_at == gwt.T0 + gwt.sec(60)


def test_revise_while_paused_applies_the_new_rule_to_the_paused_span_on_resume(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire="all")
    s.materialize(gwt.T0)
    s.given(m.PauseSchedule(), gwt.T0 + gwt.sec(1))
    d = s.when(m.ReviseSchedule(spec=gwt.spec(every=120.0, misfire="all"), expected_revision=1),
               gwt.T0 + gwt.sec(300))
    assert gwt.one(d, m.ScheduleRevised).next_run_at == gwt.T0 + gwt.sec(120)
    d = s.when(m.ResumeSchedule(), gwt.T0 + gwt.sec(400))
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == [
        gwt.T0 + gwt.sec(120), gwt.T0 + gwt.sec(240), gwt.T0 + gwt.sec(360)]
    assert {e.revision for e in gwt.all(d, m.OccurrenceMaterialized)} == {2}


def test_resume_applies_misfire_to_the_paused_span(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire="latest")
    s.materialize(gwt.T0)
    s.given(m.PauseSchedule(), gwt.T0 + gwt.sec(1))
    # paused across 09:01 .. 09:05; resumed at 09:05:30 (09:05 is within the 60 s grace)
    d = s.when(m.ResumeSchedule(), gwt.T0 + gwt.sec(330))
    assert gwt.names(d)[0] == "ScheduleResumed"
    skipped = gwt.all(d, m.OccurrenceSkipped)
    assert [e.scheduled_at for e in skipped] == [gwt.T0 + gwt.sec(60 * k) for k in (1, 2, 3, 4)]
    assert {e.reason for e in skipped} == {"coalesced"}  # latest: coalesced into the newest
    [ran] = gwt.all(d, m.OccurrenceMaterialized)
    assert ran.scheduled_at == gwt.T0 + gwt.sec(300)


def test_resume_with_misfire_all_runs_every_paused_instant(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire="all")
    s.materialize(gwt.T0)
    s.given(m.PauseSchedule(), gwt.T0 + gwt.sec(1))
    d = s.when(m.ResumeSchedule(), gwt.T0 + gwt.sec(330))
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == [
        gwt.T0 + gwt.sec(60 * k) for k in range(1, 6)]
    assert gwt.all(d, m.OccurrenceSkipped) == []


def test_delete_cancels_runs_not_started_and_stops_the_schedule(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    [a] = s.materialize(gwt.T0)
    [b] = s.materialize(gwt.T0 + gwt.sec(60))
    claimed = s.claim(a.run_id, gwt.T0 + gwt.sec(61))
    d = s.when(m.DeleteSchedule(), gwt.T0 + gwt.sec(62))
    assert gwt.names(d) == ["OccurrenceCancelled", "ScheduleDeleted"]
    assert gwt.one(d, m.OccurrenceCancelled).run_id == b.run_id
    assert s.run(a.run_id).state == "LEASED"  # a running attempt finishes under its fence
    assert s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(63)).status == "ok"
    assert gwt.all(s.when(m.Tick(), gwt.T0 + gwt.sec(900)), m.OccurrenceMaterialized) == []
    assert s.state.next_run_at is None
    assert s.when(m.CreateSchedule(spec=gwt.spec()), gwt.T0).status == "conflict"


def test_a_run_of_a_deleted_schedule_is_never_retried(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, retry={"max_attempts": 5})
    [a] = s.materialize(gwt.T0)
    claimed = s.claim(a.run_id, gwt.T0 + gwt.sec(1))
    s.given(m.DeleteSchedule(), gwt.T0 + gwt.sec(2))
    d = s.when(m.FailRun(run_id=a.run_id, attempt=1, fence=claimed.fence, worker_id="w1",
                         error_class="transient"), gwt.T0 + gwt.sec(3))
    assert "RetryScheduled" not in gwt.names(d)
    assert s.run(a.run_id).state == "CANCELLED"


def test_revising_a_one_shot_to_a_past_instant_is_invalid(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, at=(gwt.T0 + gwt.sec(3600)).isoformat())
    d = s.when(m.ReviseSchedule(spec=gwt.spec(at=(gwt.T0 - gwt.sec(3600)).isoformat()),
                                expected_revision=1), gwt.T0)
    assert (d.status, d.field, d.events) == ("invalid", "at", [])


def test_create_of_a_cron_rule_that_can_never_fire_is_invalid(gwt: GivenWhenThen) -> None:
    m = gwt.m
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(cron="0 0 */31 * 1#5")), gwt.T0)
    assert (d.status, d.events, d.field) == ("invalid", [], "cron")
    assert "never fall on the same day" in d.reason


def test_a_recorded_cron_rule_that_can_never_fire_folds_and_materializes_nothing(
    gwt: GivenWhenThen,
) -> None:
    # an earlier version accepted such a rule: its ScheduleCreated must still fold
    m = gwt.m
    created = gwt.one(gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec(cron="0 0 1 * *")),
                               gwt.T0), m.ScheduleCreated)
    never = created.model_copy(update={"spec": gwt.spec(cron="0 0 */31 * 1#5"),
                                       "next_run_at": None, "next_due_at": None})
    s = gwt.story().given_events(never)
    assert s.state.status == "ACTIVE"
    events = s.when(m.Tick(), gwt.T0 + gwt.sec(86400 * 400)).events
    assert [type(e) for e in events] == [m.ScheduleCompleted]  # no run: it is exhausted
