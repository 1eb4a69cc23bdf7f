"""A partition task: everything a processor holds and does for one partition it owns.

The processor (``chronolog.processors.runtime``, the task manager) owns partitions and
commits their transactions; a ``PartitionTask`` decides them. ``decide`` takes a batch of
the partition's records and its due timers and produces the transaction's ``Output``, each
record through one pipeline: a worker's offer seats the worker; a command is decoded (a
record that does not decode is dead-lettered, with an ``invalid`` reply), placed (a command
for a key whose home is another partition is forwarded there, docs/design.md §18), checked
against the reply cache (a duplicate gets its original reply again), and routed to its
aggregate — the partition's routing view, a tenant's quota, or a schedule — whose decision
is encoded, evolved into the state and recorded with its reply. Then the READY runs that
wait are assigned to workers' seats with credit.

A decision whose events cannot be applied to the state raises ``Unapplied``: the state is
no longer the log's, and the task manager drops the partition and takes it over again.

What every task of a processor shares (the tenants' policies, counters, the dead-letter
writer, the other tasks for tenant-wide counts, the tenants' retries-a-minute and storage
budgets) is its ``TaskContext``. A schedule's decision passes the tenant's storage budget
(``StorageGate.within``, docs/design.md §9) before it is applied.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import structlog

from chronolog.commands.aggregate import OPEN_TENANT, PROCESSOR, Aggregate, Decision, TenantContext
from chronolog.commands.decider import ScheduleDecision
from chronolog.commands.permits import waits_for_permit
from chronolog.commands.registry import PartitionAggregates
from chronolog.commands.routing import RoutingView
from chronolog.commands.state import QuotaState, ScheduleState
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
from chronolog.domain.offers import BadOffer, Offer, is_offer, verify_proof
from chronolog.domain.routing import Forward, RoutingVersion
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.partitioner import key_hash, misplaced
from chronolog.log.port import OutRecord, PartitionOwner, Record
from chronolog.processors.attempt_budget import AttemptBudget
from chronolog.processors.config import (
    ProcessorConfig,
    ProcessorStats,
    TenantPolicies,
    claim_context,
    tick_context,
)
from chronolog.processors.dispatch import Dispatcher, running_by_tenant
from chronolog.processors.internal import (
    INTERNAL_COMMANDS,
    assign_envelope,
    sniff_command_id,
    tick_envelope,
)
from chronolog.processors.output import Output
from chronolog.processors.schedule_store import ScheduleStore
from chronolog.processors.snapshots import Chunk, SnapshotWriter
from chronolog.processors.storage_budget import StorageGate
from chronolog.processors.timers import Timers
from chronolog.settings import RULES_HEADER, RulesVersion

log = structlog.get_logger("chronolog.processor")

S = TypeVar("S")
E = TypeVar("E")

# the events after which a run may be READY (it waits for a worker's seat)
# the events after which a run may wait for a worker (RunPermitted: it had waited for a permit)
ReadyEvent = m.OccurrenceMaterialized | m.OccurrenceReady | m.OccurrenceRedriven | m.RunPermitted
READY_EVENTS = (*ReadyEvent.__args__,)
ROUTING_KEY = routing_key()


@dataclass
class TaskContext:
    """What the tasks of one processor share."""

    topics: Any
    config: ProcessorConfig
    tenants: TenantPolicies
    stats: ProcessorStats
    member_id: str
    rules: RulesVersion
    dead_letters: DeadLetters
    # every task of the processor, by partition (a tenant's running runs span them)
    tasks: Mapping[int, PartitionTask]
    attempt_budget: AttemptBudget = field(default_factory=AttemptBudget)  # retries a minute
    # bytes of params and results each tenant wrote in the last hour (its storage budget)
    storage: StorageGate = field(default_factory=StorageGate)
    # commands (partition, offset) and timers (key) whose decision could not be applied:
    # not decided again (the command is dead-lettered, the timer waits for a command)
    unapplied: dict[tuple[int, int], Exception] = field(default_factory=dict)
    unapplied_keys: set[str] = field(default_factory=set)
    unverified_logged: dict[str, float] = field(default_factory=dict)  # worker -> when logged


class Unapplied(Exception):
    """A decision could not be applied to the partition's state (the task manager drops
    the partition and takes it over again from the log)."""


class PartitionTask:
    """One owned partition: its states, timers, reply cache and workers' seats, and the
    pipeline each of its records goes through (``decide``)."""

    def __init__(self, partition: int, owner: PartitionOwner, ctx: TaskContext,
                 aggregates: PartitionAggregates) -> None:
        self.partition = partition
        # the aggregates it decides: schedules, tenants' quotas, its routing view
        self.aggregates = aggregates
        self.owner = owner
        self.ctx = ctx
        # the schedules' states, the quiet ones beyond the horizon held cold (``tend``)
        self.states = self.new_states()
        self._next_cool = datetime.min.replace(tzinfo=UTC)
        self.timers = Timers()  # the schedules' and the quotas' next wake instants
        # command_id -> (wall time, the reply's encoded bytes) of committed replies
        self.replies: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        # command_id -> the output of a transaction still in flight that replies to it
        self.pending: dict[str, Output] = {}
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
        self.routing: RoutingView = aggregates.routing.initial(ROUTING_TENANT, ROUTING_ID)
        # the schedules whose timer was due when the partition was taken over (``resume``)
        # and that have not had their first Tick since
        self.resuming: set[str] = set()

    def new_states(self) -> ScheduleStore:
        """An empty store of this partition's schedules (a restore fills it)."""
        horizon = self.ctx.config.hot_horizon_s
        return ScheduleStore(None if horizon is None else timedelta(seconds=horizon),
                             self.aggregates.schedule.wakeup)

    def tend(self, now: datetime, warm: int | None = None) -> None:
        """Keep the hot set: the cold states whose wake-up comes within the horizon are
        warmed and their timers armed (at most ``warm``, by default ``warm_per_step``);
        every ``cool_every_s`` the quiet states changed since that are idle go cold and
        their timers are disarmed (``cool_per_step`` at a time)."""
        cfg = self.ctx.config
        states = self.states
        for key, st in states.warm(now, cfg.warm_per_step if warm is None else warm):
            self.arm(key, st)
            self.ctx.stats.warmed += 1
        if states.cooling and now >= self._next_cool:
            cooled = states.cool(now, cfg.cool_per_step)
            for key in cooled:
                self.timers.disarm(key)
            self.timers.compact()  # the cooled keys' entries: not kept until their instants
            self.ctx.stats.cooled += len(cooled)
            # a slice left over goes at the next decide
            self._next_cool = now + timedelta(seconds=cfg.cool_every_s) \
                if not states.cooling else now

    def running(self) -> asyncio.Task[None] | None:
        """This partition's commit chain while it runs (None when idle)."""
        return self.chain if self.chain is not None and not self.chain.done() else None

    def arm(self, key: str, state: ScheduleState) -> None:
        self.arm_at(key, self.aggregates.schedule.wakeup(state))

    def arm_at(self, key: str, wake: datetime | None) -> None:
        self.timers.arm(key, wake)

    def next_wake(self) -> datetime | None:
        """The earliest of: a timer, the warming of the next cold states, the next cooling
        of states changed since the last (``tend``)."""
        wake = self.timers.next()
        warm = self.states.next_warm()
        if warm is not None and (wake is None or warm < wake):
            wake = warm
        if self.states.cooling and (wake is None or self._next_cool < wake):
            wake = self._next_cool
        return wake

    def resume(self, now: datetime) -> None:
        """The partition was just taken over (restored, to be installed): every schedule
        whose timer is due at ``now`` fell in a gap — no processor decided it meanwhile.
        Its first Tick says so (``Tick.resumed``), and comes before anything else decided
        for it (``_tick_resumed``): a command read after the take-over, such as a worker's
        claim of a run left READY before the gap, is decided after that Tick."""
        self.resuming = {key for key in self.timers.due_at(now) if key in self.states
                         and key not in self.ctx.unapplied_keys}

    def snapshot_due(self, idle: bool) -> bool:
        """Whether the next batch of this partition should carry a snapshot chunk (``idle``:
        the processor has nothing else to do; ``SnapshotWriter.due``)."""
        snap = self.snap
        return snap is not None and snap.due(time.monotonic(), idle)

    def decide(
        self, batch: list[Record], now: datetime, idle: bool = False,
    ) -> tuple[Output | None, dict[tuple[str, int], int]]:
        """Decide a partition's commands and due timers (state is evolved as we go).

        A snapshot chunk that is due is encoded first: it holds the states after every
        earlier transaction of the partition, and goes in this one (docs/design.md §14)."""
        chunk: Chunk | None = None
        snap = self.snap
        if snap is not None and snap.due(time.monotonic(), idle):
            try:
                chunk = snap.take(self.states, self.quotas, time.monotonic(), idle, self.routing)
            except Exception:
                log.exception("snapshot_encode_failed", partition=self.partition)
        self.tend(now)
        out = Output(self.ctx.topics, self.partition, (
            ("processor", self.ctx.member_id.encode()), ("epoch", str(self.owner.epoch).encode()),
            (RULES_HEADER, self.ctx.rules.label.encode())), snap, chunk)
        consumed: dict[tuple[str, int], int] = {}
        for rec in batch:
            self._handle(rec, now, out)
        if batch:
            consumed[(self.ctx.topics.commands, self.partition)] = batch[-1].offset + 1
        budget = max(16, self.ctx.config.ticks_per_step // max(1, len(self.ctx.tasks)))
        for key in self.timers.due(now, budget):
            qs = self.quotas.get(key)
            if qs is not None:
                self._decide_quota(key, qs, tick_envelope(qs, f"tick:{self.partition}:"
                                   f"{int(now.timestamp() * 1e6)}:{key}", now), now, out)
                continue
            st = self.states.get(key)
            if st is None or key in self.ctx.unapplied_keys:
                continue  # a timer whose decision could not be applied waits for a command
            self._tick(key, st, now, out, resumed=self._first_since_resume(key))
        self._assign_waiting(now, out)
        if out.empty and not consumed:
            return None, consumed
        return out, consumed

    def _first_since_resume(self, key: str) -> bool:
        """Whether this is the first Tick of ``key`` since the take-over (``resume``)."""
        if key not in self.resuming:
            return False
        self.resuming.discard(key)
        return True

    def _tick(self, key: str, st: ScheduleState, now: datetime, out: Output,
              resumed: bool = False) -> None:
        """Decide and apply a schedule's Tick (``resumed``: its first since the take-over,
        with a command ID of its own: the key's timer may tick it again in this batch)."""
        cid = f"tick:{self.partition}:{int(now.timestamp() * 1e6)}:{key}"
        if resumed:
            cid += ":resumed"
        try:
            dec = self.aggregates.schedule.decide(st, tick_envelope(st, cid, now, resumed), now,
                                                  tick_context(self.ctx.tenants, st.tenant))
            encoded = self._encode(key, st.tenant, st.schedule_id, dec, cid, now)
        except Exception:  # a decider bug must not stop the partition
            self.ctx.stats.tick_errors += 1
            log.exception("tick_decide_failed", partition=self.partition, key=key)
            return  # not re-armed: the schedule's next command decides again
        try:
            self._apply(key, st, dec, encoded, cid, now, out)
        except Exception as exc:  # the state is suspect: rebuilt (_decide)
            self.ctx.unapplied_keys.add(key)
            raise Unapplied(f"timer of {key}: {type(exc).__name__}: {exc}") from exc
        self.ctx.stats.ticks += 1

    def _tick_resumed(self, key: str, now: datetime, out: Output) -> None:
        """A command of a schedule still waiting for its first Tick since the take-over
        comes after that Tick, decided here (its timer entry is superseded): a worker that
        came back before the processor cannot claim a run the Tick coalesces."""
        st = self.states.get(key)
        if not self._first_since_resume(key) or st is None or key in self.ctx.unapplied_keys:
            return
        self.timers.disarm(key)
        self._tick(key, st, now, out, resumed=True)

    def _handle(self, rec: Record, now: datetime, out: Output) -> None:
        if rec.headers and is_offer(rec.headers):
            try:
                offer = Offer.decode(rec.value)
            except BadOffer as exc:
                self._dead_letter(rec, str(exc), out)
                return
            if offer.pool is not None:
                why = verify_proof(offer, rec.partition, self.ctx.tenants.credentials(offer.pool),
                                   now.timestamp())
                if why is not None:
                    self._unverified_offer(offer, rec.partition, why)
                    return
            self.dispatch.offer(offer, time.monotonic())
            return
        unapplied = self.ctx.unapplied.get((self.partition, rec.offset))
        if unapplied is not None:  # it stopped this partition once: not decided again
            self._dead_letter(rec, f"the command's events could not be applied: "
                              f"{type(unapplied).__name__}: {unapplied}", out, error=unapplied)
            return
        try:
            env = codec.decode_command(rec.value)
        except codec.DecodeError as exc:
            self._dead_letter(rec, str(exc), out, error=exc)
            return
        key = partition_key(env.tenant, env.schedule_id)
        kind = self.aggregates.kind_of(env.schedule_id)
        if kind == "routing":  # addressed to this partition, not placed by key
            self._decide_routing(rec, env, now, out)
            return
        h = key_hash(key.encode())
        wrong_place = misplaced(rec.key, key, self.partition, self._placed_by(h))
        if wrong_place is not None:
            self._dead_letter(rec, wrong_place, out, env)
            return
        if isinstance(env.payload, m.Tick):
            self._dead_letter(rec, "type: Tick is internal to the processor", out, env)
            return
        cid = env.command_id
        if env.reply_to:
            out.reply_to[cid] = env.reply_to
        cached = self.replies.get(cid)
        if cached is not None and time.time() - cached[0] <= self.ctx.config.reply_retention_s:
            self.ctx.stats.duplicates += 1
            out.reply_bytes(cid, cached[1])  # the original reply, again
            return
        if cid in out.seen:
            self.ctx.stats.duplicates += 1
            out.reply_again(cid)
            return
        earlier = self.pending.get(cid)
        if earlier is not None:  # the original's transaction is still in flight
            self.ctx.stats.duplicates += 1
            out.reply_from(cid, earlier)
            return
        if not isinstance(env.payload, m.AdoptKey) and self._forwarded(rec, key, h, out):
            return
        if kind == "quota":
            qs = self.quotas.get(key)
            if qs is None:
                qs = self.aggregates.quota.initial(env.tenant, env.schedule_id)
            self._decide_quota(key, qs, env, now, out, rec)
            return
        if key in self.resuming:
            self._tick_resumed(key, now, out)
        st = self.states.get(key)
        if st is None:
            st = self.aggregates.schedule.initial(env.tenant, env.schedule_id)
        allowed, max_schedules = self.ctx.tenants.policy(env.tenant)
        max_attempts, min_backoff = self.ctx.tenants.retry_bounds(env.tenant)
        timeout, job_timeouts = self.ctx.tenants.timeouts(env.tenant)
        budget = self.ctx.tenants.storage_budget(env.tenant)
        refusal, budget_wait = self.ctx.storage.result_refusal(budget, env, now)
        tenant = TenantContext(allowed, max_schedules,
                               destinations=self.ctx.tenants.destinations(env.tenant),
                               min_interval=self.ctx.tenants.min_interval(env.tenant),
                               max_attempts=max_attempts, min_backoff=min_backoff,
                               execution_timeout=timeout, job_timeouts=job_timeouts,
                               job_concurrency=self.ctx.tenants.job_concurrency(env.tenant),
                               retry_delay=max(budget_wait, self._retry_delay(
                                   env, now, failing=refusal is not None)),
                               result_refusal=refusal)
        try:
            dec = self.ctx.storage.within(budget, env, now, (
                self._unpooled_claim(env) or self._over_share(env)
                or self.aggregates.schedule.decide(st, env, now, tenant)))
            self._spend_retries(env.tenant, dec, now)
            encoded = self._encode(key, st.tenant, st.schedule_id, dec, cid, now)
        except Exception as exc:  # a decider bug rejects this command only
            self.ctx.stats.decide_errors += 1
            log.exception("decide_failed", command_id=cid, tenant=env.tenant,
                          schedule_id=env.schedule_id, type=env.type)
            self._dead_letter(rec, f"the command could not be decided: "
                              f"{type(exc).__name__}: {exc}", out, env, exc)
            return
        if dec.events and key not in self.states:
            self.states[key] = st
        out.traced(rec, env, dec)  # its decision's span, with tracing on (docs/tracing.md)
        try:
            self._apply(key, st, dec, encoded, cid, now, out)
        except Exception as exc:  # the state is suspect: rebuilt (_decide)
            self.ctx.unapplied[(self.partition, rec.offset)] = exc
            raise Unapplied(f"command {cid}: {type(exc).__name__}: {exc}") from exc
        self.ctx.unapplied_keys.discard(key)
        if isinstance(env.payload, m.AdoptKey):
            self._adopted(key, st, dec)
        elif isinstance(env.payload, m.ClaimRun) and dec.ok:
            self._claimed_directly(st, env.payload.run_id)

    # ------------------------------------------------------------------ routing (§18)

    def _placed_by(self, h: int) -> int | None:
        """The partition count under which a command for the key of hash ``h`` belongs on
        this partition: one of a version of its routing view where it is the key's home,
        else the current one (the record is misplaced); None while no version has this
        partition (``place`` forwards whatever it receives)."""
        view = self.routing
        assert view is not None
        if view.routing is None:
            return None
        for v in view.table.versions:
            if v.home(h) == self.partition:
                return v.partitions
        return view.table.current.partitions

    def _forwarded(self, rec: Record, key: str, h: int,
                   out: Output) -> bool:
        """``place``: a command for a key this partition does not hold, and may not decide,
        is appended in this transaction to the partition that may hold it (True)."""
        view = self.routing
        assert view is not None
        where = view.place(h, key in self.states or key in self.quotas)
        if not isinstance(where, Forward):
            return False
        self.ctx.stats.forwarded += 1
        out.commands.append(OutRecord(topic=self.ctx.topics.commands, key=rec.key, value=rec.value,
                                      partition=where.partition, headers=rec.headers))
        return True

    def _decide_routing(self, rec: Record, env: m.CommandEnvelope,
                        now: datetime, out: Output) -> None:
        """A command of the partition's routing view. A handover moves every key whose home
        in the next version is another partition, in this transaction, ahead of the
        partition's own routing events and of its handover-done commands."""
        view = self.routing
        routing = self.aggregates.routing
        cid = env.command_id
        try:
            dec = routing.decide(view, env, now, OPEN_TENANT)
            encoded = self._encode(ROUTING_KEY, ROUTING_TENANT, ROUTING_ID, dec, cid, now)
        except Exception as exc:  # a decider bug rejects this command only
            self.ctx.stats.decide_errors += 1
            log.exception("routing_decide_failed", command_id=cid, type=env.type)
            self._dead_letter(rec, f"the command could not be decided: "
                              f"{type(exc).__name__}: {exc}", out, env, exc)
            return
        if not dec.ok:
            log.warning("routing_rejected", partition=self.partition, command_id=cid,
                        status=dec.status, reason=dec.reason)
        handover = next((ev for ev in dec.events if isinstance(ev, m.HandedOver)), None)
        if handover is not None:
            after = view
            for ev in dec.events:
                if ev is handover:
                    break
                after = routing.evolve(after, ev)
            self._hand_over(after.table.get(handover.version), now, out)
        if env.reply_to and not cid.startswith(INTERNAL_COMMANDS):
            out.reply_to[cid] = env.reply_to
        self.routing = self._record(routing, ROUTING_KEY, ROUTING_TENANT, ROUTING_ID, view, dec,
                                    encoded, cid, now, out)
        log.info("routing_decided", partition=self.partition, type=env.type,
                 status=dec.status, events=[ev.type for ev in dec.events])

    def _hand_over(self, to: RoutingVersion, now: datetime,
                   out: Output) -> None:
        """Move out every key whose home in ``to`` is another partition: its moved-out event
        here and its adopt command to its new home (``move_out``), in key order."""
        p = self.partition
        for key in sorted(self.states):
            dest = to.home(key_hash(key.encode()))
            if dest == p:
                continue
            st = self.states[key]
            runs = [*(st.runs or {})]
            cid = move_command_id("out", to.version, key)
            dec = self.aggregates.schedule.move_out(st, dest, to.version, p)
            if not dec.ok:  # nothing of it here (a create refused before it was held)
                del self.states[key]
                continue
            encoded = self._encode(key, st.tenant, st.schedule_id, dec, cid, now)
            self._apply(key, st, dec, encoded, cid, now, out)
            del self.states[key]
            self.resuming.discard(key)
            for run_id in runs:  # its workers' credit: they now answer to the new home
                self.dispatch.settle(run_id, None)
            self.ctx.stats.moved_out += 1
        for key in sorted(self.quotas):
            dest = to.home(key_hash(key.encode()))
            if dest == p:
                continue
            qs = self.quotas[key]
            cid = move_command_id("out", to.version, key)
            moved = self.aggregates.quota.move_out(qs, dest, to.version, p)
            self._record(self.aggregates.quota, key, qs.tenant, qs.schedule_id, qs, moved,
                         self._encode(key, qs.tenant, qs.schedule_id, moved, cid, now), cid,
                         now, out)
            del self.quotas[key]
            self.arm_at(key, None)
            self.ctx.stats.moved_out += 1

    def _adopted(self, key: str, st: ScheduleState, dec: ScheduleDecision) -> None:
        """After an adopt command: a key moved in has its runs seated (its timer is armed by
        ``_apply``); a refused adopt is an error of the handover (logged)."""
        if not dec.ok:
            log.error("adopt_refused", partition=self.partition, key=key, status=dec.status,
                      reason=dec.reason)
            return
        self.ctx.stats.moved_in += 1
        self.seat_runs(key, st)

    def seat_runs(self, key: str, st: ScheduleState) -> None:
        """A state that arrived whole (restored, moved in): its READY runs wait for a seat,
        its LEASED ones hold their worker's."""
        for run in (st.runs or {}).values():
            if run.state == "READY":
                self._wait_for_seat(key, st, run)
            elif run.state == "LEASED" and run.worker_id:
                self.dispatch.adopt(run.resource_class, run.worker_id, run.run_id, run.fence)
                self.dispatch.hold(run.run_id, st.tenant)

    def _decide_quota(self, key: str, qs: QuotaState,
                      env: m.CommandEnvelope, now: datetime, out: Output,
                      rec: Record | None = None) -> None:
        """Decide a command (``rec``) or a timer of a tenant's quota aggregate, and apply it:
        its events, the saga commands it sends, and a reply (only to a refused command of
        someone else: the saga's own steps are answered by commands)."""
        cid = env.command_id
        try:
            tenant = TenantContext(max_schedules=self.ctx.tenants.policy(env.tenant)[1])
            dec = self.aggregates.quota.decide(qs, env, now, tenant)
            encoded = self._encode(key, qs.tenant, qs.schedule_id, dec, cid, now)
        except Exception as exc:  # a decider bug rejects this command only
            log.exception("quota_decide_failed", command_id=cid, tenant=env.tenant)
            if rec is None:
                self.ctx.stats.tick_errors += 1
            else:
                self.ctx.stats.decide_errors += 1
                self._dead_letter(rec, f"the command could not be decided: "
                                  f"{type(exc).__name__}: {exc}", out, env, exc)
            return
        if dec.events:
            self.quotas[key] = qs
        self._record(self.aggregates.quota, key, qs.tenant, qs.schedule_id, qs, dec, encoded,
                     cid, now, out)
        if qs.empty and qs.schedule_id != QUOTA_ID:
            self.quotas.pop(key, None)  # a concurrency key nobody holds or waits for
        if isinstance(env.payload, m.AdoptKey) and not dec.ok:
            log.error("adopt_refused", partition=self.partition, key=key, status=dec.status,
                      reason=dec.reason)

    def _record(
        self, aggregate: Aggregate[S, Any, E], key: str, tenant: str, schedule_id: str,
        state: S, dec: Decision[E], encoded: tuple[list[bytes], bytes | None],
        command_id: str, now: datetime, out: Output,
        on_event: Callable[[E], None] | None = None,
    ) -> S:
        """Evolve and record a decision of any aggregate in this transaction: its events
        (``on_event`` sees each once it is folded), the commands it sends, the key's next
        timer and its reply (none for the processor's own commands: timers, assignments,
        moves). Returns the state after the events."""
        first_index = len(out.events)
        values, body = encoded
        snap = self.snap
        if snap is not None and dec.events:
            snap.dirty.add(key)
            snap.events_since += len(dec.events)
        for i, ev in enumerate(dec.events):
            state = aggregate.evolve(state, ev)
            out.event(event_id_for(command_id, i), key, tenant, schedule_id, now, command_id,
                      ev, values[i])
            if on_event is not None:
                on_event(ev)
        self._send(tenant, dec, now, out)
        self.arm_at(key, aggregate.wakeup(state))
        if body is not None:
            answered = dec.answers or command_id  # a held create is answered by the saga
            if dec.answers and dec.answers_client:
                out.reply_to[answered] = dec.answers_client  # its reply wakes that client
            out.reply_new(answered, dec.status, dec.reason, body, tenant, schedule_id,
                          first_index, len(out.events))
            self.pending[answered] = out
        return state

    def _send(self, tenant: str, dec: Decision[Any], now: datetime,
              out: Output) -> None:
        """A decision's commands to other aggregates of the tenant (the quota saga, a moved
        key's adopt command) or to other partitions (handover-done), written to ``commands``
        in this transaction, after the events: to the partition the send names, else to the
        aggregate's home in the version this partition serves (its ``place`` forwards it if
        the key is elsewhere)."""
        view = self.routing
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
            out.commands.append(OutRecord(topic=self.ctx.topics.commands, key=key,
                                          value=codec.encode_command(env), partition=partition))

    def _encode(self, key: str, tenant: str, schedule_id: str, dec: Decision[Any],
                command_id: str, now: datetime) -> tuple[list[bytes], bytes | None]:
        """A decision's events and reply body as bytes, before anything is evolved: a value
        that cannot be encoded (an integer past 64 bits, ...) raises here, with the state
        and the batch untouched."""
        events = [codec.encode_event_fields(event_id_for(command_id, i), m.CURRENT_VERSION, key,
                                            tenant, schedule_id, now, command_id, ev)
                  for i, ev in enumerate(dec.events)]
        if dec.deferred or (command_id.startswith(INTERNAL_COMMANDS) and dec.answers is None):
            return events, None  # the processor's own commands, or answered later (the saga)
        body = dec.body if not dec.field else {**dec.body, "field": dec.field}
        return events, codec.encode_body(body)

    def _apply(
        self, key: str,
        st: ScheduleState,
        dec: ScheduleDecision,
        encoded: tuple[list[bytes], bytes | None],
        command_id: str,
        now: datetime,
        out: Output,
    ) -> None:
        """Evolve and record a schedule's decision (``_record``); a run it makes READY waits
        for a worker's seat, a run it moves on settles the seat that holds it."""

        def ready(ev: m.ScheduleEvent) -> None:
            if isinstance(ev, READY_EVENTS):
                self._ready(key, st, ev)

        self._record(self.aggregates.schedule, key, st.tenant, st.schedule_id, st, dec,
                     encoded, command_id, now, out, ready)
        for ev in dec.events:
            run_id = getattr(ev, "run_id", None)
            if run_id is not None and run_id in self.dispatch.assigned:
                if ev.type == "LeaseExpired":
                    self.dispatch.lapse_holder(run_id)
                self.dispatch.settle(run_id, st.run(run_id))

    def _unverified_offer(self, offer: Offer, partition: int, why: str) -> None:
        """Count a pool offer that seats nobody; log it at most every 10 s per worker."""
        self.ctx.stats.offers_unverified += 1
        mono = time.monotonic()
        if mono - self.ctx.unverified_logged.get(offer.worker_id, float("-inf")) >= 10.0:
            if len(self.ctx.unverified_logged) > 1000:
                self.ctx.unverified_logged.clear()
            self.ctx.unverified_logged[offer.worker_id] = mono
            log.warning("offer_unverified", worker_id=offer.worker_id[:200],
                        pool=(offer.pool or "")[:100], partition=partition, reason=why,
                        total=self.ctx.stats.offers_unverified)

    def _ready(self, key: str, st: ScheduleState, ev: ReadyEvent) -> None:
        """A run became READY: it waits for a worker's seat (``_assign_waiting``)."""
        if isinstance(ev, m.OccurrenceMaterialized) and ev.state != "READY":
            return
        run = st.run(ev.run_id)
        if run is not None and run.state == "READY":
            self._wait_for_seat(key, st, run)

    def _wait_for_seat(self, key: str, st: ScheduleState, run: Any) -> None:
        self.dispatch.wait(run.resource_class, st.tenant, self.ctx.tenants.weight(st.tenant),
                         run.priority, key, run.run_id, run.attempt)

    def _assign_waiting(self, now: datetime, out: Output) -> None:
        """Assign waiting READY runs to seats with credit: the decider's ClaimRun on the
        worker's behalf, and an assignment record on partition p of ``ready.<class>``."""
        d = self.dispatch
        mono = time.monotonic()
        running: Counter[str] | None = None  # counted once a capped tenant's run comes up
        for cls, queue in d.waiting.items():
            kept: list[tuple[str, tuple[int, int, str, str, int]]] = []
            for tenant, entry in queue.entries():
                if not d.has_credit(cls):
                    kept.append((tenant, entry))
                    break
                _, _, key, run_id, attempt = entry
                if key in self.resuming:
                    # its schedule's first Tick since the take-over may coalesce the run
                    # (``resume``): assigned after that Tick, if it is still READY
                    kept.append((tenant, entry))
                    continue
                st = self.states.get(key)
                run = st.run(run_id) if st is not None else None
                if st is None or run is None or run.state != "READY" or run.attempt != attempt:
                    continue  # cancelled, skipped or assigned meanwhile
                if waits_for_permit(run):
                    continue  # back in line when its permit is granted (RunPermitted)
                cap = self.ctx.tenants.max_running(tenant)
                if cap is not None and running is None:
                    running = running_by_tenant(p.dispatch for p in self.ctx.tasks.values())
                if cap is not None and running is not None and running[tenant] >= cap:
                    kept.append((tenant, entry))  # the tenant holds its share: it waits
                    continue
                seat = d.seat_for(cls, run.job.type, mono, self.ctx.tenants.seat_pools(st.tenant))
                if seat is None:
                    kept.append((tenant, entry))  # no live seat takes its job type
                    continue
                cid = f"assign:{self.partition}:{run_id}:{attempt}"
                try:
                    dec = self.aggregates.schedule.decide(
                        st, assign_envelope(st, cid, now, run_id, attempt, seat.worker_id), now,
                        claim_context(self.ctx.tenants, st.tenant))
                    encoded = self._encode(key, st.tenant, st.schedule_id, dec, cid, now)
                except Exception:  # a decider bug must not stop the partition
                    log.exception("assign_decide_failed", partition=self.partition, run_id=run_id)
                    continue  # it stays READY; the next event of its schedule queues it again
                try:
                    self._apply(key, st, dec, encoded, cid, now, out)
                except Exception as exc:  # the state is suspect: rebuilt (_decide)
                    self.ctx.unapplied_keys.add(key)
                    raise Unapplied(
                        f"assignment of {run_id}: {type(exc).__name__}: {exc}") from exc
                if dec.status != "ok":
                    continue
                queue.charge(tenant)
                d.assign(cls, seat, run_id, int(dec.body["fence"]))
                d.hold(run_id, tenant)
                if running is not None:
                    running[tenant] += 1
                out.assignments.append(OutRecord(
                    topic=self.ctx.topics.ready_for(cls, seat.pool), key=run_id.encode(),
                    value=codec.encode_assignment(seat.worker_id, st.tenant, st.schedule_id,
                                                  dec.body),
                    partition=self.partition,
                ))
            for tenant, entry in kept:
                queue.restore(tenant, entry)
        d.prune(mono)

    def _unpooled_claim(self, env: m.CommandEnvelope) -> ScheduleDecision | None:
        """A worker's own ClaimRun of a run whose tenant is bound to worker pools: refused.
        Such runs go only to seats whose offers proved a pool credential; a claim carries no
        proof, so allowing it would hand the run (params included) to any log writer."""
        if not isinstance(env.payload, m.ClaimRun):
            return None
        if None in self.ctx.tenants.seat_pools(env.tenant):
            return None
        return Decision(status="forbidden", body={"run_id": env.payload.run_id},
                        field="worker_id",
                        reason="the tenant's runs go only to workers of its pools, through "
                               "offers that prove a pool credential: a run cannot be claimed")

    def _over_share(self, env: m.CommandEnvelope) -> ScheduleDecision | None:
        """A worker's own ClaimRun (not an assignment) when the tenant already holds its
        ``max_running`` share: refused, as dispatch would not assign it either."""
        cap = self.ctx.tenants.max_running(env.tenant)
        if cap is None or not isinstance(env.payload, m.ClaimRun):
            return None
        held = running_by_tenant(p.dispatch for p in self.ctx.tasks.values())[env.tenant]
        if held < cap:
            return None
        return Decision(status="conflict", body={"run_id": env.payload.run_id},
                        reason=f"the tenant holds its share of running slots "
                               f"(max_running {cap}): the run waits READY")

    def _claimed_directly(self, st: ScheduleState, run_id: str) -> None:
        """A run a worker claimed itself holds the worker's seat and counts against the
        tenant's ``max_running``, like an assigned one (settled when it finishes)."""
        run = st.run(run_id)
        if run is not None and run.state == "LEASED" and run.worker_id:
            self.dispatch.adopt(run.resource_class, run.worker_id, run_id, run.fence)
            self.dispatch.hold(run_id, st.tenant)

    def _retry_delay(self, env: m.CommandEnvelope, now: datetime,
                     failing: bool = False) -> float:
        """The extra wait a retry of ``env`` (a failure, or ``failing``: a result refused)
        gets: the tenant's budget of retries a minute is spent (``AttemptBudget``); 0 for
        other commands or without a ceiling."""
        per_minute = self.ctx.tenants.attempts_per_minute(env.tenant)
        if per_minute is None or not (failing or isinstance(env.payload, m.FailRun)):
            return 0.0
        return self.ctx.attempt_budget.delay(env.tenant, per_minute, now.timestamp())

    def _spend_retries(self, tenant: str, dec: ScheduleDecision, now: datetime) -> None:
        per_minute = self.ctx.tenants.attempts_per_minute(tenant)
        if per_minute is not None:
            for ev in dec.events:
                if isinstance(ev, m.RetryScheduled):
                    self.ctx.attempt_budget.take(tenant, per_minute, now.timestamp())

    def _dead_letter(
        self, rec: Record, reason: str, out: Output,
        env: m.CommandEnvelope | None = None, error: BaseException | None = None,
    ) -> None:
        """Skip ``rec``: its dead letter and an ``invalid`` reply go in this transaction."""
        self.ctx.stats.dead_letters += 1
        command_id = env.command_id if env else sniff_command_id(rec.value)
        out.records.append(self.ctx.dead_letters.record(
            rec, error if error is not None else reason, command_id))
        if command_id:
            out.reply_bytes(command_id, codec.encode_reply(
                m.Reply(command_id=command_id, status="invalid", reason=reason)))
