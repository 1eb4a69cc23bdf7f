"""The effect runner: performs each EffectIntended through its adapter and records the outcome.

The runner is a member of the consumer group ``<prefix>effects`` on ``events``. For an intent
it resolves the effect's destination from the tenants file (``chronolog.destinations``): a
destination the tenant was not granted, or one this node must refuse (its own database,
chronolog's topics), is recorded as **failed** with the reason, nothing attempted. It then
resolves the payload (inline, or the staged object through the result store), calls the
adapter of its ``kind`` with the operator's settings plus the tenant's own options, and
records the outcome with a ``RecordEffectOutcome`` command (``succeeded`` | ``failed`` |
``uncertain``).

Isolation. Intents are read in log order and handed to one *lane* per destination (tenant,
destination name). A lane performs its effects one at a time, in order; lanes run
concurrently, so a failing or slow destination delays only its own effects. Each lane has a
circuit breaker: after ``breaker_failures`` consecutive ``retry_later`` outcomes it opens, and
its effects are postponed (not failed) until ``breaker_cooldown`` has passed; then one effect
probes it (half-open): success closes it, another failure opens it again.

* ``retry_later`` is handled in the lane: the same intent is tried again with backoff (1s
  doubling to 60s) for up to the give-up time (the destination's ``give_up_after``, default
  1h, or the effect's own if shorter), then recorded as **uncertain** — the runner cannot
  always tell a destination that never acted from one that did, so an operator decides. A
  ``stop()`` during the wait leaves the intent unrecorded and the offset before it.
* ``uncertain`` makes the processor emit EffectUncertain + ReconciliationRequired: the run
  goes to RECONCILING (``chronolog reconcile list|resolve``). A ``retry`` decision re-emits
  the intent with ``attempt + 1`` under the same effect ID; the runner performs it again.

Progress. Intents complete out of log order, so the group offset of a partition moves to the
oldest intent not yet recorded (or past everything read when none is open): an intent is
never skipped by a restart, and one still open holds the offset (not the work) of the
partition. At most ``max_open`` intents are open at once; past that the runner stops reading
until some finish.

Restart without repeating a recorded effect. The outcome of an intent is written to the same
partition of ``events`` (same key), after it. When a partition is assigned the runner folds
that partition from the group's committed offset to its end: an intent followed by an
EffectSucceeded/Failed/Uncertain of the same effect ID and delivery attempt is done and is
skipped when it is read again. The outcome command has a deterministic ID
(``effect-outcome:<effect_id>:<attempt>``), so re-sending it after a lost reply or a crash is
answered as a duplicate by the processor.

What remains: an effect performed but not yet recorded when the runner dies IS performed
again by the next owner of the partition, and so is an effect recorded after an older intent
of its partition that was still open (the offset could not move past it). Whether that
repeats the external action depends on the adapter's contract (idempotency key, inbox, Kafka
transaction) — for SMTP the repeat can duplicate a message if the runner died between the
server's 250 and the recorded outcome (a lost reply *during* DATA is uncertain, never resent).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from chronolog import destinations as dst
from chronolog.backoff import Backoff
from chronolog.client import Client, ReplyTimeout
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.effect_adapters.base import EffectAdapter, EffectContext, Outcome
from chronolog.effect_adapters.kafka_topic import KafkaEffectAdapter
from chronolog.effect_adapters.payload import PayloadError, resolve_payload
from chronolog.effect_adapters.postgres_inbox import PostgresInboxEffectAdapter
from chronolog.effect_adapters.smtp import EmailEffectAdapter
from chronolog.effect_adapters.webhook import WebhookEffectAdapter
from chronolog.lifecycle import unavailable
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog, Record
from chronolog.log.reading import read_partition
from chronolog.telemetry import tracing
from chronolog.wakeup import wait_within

log = structlog.get_logger("chronolog.effects")

OUTCOME_TYPES = ("EffectSucceeded", "EffectFailed", "EffectUncertain")
# between tries to send an outcome while the log is away
RECORD_BACKOFF = Backoff(first=0.5, cap=5.0)


@dataclass
class RunnerConfig:
    poll_ms: int = 200
    max_records: int = 500
    retry_initial: float = 1.0
    retry_max: float = 60.0
    record_attempts: int = 5
    reply_timeout: float = 30.0
    max_open: int = 10_000  # intents read but not yet recorded, over all partitions
    stop_grace: float = 30.0  # how long stop() lets an effect in progress finish


@dataclass
class RunnerStats:
    performed: int = 0
    skipped_done: int = 0
    retries: int = 0
    postponed: int = 0  # waits for an open circuit breaker
    outcomes: dict[str, int] = field(default_factory=dict)


class Breaker:
    """A destination's circuit breaker: open after ``failures`` consecutive failures, one
    probe (half-open) after ``cooldown`` seconds."""

    def __init__(self, failures: int, cooldown: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = failures
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.open_until: float | None = None

    @property
    def state(self) -> str:
        if self.open_until is None:
            return "closed"
        return "open" if self.clock() < self.open_until else "half-open"

    def wait(self) -> float:
        """Seconds until an attempt may be made (0: closed, or half-open for a probe)."""
        if self.open_until is None:
            return 0.0
        return max(0.0, self.open_until - self.clock())

    def record(self, available: bool) -> None:
        """After an attempt: ``available`` unless the outcome was retry_later. A failed
        probe (half-open) opens the breaker again at once."""
        if available:
            self.failures, self.open_until = 0, None
            return
        self.failures += 1
        if self.failures >= self.threshold:
            self.open_until = self.clock() + self.cooldown


@dataclass
class _Job:
    partition: int
    rec: Record
    env: m.EventEnvelope
    intent: m.EffectIntended
    fold: PartitionFold


class _Lane:
    """The effects of one destination of one tenant, performed one at a time, in order."""

    def __init__(self, key: tuple[str, str], breaker: Breaker) -> None:
        self.key = key
        self.breaker = breaker
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.busy = False
        self.task: asyncio.Task[None] | None = None


class _Stopping(Exception):
    """The runner is stopping in the middle of an intent: leave it unrecorded."""


class PartitionFold:
    """Which (effect_id, delivery attempt) pairs of one partition already have an outcome."""

    def __init__(self) -> None:
        self.last_attempt: dict[str, int] = {}
        self.done: set[tuple[str, int]] = set()

    def apply(self, env: m.EventEnvelope) -> None:
        p = env.payload
        if isinstance(p, m.EffectIntended):
            self.last_attempt[p.effect_id] = p.attempt
        elif env.type in OUTCOME_TYPES:
            attempt = self.last_attempt.get(p.effect_id)  # type: ignore[union-attr, arg-type]
            if attempt is not None:
                self.done.add((p.effect_id, attempt))  # type: ignore[union-attr, arg-type]


def resume_offset(folded_to: int, intents: Mapping[tuple[str, int], int],
                  done: set[tuple[str, int]], poison: int | None) -> int:
    """Where a runner reads a partition from after folding it up to ``folded_to``: the first
    intent there without an outcome (or record that does not decode: it is dead-lettered
    when read), else ``folded_to`` — what comes before has nothing left to do, and reading it
    again costs a restart as much as the fold (a node that stops before its runner caught up
    read the same events twice at every start)."""
    open_at = [off for key, off in intents.items() if key not in done]
    if poison is not None:
        open_at.append(poison)
    return min(open_at, default=folded_to)


def default_adapters(
    log_: EventLog, member_id: str, database_url: str | None = None
) -> dict[str, EffectAdapter]:
    """The adapters of a runner; ``database_url`` is the node's own database (refused)."""
    return {
        "webhook": WebhookEffectAdapter(),
        "email": EmailEffectAdapter(),
        "postgres": PostgresInboxEffectAdapter(database_url),
        "kafka": KafkaEffectAdapter(log_, member_id),
    }


