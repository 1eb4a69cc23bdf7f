"""The processor: the single writer of its partitions of ``events``.

A ``Processor`` joins the consumer group on ``commands``. For each assigned partition p it
acquires ownership (a Kafka transactional producer ``<prefix>processor-p<p>``, or a SQLite
epoch), which fences any previous owner; restores state from partition p's snapshot on
``state`` plus the tail of ``events`` after it — or, without a usable snapshot, by folding
partition p of ``events`` from offset 0 (``chronolog.processors.snapshots``, docs/design.md
§14); and rebuilds its reply cache from the tail of partition p of ``replies``. While it
owns p it writes p's snapshot: chunks of the states changed since the last round, in its
own transactions, while idle or when a round is overdue. Then it loops: take
a batch of commands, decide each against its schedule's state, give itself ``Tick`` commands
for schedules whose timers are due, and commit the events, ready hints, dead letters, replies
and the consumed command offsets in ONE transaction per partition per batch.

Timers are a heap of (wake instant, key) per partition, fed by ``next_wakeup(state)`` after
every decision — never a scan of all schedules; an idle partition costs nothing.

A ``Fenced`` commit means a newer owner exists: the partition's state and owner are dropped
at once and nothing more is written for it (its batch is invisible to read_committed readers).

Pipelining: while the transactions of batch N are in flight (I/O: fsync, broker round
trips), the processor already polls and decides batch N+1 against the state batch N left
behind (the state is always ahead of the log while a commit is open — as before). Batch N+1
is only *committed* after every transaction of batch N finished, so a partition's
transactions stay strictly ordered; if one of batch N failed, that partition is dropped and
its batch N+1 is discarded (never written), and it is rebuilt from the log. A duplicate of a
command whose reply is still in flight is answered once that reply's positions are known.

When the log offers ``commit_many`` (SQLite: one database transaction, one fsync, each
owner's epoch still checked), one writer loop commits: whatever was decided while its
commit was in flight (any number of polls, any partitions) is queued and committed right
after it, all in one ``commit_many`` — the loop keeps deciding instead of waiting for the
writer, and a busy log gets fewer, larger commits (measured on the mixed benchmark: the
event loop sat idle about 40% of the time when batch N+1 waited for batch N's commit).
A partition whose commit failed is dropped, so its queued work is discarded, never written.
Past ``max_held`` queued commands the loop waits for the writer (backpressure).

Otherwise (Kafka: one producer per partition) each partition has
its own commit chain, independent of the other partitions — a slow transaction on one
partition delays only that partition's commands (no barrier across the partitions of a
poll). A partition has at most one transaction in flight: records that arrive for it
meanwhile are held, and when the transaction finishes the chain itself decides everything
held (plus due timers) as the partition's next batch and commits it — so a busy partition
gets fewer, larger transactions instead of a queue of small ones (measured: queueing up to
8 small transactions per partition doubled the p99). Past ``max_held`` held records the
loop waits for that partition (backpressure).

GC: ``ProcessorConfig.gc_tuning`` (default on) raises the first-generation threshold while
the processor runs and freezes the restored state, so the collector does not rescan the
growing, long-lived schedule states on every few thousand allocations (about 30-40% of the
processor's CPU with Python's defaults).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import orjson
import structlog

from chronolog.backoff import Backoff
from chronolog.commands.decider import (
    PROCESSOR,
    Decision,
    TenantContext,
    decide,
    evolve,
    move_out,
    next_wakeup,
)
from chronolog.commands.quota import (
    QuotaState,
    decide_quota,
    evolve_quota,
    move_out_quota,
    quota_wakeup,
)
from chronolog.commands.routing import RoutingView, decide_routing, evolve_routing
from chronolog.commands.state import ScheduleState, initial_state
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import (
    QUOTA_ID,
    ROUTING_ID,
    ROUTING_TENANT,
    event_id_for,
    move_command_id,
    partition_key,
    routing_key,
)
from chronolog.domain.limits import (
    DEFAULT_EXECUTION_TIMEOUT_SECONDS,
    MAX_RETRY_ATTEMPTS,
    MIN_INTERVAL_SECONDS,
    MIN_RETRY_BACKOFF_SECONDS,
)
from chronolog.domain.offers import BadOffer, Offer, is_offer, verify_proof
from chronolog.domain.routing import Forward, RoutingTable, RoutingVersion
from chronolog.environment import gc_paused, gc_tuned, utc_now
from chronolog.environment import gc_tune as _gc_tune
from chronolog.environment import gc_untune as _gc_untune
from chronolog.lifecycle import unavailable
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.partitioner import key_hash, misplaced
from chronolog.log.port import (
    WAKE_HEADER,
    EventLog,
    Fenced,
    LogError,
    LogUnavailable,
    OutRecord,
    PartitionOwner,
    Position,
    Record,
)
from chronolog.log.reading import read_partition
from chronolog.log.routing_history import read_routing
from chronolog.logging import Throttle
from chronolog.processors.attempt_budget import AttemptBudget
from chronolog.processors.dispatch import Dispatcher, running_by_tenant
from chronolog.processors.snapshots import (
    Chunk,
    Folder,
    Loaded,
    SnapshotRejected,
    SnapshotWriter,
    decode_snapshot_async,
)
from chronolog.settings import RULES_HEADER, RulesVersion, installed_rules

log = structlog.get_logger("chronolog.processor")

PROCESSOR_GROUP_SUFFIX = "processors"
READY_EVENT_TYPES = ("OccurrenceMaterialized", "OccurrenceReady", "OccurrenceRedriven")
# command IDs of the processor's own commands, answered by no reply of their own
RESTORE_SWEEP_EVENTS = 50_000  # events folded between two young collections (``_fold``)
INTERNAL_COMMANDS = ("tick:", "assign:", "quota:", "move:", "routing:")
ROUTING_KEY = routing_key()
# between tries to take a partition over while the log does not answer (acquire, restore)
TAKEOVER_BACKOFF = Backoff(first=0.5, cap=5.0)
# How long a rebalance callback waits for its take-overs before it returns (the group's
# heartbeats wait for it: under half the session timeout); the rest go on in the background
TAKEOVER_INLINE_S = 4.0
RESTORE_SLOTS = 2  # partitions restored at the same time


class TenantPolicies(Protocol):
    """Where a processor learns a tenant's allowed job types, schedule quota, minimum
    interval and the effect destinations (name -> kind) the operator granted it."""

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]: ...

    def min_interval(self, tenant: str) -> float: ...

    def destinations(self, tenant: str) -> Mapping[str, str] | None: ...

    def weight(self, tenant: str) -> float: ...

    def seat_pools(self, tenant: str) -> frozenset[str | None]: ...

    def credentials(self, pool: str) -> tuple[str, ...]: ...

    def retry_bounds(self, tenant: str) -> tuple[int, float]: ...

    def max_running(self, tenant: str) -> int | None: ...

    def timeouts(self, tenant: str) -> tuple[float, dict[str, float]]: ...

    def attempts_per_minute(self, tenant: str) -> int | None: ...


class OpenTenants:
    """Every tenant may run every job, with no quota (embedded single-user default).

    Effect destinations are not checked here (None): the effect runner, which resolves each
    destination from the tenants file when it performs an effect, refuses any not granted.
    """

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]:
        return (None, None)

    def min_interval(self, tenant: str) -> float:
        return MIN_INTERVAL_SECONDS

    def destinations(self, tenant: str) -> Mapping[str, str] | None:
        return None

    def weight(self, tenant: str) -> float:
        return 1.0

    def seat_pools(self, tenant: str) -> frozenset[str | None]:
        return frozenset({None})  # no pools: pool-less workers only

    def credentials(self, pool: str) -> tuple[str, ...]:
        return ()  # no pool is known: every pool offer is refused

    def retry_bounds(self, tenant: str) -> tuple[int, float]:
        return (MAX_RETRY_ATTEMPTS, MIN_RETRY_BACKOFF_SECONDS)

    def max_running(self, tenant: str) -> int | None:
        return None

    def timeouts(self, tenant: str) -> tuple[float, dict[str, float]]:
        return (DEFAULT_EXECUTION_TIMEOUT_SECONDS, {})

    def attempts_per_minute(self, tenant: str) -> int | None:
        return None


@dataclass
class ProcessorConfig:
    batch_max: int = 500
    poll_ms: int = 50
    # due timers decided per iteration, shared by the owned partitions: a burst of instants
    # goes out in several smaller transactions, so its first runs start a few ms after T
    ticks_per_step: int = 300
    reply_cache_size: int = 10_000
    reply_retention_s: float = 3600.0
    restore_chunk: int = 2000
    # pipelining: decide batch N+1 while batch N's transactions are in flight
    pipeline: bool = True
    # per-partition commit chains: None = when the log has no commit_many (Kafka); True /
    # False force them on / off (off: the one writer loop, as with commit_many)
    commit_chains: bool | None = None
    # with chains: records held for a partition whose transaction is in flight before the
    # loop waits for it; with commit_many: commands queued for the writer loop
    max_held: int = 5000
    # raise gen-0 GC threshold during run() and gc.freeze() the restored state
    gc_tuning: bool = True
    gc_gen0_threshold: int = 50_000
    # Kafka: return from a commit without waiting until committed readers see it (nothing
    # on the processor's path reads its own writes back; see chronolog.log.kafka)
    await_visible: bool = False
    # a partition this processor was fenced out of, yet its group still assigns to it after
    # this long (the fencer's view of the group changed meanwhile and it let the partition
    # go), is acquired again instead of staying without an owner
    fenced_retry_s: float = 5.0
    # snapshots of the owned partitions' states on the ``state`` topic (docs/design.md §14,
    # chronolog.processors.snapshots): a takeover reads them plus the tail of ``events``
    # instead of folding ``events`` from offset 0. Off: fold from 0 and write none.
    snapshots: bool = True
    # a round of the dirty states when the processor is idle, at most this often ...
    snapshot_interval_s: float = 5.0
    # ... and while it is busy, once the last round started this long ago, or after this
    # many events since (a burst of runs is not slowed by snapshots; the tail a takeover
    # folds stays bounded under sustained load)
    snapshot_busy_interval_s: float = 30.0
    snapshot_events: int = 100_000
    snapshot_chunk: int = 256  # states encoded per batch (one chunk per transaction)
    state_read_batch: int = 10_000  # records per read of the state topic at takeover
    # the recurrence engine and tz database named in the ``rules`` header of every event
    # this processor writes (None: the installed ones, ``installed_rules()``)
    rules: RulesVersion | None = None
    # the deployment's routing table for a partition with no routing event of its own yet
    # (docs/design.md §18; None: read at each takeover from the log's routing history,
    # ``chronolog.log.routing_history``); later versions come from the partition's own log
    routing: RoutingTable | None = None


@dataclass
class ProcessorStats:
    commands: int = 0
    events: int = 0
    ticks: int = 0
    transactions: int = 0
    dead_letters: int = 0
    offers_unverified: int = 0  # pool offers whose proof did not verify (nobody seated)
    decide_errors: int = 0  # commands whose decide raised (rejected as invalid)
    tick_errors: int = 0  # timers whose decide raised (the schedule is not re-armed)
    apply_errors: int = 0  # decisions that could not be applied (the partition was rebuilt)
    duplicates: int = 0
    fenced: int = 0
    restored_from_snapshot: int = 0  # takeovers that started from a snapshot
    restored_from_zero: int = 0  # takeovers that folded events from offset 0
    snapshots_rejected: int = 0  # snapshots ignored (damaged, another version, ...)
    forwarded: int = 0  # commands appended to the partition that may hold their key
    moved_out: int = 0  # keys handed over to another partition
    moved_in: int = 0  # keys adopted from another partition
    started_at: float = field(default_factory=time.monotonic)


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
    tail_events: int = 0  # events folded (the tail after the snapshot, or all of them)
    events_offset: int = 0


class PartitionState:
    """Everything a processor holds for one owned partition."""

    def __init__(self, partition: int, owner: PartitionOwner) -> None:
        self.partition = partition
        self.owner = owner
        self.states: dict[str, ScheduleState] = {}
        self.heap: list[tuple[datetime, str]] = []
        self.armed: dict[str, datetime] = {}
        # command_id -> (wall time, the reply's encoded bytes) of committed replies
        self.replies: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        # command_id -> the output of a transaction still in flight that replies to it
        self.pending: dict[str, _Output] = {}
        # the tenants' quota aggregates whose key falls on this partition (key -> state)
        self.quotas: dict[str, QuotaState] = {}
        self.events_offset = 0
        # the snapshot of this partition being written (None: snapshots are off)
        self.snap: SnapshotWriter | None = None
        # this partition's commit chain (a task while a transaction is in flight) and the
        # records that arrived meanwhile, decided by the chain when that transaction ends
        self.chain: asyncio.Task[None] | None = None
        self.held: list[Record] = []
        self.dispatch = Dispatcher()  # workers' seats and the READY runs waiting for one
        # the partition's routing view, folded from its log (docs/design.md §18)
        self.routing: RoutingView | None = None

    def running(self) -> asyncio.Task[None] | None:
        """This partition's commit chain while it runs (None when idle)."""
        return self.chain if self.chain is not None and not self.chain.done() else None

    def arm(self, key: str, state: ScheduleState) -> None:
        self.arm_at(key, next_wakeup(state))

    def arm_at(self, key: str, wake: datetime | None) -> None:
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

    def snapshot_due(self, idle: bool) -> bool:
        """Whether the next batch of this partition should carry a snapshot chunk (``idle``:
        the processor has nothing else to do; ``SnapshotWriter.due``)."""
        snap = self.snap
        return snap is not None and snap.due(time.monotonic(), idle)


