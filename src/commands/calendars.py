"""Exclusion calendars: a tenant's named calendars, and the schedules that skip what they
exclude (docs/design.md §23). Pure: no I/O, no clock; every revision, copy and exclusion is
written into the events.

A calendar is an aggregate of its own, ``calendar_id(name)`` (kept in the quota aggregate's
kind of state, ``QuotaState.calendar``, so snapshots, restore, takeovers and repartitioning
carry it unchanged), decided on one partition:

* ``PutCalendar`` creates it (no expected revision: refused when it exists with another
  spec, answered again when it holds this very one) or revises it (the expected revision is
  its current one, else a conflict) — ``CalendarRevised``;
* ``DeleteCalendar`` deletes it (``CalendarDeleted``), refused while a schedule names it;
* a schedule that names it subscribes (``CalendarSubscribed``) and stops
  (``CalendarUnsubscribed``) when it no longer does.

Every revision is sent to every subscriber (``CopyCalendar``), and the current one to a new
subscriber, in the transaction of the decision: the schedule holds a copy
(``CalendarCopied``, ``ScheduleState.calendars``) and decides its instants against it. A
revision counts on across a deletion, so a copy is newer than every copy before it and an
older copy arriving late changes nothing.

On the schedule (``decider``): an instant of the rule that one of its calendars excludes is
recorded SKIPPED, reason ``excluded``, with the calendar's name, the revision it held and
the entry (``exclusion``) — never silently dropped. A schedule that names a calendar whose
copy has not come yet materializes nothing until it has (``awaiting``): a change takes
effect for every instant not yet materialized when its copy arrives. A calendar that does
not exist excludes every instant (its skip says so): a schedule does not run on a rule it
cannot read. Manual triggers are not excluded (a person asked for that run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from chronolog.commands.aggregate import PROCESSOR, Decision, Draft, Send
from chronolog.commands.state import CalendarCopy, CalendarHome, QuotaState, ScheduleState
from chronolog.domain import messages as m
from chronolog.domain.calendars import excluded_by
from chronolog.domain.ids import calendar_id, saga_command_id

__all__ = [
    "MISSING",
    "Exclusion",
    "after_decision",
    "applies",
    "awaiting",
    "copies_for",
    "copy_newer",
    "decide_calendar",
    "evolve_calendar",
    "exclusion",
]

MISSING = "the calendar does not exist"  # the entry a missing calendar excludes by
_NAMED = frozenset({"ACTIVE", "PAUSED"})  # the states in which a schedule subscribes


class Exclusion(NamedTuple):
    """Why an instant is skipped: the calendar, the revision held, the entry."""

    calendar: str
    revision: int
    entry: str


# ---------------------------------------------------------------------------------------
# the schedule's side


def exclusion(copies: tuple[CalendarCopy, ...] | None, instant: object) -> Exclusion | None:
    """The first of the schedule's calendars that excludes ``instant`` (a tz-aware datetime),
    in the order the schedule names them; None when none does."""
    if not copies:
        return None
    for c in copies:
        if c.spec is None:
            return Exclusion(c.name, c.revision, MISSING)
        entry = excluded_by(c.spec, instant)  # type: ignore[arg-type]
        if entry is not None:
            return Exclusion(c.name, c.revision, entry)
    return None


def awaiting(state: ScheduleState) -> bool:
    """Whether a calendar the schedule names has not sent its copy yet."""
    return state.calendars is not None and not all(c.received for c in state.calendars)


def copies_for(held: tuple[CalendarCopy, ...] | None,
               names: tuple[str, ...]) -> tuple[CalendarCopy, ...] | None:
    """The copies of a policy naming ``names``: those held kept, the others awaited."""
    if not names:
        return None
    have = {c.name: c for c in held or ()}
    return tuple(have.get(n) or CalendarCopy(n, 0, None, False) for n in names)


def copy_newer(state: ScheduleState, p: m.CopyCalendar) -> bool:
    """Whether a calendar's copy is one the schedule names and newer than the one it holds."""
    for c in state.calendars or ():
        if c.name == p.name:
            return not c.received or p.revision > c.revision
    return False


def copied(copies: tuple[CalendarCopy, ...] | None,
           event: m.CalendarCopied) -> tuple[CalendarCopy, ...] | None:
    """The copies with ``event``'s in place of the one named alike."""
    if copies is None:
        return None
    return tuple(CalendarCopy(c.name, event.revision, event.spec, True) if c.name == event.name
                 else c for c in copies)


def _named(state: ScheduleState) -> tuple[str, ...]:
    """The calendars a schedule subscribes to: its policy's, while it is live."""
    pol = state.policy
    if pol is None or state.status not in _NAMED:
        return ()
    return pol.exclude


def applies(state: ScheduleState, events: list[m.ScheduleEvent]) -> bool:
    """Whether a decision may change what the schedule subscribes to (cheap: most do not)."""
    pol = state.policy
    if pol is not None and pol.exclude:
        return True
    return any(isinstance(ev, (m.ScheduleCreated, m.ScheduleRevised)) and ev.spec.exclude
               for ev in events)


