"""SqliteEventLog: the EventLog port on one SQLite database file (WAL mode).

The embedded backend for a single machine. Several OS processes (a processor, workers, a
projector, the CLI) may open the same file; SQLite's own locking serializes the writers and
WAL lets readers run alongside them.

Durability
    ``journal_mode=WAL`` with ``synchronous=FULL`` by default: every commit fsyncs the WAL
    before it returns, so "the log is durable before a reply is sent" holds even across a
    power loss. ``NORMAL`` would survive a process crash (``kill -9``) but may lose the last
    commits on power loss — too weak for the guarantee. FULL costs one fsync per *commit*,
    not per record, so processors batch (one ``owner.commit`` per batch of commands).
    ``synchronous`` is a constructor argument for benchmarks and throwaway logs.

Schema (``PRAGMA user_version`` = 2)
    ``topics(topic, partitions)``; ``records(topic, partition, offset, key, value, headers,
    ts)`` WITHOUT ROWID, primary key (topic, partition, offset); ``log_ends(topic, partition,
    next_offset)`` — the next offset of every partition, updated in the appending
    transaction; ``group_offsets(grp, topic, partition, next_offset)``; ``owners(name, epoch,
    owner_id, acquired_ms)`` — one row per ``<prefix>processor-p<n>``. Version 2 added the
    compacted topics (below); a version-1 file gets their tables when it is opened. Group
    membership is in a file of its own beside the log (``<log>-group``, below); a
    ``members`` table left in a log file by an older version is not used.

Compacted topics
    A topic listed in ``compacted_topics`` (the ``state`` topic: ``Topics.compacted``) keeps
    only the latest record of each key, as a fully compacted Kafka topic does: its records
    live in ``compacted(topic, partition, offset, key, value, headers, ts)``, primary key
    (topic, partition, offset) — a read from an offset is one sequential scan, as in
    ``records`` — with a unique index on (topic, partition, key): an append *replaces* the
    key's row (upsert) with a new offset from ``log_ends``. So reading a partition from 0
    gives every key's latest value, in the order they were written; offsets have gaps where
    older values were. A key is required.

Page size
    New files get 16 KiB pages (``PAGE_SIZE``). ``records`` is a WITHOUT ROWID table, whose
    cells spill to an overflow page above about 1 KB with 4 KiB pages — and a
    ``ScheduleCreated`` event is about 1 KB: an insert then costs several times as much and
    the file grows 4x (docs/run-path.md). With 16 KiB pages records up to about 4 KB stay in
    their cell. An
    existing file keeps the page size it was created with (WAL mode cannot change it).
Ownership and fencing
    ``acquire(p)`` bumps the epoch of ``<prefix>processor-p<p>`` in one IMMEDIATE transaction.
    ``owner.commit`` opens ``BEGIN IMMEDIATE`` (the database write lock), checks the stored
    epoch is still its own — otherwise it rolls back and raises ``Fenced`` — then appends
    the records (then the records of the optional ``then(positions)`` callback) and upserts
    the group offsets, and commits: all or nothing. Because the check
    and the writes happen under the one write lock, an older owner can never write once a
    newer ``acquire`` has committed, whichever process it lives in. ``ProcessLock`` (an
    ``fcntl.flock`` on ``<db>.<prefix>owner-p<n>.lock``) is an optional helper that lets a
    standby processor *wait* for the active one to die before acquiring; it is advisory and
    not needed for safety — the epoch check is what guarantees it.

Consumer groups
    Members upsert ``members(grp, member_id, topics, heartbeat_until)`` in the *group file*
    ``<log>-group`` (WAL, like the log) every ``heartbeat_interval_s``; a member whose
    ``heartbeat_until`` (now + ``session_timeout_s``) has passed is not live and its row is
    deleted by the next heartbeat of any member. "Now" is the machine's uptime clock
    (``_group_now``), not the wall clock: a wall clock stepped forward would lapse every
    member at once, one stepped back would hold a forming group for the size of the step.
    The file records the boot its times belong to; opened in another boot, its members are
    deleted (they are gone, and the clock started again).
    Assignment is deterministic: for every topic, Kafka's *range* assignment of its
    partitions over the sorted ids of the live members subscribed to it (so partition p of
    co-partitioned topics goes to the same member). Every member recomputes it in
    ``getmany`` whenever the database changed; on a change it awaits ``on_revoked(lost)``
    then ``on_assigned(gained)`` before it returns more records, and starts a gained
    partition at the group's committed offset (or 0). During a hand-over two members can
    briefly both read a partition: delivery is at least once (duplicates, never losses), as
    with Kafka. ``close()`` leaves the group (deletes the row) without calling
    ``on_revoked`` — like aiokafka's ``stop()``.

    A group that forms waits before its first assignment, as a Kafka broker does for
    ``group.initial.rebalance.delay.ms``: a member's row records when it joined
    (``joined_at``, again after a lapse), and a member whose consumer has a ``settle_s``
    takes nothing until ``settle_s`` has passed without a join since the first live member
    joined (at most ``GROUP_FORMING_MAX_S`` after it); a member joining a formed group is
    assigned its share at once. Processors started together then each restore their own
    share once; without it the first to join took every partition and began restoring
    them, the others fenced it a moment later, and its restores were wasted — a restart of
    three processors on 1,000,000 schedules spent 12 s where its restores needed 5
    (docs/performance.md).

    The heartbeats run on the event loop, which a processor can hold for seconds (a snapshot
    chunk of a partition of a million schedules encoded, states installed after a restore).
    Like Kafka's background heartbeat thread, a *keep-alive* thread per member renews a live
    membership whose loop has not for two heartbeat intervals — it only moves
    ``heartbeat_until`` of a row that has not expired, it never rejoins — as long as the
    member polled (``getmany``) within ``max_poll_interval_s`` (Kafka's
    ``max.poll.interval.ms``): a process whose loop is stuck for good leaves the group.

    Why a file of its own: a renewal is a write, and every write to one SQLite file waits
    for that file's one write lock. In the log's file a renewal competed with every commit
    of every process. A process whose event loop keeps the GIL busy (a processor folding a
    partition of 800,000 schedules) takes each turn at the lock late, and while the other
    processors committed back to back (their first snapshot rounds at 10,000,000
    schedules) its renewals missed the lock for longer than the session: the group took its
    partitions mid-take-over, again and again. In the group file a renewal waits only for
    other renewals. A member's reader sees both files (the group file attached as ``grp``)
    and recomputes the assignment when either changed (``data_version`` of both).

Async
    Each log has three connections, each driven by its own single-thread executor: a writer
    (all transactions of the log), a reader (all queries; the group file attached), so
    polling readers never queue behind a writer that waits for the database lock, and a
    writer of the group file (heartbeats, joining, leaving), so a renewal never queues
    behind the log's commits. ``read(timeout_ms=...)`` and ``getmany`` check
    ``PRAGMA data_version`` (a counter that moves when another connection commits) and only
    re-run their queries when it moved. Between checks they wait on the log's doorbell
    (``chronolog.log.doorbell``), which every writer rings after each commit, so a reader
    wakes as soon as any process writes; ``poll_idle_s`` bounds the wait in case a ring is
    lost. Without a doorbell (no abstract sockets) they poll with a short, backing-off
    interval. The writer waits for the database write lock in its own short steps
    (``_begin``), not in SQLite's busy handler, whose sleeps grow to 100 ms, and writers take
    turns at it (``chronolog.log.write_turns``). A transaction is placed in memory and
    written in a few statements (``_Writes``): each statement gives up the GIL, and taking
    it back beside a busy event loop costs up to the switch interval.

A full disk
    A write that finds no room (SQLITE_FULL) is rolled back whole and raises ``LogFull``
    (a ``LogUnavailable`` naming the disk full): an append, a commit or a group heartbeat
    fails, nothing of it is visible, and the file stays consistent (WAL: the failed frames
    are never committed). Once space is freed, writes succeed again; a processor drops the
    partitions whose commit failed and takes them over again from the log.

Write-ahead log
    SQLite folds the WAL into the database after commits (its automatic checkpoint), but it
    starts the file over only at a moment when no reader uses frames of it. The processes of
    a deployment read without a gap (every poller, every restore), so that moment never came:
    the WAL only grew — 71 GB, and a full disk, during the first snapshot round of
    10,000,000 schedules. After a commit of this process's writer, at most every
    ``WAL_CHECK_S``, a WAL larger than ``wal_limit_bytes`` (256 MiB) is folded in whole and
    truncated (``PRAGMA wal_checkpoint(TRUNCATE)``) on a connection and thread of their own:
    that checkpoint holds new writers back while it waits, at most
    ``WAL_TRUNCATE_WAIT_MS``, for the readers of older frames to finish; if they do not,
    the next look tries again.

Offsets are contiguous (0, 1, 2, ...): there are no transaction markers as in Kafka.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import functools
import json
import logging
import math
import operator
import os
import random
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from chronolog.environment import boot_id, uptime
from chronolog.log.datadir import PRIVATE_FILE, private_dir, tighten
from chronolog.log.doorbell import ALL, Doorbell, topic_bit
from chronolog.log.partitioner import partition_for, range_assign
from chronolog.log.port import (
    WAKE_HEADER,
    Fenced,
    LogError,
    LogFull,
    LogUnavailable,
    Offsets,
    OutRecord,
    Position,
    RebalanceCallback,
    Record,
    ThenCallback,
    Topics,
    refuse_deletion,
)
from chronolog.log.record_codec import CODEC_ZSTD_DICT_1, pack, pack_many, unpack_many
from chronolog.log.write_turns import SUFFIX as WRITE_TURNS_SUFFIX
from chronolog.log.write_turns import WriteTurns

__all__ = ["ProcessLock", "SqliteEventLog", "SqliteGroupConsumer", "SqlitePartitionOwner"]

log = logging.getLogger(__name__)

T = TypeVar("T")
TP = tuple[str, int]
Member = tuple[str, list[str], float]  # a live member: its id, its topics, when it joined

SCHEMA_VERSION = 3
PAGE_SIZE = 16384
_HEARTBEAT_SUMMARY_S = 30.0  # failing heartbeats: one log line per this many seconds
# the write-ahead log's size past which it is folded into the database and truncated
# (module docstring, "Write-ahead log"), how often a writer looks at it, and how long the
# truncating checkpoint waits for the readers of older frames
WAL_LIMIT_BYTES = 256 * 2**20
WAL_CHECK_S = 1.0
WAL_TRUNCATE_WAIT_MS = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    topic       TEXT PRIMARY KEY,
    partitions  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    offset      INTEGER NOT NULL,
    key         BLOB,
    value       BLOB NOT NULL,
    headers     BLOB,
    ts          INTEGER NOT NULL,
    codec       INTEGER,
    PRIMARY KEY (topic, partition, offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_ends (
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets (
    grp         TEXT NOT NULL,
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS owners (
    name        TEXT PRIMARY KEY,
    epoch       INTEGER NOT NULL,
    owner_id    TEXT NOT NULL,
    acquired_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS compacted_topics (
    topic       TEXT PRIMARY KEY
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS compacted (
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    offset      INTEGER NOT NULL,
    key         BLOB NOT NULL,
    value       BLOB NOT NULL,
    headers     BLOB,
    ts          INTEGER NOT NULL,
    PRIMARY KEY (topic, partition, offset)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS compacted_by_key ON compacted (topic, partition, key);
"""

