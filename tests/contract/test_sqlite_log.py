"""SqliteEventLog across real OS processes: fencing, kill -9 atomicity, group expiry.

Child processes run small scripts (``python -c``) against the same database file and talk
to the test over stdin/stdout lines; every wait is a deadline on such a line or on a
condition read from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import signal
import sqlite3
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from chronolog.environment import boot_id, uptime
from chronolog.log import sqlite as sqlite_log
from chronolog.log.port import OutRecord, Record, Topics
from chronolog.log.record_codec import unpack
from chronolog.log.sqlite import SCHEMA_VERSION, ProcessLock, SqliteEventLog, group_path
from support.polling import wait_until

PARTITIONS = 4
DEADLINE_S = 30.0

_PRELUDE = """
import asyncio, os, sys
from chronolog.log.port import Fenced, OutRecord, Topics
from chronolog.log.sqlite import SqliteEventLog
DB, PREFIX = sys.argv[1], sys.argv[2]
def say(*parts):
    print(*parts, flush=True)
async def line():
    return (await asyncio.to_thread(sys.stdin.readline)).strip()
"""


class Child:
    """A child process speaking a line protocol on stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def expect(self, prefix: str, deadline_s: float = DEADLINE_S) -> str:
        assert self.proc.stdout is not None
        try:
            while True:
                raw = await asyncio.wait_for(self.proc.stdout.readline(), deadline_s)
                if not raw:
                    err = b""
                    if self.proc.stderr is not None:
                        err = await self.proc.stderr.read()
                    pytest.fail(f"child exited before {prefix!r}: {err.decode()[-2000:]}")
                text = raw.decode().strip()
                if text.startswith(prefix):
                    return text
        except TimeoutError:
            pytest.fail(f"child did not say {prefix!r} within {deadline_s}s")

    async def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    def kill9(self) -> None:
        if self.proc.returncode is None:
            # it may have exited already, not yet reaped by the event loop: nothing to kill
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)


Spawn = Callable[..., Awaitable[Child]]


@pytest.fixture
def topics(topic_prefix: str) -> Topics:
    return Topics(prefix=topic_prefix, partitions=PARTITIONS)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "log.db"


@pytest.fixture
async def log(db: Path, topics: Topics) -> AsyncIterator[SqliteEventLog]:
    lg = SqliteEventLog(db, topics, session_timeout_s=1.0, heartbeat_interval_s=0.2)
    await lg.start()
    await lg.ensure_topics()
    yield lg
    await lg.close()


@pytest.fixture
async def spawn(db: Path, topics: Topics) -> AsyncIterator[Spawn]:
    children: list[Child] = []

    async def _spawn(body: str, *args: str) -> Child:
        script = _PRELUDE + textwrap.dedent(body)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, str(db), topics.prefix, *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        child = Child(proc)
        children.append(child)
        return child

    yield _spawn
    for child in children:
        child.kill9()
        await child.proc.wait()


# ---------------------------------------------------------------------------------------


FENCED_CHILD = """
async def main():
    log = SqliteEventLog(DB, Topics(prefix=PREFIX, partitions=4))
    await log.start()
    owner = await log.acquire(0, "child")
    t = log.topics
    await owner.commit([OutRecord(t.events, None, b"child-1", partition=0)],
                       {(t.commands, 0): 1}, "processors")
    say("ready", owner.epoch)
    await line()
    try:
        await owner.commit([OutRecord(t.events, None, b"child-2", partition=0)],
                           {(t.commands, 0): 2}, "processors")
        say("committed")
    except Fenced:
        say("fenced")
    await log.close()
asyncio.run(main())
"""


async def test_acquire_in_another_process_fences_the_first(
    log: SqliteEventLog, spawn: Spawn
) -> None:
    t = log.topics
    child = await spawn(FENCED_CHILD)
    ready = await child.expect("ready")
    child_epoch = int(ready.split()[1])

    owner = await log.acquire(0, "parent")
    assert owner.epoch > child_epoch
    await child.send("go")
    assert await child.expect("") == "fenced"  # the next line the child prints
    assert await log.committed("processors", t.commands, 0) == 1  # its commit left nothing
    await owner.commit([OutRecord(t.events, None, b"parent-1", partition=0)],
                       {(t.commands, 0): 5}, "processors")
    values = [r.value for r in await log.read(t.events, 0, 0)]
    assert values == [b"child-1", b"parent-1"]
    assert await log.committed("processors", t.commands, 0) == 5
    assert await asyncio.wait_for(child.proc.wait(), DEADLINE_S) == 0