def after_decision(before: ScheduleState, after: ScheduleState, command_id: str,
                   send: Callable[[Send], None]) -> None:
    """Subscribe to each calendar the decision made the schedule name, unsubscribe from each
    it no longer names (``after``: the state with the decision's events folded in)."""
    was, now = _named(before), _named(after)
    if was == now:
        return
    for name in now:
        if name not in was:
            send(Send(calendar_id(name), saga_command_id("calendar-subscribe",
                                                         f"{command_id}\n{name}"),
                      m.SubscribeCalendar(name=name, schedule_id=after.schedule_id)))
    for name in was:
        if name not in now:
            send(Send(calendar_id(name), saga_command_id("calendar-unsubscribe",
                                                         f"{command_id}\n{name}"),
                      m.UnsubscribeCalendar(name=name, schedule_id=after.schedule_id)))


# ---------------------------------------------------------------------------------------
# the calendar's aggregate

CalendarDecision = Decision[m.QuotaEvent]
CalendarDraft = Draft[QuotaState, m.QuotaEvent]
CalendarCommand = m.PutCalendar | m.DeleteCalendar | m.SubscribeCalendar | m.UnsubscribeCalendar
MAX_NAMED_IN_REFUSAL = 5


def decide_calendar(d: CalendarDraft, command: m.CommandEnvelope,
                    p: CalendarCommand) -> CalendarDecision:
    """Decide one command of the calendar ``d.state`` is into the draft ``d``."""
    if d.state.schedule_id != calendar_id(p.name):
        return Decision(status="invalid", field="name",
                        reason=f"calendar '{p.name}' is not decided by "
                        f"'{d.state.schedule_id}'")
    home = d.state.calendar or CalendarHome(p.name)
    match p:
        case m.PutCalendar():
            return _put(d, command, home, p)
        case m.DeleteCalendar():
            return _delete(d, home, p)
    if command.principal != PROCESSOR:
        return Decision(status="forbidden",
                        reason="only the processor subscribes a schedule to a calendar")
    if isinstance(p, m.SubscribeCalendar):
        if p.schedule_id not in home.subscribers:
            d.emit(m.CalendarSubscribed(name=p.name, schedule_id=p.schedule_id))
        d.send(_copy(home, p.schedule_id, command.command_id))
    elif p.schedule_id in home.subscribers:
        d.emit(m.CalendarUnsubscribed(name=p.name, schedule_id=p.schedule_id))
    return d.decision()


def _put(d: CalendarDraft, command: m.CommandEnvelope, home: CalendarHome,
         p: m.PutCalendar) -> CalendarDecision:
    exists = home.spec is not None
    if p.expected_revision is None:
        if exists and home.spec == p.spec:  # put again: the same answer
            return d.decision(body={"name": p.name, "revision": home.revision,
                                    "created": False})
        if exists:
            return Decision(status="conflict", field="If-Match",
                            reason=f"calendar '{p.name}' exists (revision {home.revision}): "
                            f"revise it with its revision", body={"revision": home.revision})
    elif not exists:
        return Decision(status="not_found", field="name",
                        reason=f"calendar '{p.name}' does not exist")
    elif p.expected_revision != home.revision:
        return Decision(status="conflict", field="If-Match",
                        reason=f"expected revision {p.expected_revision}, current is "
                        f"{home.revision}", body={"revision": home.revision})
    d.emit(m.CalendarRevised(name=p.name, revision=home.revision + 1, spec=p.spec))
    after = d.state.calendar
    assert after is not None
    for sid in sorted(after.subscribers):
        d.send(_copy(after, sid, command.command_id))
    return d.decision(body={"name": p.name, "revision": after.revision,
                            "created": not exists})


def _delete(d: CalendarDraft, home: CalendarHome, p: m.DeleteCalendar) -> CalendarDecision:
    if home.spec is None:
        return Decision(status="not_found", field="name",
                        reason=f"calendar '{p.name}' does not exist")
    if p.expected_revision is not None and p.expected_revision != home.revision:
        return Decision(status="conflict", field="If-Match",
                        reason=f"expected revision {p.expected_revision}, current is "
                        f"{home.revision}", body={"revision": home.revision})
    if home.subscribers:
        named = sorted(home.subscribers)
        shown = ", ".join(named[:MAX_NAMED_IN_REFUSAL]) + (
            ", ..." if len(named) > MAX_NAMED_IN_REFUSAL else "")
        return Decision(status="conflict", field="name",
                        reason=f"calendar '{p.name}' is named by {len(named)} schedule"
                        f"{'s' if len(named) != 1 else ''} ({shown}): remove it from their "
                        f"exclude first", body={"revision": home.revision})
    d.emit(m.CalendarDeleted(name=p.name, revision=home.revision + 1))
    return d.decision(body={"name": p.name, "revision": home.revision + 1})


def _copy(home: CalendarHome, schedule_id: str, cause: str) -> Send:
    """The calendar's current revision, to one schedule that names it."""
    return Send(schedule_id, saga_command_id("calendar-copy", f"{cause}\n{schedule_id}"),
                m.CopyCalendar(name=home.name, revision=home.revision, spec=home.spec))


def evolve_calendar(state: QuotaState, event: m.CalendarRevised | m.CalendarDeleted
                    | m.CalendarSubscribed | m.CalendarUnsubscribed) -> None:
    """Fold one event of a calendar into its state (in place)."""
    home = state.calendar
    if home is None:
        home = state.calendar = CalendarHome(event.name)
    match event:
        case m.CalendarRevised():
            home.revision, home.spec = event.revision, event.spec
        case m.CalendarDeleted():
            home.revision, home.spec = event.revision, None
        case m.CalendarSubscribed():
            home.subscribers.add(event.schedule_id)
        case m.CalendarUnsubscribed():
            home.subscribers.discard(event.schedule_id)
