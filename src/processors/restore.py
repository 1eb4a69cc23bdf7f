"""Restore: how a processor rebuilds a partition it takes over (docs/design.md §14).

From the partition's snapshot on ``state`` plus the tail of ``events`` after it, or —
without a usable snapshot, or with snapshots off — by folding ``events`` from offset 0;
then the task's timers, the READY runs waiting for a seat, the LEASED runs holding one, and
the reply cache from the tail of ``replies``. A ``Takeover`` records how it went.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from chronolog.archive.source import ArchivedHistory
from chronolog.domain import codec
from chronolog.environment import gc_paused, utc_now
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog, LogError, LogUnavailable, LogUnsafe, Record
from chronolog.log.reading import Readable, read_partition
from chronolog.processors.config import ProcessorConfig, ProcessorStats
from chronolog.processors.partition_task import PartitionTask
from chronolog.processors.snapshots import (
    Folder,
    Loaded,
    SnapshotRejected,
    SnapshotWriter,
    decode_snapshot_async,
)

log = structlog.get_logger("chronolog.processor")

RESTORE_SWEEP_EVENTS = 50_000  # events folded between two young collections (``_fold``)


@dataclass
class Takeover:
    """How one partition was taken over (``Processor.takeovers``)."""

    partition: int
    assigned_at: float  # time.monotonic() when the assignment arrived
    restored_at: float = 0.0  # ... when states and replies were rebuilt
    from_snapshot: bool = False
    rejected: str | None = None  # why a snapshot there was ignored
    snapshot_records: int = 0  # records read from the state topic
    states: int = 0
    cold: int = 0  # of them, held cold (their sealed bytes: ``ScheduleStore``)
    cooled: int = 0  # states cooled during the fold (``ProcessorConfig.restore_hot_max``)
    hot_peak: int = 0  # the most states hot at once during the fold (after each read)
    tail_events: int = 0  # events folded (the tail after the snapshot, or all of them)
    events_offset: int = 0



class Restorer:
    """Restores the partitions one processor takes over."""

    def __init__(self, log_: EventLog, topics: Any, config: ProcessorConfig,
                 stats: ProcessorStats, dead_letters: DeadLetters, member_id: str,
                 clock: Callable[[], datetime] = utc_now) -> None:
        self.log = log_
        self.clock = clock
        self.topics = topics
        self.config = config
        self.stats = stats
        self.dead_letters = dead_letters
        self.member_id = member_id
        self._snapshots: bool | None = None  # the state topic is usable (checked once)


    async def restore(self, ps: PartitionTask, takeover: Takeover | None = None) -> None:
        """Rebuild partition p's states: from its snapshot on ``state`` plus the tail of
        ``events`` after it, or — no usable snapshot, or snapshots off — by folding ``events``
        from offset 0 (docs/design.md §14); then its timers, dispatch queue and replies."""
        takeover = takeover or Takeover(ps.partition, time.monotonic())
        if not self.config.gc_tuning:
            await self.rebuild(ps, takeover)
            return
        with gc_paused():
            await self.rebuild(ps, takeover)
            # the restored states are long-lived: out of every collection from now on (the
            # first one after the pause would traverse them all: 5 us a state)
            gc.freeze()

    async def rebuild(self, ps: PartitionTask, takeover: Takeover) -> None:
        p = ps.partition
        snapshots = await self.snapshots_usable()
        loaded: Loaded | None = None
        if snapshots:
            events_end = await self.log.end_offset(self.topics.events, p)
            try:
                loaded = await self._load_snapshot(ps, events_end, takeover)
                if loaded is not None:
                    folded = await self._fold(ps, loaded, takeover)
            except SnapshotRejected as exc:
                self._rejected(p, str(exc), takeover)
                ps.states, ps.quotas = ps.new_states(), {}
                loaded = None
        if loaded is None:
            folded = await self._fold(ps, None, takeover, await self._whole_history(p))
            self.stats.restored_from_zero += 1
        else:
            takeover.from_snapshot = True
            self.stats.restored_from_snapshot += 1
        dirty, log_end, last_event = folded
        ps.events_offset = log_end
        takeover.states = len(ps.states)
        takeover.events_offset = log_end
        # the cold states whose wake-up is near (or passed, in the gap before the take-over:
        # ``resume`` finds them armed) are warmed now; the hot ones are armed and seated
        now = self.clock()
        warmed = ps.states.warm(now, 5000)
        while warmed:
            await asyncio.sleep(0)  # in slices: the group's heartbeats go on
            warmed = ps.states.warm(now, 5000)
        takeover.cold = ps.states.cold
        for i, (key, st) in enumerate(ps.states.hot_items()):
            if i % 5000 == 4999:
                await asyncio.sleep(0)  # the group's heartbeats go on (100k states: ~1 s)
            ps.arm(key, st)
            ps.seat_runs(key, st)
        for key, qs in ps.quotas.items():
            ps.arm_at(key, ps.aggregates.quota.wakeup(qs))
        await self._restore_replies(ps)
        if snapshots:
            cfg = self.config
            ps.snap = SnapshotWriter(
                p, self.topics.state, self.member_id, ps.owner.epoch,
                interval_s=cfg.snapshot_interval_s,
                busy_interval_s=cfg.snapshot_busy_interval_s, events=cfg.snapshot_events,
                chunk=max(1, cfg.snapshot_chunk), dirty=dirty,
                specs=set() if loaded is None else loaded.specs, log_end=log_end,
                last_event=last_event, fold_from=0 if loaded is None else loaded.fold_from,
                marker_last=None if loaded is None else loaded.last_event,
                marked=loaded is not None)
            if loaded is None and dirty:
                # folded from 0: no snapshot of these states yet — the first round goes
                # now (after a snapshot, the tail's states wait for the usual interval)
                ps.snap.start_now()

    async def snapshots_usable(self) -> bool:
        """Whether snapshots are on and the log has a ``state`` topic like ``events``.

        Decided once per process, from an answer of the log: a log that does not answer
        (``LogUnavailable``) fails this takeover, which is tried again, instead of turning
        snapshots off for the life of the process (every later takeover would fold from 0)."""
        if self._snapshots is None:
            usable = False
            if self.config.snapshots:
                try:
                    n = await self.log.partitions_for(self.topics.state)
                    events = await self.log.partitions_for(self.topics.events)
                except LogUnavailable:
                    raise
                except LogError as exc:
                    log.warning("snapshots_off", reason=f"no state topic: {exc}")
                else:
                    if n == events:
                        usable = True
                    else:
                        log.warning("snapshots_off", reason=f"the state topic has {n} "
                                    f"partitions, events {events}")
            self._snapshots = usable
        return self._snapshots

    async def _load_snapshot(self, ps: PartitionTask, events_end: int,
                             takeover: Takeover) -> Loaded | None:
        """Partition p of ``state``, read whole and decoded into ``ps``'s (empty) store,
        its quiet schedules cold (None: no snapshot there)."""
        records: list[Record] = []
        async for recs in read_partition(self.log, self.topics.state, ps.partition, 0,
                                         batch=self.config.state_read_batch):
            records.extend(recs)
        takeover.snapshot_records = len(records)
        return await decode_snapshot_async(records, events_end, ps.states)

    def _rejected(self, p: int, reason: str, takeover: Takeover) -> None:
        self.stats.snapshots_rejected += 1
        takeover.rejected = reason
        log.warning("snapshot_rejected", partition=p, reason=reason,
                    detail="folding events from offset 0")

    async def _whole_history(self, p: int) -> Readable:
        """Where partition p's events are read from offset 0: the log, or — once pruned —
        the archive below its archived end (``ArchivedHistory``). ``LogUnsafe`` when the
        log was pruned and no archive covers what went: folding what is left would build
        wrong states, so the partition is not taken over (its readiness says why)."""
        start = await self.log.start_offset(self.topics.events, p)
        if start == 0:
            return self.log
        why = (f"partition {p} of events was pruned below offset {start} and has no usable "
               "snapshot")
        if self.config.archive is None:
            raise LogUnsafe(f"{why}; restoring it needs the archive (--archive)")
        history = ArchivedHistory(self.config.archive, self.log)
        entries = history.entries(p)
        if not entries or entries[0].start != 0 or history.archived_end(p) < start:
            raise LogUnsafe(f"{why}, and the archive does not hold offsets 0 to {start}")
        return history

    async def _fold(
        self, ps: PartitionTask, loaded: Loaded | None, takeover: Takeover,
        source: Readable | None = None,
    ) -> tuple[set[str], int, tuple[int, str] | None]:
        """Fold partition p of ``events`` into ``ps`` (``Folder``): onto ``loaded`` (a
        snapshot), or from offset 0. Returns the keys whose states are not on ``state`` as
        they are, the offset after the last event, and that event's (offset, ID). Raises
        ``SnapshotRejected`` when the snapshot does not fit the log (before folding any)."""
        folder = Folder(ps.aggregates, loaded, ps.routing, into=ps.new_states())
        ps.states, ps.quotas = folder.states, folder.quotas
        offset = folder.start
        unswept = 0
        async for recs in read_partition(source or self.log, self.topics.events, ps.partition,
                                         offset, batch=self.config.restore_chunk):
            for rec in recs:
                try:
                    env = codec.decode_event(rec.value)
                except Exception as exc:  # noqa: BLE001 - a poison record must not stop us
                    folder.undecodable(rec.offset)
                    await self.dead_letters.put(rec, exc)
                    continue
                try:
                    folder.feed(rec.offset, env)
                except SnapshotRejected:
                    raise
                except Exception as exc:  # noqa: BLE001 - a poison record must not stop us
                    await self.dead_letters.put(rec, exc)
            offset = recs[-1].offset + 1
            unswept += len(recs)
            await self._bound_hot(ps, takeover)
            if unswept >= RESTORE_SWEEP_EVENTS and not gc.isenabled():
                # collection is paused for the restore (``gc_paused``), but a long fold's
                # reads leave cyclic garbage (the Kafka client's fetches): 1.7 million events
                # held 3.9 GiB without this. A young collection sweeps what was allocated
                # since the last one (the states it keeps are moved out of young ones)
                unswept = 0
                gc.collect(1)
            # a read of records the reader fetched already does not suspend: without this a
            # long fold would hold the event loop (the group's heartbeats) from start to end
            await asyncio.sleep(0)
        dirty, last_event = folder.finish()
        if folder.routing is not None:
            ps.routing = folder.routing
        takeover.tail_events = folder.folded
        return dirty, max(offset, folder.fold_from), last_event

    async def _bound_hot(self, ps: PartitionTask, takeover: Takeover) -> None:
        """Cool the idle states the fold touched once more than ``restore_hot_max`` are hot
        (a state folded again later is hydrated again by ``get``), ``cool_per_step`` at a
        time with a turn of the event loop between: cooling 50,000 states at once held the
        loop for seconds on a loaded machine — longer than a SQLite group's session, so the
        processor fell out of its group in the middle of its take-overs, and a group of
        processors starting on 10 million schedules handed partitions round and round."""
        states = ps.states
        takeover.hot_peak = max(takeover.hot_peak, states.hot)
        if states.hot <= self.config.restore_hot_max:
            return
        while states.cooling:
            cooled = len(states.cool(self.clock(), self.config.cool_per_step))
            takeover.cooled += cooled
            self.stats.cooled += cooled
            await asyncio.sleep(0)

    async def _restore_replies(self, ps: PartitionTask) -> None:
        topic = self.topics.replies
        end = await self.log.end_offset(topic, ps.partition)
        start = max(0, end - self.config.reply_cache_size)
        async for recs in read_partition(self.log, topic, ps.partition, start, end):
            for rec in recs:
                try:
                    cid = rec.key.decode() if rec.key else codec.decode_reply(rec.value).command_id
                except Exception as exc:  # noqa: BLE001 - not a reply: it answers nothing
                    await self.dead_letters.put(rec, exc)
                    continue
                ps.replies[cid] = (rec.timestamp_ms / 1000.0, rec.value)
        while len(ps.replies) > self.config.reply_cache_size:
            ps.replies.popitem(last=False)
