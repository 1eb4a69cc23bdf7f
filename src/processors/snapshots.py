"""Snapshots of a partition's states on the log, so that a takeover costs live state, not
history (docs/design.md §14).

A processor folds partition p of ``events`` into schedule and quota states. Folding from
offset 0 costs every event ever written; instead, the owner of p keeps a copy of its states
on partition p of the compacted topic ``state`` (``Topics.state``), keyed like ``events``
(``tenant/schedule_id``), and a new owner starts from that copy plus the tail of ``events``
after it. ``events`` stays the source of truth: nothing here is ever read by the audit or a
replay, and a copy that is missing, of another state version, or damaged is ignored — the
new owner then folds from offset 0, as before.

Writing (``SnapshotWriter``, one per owned partition)
    Every state a decision changes is *dirty*. A *round* starts every ``interval_s`` while
    the processor is idle (nothing polled, no timer due), and while it is busy only once
    the last round started ``busy_interval_s`` ago or ``events`` events were decided since:
    the dirty set is taken, and one *chunk* of it (``chunk`` states) at a time is encoded
    (``chronolog.commands.state_codec``) at the start of a batch of the partition and
    written in that batch's transaction — the owner's fenced transaction
    (``PartitionOwner.commit``), so a fenced zombie can never publish a state a new owner
    uses; when idle, a chunk goes in a transaction of its own. The last chunk of a round
    carries the *marker* (key ``@snapshot``). No batch pays more than one chunk, nothing is
    written per command, and a burst of runs pays none (measured: about 11 us of the event
    loop and 13 us of the SQLite writer per state written).

    A chunk is encoded before its batch is decided, so it holds the states after every
    event of the earlier transactions of the partition — which all commit before it (a
    partition's transactions commit in order; if one fails the partition is dropped and
    nothing after it commits). So each state record is the state *as of* the offset of
    ``events`` where its transaction's events begin (``through``), known only once the
    transaction's records have positions: it is framed in ``then()``. The marker says
    ``fold_from`` = the ``through`` of the round's first chunk: every state changed before
    it was in that round's dirty set or is covered by an earlier record.

Reading (``decode_snapshot`` and the processor's restore)
    Read partition p of ``state`` from 0 and keep each key's latest record (compaction keeps
    at least that). With the latest marker at ``fold_from`` S: every state whose record
    covers ``through`` T, folded with the events of its key at offsets >= T, from S on, is
    the fold of all its events. Before the tail is folded, the event the marker names as the
    last one before S must be at its offset of ``events`` (a copy of another log is
    ignored). Each record is checksummed (CRC-32 over key, header and body) and versioned
    (``STATE_VERSION``): any record that fails either, any undecodable body, a through past
    the end of ``events``: the whole copy is ignored (``SnapshotRejected``).

Keys that leave the partition (a handover to another routing version moves them out,
docs/design.md §18) are written as a *gone* record (kind G, empty body): the latest record
of the key then says the partition holds nothing of it, so an older state record of it is
never restored; events of the key after its ``through`` (it may move back) are folded as
usual. The partition's routing view (``chronolog.commands.routing``) is a record of its own
(kind R, key ``routing_key()``), so a takeover from a snapshot routes as its owner did.

A schedule's record (kind W) holds its *sealed* bytes (``schedule_store.seal``): whether
it is quiet, its wake-up, then its encoded state, compressed — the very bytes the processor's store
holds a cold schedule as (``chronolog.processors.schedule_store``). A restore into such a
store keeps a quiet record's bytes as they are, bucketed by its wake-up, without decoding
them: a partition of a million idle schedules is restored by reading it. Records of kind S
(the encoded state alone, written before W) are still read, decoded.

Record layout: ``b"cs"``, kind (1 byte: W sealed schedule, S schedule, Q quota, R routing
view, G gone, P spec, M marker), state version (u16), through (u64), CRC-32 (u32), then the
body (orjson; a W body is 9 bytes of seal, then orjson compressed with zstd and the
embedded log's record dictionary, ``chronolog.log.record_codec``).
"""

from __future__ import annotations

