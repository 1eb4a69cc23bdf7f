"""Snapshots of a partition (``chronolog.processors.snapshots``): restore = fold from 0.

The stateful property drives the decider's machine (random specs, every command kind,
clock advances; tests/unit/decider/test_invariants.py) plus a tenant's quota aggregate on
one partition of a simulated log: decisions are grouped in transactions, each transaction
gets offsets (with gaps, as Kafka's commit markers leave), and the snapshot writer works as
the processor drives it — a chunk encoded at the start of a transaction, framed when the
transaction's events have offsets, several transactions per round. At random points a new
owner takes over: it decodes the state topic (compacted or not), folds the tail of events
from the marker, and must hold exactly the states a fold from offset 0 gives; it then goes
on with the restored states and a writer of its own, so rounds across owners are covered.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from chronolog.commands import state_codec as sc
from chronolog.commands.aggregate import PROCESSOR, Decision
from chronolog.commands.decider import decide, evolve, fold, held, move_out, next_wakeup
from chronolog.commands.quota import QuotaState, decide_quota, evolve_quota
from chronolog.commands.registry import PartitionAggregates
from chronolog.commands.routing import table_of
from chronolog.commands.state import ScheduleState
from chronolog.domain import messages as m
from chronolog.log.port import Record
from chronolog.processors import snapshots as sn
from chronolog.processors.schedule_store import ScheduleStore, unsealed
from support.decider import T0, Story
from support.states import partition_fields
from unit.decider.test_invariants import SIDS, TENANT, DeciderMachine

AGGREGATES = PartitionAggregates.of_partition(0, table_of([1]))

QUOTA_KEY = f"{TENANT}/@quota"


def key_of(sid: str) -> str:
    return f"{TENANT}/{sid}"


class PartitionMachine(DeciderMachine):
    """The decider's machine on one partition of a log, with an owner writing snapshots."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int, m.EventEnvelope]] = []
        self.state_log: list[Record] = []
        self.next_offset = 0
        self.tx: list[tuple[str, str, Any]] = []  # (key, schedule id, event) of the open one
        self.quota = QuotaState(TENANT)
        self.epoch = 1
        self.writer = self._writer(set(), set(), 0, None, 0)
        self.chunk: sn.Chunk | None = None
        self.mono = 0.0
        self.takeovers = 0
        self.q = 0
        self.decided = 0
        self.commit_every = 1_000_000  # until configure
        self.gap = 0
        self.lag = 0
        self.pending: list[tuple[list[tuple[str, str, Any]], sn.Chunk | None, int]] = []

    def _writer(self, dirty: set[str], specs: set[str], log_end: int,
                last_event: tuple[int, str] | None, fold_from: int) -> sn.SnapshotWriter:
        w = sn.SnapshotWriter(0, "state", f"owner-{self.epoch}", self.epoch, interval_s=1.0,
                              events=1_000_000, chunk=2, dirty=dirty, specs=specs,
                              log_end=log_end, last_event=last_event, fold_from=fold_from)
        w.start_now()
        return w

    def _do(self, sid: str, payload: Any) -> Decision:
        decision = super()._do(sid, payload)
        self._record(key_of(sid), sid, decision.events)
        return decision

    def _record(self, key: str, sid: str, events: list[Any]) -> None:
        if events:
            self.writer.dirty.add(key)
            self.writer.events_since += len(events)
            self.tx.extend((key, sid, e) for e in events)
            self.decided += 1
            if self.decided % self.commit_every == 0:  # a batch of commit_every decisions
                self.commit(self.gap, 0.5, True)

    def _by_key(self) -> dict[str, ScheduleState]:
        return {key_of(sid): s for sid, s in self.states.items()}

    def _store(self) -> ScheduleStore:
        """The owner's states as its processor holds them: the quiet ones whose wake-up is
        after now cold."""
        store = ScheduleStore(timedelta(0), next_wakeup)
        for key, s in self._by_key().items():
            store.put(key, s)
        store.cool(self.now)
        return store

    # -- the simulated log ---------------------------------------------------------------

    @initialize(chunk=st.integers(1, 3), interval=st.sampled_from([0.0, 1.0, 3.0]),
                commit_every=st.sampled_from([1, 2, 4]), gap=st.sampled_from([0, 0, 1]),
                lag=st.sampled_from([0, 0, 1, 3]))
    def configure(self, chunk: int, interval: float, commit_every: int, gap: int,
                  lag: int) -> None:
        """Chunk size, round interval, decisions per transaction, commit-marker offsets,
        transactions decided but not yet committed (the writer loop's queue)."""
        self.writer.chunk = chunk
        self.writer.interval_s = interval
        self.commit_every = commit_every
        self.gap = gap
        self.lag = lag

    @rule(gap=st.integers(0, 2), seconds=st.sampled_from([0.0, 0.5, 2.0]),
          idle=st.booleans())
    def commit(self, gap: int, seconds: float, idle: bool) -> None:
        """The open transaction is decided (it commits once ``lag`` later ones are); the
        next one begins, with a chunk when one is due."""
        self.pending.append((self.tx, self.chunk, gap))
        self.tx, self.chunk = [], None
        while len(self.pending) > self.lag:
            self._commit(*self.pending.pop(0))
        self.mono += seconds
        self.chunk = self.writer.take(self._store(), {QUOTA_KEY: self.quota}, self.mono,
                                      idle)

    def _commit(self, tx: list[tuple[str, str, Any]], chunk: sn.Chunk | None,
                gap: int) -> None:
        base = (self.writer.log_end, self.writer.last_event)
        span = None
        if tx:
            first = self.next_offset
            for key, sid, payload in tx:
                self.q += 1
                env = m.EventEnvelope.model_construct(
                    event_id=f"e{self.q}", type=payload.type, version=1, key=key,
                    tenant=TENANT, schedule_id=sid, at=self.now, causation_id=None,
                    payload=payload)
                self.events.append((self.next_offset, env))
                self.next_offset += 1
            span = (first, self.next_offset - 1, self.events[-1][1].event_id)
        records = self.writer.transaction(chunk, span, base)
        for rec in records:
            self.state_log.append(Record(rec.topic, 0, len(self.state_log), rec.key, rec.value))
        if chunk is not None:
            self.writer.committed(chunk)
        self.next_offset += gap  # a commit marker (Kafka), or nothing (SQLite)

    @rule(op=st.sampled_from(["reserve", "confirm", "release", "tick"]),
          i=st.integers(0, len(SIDS) - 1))
    def quota_step(self, op: str, i: int) -> None:
        sid = SIDS[i]
        self.n += 1
        payload: Any = {
            "reserve": lambda: m.ReserveQuotaSlot(schedule_id=sid, create_command_id=f"c-{sid}"),
            "confirm": lambda: m.ConfirmQuotaSlot(schedule_id=sid, create_command_id=f"c-{sid}"),
            "release": lambda: m.ReleaseQuotaSlot(schedule_id=sid, create_command_id=f"c-{sid}",
                                                  reason="test"),
            "tick": lambda: m.Tick(),
        }[op]()
        env = m.CommandEnvelope(command_id=f"q{self.n}", type=payload.type, tenant=TENANT,
                                principal=PROCESSOR, schedule_id="@quota", issued_at=self.now,
                                payload=payload)
        dec = decide_quota(self.quota, env, self.now, 2)
        for e in dec.events:
            evolve_quota(self.quota, e)
        self._record(QUOTA_KEY, "@quota", dec.events)

    @rule(compacted=st.booleans(), go_on=st.booleans(), cold=st.booleans())
    def take_over(self, compacted: bool, go_on: bool, cold: bool) -> None:
        """A new owner restores from the state topic plus the tail of events (``cold``:
        into a store that keeps the quiet states cold, as a processor's does)."""
        self.pending.append((self.tx, self.chunk, 0))  # what the old owner decided commits;
        self.tx, self.chunk = [], None  # its next chunk is lost with it
        while self.pending:
            self._commit(*self.pending.pop(0))
        records = self.state_log
        if compacted:  # what Kafka's cleaner may leave: the latest record of each key
            latest = {r.key: r for r in records}
            records = sorted(latest.values(), key=lambda r: r.offset)
        into = ScheduleStore(timedelta(0) if cold else None, next_wakeup)
        loaded = sn.decode_snapshot(records, self.next_offset, into)
        if loaded is not None:  # each record is the fold of exactly the events it covers
            for key, through in loaded.through.items():
                covered = [e.payload for o, e in self.events if e.key == key and o < through]
                if key == QUOTA_KEY:
                    q = QuotaState(TENANT)
                    for e in covered:
                        evolve_quota(q, e)
                    assert list(loaded.quotas[key].slots.items()) == list(q.slots.items())
                elif key not in loaded.states:  # a gone record: the key left
                    assert not held(fold(TENANT, key.split("/", 1)[1], covered))
                else:
                    assert (fold(TENANT, key.split("/", 1)[1], covered).snapshot()
                            == loaded.states[key].snapshot())
        folder = sn.Folder(AGGREGATES, loaded, into=into)
        for offset, env in self.events:
            if offset >= folder.start:
                folder.feed(offset, env)
        dirty, last_event = folder.finish()
        quota_events = any(env.key == QUOTA_KEY for _, env in self.events)
        live = partition_fields(self._by_key(), {QUOTA_KEY: self.quota} if quota_events else {})
        assert partition_fields(folder.states, folder.quotas) == live
        # ... and that is the fold of every event from offset 0
        by_key: dict[str, list[Any]] = {}
        for _, env in self.events:
            by_key.setdefault(env.key, []).append(env.payload)
        for key, evs in by_key.items():
            if key != QUOTA_KEY:
                sid = key.split("/", 1)[1]
                if key not in folder.states:  # it left the partition
                    assert not held(fold(TENANT, sid, evs))
                    continue
                assert fold(TENANT, sid, evs).snapshot() == folder.states[key].snapshot()
        if loaded is not None:  # the tail: each key's events its record does not cover
            assert folder.folded == sum(
                1 for o, e in self.events
                if o >= loaded.fold_from and o >= loaded.through.get(e.key, 0))
        self.takeovers += 1
        if go_on:  # the new owner goes on from what it restored
            self.epoch += 1
            for sid in list(self.states):
                self.states[sid] = folder.states.get(key_of(sid), self.states[sid])
            if QUOTA_KEY in folder.quotas:
                self.quota = folder.quotas[QUOTA_KEY]
            end = self.events[-1][0] + 1 if self.events else 0
            self.writer = self._writer(dirty, set() if loaded is None else loaded.specs,
                                       max(end, folder.fold_from), last_event,
                                       0 if loaded is None else loaded.fold_from)


PartitionMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestRestoreFromSnapshotEqualsFoldFromZero = PartitionMachine.TestCase
TestRestoreFromSnapshotEqualsFoldFromZero.pytestmark = [pytest.mark.exhaustive]  # type: ignore[attr-defined]


class MovingPartitionMachine(PartitionMachine):
    """The same, with schedules leaving the partition (a handover to another routing
    version, docs/design.md §18) and coming back at random points: a key that left is not
    restored from an older record of it (its gone record, or its moved-out event in the
    tail, removes it), and one that came back is restored as it came."""

    def __init__(self) -> None:
        super().__init__()
        self.away: dict[str, m.AdoptKey] = {}
        self.version = 1

    def _by_key(self) -> dict[str, ScheduleState]:
        return {key_of(sid): s for sid, s in self.states.items() if sid not in self.away}

    def _do(self, sid: str, payload: Any) -> Decision:
        if sid in self.away:  # a command for it: it is back first
            self._come_back(sid)
        return super()._do(sid, payload)

    def _apply(self, sid: str, dec: Decision) -> None:
        for e in dec.events:
            evolve(self.states[sid], e)
            self.history[sid].append(e)
        self._record(key_of(sid), sid, dec.events)

    @rule(i=st.integers(0, len(SIDS) - 1))
    def leave(self, i: int) -> None:
        sid = SIDS[i]
        state = self.states.get(sid)
        if sid in self.away or state is None or not held(state):
            return
        self.version += 1
        dec = move_out(state, 1, self.version, 0)
        self.away[sid] = dec.sends[0].payload
        self._apply(sid, dec)

    @rule(i=st.integers(0, len(SIDS) - 1))
    def come_back(self, i: int) -> None:
        if SIDS[i] in self.away:
            self._come_back(SIDS[i])

    def _come_back(self, sid: str) -> None:
        adopt = self.away.pop(sid)
        env = m.CommandEnvelope(command_id=f"in-{self.version}-{sid}", type=adopt.type,
                                tenant=TENANT, principal=PROCESSOR, schedule_id=sid,
                                issued_at=self.now, payload=adopt)
        dec = decide(self.states[sid], env, self.now)
        assert dec.ok, dec.reason
        self._apply(sid, dec)


MovingPartitionMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestRestoreWithKeysLeavingAndComingBack = MovingPartitionMachine.TestCase
TestRestoreWithKeysLeavingAndComingBack.pytestmark = [pytest.mark.exhaustive]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- rejections


def written_partition(states: int = 3, manual: bool = False,
                      ) -> tuple[list[Record], list[tuple[int, m.EventEnvelope]]]:
    """A partition with a few schedules (``manual``: each with a manual run), a complete
    snapshot round and events after it."""
    machine = PartitionMachine()
    machine.writer.chunk = 1
    for i in range(states):
        s = Story(schedule_id=f"s{i}").create()
        if manual:
            s.given(m.TriggerRun(request_key=f"key-{i}"), T0)
        machine.states[f"s{i}"] = s.state
        machine._record(key_of(f"s{i}"), f"s{i}", s.history)
    while True:
        machine.commit(0, 1.0, True)
        if machine.writer.stats.rounds and machine.chunk is None:
            break
    return machine.state_log, machine.events


def reframed(rec: Record, version: int | None = None, through: int | None = None,
             body: bytes | None = None, kind: int | None = None) -> Record:
    k, v, t, b = sn.unframe(rec.key or b"", rec.value)
    value = sn.frame(rec.key or b"", k if kind is None else kind, v if version is None else version,
                     t if through is None else through, b if body is None else body)
    return Record(rec.topic, rec.partition, rec.offset + 1000, rec.key, value)


