"""Kafka-only checks of KafkaEventLog that the shared contract suite cannot express.

Transactions and zombie fencing on a real broker (a second owner's ``acquire`` fences the
first; the fenced owner's output never reaches a ``read_committed`` reader), output and
consumed offsets committed atomically, the last stable offset held back by an open
transaction, and agreement of our partitioner with aiokafka's DefaultPartitioner on the
broker. Needs ``KAFKA_BOOTSTRAP_SERVERS`` (fails without it, never skips).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition

from chronolog.log import kafka_fetch_wait
from chronolog.log.kafka import KafkaEventLog
from chronolog.log.kafka_fetch_wait import IDLE_WAIT_MS
from chronolog.log.partitioner import partition_for
from chronolog.log.port import (
    Fenced,
    LogError,
    LogUnavailable,
    OutRecord,
    Position,
    Record,
    Topics,
)
from support.polling import wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 4
GROUP = "processor"


@pytest.fixture
async def klog(kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[KafkaEventLog]:
    log = KafkaEventLog(kafka_bootstrap, Topics(prefix=topic_prefix, partitions=PARTITIONS))
    await log.start()
    await log.ensure_topics(["default"])
    yield log
    await log.close()


@pytest.fixture
async def second_log(kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[KafkaEventLog]:
    """Another process's view of the same broker and prefix."""
    log = KafkaEventLog(
        kafka_bootstrap, Topics(prefix=topic_prefix, partitions=PARTITIONS), client_id="other"
    )
    await log.start()
    yield log
    await log.close()


async def read_all(log: KafkaEventLog, topic: str, partition: int) -> list[Record]:
    """Every committed record of a partition, from offset 0 up to its last stable offset."""
    end = await log.end_offset(topic, partition)
    out: list[Record] = []
    offset = 0
    while offset < end:
        batch = await log.read(topic, partition, offset, timeout_ms=0)
        if not batch:
            break
        out.extend(batch)
        offset = batch[-1].offset + 1
    return out


async def test_partitioner_agrees_with_aiokafka_on_the_broker(klog: KafkaEventLog) -> None:
    keys = [f"tenant{i % 3}/schedule-{i}".encode() for i in range(64)]
    positions = await klog.append(
        [OutRecord(klog.topics.commands, key=k, value=b"v") for k in keys]
    )
    aiokafka_partitioner = DefaultPartitioner()
    all_partitions = list(range(PARTITIONS))
    for key, pos in zip(keys, positions, strict=True):
        assert pos.partition == partition_for(key, PARTITIONS)
        assert pos.partition == aiokafka_partitioner(key, all_partitions, all_partitions)
    assert len({p.partition for p in positions}) == PARTITIONS


async def test_append_then_read_preserves_key_value_headers(klog: KafkaEventLog) -> None:
    topic = klog.topics.events
    recs = [
        OutRecord(topic, key=b"k", value=f"v{i}".encode(), partition=2, headers=(("h", b"x"),))
        for i in range(5)
    ]
    positions = await klog.append(recs)
    assert [p.offset for p in positions] == [0, 1, 2, 3, 4]
    assert await klog.end_offset(topic, 2) == 5
    got = await klog.read(topic, 2, 1, max_records=3)
    assert [(r.offset, r.key, r.value, r.headers) for r in got] == [
        (1, b"k", b"v1", (("h", b"x"),)),
        (2, b"k", b"v2", (("h", b"x"),)),
        (3, b"k", b"v3", (("h", b"x"),)),
    ]
    assert got[0].timestamp_ms > 0
    # nothing beyond the end: returns empty after the (short) wait
    assert await klog.read(topic, 2, 5, timeout_ms=100) == []


async def test_read_waits_for_a_record_within_timeout(klog: KafkaEventLog) -> None:
    topic = klog.topics.replies

    async def late_append() -> None:
        await asyncio.sleep(0.3)  # the record must arrive while read is already waiting
        await klog.append([OutRecord(topic, key=None, value=b"late", partition=0)])

    task = asyncio.create_task(late_append())
    got = await klog.read(topic, 0, 0, timeout_ms=10_000)
    await task
    assert [r.value for r in got] == [b"late"]


async def test_read_below_log_start_resumes_at_log_start(
    klog: KafkaEventLog, kafka_bootstrap: str
) -> None:
    """Records removed by retention (here: DeleteRecords) are skipped, not an error."""
    topic = klog.topics.replies
    await klog.append([OutRecord(topic, None, b"%d" % i, partition=1) for i in range(5)])
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, 1): RecordsToDelete(3)})
    finally:
        await admin.close()
    got = await klog.read(topic, 1, 0)
    assert [(r.offset, r.value) for r in got] == [(3, b"3"), (4, b"4")]
    # beyond the end: nothing, and no exception
    assert await klog.read(topic, 1, 50, timeout_ms=0) == []


