"""The decider: ``decide(state, command, now) -> Decision`` and ``evolve(state, event)``.

Pure: no I/O, no clock, no randomness. Time enters as ``now`` (authority time); jitter is a
hash of (run ID, attempt) or (schedule ID, instant). Every computed value is written into
the events, so ``evolve`` (replay) never recomputes a schedule instant, a retry time, a lease
deadline or a fence.

Rejections are data: a ``Decision`` with a non-``ok`` status and a reason. A rejection may
still carry events (a stale completion is recorded as CompletionRejected for audit; a
heartbeat that finds its lease expired also expires it).

``decide`` works on a clone of the state and applies each event to it as it goes, so a
command that emits several dependent events (a Tick expiring a lease, releasing the overlap
guard and materializing the next occurrence) sees a consistent state at every step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any, TypeGuard, assert_never, get_args

import orjson

from chronolog.commands import calendars, permits
from chronolog.commands.aggregate import (
    OPEN_TENANT,
    PROCESSOR,
    Aggregate,
    Decision,
    Draft,
    Send,
    TenantContext,
)
from chronolog.commands.backlog import MAX_INSTANTS_PER_DECISION, due_time, plan_due
from chronolog.commands.state import (
    BACKFILL_KEYS_KEPT,
    DEAD_KEPT,
    MANUAL_KEYS_KEPT,
    Backfills,
    Manual,
    Policy,
    QuotaWait,
    Run,
    ScheduleState,
    initial_state,
    policy_for,
    trigger_of,
)
from chronolog.commands.state_codec import (
    STATE_VERSION,
    StateDecodeError,
    decode_moved_schedule,
    moved_schedule,
)
from chronolog.domain import messages as m
from chronolog.domain.ids import (
    QUOTA_ID,
    ROUTING_ID,
    backfill_run_id,
    calendar_id,
    effect_id_for,
    limit_id,
    manual_run_id,
    move_command_id,
    partition_key,
    run_id_for,
    saga_command_id,
)
from chronolog.domain.limits import (
    MAX_BACKFILL_INSTANTS,
    MIN_RETRY_BACKOFF_SECONDS,
)
from chronolog.domain.recurrence import (
    DelayTrigger,
    RecurrenceError,
    Trigger,
    upcoming,
)
from chronolog.domain.storage_budget import SETTING as STORAGE_SETTING

__all__ = [
    "LEAVES_LIVE",
    "MAX_INSTANTS_PER_DECISION",
    "QUOTA_EXPIRY_MARGIN",
    "SCHEDULE",
    "decide",
    "evolve",
    "fold",
    "held",
    "initial_state",
    "move_out",
    "next_wakeup",
    "ungranted_effect",
]

COLLAPSE_SKIPS_OVER = 20  # more consecutive skips than this become one range event
_US = timedelta(microseconds=1)
# a granted quota slot is taken only while at least this long remains of its reservation, so
# the quota aggregate (another processor, another clock) never expires a slot being taken
QUOTA_EXPIRY_MARGIN = timedelta(seconds=5)
# the events after which a schedule is no longer live: one of them gives its quota slot back
LEAVES_LIVE: tuple[type, ...] = (m.ScheduleDeleted, m.ScheduleCompleted)


ScheduleDecision = Decision[m.ScheduleEvent]
ScheduleDraft = Draft[ScheduleState, m.ScheduleEvent]


def _reject(status: m.Status, reason: str, field_: str | None = None,
            **body: Any) -> ScheduleDecision:
    return Decision(status=status, reason=reason, field=field_, body=dict(body))


def _draft(state: ScheduleState) -> ScheduleDraft:
    """A scratch copy of the state (copy-on-write: only the runs an event touches are
    cloned) that folds each event as it is emitted."""
    return Draft(state.draft(), evolve)


# =======================================================================================
# decide


def decide(
    state: ScheduleState,
    command: m.CommandEnvelope,
    now: datetime,
    tenant: TenantContext = OPEN_TENANT,
) -> ScheduleDecision:
    """Decide one command against one schedule's state at authority time ``now``."""
    dec = _decide(state, command, now, tenant)
    if dec.events and state.exists and isinstance(state.quota, str):
        _release_when_not_live(state, dec)
    if dec.events and permits.applies(state, dec.events, tenant):
        after = _after(state, dec.events)
        permits.after_decision(state, after, command.command_id, tenant, dec.events.append,
                               dec.sends.append)
    if dec.events and calendars.applies(state, dec.events):
        calendars.after_decision(state, _after(state, dec.events), command.command_id,
                                 dec.sends.append)
    return dec


def _after(state: ScheduleState, events: list[m.ScheduleEvent]) -> ScheduleState:
    """A draft of ``state`` with ``events`` folded in."""
    after = state.draft()
    for ev in events:
        evolve(after, ev)
    return after


def _release_when_not_live(state: ScheduleState, dec: ScheduleDecision) -> None:
    """A schedule holding a quota slot that stops being live (an event of ``LEAVES_LIVE``)
    gives the slot back: a release to the tenant's quota aggregate, named after that event."""
    assert isinstance(state.quota, str)
    for ev in dec.events:
        if isinstance(ev, LEAVES_LIVE):
            dec.sends.append(_release(state, state.quota, type(ev).__name__))
            return


def _release(state: ScheduleState, create_command_id: str, reason: str) -> Send:
    return Send(QUOTA_ID, saga_command_id("release", create_command_id),
                m.ReleaseQuotaSlot(schedule_id=state.schedule_id,
                                   create_command_id=create_command_id, reason=reason))


def _decide(
    state: ScheduleState,
    command: m.CommandEnvelope,
    now: datetime,
    tenant: TenantContext,
) -> ScheduleDecision:
    p = command.payload
    match p:
        case m.Tick():
            return tick(state, now, p.resumed)
        case m.ClaimRun():
            return _claim(state, p, now, tenant)
        case m.Heartbeat():
            return _heartbeat(state, p, now)
        case m.CompleteRun():
            return _complete(state, p, now, tenant)
        case m.FailRun():
            return _fail(state, p, now, tenant)
        case m.CreateSchedule():
            return _create_or_hold(state, command, p, now, tenant)
        case m.ReviseSchedule():
            return _revise(state, p, now, tenant)
        case m.PauseSchedule():
            return _pause(state, p, now)
        case m.ResumeSchedule():
            return _resume(state, now)
        case m.DeleteSchedule():
            return _delete(state, command.principal)
        case m.TriggerRun():
            return _trigger(state, p, now, command.command_id)
        case m.BackfillSchedule():
            return _backfill(state, p, now, tenant)
        case m.CancelRun():
            return _cancel(state, p, now, command.principal)
        case m.RedriveRun():
            return _redrive(state, p, now, command.principal)
        case m.ResolveReconciliation():
            return _resolve(state, p, now, command.principal)
        case m.RecordEffectOutcome():
            return _effect_outcome(state, p, now)
        case m.AnswerQuotaSlot():
            if command.principal != PROCESSOR:
                return _reject("forbidden", "only the processor answers a quota reservation")
            return _quota_answered(state, p, now, tenant)
        case m.GrantPermit():
            return permits.grant_received(state, p, command.principal)
        case m.CopyCalendar():
            if command.principal != PROCESSOR:
                return _reject("forbidden", "only the processor copies a calendar")
            return _calendar_copied(state, p, now)
        case (m.PutCalendar() | m.DeleteCalendar() | m.SubscribeCalendar()
              | m.UnsubscribeCalendar()):
            return _reject("invalid", f"{p.type} is a command of a calendar (schedule ID "
                           f"'{calendar_id(p.name)}')", "type")
        case m.AcquirePermit() | m.ReleasePermit():
            return _reject("invalid", f"{p.type} is a command of a concurrency key's permits "
                           f"(schedule ID '{limit_id(p.key)}')", "type")
        case m.ReserveQuotaSlot() | m.ConfirmQuotaSlot() | m.ReleaseQuotaSlot():
            return _reject("invalid", f"{p.type} is a command of the tenant's quota "
                           f"(schedule ID '{QUOTA_ID}')", "type")
        case m.AdoptKey():
            return _adopt(state, command, p)
        case m.BeginHandover() | m.HandoverDone():
            return _reject("invalid", f"{p.type} is a command of a partition's routing view "
                           f"(schedule ID '{ROUTING_ID}')", "type")
        case _:
            assert_never(p)


# ---------------------------------------------------------------------------------------
# schedule lifecycle


def _compile(spec: m.ScheduleSpec, anchor: datetime) -> Any:
    """The trigger of a new or revised spec: refused (RecurrenceError) if it never fires."""
    return trigger_of(spec, anchor, recorded=False)


def _due(schedule_id: str, instant: datetime | None, pol: Policy) -> datetime | None:
    """The instant plus the schedule's deterministic jitter (the moment it becomes due)."""
    return None if instant is None else due_time(schedule_id, instant, pol.jitter)


def _first_instant(
    trigger: Trigger, pol: Policy, spec: m.ScheduleSpec, now: datetime, anchor: datetime
) -> datetime | None:
    """The first instant of a new schedule: the first at/after its start (or now).

    A fixed-delay schedule first runs at its anchor (now by default; start if later).
    """
    if pol.kind == "at":
        return spec.at
    if pol.kind == "delay":
        assert isinstance(trigger, DelayTrigger)  # the policy's kind is its trigger's
        return trigger.first_instant(max(anchor, now))
    floor = spec.start if spec.start is not None and spec.start > now else now
    return trigger.next_after(floor - _US)