# the group file's tables (module docstring, "Consumer groups"): the members, their times
# on the machine's uptime clock (``_group_now``), and the boot those times belong to
_GROUP_SCHEMA = """
CREATE TABLE IF NOT EXISTS members (
    grp             TEXT NOT NULL,
    member_id       TEXT NOT NULL,
    topics          TEXT NOT NULL,
    heartbeat_until REAL NOT NULL,
    joined_at       REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (grp, member_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_clock (
    one     INTEGER PRIMARY KEY CHECK (one = 1),
    boot_id TEXT NOT NULL
)
"""
# a group whose members all joined this recently is forming (``SqliteGroupConsumer``, module
# docstring "Consumer groups"): its first assignment waits, at most this long after the first
# member joined, for the others
GROUP_FORMING_MAX_S = 10.0
GROUP_SUFFIX = "-group"  # beside the log file: its consumer groups' membership


def group_path(path: str | Path) -> Path:
    """The file holding the membership of the consumer groups of the log at ``path``."""
    return Path(f"{path}{GROUP_SUFFIX}")


_UPSERT_OFFSET = (
    "INSERT INTO group_offsets (grp, topic, partition, next_offset) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (grp, topic, partition) DO UPDATE SET next_offset = excluded.next_offset"
)
_UPSERT_END = (
    "INSERT INTO log_ends (topic, partition, next_offset) VALUES (?, ?, ?) "
    "ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset"
)
_SELECT_RECORDS = (
    "SELECT offset, key, value, headers, ts, codec FROM records "
    "WHERE topic = ? AND partition = ? AND offset >= ? ORDER BY offset LIMIT ?"
)
_SELECT_COMPACTED = (
    "SELECT offset, key, value, headers, ts, NULL FROM compacted "
    "WHERE topic = ? AND partition = ? AND offset >= ? ORDER BY offset LIMIT ?"
)
_UPSERT_COMPACTED = (
    "INSERT INTO compacted (topic, partition, key, offset, value, headers, ts) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (topic, partition, key) DO UPDATE SET "
    "offset = excluded.offset, value = excluded.value, headers = excluded.headers, "
    "ts = excluded.ts"
)


class _TopicCache(dict[str, int]):
    """topic -> partition count, and which topics are compacted. A count only grows
    (``add_partitions``); one cached by a process is refreshed when it meets a larger
    partition number, and by its group consumers' polls."""

    def __init__(self) -> None:
        super().__init__()
        self.compacted: set[str] = set()


def _select_for(cache: dict[str, int], topic: str) -> str:
    compacted = getattr(cache, "compacted", ())
    return _SELECT_COMPACTED if topic in compacted else _SELECT_RECORDS


# ---------------------------------------------------------------------------------------
# helpers


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _encode_headers(headers: Sequence[tuple[str, bytes]]) -> bytes | None:
    """Length-prefixed encoding: per header u16 name length, u32 value length, name, value."""
    if not headers:
        return None
    parts: list[bytes] = []
    for name, value in headers:
        raw = name.encode()
        parts.append(struct.pack("<HI", len(raw), len(value)))
        parts.append(raw)
        parts.append(bytes(value))
    return b"".join(parts)


def _decode_headers(blob: bytes | None) -> tuple[tuple[str, bytes], ...]:
    if not blob:
        return ()
    out: list[tuple[str, bytes]] = []
    i, n = 0, len(blob)
    while i < n:
        nlen, vlen = struct.unpack_from("<HI", blob, i)
        i += 6
        name = blob[i : i + nlen].decode()
        i += nlen
        out.append((name, bytes(blob[i : i + vlen])))
        i += vlen
    return tuple(out)


def _is_busy(exc: sqlite3.Error) -> bool:
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