async def test_commit_is_atomic_with_consumed_offsets(klog: KafkaEventLog) -> None:
    t = klog.topics
    owner = await klog.acquire(1, "owner-a")
    positions = await owner.commit(
        [OutRecord(t.events, key=b"s1", value=b"e1", partition=1),
         OutRecord(t.replies, key=None, value=b"r1", partition=0)],
        {(t.commands, 1): 7},
        GROUP,
    )
    # commit returns only once committed readers can see the outputs and offsets
    assert [(p.topic, p.partition, p.offset) for p in positions] == [
        (t.events, 1, 0), (t.replies, 0, 0)
    ]
    assert await klog.committed(GROUP, t.commands, 1) == 7
    assert [r.value for r in await read_all(klog, t.events, 1)] == [b"e1"]
    assert [r.value for r in await read_all(klog, t.replies, 0)] == [b"r1"]
    # a transaction leaves a commit marker: the LSO is past it
    assert await klog.end_offset(t.events, 1) == 2
    # the next commit continues after the marker
    more = await owner.commit(
        [OutRecord(t.events, key=b"s1", value=b"e2", partition=1)], {(t.commands, 1): 9}, GROUP
    )
    assert more[0].offset == 2
    assert await klog.committed(GROUP, t.commands, 1) == 9
    await owner.close()


async def test_commit_then_records_carry_positions_and_errors_abort(klog: KafkaEventLog) -> None:
    t = klog.topics
    owner = await klog.acquire(2, "owner-a")

    def reply(positions: list[Position]) -> list[OutRecord]:
        body = ",".join(f"{p.topic}:{p.partition}:{p.offset}" for p in positions).encode()
        return [OutRecord(t.replies, key=None, value=body, partition=3)]

    positions = await owner.commit(
        [OutRecord(t.events, key=b"s", value=b"e", partition=2)], {(t.commands, 2): 1}, GROUP,
        then=reply,
    )
    assert [(p.topic, p.partition, p.offset) for p in positions] == [
        (t.events, 2, 0), (t.replies, 3, 0)
    ]
    assert [r.value for r in await read_all(klog, t.replies, 3)] == [f"{t.events}:2:0".encode()]

    class Boom(Exception):
        pass

    def broken(positions: list[Position]) -> list[OutRecord]:
        raise Boom()

    with pytest.raises(Boom):
        await owner.commit([OutRecord(t.events, key=b"s", value=b"lost", partition=2)],
                           {(t.commands, 2): 2}, GROUP, then=broken)
    # aborted: neither the record nor the offset is visible, and the owner goes on
    await owner.commit([OutRecord(t.events, key=b"s", value=b"e2", partition=2)],
                       {(t.commands, 2): 3}, GROUP)
    assert [r.value for r in await read_all(klog, t.events, 2)] == [b"e", b"e2"]
    assert await klog.committed(GROUP, t.commands, 2) == 3
    await owner.close()


def _naming_reply(t: Topics, partition: int) -> Callable[[list[Position]], list[OutRecord]]:
    """A ``then`` whose reply names the offsets it was given (and a keyed, hint-like record)."""
    def then(positions: list[Position]) -> list[OutRecord]:
        body = ",".join(str(p.offset) for p in positions).encode()
        return [OutRecord(t.ready("default"), key=body, value=b"hint"),
                OutRecord(t.replies, key=None, value=body, partition=partition)]
    return then


async def _replies_match_events(klog: KafkaEventLog, partition: int, per_commit: int) -> None:
    """Every committed reply names exactly the offsets its commit's events landed at."""
    t = klog.topics
    events = [r.offset for r in await read_all(klog, t.events, partition)]
    replies = [r.value.decode() for r in await read_all(klog, t.replies, partition)]
    chunks = [events[i:i + per_commit] for i in range(0, len(events), per_commit)]
    assert replies == [",".join(map(str, c)) for c in chunks]