COMMIT_LOOP_CHILD = """
BATCH = int(sys.argv[3])
async def main():
    log = SqliteEventLog(DB, Topics(prefix=PREFIX, partitions=4))
    await log.start()
    t = log.topics
    lock = log.process_lock(0)
    assert lock.try_acquire()
    owner = await log.acquire(0, f"child-{os.getpid()}")
    batch = await log.committed("processors", t.commands, 0) or 0
    pad = b"x" * 280
    say("started", batch)
    while True:
        records = [OutRecord(t.events, None, b"%d:%d:" % (batch, j) + pad, partition=j % 4)
                   for j in range(BATCH)]
        await owner.commit(records, {(t.commands, 0): batch + 1}, "processors")
        batch += 1
asyncio.run(main())
"""


def _batches(db: Path, events: str) -> Counter[int]:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return Counter(
            int(unpack(codec, bytes(v)).split(b":", 1)[0])
            for v, codec in conn.execute("SELECT value, codec FROM records WHERE topic = ?",
                                         (events,))
        )
    finally:
        conn.close()


async def test_kill_9_during_commit_loop_leaves_no_partial_batch(
    log: SqliteEventLog, spawn: Spawn, db: Path
) -> None:
    t = log.topics
    batch_size = 1000
    rng = random.Random(1234)
    for round_ in range(3):
        before = await log.committed("processors", t.commands, 0) or 0
        child = await spawn(COMMIT_LOOP_CHILD, str(batch_size))
        started = await child.expect("started")
        assert int(started.split()[1]) == before  # restarts resume from the committed batch

        async def progressed(target: int = before + 2) -> bool:
            return (await log.committed("processors", t.commands, 0) or 0) >= target

        await wait_until(progressed, DEADLINE_S, interval=0.01,
                     what=f"round {round_}: the child to commit batches")
        # the optional process lock is held by the live child
        assert not ProcessLock(f"{db}.{t.prefix}owner-p0.lock").try_acquire()
        # fault injection at a random moment: commits of 1000 records take most of the time
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        child.kill9()
        assert await asyncio.wait_for(child.proc.wait(), DEADLINE_S) == -signal.SIGKILL

        committed = await log.committed("processors", t.commands, 0)
        assert committed is not None
        counts = _batches(db, t.events)
        # every batch is all-or-nothing, and exactly the batches the offsets say
        assert set(counts) == set(range(committed)), (committed, sorted(counts)[-3:])
        assert set(counts.values()) == {batch_size}
        ends = [await log.end_offset(t.events, p) for p in range(PARTITIONS)]
        assert sum(ends) == committed * batch_size

    # the lock died with its process: a standby can take it now
    lock = log.process_lock(0)
    assert await lock.acquire(timeout_s=DEADLINE_S)
    lock.release()


GROUP_CHILD = """
async def main():
    log = SqliteEventLog(DB, Topics(prefix=PREFIX, partitions=4),
                         session_timeout_s=1.0, heartbeat_interval_s=0.2)
    await log.start()
    gc = log.group_consumer("workers", [log.topics.commands], "member-child")
    await gc.start()
    say("joined")
    while True:
        await gc.getmany(timeout_ms=200)
asyncio.run(main())
"""


async def test_killed_member_expires_and_its_partitions_move(
    log: SqliteEventLog, spawn: Spawn
) -> None:
    t = log.topics
    everything = {(t.commands, p) for p in range(PARTITIONS)}
    gained: set[tuple[str, int]] = set()
    revoked: set[tuple[str, int]] = set()

    async def on_assigned(tps: set[tuple[str, int]]) -> None:
        gained.update(tps)

    async def on_revoked(tps: set[tuple[str, int]]) -> None:
        revoked.update(tps)

    gc = log.group_consumer("workers", [t.commands], "member-a", on_assigned, on_revoked)
    await gc.start()
    child = await spawn(GROUP_CHILD)
    await child.expect("joined")

    async def split() -> bool:
        await gc.getmany(timeout_ms=50)
        return len(gc.assignment()) == PARTITIONS // 2

    await wait_until(split, DEADLINE_S, interval=0.01,
                     what="the child to take half of the partitions")
    lost = everything - gc.assignment()
    assert revoked == lost
    child.kill9()
    await child.proc.wait()

    async def took_over() -> bool:
        await gc.getmany(timeout_ms=50)
        return gc.assignment() == everything

    await wait_until(took_over, DEADLINE_S, interval=0.01,
                     what="the dead member's partitions to come back")
    assert gained == everything
    await gc.close()


APPEND_CHILD = """
N = int(sys.argv[3])
async def main():
    log = SqliteEventLog(DB, Topics(prefix=PREFIX, partitions=4))
    await log.start()
    t = log.topics
    say("ready")
    await line()
    for i in range(N):
        await log.append([OutRecord(t.commands, None, b"%d:%d" % (os.getpid(), i), partition=1)])
    say("done")
    await log.close()
asyncio.run(main())
"""


