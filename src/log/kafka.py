"""KafkaEventLog: the EventLog port (``chronolog.log.port``) on Apache Kafka through aiokafka.

Mapping of the port onto Kafka:

* ``append`` — one shared idempotent, non-transactional producer (acks=all). Keyed records with
  ``partition=None`` are placed with ``chronolog.log.partitioner.partition_for`` (Kafka's
  default murmur2), so both log adapters agree on placement.
* ``read`` / ``end_offset`` — a small pool of group-less ``read_committed`` consumers used with
  manual ``assign`` + ``seek``; ``end_offset`` is the last stable offset (ListOffsets with
  read_committed isolation).
* ``committed`` — OffsetFetch through the admin client.
* ``acquire(p)`` — a transactional producer with ``transactional_id = <prefix>processor-p<p>``
  (one stable id per input partition: aiokafka speaks the v0 transaction protocol, so zombie
  fencing rests on the id alone). Its ``start()`` (InitProducerId) fences every older producer
  with the same id. ``commit`` = begin, send, (``then(positions)``: wait for the produce acks
  inside the open transaction, send its records), ``send_offsets_to_transaction``, commit.
* compacted topics (``Topics.compacted``: the processors' ``state``) — created with
  ``cleanup.policy=compact`` and small segments (``ensure_topics``); written and read like
  any topic: a reader keeps each key's latest record.
* ``group_consumer`` — an ``AIOKafkaConsumer`` in ``group``, ``read_committed``, manual commits;
  after the user's ``on_assigned`` callback (which typically acquires the partition and so
  completes any pending transaction of an older owner) the committed offsets are fetched and
  sought for each newly assigned partition the callback did not seek itself.

Visibility: Kafka acknowledges ``EndTxn`` before the commit markers are written, so for a few
milliseconds after ``commit_transaction`` a ``read_committed`` reader (and OffsetFetch) may not
see the transaction yet. ``KafkaPartitionOwner.commit`` therefore waits (bounded) until the last
stable offset of every written partition has passed its records and the group's stored offsets
equal ``consumed``, so ``commit`` returning means "visible to committed readers", as in the
SQLite adapter. Pass ``await_visible=False`` to skip that wait (or set it per owner:
``KafkaPartitionOwner.await_visible``). A processor skips it: it never reads its own writes
back through the log (its state is in memory; replies are read by clients asynchronously),
and a new owner's ``acquire`` (InitProducerId) only returns once the previous owner's
pending transaction is completed, so the restore that follows sees it. The wait costs two
to four extra broker round trips per commit.

Back-to-back transactions: for a few milliseconds after ``EndTxn`` the coordinator is still
writing the markers, and the next transaction's first AddPartitionsToTxn is refused with
CONCURRENT_TRANSACTIONS; aiokafka then retries after a fixed back-off (``BACKOFF_OVERRIDE``,
KAFKA-5477), which a processor committing one batch after another paid in most of its
transactions. ``concurrent_txn_backoff_ms`` (default 2) lowers that process-wide constant
(docs/run-path.md, "Measurements behind the adapters' settings").

Group consumers and latency: aiokafka keeps one fetch request in flight per broker, and a
partition whose fetched records are still buffered is left out of the next request. So once a
consumer drained a partition, new records there are fetched only after the request in flight
(built without that partition) returns — after up to ``fetch.max.wait.ms`` when the other
partitions are quiet. Group consumers therefore use a short wait (``fetch_max_wait_ms``,
default 10 ms instead of aiokafka's 100; measured in docs/run-path.md) while records flow, and
aiokafka's 500 ms once they fetched nothing for a second (``chronolog.log.kafka_fetch_wait``):
an idle consumer's request names every partition, so the broker answers it as soon as records
arrive, and the short wait would only buy up to 100 empty fetches per second per consumer.

Within ``commit`` the consumed offsets (AddOffsetsToTxn + TxnOffsetCommit) are queued right
after the records, so they travel while ``then()`` waits for the records' acks.

Predicted positions: ``then()`` needs the records' offsets, which the plain way learns from
the records' acks — a second produce round trip before EndTxn. But an owner is the only
writer of its partition of ``events``, so it knows that partition's next offset: the last
record it committed there + 2 (the commit marker takes one). When every record of a commit
goes to that partition (a processor writes its ready hints through ``then()`` for this),
``then()`` is called with the predicted positions and everything — records, ``then()``'s
records, offsets — goes out at once. The acks are checked against the prediction before
EndTxn; a mismatch aborts the transaction (nothing becomes visible) and the commit is made
the plain way. After a failed commit, and for a new owner, the next offset is unknown until
a plain commit writes there (its effect on the reply latency: docs/run-path.md).

Durability: the topics are created with the replication factor and min ISR of the
deployment (``Durability``: by default three copies, two in sync, on a cluster of three or
more brokers, one on a single broker) and with unclean leader election off; ``ensure_topics``
then checks the cluster against ``chronolog.log.durability.durability_problems`` and raises
``LogUnsafe`` on any problem (unless the deployment allows it: then each is logged).

Authentication: ``KafkaAuth`` (``auth=``) is passed to every client the log builds — the
shared producer and admin client, the readers, the partition owners' transactional
producers, the group consumers and the restore consumer — so one process speaks to the
broker as one principal (``chronolog.settings.kafka_auth_from_env``; what each role's
principal needs: ``chronolog.log.kafka_acls``).

Failures: ``Fenced`` when the partition's producer is fenced or otherwise unusable (the caller
must drop the partition's state and re-acquire); ``LogUnavailable`` when the broker does not
answer within the configured bounds. After a timeout in the middle of ``commit_transaction`` the
outcome is unknown (the broker may still complete it); the owner then reports ``Fenced`` and a
new owner sees whatever landed when it rebuilds from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    IllegalStateError,
    InvalidPartitionsError,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidReplicationFactorError,
    InvalidTxnState,
    KafkaError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    TopicAlreadyExistsError,
    TransactionalIdAuthorizationFailed,
    for_code,
)
from aiokafka.producer import sender
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from chronolog.backoff import Backoff, retry
from chronolog.log.durability import (
    SAFE_DEFAULT,
    Durability,
    TopicFacts,
    durability_problems,
)
from chronolog.log.kafka_config import NO_AUTH, PRUNED_SEGMENT_MS, KafkaAuth
from chronolog.log.kafka_fetch_wait import fetch_wait_ms, wait_long_when_idle
from chronolog.log.partitioner import partition_for
from chronolog.log.port import (
    Fenced,
    LogError,
    LogUnavailable,
    LogUnsafe,
    Offsets,
    OutRecord,
    Position,
    RebalanceCallback,
    Record,
    ThenCallback,
    Topics,
    refuse_deletion,
)
from chronolog.wakeup import wait_within

__all__ = ["KafkaEventLog", "KafkaGroupConsumer", "KafkaPartitionOwner"]

log = logging.getLogger(__name__)

# Errors after which a transactional producer can never be used again.
_FATAL_TXN_ERRORS: tuple[type[BaseException], ...] = (
    ProducerFenced,
    OutOfOrderSequenceNumber,
    InvalidProducerEpoch,
    InvalidReplicationFactorError,
    InvalidProducerIdMapping,
    InvalidTxnState,
    TransactionalIdAuthorizationFailed,
    IllegalStateError,
)

# Readers (group-less consumers, each assigned one partition at a time). A reader taken for
# another partition than its last drops what it prefetched and seeks: a process reading
# several topics at once (the projector: every partition of events, dlq and workers) with
# fewer readers than partitions in use made each read start cold, and the projector fell
# behind a steady 1,000 events/s. Enough for each partition a process reads at once.
_READER_POOL_SIZE = 16
STATE_SEGMENT_BYTES = 16 * 1024 * 1024  # segment size of the compacted state topic
_VISIBILITY_TIMEOUT_S = 10.0
# a group member that sends no heartbeat for this long is dropped from its group (no
# heartbeat goes out while a rebalance callback runs: aiokafka starts them once it returns)
GROUP_SESSION_TIMEOUT_S = 10.0


def _headers_out(headers: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]] | None:
    return [(k, bytes(v)) for k, v in headers] if headers else None


# one record sent in a batch: the batch's delivery future and the record's offset in it
_Sent = tuple["asyncio.Future[Any]", int]


async def _know_partition(producer: AIOKafkaProducer, topic: str, partition: int) -> None:
    """Make sure the producer's metadata has ``partition`` of ``topic``: one added since it
    last refreshed (``add_partitions``, by any process) is refused by aiokafka until then."""
    known = producer.client.cluster.partitions_for_topic(topic)
    if known is not None and partition in known:
        return
    await _bounded(producer.client.force_metadata_update(), 30, "metadata update")
    known = producer.client.cluster.partitions_for_topic(topic)
    if known is None or partition not in known:
        raise LogError(f"kafka: partition {partition} of {topic!r} does not exist")


async def _send_batched(producer: AIOKafkaProducer,
                        placed: Sequence[tuple[OutRecord, int]]) -> list[_Sent]:
    """Send records with aiokafka's batch API: per partition, as few batches as fit (one
    future each) instead of one ``send`` coroutine and future per record. Records of one
    partition keep their order; ``_positions`` turns the result into their positions."""
    by_tp: dict[tuple[str, int], list[int]] = {}
    for i, (rec, p) in enumerate(placed):
        by_tp.setdefault((rec.topic, p), []).append(i)
    sent: list[_Sent | None] = [None] * len(placed)
    for (topic, p), indexes in by_tp.items():
        await _know_partition(producer, topic, p)
        batch, members = producer.create_batch(), list[tuple[int, int]]()
        for i in indexes:
            rec = placed[i][0]
            meta = batch.append(key=rec.key, value=rec.value, timestamp=None,
                                headers=_headers_out(rec.headers) or [])
            if meta is None:  # full: send it, start another
                fut = await producer.send_batch(batch, topic, partition=p)
                for j, rel in members:
                    sent[j] = (fut, rel)
                batch, members = producer.create_batch(), list[tuple[int, int]]()
                meta = batch.append(key=rec.key, value=rec.value, timestamp=None,
                                    headers=_headers_out(rec.headers) or [])
                assert meta is not None  # the first record of a batch always fits
            members.append((i, meta.offset))
        batch.close()
        fut = await producer.send_batch(batch, topic, partition=p)
        for j, rel in members:
            sent[j] = (fut, rel)
    return [x for x in sent if x is not None]


async def _positions(sent: Sequence[_Sent], bound: float, what: str) -> list[Position]:
    """The positions of records sent by ``_send_batched`` once their batches are acked."""
    futures = list({id(f): f for f, _ in sent}.values())
    await _bounded(asyncio.gather(*futures), bound, what)
    out = []
    for fut, rel in sent:
        meta = fut.result()
        out.append(Position(meta.topic, meta.partition, meta.offset + rel))
    return out


def _to_record(msg: Any) -> Record:
    return Record(
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        key=msg.key,
        value=msg.value if msg.value is not None else b"",
        headers=tuple((k, bytes(v)) for k, v in (msg.headers or ())),
        timestamp_ms=int(msg.timestamp or 0),
    )


async def _bounded(aw: Any, seconds: float, what: str) -> Any:
    """Await ``aw`` for at most ``seconds``; a timeout becomes ``LogUnavailable``."""
    try:
        return await wait_within(aw, seconds)
    except TimeoutError as exc:
        raise LogUnavailable(f"kafka: {what} did not finish within {seconds:.0f}s") from exc


# Between repeats of a Kafka request that failed with a retriable error (coordinator loading,
# leader moving, ...).
_REQUEST_BACKOFF = Backoff(first=0.02, cap=0.5)


async def start_client(client: Any, bound_s: float, what: str) -> None:
    """Start an aiokafka consumer or producer within ``bound_s`` s; one that fails to start
    is stopped before the error goes on. Left alone it keeps its connections and tasks, and
    is reported ("Unclosed AIOKafkaConsumer") when collected: a projector whose reads each
    opened a reader during a broker outage wrote some 300 such lines in 20 s."""
    try:
        await _bounded(client.start(), bound_s, what)
    except BaseException:
        await stop_client(client, 10)
        raise


async def stop_client(client: Any, bound_s: float) -> None:
    """Stop an aiokafka consumer or producer, best effort, within ``bound_s`` s.

    aiokafka's ``stop`` awaits the tasks it cancels itself (a consumer's fetch task): their
    CancelledError can come out of it — seen when an effect runner closed its group consumer
    after an offset commit timed out with two brokers of three away, which ended the
    process. Only a cancellation of the calling task itself goes on. A stop still running
    after the bound is cancelled and not waited for (``asyncio.wait_for`` would wait for it
    to finish cancelling, unbounded when it does not): the client is abandoned, which is
    safe for the same reasons as a process's stop (``chronolog.lifecycle``)."""
    stopping = asyncio.ensure_future(client.stop())
    try:
        done, _ = await asyncio.wait({stopping}, timeout=bound_s)
    except asyncio.CancelledError:
        stopping.cancel()
        raise
    if not done:
        stopping.cancel()
        _retrieve_exceptions([stopping])
        log.warning("kafka: stopping a %s took over %.0f s; abandoned", type(client).__name__,
                    bound_s)
        return
    with contextlib.suppress(asyncio.CancelledError, Exception):  # best effort
        stopping.result()