class Processor:
    """Owns partitions of ``commands``/``events`` and decides their commands."""

    def __init__(
        self,
        log_: EventLog,
        member_id: str,
        tenants: TenantPolicies | None = None,
        config: ProcessorConfig | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.log = log_
        self.topics = log_.topics
        self.member_id = member_id
        self.tenants = tenants or OpenTenants()
        self.config = config or ProcessorConfig()
        self.clock = clock
        self.rules = self.config.rules or installed_rules()
        self._snapshots: bool | None = None  # the state topic is usable (checked once)
        self.takeovers: deque[Takeover] = deque(maxlen=256)  # the latest, newest last
        self.group = f"{self.topics.prefix}{PROCESSOR_GROUP_SUFFIX}"
        self.partitions: dict[int, PartitionState] = {}
        self.attempt_budget = AttemptBudget()  # tenants' retries per minute
        self.stats = ProcessorStats()
        self._unverified_logged: dict[str, float] = {}  # worker -> when last logged
        self._stopping = asyncio.Event()
        self._consumer: Any = None
        self._inflight: asyncio.Task[None] | None = None  # the writer loop (commit_many)
        self._queued: list[_Work] = []  # decided, waiting for the writer loop
        self._rebuild: list[int] = []  # partitions to take over again (commit failed)
        self._fenced_out: dict[int, float] = {}  # partition -> when to check it again
        # commit chains of dropped partitions that may still be running (waited at shutdown)
        self._orphans: list[asyncio.Task[None]] = []
        self.on_commit: list[Callable[[int, list[m.EventEnvelope]], None]] = []
        self.dead_letters = DeadLetters(log_, "processor")
        # commands (partition, offset) and timers (key) whose decision could not be applied
        self._unapplied: dict[tuple[int, int], Exception] = {}
        self._unapplied_keys: set[str] = set()
        # partition -> why its last commit or take-over failed (until one succeeds)
        self._failed: dict[int, str] = {}
        # partition -> (failed take-overs in a row, monotonic time of the next try)
        self._retake: dict[int, tuple[int, float]] = {}
        self._throttle = Throttle()
        # partitions being taken over in the background -> the task (``_on_assigned``), and
        # the outcomes it produced since: (partition, (state, take-over, committed offset) |
        # the exception | None when revoked before its turn)
        self._restoring: dict[int, asyncio.Task[None]] = {}
        self._restored: list[tuple[int, Any]] = []
        self._closing: set[asyncio.Task[None]] = set()  # owners of discarded take-overs
        self._abandoned: set[int] = set()  # revoked while being restored: not installed
        self._restore_slots = asyncio.Semaphore(RESTORE_SLOTS)
        # partitions installed since this step's poll began -> the offset they were sought to
        self._installed: dict[int, int] = {}

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the loop to finish its open batch and leave the group."""
        self._stopping.set()

    def readiness(self) -> tuple[bool, str]:
        """Ready: in the group, every partition assigned to it restored, and the last commit
        attempt of each succeeded (``chronolog.readiness``); else what it waits for."""
        consumer = self._consumer
        if consumer is None or self._stopping.is_set():
            return False, "stopping" if self._stopping.is_set() else "starting"
        if not consumer.joined():
            return False, "not in the processors group (joining, or the log is away)"
        assigned = sorted(p for t, p in consumer.assignment() if t == self.topics.commands)
        failed = [p for p in assigned if p in self._failed]
        if failed:
            return False, f"partition {failed[0]}: {self._failed[failed[0]]}"
        waiting = [p for p in assigned if p not in self.partitions]
        if waiting:
            return False, f"restoring partitions {waiting}"
        return True, (f"owns partitions {assigned}" if assigned
                      else "in the processors group, owns no partition")

    async def run(self) -> None:
        """Run until ``stop()``; then finish the open transactions and leave the group."""
        self._consumer = self.log.group_consumer(
            self.group,
            [self.topics.commands],
            self.member_id,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
        )
        tuned = False
        try:
            if self.config.gc_tuning:
                _gc_tune(self.config.gc_gen0_threshold)
                tuned = True
            await self._consumer.start()
            while not self._stopping.is_set():
                await self.step()
        finally:
            try:
                await self._settle(rebuild=False)  # the open transactions finish first
            finally:
                for task in set(self._restoring.values()):
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                for _, outcome in self._restored:
                    if isinstance(outcome, tuple):
                        self._discard_owner(outcome[0])
                self._restoring, self._restored = {}, []
                await self._consumer.close()
                for ps in list(self.partitions.values()):
                    await self._drop(ps.partition, "shutdown")
                if self._closing:
                    await asyncio.gather(*self._closing, return_exceptions=True)
                if tuned:
                    _gc_untune()

    async def step(self) -> None:
        """One iteration: a batch of commands plus due timers, one transaction per partition.

        Decides while the previous iteration's transactions are still in flight (see the
        module docstring), then waits for those before launching its own.
        """
        if self._restored:
            self._install_restored()  # before the poll: their records flow from the seek
        self._installed.clear()
        timeout = self._poll_timeout()
        records = await self._consumer.getmany(timeout_ms=timeout,
                                               max_records=self.config.batch_max)
        now = self.clock()
        by_partition: dict[int, list[Record]] = {}
        for rec in records:
            by_partition.setdefault(rec.partition, []).append(rec)
        # nothing to decide anywhere: the moment for snapshot chunks (otherwise only an
        # overdue snapshot round gets one: a burst of runs is not slowed by snapshots)
        idle = not records and not any(
            ps.held or ps.running() or ((nw := ps.next_wake()) is not None and nw <= now)
            for ps in self.partitions.values())
        chains = self._chains()
        if chains:
            await self._take_over_again()
        self._reread_installed(by_partition)
        work: list[_Work] = []
        for p, ps in list(self.partitions.items()):
            batch = by_partition.get(p, [])
            chain = ps.running() if chains else None
            if chain is not None:
                ps.held.extend(batch)  # its chain decides them when its transaction ends
                if len(ps.held) > self.config.max_held:
                    await asyncio.wait([chain])  # backpressure
                continue
            if ps.held:
                batch, ps.held = ps.held + batch, []
            nw = ps.next_wake()
            if not batch and (nw is None or nw > now) and not ps.snapshot_due(idle):
                continue
            out, consumed = await self._decide(ps, batch, now, idle)
            if out is not None:
                work.append(_Work(ps, batch, out, consumed))
        if chains:
            for w in work:
                w.ps.chain = asyncio.create_task(self._chain(w))
            return
        # One writer loop: work decided while a commit is in flight is queued and committed
        # by the loop right after it, all of it in one commit (see the module docstring).
        self._queued.extend(work)
        task = self._inflight
        if task is None or task.done():
            await self._settle()  # the finished loop's failed partitions are taken over again
            if self._queued:
                self._inflight = asyncio.create_task(self._commit_queued())
        elif sum(len(w.batch) for w in self._queued) > self.config.max_held:
            await asyncio.shield(asyncio.wait([task]))  # backpressure
        if not self.config.pipeline:
            await self._settle()

    def _chains(self) -> bool:
        """Whether partitions commit through their own chains (module docstring)."""
        if not self.config.pipeline:
            return False
        if self.config.commit_chains is not None:
            return self.config.commit_chains
        return getattr(self.log, "commit_many", None) is None

    async def _chain(self, w: _Work) -> None:
        """A partition's commit chain: commit ``w``, then decide and commit what arrived
        meanwhile (held records, due timers), until nothing is left; never raises.

        If a transaction fails the partition is dropped (``_committed``) and the chain ends;
        its held records were never decided into a commit, so the next owner reads them again
        from the committed offset.
        """
        ps = w.ps
        while self.partitions.get(ps.partition) is ps:
            try:
                result: Any = await ps.owner.commit(w.out.records, w.consumed, self.group,
                                                    then=w.out.then)
            except Exception as exc:  # noqa: BLE001 - the outcome is handled as data
                result = exc
            try:
                await self._committed(w, result)
            except Exception:  # a chain task must not die with an unread error
                log.exception("commit_accounting_failed", partition=ps.partition)
            if self.partitions.get(ps.partition) is not ps:
                return
            batch, ps.held = ps.held, []
            now = self.clock()
            nw = ps.next_wake()
            if not batch and (nw is None or nw > now) and not ps.snapshot_due(False):
                return
            out, consumed = await self._decide(ps, batch, now, False)
            if out is None:
                return
            w = _Work(ps, batch, out, consumed)

    async def _settle(self, rebuild: bool = True) -> None:
        """Wait for the transactions in flight; take over again partitions whose commit failed."""
        task = self._inflight
        if task is not None:
            await asyncio.shield(task)  # cancelled while waiting: run()'s finally waits again
            if self._inflight is task:
                self._inflight = None
        chains = [t for t in (ps.running() for ps in list(self.partitions.values()))
                  if t is not None] + self._orphans
        if chains:
            await asyncio.shield(asyncio.wait(chains))
        self._orphans = [t for t in self._orphans if not t.done()]
        if not rebuild:
            return
        await self._take_over_again()

    async def _take_over_again(self) -> None:
        """Acquire again (restore + seek) the partitions whose commit failed, not fenced;
        those fenced that the group still assigns to us ``fenced_retry_s`` later; and those
        whose take-over failed (the log did not answer), after ``TAKEOVER_BACKOFF``."""
        again, self._rebuild = self._rebuild, []
        mono = time.monotonic()
        for p, when in list(self._fenced_out.items()):
            if when <= mono:
                del self._fenced_out[p]
                again.append(p)
        again.extend(p for p, (_, when) in self._retake.items() if when <= mono)
        for p in again:
            if (p not in self.partitions
                    and (self.topics.commands, p) in self._consumer.assignment()):
                await self._on_assigned({(self.topics.commands, p)})

    def _poll_timeout(self) -> int:
        # a busy partition's timers are its chain's business (no busy polling meanwhile)
        idle = [ps for ps in self.partitions.values() if ps.running() is None]
        poll_ms = self.config.poll_ms
        if len(idle) == len(self.partitions):
            if any(ps.snapshot_due(True) for ps in idle):
                return 0  # nothing in flight: a snapshot chunk goes out unless commands came
            if any(ps.snap is not None and ps.snap.round is not None for ps in idle):
                poll_ms = min(poll_ms, 5)  # a round's next chunk, once its writer is done
        if self._restoring:
            poll_ms = min(poll_ms, 20)  # a partition restored in the background: installed soon
        wakes = [w for w in (ps.next_wake() for ps in idle) if w is not None]
        if not wakes:
            return poll_ms
        delta = (min(wakes) - self.clock()).total_seconds() * 1000
        return int(max(0, min(poll_ms, delta)))

    # ------------------------------------------------------------------ ownership

    async def _on_assigned(self, tps: set[tuple[str, int]]) -> None:
        """Take over each assigned partition: acquire (fencing the previous owner), restore,
        seek. One the log does not let us take over now (it does not answer) stays without
        state and is tried again after ``TAKEOVER_BACKOFF`` (``_take_over_again``): a broker
        outage under load must not end the process, nor leave the partition unowned.

        The take-overs run in tasks of their own, awaited here for at most
        ``TAKEOVER_INLINE_S``: no heartbeat of the group goes out while a rebalance callback
        runs (aiokafka starts them once it returns), so a restore longer than the session
        timeout done here would get the member dropped from the group — and, taken over
        again from the start after rejoining, dropped again, for ever (a first fold of a
        long history). A partition still restoring then is installed by ``step`` once
        restored; its records are not decided before that (the seek at the install reads
        them again from the committed offset)."""
        assigned_at = time.monotonic()
        ours = {p for topic, p in tps if topic == self.topics.commands}
        self._abandoned -= ours  # revoked while restoring, and given back: installed after all
        todo = sorted(p for p in ours if p not in self.partitions and p not in self._restoring)
        if todo:
            tasks = []
            for p in todo:
                task = asyncio.create_task(self._take_over_in_turn(p, assigned_at),
                                           name=f"take-over-{p}")
                self._restoring[p] = task
                tasks.append(task)
            await asyncio.wait(tasks, timeout=TAKEOVER_INLINE_S)
        self._install_restored()

    async def _take_over_in_turn(self, p: int, assigned_at: float) -> None:
        """Acquire and restore partition p once one of ``RESTORE_SLOTS`` is free (in the
        order of assignment: one long restore does not hold the others up, and a few at a
        time serve the first ones sooner than all at once); its outcome goes to
        ``_restored`` for ``_install_restored``."""
        async with self._restore_slots:
            if p in self._abandoned:
                self._restored.append((p, None))  # revoked before its turn: nothing to do
                return
            # the outcome first, then the append: ``self._restored`` is replaced by each
            # install, so the list must be looked up after the await, not before it
            outcome: Any
            try:
                outcome = await self._take_over(p, assigned_at)
            except Exception as exc:  # noqa: BLE001 - handled at the install
                outcome = exc
            self._restored.append((p, outcome))

    def _install_restored(self) -> None:
        """Install the partitions restored since the last call (seek to the committed
        offset: their records flow from there), note the take-overs that failed."""
        restored, self._restored = self._restored, []
        fatal: BaseException | None = None  # raised once the others are installed
        for p, outcome in restored:
            self._restoring.pop(p, None)
            abandoned = p in self._abandoned
            self._abandoned.discard(p)
            if outcome is None:
                continue
            if isinstance(outcome, BaseException):
                try:
                    self._take_over_failed(p, outcome)
                except BaseException as exc:  # noqa: BLE001 - not the log's: ends the run
                    fatal = fatal or exc
                continue
            ps, takeover, committed = outcome
            if abandoned:
                self._discard_owner(ps)  # revoked while it was restored
                continue
            self._consumer.seek(self.topics.commands, p, committed or 0)
            self._installed[p] = committed or 0
            self.partitions[p] = ps
            self._failed.pop(p, None)  # taken over: its next commit tells
            self._retake.pop(p, None)
            takeover.restored_at = time.monotonic()
            self.takeovers.append(takeover)
            log.info("partition_assigned", partition=p, schedules=len(ps.states),
                     events_offset=ps.events_offset, commands_offset=committed or 0,
                     from_snapshot=takeover.from_snapshot, tail_events=takeover.tail_events,
                     restore_s=round(takeover.restored_at - takeover.assigned_at, 3))
        if restored and self.config.gc_tuning and gc_tuned():
            gc.freeze()  # the restored states are long-lived: keep them out of collections
        if fatal is not None:
            raise fatal

    def _reread_installed(self, by_partition: dict[int, list[Record]]) -> None:
        """A partition installed while this step polled, or after (a rebalance callback, a
        take-over again): the records polled for it may predate its seek — they are left
        undecided and the partition is sought to its committed offset again (nothing was
        decided for it since the install), so they are read again in order."""
        for p, committed in self._installed.items():
            if by_partition.pop(p, None) is not None:
                self._consumer.seek(self.topics.commands, p, committed)

    def _take_over_failed(self, p: int, exc: BaseException) -> None:
        if not (unavailable(exc) or isinstance(exc, LogError)):
            raise exc
        tries = self._retake.get(p, (0, 0.0))[0] + 1
        wait = TAKEOVER_BACKOFF.delay(tries)
        self._retake[p] = (tries, time.monotonic() + wait)
        self._failed[p] = f"take-over failed: {type(exc).__name__}: {exc}"[:300]
        held = self._throttle.take(f"takeover-{p}")  # a few lines per outage
        if held is not None:
            log.warning("partition_takeover_failed", partition=p, tries=tries,
                        retry_in_s=wait, error=f"{type(exc).__name__}: {exc}"[:300],
                        **({"held_back": held} if held else {}))

    def _discard_owner(self, ps: PartitionState) -> None:
        task = asyncio.create_task(ps.owner.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _take_over(self, p: int, assigned_at: float | None = None
                         ) -> tuple[PartitionState, Takeover, int | None]:
        """Acquire partition p (fencing its previous owner) and restore its state: the
        partition, its take-over record and the group's committed offset of p."""
        if assigned_at is None:
            assigned_at = time.monotonic()
        table = self.config.routing or await read_routing(self.log)
        takeover = Takeover(p, assigned_at)
        owner = await self.log.acquire(p, self.member_id)  # fences the previous owner
        if hasattr(owner, "await_visible"):  # a log adapter that can skip that wait
            owner.await_visible = self.config.await_visible
        ps = PartitionState(p, owner)
        ps.routing = RoutingView.initial(p, table)
        try:
            await self._restore(ps, takeover)
            committed = await self.log.committed(self.group, self.topics.commands, p)
        except BaseException:
            with contextlib.suppress(Exception):
                await owner.close()
            raise
        return ps, takeover, committed

    async def _on_revoked(self, tps: set[tuple[str, int]]) -> None:
        for topic, p in sorted(tps):
            if topic == self.topics.commands:
                self._retake.pop(p, None)  # its next owner takes it over
                self._failed.pop(p, None)
                if p in self._restoring:
                    self._abandoned.add(p)
            ps = self.partitions.get(p)
            if topic == self.topics.commands and ps is not None:
                chain = ps.running()
                if chain is not None:  # what it decided commits first
                    await asyncio.shield(asyncio.wait([chain]))
                await self._drop(p, "revoked")

    async def _drop(self, p: int, why: str) -> None:
        ps = self.partitions.pop(p, None)
        if ps is None:
            return
        chain = ps.running()
        if chain is not None:
            self._orphans.append(chain)  # it sees the drop and writes nothing more
        try:
            await ps.owner.close()
        except Exception:  # noqa: BLE001 - the owner is being discarded either way
            pass
        if self.config.gc_tuning and gc.get_freeze_count():
            gc.unfreeze()  # let the collector reclaim the dropped state (frozen again later)
        log.info("partition_dropped", partition=p, reason=why)

    async def _restore(self, ps: PartitionState, takeover: Takeover | None = None) -> None:
        """Rebuild partition p's states: from its snapshot on ``state`` plus the tail of
        ``events`` after it, or — no usable snapshot, or snapshots off — by folding ``events``
        from offset 0 (docs/design.md §14); then its timers, dispatch queue and replies."""
        if not self.config.gc_tuning:
            await self._rebuild_partition(ps, takeover or Takeover(ps.partition,
                                                                   time.monotonic()))
            return
        with gc_paused():
            await self._rebuild_partition(ps, takeover or Takeover(ps.partition,
                                                                   time.monotonic()))
            # the restored states are long-lived: out of every collection from now on (the
            # first one after the pause would traverse them all: 5 us a state)
            gc.freeze()

    async def _rebuild_partition(self, ps: PartitionState, takeover: Takeover) -> None:
        p = ps.partition
        snapshots = await self._snapshots_usable()
        loaded: Loaded | None = None
        if snapshots:
            events_end = await self.log.end_offset(self.topics.events, p)
            try:
                loaded = await self._load_snapshot(p, events_end, takeover)
                if loaded is not None:
                    folded = await self._fold(ps, loaded, takeover)
            except SnapshotRejected as exc:
                self._rejected(p, str(exc), takeover)
                ps.states, ps.quotas = {}, {}
                loaded = None
        if loaded is None:
            folded = await self._fold(ps, None, takeover)
            self.stats.restored_from_zero += 1
        else:
            takeover.from_snapshot = True
            self.stats.restored_from_snapshot += 1
        dirty, log_end, last_event = folded
        ps.events_offset = log_end
        takeover.states = len(ps.states)
        takeover.events_offset = log_end
        for i, (key, st) in enumerate(list(ps.states.items())):
            if i % 5000 == 4999:
                await asyncio.sleep(0)  # the group's heartbeats go on (100k states: ~1 s)
            ps.arm(key, st)
            self._seat_runs(ps, key, st)
        for key, qs in ps.quotas.items():
            ps.arm_at(key, quota_wakeup(qs))
        await self._restore_replies(ps)
        if snapshots:
            cfg = self.config
            ps.snap = SnapshotWriter(
                p, self.topics.state, self.member_id, ps.owner.epoch,
                interval_s=cfg.snapshot_interval_s,
                busy_interval_s=cfg.snapshot_busy_interval_s, events=cfg.snapshot_events,
                chunk=max(1, cfg.snapshot_chunk), dirty=dirty,
                specs=set() if loaded is None else loaded.specs, log_end=log_end,
                last_event=last_event, fold_from=0 if loaded is None else loaded.fold_from)
            if loaded is None and dirty:
                # folded from 0: no snapshot of these states yet — the first round goes
                # now (after a snapshot, the tail's states wait for the usual interval)
                ps.snap.start_now()

    async def _snapshots_usable(self) -> bool:
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

    async def _load_snapshot(self, p: int, events_end: int,
                             takeover: Takeover) -> Loaded | None:
        """Partition p of ``state``, read whole and decoded (None: no snapshot there)."""
        records: list[Record] = []
        async for recs in read_partition(self.log, self.topics.state, p, 0,
                                         batch=self.config.state_read_batch):
            records.extend(recs)
        takeover.snapshot_records = len(records)
        return await decode_snapshot_async(records, events_end)

    def _rejected(self, p: int, reason: str, takeover: Takeover) -> None:
        self.stats.snapshots_rejected += 1
        takeover.rejected = reason
        log.warning("snapshot_rejected", partition=p, reason=reason,
                    detail="folding events from offset 0")

    async def _fold(
        self, ps: PartitionState, loaded: Loaded | None, takeover: Takeover,
    ) -> tuple[set[str], int, tuple[int, str] | None]:
        """Fold partition p of ``events`` into ``ps`` (``Folder``): onto ``loaded`` (a
        snapshot), or from offset 0. Returns the keys whose states are not on ``state`` as
        they are, the offset after the last event, and that event's (offset, ID). Raises
        ``SnapshotRejected`` when the snapshot does not fit the log (before folding any)."""
        folder = Folder(loaded, ps.routing)
        ps.states, ps.quotas = folder.states, folder.quotas
        offset = folder.start
        unswept = 0
        async for recs in read_partition(self.log, self.topics.events, ps.partition, offset,
                                         batch=self.config.restore_chunk):
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
        ps.routing = folder.routing
        takeover.tail_events = folder.folded
        return dirty, max(offset, folder.fold_from), last_event

    async def _restore_replies(self, ps: PartitionState) -> None:
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

    # ------------------------------------------------------------------ the batch

    async def _decide(
        self, ps: PartitionState, batch: list[Record], now: datetime, idle: bool = False,
    ) -> tuple[_Output | None, dict[tuple[str, int], int]]:
        """``_decide_partition``; when a decision could not be applied to the state (a bug in
        ``evolve``), the state is no longer the log's: the partition is dropped and taken
        over again from the log, and the command at fault is dead-lettered when it is read
        again (the timer at fault is not armed again), so it cannot stop the partition twice.
        """
        try:
            return self._decide_partition(ps, batch, now, idle)
        except _Unapplied as exc:
            self.stats.apply_errors += 1
            log.error("decision_not_applied", partition=ps.partition, error=str(exc))
            if await self._discard(ps, "a decision could not be applied"):
                self._rebuild.append(ps.partition)
            return None, {}

    def _decide_partition(
        self, ps: PartitionState, batch: list[Record], now: datetime, idle: bool = False,
    ) -> tuple[_Output | None, dict[tuple[str, int], int]]:
        """Decide a partition's commands and due timers (state is evolved as we go).

        A snapshot chunk that is due is encoded first: it holds the states after every
        earlier transaction of the partition, and goes in this one (docs/design.md §14)."""
        chunk: Chunk | None = None
        snap = ps.snap
        if snap is not None and snap.due(time.monotonic(), idle):
            try:
                chunk = snap.take(ps.states, ps.quotas, time.monotonic(), idle, ps.routing)
            except Exception:
                log.exception("snapshot_encode_failed", partition=ps.partition)
        out = _Output(self.topics, ps.partition, (
            ("processor", self.member_id.encode()), ("epoch", str(ps.owner.epoch).encode()),
            (RULES_HEADER, self.rules.label.encode())), snap, chunk)
        consumed: dict[tuple[str, int], int] = {}
        for rec in batch:
            self._handle(ps, rec, now, out)
        if batch:
            consumed[(self.topics.commands, ps.partition)] = batch[-1].offset + 1
        budget = max(16, self.config.ticks_per_step // max(1, len(self.partitions)))
        for key in ps.due_keys(now, budget):
            qs = ps.quotas.get(key)
            if qs is not None:
                self._decide_quota(ps, key, qs, _tick_envelope(qs, f"tick:{ps.partition}:"
                                   f"{int(now.timestamp() * 1e6)}:{key}", now), now, out)
                continue
            st = ps.states.get(key)
            if st is None or key in self._unapplied_keys:
                continue  # a timer whose decision could not be applied waits for a command
            cid = f"tick:{ps.partition}:{int(now.timestamp() * 1e6)}:{key}"
            try:
                dec = decide(st, _tick_envelope(st, cid, now), now, TenantContext())
                encoded = self._encode(key, st, dec, cid, now)
            except Exception:  # a decider bug must not stop the partition
                self.stats.tick_errors += 1
                log.exception("tick_decide_failed", partition=ps.partition, key=key)
                continue  # not re-armed: the schedule's next command decides again
            try:
                self._apply(ps, key, st, dec, encoded, cid, now, out)
            except Exception as exc:  # the state is suspect: rebuilt (_decide)
                self._unapplied_keys.add(key)
                raise _Unapplied(f"timer of {key}: {type(exc).__name__}: {exc}") from exc
            self.stats.ticks += 1
        self._dispatch(ps, now, out)
        if out.empty and not consumed:
            return None, consumed
        return out, consumed

    async def _commit_queued(self) -> None:
        """The writer loop (logs with ``commit_many``): commit everything queued, in order,
        until the queue is empty; never raises.

        A partition dropped meanwhile (its commit failed, fenced, revoked) has its queued
        work discarded: it was decided on a state that is gone, and its commands were not
        consumed, so whoever owns the partition next reads them again.
        """
        while self._queued:
            work, self._queued = self._queued, []
            work = [w for w in work if self.partitions.get(w.ps.partition) is w.ps]
            if work:
                await self._commit_all(work)

    async def _commit_all(self, work: list[_Work]) -> None:
        """Commit every partition's transaction of one batch; never raises.

        With a log that has ``commit_many`` (SQLite) the partitions commit in ONE database
        transaction (one fsync; each owner's epoch is still checked, a fenced owner's part is
        left out); otherwise each partition's transaction runs concurrently.
        """
        results: list[Any]
        many = getattr(self.log, "commit_many", None)
        if many is not None and len(work) > 1:
            try:
                results = list(await many([
                    (w.ps.owner, w.out.records, w.consumed, self.group, w.out.then) for w in work
                ]))
            except Exception as exc:  # noqa: BLE001 - every partition's outcome is unknown
                results = [exc] * len(work)
        else:
            results = await asyncio.gather(*(
                w.ps.owner.commit(w.out.records, w.consumed, self.group, then=w.out.then)
                for w in work
            ), return_exceptions=True)
        for w, res in zip(work, results, strict=True):
            await self._committed(w, res)

    async def _committed(self, w: _Work, result: Any) -> None:
        """Account for one partition's transaction (``result``: positions or the exception).

        The live state was evolved while deciding; if the transaction did not commit, that
        state is ahead of the log, so the partition is dropped — and, unless we were fenced,
        taken over again from the log (restore + seek to the committed offset) by ``_settle``.
        """
        ps, out = w.ps, w.out
        if isinstance(result, BaseException):
            self._failed[ps.partition] = (f"last commit failed: {type(result).__name__}: "
                                          f"{result}")[:300]
        else:
            self._failed.pop(ps.partition, None)
        if isinstance(result, Fenced):
            self.stats.fenced += 1
            log.warning("partition_fenced", partition=ps.partition, error=str(result))
            if await self._discard(ps, "fenced"):
                self._fenced_out[ps.partition] = time.monotonic() + self.config.fenced_retry_s
            return
        if isinstance(result, BaseException):  # unknown outcome: rebuild from the log
            log.warning("partition_commit_failed", partition=ps.partition, error=repr(result))
            if await self._discard(ps, "commit failed"):
                self._rebuild.append(ps.partition)
            return
        self.stats.transactions += 1
        self.stats.commands += len(w.batch)
        self.stats.events += len(out.events)
        if out.chunk is not None and ps.snap is not None:
            ps.snap.committed(out.chunk)
        wall = time.time()
        for cid, data in out.final.items():
            ps.replies[cid] = (wall, data)
            ps.replies.move_to_end(cid)
            if ps.pending.get(cid) is out:
                del ps.pending[cid]
        while len(ps.replies) > self.config.reply_cache_size:
            ps.replies.popitem(last=False)
        if self.on_commit:
            envelopes = out.envelopes()
            for hook in self.on_commit:
                hook(ps.partition, envelopes)

    async def _discard(self, ps: PartitionState, why: str) -> bool:
        """Drop ``ps`` if it is still the live state of its partition (True when dropped)."""
        if self.partitions.get(ps.partition) is not ps:
            return False
        await self._drop(ps.partition, why)
        return True

    def _handle(self, ps: PartitionState, rec: Record, now: datetime, out: _Output) -> None:
        if rec.headers and is_offer(rec.headers):
            try:
                offer = Offer.decode(rec.value)
            except BadOffer as exc:
                self._dead_letter(ps, rec, str(exc), out)
                return
            if offer.pool is not None:
                why = verify_proof(offer, rec.partition, self.tenants.credentials(offer.pool),
                                   now.timestamp())
                if why is not None:
                    self._unverified_offer(offer, rec.partition, why)
                    return
            ps.dispatch.offer(offer, time.monotonic())
            return
        unapplied = self._unapplied.get((ps.partition, rec.offset))
        if unapplied is not None:  # it stopped this partition once: not decided again
            self._dead_letter(ps, rec, f"the command's events could not be applied: "
                              f"{type(unapplied).__name__}: {unapplied}", out, error=unapplied)
            return
        try:
            env = codec.decode_command(rec.value)
        except codec.DecodeError as exc:
            self._dead_letter(ps, rec, str(exc), out, error=exc)
            return
        key = partition_key(env.tenant, env.schedule_id)
        if env.schedule_id == ROUTING_ID:  # addressed to this partition, not placed by key
            self._decide_routing(ps, rec, env, now, out)
            return
        h = key_hash(key.encode())
        wrong_place = misplaced(rec.key, key, ps.partition, self._placed_by(ps, h))
        if wrong_place is not None:
            self._dead_letter(ps, rec, wrong_place, out, env)
            return
        if isinstance(env.payload, m.Tick):
            self._dead_letter(ps, rec, "type: Tick is internal to the processor", out, env)
            return
        cid = env.command_id
        if env.reply_to:
            out.reply_to[cid] = env.reply_to
        cached = ps.replies.get(cid)
        if cached is not None and time.time() - cached[0] <= self.config.reply_retention_s:
            self.stats.duplicates += 1
            out.reply_bytes(cid, cached[1])  # the original reply, again
            return
        if cid in out.seen:
            self.stats.duplicates += 1
            out.reply_again(cid)
            return
        earlier = ps.pending.get(cid)
        if earlier is not None:  # the original's transaction is still in flight
            self.stats.duplicates += 1
            out.reply_from(cid, earlier)
            return
        if not isinstance(env.payload, m.AdoptKey) and self._forwarded(ps, rec, key, h, out):
            return
        if env.schedule_id == QUOTA_ID:
            qs = ps.quotas.get(key)
            self._decide_quota(ps, key, qs if qs is not None else QuotaState(env.tenant), env,
                               now, out, rec)
            return
        st = ps.states.get(key)
        if st is None:
            st = initial_state(env.tenant, env.schedule_id)
        allowed, max_schedules = self.tenants.policy(env.tenant)
        max_attempts, min_backoff = self.tenants.retry_bounds(env.tenant)
        timeout, job_timeouts = self.tenants.timeouts(env.tenant)
        tenant = TenantContext(allowed, max_schedules,
                               destinations=self.tenants.destinations(env.tenant),
                               min_interval=self.tenants.min_interval(env.tenant),
                               max_attempts=max_attempts, min_backoff=min_backoff,
                               execution_timeout=timeout, job_timeouts=job_timeouts,
                               retry_delay=self._retry_delay(env, now))
        try:
            dec = (self._unpooled_claim(env) or self._over_share(env)
                   or decide(st, env, now, tenant))
            self._spend_retries(env.tenant, dec, now)
            encoded = self._encode(key, st, dec, cid, now)
        except Exception as exc:  # a decider bug rejects this command only
            self.stats.decide_errors += 1
            log.exception("decide_failed", command_id=cid, tenant=env.tenant,
                          schedule_id=env.schedule_id, type=env.type)
            self._dead_letter(ps, rec, f"the command could not be decided: "
                              f"{type(exc).__name__}: {exc}", out, env, exc)
            return
        if dec.events and key not in ps.states:
            ps.states[key] = st
        try:
            self._apply(ps, key, st, dec, encoded, cid, now, out)
        except Exception as exc:  # the state is suspect: rebuilt (_decide)
            self._unapplied[(ps.partition, rec.offset)] = exc
            raise _Unapplied(f"command {cid}: {type(exc).__name__}: {exc}") from exc
        self._unapplied_keys.discard(key)
        if isinstance(env.payload, m.AdoptKey):
            self._adopted(ps, key, st, dec)
        elif isinstance(env.payload, m.ClaimRun) and dec.ok:
            self._claimed_directly(ps, st, env.payload.run_id)

    # ------------------------------------------------------------------ routing (§18)

    def _placed_by(self, ps: PartitionState, h: int) -> int | None:
        """The partition count under which a command for the key of hash ``h`` belongs on
        this partition: one of a version of its routing view where it is the key's home,
        else the current one (the record is misplaced); None while no version has this
        partition (``place`` forwards whatever it receives)."""
        view = ps.routing
        assert view is not None
        if view.routing is None:
            return None
        for v in view.table.versions:
            if v.home(h) == ps.partition:
                return v.partitions
        return view.table.current.partitions

    def _forwarded(self, ps: PartitionState, rec: Record, key: str, h: int,
                   out: _Output) -> bool:
        """``place``: a command for a key this partition does not hold, and may not decide,
        is appended in this transaction to the partition that may hold it (True)."""
        view = ps.routing
        assert view is not None
        where = view.place(h, key in ps.states or key in ps.quotas)
        if not isinstance(where, Forward):
            return False
        self.stats.forwarded += 1
        out.commands.append(OutRecord(topic=self.topics.commands, key=rec.key, value=rec.value,
                                      partition=where.partition, headers=rec.headers))
        return True

    def _decide_routing(self, ps: PartitionState, rec: Record, env: m.CommandEnvelope,
                        now: datetime, out: _Output) -> None:
        """A command of the partition's routing view. A handover moves every key whose home
        in the next version is another partition, in this transaction, ahead of the
        partition's own routing events and of its handover-done commands."""
        view = ps.routing
        assert view is not None
        cid = env.command_id
        try:
            dec = decide_routing(view, env)
            values = [codec.encode_event_fields(event_id_for(cid, i), m.CURRENT_VERSION,
                                                ROUTING_KEY, ROUTING_TENANT, ROUTING_ID, now,
                                                cid, ev) for i, ev in enumerate(dec.events)]
        except Exception as exc:  # a decider bug rejects this command only
            self.stats.decide_errors += 1
            log.exception("routing_decide_failed", command_id=cid, type=env.type)
            self._dead_letter(ps, rec, f"the command could not be decided: "
                              f"{type(exc).__name__}: {exc}", out, env, exc)
            return
        if not dec.ok:
            log.warning("routing_rejected", partition=ps.partition, command_id=cid,
                        status=dec.status, reason=dec.reason)
        handover = next((ev for ev in dec.events if isinstance(ev, m.HandedOver)), None)
        if handover is not None:
            after = view
            for ev in dec.events:
                if ev is handover:
                    break
                after = evolve_routing(after, ev)
            self._hand_over(ps, after.table.get(handover.version), now, out)
        first_index = len(out.events)
        for i, ev in enumerate(dec.events):
            view = ps.routing = evolve_routing(view, ev)
            out.event(event_id_for(cid, i), ROUTING_KEY, ROUTING_TENANT, ROUTING_ID, now, cid,
                      ev, values[i])
        if dec.events and ps.snap is not None:
            ps.snap.dirty.add(ROUTING_KEY)
            ps.snap.events_since += len(dec.events)
        self._send(ps, ROUTING_TENANT, dec, now, out)
        if not cid.startswith(INTERNAL_COMMANDS):
            if env.reply_to:
                out.reply_to[cid] = env.reply_to
            body = dec.body if not dec.field else {**dec.body, "field": dec.field}
            out.reply_new(cid, dec.status, dec.reason, codec.encode_body(body), ROUTING_TENANT,
                          ROUTING_ID, first_index, len(out.events))
            ps.pending[cid] = out
        log.info("routing_decided", partition=ps.partition, type=env.type,
                 status=dec.status, events=[ev.type for ev in dec.events])

    def _hand_over(self, ps: PartitionState, to: RoutingVersion, now: datetime,
                   out: _Output) -> None:
        """Move out every key whose home in ``to`` is another partition: its moved-out event
        here and its adopt command to its new home (``move_out``), in key order."""
        p = ps.partition
        for key in sorted(ps.states):
            dest = to.home(key_hash(key.encode()))
            if dest == p:
                continue
            st = ps.states[key]
            runs = [*(st.runs or {})]
            cid = move_command_id("out", to.version, key)
            dec = move_out(st, dest, to.version, p)
            if not dec.ok:  # nothing of it here (a create refused before it was held)
                del ps.states[key]
                continue
            encoded = self._encode(key, st, dec, cid, now)
            self._apply(ps, key, st, dec, encoded, cid, now, out)
            del ps.states[key]
            for run_id in runs:  # its workers' credit: they now answer to the new home
                ps.dispatch.settle(run_id, None)
            self.stats.moved_out += 1
        for key in sorted(ps.quotas):
            dest = to.home(key_hash(key.encode()))
            if dest == p:
                continue
            qs = ps.quotas[key]
            cid = move_command_id("out", to.version, key)
            dec = move_out_quota(qs, dest, to.version, p)
            self._apply_quota(ps, key, qs, dec, self._encode(key, qs, dec, cid, now),  # type: ignore[arg-type]
                              cid, now, out)
            del ps.quotas[key]
            ps.arm_at(key, None)
            self.stats.moved_out += 1

    def _adopted(self, ps: PartitionState, key: str, st: ScheduleState, dec: Decision) -> None:
        """After an adopt command: a key moved in has its runs seated (its timer is armed by
        ``_apply``); a refused adopt is an error of the handover (logged)."""
        if not dec.ok:
            log.error("adopt_refused", partition=ps.partition, key=key, status=dec.status,
                      reason=dec.reason)
            return
        self.stats.moved_in += 1
        self._seat_runs(ps, key, st)

    def _seat_runs(self, ps: PartitionState, key: str, st: ScheduleState) -> None:
        """A state that arrived whole (restored, moved in): its READY runs wait for a seat,
        its LEASED ones hold their worker's."""
        for run in (st.runs or {}).values():
            if run.state == "READY":
                self._wait_for_seat(ps, key, st, run)
            elif run.state == "LEASED" and run.worker_id:
                ps.dispatch.adopt(run.resource_class, run.worker_id, run.run_id, run.fence)
                ps.dispatch.hold(run.run_id, st.tenant)

    def _decide_quota(self, ps: PartitionState, key: str, qs: QuotaState,
                      env: m.CommandEnvelope, now: datetime, out: _Output,
                      rec: Record | None = None) -> None:
        """Decide a command (``rec``) or a timer of a tenant's quota aggregate, and apply it:
        its events, the saga commands it sends, and a reply (only to a refused command of
        someone else: the saga's own steps are answered by commands)."""
        cid = env.command_id
        try:
            dec = decide_quota(qs, env, now, self.tenants.policy(env.tenant)[1])
            encoded = self._encode(key, qs, dec, cid, now)  # type: ignore[arg-type]
        except Exception as exc:  # a decider bug rejects this command only
            log.exception("quota_decide_failed", command_id=cid, tenant=env.tenant)
            if rec is None:
                self.stats.tick_errors += 1
            else:
                self.stats.decide_errors += 1
                self._dead_letter(ps, rec, f"the command could not be decided: "
                                  f"{type(exc).__name__}: {exc}", out, env, exc)
            return
        if dec.events:
            ps.quotas[key] = qs
        self._apply_quota(ps, key, qs, dec, encoded, cid, now, out)
        if isinstance(env.payload, m.AdoptKey) and not dec.ok:
            log.error("adopt_refused", partition=ps.partition, key=key, status=dec.status,
                      reason=dec.reason)

    def _apply_quota(self, ps: PartitionState, key: str, qs: QuotaState, dec: Decision,
                     encoded: tuple[list[bytes], bytes | None], cid: str, now: datetime,
                     out: _Output) -> None:
        """Evolve and record a quota decision's events, its saga commands and its reply."""
        if dec.events and ps.snap is not None:
            ps.snap.dirty.add(key)
            ps.snap.events_since += len(dec.events)
        first_index = len(out.events)
        values, body = encoded
        for i, ev in enumerate(dec.events):
            evolve_quota(qs, ev)
            out.event(event_id_for(cid, i), key, qs.tenant, QUOTA_ID, now, cid, ev, values[i])
        self._send(ps, qs.tenant, dec, now, out)
        ps.arm_at(key, quota_wakeup(qs))
        if body is not None:
            out.reply_new(cid, dec.status, dec.reason, body, qs.tenant, QUOTA_ID, first_index,
                          len(out.events))
            ps.pending[cid] = out

    def _send(self, ps: PartitionState, tenant: str, dec: Decision, now: datetime,
              out: _Output) -> None:
        """A decision's commands to other aggregates of the tenant (the quota saga, a moved
        key's adopt command) or to other partitions (handover-done), written to ``commands``
        in this transaction, after the events: to the partition the send names, else to the
        aggregate's home in the version this partition serves (its ``place`` forwards it if
        the key is elsewhere)."""
        view = ps.routing
        assert view is not None
        for send in dec.sends:
            env = m.CommandEnvelope.model_construct(
                command_id=send.command_id, type=send.payload.type, tenant=tenant,
                principal=PROCESSOR, schedule_id=send.schedule_id, issued_at=now,
                reply_to=None, payload=send.payload)
            key = partition_key(tenant, send.schedule_id).encode()
            partition = send.partition
            if partition is None:
                serves = view.table.current if view.routing is None else view.routing.serves
                partition = serves.home(key_hash(key))
            out.commands.append(OutRecord(topic=self.topics.commands, key=key,
                                          value=codec.encode_command(env), partition=partition))

    def _encode(self, key: str, st: ScheduleState, dec: Decision, command_id: str,
                now: datetime) -> tuple[list[bytes], bytes | None]:
        """A decision's events and reply body as bytes, before anything is evolved: a value
        that cannot be encoded (an integer past 64 bits, ...) raises here, with the state
        and the batch untouched."""
        events = [codec.encode_event_fields(event_id_for(command_id, i), m.CURRENT_VERSION, key,
                                            st.tenant, st.schedule_id, now, command_id, ev)
                  for i, ev in enumerate(dec.events)]
        if dec.deferred or (command_id.startswith(INTERNAL_COMMANDS) and dec.answers is None):
            return events, None  # the processor's own commands, or answered later (the saga)
        body = dec.body if not dec.field else {**dec.body, "field": dec.field}
        return events, codec.encode_body(body)

    def _apply(
        self,
        ps: PartitionState,
        key: str,
        st: ScheduleState,
        dec: Decision,
        encoded: tuple[list[bytes], bytes | None],
        command_id: str,
        now: datetime,
        out: _Output,
    ) -> None:
        """Evolve and record a decision's events, and its reply (none for the processor's own
        commands: timers and assignments)."""
        first_index = len(out.events)
        values, body = encoded
        snap = ps.snap
        if snap is not None and dec.events:
            snap.dirty.add(key)
            snap.events_since += len(dec.events)
        for i, ev in enumerate(dec.events):
            evolve(st, ev)
            out.event(event_id_for(command_id, i), key, st.tenant, st.schedule_id, now,
                      command_id, ev, values[i])
            if ev.type in READY_EVENT_TYPES:
                self._ready(ps, key, st, ev)
        for ev in dec.events:
            run_id = getattr(ev, "run_id", None)
            if run_id is not None and run_id in ps.dispatch.assigned:
                if ev.type == "LeaseExpired":
                    ps.dispatch.lapse_holder(run_id)
                ps.dispatch.settle(run_id, st.run(run_id))
        self._send(ps, st.tenant, dec, now, out)
        ps.arm(key, st)
        if body is not None:
            answered = dec.answers or command_id  # a held create is answered by the saga
            if dec.answers and dec.answers_client:
                out.reply_to[answered] = dec.answers_client  # its reply wakes that client
            out.reply_new(answered, dec.status, dec.reason, body,
                          st.tenant, st.schedule_id, first_index, len(out.events))
            ps.pending[answered] = out

    def _unverified_offer(self, offer: Offer, partition: int, why: str) -> None:
        """Count a pool offer that seats nobody; log it at most every 10 s per worker."""
        self.stats.offers_unverified += 1
        mono = time.monotonic()
        if mono - self._unverified_logged.get(offer.worker_id, float("-inf")) >= 10.0:
            if len(self._unverified_logged) > 1000:
                self._unverified_logged.clear()
            self._unverified_logged[offer.worker_id] = mono
            log.warning("offer_unverified", worker_id=offer.worker_id[:200],
                        pool=(offer.pool or "")[:100], partition=partition, reason=why,
                        total=self.stats.offers_unverified)

    def _ready(self, ps: PartitionState, key: str, st: ScheduleState, ev: Any) -> None:
        """A run became READY: it waits for a worker's seat (``_dispatch``)."""
        if isinstance(ev, m.OccurrenceMaterialized) and ev.state != "READY":
            return
        run = st.run(ev.run_id)
        if run is not None and run.state == "READY":
            self._wait_for_seat(ps, key, st, run)

    def _wait_for_seat(self, ps: PartitionState, key: str, st: ScheduleState, run: Any) -> None:
        ps.dispatch.wait(run.resource_class, st.tenant, self.tenants.weight(st.tenant),
                         run.priority, key, run.run_id, run.attempt)

    def _dispatch(self, ps: PartitionState, now: datetime, out: _Output) -> None:
        """Assign waiting READY runs to seats with credit: the decider's ClaimRun on the
        worker's behalf, and an assignment record on partition p of ``ready.<class>``."""
        d = ps.dispatch
        mono = time.monotonic()
        running: Counter[str] | None = None  # counted once a capped tenant's run comes up
        for cls, queue in d.waiting.items():
            kept: list[tuple[str, tuple[int, int, str, str, int]]] = []
            for tenant, entry in queue.entries():
                if not d.has_credit(cls):
                    kept.append((tenant, entry))
                    break
                _, _, key, run_id, attempt = entry
                st = ps.states.get(key)
                run = st.run(run_id) if st is not None else None
                if st is None or run is None or run.state != "READY" or run.attempt != attempt:
                    continue  # cancelled, skipped or assigned meanwhile
                cap = self.tenants.max_running(tenant)
                if cap is not None and running is None:
                    running = running_by_tenant(p.dispatch for p in self.partitions.values())
                if cap is not None and running is not None and running[tenant] >= cap:
                    kept.append((tenant, entry))  # the tenant holds its share: it waits
                    continue
                seat = d.seat_for(cls, run.job.type, mono, self.tenants.seat_pools(st.tenant))
                if seat is None:
                    kept.append((tenant, entry))  # no live seat takes its job type
                    continue
                cid = f"assign:{ps.partition}:{run_id}:{attempt}"
                try:
                    dec = decide(st, _assign_envelope(st, cid, now, run_id, attempt,
                                                      seat.worker_id), now,
                                 self._claim_context(st.tenant))
                    encoded = self._encode(key, st, dec, cid, now)
                except Exception:  # a decider bug must not stop the partition
                    log.exception("assign_decide_failed", partition=ps.partition, run_id=run_id)
                    continue  # it stays READY; the next event of its schedule queues it again
                try:
                    self._apply(ps, key, st, dec, encoded, cid, now, out)
                except Exception as exc:  # the state is suspect: rebuilt (_decide)
                    self._unapplied_keys.add(key)
                    raise _Unapplied(
                        f"assignment of {run_id}: {type(exc).__name__}: {exc}") from exc
                if dec.status != "ok":
                    continue
                queue.charge(tenant)
                d.assign(cls, seat, run_id, int(dec.body["fence"]))
                d.hold(run_id, tenant)
                if running is not None:
                    running[tenant] += 1
                out.assignments.append(OutRecord(
                    topic=self.topics.ready_for(cls, seat.pool), key=run_id.encode(),
                    value=codec.dumps_kept({"assignee": seat.worker_id, "tenant": st.tenant,
                                            "schedule_id": st.schedule_id, **dec.body},
                                           orjson.OPT_UTC_Z),
                    partition=ps.partition,
                ))
            for tenant, entry in kept:
                queue.restore(tenant, entry)
        d.prune(mono)

    def _unpooled_claim(self, env: m.CommandEnvelope) -> Decision | None:
        """A worker's own ClaimRun of a run whose tenant is bound to worker pools: refused.
        Such runs go only to seats whose offers proved a pool credential; a claim carries no
        proof, so allowing it would hand the run (params included) to any log writer."""
        if not isinstance(env.payload, m.ClaimRun):
            return None
        if None in self.tenants.seat_pools(env.tenant):
            return None
        return Decision(status="forbidden", body={"run_id": env.payload.run_id},
                        field="worker_id",
                        reason="the tenant's runs go only to workers of its pools, through "
                               "offers that prove a pool credential: a run cannot be claimed")

    def _over_share(self, env: m.CommandEnvelope) -> Decision | None:
        """A worker's own ClaimRun (not an assignment) when the tenant already holds its
        ``max_running`` share: refused, as dispatch would not assign it either."""
        cap = self.tenants.max_running(env.tenant)
        if cap is None or not isinstance(env.payload, m.ClaimRun):
            return None
        held = running_by_tenant(p.dispatch for p in self.partitions.values())[env.tenant]
        if held < cap:
            return None
        return Decision(status="conflict", body={"run_id": env.payload.run_id},
                        reason=f"the tenant holds its share of running slots "
                               f"(max_running {cap}): the run waits READY")

    def _claimed_directly(self, ps: PartitionState, st: ScheduleState, run_id: str) -> None:
        """A run a worker claimed itself holds the worker's seat and counts against the
        tenant's ``max_running``, like an assigned one (settled when it finishes)."""
        run = st.run(run_id)
        if run is not None and run.state == "LEASED" and run.worker_id:
            ps.dispatch.adopt(run.resource_class, run.worker_id, run_id, run.fence)
            ps.dispatch.hold(run_id, st.tenant)

    def _retry_delay(self, env: m.CommandEnvelope, now: datetime) -> float:
        """The extra wait a retry of ``env`` (a failure) gets: the tenant's budget of retries
        a minute is spent (``AttemptBudget``); 0 for other commands or without a ceiling."""
        per_minute = self.tenants.attempts_per_minute(env.tenant)
        if per_minute is None or not isinstance(env.payload, m.FailRun):
            return 0.0
        return self.attempt_budget.delay(env.tenant, per_minute, now.timestamp())

    def _spend_retries(self, tenant: str, dec: Decision, now: datetime) -> None:
        per_minute = self.tenants.attempts_per_minute(tenant)
        if per_minute is not None:
            for ev in dec.events:
                if isinstance(ev, m.RetryScheduled):
                    self.attempt_budget.take(tenant, per_minute, now.timestamp())

    def _claim_context(self, tenant: str) -> TenantContext:
        """What an assignment (a ClaimRun on a worker's behalf) needs of the tenant's
        policy: its execution timeouts, written into AttemptClaimed and the record."""
        timeout, job_timeouts = self.tenants.timeouts(tenant)
        return TenantContext(execution_timeout=timeout, job_timeouts=job_timeouts)

    def _dead_letter(
        self, ps: PartitionState, rec: Record, reason: str, out: _Output,
        env: m.CommandEnvelope | None = None, error: BaseException | None = None,
    ) -> None:
        """Skip ``rec``: its dead letter and an ``invalid`` reply go in this transaction."""
        self.stats.dead_letters += 1
        command_id = env.command_id if env else _sniff_command_id(rec.value)
        out.records.append(self.dead_letters.record(
            rec, error if error is not None else reason, command_id))
        if command_id:
            out.reply_bytes(command_id, codec.encode_reply(
                m.Reply(command_id=command_id, status="invalid", reason=reason)))


class _Unapplied(Exception):
    """A decision could not be applied to the partition's state (see ``Processor._decide``)."""


@dataclass
class _Work:
    """One partition's decided batch, waiting for (or in) its transaction."""

    ps: PartitionState
    batch: list[Record]
    out: _Output
    consumed: dict[tuple[str, int], int]


# reply kinds inside _Output.replies
_NEW, _BYTES, _AGAIN, _FROM = 0, 1, 2, 3


class _Output:
    """The records of one partition's transaction, in order; replies are built last.

    A reply carries the exact log positions of the events its command caused. Those are
    only known once the events are appended, so replies are produced by ``then(positions)``
    inside the same transaction (the port's two-phase commit). Replies are kept as encoded
    bytes (``final``: command_id -> bytes, the processor's duplicate cache) — a ``Reply``
    model is never built on this path.
    """

    def __init__(self, topics: Any, partition: int,
                 writer: tuple[tuple[str, bytes], ...] = (),
                 snap: SnapshotWriter | None = None, chunk: Chunk | None = None) -> None:
        self.topics = topics
        self.events_topic = topics.events
        self.partition = partition
        self.writer = writer  # headers naming the processor and its epoch (audit trail)
        # the partition's snapshot: this transaction's events move its end; ``chunk``: the
        # states this transaction writes to ``state`` (framed in ``then``, once positioned)
        self.snap = snap
        self.chunk = chunk
        self._snap_base: tuple[int, tuple[int, str] | None] | None = None
        self.records: list[OutRecord] = []
        # assignment records: written after the events, with the replies (``then``), so that the
        # first records are this partition's events only — a Kafka owner can then predict
        # their positions and send everything in one round trip (chronolog.log.kafka)
        self.assignments: list[OutRecord] = []
        # commands to other aggregates (the quota saga), written with the assignments
        self.commands: list[OutRecord] = []
        # (event_id, key, tenant, schedule_id, at, causation_id, payload) of each event;
        # envelope models are only built for on_commit hooks (``envelopes``)
        self.events: list[tuple[str, str, str, str, datetime, str, Any]] = []
        self.event_index: list[int] = []  # index in records of each event
        # (kind, command_id, data): _NEW data = (status, reason, body json, tenant,
        # schedule_id, first event, end event); _BYTES data = the reply's bytes; _AGAIN
        # data = None (same command earlier in this batch); _FROM data = the earlier
        # _Output whose transaction (committed before ours) holds the original reply
        self.replies: list[tuple[int, str, Any]] = []
        self.final: dict[str, bytes] = {}
        self.seen: set[str] = set()
        self.reply_to: dict[str, str] = {}  # command_id -> the client its reply wakes

    @property
    def empty(self) -> bool:
        return (not self.records and not self.replies and not self.assignments
                and not self.commands and self.chunk is None)

    def event(self, event_id: str, key: str, tenant: str, schedule_id: str, at: datetime,
              causation_id: str, payload: Any, value: bytes) -> None:
        """Append an event whose bytes (``value``) the processor encoded already."""
        self.events.append((event_id, key, tenant, schedule_id, at, causation_id, payload))
        self.event_index.append(len(self.records))
        self.records.append(OutRecord(self.events_topic, key.encode(), value, self.partition,
                                      self.writer))

    def envelopes(self) -> list[m.EventEnvelope]:
        return [m.EventEnvelope(event_id=event_id, type=payload.type, version=m.CURRENT_VERSION,
                                key=key, tenant=tenant, schedule_id=schedule_id, at=at,
                                causation_id=causation_id, payload=payload)
                for event_id, key, tenant, schedule_id, at, causation_id, payload in self.events]

    def reply_new(self, command_id: str, status: str, reason: str, body: bytes, tenant: str,
                  schedule_id: str, first_event: int, end_event: int) -> None:
        self.replies.append((_NEW, command_id,
                             (status, reason, body, tenant, schedule_id, first_event, end_event)))
        self.seen.add(command_id)

    def reply_bytes(self, command_id: str, data: bytes) -> None:
        self.replies.append((_BYTES, command_id, data))

    def reply_again(self, command_id: str) -> None:
        self.replies.append((_AGAIN, command_id, None))

    def reply_from(self, command_id: str, earlier: _Output) -> None:
        self.replies.append((_FROM, command_id, earlier))

    def then(self, positions: list[Position]) -> list[OutRecord]:
        """The assignment records, then the replies with the positions of their events (called
        inside the transaction; again if a prediction of the positions was wrong)."""
        out = list(self.assignments) + self.commands
        final: dict[str, bytes] = {}
        topic, partition = self.topics.replies, self.partition
        for kind, cid, data in self.replies:
            if kind == _NEW:
                status, reason, body, tenant, schedule_id, a, b = data
                pos = [(positions[i].topic, positions[i].partition, positions[i].offset)
                       for i in self.event_index[a:b]]
                value = codec.encode_reply_fields(cid, status, reason, body, pos, tenant,
                                                  schedule_id)
            elif kind == _BYTES:
                value = data
            elif kind == _AGAIN:
                value = final[cid]
            else:
                value = data.final[cid]  # committed before this transaction began
            final[cid] = value
            to = self.reply_to.get(cid)
            out.append(OutRecord(topic=topic, key=cid.encode(), value=value, partition=partition,
                                 headers=((WAKE_HEADER, to.encode()),) if to else ()))
        self.final = final
        snap = self.snap
        if snap is not None:
            self._then_snapshot(snap, positions, out)
        return out

    def _then_snapshot(self, snap: SnapshotWriter, positions: list[Position],
                       out: list[OutRecord]) -> None:
        """The chunk's records (``SnapshotWriter.transaction``); the partition's end before
        this transaction is taken at the first call (``then`` may be called again)."""
        base = self._snap_base
        if base is None:
            base = self._snap_base = (snap.log_end, snap.last_event)
        index = self.event_index
        span = None if not index else (positions[index[0]].offset,
                                       positions[index[-1]].offset, self.events[-1][0])
        out.extend(snap.transaction(self.chunk, span, base))




def _tick_envelope(st: ScheduleState | QuotaState, command_id: str,
                   now: datetime) -> m.CommandEnvelope:
    return m.CommandEnvelope.model_construct(
        command_id=command_id, type="Tick", tenant=st.tenant, principal="processor",
        schedule_id=st.schedule_id, issued_at=now, reply_to=None, payload=m.Tick(),
    )


def _assign_envelope(st: ScheduleState, command_id: str, now: datetime, run_id: str,
                     attempt: int, worker_id: str) -> m.CommandEnvelope:
    return m.CommandEnvelope.model_construct(
        command_id=command_id, type="ClaimRun", tenant=st.tenant, principal="processor",
        schedule_id=st.schedule_id, issued_at=now, reply_to=None,
        payload=m.ClaimRun.model_construct(type="ClaimRun", run_id=run_id, attempt=attempt,
                                           worker_id=worker_id),
    )


def _sniff_command_id(value: bytes) -> str | None:
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    cid = raw.get("command_id") if isinstance(raw, dict) else None
    return cid if isinstance(cid, str) and cid else None


def partitions_of(records: Iterable[Record]) -> set[int]:
    return {r.partition for r in records}


__all__ = [
    "OpenTenants",
    "PartitionState",
    "Position",
    "Processor",
    "ProcessorConfig",
    "Sequence",
    "TenantPolicies",
    "timedelta",
    "utc_now",
]
