"""Exclusion calendars on the read side: which upcoming instants the calendars a schedule
names (``exclude``) exclude, as the schedule's ``preview``, ``GET /v1/preview?exclude=``
and the dashboard mark them, and a skipped run's exclusion as the run documents show it.

The marks are made against the calendars as the read model holds them now (their current
revisions): the processor decides each instant against the copy the schedule holds when
the instant comes (``chronolog.commands.calendars``), so a mark is a forecast, by the same
rule — the first calendar of ``exclude`` that excludes the instant names it, and a calendar
that does not exist (never created, or deleted) excludes every instant. An excluded instant
is still listed, marked: it is recorded SKIPPED (reason ``excluded``) when it comes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from chronolog.commands.calendars import MISSING
from chronolog.domain.calendars import CALENDAR_NAME_PATTERN, MAX_EXCLUDE, CalendarSpec, excluded_by
from chronolog.queries.documents import ExcludedOut, ExclusionOut

__all__ = ["Calendars", "calendar_specs", "excluded", "exclusion_out", "mark_excluded",
           "parse_exclude"]

# a tenant's calendars by name as the read model holds them: the current spec, or None
# for a deleted one (a name absent from the mapping was never created: the same, missing)
Calendars = Mapping[str, CalendarSpec | None]

_NAME = re.compile(CALENDAR_NAME_PATTERN)


def calendar_specs(rows: Iterable[Mapping[str, Any]]) -> dict[str, CalendarSpec | None]:
    """The ``calendars`` rows' specs by name (``spec`` NULL: deleted, None)."""
    out: dict[str, CalendarSpec | None] = {}
    for r in rows:
        raw = r["spec"]
        if isinstance(raw, (str, bytes)):
            raw = orjson.loads(raw)
        out[r["name"]] = None if raw is None else CalendarSpec.model_validate(raw)
    return out


def excluded(names: Sequence[str], calendars: Calendars, instant: datetime
             ) -> ExcludedOut | None:
    """The first calendar of ``names`` (a schedule's ``exclude``, in its order) that
    excludes ``instant`` and the entry that does (a missing or deleted calendar: every
    instant, entry ``MISSING``); None when none does."""
    for name in names:
        spec = calendars.get(name)
        if spec is None:
            return ExcludedOut(calendar=name, entry=MISSING)
        entry = excluded_by(spec, instant)
        if entry is not None:
            return ExcludedOut(calendar=name, entry=entry)
    return None


def mark_excluded(names: Sequence[str], calendars: Calendars, instants: Iterable[datetime]
                  ) -> list[ExcludedOut | None]:
    """Per instant (in order), its :func:`excluded` mark (all None when ``names`` is
    empty)."""
    if not names:
        return [None for _ in instants]
    return [excluded(names, calendars, t) for t in instants]


def exclusion_out(state: str | None, skipped_reason: str | None, raw: Any
                  ) -> ExclusionOut | None:
    """A run's ``exclusion`` column (``{calendar, revision, entry}``, jsonb) as its
    documents show it: only on a run SKIPPED with reason ``excluded`` (None otherwise, or
    when the column is empty)."""
    if state != "SKIPPED" or skipped_reason != "excluded" or raw is None:
        return None
    if isinstance(raw, (str, bytes)):
        raw = orjson.loads(raw)
    if not isinstance(raw, dict) or not raw.get("calendar"):
        return None
    revision = raw.get("revision")
    return ExclusionOut(calendar=str(raw["calendar"]),
                        revision=revision if isinstance(revision, int) else 0,
                        entry=str(raw.get("entry") or ""))


def parse_exclude(text: str | None) -> tuple[str, ...]:
    """``"us-holidays, fr-holidays"`` -> the calendar names, in order (``ValueError`` with
    the message to show: a name that is not one, a name given twice, too many)."""
    if text is None or not text.strip():
        return ()
    names = tuple(n.strip() for n in text.split(","))
    for i, n in enumerate(names):
        if not n or len(n) > 100 or not _NAME.match(n):
            shown = n[:40].encode("unicode_escape").decode()
            raise ValueError(f"invalid exclude '{shown}': a calendar name is 1 to 100 "
                             "letters, digits, '_', '.' or '-', starting with a letter or "
                             "digit")
        if n in names[:i]:
            raise ValueError(f"invalid exclude: calendar '{n}' is named twice")
    if len(names) > MAX_EXCLUDE:
        raise ValueError(f"invalid exclude: at most {MAX_EXCLUDE} calendars")
    return names
