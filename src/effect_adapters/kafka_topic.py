"""Kafka topic effects: the result published to a topic, keyed by the effect ID.

On a **Kafka** log the adapter is ``transactional``. One Kafka transaction of a
transactional producer with ``transactional_id = <prefix>effects-<member>`` (one per effect
runner instance; a restarted instance with the same member ID fences its zombie) holds:

1. the result record on the destination's ``topic`` (the operator's; chronolog's own topics
   under the prefix are refused, except ``<prefix>effects.out``), key = effect ID,
   value = ``{effect_id, run_id, attempt, checksum, result}``, headers ``effect_id``/``run_id``;
2. the runner's ``RecordEffectOutcome(succeeded)`` command (a deterministic command ID, so
   the runner's later re-send of it is answered as a duplicate);
3. the runner's consumer-group offset on ``events`` past the intent
   (``send_offsets_to_transaction``).

Either all three become visible to ``read_committed`` readers or none does: a crash before
the commit publishes nothing (the intent is re-read and retried), a crash after it leaves an
offset past the intent and an outcome command the processor will decide. A read_committed
consumer of the topic sees the result once. Caveat: exactly once holds while one runner
instance owns the intent's partition; if the group rebalances the partition to another
instance while a transaction is open, the new owner may read the offset from before it and
publish again (the effect ID key lets a consumer drop such a duplicate).

On the **embedded SQLite** log the adapter appends the record to the same-named topic of
the log (created on first use). That append is atomic but is not tied to the runner's
progress: a crash between the append and the recorded outcome appends it again on restart.
That path is **at-least-once**; consumers deduplicate by the record key (the effect ID).

A destination with its own ``bootstrap`` publishes to **another Kafka cluster** with an
idempotent producer (acks=all), outside any transaction of the node: **at-least-once** too
(a send whose acknowledgement was lost is sent again), deduplicated by the key. The topic
must exist there.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from chronolog.destinations import chronolog_topic
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.effect_adapters.base import Contract, EffectContext, Outcome, Stopwatch
from chronolog.log.kafka import stop_client
from chronolog.log.kafka_config import NO_AUTH
from chronolog.log.partitioner import partition_for
from chronolog.log.port import EventLog, KafkaCluster, LogError, OutRecord
from chronolog.wakeup import wait_within


class KafkaEffectAdapter:
    """Publish the result to a topic (Kafka transaction, or the SQLite log's topic)."""

    kind = "kafka"

    def __init__(self, log_: EventLog, member_id: str) -> None:
        self.log = log_
        self.member_id = member_id
        self._producer: Any = None
        self._lock = asyncio.Lock()
        self._remote: dict[str, Any] = {}  # bootstrap -> producer of another cluster

    @property
    def contract(self) -> Contract:
        # the SQLite path is at-least-once (see the module docstring)
        return "transactional" if isinstance(self.log, KafkaCluster) else "idempotent"

    @property
    def transactional_id(self) -> str:
        return f"{self.log.topics.prefix}effects-{self.member_id}"

    async def close(self) -> None:
        if self._producer is not None:
            await stop_client(self._producer, 15)
            self._producer = None
        for producer in self._remote.values():
            await stop_client(producer, 15)
        self._remote.clear()

    def _record(self, intent: m.EffectIntended, payload: Any, topic: str) -> OutRecord:
        value = orjson.dumps({"effect_id": intent.effect_id, "run_id": intent.run_id,
                              "attempt": intent.attempt, "checksum": intent.checksum,
                              "result": payload})
        return OutRecord(topic=topic, key=intent.effect_id.encode(), value=value,
                         headers=(("effect_id", intent.effect_id.encode()),
                                  ("run_id", intent.run_id.encode())))

    async def perform(
        self, intent: m.EffectIntended, payload: Any, ctx: EffectContext | None = None
    ) -> Outcome:
        topic = intent.config.get("topic") or self.log.topics.effects
        if chronolog_topic(topic, self.log.topics):
            return Outcome.failed(reason=f"config: topic '{topic}' is one of chronolog's own "
                                  "topics; refused")
        rec = self._record(intent, payload, topic)
        if intent.config.get("bootstrap"):
            return await self._other_cluster(str(intent.config["bootstrap"]), rec)
        if isinstance(self.log, KafkaCluster):
            return await self._transactional(intent, rec, ctx, self.log.bootstrap_servers)
        return await self._append(rec)

    # ------------------------------------------------------------------ sqlite

    async def _append(self, rec: OutRecord) -> Outcome:
        sw = Stopwatch()
        try:
            await self.log.ensure_topic(rec.topic)
            pos = (await self.log.append([rec]))[0]
        except LogError as exc:
            return Outcome.retry_later(error=str(exc), elapsed_ms=sw.ms())
        return Outcome.succeeded(contract="at-least-once (embedded log)", topic=pos.topic,
                                 partition=pos.partition, offset=pos.offset, elapsed_ms=sw.ms())

    # ------------------------------------------------------------------ another cluster

    async def _other_cluster(self, bootstrap: str, rec: OutRecord) -> Outcome:
        sw = Stopwatch()
        try:
            producer = self._remote.get(bootstrap)
            if producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=bootstrap, client_id=f"chronolog-effects-{self.member_id}",
                    enable_idempotence=True, acks="all", linger_ms=0, request_timeout_ms=30000)
                try:
                    await wait_within(producer.start(), 40)
                except BaseException:
                    await stop_client(producer, 10)
                    raise
                self._remote[bootstrap] = producer
            meta = await wait_within(producer.send_and_wait(
                rec.topic, rec.value, key=rec.key, headers=list(rec.headers)), 40)
        except (TimeoutError, KafkaError, OSError) as exc:
            return Outcome.retry_later(error=repr(exc)[:300], elapsed_ms=sw.ms(),
                                       reason="not acknowledged; sent again (the key "
                                       "deduplicates)")
        return Outcome.succeeded(contract="at-least-once (another cluster)", topic=meta.topic,
                                 partition=meta.partition, offset=meta.offset,
                                 elapsed_ms=sw.ms())

    # ------------------------------------------------------------------ kafka

    async def _start_producer(self, bootstrap_servers: str) -> Any:
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap_servers,
                client_id=f"chronolog-{self.transactional_id}",
                transactional_id=self.transactional_id, enable_idempotence=True, acks="all",
                linger_ms=0, request_timeout_ms=30000,
                # the log's cluster: as the log's principal (the effects role's ACLs)
                **getattr(self.log, "auth", NO_AUTH).client_kwargs(),
            )
            try:
                await wait_within(producer.start(), 40)  # InitProducerId fences zombies
            except BaseException:
                await stop_client(producer, 10)
                raise
            self._producer = producer
        return self._producer

    async def _transactional(
        self, intent: m.EffectIntended, rec: OutRecord, ctx: EffectContext | None,
        bootstrap_servers: str,
    ) -> Outcome:
        sw = Stopwatch()
        async with self._lock:
            try:
                producer = await self._start_producer(bootstrap_servers)
                n = await self.log.partitions_for(rec.topic)
                await wait_within(producer.begin_transaction(), 30)
                meta = await wait_within(producer.send_and_wait(
                    rec.topic, rec.value, key=rec.key, partition=partition_for(rec.key or b"", n),
                    headers=list(rec.headers)), 30)
                evidence = {"contract": "transactional", "transactional_id": self.transactional_id,
                            "topic": meta.topic, "partition": meta.partition,
                            "offset": meta.offset}
                recorded = False
                if ctx is not None and ctx.outcome_envelope is not None:
                    env = ctx.outcome_envelope("succeeded", evidence)
                    key = partition_key(env.tenant, env.schedule_id).encode()
                    cmds = self.log.topics.commands
                    await wait_within(producer.send_and_wait(
                        cmds, codec.encode_command(env), key=key,
                        partition=partition_for(key, await self.log.partitions_for(cmds))), 30)
                    target = ctx.commit_to() if ctx.commit_to is not None else ctx.offset + 1
                    await wait_within(producer.send_offsets_to_transaction(
                        {TopicPartition(ctx.events_topic, ctx.partition):
                         OffsetAndMetadata(target, "")}, ctx.group), 30)
                    recorded = True
                await wait_within(producer.commit_transaction(), 30)
            except Exception as exc:  # noqa: BLE001 - classified below
                landed = await self._landed(ctx)
                await self._reset(abort=not landed)
                if landed:
                    return Outcome("succeeded", {"contract": "transactional",
                                                 "verified_by": "committed group offset",
                                                 "error": repr(exc)[:300]}, recorded=True)
                return Outcome.retry_later(error=repr(exc)[:300], elapsed_ms=sw.ms(),
                                           reason="transaction aborted; nothing visible")
        return Outcome("succeeded", {**evidence, "elapsed_ms": sw.ms()}, recorded=recorded)

    async def _landed(self, ctx: EffectContext | None) -> bool:
        """After an ambiguous commit error: did the transaction (and our offset) commit?

        Only answerable when the transaction moved the offset past the intent (no older
        intent of the partition was open); otherwise it is retried (the key deduplicates)."""
        if ctx is None or not ctx.group:
            return False
        try:
            committed = await self.log.committed(ctx.group, ctx.events_topic, ctx.partition)
        except Exception:  # noqa: BLE001
            return False
        return committed is not None and committed > ctx.offset

    async def _reset(self, abort: bool) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if abort:
            with contextlib.suppress(Exception):
                await wait_within(producer.abort_transaction(), 10)
        await stop_client(producer, 15)

