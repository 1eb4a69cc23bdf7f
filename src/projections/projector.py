"""The live projector: ``events`` (committed reads) -> PostgreSQL read model, exactly once.

``Projector(log, store)`` reads every partition of the ``events`` topic itself, through the
EventLog port (``log.read(topic, p, offset, max_records, timeout_ms)``: read_committed on
Kafka, the only kind of record SQLite stores), starting from the offsets stored in
PostgreSQL (``store.offsets()``) — never from Kafka consumer-group offsets. The read model
is the only place its progress lives (KAFKA-NOTES, last section), so a row change and the
offset that produced it can never disagree.

One *pass*:

1. read up to ``batch_max`` events across the partitions (each partition from its next
   offset, ``batch_max / P`` records at most, the reads run concurrently; when the previous
   pass found nothing the reads wait up to ``idle_ms`` for new records instead of spinning);
2. decode each record (``codec.decode_event``) and fold the batch with the pure
   ``project_batch`` (both while the previous batch is being written) — partition order is kept; across partitions order does not matter
   because every row (schedule, run, attempt, effect) belongs to one aggregate, i.e. to one
   partition;
3. ``store.apply(changes, {(topic, p): (expected, new)})``: the row changes and the new
   offsets commit in ONE PostgreSQL transaction, guarded by the expected offsets.

An ``OffsetConflict`` means another projector instance (or a replay) moved the offsets: the
batch is discarded (nothing of it was written), the offsets are read again from PostgreSQL
and the loop continues from there — two projectors on one database never write an event
twice. A record that does not decode stops the projector with ``ProjectionError`` after the
batches before it committed: skipping it would make the live tables differ from a replay.

While the database is written, the next batches are already being read, decoded and
projected by a reader task (``read_ahead`` batches, default 2, in a bounded queue), so the
CPU work overlaps PostgreSQL's; on a conflict the queued batches are dropped with it.

``partitions=`` restricts a projector to some partitions of ``events``: projectors on
disjoint partition sets share one database without ever conflicting (offsets are
compare-and-set per partition, and every row belongs to one partition), which is how the
projection scales past one process's CPU.

Observability: ``watermark()`` (per-partition next offset + the authority time of the last
event applied), ``lag()`` (records between the stored offsets and the log's end offsets —
on Kafka a transaction's commit marker takes an offset too, so a caught-up partition can
show a lag of 1 until the next record), ``stats`` (events, batches, conflicts, events per
type, completion rejections per reason, the latest commit's delay behind the records'
append time), ``on_commit`` callbacks (benchmarks), and ``wait_for(positions)`` for an
in-process read-your-writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from chronolog.environment import gc_tune, gc_untune
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.port import EventLog, Record
from chronolog.projections.project import project_batch
from chronolog.projections.store import OffsetConflict, PostgresProjectionStore, RowChanges

__all__ = ["Commit", "ProjectionError", "Projector", "ProjectorStats", "Watermark"]

log = structlog.get_logger("chronolog.projector")

DEFAULT_BATCH = 5000
DEFAULT_IDLE_MS = 100


GC_GEN0_THRESHOLD = 50_000  # while run() is active (see chronolog.environment.gc_tune)

class ProjectionError(RuntimeError):
    """The projector cannot go on (a record that does not decode); earlier batches stay."""


@dataclass(frozen=True)
class Watermark:
    """How far the projection has read: next offset per partition, last event time."""

    partitions: dict[int, int]
    time: datetime | None

    def reached(self, required: Mapping[int, int]) -> bool:
        """Whether every ``partition -> next offset`` of ``required`` is covered."""
        return all(self.partitions.get(p, 0) >= n for p, n in required.items())


@dataclass(frozen=True)
class Commit:
    """One committed batch (passed to ``on_commit`` callbacks)."""

    events: int
    offsets: dict[int, tuple[int, int]]  # partition -> (expected, new)
    append_ms: list[int]  # each record's append timestamp (ms since the epoch)
    committed_ms: float  # wall clock when the transaction committed (ms since the epoch)


@dataclass
class ProjectorStats:
    """Counters since this projector started."""

    events: int = 0
    batches: int = 0
    conflicts: int = 0
    missing_rows: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    completion_rejections: Counter[str] = field(default_factory=Counter)  # by reason
    last_delay_s: float = 0.0  # commit time minus the oldest record's append time
    started_at: float = field(default_factory=time.monotonic)


@dataclass
class _Batch:
    records: dict[int, list[Record]]
    envelopes: dict[int, list[m.EventEnvelope]]
    error: str | None = None  # a record that did not decode ends the batch before it
    changes: RowChanges | None = None  # projected while the previous batch is written

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.envelopes.values())


class Projector:
    """Projects the ``events`` topic into PostgreSQL until ``stop()``."""

    def __init__(
        self,
        log_: EventLog,
        store: PostgresProjectionStore,
        *,
        batch_max: int = DEFAULT_BATCH,
        idle_ms: int = DEFAULT_IDLE_MS,
        read_ahead: int = 2,
        partitions: Iterable[int] | None = None,
    ) -> None:
        self.log = log_
        self.store = store
        self.topic = log_.topics.events
        self.batch_max = max(1, batch_max)
        self.idle_ms = max(0, idle_ms)
        self.read_ahead = max(1, read_ahead)
        self.stats = ProjectorStats()
        self.on_commit: list[Callable[[Commit], None]] = []
        self._offsets: dict[int, int] = {}
        self._last_event_at: datetime | None = None
        self._partitions = 0
        self._only = None if partitions is None else frozenset(partitions)
        self._owned: list[int] = []
        self._stopping = asyncio.Event()
        self._progress = asyncio.Condition()
        self._started = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Learn the partition count and load the stored offsets (idempotent)."""
        if self._started:
            return
        self._partitions = await self.log.partitions_for(self.topic)
        self._owned = [p for p in range(self._partitions) if self._only is None or p in self._only]
        if not self._owned:
            raise ValueError(f"no partition of {self.topic} ({self._partitions}) to project")
        await self._load_offsets()
        self._started = True

    def stop(self) -> None:
        """Ask ``run`` to return after its current batch."""
        self._stopping.set()

    async def run(self) -> None:
        """Project until ``stop()``; a ``ProjectionError`` ends it."""
        await self.start()
        stopping = asyncio.create_task(self._stopping.wait())
        gc_tune(GC_GEN0_THRESHOLD)  # batches allocate many short-lived objects
        try:
            while not self._stopping.is_set():
                # a reader task reads, decodes and projects ahead (a bounded queue) from the
                # stored offsets; this loop writes. On a conflict both start over.
                queue: asyncio.Queue[_Batch] = asyncio.Queue(maxsize=self.read_ahead)
                reader = asyncio.create_task(self._reader(queue, dict(self._offsets)))
                try:
                    while True:
                        getter = asyncio.create_task(queue.get())
                        await asyncio.wait({getter, stopping, reader},
                                           return_when=asyncio.FIRST_COMPLETED)
                        if not getter.done():
                            await _cancel(getter)
                            if reader.done():
                                reader.result()  # a read failure ends the projector
                            return  # stopping
                        batch = getter.result()
                        try:
                            await self._apply(batch)
                        except OffsetConflict as exc:
                            self.stats.conflicts += 1
                            log.warning("projector_offset_conflict", error=str(exc))
                            await self._load_offsets()
                            break  # read again from the offsets stored now
                        if batch.error is not None:
                            raise ProjectionError(batch.error)
                finally:
                    await _cancel(reader)
        finally:
            gc_untune()
            await _cancel(stopping)

    async def _reader(self, queue: asyncio.Queue[_Batch], start: dict[int, int]) -> None:
        """Fill ``queue`` with decoded, projected batches read from ``start`` on."""
        position = dict(start)
        idle = False
        while True:
            batch = await self._read(position, self.idle_ms if idle else 0)
            if batch.size == 0 and batch.error is None:
                idle = True
                continue
            idle = False
            for p, recs in batch.records.items():
                position[p] = recs[-1].offset + 1
            await queue.put(batch)
            if batch.error is not None:
                return

    async def step(self, wait_ms: int = 0) -> int:
        """One pass without read-ahead (tests, tools): the number of events applied."""
        await self.start()
        batch = await self._read(dict(self._offsets), wait_ms)
        if batch.size == 0 and batch.error is None:
            return 0
        try:
            await self._apply(batch)
        except OffsetConflict:
            self.stats.conflicts += 1
            await self._load_offsets()
            return 0
        if batch.error is not None:
            raise ProjectionError(batch.error)
        return batch.size

    async def run_until_caught_up(self, timeout: float = 30.0) -> None:
        """Apply passes until every partition reached the end offset seen at the start."""
        await self.start()
        ends = {p: await self.log.end_offset(self.topic, p) for p in self._owned}
        deadline = time.monotonic() + timeout
        while any(self._offsets.get(p, 0) < e for p, e in ends.items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"projector not caught up after {timeout}s: "
                                   f"{self._offsets} < {ends}")
            if await self.step(wait_ms=50) == 0:
                return  # nothing readable below the ends (on Kafka: only commit markers left)

    # ------------------------------------------------------------------ observability

    def watermark(self) -> Watermark:
        """Next offset per partition (0 for partitions never written) + last event time."""
        return Watermark(
            {p: self._offsets.get(p, 0) for p in self._owned}, self._last_event_at
        )

    async def lag(self) -> dict[int, int]:
        """Records per partition between the stored offsets and the log's end offsets."""
        await self.start()
        out: dict[int, int] = {}
        for p in self._owned:
            end = await self.log.end_offset(self.topic, p)
            out[p] = max(0, end - self._offsets.get(p, 0))
        return out

    async def wait_for(self, required: Mapping[int, int], timeout: float) -> bool:
        """Wait (bounded) until the watermark covers ``partition -> next offset``."""
        async with self._progress:
            try:
                await asyncio.wait_for(
                    self._progress.wait_for(lambda: self.watermark().reached(required)), timeout
                )
            except asyncio.TimeoutError:
                return False
        return True

    # ------------------------------------------------------------------ internals

    async def _load_offsets(self) -> None:
        stored = await self.store.offsets()
        self._offsets = {p: n for (t, p), n in stored.items() if t == self.topic}
        self._last_event_at = await self.store.pool.fetchval(
            "SELECT max(last_event_at) FROM projection_offsets WHERE projection = $1 "
            "AND topic = $2 AND partition = ANY($3::integer[])", self.store.projection,
            self.topic, self._owned)

    async def _read(self, start: dict[int, int], wait_ms: int) -> _Batch:
        """Read, decode and project one batch, each partition from ``start``."""
        n = max(1, len(self._owned))
        per_partition = max(1, self.batch_max // n)
        reads = await asyncio.gather(*(
            self.log.read(self.topic, p, start.get(p, 0), per_partition, wait_ms)
            for p in self._owned
        ))
        batch = _Batch({}, {})
        for p, records in zip(self._owned, reads):
            envs: list[m.EventEnvelope] = []
            kept: list[Record] = []
            for rec in records:
                try:
                    envs.append(codec.decode_event(rec.value))
                except codec.DecodeError as exc:
                    batch.error = (f"{rec.topic}[{rec.partition}]@{rec.offset} does not decode: "
                                   f"{exc}")
                    break
                kept.append(rec)
            if kept:
                batch.records[p] = kept
                batch.envelopes[p] = envs
            if batch.error is not None:
                break  # later partitions wait for the next projector start
        if batch.envelopes:
            batch.changes = project_batch(_chain(batch.envelopes.values()))
        return batch

    async def _apply(self, batch: _Batch) -> None:
        if batch.size == 0:
            return
        offsets: dict[tuple[str, int], tuple[int, int]] = {}
        last_at: dict[tuple[str, int], datetime] = {}
        for p, recs in batch.records.items():
            tp = (self.topic, p)
            offsets[tp] = (self._offsets.get(p, 0), recs[-1].offset + 1)
            last_at[tp] = max(e.at for e in batch.envelopes[p])
        changes = batch.changes or project_batch(_chain(batch.envelopes.values()))
        result = await self.store.apply(changes, offsets, last_event_at=last_at)
        committed_ms = time.time() * 1000
        # bookkeeping only after the transaction committed
        for (_, p), (_, new) in offsets.items():
            self._offsets[p] = new
        newest = max(last_at.values())
        if self._last_event_at is None or newest > self._last_event_at:
            self._last_event_at = newest
        st = self.stats
        st.events += batch.size
        st.batches += 1
        for envs in batch.envelopes.values():
            for env in envs:
                st.by_type[env.type] += 1
                if isinstance(env.payload, m.CompletionRejected):
                    st.completion_rejections[env.payload.reason] += 1
        missing = sum(len(v) for v in result.missing.values())
        if missing:
            st.missing_rows += missing
            log.warning("projector_missing_rows", rows={k: len(v) for k, v in result.missing.items()})
        append_ms = [r.timestamp_ms for recs in batch.records.values() for r in recs]
        st.last_delay_s = max(0.0, (committed_ms - min(append_ms)) / 1000) if append_ms else 0.0
        async with self._progress:
            self._progress.notify_all()
        if self.on_commit:
            info = Commit(batch.size, {p: v for (_, p), v in offsets.items()}, append_ms,
                          committed_ms)
            for cb in self.on_commit:
                cb(info)


def _chain(groups: Iterable[list[m.EventEnvelope]]) -> Iterable[m.EventEnvelope]:
    for g in groups:
        yield from g


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