def _is_full(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL: the disk (or the file system's quota) has no room for the write."""
    return (getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
            or "disk is full" in str(exc).lower())


class _LogConnection(sqlite3.Connection):
    """A connection that knows how long its writer may wait for the write lock."""

    wait_s: float = 10.0
    rung: int = 0  # doorbell bits of what the current write transaction wrote
    turns: WriteTurns | None = None  # a writer connection's turns at the write lock


def _rings(conn: sqlite3.Connection, mask: int) -> None:
    """After this transaction commits, ring the doorbell of the readers of ``mask``."""
    if isinstance(conn, _LogConnection):
        conn.rung |= mask


def _begin(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``, waiting for another process's write transaction in short steps.

    SQLite's own busy handler sleeps 1, 2, 5, 10, ... up to 100 ms between tries, so under
    contention a lock freed after one fsync is taken tens of milliseconds later; here the
    writer connection has no busy timeout and retries every 0.1-0.5 ms up to ``wait_s``.
    Writers take turns (``chronolog.log.write_turns``): one that is not waiting first lets
    in those that are, and one that has to wait says so while it tries again.
    """
    turns: WriteTurns | None = getattr(conn, "turns", None)
    if turns is not None:
        turns.let_others_in()
    try:
        conn.execute("BEGIN IMMEDIATE")
        return
    except sqlite3.OperationalError as exc:
        if not _is_busy(exc):
            raise
    deadline = time.monotonic() + getattr(conn, "wait_s", 10.0)
    pause = 0.0001
    with turns.waiting() if turns is not None else contextlib.nullcontext():
        while True:
            time.sleep(pause)
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    raise
            pause = min(pause * 2, 0.0005)


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # pragma: no cover - the connection is already in trouble
            log.exception("rollback failed")


class _Conn:
    """One sqlite3 connection confined to one dedicated thread."""

    def __init__(self, path: str, name: str, busy_timeout_ms: int, synchronous: str,
                 writer: bool = False, after_write: Callable[[int], None] | None = None,
                 attach_group: str | None = None) -> None:
        self._path = path
        self._attach_group = attach_group  # attached read-side as ``grp`` (its members)
        self._writer = writer
        self._after_write = after_write
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: _LogConnection | None = None

    def _open(self) -> None:
        conn = sqlite3.connect(
            self._path,
            isolation_level=None,  # autocommit; transactions are explicit BEGIN/COMMIT
            timeout=self._busy_timeout_ms / 1000,
            factory=_LogConnection,
        )
        conn.wait_s = self._busy_timeout_ms / 1000
        # opening may meet another process creating the file or switching it to WAL: wait
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        if self._attach_group is not None:
            conn.execute("ATTACH DATABASE ? AS grp", (self._attach_group,))
        if self._writer:
            # the writer waits for the write lock in _begin, in steps far shorter than SQLite's
            conn.execute("PRAGMA busy_timeout = 0")
            conn.turns = WriteTurns(self._path)
        self._conn = conn

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on this connection's thread, mapping SQLite errors."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._call, fn, *args))

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``run`` for a caller on another thread than the event loop's (blocks it)."""
        return self.submit(fn, *args).result()

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """``run`` without waiting, from any thread: the outcome's future."""
        return self._executor.submit(functools.partial(self._call, fn, *args))

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._conn is None:
            self._open()
        assert self._conn is not None
        try:
            result = fn(self._conn, *args)
            mask, self._conn.rung = self._conn.rung, 0
            if self._after_write is not None and mask:
                self._after_write(mask)
            return result
        except sqlite3.Error as exc:
            self._conn.rung = 0
            _rollback(self._conn)
            if _is_full(exc):
                raise LogFull(f"sqlite log {self._path}: disk full, nothing written "
                              f"({exc})") from exc
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise LogUnavailable(f"sqlite log {self._path} is locked: {exc}") from exc
            raise LogError(f"sqlite log {self._path}: {exc}") from exc
        except BaseException:
            self._conn.rung = 0
            _rollback(self._conn)
            raise

    async def close(self) -> None:
        def _close(_: Any) -> None:
            if self._conn is not None:
                if self._conn.turns is not None:
                    self._conn.turns.close()
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, functools.partial(_close, None))
        self._executor.shutdown(wait=False)


# ---------------------------------------------------------------------------------------
# blocking operations (run on a connection's thread)


def _wal(conn: sqlite3.Connection) -> None:
    """Switch the connection's file to WAL (persistent: a no-op once it is)."""
    # switching a new file to WAL may meet another opener doing the same; SQLite answers
    # that with SQLITE_BUSY at once (its busy handler is not called for a journal-mode
    # change), so the wait is here
    deadline = time.monotonic() + getattr(conn, "wait_s", 10.0)
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            break
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.005 + random.random() * 0.01)
    if str(mode).lower() != "wal":
        raise LogError(f"could not switch the sqlite log to WAL (journal_mode={mode})")


def _setup_group(conn: sqlite3.Connection) -> None:
    """The group file (its own connection): WAL and its tables. Rows written in another
    boot of the machine (or by a version that kept wall-clock times) are of members that are
    gone, on a clock that started again: they are deleted."""
    _wal(conn)
    _begin(conn)
    for stmt in _GROUP_SCHEMA.split(";"):
        conn.execute(stmt)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(members)")}
    if "joined_at" not in columns:  # a group file of the version before: members of old
        conn.execute("ALTER TABLE members ADD COLUMN joined_at REAL NOT NULL DEFAULT 0")
    boot = boot_id()
    row = conn.execute("SELECT boot_id FROM group_clock WHERE one = 1").fetchone()
    if row is None or row[0] != boot:
        conn.execute("DELETE FROM members")
        conn.execute("INSERT INTO group_clock (one, boot_id) VALUES (1, ?) ON CONFLICT (one) "
                     "DO UPDATE SET boot_id = excluded.boot_id", (boot,))
    conn.execute("COMMIT")


def _group_now() -> float:
    """The consumer groups' clock: the machine's uptime, which every process of the machine
    reads alike and nobody can step — a wall clock stepped forward would lapse every member
    at once, and one stepped back would hold a forming group for the size of the step (the
    embedded log is one machine's: its members share that clock)."""
    return uptime()


def _setup(conn: sqlite3.Connection) -> None:
    # a no-op once the file exists (its page size is fixed by then; see "Page size")
    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    _wal(conn)
    _begin(conn)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise LogError(f"sqlite log schema {version} is newer than this code "
                           f"({SCHEMA_VERSION})")
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(records)")}
        if "codec" not in columns:  # a version-2 file: its rows stay as they are (NULL)
            conn.execute("ALTER TABLE records ADD COLUMN codec INTEGER")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _truncate_wal(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """Fold every frame of the write-ahead log into the database and truncate it to zero
    bytes, waiting (the connection's busy timeout) for the writer and for readers of older
    frames; (busy, frames in the log, frames folded) as SQLite reports them."""
    row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def _topic_partitions(conn: sqlite3.Connection, cache: dict[str, int], topic: str) -> int:
    n = cache.get(topic)
    return _stored_count(conn, cache, topic) if n is None else n


def _stored_count(conn: sqlite3.Connection, cache: dict[str, int], topic: str) -> int:
    """The partition count of ``topic`` as stored now, cached. The cache is shared with the
    event loop (a group consumer computes its assignment from it) and the other connection's
    thread: an entry is only ever replaced by a larger count, never removed, not even for the
    time of this read — a reader that found it missing would fail (KeyError)."""
    row = conn.execute("SELECT partitions FROM topics WHERE topic = ?", (topic,)).fetchone()
    if row is None:
        raise LogError(f"unknown topic {topic!r} (call ensure_topics first)")
    if isinstance(cache, _TopicCache) and conn.execute(
            "SELECT 1 FROM compacted_topics WHERE topic = ?", (topic,)).fetchone():
        cache.compacted.add(topic)  # learnt before the count: no reader misses it
    n = cache[topic] = max(int(row[0]), cache.get(topic, 0))
    return n


def _grown_count(conn: sqlite3.Connection, cache: dict[str, int], topic: str, p: int) -> int:
    """The partition count of ``topic`` for partition number ``p``: the cached one, or —
    when ``p`` is past it — the one stored now (another process may have added partitions)."""
    n = cache.get(topic)
    if n is None or p >= n:
        n = _stored_count(conn, cache, topic)
    return n


def _add_partitions(conn: sqlite3.Connection, topic: str, partitions: int) -> int:
    _begin(conn)
    row = conn.execute("SELECT partitions FROM topics WHERE topic = ?", (topic,)).fetchone()
    if row is None:
        _rollback(conn)
        raise LogError(f"unknown topic {topic!r} (call ensure_topics first)")
    n = max(int(row[0]), partitions)
    if n != int(row[0]):
        conn.execute("UPDATE topics SET partitions = ? WHERE topic = ?", (n, topic))
        _rings(conn, ALL)  # group members may gain the new partitions
    conn.execute("COMMIT")
    return n


def _load_topics(conn: sqlite3.Connection, cache: _TopicCache) -> None:
    compacted = {str(t) for (t,) in conn.execute("SELECT topic FROM compacted_topics")}
    cache.compacted.update(compacted)
    cache.update({str(t): int(n) for t, n in
                  conn.execute("SELECT topic, partitions FROM topics").fetchall()})


@functools.cache
def _insert_sql(rows: int) -> str:
    return _INSERT_RECORDS + ", ".join([f"(?, ?, ?, ?, ?, ?, ?, {CODEC_ZSTD_DICT_1})"] * rows)


_INSERT_RECORDS = ("INSERT INTO records (topic, partition, offset, key, value, headers, ts, codec) "
                   "VALUES ")
# Rows per multi-row INSERT: one sqlite3_step (one release of the GIL) per chunk instead of
# one per row — the writer thread then no longer convoys behind the event loop's thread for
# the GIL on every record (``_Writes``). 1,024 rows: 4,000 records beside a busy event loop
# went in 200 ms instead of 551 with 64 (docs/run-path.md); 7,168 values, within SQLite's
# default bound of 32,766 (a build with a lower one gets chunks that fit: ``_insert_chunk``);
# a rest under a chunk goes in powers of two.
# Every row is stored compressed (chronolog.log.record_codec: value and headers).
_INSERT_CHUNK = 1024


def _insert_chunk(conn: sqlite3.Connection) -> int:
    """Rows per multi-row INSERT on ``conn``: ``_INSERT_CHUNK``, or fewer when the SQLite
    build bounds a statement's parameters lower."""
    return max(1, min(_INSERT_CHUNK, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 7))


class _Writes:
    """What one write transaction adds to the log, placed in memory first and written at
    the end (``flush``) in a few statements.

    Every statement releases the GIL, and the writer thread runs beside a busy event loop (a
    processor deciding a burst): a thread that has released the GIL waits up to the switch
    interval (5 ms) to take it back. A processor's commit of many owners' batches made about
    ten statements per batch (a savepoint, the fence check, the offsets read, the inserts of
    the records and of ``then()``'s, the consumed offsets) and held the write lock for half a
    second while other processes' appends waited (docs/run-path.md). Now the owners' epochs
    are read in one statement, each topic's ends in one, and everything is written at once;
    a batch that fails while it is placed (``then`` raising) is undone in memory (``mark`` /
    ``undo``), before anything was written."""

    def __init__(self, conn: sqlite3.Connection, cache: dict[str, int]) -> None:
        self.conn = conn
        self.cache = cache
        self.ts = _now_ms()
        self.ends: dict[TP, int] = {}  # next offset of every partition of the topics read
        self.ends_read: set[str] = set()
        self.placed: dict[TP, int] = {}  # next offsets after what is placed
        self.values: list[Any] = []  # rows of ``records``, 7 values each
        self.compacted: list[tuple[Any, ...]] = []  # rows of compacted topics (by key)
        self.group_offsets: list[tuple[str, str, int, int]] = []
        self.wake: set[str] = set()  # what the doorbell rings for: topics or WAKE_HEADER names
        # headers as stored: (plain, compressed), once per transaction
        self.headers_seen: dict[tuple[tuple[str, bytes], ...], tuple[bytes, bytes]] = {}

    def _next_offset(self, tp: TP) -> int:
        off = self.placed.get(tp)
        if off is not None:
            return off
        topic = tp[0]
        if topic not in self.ends_read:
            self.ends.update(((topic, int(p)), int(o)) for p, o in self.conn.execute(
                "SELECT partition, next_offset FROM log_ends WHERE topic = ?", (topic,)))
            self.ends_read.add(topic)
        return self.ends.get(tp, 0)

    def place(self, records: Sequence[OutRecord]) -> list[Position]:
        """Give ``records`` their positions (nothing is written before ``flush``)."""
        conn, cache, ts = self.conn, self.cache, self.ts
        compacted_topics = getattr(cache, "compacted", ())
        positions: list[Position] = []
        for rec in records:
            topic = rec.topic
            n = cache.get(topic)
            if n is None:
                n = _topic_partitions(conn, cache, topic)
            if rec.partition is not None:
                p = rec.partition
                if p >= n:
                    n = _grown_count(conn, cache, topic, p)
                if not 0 <= p < n:
                    raise LogError(f"partition {p} out of range for {topic!r} ({n} partitions)")
            elif rec.key is not None:
                p = partition_for(rec.key, n)
            else:
                p = random.randrange(n)
            tp = (topic, p)
            off = self._next_offset(tp)
            headers = rec.headers
            is_compacted = topic in compacted_topics
            blob: bytes | None = None
            if headers:
                seen = self.headers_seen.get(headers)
                if seen is None:
                    raw = _encode_headers(headers) or b""
                    seen = self.headers_seen[headers] = (raw, pack(raw))
                blob = seen[0] if is_compacted else seen[1]
                self.wake.add(_wake_name(topic, headers))
            else:
                self.wake.add(topic)
            if is_compacted:
                if rec.key is None:
                    raise LogError(f"a record for the compacted topic {topic!r} needs a key")
                self.compacted.append((topic, p, rec.key, off, rec.value, blob, ts))
            else:
                self.values += (topic, p, off, rec.key, rec.value, blob, ts)
            positions.append(Position(topic, p, off))
            self.placed[tp] = off + 1
        return positions

    def mark(self) -> tuple[int, int, int, dict[TP, int], set[str]]:
        return (len(self.values), len(self.compacted), len(self.group_offsets),
                dict(self.placed), set(self.wake))

    def undo(self, mark: tuple[int, int, int, dict[TP, int], set[str]]) -> None:
        """Forget what was placed since ``mark``."""
        values, compacted, group_offsets, placed, wake = mark
        del self.values[values:]
        del self.compacted[compacted:]
        del self.group_offsets[group_offsets:]
        self.placed, self.wake = placed, wake

    def flush(self) -> None:
        """Write what is placed: every value compressed in one call (``pack_many``), the
        records in multi-row inserts, the ends and group offsets, the doorbell's bits."""
        conn, values = self.conn, self.values
        values[4::7] = pack_many(values[4::7])
        at, left, cap = 0, len(values) // 7, _insert_chunk(conn)
        while left:
            # full chunks, then the rest in powers of two: a few distinct statements, each
            # prepared once (_insert_sql is cached, and so is sqlite3's statement)
            rows = cap if left >= cap else 1 << (left.bit_length() - 1)
            conn.execute(_insert_sql(rows), values[at:at + 7 * rows])
            at, left = at + 7 * rows, left - rows
        if self.compacted:
            conn.executemany(_UPSERT_COMPACTED, self.compacted)
        if self.placed:
            conn.executemany(_UPSERT_END, [(t, p, o) for (t, p), o in self.placed.items()])
        if self.group_offsets:
            conn.executemany(_UPSERT_OFFSET, self.group_offsets)
        for name in self.wake:
            _rings(conn, topic_bit(name))


def _append_in_tx(
    conn: sqlite3.Connection, cache: dict[str, int], records: Sequence[OutRecord]
) -> list[Position]:
    """Insert ``records`` inside the caller's write transaction; return their positions."""
    if not records:
        return []
    writes = _Writes(conn, cache)
    positions = writes.place(records)
    writes.flush()
    return positions


def _wake_name(topic: str, headers: Sequence[tuple[str, bytes]]) -> str:
    for name, value in headers:
        if name == WAKE_HEADER:
            return value.decode(errors="replace")
    return topic


def _append(
    conn: sqlite3.Connection, cache: dict[str, int], records: Sequence[OutRecord]
) -> list[Position]:
    _begin(conn)
    positions = _append_in_tx(conn, cache, records)
    conn.execute("COMMIT")
    return positions


def _owner_commit(
    conn: sqlite3.Connection,
    cache: dict[str, int],
    name: str,
    epoch: int,
    records: Sequence[OutRecord],
    consumed: list[tuple[str, str, int, int]],
    then: ThenCallback | None = None,
) -> list[Position]:
    [result] = _owners_commit(conn, cache, [(name, epoch, records, consumed, then)])
    if isinstance(result, Exception):
        raise result
    return result


def _fenced(name: str, epoch: int, row: tuple[Any, ...] | None) -> Fenced | None:
    """``Fenced`` unless ``name``'s row in ``owners`` (read under the write lock) is still at
    ``epoch``."""
    if row is not None and int(row[0]) == epoch:
        return None
    current = "none" if row is None else f"epoch {row[0]} held by {row[1]!r}"
    return Fenced(f"{name} epoch {epoch} was fenced ({current})")


def _owner_rows(conn: sqlite3.Connection, names: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    """The ``owners`` rows (epoch, owner_id) of ``names``, in one statement."""
    wanted = sorted(set(names))
    marks = ", ".join("?" * len(wanted))
    return {str(n): (e, o) for n, e, o in conn.execute(
        f"SELECT name, epoch, owner_id FROM owners WHERE name IN ({marks})", wanted)}


def _owners_commit(
    conn: sqlite3.Connection,
    cache: dict[str, int],
    items: list[tuple[str, int, Sequence[OutRecord], list[tuple[str, str, int, int]],
                      ThenCallback | None]],
) -> list[list[Position] | Exception]:
    """Several owners' commits in ONE write transaction (one WAL sync), each all-or-nothing.

    Each owner's epoch is checked under the write lock; a fenced owner's part is left out
    (result: ``Fenced``), and an exception raised while placing one owner's part (``then``)
    undoes that part only (``_Writes.undo``) and is its result. An owner's later parts after
    a failed one fail too (``MultiCommit``). A SQLite error aborts the whole transaction
    (raised: no part is visible).
    """
    results: list[list[Position] | Exception] = []
    failed: dict[str, Exception] = {}  # owner name -> why its earlier part failed
    _begin(conn)
    try:
        owners = _owner_rows(conn, (item[0] for item in items))
        writes = _Writes(conn, cache)
        for name, epoch, records, consumed, then in items:
            earlier = failed.get(name)
            if earlier is not None:  # decided on the state the failed part left behind
                results.append(earlier if isinstance(earlier, Fenced) else LogError(
                    f"{name}: an earlier batch of this owner failed in this commit: {earlier!r}"))
                continue
            fenced = _fenced(name, epoch, owners.get(name))
            if fenced is not None:
                failed[name] = fenced
                results.append(fenced)
                continue
            mark = writes.mark()
            try:
                positions = writes.place(records)
                if then is not None:
                    late = then(positions)
                    if late:
                        positions = positions + writes.place(late)
                writes.group_offsets += consumed
            except sqlite3.Error:
                raise
            except Exception as exc:  # noqa: BLE001 - this owner's part only
                writes.undo(mark)
                failed[name] = exc
                results.append(exc)
                continue
            results.append(positions)
        writes.flush()
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return results


def _acquire(conn: sqlite3.Connection, name: str, owner_id: str) -> int:
    _begin(conn)
    row = conn.execute(
        "INSERT INTO owners (name, epoch, owner_id, acquired_ms) VALUES (?, 1, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET epoch = epoch + 1, owner_id = excluded.owner_id, "
        "acquired_ms = excluded.acquired_ms RETURNING epoch",
        (name, owner_id, _now_ms()),
    ).fetchone()
    conn.execute("COMMIT")
    return int(row[0])


def _ensure_topics(conn: sqlite3.Connection, wanted: list[tuple[str, int]],
                   compacted: Sequence[str] = ()) -> dict[str, int]:
    _begin(conn)
    # a compacted topic is marked before (or with) its creation, never after records exist
    conn.executemany(
        "INSERT INTO compacted_topics (topic) SELECT ? WHERE NOT EXISTS "
        "(SELECT 1 FROM topics WHERE topic = ?) ON CONFLICT (topic) DO NOTHING",
        [(t, t) for t in compacted],
    )
    conn.executemany(
        "INSERT INTO topics (topic, partitions) VALUES (?, ?) ON CONFLICT (topic) DO NOTHING",
        wanted,
    )
    _rings(conn, ALL)  # a reader may wait for a topic to exist
    found = {
        str(t): int(n)
        for t, n in conn.execute("SELECT topic, partitions FROM topics").fetchall()
    }
    conn.execute("COMMIT")
    return found


def _upsert_offsets(conn: sqlite3.Connection, rows: list[tuple[str, str, int, int]]) -> None:
    _begin(conn)
    conn.executemany(_UPSERT_OFFSET, rows)
    conn.execute("COMMIT")


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _rows_to_records(topic: str, partition: int, rows: Iterable[tuple[Any, ...]]) -> list[Record]:
    rows = list(rows)
    # values and headers expanded in one call (record_codec.unpack_many: one GIL release)
    stored: list[tuple[int | None, bytes]] = [(codec, bytes(value))
                                              for _, _, value, _, _, codec in rows]
    stored += [(codec, bytes(headers)) for _, _, _, headers, _, codec in rows
               if headers is not None]
    expanded = iter(unpack_many(stored))
    values = [next(expanded) for _ in rows]
    return [
        Record(
            topic=topic,
            partition=partition,
            offset=int(off),
            key=None if key is None else bytes(key),
            value=value,
            headers=_decode_headers(None if headers is None else next(expanded)),
            timestamp_ms=int(ts),
        )
        for (off, key, _, headers, ts, _), value in zip(rows, values, strict=True)
    ]


def _poll_partition(
    conn: sqlite3.Connection,
    topic: str,
    partition: int,
    offset: int,
    limit: int,
    last_version: int | None,
    select: str = _SELECT_RECORDS,
) -> tuple[int, list[Record] | None]:
    """Return (data_version, records); records is None when nothing was committed since."""
    version = _data_version(conn)
    if version == last_version:
        return version, None
    rows = conn.execute(select, (topic, partition, offset, limit)).fetchall()
    return version, _rows_to_records(topic, partition, rows)


DELETE_BATCH = 5_000  # records removed per transaction by ``delete_before``


def _start_offset(conn: sqlite3.Connection, topic: str, partition: int) -> int:
    row = conn.execute("SELECT min(offset) FROM records WHERE topic = ? AND partition = ?",
                       (topic, partition)).fetchone()
    if row is not None and row[0] is not None:
        return int(row[0])
    end = conn.execute("SELECT next_offset FROM log_ends WHERE topic = ? AND partition = ?",
                       (topic, partition)).fetchone()
    return int(end[0]) if end else 0


def _delete_batch(conn: sqlite3.Connection, topic: str, partition: int, offset: int) -> bool:
    """Remove at most ``DELETE_BATCH`` of the oldest records below ``offset`` in one
    transaction; True when none is left below it."""
    _begin(conn)
    start = _start_offset(conn, topic, partition)
    upper = min(offset, start + DELETE_BATCH)
    conn.execute("DELETE FROM records WHERE topic = ? AND partition = ? AND offset < ?",
                 (topic, partition, upper))
    conn.execute("COMMIT")
    return upper >= offset


# ---------------------------------------------------------------------------------------
# the public classes


class ProcessLock:
    """An exclusive, advisory, per-process lock file (``fcntl.flock``) — optional.

    ``SqliteEventLog.process_lock(p)`` returns the lock of ``<db>.<prefix>owner-p<p>.lock``
    (``p=None``: one lock for the whole node, ``<db>.<prefix>owner.lock``). A standby
    processor can ``await lock.acquire()`` to wait until the active one exits (the kernel
    releases a flock when its process dies, even by ``kill -9``) and only then call
    ``log.acquire(p)``. It is a convenience against needless fencing ping-pong, not a safety
    mechanism: correctness comes from the epoch check in ``SqlitePartitionOwner.commit``.
    flock is per open file description, so two ``ProcessLock`` objects on one path exclude
    each other even inside one process.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock without waiting; True when it is now held by this object."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    async def acquire(self, timeout_s: float | None = None, poll_s: float = 0.1) -> bool:
        """Wait (polling) until the lock is held; False when ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self.try_acquire():
            if deadline is not None and loop.time() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class SqlitePartitionOwner:
    """The single writer of input partition ``partition`` at ``epoch`` (see module doc)."""

    def __init__(self, log: SqliteEventLog, partition: int, epoch: int, owner_id: str) -> None:
        self._log = log
        self.partition = partition
        self.epoch = epoch
        self.owner_id = owner_id
        self.name = log._owner_name(partition)
        self._fenced = False
        self._closed = False

    async def commit(
        self,
        records: Sequence[OutRecord],
        consumed: Offsets,
        group: str,
        then: ThenCallback | None = None,
    ) -> list[Position]:
        """Check our epoch, append ``records`` and store ``consumed`` — one transaction.

        ``then(positions)`` runs inside that transaction, on the writer thread (not the
        event loop): it must be quick, pure and must not touch asyncio objects.
        """
        if self._fenced:
            raise Fenced(f"{self.name} epoch {self.epoch} was fenced")
        if self._closed:
            raise LogError(f"{self.name} owner is closed")
        rows = [(group, t, int(p), int(o)) for (t, p), o in consumed.items()]
        try:
            return await self._log._w.run(
                _owner_commit, self._log._partitions, self.name, self.epoch, list(records), rows,
                then,
            )
        except Fenced:
            self._fenced = True
            raise

    async def close(self) -> None:
        self._closed = True


class SqliteGroupConsumer:
    """A consumer group member over the members table (see module doc for the protocol)."""

    def __init__(
        self,
        log: SqliteEventLog,
        group: str,
        topics: Sequence[str],
        member_id: str,
        on_assigned: RebalanceCallback | None,
        on_revoked: RebalanceCallback | None,
        wake_on: Sequence[str] = (),
        settle_s: float = 0.0,
    ) -> None:
        self._log = log
        self.settle_s = settle_s
        # while the group forms: when its first assignment is due (_group_now()), else None
        self._forming_until: float | None = None
        self.group = group
        self.topics = sorted(set(topics))
        self._interest = functools.reduce(operator.or_, map(topic_bit, [*self.topics, *wake_on]),
                                          0)
        self.member_id = member_id
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._assigned: set[TP] = set()
        self._positions: dict[TP, int] = {}
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._last_heartbeat = 0.0  # loop time of the last successful heartbeat
        # the keep-alive thread's last renewal and the last getmany (time.monotonic, the
        # clock of the event loop's time())
        self._renewed_at = 0.0
        self._polled_at = 0.0
        self._keepalive: threading.Thread | None = None
        self._keepalive_stop = threading.Event()
        self._last_version: tuple[int, int] | None = None
        self._dirty = True  # positions or assignment changed since the last query
        self._expired = False  # our membership lapsed: revoke everything, then rejoin
        self._rotation = 0
        self._started = False
        self._closed = False

    # -- membership -------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        await self._log._ready()
        for topic in self.topics:
            # the count stored now, not one this log object cached before another process
            # added partitions: a partition assigned only later would be read from its end
            # then, past what was written to it meanwhile (fails fast on unknown topics)
            await self._log.partition_count(topic)
        await self._heartbeat()
        self._started = True
        self._heartbeat_task = asyncio.create_task(
            self._heartbeat_loop(), name=f"sqlite-heartbeat-{self.group}-{self.member_id}"
        )
        self._polled_at = time.monotonic()
        self._keepalive = threading.Thread(
            target=self._keep_alive, name=f"sqlite-keepalive-{self.member_id}", daemon=True)
        self._keepalive.start()
        members = await self._log._r.run(self._live_members)
        await self._rebalance(members)

    async def _heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        lapsed = (self._started
                  and loop.time() - self._alive_at() > self._log.session_timeout_s)
        until = _group_now() + self._log.session_timeout_s
        await self._log._hb.run(
            self._upsert_member, self.group, self.member_id, json.dumps(self.topics), until
        )
        self._last_heartbeat = asyncio.get_running_loop().time()
        if lapsed:
            # We were out of the group (paused, starved, heartbeats failing on a full
            # disk): other members may own our partitions by now. Like a Kafka member
            # fenced by a new generation, give everything up before taking any assignment
            # again — once we are back in (not at every failed heartbeat meanwhile).
            self._expired = True
            self._dirty = True

    @staticmethod
    def _upsert_member(
        conn: sqlite3.Connection, group: str, member_id: str, topics: str, until: float
    ) -> None:
        """Renew the membership (on the group file's connection).

        Only a change of membership rings the doorbell (this member joining or changing its
        topics, lapsed members removed): a renewal alone changes no assignment, and ringing
        on each one woke every reader of the file twice a second per member. A member back
        from a lapse (its row expired but not yet removed) is a change too."""
        _begin(conn)
        now = _group_now()
        had = conn.execute("SELECT topics, heartbeat_until FROM members WHERE grp = ? AND "
                           "member_id = ?", (group, member_id)).fetchone()
        # joined now, or back from a lapse: a new member (``_forming``); else as it was
        conn.execute(
            "INSERT INTO members (grp, member_id, topics, heartbeat_until, joined_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (grp, member_id) DO UPDATE SET "
            "topics = excluded.topics, heartbeat_until = excluded.heartbeat_until, "
            "joined_at = CASE WHEN members.heartbeat_until <= ? THEN excluded.joined_at "
            "ELSE members.joined_at END",
            (group, member_id, topics, until, now, now),
        )
        gone = conn.execute(
            "DELETE FROM members WHERE grp = ? AND heartbeat_until < ?", (group, now)
        ).rowcount
        if had is None or had[0] != topics or had[1] <= now or gone:
            _rings(conn, ALL)  # membership: every consumer of the group may rebalance
        conn.execute("COMMIT")

    def _alive_at(self) -> float:
        """When the membership was last renewed, by the event loop or the keep-alive."""
        return max(self._last_heartbeat, self._renewed_at)

    def _keep_alive(self) -> None:
        """The keep-alive thread: renew a live membership whose event loop has not (module
        docstring, "Groups"), while the member polled within ``max_poll_interval_s``."""
        log_ = self._log
        while not self._keepalive_stop.wait(log_.heartbeat_interval_s):
            now = time.monotonic()
            if (self._closed or now - self._polled_at > log_.max_poll_interval_s
                    or now - self._alive_at() < 2 * log_.heartbeat_interval_s):
                continue  # stopped polling, or the loop's own heartbeats keep up
            try:
                renewed = log_._hb.call(self._extend, self.group, self.member_id,
                                        _group_now() + log_.session_timeout_s)
            except Exception:  # noqa: BLE001 - the loop's heartbeats log their failures
                continue
            if renewed:
                self._renewed_at = now

    @staticmethod
    def _extend(conn: sqlite3.Connection, group: str, member_id: str, until: float) -> bool:
        """Move a live membership's expiry to ``until``; never revive a lapsed one (that is
        the event loop's heartbeat, which rejoins). No ring: the membership is the same."""
        _begin(conn)
        cur = conn.execute("UPDATE members SET heartbeat_until = ? WHERE grp = ? AND "
                           "member_id = ? AND heartbeat_until > ?",
                           (until, group, member_id, _group_now()))
        conn.execute("COMMIT")
        return cur.rowcount == 1

    async def _heartbeat_loop(self) -> None:
        interval = self._log.heartbeat_interval_s
        failed_at: float | None = None  # when the failures in a row began (logged then)
        held = 0
        while True:
            await asyncio.sleep(interval)
            try:
                await self._heartbeat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep trying; expiry will hand our partitions over
                # one line when they begin and one per SUMMARY_S while they go on (a full
                # disk fails every heartbeat), a traceback only for what is not the log away
                now = time.monotonic()
                if failed_at is None or now - failed_at >= _HEARTBEAT_SUMMARY_S:
                    log.warning("heartbeat of %s/%s failed%s: %s", self.group, self.member_id,
                                f" ({held} more)" if held else "", exc,
                                exc_info=not isinstance(exc, LogUnavailable))
                    failed_at, held = now, 0
                else:
                    held += 1
                continue
            failed_at, held = None, 0

    def _live_members(self, conn: sqlite3.Connection) -> list[Member]:
        rows = conn.execute(
            "SELECT member_id, topics, joined_at FROM grp.members WHERE grp = ? AND "
            "heartbeat_until > ?", (self.group, _group_now()),
        ).fetchall()
        return [(str(m), list(json.loads(t)), float(j)) for m, t, j in rows]

    def _forming(self, members: list[Member], now: float) -> float | None:
        """When a forming group's first assignment is due, or None: the group has formed.

        The live members' join times, in order, tell: the group formed at the first pause of
        ``settle_s`` without a join after the first member joined (or ``GROUP_FORMING_MAX_S``
        after it, if members keep joining). A member that joined after such a pause joins a
        formed group and takes its share at once; until the pause, every member takes
        nothing (module docstring, "Consumer groups")."""
        if self.settle_s <= 0 or not members:
            return None
        joined = sorted(j for _, _, j in members)
        formed = joined[0] + GROUP_FORMING_MAX_S
        for before, after in zip(joined, [*joined[1:], math.inf], strict=True):
            if after - before >= self.settle_s:
                formed = min(formed, before + self.settle_s)
                break
        return formed if now < formed else None

    def _compute_assignment(self, members: list[Member]) -> set[TP]:
        subs: dict[str, list[str]] = {}
        for member_id, topics, _ in members:
            for topic in topics:
                subs.setdefault(topic, []).append(member_id)
        mine: set[TP] = set()
        for topic in self.topics:
            ids = sorted(set(subs.get(topic, [])) | {self.member_id})  # we are alive
            n = self._log._partitions[topic]
            mine.update((topic, p) for p in range_assign(ids, n)[self.member_id])
        return mine

    async def _rebalance(self, members: list[Member]) -> None:
        self._forming_until = self._forming(members, _group_now())
        if self._expired:
            self._expired = False
            expelled = set(self._assigned)
            if expelled:
                self._assigned.clear()
                self._positions.clear()
                if self._on_revoked is not None:
                    await self._on_revoked(expelled)
        # nothing is assigned before the group formed (``_forming``)
        new = self._compute_assignment(members) if self._forming_until is None else set()
        if new == self._assigned:
            return
        lost = self._assigned - new
        gained = new - self._assigned
        if lost:
            self._assigned -= lost
            for tp in lost:
                self._positions.pop(tp, None)
            if self._on_revoked is not None:
                await self._on_revoked(set(lost))
        if gained:
            committed = await self._log._r.run(self._committed_many, sorted(gained))
            for tp in gained:
                self._positions[tp] = committed.get(tp, 0)
            self._assigned |= gained
            if self._on_assigned is not None:
                await self._on_assigned(set(gained))
        self._dirty = True

    def _committed_many(self, conn: sqlite3.Connection, tps: list[TP]) -> dict[TP, int]:
        out: dict[TP, int] = {}
        for topic, p in tps:
            row = conn.execute(
                "SELECT next_offset FROM group_offsets "
                "WHERE grp = ? AND topic = ? AND partition = ?",
                (self.group, topic, p),
            ).fetchone()
            if row is not None:
                out[(topic, p)] = int(row[0])
        return out

    # -- consuming --------------------------------------------------------------------

    def assignment(self) -> set[TP]:
        return set(self._assigned)

    def joined(self) -> bool:
        if not self._started or self._closed or self._expired:
            return False
        age = asyncio.get_running_loop().time() - self._alive_at()
        return age <= self._log.session_timeout_s

    def _poll(
        self,
        conn: sqlite3.Connection,
        positions: list[tuple[TP, int]],
        limit: int,
        last_version: tuple[int, int] | None,
        force: bool,
    ) -> tuple[tuple[int, int], list[Member] | None, list[Record] | None]:
        # the log's and the group file's: a record, a topic grown, or a member come or gone
        version = (_data_version(conn),
                   int(conn.execute("PRAGMA grp.data_version").fetchone()[0]))
        if version == last_version and not force:
            return version, None, None
        members = self._live_members(conn)
        names = self.topics
        counts = conn.execute(
            f"SELECT topic, partitions FROM topics WHERE topic IN ({','.join('?' * len(names))})",
            names).fetchall()
        cache = self._log._partitions
        cache.update({str(t): int(n) for t, n in counts if int(n) > cache.get(str(t), 0)})
        out: list[Record] = []
        for (topic, p), offset in positions:
            if len(out) >= limit:
                break
            rows = conn.execute(_select_for(self._log._partitions, topic),
                                (topic, p, offset, limit - len(out))).fetchall()
            out.extend(_rows_to_records(topic, p, rows))
        return version, members, out

    async def getmany(self, timeout_ms: int = 200, max_records: int = 500) -> list[Record]:
        if not self._started:
            raise LogError("group consumer not started")
        if self._closed:
            raise LogError("group consumer closed")
        loop = asyncio.get_running_loop()
        self._polled_at = time.monotonic()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        delay = self._log.poll_min_s
        while True:
            if loop.time() - self._last_heartbeat > self._log.session_timeout_s / 2:
                # the background task fell behind: do not expire. One that fails (a full
                # disk) does not fail the read: reads need no room, the membership may lapse
                with contextlib.suppress(LogUnavailable):
                    await self._heartbeat()
            positions = sorted(self._positions.items())
            if positions:  # rotate so that a busy partition does not starve the others
                k = self._rotation % len(positions)
                positions = positions[k:] + positions[:k]
                self._rotation += 1
            if self._forming_until is not None and _group_now() >= self._forming_until:
                self._dirty = True  # the group has formed: its first assignment
            force, self._dirty = self._dirty, False
            rung = self._log._bell.mark(self._interest)
            version, members, records = await self._log._r.run(
                self._poll, positions, max_records, self._last_version, force
            )
            self._last_version = version
            if members is not None:
                before = set(self._assigned)
                await self._rebalance(members)
                if self._assigned != before:
                    continue  # positions changed: query again before returning anything
            if records:
                kept: list[Record] = []
                asked = dict(positions)
                for rec in records:
                    tp = (rec.topic, rec.partition)
                    # a seek or rebalance during the query wins over what it returned; a
                    # position below the partition's start (deleted records) moves to it
                    at = self._positions.get(tp)
                    if at is not None and at == asked.get(tp) and rec.offset >= at:
                        kept.append(rec)
                        self._positions[tp] = asked[tp] = rec.offset + 1
                if len(kept) >= max_records:
                    self._dirty = True  # there may be more right away
                if kept:
                    return kept
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            if self._forming_until is not None:  # look again once the group has formed
                remaining = min(remaining, max(self._forming_until - _group_now(), 0.001))
            delay = await self._log._wait_for_writes(rung, delay, remaining, self._interest)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        tp = (topic, partition)
        if tp not in self._assigned:
            raise LogError(f"{tp} is not assigned to {self.member_id}")
        self._positions[tp] = offset
        self._dirty = True

    def position(self, topic: str, partition: int) -> int:
        """The next offset ``getmany`` returns for an assigned partition."""
        return self._positions[(topic, partition)]

    async def commit(self, offsets: Offsets) -> None:
        rows = [(self.group, t, int(p), int(o)) for (t, p), o in offsets.items()]
        if rows:
            await self._log._w.run(_upsert_offsets, rows)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._keepalive_stop.set()
        if self._keepalive is not None:
            await asyncio.to_thread(self._keepalive.join, 10)
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            try:
                await self._heartbeat_task
            except asyncio.CancelledError:
                pass
            except Exception:  # pragma: no cover
                log.exception("heartbeat task failed")
        if self._started:

            def _leave(conn: sqlite3.Connection) -> None:
                _begin(conn)
                conn.execute(
                    "DELETE FROM members WHERE grp = ? AND member_id = ?",
                    (self.group, self.member_id),
                )
                _rings(conn, ALL)
                conn.execute("COMMIT")

            try:
                await self._log._hb.run(_leave)
            except LogError:
                log.warning("could not leave group %s cleanly", self.group, exc_info=True)
        self._assigned.clear()
        self._positions.clear()
        self._log._consumers.discard(self)


class SqliteEventLog:
    """The EventLog port on one SQLite file (see the module docstring for the design)."""

    def __init__(
        self,
        path: str | Path,
        topics: Topics = Topics(),
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = 10_000,
        session_timeout_s: float = 4.0,
        heartbeat_interval_s: float = 0.5,
        max_poll_interval_s: float = 120.0,
        poll_min_s: float = 0.002,
        poll_max_s: float = 0.02,
        poll_idle_s: float = 0.5,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
    ) -> None:
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"bad synchronous mode {synchronous!r}")
        self.path = Path(path)
        self.topics = topics
        self.synchronous = synchronous.upper()
        self.session_timeout_s = session_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_poll_interval_s = max_poll_interval_s
        self.poll_min_s = poll_min_s
        self.poll_max_s = poll_max_s
        self.poll_idle_s = poll_idle_s
        self._busy_timeout_ms = busy_timeout_ms
        self._bell = Doorbell(self.path)
        self._w = _Conn(str(self.path), "sqlite-log-w", busy_timeout_ms, self.synchronous,
                        writer=True, after_write=self._after_commit)
        self.wal_limit_bytes = wal_limit_bytes
        self._ckpt = _Conn(str(self.path), "sqlite-log-ckpt", WAL_TRUNCATE_WAIT_MS,
                           self.synchronous)
        self._wal_checked = 0.0  # time.monotonic() of the last look at the WAL's size
        self._truncating = False
        self.group_path = group_path(self.path)
        self._r = _Conn(str(self.path), "sqlite-log-r", busy_timeout_ms, self.synchronous,
                        attach_group=str(self.group_path))
        # Group heartbeats on a connection of their own, to a file of their own (module
        # docstring, "Consumer groups"). ``synchronous=NORMAL``: a renewal lost to a power
        # cut is only a renewal; no fsync each.
        self._hb = _Conn(str(self.group_path), "sqlite-log-hb", busy_timeout_ms, "NORMAL",
                         writer=True, after_write=self._bell.ring)
        self._partitions = _TopicCache()  # topic -> partition count; compacted topics
        self._consumers: set[SqliteGroupConsumer] = set()
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._closed = False

    async def __aenter__(self) -> SqliteEventLog:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise LogError("sqlite log is closed")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            self._private_files()
            await self._w.run(_setup)
            await self._hb.run(_setup_group)  # before the reader attaches it
            await self._r.run(_load_topics, self._partitions)
            self._bell.open()
            self._started = True

    def _after_commit(self, mask: int) -> None:
        """After each commit of this process's writer (on its thread): ring the readers,
        and at most every ``WAL_CHECK_S`` fold a write-ahead log grown past
        ``wal_limit_bytes`` into the database and truncate it, on a connection of its own."""
        self._bell.ring(mask)
        now = time.monotonic()
        if self._truncating or now - self._wal_checked < WAL_CHECK_S:
            return
        self._wal_checked = now
        try:
            size = os.stat(f"{self.path}-wal").st_size
        except OSError:
            return
        if size <= self.wal_limit_bytes:
            return
        self._truncating = True
        self._ckpt.submit(_truncate_wal).add_done_callback(
            functools.partial(self._truncated, size))

    def _truncated(self, size: int, done: concurrent.futures.Future[tuple[int, int, int]]
                   ) -> None:
        self._truncating = False
        exc = done.exception()
        if exc is not None:
            log.warning("wal_truncate_failed path=%s size=%d error=%s", self.path, size, exc)
            return
        busy, frames, folded = done.result()
        log.info("wal_truncated path=%s size=%d busy=%d frames=%d folded=%d", self.path,
                 size, busy, frames, folded)

    def _private_files(self) -> None:
        """The log's directory 0700 and its files 0600 (SQLite gives ``-wal``/``-shm`` the
        mode of the database file): created so, tightened with a warning if found wider."""
        private_dir(self.path.parent)
        for db in (self.path, self.group_path):
            for suffix in ("", "-wal", "-shm", WRITE_TURNS_SUFFIX):
                tighten(Path(f"{db}{suffix}"))
            os.close(os.open(db, os.O_RDWR | os.O_CREAT, PRIVATE_FILE))

    async def _ready(self) -> None:
        if not self._started:
            await self.start()

    async def close(self) -> None:
        if self._closed:
            return
        for consumer in list(self._consumers):
            await consumer.close()
        self._closed = True
        await self._w.close()
        await self._ckpt.close()
        await self._hb.close()
        await self._r.close()
        self._bell.close()

    # -- topics -----------------------------------------------------------------------

    async def ensure_topics(self, ready_classes: Sequence[str] = ("default",)) -> None:
        await self._ready()
        t = self.topics
        names = [t.commands, t.events, t.replies, t.dlq, t.effects, t.workers, t.state]
        names += [t.ready(c) for c in ready_classes]
        found = await self._w.run(_ensure_topics,
                                  [(n, t.partitions) for n in names]
                                  + [(t.routing, 1), (t.audit, 1)], t.compacted)
        await self._r.run(_load_topics, self._partitions)
        for name in names:
            if found[name] < t.partitions:
                log.warning(
                    "topic %s exists with %d partitions, not %d", name, found[name], t.partitions
                )
        self._partitions.update(found)
        await self._follow_commands(names, found)

    async def _follow_commands(self, names: Sequence[str], found: Mapping[str, int]) -> None:
        """A topic that follows the processors' partitions (``Topics.follows_processors``)
        created after the deployment grew (a new ``ready.<class>``) grows to the count of
        ``commands`` (docs/design.md §18)."""
        n = found[self.topics.commands]
        for name in names:
            if self.topics.follows_processors(name) and found[name] < n:
                await self.add_partitions(name, n)

    async def ensure_topic(self, topic: str, partitions: int | None = None) -> int:
        await self._ready()
        n = self._partitions.get(topic)
        if n is None:
            wanted = [(topic, partitions or self.topics.partitions)]
            found = await self._w.run(_ensure_topics, wanted,
                                      [t for t in self.topics.compacted if t == topic])
            self._partitions.update(found)
            n = found[topic]
        return n

    async def partitions_for(self, topic: str) -> int:
        await self._ready()
        n = self._partitions.get(topic)
        if n is None:
            n = await self._r.run(_topic_partitions, self._partitions, topic)
        return n

    async def partition_count(self, topic: str) -> int:
        await self._ready()
        return await self._r.run(_grown_count, self._partitions, topic, 1 << 62)

    async def _count_for(self, topic: str, partition: int) -> int:
        """The partition count of ``topic``, read again when ``partition`` is past the one
        cached (another process may have added partitions since)."""
        n = await self.partitions_for(topic)
        if partition >= n:
            n = await self._r.run(_grown_count, self._partitions, topic, partition)
        return n

    async def prefixed_topics(self) -> dict[str, int]:
        await self._ready()
        prefix = self.topics.prefix

        def _topics(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute("SELECT topic, partitions FROM topics WHERE substr(topic, 1, ?)"
                                " = ? ORDER BY topic", (len(prefix), prefix)).fetchall()
            return {str(t): int(n) for t, n in rows}

        return await self._r.run(_topics)

    async def add_partitions(self, topic: str, partitions: int) -> int:
        await self._ready()
        n = await self._w.run(_add_partitions, topic, partitions)
        self._partitions[topic] = max(n, self._partitions.get(topic, 0))
        return n

    # -- records ----------------------------------------------------------------------

    async def append(self, records: Sequence[OutRecord]) -> list[Position]:
        await self._ready()
        if not records:
            return []
        return await self._w.run(_append, self._partitions, list(records))

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 1000,
        timeout_ms: int = 0,
    ) -> list[Record]:
        n = await self._count_for(topic, partition)
        if not 0 <= partition < n:
            raise LogError(f"partition {partition} out of range for {topic!r} ({n} partitions)")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        delay = self.poll_min_s
        last: int | None = None
        interest = topic_bit(topic)
        select = _select_for(self._partitions, topic)
        while True:
            rung = self._bell.mark(interest)
            last, records = await self._r.run(
                _poll_partition, topic, partition, offset, max_records, last, select
            )
            if records:
                return records
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            delay = await self._wait_for_writes(rung, delay, remaining, interest)

    async def _wait_for_writes(self, rung: int, delay: float, remaining: float,
                               interest: int) -> float:
        """Wait before querying again: until a write to a topic of ``interest`` rings the
        doorbell (``rung``: its ``mark`` before the last query), at most ``poll_idle_s``;
        without a doorbell, the backing-off poll interval. Returns the next poll interval."""
        if self._bell.active:
            await self._bell.wait(rung, min(self.poll_idle_s, remaining), interest)
            return delay
        await asyncio.sleep(min(delay, remaining))
        return min(delay * 2, self.poll_max_s)

    async def write_quorum(self) -> str | None:
        return None  # one file: writable whenever it answers (a full disk is LogFull)

    async def end_offset(self, topic: str, partition: int) -> int:
        await self.partitions_for(topic)

        def _end(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT next_offset FROM log_ends WHERE topic = ? AND partition = ?",
                (topic, partition),
            ).fetchone()
            return int(row[0]) if row else 0

        return await self._r.run(_end)

    async def store_offsets(self, group: str, offsets: Offsets) -> None:
        await self._ready()
        rows = [(group, t, int(p), int(o)) for (t, p), o in offsets.items()]
        if rows:
            await self._w.run(_upsert_offsets, rows)

    async def start_offset(self, topic: str, partition: int) -> int:
        await self.partitions_for(topic)
        return await self._r.run(_start_offset, topic, partition)

    async def delete_before(self, topic: str, partition: int, offset: int) -> int:
        await self.partitions_for(topic)
        refuse_deletion(topic, partition, offset, await self.end_offset(topic, partition),
                        topic in self._partitions.compacted)
        while not await self._w.run(_delete_batch, topic, partition, offset):
            pass
        return await self.start_offset(topic, partition)

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        await self._ready()

        def _committed(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT next_offset FROM group_offsets "
                "WHERE grp = ? AND topic = ? AND partition = ?",
                (group, topic, partition),
            ).fetchone()
            return int(row[0]) if row else None

        return await self._r.run(_committed)

    # -- ownership --------------------------------------------------------------------

    def _owner_name(self, partition: int) -> str:
        return f"{self.topics.prefix}processor-p{partition}"

    async def acquire(self, partition: int, owner_id: str) -> SqlitePartitionOwner:
        n = await self._count_for(self.topics.commands, partition)
        if not 0 <= partition < n:
            raise LogError(f"partition {partition} out of range ({n} partitions)")
        epoch = await self._w.run(_acquire, self._owner_name(partition), owner_id)
        return SqlitePartitionOwner(self, partition, epoch, owner_id)

    async def commit_many(
        self,
        batches: Sequence[
            tuple[SqlitePartitionOwner, Sequence[OutRecord], Offsets, str, ThenCallback | None]
        ],
    ) -> list[list[Position] | BaseException]:
        """Commit several owners' batches in ONE SQLite transaction (the ``MultiCommit``
        capability of ``chronolog.log.port``).

        Each batch ``(owner, records, consumed, group, then)`` behaves exactly like
        ``owner.commit(records, consumed, group, then)`` — atomic by itself, its owner's
        epoch checked under the write lock — and its result is the positions or the exception
        that call would have raised (``Fenced`` for a superseded owner, whose part is left
        out). The batches share one transaction and so one WAL sync: with
        ``synchronous=FULL`` a processor owning many partitions pays one fsync per poll, not
        one per partition. A SQLite error fails every batch (nothing is visible).
        """
        results: list[list[Position] | BaseException | None] = [None] * len(batches)
        items: list[tuple[str, int, Sequence[OutRecord], list[tuple[str, str, int, int]],
                          ThenCallback | None]] = []
        index: list[int] = []
        for i, (owner, records, consumed, group, then) in enumerate(batches):
            if owner._log is not self:
                results[i] = LogError(f"{owner.name} belongs to another log")
            elif owner._fenced:
                results[i] = Fenced(f"{owner.name} epoch {owner.epoch} was fenced")
            elif owner._closed:
                results[i] = LogError(f"{owner.name} owner is closed")
            else:
                rows = [(group, t, int(p), int(o)) for (t, p), o in consumed.items()]
                items.append((owner.name, owner.epoch, list(records), rows, then))
                index.append(i)
        if items:
            done = await self._w.run(_owners_commit, self._partitions, items)
            for i, res in zip(index, done, strict=True):
                if isinstance(res, Fenced):
                    batches[i][0]._fenced = True
                results[i] = res
        return [r if r is not None else LogError("not committed") for r in results]

    def process_lock(self, partition: int | None = None) -> ProcessLock:
        """The optional advisory process lock for ``partition`` (None: the whole node)."""
        suffix = "owner" if partition is None else f"owner-p{partition}"
        return ProcessLock(f"{self.path}.{self.topics.prefix}{suffix}.lock")

    # -- groups -----------------------------------------------------------------------

    def group_consumer(
        self,
        group: str,
        topics: Sequence[str],
        member_id: str,
        on_assigned: RebalanceCallback | None = None,
        on_revoked: RebalanceCallback | None = None,
        wake_on: Sequence[str] = (),
        settle_s: float = 0.0,
    ) -> SqliteGroupConsumer:
        consumer = SqliteGroupConsumer(self, group, topics, member_id, on_assigned, on_revoked,
                                       wake_on, settle_s)
        self._consumers.add(consumer)
        return consumer


# --------------------------------------------------------------------------- backup


def backup_file(source: str | Path, target: str | Path) -> dict[str, int]:
    """Copy the log file ``source`` to ``target`` with SQLite's online backup API: a
    consistent copy of every table (records, compacted topics, group offsets, owner epochs)
    as of one moment, taken while processes write. Returns the copy's ``record_counts``."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(str(target))
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        finally:
            dst.close()
    finally:
        src.close()
    return record_counts(target)


def restore_file(backup: str | Path, target: str | Path) -> None:
    """Write the backed-up log file into ``target`` (a new file: ``chronolog restore`` stages
    it next to the live log and renames it over that at the end). The old deployment's
    group members are not in it (``forget_members`` removes them beside the live log); a
    backup taken by an older version has them in a table of its own, dropped here."""
    src = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(str(target))
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=WAL")
            dst.execute("DROP TABLE IF EXISTS members")
            dst.commit()
        finally:
            dst.close()
    finally:
        src.close()


def forget_members(log_path: str | Path) -> None:
    """Remove the group file of the log at ``log_path`` (with its WAL, shared memory and
    turns file): no process is a member of a log restored over it. Only while no process
    has the log open."""
    for suffix in ("", "-wal", "-shm", WRITE_TURNS_SUFFIX):
        Path(f"{group_path(log_path)}{suffix}").unlink(missing_ok=True)


def checked_counts(path: str | Path) -> dict[str, int]:
    """``record_counts`` of a log file that passes ``PRAGMA integrity_check``, opened
    read-only and immutable (nothing is written beside it); ``ValueError`` naming the first
    problem SQLite reports otherwise (a truncated or damaged file)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"not a sound SQLite file ({exc})") from None
    if rows != ["ok"]:
        raise ValueError(f"fails PRAGMA integrity_check ({rows[0]})")
    try:
        return record_counts(path)
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"not a sound SQLite file ({exc})") from None


def record_counts(path: str | Path) -> dict[str, int]:
    """``topic -> records`` of a log file (compacted topics: the records kept); an empty
    dict for a file without chronolog's tables."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        out: dict[str, int] = {}
        for table in ("records", "compacted"):
            if table in tables:
                for topic, n in conn.execute(f"SELECT topic, count(*) FROM {table} GROUP BY 1"):
                    out[topic] = out.get(topic, 0) + n
        return out
    finally:
        conn.close()
