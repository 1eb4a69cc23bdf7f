"""Recurrence rules: when does a schedule fire next? (pure: no I/O, no clock, no randomness)

A trigger answers one question, ``next_after(after)``: the first instant strictly after
``after`` (any tz-aware datetime) at which the schedule fires, as a tz-aware UTC datetime,
or ``None`` once the rule is exhausted (past its end bound, a one-shot already passed).

Kinds (exactly one per trigger, see :func:`compile_trigger`):

* ``cron``  — 5-field cron (or ``@hourly @daily @midnight @weekly @monthly @yearly
  @annually``) evaluated on the local wall clock of an IANA zone. croniter validates the
  expression; this module parses the field sets itself and owns the daylight-saving rules
  of docs/design.md §4 (croniter's own DST handling fires a fixed-time job twice on fall-back day):

  - a *wildcard* job (minute or hour field starts with ``*``) fires at every real instant
    whose local wall time matches: both passes of a repeated hour, nothing in a skipped one;
  - a *fixed-time* job fires each matching wall time once: an ambiguous one per
    ``dst_ambiguous`` (``first`` = fold 0, ``second`` = fold 1, ``both``), a nonexistent one
    per ``dst_nonexistent`` (``shift_forward`` = the UTC instant the gap ends, ``skip``).
    Several wall times shifted onto the same instant fire once.
  - day-of-month / day-of-week follow Vixie cron: when both fields are restricted (neither
    starts with ``*`` or ``?``) a day matches if EITHER matches, otherwise both must match.
    So ``0 0 1 * 1`` is "the 1st and every Monday", while ``0 0 */2 * 1`` is "Mondays that
    fall on an odd day" (croniter's ``day_or`` would OR the latter too). Day-of-week 7 is
    Sunday. The specials ``L``, ``L-n``, ``nW``, ``LW`` (day-of-month) and ``nL``, ``n#k``
    (day-of-week) restrict their field like any list item (see :func:`_rule_day`). A
    reversed range wraps (``22-2`` hours = 22, 23, 0, 1, 2; ``FRI-MON`` = Fri, Sat, Sun,
    Mon) and its step runs on across the wrap (``23-1/2`` hours = 23, 1, where croniter
    gives 23 alone); day-of-week ``7-0`` is Sunday alone, ``0-7`` every day. A rule no
    calendar day can match is refused (:func:`_can_fire`). ``H`` is not supported. Numbers
    are ASCII digits only.

* ``every`` — instants ``anchor + k * interval`` (k any integer) in real elapsed time; the
  zone is for display only. ``anchor`` is required (callers pass the schedule's creation
  instant by default).
* ``at``    — one shot: ``at`` if it is after ``after``, else ``None``.
* ``delay`` — fixed delay after the previous run finished: ``next_after(finished)`` returns
  ``finished + delay``. The first run is :meth:`DelayTrigger.first_instant` ``(anchor)``,
  i.e. the anchor itself (or ``start`` if later).

Bounds: no returned instant is before ``start``; none is after ``end`` (``None`` instead).
Naive datetimes and naive ISO strings given to :func:`compile_trigger` are local wall times
in ``timezone``; ``next_after`` requires a tz-aware argument. Cron instants have
microsecond 0. Compiled triggers are immutable and cached.
"""

from __future__ import annotations

import bisect
import calendar
import functools
import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from chronolog.domain.durations import InvalidDuration, parse_duration
from chronolog.domain.limits import EARLIEST_INSTANT, LATEST_INSTANT, check_instant

