"""The tenant quota aggregate: ``decide_quota(state, command, now, max_schedules)`` and
``evolve_quota(state, event)``. Pure, like the schedule decider: time enters as ``now``.

A tenant with ``max_schedules`` has one quota aggregate, keyed ``tenant/@quota`` — one
partition, so one processor decides every slot of the tenant, in one order, whatever the
partitions of its schedules. A slot is held per schedule under the command ID of the create
that asked for it:

* ``ReserveQuotaSlot`` — a free slot is reserved until ``now + RESERVATION_TTL`` and granted,
  or the reservation is refused (the answer goes back to the schedule either way);
* ``ConfirmQuotaSlot`` — the schedule was created: the reservation becomes a taken slot;
* ``ReleaseQuotaSlot`` — the create was refused after all, or the schedule stopped being
  live: the slot is free again;
* ``Tick`` — a reservation whose create never confirmed is released at its end
  (``released_at`` is the Tick's ``now``), and the held create is told.

A repeated step changes nothing (a reserve for a slot already held answers again; a release
of a slot not held is a no-op), so at most ``max_schedules`` slots are ever taken or
reserved, and every reservation ends confirmed or released.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypeGuard, assert_never, get_args

from chronolog.commands.aggregate import PROCESSOR, Aggregate, Decision, Draft, Send, TenantContext
from chronolog.commands.calendars import decide_calendar, evolve_calendar
from chronolog.commands.permits import decide_permit, evolve_permit
from chronolog.commands.state import CalendarHome, QuotaState
from chronolog.commands.state_codec import (
    STATE_VERSION,
    StateDecodeError,
    decode_moved_quota,
    moved_quota,
)
from chronolog.domain import messages as m
from chronolog.domain.ids import (
    CALENDAR_PREFIX,
    QUOTA_ID,
    limit_id,
    move_command_id,
    partition_key,
    saga_command_id,
)

__all__ = ["QUOTA", "RESERVATION_TTL", "QuotaState", "decide_quota", "evolve_quota",
           "move_out_quota", "quota_wakeup"]

# how long a reserved slot waits for its schedule's processor to create the schedule
RESERVATION_TTL = timedelta(seconds=60)


def decide_quota(state: QuotaState, command: m.CommandEnvelope, now: datetime,
                 max_schedules: int | None) -> QuotaDecision:
    """Decide one command of the tenant's quota aggregate at authority time ``now``."""
    p = command.payload
    if isinstance(p, m.Tick):
        return _expire(state, now)
    if isinstance(p, m.AdoptKey):
        return _adopt(state, command, p)
    if isinstance(p, (m.AcquirePermit, m.ReleasePermit)):
        return _permit(state, command, p)
    if isinstance(p, (m.PutCalendar, m.DeleteCalendar, m.SubscribeCalendar,
                      m.UnsubscribeCalendar)):
        return decide_calendar(_draft(state), command, p)
    if state.schedule_id.startswith(CALENDAR_PREFIX):
        return Decision(status="invalid", field="scheduleId",
                        reason=f"schedule ID '{state.schedule_id}' is a calendar, not a "
                        f"schedule")
    if state.schedule_id != QUOTA_ID:
        return Decision(status="invalid", field="scheduleId",
                        reason=f"schedule ID '{state.schedule_id}' is a concurrency key's "
                        f"permits, not a schedule")
    if not isinstance(p, (m.ReserveQuotaSlot, m.ConfirmQuotaSlot, m.ReleaseQuotaSlot)):
        return Decision(status="invalid", field="scheduleId",
                        reason=f"schedule ID '{QUOTA_ID}' is the tenant's quota, not a schedule")
    if command.principal != PROCESSOR:
        return Decision(status="forbidden",
                        reason="only the processor reserves, confirms or releases quota slots")
    d = _draft(state)
    held = state.slots.get(p.schedule_id)
    match p:
        case m.ReserveQuotaSlot():
            _reserve(d, p, held, now, max_schedules)
        case m.ConfirmQuotaSlot():
            if held is None:  # its reservation expired meanwhile: the schedule is live all
                # the same, so its slot is taken (the audit reports a quota this exceeds)
                d.emit(m.QuotaSlotConfirmed(schedule_id=p.schedule_id,
                                            create_command_id=p.create_command_id, late=True))
            elif held[0] == p.create_command_id and held[1] is not None:
                d.emit(m.QuotaSlotConfirmed(schedule_id=p.schedule_id,
                                            create_command_id=p.create_command_id))
        case m.ReleaseQuotaSlot():
            if held is not None and held[0] == p.create_command_id:
                d.emit(m.QuotaSlotReleased(schedule_id=p.schedule_id,
                                           create_command_id=p.create_command_id,
                                           reason=p.reason, released_at=now))
    return Decision(events=d.events, sends=d.sends)