def end_of(events: list[tuple[int, m.EventEnvelope]]) -> int:
    return events[-1][0] + 1


def test_a_complete_round_is_a_snapshot_of_every_state() -> None:
    records, events = written_partition()
    loaded = sn.decode_snapshot(records, end_of(events))
    assert loaded is not None
    assert sorted(loaded.states) == [key_of(f"s{i}") for i in range(3)]
    assert loaded.fold_from == end_of(events)
    assert loaded.last_event == (events[-1][0], events[-1][1].event_id)


def test_a_round_writes_its_states_in_key_order() -> None:
    records, _ = written_partition(states=30)
    keys = [r.key for r in records
            if sn.unframe(r.key or b"", r.value)[0] in (sn.KIND_SEALED, sn.KIND_SCHEDULE)]
    assert len(keys) == 30 and keys == sorted(keys)


def test_no_marker_is_no_snapshot() -> None:
    records, events = written_partition()
    assert sn.decode_snapshot([r for r in records if r.key != sn.MARKER_KEY],
                              end_of(events)) is None


def test_a_flipped_byte_is_caught_by_the_checksum() -> None:
    records, events = written_partition()
    victim = next(r for r in records if r.key == key_of("s1").encode())
    value = bytearray(victim.value)
    value[-3] ^= 0x01
    bad = Record(victim.topic, 0, 999, victim.key, bytes(value))
    with pytest.raises(sn.SnapshotRejected, match="checksum"):
        sn.decode_snapshot([*records, bad], end_of(events))


def test_a_record_under_another_key_is_caught_by_the_checksum() -> None:
    records, events = written_partition()
    victim = next(r for r in records if r.key == key_of("s1").encode())
    moved = Record(victim.topic, 0, 999, key_of("s2").encode(), victim.value)
    with pytest.raises(sn.SnapshotRejected, match="checksum"):
        sn.decode_snapshot([*records, moved], end_of(events))


