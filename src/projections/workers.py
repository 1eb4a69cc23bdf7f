"""Workers on the read side: the directory the projector keeps, and what readers ask of it.

``WorkerDirectory(log, pool)`` reads every partition of the ``workers`` topic (membership
records, ``chronolog.domain.membership``) from the offsets stored in ``projection_offsets``
and folds them into ``workers`` (one row per worker: its classes with their job types and
slots, started, last seen, stopped) and ``served_job_types`` (every job type ever announced
per class), each batch in one transaction with its offsets. Applying a record twice changes
nothing (a row only moves to a newer ``last_seen``), so two directories on one database are
harmless. A record that does not decode is dead-lettered and passed.

Readers (the API, the CLI, the live view, the metrics) derive from those tables, with the
database's clock, whether a worker is *live* (not stopped, last seen within
``membership.LIVE_S``) and so why a READY run waits: ``waiting_reason`` when no live worker
of the run's resource class serves its job type. Nothing of this is an event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import orjson
import structlog

from chronolog.domain.membership import LIVE_S, Announcement, BadAnnouncement, waiting_reason
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog
from chronolog.projections.folding import fold_until_stopped

__all__ = [
    "WorkerDirectory",
    "WorkerRow",
    "ever_served",
    "jobs_in",
    "live_served",
    "live_workers_per_class",
    "served_types",
    "waiting_counts",
    "waiting_for",
    "waiting_runs",
    "workers_page",
]

log = structlog.get_logger("chronolog.workers_directory")

BATCH = 500
_LIVE = f"(NOT w.stopped AND w.last_seen > now() - make_interval(secs => {LIVE_S}))"


class WorkerDirectory:
    """Folds the ``workers`` topic into the ``workers`` tables until ``stop()``."""

    def __init__(self, log_: EventLog, pool: asyncpg.Pool, projection: str = "main",
                 idle_ms: int = 200, *, dead_letter: bool = True) -> None:
        self.log = log_
        self.pool = pool
        self.projection = projection
        self.topic = log_.topics.workers
        self.idle_ms = idle_ms
        self.records = 0
        self._stopping = asyncio.Event()
        # dead_letter=False (a replay): a bad record is only noted in ``skipped`` (the live
        # directory dead-lettered it already)
        self.dead_letters = DeadLetters(log_, "workers-directory") if dead_letter else None
        self.skipped: list[str] = []

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Fold until ``stop()``; a failure (log, database) is logged and retried."""
        await fold_until_stopped(self.step, self._stopping, self.idle_ms, log,
                                 "workers_directory_failed")

    async def step(self, wait_ms: int = 0) -> int:
        """Read each partition once from its stored offset and fold what was there."""
        n = await self.log.partitions_for(self.topic)
        rows = await self.pool.fetch(
            "SELECT partition, next_offset FROM projection_offsets "
            "WHERE projection = $1 AND topic = $2", self.projection, self.topic)
        stored = {r["partition"]: r["next_offset"] for r in rows}
        reads = await asyncio.gather(*(self.log.read(self.topic, p, stored.get(p, 0), BATCH,
                                                     wait_ms if n == 1 else 0)
                                       for p in range(n)))
        if not any(reads):
            if wait_ms and n > 1:
                await asyncio.sleep(wait_ms / 1000)
            return 0
        latest: dict[str, Announcement] = {}
        for recs in reads:
            for rec in recs:
                try:
                    a = Announcement.decode(rec.value)
                except BadAnnouncement as exc:
                    if self.dead_letters is not None:
                        await self.dead_letters.put(rec, exc)
                    else:
                        self.skipped.append(f"{rec.topic}[{rec.partition}]@{rec.offset}: {exc}")
                    continue
                old = latest.get(a.worker_id)
                if old is None or old.sent_at <= a.sent_at:
                    latest[a.worker_id] = a
        offsets = {p: recs[-1].offset + 1 for p, recs in enumerate(reads) if recs}
        async with self.pool.acquire() as conn, conn.transaction():
            for a in latest.values():
                await _upsert(conn, a)
            for p, nxt in offsets.items():
                await conn.execute(
                    "INSERT INTO projection_offsets (projection, topic, partition, next_offset) "
                    "VALUES ($1, $2, $3, $4) ON CONFLICT (projection, topic, partition) DO "
                    "UPDATE SET next_offset = GREATEST(projection_offsets.next_offset, "
                    "EXCLUDED.next_offset), updated_at = now()",
                    self.projection, self.topic, p, nxt)
        count = sum(len(r) for r in reads)
        self.records += count
        return count


async def _upsert(conn: asyncpg.Connection, a: Announcement) -> None:
    classes = {c: {"jobTypes": list(s.job_types), "slots": s.slots} for c, s in a.classes.items()}
    await conn.execute(
        "INSERT INTO workers (worker_id, classes, started_at, last_seen, stopped) "
        "VALUES ($1, $2::jsonb, $3, $4, $5) ON CONFLICT (worker_id) DO UPDATE SET "
        "classes = EXCLUDED.classes, started_at = EXCLUDED.started_at, "
        "last_seen = EXCLUDED.last_seen, stopped = EXCLUDED.stopped, updated_at = now() "
        "WHERE workers.last_seen <= EXCLUDED.last_seen",
        a.worker_id, orjson.dumps(classes).decode(), a.started_at, a.sent_at, a.stopping)
    pairs = [(c, j) for c, s in a.classes.items() for j in s.job_types]
    if pairs:
        await conn.execute(
            "INSERT INTO served_job_types (resource_class, job_type, first_seen, last_seen) "
            "SELECT c, j, $3, $3 FROM unnest($1::text[], $2::text[]) AS u(c, j) "
            "ON CONFLICT (resource_class, job_type) DO UPDATE SET last_seen = "
            "GREATEST(served_job_types.last_seen, EXCLUDED.last_seen)",
            [c for c, _ in pairs], [j for _, j in pairs], a.sent_at)


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    classes: dict[str, dict[str, Any]]  # class -> {"jobTypes": [...], "slots": n}
    started_at: datetime
    last_seen: datetime
    stopped: bool
    live: bool