async def test_concurrent_appends_from_processes_get_contiguous_unique_offsets(
    log: SqliteEventLog, spawn: Spawn
) -> None:
    t = log.topics
    per_child = 150
    children = [await spawn(APPEND_CHILD, str(per_child)) for _ in range(3)]
    for child in children:
        await child.expect("ready")
    for child in children:  # start them together: they contend for the write lock
        await child.send("go")
    for child in children:
        await child.expect("done")
    records = await log.read(t.commands, 1, 0, max_records=10_000)
    assert [r.offset for r in records] == list(range(3 * per_child))
    by_pid: dict[bytes, list[int]] = {}
    for r in records:
        pid, i = r.value.split(b":")
        by_pid.setdefault(pid, []).append(int(i))
    assert len(by_pid) == 3
    assert all(seq == list(range(per_child)) for seq in by_pid.values())  # per-process order


# ---------------------------------------------------------------------------------------
# commit_many: the optional MultiCommit capability (several owners, one transaction)


async def _values(lg: SqliteEventLog, topic: str, partition: int) -> list[bytes]:
    return [r.value for r in await lg.read(topic, partition, 0, 100)]


async def test_commit_many_commits_each_owner_atomically_with_its_offsets(
    log: SqliteEventLog,
) -> None:
    from chronolog.log.port import MultiCommit, Position

    assert isinstance(log, MultiCommit)
    t = log.topics
    o0, o1 = await log.acquire(0, "m"), await log.acquire(1, "m")
    seen: list[list[Position]] = []

    def then(positions: list[Position]) -> list[OutRecord]:
        seen.append(positions)
        return [OutRecord(t.replies, b"c", f"reply-{positions[0].offset}".encode(),
                          partition=positions[0].partition)]

    results = await log.commit_many([
        (o0, [OutRecord(t.events, None, b"e0", partition=0)], {(t.commands, 0): 5}, "g", then),
        (o1, [OutRecord(t.events, None, b"e1a", partition=1),
              OutRecord(t.events, None, b"e1b", partition=1)], {(t.commands, 1): 7}, "g", None),
    ])
    assert results[0] == [Position(t.events, 0, 0), Position(t.replies, 0, 0)]
    assert results[1] == [Position(t.events, 1, 0), Position(t.events, 1, 1)]
    assert seen == [[Position(t.events, 0, 0)]]
    assert await _values(log, t.events, 0) == [b"e0"]
    assert await _values(log, t.events, 1) == [b"e1a", b"e1b"]
    assert await _values(log, t.replies, 0) == [b"reply-0"]
    assert await log.committed("g", t.commands, 0) == 5
    assert await log.committed("g", t.commands, 1) == 7


async def test_commit_many_leaves_out_a_fenced_owner_and_an_owner_whose_then_fails(
    log: SqliteEventLog, db: Path, topics: Topics,
) -> None:
    from chronolog.log.port import Fenced

    t = log.topics
    old0, o1, o2 = await log.acquire(0, "old"), await log.acquire(1, "m"), await log.acquire(2, "m")
    other = SqliteEventLog(db, topics)  # a second process's log on the same file
    await other.start()
    try:
        new0 = await other.acquire(0, "new")  # fences old0

        def boom(_: object) -> list[OutRecord]:
            raise RuntimeError("then failed")

        results = await log.commit_many([
            (old0, [OutRecord(t.events, None, b"zombie", partition=0)],
             {(t.commands, 0): 3}, "g", None),
            (o1, [OutRecord(t.events, None, b"lost", partition=1)],
             {(t.commands, 1): 4}, "g", boom),
            (o2, [OutRecord(t.events, None, b"kept", partition=2)],
             {(t.commands, 2): 5}, "g", None),
        ])
        assert isinstance(results[0], Fenced)
        assert isinstance(results[1], RuntimeError)
        assert not isinstance(results[2], BaseException)
        assert await _values(log, t.events, 0) == []
        assert await _values(log, t.events, 1) == []
        assert await _values(log, t.events, 2) == [b"kept"]
        assert await log.committed("g", t.commands, 0) is None
        assert await log.committed("g", t.commands, 1) is None
        assert await log.committed("g", t.commands, 2) == 5
        # the fenced owner stays fenced; the others stay usable; the new owner writes
        with pytest.raises(Fenced):
            await old0.commit([], {(t.commands, 0): 9}, "g")
        await o1.commit([OutRecord(t.events, None, b"retry", partition=1)],
                        {(t.commands, 1): 4}, "g")
        await new0.commit([OutRecord(t.events, None, b"new", partition=0)],
                          {(t.commands, 0): 3}, "g")
        assert await _values(log, t.events, 0) == [b"new"]
        assert await _values(log, t.events, 1) == [b"retry"]
        # the failed batch took no offset: the next records of its partitions start at 0
        assert [r.offset for r in await log.read(t.events, 1, 0, 10)] == [0]
        assert [r.offset for r in await log.read(t.events, 2, 0, 10)] == [0]
    finally:
        await other.close()