# Between polls for a committed transaction to become visible to committed readers.
_VISIBILITY_POLL = Backoff(first=0.002, cap=0.05)


def _retriable(exc: Exception) -> bool:
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


async def _retrying(call: Callable[[], Awaitable[Any]], seconds: float, what: str) -> Any:
    """Run ``call()`` until it succeeds, retrying retriable Kafka errors with a short
    backoff; bounded by ``seconds`` overall. A Kafka error that is not retried, or the bound
    passing, becomes ``LogUnavailable``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    def retrying(exc: Exception, wait: float) -> None:
        log.debug("kafka: %s: retrying after %r", what, exc)

    try:
        return await retry(
            lambda: _bounded(call(), max(deadline - loop.time(), 0.001), what),
            backoff=_REQUEST_BACKOFF, give_up_after=seconds, retry_on=_retriable,
            on_retry=retrying,
        )
    except KafkaError as exc:
        raise LogUnavailable(f"kafka: {what} failed: {exc!r}") from exc


def _retrieve_exceptions(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Mark the exceptions of abandoned futures as retrieved (now or when they finish).

    After a failed transaction aiokafka fails every pending send future (and its transaction
    waiter) with the same error; nobody awaits them any more, and asyncio would report each one
    as "Future exception was never retrieved" when it is garbage-collected.
    """

    def retrieve(fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled():
            fut.exception()

    for fut in futures:
        if fut.done():
            retrieve(fut)
        else:
            fut.add_done_callback(retrieve)


def _internal_futures(producer: AIOKafkaProducer) -> list[asyncio.Future[Any]]:
    """aiokafka-internal futures a dead transactional producer leaves failed behind: its
    transaction waiter and each unsent batch's result and drain waiters (private attributes,
    looked up defensively: missing ones are simply skipped)."""
    found: list[Any] = []
    txn = getattr(producer, "_txn_manager", None)
    found.append(getattr(txn, "_transaction_waiter", None))
    acc = getattr(producer, "_message_accumulator", None)
    batches: list[Any] = []
    for queue in (getattr(acc, "_batches", None) or {}).values():
        batches.extend(queue)
    batches.extend(getattr(acc, "_pending_batches", None) or ())
    for batch in batches:
        found.append(getattr(batch, "future", None))
        found.append(getattr(batch, "_drain_waiter", None))
    return [f for f in found if isinstance(f, asyncio.Future)]


def _lower_concurrent_txn_backoff(seconds: float) -> None:
    """Lower aiokafka's retry delay after CONCURRENT_TRANSACTIONS (never raise it)."""
    current = getattr(sender, "BACKOFF_OVERRIDE", None)
    if isinstance(current, (int, float)) and seconds < current:
        sender.BACKOFF_OVERRIDE = seconds


_GROUP_METADATA_MAX_AGE_MS = 5000


class _Mispredicted(Exception):
    """A predicted commit's acknowledged offsets were not the predicted ones (aborted)."""


class _Reader:
    """A group-less read_committed consumer, leased to one read at a time."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.tp: TopicPartition | None = None
        self.lso = -1  # the last stable offset of ``tp`` last seen (it only grows)




class KafkaEventLog:
    """The EventLog port on Kafka (see the module docstring for the mapping)."""

    def __init__(
        self,
        bootstrap_servers: str,
        topics: Topics = Topics(),
        client_id: str = "chronolog",
        transaction_timeout_ms: int = 60000,
        *,
        request_timeout_ms: int = 30000,
        aux_partitions: int | None = None,
        await_visible: bool = True,
        concurrent_txn_backoff_ms: float | None = 2.0,
        fetch_max_wait_ms: int = 10,
        durability: Durability = SAFE_DEFAULT,
        auth: KafkaAuth = NO_AUTH,
        compression: str = "zstd",
        segment_ms: int = PRUNED_SEGMENT_MS,
    ) -> None:
        """``auth``: the principal every client of this log speaks as. ``compression``: how
        its producers compress their batches (``COMPRESSIONS``; the brokers keep them as
        sent, the consumers decompress). ``segment_ms``: how often the topics the log's
        pruning shortens (events, commands, replies, ready.*) roll a segment: a broker frees
        the disk of a segment only once all of it lies below the log start.
        ``aux_partitions``: partition count of replies, dlq, effects.out and
        ready.<class> (default: ``topics.partitions``). ``concurrent_txn_backoff_ms``: the
        retry delay after CONCURRENT_TRANSACTIONS (module docstring; None: aiokafka's).
        ``fetch_max_wait_ms``: the group consumers' fetch wait (module docstring: it bounds
        how late a consumer sees new records of a partition it just drained).
        ``durability``: the replication of the topics it creates and what it requires of the
        cluster (module docstring)."""
        self.topics = topics
        self.durability = durability
        self.auth = auth
        self._compression = None if compression == "none" else compression
        self._segment = {"segment.ms": str(segment_ms)}
        self._replication: tuple[int, int] | None = None  # (factor, min ISR), once resolved
        self._brokers: list[int] = []
        self._broker_addresses: list[tuple[str, int]] = []
        self._config_broker = 0  # a broker listed at start, asked for the brokers' settings
        self.bootstrap_servers = bootstrap_servers
        self.client_id = client_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.aux_partitions = aux_partitions or topics.partitions
        self.await_visible = await_visible
        self.fetch_max_wait_ms = fetch_max_wait_ms
        if concurrent_txn_backoff_ms is not None:
            _lower_concurrent_txn_backoff(concurrent_txn_backoff_ms / 1000)
        self._bound_s = request_timeout_ms / 1000 + 5
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._readers: list[_Reader] = []
        self._free_readers: asyncio.Queue[_Reader] | None = None
        self._readers_lock = asyncio.Lock()
        self._closing_readers: set[asyncio.Task[None]] = set()  # replaced after a failure
        self._partition_counts: dict[str, int] = {}
        self._group_coordinators: dict[str, int] = {}
        self._owners: set[KafkaPartitionOwner] = set()
        self._started = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._started:
            return
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers,
            client_id=f"{self.client_id}-admin",
            request_timeout_ms=self.request_timeout_ms,
            **self.auth.client_kwargs(),
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            client_id=f"{self.client_id}-append",
            acks="all",
            enable_idempotence=True,
            # no linger: a burst sent in one call is batched anyway (send() only queues),
            # and the Client groups its appends itself; a linger only added latency
            linger_ms=0,
            max_batch_size=512 * 1024,
            compression_type=self._compression,
            request_timeout_ms=self.request_timeout_ms,
            retry_backoff_ms=50,
            **self.auth.client_kwargs(),
        )
        try:
            await _bounded(admin.start(), self._bound_s, "admin connect")
            await _bounded(producer.start(), self._bound_s, "producer connect")
        except BaseException as exc:
            await stop_client(producer, 10)
            with contextlib.suppress(Exception):
                await wait_within(admin.close(), 10)
            if isinstance(exc, KafkaError):
                raise LogUnavailable(
                    f"kafka: cannot connect to {self.bootstrap_servers}: {exc!r}"
                ) from exc
            raise
        self._admin, self._producer = admin, producer
        self._free_readers = asyncio.Queue()
        self._started = True

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        for owner in list(self._owners):
            with contextlib.suppress(Exception):
                await owner.close()
        for reader in self._readers:
            await stop_client(reader.consumer, 10)
        self._readers.clear()
        if self._closing_readers:
            await asyncio.gather(*self._closing_readers, return_exceptions=True)
        if self._producer is not None:
            await stop_client(self._producer, self._bound_s)
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await wait_within(self._admin.close(), 10)
        self._producer = self._admin = None

    async def __aenter__(self) -> KafkaEventLog:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _require(self) -> tuple[AIOKafkaProducer, AIOKafkaAdminClient]:
        if not self._started or self._producer is None or self._admin is None:
            raise LogError("KafkaEventLog is not started")
        return self._producer, self._admin

    # ------------------------------------------------------------------ topics

    async def ensure_topics(self, ready_classes: Sequence[str] = ("default",)) -> None:
        t = self.topics
        wanted: dict[str, tuple[int, dict[str, str]]] = {
            # pruned by chronolog (chronolog.processors.pruning), never by the broker's time
            t.commands: (t.partitions, {**self._segment}),
            t.events: (t.partitions, {"retention.ms": "-1", "retention.bytes": "-1",
                                      **self._segment}),
            t.replies: (self.aux_partitions, {**self._segment}),
            t.dlq: (self.aux_partitions, {}),
            t.effects: (self.aux_partitions, {}),
            t.workers: (self.aux_partitions, {"cleanup.policy": "compact"}),
            # the processors' snapshots (chronolog.processors.snapshots): the partition count
            # of events; small segments and a low dirty ratio keep a partition near the size
            # of its live states (a new owner reads it whole), segment.ms lets an idle one
            # be compacted too
            t.state: (t.partitions, {"cleanup.policy": "compact",
                                     "segment.bytes": str(STATE_SEGMENT_BYTES),
                                     "segment.ms": str(3_600_000),
                                     "min.cleanable.dirty.ratio": "0.25"}),
        }
        wanted[t.routing] = (1, {"retention.ms": "-1", "retention.bytes": "-1"})
        wanted[t.audit] = self._topic_config(t.audit) or (1, {})
        for cls in ready_classes:
            wanted[t.ready(cls)] = (self.aux_partitions, {**self._segment})
        # checked before any is created: the topics that exist, and the cluster; a topic
        # another client created meanwhile (or one whose metadata had not yet reached the
        # broker asked) is checked once it is seen
        checked = await self._check_durability(list(wanted))
        created = await self._create_topics(wanted)
        unchecked = [n for n in wanted if n not in checked and n not in created]
        if unchecked:
            await self._check_durability(unchecked)
        # a topic that follows the processors' partitions created after the deployment grew
        # (a new ready.<class>) grows to the count of commands (docs/design.md §18)
        n = self._partition_counts[t.commands]
        for name in wanted:
            if t.follows_processors(name) and self._partition_counts[name] < n:
                await self.add_partitions(name, n)

    async def _live_brokers(self) -> list[tuple[int, str, int]]:
        """(node id, host, port) of the brokers the cluster metadata lists now: the
        producer's (describe_cluster asks for every topic's metadata too, slow on a cluster of
        thousands of topics). A broker that is down is not listed."""
        producer, admin = self._require()
        known = sorted(producer.client.cluster.brokers(), key=lambda b: b.nodeId)
        if known:
            return [(int(b.nodeId), str(b.host), int(b.port)) for b in known]
        cluster = await _retrying(admin.describe_cluster, self._bound_s, "describe_cluster")
        return [(int(b["node_id"]), str(b["host"]), int(b["port"])) for b in cluster["brokers"]]

    async def _replication_for_cluster(self, seen: Iterable[int] = ()) -> tuple[int, int]:
        """(replication factor, min ISR) of the topics this log creates (``Durability``), for
        the brokers listed now and those ``seen`` holding replicas of existing topics (one
        down while a process starts does not make the cluster smaller)."""
        if self._replication is None:
            live = await self._live_brokers()
            self._brokers = sorted({b[0] for b in live} | set(seen))
            self._config_broker = live[0][0] if live else self._brokers[0]
            self._broker_addresses = [(host, port) for _, host, port in live]
            self._replication = self.durability.resolve(len(self._brokers))
        return self._replication

    async def _check_durability(self, names: list[str]) -> set[str]:
        """``LogUnsafe`` when the cluster cannot keep chronolog's promises (module docstring).
        Returns the topics of ``names`` that exist and were checked."""
        _, admin = self._require()
        described = await _retrying(lambda: admin.describe_topics(names), self._bound_s,
                                    "describe_topics")
        existing = {t["topic"]: t for t in described
                    if t["error_code"] == 0 and t["partitions"]}  # the others: created next
        holders = {int(r) for t in existing.values() for p in t["partitions"]
                   for r in p["replicas"]}
        rf, isr = await self._replication_for_cluster(holders)
        broker_keys = ("unclean.leader.election.enable",
                       "transaction.state.log.replication.factor",
                       "transaction.state.log.min.isr")
        topic_keys = ("min.insync.replicas", "unclean.leader.election.enable")
        resources = [ConfigResource(ConfigResourceType.BROKER, str(self._config_broker),
                                    dict.fromkeys(broker_keys))]
        resources += [ConfigResource(ConfigResourceType.TOPIC, n, dict.fromkeys(topic_keys))
                      for n in existing]
        responses = await _retrying(lambda: admin.describe_configs(resources), self._bound_s,
                                    "describe_configs")
        configs: dict[tuple[int, str], dict[str, str]] = {}
        for resp in responses:
            for res in resp.to_object()["resources"]:
                configs[(res["resource_type"], res["resource_name"])] = {
                    e["config_names"]: e["config_value"] for e in res["config_entries"]}
        facts: dict[str, TopicFacts] = {}
        for name, t in existing.items():
            cfg = configs.get((int(ConfigResourceType.TOPIC), name), {})
            facts[name] = TopicFacts(
                replicas=min(len(p["replicas"]) for p in t["partitions"]),
                min_isr=int(cfg.get("min.insync.replicas", "1")),
                unclean_election=cfg.get("unclean.leader.election.enable") == "true")
        broker_cfg = configs.get((int(ConfigResourceType.BROKER), str(self._config_broker)), {})
        problems = durability_problems(len(self._brokers), rf, isr, broker_cfg, facts)
        if not problems:
            return set(existing)
        if self.durability.allow_unsafe:
            for problem in problems:
                log.warning("kafka durability not kept (allowed): %s", problem)
            return set(existing)
        raise LogUnsafe("kafka: the cluster cannot keep chronolog's guarantees: "
                        + "; ".join(problems)
                        + " (CHRONOLOG_KAFKA_ALLOW_UNSAFE=1 starts anyway)")

    async def write_quorum(self) -> str | None:
        """Fewer brokers accept a connection (within 1 s) than the topics' min ISR: every
        write is refused (NOT_ENOUGH_REPLICAS, or a timeout while the controller quorum is
        lost too) until enough return. Known once ``ensure_topics`` has seen the cluster."""
        if self._replication is None or not self._broker_addresses:
            return None
        _, isr = self._replication
        with contextlib.suppress(Exception):  # a broker that joined since: count it too
            for _, host, port in await self._live_brokers():
                if (host, port) not in self._broker_addresses:
                    self._broker_addresses.append((host, port))
        if isr <= 1:
            return None

        async def answers(host: str, port: int) -> bool:
            try:
                _, writer = await wait_within(asyncio.open_connection(host, port), 1.0)
            except (OSError, TimeoutError):
                return False
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            return True

        up = sum(await asyncio.gather(*(answers(h, p) for h, p in self._broker_addresses)))
        if up >= isr:
            return None
        return (f"not enough in-sync replicas: {up} of {len(self._broker_addresses)} brokers "
                f"answer, a write needs {isr} (min ISR); writes are refused until another "
                "returns")

    def _topic_config(self, topic: str) -> tuple[int, dict[str, str]] | None:
        """(partitions, configs) of a topic created on first use with a config of its own."""
        if topic == self.topics.audit:  # checkpoints: the latest record of each key
            return (1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.25",
                        "segment.ms": str(3_600_000)})
        return None

    async def ensure_topic(self, topic: str, partitions: int | None = None) -> int:
        n = self._partition_counts.get(topic)
        if n is None:
            known = self._topic_config(topic)
            await self._create_topics({topic: (partitions or self.topics.partitions, {})
                                       if known is None else known})
            n = self._partition_counts[topic]
        return n

    async def _create_topics(self, wanted: dict[str, tuple[int, dict[str, str]]]) -> set[str]:
        """Create the topics ``wanted`` (name -> partitions, configs) that do not exist yet and
        wait until every one of them can be written; learn their partition counts. Returns
        the names this call created."""
        _, admin = self._require()
        rf, isr = await self._replication_for_cluster()
        # (more copies than brokers only where allowed: as many as there are)
        rf, isr = min(rf, len(self._brokers) or 1), min(isr, len(self._brokers) or 1)
        safe = {"min.insync.replicas": str(isr), "unclean.leader.election.enable": "false"}
        # only those missing: on a cluster with ACLs a principal without CREATE (a worker, an
        # API) is refused a CreateTopics even of a topic that exists
        known = await self._describe(list(wanted))
        new = [
            NewTopic(name, num_partitions=n, replication_factor=rf,
                     topic_configs={**safe, **cfg})
            for name, (n, cfg) in wanted.items() if not known.get(name)
        ]
        errors = []
        created: set[str] = set()
        if new:
            resp = await _retrying(
                lambda: admin.create_topics(new, timeout_ms=self.request_timeout_ms),
                self._bound_s,
                "create_topics",
            )
            errors = resp.topic_errors
        for item in errors:
            name, code = item[0], item[1]
            if code == 0:
                created.add(name)
                continue
            err = for_code(code)
            if err is TopicAlreadyExistsError:
                continue
            if err is InvalidReplicationFactorError and rf <= len(self._brokers):
                # fewer brokers up than the replication: a broker is away, wait for it
                raise LogUnavailable(f"kafka: creating topic {name} with replication {rf} "
                                     "needs that many brokers up")
            raise LogError(f"kafka: creating topic {name} failed: {err.__name__}")
        # Wait until the new topics' metadata has propagated to the broker's cache, so an
        # append right after ensure_topics does not stall on metadata.
        deadline = time.monotonic() + self._bound_s
        names = list(wanted)
        while True:
            counts = await self._describe(names)
            if all(counts.get(n) for n in names):
                self._partition_counts.update(counts)  # type: ignore[arg-type]
                # ListOffsets is answered by the partition's leader only once it hosts the
                # partition: a cheap way to wait until the broker is really ready to write.
                await self._end_offsets(
                    TopicPartition(n, p) for n in names for p in range(counts[n] or 0)
                )
                return created
            if time.monotonic() > deadline:
                missing = [n for n in names if not counts.get(n)]
                raise LogUnavailable(f"kafka: topics not visible in metadata: {missing}")
            await asyncio.sleep(0.05)

    async def _describe(self, names: list[str]) -> dict[str, int | None]:
        _, admin = self._require()
        topics = await _retrying(
            lambda: admin.describe_topics(names), self._bound_s, "describe_topics"
        )
        out: dict[str, int | None] = {}
        for t in topics:
            parts = t["partitions"]
            # ready = every partition has a leader and a non-empty ISR (right after creation
            # produce requests otherwise bounce with NotLeader / NotEnoughReplicas)
            ok = t["error_code"] == 0 and parts and all(
                p["error_code"] == 0 and p["leader"] >= 0 and p["isr"] for p in parts
            )
            out[t["topic"]] = len(parts) if ok else None
        return out

    async def partitions_for(self, topic: str) -> int:
        n = self._partition_counts.get(topic)
        if n is None:
            n = (await self._describe([topic])).get(topic)
            if not n:
                raise LogError(f"kafka: unknown topic {topic!r}")
            self._partition_counts[topic] = n
        return n

    async def partition_count(self, topic: str) -> int:
        n = (await self._describe([topic])).get(topic)
        known = self._partition_counts.get(topic, 0)
        if not n:  # unknown, or a partition added a moment ago has no leader yet
            return known or await self.partitions_for(topic)
        self._partition_counts[topic] = max(n, known)
        return max(n, known)

    async def add_partitions(self, topic: str, partitions: int) -> int:
        _, admin = self._require()
        self._partition_counts.pop(topic, None)
        n = await self.partitions_for(topic)
        if partitions > n:
            try:
                await _bounded(admin.create_partitions(
                    {topic: NewPartitions(total_count=partitions)},
                    timeout_ms=self.request_timeout_ms), self._bound_s, "create_partitions")
            except InvalidPartitionsError:
                pass  # grown meanwhile by someone else: its count is read below
            except KafkaError as exc:
                raise LogUnavailable(f"kafka: adding partitions to {topic} failed: "
                                     f"{exc!r}") from exc
        # wait until every partition has a leader and answers ListOffsets (as a new topic)
        deadline = time.monotonic() + self._bound_s
        while True:
            got = (await self._describe([topic])).get(topic) or 0
            if got >= partitions:
                await self._end_offsets(TopicPartition(topic, p) for p in range(got))
                self._partition_counts[topic] = got
                return got
            if time.monotonic() > deadline:
                raise LogUnavailable(f"kafka: {topic} has {got} partitions with a leader, "
                                     f"not {partitions}")
            await asyncio.sleep(0.05)

    async def _placed(self, records: Sequence[OutRecord]) -> list[tuple[OutRecord, int]]:
        placed: list[tuple[OutRecord, int]] = []
        for rec in records:
            if rec.partition is not None:
                placed.append((rec, rec.partition))
            elif rec.key is not None:
                placed.append((rec, partition_for(rec.key, await self.partitions_for(rec.topic))))
            else:
                raise LogError(f"kafka: record for {rec.topic} has neither key nor partition")
        return placed

    # ------------------------------------------------------------------ append

    async def append(self, records: Sequence[OutRecord]) -> list[Position]:
        producer, _ = self._require()
        placed = await self._placed(records)
        try:
            for tp in {(rec.topic, p) for rec, p in placed}:
                await _know_partition(producer, *tp)
            futures = [
                await producer.send(
                    rec.topic, rec.value, key=rec.key, partition=p,
                    headers=_headers_out(rec.headers),
                )
                for rec, p in placed
            ]
            metas = await _bounded(asyncio.gather(*futures), self._bound_s, "append")
        except KafkaError as exc:
            raise LogUnavailable(f"kafka: append failed: {exc!r}") from exc
        return [Position(m.topic, m.partition, m.offset) for m in metas]

    # ------------------------------------------------------------------ reads

    @contextlib.asynccontextmanager
    async def _reader(self, tp: TopicPartition) -> AsyncIterator[_Reader]:
        assert self._free_readers is not None
        reader: _Reader | None = None
        async with self._readers_lock:
            if self._free_readers.empty() and len(self._readers) < _READER_POOL_SIZE:
                consumer = AIOKafkaConsumer(
                    bootstrap_servers=self.bootstrap_servers,
                    client_id=f"{self.client_id}-reader{len(self._readers)}",
                    group_id=None,
                    enable_auto_commit=False,
                    isolation_level="read_committed",
                    auto_offset_reset="none",
                    request_timeout_ms=self.request_timeout_ms,
                    # short long-polls: a seek waits for the in-flight fetch to come back
                    fetch_max_wait_ms=25,
                    # a partition created a moment ago answers ListOffsets only once its
                    # leader hosts it (about 0.1-0.5 s here); aiokafka retries after this
                    # back-off, whose 100 ms default made each ensure_topics of new topics
                    # wait about 1 s instead of 0.2-0.4 s (reconnections keep their own)
                    retry_backoff_ms=20,
                    max_partition_fetch_bytes=4 * 1024 * 1024,
                    **self.auth.client_kwargs(),
                )
                await start_client(consumer, self._bound_s, "reader connect")
                wait_long_when_idle(consumer)
                reader = _Reader(consumer)
                self._readers.append(reader)
        if reader is None:
            reader = await self._free_readers.get()
            # prefer a reader already positioned on this partition
            others: list[_Reader] = []
            while reader.tp != tp and not self._free_readers.empty():
                others.append(reader)
                reader = self._free_readers.get_nowait()
            if reader.tp != tp and others:
                others.append(reader)
                reader = others.pop(0)
            for o in others:
                self._free_readers.put_nowait(o)
        try:
            yield reader
        except Exception:
            # A read that failed (a broker away, a request timed out) may leave its consumer
            # with metadata that never heals: after two brokers of three came back, a
            # projector's reader kept timing out on ListOffsets of a partition whose leader
            # had moved, for minutes. It is replaced: a new one bootstraps afresh.
            self._readers.remove(reader)
            closing = asyncio.create_task(stop_client(reader.consumer, 10))
            self._closing_readers.add(closing)
            closing.add_done_callback(self._closing_readers.discard)
            raise
        except BaseException:  # cancelled: back to the pool as it is
            self._return_reader(reader)
            raise
        else:
            self._return_reader(reader)

    def _return_reader(self, reader: _Reader) -> None:
        assert self._free_readers is not None
        if reader.tp is not None and reader.tp in reader.consumer.assignment():
            # an idle pooled reader must not keep long-polling its last partition
            reader.consumer.pause(reader.tp)
        self._free_readers.put_nowait(reader)

    async def _lso(self, consumer: AIOKafkaConsumer,
                   tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return await _bounded(consumer.end_offsets(tps), self._bound_s, "end_offsets")

    async def read(
        self, topic: str, partition: int, offset: int, max_records: int = 1000,
        timeout_ms: int = 0,
    ) -> list[Record]:
        try:
            return await self._read(topic, partition, offset, max_records, timeout_ms)
        except KafkaError as exc:  # the reader's own requests time out or lose the broker
            raise LogUnavailable(f"kafka: read of {topic}[{partition}] failed: {exc!r}") from exc

    async def _read(
        self, topic: str, partition: int, offset: int, max_records: int, timeout_ms: int,
    ) -> list[Record]:
        self._require()
        await self.partitions_for(topic)  # unknown topics fail fast instead of hanging
        tp = TopicPartition(topic, partition)
        max_records = max(1, max_records)
        offset = max(0, offset)
        async with self._reader(tp) as reader:
            c = reader.consumer
            # A read going on where the last one of this reader stopped (a partition read
            # whole: a restore) keeps what the reader fetched already — a seek would drop it
            # — and, below the last stable offset it saw, needs no new one (it only grows):
            # about two broker round trips fewer per read.
            on_it = reader.tp == tp
            fresh = not (on_it and offset < reader.lso)
            lso = (await self._lso(c, [tp]))[tp] if fresh else reader.lso
            reader.lso = lso
            # assign + seek with no await in between: the reader never needs a reset policy
            if not on_it:
                c.assign([tp])
                reader.tp = tp
                c.seek(tp, offset)
            elif await _bounded(c.position(tp), self._bound_s, "position") != offset:
                c.seek(tp, offset)
            c.resume(tp)
            loop = asyncio.get_running_loop()
            now = loop.time()
            wait_deadline = now + timeout_ms / 1000
            # Records exist below the LSO: fetch until we get some or pass the LSO (only aborted
            # batches / control markers were there), bounded by the request timeout.
            hard_deadline = max(wait_deadline, now + self._bound_s)
            while True:
                now = loop.time()
                have_data = offset < lso
                deadline = hard_deadline if have_data else wait_deadline
                remaining_ms = int(max(0.0, deadline - now) * 1000)
                try:
                    # Below the LSO, poll in short slices: a fetch that returns only aborted
                    # batches or commit markers yields no record, and getmany would otherwise
                    # sit out its whole timeout although the position has already moved on.
                    batch = await c.getmany(tp, timeout_ms=min(remaining_ms, 20) if have_data
                                            else remaining_ms, max_records=max_records)
                except OffsetOutOfRangeError:
                    # below the log start (retention) -> resume at the start; beyond the end
                    # (caller error) -> nothing to return
                    begin = (
                        await _bounded(c.beginning_offsets([tp]), self._bound_s, "log start")
                    )[tp]
                    if offset >= begin:
                        return []
                    offset = begin
                    c.seek(tp, offset)
                    continue
                msgs = batch.get(tp, [])
                if msgs:
                    return [_to_record(m) for m in msgs]
                position = await _bounded(c.position(tp), self._bound_s, "position")
                if have_data and position >= lso and not fresh:
                    # past the LSO this reader saw last: there may be committed data beyond
                    lso = reader.lso = (await self._lso(c, [tp]))[tp]
                    fresh = True
                    continue
                if have_data and position >= lso:
                    # everything below the LSO was aborted/control; wait for new data if asked
                    offset = position
                    if loop.time() >= wait_deadline:
                        return []
                    continue
                if loop.time() >= deadline:
                    if have_data:
                        raise LogUnavailable(
                            f"kafka: no committed data fetched from {topic}[{partition}] "
                            f"between {offset} and LSO {lso}"
                        )
                    return []
                if not have_data and position >= lso:
                    # the LSO may have moved while we waited
                    lso = reader.lso = (await self._lso(c, [tp]))[tp]

    async def end_offset(self, topic: str, partition: int) -> int:
        self._require()
        await self.partitions_for(topic)
        tp = TopicPartition(topic, partition)
        try:
            async with self._reader(tp) as reader:
                return (await self._lso(reader.consumer, [tp]))[tp]
        except KafkaError as exc:
            raise LogUnavailable(f"kafka: end offset of {topic}[{partition}] failed: "
                                 f"{exc!r}") from exc

    async def start_offset(self, topic: str, partition: int) -> int:
        self._require()
        await self.partitions_for(topic)
        tp = TopicPartition(topic, partition)
        try:
            async with self._reader(tp) as reader:
                begin = await _bounded(reader.consumer.beginning_offsets([tp]), self._bound_s,
                                       "log start")
                return int(begin[tp])
        except KafkaError as exc:
            raise LogUnavailable(f"kafka: start offset of {topic}[{partition}] failed: "
                                 f"{exc!r}") from exc

    async def delete_before(self, topic: str, partition: int, offset: int) -> int:
        _, admin = self._require()
        refuse_deletion(topic, partition, offset, await self.end_offset(topic, partition),
                        topic in self.topics.compacted)
        tp = TopicPartition(topic, partition)
        try:
            low = await _bounded(admin.delete_records({tp: RecordsToDelete(offset)}),
                                 self._bound_s, "delete records")
        except KafkaError as exc:
            raise LogUnavailable(f"kafka: deleting {topic}[{partition}] below {offset} "
                                 f"failed: {exc!r}") from exc
        return int(low[tp])

    async def _end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        tps = list(tps)
        if not tps:
            return {}
        try:
            async with self._reader(tps[0]) as reader:
                return await self._lso(reader.consumer, tps)
        except KafkaError as exc:
            raise LogUnavailable(f"kafka: end offsets failed: {exc!r}") from exc

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        offsets = await self._committed_many(group, [TopicPartition(topic, partition)])
        return offsets.get(TopicPartition(topic, partition))

    async def _committed_many(
        self, group: str, tps: list[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        _, admin = self._require()

        async def fetch() -> Any:
            coordinator = self._group_coordinators.get(group)
            if coordinator is None:
                coordinator = await admin.find_coordinator(group)
                self._group_coordinators[group] = coordinator
            by_topic: dict[str, list[int]] = {}
            for tp in tps:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            # OffsetFetch sent directly: aiokafka's list_consumer_group_offsets ignores the
            # top-level error code, so "coordinator loading" would read as "no offset".
            request = OffsetFetchRequest(group, list(by_topic.items()))
            try:
                resp = await admin._send_request(request, coordinator)
                top = getattr(resp, "error_code", 0)
                if top:
                    raise for_code(top)(f"OffsetFetch for group {group!r}")
                result: dict[TopicPartition, int | None] = dict.fromkeys(tps)
                for topic, parts in resp.topics:
                    for partition, offset, _meta, code in parts:
                        if code:
                            raise for_code(code)(f"OffsetFetch {topic}[{partition}]")
                        result[TopicPartition(topic, partition)] = offset if offset >= 0 else None
                return result
            except KafkaError:
                # ask for the coordinator again: it moved, is starting, or its broker is gone
                # (NodeNotReady / a lost connection: a broker of a cluster killed, whose
                # groups another broker coordinates now — kept, the cached one was asked in
                # vain for ever)
                self._group_coordinators.pop(group, None)
                raise

        out: dict[TopicPartition, int | None] = await _retrying(
            fetch, self._bound_s, f"fetching offsets of group {group!r}"
        )
        return out

    async def store_offsets(self, group: str, offsets: Offsets) -> None:
        _, admin = self._require()
        by_topic: dict[str, list[tuple[int, int, str]]] = {}
        for (topic, p), offset in offsets.items():
            by_topic.setdefault(topic, []).append((int(p), int(offset), ""))
        if not by_topic:
            return

        async def send() -> None:
            coordinator = self._group_coordinators.get(group)
            if coordinator is None:
                coordinator = await admin.find_coordinator(group)
                self._group_coordinators[group] = coordinator
            # generation -1 and no member: a commit for a group without members
            request = OffsetCommitRequest(group, OffsetCommitRequest.DEFAULT_GENERATION_ID, "",
                                          OffsetCommitRequest.DEFAULT_RETENTION_TIME,
                                          list(by_topic.items()))
            try:
                resp = await admin._send_request(request, coordinator)
                for topic, parts in resp.topics:
                    for partition, code in parts:
                        if code:
                            raise for_code(code)(f"OffsetCommit {topic}[{partition}]")
            except KafkaError:
                self._group_coordinators.pop(group, None)
                raise

        await _retrying(send, self._bound_s, f"storing offsets of group {group!r}")

    async def prefixed_topics(self) -> dict[str, int]:
        _, admin = self._require()
        names = await _retrying(admin.list_topics, self._bound_s, "list_topics")
        mine = sorted(n for n in names if n.startswith(self.topics.prefix))
        for n in mine:  # counts grow (add_partitions by another process): read them again
            self._partition_counts.pop(n, None)
        return {n: await self.partitions_for(n) for n in mine}

    async def prefixed_groups(self) -> list[str]:
        """The consumer groups under this log's prefix (processors, effect runners, workers)."""
        _, admin = self._require()
        groups = await _retrying(admin.list_consumer_groups, self._bound_s,
                                 "list_consumer_groups")
        return sorted(g[0] for g in groups if str(g[0]).startswith(self.topics.prefix))

    async def set_committed(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Store ``group``'s next offsets without joining it (a restore, while no member of
        the group runs): a consumer with a manual assignment commits them."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, group_id=group,
                                    enable_auto_commit=False,
                                    client_id=f"{self.client_id}-restore",
                                    request_timeout_ms=self.request_timeout_ms,
                                    **self.auth.client_kwargs())
        try:
            await _bounded(consumer.start(), self._bound_s, "restore consumer connect")
            tps = {TopicPartition(t, p): OffsetAndMetadata(o, "")
                   for (t, p), o in offsets.items()}
            consumer.assign(list(tps))
            await _bounded(consumer.commit(tps), self._bound_s, f"commit of group {group!r}")
        except KafkaError as exc:
            raise LogUnavailable(f"kafka: storing offsets of group {group!r}: {exc!r}") from exc
        finally:
            await stop_client(consumer, 10)

    # ------------------------------------------------------------------ ownership

    async def acquire(self, partition: int, owner_id: str) -> KafkaPartitionOwner:
        self._require()
        txn_id = f"{self.topics.prefix}processor-p{partition}"
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            client_id=f"{self.client_id}-{owner_id}-p{partition}",
            transactional_id=txn_id,
            transaction_timeout_ms=self.transaction_timeout_ms,
            enable_idempotence=True,
            acks="all",
            linger_ms=0,
            max_batch_size=512 * 1024,
            compression_type=self._compression,
            request_timeout_ms=self.request_timeout_ms,
            # retries are mostly KIP-890 verification refusals of a produce sent right
            # after the previous commit (answered NOT_ENOUGH_REPLICAS to aiokafka's produce
            # version); each one waited the whole back-off at the old setting
            retry_backoff_ms=2,
            **self.auth.client_kwargs(),
        )
        try:
            # InitProducerId: bumps the epoch of txn_id, fencing older producers (and aborting
            # or completing their open transaction).
            await start_client(producer, self._bound_s, f"InitProducerId for {txn_id}")
        except KafkaError as exc:  # no broker to bootstrap from, ...
            raise LogUnavailable(f"kafka: InitProducerId for {txn_id} failed: {exc!r}"
                                 ) from exc
        owner = KafkaPartitionOwner(self, partition, owner_id, producer)
        self._owners.add(owner)
        return owner

    # ------------------------------------------------------------------ groups

    def group_consumer(
        self,
        group: str,
        topics: Sequence[str],
        member_id: str,
        on_assigned: RebalanceCallback | None = None,
        on_revoked: RebalanceCallback | None = None,
        wake_on: Sequence[str] = (),  # the broker wakes its consumers: not needed
        settle_s: float = 0.0,  # the broker's group.initial.rebalance.delay.ms decides
    ) -> KafkaGroupConsumer:
        self._require()
        return KafkaGroupConsumer(self, group, list(topics), member_id, on_assigned, on_revoked)


