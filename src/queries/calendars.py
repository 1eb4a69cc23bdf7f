"""Reads of a tenant's calendars (the ``calendars`` table, migration 0015) and the documents
the API and the CLI show for them.

A calendar's document is its definition (the body of a ``PUT /v1/calendars/{name}``) with its
``name``, ``revision`` (also the ``ETag``), ``createdAt``, ``updatedAt`` and ``usedBy``: the
IDs of the tenant's live schedules (ACTIVE or PAUSED) whose definition names it. A deleted
calendar is not found (its row stays, so a calendar put again counts its revisions on).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg
import orjson
from pydantic import Field

from chronolog.domain.calendars import CalendarSpec
from chronolog.queries.documents import CamelModel

__all__ = ["CALENDARS_PAGE", "CalendarOut", "CalendarPage", "CalendarSummary",
           "calendar_document", "calendar_page", "missing_calendars"]

CALENDARS_PAGE = 100  # calendars a list answers at most at a time (and by default)
USED_BY_SHOWN = 100  # schedule IDs a calendar's document names at most


class CalendarSummary(CamelModel):
    name: str
    revision: int
    updated_at: datetime


class CalendarPage(CamelModel):
    items: list[CalendarSummary]
    next_cursor: str | None = Field(default=None, description="the name to pass as ``after`` "
                                    "for the next page; absent on the last page")


class CalendarOut(CamelModel):
    name: str
    revision: int
    definition: dict[str, Any] = Field(description="the calendar as it was put: timezone, "
                                       "dates, ranges, windows")
    created_at: datetime | None = None
    updated_at: datetime
    used_by: list[str] = Field(description="IDs of the live schedules whose exclude names "
                               f"it (at most {USED_BY_SHOWN})")


_LIVE = "SELECT * FROM calendars WHERE tenant = $1 AND name = $2 AND spec IS NOT NULL"


async def calendar_document(pool: asyncpg.Pool, tenant: str, name: str) -> CalendarOut | None:
    """The calendar's document, or None when it does not exist (never put, or deleted)."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(_LIVE, tenant, name)
        if row is None:
            return None
        used = await conn.fetch(
            "SELECT schedule_id FROM schedules WHERE tenant = $1 AND state IN ('ACTIVE', "
            "'PAUSED') AND spec -> 'exclude' ? $2 ORDER BY schedule_id LIMIT $3",
            tenant, name, USED_BY_SHOWN)
    spec = CalendarSpec.model_validate(_json(row["spec"]))
    return CalendarOut(name=name, revision=row["revision"],
                       definition=spec.model_dump(mode="json", by_alias=True),
                       created_at=row["created_at"], updated_at=row["updated_at"],
                       used_by=[r["schedule_id"] for r in used])


async def calendar_page(pool: asyncpg.Pool, tenant: str, after: str | None,
                        limit: int = CALENDARS_PAGE) -> CalendarPage:
    """The tenant's calendars by name (code-point order), ``limit`` after ``after``."""
    rows = await pool.fetch(
        "SELECT name, revision, updated_at FROM calendars WHERE tenant = $1 AND spec IS NOT "
        "NULL AND name COLLATE \"C\" > $2 ORDER BY name COLLATE \"C\" LIMIT $3",
        tenant, after or "", limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return CalendarPage(items=[CalendarSummary(name=r["name"], revision=r["revision"],
                                               updated_at=r["updated_at"]) for r in rows],
                        next_cursor=rows[-1]["name"] if more and rows else None)


async def missing_calendars(pool: asyncpg.Pool, tenant: str,
                            names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` the tenant has no calendar of (in their order)."""
    if not names:
        return []
    rows = await pool.fetch("SELECT name FROM calendars WHERE tenant = $1 AND name = "
                            "ANY($2::text[]) AND spec IS NOT NULL", tenant, list(names))
    have = {r["name"] for r in rows}
    return [n for n in names if n not in have]


def _json(value: Any) -> Any:
    """A jsonb value as the pool returns it (text without a codec)."""
    return orjson.loads(value) if isinstance(value, (str, bytes)) else value
