"""The misfire policy: which of a schedule's due instants run and which are skipped, and why.

Pure: no I/O, no clock. The decider applies a ``Backlog`` when it materializes (a Tick, a
resume, a revision, a pause); the API shows the same ``Backlog`` for a paused schedule, so
what a resume is said to do and what it does cannot disagree.

The rules (docs/tour.md, "Downtime, stated"):

* **one instant due** (the usual case): on time within ``grace``, it runs. Later than
  ``grace`` — ``skip``: skipped (``misfire``, or ``paused``); ``latest`` and ``all``: it runs
  unless older than ``max_age`` (``misfire_max_age``).
* **a backlog** (more than one instant due at one decision: after a restart, a resume, a
  processor takeover), whatever the grace — ``latest``: only the newest runs (unless older
  than ``max_age``), every older one is skipped as ``coalesced``; ``skip``: only the newest,
  and only if it is within ``grace`` of now, the others are skipped (``misfire`` or
  ``paused``); ``all``: every instant younger than ``max_age`` runs, in order, at most
  ``max_catchup`` of them (the newest win; the rest ``misfire_max_age`` /
  ``misfire_max_catchup``), and they run one after another (see ``Backlog.catch_up``).
* **an occurrence from before a gap that never started** (READY or PENDING, never claimed):
  under ``latest`` and an overlap policy other than ``allow`` it is coalesced into the
  newest instant that runs, so it cannot hold the overlap guard against it — after a
  backlog, and after one instant due at the first decision of a processor that took the
  partition over (``Tick.resumed``); ``skip`` and ``all`` keep it in place
  (``Backlog.coalesces_unstarted``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from chronolog.domain.recurrence import jitter_offset

__all__ = [
    "MAX_INSTANTS_PER_DECISION",
    "Backlog",
    "Planned",
    "due_time",
    "misfire_choice",
    "plan_due",
]

MAX_INSTANTS_PER_DECISION = 1000  # a decision materializes or skips at most this many instants


class MisfirePolicy(Protocol):
    """What the planner reads of a schedule's policy (``commands.state.Policy``), read-only."""

    @property
    def misfire(self) -> str: ...
    @property
    def grace(self) -> float: ...
    @property
    def max_catchup(self) -> int: ...
    @property
    def misfire_max_age(self) -> float: ...
    @property
    def jitter(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def overlap(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Planned:
    """One due instant: it runs (``reason`` None) or is skipped for ``reason``."""

    instant: datetime
    reason: str | None

    @property
    def runs(self) -> bool:
        return self.reason is None


@dataclass(frozen=True, slots=True)
class Backlog:
    """The due instants of one decision, in order, and what the misfire policy does with each.

    ``following`` is the schedule's instant after them; ``later`` counts further instants
    already due beyond the per-decision budget (left for the next decision). ``catch_up``:
    the policy is ``all`` and more than one instant is due — the occurrences run one after
    another (queued behind a running one) unless the overlap policy is ``allow``.
    """

    items: tuple[Planned, ...]
    following: datetime | None
    later: int

    @property
    def backlog(self) -> bool:
        return len(self.items) + self.later > 1

    def catch_up(self, pol: MisfirePolicy) -> bool:
        return pol.misfire == "all" and self.backlog

    def coalesces_unstarted(self, pol: MisfirePolicy, resumed: bool = False) -> bool:
        """``latest`` after a gap whose newest instant runs (now or, past the budget, in the
        next decision), under an overlap policy that guards: an occurrence from before the
        gap that never started is coalesced into the newest as well, rather than hold the
        guard against it (under ``allow`` it blocks nothing and is left alone).

        A gap is a backlog (more than one instant due), or one instant due at the first
        decision after the processor took the partition over (``resumed``: ``Tick.resumed``).
        One instant due at any other decision is no gap: the occurrence before it may only
        wait for a busy worker pool, and keeps its place."""
        if pol.misfire != "latest" or pol.overlap == "allow" or not self.items:
            return False
        if not (self.backlog or resumed):
            return False
        return self.later > 0 or self.items[-1].runs

    def within_count(self, count: int, max_count: int | None) -> tuple[Planned, ...]:
        """The items up to the run that uses up ``max_count`` (``count`` runs so far): the
        schedule ends there, later instants are past its end."""
        if max_count is None:
            return self.items
        left = max_count - count
        for i, item in enumerate(self.items):
            if item.runs:
                left -= 1
                if left <= 0:
                    return self.items[: i + 1]
        return self.items


def due_time(schedule_id: str, instant: datetime, jitter: float) -> datetime:
    """The instant plus the schedule's deterministic jitter (the moment it becomes due)."""
    if jitter <= 0:
        return instant
    return instant + timedelta(seconds=jitter_offset(schedule_id, instant, jitter))


def _next_instant(pol: MisfirePolicy, trigger: Any, after: datetime) -> datetime | None:
    if pol.kind in ("delay", "at"):
        return None  # a delay schedule plans its next instant when its run finishes
    nxt: datetime | None = trigger.next_after(after)
    return nxt


def plan_due(
    schedule_id: str,
    pol: MisfirePolicy,
    trigger: Any,
    next_run_at: datetime | None,
    now: datetime,
    late_reason: str = "misfire",
    budget: int = MAX_INSTANTS_PER_DECISION,
) -> Backlog:
    """What the misfire policy does at ``now`` with the instants due from ``next_run_at`` on.

    ``late_reason`` names a skip caused by lateness (``misfire``; ``paused`` on a resume).
    """
    due: list[datetime] = []
    t = next_run_at
    while t is not None and len(due) < budget and due_time(schedule_id, t, pol.jitter) <= now:
        due.append(t)
        t = _next_instant(pol, trigger, t)
    if not due:
        return Backlog((), t, 0)
    following = t
    later = 0
    while t is not None and later < pol.max_catchup and due_time(schedule_id, t, pol.jitter) <= now:
        later += 1
        t = _next_instant(pol, trigger, t)
    # lateness counts from when an instant became due (with jitter): counting from the bare
    # instant would make a jitter window wider than the grace turn on-time runs into misfires
    lateness = [now - due_time(schedule_id, x, pol.jitter) for x in due]
    reasons = misfire_choice(lateness, later, pol, late_reason)
    return Backlog(tuple(Planned(x, r) for x, r in zip(due, reasons, strict=True)), following,
                   later)


def misfire_choice(
    lateness: list[timedelta], later: int, pol: MisfirePolicy, late_reason: str
) -> list[str | None]:
    """The misfire policy for due instants (oldest first) that have been due for ``lateness``,
    with ``later`` more due after them: None (runs) or the reason each is skipped."""
    grace = timedelta(seconds=pol.grace)
    max_age = timedelta(seconds=pol.misfire_max_age)
    n = len(lateness)
    if n + later == 1:
        return [_single_late_instant(lateness[0], grace, max_age, pol, late_reason)]
    if pol.misfire == "latest":
        out: list[str | None] = ["coalesced"] * n
        if later == 0:
            out[-1] = None if lateness[-1] <= max_age else "misfire_max_age"
        return out
    if pol.misfire == "skip":
        out = [late_reason] * n
        if later == 0 and lateness[-1] <= grace:
            out[-1] = None
        return out
    room = pol.max_catchup - later
    young = [i for i in range(n) if lateness[i] <= max_age]
    kept = set(young[-room:]) if room > 0 else set()
    return [None if i in kept
            else "misfire_max_age" if lateness[i] > max_age
            else "misfire_max_catchup"
            for i in range(n)]


def _single_late_instant(
    lateness: timedelta, grace: timedelta, max_age: timedelta, pol: MisfirePolicy,
    late_reason: str,
) -> str | None:
    """One instant due: on time within the grace; later, the policy decides."""
    if lateness <= grace:
        return None
    if pol.misfire == "skip":
        return late_reason
    return None if lateness <= max_age else "misfire_max_age"