async def workers_page(pool: Any, *, after: str | None = None, limit: int = 100,
                       live: bool | None = None) -> list[WorkerRow]:
    """Workers by worker ID, after ``after``; ``live`` filters on liveness."""
    sql = f"SELECT w.*, {_LIVE} AS live FROM workers w WHERE true"
    args: list[Any] = []
    if after is not None:
        args.append(after)
        sql += f" AND w.worker_id > ${len(args)}"
    if live is not None:
        sql += f" AND {_LIVE} = {'true' if live else 'false'}"
    args.append(limit)
    sql += f" ORDER BY w.worker_id LIMIT ${len(args)}"
    return [WorkerRow(r["worker_id"], _obj(r["classes"]), r["started_at"], r["last_seen"],
                      r["stopped"], r["live"]) for r in await pool.fetch(sql, *args)]


async def live_served(pool: Any) -> frozenset[tuple[str, str]]:
    """(resource class, job type) pairs some live worker serves now."""
    rows = await pool.fetch(f"SELECT w.classes FROM workers w WHERE {_LIVE}")
    return frozenset((c, j) for r in rows for c, s in _obj(r["classes"]).items()
                     for j in s.get("jobTypes", ()))


def waiting_for(state: str, resource_class: str | None, job_type: str | None,
                served: frozenset[tuple[str, str]]) -> str | None:
    """A READY run no live worker of its class serves: why it waits (else None)."""
    if state != "READY" or (resource_class or "default", job_type or "") in served:
        return None
    return waiting_reason(job_type, resource_class)


async def live_workers_per_class(pool: Any) -> dict[str, int]:
    """Live workers per resource class."""
    return {r[0]: int(r[1]) for r in await pool.fetch(
        f"SELECT c.key, count(*) FROM workers w, jsonb_each(w.classes) AS c WHERE {_LIVE} "
        "GROUP BY 1")}


async def ever_served(pool: Any, resource_class: str, job_type: str) -> bool:
    """Whether any worker of ``resource_class`` has ever announced ``job_type``."""
    return bool(await pool.fetchval(
        "SELECT EXISTS (SELECT 1 FROM served_job_types WHERE resource_class = $1 "
        "AND job_type = $2)", resource_class, job_type))


async def served_types(pool: Any, resource_class: str) -> list[str]:
    """Every job type ever announced in ``resource_class``."""
    return [r[0] for r in await pool.fetch(
        "SELECT job_type FROM served_job_types WHERE resource_class = $1 ORDER BY 1",
        resource_class)]


async def waiting_counts(pool: Any) -> list[tuple[str, str, int]]:
    """(resource class, job type, READY runs no live worker serves), sorted. The READY runs
    are counted per (class, job type) first, so the cost does not grow with the workers."""
    served = await live_served(pool)
    return [(r[0], r[1], int(r[2])) for r in await pool.fetch(
        "SELECT COALESCE(resource_class, 'default'), COALESCE(job_type, ''), count(*) "
        "FROM runs WHERE state = 'READY' GROUP BY 1, 2 ORDER BY 1, 2")
        if (r[0], r[1]) not in served]


async def waiting_runs(pool: Any, limit: int = 10) -> list[tuple[str, str, str, str]]:
    """(tenant, schedule ID, run ID, reason) of the oldest READY runs no live worker serves."""
    unserved = await waiting_counts(pool)
    if not unserved:
        return []
    rows = await pool.fetch(
        "SELECT tenant, schedule_id, run_id, job_type, resource_class FROM runs "
        "WHERE state = 'READY' AND (COALESCE(resource_class, 'default'), "
        "COALESCE(job_type, '')) IN (SELECT * FROM unnest($1::text[], $2::text[])) "
        "ORDER BY ready_at NULLS LAST, run_id LIMIT $3",
        [c for c, _, _ in unserved], [j for _, j, _ in unserved], limit)
    return [(r["tenant"], r["schedule_id"], r["run_id"],
             waiting_reason(r["job_type"], r["resource_class"])) for r in rows]


def _obj(value: Any) -> dict[str, Any]:
    return orjson.loads(value) if isinstance(value, (str, bytes)) else dict(value or {})


def jobs_in(classes: dict[str, dict[str, Any]], allowed: Iterable[str] | None
            ) -> dict[str, dict[str, Any]]:
    """``classes`` with only the job types in ``allowed`` (None: all)."""
    if allowed is None:
        return classes
    keep = set(allowed)
    return {c: {**s, "jobTypes": [j for j in s.get("jobTypes", ()) if j in keep]}
            for c, s in classes.items()}
