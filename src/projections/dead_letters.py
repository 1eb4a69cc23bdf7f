"""Dead letters on the read side: the ``dead_letters`` table the projector folds from the
``dlq`` topic (``GET /v1/dlq`` reads it; ``chronolog.queries.read_model``).

``DeadLetterFold(log, pool)`` reads every partition of ``dlq`` from the offsets stored in
``projection_offsets`` (topic: the dlq topic) and writes one row per letter key — consumer,
source topic, partition and offset — with the tenant and schedule ID the letter names (for
a letter written before it named them: what its original record names,
``chronolog.log.dead_letters.named_by``), each batch in one transaction with its offsets.
The first letter of a key is kept (``ON CONFLICT DO NOTHING``): a letter written again by a
consumer that crashed in between changes nothing, and folding the topic again from offset 0
gives the same rows. A letter's time is its ``dead_lettered_at`` (else the record's append
time); text is stored with U+0000 as U+FFFD, as the projector stores events.

A record of ``dlq`` that is not a dead letter, or whose numbers PostgreSQL cannot hold, is
itself dead-lettered (consumer ``dead-letters``) and passed: the fold never stops on it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pydantic
import structlog

from chronolog.domain import codec
from chronolog.domain import limits as lim
from chronolog.log.dead_letters import DeadLetters, named_by
from chronolog.log.port import EventLog, Record
from chronolog.projections.folding import IDLE_MS, fold_until_stopped
from chronolog.projections.store import refused_for_its_data

__all__ = ["CONSUMER", "DeadLetterFold", "LetterRow", "letter_row"]

log = structlog.get_logger("chronolog.dead_letter_fold")

BATCH = 500
CONSUMER = "dead-letters"  # the consumer name of the letters this fold writes itself
_INT32 = 2**31 - 1

_COLUMNS = ("consumer", "source_topic", "source_partition", "source_offset", "tenant",
            "schedule_id", "reason", "error_class", "command_id", "original", "original_size",
            "dead_lettered_at", "dlq_partition", "dlq_offset")
_TYPES = ("text", "text", "integer", "bigint", "text", "text", "text", "text", "text", "text",
          "bigint", "timestamptz", "integer", "bigint")
_INSERT = (
    f"INSERT INTO dead_letters ({', '.join(_COLUMNS)}) "
    f"SELECT * FROM unnest({', '.join(f'${i}::{t}[]' for i, t in enumerate(_TYPES, 1))}) "
    "ON CONFLICT (consumer, source_topic, source_partition, source_offset) DO NOTHING")


class BadLetter(ValueError):
    """A dlq record that cannot be a row of ``dead_letters``."""


@dataclass(frozen=True)
class LetterRow:
    """One row of ``dead_letters`` (in ``_COLUMNS`` order by ``values``)."""

    consumer: str
    source_topic: str
    source_partition: int
    source_offset: int
    tenant: str | None
    schedule_id: str | None
    reason: str
    error_class: str
    command_id: str | None
    original: str
    original_size: int | None
    dead_lettered_at: datetime
    dlq_partition: int
    dlq_offset: int

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, c) for c in _COLUMNS)


def _text(value: str | None) -> str | None:
    return None if value is None else value.replace("\x00", "\ufffd")


def _bounded(value: int | None, top: int, what: str) -> int | None:
    if value is not None and not 0 <= value <= top:
        raise BadLetter(f"{what} {value} is out of range")
    return value


def letter_row(lg: EventLog, rec: Record) -> LetterRow:
    """The row of a dlq record; ``BadLetter`` when it is not a dead letter we can store."""
    try:
        dl = codec.decode_dead_letter(rec.value)
    except (ValueError, pydantic.ValidationError) as exc:  # JSONDecodeError is a ValueError
        raise BadLetter(f"not a dead letter: {exc}"[:500]) from None
    topic = dl.source_topic or lg.topics.commands  # written before the field existed
    tenant, schedule_id = dl.tenant, dl.schedule_id
    if tenant is None and schedule_id is None:  # a letter from before they were named
        try:
            original = base64.b64decode(dl.original, validate=True)
        except (binascii.Error, ValueError):
            original = b""
        tenant, schedule_id = named_by(lg.topics, topic, None, original)
    at = dl.dead_lettered_at or datetime.fromtimestamp(rec.timestamp_ms / 1000, UTC)
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return LetterRow(
        consumer=_text(dl.consumer) or "", source_topic=_text(topic) or "",
        source_partition=_bounded(dl.source_partition, _INT32, "source_partition") or 0,
        source_offset=_bounded(dl.source_offset, lim.MAX_INT, "source_offset") or 0,
        tenant=_text(tenant), schedule_id=_text(schedule_id), reason=_text(dl.reason) or "",
        error_class=_text(dl.error_class) or "", command_id=_text(dl.command_id),
        original=_text(dl.original) or "",
        original_size=_bounded(dl.original_size, lim.MAX_INT, "original_size"),
        dead_lettered_at=at, dlq_partition=rec.partition, dlq_offset=rec.offset)


class DeadLetterFold:
    """Folds the ``dlq`` topic into ``dead_letters`` until ``stop()``."""

    def __init__(self, log_: EventLog, pool: asyncpg.Pool, projection: str = "main",
                 idle_ms: int = IDLE_MS, *, dead_letter: bool = True) -> None:
        self.log = log_
        self.pool = pool
        self.projection = projection
        self.topic = log_.topics.dlq
        self.idle_ms = idle_ms
        self.records = 0
        self._stopping = asyncio.Event()
        # dead_letter=False (a replay): a bad record is only noted in ``skipped`` (the live
        # fold dead-lettered it already)
        self.dead_letters = DeadLetters(log_, CONSUMER) if dead_letter else None
        self.skipped: list[str] = []

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Fold until ``stop()``; a failure (log, database) is logged and retried."""
        await fold_until_stopped(self.step, self._stopping, self.idle_ms, log,
                                 "dead_letter_fold_failed")

    async def offsets(self) -> dict[int, int]:
        """The next dlq offset folded, per partition."""
        rows = await self.pool.fetch(
            "SELECT partition, next_offset FROM projection_offsets "
            "WHERE projection = $1 AND topic = $2", self.projection, self.topic)
        return {r["partition"]: r["next_offset"] for r in rows}

    async def step(self, wait_ms: int = 0) -> int:
        """Read each partition once from its stored offset and fold what was there."""
        n = await self.log.partitions_for(self.topic)
        stored = await self.offsets()
        reads = await asyncio.gather(*(self.log.read(self.topic, p, stored.get(p, 0), BATCH,
                                                     wait_ms if n == 1 else 0)
                                       for p in range(n)))
        if not any(reads):
            if wait_ms and n > 1:
                await asyncio.sleep(wait_ms / 1000)
            return 0
        rows: list[tuple[Record, LetterRow]] = []
        for recs in reads:
            for rec in recs:
                try:
                    rows.append((rec, letter_row(self.log, rec)))
                except BadLetter as exc:
                    await self._bad(rec, exc)
        offsets = {p: recs[-1].offset + 1 for p, recs in enumerate(reads) if recs}
        try:
            await self._write([row for _, row in rows], offsets)
        except Exception as exc:
            if not refused_for_its_data(exc):
                raise
            await self._write_each(rows, offsets)
        count = sum(len(r) for r in reads)
        self.records += count
        return count

    async def _write(self, rows: list[LetterRow], offsets: dict[int, int]) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            if rows:
                columns = list(zip(*(row.values() for row in rows), strict=True))
                await conn.execute(_INSERT, *[list(c) for c in columns])
            for p, nxt in offsets.items():
                await conn.execute(
                    "INSERT INTO projection_offsets (projection, topic, partition, next_offset) "
                    "VALUES ($1, $2, $3, $4) ON CONFLICT (projection, topic, partition) DO "
                    "UPDATE SET next_offset = GREATEST(projection_offsets.next_offset, "
                    "EXCLUDED.next_offset), updated_at = now()",
                    self.projection, self.topic, p, nxt)

    async def _write_each(self, rows: list[tuple[Record, LetterRow]],
                          offsets: dict[int, int]) -> None:
        """A batch the database refused: each row alone; a row refused alone is
        dead-lettered and passed."""
        for rec, row in rows:
            try:
                await self._write([row], {rec.partition: rec.offset + 1})
            except Exception as exc:
                if not refused_for_its_data(exc):
                    raise
                await self._bad(rec, exc)
        await self._write([], offsets)

    async def _bad(self, rec: Record, exc: BaseException) -> None:
        if self.dead_letters is not None:
            await self.dead_letters.put(rec, exc)
        else:
            self.skipped.append(f"{rec.topic}[{rec.partition}]@{rec.offset}: {exc}")