import asyncio
import struct
import time
import zlib
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from chronolog.commands.decider import next_wakeup
from chronolog.commands.registry import PartitionAggregates
from chronolog.commands.routing import RoutingView, decode_view, encode_view
from chronolog.commands.state import Policy, QuotaState
from chronolog.commands.state_codec import (
    STATE_VERSION,
    StateDecodeError,
    decode_quota,
    decode_schedule,
    decode_shape,
    encode_quota,
    shape_of,
    upcast_state,
)
from chronolog.domain.ids import is_quota_id, routing_key
from chronolog.domain.messages import EventEnvelope, KeyMovedOut
from chronolog.log.port import OutRecord, Record
from chronolog.processors.schedule_store import ScheduleStore, unsealed

__all__ = [
    "MARKER_KEY",
    "SPEC_KEY_PREFIX",
    "Chunk",
    "Folder",
    "Loaded",
    "SnapshotRejected",
    "SnapshotWriter",
    "decode_snapshot",
    "decode_snapshot_async",
    "frame",
    "unframe",
]

MAGIC = b"cs"
KIND_SCHEDULE, KIND_QUOTA, KIND_SPEC, KIND_MARKER = b"S"[0], b"Q"[0], b"P"[0], b"M"[0]
KIND_ROUTING, KIND_GONE, KIND_SEALED = b"R"[0], b"G"[0], b"W"[0]
_KIND_NAMES = {KIND_SCHEDULE: "schedule", KIND_QUOTA: "quota", KIND_SPEC: "spec",
               KIND_MARKER: "marker", KIND_ROUTING: "routing", KIND_GONE: "gone",
               KIND_SEALED: "schedule"}
ROUTING_KEY = routing_key().encode()
MARKER_KEY = b"@snapshot"  # no partition key: those are always tenant/schedule_id
SPEC_KEY_PREFIX = b"@spec/"
_HEADER = struct.Struct(">2sBHQ")
_CRC = struct.Struct(">I")
_PREFIX = _HEADER.size + _CRC.size
# the state versions whose marker, spec shape, routing view and gone records this code reads:
# their layouts are the same since version 1 (version 2 changed the schedule states alone,
# which are upcast, ``upcast_state``)
FRAME_VERSIONS = frozenset(range(1, STATE_VERSION + 1))


class SnapshotRejected(Exception):
    """A snapshot that must not be used; the reason says why (the fold starts at 0)."""


def frame(key: bytes, kind: int, version: int, through: int, body: bytes) -> bytes:
    """A record value: header, CRC-32 of key + header + body, body."""
    header = _HEADER.pack(MAGIC, kind, version, through)
    crc = zlib.crc32(body, zlib.crc32(header, zlib.crc32(key)))
    return header + _CRC.pack(crc) + body


def unframe(key: bytes, value: bytes) -> tuple[int, int, int, bytes]:
    """(kind, version, through, body) of a record value; ``SnapshotRejected`` if it is
    not one, or its checksum does not match."""
    if len(value) < _PREFIX:
        raise SnapshotRejected(f"record {key!r}: {len(value)} bytes, too short")
    magic, kind, version, through = _HEADER.unpack_from(value)
    if magic != MAGIC or kind not in _KIND_NAMES:
        raise SnapshotRejected(f"record {key!r}: not a snapshot record")
    (crc,) = _CRC.unpack_from(value, _HEADER.size)
    body = value[_PREFIX:]
    if zlib.crc32(body, zlib.crc32(value[:_HEADER.size], zlib.crc32(key))) != crc:
        raise SnapshotRejected(f"record {key!r}: checksum mismatch")
    return kind, version, through, body


# ------------------------------------------------------------------------------- reading


@dataclass
class Loaded:
    """A decoded snapshot of one partition."""

    states: ScheduleStore  # the quiet schedules cold, when the store has a horizon
    quotas: dict[str, QuotaState]
    through: dict[str, int]  # key -> the offset of events its record covers up to
    fold_from: int  # fold the tail of events from here
    last_event: tuple[int, str] | None  # (offset, event ID) of the last event before it
    specs: set[str]  # hashes of the spec shapes stored
    marker: dict[str, Any]
    records: int  # records read (every version of every key)
    routing: RoutingView | None = None  # the partition's routing view, when stored


DECODE_SLICE = 5000  # records decoded between two yields of ``decode_snapshot_steps``


