"""The worker directory the projector keeps: the ``workers`` topic folded into PostgreSQL.

``WorkerDirectory(log, pool)`` reads every partition of the ``workers`` topic (membership
records, ``chronolog.domain.membership``) from the offsets stored in ``projection_offsets``
and folds them into ``workers`` (one row per worker: its classes with their job types and
slots, started, last seen, stopped) and ``served_job_types`` (every job type ever announced
per class), each batch in one transaction with its offsets. Applying a record twice changes
nothing (a row only moves to a newer ``last_seen``), so two directories on one database are
harmless. A record that does not decode is dead-lettered and passed.

What readers derive from those tables (liveness, why a READY run waits) is
``chronolog.queries.workers``.
"""

from __future__ import annotations

import asyncio

import asyncpg
import orjson
import structlog

from chronolog.domain.membership import Announcement, BadAnnouncement
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog
from chronolog.projections.folding import IDLE_MS, fold_until_stopped

__all__ = ["WorkerDirectory"]

log = structlog.get_logger("chronolog.workers_directory")

BATCH = 500


class WorkerDirectory:
    """Folds the ``workers`` topic into the ``workers`` tables until ``stop()``."""

    def __init__(self, log_: EventLog, pool: asyncpg.Pool, projection: str = "main",
                 idle_ms: int = IDLE_MS, *, dead_letter: bool = True) -> None:
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