def _create(
    state: ScheduleState, p: m.CreateSchedule, now: datetime, tenant: TenantContext
) -> ScheduleDecision:
    if state.status != "NEW":
        if state.status == "DELETED":
            return _reject("conflict", "schedule id was deleted; choose another", "scheduleId")
        assert state.policy is not None
        new_hash = policy_for(p.spec).spec_hash
        if p.request_key is not None and p.request_key == state.request_key:
            # compared with the spec it was created with: a retried create still matches
            # after the schedule has been revised since
            if new_hash == (state.created_hash or state.policy.spec_hash):
                return Decision(body=_schedule_body(state))
            return _reject(
                "conflict", "request key reused with a different spec", "Idempotency-Key",
                revision=state.revision,
            )
        return _reject("conflict", "schedule id taken", "scheduleId", revision=state.revision)
    if not tenant.allows(p.spec.job.type):
        return _reject("forbidden", f"job type '{p.spec.job.type}' not allowed", "job.type")
    if (refused := ungranted_effect(p.spec, tenant)) is not None:
        return refused
    pol = policy_for(p.spec)
    anchor = p.spec.anchor or now
    try:
        trigger = _compile(p.spec, anchor)
    except RecurrenceError as exc:
        return _reject("invalid", str(exc), exc.field)
    too_often = (_below_min_interval(p.spec, trigger, now, tenant)
                 or _over_retry_ceiling(p.spec, tenant))
    if too_often is not None:
        return too_often
    first = _first_instant(trigger, pol, p.spec, now, anchor)
    if pol.kind == "at" and first is not None and first < now - timedelta(seconds=pol.grace):
        return _reject("invalid", f"invalid at '{m_iso(first)}': in the past", "at")
    d = _draft(state)
    d.emit(
        m.ScheduleCreated(
            revision=1,
            spec=p.spec,
            request_key=p.request_key,
            created_at=now,
            anchor=anchor,
            next_run_at=first,
            next_due_at=_due(state.schedule_id, first, pol),
        )
    )
    _complete_if_no_instant_left(d, now)
    return Decision(events=d.events, body=_schedule_body(d.state))


def _create_or_hold(
    state: ScheduleState, command: m.CommandEnvelope, p: m.CreateSchedule, now: datetime,
    tenant: TenantContext,
) -> ScheduleDecision:
    """A create of a tenant with a quota that passes every other check is held: it waits
    for a slot from the tenant's quota aggregate, and is answered when the slot is (see
    ``_quota_answered``). A create of an existing schedule takes no slot."""
    command_id = command.command_id
    wait = state.quota
    if isinstance(wait, QuotaWait):
        if wait.command_id == command_id:
            return Decision(deferred=True)  # a re-sent create: its answer is on the way
        return _reject("conflict", "the schedule is being created (waiting for a quota "
                       "slot); retry", "scheduleId")
    if tenant.max_schedules is None or state.status != "NEW":
        return _create(state, p, now, tenant)
    trial = _create(state, p, now, tenant)  # every check but the quota
    if not trial.ok:
        return trial
    d = _draft(state)
    d.emit(m.ScheduleCreationHeld(command_id=command_id, request_key=p.request_key,
                                  spec=p.spec, reply_to=command.reply_to))
    reserve = m.ReserveQuotaSlot(schedule_id=state.schedule_id, create_command_id=command_id)
    return Decision(events=d.events, deferred=True,
                    sends=[Send(QUOTA_ID, saga_command_id("reserve", command_id), reserve)])


def _quota_answered(
    state: ScheduleState, p: m.AnswerQuotaSlot, now: datetime, tenant: TenantContext
) -> ScheduleDecision:
    """The quota's answer to a held create: created with the slot (confirmed to the quota),
    or refused — and a reserved slot it cannot use is given back. The reply goes to the
    held create's command."""
    wait = state.quota
    cid = p.create_command_id
    if not isinstance(wait, QuotaWait) or wait.command_id != cid:
        # not waiting for this answer (any more): a slot granted for it is not used, unless
        # the live schedule holds it already (the same answer twice)
        if p.granted and not (state.exists and state.quota == cid):
            return Decision(sends=[_release(state, cid, "rejected")])
        return Decision()
    if not p.granted:
        return _refuse_held(state, wait, "quota", p.reason, release=False)
    if p.expires_at is None or now >= p.expires_at - QUOTA_EXPIRY_MARGIN:
        return _refuse_held(state, wait, "quota", "the reserved quota slot expired before the "
                            "schedule could be created; retry", release=True)
    dec = _create(state, m.CreateSchedule(spec=wait.spec, request_key=wait.request_key), now,
                  tenant)
    if not dec.ok:
        return _refuse_held(state, wait, dec.status, dec.reason, release=True, field_=dec.field)
    dec.sends.append(Send(QUOTA_ID, saga_command_id("confirm", cid), m.ConfirmQuotaSlot(
        schedule_id=state.schedule_id, create_command_id=cid)))
    dec.answers, dec.answers_client = cid, wait.reply_to
    return dec


def _refuse_held(state: ScheduleState, wait: QuotaWait, status: m.Status, reason: str,
                 release: bool, field_: str | None = None) -> ScheduleDecision:
    d = _draft(state)
    d.emit(m.ScheduleCreationRefused(command_id=wait.command_id, status=status, reason=reason,
                                     release=release))
    dec = _reject(status, reason, field_)
    dec.events = d.events
    dec.answers, dec.answers_client = wait.command_id, wait.reply_to
    if release:
        dec.sends.append(_release(state, wait.command_id, "rejected"))
    return dec


def ungranted_effect(spec: m.ScheduleSpec, tenant: TenantContext) -> ScheduleDecision | None:
    """An effect may only name a destination the operator granted to the tenant, of its kind."""
    if tenant.destinations is None:
        return None
    for i, eff in enumerate(spec.effects):
        kind = tenant.destinations.get(eff.destination)
        if kind is None:
            return _reject("forbidden", f"effect destination '{eff.destination}' is not granted "
                           "to this tenant", f"effects[{i}].destination")
        if kind != eff.kind:
            return _reject("invalid", f"effect destination '{eff.destination}' is a {kind} "
                           f"destination, not {eff.kind}", f"effects[{i}].kind")
    return None


# how many upcoming instants of a cron rule are compared against the minimum interval
_CRON_GAPS_CHECKED = 64


def _below_min_interval(
    spec: m.ScheduleSpec, trigger: Any, now: datetime, tenant: TenantContext
) -> ScheduleDecision | None:
    """A recurring schedule fires at most once per ``tenant.min_interval``: an ``every`` or
    ``delay`` shorter than it, or a cron rule with two of its next instants closer than it,
    is invalid (naming the field)."""
    least = tenant.min_interval
    for name in ("every", "delay"):
        value = getattr(spec, name)
        if value is not None and value < least:
            return _reject("invalid", f"invalid {name} '{value:g}s': shorter than the "
                           f"tenant's minimum interval of {least:g}s", name)
    if spec.cron is not None and least > 60:  # a cron rule is at least a minute apart
        instants = upcoming(trigger, now, _CRON_GAPS_CHECKED)
        for a, b in pairwise(instants):
            if (b - a).total_seconds() < least:
                return _reject("invalid", f"invalid cron '{spec.cron}': fires {b - a} apart "
                               f"at {m_iso(a)}, the tenant's minimum interval is {least:g}s",
                               "cron")
    return None


def _over_retry_ceiling(spec: m.ScheduleSpec, tenant: TenantContext) -> ScheduleDecision | None:
    """``retry.maxAttempts`` above the tenant's ceiling is invalid (naming the field)."""
    if spec.retry.max_attempts > tenant.max_attempts:
        return _reject("invalid", f"invalid retry.maxAttempts '{spec.retry.max_attempts}': "
                       f"more than the tenant's ceiling of {tenant.max_attempts}",
                       "retry.maxAttempts")
    return None


def m_iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _schedule_body(s: ScheduleState) -> dict[str, Any]:
    return {
        "schedule_id": s.schedule_id,
        "revision": s.revision,
        "state": s.status,
        "next_run_at": s.next_run_at,
    }


def _revise(
    state: ScheduleState, p: m.ReviseSchedule, now: datetime, tenant: TenantContext
) -> ScheduleDecision:
    if (ended := _refuse_completed(state)) is not None:
        return ended
    if not state.exists:
        return _reject("not_found", "no such schedule")
    if p.expected_revision != state.revision:
        return _reject(
            "conflict",
            f"expected revision {p.expected_revision}, current is {state.revision}",
            "If-Match",
            revision=state.revision,
        )
    if not tenant.allows(p.spec.job.type):
        return _reject("forbidden", f"job type '{p.spec.job.type}' not allowed", "job.type")
    if (refused := ungranted_effect(p.spec, tenant)) is not None:
        return refused
    pol = policy_for(p.spec)
    anchor = p.spec.anchor or state.anchor or now
    try:
        trigger = _compile(p.spec, anchor)
    except RecurrenceError as exc:
        return _reject("invalid", str(exc), exc.field)
    too_often = (_below_min_interval(p.spec, trigger, now, tenant)
                 or _over_retry_ceiling(p.spec, tenant))
    if too_often is not None:
        return too_often
    if (waits := _waits_for_calendars(state, now)) is not None:
        return waits
    d = _draft(state)
    # Instants of the old revision already due belong to it: settle them first (exactly as
    # a Tick just before the revision would), so none is silently dropped.
    _materialize_due(d, now, late_reason="misfire")
    s = d.state
    # Only unmaterialized occurrences change: the next instant is strictly after the last
    # materialized (or skipped) one, so no revision can reuse an occurrence key. An active
    # schedule's new rule starts now; a paused one's starts where the pause began, so the
    # resume applies the misfire policy to the new rule's instants of the paused span.
    start = now if s.status == "ACTIVE" or s.paused_at is None else min(now, s.paused_at)
    after = start - _US
    if s.last_scheduled_at is not None and s.last_scheduled_at > after:
        after = s.last_scheduled_at
    if pol.kind == "at":
        if p.spec.at is not None and p.spec.at < now - timedelta(seconds=pol.grace):
            return _reject("invalid", f"invalid at '{m_iso(p.spec.at)}': in the past", "at")
        nxt = p.spec.at if p.spec.at is not None and p.spec.at > after else None
    elif pol.kind == "delay":
        # planned when the running occurrence finishes; else the delay counts from now
        nxt = None if s.active_runs() else trigger.next_after(now)
    else:
        nxt = trigger.next_after(after)
    if pol.max_count is not None and s.count >= pol.max_count:
        nxt = None
    d.emit(
        m.ScheduleRevised(
            revision=s.revision + 1,
            spec=p.spec,
            anchor=anchor,
            next_run_at=nxt,
            next_due_at=_due(s.schedule_id, nxt, pol),
        )
    )
    _complete_if_no_instant_left(d, now)
    return Decision(events=d.events, body=_schedule_body(d.state))


