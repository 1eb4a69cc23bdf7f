"""The day partitions of ``runs`` and ``attempts`` (migration 0009, docs/design.md §9).

Both tables are partitioned by RANGE of the run's ``scheduled_at`` (an attempt carries its
run's): ``runs_pYYYYMMDD`` and ``attempts_pYYYYMMDD`` hold one UTC day,
``[YYYY-MM-DD 00:00Z, next day 00:00Z)``, always made and dropped as a pair, and
``runs_default`` / ``attempts_default`` hold any row whose day has no partition, so an
insert never fails for want of one.

``ensure_days(pool, today, back, ahead)`` makes the pairs missing for the days
``today - back .. today + ahead``: the live projector on its retention timer and
``chronolog replay`` before its build, both from the wall clock's today and with ``back`` the
whole days of the deployment's retention window (``days_back``), so a replayed history
lands in the same days a live projector would have put it in, and a day past the window
(whose rows a replay prunes as it goes) is not made only to be dropped. A day whose rows
are already in the default partition is left to it: PostgreSQL refuses a partition whose
rows the default holds, and moving them would lock the table for a copy. Each day is one
short transaction whose lock wait is bounded (``LOCK_WAIT_MS``): making a partition takes
an ACCESS EXCLUSIVE lock on its parent, and queueing behind a long reader would stop every
other reader and writer behind it; a day not made now is made on the next pass.

``day_partitions(conn)`` lists the day partitions as ``(day, runs name, attempts name)``;
``make_days(pool, days)`` makes given days (a restore makes its backup's days before it
loads the rows, so they land in the days they came from).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import asyncpg

__all__ = [
    "AHEAD_DAYS",
    "DEFAULT_PARTITION",
    "LOCK_WAIT_MS",
    "DayPartition",
    "day_bounds",
    "day_partitions",
    "days_back",
    "ensure_days",
    "insertable_columns",
    "make_days",
    "partition_day",
    "quote",
]

DEFAULT_PARTITION = "runs_default"
AHEAD_DAYS = 3  # days made ahead of today
LOCK_WAIT_MS = 1000  # how long a partition's DDL waits for its table lock
DAY_S = 86400.0
_NAME = re.compile(r"^runs_p(\d{8})$")


@dataclass(frozen=True)
class DayPartition:
    day: date
    runs: str
    attempts: str

    @property
    def upper(self) -> datetime:
        return day_bounds(self.day)[1]


def partition_day(name: str) -> date | None:
    """The day of a runs day partition's name (None: not one)."""
    match = _NAME.match(name)
    return datetime.strptime(match.group(1), "%Y%m%d").date() if match else None


def day_bounds(day: date) -> tuple[datetime, datetime]:
    lower = datetime.combine(day, time(), tzinfo=UTC)
    return lower, lower + timedelta(days=1)


def days_back(window_s: float) -> int:
    """The whole days of a retention window: how far back of today partitions are made (a
    day older than that is past the window before it is over)."""
    return max(0, math.floor(window_s / DAY_S))


def _pair(day: date) -> DayPartition:
    tag = day.strftime("%Y%m%d")
    return DayPartition(day, f"runs_p{tag}", f"attempts_p{tag}")


async def day_partitions(conn: asyncpg.Connection | asyncpg.Pool) -> list[DayPartition]:
    """The day partitions of ``runs`` (each with its ``attempts`` twin), oldest first."""
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'runs'::regclass")
    days = sorted(d for d in (partition_day(r[0]) for r in rows) if d is not None)
    return [_pair(d) for d in days]


async def _make(conn: asyncpg.Connection, day: DayPartition) -> bool:
    lower, upper = day_bounds(day.day)
    try:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = {LOCK_WAIT_MS}")
            for parent, name in (("runs", day.runs), ("attempts", day.attempts)):
                await conn.execute(
                    f'CREATE TABLE IF NOT EXISTS "{name}" PARTITION OF {parent} '
                    f"FOR VALUES FROM ('{lower.isoformat()}') TO ('{upper.isoformat()}')")
    except (asyncpg.exceptions.CheckViolationError, asyncpg.exceptions.LockNotAvailableError):
        return False  # the default holds rows of that day, or the table is busy: not now
    return True


async def make_days(pool: asyncpg.Pool, days: Iterable[date]) -> list[str]:
    """Make the day partitions of ``days`` that are missing (a day whose rows the default
    partition holds, or whose table stays locked, is left out); the runs partitions made."""
    have = {p.day for p in await day_partitions(pool)}
    made: list[str] = []
    async with pool.acquire() as conn:
        for day in sorted(set(days) - have):
            pair = _pair(day)
            if await _make(conn, pair):
                made.append(pair.runs)
    return made


async def ensure_days(pool: asyncpg.Pool, today: date, *, back: int,
                      ahead: int = AHEAD_DAYS, after: datetime | None = None) -> list[str]:
    """Make the day partitions missing for ``today - back .. today + ahead`` (module
    docstring), only those ending after ``after`` if given; the runs partitions made now."""
    days = [today + timedelta(days=n) for n in range(-back, ahead + 1)]
    return await make_days(pool, [d for d in days if after is None or day_bounds(d)[1] > after])


def quote(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


async def insertable_columns(conn: asyncpg.Connection | asyncpg.Pool, table: str) -> list[str]:
    """The columns of ``table`` a row is written with (not the generated ones), in order."""
    rows = await conn.fetch(
        "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 "
        "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", quote(table))
    return [r[0] for r in rows]