class KafkaPartitionOwner:
    """The single writer of input partition ``partition``: a transactional producer."""

    def __init__(
        self, log_: KafkaEventLog, partition: int, owner_id: str, producer: AIOKafkaProducer
    ) -> None:
        self._log = log_
        self.partition = partition
        self.owner_id = owner_id
        self._producer: AIOKafkaProducer | None = producer
        self._lock = asyncio.Lock()
        self._dead: str | None = None
        # wait after each commit until committed readers see it (see the module docstring);
        # a processor turns this off for its own owners (ProcessorConfig.await_visible)
        self.await_visible: bool = log_.await_visible
        self._late_tps: set[TopicPartition] = set()  # partitions then() wrote last time
        # the next offset of our own partition of ``events`` (None: unknown — learnt from
        # the first commit that writes there), and how often a prediction was wrong
        self._next_event: int | None = None
        self.predicted = 0  # commits made the one-round-trip way
        self.mispredicted = 0
        txn = getattr(producer, "_txn_manager", None)
        self.epoch: int = int(getattr(txn, "producer_epoch", 0) or 0)
        self.producer_id: int = int(getattr(txn, "producer_id", -1))

    @property
    def transactional_id(self) -> str:
        return f"{self._log.topics.prefix}processor-p{self.partition}"

    async def commit(
        self,
        records: Sequence[OutRecord],
        consumed: Offsets,
        group: str,
        then: ThenCallback | None = None,
    ) -> list[Position]:
        async with self._lock:
            if self._dead is not None or self._producer is None:
                raise Fenced(f"{self.transactional_id}: owner is no longer usable ({self._dead})")
            producer = self._producer
            placed = await self._log._placed(records)
            offsets = {
                TopicPartition(t, p): OffsetAndMetadata(o, "") for (t, p), o in consumed.items()
            }
            positions: list[Position] | None = None
            if then is not None and self._predictable(placed):
                try:
                    positions = await self._transaction(producer, placed, offsets, group, then,
                                                        predict=True)
                except _Mispredicted as exc:  # aborted: nothing of it is visible
                    self.mispredicted += 1
                    log.warning("%s: %s; committing the plain way", self.transactional_id, exc)
            if positions is None:
                positions = await self._transaction(producer, placed, offsets, group, then,
                                                    predict=False)
        if self.await_visible:
            await self._await_visible(positions, offsets, group)
        return positions

    def _predictable(self, placed: list[tuple[OutRecord, int]]) -> bool:
        """Whether every record goes to this owner's own partition of ``events``, whose next
        offset we know (see "Predicted positions" in the module docstring)."""
        if self._next_event is None or not placed:
            return False
        events = self._log.topics.events
        return all(rec.topic == events and p == self.partition for rec, p in placed)

    def _learn(self, placed: list[tuple[OutRecord, int]], metas: Sequence[Any]) -> None:
        """After a commit: the next offset of our ``events`` partition is the last record's
        + 2 (its commit marker takes one offset); unchanged if the commit wrote none there."""
        events = self._log.topics.events
        # metas goes on past placed with the late records (then()): zip stops at placed
        last = [m.offset for (rec, p), m in zip(placed, metas, strict=False)
                if rec.topic == events and p == self.partition]
        if last:
            self._next_event = last[-1] + 2

    async def _transaction(
        self, producer: AIOKafkaProducer, placed: list[tuple[OutRecord, int]],
        offsets: dict[TopicPartition, OffsetAndMetadata], group: str,
        then: ThenCallback | None, predict: bool,
    ) -> list[Position]:
        """One transaction: the records, ``then``'s records, the consumed offsets.

        ``predict``: ``then`` gets the predicted positions of the records and everything goes
        out at once; acks that differ from the prediction abort it (``_Mispredicted``).
        Otherwise ``then`` gets the acknowledged positions, and its records follow them.
        """
        bound = self._log._bound_s
        predicted: list[Position] = []
        late_placed: list[tuple[OutRecord, int]] = []
        if predict:
            assert then is not None and self._next_event is not None
            base = self._next_event
            predicted = [Position(rec.topic, p, base + i) for i, (rec, p) in enumerate(placed)]
            late_placed = await self._log._placed(then(predicted))
        futures: list[asyncio.Future[Any]] = []
        offsets_sent: asyncio.Future[Any] | None = None
        try:
            await _bounded(producer.begin_transaction(), bound, "begin_transaction")
            if not predict:
                self._preadd_late_partitions(producer)
            sent = await _send_batched(producer, placed + late_placed)
            futures.extend(f for f, _ in sent)
            if offsets:
                # AddOffsetsToTxn + TxnOffsetCommit go out now, alongside the produce
                # requests (and the wait for their acks), not after them
                offsets_sent = asyncio.ensure_future(
                    producer.send_offsets_to_transaction(offsets, group))
                futures.append(offsets_sent)
            if then is not None:
                acked = await _positions(sent[:len(placed)], bound, "produce")
                if predict and acked != predicted:
                    raise _Mispredicted(f"predicted offsets from {predicted[0].offset}, "
                                        f"acknowledged from {acked[0].offset}")
                if not predict:  # then() builds records that carry the acked positions
                    late_placed = await self._log._placed(then(acked))
                    late_sent = await _send_batched(producer, late_placed)
                    sent += late_sent
                    futures.extend(f for f, _ in late_sent)
            if offsets_sent is not None:
                await _bounded(offsets_sent, bound, "send_offsets_to_transaction")
            await _bounded(producer.commit_transaction(), bound, "commit_transaction")
            metas = await _positions(sent, bound, "produce")
        except BaseException as exc:
            self._next_event = None
            _retrieve_exceptions(futures)
            await self._fail(producer, exc)  # aborts; raises exc itself, or Fenced
            raise AssertionError("unreachable") from exc  # pragma: no cover - _fail always raises
        # explicitly placed late records (a processor's replies) land on the same
        # partitions every time: registered up front next time
        self._late_tps = {TopicPartition(rec.topic, p) for rec, p in late_placed
                          if rec.partition is not None}
        self._learn(placed, metas)
        self.predicted += predict
        return metas

    def _preadd_late_partitions(self, producer: AIOKafkaProducer) -> None:
        """Register the partitions ``then()`` wrote last time with the new transaction now.

        aiokafka adds a partition to a transaction (AddPartitionsToTxn, one sequential
        coordinator round trip) when the first record for it is sent; ``then()``'s records
        (a processor's replies) are only sent after the first records' acks, which cost a
        second AddPartitionsToTxn round trip per transaction. Registered up front, they go
        out in the first request. Harmless when unused: the commit writes a marker there.
        Uses aiokafka's transaction manager (skipped if that internal is missing).
        """
        if not self._late_tps:
            return
        add = getattr(getattr(producer, "_txn_manager", None), "maybe_add_partition_to_txn", None)
        if add is not None:
            for tp in self._late_tps:
                add(tp)

    async def _fail(self, producer: AIOKafkaProducer, exc: BaseException) -> None:
        """Handle an exception raised inside a transaction; always raises.

        * fenced / fatal producer errors: drop the producer, raise ``Fenced``;
        * cancellation: the transaction's state is unknown; drop the producer, re-raise;
        * any other error (broker error, timeout, an exception from ``then``): abort the
          transaction; if that works the owner stays usable and ``LogUnavailable`` (Kafka
          errors, timeouts) or the original exception is raised; if the abort fails too the
          producer is dropped and ``Fenced`` raised.
        """
        txn = getattr(producer, "_txn_manager", None)
        fatal = isinstance(exc, _FATAL_TXN_ERRORS) or bool(txn and txn.is_fatal_error())
        if not fatal and not isinstance(exc, Exception):
            self._dead = f"interrupted by {exc!r}"
            await self._drop()
            raise exc
        if not fatal:
            try:
                await wait_within(producer.abort_transaction(), self._log._bound_s)
            except Exception as abort_exc:  # noqa: BLE001 - any abort failure kills the owner
                log.warning("%s: abort after %r failed: %r", self.transactional_id, exc, abort_exc)
            else:
                if isinstance(exc, (KafkaError, LogUnavailable)):
                    raise LogUnavailable(
                        f"{self.transactional_id}: transaction aborted after {exc!r}"
                    ) from exc
                raise exc
        self._dead = repr(exc)
        await self._drop()
        raise Fenced(
            f"{self.transactional_id} (epoch {self.epoch}) fenced or unusable: {exc!r}"
        ) from exc

    async def _drop(self) -> None:
        producer, self._producer = self._producer, None
        self._log._owners.discard(self)
        if producer is not None:
            await stop_client(producer, 10)
            _retrieve_exceptions(_internal_futures(producer))

    async def _await_visible(
        self, positions: list[Position], offsets: dict[TopicPartition, OffsetAndMetadata],
        group: str,
    ) -> None:
        """Wait (bounded) until committed readers see the transaction we just committed."""
        want: dict[TopicPartition, int] = {}
        for pos in positions:
            tp = TopicPartition(pos.topic, pos.partition)
            want[tp] = max(want.get(tp, 0), pos.offset + 1)
        deadline = time.monotonic() + _VISIBILITY_TIMEOUT_S
        waits = _VISIBILITY_POLL.delays()
        while want or offsets:
            if want:
                lso = await self._log._end_offsets(want)
                want = {tp: o for tp, o in want.items() if lso.get(tp, -1) < o}
            if offsets:
                stored = await self._log._committed_many(group, list(offsets))
                offsets = {
                    tp: m for tp, m in offsets.items() if stored.get(tp) != m.offset
                }
            if not (want or offsets):
                return
            if time.monotonic() > deadline:
                log.warning(
                    "%s: transaction committed but not yet visible after %.0fs "
                    "(partitions %s, offsets %s)",
                    self.transactional_id, _VISIBILITY_TIMEOUT_S, list(want), list(offsets),
                )
                return
            await asyncio.sleep(next(waits))

    async def close(self) -> None:
        async with self._lock:
            if self._dead is None:
                self._dead = "closed"
            await self._drop()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, gc: KafkaGroupConsumer) -> None:
        self._gc = gc

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._gc._revoked({(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._gc._assigned({(tp.topic, tp.partition) for tp in assigned})


class KafkaGroupConsumer:
    """A consumer-group member over ``topics`` (read_committed, manual offset commits)."""

    def __init__(
        self,
        log_: KafkaEventLog,
        group: str,
        topics: list[str],
        member_id: str,
        on_assigned: RebalanceCallback | None,
        on_revoked: RebalanceCallback | None,
    ) -> None:
        self._log = log_
        self.group = group
        self.topics = topics
        self.member_id = member_id
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._sought: set[tuple[str, int]] | None = None
        self._settled = False  # the last rebalance callback was an assignment, completed
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=log_.bootstrap_servers,
            client_id=f"{log_.client_id}-{member_id}",
            group_id=group,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=log_.request_timeout_ms,
            session_timeout_ms=int(GROUP_SESSION_TIMEOUT_S * 1000),
            heartbeat_interval_ms=1000,
            # partitions added to a topic (add_partitions) are seen, and assigned, at the
            # next metadata refresh: within seconds, not aiokafka's default 5 minutes
            metadata_max_age_ms=_GROUP_METADATA_MAX_AGE_MS,
            fetch_max_wait_ms=log_.fetch_max_wait_ms,
            max_partition_fetch_bytes=4 * 1024 * 1024,
            **log_.auth.client_kwargs(),
        )
        self._started = False

    async def _assigned(self, assigned: set[tuple[str, int]]) -> None:
        self._sought = set()
        try:
            if self._on_assigned is not None:
                await self._on_assigned(set(assigned))
            self._settled = True
            # Fetch the committed offsets only now: the callback may have started the
            # partition's transactional producer, completing an older owner's transaction.
            # (Should this fail, aiokafka starts such a partition at its committed offset.)
            # A member may seek a partition while this runs (one it took over in the
            # background after its callback returned): that seek is the newer one.
            for topic, partition in sorted(assigned - self._sought):
                tp = TopicPartition(topic, partition)
                offset = await self._consumer.committed(tp)
                if (offset is not None and offset >= 0
                        and (topic, partition) not in self._sought):
                    self._consumer.seek(tp, offset)
        finally:
            self._sought = None

    async def _revoked(self, revoked: set[tuple[str, int]]) -> None:
        self._settled = False  # a rebalance begins
        if self._on_revoked is not None and revoked:
            await self._on_revoked(set(revoked))

    async def start(self) -> None:
        if self._started:
            return
        await start_client(self._consumer, self._log._bound_s, "group consumer connect")
        wait_long_when_idle(self._consumer)
        self._consumer.subscribe(self.topics, listener=_Listener(self))
        self._started = True

    def fetch_wait_ms(self) -> int | None:
        """The fetch wait its next request asks of the broker (``chronolog.log.kafka_fetch_wait``:
        long while idle, short while records flow); None before it started."""
        return fetch_wait_ms(self._consumer)

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def joined(self) -> bool:
        # aiokafka forgets the coordinator when a heartbeat or commit finds it gone (a broker
        # down); its private attribute is read defensively (missing: assume known)
        coordinator = getattr(self._consumer, "_coordinator", None)
        known = getattr(coordinator, "coordinator_id", 0) is not None
        return self._started and self._settled and known

    async def getmany(self, timeout_ms: int = 200, max_records: int = 500) -> list[Record]:
        batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        out: list[Record] = []
        for msgs in batches.values():
            out.extend(_to_record(m) for m in msgs)
        return out

    def seek(self, topic: str, partition: int, offset: int) -> None:
        if self._sought is not None:
            self._sought.add((topic, partition))
        self._consumer.seek(TopicPartition(topic, partition), offset)

    async def commit(self, offsets: Offsets) -> None:
        if not offsets:
            return
        await _bounded(
            self._consumer.commit(
                {TopicPartition(t, p): o for (t, p), o in offsets.items()}
            ),
            self._log._bound_s,
            "offset commit",
        )

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        await stop_client(self._consumer, self._log._bound_s)