async def test_commit_many_fails_an_owners_later_batches_once_one_of_them_failed(
    log: SqliteEventLog,
) -> None:
    """A later batch of one owner was decided on the state its failed batch left behind."""
    from chronolog.log.port import LogError as PortLogError

    t = log.topics
    o0, o1 = await log.acquire(0, "m"), await log.acquire(1, "m")

    def boom(_: object) -> list[OutRecord]:
        raise RuntimeError("then failed")

    results = await log.commit_many([
        (o0, [OutRecord(t.events, None, b"first", partition=0)], {(t.commands, 0): 1}, "g", boom),
        (o1, [OutRecord(t.events, None, b"other", partition=1)], {(t.commands, 1): 1}, "g", None),
        (o0, [OutRecord(t.events, None, b"second", partition=0)], {(t.commands, 0): 2}, "g", None),
    ])
    assert isinstance(results[0], RuntimeError)
    assert not isinstance(results[1], BaseException)
    assert isinstance(results[2], PortLogError) and "earlier batch" in str(results[2])
    assert await _values(log, t.events, 0) == []
    assert await _values(log, t.events, 1) == [b"other"]
    assert await log.committed("g", t.commands, 0) is None
    # two batches of one owner that both succeed apply in order, offsets of the last
    await log.commit_many([
        (o0, [OutRecord(t.events, None, b"a", partition=0)], {(t.commands, 0): 1}, "g", None),
        (o0, [OutRecord(t.events, None, b"b", partition=0)], {(t.commands, 0): 2}, "g", None),
    ])
    assert await _values(log, t.events, 0) == [b"a", b"b"]
    assert await log.committed("g", t.commands, 0) == 2


async def test_a_new_log_file_uses_pages_that_hold_a_record_without_overflow(
    log: SqliteEventLog, db: Path,
) -> None:
    """16 KiB pages: an event of a few KiB stays in its b-tree cell (4 KiB pages spilled
    every record over ~1 KB to an overflow page: 4x the file, ~3x the insert time)."""
    import sqlite3

    from chronolog.log.sqlite import PAGE_SIZE

    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 16384
    finally:
        conn.close()


async def test_logs_opening_one_new_file_at_once_all_start(tmp_path: Path) -> None:
    """Several openers of a file none has created yet (the services of one node starting
    together) wait for each other's file creation and WAL switch instead of failing."""
    for attempt in range(30):
        path = tmp_path / f"fresh{attempt}" / "log.db"
        logs = [SqliteEventLog(path, Topics(prefix="t.", partitions=PARTITIONS))
                for _ in range(4)]
        try:
            await asyncio.gather(*(lg.start() for lg in logs))
            await asyncio.gather(*(lg.ensure_topics() for lg in logs))
            assert await logs[0].partitions_for("t.commands") == PARTITIONS
        finally:
            for lg in logs:
                await lg.close()


async def test_a_compacted_topic_keeps_one_row_per_key(log: SqliteEventLog, db: Path) -> None:
    """The embedded log compacts on write: an append replaces the key's row (upsert)."""
    t = log.topics
    for round_ in range(3):
        await log.append([OutRecord(t.state, b"k%d" % i, b"v%d-%d" % (i, round_), partition=0)
                          for i in range(4)])
    got = await log.read(t.state, 0, 0)
    assert [(r.key, r.value) for r in got] == [(b"k%d" % i, b"v%d-2" % i) for i in range(4)]
    assert [r.offset for r in got] == [8, 9, 10, 11]  # offsets keep counting
    assert await log.end_offset(t.state, 0) == 12
    assert [r.value for r in await log.read(t.state, 0, 10)] == [b"v2-2", b"v3-2"]
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM compacted WHERE topic = ?",
                            (t.state,)).fetchone()[0]
        in_records = conn.execute("SELECT COUNT(*) FROM records WHERE topic = ?",
                                  (t.state,)).fetchone()[0]
    assert (rows, in_records) == (4, 0)
    with pytest.raises(Exception, match="needs a key"):
        await log.append([OutRecord(t.state, None, b"no key", partition=0)])