__all__ = [
    "DST_AMBIGUOUS_CHOICES",
    "DST_NONEXISTENT_CHOICES",
    "AtTrigger",
    "CronSpec",
    "CronTrigger",
    "DelayTrigger",
    "DstMark",
    "EveryTrigger",
    "RecurrenceError",
    "Trigger",
    "compile_trigger",
    "dst_marks",
    "is_wildcard_cron",
    "jitter_offset",
    "marked_rows",
    "parse_cron",
    "parse_instant",
    "resolve_zone",
    "upcoming",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_ONE_DAY = timedelta(days=1)
_UNIX_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_SEARCH_YEARS = 100  # a rule that fires matches within 40 years (see _can_fire); beyond: none

# The recurrence engine's version: raised whenever a change of this module can move an
# instant of some rule (``chronolog rules snapshot`` / ``diff`` record and compare it).
ENGINE_VERSION = "recurrence/1"

DST_AMBIGUOUS_CHOICES = ("first", "second", "both")
DST_NONEXISTENT_CHOICES = ("shift_forward", "skip")


class RecurrenceError(ValueError):
    """An invalid recurrence input. ``str(e)`` is one line: ``invalid <field> '<value>': <why>``.

    ``field`` is one of cron, timezone, every, at, anchor, delay, start, end, dst.ambiguous,
    dst.nonexistent, trigger (not exactly one kind given) or after (naive ``next_after`` arg).
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = str(value)
        self.reason = reason
        shown = self.value.replace("\r", "\\r").replace("\n", "\\n")
        if len(shown) > 200:
            shown = shown[:197] + "..."
        super().__init__(f"invalid {field} '{shown}': {reason}")


@runtime_checkable
class Trigger(Protocol):
    """A compiled recurrence rule (``kind`` is read-only on the concrete frozen classes)."""

    @property
    def kind(self) -> str:
        """``"cron"``, ``"every"``, ``"at"`` or ``"delay"``."""
        ...

    def next_after(self, after: datetime) -> datetime | None:
        """The first firing instant strictly after ``after`` (UTC), or None when exhausted."""
        ...


# --------------------------------------------------------------------------- instants


def resolve_zone(name: str) -> ZoneInfo:
    """Return the IANA zone ``name`` or raise ``RecurrenceError(field="timezone")``."""
    if not isinstance(name, str) or not name.strip():
        raise RecurrenceError("timezone", name, "unknown IANA zone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise RecurrenceError("timezone", name, "unknown IANA zone") from None


def _aware_timestamp(value: datetime) -> float:
    """POSIX timestamp of a tz-aware datetime (naive is a programming error)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise RecurrenceError("after", value.isoformat(), "must be timezone-aware")
    return value.timestamp()


def _to_us(value: datetime) -> int:
    """Exact integer microseconds since the epoch of a tz-aware datetime."""
    return (value - _EPOCH) // _ONE_US


def _from_us(micros: int) -> datetime:
    """UTC datetime from integer microseconds since the epoch."""
    return _EPOCH + timedelta(microseconds=micros)


def _offset_at(zone: ZoneInfo, ts: int) -> timedelta:
    """UTC offset of ``zone`` at the instant ``ts`` (POSIX seconds)."""
    offset = datetime.fromtimestamp(ts, zone).utcoffset()
    assert offset is not None
    return offset


def _gap_end(zone: ZoneInfo, before_ts: int, after_ts: int) -> int:
    """The transition instant in ``(before_ts, after_ts]`` where ``zone``'s offset changes."""
    low, high = before_ts, after_ts
    offset_low = _offset_at(zone, low)
    while high - low > 1:
        mid = (low + high) // 2
        if _offset_at(zone, mid) == offset_low:
            low = mid
        else:
            high = mid
    return high


def _wall_instants(
    zone: ZoneInfo, wall: datetime, ambiguous: str, nonexistent: str
) -> tuple[int, ...]:
    """POSIX seconds at which the naive local ``wall`` time fires under the DST policy."""
    first = wall.replace(tzinfo=zone, fold=0).utcoffset()
    second = wall.replace(tzinfo=zone, fold=1).utcoffset()
    assert first is not None and second is not None
    base = ((wall.toordinal() - _UNIX_EPOCH_ORDINAL) * 86400 + wall.hour * 3600
            + wall.minute * 60 + wall.second)
    ts_first = base - int(first.total_seconds())
    ts_second = base - int(second.total_seconds())
    if first == second:
        return (ts_first,)
    if first > second:  # repeated wall time: fold 0 is the earlier instant
        return {"first": (ts_first,), "second": (ts_second,),
                "both": (ts_first, ts_second)}[ambiguous]
    if nonexistent == "skip":  # wall time inside a gap
        return ()
    return (_gap_end(zone, ts_second, ts_first),)


def _local_to_utc(
    zone: ZoneInfo, wall: datetime, field_name: str, ambiguous: str, nonexistent: str
) -> datetime:
    """Map a naive wall time to one UTC instant (``both`` means the first pass)."""
    choice = "first" if ambiguous == "both" else ambiguous
    instants = _wall_instants(zone, wall.replace(microsecond=0), choice, nonexistent)
    if not instants:
        raise RecurrenceError(
            field_name,
            wall.isoformat(),
            f"local time does not exist in {zone.key} (DST gap) and dst.nonexistent is skip",
        )
    return datetime.fromtimestamp(instants[0], UTC) + timedelta(microseconds=wall.microsecond)


def parse_instant(
    value: datetime | str,
    timezone: str = "UTC",
    *,
    field: str = "at",
    dst_ambiguous: str = "first",
    dst_nonexistent: str = "shift_forward",
) -> datetime:
    """Read an instant (ISO-8601 text, ``Z`` allowed, or a datetime) as tz-aware UTC.

    A naive value is a wall time in ``timezone``: an ambiguous one takes the pass chosen by
    ``dst_ambiguous`` (``both`` -> first), a nonexistent one moves to the end of the gap
    (or is an error with ``skip``). Errors are ``RecurrenceError(field=field)``.
    """
    if isinstance(value, str):
        if not value.isascii():
            raise RecurrenceError(
                field, value, "not ASCII: write an ISO-8601 date-time such as 2026-03-08T09:00:00Z"
            )
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            raise RecurrenceError(
                field, value, "not an ISO-8601 date-time such as 2026-03-08T09:00:00Z"
            ) from None
    elif isinstance(value, datetime):
        parsed = value
    else:
        raise RecurrenceError(
            field, value, f"expected a datetime or ISO-8601 text, not {type(value).__name__}"
        )
    if not _EARLIEST_NAIVE <= parsed.replace(tzinfo=None) < _LATEST_NAIVE:
        raise RecurrenceError(field, value, _INSTANT_RANGE)
    if parsed.tzinfo is not None and parsed.utcoffset() is not None:
        instant = parsed.astimezone(UTC)
    else:
        instant = _local_to_utc(resolve_zone(timezone), parsed, field, dst_ambiguous,
                                dst_nonexistent)
    try:
        return check_instant(instant)
    except ValueError:
        raise RecurrenceError(field, instant.isoformat(), _INSTANT_RANGE) from None


# a day of margin on each side of the range, so converting a wall time cannot overflow
_EARLIEST_NAIVE = (EARLIEST_INSTANT - timedelta(days=1)).replace(tzinfo=None)
_LATEST_NAIVE = (LATEST_INSTANT + timedelta(days=1)).replace(tzinfo=None)
_INSTANT_RANGE = (f"must be between {EARLIEST_INSTANT:%Y-%m-%d} and "
                  f"{LATEST_INSTANT.year - 1}-12-31")


# --------------------------------------------------------------------------- cron parsing

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DOW_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}


@dataclass(frozen=True, slots=True)
class _FieldDef:
    name: str
    low: int
    high: int
    names: dict[str, int] = field(default_factory=dict, hash=False, compare=False)
    star_high: int | None = None  # day-of-week: '*' means 0-6 although 7 is accepted
    allows_question: bool = False
    cycle: int = 0  # a reversed range wraps after low + cycle - 1 (0: after high)


