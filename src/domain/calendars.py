"""Exclusion calendars: which instants a calendar excludes. Pure: no clock, no I/O.

A calendar is a tenant's named set of exclusions that schedules refer to by name. Each
entry is read in its own IANA zone (the calendar's ``timezone`` unless the entry names one):

* ``dates`` — whole local days: ``2026-12-25`` excludes every instant whose local date in
  the zone is that day (a day of 23 or 25 hours on a daylight-saving change is still the
  whole day);
* ``ranges`` — whole local days from ``from`` to ``to``, both included;
* ``windows`` — recurring local-time windows: on the listed ``days`` of the week (default
  every day), from ``start`` (included) to ``end`` (excluded), ``HH:MM`` wall times;
  ``24:00`` ends at midnight, and an ``end`` at or before ``start`` runs past midnight into
  the next day (a window that starts on a listed day ends on the following one). A wall time
  a daylight-saving change skips or repeats is compared as the wall clock reads it: the
  instant's local time in the zone, whichever its offset.

``excluded_by(calendar, instant)`` names the first entry that excludes ``instant`` (for the
skipped occurrence's reason), or None. Sizes are bounded so that one check costs at most a
few hundred comparisons.
"""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from chronolog.domain.recurrence import RecurrenceError, resolve_zone

__all__ = ["CALENDAR_NAME_PATTERN", "MAX_EXCLUDE", "CalendarName", "CalendarSpec",
           "DateRange", "Window", "excluded_by"]

# a calendar's name: what schedules refer to it by (``ScheduleSpec.exclude``)
CALENDAR_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
CalendarName = Annotated[str, Field(min_length=1, max_length=100,
                                    pattern=CALENDAR_NAME_PATTERN)]
MAX_EXCLUDE = 10  # calendars one schedule may name
MAX_DATES = 1000
MAX_RANGES = 200
MAX_WINDOWS = 50
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$|^24:00$")


def _zone(name: str | None) -> str | None:
    if name is not None:
        try:
            resolve_zone(name)
        except RecurrenceError:
            raise ValueError(f"unknown IANA zone '{name}'") from None
    return name


Zone = Annotated[str | None, AfterValidator(_zone)]


def _minutes(text: str) -> int:
    """``HH:MM`` (or ``24:00``) as minutes after midnight."""
    if not _HHMM.match(text):
        raise ValueError(f"'{text}' is not a wall time HH:MM (00:00 to 24:00)")
    h, m = text.split(":")
    return int(h) * 60 + int(m)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class DateRange(_Model):
    """Whole local days, both ends included."""

    start: date = Field(alias="from")
    end: date = Field(alias="to")
    timezone: Zone = None

    @model_validator(mode="after")
    def _ordered(self) -> DateRange:
        if self.end < self.start:
            raise ValueError(f"to {self.end} is before from {self.start}")
        return self


class Window(_Model):
    """A recurring local-time window: on ``days``, from ``start`` to ``end``."""

    days: tuple[Weekday, ...] = WEEKDAYS
    start: str
    end: str
    timezone: Zone = None

    @field_validator("start", "end")
    @classmethod
    def _wall_time(cls, v: str) -> str:
        _minutes(v)
        return v

    @field_validator("days")
    @classmethod
    def _some_days(cls, v: tuple[Weekday, ...]) -> tuple[Weekday, ...]:
        if not v:
            raise ValueError("at least one day of the week")
        return v

    @model_validator(mode="after")
    def _a_span(self) -> Window:
        if self.start == "24:00":
            raise ValueError("start 24:00 is the next day's 00:00: write 00:00")
        if _minutes(self.start) == _minutes(self.end):
            raise ValueError(f"start {self.start} and end {self.end} are the same wall time "
                             "(a whole day: 00:00 to 24:00)")
        return self


