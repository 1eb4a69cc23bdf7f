"""The processor: the single writer of its partitions of ``events``.

A ``Processor`` joins the consumer group on ``commands``. For each assigned partition p it
acquires ownership (a Kafka transactional producer ``<prefix>processor-p<p>``, or a SQLite
epoch), which fences any previous owner; restores state by folding partition p of ``events``;
and rebuilds its reply cache from the tail of partition p of ``replies``. Then it loops: take
a batch of commands, decide each against its schedule's state, give itself ``Tick`` commands
for schedules whose timers are due, and commit the events, ready hints, dead letters, replies
and the consumed command offsets in ONE transaction per partition per batch.

Timers are a heap of (wake instant, key) per partition, fed by ``next_wakeup(state)`` after
every decision — never a scan of all schedules; an idle partition costs nothing.

A ``Fenced`` commit means a newer owner exists: the partition's state and owner are dropped
at once and nothing more is written for it (its batch is invisible to read_committed readers).
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Protocol, Sequence

import orjson
import structlog

from chronolog.commands.decider import Decision, TenantContext, decide, evolve, next_wakeup
from chronolog.commands.state import ScheduleState, initial_state
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import event_id_for, partition_key
from chronolog.log.port import EventLog, Fenced, OutRecord, PartitionOwner, Position, Record

log = structlog.get_logger("chronolog.processor")

PROCESSOR_GROUP_SUFFIX = "processors"
READY_EVENT_TYPES = ("OccurrenceMaterialized", "OccurrenceReady", "OccurrenceRedriven")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class TenantPolicies(Protocol):
    """Where a processor learns a tenant's allowed job types and schedule quota."""

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]: ...


class OpenTenants:
    """Every tenant may run every job, with no quota (embedded single-user default)."""

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]:
        return (None, None)


class SnapshotStore(Protocol):
    """Hook for snapshots: restore may start from a saved fold instead of offset 0."""

    async def load(self, partition: int) -> tuple[int, dict[str, ScheduleState]] | None: ...


@dataclass
class ProcessorConfig:
    batch_max: int = 500
    poll_ms: int = 50
    ticks_per_batch: int = 2000
    reply_cache_size: int = 10_000
    reply_retention_s: float = 3600.0
    restore_chunk: int = 2000


@dataclass
class ProcessorStats:
    commands: int = 0
    events: int = 0
    ticks: int = 0
    transactions: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    fenced: int = 0
    started_at: float = field(default_factory=time.monotonic)


class PartitionState:
    """Everything a processor holds for one owned partition."""

    def __init__(self, partition: int, owner: PartitionOwner) -> None:
        self.partition = partition
        self.owner = owner
        self.states: dict[str, ScheduleState] = {}
        self.heap: list[tuple[datetime, str]] = []
        self.armed: dict[str, datetime] = {}
        self.replies: OrderedDict[str, tuple[float, m.Reply]] = OrderedDict()
        self.active_by_tenant: dict[str, int] = {}
        self.events_offset = 0

    def arm(self, key: str, state: ScheduleState) -> None:
        wake = next_wakeup(state)
        if wake is None:
            self.armed.pop(key, None)
            return
        if self.armed.get(key) == wake:
            return
        self.armed[key] = wake
        heapq.heappush(self.heap, (wake, key))

    def due_keys(self, now: datetime, limit: int) -> list[str]:
        out: list[str] = []
        while self.heap and self.heap[0][0] <= now and len(out) < limit:
            wake, key = heapq.heappop(self.heap)
            if self.armed.get(key) != wake:
                continue  # superseded entry
            del self.armed[key]
            out.append(key)
        return out

    def next_wake(self) -> datetime | None:
        while self.heap and self.armed.get(self.heap[0][1]) != self.heap[0][0]:
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else None