_FIELDS = (
    _FieldDef("minute", 0, 59),
    _FieldDef("hour", 0, 23),
    _FieldDef("day-of-month", 1, 31, allows_question=True),
    _FieldDef("month", 1, 12, _MONTH_NAMES),
    _FieldDef("day-of-week", 0, 7, _DOW_NAMES, star_high=6, allows_question=True, cycle=7),
)
_DOM, _DOW = _FIELDS[2], _FIELDS[4]


class _FieldError(Exception):
    """A reason why one cron field is invalid (wrapped into RecurrenceError)."""


def _shown(token: str, limit: int = 24) -> str:
    """``token`` for an error message, shortened when it is long."""
    return token if len(token) <= limit else token[: limit - 3] + "..."


def _ascii_number(token: str) -> int | None:
    """The value of ``token`` if it is a decimal number written in ASCII digits, else None.

    ``str.isdigit`` alone also accepts superscripts and other scripts' digits, which ``int``
    refuses or reads; more than nine significant digits is out of every field's range anyway
    (and ``int`` refuses texts over 4300 digits).
    """
    if not (token.isascii() and token.isdigit()):
        return None
    significant = token.lstrip("0") or "0"
    return int(significant) if len(significant) <= 9 else 10**9


def _field_value(token: str, spec: _FieldDef) -> int:
    """One number or name of a field, range-checked."""
    number = _ascii_number(token)
    if number is None:
        if token.lower() in spec.names:
            return spec.names[token.lower()]
        kind = "a number (ASCII digits) or a name" if spec.names else "a number (ASCII digits)"
        hint = (" (H is not supported)" if "H" in token.upper()
                else " (L, W and # are whole list items: no range or step)"
                if spec in (_DOM, _DOW) and any(c in token.upper() for c in "LW#") else "")
        raise _FieldError(f"{spec.name} '{_shown(token)}' is not {kind}{hint}")
    if not spec.low <= number <= spec.high:
        raise _FieldError(f"{spec.name} {_shown(token)} out of range {spec.low}-{spec.high}")
    return number


def _field_step(text: str, spec: _FieldDef) -> int:
    """The ``/step`` of an item: a positive integer."""
    step = _ascii_number(text)
    if not step:
        raise _FieldError(
            f"{spec.name} step '{_shown(text)}' must be a positive integer (ASCII digits)"
        )
    if step >= 10**9:
        raise _FieldError(f"{spec.name} step '{_shown(text)}' is too large")
    return step


def _wrapped_range(low: int, high: int, step: int, spec: _FieldDef) -> list[int]:
    """A reversed range ``low-high`` wraps: low..top then bottom..high; the step runs on
    across the wrap (``22-3/2`` hours = 22, 0, 2). Day-of-week wraps over Sunday..Saturday."""
    if spec.cycle:
        low, high = low % spec.cycle, high % spec.cycle
        top = spec.low + spec.cycle - 1
    else:
        top = spec.high
    if low <= high:  # e.g. day-of-week 7-1 is 0-1
        return list(range(low, high + 1, step))
    cycle = [*range(low, top + 1), *range(spec.low, high + 1)]
    return cycle[::step]


def _field_item(item: str, spec: _FieldDef) -> set[int]:
    """Expand one comma-separated item: ``*``, ``a``, ``a-b``, each optionally ``/step``."""
    base, slash, step_text = item.partition("/")
    step = _field_step(step_text, spec) if slash else 1
    if not base:
        raise _FieldError(
            f"{spec.name} '{_shown(item)}' needs a value before the step, as in */5 or 10/5")
    if base == "*" or (base == "?" and spec.allows_question):
        low, high = spec.low, spec.star_high if spec.star_high is not None else spec.high
    elif "-" in base:
        first, _, last = base.partition("-")
        if not first or not last:
            raise _FieldError(
                f"{spec.name} '{_shown(item)}' needs a value on each side of '-', as in 1-5")
        low, high = _field_value(first, spec), _field_value(last, spec)
        if low > high:
            return set(_wrapped_range(low, high, step, spec))
    else:
        low = _field_value(base, spec)
        high = spec.high if slash else low
    return set(range(low, high + 1, step))


# Day rules: the specials L, L-n, nW, LW (day-of-month) and nL, n#k (day-of-week). Each
# names at most one day of a given month; see _rule_day.
_DayRule = tuple[str, int, int]  # (kind, a, b): ("L", n, 0), ("W", n, 0), ("LW", 0, 0),
#                                  ("nL", weekday, 0), ("#", weekday, k); weekday 0 = Sunday


def _dom_rule(item: str) -> _DayRule | None:
    """``L``, ``L-n``, ``LW`` or ``nW`` as a day rule; None for an ordinary item."""
    upper = item.upper()
    if upper in ("L", "LW"):
        return (upper, 0, 0) if upper == "LW" else ("L", 0, 0)
    if upper.startswith("L-"):
        offset = _ascii_number(item[2:])
        if offset is None or offset > 30:
            raise _FieldError(
                f"day-of-month '{_shown(item)}': L-n needs n from 0 to 30 (ASCII digits)"
            )
        return ("L", offset, 0)
    if upper.endswith("W") and "/" not in item and "-" not in item:
        if len(item) == 1:
            raise _FieldError("day-of-month 'W' needs a day number before it, as in 15W")
        return ("W", _field_value(item[:-1], _DOM), 0)
    return None


