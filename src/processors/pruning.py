"""Pruning the log: old records go, and only what nothing needs any more (docs/design.md §20).

The owner of partition p of ``commands`` prunes partition p of ``events`` and of the
transient topics (``commands``, ``replies``, ``ready.*``) every ``prune_every_s``. Each is
removed only as a *prefix*, with ``EventLog.delete_before`` (Kafka's DeleteRecords; the
embedded logs delete in bounded batches, oldest first): the log is shortened, never torn.

``events`` — an event at offset o goes only when every reader that may still need it is past
it (``EventNeeds``, ``events_bound``):

* **a takeover**: the partition's latest snapshot marker (``chronolog.processors.snapshots``)
  names the event a new owner reads first (the one before its ``fold_from``, whose ID it
  checks); without a snapshot nothing goes, since a takeover would fold from offset 0;
* **the audit**: the latest audit checkpoint (``chronolog.log.audit_checkpoints``) names the
  event it checks first on resuming. Without a checkpoint nothing goes unless an archive is
  kept: history is never removed unaudited and unarchived;
* **the read model**: the projectors' published offsets (``Topics.projector_group``); none
  published: nothing goes;
* **the effect runners**: their group's committed offset, when they have one;
* **the archive** (``--archive DIR``): the records are appended to it first
  (``chronolog.archive``), under a lock per partition, and only what it holds goes;
* **the window**: nothing newer than ``retention_s`` before the partition's newest record
  (log time, not the wall clock: a deployment stopped for a month keeps its window), so a
  replay of the window (``chronolog replay``) finds every event of it.

Transient topics keep what their readers may still ask for (``transient_s``: an hour, or
the retention window when that is shorter, never less than a minute; it must not be shorter
than the longest lease a worker is given): ``commands`` below the
processors' committed offset only (a command not yet decided is never lost); ``replies``
(a client waits for its reply for seconds; the reply cache a new owner restores keeps an hour)
and ``ready.*`` assignments (an assignment its worker has not read by then has had its lease
expire, and the run is retried) by age alone. A request key's idempotence does not depend on
any of them: the schedule's state holds its manual keys (``MANUAL_KEYS_KEPT``).

A process killed during a pass leaves a shorter prefix removed, and an archive whose
segments are whole (a retried range is written byte for byte again or found there): the next
pass goes on from what is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from chronolog.archive import ArchiveWriter
from chronolog.archive.format import partition_dir
from chronolog.log.audit_checkpoints import checkpoint_needs
from chronolog.log.port import EventLog, LogError, Record, Topics

log = structlog.get_logger("chronolog.pruning")

PRUNE_EVERY_S = 30.0
TRANSIENT_S = 3600.0
MIN_TRANSIENT_S = 60.0
SCAN_BATCH = 2_000  # records read at a time while looking for the window's first record
SCAN_LIMIT = 100_000  # records looked at per topic partition per pass (the next goes on)


class Unread:
    """The audit checkpoint not read yet (``Pruner.prune`` reads it)."""


UNREAD = Unread()


@dataclass(frozen=True)
class EventNeeds:
    """Partition p of ``events`` and the first offset each of its readers still needs."""

    start: int  # the partition's first record held
    end: int
    snapshot: int | None  # a takeover from the latest snapshot; None: no snapshot
    checkpoint: int | None  # the audit's latest checkpoint; None: none saved
    projector: int | None  # the projectors' published offset; None: none published
    effects: int | None  # the effect runners' committed offset; None: no runner ever
    archive: int | None  # the archive's end; None: no archive kept
    window: int  # the first record inside the retention window


def events_bound(n: EventNeeds) -> tuple[int, str]:
    """The offset below which partition p of ``events`` may go, and the need that holds it
    there (the bound is never below ``start``: nothing is restored by pruning)."""
    limits: list[tuple[int, str]] = [
        (0 if n.snapshot is None else n.snapshot, "snapshot"),
        (0 if n.projector is None else n.projector, "projector"),
    ]
    if n.checkpoint is not None:
        limits.append((n.checkpoint, "audit checkpoint"))
    elif n.archive is None:
        limits.append((0, "audit checkpoint"))
    if n.effects is not None:
        limits.append((n.effects, "effect runners"))
    if n.archive is not None:
        limits.append((n.archive, "archive"))
    # last: a tie names the reader that needs the events
    limits += [(n.window, "retention window"), (n.end, "end")]
    bound, why = min(limits, key=lambda lim: lim[0])
    return max(bound, n.start), why


@dataclass
class PruneStats:
    passes: int = 0
    failures: int = 0
    deleted: dict[str, int] = field(default_factory=dict)  # topic -> records removed
    archived: int = 0  # events appended to the archive
    held_by: dict[int, str] = field(default_factory=dict)  # partition -> what holds events


class ArchiveBusy(LogError):
    """Another process is appending to this partition's archive: this pass skips it."""