class Processor:
    """Owns partitions of ``commands``/``events`` and decides their commands."""

    def __init__(
        self,
        log_: EventLog,
        member_id: str,
        tenants: TenantPolicies | None = None,
        config: ProcessorConfig | None = None,
        clock: Callable[[], datetime] = utc_now,
        snapshots: SnapshotStore | None = None,
    ) -> None:
        self.log = log_
        self.topics = log_.topics
        self.member_id = member_id
        self.tenants = tenants or OpenTenants()
        self.config = config or ProcessorConfig()
        self.clock = clock
        self.snapshots = snapshots
        self.group = f"{self.topics.prefix}{PROCESSOR_GROUP_SUFFIX}"
        self.partitions: dict[int, PartitionState] = {}
        self.stats = ProcessorStats()
        self._stopping = asyncio.Event()
        self._consumer: Any = None
        self._ready_classes: set[str] = set()
        self.on_commit: list[Callable[[int, list[m.EventEnvelope]], None]] = []

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the loop to finish its open batch and leave the group."""
        self._stopping.set()

    async def run(self) -> None:
        """Run until ``stop()``; then commit nothing half-way and leave the group."""
        self._consumer = self.log.group_consumer(
            self.group,
            [self.topics.commands],
            self.member_id,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
        )
        await self._consumer.start()
        try:
            while not self._stopping.is_set():
                await self.step()
        finally:
            await self._consumer.close()
            for ps in list(self.partitions.values()):
                await self._drop(ps.partition, "shutdown")

    async def step(self) -> None:
        """One iteration: a batch of commands plus due timers, one transaction per partition."""
        timeout = self._poll_timeout()
        records = await self._consumer.getmany(timeout_ms=timeout, max_records=self.config.batch_max)
        now = self.clock()
        by_partition: dict[int, list[Record]] = {}
        for rec in records:
            by_partition.setdefault(rec.partition, []).append(rec)
        work = []
        for p, ps in list(self.partitions.items()):
            batch = by_partition.get(p, [])
            nw = ps.next_wake()
            if not batch and (nw is None or nw > now):
                continue
            work.append((ps, batch, self._decide_partition(ps, batch, now)))
        # decisions are CPU work done above, partition by partition; the transactions are
        # I/O and run concurrently (one owner per partition, so they never conflict)
        await asyncio.gather(*(self._commit_partition(ps, batch, out, consumed)
                               for ps, batch, (out, consumed) in work if out is not None))

    def _poll_timeout(self) -> int:
        wakes = [w for w in (ps.next_wake() for ps in self.partitions.values()) if w is not None]
        if not wakes:
            return self.config.poll_ms
        delta = (min(wakes) - self.clock()).total_seconds() * 1000
        return int(max(0, min(self.config.poll_ms, delta)))

    # ------------------------------------------------------------------ ownership

    async def _on_assigned(self, tps: set[tuple[str, int]]) -> None:
        for topic, p in sorted(tps):
            if topic != self.topics.commands or p in self.partitions:
                continue
            owner = await self.log.acquire(p, self.member_id)  # fences the previous owner
            ps = PartitionState(p, owner)
            await self._restore(ps)
            committed = await self.log.committed(self.group, self.topics.commands, p)
            self._consumer.seek(self.topics.commands, p, committed or 0)
            self.partitions[p] = ps
            log.info("partition_assigned", partition=p, schedules=len(ps.states),
                     events_offset=ps.events_offset, commands_offset=committed or 0)

    async def _on_revoked(self, tps: set[tuple[str, int]]) -> None:
        for topic, p in sorted(tps):
            if topic == self.topics.commands and p in self.partitions:
                await self._drop(p, "revoked")

    async def _drop(self, p: int, why: str) -> None:
        ps = self.partitions.pop(p, None)
        if ps is None:
            return
        try:
            await ps.owner.close()
        except Exception:  # noqa: BLE001 - the owner is being discarded either way
            pass
        log.info("partition_dropped", partition=p, reason=why)

    async def _restore(self, ps: PartitionState) -> None:
        """Fold partition p of ``events`` (from a snapshot when one exists)."""
        p = ps.partition
        offset = 0
        if self.snapshots is not None:
            snap = await self.snapshots.load(p)
            if snap is not None:
                offset, ps.states = snap
        end = await self.log.end_offset(self.topics.events, p)
        while offset < end:
            recs = await self.log.read(self.topics.events, p, offset, self.config.restore_chunk)
            if not recs:
                break
            for rec in recs:
                env = codec.decode_event(rec.value)
                st = ps.states.get(env.key)
                if st is None:
                    st = ps.states[env.key] = initial_state(env.tenant, env.schedule_id)
                evolve(st, env.payload)
            offset = recs[-1].offset + 1
        ps.events_offset = offset
        for key, st in ps.states.items():
            ps.arm(key, st)
            if st.exists:
                ps.active_by_tenant[st.tenant] = ps.active_by_tenant.get(st.tenant, 0) + 1
        await self._restore_replies(ps)

    async def _restore_replies(self, ps: PartitionState) -> None:
        end = await self.log.end_offset(self.topics.replies, ps.partition)
        offset = max(0, end - self.config.reply_cache_size)
        while offset < end:
            recs = await self.log.read(self.topics.replies, ps.partition, offset, 2000)
            if not recs:
                break
            for rec in recs:
                reply = codec.decode_reply(rec.value)
                ps.replies[reply.command_id] = (rec.timestamp_ms / 1000.0, reply)
            offset = recs[-1].offset + 1
        while len(ps.replies) > self.config.reply_cache_size:
            ps.replies.popitem(last=False)

    # ------------------------------------------------------------------ the batch

    def _decide_partition(
        self, ps: PartitionState, batch: list[Record], now: datetime
    ) -> tuple["_Output | None", dict[tuple[str, int], int]]:
        """Decide a partition's commands and due timers (state is evolved as we go)."""
        out = _Output(self.topics, ps.partition, (
            ("processor", self.member_id.encode()), ("epoch", str(ps.owner.epoch).encode())))
        consumed: dict[tuple[str, int], int] = {}
        for rec in batch:
            self._handle(ps, rec, now, out)
            consumed[(self.topics.commands, ps.partition)] = rec.offset + 1
        for key in ps.due_keys(now, self.config.ticks_per_batch):
            st = ps.states.get(key)
            if st is None:
                continue
            cid = f"tick:{ps.partition}:{int(now.timestamp() * 1e6)}:{key}"
            dec = decide(st, _tick_envelope(st, cid, now), now, TenantContext())
            self._apply(ps, key, st, dec, cid, now, out, reply_to=None)
            self.stats.ticks += 1
        if out.empty and not consumed:
            return None, consumed
        return out, consumed

    async def _commit_partition(
        self, ps: PartitionState, batch: list[Record], out: "_Output",
        consumed: dict[tuple[str, int], int],
    ) -> None:
        """One transaction: the partition's output plus its consumed command offsets.

        The live state was evolved while deciding; if the transaction does not commit, that
        state is ahead of the log, so the partition is dropped — and, unless we were fenced,
        taken over again at once from the log (restore + seek to the committed offset).
        """
        try:
            await ps.owner.commit(out.records, consumed, self.group, then=out.then)
        except Fenced as exc:
            self.stats.fenced += 1
            log.warning("partition_fenced", partition=ps.partition, error=str(exc))
            await self._drop(ps.partition, "fenced")
            return
        except Exception as exc:  # noqa: BLE001 - unknown outcome: rebuild from the log
            log.warning("partition_commit_failed", partition=ps.partition, error=repr(exc))
            await self._drop(ps.partition, "commit failed")
            if (self.topics.commands, ps.partition) in self._consumer.assignment():
                await self._on_assigned({(self.topics.commands, ps.partition)})
            return
        self.stats.transactions += 1
        self.stats.commands += len(batch)
        self.stats.events += len(out.events)
        wall = time.time()
        for reply in out.final_replies:
            ps.replies[reply.command_id] = (wall, reply)
        while len(ps.replies) > self.config.reply_cache_size:
            ps.replies.popitem(last=False)
        for hook in self.on_commit:
            hook(ps.partition, out.events)

    def _handle(self, ps: PartitionState, rec: Record, now: datetime, out: "_Output") -> None:
        try:
            env = codec.decode_command(rec.value)
        except codec.DecodeError as exc:
            self._dead_letter(ps, rec, str(exc), out)
            return
        key = partition_key(env.tenant, env.schedule_id)
        if isinstance(env.payload, m.Tick):
            self._dead_letter(ps, rec, "type: Tick is internal to the processor", out, env)
            return
        cached = ps.replies.get(env.command_id)
        if cached is not None and time.time() - cached[0] <= self.config.reply_retention_s:
            self.stats.duplicates += 1
            out.reply(cached[1])  # the original reply, again
            return
        if env.command_id in out.seen:
            self.stats.duplicates += 1
            out.reply(*out.seen[env.command_id])
            return
        st = ps.states.get(key)
        if st is None:
            st = initial_state(env.tenant, env.schedule_id)
        allowed, max_schedules = self.tenants.policy(env.tenant)
        tenant = TenantContext(allowed, max_schedules, ps.active_by_tenant.get(env.tenant, 0))
        dec = decide(st, env, now, tenant)
        if dec.events and key not in ps.states:
            ps.states[key] = st
        self._apply(ps, key, st, dec, env.command_id, now, out, reply_to=env.reply_to)

    def _apply(
        self,
        ps: PartitionState,
        key: str,
        st: ScheduleState,
        dec: Decision,
        command_id: str,
        now: datetime,
        out: "_Output",
        reply_to: str | None,
    ) -> None:
        existed = st.exists
        first_index = len(out.events)
        for i, ev in enumerate(dec.events):
            env = m.EventEnvelope.model_construct(  # every field is already valid
                event_id=event_id_for(command_id, i), type=ev.type, version=m.CURRENT_VERSION,
                key=key, tenant=st.tenant, schedule_id=st.schedule_id, at=now,
                causation_id=command_id, payload=ev,
            )
            evolve(st, ev)
            out.event(env)
            if ev.type in READY_EVENT_TYPES:
                self._hint(st, ev, out)
        if st.exists != existed:
            delta = 1 if st.exists else -1
            ps.active_by_tenant[st.tenant] = ps.active_by_tenant.get(st.tenant, 0) + delta
        ps.arm(key, st)
        if not command_id.startswith("tick:"):
            body = _jsonable(dec.body)
            if dec.field:
                body["field"] = dec.field
            reply = m.Reply(command_id=command_id, status=dec.status, reason=dec.reason,
                            body=body, tenant=st.tenant, schedule_id=st.schedule_id)
            out.reply(reply, first_index, len(out.events))
            out.seen[command_id] = (reply, first_index, len(out.events))

    def _hint(self, st: ScheduleState, ev: Any, out: "_Output") -> None:
        if isinstance(ev, m.OccurrenceMaterialized) and ev.state != "READY":
            return
        run = st.run(ev.run_id)
        if run is None or run.state != "READY":
            return
        hint = {
            "run_id": run.run_id, "tenant": st.tenant, "schedule_id": st.schedule_id,
            "attempt": run.attempt, "job_type": run.job.type, "scheduled_at": run.scheduled_at,
            "due_at": run.due_at, "priority": run.priority, "resource_class": run.resource_class,
        }
        self._ready_classes.add(run.resource_class)
        out.records.append(OutRecord(
            topic=self.topics.ready(run.resource_class), key=run.run_id.encode(),
            value=orjson.dumps(hint, option=orjson.OPT_UTC_Z),
        ))

    def _dead_letter(
        self, ps: PartitionState, rec: Record, reason: str, out: "_Output",
        env: m.CommandEnvelope | None = None,
    ) -> None:
        self.stats.dead_letters += 1
        command_id = env.command_id if env else _sniff_command_id(rec.value)
        dl = m.DeadLetter(reason=reason, original=base64.b64encode(rec.value).decode(),
                          source_partition=rec.partition, source_offset=rec.offset,
                          command_id=command_id)
        out.records.append(OutRecord(topic=self.topics.dlq, key=rec.key,
                                     value=codec.encode_dead_letter(dl), partition=None))
        log.warning("command_dead_lettered", partition=rec.partition, offset=rec.offset,
                    reason=reason)
        if command_id:
            out.reply(m.Reply(command_id=command_id, status="invalid", reason=reason))