def _dow_rule(item: str) -> _DayRule | None:
    """``nL`` or ``n#k`` as a day rule; None for an ordinary item."""
    if "#" in item:
        weekday, _, nth = item.partition("#")
        if not weekday:
            raise _FieldError(f"day-of-week '{_shown(item)}' needs a weekday before the #, "
                              "as in 5#3 (the third Friday)")
        k = _ascii_number(nth)
        if k is None or not 1 <= k <= 5:
            raise _FieldError(
                f"day-of-week '{_shown(item)}': n#k needs k from 1 to 5 (ASCII digits)"
            )
        return ("#", _field_value(weekday, _DOW) % 7, k)
    if (item.upper().endswith("L") and item.lower() not in _DOW_NAMES
            and "/" not in item and "-" not in item):
        if len(item) == 1:
            raise _FieldError("day-of-week 'L' needs a weekday before it (5L = the last Friday)")
        return ("nL", _field_value(item[:-1], _DOW) % 7, 0)
    return None


def _parse_field(text: str, spec: _FieldDef) -> tuple[frozenset[int], tuple[_DayRule, ...]]:
    """Expand a whole field (comma-separated items) into its values and its day rules."""
    values: set[int] = set()
    rules: list[_DayRule] = []
    for item in text.split(","):
        if not item:
            raise _FieldError(f"{spec.name} '{_shown(text)}' has an empty list item")
        rule = _dom_rule(item) if spec is _DOM else _dow_rule(item) if spec is _DOW else None
        if rule is not None:
            rules.append(rule)
        else:
            values |= _field_item(item, spec)
    if spec.star_high is not None and 7 in values:  # day-of-week 7 is Sunday
        values = (values - {7}) | {0}
    return frozenset(values), tuple(sorted(set(rules)))


def _expand_macro(expr: str) -> str:
    """Normalize whitespace and replace ``@daily``-style macros by their 5 fields."""
    text = " ".join(expr.split())
    if text.startswith("@"):
        if text.lower() not in _MACROS:
            raise RecurrenceError("cron", expr, f"unknown macro {text} (use {', '.join(_MACROS)})")
        return _MACROS[text.lower()]
    return text


_DAYS_IN_MONTH_MAX = {
    1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31
}


# A month's shape: the weekday of its 1st (Monday = 0) and its number of days. Which of its
# days a rule matches depends on the month and its shape alone.
_Shape = tuple[int, int]


@functools.lru_cache(maxsize=16384)
def _month_shape(year: int, month: int) -> _Shape:
    """The shape of ``year-month``."""
    return calendar.monthrange(year, month)


