"""Durations: parse human and ISO-8601 spellings into seconds, and format seconds back.

Accepted spellings (all mean a number of seconds, never negative):

* plain numbers, as ``int``/``float`` or text: ``90``, ``"1.5"`` (seconds); text numbers
  are ASCII digits only (``"٣"`` or ``"²"`` is an error, not 3 or 2);
* unit strings, optionally compound: ``"500ms"``, ``"90s"``, ``"15m"``, ``"2h"``, ``"1d"``,
  ``"1w"``, ``"1h30m"``, ``"1.5h"`` (units ``ms s m h d w``; case-insensitive);
* ISO-8601 durations without years or months (which have no fixed length):
  ``"PT15M"``, ``"P1D"``, ``"P1DT2H30M"``, ``"PT0.5S"``, ``"P2W"``.

At most ten years (``limits.MAX_DURATION_SECONDS``). Zero is accepted here; callers that need
a positive duration check ``> 0`` themselves.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re

from chronolog.domain.limits import MAX_DURATION_SECONDS

__all__ = ["InvalidDuration", "format_duration", "parse_duration"]

_UNIT_SECONDS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # ASCII digits only (\d takes any script)
_PLAIN_RE = re.compile(rf"^{_NUMBER}$")
_UNIT_PART_RE = re.compile(rf"({_NUMBER})([a-z]+)")
_UNIT_STRING_RE = re.compile(rf"^(?:{_NUMBER}[a-z]+)+$")
_ISO_RE = re.compile(
    rf"^P(?:(?P<w>{_NUMBER})W)?(?:(?P<d>{_NUMBER})D)?"
    rf"(?:T(?:(?P<h>{_NUMBER})H)?(?:(?P<m>{_NUMBER})M)?(?:(?P<s>{_NUMBER})S)?)?$"
)


class InvalidDuration(ValueError):
    """A duration that cannot be read; ``str(e)`` is ``invalid duration '<value>': <why>``."""

    def __init__(self, value: object, reason: str) -> None:
        self.value = str(value)
        self.reason = reason
        super().__init__(f"invalid duration '{_one_line(self.value)}': {reason}")


def _one_line(text: str) -> str:
    """Escape line breaks so an error message stays on one line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _check_number(value: object, seconds: float) -> float:
    """Reject NaN, infinities and negative numbers."""
    # an infinite text is digits: refused below as "at most ten years"
    if math.isnan(seconds) or (math.isinf(seconds) and not isinstance(value, str)):
        raise InvalidDuration(value, "must be a finite number of seconds")
    if seconds < 0:
        raise InvalidDuration(value, "must not be negative")
    if seconds > MAX_DURATION_SECONDS:
        raise InvalidDuration(value, f"must be at most {MAX_DURATION_SECONDS} seconds (ten years)")
    return float(seconds)


def _parse_units(text: str, original: str) -> float:
    """Parse ``1h30m``-style text (already lower-cased, no spaces)."""
    if not _UNIT_STRING_RE.match(text):
        raise InvalidDuration(original, "expected a number with a unit (ms, s, m, h, d, w), "
                              "e.g. 90s, 15m, 1h30m")
    total = 0.0
    seen: set[str] = set()
    for number, unit in _UNIT_PART_RE.findall(text):
        if unit not in _UNIT_SECONDS:
            raise InvalidDuration(original, f"unknown unit '{unit}' (use ms, s, m, h, d, w)")
        if unit in seen:
            raise InvalidDuration(original, f"unit '{unit}' appears twice")
        seen.add(unit)
        total += float(number) * _UNIT_SECONDS[unit]
    return total


def _parse_iso(text: str, original: str) -> float:
    """Parse an ISO-8601 duration (upper-cased) such as ``PT15M`` or ``P1DT2H``."""
    date_part = text.split("T", 1)[0]
    if "Y" in date_part or "M" in date_part:
        raise InvalidDuration(original, "ISO-8601 years and months have no fixed length; "
                              "use days or weeks")
    match = _ISO_RE.match(text)
    if match is None or text in ("P", "PT") or text.endswith("T"):
        raise InvalidDuration(original, "not an ISO-8601 duration such as PT15M or P1DT2H")
    parts = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(match.group(k)) * factor for k, factor in parts.items() if match.group(k))


def parse_duration(value: str | int | float) -> float:
    """Return the number of seconds ``value`` spells (see the module docstring)."""
    if isinstance(value, bool):
        raise InvalidDuration(value, "expected a duration, not a boolean")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond the float range
            raise InvalidDuration(
                value, f"must be at most {MAX_DURATION_SECONDS} seconds (ten years)") from None
        return _check_number(value, seconds)
    if not isinstance(value, str):
        raise InvalidDuration(value, f"expected text or a number, not {type(value).__name__}")
    text = value.strip().replace(" ", "")
    if not text:
        raise InvalidDuration(value, "empty")
    if not text.isascii():
        raise InvalidDuration(value, "not ASCII: write digits 0-9 and a unit, e.g. 90s, 15m, PT15M")
    if text.startswith("-"):
        raise InvalidDuration(value, "must not be negative")
    if _PLAIN_RE.match(text):
        return _check_number(value, float(text))
    if text[0] in "Pp":
        return _check_number(value, _parse_iso(text.upper(), value))
    return _check_number(value, _parse_units(text.lower(), value))


def format_duration(seconds: float) -> str:
    """Format seconds compactly: ``90 -> "1m30s"``, ``3600 -> "1h"``, ``0.5 -> "500ms"``.

    Units are d, h, m, s and ms (rounded to the millisecond); zero is ``"0s"``.
    """
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"cannot format duration {seconds!r}")
    sign = "-" if seconds < 0 else ""
    remaining = round(abs(seconds) * 1000)
    if remaining == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, remaining = divmod(remaining, size)
        if count:
            out.append(f"{count}{unit}")
    return sign + "".join(out)
