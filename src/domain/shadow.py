"""Shadow check of recurrence rules: resolve a window of instants, compare two resolutions.

Pure (no I/O, no clock): ``chronolog rules snapshot`` resolves every live schedule's
instants in a window with the engine and tz database installed (``resolve``) and stores
them with the rule; ``chronolog rules diff`` resolves the same rules over the same window
with the engine and tz database installed *then* and compares (``compare``). The zone's
UTC-offset transitions inside the window (``transitions``) are stored too, so that a change
can name the daylight-saving rule it comes from.

A rule is the trigger part of a schedule (``cron`` / ``every`` / ``at`` / ``delay``,
``timezone``, ``anchor``, ``start``, ``end``, ``dst``). Fixed-delay rules have no
precomputable instants (each depends on when the previous run finished): resolved as none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from chronolog.domain.recurrence import RecurrenceError, compile_trigger, resolve_zone

__all__ = ["Change", "Transition", "compare", "resolve", "transitions", "utc_text"]

MAX_INSTANTS = 50_000  # per schedule and window (an `every 1s` rule over a month is 2.6 M)
_STEP = timedelta(hours=1)


def utc_text(t: datetime) -> str:
    """``2026-03-08T07:00:00Z`` (microseconds kept when there are any)."""
    t = t.astimezone(UTC)
    spec = "microseconds" if t.microsecond else "seconds"
    return t.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def _offset_text(delta: timedelta | None) -> str:
    total = int((delta or timedelta(0)).total_seconds())
    sign = "-" if total < 0 else "+"
    total = abs(total)
    text = f"{sign}{total // 3600:02d}:{total % 3600 // 60:02d}"
    return text + (f":{total % 60:02d}" if total % 60 else "")


def _local(t: datetime, zone_name: str) -> str:
    return t.astimezone(resolve_zone(zone_name)).isoformat(timespec="seconds")


def resolve(rule: dict[str, Any], start: datetime, end: datetime) -> dict[str, Any]:
    """``{"instants": [{"utc", "local"}], "truncated": bool}``: the rule's instants in
    ``(start, end]`` (at most ``MAX_INSTANTS``), or ``{"error": message}`` when the rule no
    longer compiles (an unknown zone, a dialect change)."""
    if rule.get("delay") is not None:
        return {"instants": [], "truncated": False}
    dst = rule.get("dst") or {}
    try:
        trigger = compile_trigger(
            cron=rule.get("cron"), every=rule.get("every"), at=rule.get("at"),
            timezone=rule.get("timezone", "UTC"), anchor=_instant(rule.get("anchor")),
            start=_instant(rule.get("start")), end=_instant(rule.get("end")),
            dst_ambiguous=dst.get("ambiguous", "first"),
            dst_nonexistent=dst.get("nonexistent", "shift_forward"))
        zone = rule.get("timezone", "UTC")
        out: list[dict[str, str]] = []
        current: datetime | None = start
        while current is not None and len(out) < MAX_INSTANTS:
            try:
                current = trigger.next_after(current)
            except (OverflowError, ValueError) as exc:
                if isinstance(exc, RecurrenceError):
                    raise
                break
            if current is None or current > end:
                return {"instants": out, "truncated": False}
            out.append({"utc": utc_text(current), "local": _local(current, zone)})
        return {"instants": out, "truncated": current is not None and len(out) >= MAX_INSTANTS}
    except RecurrenceError as exc:
        return {"error": str(exc)}


def _instant(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


@dataclass(frozen=True)
class Transition:
    """A change of the zone's UTC offset at ``at``: ``before`` -> ``after`` (``dst``: whether
    daylight-saving time is in force after it)."""

    at: str
    before: str
    after: str
    dst: bool

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "before": self.before, "after": self.after, "dst": self.dst}

    def text(self, zone: str) -> str:
        kind = "DST starts" if self.dst else "DST ends" if self.before != self.after else ""
        return f"{zone} {self.at} {self.before} -> {self.after}" + (f" ({kind})" if kind else "")


def transitions(zone_name: str, start: datetime, end: datetime) -> list[Transition]:
    """The zone's offset changes in ``(start, end]``, each to the second (the zone is sampled
    hourly: two changes less than an hour apart would be seen as one)."""
    try:
        zone = resolve_zone(zone_name)
    except RecurrenceError:
        return []
    out: list[Transition] = []
    t = start.astimezone(UTC)
    before = t.astimezone(zone).utcoffset()
    while t < end:
        nxt = min(t + _STEP, end)
        after = nxt.astimezone(zone).utcoffset()
        if after != before:
            lo, hi = t, nxt  # offset(lo) == before, offset(hi) == after
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == before:
                    lo = mid
                else:
                    hi = mid
            at = hi.replace(microsecond=0)
            out.append(Transition(utc_text(at), _offset_text(before), _offset_text(after),
                                  bool(at.astimezone(zone).dst())))
            before = after
        t = nxt
    return out


@dataclass
class Change:
    """One instant that moved, appeared or disappeared."""

    change: str  # "moved" | "added" | "removed"
    before: dict[str, str] | None  # {"utc", "local"} as recorded
    after: dict[str, str] | None  # {"utc", "local"} as resolved now
    transition: dict[str, Any] | None = None  # the differing transition involved

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "before": self.before, "after": self.after,
                "transition": self.transition}


@dataclass
class Comparison:
    """How a schedule's instants differ between a recorded and a new resolution."""

    changes: list[Change] = field(default_factory=list)
    transitions_removed: list[Transition] = field(default_factory=list)
    transitions_added: list[Transition] = field(default_factory=list)
    error: str | None = None  # the rule no longer resolves (all its instants are removed)

    @property
    def changed(self) -> bool:
        return bool(self.changes) or self.error is not None