class EffectRunner:
    """Consumes ``events`` in the ``<prefix>effects`` group and performs effect intents."""

    def __init__(
        self,
        log_: EventLog,
        member_id: str,
        adapters: Mapping[str, EffectAdapter] | None = None,
        database_url: str | None = None,
        result_store: Any | None = None,
        config: RunnerConfig | None = None,
        tenants: Any | None = None,
    ) -> None:
        self.log = log_
        self.topics = log_.topics
        self.member_id = member_id
        self.group = self.topics.effects_group
        self.adapters: dict[str, EffectAdapter] = dict(
            adapters if adapters is not None else default_adapters(log_, member_id, database_url))
        self.result_store = result_store
        self.config = config or RunnerConfig()
        self.stats = RunnerStats()
        self.client = self._new_client()  # a new one for every run()
        # the tenants registry (``chronolog.tenants.Tenants``): where destinations come from;
        # without one no destination exists and every effect is refused
        self.tenants = tenants
        self.database_url = database_url
        self._folds: dict[int, PartitionFold] = {}
        self._open: dict[int, dict[int, None]] = {}  # partition -> offsets of open intents
        self._read_to: dict[int, int] = {}  # partition -> the offset after the last read
        self._committed: dict[int, int] = {}
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._progress = asyncio.Event()
        self._failure: BaseException | None = None
        self._stop_requested = asyncio.Event()  # stop() was called: no run() any more
        self._stopping = asyncio.Event()  # the current run() ends (stop, or a lane failed)
        self._running = False
        self._consumer: Any = None
        self.ready = asyncio.Event()  # set once partitions are assigned and folded
        self.dead_letters = DeadLetters(log_, "effects")

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Finish the intent at hand (or leave it unrecorded if it is waiting) and leave."""
        self._stop_requested.set()
        self._stopping.set()

    def readiness(self) -> tuple[bool, str]:
        """Ready: its consumer is in the effects group and every partition assigned to it is
        folded (``chronolog.readiness``); else what it waits for."""
        consumer = self._consumer
        if self._stop_requested.is_set():
            return False, "stopping"
        if consumer is None or not self._running:
            return False, "starting"
        if not consumer.joined():
            return False, "not in the effects group (joining, or the log is away)"
        assigned = sorted(p for t, p in consumer.assignment() if t == self.topics.events)
        waiting = [p for p in assigned if p not in self._folds]
        if waiting:
            return False, f"folding partitions {waiting}"
        return True, (f"consumes partitions {assigned}" if assigned
                      else "in the effects group, consumes no partition")

    async def run(self) -> None:
        """Perform intents until ``stop()``. A failure ends it, raised (a lane that cannot
        record an outcome, the log away at a rebalance); ``run`` may be called again then:
        it folds its partitions from the committed offsets again (``serve_log`` does, while
        the log is away)."""
        if self._stop_requested.is_set():
            return
        self._stopping = asyncio.Event()  # this run's; stop() sets it too
        self._failure = None
        for state in (self._folds, self._open, self._read_to, self._committed):
            state.clear()
        self.client = self._new_client()
        self._consumer = None
        self._running = True
        failure: BaseException | None = None
        try:
            await self.client.start()
            self._consumer = self.log.group_consumer(
                self.group, [self.topics.events], f"effects-{self.member_id}",
                on_assigned=self._on_assigned, on_revoked=self._on_revoked)
            await self._consumer.start()
            while not self._stopping.is_set():
                await self.step()
        except _Stopping:
            pass
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._running = False
            self._stopping.set()
            await self._close_lanes()
            if self._consumer is not None:
                with contextlib.suppress(Exception):
                    await self._commit_progress()
                with contextlib.suppress(Exception):
                    await self._consumer.close()
            await self.client.close()
            failure = failure or self._failure
            if failure is None or not unavailable(failure):  # else run() may be called again
                for adapter in self.adapters.values():
                    with contextlib.suppress(Exception):
                        await adapter.close()
        if self._failure is not None:  # a lane could not record an outcome: fail loudly
            raise self._failure

    def _new_client(self) -> Client:
        return Client(self.log, principal=f"effects:{self.member_id}",
                      reply_timeout=self.config.reply_timeout,
                      client_id=f"effects-{self.member_id}")

    async def step(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self.open_intents >= self.config.max_open:
            await self._wait_for_room()
            return
        records = await self._consumer.getmany(timeout_ms=self.config.poll_ms,
                                               max_records=self.config.max_records)
        by_partition: dict[int, list[Record]] = {}
        for rec in records:
            if rec.topic == self.topics.events:
                by_partition.setdefault(rec.partition, []).append(rec)
        for p, recs in by_partition.items():
            await self._partition(p, recs)
        await self._commit_progress()

    @property
    def open_intents(self) -> int:
        """Intents read and not yet recorded, over all partitions."""
        return sum(len(o) for o in self._open.values())

    async def _wait_for_room(self) -> None:
        """Too many intents open: read nothing new until some finish. The consumer is still
        polled (a Kafka member that stops polling leaves its group), and what it returns is
        put back (seek) to be read again."""
        self._progress.clear()
        records = await self._consumer.getmany(timeout_ms=0, max_records=1)
        for rec in records:
            self._consumer.seek(rec.topic, rec.partition, rec.offset)
        with contextlib.suppress(asyncio.TimeoutError):
            await wait_within(self._progress.wait(), self.config.poll_ms / 1000)
        await self._commit_progress()

    async def _close_lanes(self) -> None:
        deadline = time.monotonic() + self.config.stop_grace
        for lane in list(self._lanes.values()):
            if lane.task is None:
                continue
            if lane.busy:  # let the effect at hand finish (or leave it unrecorded)
                with contextlib.suppress(Exception):
                    await wait_within(asyncio.shield(lane.task),
                                           max(0.0, deadline - time.monotonic()))
            lane.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await lane.task
        self._lanes.clear()

    # ------------------------------------------------------------------ assignment

    async def _on_assigned(self, tps: set[tuple[str, int]]) -> None:
        try:
            await self._fold_assigned(tps)
        except Exception as exc:
            # a partition left unfolded would have its intents passed over: this run ends
            # (the consumer may swallow a callback's error) and run() starts over
            self._failure = exc
            self._stopping.set()
            raise

    async def _fold_assigned(self, tps: set[tuple[str, int]]) -> None:
        for topic, p in sorted(tps):
            if topic != self.topics.events:
                continue
            start = await self.log.committed(self.group, topic, p) or 0
            fold = PartitionFold()
            offset = start
            intents: dict[tuple[str, int], int] = {}  # (effect, attempt) -> its offset
            poison: int | None = None  # the first record that does not decode
            async for recs in read_partition(self.log, topic, p, start):
                for rec in recs:
                    env = _decoded(rec)
                    if env is None:  # a poison record is dead-lettered when consumed
                        poison = rec.offset if poison is None else poison
                        continue
                    fold.apply(env)
                    if isinstance(env.payload, m.EffectIntended):
                        intents.setdefault((env.payload.effect_id, env.payload.attempt),
                                           rec.offset)
                offset = recs[-1].offset + 1
            resume = resume_offset(offset, intents, fold.done, poison)
            self._folds[p] = fold
            self._open[p] = {}
            self._committed[p] = start
            self._read_to[p] = resume  # committed with the next progress
            self._consumer.seek(topic, p, resume)
            log.info("effects_partition_assigned", partition=p, from_offset=start,
                     folded_to=offset, resume_at=resume, done=len(fold.done))
        self.ready.set()

    async def _on_revoked(self, tps: set[tuple[str, int]]) -> None:
        for topic, p in tps:
            if topic == self.topics.events:
                with contextlib.suppress(Exception):  # keep what is done; best effort
                    await self._commit_progress(only=p)
                self._folds.pop(p, None)
                self._open.pop(p, None)
                self._read_to.pop(p, None)
                self._committed.pop(p, None)

    # ------------------------------------------------------------------ work

    async def _partition(self, p: int, recs: list[Record]) -> None:
        """Fold the partition's records and hand each open intent to its destination's lane."""
        fold = self._folds.get(p)
        if fold is None:
            return  # revoked meanwhile
        for rec in recs:
            try:
                env = codec.decode_event(rec.value)
            except codec.DecodeError as exc:  # not an event: recorded, then passed
                await self.dead_letters.put(rec, exc)
                self._read_to[p] = rec.offset + 1
                continue
            fold.apply(env)
            if isinstance(env.payload, m.EffectIntended):
                intent = env.payload
                if (intent.effect_id, intent.attempt) in fold.done:
                    self.stats.skipped_done += 1
                else:
                    self._open[p][rec.offset] = None
                    self._lane(env.tenant, intent).queue.put_nowait(
                        _Job(p, rec, env, intent, fold))
            self._read_to[p] = rec.offset + 1

    # ------------------------------------------------------------------ progress

    def _safe_offset(self, p: int, excluding: int | None = None) -> int | None:
        """Where the partition's group offset may be: the oldest open intent, or all read."""
        open_ = [o for o in self._open.get(p, {}) if o != excluding]
        return min(open_) if open_ else self._read_to.get(p)

    def _reserve_commit(self, p: int, offset: int) -> int:
        """The offset a transactional adapter commits with the intent at ``offset``."""
        target = self._safe_offset(p, excluding=offset)
        target = offset + 1 if target is None else target
        self._committed[p] = max(self._committed.get(p, 0), target)
        return target

    async def _commit_progress(self, only: int | None = None) -> None:
        moves = {}
        for p in ([only] if only is not None else list(self._folds)):
            target = self._safe_offset(p)
            if target is not None and target > self._committed.get(p, -1):
                moves[(self.topics.events, p)] = target
        if moves:
            await self._consumer.commit(moves)
            for (_t, p), target in moves.items():
                self._committed[p] = target

    def _settle(self, job: _Job) -> None:
        if self._folds.get(job.partition) is job.fold:  # still ours (not revoked meanwhile)
            job.fold.done.add((job.intent.effect_id, job.intent.attempt))
            self._open[job.partition].pop(job.rec.offset, None)
        self._progress.set()

    # ------------------------------------------------------------------ lanes

    def _lane(self, tenant: str, intent: m.EffectIntended) -> _Lane:
        dest = self._destination(tenant, intent)[0]
        # the refused ones of a tenant share one lane: they are only recorded as failed
        key = (tenant, intent.destination if dest is not None else "<refused>")
        lane = self._lanes.get(key)
        if lane is None:
            breaker = (Breaker(dest.breaker_failures, dest.breaker_cooldown) if dest is not None
                       else Breaker(1, 0.0))
            lane = self._lanes[key] = _Lane(key, breaker)
            lane.task = asyncio.create_task(self._lane_loop(lane),
                                            name=f"effects-lane-{key[0]}-{key[1]}")
        return lane

    async def _lane_loop(self, lane: _Lane) -> None:
        while not self._stopping.is_set():
            job = await lane.queue.get()
            if self._folds.get(job.partition) is not job.fold:
                continue  # the partition was revoked: its next owner performs it
            lane.busy = True
            try:
                await self._perform(lane, job)
            except _Stopping:
                return
            except Exception as exc:  # noqa: BLE001 - the runner stops (see step)
                self._failure = exc
                self._stopping.set()
                return
            finally:
                lane.busy = False
            self._settle(job)

    def _destination(
        self, tenant: str, intent: m.EffectIntended
    ) -> tuple[dst.AnyDestination | None, str]:
        """The destination an intent names, or None and why it is refused."""
        if not intent.destination:
            return None, "the effect names no destination"
        dest = self.tenants.destination(tenant, intent.destination) if self.tenants else None
        if dest is None:
            return None, (f"destination '{intent.destination}' is not granted to tenant "
                          f"'{tenant}'")
        if dest.kind != intent.kind:
            return None, f"destination '{intent.destination}' is not a {intent.kind} destination"
        # no lookups on the event loop: the postgres adapter resolves names before connecting
        why = dst.refusal(dest, self.topics, self.database_url, resolve=False)
        if why is not None:
            return None, f"destination '{intent.destination}' refused: {why}"
        return dest, ""

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await wait_within(self._stopping.wait(), seconds)
        if self._stopping.is_set():
            raise _Stopping()

    def outcome_envelope(
        self, env: m.EventEnvelope, intent: m.EffectIntended, status: str,
        evidence: dict[str, Any],
    ) -> m.CommandEnvelope:
        """The RecordEffectOutcome command for ``intent`` (read in ``env``): its command ID
        is the same for every send of this delivery attempt's outcome."""
        return self.client.envelope(
            env.tenant, env.schedule_id,
            m.RecordEffectOutcome(run_id=intent.run_id, effect_id=intent.effect_id,
                                  outcome=status, evidence=evidence),  # type: ignore[arg-type]
            command_id=f"effect-outcome:{intent.effect_id}:{intent.attempt}")

    async def _perform(self, lane: _Lane, job: _Job) -> None:
        if not tracing.enabled:
            await self._perform_effect(lane, job)
            return
        env, intent = job.env, job.intent
        with tracing.effect_span(tenant=env.tenant, schedule_id=env.schedule_id,
                                 run_id=intent.run_id, effect_id=intent.effect_id,
                                 kind=intent.kind, destination=intent.destination,
                                 attempt=intent.attempt) as span:
            # current while it is delivered and recorded: a webhook's traceparent and the
            # outcome command's record name it
            tracing.effect_outcome(span, await self._perform_effect(lane, job))

    async def _perform_effect(self, lane: _Lane, job: _Job) -> str:
        """Perform an intent and record its outcome; the outcome's status."""
        env, intent, rec, p = job.env, job.intent, job.rec, job.partition
        dest, refused = self._destination(env.tenant, intent)
        ctx = EffectContext(
            tenant=env.tenant, schedule_id=env.schedule_id, intended_at=env.at,
            runner_id=self.member_id, group=self.group, events_topic=rec.topic, partition=p,
            offset=rec.offset,
            outcome_envelope=lambda s, ev: self.outcome_envelope(env, intent, s, ev),
            commit_to=lambda: self._reserve_commit(p, rec.offset))
        if dest is None:
            outcome = Outcome.failed(reason=refused, destination=intent.destination)
        else:
            outcome = await self._until_settled(lane, dest, intent, ctx)
        self.stats.performed += 1
        evidence = {**outcome.evidence, "runner": self.member_id,
                    "effect_attempt": intent.attempt}
        await self._record(self.outcome_envelope(env, intent, outcome.status, evidence))
        self.stats.outcomes[outcome.status] = self.stats.outcomes.get(outcome.status, 0) + 1
        log.info("effect_outcome", effect_id=intent.effect_id, run_id=intent.run_id,
                 kind=intent.kind, destination=intent.destination, outcome=outcome.status,
                 recorded_in_txn=outcome.recorded)
        return outcome.status

    async def _until_settled(
        self, lane: _Lane, dest: dst.AnyDestination, intent: m.EffectIntended, ctx: EffectContext
    ) -> Outcome:
        """Attempt until the outcome is not retry_later, the breaker permitting, or give up."""
        adapter = self.adapters.get(intent.kind)
        effective = intent.model_copy(
            update={"config": dst.adapter_config(dest, intent.config)})
        give_up = dst.give_up_after(dest, intent.config)
        started = time.monotonic()
        waits = Backoff(first=self.config.retry_initial, cap=self.config.retry_max).delays()
        last: Outcome | None = None
        while True:
            blocked = lane.breaker.wait()
            if blocked > 0:  # open: postponed, not failed
                if time.monotonic() + blocked - started >= give_up:
                    return Outcome.uncertain(
                        reason=f"gave up after {give_up:g}s: the destination's circuit is open",
                        last=last.evidence if last else None, breaker="open")
                self.stats.postponed += 1
                log.info("effect_postponed", effect_id=intent.effect_id,
                         destination=intent.destination, wait_s=round(blocked, 3))
                await self._pause(blocked)
                continue
            outcome = await self._attempt(adapter, effective, ctx)
            lane.breaker.record(outcome.status != "retry_later")
            if outcome.status != "retry_later":
                return outcome
            last = outcome
            waited = time.monotonic() - started
            if waited >= give_up:
                return Outcome.uncertain(
                    reason=f"gave up after {waited:.0f}s of retry_later; the destination may "
                    "or may not have acted", last=outcome.evidence)
            self.stats.retries += 1
            delay = next(waits)
            pause = outcome.retry_after if outcome.retry_after is not None else delay
            pause = min(pause, max(0.0, give_up - waited))
            log.info("effect_retry_later", effect_id=intent.effect_id, wait_s=pause,
                     destination=intent.destination, breaker=lane.breaker.state)
            await self._pause(pause)

    async def _attempt(
        self, adapter: EffectAdapter | None, intent: m.EffectIntended, ctx: EffectContext
    ) -> Outcome:
        if adapter is None:
            return Outcome.failed(reason=f"no adapter for effect kind {intent.kind!r}")
        try:
            payload = await resolve_payload(intent, self.result_store)
        except PayloadError as exc:
            if exc.permanent:
                return Outcome.failed(reason=f"result unreadable: {exc}")
            return Outcome.retry_later(reason=f"result not readable yet: {exc}")
        try:
            return await adapter.perform(intent, payload, ctx)
        except Exception as exc:  # an adapter bug: we cannot know what happened
            log.exception("effect_adapter_error", effect_id=intent.effect_id)
            return Outcome.uncertain(reason="adapter raised; the effect may have happened",
                                     error=f"{type(exc).__name__}: {exc}"[:500])

    async def _record(self, env: m.CommandEnvelope) -> None:
        """Send the outcome command (same ID on every try) until the processor answers:
        ``record_attempts`` times without a reply, and for as long as the log is away (it
        cannot be sent then; an outcome already known is not dropped for an outage)."""
        i = away = 0
        while i < self.config.record_attempts:
            try:
                reply = await self.client.send(env)
            except ReplyTimeout:
                log.warning("effect_outcome_reply_timeout", command_id=env.command_id, attempt=i)
                i += 1
                continue
            except Exception as exc:
                if not unavailable(exc):
                    raise
                away += 1
                if away == 1:
                    log.warning("effect_outcome_waiting_for_log", command_id=env.command_id,
                                error=f"{type(exc).__name__}: {exc}"[:300])
                await self._pause(RECORD_BACKOFF.delay(away))
                continue
            if reply.status != "ok":
                log.warning("effect_outcome_rejected", command_id=env.command_id,
                            status=reply.status, reason=reply.reason)
            return
        raise RuntimeError(f"no reply to {env.command_id} after "
                           f"{self.config.record_attempts} tries; stopping unrecorded")


def _decoded(rec: Record) -> m.EventEnvelope | None:
    """The event in ``rec``, or None when it is not one."""
    try:
        return codec.decode_event(rec.value)
    except codec.DecodeError:
        return None
