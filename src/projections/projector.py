"""The live projector: ``events`` (committed reads) -> PostgreSQL read model, exactly once.

``Projector(log, store)`` reads every partition of the ``events`` topic itself, through the
EventLog port (``log.read(topic, p, offset, max_records, timeout_ms)``: read_committed on
Kafka, the only kind of record SQLite stores), starting from the offsets stored in
PostgreSQL (``store.offsets()``) — never from Kafka consumer-group offsets. The read model
is the only place its progress lives (docs/design.md §9), so a row change and the
offset that produced it can never disagree.

One *pass*:

1. read up to ``batch_max`` events across the partitions (each partition from its next
   offset, ``batch_max / P`` records at most, the reads run concurrently; when the previous
   pass found nothing the reads wait up to ``idle_ms`` for new records instead of spinning,
   and the pass takes the first partition's records to come while the other reads go on
   waiting: an idle projector keeps one read per partition waiting, not a pass every
   ``idle_ms``);
2. decode each record (``codec.decode_event``) and fold the batch with the pure
   ``project_batch`` (both while the previous batch is being written) — partition order is
   kept; across partitions order does not matter because every row (schedule, run, attempt,
   effect) belongs to one aggregate, i.e. to one partition at a time. A key moved to
   another partition (docs/design.md §18) is kept in order by the *move barrier*
   (``chronolog.domain.barrier``, docs/design.md §9): a partition is cut before a
   ``KeyMovedIn`` until its old home's ``HandedOver`` of that version is applied
   (``projection_offsets.handed_over``, written with the offsets), and not read meanwhile;
3. ``store.apply(changes, {(topic, p): (expected, new)})``: the row changes and the new
   offsets commit in ONE PostgreSQL transaction, guarded by the expected offsets.

While ``run`` runs it holds the schema's *projection lease*, a shared PostgreSQL advisory
lock (``chronolog.projections.lease``): ``chronolog replay`` will not replace tables a
projector is writing, and a projector started during a replay waits until the rebuilt tables
are in place, then goes on from their offsets. ``step`` and ``run_until_caught_up`` (tests,
tools) take no lease.

An ``OffsetConflict`` means another projector instance (or a replay) moved the offsets: the
batch is discarded (nothing of it was written), the offsets are read again from PostgreSQL
and the loop continues from there — two projectors on one database never write an event
twice.

Alongside, ``run`` folds the ``workers`` topic (``chronolog.projections.workers``) and the
``dlq`` topic (``chronolog.projections.dead_letters``) into their tables, each from its own
offsets in ``projection_offsets`` (by the projector of partition 0 of a partitioned set).

A record that does not decode, or whose projection raises, is dead-lettered
(``chronolog.log.dead_letters``) and skipped: its offset is passed with the rest of the
batch. A batch the database refuses for its data (a value out of range, ...) is written
again one record at a time, in log order, each record with its own offset in its own
transaction: the records the database refuses alone are dead-lettered and their offsets
passed in an empty transaction, every other record is written. The dead letter is in the log
before the transaction that passes its offset, so a crash in between dead-letters it again
(one letter per key) — no record is skipped without a letter, none retried forever. A replay
(``chronolog replay``) skips the same records, so it rebuilds the same tables.

While the database is written, the next batches are already being read, decoded and
projected by a reader task (``read_ahead`` batches, default 2, in a bounded queue), so the
CPU work overlaps PostgreSQL's; on a conflict the queued batches are dropped with it.

``partitions=`` restricts a projector to some partitions of ``events``: projectors on
disjoint partition sets share one database without ever conflicting (offsets are
compare-and-set per partition, and every row belongs to one partition), which is how the
projection scales past one process's CPU. A projector over every partition (or whose set
names them) reads the partitions added to ``events`` while it runs: the count is read
again every ``discover_s``.

Retention (``chronolog.projections.retention``, docs/design.md §9): ``run`` also prunes, every
``prune_every_s`` and a bounded number of batches at a time, the rows of the runs finished
longer ago than their tenant's window (``retention=``, a ``RetentionPolicy``) before the
newest event projected (the oldest of the partitions still behind the log, while one is:
``pruning_now``), and before each pass makes the day partitions of ``runs`` and
``attempts`` of today and the next days (``ensure_partitions()``,
``chronolog.projections.partitions``); ``prune()`` is one pass (tests, tools). ``step`` and
``run_until_caught_up`` only project.

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
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.barrier import (
    Barrier,
    barrier_met,
    cut_at_barrier,
    handed_over,
    record_handovers,
)
from chronolog.environment import gc_tune, gc_untune
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog, Record
from chronolog.projections.dead_letters import DeadLetterFold
from chronolog.projections.lease import ProjectionLease
from chronolog.projections.project import project, project_batch
from chronolog.projections.retention import (
    PruneReport,
    RetentionPolicy,
    ensure_partitions,
    projected_now,
    prune,
)
from chronolog.projections.store import (
    OffsetConflict,
    PostgresProjectionStore,
    RowChanges,
    refused_for_its_data,
)
from chronolog.projections.workers import WorkerDirectory
from chronolog.settings import RULES_HEADER, RulesVersion
from chronolog.wakeup import wait_within

__all__ = ["Commit", "Projector", "ProjectorStats", "Watermark", "decode_and_project"]

log = structlog.get_logger("chronolog.projector")

DEFAULT_BATCH = 5000
DEFAULT_IDLE_MS = 1000
DEFAULT_DISCOVER_S = 2.0  # how often the projector looks for partitions added to events
DEFAULT_PRUNE_EVERY_S = 10.0  # how often finished runs past their retention are pruned
PROGRESS_EVERY_S = 5.0  # between two publications of the stored offsets on the log
PRUNE_BATCHES_PER_PASS = 20  # batches of one pruning pass (the next pass goes on)
CANCEL_AGAIN_S = 1.0  # a task that goes on after its cancellation is cancelled again after this


GC_GEN0_THRESHOLD = 50_000  # while run() is active (see chronolog.environment.gc_tune)

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
    refused_batches: int = 0  # batches the database refused, written again record by record
    barrier_waits: int = 0  # batches cut before a KeyMovedIn whose old home was not applied
    by_type: Counter[str] = field(default_factory=Counter)
    completion_rejections: Counter[str] = field(default_factory=Counter)  # by reason
    last_delay_s: float = 0.0  # commit time minus the oldest record's append time
    # partition -> the ``rules`` header of the newest event projected from it (the engine
    # and tz database of the processor that wrote it; processors_disagree() compares them)
    rules: dict[int, RulesVersion] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)

    def rules_in_use(self) -> dict[RulesVersion, list[int]]:
        """Each engine / tz database pair -> the partitions whose newest event names it."""
        out: dict[RulesVersion, list[int]] = {}
        for p, rv in sorted(self.rules.items()):
            out.setdefault(rv, []).append(p)
        return out


@dataclass
class _Batch:
    records: dict[int, list[Record]]  # the records that decoded, aligned with envelopes
    envelopes: dict[int, list[m.EventEnvelope]]
    ends: dict[int, int] = field(default_factory=dict)  # partition -> next offset after it
    dead: list[tuple[Record, BaseException]] = field(default_factory=list)  # to skip
    changes: RowChanges | None = None  # projected while the previous batch is written
    handed: dict[int, int] = field(default_factory=dict)  # partition -> HandedOver version

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.envelopes.values())


def decode_records(
    records: dict[int, list[Record]],
) -> tuple[dict[int, list[Record]], dict[int, list[m.EventEnvelope]],
           list[tuple[Record, BaseException]]]:
    """Decode records (per partition, in log order): the records kept, their envelopes, and
    the records that do not decode (with the error) — to be dead-lettered and skipped."""
    kept: dict[int, list[Record]] = {}
    envelopes: dict[int, list[m.EventEnvelope]] = {}
    dead: list[tuple[Record, BaseException]] = []
    for p, recs in records.items():
        for rec in recs:
            try:
                env = codec.decode_event(rec.value)
            except Exception as exc:  # noqa: BLE001 - any undecodable record is skipped
                dead.append((rec, exc))
                continue
            kept.setdefault(p, []).append(rec)
            envelopes.setdefault(p, []).append(env)
    return kept, envelopes, dead


def decode_and_project(
    records: dict[int, list[Record]],
) -> tuple[dict[int, list[Record]], dict[int, list[m.EventEnvelope]], RowChanges,
           list[tuple[Record, BaseException]]]:
    """Decode and project records (per partition, in log order): the records kept, their
    envelopes, their folded row changes, and the records that do not decode or project
    (with the error) — to be dead-lettered and skipped."""
    return project_decoded(*decode_records(records))


def project_decoded(
    kept: dict[int, list[Record]], envelopes: dict[int, list[m.EventEnvelope]],
    dead: list[tuple[Record, BaseException]],
) -> tuple[dict[int, list[Record]], dict[int, list[m.EventEnvelope]], RowChanges,
           list[tuple[Record, BaseException]]]:
    """Project decoded records (``decode_records``): the records kept, their envelopes, their
    folded row changes, and the records to skip, with those whose projection raises."""
    try:
        return kept, envelopes, project_batch(_chain(envelopes.values())), dead
    except Exception:  # noqa: BLE001 - find the records whose projection raises
        pass
    changes = RowChanges()
    for p in list(envelopes):
        pairs = list(zip(kept.pop(p), envelopes.pop(p), strict=True))
        for rec, env in pairs:
            try:
                one = project(env)
            except Exception as exc:  # noqa: BLE001 - skipped like an undecodable record
                dead.append((rec, exc))
                continue
            changes.merge(one)
            kept.setdefault(p, []).append(rec)
            envelopes.setdefault(p, []).append(env)
    return kept, envelopes, changes, dead


def cut_batch(
    read: dict[int, list[Record]], kept: dict[int, list[Record]],
    envelopes: dict[int, list[m.EventEnvelope]], dead: list[tuple[Record, BaseException]],
    handovers: Mapping[int, int],
) -> dict[int, tuple[int, Barrier]]:
    """Cut each partition of a decoded batch before its first ``KeyMovedIn`` whose old home's
    handover is not among ``handovers`` (the ones applied, or in batches applied before
    this one: docs/design.md §9, the move barrier). ``read``, ``kept``, ``envelopes`` and
    ``dead`` are cut in place; returns partition -> (offset of the ``KeyMovedIn``, its
    barrier) for the partitions cut."""
    held: dict[int, tuple[int, Barrier]] = {}
    for p, envs in list(envelopes.items()):
        n, barrier = cut_at_barrier(envs, handovers)
        if barrier is None:
            continue
        offset = kept[p][n].offset
        held[p] = (offset, barrier)
        kept[p], envelopes[p] = kept[p][:n], envs[:n]
        read[p] = [r for r in read[p] if r.offset < offset]
        for side in (read, kept, envelopes):
            if not side[p]:
                del side[p]
    if held:
        dead[:] = [(r, e) for r, e in dead
                   if r.partition not in held or r.offset < held[r.partition][0]]
    return held


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
        discover_s: float = DEFAULT_DISCOVER_S,
        retention: RetentionPolicy | None = None,
        prune_every_s: float = DEFAULT_PRUNE_EVERY_S,
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
        self.discover_s = discover_s
        self._discovered_at = 0.0
        # the move barrier: partition -> highest routing version whose HandedOver is applied
        # (any projector's, as far as this one knows), and the owned partitions held at a
        # KeyMovedIn: partition -> (its offset, what it waits for)
        self._handed: dict[int, int] = {}
        self._held: dict[int, tuple[int, Barrier]] = {}
        self._stopping = asyncio.Event()
        self._progress = asyncio.Condition()
        self._started = False
        self.dead_letters = DeadLetters(log_, "projector")
        # the workers and dlq topics are folded alongside (by one projector of a set)
        alongside = self._only is None or 0 in self._only
        self.workers: WorkerDirectory | None = (
            WorkerDirectory(log_, store.pool, store.projection) if alongside else None)
        self.letters: DeadLetterFold | None = (
            DeadLetterFold(log_, store.pool, store.projection) if alongside else None)
        # retention of finished runs (chronolog.projections.retention): by one projector of
        # a set too, on a timer beside the batches
        self.retention = (retention or RetentionPolicy()) if alongside else None
        self.prune_every_s = prune_every_s
        self.pruned = PruneReport()  # totals since this projector started
        self.progress_every_s = PROGRESS_EVERY_S
        self.partitions_made: list[str] = []  # day partitions this projector made

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Learn the partition count and load the stored offsets (idempotent)."""
        if self._started:
            return
        self._partitions = await self.log.partition_count(self.topic)
        self._discovered_at = time.monotonic()
        self._owned = self._mine(self._partitions)
        if not self._owned:
            raise ValueError(f"no partition of {self.topic} ({self._partitions}) to project")
        await self._load_offsets()
        self._started = True

    def _mine(self, partitions: int) -> list[int]:
        return [p for p in range(partitions) if self._only is None or p in self._only]

    async def _discover(self) -> None:
        """Follow partitions added to ``events`` while running: every ``discover_s`` the
        log's partition count is read again (not a cached one) and the partitions added
        that this projector projects are read from then on (from their stored offsets)."""
        if time.monotonic() - self._discovered_at < self.discover_s:
            return
        self._discovered_at = time.monotonic()
        n = await self.log.partition_count(self.topic)
        if n > self._partitions:
            log.info("projector_partitions_added", topic=self.topic, before=self._partitions,
                     after=n)
            self._partitions = n
            self._owned = self._mine(n)

    def stop(self) -> None:
        """Ask ``run`` to return after its current batch."""
        self._stopping.set()

    async def run(self) -> None:
        """Project until ``stop()`` (a log or database failure ends it, raised; ``run`` may
        be called again then: it goes on from the offsets stored in the database).

        It holds the schema's projection lease (``chronolog.projections.lease``) while it
        runs: a replay refuses to replace the tables meanwhile, and a run that starts while a
        replay holds the lease waits for it, then reads the offsets of the rebuilt tables."""
        lease = await ProjectionLease.shared(self.store.pool, self.store.projection,
                                             self._stopping)
        if lease is None:
            return  # stopped while waiting for a replay
        try:
            await self._run(lease)
        finally:
            await lease.release()

    async def _run(self, lease: ProjectionLease) -> None:
        if self._started:
            await self._load_offsets()
        await self.start()
        if self.retention is not None:  # today's days before the first batch lands
            try:
                await self.ensure_partitions()
            except Exception as exc:  # noqa: BLE001 - the retention timer tries again
                log.warning("projector_partitions_failed", error=repr(exc)[:500])
        stopping = asyncio.create_task(self._stopping.wait())
        members = (asyncio.create_task(self.workers.run(), name="workers-directory")
                   if self.workers is not None else None)
        letters = (asyncio.create_task(self.letters.run(), name="dead-letter-fold")
                   if self.letters is not None else None)
        pruner = (asyncio.create_task(self._prune_until_stopped(), name="retention")
                  if self.retention is not None else None)
        progress = asyncio.create_task(self._publish_progress(), name="progress")
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
                        lease.check()  # never write once the lease is gone
                        try:
                            await self._apply(batch)
                        except OffsetConflict as exc:
                            self.stats.conflicts += 1
                            log.warning("projector_offset_conflict", error=str(exc))
                            await self._load_offsets()
                            break  # read again from the offsets stored now
                finally:
                    await _cancel(reader)
        finally:
            gc_untune()
            await _cancel(stopping)
            for side in (members, letters, pruner, progress):
                if side is not None:
                    await _cancel(side)

    async def prune(self, max_batches: int | None = None) -> PruneReport:
        """One pruning pass (``chronolog.projections.retention``): the rows of the runs
        finished longer than their tenant's retention before the pruning's now
        (``pruning_now``); none while a partition behind the log has projected nothing."""
        now = await self.pruning_now()
        if now is None:
            return PruneReport()
        report = await prune(self.store.pool, self.retention or RetentionPolicy(),
                             projection=self.store.projection, topic=self.topic,
                             max_batches=max_batches, now=now)
        for name in ("runs", "attempts", "effects", "batches", "moved"):
            setattr(self.pruned, name, getattr(self.pruned, name) + getattr(report, name))
        self.pruned.days += report.days
        self.pruned.now = report.now
        return report

    async def pruning_now(self) -> datetime | None:
        """The time the live projector prunes by: the newest event projected, unless one
        of its partitions is behind the log — then the oldest last event time of those.

        A run's later events are on its own partition. Pruned by the newest time of any
        partition, a run of a partition that lags behind the others (catching up, a hot
        partition, small batches) could go before its own partition had projected the
        events after its finish — an effect intended with its result would then come back
        as a row of its own, which a replay (pruning once, at the end) never writes. By
        the times of the partitions still behind, a run goes only once its own partition
        is past its window. A lag of one record is taken as caught up: on Kafka a
        transaction's commit marker takes the last offset. None: a partition behind has
        projected nothing yet (no pruning until it has)."""
        newest = await projected_now(self.store.pool, self.store.projection, self.topic)
        behind = [p for p, n in (await self.lag()).items() if n > 1]
        if newest is None or not behind:
            return newest
        times = await self.store.pool.fetch(
            "SELECT partition, last_event_at FROM projection_offsets "
            "WHERE projection = $1 AND topic = $2 AND partition = ANY($3::integer[])",
            self.store.projection, self.topic, behind)
        known = {r["partition"]: r["last_event_at"] for r in times}
        if any(known.get(p) is None for p in behind):
            return None
        return min(newest, *(known[p] for p in behind))

    async def ensure_partitions(self) -> list[str]:
        """Make the day partitions of today and the next days that are missing
        (``chronolog.projections.partitions``); the runs partitions made."""
        now = await projected_now(self.store.pool, self.store.projection, self.topic)
        made = await ensure_partitions(self.store.pool, self.retention or RetentionPolicy(),
                                       now=now)
        self.partitions_made += made
        return made

    async def _every(self, seconds: Callable[[], float], what: str,
                     step: Callable[[], Awaitable[Any]]) -> None:
        """``step()`` every ``seconds()`` until stopped; a failure is logged (``what``) and
        tried again at the next tick — a side task never stops projecting."""
        while not self._stopping.is_set():
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - tried again at the next tick
                log.warning(what, error=repr(exc)[:500])
            with contextlib.suppress(TimeoutError):
                await wait_within(self._stopping.wait(), seconds())

    async def _prune_until_stopped(self) -> None:
        """The day partitions ahead, then ``prune`` (a bounded pass), every
        ``prune_every_s`` until stopped."""
        async def step() -> None:
            await self.ensure_partitions()
            await self.prune(PRUNE_BATCHES_PER_PASS)

        await self._every(lambda: self.prune_every_s, "projector_prune_failed", step)

    async def _publish_progress(self) -> None:
        """Every ``progress_every_s``, the offsets stored in the database as the log's group
        ``Topics.projector_group`` (``EventLog.store_offsets``): the log's pruning removes no
        event this projector has not applied (``chronolog.processors.pruning``)."""
        published: dict[int, int] = {}

        async def publish() -> None:
            changed = {(self.topic, p): n for p, n in self._offsets.items()
                       if published.get(p) != n}
            if changed:
                await self.log.store_offsets(self.log.topics.projector_group, changed)
                published.update({p: n for (_, p), n in changed.items()})

        await self._every(lambda: self.progress_every_s, "projector_progress_failed", publish)

    async def _reader(self, queue: asyncio.Queue[_Batch], start: dict[int, int]) -> None:
        """Fill ``queue`` with decoded, projected batches read from ``start`` on."""
        position = dict(start)
        # handovers applied, or in the batches queued ahead of the next one (which are
        # applied first, or dropped with it on a conflict)
        known = dict(self._handed)
        waiting: dict[int, asyncio.Task[list[Record]]] = {}  # reads that wait for records
        idle = False
        try:
            while True:
                batch = await self._read(position, self.idle_ms if idle else 0, known,
                                         waiting)
                if not batch.ends:
                    idle = True
                    # a read of records the log's client fetched already need not suspend:
                    # the loop must not hold the event loop (stop, the writer) meanwhile
                    await asyncio.sleep(0)
                    continue
                idle = False
                position.update(batch.ends)
                for p, v in batch.handed.items():
                    known[p] = max(known.get(p, 0), v)
                await queue.put(batch)
        finally:
            await _cancel_all(waiting.values())

    async def step(self, wait_ms: int = 0) -> int:
        """One pass without read-ahead (tests, tools): the number of events applied."""
        await self.start()
        waiting: dict[int, asyncio.Task[list[Record]]] = {}
        try:
            batch = await self._read(dict(self._offsets), wait_ms, dict(self._handed), waiting,
                                     first=False)
        finally:
            await _cancel_all(waiting.values())
        if not batch.ends:
            return 0
        try:
            await self._apply(batch)
        except OffsetConflict:
            self.stats.conflicts += 1
            await self._load_offsets()
            return 0
        return max(1, batch.size)  # records were passed, if only dead-lettered ones

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

    def held(self) -> dict[int, tuple[int, Barrier]]:
        """The partitions held by the move barrier: partition -> (offset of the
        ``KeyMovedIn`` it waits at, the old home's handover it waits for)."""
        return {p: (offset, b) for p, (offset, b) in self._held.items()
                if self._offsets.get(p, 0) <= offset and not barrier_met(self._handed, b)}

    async def lag(self) -> dict[int, int]:
        """Records per partition between the stored offsets and the log's end offsets (the
        partitions added to the log since included, ``_discover``)."""
        await self.start()
        await self._discover()
        out: dict[int, int] = {}
        for p in self._owned:
            end = await self.log.end_offset(self.topic, p)
            out[p] = max(0, end - self._offsets.get(p, 0))
        return out

    async def wait_for(self, required: Mapping[int, int], timeout: float) -> bool:
        """Wait (bounded) until the watermark covers ``partition -> next offset``."""
        async with self._progress:
            try:
                await wait_within(
                    self._progress.wait_for(lambda: self.watermark().reached(required)), timeout
                )
            except TimeoutError:
                return False
        return True

    # ------------------------------------------------------------------ internals

    async def _load_offsets(self) -> None:
        stored = await self.store.offsets()
        self._offsets = {p: n for (t, p), n in stored.items() if t == self.topic}
        self._handed = await self.store.handovers(self.topic)
        self._last_event_at = await self.store.pool.fetchval(
            "SELECT max(last_event_at) FROM projection_offsets WHERE projection = $1 "
            "AND topic = $2 AND partition = ANY($3::integer[])", self.store.projection,
            self.topic, self._owned)

    async def _read(self, start: dict[int, int], wait_ms: int, known: dict[int, int],
                    waiting: dict[int, asyncio.Task[list[Record]]], *, first: bool = True
                    ) -> _Batch:
        """Read, decode and project one batch, each partition from ``start``, cut at the move
        barrier: ``known`` are the handovers applied before this batch (updated from the
        database when a partition waits for one it does not know of).

        ``waiting``: the reads still in flight, by partition, kept from one call to the next
        (the caller cancels them when it stops). With ``wait_ms`` a read waits up to that
        long for records, and this returns as soon as any partition has some: the others go
        on waiting — a read per partition, not a pass per ``wait_ms``, and a partition's
        records are not held back until every other partition's wait has run out (not
        ``first``: it waits for every read). Without ``wait_ms``, the reads it starts return
        at once and are all taken (with any waiting read that has finished)."""
        await self._discover()
        reading = await self._unheld(start, known)
        for p in [p for p in waiting if p not in reading]:
            await _cancel(waiting.pop(p))  # held at the move barrier since, or no longer owned
        n = max(1, len(self._owned))
        per_partition = max(1, self.batch_max // n)
        if not reading and wait_ms:
            await asyncio.sleep(wait_ms / 1000)  # every partition waits for another's handover
        started = [p for p in reading if p not in waiting]
        for p in started:
            waiting[p] = asyncio.create_task(
                self.log.read(self.topic, p, start.get(p, 0), per_partition, wait_ms),
                name=f"projector-read-{p}")
        if waiting:
            if wait_ms:
                await asyncio.wait(waiting.values(), return_when=asyncio.FIRST_COMPLETED
                                   if first else asyncio.ALL_COMPLETED)
            elif started:
                await asyncio.wait([waiting[p] for p in started])
        done = [p for p in reading if p in waiting and waiting[p].done()]
        reads = [waiting.pop(p).result() for p in done]  # a failed read ends the reader
        read = {p: records for p, records in zip(done, reads, strict=True) if records}
        kept, envelopes, dead = decode_records(read)
        held = cut_batch(read, kept, envelopes, dead, known)
        if held:
            self.stats.barrier_waits += 1
            self._held.update(held)
        handed: dict[int, int] = {}
        for p, envs in envelopes.items():
            record_handovers(handed, p, envs)
        kept, envelopes, changes, dead = project_decoded(kept, envelopes, dead)
        return _Batch(kept, envelopes, {p: recs[-1].offset + 1 for p, recs in read.items()},
                      dead, changes, handed)

    async def _unheld(self, start: dict[int, int], known: dict[int, int]) -> list[int]:
        """The owned partitions to read now: not those held at a ``KeyMovedIn`` whose old
        home's handover is not applied. While one is held, the handovers other projectors
        applied are read again from the database (one query per pass, never per record)."""
        def waiting() -> set[int]:
            # at or before its KeyMovedIn: on Kafka a commit marker may sit just before it,
            # so the position after the records applied can be below the held offset
            return {p for p, (offset, barrier) in self._held.items()
                    if start.get(p, 0) <= offset and not barrier_met(known, barrier)}

        if waiting():
            for p, v in (await self.store.handovers(self.topic)).items():
                known[p] = max(known.get(p, 0), v)
        held = waiting()
        return [p for p in self._owned if p not in held]

    async def _apply(self, batch: _Batch) -> None:
        if not batch.ends:
            return
        await self.dead_letters.put_many(batch.dead)  # before the offsets pass them
        offsets = {(self.topic, p): (self._offsets.get(p, 0), end)
                   for p, end in batch.ends.items()}
        changes = batch.changes or project_batch(_chain(batch.envelopes.values()))
        try:
            result = await self.store.apply(
                changes, offsets, last_event_at=self._last_at(batch.envelopes),
                handed_over={(self.topic, p): v for p, v in batch.handed.items()})
        except Exception as exc:
            if not refused_for_its_data(exc):
                raise
            self.stats.refused_batches += 1
            log.warning("projector_batch_refused", error=f"{type(exc).__name__}: {exc}"[:500],
                        events=batch.size)
            await self._apply_each(batch)
            return
        await self._committed(offsets, batch.records, batch.envelopes, result)

    async def _apply_each(self, batch: _Batch) -> None:
        """Write a refused batch again one record per transaction, in log order; the
        records the database refuses alone are dead-lettered and their offsets passed."""
        for p, end in batch.ends.items():
            tp = (self.topic, p)
            for rec, env in zip(batch.records.get(p, []), batch.envelopes.get(p, []),
                                strict=True):
                offsets = {tp: (self._offsets.get(p, 0), rec.offset + 1)}
                version = handed_over(env)
                try:
                    result = await self.store.apply(
                        project(env), offsets, last_event_at={tp: env.at},
                        handed_over=None if version is None else {tp: version})
                except Exception as exc:
                    if not refused_for_its_data(exc):
                        raise
                    await self.dead_letters.put(rec, exc)
                    result = await self.store.apply(RowChanges(), offsets)
                    await self._committed(offsets, {}, {}, result)
                    continue
                await self._committed(offsets, {p: [rec]}, {p: [env]}, result)
            if self._offsets.get(p, 0) < end:  # dead-lettered records at the end
                offsets = {tp: (self._offsets.get(p, 0), end)}
                await self._committed(offsets, {}, {},
                                      await self.store.apply(RowChanges(), offsets))

    def _last_at(self, envelopes: dict[int, list[m.EventEnvelope]]
                 ) -> dict[tuple[str, int], datetime]:
        return {(self.topic, p): max(e.at for e in envs) for p, envs in envelopes.items() if envs}

    async def _committed(self, offsets: dict[tuple[str, int], tuple[int, int]],
                   records: dict[int, list[Record]], envelopes: dict[int, list[m.EventEnvelope]],
                   result: Any) -> None:
        """Bookkeeping after a transaction committed ``offsets`` and these events."""
        committed_ms = time.time() * 1000
        for (_, p), (_, new) in offsets.items():
            self._offsets[p] = new
        for p, envs in envelopes.items():
            record_handovers(self._handed, p, envs)
        for p, recs in records.items():
            rules = _rules_of(recs[-1]) if recs else None
            if rules is not None:
                self.stats.rules[p] = rules
        last_at = self._last_at(envelopes)
        if last_at:
            newest = max(last_at.values())
            if self._last_event_at is None or newest > self._last_event_at:
                self._last_event_at = newest
        size = sum(len(v) for v in envelopes.values())
        st = self.stats
        st.events += size
        st.batches += 1
        for envs in envelopes.values():
            for env in envs:
                st.by_type[env.type] += 1
                if isinstance(env.payload, m.CompletionRejected):
                    st.completion_rejections[env.payload.reason] += 1
        missing = sum(len(v) for v in result.missing.values())
        if missing:
            st.missing_rows += missing
            log.warning("projector_missing_rows",
                        rows={k: len(v) for k, v in result.missing.items()})
        append_ms = [r.timestamp_ms for recs in records.values() for r in recs]
        if append_ms:
            st.last_delay_s = max(0.0, (committed_ms - min(append_ms)) / 1000)
        async with self._progress:
            self._progress.notify_all()
        if self.on_commit:
            info = Commit(size, {p: v for (_, p), v in offsets.items()}, append_ms, committed_ms)
            for cb in self.on_commit:
                cb(info)


def _rules_of(rec: Record) -> RulesVersion | None:
    for name, value in rec.headers:
        if name == RULES_HEADER:
            return RulesVersion.parse(value)
    return None


def _chain(groups: Iterable[list[m.EventEnvelope]]) -> Iterable[m.EventEnvelope]:
    for g in groups:
        yield from g


async def _cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """``_cancel`` each of ``tasks`` (the reads left waiting when a reader stops)."""
    for task in list(tasks):
        await _cancel(task)


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for its end, cancelling it again each second it goes on: a
    library call inside it that loses a cancellation (``asyncio.wait_for`` in Python 3.11,
    which aiokafka uses) would otherwise hold the projector's stop. Its outcome is dropped; a
    cancellation of the caller is not (``asyncio.wait`` lets it through)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_AGAIN_S)
    if not task.cancelled():
        task.exception()  # retrieved: the reader's failure is raised by its own check