def _wall(local: str) -> str:
    """The wall-clock part of a local ISO time (``2026-03-08T09:00:00``), offset dropped."""
    return local[:19]


def compare(recorded: list[dict[str, str]], now: dict[str, Any],
            recorded_transitions: list[Transition], now_transitions: list[Transition]
            ) -> Comparison:
    """Compare recorded instants (and the zone's recorded transitions) with a new
    resolution (``resolve``'s result) and the zone's transitions now. A removed and an
    added instant with the same local wall time are one ``moved`` instant. Each change names
    the latest transition at or before it that differs between the two (none: the engine,
    not the tz database, moved it)."""
    cmp = Comparison()
    old_t = {(t.at, t.before, t.after) for t in recorded_transitions}
    new_t = {(t.at, t.before, t.after) for t in now_transitions}
    cmp.transitions_removed = [t for t in recorded_transitions if (t.at, t.before, t.after)
                               not in new_t]
    cmp.transitions_added = [t for t in now_transitions if (t.at, t.before, t.after)
                             not in old_t]
    differing = sorted(cmp.transitions_removed + cmp.transitions_added, key=lambda t: t.at)
    if "error" in now:
        cmp.error = str(now["error"])
        cmp.changes = [Change("removed", i, None, _involved(differing, i["utc"]))
                       for i in recorded]
        return cmp
    new = list(now["instants"])
    old_utc = {i["utc"] for i in recorded}
    new_utc = {i["utc"] for i in new}
    removed = [i for i in recorded if i["utc"] not in new_utc]
    added = [i for i in new if i["utc"] not in old_utc]
    by_wall: dict[str, list[dict[str, str]]] = {}
    for a in added:
        by_wall.setdefault(_wall(a["local"]), []).append(a)
    paired: set[int] = set()
    for r in removed:
        match = by_wall.get(_wall(r["local"]))
        if match:
            a = match.pop(0)
            paired.add(id(a))
            cmp.changes.append(Change("moved", r, a, _involved(differing, min(r["utc"],
                                                                              a["utc"]))))
        else:
            cmp.changes.append(Change("removed", r, None, _involved(differing, r["utc"])))
    cmp.changes += [Change("added", None, a, _involved(differing, a["utc"]))
                    for a in added if id(a) not in paired]
    cmp.changes.sort(key=lambda c: (c.before or c.after or {}).get("utc", ""))
    return cmp


def _involved(differing: list[Transition], utc: str) -> dict[str, Any] | None:
    """The latest differing transition at or before ``utc`` (else the first after it)."""
    if not differing:
        return None
    before = [t for t in differing if t.at <= utc]
    return (before[-1] if before else differing[0]).to_dict()
