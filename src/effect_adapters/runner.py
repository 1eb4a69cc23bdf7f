"""The effect runner: performs each EffectIntended through its adapter and records the outcome.

The runner is a member of the consumer group ``<prefix>effects`` on ``events``. Per assigned
partition it works strictly in log order, one intent at a time (partitions run
concurrently). For an intent it resolves the payload (inline, or the staged object through
the result store), calls the adapter of its ``kind``, and records the outcome with a
``RecordEffectOutcome`` command (``succeeded`` | ``failed`` | ``uncertain``). Only after the
processor has answered does the runner move the group offset past the intent.

* ``retry_later`` is handled here: the same intent is tried again with backoff (1s doubling
  to 60s) for up to ``give_up_after`` (1h), then recorded as **uncertain** — the runner
  cannot always tell a destination that never acted from one that did, so an operator
  decides. A ``stop()`` during the wait leaves the intent unrecorded and the offset before it.
* ``uncertain`` makes the processor emit EffectUncertain + ReconciliationRequired: the run
  goes to RECONCILING (``chronolog reconcile list|resolve``). A ``retry`` decision re-emits
  the intent with ``attempt + 1`` under the same effect ID; the runner performs it again.

Restart without repeating a recorded effect. The outcome of an intent is written to the same
partition of ``events`` (same key), after it. When a partition is assigned the runner folds
that partition from the group's committed offset to its end: an intent followed by an
EffectSucceeded/Failed/Uncertain of the same effect ID and delivery attempt is done and is
skipped when it is read again. Intents before the committed offset are done by construction
(the offset only moves past an intent once its outcome is recorded). The outcome command has
a deterministic ID (``effect-outcome:<effect_id>:<attempt>``), so re-sending it after a lost
reply or a crash is answered as a duplicate by the processor.

What remains: an effect performed but not yet recorded when the runner dies IS performed
again by the next owner of the partition. Whether that repeats the external action depends
on the adapter's contract (idempotency key, inbox, Kafka transaction) — for SMTP the
repeat can duplicate a message if the runner died between the server's 250 and the recorded
outcome (a lost reply *during* DATA is uncertain, never resent).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import structlog

from chronolog.log.reading import read_partition
from chronolog.commands.client import Client, ReplyTimeout
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.effect_adapters.base import EffectAdapter, EffectContext, Outcome
from chronolog.effect_adapters.payload import PayloadError, resolve_payload
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog, Record

log = structlog.get_logger("chronolog.effects")

OUTCOME_TYPES = ("EffectSucceeded", "EffectFailed", "EffectUncertain")
GROUP_SUFFIX = "effects"


@dataclass
class RunnerConfig:
    poll_ms: int = 200
    max_records: int = 500
    retry_initial: float = 1.0
    retry_max: float = 60.0
    give_up_after: float = 3600.0
    record_attempts: int = 5
    reply_timeout: float = 30.0


@dataclass
class RunnerStats:
    performed: int = 0
    skipped_done: int = 0
    retries: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


class _Stopping(Exception):
    """The runner is stopping in the middle of an intent: leave it unrecorded."""


class _PartitionFold:
    """Which (effect_id, delivery attempt) pairs of one partition already have an outcome."""

    def __init__(self) -> None:
        self.last_attempt: dict[str, int] = {}
        self.done: set[tuple[str, int]] = set()

    def apply(self, env: m.EventEnvelope) -> None:
        p = env.payload
        if isinstance(p, m.EffectIntended):
            self.last_attempt[p.effect_id] = p.attempt
        elif env.type in OUTCOME_TYPES:
            attempt = self.last_attempt.get(p.effect_id)  # type: ignore[union-attr]
            if attempt is not None:
                self.done.add((p.effect_id, attempt))  # type: ignore[union-attr]


def default_adapters(
    log_: EventLog, member_id: str, database_url: str | None = None
) -> dict[str, EffectAdapter]:
    from chronolog.effect_adapters.kafka_topic import KafkaEffectAdapter
    from chronolog.effect_adapters.postgres_inbox import PostgresInboxEffectAdapter
    from chronolog.effect_adapters.smtp import EmailEffectAdapter
    from chronolog.effect_adapters.webhook import WebhookEffectAdapter

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
    ) -> None:
        self.log = log_
        self.topics = log_.topics
        self.member_id = member_id
        self.group = f"{self.topics.prefix}{GROUP_SUFFIX}"
        self.adapters: dict[str, EffectAdapter] = dict(
            adapters if adapters is not None else default_adapters(log_, member_id, database_url))
        self.result_store = result_store
        self.config = config or RunnerConfig()
        self.stats = RunnerStats()
        self.client = Client(log_, principal=f"effects:{member_id}",
                             reply_timeout=self.config.reply_timeout,
                             client_id=f"effects-{member_id}")
        self._folds: dict[int, _PartitionFold] = {}
        self._stopping = asyncio.Event()
        self._consumer: Any = None
        self.ready = asyncio.Event()  # set once partitions are assigned and folded
        self.dead_letters = DeadLetters(log_, "effects")

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Finish the intent at hand (or leave it unrecorded if it is waiting) and leave."""
        self._stopping.set()

    async def run(self) -> None:
        await self.client.start()
        self._consumer = self.log.group_consumer(
            self.group, [self.topics.events], f"effects-{self.member_id}",
            on_assigned=self._on_assigned, on_revoked=self._on_revoked)
        await self._consumer.start()
        try:
            while not self._stopping.is_set():
                await self.step()
        except _Stopping:
            pass
        finally:
            with contextlib.suppress(Exception):
                await self._consumer.close()
            await self.client.close()
            for adapter in self.adapters.values():
                with contextlib.suppress(Exception):
                    await adapter.close()

    async def step(self) -> None:
        records = await self._consumer.getmany(timeout_ms=self.config.poll_ms,
                                               max_records=self.config.max_records)
        by_partition: dict[int, list[Record]] = {}
        for rec in records:
            if rec.topic == self.topics.events:
                by_partition.setdefault(rec.partition, []).append(rec)
        if not by_partition:
            return
        results = await asyncio.gather(
            *(self._partition(p, recs) for p, recs in by_partition.items()),
            return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:
            if not isinstance(err, _Stopping):
                raise err
        if errors:
            raise _Stopping()

    # ------------------------------------------------------------------ assignment

    async def _on_assigned(self, tps: set[tuple[str, int]]) -> None:
        for topic, p in sorted(tps):
            if topic != self.topics.events:
                continue
            start = await self.log.committed(self.group, topic, p) or 0
            fold = _PartitionFold()
            offset = start
            async for recs in read_partition(self.log, topic, p, start):
                for rec in recs:
                    env = _decoded(rec)
                    if env is not None:  # a poison record is dead-lettered when consumed
                        fold.apply(env)
                offset = recs[-1].offset + 1
            self._folds[p] = fold
            self._consumer.seek(topic, p, start)
            log.info("effects_partition_assigned", partition=p, from_offset=start,
                     folded_to=offset, done=len(fold.done))
        self.ready.set()

    async def _on_revoked(self, tps: set[tuple[str, int]]) -> None:
        for topic, p in tps:
            if topic == self.topics.events:
                self._folds.pop(p, None)

    # ------------------------------------------------------------------ work

    async def _partition(self, p: int, recs: list[Record]) -> None:
        fold = self._folds.get(p)
        if fold is None:
            return  # revoked meanwhile
        next_offset: int | None = None
        try:
            for rec in recs:
                try:
                    env = codec.decode_event(rec.value)
                except codec.DecodeError as exc:  # not an event: recorded, then passed
                    await self.dead_letters.put(rec, exc)
                    next_offset = rec.offset + 1
                    continue
                fold.apply(env)
                if isinstance(env.payload, m.EffectIntended):
                    intent = env.payload
                    if (intent.effect_id, intent.attempt) in fold.done:
                        self.stats.skipped_done += 1
                    else:
                        await self._perform(p, rec, env, intent)
                        fold.done.add((intent.effect_id, intent.attempt))
                next_offset = rec.offset + 1
        finally:
            if next_offset is not None and p in self._folds:
                await self._consumer.commit({(self.topics.events, p): next_offset})

    def _outcome_envelope(
        self, env: m.EventEnvelope, intent: m.EffectIntended, status: str,
        evidence: dict[str, Any],
    ) -> m.CommandEnvelope:
        return self.client.envelope(
            env.tenant, env.schedule_id,
            m.RecordEffectOutcome(run_id=intent.run_id, effect_id=intent.effect_id,
                                  outcome=status, evidence=evidence),  # type: ignore[arg-type]
            command_id=f"effect-outcome:{intent.effect_id}:{intent.attempt}")

    async def _perform(
        self, p: int, rec: Record, env: m.EventEnvelope, intent: m.EffectIntended
    ) -> None:
        adapter = self.adapters.get(intent.kind)
        ctx = EffectContext(
            tenant=env.tenant, schedule_id=env.schedule_id, intended_at=env.at,
            runner_id=self.member_id, group=self.group, events_topic=rec.topic, partition=p,
            offset=rec.offset,
            outcome_envelope=lambda s, ev: self._outcome_envelope(env, intent, s, ev))
        started = time.monotonic()
        delay = self.config.retry_initial
        while True:
            outcome = await self._attempt(adapter, intent, ctx)
            if outcome.status != "retry_later":
                break
            waited = time.monotonic() - started
            if waited >= self.config.give_up_after:
                outcome = Outcome.uncertain(
                    reason=f"gave up after {waited:.0f}s of retry_later; the destination may "
                    "or may not have acted", last=outcome.evidence)
                break
            self.stats.retries += 1
            pause = outcome.retry_after if outcome.retry_after is not None else delay
            log.info("effect_retry_later", effect_id=intent.effect_id, wait_s=pause,
                     evidence=outcome.evidence)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), pause)
            if self._stopping.is_set():
                raise _Stopping()
            delay = min(self.config.retry_max, delay * 2)
        self.stats.performed += 1
        evidence = {**outcome.evidence, "runner": self.member_id,
                    "effect_attempt": intent.attempt}
        await self._record(self._outcome_envelope(env, intent, outcome.status, evidence))
        self.stats.outcomes[outcome.status] = self.stats.outcomes.get(outcome.status, 0) + 1
        log.info("effect_outcome", effect_id=intent.effect_id, run_id=intent.run_id,
                 kind=intent.kind, outcome=outcome.status, recorded_in_txn=outcome.recorded)

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
        except Exception as exc:  # noqa: BLE001 - an adapter bug: we cannot know what happened
            log.exception("effect_adapter_error", effect_id=intent.effect_id)
            return Outcome.uncertain(reason="adapter raised; the effect may have happened",
                                     error=f"{type(exc).__name__}: {exc}"[:500])

    async def _record(self, env: m.CommandEnvelope) -> None:
        """Send the outcome command (same ID on every try) until the processor answers."""
        for i in range(self.config.record_attempts):
            try:
                reply = await self.client.send(env)
            except ReplyTimeout:
                log.warning("effect_outcome_reply_timeout", command_id=env.command_id, attempt=i)
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