def decode_snapshot(records: Iterable[Record], events_end: int,
                    into: ScheduleStore | None = None) -> Loaded | None:
    """The snapshot in ``records`` (a partition of ``state`` read from 0, in order), or
    None when there is none (no marker). ``events_end``: the end offset of the partition
    of ``events``; ``into``: the (empty) store to restore the schedules into — its quiet
    ones are held cold when it has a horizon; by default one without (every state decoded).
    Raises ``SnapshotRejected`` for a copy that must not be used."""
    steps = decode_snapshot_steps(records, events_end, into)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def decode_snapshot_async(records: Iterable[Record], events_end: int,
                                into: ScheduleStore | None = None) -> Loaded | None:
    """``decode_snapshot``, giving the event loop a turn every ``DECODE_SLICE`` records (a
    partition of 100,000 states is seconds of decoding: the other partitions, a group
    heartbeat, the dev node's API go on meanwhile)."""
    steps = decode_snapshot_steps(records, events_end, into)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


def decode_snapshot_steps(records: Iterable[Record], events_end: int,
                          into: ScheduleStore | None = None,
                          ) -> Generator[None, None, Loaded | None]:
    """``decode_snapshot`` in steps: yields every ``DECODE_SLICE`` records decoded."""
    latest: dict[bytes, bytes] = {}
    n = 0
    for rec in records:
        n += 1
        if rec.key is not None:
            latest[rec.key] = rec.value
    raw_marker = latest.pop(MARKER_KEY, None)
    if raw_marker is None:
        return None
    kind, version, fold_from, body = unframe(MARKER_KEY, raw_marker)
    if kind != KIND_MARKER:
        raise SnapshotRejected("the marker record is not a marker")
    if version not in FRAME_VERSIONS:
        raise SnapshotRejected(f"the marker is of state version {version}, "
                               f"this code reads {STATE_VERSION}")
    try:
        marker = orjson.loads(body)
        last = marker["last_event"]
        last_event = None if last is None else (int(last[0]), str(last[1]))
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise SnapshotRejected(f"the marker does not decode: {exc!r}") from exc
    if fold_from > events_end:
        raise SnapshotRejected(f"the marker covers events up to {fold_from}, past the end "
                               f"of events ({events_end})")
    shapes: dict[str, Policy] = {}
    bodies: list[tuple[str, int, int, int, bytes]] = []
    for i, (key, value) in enumerate(latest.items()):
        if i % DECODE_SLICE == DECODE_SLICE - 1:
            yield
        kind, version, through, body = unframe(key, value)
        if through > events_end:
            raise SnapshotRejected(f"record {key!r} covers events up to {through}, past the "
                                   f"end of events ({events_end})")
        if kind == KIND_SPEC:
            if version not in FRAME_VERSIONS:
                raise SnapshotRejected(f"spec {key!r} is of state version {version}")
            try:
                shape_hash, shape = decode_shape(body)
            except StateDecodeError as exc:
                raise SnapshotRejected(f"spec {key!r}: {exc}") from exc
            shapes[shape_hash] = shape
        elif kind in (KIND_SCHEDULE, KIND_SEALED, KIND_QUOTA, KIND_ROUTING, KIND_GONE):
            if version not in FRAME_VERSIONS and kind in (KIND_ROUTING, KIND_GONE):
                raise SnapshotRejected(f"record {key!r} is of state version {version}")
            bodies.append((key.decode(), kind, version, through, body))
        else:
            raise SnapshotRejected(f"record {key!r}: a second marker")
    states = ScheduleStore(None, next_wakeup) if into is None else into
    cold = states.horizon is not None
    for h, shape in shapes.items():
        states.add_shape(h, shape)
    quotas: dict[str, QuotaState] = {}
    through_of: dict[str, int] = {}
    routing: RoutingView | None = None
    for i, (skey, kind, version, through, body) in enumerate(bodies):
        if i % DECODE_SLICE == DECODE_SLICE - 1:
            yield
        through_of[skey] = through
        if kind == KIND_GONE:
            continue  # the key left the partition: nothing of it is restored
        if kind == KIND_ROUTING:
            try:
                routing = decode_view(body)
            except ValueError as exc:
                raise SnapshotRejected(f"record {skey!r}: {exc}") from exc
            continue
        if kind == KIND_SEALED:
            try:
                # a quiet state is held as it is (a slice of the record's bytes is a copy of
                # its own, not a view): decoded when first read
                if cold and version == STATE_VERSION and states.put_cold(
                        skey, body, not isinstance(body, bytes)):
                    continue
                body = unsealed(body)
            except ValueError as exc:  # too short, or not zstd's
                raise SnapshotRejected(f"record {skey!r}: {exc}") from exc
        try:
            data: Any = body
            if version != STATE_VERSION:  # upcast (or refused: StateDecodeError)
                data = upcast_state(_KIND_NAMES[kind], orjson.loads(body), version)
            if kind in (KIND_SCHEDULE, KIND_SEALED):
                st = decode_schedule(data, shapes)
                if f"{st.tenant}/{st.schedule_id}" != skey:
                    raise StateDecodeError(f"the state of {st.tenant}/{st.schedule_id}")
                states.put(skey, st)
            else:
                if not is_quota_id(skey.partition("/")[2]):
                    raise StateDecodeError("a quota state under a schedule's key")
                quotas[skey] = decode_quota(data)
        except StateDecodeError as exc:
            raise SnapshotRejected(f"record {skey!r}: {exc}") from exc
    return Loaded(states, quotas, through_of, fold_from, last_event, set(shapes), marker, n,
                  routing)