async def test_predicted_commits_go_out_in_one_round_trip_with_the_real_positions(
    klog: KafkaEventLog,
) -> None:
    """The owner predicts its own events partition's offsets (the last commit's + marker),
    so ``then``'s records travel with the events; the replies still carry the real offsets
    — also across an aborted transaction, which makes the owner learn them again."""
    t = klog.topics
    owner = await klog.acquire(1, "owner-a")
    then = _naming_reply(t, 1)

    async def commit(i: int) -> None:
        await owner.commit([OutRecord(t.events, b"s", b"e%d-%d" % (i, k), partition=1)
                            for k in range(3)], {(t.commands, 1): i + 1}, GROUP, then=then)

    for i in range(4):
        await commit(i)
    assert owner.predicted == 3 and owner.mispredicted == 0  # the first one learns

    class Boom(Exception):
        pass

    def broken(positions: list[Position]) -> list[OutRecord]:
        raise Boom()

    owner._next_event = None  # a plain commit whose then() fails: sent, then aborted
    with pytest.raises(Boom):
        await owner.commit([OutRecord(t.events, b"s", b"lost", partition=1)],
                           {(t.commands, 1): 9}, GROUP, then=broken)
    for i in range(4, 7):
        await commit(i)
    assert owner.predicted == 5 and owner.mispredicted == 0
    await _replies_match_events(klog, 1, 3)
    assert await klog.committed(GROUP, t.commands, 1) == 7
    await owner.close()


async def test_a_wrong_prediction_is_aborted_and_committed_the_plain_way(
    klog: KafkaEventLog,
) -> None:
    t = klog.topics
    owner = await klog.acquire(2, "owner-a")
    then = _naming_reply(t, 2)
    await owner.commit([OutRecord(t.events, b"s", b"e0", partition=2)],
                       {(t.commands, 2): 1}, GROUP, then=then)
    assert owner._next_event is not None
    owner._next_event += 5  # as if someone else had written there
    positions = await owner.commit([OutRecord(t.events, b"s", b"e1", partition=2)],
                                   {(t.commands, 2): 2}, GROUP, then=then)
    assert owner.mispredicted == 1
    # the aborted attempt left nothing visible; the plain commit's reply is right
    assert [r.value for r in await read_all(klog, t.events, 2)] == [b"e0", b"e1"]
    await _replies_match_events(klog, 2, 1)
    assert positions[0].offset == (await read_all(klog, t.events, 2))[-1].offset
    assert await klog.committed(GROUP, t.commands, 2) == 2
    await owner.commit([OutRecord(t.events, b"s", b"e2", partition=2)],
                       {(t.commands, 2): 3}, GROUP, then=then)
    assert owner.predicted == 1  # learnt again from the plain commit
    await _replies_match_events(klog, 2, 1)
    await owner.close()


async def test_second_owner_fences_first(klog: KafkaEventLog, second_log: KafkaEventLog) -> None:
    t = klog.topics
    first = await klog.acquire(0, "owner-a")
    await first.commit([OutRecord(t.events, key=b"k", value=b"a1", partition=0)],
                       {(t.commands, 0): 1}, GROUP)

    second = await second_log.acquire(0, "owner-b")
    assert second.epoch > first.epoch
    with pytest.raises(Fenced):
        await first.commit([OutRecord(t.events, key=b"k", value=b"zombie", partition=0)],
                           {(t.commands, 0): 2}, GROUP)
    # a fenced owner stays dead
    with pytest.raises(Fenced):
        await first.commit([], {(t.commands, 0): 3}, GROUP)

    await second.commit([OutRecord(t.events, key=b"k", value=b"b1", partition=0)],
                        {(t.commands, 0): 2}, GROUP)
    assert [r.value for r in await read_all(second_log, t.events, 0)] == [b"a1", b"b1"]
    assert await second_log.committed(GROUP, t.commands, 0) == 2
    await second.close()


async def test_zombie_open_transaction_is_aborted_by_new_owner(
    klog: KafkaEventLog, second_log: KafkaEventLog, kafka_bootstrap: str
) -> None:
    """A producer that dies mid-transaction: the new owner's acquire aborts its output."""
    t = klog.topics
    zombie = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap,
        transactional_id=f"{t.prefix}processor-p3",
        enable_idempotence=True,
    )
    await zombie.start()
    try:
        await zombie.begin_transaction()
        meta = await (await zombie.send(t.events, b"uncommitted", key=b"z", partition=3))
        assert meta.offset == 0
        # the open transaction holds the last stable offset back
        assert await klog.end_offset(t.events, 3) == 0
        assert await klog.read(t.events, 3, 0, timeout_ms=200) == []

        owner = await second_log.acquire(3, "owner-b")  # fences + aborts the zombie's txn
        await owner.commit([OutRecord(t.events, key=b"z", value=b"committed", partition=3)],
                           {(t.commands, 3): 1}, GROUP)
        got = await read_all(klog, t.events, 3)
        assert [r.value for r in got] == [b"committed"]
        # reading from the aborted record's offset skips it
        assert [r.value for r in await klog.read(t.events, 3, 0)] == [b"committed"]
        with pytest.raises(Exception):  # noqa: B017 - any failure: the zombie is fenced
            await zombie.commit_transaction()
        await owner.close()
    finally:
        await zombie.stop()