def test_a_state_of_another_version_is_ignored_unless_upcast() -> None:
    records, events = written_partition()
    victim = next(r for r in records if r.key == key_of("s1").encode())
    stale = reframed(victim, version=sc.STATE_VERSION + 1)
    with pytest.raises(sn.SnapshotRejected, match="version"):
        sn.decode_snapshot([*records, stale], end_of(events))
    older = reframed(victim, version=0)
    with pytest.raises(sn.SnapshotRejected, match="no upcaster"):
        sn.decode_snapshot([*records, older], end_of(events))
    sc.register_state_upcaster("schedule", 0)(lambda body: body)
    try:
        loaded = sn.decode_snapshot([*records, older], end_of(events))
        assert loaded is not None and key_of("s1") in loaded.states
    finally:
        sc._UPCASTERS.pop(("schedule", 0), None)


def test_a_snapshot_written_by_version_1_is_restored_through_its_upcast() -> None:
    records, events = written_partition(manual=True)

    def version_1(r: Record) -> Record:
        kind, _v, _t, body = sn.unframe(r.key or b"", r.value)
        if kind == sn.KIND_SEALED:  # version 1 wrote the state alone (kind S), its manual
            a = orjson.loads(unsealed(body))  # keys without their runs' final states
            a[18] = [entry[:3] for entry in a[18]]
            return reframed(r, version=1, body=orjson.dumps(a), kind=sn.KIND_SCHEDULE)
        return reframed(r, version=1, body=body)

    old = [version_1(r) for r in records]
    assert {sn.unframe(r.key or b"", r.value)[1] for r in old} == {1}
    loaded = sn.decode_snapshot(old, end_of(events))
    current = sn.decode_snapshot(records, end_of(events))
    assert loaded is not None and current is not None
    assert partition_fields(loaded.states, loaded.quotas) == partition_fields(current.states,
                                                                              current.quotas)


def test_a_marker_of_another_version_is_ignored() -> None:
    records, events = written_partition()
    marker = next(r for r in reversed(records) if r.key == sn.MARKER_KEY)
    with pytest.raises(sn.SnapshotRejected, match="marker is of state version"):
        sn.decode_snapshot([*records, reframed(marker, version=sc.STATE_VERSION + 1)],
                           end_of(events))


def test_a_snapshot_past_the_end_of_events_is_ignored() -> None:
    records, events = written_partition()
    with pytest.raises(sn.SnapshotRejected, match="past the end"):
        sn.decode_snapshot(records, end_of(events) - 1)


def test_a_snapshot_of_another_log_does_not_fit_its_events() -> None:
    records, events = written_partition()
    loaded = sn.decode_snapshot(records, end_of(events))
    assert loaded is not None
    folder = sn.Folder(AGGREGATES, loaded)
    offset, env = events[-1]
    other = env.model_copy(update={"event_id": "someone-else.0"})
    with pytest.raises(sn.SnapshotRejected, match="not there"):
        folder.feed(offset, other)
    empty = sn.Folder(AGGREGATES, sn.decode_snapshot(records, end_of(events)))
    with pytest.raises(sn.SnapshotRejected, match="events end before it"):
        empty.finish()


def test_a_marker_that_is_no_json_is_ignored() -> None:
    records, events = written_partition()
    marker = next(r for r in reversed(records) if r.key == sn.MARKER_KEY)
    with pytest.raises(sn.SnapshotRejected, match="marker does not decode"):
        sn.decode_snapshot([*records, reframed(marker, body=b"{nope")], end_of(events))


def test_a_record_that_is_no_snapshot_record_is_ignored() -> None:
    records, events = written_partition()
    junk = Record("state", 0, 999, key_of("s0").encode(), orjson.dumps({"hello": 1}))
    with pytest.raises(sn.SnapshotRejected, match=r"not a snapshot record|too short"):
        sn.decode_snapshot([*records, junk], end_of(events))