def _reserve(d: QuotaDraft, p: m.ReserveQuotaSlot, held: tuple[str, datetime | None] | None,
             now: datetime, max_schedules: int | None) -> None:
    """Reserve a free slot for the schedule and grant it, or refuse; answer either way."""
    s = d.state
    if held is not None and held[0] == p.create_command_id:  # asked again: the same answer
        _answer(d, p.schedule_id, p.create_command_id, True, held[1] or now + RESERVATION_TTL)
        return
    taken, reserved = s.taken(), s.reserved()
    if held is not None:
        reason = "the schedule already holds a quota slot"
    elif max_schedules is not None and taken + reserved >= max_schedules:
        reason = (f"tenant has {taken} active schedules (max {max_schedules})" if not reserved
                  else f"tenant has {taken} active schedules and {reserved} being created "
                  f"(max {max_schedules})")
    else:
        until = now + RESERVATION_TTL
        d.emit(m.QuotaSlotReserved(schedule_id=p.schedule_id,
                                   create_command_id=p.create_command_id,
                                   max_schedules=max_schedules, expires_at=until))
        _answer(d, p.schedule_id, p.create_command_id, True, until)
        return
    d.emit(m.QuotaSlotRefused(schedule_id=p.schedule_id, create_command_id=p.create_command_id,
                              max_schedules=max_schedules, taken=taken, reserved=reserved,
                              reason=reason))
    _answer(d, p.schedule_id, p.create_command_id, False, None, reason)


def _permit(state: QuotaState, command: m.CommandEnvelope,
            p: m.AcquirePermit | m.ReleasePermit) -> QuotaDecision:
    """A request for (or the release of) a permit of the concurrency key this aggregate is."""
    if command.principal != PROCESSOR:
        return Decision(status="forbidden",
                        reason="only the processor asks for or gives back a permit")
    if state.schedule_id != limit_id(p.key):
        return Decision(status="invalid", field="key",
                        reason=f"the permits of key {p.key!r} are not decided here")
    d = _draft(state)
    decide_permit(d, p)
    return Decision(events=d.events, sends=d.sends)


def move_out_quota(state: QuotaState, to_partition: int, version: int,
                   from_partition: int) -> QuotaDecision:
    """The handover rule for a tenant's quota aggregate (as ``decider.move_out`` for a
    schedule): its slots leave this partition, an adopt command carries them to
    ``to_partition`` in the same transaction."""
    adopt = m.AdoptKey(kind="quota", state=moved_quota(state), state_version=STATE_VERSION,
                       from_partition=from_partition, version=version)
    d = _draft(state)
    d.emit(m.KeyMovedOut(to_partition=to_partition, version=version))
    return Decision(events=d.events, sends=[
        Send(state.schedule_id, move_command_id(
            "in", version, partition_key(state.tenant, state.schedule_id)), adopt,
             partition=to_partition)])


def _adopt(state: QuotaState, command: m.CommandEnvelope, p: m.AdoptKey) -> QuotaDecision:
    """The tenant's quota moved here: installed exactly as it left, never over slots held
    here."""
    if command.principal != PROCESSOR:
        return Decision(status="forbidden", reason="only the processor moves a tenant's quota")
    if p.kind != "quota":
        return Decision(status="invalid", field="kind",
                        reason=f"a {p.kind} state is adopted by its own aggregate")
    if not state.empty:
        return Decision(status="conflict", field="scheduleId",
                        reason="the tenant's quota is held here already")
    try:
        moved = decode_moved_quota(p.state, p.state_version)
    except StateDecodeError as exc:
        return Decision(status="invalid", field="state",
                        reason=f"the adopted quota does not decode: {exc}")
    if moved.tenant != state.tenant or moved.schedule_id != state.schedule_id:
        return Decision(status="invalid", field="state",
                        reason=f"the adopted quota is of tenant {moved.tenant}")
    d = _draft(state)
    d.emit(m.KeyMovedIn(kind="quota", state=p.state, state_version=p.state_version,
                        from_partition=p.from_partition, version=p.version))
    return Decision(events=d.events)


def _expire(state: QuotaState, now: datetime) -> QuotaDecision:
    """Release every reservation that ended unconfirmed; tell each held create."""
    d = _draft(state)
    for sid, (cid, until) in sorted(state.slots.items()):
        if until is not None and until <= now:
            d.emit(m.QuotaSlotReleased(schedule_id=sid, create_command_id=cid,
                                       reason="expired", released_at=now))
            _answer(d, sid, cid, False, None, "the reserved quota slot expired before the "
                     "schedule was created; retry", kind="expired")
    return Decision(events=d.events, sends=d.sends)


