"""The EventLog contract: one suite, run against SqliteEventLog and KafkaEventLog.

Each test is named after the rule it checks. The suite only assumes what the port promises:
Kafka offsets are not contiguous after transactions (commit markers take offsets), group
assignment happens in the background after ``start()``, and a rebalance can take seconds,
so every wait is an explicit deadline on a condition — never a bare sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from chronolog.log.partitioner import partition_for
from chronolog.log.port import (
    EventLog,
    Fenced,
    GroupConsumer,
    KafkaCluster,
    LogError,
    OutRecord,
    PartitionOwner,
    Position,
    Record,
)

from .conftest import PARTITIONS, OpenLog

GROUP_DEADLINE_S = 45.0  # Kafka joins and rebalances take seconds


# --------------------------------------------------------------------------- helpers


async def read_all(log: EventLog, topic: str, partition: int) -> list[Record]:
    """Every committed record of a partition, up to its end offset at the time of the call."""
    end = await log.end_offset(topic, partition)
    out: list[Record] = []
    pos = 0
    while pos < end:
        # Records below the end offset are "there": read must return them without waiting.
        # Kafka: a trailing transaction marker occupies an offset no record has, so an
        # empty read means only markers / aborted records are left below the end.
        batch = await log.read(topic, partition, pos, timeout_ms=0)
        if not batch:
            break
        out.extend(batch)
        pos = batch[-1].offset + 1
    return out


async def read_values(log: EventLog, topic: str) -> list[bytes]:
    values: list[bytes] = []
    for p in range(PARTITIONS):
        values.extend(r.value for r in await read_all(log, topic, p))
    return values


def keys_per_partition(per_partition: int, prefix: str = "k") -> list[bytes]:
    """Keys that spread exactly ``per_partition`` records onto every partition."""
    counts = [0] * PARTITIONS
    keys: list[bytes] = []
    i = 0
    while min(counts) < per_partition:
        key = f"{prefix}{i}".encode()
        i += 1
        p = partition_for(key, PARTITIONS)
        if counts[p] < per_partition:
            counts[p] += 1
            keys.append(key)
    return keys


async def poll_until(
    consumers: Sequence[GroupConsumer],
    condition: Callable[[], bool],
    sink: dict[int, list[Record]] | None = None,
    deadline_s: float = GROUP_DEADLINE_S,
    what: str = "condition",
) -> None:
    """Poll every consumer concurrently (records go to ``sink[i]``) until ``condition()``."""

    if sink is not None:
        for i in range(len(consumers)):
            sink.setdefault(i, [])

    async def _loop() -> None:
        while not condition():
            batches = await asyncio.gather(*(c.getmany(timeout_ms=100) for c in consumers))
            if sink is not None:
                for i, batch in enumerate(batches):
                    sink.setdefault(i, []).extend(batch)

    try:
        await asyncio.wait_for(_loop(), deadline_s)
    except TimeoutError:
        pytest.fail(
            f"timed out waiting for {what}; assignments: "
            f"{[sorted(c.assignment()) for c in consumers]}"
        )


# --------------------------------------------------------------------------- records


async def test_a_log_with_all_its_replicas_reports_no_write_quorum_problem(
    event_log: EventLog,
) -> None:
    assert await event_log.write_quorum() is None


async def test_append_then_read_returns_records_in_order_with_offsets_from_zero(
    event_log: EventLog,
) -> None:
    topic = event_log.topics.commands
    records = [
        OutRecord(topic, f"key-{i}".encode(), f"value-{i}".encode(), partition=i % PARTITIONS,
                  headers=(("n", str(i).encode()), ("kind", b"test")))
        for i in range(20)
    ]
    before_ms = int(time.time() * 1000)
    positions = await event_log.append(records)

    assert ([(p.topic, p.partition) for p in positions]
            == [(topic, i % PARTITIONS) for i in range(20)])
    for p in range(PARTITIONS):
        mine = [(rec, pos) for rec, pos in zip(records, positions, strict=True)
                if pos.partition == p]
        assert [pos.offset for _, pos in mine] == list(range(len(mine)))
        got = await event_log.read(topic, p, 0)
        assert [r.offset for r in got] == list(range(len(mine)))
        assert [r.value for r in got] == [rec.value for rec, _ in mine]
        assert [r.key for r in got] == [rec.key for rec, _ in mine]
        assert [r.headers for r in got] == [rec.headers for rec, _ in mine]
        assert all(r.topic == topic and r.partition == p for r in got)
        assert all(abs(r.timestamp_ms - before_ms) < 60_000 for r in got)


async def test_keyed_append_lands_on_partition_for_key(event_log: EventLog) -> None:
    topic = event_log.topics.events
    keys = [f"tenant-{i % 3}/schedule-{i}".encode() for i in range(40)]
    positions = await event_log.append([OutRecord(topic, k, b"v:" + k) for k in keys])
    for key, pos in zip(keys, positions, strict=True):
        assert pos.partition == partition_for(key, PARTITIONS), key
    for p in range(PARTITIONS):
        got = await read_all(event_log, topic, p)
        assert sorted(r.key for r in got if r.key) == sorted(
            k for k in keys if partition_for(k, PARTITIONS) == p
        )


async def test_read_from_offset(event_log: EventLog) -> None:
    topic = event_log.topics.commands
    await event_log.append([OutRecord(topic, None, b"%d" % i, partition=2) for i in range(10)])
    got = await event_log.read(topic, 2, 4)
    assert [r.offset for r in got] == list(range(4, 10))
    assert [r.value for r in got] == [b"%d" % i for i in range(4, 10)]
    limited = await event_log.read(topic, 2, 2, max_records=3)
    assert [r.offset for r in limited] == [2, 3, 4]


async def test_read_waits_up_to_timeout_then_returns_empty(event_log: EventLog) -> None:
    topic = event_log.topics.commands
    await event_log.append([OutRecord(topic, None, b"x", partition=1)])
    started = time.monotonic()
    assert await event_log.read(topic, 1, 1, timeout_ms=300) == []
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 5.0, elapsed
    assert await event_log.read(topic, 3, 0, timeout_ms=0) == []


async def test_read_with_timeout_returns_as_soon_as_a_record_arrives(
    event_log: EventLog, open_log: OpenLog
) -> None:
    writer = await open_log()  # another instance: another process's append wakes us
    topic = event_log.topics.commands
    started = time.monotonic()
    reader = asyncio.create_task(event_log.read(topic, 0, 0, timeout_ms=15_000))
    await asyncio.sleep(0.05)  # let the read start waiting (not a synchronisation point)
    await writer.append([OutRecord(topic, None, b"late", partition=0)])
    got = await asyncio.wait_for(reader, 20)
    assert [r.value for r in got] == [b"late"]
    assert time.monotonic() - started < 10


async def test_end_offset(event_log: EventLog) -> None:
    topic = event_log.topics.events
    assert await event_log.end_offset(topic, 0) == 0
    await event_log.append([OutRecord(topic, None, b"e", partition=0) for _ in range(5)])
    assert await event_log.end_offset(topic, 0) == 5
    assert await event_log.end_offset(topic, 1) == 0


# --------------------------------------------------------------------------- pruning


async def test_delete_before_removes_a_prefix_and_every_process_reads_from_the_new_start(
    event_log: EventLog, open_log: OpenLog,
) -> None:
    topic = event_log.topics.events
    await event_log.append([OutRecord(topic, None, b"%d" % i, partition=1) for i in range(12)])
    assert await event_log.start_offset(topic, 1) == 0

    assert await event_log.delete_before(topic, 1, 7) == 7

    other = await open_log()
    for log in (event_log, other):
        assert await log.start_offset(topic, 1) == 7
        assert await log.end_offset(topic, 1) == 12
        got = await log.read(topic, 1, 0)  # from below the start: from the start
        assert [(r.offset, r.value) for r in got] == [(i, b"%d" % i) for i in range(7, 12)]
    assert await event_log.start_offset(topic, 0) == 0  # other partitions untouched
    positions = await event_log.append([OutRecord(topic, None, b"next", partition=1)])
    assert positions[0].offset == 12


async def test_delete_before_at_or_below_the_start_changes_nothing(event_log: EventLog) -> None:
    topic = event_log.topics.events
    await event_log.append([OutRecord(topic, None, b"x", partition=0) for _ in range(6)])
    await event_log.delete_before(topic, 0, 4)
    assert await event_log.delete_before(topic, 0, 2) == 4
    assert await event_log.delete_before(topic, 0, 4) == 4
    assert [r.offset for r in await event_log.read(topic, 0, 0)] == [4, 5]


async def test_delete_before_the_end_empties_the_partition_and_its_start_is_the_end(
    event_log: EventLog,
) -> None:
    topic = event_log.topics.events
    await event_log.append([OutRecord(topic, None, b"x", partition=3) for _ in range(3)])
    assert await event_log.delete_before(topic, 3, 3) == 3
    assert await event_log.start_offset(topic, 3) == 3
    assert await event_log.read(topic, 3, 0) == []


async def test_delete_before_past_the_end_or_on_a_compacted_topic_is_refused(
    event_log: EventLog,
) -> None:
    t = event_log.topics
    await event_log.append([OutRecord(t.events, None, b"x", partition=2) for _ in range(3)])
    with pytest.raises(LogError, match="end"):
        await event_log.delete_before(t.events, 2, 4)
    with pytest.raises(LogError, match="compacted"):
        await event_log.delete_before(t.state, 2, 1)
    assert await event_log.start_offset(t.events, 2) == 0


async def test_a_group_member_whose_committed_offset_was_deleted_resumes_at_the_start(
    event_log: EventLog,
) -> None:
    t = event_log.topics
    await event_log.append([OutRecord(t.commands, None, b"%d" % i, partition=0)
                            for i in range(8)])
    await event_log.append([OutRecord(t.commands, None, b"x", partition=p)
                            for p in range(1, PARTITIONS)])
    first = event_log.group_consumer("pruned", [t.commands], "member-a")
    await first.start()
    everything = {(t.commands, p) for p in range(PARTITIONS)}
    sink: dict[int, list[Record]] = {}
    await poll_until([first], lambda: first.assignment() == everything, sink,
                     what="the assignment")
    await first.commit({(t.commands, 0): 2})
    await first.close()
    await event_log.delete_before(t.commands, 0, 5)

    again = event_log.group_consumer("pruned", [t.commands], "member-b")
    await again.start()
    sink = {}
    await poll_until([again], lambda: sum(r.partition == 0 for r in sink.get(0, [])) >= 3,
                     sink, what="partition 0 from its new start")
    assert [r.offset for r in sink[0] if r.partition == 0] == [5, 6, 7]
    await again.close()


async def test_offsets_stored_for_a_group_without_members_are_read_by_every_process(
    event_log: EventLog, open_log: OpenLog,
) -> None:
    t = event_log.topics
    group = f"{t.prefix}progress"
    assert await event_log.committed(group, t.events, 1) is None
    await event_log.store_offsets(group, {(t.events, 1): 7, (t.events, 2): 3})
    await event_log.store_offsets(group, {(t.events, 1): 9})
    other = await open_log()
    assert await other.committed(group, t.events, 1) == 9
    assert await other.committed(group, t.events, 2) == 3
    assert await other.committed(group, t.events, 0) is None


# --------------------------------------------------------------------------- owners


async def test_owner_commit_makes_records_and_group_offsets_visible_atomically(
    event_log: EventLog,
) -> None:
    t = event_log.topics
    owner = await event_log.acquire(0, "proc-a")
    assert isinstance(owner, PartitionOwner)
    assert owner.partition == 0
    assert await event_log.committed("processors", t.commands, 0) is None
    assert await event_log.end_offset(t.events, 0) == 0

    out = [OutRecord(t.events, None, b"event-%d" % i, partition=0) for i in range(3)]
    out.append(OutRecord(t.replies, b"client-1", b"reply"))
    positions = await owner.commit(out, {(t.commands, 0): 7}, "processors")

    assert [(p.topic, p.partition) for p in positions[:3]] == [(t.events, 0)] * 3
    assert positions[0].offset < positions[1].offset < positions[2].offset
    assert positions[3].partition == partition_for(b"client-1", PARTITIONS)
    assert await event_log.committed("processors", t.commands, 0) == 7
    assert [r.value for r in await read_all(event_log, t.events, 0)] == [
        b"event-0", b"event-1", b"event-2"
    ]
    assert await event_log.end_offset(t.events, 0) > positions[2].offset
    replies = await read_all(event_log, t.replies, positions[3].partition)
    assert [(r.offset, r.value) for r in replies] == [(positions[3].offset, b"reply")]
    await owner.close()


async def test_owner_commit_then_records_join_the_same_transaction_with_positions(
    event_log: EventLog, open_log: OpenLog
) -> None:
    t = event_log.topics
    seen: list[list[Position]] = []

    def replies(positions: list[Position]) -> list[OutRecord]:
        seen.append(list(positions))
        return [OutRecord(t.replies, b"client", b"event-at-%d" % positions[-1].offset)]

    owner = await event_log.acquire(1, "proc-a")
    events = [OutRecord(t.events, None, b"e-%d" % i, partition=1) for i in range(2)]
    positions = await owner.commit(events, {(t.commands, 1): 2}, "processors", then=replies)
    assert len(positions) == 3
    assert seen == [positions[:2]]
    reply_pos = positions[2]
    assert reply_pos.topic == t.replies
    got = await read_all(event_log, t.replies, reply_pos.partition)
    assert [(r.offset, r.value) for r in got] == [
        (reply_pos.offset, b"event-at-%d" % positions[1].offset)
    ]
    assert [r.value for r in await read_all(event_log, t.events, 1)] == [b"e-0", b"e-1"]

    # a fenced commit shows neither its records nor its then-records
    other = await open_log()
    await other.acquire(1, "proc-b")
    with pytest.raises(Fenced):
        await owner.commit([OutRecord(t.events, None, b"zombie", partition=1)],
                           {(t.commands, 1): 3}, "processors", then=replies)
    assert await read_values(event_log, t.replies) == [b"event-at-%d" % positions[1].offset]
    assert await read_values(event_log, t.events) == [b"e-0", b"e-1"]
    assert await event_log.committed("processors", t.commands, 1) == 2
    await owner.close()


# --------------------------------------------------------------------------- compacted


def latest_per_key(records: Sequence[Record]) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for r in records:
        assert r.key is not None
        out[r.key] = r.value
    return out


async def test_a_compacted_topic_read_from_zero_gives_every_keys_latest_value(
    event_log: EventLog,
) -> None:
    t = event_log.topics
    assert t.state in t.compacted
    assert await event_log.partitions_for(t.state) == await event_log.partitions_for(t.events)
    writes = [(b"a", b"a1"), (b"b", b"b1"), (b"a", b"a2"), (b"c", b"c1"), (b"b", b"b2"),
              (b"a", b"a3")]
    await event_log.append([OutRecord(t.state, k, v, partition=2) for k, v in writes[:3]])
    owner = await event_log.acquire(2, "proc-a")
    await owner.commit([OutRecord(t.state, k, v, partition=2) for k, v in writes[3:]],
                       {}, "processors")
    got = await read_all(event_log, t.state, 2)
    offsets = [r.offset for r in got]
    assert offsets == sorted(offsets)
    assert latest_per_key(got) == {b"a": b"a3", b"b": b"b2", b"c": b"c1"}
    # what a compaction may keep: each key's latest value, in the order they were written
    assert [r.value for r in got][-3:] == [b"c1", b"b2", b"a3"]
    assert await read_all(event_log, t.state, 1) == []
    await owner.close()


async def test_a_compacted_topics_records_commit_with_the_owners_transaction_or_not_at_all(
    event_log: EventLog, open_log: OpenLog,
) -> None:
    t = event_log.topics

    def state(positions: list[Position]) -> list[OutRecord]:
        at = positions[-1].offset
        return [OutRecord(t.state, b"acme/s1", b"as-of-%d" % at, partition=3),
                OutRecord(t.state, b"@snapshot", b"marker-%d" % at, partition=3)]

    owner = await event_log.acquire(3, "proc-a")
    positions = await owner.commit([OutRecord(t.events, b"acme/s1", b"e-0", partition=3)],
                                   {(t.commands, 3): 1}, "processors", then=state)
    assert [p.topic for p in positions] == [t.events, t.state, t.state]
    assert latest_per_key(await read_all(event_log, t.state, 3)) == {
        b"acme/s1": b"as-of-%d" % positions[0].offset,
        b"@snapshot": b"marker-%d" % positions[0].offset}
    # a zombie's snapshot never becomes visible
    other = await open_log()
    await other.acquire(3, "proc-b")
    with pytest.raises(Fenced):
        await owner.commit([], {}, "processors",
                           then=lambda _: [OutRecord(t.state, b"acme/s1", b"zombie",
                                                     partition=3)])
    with pytest.raises(Fenced):
        await owner.commit([OutRecord(t.state, b"@snapshot", b"zombie", partition=3)], {},
                           "processors")
    assert latest_per_key(await read_all(event_log, t.state, 3)) == {
        b"acme/s1": b"as-of-%d" % positions[0].offset,
        b"@snapshot": b"marker-%d" % positions[0].offset}
    await owner.close()


async def test_second_acquire_fences_the_first(event_log: EventLog, open_log: OpenLog) -> None:
    t = event_log.topics
    other = await open_log()  # the new owner lives in another "process"
    first = await event_log.acquire(0, "proc-a")
    await first.commit([OutRecord(t.events, None, b"a-1", partition=0)],
                       {(t.commands, 0): 1}, "processors")

    second = await other.acquire(0, "proc-b")
    with pytest.raises(Fenced):
        await first.commit([OutRecord(t.events, None, b"a-2", partition=0)],
                           {(t.commands, 0): 2}, "processors")
    # nothing of the fenced commit is visible
    assert await event_log.committed("processors", t.commands, 0) == 1
    assert await read_values(event_log, t.events) == [b"a-1"]

    await second.commit([OutRecord(t.events, None, b"b-1", partition=0)],
                        {(t.commands, 0): 3}, "processors")
    assert await event_log.committed("processors", t.commands, 0) == 3
    assert await read_values(event_log, t.events) == [b"a-1", b"b-1"]
    # a fenced owner stays fenced
    with pytest.raises(Fenced):
        await first.commit([], {(t.commands, 0): 9}, "processors")
    assert await event_log.committed("processors", t.commands, 0) == 3
    await first.close()
    await second.close()


async def test_acquire_is_per_partition(event_log: EventLog, open_log: OpenLog) -> None:
    t = event_log.topics
    other = await open_log()
    owner0 = await event_log.acquire(0, "proc-a")
    owner1 = await other.acquire(1, "proc-b")
    await owner0.commit([OutRecord(t.events, None, b"p0", partition=0)],
                        {(t.commands, 0): 1}, "processors")
    await owner1.commit([OutRecord(t.events, None, b"p1", partition=1)],
                        {(t.commands, 1): 1}, "processors")
    await owner0.commit([OutRecord(t.events, None, b"p0-again", partition=0)],
                        {(t.commands, 0): 2}, "processors")
    assert [r.value for r in await read_all(event_log, t.events, 0)] == [b"p0", b"p0-again"]
    assert [r.value for r in await read_all(event_log, t.events, 1)] == [b"p1"]
    await owner0.close()
    await owner1.close()


async def test_consumed_offsets_readable_via_committed(event_log: EventLog) -> None:
    t = event_log.topics
    owner = await event_log.acquire(2, "proc-a")
    await owner.commit([], {(t.commands, 2): 11, (t.events, 2): 4}, "processors")
    assert await event_log.committed("processors", t.commands, 2) == 11
    assert await event_log.committed("processors", t.events, 2) == 4
    assert await event_log.committed("processors", t.commands, 1) is None
    assert await event_log.committed("someone-else", t.commands, 2) is None
    await owner.commit([], {(t.commands, 2): 12}, "processors")
    assert await event_log.committed("processors", t.commands, 2) == 12
    await owner.close()


# --------------------------------------------------------------------------- groups


async def test_group_consumer_one_member_gets_all_partitions(event_log: EventLog) -> None:
    t = event_log.topics
    assigned: set[tuple[str, int]] = set()

    async def on_assigned(tps: set[tuple[str, int]]) -> None:
        assigned.update(tps)

    consumer = event_log.group_consumer("workers", [t.commands], "member-a",
                                        on_assigned=on_assigned)
    await consumer.start()
    everything = {(t.commands, p) for p in range(PARTITIONS)}
    sink: dict[int, list[Record]] = {}
    await poll_until([consumer], lambda: consumer.assignment() == everything, sink,
                     what="the only member to get every partition")
    assert assigned == everything

    keys = keys_per_partition(3)
    positions = await event_log.append([OutRecord(t.commands, k, k) for k in keys])
    await poll_until([consumer], lambda: len(sink[0]) >= len(keys), sink,
                     what="every record")
    got = sink[0]
    assert sorted((r.partition, r.offset) for r in got) == sorted(
        (p.partition, p.offset) for p in positions
    )
    for p in range(PARTITIONS):  # per partition in order
        offsets = [r.offset for r in got if r.partition == p]
        assert offsets == sorted(offsets)
    await consumer.close()


async def _two_members(
    event_log: EventLog, open_log: OpenLog, group: str,
    gained_b: set[tuple[str, int]] | None = None,
) -> tuple[GroupConsumer, GroupConsumer, dict[int, list[Record]]]:
    t = event_log.topics
    other = await open_log()

    async def on_assigned_b(tps: set[tuple[str, int]]) -> None:
        if gained_b is not None:
            gained_b.update(tps)

    a = event_log.group_consumer(group, [t.commands], "member-a")
    b = other.group_consumer(group, [t.commands], "member-b", on_assigned=on_assigned_b)
    await a.start()
    await b.start()
    everything = {(t.commands, p) for p in range(PARTITIONS)}

    def split() -> bool:
        sa, sb = a.assignment(), b.assignment()
        return bool(sa) and bool(sb) and not (sa & sb) and (sa | sb) == everything

    sink: dict[int, list[Record]] = {}
    await poll_until([a, b], split, sink, what="two members to split the partitions")
    return a, b, sink


async def test_group_two_members_split_partitions_and_read_every_record_once(
    event_log: EventLog, open_log: OpenLog
) -> None:
    t = event_log.topics
    a, b, sink = await _two_members(event_log, open_log, "workers")
    keys = keys_per_partition(5)
    positions = await event_log.append([OutRecord(t.commands, k, k) for k in keys])

    def total() -> int:
        return sum(len(v) for v in sink.values())

    await poll_until([a, b], lambda: total() >= len(keys), sink, what="every record")
    # two more rounds: a duplicate arriving late would show up here
    for _ in range(2):
        for i, batch in enumerate(await asyncio.gather(a.getmany(200), b.getmany(200))):
            sink.setdefault(i, []).extend(batch)

    read = Counter((r.partition, r.offset) for v in sink.values() for r in v)
    assert set(read) == {(p.partition, p.offset) for p in positions}
    assert max(read.values()) == 1, "a record was read twice without a rebalance"
    for i, member in enumerate((a, b)):
        assert {(r.topic, r.partition) for r in sink.get(i, [])} <= member.assignment()
    await a.close()
    await b.close()


async def test_group_member_leaving_hands_partitions_over_from_committed_offsets(
    event_log: EventLog, open_log: OpenLog
) -> None:
    t = event_log.topics
    gained_b: set[tuple[str, int]] = set()
    a, b, sink = await _two_members(event_log, open_log, "workers", gained_b)
    a_parts = sorted(a.assignment())
    keys = keys_per_partition(10)
    positions = await event_log.append([OutRecord(t.commands, k, k) for k in keys])
    per_tp = Counter((p.topic, p.partition) for p in positions)

    def a_has_read_its_partitions() -> bool:
        seen = Counter((r.topic, r.partition) for r in sink.get(0, []))
        return all(seen[tp] >= per_tp[tp] for tp in a_parts)

    await poll_until([a, b], a_has_read_its_partitions, sink, what="member a to read its records")
    # a "processes" only the first 4 records of each of its partitions, commits, and leaves
    processed: list[Record] = []
    commit: dict[tuple[str, int], int] = {}
    for tp in a_parts:
        mine = sorted((r for r in sink[0] if (r.topic, r.partition) == tp), key=lambda r: r.offset)
        processed.extend(mine[:4])
        commit[tp] = mine[3].offset + 1
    await a.commit(commit)
    for tp, off in commit.items():
        assert await event_log.committed("workers", *tp) == off
    await a.close()

    everything = {(t.commands, p) for p in range(PARTITIONS)}
    b_before = len(sink.get(1, []))

    def b_took_over_and_caught_up() -> bool:
        if b.assignment() != everything:
            return False
        seen = Counter((r.topic, r.partition) for r in sink[1][b_before:])
        return all(seen[tp] >= per_tp[tp] - 4 for tp in a_parts)

    b_sink: dict[int, list[Record]] = {0: sink[1]}
    await poll_until([b], b_took_over_and_caught_up, b_sink, what="member b to take over")

    assert set(a_parts) <= gained_b
    for tp in a_parts:
        resumed = sorted(r.offset for r in sink[1][b_before:] if (r.topic, r.partition) == tp)
        assert resumed and resumed[0] == commit[tp], (tp, resumed, commit[tp])
    # no record lost: a processed + everything b read covers the log
    covered = {(r.partition, r.offset) for r in processed} | {
        (r.partition, r.offset) for r in sink[1]
    }
    assert covered >= {(p.partition, p.offset) for p in positions}
    await b.close()


# --------------------------------------------------------------------------- topics


async def test_ensure_topics_is_idempotent(event_log: EventLog) -> None:
    t = event_log.topics
    await event_log.append([OutRecord(t.commands, None, b"keep", partition=0)])
    await event_log.ensure_topics()
    await event_log.ensure_topics(("default", "gpu"))
    await event_log.ensure_topics(("default", "gpu"))
    assert await event_log.partitions_for(t.commands) == PARTITIONS
    assert await event_log.partitions_for(t.ready("gpu")) == PARTITIONS
    assert [r.value for r in await event_log.read(t.commands, 0, 0)] == [b"keep"]


async def test_partitions_for(event_log: EventLog) -> None:
    t = event_log.topics
    for topic in (t.commands, t.events, t.replies, t.dlq, t.effects, t.ready("default"),
                  t.state):
        assert await event_log.partitions_for(topic) == PARTITIONS, topic


async def test_partitions_for_an_unknown_topic_raises_log_error(event_log: EventLog) -> None:
    with pytest.raises(LogError):
        await event_log.partitions_for(f"{event_log.topics.prefix}nowhere")


async def test_ensure_topic_creates_one_topic_with_the_given_partition_count(
    event_log: EventLog,
) -> None:
    topic = f"{event_log.topics.prefix}results.three"
    assert await event_log.ensure_topic(topic, 3) == 3
    assert await event_log.partitions_for(topic) == 3
    key = b"effect-1"
    [pos] = await event_log.append([OutRecord(topic, key, b"result")])
    assert (pos.topic, pos.partition) == (topic, partition_for(key, 3))
    [rec] = await event_log.read(topic, pos.partition, 0)
    assert (rec.key, rec.value, rec.offset) == (key, b"result", pos.offset)


async def test_ensure_topic_defaults_to_the_shared_partition_count(event_log: EventLog) -> None:
    topic = f"{event_log.topics.prefix}results.default"
    assert await event_log.ensure_topic(topic) == PARTITIONS
    assert await event_log.partitions_for(topic) == PARTITIONS


async def test_ensure_topic_is_idempotent_and_keeps_an_existing_topics_count(
    event_log: EventLog, open_log: OpenLog
) -> None:
    topic = f"{event_log.topics.prefix}results.kept"
    assert await event_log.ensure_topic(topic, 2) == 2
    await event_log.append([OutRecord(topic, None, b"keep", partition=1)])
    assert await event_log.ensure_topic(topic, 2) == 2
    assert await event_log.ensure_topic(topic, 7) == 2
    assert await event_log.ensure_topic(event_log.topics.commands) == PARTITIONS
    # another process sees the topic and its count, and creating it again keeps its records
    other = await open_log()
    assert await other.ensure_topic(topic, 5) == 2
    assert await other.partitions_for(topic) == 2
    assert [r.value for r in await read_all(other, topic, 1)] == [b"keep"]


async def test_only_a_broker_backed_log_is_a_kafka_cluster(
    event_log: EventLog, backend: str
) -> None:
    # the capability the Kafka effect adapter's transactional path checks for
    assert isinstance(event_log, KafkaCluster) == (backend == "kafka")


# --------------------------------------------------------------------------- growing a topic


async def test_adding_partitions_keeps_every_record_where_it_was_and_never_shrinks(
    event_log: EventLog,
) -> None:
    t = event_log.topics
    keys = keys_per_partition(2)
    before = await event_log.append([OutRecord(t.commands, k, k) for k in keys])

    assert await event_log.add_partitions(t.commands, PARTITIONS * 2) == PARTITIONS * 2
    assert await event_log.partitions_for(t.commands) == PARTITIONS * 2
    for p in range(PARTITIONS):
        assert ([r.value for r in await read_all(event_log, t.commands, p)]
                == [keys[i] for i, pos in enumerate(before) if pos.partition == p])
    for p in range(PARTITIONS, PARTITIONS * 2):
        assert await event_log.end_offset(t.commands, p) == 0
    # a keyed append now hashes over the new count; a new partition takes records
    key = next(k for k in (f"g{i}".encode() for i in range(1000))
               if partition_for(k, PARTITIONS * 2) >= PARTITIONS)
    [pos] = await event_log.append([OutRecord(t.commands, key, b"new home")])
    assert pos.partition == partition_for(key, PARTITIONS * 2)
    assert [r.value for r in await read_all(event_log, t.commands, pos.partition)] == [
        b"new home"]
    # a count at or below the current one changes nothing
    assert await event_log.add_partitions(t.commands, PARTITIONS) == PARTITIONS * 2
    assert await event_log.add_partitions(t.commands, PARTITIONS * 2) == PARTITIONS * 2
    assert await event_log.partitions_for(t.commands) == PARTITIONS * 2
    # the other topics keep theirs
    assert await event_log.partitions_for(t.events) == PARTITIONS


async def test_another_process_writes_reads_and_owns_a_partition_added_after_it_started(
    event_log: EventLog, open_log: OpenLog,
) -> None:
    t = event_log.topics
    other = await open_log()
    assert await other.partitions_for(t.commands) == PARTITIONS  # known before the growth
    await event_log.add_partitions(t.commands, PARTITIONS + 3)
    new = PARTITIONS + 2

    [pos] = await other.append([OutRecord(t.commands, b"k", b"to the new one", partition=new)])
    assert (pos.partition, pos.offset) == (new, 0)
    assert [r.value for r in await read_all(other, t.commands, new)] == [b"to the new one"]
    owner = await other.acquire(new, "owner-of-a-new-partition")
    [written] = await owner.commit(
        [OutRecord(t.commands, b"k", b"in a transaction", partition=new)], {}, "g")
    assert written.partition == new
    assert [r.value for r in await read_all(event_log, t.commands, new)] == [
        b"to the new one", b"in a transaction"]
    await owner.close()


async def test_a_group_member_is_assigned_the_partitions_added_while_it_runs(
    event_log: EventLog, open_log: OpenLog,
) -> None:
    t = event_log.topics
    member_log = await open_log()  # the member lives in another process than the grower
    assigned: set[tuple[str, int]] = set()

    async def on_assigned(tps: set[tuple[str, int]]) -> None:
        assigned.update(tps)

    consumer = member_log.group_consumer("growing", [t.commands], "member-a",
                                         on_assigned=on_assigned)
    await consumer.start()
    sink: dict[int, list[Record]] = {}
    await poll_until([consumer], lambda: len(consumer.assignment()) == PARTITIONS, sink,
                     what="every partition of the topic as it was")
    await event_log.add_partitions(t.commands, PARTITIONS * 2)
    everything = {(t.commands, p) for p in range(PARTITIONS * 2)}
    await poll_until([consumer], lambda: consumer.assignment() == everything, sink,
                     what="the added partitions")
    assert assigned == everything
    [pos] = await event_log.append(
        [OutRecord(t.commands, b"k", b"on an added partition", partition=PARTITIONS + 1)])
    await poll_until([consumer], lambda: any(r.value == b"on an added partition"
                                             for r in sink[0]), sink, what="its record")
    got = [r for r in sink[0] if r.value == b"on an added partition"]
    assert [(r.partition, r.offset) for r in got] == [(pos.partition, pos.offset)]
    await consumer.close()


async def test_a_member_started_after_another_process_grew_the_topic_gets_every_partition_first(
    event_log: EventLog, open_log: OpenLog,
) -> None:
    """A log object that knew the topic before another process added partitions: a member
    started on it is assigned the partitions as they are now in its first assignment, so
    one that follows a partition from its end (as a client's reply reader does) passes
    over nothing written there after it started."""
    t = event_log.topics
    member_log = await open_log()
    assert await member_log.partitions_for(t.replies) == PARTITIONS  # known before the growth
    await event_log.add_partitions(t.replies, PARTITIONS * 2)
    first: list[set[tuple[str, int]]] = []

    async def on_assigned(tps: set[tuple[str, int]]) -> None:
        first.append(set(tps))

    consumer = member_log.group_consumer("late", [t.replies], "member-late",
                                         on_assigned=on_assigned)
    await consumer.start()
    await poll_until([consumer], lambda: bool(first), {}, what="an assignment")
    assert first[0] == {(t.replies, p) for p in range(PARTITIONS * 2)}
    await consumer.close()


async def test_prefixed_topics_lists_this_logs_topics_with_their_counts_and_no_others(
    event_log: EventLog, open_log: OpenLog,
) -> None:
    t = event_log.topics
    await event_log.ensure_topics(("default", "gpu"))
    other = await open_log()
    await other.add_partitions(t.ready("gpu"), PARTITIONS + 2)  # by another process
    topics = await event_log.prefixed_topics()
    names = list(topics)
    assert {t.commands, t.events, t.state, t.replies, t.routing, t.ready("default"),
            t.ready("gpu")} <= set(names)
    assert names == sorted(names)
    assert all(n.startswith(t.prefix) for n in names)
    assert topics[t.routing] == 1 and topics[t.events] == PARTITIONS
    assert topics[t.ready("gpu")] == PARTITIONS + 2
    assert [n for n in names if t.follows_processors(n)] == sorted(
        [t.commands, t.events, t.state, t.replies, t.ready("default"), t.ready("gpu")])
