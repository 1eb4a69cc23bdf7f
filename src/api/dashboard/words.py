"""A schedule's rule in words, for people: ``0 9 * * 1-5`` -> "at 09:00 on Monday to
Friday". The common shapes of cron are spelled out; anything else is shown as its fields
("minute 0,30; hour 9-17; ...") beside the expression itself, which the page always shows
too. Presentation only: what runs is decided by ``chronolog.domain.recurrence``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["duration_words", "exclusion_words", "rule_words"]

_DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
         "Sunday"]
_DAY_NAMES = {d[:3].upper(): i for i, d in enumerate(_DAYS[:7])}
_MONTHS = ["", "January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
_MONTH_NAMES = {m[:3].upper(): i for i, m in enumerate(_MONTHS) if m}
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
           "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
           "@hourly": "0 * * * *"}


def duration_words(seconds: float) -> str:
    """``90`` -> "1 min 30 s"; ``3600`` -> "1 h"."""
    s = int(seconds)
    if s != seconds:
        return f"{seconds:g} s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size} {unit}")
            s %= size
    return " ".join(parts) or "0 s"


def _num(text: str, names: dict[str, int]) -> int | None:
    if text.isdigit():
        return int(text)
    return names.get(text.upper())


_NTH = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}


def _day_list(field: str) -> str | None:
    """``1-5`` -> "Monday to Friday"; ``SAT,SUN`` -> "Saturday and Sunday"; ``SUN#2`` ->
    "the second Sunday of the month"; ``5L`` -> "the last Friday of the month"."""
    out = []
    for item in field.split(","):
        if "#" in item:
            day, _, nth = item.partition("#")
            d = _num(day, _DAY_NAMES)
            if d is None or not 0 <= d <= 7 or not nth.isdigit() or int(nth) not in _NTH:
                return None
            out.append(f"the {_NTH[int(nth)]} {_DAYS[d]} of the month")
        elif item.upper().endswith("L") and len(item) > 1:
            d = _num(item[:-1], _DAY_NAMES)
            if d is None or not 0 <= d <= 7:
                return None
            out.append(f"the last {_DAYS[d]} of the month")
        elif "-" in item and "/" not in item:
            lo, hi = (_num(x, _DAY_NAMES) for x in item.split("-", 1))
            if lo is None or hi is None or not (0 <= lo <= 7 and 0 <= hi <= 7):
                return None
            out.append(f"{_DAYS[lo]} to {_DAYS[hi]}")
        else:
            d = _num(item, _DAY_NAMES)
            if d is None or not 0 <= d <= 7:
                return None
            out.append(_DAYS[d])
    return " and ".join(out) if len(out) <= 2 else ", ".join(out[:-1]) + " and " + out[-1]


def _month_list(field: str) -> str | None:
    out = []
    for item in field.split(","):
        mo = _num(item, _MONTH_NAMES)
        if mo is None or not 1 <= mo <= 12:
            return None
        out.append(_MONTHS[mo])
    return ", ".join(out)


def _cron_words(expr: str) -> str:
    text = _MACROS.get(expr.strip().lower(), expr.strip())
    fields = text.split()
    if len(fields) != 5:
        return f"cron {expr}"
    minute, hour, dom, month, dow = fields
    when: str
    if minute == "*" and hour == "*":
        when = "every minute"
    elif minute.startswith("*/") and minute[2:].isdigit() and hour == "*":
        when = f"every {int(minute[2:])} minutes"
    elif minute.isdigit() and hour == "*":
        when = f"every hour at minute {int(minute)}"
    elif minute.isdigit() and hour.startswith("*/") and hour[2:].isdigit():
        when = f"every {int(hour[2:])} hours at minute {int(minute)}"
    elif minute.isdigit() and all(h.isdigit() for h in hour.split(",")):
        when = "at " + ", ".join(f"{int(h):02d}:{int(minute):02d}" for h in hour.split(","))
    else:
        when = f"minute {minute}, hour {hour}"
    days = []
    if dom != "*":
        if dom == "L":
            days.append("on the last day of the month")
        elif dom.isdigit():
            days.append(f"on day {int(dom)} of the month")
        else:
            days.append(f"on days {dom} of the month")
    if dow != "*":
        named = _day_list(dow)
        days.append(f"on {named}" if named else f"on weekdays {dow}")
    if month != "*":
        named = _month_list(month)
        days.append(f"in {named}" if named else f"in months {month}")
    return " ".join([when, *days])


def rule_words(definition: dict[str, Any]) -> str:
    """A definition's (camelCase, as the API shows it) rule in words, with its zone."""
    if definition.get("cron") is not None:
        zone = definition.get("timezone") or "UTC"
        return f"{_cron_words(str(definition['cron']))} ({zone})"
    if definition.get("every") is not None:
        return f"every {duration_words(float(definition['every']))}"
    if definition.get("at") is not None:
        return f"once at {definition['at']}"
    if definition.get("delay") is not None:
        return f"{duration_words(float(definition['delay']))} after each run ends"
    return "no rule"


def exclusion_words(mark: dict[str, Any] | None) -> str:
    """A calendar's exclusion in words: an upcoming instant's mark ``{calendar, entry}`` ->
    "excluded by us-holidays (2026-12-25)"; a skipped run's ``{calendar, revision, entry}``
    -> "excluded by us-holidays r3 (2026-12-25)"; "" for none. Plain text: the page
    escapes it."""
    if not mark:
        return ""
    revision = mark.get("revision")
    at = f" r{revision}" if isinstance(revision, int) and revision > 0 else ""
    entry = mark.get("entry")
    return f"excluded by {mark.get('calendar')}{at}" + (f" ({entry})" if entry else "")
