"""MemoryEventLog: the EventLog port in the memory of one process, for tests.

The third adapter of the port, beside ``SqliteEventLog`` and ``KafkaEventLog``, and held to
the same contract suite (``tests/contract/test_event_log.py``). It exists so that what is
built on the log — the processor's record pipeline, dispatch, the aggregates, clients and
workers — can be tested in one process without a database file or a broker; what only a
real log can show (crashes, other OS processes, Kafka's and SQLite's own behaviour) stays
with the integration tests on both real logs. Nothing of it survives the process, so no
setting selects it.

Several ``MemoryEventLog`` objects on one ``MemoryStore`` stand for several processes on
one log (each its own topic cache, consumers and owners; the records, offsets, owners and
group members shared).

Atomicity
    Every operation changes the store in one synchronous step (no ``await`` between its
    first and last change), and all users of a store run on one event loop: a commit, its
    ``then`` records and its consumed offsets become visible together or not at all.

Ownership and fencing
    As on SQLite: ``acquire(p)`` bumps the epoch of ``<prefix>processor-p<p>``; a commit by
    an owner whose epoch is no longer the stored one raises ``Fenced`` and changes nothing.

Consumer groups
    As on SQLite: Kafka's range assignment of each topic's partitions over the sorted ids of
    the group's members subscribed to it. A member is live from ``start`` to ``close``
    (there are no heartbeats to miss in one process). A change of membership or of a
    topic's partition count is seen by every member at its next ``getmany``, which awaits
    ``on_revoked(lost)`` then ``on_assigned(gained)`` before it returns records and starts a
    gained partition at the group's committed offset (or 0).

Compacted topics
    A topic of ``Topics.compacted`` keeps only each key's latest record: an append removes
    the key's older record, so offsets have gaps there, as on the embedded log.

Offsets are contiguous elsewhere (0, 1, 2, ...): there are no transaction markers.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from chronolog.log.partitioner import partition_for, range_assign
from chronolog.log.port import (
    Fenced,
    LogError,
    Offsets,
    OutRecord,
    PartitionOwner,
    Position,
    RebalanceCallback,
    Record,
    ThenCallback,
    Topics,
    refuse_deletion,
)

__all__ = ["MemoryEventLog", "MemoryGroupConsumer", "MemoryPartitionOwner", "MemoryStore"]

TP = tuple[str, int]


@dataclass
class _Partition:
    """One partition's records, oldest first, and the offset the next one gets."""

    records: list[Record] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # records' offsets, for bisect
    next_offset: int = 0

    def add(self, record: Record, compacted: bool) -> None:
        if compacted:  # the key's older record goes: each key keeps its latest value only
            for i, old in enumerate(self.records):
                if old.key == record.key:
                    del self.records[i], self.offsets[i]
                    break
        self.records.append(record)
        self.offsets.append(record.offset)
        self.next_offset = record.offset + 1

    def start(self) -> int:
        return self.offsets[0] if self.offsets else self.next_offset

    def delete_before(self, offset: int) -> None:
        i = bisect.bisect_left(self.offsets, offset)
        del self.records[:i], self.offsets[:i]

    def read(self, offset: int, limit: int) -> list[Record]:
        i = bisect.bisect_left(self.offsets, offset)
        return self.records[i:i + limit]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class MemoryStore:
    """What the processes of one in-memory log share: topics, records, group offsets, owner
    epochs and group members."""

    def __init__(self) -> None:
        self.topics: dict[str, list[_Partition]] = {}
        self.compacted: set[str] = set()
        self.group_offsets: dict[tuple[str, str, int], int] = {}
        self.epochs: dict[str, tuple[int, str]] = {}  # owner name -> (epoch, owner id)
        self.members: dict[str, dict[str, MemoryGroupConsumer]] = {}  # group -> id -> member
        self.generation = 0  # moves with membership and partition counts: members rebalance
        self._waiters: set[asyncio.Future[None]] = set()

    def changed(self) -> None:
        """Wake every reader waiting for a write (each then looks at what it waits for)."""
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            _wake(fut)

    async def wait(self, timeout_s: float) -> None:
        """Until the next change, at most ``timeout_s``.

        A future and a timer rather than ``asyncio.wait_for``: on Python 3.11 ``wait_for``
        loses a cancellation that arrives as the awaited event is set (writes here wake
        readers at once, so that happens), and a client's close() then hung on a reply
        reader that went on polling."""
        if timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.add(fut)
        timer = loop.call_later(timeout_s, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiters.discard(fut)

    def partitions(self, topic: str) -> list[_Partition]:
        parts = self.topics.get(topic)
        if parts is None:
            raise LogError(f"unknown topic {topic!r} (call ensure_topics first)")
        return parts

    def partition(self, topic: str, partition: int) -> _Partition:
        parts = self.partitions(topic)
        if not 0 <= partition < len(parts):
            raise LogError(f"partition {partition} out of range for {topic!r} "
                           f"({len(parts)} partitions)")
        return parts[partition]

    def create(self, topic: str, partitions: int, compacted: bool = False) -> int:
        parts = self.topics.get(topic)
        if parts is None:
            if compacted:  # marked with its creation, never after records exist
                self.compacted.add(topic)
            parts = self.topics[topic] = [_Partition() for _ in range(partitions)]
            self.generation += 1
        return len(parts)

    def grow(self, topic: str, partitions: int) -> int:
        parts = self.partitions(topic)
        if partitions > len(parts):
            parts.extend(_Partition() for _ in range(partitions - len(parts)))
            self.generation += 1
            self.changed()
        return len(parts)

    def stage(self, records: Sequence[OutRecord],
              ends: dict[TP, int]) -> list[tuple[Position, OutRecord]]:
        """Where ``records`` would land, given the next offsets ``ends`` already staged
        (updated); nothing is written yet."""
        out: list[tuple[Position, OutRecord]] = []
        for rec in records:
            parts = self.partitions(rec.topic)
            if rec.partition is not None:
                self.partition(rec.topic, rec.partition)  # in range
                p = rec.partition
            elif rec.key is not None:
                p = partition_for(rec.key, len(parts))
            else:
                p = random.randrange(len(parts))
            if rec.topic in self.compacted and rec.key is None:
                raise LogError(f"a record for the compacted topic {rec.topic!r} needs a key")
            tp = (rec.topic, p)
            off = ends.get(tp, parts[p].next_offset)
            ends[tp] = off + 1
            out.append((Position(rec.topic, p, off), rec))
        return out

    def write(self, staged: Sequence[tuple[Position, OutRecord]]) -> None:
        ts = time.time_ns() // 1_000_000
        for pos, rec in staged:
            self.topics[pos.topic][pos.partition].add(
                Record(pos.topic, pos.partition, pos.offset, rec.key, rec.value,
                       tuple(rec.headers), ts),
                pos.topic in self.compacted)

    def fenced(self, name: str, epoch: int) -> Fenced | None:
        held = self.epochs.get(name)
        if held is not None and held[0] == epoch:
            return None
        current = "none" if held is None else f"epoch {held[0]} held by {held[1]!r}"
        return Fenced(f"{name} epoch {epoch} was fenced ({current})")

    def commit(self, owner: MemoryPartitionOwner, records: Sequence[OutRecord],
               consumed: Offsets, group: str, then: ThenCallback | None) -> list[Position]:
        """One owner's commit, all or nothing (no await inside: nothing runs between)."""
        fenced = self.fenced(owner.name, owner.epoch)
        if fenced is not None:
            raise fenced
        ends: dict[TP, int] = {}
        staged = self.stage(records, ends)
        if then is not None:
            late = then([pos for pos, _ in staged])
            if late:
                staged += self.stage(late, ends)
        self.write(staged)
        for (topic, p), offset in consumed.items():
            self.group_offsets[(group, topic, int(p))] = int(offset)
        return [pos for pos, _ in staged]


class MemoryPartitionOwner:
    """The single writer of input partition ``partition`` at ``epoch``."""

    def __init__(self, log: MemoryEventLog, partition: int, epoch: int, owner_id: str) -> None:
        self._log = log
        self.partition = partition
        self.epoch = epoch
        self.owner_id = owner_id
        self.name = log.owner_name(partition)
        self._closed = False

    async def commit(
        self,
        records: Sequence[OutRecord],
        consumed: Offsets,
        group: str,
        then: ThenCallback | None = None,
    ) -> list[Position]:
        if self._closed:
            raise LogError(f"{self.name} owner is closed")
        positions = self._log.store.commit(self, records, consumed, group, then)
        self._log.store.changed()
        return positions

    async def close(self) -> None:
        self._closed = True



class MemoryGroupConsumer:
    """A consumer group member over the store's member table (see the module docstring)."""

    def __init__(
        self,
        log: MemoryEventLog,
        group: str,
        topics: Sequence[str],
        member_id: str,
        on_assigned: RebalanceCallback | None,
        on_revoked: RebalanceCallback | None,
    ) -> None:
        self._log = log
        self.group = group
        self.topics = sorted(set(topics))
        self.member_id = member_id
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._assigned: set[TP] = set()
        self._positions: dict[TP, int] = {}
        self._generation = -1  # the store's generation this member's assignment is for
        self._rotation = 0
        self._started = False
        self._closed = False

    async def start(self) -> None:
        if self._started:
            return
        store = self._log.store
        for topic in self.topics:
            store.partitions(topic)  # fail fast on unknown topics
        store.members.setdefault(self.group, {})[self.member_id] = self
        store.generation += 1
        store.changed()
        self._started = True
        await self._rebalance()

    def _compute_assignment(self) -> set[TP]:
        store = self._log.store
        members = store.members.get(self.group, {})
        mine: set[TP] = set()
        for topic in self.topics:
            ids = sorted(m for m, c in members.items() if topic in c.topics)
            n = len(store.partitions(topic))
            mine.update((topic, p) for p in range_assign(ids, n)[self.member_id])
        return mine

    async def _rebalance(self) -> None:
        """Catch up with the store's generation; callbacks may let other members change it
        meanwhile, so repeat until this member's assignment is for the current one."""
        store = self._log.store
        while self._generation != store.generation and not self._closed:
            self._generation = store.generation
            new = self._compute_assignment()
            lost = self._assigned - new
            gained = new - self._assigned
            if lost:
                self._assigned -= lost
                for tp in lost:
                    self._positions.pop(tp, None)
                if self._on_revoked is not None:
                    await self._on_revoked(set(lost))
            if gained:
                for topic, p in gained:
                    self._positions[(topic, p)] = store.group_offsets.get(
                        (self.group, topic, p), 0)
                self._assigned |= gained
                if self._on_assigned is not None:
                    await self._on_assigned(set(gained))

    def assignment(self) -> set[TP]:
        return set(self._assigned)

    def joined(self) -> bool:
        return self._started and not self._closed

    def _poll(self, max_records: int) -> list[Record]:
        store = self._log.store
        positions = sorted(self._positions.items())
        if positions:  # rotate so that a busy partition does not starve the others
            k = self._rotation % len(positions)
            positions = positions[k:] + positions[:k]
            self._rotation += 1
        out: list[Record] = []
        for (topic, p), offset in positions:
            if len(out) >= max_records:
                break
            got = store.partition(topic, p).read(offset, max_records - len(out))
            if got:
                self._positions[(topic, p)] = got[-1].offset + 1
                out.extend(got)
        return out

    async def getmany(self, timeout_ms: int = 200, max_records: int = 500) -> list[Record]:
        if not self._started:
            raise LogError("group consumer not started")
        if self._closed:
            raise LogError("group consumer closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        while True:
            await self._rebalance()
            records = self._poll(max_records)
            if records:
                return records
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            await self._log.store.wait(remaining)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        tp = (topic, partition)
        if tp not in self._assigned:
            raise LogError(f"{tp} is not assigned to {self.member_id}")
        self._positions[tp] = offset

    async def commit(self, offsets: Offsets) -> None:
        store = self._log.store
        for (topic, p), offset in offsets.items():
            store.group_offsets[(self.group, topic, int(p))] = int(offset)
        store.changed()

    async def close(self) -> None:
        """Leave the group (without ``on_revoked``, like aiokafka's ``stop()``)."""
        if self._closed:
            return
        self._closed = True
        store = self._log.store
        members = store.members.get(self.group, {})
        if members.get(self.member_id) is self:
            del members[self.member_id]
            store.generation += 1
            store.changed()
        self._assigned.clear()
        self._positions.clear()
        self._log.consumers.discard(self)


class MemoryEventLog:
    """The EventLog port on a ``MemoryStore`` (see the module docstring)."""

    def __init__(self, topics: Topics = Topics(), store: MemoryStore | None = None) -> None:
        self.topics = topics
        self.store = store if store is not None else MemoryStore()
        self.consumers: set[MemoryGroupConsumer] = set()
        self._closed = False

    async def start(self) -> None:
        if self._closed:
            raise LogError("memory log is closed")

    async def close(self) -> None:
        for consumer in list(self.consumers):
            await consumer.close()
        self._closed = True

    # -- topics -----------------------------------------------------------------------

    async def ensure_topics(self, ready_classes: Sequence[str] = ("default",)) -> None:
        t = self.topics
        names = [t.commands, t.events, t.replies, t.dlq, t.effects, t.workers, t.state]
        names += [t.ready(c) for c in ready_classes]
        for name in names:
            self.store.create(name, t.partitions, compacted=name in t.compacted)
        self.store.create(t.routing, 1)
        self.store.create(t.audit, 1, compacted=True)
        # a topic that follows the processors' partitions created after the deployment grew
        # (a new ready.<class>) grows to the count of commands, as on the other logs
        n = len(self.store.partitions(t.commands))
        for name in names:
            if t.follows_processors(name):
                self.store.grow(name, n)
        self.store.changed()

    async def ensure_topic(self, topic: str, partitions: int | None = None) -> int:
        n = self.store.create(topic, partitions or self.topics.partitions,
                              compacted=topic in self.topics.compacted)
        self.store.changed()
        return n

    async def partitions_for(self, topic: str) -> int:
        return len(self.store.partitions(topic))

    async def partition_count(self, topic: str) -> int:
        return len(self.store.partitions(topic))

    async def prefixed_topics(self) -> dict[str, int]:
        prefix = self.topics.prefix
        return {name: len(parts) for name, parts in sorted(self.store.topics.items())
                if name.startswith(prefix)}

    async def add_partitions(self, topic: str, partitions: int) -> int:
        return self.store.grow(topic, partitions)

    # -- records ----------------------------------------------------------------------

    async def append(self, records: Sequence[OutRecord]) -> list[Position]:
        staged = self.store.stage(records, {})
        self.store.write(staged)
        if staged:
            self.store.changed()
        return [pos for pos, _ in staged]

    async def read(
        self, topic: str, partition: int, offset: int, max_records: int = 1000,
        timeout_ms: int = 0,
    ) -> list[Record]:
        part = self.store.partition(topic, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        while True:
            records = part.read(offset, max_records)
            remaining = deadline - loop.time()
            if records or remaining <= 0:
                return records
            await self.store.wait(remaining)

    async def end_offset(self, topic: str, partition: int) -> int:
        return self.store.partition(topic, partition).next_offset

    async def store_offsets(self, group: str, offsets: Offsets) -> None:
        for (topic, p), offset in offsets.items():
            self.store.group_offsets[(group, topic, int(p))] = int(offset)

    async def start_offset(self, topic: str, partition: int) -> int:
        return self.store.partition(topic, partition).start()

    async def delete_before(self, topic: str, partition: int, offset: int) -> int:
        part = self.store.partition(topic, partition)
        refuse_deletion(topic, partition, offset, part.next_offset,
                        topic in self.store.compacted)
        part.delete_before(offset)
        return part.start()

    async def write_quorum(self) -> str | None:
        return None  # one process's memory: writable whenever it answers

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        return self.store.group_offsets.get((group, topic, partition))

    # -- ownership --------------------------------------------------------------------

    def owner_name(self, partition: int) -> str:
        return f"{self.topics.prefix}processor-p{partition}"

    async def acquire(self, partition: int, owner_id: str) -> MemoryPartitionOwner:
        n = len(self.store.partitions(self.topics.commands))
        if not 0 <= partition < n:
            raise LogError(f"partition {partition} out of range ({n} partitions)")
        name = self.owner_name(partition)
        epoch = self.store.epochs.get(name, (0, ""))[0] + 1
        self.store.epochs[name] = (epoch, owner_id)
        return MemoryPartitionOwner(self, partition, epoch, owner_id)

    async def commit_many(
        self,
        batches: Sequence[
            tuple[PartitionOwner, Sequence[OutRecord], Offsets, str, ThenCallback | None]
        ],
    ) -> list[list[Position] | BaseException]:
        """Several owners' commits at once (the ``MultiCommit`` capability, as on SQLite):
        each batch is atomic by itself; a batch of an owner whose earlier batch failed here
        fails too (it was decided on the state the failed one left behind)."""
        results: list[list[Position] | BaseException] = []
        failed: dict[str, BaseException] = {}
        for owner, records, consumed, group, then in batches:
            if not isinstance(owner, MemoryPartitionOwner) or owner._log.store is not self.store:
                results.append(LogError(f"{owner!r} belongs to another log"))
                continue
            earlier = failed.get(owner.name)
            if earlier is not None:
                results.append(earlier if isinstance(earlier, Fenced) else LogError(
                    f"{owner.name}: an earlier batch of this owner failed in this commit: "
                    f"{earlier!r}"))
                continue
            try:
                if owner._closed:
                    raise LogError(f"{owner.name} owner is closed")
                results.append(self.store.commit(owner, records, consumed, group, then))
            except Exception as exc:  # noqa: BLE001 - this batch's result, not the call's
                failed[owner.name] = exc
                results.append(exc)
        self.store.changed()
        return results

    # -- groups -----------------------------------------------------------------------

    def group_consumer(
        self,
        group: str,
        topics: Sequence[str],
        member_id: str,
        on_assigned: RebalanceCallback | None = None,
        on_revoked: RebalanceCallback | None = None,
        wake_on: Sequence[str] = (),  # every write wakes every reader here: nothing to add
        settle_s: float = 0.0,  # members join in one process, in the order they start
    ) -> MemoryGroupConsumer:
        consumer = MemoryGroupConsumer(self, group, topics, member_id, on_assigned, on_revoked)
        self.consumers.add(consumer)
        return consumer