def _pause(state: ScheduleState, p: m.PauseSchedule, now: datetime) -> ScheduleDecision:
    if (ended := _refuse_completed(state)) is not None:
        return ended
    if not state.exists:
        return _reject("not_found", "no such schedule")
    if state.status == "PAUSED":
        return Decision(body=_schedule_body(state))
    if (waits := _waits_for_calendars(state, now)) is not None:
        return waits
    d = _draft(state)
    # what was already due when the pause arrived is not "missed while paused"
    _materialize_due(d, now, late_reason="misfire")
    if _complete_if_no_instant_left(d, now):  # that was its last instant: nothing to pause
        return Decision(events=d.events, body=_schedule_body(d.state))
    d.emit(m.SchedulePaused(reason=p.reason, paused_at=now))
    return Decision(events=d.events, body=_schedule_body(d.state))


def _resume(state: ScheduleState, now: datetime) -> ScheduleDecision:
    if (ended := _refuse_completed(state)) is not None:
        return ended
    if not state.exists:
        return _reject("not_found", "no such schedule")
    if state.status == "ACTIVE":
        return Decision(body=_schedule_body(state))
    d = _draft(state)
    d.emit(
        m.ScheduleResumed(
            resumed_at=now, next_run_at=state.next_run_at, next_due_at=state.next_due_at
        )
    )
    # The misfire policy applies to the instants of the paused span, right away.
    _materialize_due(d, now, late_reason="paused")
    _complete_if_no_instant_left(d, now)
    return Decision(events=d.events, body=_schedule_body(d.state))


def _waits_for_calendars(state: ScheduleState, now: datetime) -> ScheduleDecision | None:
    """A refusal while an instant is due that the schedule cannot settle yet: a calendar it
    names has not sent its copy (for the moment a subscription takes)."""
    if (calendars.awaiting(state) and state.next_due_at is not None
            and state.next_due_at <= now):
        waiting = [c.name for c in state.calendars or () if not c.received]
        return _reject("conflict", f"an instant is due and the schedule waits for the copy of "
                       f"calendar '{waiting[0]}' to decide it; retry shortly", "exclude")
    return None


def _calendar_copied(state: ScheduleState, p: m.CopyCalendar,
                     now: datetime) -> ScheduleDecision:
    """A calendar the schedule names sent a revision: held from now on (an older one than
    held changes nothing); instants that waited for it are decided now."""
    if not calendars.copy_newer(state, p):
        return Decision()
    d = _draft(state)
    d.emit(m.CalendarCopied(name=p.name, revision=p.revision, spec=p.spec))
    if d.state.status == "ACTIVE" and not calendars.awaiting(d.state):
        _materialize_due(d, now, late_reason="misfire")
        _expire_start_deadlines(d, now)
        _complete_if_no_instant_left(d, now)
    return Decision(events=d.events)


def _delete(state: ScheduleState, principal: str) -> ScheduleDecision:
    if not state.exists and state.status != "COMPLETED":  # a completed one can be deleted
        return _reject("not_found", "no such schedule")
    d = _draft(state)
    # Runs not yet started will never start; running ones finish under their fence.
    for run in _current_runs(d):
        if run.state in ("PENDING", "READY", "RETRY_WAIT"):
            d.emit(m.OccurrenceCancelled(run_id=run.run_id, by=principal,
                                         reason="schedule deleted"))
    d.emit(m.ScheduleDeleted())
    return Decision(events=d.events, body=_schedule_body(d.state))


# ---------------------------------------------------------------------------------------
# time: Tick


def tick(state: ScheduleState, now: datetime, resumed: bool = False) -> ScheduleDecision:
    """Everything due at ``now``: lease expiry, retry release, start deadlines, instants.

    ``resumed``: the processor's first timer of the schedule after it took the partition
    over (``Tick.resumed``): what is due fell in a gap (``_materialize_due``)."""
    if state.status == "NEW":
        return Decision()
    d = _draft(state)
    _expire_leases(d, now)
    _release_retries(d, now)
    _expire_start_deadlines(d, now)
    if d.state.status == "ACTIVE":
        _materialize_due(d, now, late_reason="misfire", resumed=resumed)
        # an occurrence materialized late may already be past its start deadline
        _expire_start_deadlines(d, now)
        _complete_if_no_instant_left(d, now)
    return Decision(events=d.events)


def _current_runs(d: ScheduleDraft) -> Iterator[Run]:
    """The draft's runs, each fetched when reached: an earlier event may have replaced it
    (copy-on-write) or retired it, so a list of run objects taken up front can be stale."""
    runs = d.state.runs
    if not runs:
        return
    for run_id in list(runs):
        run = d.state.run(run_id)
        if run is not None:
            yield run


def _expire_leases(d: ScheduleDraft, now: datetime) -> None:
    for run in _current_runs(d):
        if run.state == "LEASED" and run.lease_until is not None and run.lease_until < now:
            _expire_lease(d, run.run_id, now)


def _expire_lease(d: ScheduleDraft, run_id: str, now: datetime) -> None:
    """Lease expiry advances the fence at once; the run goes back to READY (or ends)."""
    run = d.state.run(run_id)
    assert run is not None
    assert run.lease_until is not None
    d.emit(m.LeaseExpired(run_id=run_id, attempt=run.attempt, fence=run.fence,
                          lease_until=run.lease_until))
    d.emit(m.FenceAdvanced(fence=d.state.fence + 1, run_id=run_id, reason="lease_expired"))
    run = d.state.run(run_id)
    assert run is not None
    if run.cancel_requested:
        d.emit(m.OccurrenceCancelled(run_id=run_id, reason="cancelled while its lease expired"))
    else:
        _retry_or_dead(d, run, now, immediate=True)
    _after_run_left_guard(d, now)


def _retry_or_dead(d: ScheduleDraft, run: Run, now: datetime, immediate: bool,
                   min_backoff: float = MIN_RETRY_BACKOFF_SECONDS, extra: float = 0.0) -> None:
    """A failed or expired attempt: another attempt (bounded) or the dead-letter state.

    A scheduled retry waits at least ``min_backoff`` seconds (the tenant's floor), and
    ``extra`` more (the tenant's retries per minute are spent)."""
    pol = d.state.policy
    assert pol is not None
    if d.state.status == "DELETED":
        # the schedule is gone: a running attempt may finish, but no new attempt starts
        d.emit(m.OccurrenceCancelled(run_id=run.run_id, reason="schedule deleted"))
        return
    used = run.attempt - run.attempt_base + 1
    if used >= pol.max_attempts:
        d.emit(m.OccurrenceDeadLettered(run_id=run.run_id, reason="max_attempts",
                                        message=f"{used} attempts used"))
        return
    deadline = (run.age_base or run.scheduled_at) + timedelta(seconds=pol.retry_max_age)
    if immediate:
        if now > deadline:
            d.emit(m.OccurrenceDeadLettered(run_id=run.run_id, reason="max_age"))
        else:
            d.emit(m.OccurrenceReady(run_id=run.run_id, attempt=run.attempt + 1,
                                     resource_class=run.resource_class, priority=run.priority))
        return
    wait = max(min_backoff, retry_delay(pol, run.run_id, run.attempt, used)) + extra
    retry_at = now + timedelta(seconds=wait)
    if retry_at > deadline:
        d.emit(m.OccurrenceDeadLettered(run_id=run.run_id, reason="max_age",
                                        message=f"next retry {m_iso(retry_at)} past max age"))
        return
    d.emit(m.RetryScheduled(run_id=run.run_id, attempt=run.attempt + 1, retry_at=retry_at))


def retry_delay(pol: Policy, run_id: str, attempt: int, used: int) -> float:
    """Exponential backoff, capped, with deterministic jitter in [50%, 100%] of the step."""
    base = min(pol.max_backoff, pol.initial_backoff * pol.multiplier ** (used - 1))
    return base * (0.5 + 0.5 * unit_hash(f"{run_id}#{attempt}"))


def unit_hash(text: str) -> float:
    """A deterministic number in [0, 1) from a string (the decider's only 'randomness')."""
    h = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def _release_retries(d: ScheduleDraft, now: datetime) -> None:
    for run in _current_runs(d):
        if run.state == "RETRY_WAIT" and run.retry_at is not None and run.retry_at <= now:
            d.emit(m.OccurrenceReady(run_id=run.run_id, attempt=run.attempt,
                                     resource_class=run.resource_class, priority=run.priority))


def _expire_start_deadlines(d: ScheduleDraft, now: datetime) -> None:
    for run in _current_runs(d):
        if (
            run.state in ("READY", "PENDING")
            and not run.claimed
            and run.start_deadline_at is not None
            and run.start_deadline_at < now
        ):
            _skip_for_start_deadline(d, run, now)


def _skip_for_start_deadline(d: ScheduleDraft, run: Run, now: datetime) -> None:
    d.emit(m.OccurrenceSkipped(run_id=run.run_id, scheduled_at=run.scheduled_at,
                               reason="start_deadline", materialized=True,
                               revision=run.revision, advances_schedule=False))
    _after_run_left_guard(d, now)


# ---------------------------------------------------------------------------------------
# materialization and misfire


def _materialize_due(d: ScheduleDraft, now: datetime, late_reason: str,
                     resumed: bool = False) -> None:
    """Materialize or skip every instant due at ``now`` (bounded per decision) as the
    misfire policy decides (``backlog.plan_due``). ``resumed``: the decision follows a
    take-over of the partition, so even one instant due is a gap
    (``Backlog.coalesces_unstarted``)."""
    s = d.state
    pol = s.policy
    if pol is None or s.status != "ACTIVE" or calendars.awaiting(s):
        return  # a calendar's copy is on its way: its arrival decides what is due
    plan = plan_due(s.schedule_id, pol, s.trigger, s.next_run_at, now, late_reason)
    if not plan.items:
        return
    if plan.coalesces_unstarted(pol, resumed):
        _coalesce_unstarted(d, now)
    # a catch-up (misfire all) runs its instants one after another, not side by side and
    # not skipped for overlapping each other: they wait behind the running one
    queue = plan.catch_up(pol) and pol.overlap != "allow"
    skipped_run: list[tuple[datetime, str, calendars.Exclusion | None]] = []
    for i, item in enumerate(plan.items):
        nxt = plan.items[i + 1].instant if i + 1 < len(plan.items) else plan.following
        excluded = calendars.exclusion(s.calendars, item.instant)
        if excluded is not None:  # whatever else the misfire policy says of it
            skipped_run.append((item.instant, "excluded", excluded))
        elif item.reason is None:
            _flush_skips(d, skipped_run, item.instant)
            _materialize(d, item.instant, nxt, now, queue)
            if pol.max_count is not None and s.count >= pol.max_count:
                return  # the last run: later instants are past the schedule's end
        else:
            skipped_run.append((item.instant, item.reason, None))
    if skipped_run:  # the last due instant was skipped: the schedule goes on after it
        _flush_skips(d, skipped_run, None, final_next=plan.following)