def _rule_day(rule: _DayRule, first_weekday: int, last: int) -> int | None:
    """The day a day rule names in a month whose 1st is ``first_weekday`` (Monday = 0) and
    whose last day is ``last``, or None when that month has none.

    ``L-n``: n days before the last day. ``nW``: the weekday (Mon-Fri) nearest day n, never
    leaving the month (the 1st on a Saturday gives Monday the 3rd, a last day on a Sunday
    gives Friday); no day in a month without day n. ``LW``: the last weekday. ``nL``: the
    last weekday n. ``n#k``: the k-th weekday n (none in a month with fewer than k).
    """
    kind, a, b = rule
    if kind == "L":
        return last - a if last - a >= 1 else None
    if kind in ("W", "LW"):
        day = last if kind == "LW" else a
        if day > last:
            return None
        weekday = (first_weekday + day - 1) % 7
        if weekday == 5:  # Saturday: Friday before, or Monday after the 1st
            return day - 1 if day > 1 else day + 2
        if weekday == 6:  # Sunday: Monday after, or Friday before the last day
            return day + 1 if day < last else day - 2
        return day
    first_of = (a - (first_weekday + 1) % 7) % 7 + 1  # first day that is weekday a
    if kind == "nL":
        return first_of + 7 * ((last - first_of) // 7)
    day = first_of + 7 * (b - 1)
    return day if day <= last else None


@functools.lru_cache(maxsize=16384)
def _rule_days(rules: tuple[_DayRule, ...], first_weekday: int, last: int) -> frozenset[int]:
    """The days of a month of shape ``(first_weekday, last)`` that any of ``rules`` names."""
    found = (_rule_day(rule, first_weekday, last) for rule in rules)
    return frozenset(day for day in found if day is not None)


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A parsed 5-field cron expression (field sets, Vixie star flags, wildcard flag).

    ``dom_rules`` / ``dow_rules`` hold the specials (``L``, ``L-n``, ``nW``, ``LW``; ``nL``,
    ``n#k``): a day matches its field if it is in the set or named by one of the rules.
    """

    expr: str
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]  # 0 = Sunday
    dom_star: bool
    dow_star: bool
    wildcard: bool
    seconds_of_day: tuple[int, ...]  # sorted matching wall times of a day, in seconds
    dom_rules: tuple[_DayRule, ...] = ()
    dow_rules: tuple[_DayRule, ...] = ()

    fires: bool = True  # some calendar day matches (see _can_fire)

    def matches_day(self, day: date) -> bool:
        """Does ``day`` match month and the Vixie DOM/DOW rule?"""
        return self.matches(day.month, day.day, _month_shape(day.year, day.month))

    def matches(self, month: int, day: int, shape: _Shape) -> bool:
        """Does day ``day`` of ``month``, in a year where that month has ``shape``, match
        month and the Vixie DOM/DOW rule? (The one home of the day rule.)"""
        if month not in self.months:
            return False
        dom_ok = day in self.doms or (
            bool(self.dom_rules) and day in _rule_days(self.dom_rules, *shape))
        dow_ok = (shape[0] + day) % 7 in self.dows or (
            bool(self.dow_rules) and day in _rule_days(self.dow_rules, *shape))
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def matches_time(self, hour: int, minute: int) -> bool:
        """Does the wall clock time ``hour:minute`` match?"""
        return hour in self.hours and minute in self.minutes


def _month_shapes(month: int) -> Iterator[_Shape]:
    """Every shape ``month`` has in some Gregorian year: its 1st on each of the 7 weekdays,
    with its one length (February: 28 days, and 29)."""
    lengths = (28, 29) if month == 2 else (_DAYS_IN_MONTH_MAX[month],)
    for length in lengths:
        for first_weekday in range(7):
            yield first_weekday, length


def _can_fire(spec: CronSpec) -> bool:
    """Does some day of the Gregorian calendar match ``spec``? Exact, and no calendar search.

    Whether a day matches depends on its month, its day number and the month's *shape* (the
    weekday of its 1st and its length) alone: the weekday of every day, and the day each
    special names (``L``, ``L-n``, ``nW``, ``LW``, ``nL``, ``n#k``), follow from the shape,
    and the day-of-month x day-of-week combination (AND or OR) is applied by the same
    :meth:`CronSpec.matches` the search uses. So a rule fires on some day iff it matches
    some day of some shape that occurs. Every shape of :func:`_month_shapes` occurs: the
    Gregorian calendar repeats every 400 years (146,097 days, exactly 20,871 weeks), and
    within a cycle a month of a given length comes back with its 1st on the same weekday
    within 12 years at most; a leap February within 28 years, or 40 across a century year
    that is not a leap year (Feb 1 is a Sunday in leap 2088, and next in 2128). The longest
    wait between two matching days of a rule that fires is therefore 40 years, under the
    search's bound ``_SEARCH_YEARS``. Cost: at most 12 months x 14 shapes x 31 days.
    """
    return any(spec.matches(month, day, shape)
               for month in sorted(spec.months)
               for shape in _month_shapes(month)
               for day in range(1, shape[1] + 1))


def _check_fires(expr: str, spec: CronSpec) -> None:
    """Refuse an expression no calendar day can ever match (``0 0 30 2 *``,
    ``0 0 */31 * 1#5``), naming the field(s) at fault."""
    if spec.fires:
        return
    any_weekday = replace(spec, dows=frozenset(range(7)), dow_rules=(), dow_star=True)
    if not _can_fire(any_weekday):
        raise RecurrenceError("cron", expr, "day-of-month never occurs in the selected month(s)")
    raise RecurrenceError("cron", expr, "day-of-month and day-of-week never fall on the same "
                                        "day in the selected month(s)")


def _validate_with_croniter(expr: str, parts: list[str]) -> None:
    """Let croniter confirm the expression (it is the reference parser we build on).

    A day field holding a special (L, W, #), which croniter supports only in part, is
    replaced by ``*`` for this check: those are validated by this module alone.
    """
    plain = [("*" if i in (2, 4) and any(c in text.upper() for c in "LW#") else text)
             for i, text in enumerate(parts)]
    try:
        croniter.expand(" ".join(plain))
    except Exception as exc:  # noqa: BLE001 - croniter raises several unrelated classes
        reason = " ".join(str(exc).split())[:200]
        raise RecurrenceError("cron", expr, f"rejected by croniter: {reason}") from None


@functools.lru_cache(maxsize=4096)
def parse_cron(expr: str) -> CronSpec:
    """Parse and validate a cron expression; raise ``RecurrenceError(field="cron")``, also
    for an expression that can never fire."""
    spec = _parse_recorded_cron(expr)
    _check_fires(expr, spec)
    return spec


@functools.lru_cache(maxsize=4096)
def _parse_recorded_cron(expr: str) -> CronSpec:
    """Parse an expression like :func:`parse_cron`, but accept one that can never fire (its
    ``fires`` is False): a rule the log already holds may predate that refusal."""
    if not isinstance(expr, str):
        raise RecurrenceError("cron", expr, "expected text")
    fields_text = _expand_macro(expr)
    parts = fields_text.split(" ") if fields_text else []
    if len(parts) != 5:
        raise RecurrenceError(
            "cron",
            expr,
            f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}",
        )
    try:
        parsed = [_parse_field(text, spec) for text, spec in zip(parts, _FIELDS, strict=True)]
    except _FieldError as exc:
        raise RecurrenceError("cron", expr, str(exc)) from None
    _validate_with_croniter(expr, parts)
    (minutes, _), (hours, _), (doms, dom_rules), (months, _), (dows, dow_rules) = parsed
    spec = CronSpec(
        expr=fields_text,
        minutes=minutes,
        hours=hours,
        doms=doms,
        months=months,
        dows=dows,
        dom_star=parts[2][0] in "*?",
        dow_star=parts[4][0] in "*?",
        wildcard=parts[0].startswith("*") or parts[1].startswith("*"),
        seconds_of_day=tuple(sorted(h * 3600 + m * 60 for h in hours for m in minutes)),
        dom_rules=dom_rules,
        dow_rules=dow_rules,
    )
    return replace(spec, fires=_can_fire(spec))


def is_wildcard_cron(expr: str) -> bool:
    """True if the (valid) expression's minute or hour field starts with ``*`` (docs/design.md §4).

    Macros are expanded first (``@hourly`` is wildcard, ``@daily`` is not). Raises
    ``RecurrenceError`` for an invalid expression.
    """
    return parse_cron(expr).wildcard


# --------------------------------------------------------------------------- cron search


def _day_epoch(day: date) -> int:
    """POSIX seconds of ``day`` 00:00 as if it were UTC."""
    return (day.toordinal() - _UNIX_EPOCH_ORDINAL) * 86400


@functools.lru_cache(maxsize=65536)
def _steady_offset(zone: ZoneInfo, day: date) -> int | None:
    """The zone's UTC offset in seconds if it is the same all local day, else None.

    Compares both folds at the day's start and at the next day's start: any transition
    inside the day (or at its edges) makes them differ. (Two transitions cancelling out
    within one day do not occur in tzdata.)
    """
    start = datetime(day.year, day.month, day.day)
    end = start + _ONE_DAY
    offsets = {
        start.replace(tzinfo=zone, fold=0).utcoffset(),
        start.replace(tzinfo=zone, fold=1).utcoffset(),
        end.replace(tzinfo=zone, fold=0).utcoffset(),
        end.replace(tzinfo=zone, fold=1).utcoffset(),
    }
    if len(offsets) != 1:
        return None
    (offset,) = offsets
    assert offset is not None
    return int(offset.total_seconds())


@functools.lru_cache(maxsize=4096)
def _transition_day(
    expr: str, zone: ZoneInfo, ambiguous: str, nonexistent: str, day: date
) -> tuple[int, ...]:
    """Sorted, de-duplicated firing instants (POSIX seconds) of a day with a DST transition."""
    instants: set[int] = set()
    for seconds in _parse_recorded_cron(expr).seconds_of_day:
        wall = datetime(day.year, day.month, day.day, seconds // 3600, seconds % 3600 // 60)
        instants.update(_wall_instants(zone, wall, ambiguous, nonexistent))
    return tuple(sorted(instants))


def _next_month_start(day: date) -> date:
    """The first day of the month after ``day``'s."""
    return date(day.year + 1, 1, 1) if day.month == 12 else date(day.year, day.month + 1, 1)


def _matching_days(spec: CronSpec, first: date) -> Iterator[date]:
    """Calendar days matching ``spec``, from ``first`` on, for at most ``_SEARCH_YEARS``."""
    day = first
    last_year = min(first.year + _SEARCH_YEARS, date.max.year - 1)
    while day.year <= last_year:
        if day.month not in spec.months:
            day = _next_month_start(day)
        else:
            if spec.matches_day(day):
                yield day
            day += _ONE_DAY


@dataclass(frozen=True, slots=True)
class CronTrigger:
    """Cron on the wall clock of ``timezone`` with the DST rules of docs/design.md §4."""

    spec: CronSpec
    zone: ZoneInfo
    dst_ambiguous: str = "first"
    dst_nonexistent: str = "shift_forward"
    start: datetime | None = None
    end: datetime | None = None
    kind: str = field(default="cron", init=False)

    @property
    def timezone(self) -> str:
        """The IANA zone name."""
        return self.zone.key

    @property
    def wildcard(self) -> bool:
        """Wildcard jobs fire on every real matching instant, whatever the DST options."""
        return self.spec.wildcard

    def _policy(self) -> tuple[str, str]:
        """(ambiguous, nonexistent) as applied: wildcard jobs are always both/skip."""
        if self.spec.wildcard:
            return "both", "skip"
        return self.dst_ambiguous, self.dst_nonexistent

    def _first_in_day(self, day: date, ts: float) -> int | None:
        """The first firing instant of local ``day`` strictly after ``ts``."""
        offset = _steady_offset(self.zone, day)
        if offset is not None:
            base = _day_epoch(day) - offset
            sods = self.spec.seconds_of_day
            index = bisect.bisect_right(sods, ts - base)
            return base + sods[index] if index < len(sods) else None
        instants = _transition_day(self.spec.expr, self.zone, *self._policy(), day)
        index = bisect.bisect_right(instants, ts)
        return instants[index] if index < len(instants) else None

    def _search(self, ts: float) -> int | None:
        """First firing instant strictly after ``ts`` (POSIX seconds), unbounded by end."""
        if not self.spec.fires:
            return None
        today = datetime.fromtimestamp(ts, self.zone).date()
        yesterday = today - _ONE_DAY  # a transition day may fire past its own local end
        if self.spec.matches_day(yesterday) and _steady_offset(self.zone, yesterday) is None:
            found = self._first_in_day(yesterday, ts)
            if found is not None:
                return found
        for day in _matching_days(self.spec, today):
            found = self._first_in_day(day, ts)
            if found is not None:
                return self._earliest_with_next_day(day, ts, found)
        return None

    def _earliest_with_next_day(self, day: date, ts: float, found: int) -> int:
        """On a transition day, a repeat spanning midnight can put the next day's first
        instant before this day's second pass: take the earlier of the two."""
        if _steady_offset(self.zone, day) is not None:
            return found
        tomorrow = day + _ONE_DAY
        if not self.spec.matches_day(tomorrow):
            return found
        other = self._first_in_day(tomorrow, ts)
        return found if other is None else min(found, other)

    def next_after(self, after: datetime) -> datetime | None:
        """The first firing instant strictly after ``after`` (UTC), None past ``end``."""
        ts = _aware_timestamp(after)
        if self.start is not None:
            ts = max(ts, math.ceil(self.start.timestamp()) - 1)  # integer instants >= start
        if self.end is not None and ts >= self.end.timestamp():
            return None
        found = self._search(ts)
        if found is None or (self.end is not None and found > self.end.timestamp()):
            return None
        return datetime.fromtimestamp(found, UTC)


# --------------------------------------------------------------------------- other kinds


@dataclass(frozen=True, slots=True)
class EveryTrigger:
    """Fixed interval aligned to ``anchor``: ``anchor + k * interval`` in real time."""

    interval: timedelta
    anchor: datetime
    zone: ZoneInfo
    start: datetime | None = None
    end: datetime | None = None
    kind: str = field(default="every", init=False)

    @property
    def timezone(self) -> str:
        """The IANA zone name (display only)."""
        return self.zone.key

    def next_after(self, after: datetime) -> datetime | None:
        """The first ``anchor + k * interval`` strictly after ``after`` and within bounds."""
        if after.tzinfo is None or after.utcoffset() is None:
            raise RecurrenceError("after", after.isoformat(), "must be timezone-aware")
        floor = _to_us(after)
        if self.start is not None:
            floor = max(floor, _to_us(self.start) - 1)
        step = self.interval // _ONE_US
        anchor = _to_us(self.anchor)
        instant = anchor + ((floor - anchor) // step + 1) * step
        if self.end is not None and instant > _to_us(self.end):
            return None
        return _from_us(instant)


@dataclass(frozen=True, slots=True)
class AtTrigger:
    """One shot at ``at``."""

    at: datetime
    zone: ZoneInfo
    start: datetime | None = None
    end: datetime | None = None
    kind: str = field(default="at", init=False)

    @property
    def timezone(self) -> str:
        """The IANA zone name (display only)."""
        return self.zone.key

    def _in_bounds(self) -> bool:
        """Is ``at`` inside [start, end]?"""
        return ((self.start is None or self.at >= self.start)
                and (self.end is None or self.at <= self.end))

    def next_after(self, after: datetime) -> datetime | None:
        """``at`` if it is strictly after ``after`` (and within bounds), else None."""
        _aware_timestamp(after)
        return self.at if self.at > after and self._in_bounds() else None


@dataclass(frozen=True, slots=True)
class DelayTrigger:
    """Fixed delay after the previous run finished.

    ``next_after(finished)`` is ``finished + delay`` (moved up to ``start`` if earlier).
    The first run has no previous finish: it is :meth:`first_instant` of the anchor.
    """

    delay: timedelta
    zone: ZoneInfo
    start: datetime | None = None
    end: datetime | None = None
    kind: str = field(default="delay", init=False)

    @property
    def timezone(self) -> str:
        """The IANA zone name (display only)."""
        return self.zone.key

    def _bounded(self, instant: datetime) -> datetime | None:
        """Clamp up to ``start``; None past ``end``."""
        if self.start is not None and instant < self.start:
            instant = self.start
        if self.end is not None and instant > self.end:
            return None
        return instant

    def first_instant(self, anchor: datetime) -> datetime | None:
        """The first run: the anchor itself (or ``start`` if later); None past ``end``."""
        _aware_timestamp(anchor)
        return self._bounded(anchor.astimezone(UTC))

    def next_after(self, after: datetime) -> datetime | None:
        """``after + delay`` where ``after`` is when the previous run finished."""
        _aware_timestamp(after)
        return self._bounded(after.astimezone(UTC) + self.delay)


# --------------------------------------------------------------------------- compile


def _check_choice(field_name: str, value: str, choices: tuple[str, ...]) -> None:
    """Reject a DST option outside ``choices``."""
    if value not in choices:
        raise RecurrenceError(
            field_name, value, f"expected {', '.join(choices[:-1])} or {choices[-1]}"
        )


def _positive_duration(field_name: str, value: str | float) -> timedelta:
    """Parse a duration that must be > 0 (microsecond resolution)."""
    try:
        seconds = parse_duration(value)
    except InvalidDuration as exc:
        raise RecurrenceError(field_name, value, exc.reason) from None
    micros = round(seconds * 1_000_000)
    if micros <= 0:
        raise RecurrenceError(field_name, value, "must be greater than zero")
    return timedelta(microseconds=micros)


def _optional_instant(
    field_name: str, value: datetime | str | None, zone: ZoneInfo
) -> datetime | None:
    """Read an optional bound/anchor as UTC (naive = wall time in ``zone``)."""
    if value is None:
        return None
    return parse_instant(value, zone.key, field=field_name)


def _chosen_kind(cron: object, every: object, at: object, delay: object) -> str:
    """The one trigger kind given, or RecurrenceError(field="trigger")."""
    given = [name for name, v in (("cron", cron), ("every", every), ("at", at), ("delay", delay))
             if v is not None]
    if len(given) != 1:
        raise RecurrenceError(
            "trigger", ", ".join(given) or "none", "give exactly one of cron, every, at, delay"
        )
    return given[0]


@functools.lru_cache(maxsize=8192, typed=True)
def _compile(
    cron: str | None,
    every: str | float | None,
    at: datetime | str | None,
    delay: str | float | None,
    timezone: str,
    anchor: datetime | None,
    start: datetime | None,
    end: datetime | None,
    dst_ambiguous: str,
    dst_nonexistent: str,
    recorded: bool,
) -> Trigger:
    """Build a trigger (cached; see :func:`compile_trigger`)."""
    _check_choice("dst.ambiguous", dst_ambiguous, DST_AMBIGUOUS_CHOICES)
    _check_choice("dst.nonexistent", dst_nonexistent, DST_NONEXISTENT_CHOICES)
    zone = resolve_zone(timezone)
    kind = _chosen_kind(cron, every, at, delay)
    start_utc = _optional_instant("start", start, zone)
    end_utc = _optional_instant("end", end, zone)
    if start_utc is not None and end_utc is not None and end_utc < start_utc:
        raise RecurrenceError(
            "end", end_utc.isoformat(), f"is before start {start_utc.isoformat()}"
        )
    if kind == "cron":
        assert cron is not None
        spec = _parse_recorded_cron(cron) if recorded else parse_cron(cron)
        return CronTrigger(spec, zone, dst_ambiguous, dst_nonexistent, start_utc, end_utc)
    if kind == "every":
        assert every is not None
        interval = _positive_duration("every", every)
        anchor_utc = _optional_instant("anchor", anchor, zone)
        if anchor_utc is None:
            raise RecurrenceError(
                "anchor", "none", "every needs an anchor (e.g. the schedule's creation instant)"
            )
        return EveryTrigger(interval, anchor_utc, zone, start_utc, end_utc)
    if kind == "at":
        assert at is not None
        at_utc = parse_instant(
            at, zone.key, field="at", dst_ambiguous=dst_ambiguous, dst_nonexistent=dst_nonexistent
        )
        return AtTrigger(at_utc, zone, start_utc, end_utc)
    assert delay is not None
    return DelayTrigger(_positive_duration("delay", delay), zone, start_utc, end_utc)


def compile_trigger(
    *,
    cron: str | None = None,
    every: str | float | None = None,
    at: datetime | str | None = None,
    delay: str | float | None = None,
    timezone: str = "UTC",
    anchor: datetime | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    dst_ambiguous: str = "first",
    dst_nonexistent: str = "shift_forward",
    recorded: bool = False,
) -> Trigger:
    """Compile exactly one of cron / every / at / delay into an immutable, cached Trigger.

    Raises ``RecurrenceError`` (one line naming field and value) for any invalid input,
    including a cron rule that can never fire, unless ``recorded``: a rule the log already
    holds (an earlier version accepted some that never fire) compiles to a trigger with no
    instant.
    """
    return _compile(cron, every, at, delay, timezone, anchor, start, end, dst_ambiguous,
                    dst_nonexistent, recorded)


def upcoming(trigger: Trigger, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` instants strictly after ``after`` (fewer if the rule runs out, or
    reaches the end of the calendar: no instant past year 9999 exists)."""
    out: list[datetime] = []
    current: datetime | None = after
    while len(out) < count and current is not None:
        try:
            current = trigger.next_after(current)
        except RecurrenceError:
            raise
        except (OverflowError, ValueError):  # past datetime.max
            break
        if current is not None:
            out.append(current)
    return out


# --------------------------------------------------------------------------- DST marks


@dataclass(frozen=True, slots=True)
class DstMark:
    """An instant of a preview and what daylight saving time did to it: ``mark`` is None,
    ``shifted`` (its wall time does not exist that day: moved forward), ``repeated`` (its
    wall time happens twice that day) or ``skipped`` (a wall time that does not exist, or
    the repetition the DST policy leaves out: listed, never run); ``note`` says why."""

    at: datetime
    mark: str | None = None
    note: str | None = None


def _wall_ambiguous(t: datetime, zone: ZoneInfo) -> bool:
    """Whether ``t``'s local wall time happens twice in ``zone`` (a clock set back)."""
    wall = t.astimezone(zone).replace(tzinfo=None)
    return (wall.replace(tzinfo=zone, fold=0).utcoffset()
            != wall.replace(tzinfo=zone, fold=1).utcoffset())


def dst_marks(trigger: Trigger | None, instants: list[datetime]) -> list[DstMark]:
    """The consecutive ``instants`` of ``trigger`` (in order) with their DST marks, and the
    instants the transition left out between the first and the last (``skipped``), in time
    order, a skipped one after a kept one at the same instant. Only a cron rule has marks.

    The rule is compiled again with the other policies (``nonexistent`` shift or skip,
    ``ambiguous`` both) over the same span: what differs is what the policy decided.
    """
    marks = [DstMark(t) for t in instants]
    if not instants or not isinstance(trigger, CronTrigger):
        return marks
    first, last = instants[0], instants[-1]

    def span(ambiguous: str, nonexistent: str) -> set[datetime]:
        other = replace(trigger, dst_ambiguous=ambiguous, dst_nonexistent=nonexistent)
        got = upcoming(other, first - _ONE_US, 4 * len(instants))
        return {t for t in got if first <= t <= last}

    ambiguous, zone = trigger.dst_ambiguous, trigger.zone
    no_shift = span("both", "skip")
    for index, t in enumerate(instants):
        if _wall_ambiguous(t, zone):
            marks[index] = DstMark(t, "repeated", "this wall time happens twice (clocks go "
                                                  f"back): policy ambiguous={ambiguous}")
        elif t not in no_shift:
            marks[index] = DstMark(t, "shifted", "the wall time does not exist that day "
                                                 "(clocks go forward): shifted forward")
    for t in sorted(span("both", "shift_forward") - set(instants)):
        note = (f"the repetition of this wall time is left out: policy ambiguous={ambiguous}"
                if _wall_ambiguous(t, zone) else "the wall time does not exist that day "
                "(clocks go forward): policy nonexistent=skip")
        marks.append(DstMark(t, "skipped", note))
    marks.sort(key=lambda m: (m.at, m.mark == "skipped"))
    return marks


def marked_rows(marks: list[DstMark], zone: ZoneInfo) -> list[dict[str, str | None]]:
    """``{"utc": ..Z, "local": ..+hh:mm, "dst": mark, "note": why}`` per marked instant,
    seconds precision: the rows of ``chronolog preview --json`` and ``GET /v1/preview``."""
    return [
        {
            "utc": mark.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "local": mark.at.astimezone(zone).isoformat(timespec="seconds"),
            "dst": mark.mark,
            "note": mark.note,
        }
        for mark in marks
    ]


# --------------------------------------------------------------------------- jitter


def jitter_offset(schedule_id: str, instant: datetime, window_seconds: float) -> float:
    """Deterministic jitter in ``[0, window_seconds)`` from blake2b(schedule_id, instant).

    An aware instant is normalized to UTC first, so equal instants give equal jitter
    whatever their zone. ``0.0`` when the window is not positive.
    """
    if not window_seconds > 0 or math.isinf(window_seconds):
        return 0.0
    if instant.tzinfo is not None:
        instant = instant.astimezone(UTC)
    digest = hashlib.blake2b(
        f"{schedule_id}\x00{instant.isoformat()}".encode(), digest_size=8
    ).digest()
    fraction = (int.from_bytes(digest, "big") >> 11) / float(1 << 53)  # in [0, 1)
    return min(fraction * window_seconds, math.nextafter(window_seconds, 0.0))