async def test_another_process_learns_a_compacted_topic_from_the_file(
    log: SqliteEventLog, db: Path, topics: Topics,
) -> None:
    """A log opened on the file later, without ensure_topics, writes the state topic the
    same way (compaction is a property of the topic in the file, not of the process)."""
    t = log.topics
    await log.append([OutRecord(t.state, b"k", b"first", partition=1)])
    other = SqliteEventLog(db, topics)
    await other.start()
    try:
        await other.append([OutRecord(t.state, b"k", b"second", partition=1)])
        assert [r.value for r in await other.read(t.state, 1, 0)] == [b"second"]
    finally:
        await other.close()


async def test_a_log_file_of_schema_1_gets_the_compacted_topics_when_opened(
    tmp_path: Path, topics: Topics,
) -> None:
    path = tmp_path / "old.db"
    first = SqliteEventLog(path, topics)
    await first.start()
    await first.close()
    with sqlite3.connect(path) as conn:  # what a file written before version 2 looks like
        conn.execute("DROP TABLE compacted")
        conn.execute("DROP TABLE compacted_topics")
        conn.execute("PRAGMA user_version = 1")
    again = SqliteEventLog(path, topics)
    await again.start()
    try:
        await again.ensure_topics()
        await again.append([OutRecord(topics.state, b"k", b"v", partition=0)])
        assert [r.value for r in await again.read(topics.state, 0, 0)] == [b"v"]
    finally:
        await again.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_records_are_stored_compressed_and_rows_of_an_older_file_read_as_they_were(
    tmp_path: Path,
) -> None:
    """The embedded log stores a record's value and headers with zstd and its dictionary
    (codec 1); a version-2 file's rows (no codec column) keep their plain bytes and read
    the same after the file is opened by this version."""
    db = tmp_path / "log.db"
    topics = Topics(prefix="c.", partitions=1)
    value = b'{"f":2,"k":"t/s","p":{"type":"AttemptClaimed","fence":3}}' * 3

    async def write(extra: bytes) -> list[Record]:
        async with SqliteEventLog(db, topics) as lg:
            await lg.ensure_topics()
            await lg.append([OutRecord(topics.events, b"t/s", value + extra, partition=0,
                                       headers=(("processor", b"p1"),))])
            return await lg.read(topics.events, 0, 0)

    first = asyncio.run(write(b""))
    assert [(r.value, r.headers) for r in first] == [(value, (("processor", b"p1"),))]
    conn = sqlite3.connect(db)
    try:
        stored, codec = conn.execute("SELECT value, codec FROM records").fetchone()
        assert codec == 1 and len(stored) < len(value) / 2
        # as a version-2 file: no codec column, plain rows
        conn.execute("UPDATE records SET value = ?, headers = NULL", (value,))
        conn.execute("ALTER TABLE records DROP COLUMN codec")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    finally:
        conn.close()
    both = asyncio.run(write(b"+"))
    assert [r.value for r in both] == [value, value + b"+"]
    assert _record_dictionary_sha() == RECORD_DICT_V1_SHA256


RECORD_DICT_V1_SHA256 = "99b2eaa9a093a15aaabca1d480aab1706fb025b6bfedcd45a6ae07740fd05753"


def _record_dictionary_sha() -> str:
    """The dictionary is part of the file format: a changed one would misread every row."""
    return hashlib.sha256(resources.files("chronolog.log.dictionaries").joinpath(
        "record_v1.zdict").read_bytes()).hexdigest()


async def test_reading_a_partition_count_again_never_hides_the_topic_from_a_group_member(
    log: SqliteEventLog,
) -> None:
    # What a projector's partition discovery does on a timer (partition_count, on the log's
    # reader thread) while the node's effect runner polls its group (its assignment computed
    # from the same counts on the event loop): the runner must not find the count missing
    # for the time of the read. It failed with KeyError: '<prefix>events' on an idle node.
    t = log.topics
    consumer = log.group_consumer("recount", [t.events], "member-a")
    await consumer.start()
    everything = {(t.events, p) for p in range(PARTITIONS)}
    await wait_until(lambda: consumer.assignment() == everything, DEADLINE_S)
    counts: list[int] = []

    async def recount() -> None:
        for _ in range(500):
            counts.append(await log.partition_count(t.events))

    # several at once: whenever the member polls, the log is reading a count again
    recounting = asyncio.gather(*(recount() for _ in range(4)))
    polls = 0
    while not recounting.done() or polls < 20:
        consumer.seek(t.events, polls % PARTITIONS, 0)  # its next poll looks at the group
        await consumer.getmany(timeout_ms=0)
        polls += 1
    await recounting
    assert counts == [PARTITIONS] * 2000
    assert consumer.assignment() == everything
    await consumer.close()