def _coalesce_unstarted(d: ScheduleDraft, now: datetime) -> None:
    """Misfire latest after a gap (a backlog, or an instant due at the first decision after
    a take-over): a scheduled occurrence from before it that never started (READY or
    PENDING, never claimed) is coalesced into the newest instant too, instead of holding the
    overlap guard against it. Manual runs are the caller's: never coalesced."""
    skipped = False
    for run in _current_runs(d):
        if run.trigger == "schedule" and run.state in ("READY", "PENDING") and not run.claimed:
            d.emit(m.OccurrenceSkipped(run_id=run.run_id, scheduled_at=run.scheduled_at,
                                       reason="coalesced", materialized=True,
                                       revision=run.revision, advances_schedule=False))
            skipped = True
    if skipped:
        _after_run_left_guard(d, now)


def _flush_skips(
    d: ScheduleDraft,
    skipped: list[tuple[datetime, str, calendars.Exclusion | None]],
    next_kept: datetime | None,
    final_next: datetime | None = None,
) -> None:
    """Record skipped instants: one event each, or one range event per long run of the same
    reason (and, for ``excluded``, the same calendar entry)."""
    if not skipped:
        return
    s = d.state
    pol = s.policy
    assert pol is not None
    groups: list[list[tuple[datetime, str, calendars.Exclusion | None]]] = []
    for item in skipped:
        if groups and groups[-1][0][1:] == item[1:]:
            groups[-1].append(item)
        else:
            groups.append([item])
    flat: list[tuple[datetime, datetime | None, int, str, calendars.Exclusion | None]] = []
    for g in groups:
        if len(g) > COLLAPSE_SKIPS_OVER:
            flat.append((g[0][0], g[-1][0], len(g), g[0][1], g[0][2]))
        else:
            flat.extend((t, None, 1, r, x) for t, r, x in g)
    for i, (first, through, count, reason, excl) in enumerate(flat):
        if i + 1 < len(flat):
            nxt: datetime | None = flat[i + 1][0]
        else:
            nxt = next_kept if next_kept is not None else final_next
        d.emit(
            m.OccurrenceSkipped(
                run_id=run_id_for(s.tenant, s.schedule_id, first),
                scheduled_at=first,
                reason=reason,  # type: ignore[arg-type]
                through=through,
                count=count,
                revision=s.revision,
                next_run_at=nxt,
                next_due_at=_due(s.schedule_id, nxt, pol),
                calendar=None if excl is None else excl.calendar,
                calendar_revision=None if excl is None else excl.revision,
                excluded_by=None if excl is None else excl.entry,
            )
        )
    skipped.clear()


def _materialize(
    d: ScheduleDraft, instant: datetime, nxt: datetime | None, now: datetime, queue: bool = False
) -> None:
    s = d.state
    pol = s.policy
    assert pol is not None
    skip_nxt = nxt  # an overlap skip does not use up max_count: the schedule continues
    if pol.max_count is not None and s.count + 1 >= pol.max_count:
        nxt = None
    run_id = run_id_for(s.tenant, s.schedule_id, instant)
    _admit(d, run_id, instant, pol.job, "schedule", None, nxt, now, advances=True,
           skip_nxt=skip_nxt, queue=queue)


def _admit(
    d: ScheduleDraft,
    run_id: str,
    instant: datetime,
    job: m.JobSpec,
    trigger: str,
    request_key: str | None,
    nxt: datetime | None,
    now: datetime,
    advances: bool,
    request_digest: str | None = None,
    skip_nxt: datetime | None = None,
    queue: bool = False,
    due: datetime | None = None,
    permit: tuple[str, int] | None = None,
) -> None:
    """Create an occurrence under the overlap policy (READY, PENDING, or skipped).

    ``nxt`` is the schedule's next instant after this occurrence; ``skip_nxt`` (default
    ``nxt``) the one after it when the overlap policy skips it instead. ``queue``: it waits
    (PENDING) behind an active run whatever the overlap policy (a catch-up). ``due``: when
    it is due (a backfill's run: now; default the instant plus the jitter); ``permit``: the
    concurrency key and limit it asks a permit of (a backfill's, one at a time). A backfill's
    run is READY whatever runs: it holds no overlap guard (``Run.active``).
    """
    s = d.state
    pol = s.policy
    assert pol is not None
    due_at = due or _due(s.schedule_id, instant, pol) or instant
    next_due = _due(s.schedule_id, nxt, pol)
    active = [] if trigger == "backfill" else s.active_runs()
    state = "READY"
    if active:
        policy = "buffer_all" if queue else pol.overlap
        if policy == "skip" or (policy == "buffer_one" and s.pending):
            if skip_nxt is not None:
                nxt = skip_nxt
                next_due = _due(s.schedule_id, nxt, pol)
            d.emit(
                m.OccurrenceSkipped(
                    run_id=run_id, scheduled_at=instant,
                    reason="overlap" if policy == "skip" else "overlap_buffer_full",
                    revision=s.revision, next_run_at=nxt if advances else None,
                    next_due_at=next_due if advances else None, advances_schedule=advances,
                    request_key=request_key, request_digest=request_digest,
                )
            )
            return
        if policy in ("buffer_one", "buffer_all"):
            state = "PENDING"
        elif policy == "cancel_previous":
            for run in active:
                if run.state == "RECONCILING":
                    continue  # its outcome is unknown: never cancelled behind a human's back
                if run.state == "LEASED":
                    d.emit(m.FenceAdvanced(fence=s.fence + 1, run_id=run.run_id,
                                           reason="superseded"))
                d.emit(m.OccurrenceCancelled(run_id=run.run_id, by="overlap",
                                             reason="superseded by a newer occurrence"))
    deadline = (
        due_at + timedelta(seconds=pol.start_deadline) if pol.start_deadline is not None else None
    )
    d.emit(
        m.OccurrenceMaterialized(
            run_id=run_id,
            scheduled_at=instant,
            due_at=due_at,
            revision=s.revision,
            job=job,
            trigger=trigger,  # type: ignore[arg-type]
            request_key=request_key,
            request_digest=request_digest,
            state=state,  # type: ignore[arg-type]
            start_deadline_at=deadline,
            resource_class=pol.resource_class,
            # a backfill's runs go after the tenant's other READY runs: on-time runs first
            priority=BACKFILL_PRIORITY if trigger == "backfill" else pol.priority,
            sequence=s.count + 1 if advances else s.count,
            next_run_at=nxt if advances else None,
            next_due_at=next_due if advances else None,
            advances_schedule=advances,
            permit_key=None if permit is None else permit[0],
            permit_limit=None if permit is None else permit[1],
        )
    )


def _after_run_left_guard(d: ScheduleDraft, now: datetime) -> None:
    """A run stopped holding the overlap guard: promote a buffered one; plan a delay run."""
    s = d.state
    pol = s.policy
    if pol is None:
        return
    if s.pending and not s.active_runs():
        head = s.pending[0]
        run = s.run(head)
        assert run is not None
        d.emit(m.OccurrenceReady(run_id=head, attempt=run.attempt,
                                 resource_class=run.resource_class, priority=run.priority))
    if (
        pol.kind == "delay"
        and s.status in ("ACTIVE", "PAUSED")
        and s.next_run_at is None
        and not s.active_runs()
        and (pol.max_count is None or s.count < pol.max_count)
    ):
        assert pol.spec.delay is not None
        nxt = s.trigger.next_after(now)
        if pol.spec.end is not None and nxt is not None and nxt > pol.spec.end:
            nxt = None
        if nxt is not None:
            d.emit(m.NextRunPlanned(next_run_at=nxt, next_due_at=_due(s.schedule_id, nxt, pol)))
    if pol.kind == "delay":
        _complete_if_no_instant_left(d, now)


# ---------------------------------------------------------------------------------------
# the end of a schedule: COMPLETED


def _complete_if_no_instant_left(d: ScheduleDraft, now: datetime) -> bool:
    """An ACTIVE schedule with no further instant ends: ScheduleCompleted (terminal).

    A fixed-delay schedule plans its next instant when its run finishes, so it ends only
    when no run of it is active and none was planned. Returns whether it completed.
    """
    s = d.state
    pol = s.policy
    if pol is None or not _no_instant_left(s):
        return False
    if pol.max_count is not None and s.count >= pol.max_count:
        reason = "max_count"
    else:
        reason = "at" if pol.kind == "at" else "end"
    d.emit(m.ScheduleCompleted(reason=reason, completed_at=now,  # type: ignore[arg-type]
                               last_scheduled_at=s.last_scheduled_at, count=s.count))
    return True


def _no_instant_left(s: ScheduleState) -> bool:
    """An ACTIVE schedule that will never materialize another instant."""
    if s.policy is None or s.status != "ACTIVE" or s.next_run_at is not None:
        return False
    return s.policy.kind != "delay" or not (s.active_runs() or s.pending)


def _refuse_completed(state: ScheduleState) -> ScheduleDecision | None:
    """A COMPLETED schedule is final: only delete applies to it (and its runs' commands)."""
    if state.status != "COMPLETED":
        return None
    return _reject("conflict", "schedule is COMPLETED: it has no further instant; "
                   "create a new schedule or delete this one", state="COMPLETED")


# ---------------------------------------------------------------------------------------
# runs: manual trigger, cancel, redrive, reconciliation