QuotaDecision = Decision[m.QuotaEvent]
QuotaDraft = Draft[QuotaState, m.QuotaEvent]


def _draft(state: QuotaState) -> QuotaDraft:
    """A copy of the state that folds each event as it is emitted."""
    copy = QuotaState(state.tenant, state.schedule_id)
    copy.slots = dict(state.slots)
    copy.key = state.key
    copy.holders = dict(state.holders)
    copy.waiting = list(state.waiting)
    c = state.calendar
    copy.calendar = None if c is None else CalendarHome(c.name, c.revision, c.spec,
                                                        set(c.subscribers))
    return Draft(copy, evolve_quota)


def _answer(d: QuotaDraft, schedule_id: str, cid: str, granted: bool,
            until: datetime | None, reason: str = "", kind: str = "answer") -> None:
    """Send the schedule the answer to its reservation."""
    d.send(Send(schedule_id, saga_command_id(kind, cid), m.AnswerQuotaSlot(
        create_command_id=cid, granted=granted, expires_at=until, reason=reason)))


def evolve_quota(state: QuotaState, event: m.QuotaEvent) -> QuotaState:
    """Fold one event of the quota aggregate into its state (in place; returns it)."""
    match event:
        case m.QuotaSlotReserved():
            state.slots[event.schedule_id] = (event.create_command_id, event.expires_at)
        case m.QuotaSlotConfirmed():
            state.slots[event.schedule_id] = (event.create_command_id, None)
        case m.QuotaSlotReleased():
            state.slots.pop(event.schedule_id, None)
        case m.PermitGranted() | m.PermitQueued() | m.PermitReleased():
            evolve_permit(state, event)
        case (m.CalendarRevised() | m.CalendarDeleted() | m.CalendarSubscribed()
              | m.CalendarUnsubscribed()):
            evolve_calendar(state, event)
        case m.KeyMovedOut():
            state.slots, state.holders, state.waiting = {}, {}, []
            state.calendar = None
        case m.KeyMovedIn():
            moved = decode_moved_quota(event.state, event.state_version)
            state.slots, state.key = moved.slots, moved.key
            state.holders, state.waiting = moved.holders, moved.waiting
            state.calendar = moved.calendar
        case m.QuotaSlotRefused():
            pass  # recorded for the audit, no slot changes
        case _:
            assert_never(event)
    return state


def quota_wakeup(state: QuotaState) -> datetime | None:
    """The earliest end of a reservation (when a Tick would release it)."""
    ends = [until for _, until in state.slots.values() if until is not None]
    return min(ends) if ends else None


_QUOTA_COMMANDS: tuple[type, ...] = get_args(m.QuotaCommand)
_QUOTA_EVENTS: tuple[type, ...] = get_args(m.QuotaEvent)


class QuotaAggregate:
    """A tenant's quota, keyed ``tenant/@quota``: ``decide_quota`` (with the tenant's
    ``max_schedules``), ``evolve_quota``, ``quota_wakeup``, ``move_out_quota`` and the
    moved-state codec."""

    kind = "quota"

    def initial(self, tenant: str, schedule_id: str) -> QuotaState:
        return QuotaState(tenant, schedule_id)

    def decide(self, state: QuotaState, command: m.CommandEnvelope, now: datetime,
               tenant: TenantContext) -> QuotaDecision:
        return decide_quota(state, command, now, tenant.max_schedules)

    def evolve(self, state: QuotaState, event: m.QuotaEvent) -> QuotaState:
        return evolve_quota(state, event)

    def wakeup(self, state: QuotaState) -> datetime | None:
        return quota_wakeup(state)

    def move_out(self, state: QuotaState, to_partition: int, version: int,
                 from_partition: int) -> QuotaDecision:
        return move_out_quota(state, to_partition, version, from_partition)

    def accepts(self, payload: m.Command) -> TypeGuard[m.QuotaCommand]:
        return isinstance(payload, _QUOTA_COMMANDS)

    def owns(self, event: m.Event) -> TypeGuard[m.QuotaEvent]:
        return isinstance(event, _QUOTA_EVENTS)

    def encode(self, state: QuotaState) -> tuple[str, str | None]:
        return moved_quota(state), None

    def decode(self, state: str, shape: str | None, version: int) -> QuotaState:
        return decode_moved_quota(state, version)


QUOTA: Aggregate[QuotaState, m.QuotaCommand, m.QuotaEvent] = QuotaAggregate()