async def test_group_consumer_sees_committed_records_and_commits(klog: KafkaEventLog) -> None:
    t = klog.topics
    owner = await klog.acquire(0, "w")
    await owner.commit([OutRecord(t.ready("default"), key=b"r", value=f"h{i}".encode(),
                                  partition=i % PARTITIONS) for i in range(8)], {}, GROUP)
    assigned: list[set[tuple[str, int]]] = []

    async def on_assigned(parts: set[tuple[str, int]]) -> None:
        assigned.append(parts)

    gc = klog.group_consumer("workers", [t.ready("default")], "m1", on_assigned=on_assigned)
    await gc.start()
    got: list[Record] = []
    deadline = time.monotonic() + 30
    while len(got) < 8 and time.monotonic() < deadline:
        got.extend(await gc.getmany(timeout_ms=200))
    assert sorted(r.value for r in got) == [f"h{i}".encode() for i in range(8)]
    assert assigned and assigned[-1] == {(t.ready("default"), p) for p in range(PARTITIONS)}
    assert gc.assignment() == assigned[-1]
    await gc.commit({(t.ready("default"), 0): 2})
    assert await klog.committed("workers", t.ready("default"), 0) == 2
    await gc.close()
    await owner.close()


async def test_group_members_split_partitions(klog: KafkaEventLog) -> None:
    topic = klog.topics.commands
    a = klog.group_consumer("split", [topic], "a")
    b = klog.group_consumer("split", [topic], "b")
    await a.start()
    await b.start()

    async def balanced() -> bool:
        await asyncio.gather(a.getmany(timeout_ms=100), b.getmany(timeout_ms=100))
        sa, sb = a.assignment(), b.assignment()
        return len(sa) == len(sb) == PARTITIONS // 2 and not (sa & sb)

    try:
        await wait_until(balanced, 40, what="a balanced assignment")
    finally:
        await a.close()
        await b.close()


async def test_unreachable_broker_is_log_unavailable_within_bound() -> None:
    log = KafkaEventLog("127.0.0.1:1", Topics(prefix="unreachable."), request_timeout_ms=2000)
    started = time.monotonic()
    with pytest.raises(LogUnavailable):
        await log.start()
    assert time.monotonic() - started < 15


async def test_unknown_topic_fails_fast(klog: KafkaEventLog) -> None:
    started = time.monotonic()
    with pytest.raises(LogError):
        await klog.read(f"{klog.topics.prefix}nope", 0, 0, timeout_ms=0)
    with pytest.raises(LogError):
        await klog.append([OutRecord(f"{klog.topics.prefix}nope", key=b"k", value=b"v")])
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("compression", ["none", "gzip", "lz4", "zstd"])
async def test_records_written_with_each_compression_read_back_the_same(
    kafka_bootstrap: str, topic_prefix: str, compression: str,
) -> None:
    topics = Topics(prefix=topic_prefix, partitions=1)
    log = KafkaEventLog(kafka_bootstrap, topics, compression=compression)
    await log.start()
    try:
        await log.ensure_topics()
        sent = [OutRecord(topics.events, f"k{i}".encode(), b'{"n": %d}' % i * 20,
                          partition=0, headers=(("h", b"v"),)) for i in range(50)]
        await log.append(sent)
        got = await log.read(topics.events, 0, 0, 100)
        assert [(r.key, r.value, r.headers) for r in got] == [
            (s.key, s.value, s.headers) for s in sent]
    finally:
        await log.close()


async def test_an_idle_group_consumer_long_polls_and_one_fetching_records_polls_short(
    klog: KafkaEventLog, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = klog.topics
    # "idle" after a minute without records, so that a loaded machine cannot make the
    # consumer idle again between the record's fetch and the check that follows it
    monkeypatch.setattr(kafka_fetch_wait, "IDLE_AFTER_S", 60.0)
    gc = klog.group_consumer("idle", [t.commands], "m1")
    await gc.start()
    try:
        assert gc.fetch_wait_ms() == IDLE_WAIT_MS  # nothing fetched yet
        await klog.append([OutRecord(t.commands, key=b"k", value=b"v", partition=1)])
        got = await wait_until(lambda: gc.getmany(timeout_ms=1000), 30, what="the record")
        assert [r.value for r in got] == [b"v"]
        # the response that brought the record turned the wait short, and no record for
        # IDLE_AFTER_S turns it long again
        assert gc.fetch_wait_ms() == klog.fetch_max_wait_ms < IDLE_WAIT_MS
        monkeypatch.setattr(kafka_fetch_wait, "IDLE_AFTER_S", 0.5)
        await wait_until(lambda: gc.fetch_wait_ms() == IDLE_WAIT_MS, 30, what="idle again")
    finally:
        await gc.close()