class Folder:
    """Folds a partition's events into its states: from offset 0, or onto a snapshot —
    each key's events from the offset its record covers, after checking that the event the
    marker names as the last one before ``fold_from`` is there (the first one fed).
    ``routing``: the partition's routing view before its first event (the one the snapshot
    stores replaces it)."""

    def __init__(self, aggregates: PartitionAggregates, loaded: Loaded | None = None,
                 routing: RoutingView | None = None, into: ScheduleStore | None = None,
                 ) -> None:
        self.aggregates = aggregates
        self.loaded = loaded
        self.routing = routing if loaded is None or loaded.routing is None else loaded.routing
        # the schedules: the snapshot's, else ``into`` (empty), else a store without horizon
        self.states: ScheduleStore = (
            loaded.states if loaded is not None
            else into if into is not None else ScheduleStore(None, aggregates.schedule.wakeup))
        self.quotas: dict[str, QuotaState] = {} if loaded is None else loaded.quotas
        self.through: dict[str, int] = {} if loaded is None else loaded.through
        self.fold_from = 0 if loaded is None else loaded.fold_from
        self.check = None if loaded is None else loaded.last_event
        self.last_event = self.check
        self.dirty: set[str] = set()
        self.folded = 0  # events applied

    @property
    def start(self) -> int:
        """The offset of ``events`` to read from."""
        return self.fold_from if self.check is None else self.check[0]

    def undecodable(self, offset: int) -> None:
        """A record at ``offset`` is no event (the caller dead-letters it)."""
        if self.check is not None:
            raise SnapshotRejected(f"the event at {offset} the snapshot names as its last "
                                   f"does not decode")

    def feed(self, offset: int, env: EventEnvelope) -> None:
        """Fold one event (in offset order); raises what ``evolve`` raises (the caller
        dead-letters the record), ``SnapshotRejected`` for a snapshot that does not fit."""
        if self.check is not None:
            if (offset, env.event_id) != self.check:
                raise SnapshotRejected(f"the snapshot's last event {self.check[1]} at "
                                       f"{self.check[0]} is not there (found {env.event_id} "
                                       f"at {offset})")
            self.check = None
            return
        self.last_event = (offset, env.event_id)
        if offset < self.fold_from:
            raise SnapshotRejected(f"an event at {offset}, between the snapshot's last one "
                                   f"and {self.fold_from}")
        key = env.key
        if offset < self.through.get(key, 0):
            return  # its state's record covers it
        self.folded += 1
        self.dirty.add(key)
        ev = env.payload
        aggs = self.aggregates
        kind = aggs.kind_of(env.schedule_id)
        if kind == "routing":
            if self.routing is not None and aggs.routing.owns(ev):
                self.routing = aggs.routing.evolve(self.routing, ev)
            return
        if kind == "quota":
            qs = self.quotas.get(key)
            if qs is None:
                qs = self.quotas[key] = aggs.quota.initial(env.tenant, env.schedule_id)
            if aggs.quota.owns(ev):
                aggs.quota.evolve(qs, ev)
        else:
            st = self.states.get(key)
            if st is None:
                st = self.states[key] = aggs.schedule.initial(env.tenant, env.schedule_id)
            if aggs.schedule.owns(ev):
                aggs.schedule.evolve(st, ev)
        if isinstance(ev, KeyMovedOut):  # it left the partition
            self.states.pop(key, None)
            self.quotas.pop(key, None)

    def finish(self) -> tuple[set[str], tuple[int, str] | None]:
        """The keys whose states are not on ``state`` as they are now (all of them after a
        fold from 0) and the last event fed."""
        if self.check is not None:
            raise SnapshotRejected(f"the snapshot's last event {self.check[1]} at "
                                   f"{self.check[0]} is not there (events end before it)")
        if self.loaded is None:
            # every key fed: the states, and the keys that left (an older record of theirs
            # may be on ``state``: their gone record replaces it)
            return set(self.states) | set(self.quotas) | self.dirty, self.last_event
        return self.dirty, self.last_event