@contextlib.contextmanager
def _partition_lock(directory: Path, partition: int) -> Iterator[None]:
    """One archive writer per partition at a time, across processes (a former owner's
    pass still running while the new owner's begins): an advisory flock, never waited for
    on the event loop."""
    folder = directory / partition_dir(partition)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "writer.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ArchiveBusy(f"the archive of partition {partition} is being written by "
                              "another process") from None
        yield
    finally:
        os.close(fd)


class Pruner:
    """Prunes the partitions one processor owns (module docstring)."""

    def __init__(self, log_: EventLog, *, retention_s: float, archive: str | Path | None = None,
                 transient_s: float = TRANSIENT_S, min_transient_s: float = MIN_TRANSIENT_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.log = log_
        self.topics: Topics = log_.topics
        self.retention_s = retention_s
        self.archive = None if archive is None else Path(archive)
        # an hour, or the retention window when that is shorter (never under a minute):
        # a log kept for two minutes is not kept for an hour by its transient topics
        self.transient_s = min(transient_s, max(retention_s, min_transient_s))
        self.clock = clock
        self.stats = PruneStats()
        self._ready: tuple[float, list[str]] | None = None

    async def prune(self, partition: int, snapshot: int | None,
                    checkpoint: dict[int, int] | Unread | None = UNREAD) -> None:
        """One pass over partition ``partition``: ``events`` (``snapshot``: the first offset
        a takeover from its latest snapshot reads; ``checkpoint``: the audit checkpoint's
        needs, when the caller read them once for several partitions), then the transient
        topics."""
        self.stats.passes += 1
        await self.prune_events(partition, snapshot, checkpoint)
        await self.prune_transient(partition)

    async def checkpoint(self) -> dict[int, int] | None:
        """The audit checkpoint's needs (``checkpoint_needs``): read once per pass."""
        return await checkpoint_needs(self.log)

    async def needs(self, partition: int, snapshot: int | None,
                    checkpoint: dict[int, int] | Unread | None = UNREAD) -> EventNeeds:
        t, lg = self.topics, self.log
        topic = t.events
        start = await lg.start_offset(topic, partition)
        end = await lg.end_offset(topic, partition)
        if isinstance(checkpoint, Unread):
            checkpoint = await self.checkpoint()
        archived: int | None = None
        if self.archive is not None:
            archived = await asyncio.to_thread(self._archived_end, partition)
        needs = EventNeeds(
            start, end, snapshot,
            None if checkpoint is None else checkpoint.get(partition, 0),
            await lg.committed(t.projector_group, topic, partition),
            await lg.committed(t.effects_group, topic, partition),
            archived, end)
        # the window is looked for only below what the other needs allow (the archive can
        # take what they allow): no record is read when nothing may go
        limit, _ = events_bound(replace(needs, archive=None if archived is None else end))
        if limit <= start:
            return needs  # held by another need (the window is not what holds it)
        return replace(needs, window=await self._window(topic, partition, start, limit,
                                                        self.retention_s))

    async def prune_events(self, partition: int, snapshot: int | None,
                           checkpoint: dict[int, int] | Unread | None = UNREAD) -> int:
        """Archive (when kept) and remove what nothing needs; the start after."""
        needs = await self.needs(partition, snapshot, checkpoint)
        if self.archive is not None:
            # what the other needs allow goes to the archive first
            target, _ = events_bound(replace(needs, archive=needs.end))
            if target > needs.start:
                await self._archive(partition, needs.start, target)
                needs = replace(needs, archive=await asyncio.to_thread(
                    self._archived_end, partition))
        bound, why = events_bound(needs)
        self.stats.held_by[partition] = why
        if bound <= needs.start:
            return needs.start
        after = await self.log.delete_before(self.topics.events, partition, bound)
        self._count(self.topics.events, after - needs.start)
        log.info("events_pruned", partition=partition, below=bound, held_by=why)
        return after

    async def prune_transient(self, partition: int) -> None:
        t = self.topics
        decided = await self.log.committed(t.processor_group, t.commands, partition)
        topics: list[tuple[str, int | None]] = [(t.commands, decided or 0), (t.replies, None)]
        topics += [(name, None) for name in await self._ready_topics()]
        for topic, limit in topics:
            try:
                if partition >= await self.log.partitions_for(topic):
                    continue
            except LogError:
                continue
            start = await self.log.start_offset(topic, partition)
            end = await self.log.end_offset(topic, partition)
            upto = end if limit is None else min(end, limit)
            bound = await self._window(topic, partition, start, upto, self.transient_s)
            if bound > start:
                after = await self.log.delete_before(topic, partition, bound)
                self._count(topic, after - start)

    async def _ready_topics(self) -> list[str]:
        """The ``ready.*`` topics, listed at most once a minute (a metadata request)."""
        now = time.monotonic()
        if self._ready is None or now - self._ready[0] > 60.0:
            names = [name for name in await self.log.prefixed_topics()
                     if name.startswith(f"{self.topics.prefix}ready.")]
            self._ready = (now, names)
        return self._ready[1]

    def _count(self, topic: str, n: int) -> None:
        self.stats.deleted[topic] = self.stats.deleted.get(topic, 0) + max(0, n)

    async def _window(self, topic: str, partition: int, start: int, limit: int,
                      keep_s: float) -> int:
        """The first offset in [start, limit) whose record is younger than ``keep_s`` before
        the partition's newest record (``limit`` when none is; at most ``SCAN_LIMIT``
        records are looked at)."""
        if limit <= start:
            return start
        newest = await self._newest_ms(topic, partition)
        if newest is None:
            return start
        cutoff = newest - int(keep_s * 1000)
        offset, seen = start, 0
        while offset < limit and seen < SCAN_LIMIT:
            recs = await self.log.read(topic, partition, offset, max_records=SCAN_BATCH)
            recs = [r for r in recs if r.offset < limit]
            if not recs:  # only transaction markers (Kafka) are left below the limit
                return limit
            for r in recs:
                if r.timestamp_ms > cutoff:
                    return r.offset
            seen += len(recs)
            offset = recs[-1].offset + 1
        return min(offset, limit)

    async def _newest_ms(self, topic: str, partition: int) -> int | None:
        end = await self.log.end_offset(topic, partition)
        back = 1
        while back <= 64:
            recs = await self.log.read(topic, partition, max(0, end - back), max_records=back)
            if recs:
                return recs[-1].timestamp_ms
            if end - back <= 0:
                return None
            back *= 4
        return None

    def _archived_end(self, partition: int) -> int:
        assert self.archive is not None
        return ArchiveWriter(self.archive, self.topics.events).archived_end(partition) or 0

    async def _archive(self, partition: int, start: int, target: int) -> None:
        """Append [archived end, target) of ``events`` to the archive (records below the log's
        start are gone: the archive of a log pruned before it was kept begins there)."""
        assert self.archive is not None
        with _partition_lock(self.archive, partition):
            writer = await asyncio.to_thread(ArchiveWriter, self.archive, self.topics.events)
            archived = writer.archived_end(partition)
            offset = start if archived is None or archived < start else archived
            while offset < target:
                got = await self.log.read(self.topics.events, partition, offset,
                                          max_records=SCAN_BATCH)
                recs = [r for r in got if r.offset < target]
                if not recs:
                    break
                # a segment ends at the target once a record at or past it was seen (what is
                # between are transaction markers, Kafka), else after its last record
                end = target if len(recs) < len(got) else recs[-1].offset + 1
                await asyncio.to_thread(self._append, writer, partition, recs, offset, end)
                self.stats.archived += len(recs)
                offset = end

    @staticmethod
    def _append(writer: ArchiveWriter, partition: int, recs: list[Record], start: int,
                end: int) -> None:
        writer.append(partition, recs, start=start, end=end)