async def test_one_append_of_thousands_of_records_keeps_their_order_and_offsets(
    log: SqliteEventLog,
) -> None:
    """Rows go in multi-row inserts of up to 1,024, the rest in powers of two: every size
    from a full chunk down to one row, in order, with contiguous offsets."""
    t = log.topics
    n = 1024 + 1023  # a full chunk, then 512 + 256 + ... + 1
    positions = await log.append([OutRecord(t.events, None, b"r%d" % i, partition=3)
                                  for i in range(n)])
    assert [p.offset for p in positions] == list(range(n))
    records = await log.read(t.events, 3, 0, max_records=10_000)
    assert [r.value for r in records] == [b"r%d" % i for i in range(n)]
    assert [r.offset for r in records] == list(range(n))


async def test_a_group_member_stays_in_while_its_logs_writer_is_held_longer_than_a_session(
    log: SqliteEventLog, db: Path, topics: Topics
) -> None:
    """Heartbeats have a writer of their own: a commit that holds the log's writer for
    longer than the group session (a processor's snapshot chunk of millions of schedules)
    does not delay the member's renewals, and nobody takes its partitions meanwhile."""
    member = log.group_consumer("g", [topics.commands], "m1")
    await member.start()
    try:
        held = 3 * log.session_timeout_s
        until_before = _heartbeat_until(db, "m1")
        hold = asyncio.create_task(log._w.run(lambda _conn: time.sleep(held)))
        renewals: list[float] = []
        while not hold.done():
            renewals.append(_heartbeat_until(db, "m1"))
            assert member.joined() and len(member.assignment()) == PARTITIONS
            await asyncio.wait({hold}, timeout=log.heartbeat_interval_s)
        await hold
        assert renewals[-1] - until_before >= held - log.session_timeout_s, renewals
    finally:
        await member.close()


def _heartbeat_until(db: Path, member_id: str) -> float:
    with contextlib.closing(sqlite3.connect(group_path(db))) as conn:
        row = conn.execute("SELECT heartbeat_until FROM members WHERE member_id = ?",
                           (member_id,)).fetchone()
    return float(row[0]) if row else 0.0


_HOLD_THE_WRITE_LOCK = textwrap.dedent("""
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
""")


async def test_a_group_member_stays_in_while_another_process_holds_the_logs_write_lock(
    log: SqliteEventLog, db: Path, topics: Topics
) -> None:
    """Membership is in a file of its own: another process holding the log file's write
    lock for three sessions (other processors committing back to back, each taking the
    lock before this one's turn) does not hold the member's renewals back: it stays in the
    group with all its partitions."""
    revoked: list[set[tuple[str, int]]] = []

    async def on_revoked(parts: set[tuple[str, int]]) -> None:
        revoked.append(parts)

    member = log.group_consumer("g", [topics.commands], "m1", on_revoked=on_revoked)
    await member.start()
    held = 3 * log.session_timeout_s
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLD_THE_WRITE_LOCK, str(db), str(held),
        stdout=asyncio.subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), 30) == b"held\n"
        with (pytest.raises(sqlite3.OperationalError, match="locked"),
              contextlib.closing(sqlite3.connect(db, timeout=0)) as probe):
            probe.execute("BEGIN IMMEDIATE")  # the lock is really held
        before = _heartbeat_until(db, "m1")
        renewals: list[float] = []
        while holder.returncode is None:
            await member.getmany(timeout_ms=int(log.heartbeat_interval_s * 1000))
            renewals.append(_heartbeat_until(db, "m1"))
            assert member.joined() and len(member.assignment()) == PARTITIONS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(holder.wait(), 0.01)
        assert renewals[-1] - before >= held - log.session_timeout_s, renewals
        assert revoked == []
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()
        await member.close()


async def test_a_group_member_whose_event_loop_is_held_stays_in_through_its_keep_alive(
    log: SqliteEventLog, db: Path, topics: Topics
) -> None:
    """The event loop held for three sessions (a processor encoding a snapshot chunk): the
    keep-alive thread renews the membership meanwhile, so the member is still in with all
    its partitions and nothing was revoked."""
    revoked: list[set[tuple[str, int]]] = []

    async def on_revoked(parts: set[tuple[str, int]]) -> None:
        revoked.append(parts)

    member = log.group_consumer("g", [topics.commands], "m1", on_revoked=on_revoked)
    await member.start()
    try:
        await member.getmany(timeout_ms=0)
        before = _heartbeat_until(db, "m1")
        time.sleep(3 * log.session_timeout_s)  # noqa: ASYNC251 - the fault: the loop held
        after = _heartbeat_until(db, "m1")
        assert after - before >= log.session_timeout_s, (before, after)
        assert member.joined()
        await member.getmany(timeout_ms=0)
        assert revoked == [] and len(member.assignment()) == PARTITIONS
    finally:
        await member.close()