class _Output:
    """The records of one partition's transaction, in order; replies are built last.

    A reply carries the exact log positions of the events its command caused. Those are
    only known once the events are appended, so replies are produced by ``then(positions)``
    inside the same transaction (the port's two-phase commit).
    """

    def __init__(self, topics: Any, partition: int, writer: tuple[tuple[str, bytes], ...] = ()) -> None:
        self.topics = topics
        self.partition = partition
        self.writer = writer  # headers naming the processor and its epoch (audit trail)
        self.records: list[OutRecord] = []
        self.events: list[m.EventEnvelope] = []
        self.event_index: list[int] = []  # index in records of each event
        self.replies: list[tuple[m.Reply, int, int]] = []  # reply, first event, end event
        self.final_replies: list[m.Reply] = []
        self.seen: dict[str, tuple[m.Reply, int, int]] = {}

    @property
    def empty(self) -> bool:
        return not self.records and not self.replies

    def event(self, env: m.EventEnvelope) -> None:
        self.events.append(env)
        self.event_index.append(len(self.records))
        self.records.append(OutRecord(topic=self.topics.events, key=env.key.encode(),
                                      value=codec.encode_event(env), partition=self.partition,
                                      headers=self.writer))

    def reply(self, reply: m.Reply, first_event: int = 0, end_event: int = 0) -> None:
        self.replies.append((reply, first_event, end_event))

    def then(self, positions: list[Position]) -> list[OutRecord]:
        """Replies with the positions of their events (called inside the transaction)."""
        out = []
        self.final_replies = []
        for reply, a, b in self.replies:
            if b > a:
                pos = tuple(
                    m.LogPosition(topic=positions[i].topic, partition=positions[i].partition,
                                  offset=positions[i].offset)
                    for i in self.event_index[a:b]
                )
                reply = reply.model_copy(update={"positions": pos})
            self.final_replies.append(reply)
            out.append(OutRecord(topic=self.topics.replies, key=reply.command_id.encode(),
                                 value=codec.encode_reply(reply), partition=self.partition))
        return out


def _tick_envelope(st: ScheduleState, command_id: str, now: datetime) -> m.CommandEnvelope:
    return m.CommandEnvelope.model_construct(
        command_id=command_id, type="Tick", tenant=st.tenant, principal="processor",
        schedule_id=st.schedule_id, issued_at=now, reply_to=None, payload=m.Tick(),
    )


def _sniff_command_id(value: bytes) -> str | None:
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    cid = raw.get("command_id") if isinstance(raw, dict) else None
    return cid if isinstance(cid, str) and cid else None


def _jsonable(body: dict[str, Any]) -> dict[str, Any]:
    """Reply bodies travel as JSON: datetimes become ISO strings with Z."""
    return orjson.loads(orjson.dumps(body, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC))


def partitions_of(records: Iterable[Record]) -> set[int]:
    return {r.partition for r in records}


__all__ = ["Processor", "ProcessorConfig", "OpenTenants", "TenantPolicies", "utc_now",
           "PartitionState", "Position", "timedelta", "Sequence"]