class CalendarSpec(_Model):
    """A calendar's exclusions (each read in its own zone, default ``timezone``)."""

    timezone: Zone = "UTC"
    dates: tuple[date, ...] = Field(default=(), max_length=MAX_DATES)
    ranges: tuple[DateRange, ...] = Field(default=(), max_length=MAX_RANGES)
    windows: tuple[Window, ...] = Field(default=(), max_length=MAX_WINDOWS)


def excluded_by(calendar: CalendarSpec, instant: datetime) -> str | None:
    """The entry of ``calendar`` that excludes ``instant`` (tz-aware), described for
    people — ``2026-12-25``, ``2026-12-24..2026-12-26``, ``sat,sun 22:00-06:00
    Europe/Paris``, ``02:00-05:00 UTC`` (every day) — or None when no entry does. Dates
    first, then ranges, then windows, each in the order the calendar lists them."""
    return _compiled(calendar).excluded_by(instant)


class _Compiled:
    """A calendar made fast to check (``_compiled``): each zone's local day (an ordinal),
    weekday and minute of the day computed once per instant; dates a set of ordinals, ranges
    ordinal pairs, windows minutes — every entry with its zone's index and its text."""

    __slots__ = ("dates", "ranges", "windows", "zones")

    def __init__(self, c: CalendarSpec) -> None:
        default = c.timezone or "UTC"
        names = list(dict.fromkeys([default, *(r.timezone or default for r in c.ranges),
                                    *(w.timezone or default for w in c.windows)]))
        self.zones = tuple(resolve_zone(z) for z in names)
        self.dates = {d.toordinal(): d.isoformat() for d in c.dates}
        self.ranges = tuple((names.index(r.timezone or default), r.start.toordinal(),
                             r.end.toordinal(), f"{r.start.isoformat()}..{r.end.isoformat()}"
                             + (f" {r.timezone}" if r.timezone else "")) for r in c.ranges)
        self.windows = tuple(
            (names.index(w.timezone or default), frozenset(WEEKDAYS.index(d) for d in w.days),
             _minutes(w.start), _minutes(w.end),
             (f"{','.join(w.days)} " if set(w.days) != set(WEEKDAYS) else "")
             + f"{w.start}-{w.end} {w.timezone or default}")
            for w in c.windows)

    def excluded_by(self, instant: datetime) -> str | None:
        days: list[int] = []
        minutes: list[float] = []
        for zone in self.zones:
            t = instant.astimezone(zone)
            days.append(t.toordinal())
            minutes.append(t.hour * 60 + t.minute + (t.second + t.microsecond / 1e6) / 60)
        if self.dates:
            hit = self.dates.get(days[0])
            if hit is not None:
                return hit
        for z, start, end, text in self.ranges:
            if start <= days[z] <= end:
                return text
        for z, weekdays, lo, hi, text in self.windows:
            now, today = minutes[z], (days[z] - 1) % 7  # ordinal 1 is a Monday
            if lo < hi:  # within one day
                if today in weekdays and lo <= now < hi:
                    return text
            # past midnight: the part of a window that began on a listed day, or began
            # the day before
            elif (today in weekdays and now >= lo) or ((today - 1) % 7 in weekdays
                                                         and now < hi):
                return text
        return None


_CACHE: dict[int, tuple[CalendarSpec, _Compiled]] = {}
_CACHE_MAX = 4096


def _compiled(calendar: CalendarSpec) -> _Compiled:
    """A calendar compiled once per spec object (a schedule's copy is the same object every
    time it is checked; hashing a spec would cost more than checking it). The cache holds
    the spec itself, so its id names it as long as it is cached; bounded, oldest out."""
    hit = _CACHE.get(id(calendar))
    if hit is not None and hit[0] is calendar:
        return hit[1]
    compiled = _Compiled(calendar)
    if len(_CACHE) >= _CACHE_MAX:
        del _CACHE[next(iter(_CACHE))]
    _CACHE[id(calendar)] = (calendar, compiled)
    return compiled
