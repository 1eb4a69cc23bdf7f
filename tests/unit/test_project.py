"""The pure projection (event -> row changes) and the RowChanges merge rules. No I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec
from chronolog.projections.project import FIRST_ATTEMPT, project, project_batch
from chronolog.projections.store import TABLES, First, RowChanges, Tally

T0 = datetime(2030, 3, 1, 9, 0, tzinfo=UTC)
TENANT, SID = "acme", "nightly"
SKEY = (TENANT, SID)
RUN = "r_0123456789abcdef0123"
HOLIDAYS = CalendarSpec.model_validate({"timezone": "America/New_York", "dates": ["2026-12-25"]})
SPEC = m.ScheduleSpec(cron="0 9 * * *", timezone="Europe/Berlin",
                      job=m.JobSpec(type="report", params={"region": "eu"}))


def env(payload: Any, at: datetime = T0, n: int = 0) -> m.EventEnvelope:
    return m.EventEnvelope(event_id=f"c1.{n}", type=payload.type, key=f"{TENANT}/{SID}",
                           tenant=TENANT, schedule_id=SID, at=at, causation_id="c1",
                           payload=payload)


def sched_row(c: RowChanges) -> dict[str, Any]:
    return c.schedules[SKEY]


def run_row(c: RowChanges, run_id: str = RUN) -> dict[str, Any]:
    return c.runs[(run_id,)]


# One sample of every event type (the coverage test below keeps this complete).
SAMPLES: dict[str, Any] = {
    "ScheduleCreated": m.ScheduleCreated(revision=1, spec=SPEC, request_key="k1", created_at=T0,
                                         anchor=T0, next_run_at=T0 + timedelta(days=1),
                                         next_due_at=T0 + timedelta(days=1, seconds=3)),
    "ScheduleRevised": m.ScheduleRevised(revision=2, spec=SPEC, anchor=T0, next_run_at=None,
                                         next_due_at=None),
    "SchedulePaused": m.SchedulePaused(reason="maintenance", paused_at=T0),
    "ScheduleResumed": m.ScheduleResumed(resumed_at=T0, next_run_at=T0, next_due_at=T0),
    "ScheduleDeleted": m.ScheduleDeleted(),
    "ScheduleCompleted": m.ScheduleCompleted(reason="max_count", completed_at=T0,
                                             last_scheduled_at=T0, count=3),
    "NextRunPlanned": m.NextRunPlanned(next_run_at=T0, next_due_at=T0),
    "OccurrenceMaterialized": m.OccurrenceMaterialized(
        run_id=RUN, scheduled_at=T0, due_at=T0 + timedelta(seconds=3), revision=1,
        job=SPEC.job, state="READY", sequence=7, resource_class="gpu", priority=5,
        next_run_at=T0 + timedelta(days=1), next_due_at=T0 + timedelta(days=1, seconds=1)),
    "OccurrenceSkipped": m.OccurrenceSkipped(run_id=RUN, scheduled_at=T0, reason="misfire",
                                             through=T0 + timedelta(hours=3), count=4,
                                             revision=1, next_run_at=T0 + timedelta(days=1),
                                             next_due_at=T0 + timedelta(days=1)),
    "OccurrenceReady": m.OccurrenceReady(run_id=RUN, attempt=2, resource_class="gpu", priority=5),
    "AttemptClaimed": m.AttemptClaimed(run_id=RUN, attempt=1, fence=4, worker_id="w1",
                                       claimed_at=T0 + timedelta(seconds=5),
                                       lease_until=T0 + timedelta(seconds=35)),
    "FenceAdvanced": m.FenceAdvanced(fence=4, run_id=RUN, reason="claim"),
    "LeaseExtended": m.LeaseExtended(run_id=RUN, attempt=1, fence=4,
                                     lease_until=T0 + timedelta(seconds=65)),
    "LeaseExpired": m.LeaseExpired(run_id=RUN, attempt=1, fence=4,
                                   lease_until=T0 + timedelta(seconds=65)),
    "AttemptFailed": m.AttemptFailed(run_id=RUN, attempt=1, fence=4, worker_id="w1",
                                     error_class="transient", message="timeout"),
    "RetryScheduled": m.RetryScheduled(run_id=RUN, attempt=2, retry_at=T0 + timedelta(minutes=1)),
    "OccurrenceDeadLettered": m.OccurrenceDeadLettered(run_id=RUN, reason="max_attempts",
                                                       message="3 attempts used"),
    "OccurrenceRedriven": m.OccurrenceRedriven(run_id=RUN, attempt=4, by="ops"),
    "ResultPublished": m.ResultPublished(run_id=RUN, attempt=1, fence=4, worker_id="w1",
                                         checksum="sha256:ab", size=12, inline={"rows": 3},
                                         finished_at=T0 + timedelta(seconds=20)),
    "CompletionRejected": m.CompletionRejected(run_id=RUN, attempt=1, fence=3, current_fence=4,
                                               worker_id="w0", checksum="sha256:cd",
                                               reason="stale_fence"),
    "CancellationRequested": m.CancellationRequested(run_id=RUN, by="ops", reason="wrong params"),
    "OccurrenceCancelled": m.OccurrenceCancelled(run_id=RUN, by="ops", reason="wrong params"),
    "ReconciliationRequired": m.ReconciliationRequired(run_id=RUN, reason="ambiguous",
                                                       evidence={"status": 504}),
    "ReconciliationResolved": m.ReconciliationResolved(run_id=RUN, decision="delivered",
                                                       by="ops", note="checked"),
    "EffectIntended": m.EffectIntended(effect_id=f"send-{RUN}", run_id=RUN, kind="email",
                                       config={"to": "a@b"}, checksum="sha256:ab", attempt=1),
    "EffectSucceeded": m.EffectSucceeded(effect_id=f"send-{RUN}", run_id=RUN,
                                         evidence={"id": "m1"}),
    "EffectUncertain": m.EffectUncertain(effect_id=f"send-{RUN}", run_id=RUN,
                                         evidence={"error": "reset"}),
    "EffectFailed": m.EffectFailed(effect_id=f"send-{RUN}", run_id=RUN, evidence={"code": 550}),
    "BackfillRequested": m.BackfillRequested(request_key="bf", digest="d", start=T0,
                                             end=T0 + timedelta(hours=3), overlap="allow",
                                             instants=3, runs=2, accounted=1, backfilled=0),
    "RunAwaitsPermit": m.RunAwaitsPermit(run_id=RUN, key="customer-7", limit=2, ask="a1"),
    "RunPermitted": m.RunPermitted(run_id=RUN, ask="a1"),
    "RunPermitReturned": m.RunPermitReturned(run_id=RUN, ask="a1"),
    "CalendarCopied": m.CalendarCopied(name="hol", revision=2, spec=HOLIDAYS),
}
# the tenant quota saga's events: no row (a held create is not a schedule yet)
QUOTA_SAMPLES: dict[str, Any] = {
    "ScheduleCreationHeld": m.ScheduleCreationHeld(command_id="c1", spec=SPEC),
    "ScheduleCreationRefused": m.ScheduleCreationRefused(command_id="c1", status="quota",
                                                         reason="full", release=False),
    "QuotaSlotReserved": m.QuotaSlotReserved(schedule_id="s1", create_command_id="c1",
                                             max_schedules=3, expires_at=T0),
    "QuotaSlotRefused": m.QuotaSlotRefused(schedule_id="s1", create_command_id="c1",
                                           max_schedules=3, taken=3, reserved=0, reason="full"),
    "QuotaSlotConfirmed": m.QuotaSlotConfirmed(schedule_id="s1", create_command_id="c1"),
    "QuotaSlotReleased": m.QuotaSlotReleased(schedule_id="s1", create_command_id="c1",
                                             reason="expired", released_at=T0),
    # a key moving between partitions changes none of its rows (docs/design.md §18)
    "KeyMovedOut": m.KeyMovedOut(to_partition=3, version=2),
    "KeyMovedIn": m.KeyMovedIn(state="[]", state_version=1, from_partition=1, version=2),
    "RoutingVersionAdded": m.RoutingVersionAdded(partitions=(2, 4)),
    "HandedOver": m.HandedOver(version=2),
    "HandoverReceived": m.HandoverReceived(version=2, sender=1),
    # a concurrency key's permits: no row (their runs show what they wait for)
    "PermitGranted": m.PermitGranted(key="k", run_id=RUN, schedule_id="s1", ask="a1", limit=2,
                                     holders=1),
    "PermitQueued": m.PermitQueued(key="k", run_id=RUN, schedule_id="s1", ask="a1", limit=2,
                                   holders=2, position=1),
    "PermitReleased": m.PermitReleased(key="k", run_id=RUN, schedule_id="s1", ask="a1",
                                       held=True, holders=0),
    # the schedules that name a calendar: no row (their definitions name it)
    "CalendarSubscribed": m.CalendarSubscribed(name="hol", schedule_id="s1"),
    "CalendarUnsubscribed": m.CalendarUnsubscribed(name="hol", schedule_id="s1"),
}
# a calendar's revisions: its row of calendars
CALENDAR_SAMPLES: dict[str, Any] = {
    "CalendarRevised": m.CalendarRevised(name="hol", revision=2, spec=HOLIDAYS),
    "CalendarDeleted": m.CalendarDeleted(name="hol", revision=3),
}


def test_every_event_type_has_a_sample() -> None:
    assert set(SAMPLES) | set(QUOTA_SAMPLES) | set(CALENDAR_SAMPLES) == {
        t.model_fields["type"].default for t in m.EVENT_TYPES}


def test_a_calendars_revisions_and_deletion_are_its_row() -> None:
    key = ("acme", "hol")
    revised = project(env(CALENDAR_SAMPLES["CalendarRevised"], at=T0)).calendars[key]
    assert (revised["revision"], revised["spec"], revised["deleted_at"]) == (
        2, {"dates": ["2026-12-25"], "timezone": "America/New_York"}, None)
    deleted = project(env(CALENDAR_SAMPLES["CalendarDeleted"], at=T0)).calendars[key]
    assert (deleted["revision"], deleted["spec"], deleted["deleted_at"]) == (3, None, T0)
    for name in CALENDAR_SAMPLES:  # no schedule row: a calendar is not a schedule
        c = project(env(CALENDAR_SAMPLES[name]))
        assert not c.schedules and not c.runs


def test_an_excluded_instant_records_the_calendar_that_excluded_it() -> None:
    skip = m.OccurrenceSkipped(run_id=RUN, scheduled_at=T0, reason="excluded", calendar="hol",
                               calendar_revision=2, excluded_by="2026-12-25")
    row = run_row(project(env(skip)))
    assert (row["skipped_reason"], row["exclusion"]) == (
        "excluded", {"calendar": "hol", "revision": 2, "entry": "2026-12-25"})


@pytest.mark.parametrize("name", sorted(QUOTA_SAMPLES))
def test_the_quota_sagas_events_change_no_row(name: str) -> None:
    c = project(env(QUOTA_SAMPLES[name]))
    assert all(not c.table(table) for table in TABLES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_event_projects_valid_changes_and_stamps_the_schedule(name: str) -> None:
    at = T0 + timedelta(minutes=9)
    c = project(env(SAMPLES[name], at=at))
    assert sched_row(c)["last_event_at"] == at
    for table in TABLES:
        for key, row in c.table(table).items():
            assert len(key) == len(TABLES[table].key)
            assert set(row) <= TABLES[table].columns
            if "updated_at" in TABLES[table].columns and table != "schedules":
                assert row["updated_at"] == at  # runs and effects (attempts have none)


def test_project_is_pure_and_deterministic() -> None:
    e = env(SAMPLES["OccurrenceMaterialized"])
    assert project(e) == project(e)


# ------------------------------------------------------------------ schedules


def test_schedule_created_sets_every_required_column() -> None:
    c = project(env(SAMPLES["ScheduleCreated"]))
    row = sched_row(c)
    assert TABLES["schedules"].required <= set(row)  # an insert, not a partial update
    assert row["state"] == "ACTIVE" and row["revision"] == 1
    assert row["spec"]["cron"] == "0 9 * * *" and row["spec"]["job"]["params"] == {"region": "eu"}
    assert row["next_run_at"] == T0 + timedelta(days=1)
    assert row["created_at"] == T0 and row["request_key"] == "k1"
    assert row["deleted_at"] is None and row["paused_at"] is None
    assert not c.runs and not c.attempts and not c.effects


def test_schedule_lifecycle_columns() -> None:
    revised = sched_row(project(env(SAMPLES["ScheduleRevised"])))
    assert revised["revision"] == 2 and revised["next_run_at"] is None
    assert "state" not in revised and "created_at" not in revised

    paused = sched_row(project(env(SAMPLES["SchedulePaused"])))
    assert (paused["state"], paused["paused_at"], paused["pause_reason"]) == (
        "PAUSED", T0, "maintenance")
    assert "next_run_at" not in paused  # pausing keeps the next instant

    resumed = sched_row(project(env(SAMPLES["ScheduleResumed"])))
    assert resumed["state"] == "ACTIVE" and resumed["paused_at"] is None

    deleted = sched_row(project(env(SAMPLES["ScheduleDeleted"], at=T0)))
    assert deleted["state"] == "DELETED" and deleted["deleted_at"] == T0
    assert deleted["next_run_at"] is None and deleted["next_due_at"] is None

    completed = sched_row(project(env(SAMPLES["ScheduleCompleted"], at=T0)))
    assert (completed["state"], completed["completed_at"], completed["completed_reason"]) == (
        "COMPLETED", T0, "max_count")
    assert completed["next_run_at"] is None and completed["next_due_at"] is None

    planned = sched_row(project(env(SAMPLES["NextRunPlanned"])))
    assert set(planned) == {"next_run_at", "next_due_at", "last_event_at"}

    fence = sched_row(project(env(SAMPLES["FenceAdvanced"])))
    assert fence["fence"] == 4


# ------------------------------------------------------------------ runs


def test_materialized_creates_the_run_and_advances_the_schedule() -> None:
    c = project(env(SAMPLES["OccurrenceMaterialized"], at=T0 + timedelta(seconds=1)))
    row = run_row(c)
    assert TABLES["runs"].required <= set(row)
    assert (row["tenant"], row["schedule_id"], row["trigger"], row["state"]) == (
        TENANT, SID, "schedule", "READY")
    assert row["scheduled_at"] == T0 and row["due_at"] == T0 + timedelta(seconds=3)
    assert row["params"] == {"region": "eu"} and row["job_type"] == "report"
    assert row["attempt"] == 1 and row["sequence"] == 7 and row["resource_class"] == "gpu"
    assert row["ready_at"] == T0 + timedelta(seconds=1)
    assert sched_row(c)["next_run_at"] == T0 + timedelta(days=1)


def test_manual_materialization_leaves_the_schedule_alone() -> None:
    manual = SAMPLES["OccurrenceMaterialized"].model_copy(update=dict(
        run_id="m_1", trigger="manual", request_key="req-1", state="PENDING",
        advances_schedule=False, next_run_at=None, next_due_at=None))
    c = project(env(manual))
    row = run_row(c, "m_1")
    assert row["trigger"] == "manual" and row["request_key"] == "req-1"
    assert row["state"] == "PENDING" and row["ready_at"] is None
    assert "next_run_at" not in sched_row(c)


def test_skipped_unmaterialized_instant_is_recorded_with_its_reason() -> None:
    c = project(env(SAMPLES["OccurrenceSkipped"]))
    row = run_row(c)
    assert TABLES["runs"].required <= set(row)  # a row of its own
    assert row["state"] == "SKIPPED" and row["skipped_reason"] == "misfire"
    assert row["skipped_count"] == 4 and row["skipped_through"] == T0 + timedelta(hours=3)
    assert row["trigger"] == "schedule"
    assert sched_row(c)["next_run_at"] == T0 + timedelta(days=1)


def test_skipped_materialized_run_is_a_partial_update() -> None:
    e = SAMPLES["OccurrenceSkipped"].model_copy(update=dict(
        materialized=True, reason="start_deadline", count=1, through=None,
        advances_schedule=False))
    c = project(env(e, at=T0 + timedelta(minutes=5)))
    row = run_row(c)
    assert not TABLES["runs"].required <= set(row)
    assert "scheduled_at" not in row and "revision" not in row
    assert row["state"] == "SKIPPED" and row["finished_at"] == T0 + timedelta(minutes=5)
    assert "next_run_at" not in sched_row(c)


def test_skipped_manual_trigger() -> None:
    e = SAMPLES["OccurrenceSkipped"].model_copy(update=dict(
        run_id="m_2", reason="overlap", request_key="req-2", advances_schedule=False))
    assert run_row(project(env(e)), "m_2")["trigger"] == "manual"


def test_claim_sets_the_first_start_and_opens_an_attempt() -> None:
    c = project(env(SAMPLES["AttemptClaimed"]))
    row = run_row(c)
    assert row["state"] == "LEASED" and row["attempt"] == 1
    assert row["started_at"] == First(T0 + timedelta(seconds=5))
    assert not c.attempts  # attempt 1: columns of the run's row
    assert (row["first_fence"], row["first_worker_id"], row["first_outcome"]) == (4, "w1", None)
    assert row["first_lease_until"] == T0 + timedelta(seconds=35)


def test_a_first_attempt_is_columns_of_its_run_and_a_later_one_a_row_of_attempts() -> None:
    claim = SAMPLES["AttemptClaimed"]
    second = project(env(claim.model_copy(update={"attempt": 2, "fence": 5})))
    att = second.attempts[(RUN, 2)]
    assert TABLES["attempts"].required <= set(att)
    assert (att["fence"], att["worker_id"], att["claimed_at"]) == (5, "w1", claim.claimed_at)
    row = run_row(second)
    assert row["attempt"] == 2 and not {c for c in row if c.startswith("first_")}
    # every column of an attempt has its run-row twin for attempt 1, but the claim time
    assert set(FIRST_ATTEMPT) == TABLES["attempts"].columns - {
        "run_id", "attempt", "claimed_at", "scheduled_at"}
    assert set(FIRST_ATTEMPT.values()) <= TABLES["runs"].columns


def test_lease_extended_and_expired_touch_only_the_attempt() -> None:
    ext = project(env(SAMPLES["LeaseExtended"]))
    assert set(run_row(ext)) == {"first_lease_until", "updated_at"}
    exp = project(env(SAMPLES["LeaseExpired"], at=T0 + timedelta(seconds=70)))
    row = run_row(exp)  # the following OccurrenceReady / RetryScheduled moves the run
    assert "state" not in row
    assert row["first_outcome"] == "lease_expired"
    assert row["first_finished_at"] == T0 + timedelta(seconds=70)


def test_attempt_failed_records_the_error_not_the_state() -> None:
    c = project(env(SAMPLES["AttemptFailed"]))
    row = run_row(c)
    assert row["first_outcome"] == "failed" and row["first_error"] == "timeout"
    assert "state" not in row and row["last_error_class"] == "transient"


def test_retry_dead_redrive() -> None:
    retry = run_row(project(env(SAMPLES["RetryScheduled"])))
    assert (retry["state"], retry["attempt"]) == ("RETRY_WAIT", 2)
    assert retry["retry_at"] == T0 + timedelta(minutes=1)

    dead = run_row(project(env(SAMPLES["OccurrenceDeadLettered"], at=T0)))
    assert (dead["state"], dead["dead_reason"], dead["finished_at"]) == ("DEAD", "max_attempts", T0)

    redriven = run_row(project(env(SAMPLES["OccurrenceRedriven"], at=T0)))
    assert (redriven["state"], redriven["attempt"]) == ("READY", 4)
    assert redriven["finished_at"] is None and redriven["dead_reason"] is None
    assert "started_at" not in redriven  # start lateness stays that of the first start


def test_ready_clears_retry_at() -> None:
    row = run_row(project(env(SAMPLES["OccurrenceReady"], at=T0)))
    assert (row["state"], row["attempt"], row["ready_at"], row["retry_at"]) == (
        "READY", 2, T0, None)


def test_result_published_sets_the_canonical_result() -> None:
    c = project(env(SAMPLES["ResultPublished"]))
    row = run_row(c)
    assert row["state"] == "SUCCEEDED"
    assert ((row["result_checksum"], row["result_size"], row["result_uri"])
            == ("sha256:ab", 12, None))
    assert row["result_inline"] == {"rows": 3} and row["result_attempt"] == 1
    assert row["finished_at"] == T0 + timedelta(seconds=20)
    assert "scheduled_at" not in row  # a partial change: the rest of the row stays
    assert row["first_outcome"] == "succeeded"


def test_a_run_waiting_for_a_permit_shows_its_key_until_granted_or_given_back() -> None:
    waits = run_row(project(env(SAMPLES["RunAwaitsPermit"])))
    assert waits["permit_wait"] == {"key": "customer-7", "limit": 2}
    assert "state" not in waits  # it stays READY: only what it waits for changes
    for name in ("RunPermitted", "RunPermitReturned"):
        assert run_row(project(env(SAMPLES[name])))["permit_wait"] is None


def test_completion_rejected_changes_no_row() -> None:
    c = project(env(SAMPLES["CompletionRejected"]))
    assert not c.runs and not c.attempts and not c.effects
    assert set(sched_row(c)) == {"last_event_at"}


def test_cancellation() -> None:
    req = run_row(project(env(SAMPLES["CancellationRequested"])))
    assert req["cancellation_requested"] is True and "state" not in req
    done = run_row(project(env(SAMPLES["OccurrenceCancelled"], at=T0)))
    assert (done["state"], done["finished_at"], done["cancel_reason"]) == ("CANCELLED", T0,
                                                                          "wrong params")
    bare = run_row(project(env(m.OccurrenceCancelled(run_id=RUN))))
    assert "cancel_reason" not in bare  # an empty reason keeps the requested one


def test_reconciliation_of_a_run() -> None:
    req = run_row(project(env(SAMPLES["ReconciliationRequired"], at=T0)))
    assert req["state"] == "RECONCILING"
    assert req["reconciliation"] == {"reason": "ambiguous", "effectId": None,
                                     "evidence": {"status": 504}, "at": "2030-03-01T09:00:00Z"}
    delivered = run_row(project(env(SAMPLES["ReconciliationResolved"], at=T0)))
    assert delivered["state"] == "SUCCEEDED" and delivered["finished_at"] == First(T0)
    assert delivered["reconciliation_resolution"]["decision"] == "delivered"
    for decision in ("retry", "abandon"):
        e = SAMPLES["ReconciliationResolved"].model_copy(update={"decision": decision})
        row = run_row(project(env(e)))
        assert "state" not in row  # the following OccurrenceReady / DeadLettered moves it


@pytest.mark.parametrize(("decision", "effect_state"),
                         [("delivered", "SUCCEEDED"), ("abandon", "ABANDONED"),
                          ("retry", "INTENDED")])
def test_reconciliation_of_an_effect(decision: str, effect_state: str) -> None:
    e = m.ReconciliationResolved(run_id=RUN, decision=decision, effect_id=f"send-{RUN}")
    c = project(env(e))
    assert c.effects[(f"send-{RUN}",)]["state"] == effect_state
    assert run_row(c)["state"] == "SUCCEEDED"  # as the decider's evolve has it


def test_effects() -> None:
    c = project(env(SAMPLES["EffectIntended"], at=T0))
    row = c.effects[(f"send-{RUN}",)]
    assert TABLES["effects"].required <= set(row)
    assert (row["kind"], row["state"], row["attempts"], row["run_id"]) == (
        "email", "INTENDED", 1, RUN)
    assert row["created_at"] == First(T0)
    for name, state in (("EffectSucceeded", "SUCCEEDED"), ("EffectUncertain", "UNCERTAIN"),
                        ("EffectFailed", "FAILED")):
        eff = project(env(SAMPLES[name])).effects[(f"send-{RUN}",)]
        assert eff["state"] == state and "kind" not in eff


# ------------------------------------------------------------------ folding a batch


def test_a_run_lifecycle_folds_into_one_row_per_table() -> None:
    names = ["OccurrenceMaterialized", "FenceAdvanced", "AttemptClaimed", "LeaseExtended",
             "ResultPublished", "EffectIntended", "EffectSucceeded"]
    batch = project_batch(env(SAMPLES[n], at=T0 + timedelta(seconds=i), n=i)
                          for i, n in enumerate(names))
    assert batch.row_count() == 3  # schedule, run (with its attempt 1), effect
    row = run_row(batch)
    assert row["state"] == "SUCCEEDED" and row["job_type"] == "report"
    assert row["started_at"] == First(T0 + timedelta(seconds=5))
    assert row["updated_at"] == T0 + timedelta(seconds=4)
    assert row["first_outcome"] == "succeeded"
    assert row["first_lease_until"] == T0 + timedelta(seconds=65)
    assert batch.effects[(f"send-{RUN}",)]["state"] == "SUCCEEDED"
    assert sched_row(batch)["last_event_at"] == T0 + timedelta(seconds=6)
    assert sched_row(batch)["fence"] == 4


def test_merge_rules() -> None:
    def one(**cols: Any) -> RowChanges:
        return RowChanges().set("runs", ("r",), **cols)

    def folded(*changes: RowChanges) -> dict[str, Any]:
        return RowChanges.fold(changes).runs[("r",)]

    assert folded(one(state="READY"), one(state="LEASED")) == {"state": "LEASED"}
    assert folded(one(state="READY", attempt=1), one(attempt=2)) == {"state": "READY", "attempt": 2}
    assert folded(one(dead_reason="x"), one(dead_reason=None)) == {"dead_reason": None}
    # First: the earliest non-null wins; a plain value after it overwrites
    assert folded(one(started_at=First(1)), one(started_at=First(2))) == {"started_at": First(1)}
    assert folded(one(started_at=First(None)), one(started_at=First(2))) == {"started_at": First(2)}
    assert folded(one(started_at=First(1)), one(started_at=3)) == {"started_at": 3}
    assert folded(one(started_at=3), one(started_at=First(1))) == {"started_at": 3}
    # a plain NULL then First: the column is NULL, so First fills it
    assert folded(one(started_at=None), one(started_at=First(1))) == {"started_at": 1}


def test_merge_does_not_alias_the_inputs() -> None:
    a = RowChanges().set("runs", ("r",), state="READY")
    b = RowChanges().set("runs", ("r",), attempt=2)
    folded = RowChanges.fold([a, b])
    folded.set("runs", ("r",), state="DEAD")
    assert a.runs[("r",)] == {"state": "READY"} and b.runs[("r",)] == {"attempt": 2}


def test_set_rejects_unknown_columns_and_bad_keys() -> None:
    with pytest.raises(ValueError, match="unknown"):
        RowChanges().set("runs", ("r",), stat="READY")
    with pytest.raises(ValueError, match="unknown or key"):
        RowChanges().set("runs", ("r",), run_id="r")
    with pytest.raises(ValueError, match="key"):
        RowChanges().set("attempts", ("r",), outcome="failed")
    with pytest.raises(KeyError):
        RowChanges().set("nope", ("r",), x=1)


# ------------------------------------------------------------------ run counters (tallies)


def tallies(c: RowChanges) -> list[tuple[str, str, str, int, tuple[str, str] | None]]:
    return [(t.kind, t.run_id, t.label, t.n, t.spec) for t in c.tallies]


def test_each_outcome_is_tallied_by_the_event_that_reaches_it() -> None:
    expected = {
        "ResultPublished": [("finished", RUN, "succeeded", 1, None)],
        "OccurrenceDeadLettered": [("finished", RUN, "dead", 1, None)],
        "OccurrenceCancelled": [("finished", RUN, "cancelled", 1, None)],
        # an ambiguous failure resolved as delivered (no ResultPublished before it)
        "ReconciliationResolved": [("finished", RUN, "succeeded", 1, None)],
        # four instants of a range, never runs, labelled from the schedule when known
        "OccurrenceSkipped": [("skipped", RUN, "misfire", 4, None)],
        "AttemptClaimed": [("lateness", RUN, "", 1, None)],
        # the facts the alerts count (docs/alerts.md)
        "LeaseExpired": [("lease_expired", RUN, "", 1, None)],
        "CompletionRejected": [("rejected", RUN, "stale_fence", 1, None)],
        "EffectSucceeded": [("effect", RUN, "succeeded", 1, None)],
        "EffectUncertain": [("effect", RUN, "uncertain", 1, None)],
        "EffectFailed": [("effect", RUN, "failed", 1, None)],
    }
    for name, sample in SAMPLES.items():
        assert tallies(project(env(sample))) == expected.get(name, []), name


def test_only_the_first_attempts_claim_is_a_start() -> None:
    claim = SAMPLES["AttemptClaimed"]
    [t] = project(env(claim)).tallies
    assert t.claimed_at == claim.claimed_at
    assert project(env(claim.model_copy(update={"attempt": 2}))).tallies == []


def test_an_effects_reconciliation_does_not_change_its_runs_outcome() -> None:
    for decision in ("delivered", "retry", "abandon"):
        resolved = m.ReconciliationResolved(run_id=RUN, decision=decision, by="ops",
                                            effect_id=f"send-{RUN}")
        assert project(env(resolved)).tallies == [], decision
    for decision in ("retry", "abandon"):  # their next event (Ready, DeadLettered) counts
        resolved = m.ReconciliationResolved(run_id=RUN, decision=decision, by="ops")
        assert project(env(resolved)).tallies == [], decision


def test_a_materialized_skip_is_labelled_by_its_run() -> None:
    skip = SAMPLES["OccurrenceSkipped"].model_copy(update={"materialized": True, "count": 1})
    [t] = project(env(skip)).tallies
    assert not t.never_run and t.spec is None  # the store takes the run's labels


def test_a_never_run_skip_takes_its_schedules_spec_at_that_point_of_the_log() -> None:
    gpu = SPEC.model_copy(update={"resource_class": "gpu", "job": m.JobSpec(type="render")})
    created = m.ScheduleCreated(revision=1, spec=gpu, created_at=T0, anchor=T0,
                                next_run_at=T0, next_due_at=T0)
    skip = SAMPLES["OccurrenceSkipped"]
    revised = m.ScheduleRevised(revision=2, spec=SPEC, anchor=T0, next_run_at=None,
                                next_due_at=None)
    events = [env(created, n=0), env(skip, n=1), env(revised, n=2),
              env(skip.model_copy(update={"run_id": "r_later"}), n=3)]
    want = [("skipped", RUN, "misfire", 4, ("gpu", "render")),
            ("skipped", "r_later", "misfire", 4, ("default", "report"))]
    assert tallies(project_batch(events)) == want
    # folded one event at a time (the projector's fallback path): the same labels
    assert tallies(RowChanges.fold(project(e) for e in events)) == want
    # no spec in the batch before it: left for the store (the stored schedule)
    assert [t.spec for t in project_batch(events[1:]).tallies] == [None, ("default", "report")]


def test_tallies_make_a_change_set_non_empty_and_fold_in_log_order() -> None:
    dead = Tally("finished", TENANT, SID, RUN, "dead")
    c = RowChanges().tally(dead)
    assert c and c.row_count() == 0 and c.tallies == [dead]
    later = project(env(SAMPLES["ResultPublished"]))
    assert [t.label for t in RowChanges.fold([c, later]).tallies] == ["dead", "succeeded"]