async def test_a_member_that_stopped_polling_is_not_kept_alive(
    db: Path, topics: Topics
) -> None:
    """The keep-alive renews only while the member polls (``max_poll_interval_s``): a
    process whose loop is stuck for good leaves its group like a dead one."""
    log = SqliteEventLog(db, topics, session_timeout_s=1.0, heartbeat_interval_s=0.2,
                         max_poll_interval_s=0.5)
    await log.start()
    await log.ensure_topics()
    member = log.group_consumer("g", [topics.commands], "m1")
    await member.start()
    try:
        await member.getmany(timeout_ms=0)
        time.sleep(3 * log.session_timeout_s)  # noqa: ASYNC251 - the loop held for good
        assert _heartbeat_until(db, "m1") < uptime()  # expired: out of the group
        assert not member.joined()
    finally:
        await member.close()
        await log.close()


class _Member:
    """A group member of its own log (as a process would be), with what it was assigned and
    what was revoked from it."""

    def __init__(self, db: Path, topics: Topics, member_id: str, settle_s: float) -> None:
        self.log = SqliteEventLog(db, topics)
        self.topics = topics
        self.member_id = member_id
        self.settle_s = settle_s
        self.gained: list[set[tuple[str, int]]] = []
        self.revoked: list[set[tuple[str, int]]] = []
        self.consumer: Any = None

    async def join(self) -> None:
        async def on_assigned(tps: set[tuple[str, int]]) -> None:
            self.gained.append(set(tps))

        async def on_revoked(tps: set[tuple[str, int]]) -> None:
            self.revoked.append(set(tps))

        await self.log.start()
        await self.log.ensure_topics()
        self.consumer = self.log.group_consumer(
            "g", [self.topics.commands], self.member_id, on_assigned, on_revoked,
            settle_s=self.settle_s)
        await self.consumer.start()

    async def close(self) -> None:
        if self.consumer is not None:
            await self.consumer.close()
        await self.log.close()


async def _shares(members: list[_Member]) -> list[set[int]]:
    for m in members:
        await m.consumer.getmany(timeout_ms=0)
    return [{p for _, p in m.consumer.assignment()} for m in members]


async def test_processes_joining_a_forming_group_each_take_their_share_once(
    db: Path, topics: Topics
) -> None:
    """Three members join one after another, each within ``settle_s`` of the one before
    (processes started together): none takes anything until the joins pause, then each
    takes its own share once — nothing is assigned twice, nothing revoked. Without the wait
    the first member took every partition and lost most of them a moment later."""
    members = [_Member(db, topics, f"m{i}", settle_s=2.5) for i in range(3)]
    try:
        for m in members:
            await m.join()

        async def formed() -> bool:
            return sum(map(len, await _shares(members))) == PARTITIONS

        await wait_until(formed, DEADLINE_S, interval=0.05, what="the group to form")
        shares = await _shares(members)
        assert sorted(map(len, shares)) == [1, 1, 2]  # the range assignment of 4 over 3
        assert set().union(*shares) == set(range(PARTITIONS))
        for m, share in zip(members, shares, strict=True):
            assert m.revoked == [], (m.member_id, m.revoked)
            assert m.gained == [{(topics.commands, p) for p in share}], (m.member_id, m.gained)
    finally:
        for m in members:
            await m.close()


async def test_a_member_joining_a_formed_group_takes_its_share_at_once(
    db: Path, topics: Topics
) -> None:
    """Once a group has formed, a member that joins is assigned its share as it starts, and
    the others give up exactly that share (no second wait: the group does not form again)."""
    first, second = _Member(db, topics, "m0", 0.3), _Member(db, topics, "m1", 0.3)
    try:
        await first.join()

        async def first_has_all() -> bool:
            return len((await _shares([first]))[0]) == PARTITIONS

        await wait_until(first_has_all, DEADLINE_S, interval=0.02,
                         what="the first member to have every partition")
        await second.join()
        mine = {p for _, p in second.consumer.assignment()}
        assert mine and len(mine) == PARTITIONS // 2
        await first.consumer.getmany(timeout_ms=0)
        assert first.revoked == [{(topics.commands, p) for p in mine}]
        assert {p for _, p in first.consumer.assignment()} == set(range(PARTITIONS)) - mine
    finally:
        await second.close()
        await first.close()


