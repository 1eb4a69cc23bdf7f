"""The pure projection: one event envelope -> the read-model row changes it causes.

No I/O, no clock: every value comes from the envelope (``at`` is authority time) or its
payload, so replaying the log from offset 0 rebuilds exactly the live tables. A batch is
``RowChanges.fold(project(e) for e in events)``.

Run and effect states follow the decider's ``evolve`` (commands/decider.py): where an event
does not itself move a run (AttemptFailed, LeaseExpired), the event the processor emits right
after it does (RetryScheduled, OccurrenceReady, OccurrenceDeadLettered, ...). Every event
also stamps ``schedules.last_event_at``.

Column conventions:
* ``runs.started_at`` is the *first* claim (``First``), so the run's ``latenessMs`` (first
  start minus due_at, computed as it is read) is the start lateness of the occurrence, not
  of a retry;
* ``runs.finished_at`` is set when the run reaches a terminal state and cleared by a redrive;
* ``runs.attempt`` mirrors the decider: 1 at materialization, then the attempt each event
  names; ``runs.skipped_count`` is the number of instants a SKIPPED row stands for (a
  collapsed range), so skipped counters are ``sum(skipped_count) ... group by skipped_reason``;
* a run's attempt 1 is columns of its run row (``FIRST_ATTEMPT``: ``first_fence``, ...; its
  claim time is ``started_at``), later attempts rows of ``attempts`` (migration 0012): nearly
  every run has one attempt, which costs a few columns of a row written anyway rather than a
  row and an index entry of its own;
* CompletionRejected changes no row (it is kept in the log for audit).

Run counters (``Tally``, docs/deployment.md, "Metrics"): an outcome is counted by the event
that reaches it — ``ResultPublished`` and an ambiguous failure resolved ``delivered`` (succeeded),
``OccurrenceDeadLettered`` (dead), ``OccurrenceCancelled`` (cancelled), ``OccurrenceSkipped``
(skipped, once per instant it stands for, and by reason) — so a redriven run counts again when
it ends again, and an effect's reconciliation never changes its run's outcome. The claim of a
run's first attempt is its start: its lateness is observed then.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, assert_never

from chronolog.domain import messages as m
from chronolog.domain.ids import iso_utc
from chronolog.projections.store import First, RowChanges, Tally

__all__ = ["FIRST_ATTEMPT", "project", "project_batch"]

# the run row's column for each column of an attempt 1 (its claimed_at is the run's
# started_at, the run's first claim, set by the same event)
FIRST_ATTEMPT = {"fence": "first_fence", "worker_id": "first_worker_id",
                 "lease_until": "first_lease_until", "outcome": "first_outcome",
                 "error_class": "first_error_class", "error": "first_error",
                 "finished_at": "first_finished_at"}

_EFFECT_STATE_AFTER_RESOLUTION = {"delivered": "SUCCEEDED", "abandon": "ABANDONED",
                                  "retry": "INTENDED"}


def project(envelope: m.EventEnvelope, into: RowChanges | None = None) -> RowChanges:
    """The row changes of one event (folded into ``into`` when given, which is returned)."""
    c = RowChanges() if into is None else into
    at = envelope.at
    tenant, sid = envelope.tenant, envelope.schedule_id
    skey = (tenant, sid)

    def sched(**cols: Any) -> None:
        c.set("schedules", skey, **cols)

    def run(run_id: str, **cols: Any) -> None:
        c.set("runs", (run_id,), updated_at=at, **cols)

    def attempt(run_id: str, number: int, **cols: Any) -> None:
        if number == 1:
            run(run_id, **{FIRST_ATTEMPT[k]: v for k, v in cols.items() if k != "claimed_at"})
        else:
            c.set("attempts", (run_id, number), **cols)

    def effect(effect_id: str, **cols: Any) -> None:
        c.set("effects", (effect_id,), updated_at=at, **cols)

    def outcome(run_id: str, label: str) -> None:
        c.tally(Tally("finished", tenant, sid, run_id, label))

    p = envelope.payload
    match p:
        case (m.ScheduleCreationHeld() | m.ScheduleCreationRefused() | m.QuotaSlotReserved()
              | m.QuotaSlotRefused() | m.QuotaSlotConfirmed() | m.QuotaSlotReleased()
              | m.PermitGranted() | m.PermitQueued() | m.PermitReleased()):
            # the quota saga changes no row (a held create is not a schedule yet), nor do a
            # concurrency key's permits (their runs show what they wait for)
            return c
        case (m.KeyMovedOut() | m.KeyMovedIn() | m.RoutingVersionAdded() | m.HandedOver()
              | m.HandoverReceived()):
            # a key moving between partitions (docs/design.md §18) changes none of its rows:
            # the schedule and its runs are the same on its new home
            return c
        case m.CalendarRevised():
            c.set("calendars", (tenant, p.name), revision=p.revision,
                  spec=p.spec.model_dump(mode="json", by_alias=True, exclude_defaults=True),
                  created_at=First(at), deleted_at=None, updated_at=at)
            return c
        case m.CalendarDeleted():
            c.set("calendars", (tenant, p.name), revision=p.revision, spec=None,
                  deleted_at=at, updated_at=at)
            return c
        case m.CalendarSubscribed() | m.CalendarUnsubscribed():
            return c  # which schedules name a calendar is in their definitions
        case m.CalendarCopied():
            pass  # the copy a schedule holds shows in its runs (an excluded one's exclusion)
        case m.ScheduleCreated():
            # every definition column, so a re-created (previously deleted) ID starts clean
            sched(revision=p.revision, state="ACTIVE", spec=p.spec.model_dump(mode="json"),
                  request_key=p.request_key, anchor=p.anchor, next_run_at=p.next_run_at,
                  next_due_at=p.next_due_at, paused_at=None, pause_reason=None,
                  deleted_at=None, completed_at=None, completed_reason=None,
                  created_at=p.created_at, updated_at=at)
        case m.ScheduleRevised():
            sched(revision=p.revision, spec=p.spec.model_dump(mode="json"), anchor=p.anchor,
                  next_run_at=p.next_run_at, next_due_at=p.next_due_at, updated_at=at)
        case m.SchedulePaused():
            sched(state="PAUSED", paused_at=p.paused_at, pause_reason=p.reason or None,
                  updated_at=at)
        case m.ScheduleResumed():
            sched(state="ACTIVE", paused_at=None, pause_reason=None,
                  next_run_at=p.next_run_at, next_due_at=p.next_due_at, updated_at=at)
        case m.ScheduleDeleted():
            sched(state="DELETED", deleted_at=at, next_run_at=None, next_due_at=None,
                  updated_at=at)
        case m.ScheduleCompleted():
            sched(state="COMPLETED", completed_at=p.completed_at, completed_reason=p.reason,
                  next_run_at=None, next_due_at=None, updated_at=at)
        case m.NextRunPlanned():
            sched(next_run_at=p.next_run_at, next_due_at=p.next_due_at)
        case m.OccurrenceMaterialized():
            run(p.run_id, tenant=tenant, schedule_id=sid, scheduled_at=p.scheduled_at,
                due_at=p.due_at, revision=p.revision, trigger=p.trigger,
                request_key=p.request_key, state=p.state, attempt=1, job_type=p.job.type,
                params=p.job.params, resource_class=p.resource_class, priority=p.priority,
                sequence=p.sequence, start_deadline_at=p.start_deadline_at,
                ready_at=at if p.state == "READY" else None)
            if p.advances_schedule:
                sched(next_run_at=p.next_run_at, next_due_at=p.next_due_at)
        case m.OccurrenceSkipped():
            skipped: dict[str, Any] = dict(
                state="SKIPPED", skipped_reason=p.reason, skipped_count=p.count,
                skipped_through=p.through, finished_at=at,
            )
            if p.calendar is not None:
                skipped["exclusion"] = {"calendar": p.calendar, "revision": p.calendar_revision,
                                        "entry": p.excluded_by}
            if p.materialized:
                run(p.run_id, **skipped)
            else:  # an instant that never became a run is still recorded, with its reason
                run(p.run_id, tenant=tenant, schedule_id=sid, scheduled_at=p.scheduled_at,
                    revision=p.revision, trigger="manual" if p.request_key else "schedule",
                    request_key=p.request_key, **skipped)
            c.tally(Tally("skipped", tenant, sid, p.run_id, p.reason, p.count,
                          never_run=not p.materialized))
            if p.advances_schedule:
                sched(next_run_at=p.next_run_at, next_due_at=p.next_due_at)
        case m.OccurrenceReady():
            run(p.run_id, state="READY", attempt=p.attempt, ready_at=at, retry_at=None,
                resource_class=p.resource_class, priority=p.priority)
        case m.FenceAdvanced():
            sched(fence=p.fence)
        case m.AttemptClaimed():
            run(p.run_id, state="LEASED", attempt=p.attempt, started_at=First(p.claimed_at))
            if p.attempt == 1:  # the first claim (every later attempt has a higher number)
                c.tally(Tally("lateness", tenant, sid, p.run_id, claimed_at=p.claimed_at))
            attempt(p.run_id, p.attempt, fence=p.fence, worker_id=p.worker_id,
                    claimed_at=p.claimed_at, lease_until=p.lease_until, outcome=None,
                    error_class=None, error=None, finished_at=None)
        case m.LeaseExtended():
            attempt(p.run_id, p.attempt, lease_until=p.lease_until)
        case m.LeaseExpired():
            attempt(p.run_id, p.attempt, outcome="lease_expired", lease_until=p.lease_until,
                    finished_at=at)
            c.tally(Tally("lease_expired", tenant, sid, p.run_id))
        case m.AttemptFailed():
            attempt(p.run_id, p.attempt, outcome="failed", error_class=p.error_class,
                    error=p.message or None, finished_at=at)
            run(p.run_id, last_error_class=p.error_class, last_error=p.message or None)
        case m.RetryScheduled():
            run(p.run_id, state="RETRY_WAIT", attempt=p.attempt, retry_at=p.retry_at)
        case m.OccurrenceDeadLettered():
            run(p.run_id, state="DEAD", dead_reason=p.reason, dead_message=p.message or None,
                finished_at=at)
            outcome(p.run_id, "dead")
        case m.OccurrenceRedriven():
            run(p.run_id, state="READY", attempt=p.attempt, ready_at=at, retry_at=None,
                finished_at=None, dead_reason=None, dead_message=None)
        case m.ResultPublished():
            run(p.run_id, state="SUCCEEDED", attempt=p.attempt, result_checksum=p.checksum,
                result_size=p.size, result_uri=p.uri, result_inline=p.inline,
                result_attempt=p.attempt, finished_at=p.finished_at)
            attempt(p.run_id, p.attempt, outcome="succeeded", finished_at=p.finished_at)
            outcome(p.run_id, "succeeded")
        case m.BackfillRequested():
            pass  # its runs are rows of their own (trigger "backfill")
        case m.RunAwaitsPermit():
            run(p.run_id, permit_wait={"key": p.key, "limit": p.limit})
        case m.RunPermitted() | m.RunPermitReturned():
            run(p.run_id, permit_wait=None)
        case m.CompletionRejected():  # no read-model row changes: only its counter
            c.tally(Tally("rejected", tenant, sid, p.run_id, p.reason))
        case m.CancellationRequested():
            run(p.run_id, cancellation_requested=True, cancel_reason=p.reason or None)
        case m.OccurrenceCancelled():
            extra = {"cancel_reason": p.reason} if p.reason else {}
            run(p.run_id, state="CANCELLED", finished_at=at, **extra)
            outcome(p.run_id, "cancelled")
        case m.ReconciliationRequired():
            run(p.run_id, state="RECONCILING", reconciliation_resolution=None,
                reconciliation={"reason": p.reason, "effectId": p.effect_id,
                                "evidence": p.evidence, "at": iso_utc(at)})
        case m.ReconciliationResolved():
            resolution = {"decision": p.decision, "by": p.by, "note": p.note,
                          "effectId": p.effect_id, "at": iso_utc(at)}
            if p.effect_id is not None:
                run(p.run_id, state="SUCCEEDED", finished_at=First(at),
                    reconciliation_resolution=resolution)
                effect(p.effect_id, state=_EFFECT_STATE_AFTER_RESOLUTION[p.decision])
            elif p.decision == "delivered":  # an ambiguous failure that did succeed
                run(p.run_id, state="SUCCEEDED", finished_at=First(at),
                    reconciliation_resolution=resolution)
                outcome(p.run_id, "succeeded")
            else:  # retry / abandon: the following OccurrenceReady / DeadLettered moves it
                run(p.run_id, reconciliation_resolution=resolution)
        case m.EffectIntended():
            effect(p.effect_id, tenant=tenant, schedule_id=sid, run_id=p.run_id, kind=p.kind,
                   state="INTENDED", attempts=p.attempt, checksum=p.checksum, config=p.config,
                   evidence=None, created_at=First(at))
        case m.EffectSucceeded():
            effect(p.effect_id, state="SUCCEEDED", evidence=p.evidence)
            c.tally(Tally("effect", tenant, sid, p.run_id, "succeeded"))
        case m.EffectUncertain():
            effect(p.effect_id, state="UNCERTAIN", evidence=p.evidence)
            c.tally(Tally("effect", tenant, sid, p.run_id, "uncertain"))
        case m.EffectFailed():
            effect(p.effect_id, state="FAILED", evidence=p.evidence)
            c.tally(Tally("effect", tenant, sid, p.run_id, "failed"))
        case _:
            assert_never(p)
    sched(last_event_at=at)
    return c


def project_batch(envelopes: Iterable[m.EventEnvelope]) -> RowChanges:
    """The folded row changes of a batch of envelopes, in log order."""
    out = RowChanges()
    for env in envelopes:
        project(env, out)  # set() folds exactly as merge() would, without a RowChanges per event
    return out