# ------------------------------------------------------------------------------- writing


@dataclass
class Chunk:
    """States encoded for one transaction: (key, kind, body) plus the specs they need."""

    entries: list[tuple[bytes, int, bytes]]
    first: bool  # the round's first chunk (its through is the round's fold_from)
    last: bool  # the round's last chunk: it carries the marker


@dataclass
class _Round:
    number: int
    pending: list[str]
    started_at: float
    start: int | None = None  # fold_from: the through of the first chunk
    last_event: tuple[int, str] | None = None  # the last event before ``start``
    written: int = 0


@dataclass
class SnapshotStats:
    rounds: int = 0  # rounds completed (markers written)
    states: int = 0  # state records written
    chunks: int = 0
    encode_errors: int = 0  # rounds abandoned: a state that could not be encoded
    encode_s: float = 0.0  # time spent encoding on the event loop


@dataclass
class SnapshotWriter:
    """The snapshot of one owned partition being written (module docstring)."""

    partition: int
    topic: str
    owner: str
    epoch: int
    interval_s: float = 5.0  # between rounds while the processor is idle
    busy_interval_s: float = 30.0  # ... and while it is busy
    events: int = 100_000  # events since a round started after which the next one is due
    chunk: int = 256  # states per transaction
    dirty: set[str] = field(default_factory=set)
    specs: set[str] = field(default_factory=set)  # spec shapes stored on the partition
    log_end: int = 0  # the offset after the last event committed (or being committed)
    last_event: tuple[int, str] | None = None  # (offset, event ID) of that last event
    fold_from: int = 0  # of the last marker written or read
    # that marker's last event before fold_from, and whether there is a marker at all
    marker_last: tuple[int, str] | None = None
    marked: bool = False
    events_since: int = 0
    stats: SnapshotStats = field(default_factory=SnapshotStats)
    round: _Round | None = None
    waiting: bool = False  # the transaction with the round's marker is not yet committed
    # chunks taken whose transactions have not committed yet, and how many may be: a round
    # of many chunks, taken while idle, never fills the writer's queue (a command decided
    # meanwhile would commit behind all of them)
    in_flight: int = 0
    max_in_flight: int = 2
    _last_start: float = field(default_factory=time.monotonic)
    _rounds: int = 0

    def takeover_reads_from(self) -> int | None:
        """The first offset of ``events`` a takeover from the latest committed marker reads
        (the event it checks, else ``fold_from``); None while there is no marker: a takeover
        would fold from offset 0. The log's pruning keeps everything from there."""
        if not self.marked:
            return None
        return self.fold_from if self.marker_last is None else self.marker_last[0]

    def start_now(self) -> None:
        """The next round starts at the next batch (after a takeover)."""
        self._last_start = float("-inf")

    def due(self, mono: float, idle: bool) -> bool:
        """Whether the next batch of the partition should carry a chunk. ``idle``: the
        processor has nothing else to decide; while it is busy only an *overdue* round
        writes — the last one started ``busy_interval_s`` ago, or ``events`` events were
        decided since."""
        if self.waiting or self.in_flight >= self.max_in_flight:
            return False
        overdue = (mono - self._last_start >= self.busy_interval_s
                   or self.events_since >= self.events)
        if self.round is not None:
            return idle or overdue
        if not self.dirty and self.log_end <= self.fold_from:
            return False  # nothing changed since the last marker
        return overdue or (idle and mono - self._last_start >= self.interval_s)

    def take(self, states: ScheduleStore, quotas: dict[str, QuotaState],
             mono: float, idle: bool = True, routing: RoutingView | None = None,
             ) -> Chunk | None:
        """The next chunk, encoded now (before the batch that carries it is decided): the
        dirty keys' states, the routing view, and a gone record for a key the partition no
        longer holds."""
        if not self.due(mono, idle):
            return None
        rnd = self.round
        first = rnd is None
        if rnd is None:
            self._rounds += 1
            # in key order (taken from the end: ascending): a chunk's keys are neighbours in
            # the state topic's key index, so its transaction rewrites a few pages of it, not
            # one page per state (a first round of 833,000 states in hash order wrote about
            # 4 MB of SQLite write-ahead log per chunk of 256)
            rnd = self.round = _Round(self._rounds, sorted(self.dirty, reverse=True), mono)
            self.dirty = set()
            self.events_since = 0
            self._last_start = mono
        started = time.perf_counter()
        entries: list[tuple[bytes, int, bytes]] = []
        pending = rnd.pending
        take = pending[-self.chunk:]
        del pending[-self.chunk:]
        try:
            sealed = states.sealed(take)  # a cold state's bytes as they are
            for key in take:
                if key in sealed:
                    data, pol = sealed[key]
                    if pol is not None:
                        shape_hash, shape = shape_of(pol)
                        if shape_hash not in self.specs:
                            entries.append((SPEC_KEY_PREFIX + shape_hash.encode(), KIND_SPEC,
                                            shape))
                            self.specs.add(shape_hash)
                    entries.append((key.encode(), KIND_SEALED, data))
                    continue
                qs = quotas.get(key)
                if qs is not None:
                    entries.append((key.encode(), KIND_QUOTA, encode_quota(qs)))
                elif key.encode() == ROUTING_KEY:
                    if routing is not None:
                        entries.append((ROUTING_KEY, KIND_ROUTING, encode_view(routing)))
                else:
                    entries.append((key.encode(), KIND_GONE, b""))
        except Exception:
            # a state that cannot be encoded: this round is given up (its keys stay dirty);
            # the last marker stays valid, restore folds a longer tail
            self.stats.encode_errors += 1
            self.dirty.update(take)
            self.dirty.update(pending)
            self.round = None
            self.specs.clear()  # specs of this chunk were not written
            raise
        finally:
            self.stats.encode_s += time.perf_counter() - started
        last = not pending
        self.waiting = last  # the marker's transaction: no next round before it commits
        self.in_flight += 1
        return Chunk(entries, first, last)

    def transaction(self, chunk: Chunk | None, events: tuple[int, int, str] | None,
                    base: tuple[int, tuple[int, str] | None]) -> list[OutRecord]:
        """For one transaction of the partition, once its records have positions (inside
        it: ``then``): the records of its chunk, if any, framed as of where its events begin;
        then the partition's end moves past its events.

        ``events``: (first offset, last offset, last event ID) of its events, or None;
        ``base``: (``log_end``, ``last_event``) before it — taken by the caller before the
        first call, as ``then`` may be called again with other positions."""
        through = base[0] if events is None else events[0]
        out = self._records(chunk, through, base[1]) if chunk is not None else []
        if events is not None:
            self.log_end = events[1] + 1
            self.last_event = (events[1], events[2])
        return out

    def _records(self, chunk: Chunk, through: int,
                 base_last: tuple[int, str] | None) -> list[OutRecord]:
        rnd = self.round
        if rnd is None:
            return []
        if chunk.first:
            rnd.start = through
            rnd.last_event = base_last
        out = [OutRecord(self.topic, key, frame(key, kind, STATE_VERSION, through, body),
                         self.partition) for key, kind, body in chunk.entries]
        if chunk.last:
            assert rnd.start is not None
            marker = orjson.dumps({
                "fold_from": rnd.start,
                "last_event": None if rnd.last_event is None else list(rnd.last_event),
                "round": rnd.number, "owner": self.owner, "epoch": self.epoch,
                "states": rnd.written + len(chunk.entries),
            })
            out.append(OutRecord(self.topic, MARKER_KEY,
                                 frame(MARKER_KEY, KIND_MARKER, STATE_VERSION, rnd.start,
                                       marker), self.partition))
        return out

    def committed(self, chunk: Chunk) -> None:
        """The chunk's transaction committed (chunks commit in the order they were taken)."""
        if chunk.last:
            self.waiting = False
        self.in_flight -= 1
        rnd = self.round
        if rnd is None:
            return
        self.stats.chunks += 1
        self.stats.states += len(chunk.entries)
        rnd.written += len(chunk.entries)
        if chunk.last:
            assert rnd.start is not None
            self.fold_from = rnd.start
            self.marker_last = rnd.last_event
            self.marked = True
            self.stats.rounds += 1
            self.round = None