async def test_a_group_file_of_the_version_before_loses_its_members_rows_when_opened(
    db: Path, topics: Topics
) -> None:
    """A group file written before members recorded when they joined, and before its times
    were on the machine's uptime clock, gets the column when opened, and its rows — wall-clock
    times, of members of the version before — are deleted: a member that joins is alone."""
    with contextlib.closing(sqlite3.connect(group_path(db))) as conn:
        conn.execute("CREATE TABLE members (grp TEXT NOT NULL, member_id TEXT NOT NULL, "
                     "topics TEXT NOT NULL, heartbeat_until REAL NOT NULL, "
                     "PRIMARY KEY (grp, member_id)) WITHOUT ROWID")
        conn.execute("INSERT INTO members VALUES ('g', 'old', ?, ?)",
                     (f'["{topics.commands}"]', time.time() + 60))
        conn.commit()
    member = _Member(db, topics, "new", settle_s=0.0)
    try:
        await member.join()
        assert len(member.consumer.assignment()) == PARTITIONS
        with contextlib.closing(sqlite3.connect(group_path(db))) as conn:
            assert conn.execute("SELECT member_id FROM members").fetchall() == [("new",)]
            columns = {row[1] for row in conn.execute("PRAGMA table_info(members)")}
            assert "joined_at" in columns
    finally:
        await member.close()


async def test_a_group_file_of_another_boot_loses_its_members_rows_when_opened(
    db: Path, topics: Topics
) -> None:
    """The members' times are on the machine's uptime clock, which starts again at each
    boot: rows written in another boot (whose processes are gone) are deleted when the file
    is opened, however far ahead their expiry looks — and rows of this boot are kept."""
    first = _Member(db, topics, "first", settle_s=0.0)
    await first.join()
    await first.close()
    with contextlib.closing(sqlite3.connect(group_path(db))) as conn:
        conn.execute("INSERT INTO members VALUES ('g', 'ghost', ?, ?, 0)",
                     (f'["{topics.commands}"]', uptime() + 3600))
        conn.execute("UPDATE group_clock SET boot_id = 'a boot before this one'")
        conn.commit()
    member = _Member(db, topics, "new", settle_s=0.0)
    try:
        await member.join()
        assert len(member.consumer.assignment()) == PARTITIONS
        with contextlib.closing(sqlite3.connect(group_path(db))) as conn:
            assert conn.execute("SELECT member_id FROM members").fetchall() == [("new",)]
            assert conn.execute("SELECT boot_id FROM group_clock").fetchall() == [(boot_id(),)]
    finally:
        await member.close()


async def test_the_write_ahead_log_is_truncated_past_its_limit_while_readers_never_stop(
    db: Path, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers that overlap without a gap (the pollers and restores of several processes)
    keep SQLite's own checkpoints from ever starting the write-ahead log over: at 10,000,000
    schedules it grew to 71 GB and filled the disk. Past ``wal_limit_bytes`` a writer folds
    it into the database and truncates it: with two readers of which one is always reading,
    ten times the limit written, the WAL comes back under its limit (a truncation may have
    to wait for the readers, and try again), and every record is there."""
    monkeypatch.setattr(sqlite_log, "WAL_CHECK_S", 0.0)  # look after every commit
    limit = 2 * 2**20
    log = SqliteEventLog(db, topics, wal_limit_bytes=limit)
    await log.start()
    await log.ensure_topics()
    stop = threading.Event()
    read_txns = [0, 0]

    def read_without_a_gap(i: int) -> None:
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
            time.sleep(0.01 * i)  # the two readers' transactions overlap
            while not stop.is_set():
                conn.execute("BEGIN")
                conn.execute("SELECT count(*) FROM log_ends").fetchone()
                time.sleep(0.02)
                conn.execute("COMMIT")
                read_txns[i] += 1

    readers = [threading.Thread(target=read_without_a_gap, args=(i,)) for i in range(2)]
    for t in readers:
        t.start()
    wal = Path(f"{db}-wal")
    n = 0

    async def append(records: int) -> None:
        nonlocal n
        await log.append([OutRecord(topics.events, None, os.urandom(4096), partition=0)
                          for _ in range(records)])
        n += records

    def wal_size() -> int:
        return wal.stat().st_size if wal.exists() else 0

    async def back_under_its_limit() -> bool:
        await append(1)  # a truncation that found readers is tried again after a commit
        return wal_size() <= limit

    try:
        for _ in range(100):  # 100 commits of 50 incompressible 4 KB records: 20 MB
            await append(50)
        # without the truncation it only grows: 105 MB here for the 20 MB written
        await wait_until(back_under_its_limit, 60, what=f"the WAL under {limit} bytes",
                         interval=0.05)
    finally:
        stop.set()
        for t in readers:
            await asyncio.to_thread(t.join, 10)
        await log.close()
    assert min(read_txns) > 10, read_txns  # the readers were reading throughout
    async with SqliteEventLog(db, topics) as again:
        records = await again.read(topics.events, 0, 0, max_records=n + 1)
    assert len(records) == n