def params_digest(params: dict[str, Any] | None) -> str:
    raw = orjson.dumps(params, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def _trigger(state: ScheduleState, p: m.TriggerRun, now: datetime, command_id: str
             ) -> ScheduleDecision:
    if (ended := _refuse_completed(state)) is not None:
        return ended
    if not state.exists:
        return _reject("not_found", "no such schedule")
    digest = params_digest(p.params)
    known = (state.manual or {}).get(p.request_key)
    if known is not None:
        if known.digest != digest:
            return _reject("conflict", "request key reused with other params", "Idempotency-Key",
                           run_id=known.run_id)
        return Decision(body=_manual_answer(state, known))
    pol = state.policy
    assert pol is not None
    job = pol.job
    if p.params is not None:
        job = m.JobSpec(type=job.type, params={**job.params, **p.params}, timeout=job.timeout)
    run_id = manual_run_id(state.tenant, state.schedule_id, p.request_key,
                           f"{command_id}@{now.isoformat()}")
    d = _draft(state)
    _admit(d, run_id, now, job, "manual", p.request_key, None, now, advances=False,
           request_digest=digest)
    return Decision(events=d.events,
                    body=_manual_answer(d.state, (d.state.manual or {})[p.request_key]))


def _backfill(state: ScheduleState, p: m.BackfillSchedule, now: datetime,
              tenant: TenantContext) -> ScheduleDecision:
    """Run the rule's instants in [start, end) that no run has had: each as its own run
    (``trigger: backfill``, due now), READY at once (``allow``) or one after another
    (``buffer_all``: a permit of the key ``backfill:<schedule>``, limit 1 — or of the
    schedule's own concurrency key, whose limit holds for backfills too). Not run, and
    reported: an instant at or after the schedule's creation (``accounted``: the schedule
    ran it, skipped it with a reason, or will) and one an earlier backfill ran
    (``backfilled``). A backfill's runs hold no overlap guard: on-time instants never wait
    for them, nor are skipped because of them. Idempotent by request key."""
    if (ended := _refuse_completed(state)) is not None:
        return ended
    if not state.exists:
        return _reject("not_found", "no such schedule")
    digest = params_digest({"from": m_iso(p.start), "to": m_iso(p.end), "overlap": p.overlap})
    known = next((r for r in (state.backfills.requests if state.backfills else ())
                  if r[0] == p.request_key), None)
    if known is not None:
        if known[1] != digest:
            return _reject("conflict", "request key reused with another range or overlap",
                           "Idempotency-Key")
        return Decision(body=_backfill_body(p, known[2], known[3], repeated=True))
    pol = state.policy
    assert pol is not None and state.created_at is not None
    if p.end <= p.start:
        return _reject("invalid", "to must be after from", "to")
    if p.end > now:
        return _reject("invalid", f"to {m_iso(p.end)} is in the future: the schedule runs "
                       "its own instants; backfill a past range", "to")
    if pol.kind == "delay":
        return _reject("invalid", "a fixed-delay schedule has no instants to backfill: its "
                       "next instant follows its last run", "scheduleId")
    instants = _instants_in(state.trigger, p.start, p.end)
    if instants is None:
        return _reject("invalid", f"the range holds more than {MAX_BACKFILL_INSTANTS} "
                       f"instants of the rule; backfill at most {MAX_BACKFILL_INSTANTS} "
                       "per request (a shorter range)", "to")
    if calendars.awaiting(state):
        return _reject("conflict", "the schedule waits for the copy of a calendar it names; "
                       "retry shortly", "exclude")
    ranges = state.backfills.ranges if state.backfills else ()
    items: list[dict[str, Any]] = []
    to_run: list[datetime] = []
    for t in instants:
        if t >= state.created_at:
            items.append({"scheduled_at": t, "reason": "accounted"})
        elif any(a <= t < b for a, b in ranges):
            items.append({"scheduled_at": t, "reason": "backfilled"})
        elif (x := calendars.exclusion(state.calendars, t)) is not None:
            items.append({"scheduled_at": t, "reason": "excluded", "calendar": x.calendar,
                          "calendar_revision": x.revision, "excluded_by": x.entry})
        else:
            to_run.append(t)
    d = _draft(state)
    d.emit(m.BackfillRequested(
        request_key=p.request_key, digest=digest, start=p.start, end=p.end, overlap=p.overlap,
        instants=len(instants), runs=len(to_run),
        accounted=sum(1 for i in items if i["reason"] == "accounted"),
        backfilled=sum(1 for i in items if i["reason"] == "backfilled"),
        excluded=sum(1 for i in items if i["reason"] == "excluded")))
    pace = None
    if p.overlap == "buffer_all":
        pace = (permits.rule_for(pol.concurrency, pol.job, tenant)
                or (f"backfill:{state.schedule_id}", 1))
    for t in to_run:
        run_id = backfill_run_id(state.tenant, state.schedule_id, t)
        _admit(d, run_id, t, pol.job, "backfill", None, None, now, advances=False,
               due=now, permit=pace)
        items.append({"scheduled_at": t, "run_id": run_id})
    items.sort(key=lambda i: i["scheduled_at"])
    body = _backfill_body(p, len(instants), len(to_run), repeated=False)
    body["items"] = items
    return Decision(events=d.events, body=body)


BACKFILL_PRIORITY = -100  # the lowest a spec may ask for


def _instants_in(trigger: Trigger, start: datetime, end: datetime) -> list[datetime] | None:
    """The trigger's instants in [start, end); None when more than a backfill may run."""
    out: list[datetime] = []
    t = trigger.next_after(start - _US)
    while t is not None and t < end:
        if len(out) == MAX_BACKFILL_INSTANTS:
            return None
        out.append(t)
        t = trigger.next_after(t)
    return out


def _backfill_body(p: m.BackfillSchedule, instants: int, runs: int,
                   repeated: bool) -> dict[str, Any]:
    return {"backfill_id": p.request_key, "from": p.start, "to": p.end, "overlap": p.overlap,
            "instants": instants, "runs": runs, "repeated": repeated, "items": []}


def _manual_answer(state: ScheduleState, known: Manual) -> dict[str, Any]:
    """A manual trigger's answer: its run and the run's state — held, or recorded when the
    run left the state (None: finished before a version-1 snapshot, which did not record
    how; the run's read-model document tells)."""
    run = state.run(known.run_id)
    return {"run_id": known.run_id, "state": run.state if run is not None else known.final}


_ENDINGS: dict[type, str] = {m.ResultPublished: "SUCCEEDED", m.OccurrenceCancelled: "CANCELLED",
                             m.OccurrenceDeadLettered: "DEAD", m.OccurrenceSkipped: "SKIPPED"}


def _state_after(d: ScheduleDraft, run_id: str) -> str:
    """The run's state after the draft's events: held, or the one the event that ended it
    gave (a run can leave the state in the event that ends it: the DEAD ones kept are
    bounded)."""
    live = d.state.run(run_id)
    if live is not None:
        return live.state
    for e in reversed(d.events):
        if getattr(e, "run_id", None) == run_id:
            if isinstance(e, m.ReconciliationResolved) and e.decision == "delivered":
                return "SUCCEEDED"
            if type(e) in _ENDINGS:
                return _ENDINGS[type(e)]
    raise AssertionError(f"run {run_id} left the state without an ending event")


def _let_go(state: ScheduleState, run_id: str,
            scheduled_at: datetime | None) -> tuple[bool, str | None]:
    """Whether ``run_id`` names a run of this schedule the state no longer holds (a run
    leaves the state only once finished: only the newest finished run and ``DEAD_KEPT``
    DEAD ones stay), and its final state when that is known. A remembered manual trigger
    keeps its run's final state; a scheduled run is recognized by the instant the caller
    read for it (``scheduled_at``): its run ID is a hash of that instant, and an instant
    not after the last materialized one was materialized."""
    for entry in (state.manual or {}).values():
        if entry.run_id == run_id:
            return True, entry.final
    if (scheduled_at is not None and state.last_scheduled_at is not None
            and scheduled_at <= state.last_scheduled_at
            and run_id_for(state.tenant, state.schedule_id, scheduled_at) == run_id):
        return True, None
    return False, None


def _no_run(state: ScheduleState, run_id: str, scheduled_at: datetime | None,
            verb: str) -> ScheduleDecision:
    """The refusal of a cancel or redrive (``verb``) of a run the state does not hold: a
    conflict for a finished run it let go (naming its final state when known), not_found
    for a run ID it never had."""
    gone, final = _let_go(state, run_id, scheduled_at)
    if not gone:
        return _reject("not_found", "no such run")
    if final is None:
        return _reject("conflict", f"run has finished and is no longer held by the "
                       f"processor: it can no longer be {verb}")
    if verb == "redriven" and final != "DEAD":
        return _reject("conflict", f"only a DEAD run can be redriven; run is {final}",
                       state=final)
    return _reject("conflict", f"run is {final} and no longer held by the processor: it "
                   f"can no longer be {verb}", state=final)


def _cancel(state: ScheduleState, p: m.CancelRun, now: datetime,
            principal: str) -> ScheduleDecision:
    run = state.run(p.run_id)
    if run is None:
        return _no_run(state, p.run_id, p.scheduled_at, "cancelled")
    if run.terminal or run.state == "RECONCILING":
        return _reject("conflict", f"too late: run is {run.state}", state=run.state)
    if run.state == "LEASED":
        if run.cancel_requested:
            return Decision(body={"run_id": run.run_id, "outcome": "requested", "state": "LEASED"})
        d = _draft(state)
        d.emit(m.CancellationRequested(run_id=run.run_id, by=principal, reason=p.reason))
        return Decision(events=d.events,
                        body={"run_id": run.run_id, "outcome": "requested", "state": "LEASED"})
    d = _draft(state)
    d.emit(m.OccurrenceCancelled(run_id=run.run_id, by=principal, reason=p.reason))
    _after_run_left_guard(d, now)
    return Decision(events=d.events,
                    body={"run_id": run.run_id, "outcome": "cancelled", "state": "CANCELLED"})


def _redrive(state: ScheduleState, p: m.RedriveRun, now: datetime,
             principal: str) -> ScheduleDecision:
    run = state.run(p.run_id)
    if run is None:
        return _no_run(state, p.run_id, p.scheduled_at, "redriven")
    if run.state != "DEAD":
        return _reject("conflict", f"only a DEAD run can be redriven; run is {run.state}",
                       state=run.state)
    if state.status == "DELETED":
        return _reject("conflict", "the schedule was deleted", state=run.state)
    pol = state.policy
    assert pol is not None
    if pol.overlap in ("skip", "buffer_one", "buffer_all"):
        busy = state.active_runs()
        if busy:
            # a redriven run must not overlap a running one under this policy
            return _reject("conflict", f"run {busy[0].run_id} holds the overlap guard "
                           f"(overlap={pol.overlap}); redrive when it has finished",
                           state=run.state, blocking_run_id=busy[0].run_id)
    d = _draft(state)
    d.emit(m.OccurrenceRedriven(run_id=run.run_id, attempt=run.attempt + 1, by=principal,
                                redriven_at=now))
    return Decision(events=d.events, body={"run_id": run.run_id, "state": "READY",
                                           "attempt": run.attempt + 1})


def _resolve(
    state: ScheduleState, p: m.ResolveReconciliation, now: datetime, principal: str
) -> ScheduleDecision:
    run = state.run(p.run_id)
    if run is None:
        return _reject("not_found", "no such run")
    if run.state != "RECONCILING":
        return _reject("conflict", f"run is {run.state}, not RECONCILING", state=run.state)
    target = run.reconcile or "run"
    if p.decision == "retry" and target == "run" and state.status == "DELETED":
        return _reject("conflict", "the schedule was deleted: a new attempt cannot start; "
                       "resolve as delivered or abandon", state=run.state)
    if p.effect_id is not None and p.effect_id != target:
        # several effects may be uncertain at once: each one is resolved on its own
        if target == "run" or (run.effects or {}).get(p.effect_id, [None])[0] != "UNCERTAIN":
            return _reject("conflict", f"run is reconciling {target}, not {p.effect_id}")
        target = p.effect_id
    d = _draft(state)
    effect_id = None if target == "run" else target
    d.emit(m.ReconciliationResolved(run_id=run.run_id, decision=p.decision, by=principal,
                                    note=p.note, effect_id=effect_id))
    if target == "run":
        if p.decision == "retry":
            d.emit(m.OccurrenceReady(run_id=run.run_id, attempt=run.attempt + 1,
                                     resource_class=run.resource_class, priority=run.priority))
        elif p.decision == "abandon":
            d.emit(m.OccurrenceDeadLettered(run_id=run.run_id, reason="reconciliation_abandoned",
                                            message=p.note))
        _after_run_left_guard(d, now)
    elif p.decision == "retry":
        assert run.effects is not None
        _st, attempt, intent = run.effects[target]
        d.emit(intent.model_copy(update={"attempt": attempt + 1}))
    return Decision(events=d.events, body={"run_id": run.run_id,
                                           "state": _state_after(d, run.run_id)})


# ---------------------------------------------------------------------------------------
# attempts: claim, heartbeat, complete, fail


def _claim(state: ScheduleState, p: m.ClaimRun, now: datetime,
           tenant: TenantContext = OPEN_TENANT) -> ScheduleDecision:
    run = state.run(p.run_id)
    if run is None:
        return _reject("not_found", "no such run")
    if run.state != "READY":
        return _reject("conflict", f"run is {run.state}", state=run.state, run_id=run.run_id)
    if permits.waits_for_permit(run):
        assert run.concurrency is not None
        return _reject("conflict", f"run waits for a permit of concurrency key "
                       f"'{run.concurrency[0]}' (limit {run.concurrency[1]})",
                       state=run.state, run_id=run.run_id)
    if not run.claimed and run.start_deadline_at is not None and run.start_deadline_at < now:
        # the Tick has not run yet, but the deadline has passed: skip it now, never start it
        d = _draft(state)
        _skip_for_start_deadline(d, d.state.run(run.run_id), now)  # type: ignore[arg-type]
        return Decision(status="conflict", events=d.events, reason="start deadline passed",
                        body={"state": "SKIPPED", "run_id": run.run_id})
    pol = state.policy
    assert pol is not None
    fence = state.fence + 1
    lease_until = now + timedelta(seconds=pol.lease)
    timeout = tenant.timeout_for(run.job)
    d = _draft(state)
    d.emit(m.FenceAdvanced(fence=fence, run_id=run.run_id, reason="claim"))
    d.emit(m.AttemptClaimed(run_id=run.run_id, attempt=run.attempt, fence=fence,
                            worker_id=p.worker_id, claimed_at=now, lease_until=lease_until,
                            timeout=timeout))
    return Decision(
        events=d.events,
        body={
            "run_id": run.run_id,
            "attempt": run.attempt,
            "fence": fence,
            "lease_until": lease_until,
            "lease_seconds": pol.lease,
            "scheduled_at": run.scheduled_at,
            "revision": run.revision,
            "job_type": run.job.type,
            "params": run.job.params,
            "timeout": timeout,
        },
    )


def _current_lease(
    state: ScheduleState, run: Run | None, fence: int, now: datetime
) -> tuple[str, str] | None:
    """None when ``fence`` holds an unexpired lease on ``run``; else (status, reason)."""
    if run is None:
        return ("not_found", "no such run")
    if run.state != "LEASED":
        return ("stale_fence", f"run is {run.state}")
    if fence != run.fence:
        return ("stale_fence", f"fence {fence} is not current ({run.fence})")
    if run.lease_until is not None and now > run.lease_until:
        return ("stale_fence", "lease expired")
    return None


def _heartbeat(state: ScheduleState, p: m.Heartbeat, now: datetime) -> ScheduleDecision:
    run = state.run(p.run_id)
    problem = _current_lease(state, run, p.fence, now)
    if problem is not None:
        dec = _reject(problem[0], problem[1], current_fence=state.fence)  # type: ignore[arg-type]
        if problem[1] == "lease expired" and run is not None:
            d = _draft(state)  # never revive an expired epoch: expire it now
            _expire_lease(d, run.run_id, now)
            dec.events = d.events
        return dec
    assert run is not None
    pol = state.policy
    assert pol is not None
    lease_until = now + timedelta(seconds=pol.lease)
    d = _draft(state)
    d.emit(m.LeaseExtended(run_id=run.run_id, attempt=run.attempt, fence=run.fence,
                           lease_until=lease_until))
    return Decision(events=d.events, body={"lease_until": lease_until,
                                           "cancel_requested": run.cancel_requested})


def _complete(state: ScheduleState, p: m.CompleteRun, now: datetime,
              tenant: TenantContext = OPEN_TENANT) -> ScheduleDecision:
    run = state.run(p.run_id)
    if run is None:
        return _reject("not_found", "no such run")
    if run.state == "SUCCEEDED" and run.checksum is not None:
        if p.fence == run.result_fence and p.checksum == run.checksum:
            return Decision(body=_result_body(run))  # a repeat returns the saved result
        reason = "checksum_conflict" if p.fence == run.result_fence else "stale_fence"
        d = _draft(state)
        d.emit(_rejected(run, p, state.fence, reason))
        status: m.Status = "conflict" if reason == "checksum_conflict" else "stale_fence"
        return Decision(status=status, events=d.events, reason=reason,
                        body={"current_fence": state.fence, **_result_body(run)})
    problem = _current_lease(state, run, p.fence, now)
    if problem is not None:
        d = _draft(state)
        if problem[1] == "lease expired":
            d.emit(_rejected(run, p, state.fence, "lease_expired"))
            _expire_lease(d, run.run_id, now)
        else:
            reason = ("not_leased" if run.state != "LEASED" and run.fence == p.fence
                      else "stale_fence")
            d.emit(_rejected(run, p, state.fence, reason))
        return Decision(status="stale_fence", events=d.events, reason=problem[1],
                        body={"current_fence": d.state.fence})
    if p.worker_id != run.worker_id:
        return _not_assignee(run, p.worker_id)
    if tenant.result_refusal is not None:
        return _result_refused(state, p, now, tenant, *tenant.result_refusal)
    d = _draft(state)
    d.emit(m.ResultPublished(run_id=run.run_id, attempt=run.attempt, fence=p.fence,
                             worker_id=p.worker_id, checksum=p.checksum, size=p.size,
                             uri=p.uri, inline=p.inline, finished_at=now))
    pol = state.policy
    assert pol is not None
    for eff in pol.effects:
        d.emit(m.EffectIntended(effect_id=effect_id_for(eff.effect_name, run.run_id),
                                run_id=run.run_id, kind=eff.kind,
                                destination=eff.destination, config=eff.options(),
                                checksum=p.checksum, uri=p.uri, inline=p.inline))
    _after_run_left_guard(d, now)
    live = d.state.run(run.run_id)
    if live is None:  # retired at once (a bounded number of terminal runs is kept)
        return Decision(events=d.events, body={
            "run_id": run.run_id, "state": "SUCCEEDED", "checksum": p.checksum, "fence": p.fence,
            "result": {"checksum": p.checksum, "size": p.size, "uri": p.uri, "inline": p.inline}})
    return Decision(events=d.events, body=_result_body(live))


def _result_refused(state: ScheduleState, p: m.CompleteRun, now: datetime,
                    tenant: TenantContext, error_class: m.ErrorClass,
                    message: str) -> ScheduleDecision:
    """A result over the tenant's storage budget is not published: the attempt fails with
    ``message`` (naming the budget), retried or dead-lettered by the schedule's policy like
    any failure of ``error_class``; the worker is answered ``quota``."""
    failed = _fail(state, m.FailRun(run_id=p.run_id, attempt=p.attempt, fence=p.fence,
                                    worker_id=p.worker_id, error_class=error_class,
                                    message=message), now, tenant)
    if not failed.ok:
        return failed
    return Decision(status="quota", reason=message, field=STORAGE_SETTING, events=failed.events,
                    sends=failed.sends, body=failed.body)


def _not_assignee(run: Run, worker_id: str) -> ScheduleDecision:
    """An outcome must name the worker the attempt is leased to: the fence alone is a small
    counter anyone could guess, the assignee is who the processor handed the run to."""
    return _reject("forbidden", f"worker '{worker_id}' is not the attempt's assignee",
                   "worker_id")


def _rejected(run: Run, p: m.CompleteRun, current: int, reason: str) -> m.CompletionRejected:
    return m.CompletionRejected(run_id=run.run_id, attempt=p.attempt, fence=p.fence,
                                current_fence=current, worker_id=p.worker_id,
                                checksum=p.checksum, reason=reason)  # type: ignore[arg-type]


def _result_body(run: Run) -> dict[str, Any]:
    saved = run.result
    result = None if saved is None else {"checksum": run.checksum, "size": saved[0],
                                         "uri": saved[1], "inline": saved[2]}
    return {"run_id": run.run_id, "state": run.state, "checksum": run.checksum,
            "fence": run.result_fence, "result": result}


def _fail(state: ScheduleState, p: m.FailRun, now: datetime,
          tenant: TenantContext = OPEN_TENANT) -> ScheduleDecision:
    run = state.run(p.run_id)
    problem = _current_lease(state, run, p.fence, now)
    if problem is not None:
        dec = _reject(problem[0], problem[1], current_fence=state.fence)  # type: ignore[arg-type]
        if problem[1] == "lease expired" and run is not None:
            d = _draft(state)
            _expire_lease(d, run.run_id, now)
            dec.events = d.events
        return dec
    assert run is not None
    if p.worker_id != run.worker_id:
        return _not_assignee(run, p.worker_id)
    d = _draft(state)
    d.emit(m.AttemptFailed(run_id=run.run_id, attempt=run.attempt, fence=p.fence,
                           worker_id=p.worker_id, error_class=p.error_class, message=p.message,
                           reason=p.reason))
    run = d.state.run(run.run_id)
    assert run is not None  # a failed attempt leaves its run in place
    if run.cancel_requested:
        d.emit(m.OccurrenceCancelled(run_id=run.run_id, reason="cancelled; attempt failed"))
    elif p.error_class == "transient":
        _retry_or_dead(d, run, now, immediate=False, min_backoff=tenant.min_backoff,
                       extra=tenant.retry_delay)
    elif p.error_class == "permanent":
        d.emit(m.OccurrenceDeadLettered(run_id=run.run_id, reason="permanent_error",
                                        message=p.message))
    else:
        d.emit(m.ReconciliationRequired(
            run_id=run.run_id, reason="ambiguous failure: the outcome is unknown",
            evidence={"attempt": run.attempt, "fence": p.fence, "worker_id": p.worker_id,
                      "message": p.message},
        ))
    _after_run_left_guard(d, now)
    live = d.state.run(run.run_id)
    if live is None:  # retired at once (a bounded number of terminal runs is kept)
        return Decision(events=d.events, body={"run_id": run.run_id,
                                               "state": _state_after(d, run.run_id),
                                               "attempt": run.attempt, "retry_at": None})
    return Decision(events=d.events, body={"run_id": run.run_id, "state": live.state,
                                           "attempt": live.attempt,
                                           "retry_at": live.retry_at})


def _effect_outcome(state: ScheduleState, p: m.RecordEffectOutcome,
                    now: datetime) -> ScheduleDecision:
    run = state.run(p.run_id)
    if run is None or run.effects is None or p.effect_id not in run.effects:
        return _reject("not_found", "no such effect")
    current = run.effects[p.effect_id][0]
    if current in ("SUCCEEDED", "FAILED", "ABANDONED"):
        return Decision(body={"effect_id": p.effect_id, "state": current})
    d = _draft(state)
    if p.outcome == "succeeded":
        d.emit(m.EffectSucceeded(effect_id=p.effect_id, run_id=run.run_id, evidence=p.evidence))
    elif p.outcome == "failed":
        d.emit(m.EffectFailed(effect_id=p.effect_id, run_id=run.run_id, evidence=p.evidence))
    else:
        if current == "UNCERTAIN":
            return Decision(body={"effect_id": p.effect_id, "state": current})
        d.emit(m.EffectUncertain(effect_id=p.effect_id, run_id=run.run_id, evidence=p.evidence))
        d.emit(m.ReconciliationRequired(run_id=run.run_id, effect_id=p.effect_id,
                                        reason="effect outcome unknown and the destination "
                                        "offers no idempotency or status lookup",
                                        evidence=p.evidence))
    live = d.state.run(run.run_id)
    assert live is not None and live.effects is not None  # an effect outcome keeps its run
    return Decision(events=d.events, body={"effect_id": p.effect_id,
                                           "state": live.effects[p.effect_id][0]})


# ---------------------------------------------------------------------------------------
# moves between partitions (docs/design.md §18)


def held(state: ScheduleState) -> bool:
    """Whether anything of the schedule is on this partition: it was created (whatever its
    status since), or a create of it waits for a quota slot."""
    return state.status != "NEW" or state.quota is not None


def move_out(state: ScheduleState, to_partition: int, version: int,
             from_partition: int) -> ScheduleDecision:
    """The handover rule for one key: its state leaves this partition (``KeyMovedOut``) and
    an adopt command carrying the whole of it goes to ``to_partition`` in the same
    transaction. ``state`` must be a live state (not a draft)."""
    if not held(state):
        return _reject("not_found", "nothing of the schedule is held here")
    encoded, shape = moved_schedule(state)
    adopt = m.AdoptKey(kind="schedule", state=encoded, shape=shape,
                       state_version=STATE_VERSION, from_partition=from_partition,
                       version=version)
    key = partition_key(state.tenant, state.schedule_id)
    d = _draft(state)
    d.emit(m.KeyMovedOut(to_partition=to_partition, version=version))
    return Decision(events=d.events, sends=[Send(state.schedule_id,
                                                 move_command_id("in", version, key), adopt,
                                                 partition=to_partition)])


def _adopt(state: ScheduleState, command: m.CommandEnvelope, p: m.AdoptKey) -> ScheduleDecision:
    """A key moved here by its old home's handover is installed exactly as it left
    (``KeyMovedIn`` carries the state): never over a state held here."""
    if command.principal != PROCESSOR:
        return _reject("forbidden", "only the processor moves a schedule between partitions")
    if p.kind != "schedule":
        return _reject("invalid", f"a {p.kind} state is adopted by its own aggregate", "kind")
    if held(state):
        return _reject("conflict", "the schedule is held here already: an adopted state never "
                       "replaces one", "scheduleId")
    try:
        moved = decode_moved_schedule(p.state, p.shape, p.state_version)
    except StateDecodeError as exc:
        return _reject("invalid", f"the adopted state does not decode: {exc}", "state")
    if (moved.tenant, moved.schedule_id) != (state.tenant, state.schedule_id):
        return _reject("invalid", f"the adopted state is of {moved.tenant}/"
                       f"{moved.schedule_id}", "state")
    d = _draft(state)
    d.emit(m.KeyMovedIn(kind="schedule", state=p.state, shape=p.shape,
                        state_version=p.state_version, from_partition=p.from_partition,
                        version=p.version))
    return Decision(events=d.events, body={"adopted": True, "revision": d.state.revision})


# =======================================================================================
# evolve


def evolve(state: ScheduleState, event: m.ScheduleEvent) -> ScheduleState:
    """Fold one event into the state (in place; returns it). Never recomputes a value."""
    match event:
        case m.FenceAdvanced():
            state.fence = event.fence
        case m.AttemptClaimed():
            run = _run(state, event.run_id)
            run.state = "LEASED"
            run.attempt = event.attempt
            run.fence = event.fence
            run.worker_id = event.worker_id
            run.lease_until = event.lease_until
            run.claimed = True
        case m.LeaseExtended():
            _run(state, event.run_id).lease_until = event.lease_until
        case m.OccurrenceMaterialized():
            _evolve_materialized(state, event)
        case m.ResultPublished():
            run = _run(state, event.run_id)
            run.state = "SUCCEEDED"
            run.checksum = event.checksum
            run.result_fence = event.fence
            run.result = (event.size, event.uri, event.inline)  # compact; see _result_body
            run.lease_until = None
            run.worker_id = None  # not needed once terminal (ResultPublished keeps it)
            _retire(state, run)
        case m.OccurrenceReady():
            run = _run(state, event.run_id)
            run.state = "READY"
            run.attempt = event.attempt
            run.retry_at = None
            run.lease_until = None
            _unpend(state, event.run_id)
        case m.OccurrenceSkipped():
            _evolve_skipped(state, event)
        case m.LeaseExpired():
            run = _run(state, event.run_id)
            run.lease_until = None
            run.worker_id = None
        case m.RetryScheduled():
            run = _run(state, event.run_id)
            run.state = "RETRY_WAIT"
            run.attempt = event.attempt
            run.retry_at = event.retry_at
            run.lease_until = None
        case m.AttemptFailed():
            pass  # the following event (retry, dead, reconciliation, cancel) moves the run
        case m.EffectIntended():
            run = _run(state, event.run_id)
            if run.effects is None:
                run.effects = {}
            run.effects[event.effect_id] = ["INTENDED", event.attempt, event]
        case m.ScheduleCreated():
            pol = policy_for(event.spec)
            state.status = "ACTIVE"
            state.revision = event.revision
            state.policy = pol
            state.trigger = trigger_of(event.spec, event.anchor)
            state.request_key = event.request_key
            state.created_hash = pol.spec_hash
            state.created_at = event.created_at
            state.anchor = event.anchor
            state.next_run_at = event.next_run_at
            state.next_due_at = event.next_due_at
            state.calendars = calendars.copies_for(state.calendars, event.spec.exclude)
            if isinstance(state.quota, QuotaWait):  # created with its reserved slot
                state.quota = state.quota.command_id
        case m.ScheduleRevised():
            state.revision = event.revision
            state.policy = policy_for(event.spec)
            state.anchor = event.anchor
            state.trigger = trigger_of(event.spec, event.anchor)
            state.next_run_at = event.next_run_at
            state.next_due_at = event.next_due_at
            state.calendars = calendars.copies_for(state.calendars, event.spec.exclude)
        case m.CalendarCopied():
            state.calendars = calendars.copied(state.calendars, event)
        case m.SchedulePaused():
            state.status = "PAUSED"
            state.paused_at = event.paused_at
        case m.ScheduleResumed():
            state.status = "ACTIVE"
            state.paused_at = None
            state.next_run_at = event.next_run_at
            state.next_due_at = event.next_due_at
        case m.ScheduleDeleted():
            state.status = "DELETED"
            state.next_run_at = state.next_due_at = None
            state.pending = None
        case m.ScheduleCompleted():
            state.status = "COMPLETED"
            state.next_run_at = state.next_due_at = None
        case m.NextRunPlanned():
            state.next_run_at = event.next_run_at
            state.next_due_at = event.next_due_at
        case m.OccurrenceDeadLettered():
            run = _run(state, event.run_id)
            run.state = "DEAD"
            run.lease_until = None
            run.reconcile = None
            _retire(state, run)
        case m.OccurrenceRedriven():
            run = _run(state, event.run_id)
            run.state = "READY"
            run.attempt = event.attempt
            run.attempt_base = event.attempt
            run.age_base = event.redriven_at
        case m.CompletionRejected():
            pass  # kept for audit; no state change
        case m.CancellationRequested():
            _run(state, event.run_id).cancel_requested = True
        case m.OccurrenceCancelled():
            run = _run(state, event.run_id)
            run.state = "CANCELLED"
            run.lease_until = None
            _unpend(state, event.run_id)
            _retire(state, run)
        case m.ReconciliationRequired():
            run = _run(state, event.run_id)
            run.state = "RECONCILING"
            run.reconcile = event.effect_id or "run"
            run.lease_until = None
        case m.ReconciliationResolved():
            _evolve_resolved(state, event)
        case m.EffectSucceeded():
            _set_effect(state, event.run_id, event.effect_id, "SUCCEEDED")
        case m.EffectFailed():
            _set_effect(state, event.run_id, event.effect_id, "FAILED")
        case m.EffectUncertain():
            _set_effect(state, event.run_id, event.effect_id, "UNCERTAIN")
        case m.ScheduleCreationHeld():
            state.quota = QuotaWait(event.command_id, event.request_key, event.spec,
                                    event.reply_to)
        case m.ScheduleCreationRefused():
            state.quota = None
        case m.RunAwaitsPermit() | m.RunPermitted() | m.RunPermitReturned():
            _evolve_permit(state, event)
        case m.BackfillRequested():
            _evolve_backfill(state, event)
        case m.KeyMovedOut():
            state.become(initial_state(state.tenant, state.schedule_id))
        case m.KeyMovedIn():
            state.become(decode_moved_schedule(event.state, event.shape, event.state_version))
        case _:
            assert_never(event)
    return state


def _run(state: ScheduleState, run_id: str) -> Run:
    return state.own(run_id)


def _evolve_backfill(state: ScheduleState, e: m.BackfillRequested) -> None:
    """Remember the request (the last ``BACKFILL_KEYS_KEPT``) and its range, merged."""
    old = state.backfills or Backfills((), ())
    requests = (*old.requests, (e.request_key, e.digest, e.instants, e.runs))
    ranges = sorted((*old.ranges, (e.start, e.end)))
    merged: list[tuple[datetime, datetime]] = []
    for a, b in ranges:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    state.backfills = Backfills(requests[-BACKFILL_KEYS_KEPT:], tuple(merged))


def _evolve_permit(state: ScheduleState,
                   event: m.RunAwaitsPermit | m.RunPermitted | m.RunPermitReturned) -> None:
    """A run's permit event; the kept finished run stays where it is, a retired one is gone."""
    if state.runs is not None and event.run_id in state.runs:
        permits.evolve_run(state.own(event.run_id), event)
    elif state.done is not None and state.done.run_id == event.run_id:
        done = state.done.clone()
        permits.evolve_run(done, event)
        state.done = done


def _unpend(state: ScheduleState, run_id: str) -> None:
    if state.pending and run_id in state.pending:
        state.pending.remove(run_id)
        if not state.pending:
            state.pending = None


def _evolve_materialized(state: ScheduleState, e: m.OccurrenceMaterialized) -> None:
    pol = state.policy
    assert pol is not None
    run = Run(e.run_id, e.scheduled_at, e.due_at, e.revision, e.job, e.trigger, e.state,
              e.start_deadline_at, e.resource_class, e.priority)
    if state.runs is None:
        state.runs = {}
    state.runs[e.run_id] = run
    if state.owned is not None:
        state.owned.add(e.run_id)
    if e.trigger == "backfill":  # due now: its retries' max age counts from there
        run.age_base = e.due_at
    if e.permit_key is not None and e.permit_limit is not None:
        run.concurrency = (e.permit_key, e.permit_limit)
    if e.state == "PENDING":
        if state.pending is None:
            state.pending = []
        state.pending.append(e.run_id)
    if e.advances_schedule:
        state.last_scheduled_at = e.scheduled_at
        state.count = e.sequence
        state.next_run_at = e.next_run_at
        state.next_due_at = e.next_due_at
    if e.request_key is not None:
        _remember_manual(state, e.request_key, e.request_digest or "", e.run_id)


def _remember_manual(state: ScheduleState, key: str, digest: str, run_id: str,
                     final: str | None = None) -> None:
    manual = state.own_manual()
    manual[key] = Manual(run_id, digest, final)
    if len(manual) > MANUAL_KEYS_KEPT:
        del manual[next(iter(manual))]


def _evolve_skipped(state: ScheduleState, e: m.OccurrenceSkipped) -> None:
    if e.materialized:
        run = _run(state, e.run_id)
        run.state = "SKIPPED"
        _unpend(state, e.run_id)
        _retire(state, run)
        return
    if e.request_key is not None:  # skipped before it was held: final at once
        _remember_manual(state, e.request_key, e.request_digest or "", e.run_id, "SKIPPED")
    if e.advances_schedule:
        state.last_scheduled_at = e.through or e.scheduled_at
        state.next_run_at = e.next_run_at
        state.next_due_at = e.next_due_at


def _evolve_resolved(state: ScheduleState, e: m.ReconciliationResolved) -> None:
    run = _run(state, e.run_id)
    run.reconcile = None
    if e.effect_id is None:
        if e.decision == "delivered":
            run.state = "SUCCEEDED"
            _retire(state, run)
        # retry / abandon: the following OccurrenceReady / OccurrenceDeadLettered moves it
        return
    assert run.effects is not None
    entry = run.effects[e.effect_id]
    entry[0] = {"delivered": "SUCCEEDED", "abandon": "ABANDONED", "retry": "INTENDED"}[e.decision]
    _settle_effect_reconciliation(run)


def _settle_effect_reconciliation(run: Run) -> None:
    """A run reconciling its effects stays so while any effect is still uncertain."""
    assert run.effects is not None
    uncertain = [k for k, v in run.effects.items() if v[0] == "UNCERTAIN"]
    if uncertain:
        run.state = "RECONCILING"
        run.reconcile = uncertain[0]
    else:
        run.state = "SUCCEEDED"
        run.reconcile = None


def _set_effect(state: ScheduleState, run_id: str, effect_id: str, value: str) -> None:
    run = _run(state, run_id)
    assert run.effects is not None
    run.effects[effect_id][0] = value
    if run.state == "RECONCILING" and run.reconcile not in (None, "run") and value != "UNCERTAIN":
        # a late definite outcome (e.g. a status lookup) ends that effect's reconciliation
        _settle_effect_reconciliation(run)


def _retire(state: ScheduleState, run: Run) -> None:
    """Bound the finished runs kept: the newest one (``state.done``), and the DEAD ones.

    Finished runs with open effects stay in ``runs`` until their effects are settled. A
    manual run that leaves the state leaves its final state with its request key.
    """
    runs = state.runs
    if runs is None:
        return
    finished = [r for r in runs.values() if r.terminal and r.state != "DEAD"
                and not _has_open_effects(r)]
    if finished:
        # keep the run that just finished: the same decision may go on with it (its effects)
        keep = run if any(r is run for r in finished) else finished[-1]
        for r in finished:
            del runs[r.run_id]
            if r is not keep:
                _forget(state, r)
        if state.done is not None:
            _forget(state, state.done)
        state.done = keep
    dead = [r for r in runs.values() if r.state == "DEAD"]
    while len(dead) > DEAD_KEPT:
        gone = dead.pop(0)
        del runs[gone.run_id]
        _forget(state, gone)
    if not runs:
        state.runs = None


def _forget(state: ScheduleState, run: Run) -> None:
    """``run`` leaves the state: if a remembered manual trigger made it, its entry keeps the
    run's final state (a repeated trigger answers it, ``_manual_answer``)."""
    if run.trigger != "manual" or not state.manual:
        return
    key = next((k for k, v in state.manual.items() if v.run_id == run.run_id), None)
    if key is not None:
        manual = state.own_manual()
        manual[key] = manual[key]._replace(final=run.state)


def _has_open_effects(run: Run) -> bool:
    return run.effects is not None and any(v[0] in ("INTENDED", "UNCERTAIN")
                                           for v in run.effects.values())


def fold(tenant: str, schedule_id: str, events: list[m.ScheduleEvent]) -> ScheduleState:
    """The state after folding ``events`` from the initial state."""
    s = initial_state(tenant, schedule_id)
    for e in events:
        evolve(s, e)
    return s


def next_wakeup(state: ScheduleState) -> datetime | None:
    """The earliest instant at which a Tick would change something for this schedule."""
    best: datetime | None = None
    if state.status == "ACTIVE" and state.next_due_at is not None:
        # (none while a calendar's copy is on its way: its arrival decides what is due)
        best = None if calendars.awaiting(state) else state.next_due_at
    elif _no_instant_left(state):
        # ended before it could complete (a log written before COMPLETED existed): a Tick
        # now completes it
        best = state.last_scheduled_at or state.created_at
    for run in (state.runs or {}).values():
        t: datetime | None = None
        if run.state == "LEASED" and run.lease_until is not None:
            t = run.lease_until + _US  # expiry is strictly after lease_until
        elif run.state == "RETRY_WAIT":
            t = run.retry_at
        elif run.state in ("READY", "PENDING") and not run.claimed and run.start_deadline_at:
            t = run.start_deadline_at + _US
        if t is not None and (best is None or t < best):
            best = t
    return best


# =======================================================================================
# the schedule as an aggregate (chronolog.commands.aggregate)

_SCHEDULE_COMMANDS: tuple[type, ...] = get_args(m.ScheduleCommand)
_SCHEDULE_EVENTS: tuple[type, ...] = get_args(m.ScheduleEvent)


class ScheduleAggregate:
    """A schedule, keyed ``tenant/schedule-id``: ``decide``, ``evolve``, ``next_wakeup``,
    ``move_out`` and the snapshot codec of its state."""

    kind = "schedule"

    def initial(self, tenant: str, schedule_id: str) -> ScheduleState:
        return initial_state(tenant, schedule_id)

    def decide(self, state: ScheduleState, command: m.CommandEnvelope, now: datetime,
               tenant: TenantContext) -> ScheduleDecision:
        return decide(state, command, now, tenant)

    def evolve(self, state: ScheduleState, event: m.ScheduleEvent) -> ScheduleState:
        return evolve(state, event)

    def wakeup(self, state: ScheduleState) -> datetime | None:
        return next_wakeup(state)

    def move_out(self, state: ScheduleState, to_partition: int, version: int,
                 from_partition: int) -> ScheduleDecision:
        return move_out(state, to_partition, version, from_partition)

    def accepts(self, payload: m.Command) -> TypeGuard[m.ScheduleCommand]:
        return isinstance(payload, _SCHEDULE_COMMANDS)

    def owns(self, event: m.Event) -> TypeGuard[m.ScheduleEvent]:
        return isinstance(event, _SCHEDULE_EVENTS)

    def encode(self, state: ScheduleState) -> tuple[str, str | None]:
        return moved_schedule(state)

    def decode(self, state: str, shape: str | None, version: int) -> ScheduleState:
        return decode_moved_schedule(state, shape, version)


SCHEDULE: Aggregate[ScheduleState, m.ScheduleCommand, m.ScheduleEvent] = ScheduleAggregate()
