"""The EventLog port: the one protocol every log adapter implements.

chronolog's source of truth is a partitioned, append-only log. Two adapters implement this
port for deployments — ``KafkaEventLog`` (aiokafka, transactions) and ``SqliteEventLog`` (one
WAL database file) — and a third for tests, ``MemoryEventLog`` (one process's memory); one
contract suite (``tests/contract/test_event_log.py``) runs against all three.

Vocabulary:

* a *record* is (topic, partition, offset, key, value, headers, timestamp);
* *committed* reads only return records of committed transactions (Kafka
  ``read_committed``; SQLite only ever stores committed records);
* a *PartitionOwner* is the single writer of one input partition p of ``commands``: it
  appends output records and the consumed input offsets in ONE atomic unit, and acquiring
  ownership of p fences every older owner of p (its next ``commit`` raises ``Fenced``);
* a *GroupConsumer* is a member of a consumer group over some topics, with partitions
  assigned among the live members (Kafka group protocol; SQLite: a lease table).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class LogError(Exception):
    """Base class of log adapter errors."""


class Fenced(LogError):
    """This owner was superseded by a newer owner of the partition; it must stop at once.

    Raised by ``PartitionOwner.commit`` (Kafka: ProducerFenced / OutOfOrderSequenceNumber /
    InvalidProducerEpoch; SQLite: the epoch stored for the partition is newer than ours).
    Nothing of the failed commit is visible to committed readers.
    """


class LogUnavailable(LogError):
    """The log could not be reached within the configured bound."""


class LogUnsafe(LogError):
    """The log, as configured, cannot keep chronolog's guarantees (a Kafka cluster with too
    few replicas, or unclean leader election: ``chronolog.log.durability``). A process refuses
    to start on it: exit status 2, the message naming every setting."""


class LogFull(LogUnavailable):
    """The log's disk is full (the embedded SQLite log: SQLITE_FULL). Nothing of the failed
    write is visible; writes succeed again once space is freed, so it is an unavailability
    that passes, not corruption (``chronolog audit`` passes on the log afterwards)."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record landed: enough to wait for a projection to reach it."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """A committed record read from the log."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class OutRecord:
    """A record to append. ``partition=None`` means murmur2(key) mod the topic's count."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def pool_class(pool: str, resource_class: str) -> str:
    """The ``ready.`` suffix of a pool's assignments: ``pool-<pool>.<class>`` (resource
    classes named ``pool-...`` are refused, so the names cannot collide)."""
    return f"pool-{pool}.{resource_class}"


# consumer group names, under the topics' prefix
PROCESSOR_GROUP_SUFFIX = "processors"
EFFECTS_GROUP_SUFFIX = "effects"
# the workers' groups are ``<prefix>workers.[pool-<pool>.]<digest of the job types>``
# (``chronolog.workers.runtime.worker_group``)
WORKER_GROUP_SUFFIX = "workers"


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names under a prefix (default ``chronolog.``) and the shared partition count."""

    prefix: str = "chronolog."
    partitions: int = 12

    @property
    def processor_group(self) -> str:
        """The consumer group of the processors on ``commands`` (its committed offsets are
        the commands decided; the dashboard reads its lag)."""
        return f"{self.prefix}{PROCESSOR_GROUP_SUFFIX}"

    @property
    def effects_group(self) -> str:
        """The consumer group of the effect runners on ``events`` (``chronolog.effects``)."""
        return f"{self.prefix}{EFFECTS_GROUP_SUFFIX}"

    @property
    def projector_group(self) -> str:
        """Where projectors publish how far they have applied ``events`` (offsets stored with
        ``EventLog.store_offsets``; the read model's own offsets stay in its database): the
        log's pruning waits for it."""
        return f"{self.prefix}projector"

    @property
    def commands(self) -> str:
        return f"{self.prefix}commands"

    @property
    def events(self) -> str:
        return f"{self.prefix}events"

    @property
    def replies(self) -> str:
        return f"{self.prefix}replies"

    @property
    def dlq(self) -> str:
        """Dead letters of every consumer (``chronolog.log.dead_letters``)."""
        return f"{self.prefix}dlq"

    def ready(self, resource_class: str) -> str:
        return f"{self.prefix}ready.{resource_class}"

    def ready_for(self, resource_class: str, pool: str | None) -> str:
        """Where the assignments of a worker of ``pool`` (None: pool-less) are written:
        ``ready.pool-<pool>.<class>``, so a per-pool read grant on the prefix
        ``ready.pool-<pool>.`` keeps one pool's runs from another pool's workers."""
        return self.ready(resource_class if pool is None else pool_class(pool, resource_class))

    @property
    def workers(self) -> str:
        """Workers' membership records (``chronolog.domain.membership``), keyed by worker."""
        return f"{self.prefix}workers"

    @property
    def effects(self) -> str:
        """Effect intents are read from ``events``; this topic carries kafka-effect output."""
        return f"{self.prefix}effects.out"

    @property
    def state(self) -> str:
        """Processors' snapshots of their partitions' states (``chronolog.processors.snapshots``):
        compacted, keyed ``tenant/schedule_id``, the same partition count as ``events``.
        Derived data: ``events`` stays the source of truth."""
        return f"{self.prefix}state"

    @property
    def routing(self) -> str:
        """The deployment's routing history (``chronolog.log.routing_history``): one
        partition, a record per change of the partition count."""
        return f"{self.prefix}routing"

    @property
    def audit(self) -> str:
        """Where ``chronolog audit`` keeps its checkpoint (``chronolog.log.audit_checkpoints``):
        compacted, one partition."""
        return f"{self.prefix}audit"

    def follows_processors(self, topic: str) -> bool:
        """Whether partition p of ``topic`` belongs with partition p of ``commands`` (its
        owner writes or reads it there): commands, events, state, replies and every
        ``ready.<class>``. A change of the partition count grows these (§18)."""
        return topic in (self.commands, self.events, self.state, self.replies) or (
            topic.startswith(f"{self.prefix}ready."))

    @property
    def compacted(self) -> tuple[str, ...]:
        """The topics that keep only the latest record of each key (``state``, ``audit``):
        Kafka's ``cleanup.policy=compact``; on the embedded log an append replaces the key's
        record."""
        return (self.state, self.audit)


def refuse_deletion(topic: str, partition: int, offset: int, end: int,
                    compacted: bool) -> None:
    """What every adapter's ``delete_before`` refuses (``LogError``): a compacted topic, an
    offset past the partition's end."""
    if compacted:
        raise LogError(f"{topic!r} is compacted: its records are not deleted by offset")
    if offset > end:
        raise LogError(f"cannot delete {topic}[{partition}] below {offset}: its end is {end}")


# (topic, partition) -> the NEXT offset to consume (Kafka convention: last consumed + 1)
Offsets = Mapping[tuple[str, int], int]

# A record with this header (its value: a name) wakes, on a log that wakes its readers itself
# (the embedded log's doorbell), the group members waiting on that name (``wake_on``) instead
# of every reader of its topic: a reply wakes the client it answers, not every client.
WAKE_HEADER = "chronolog-wake"

# Given the positions of a commit's records, the records to append after them (same txn).
ThenCallback = Callable[[list["Position"]], Sequence["OutRecord"]]


@runtime_checkable
class PartitionOwner(Protocol):
    """Exclusive writer for one input partition (a processor's transactional producer)."""

    partition: int
    epoch: int

    async def commit(
        self,
        records: Sequence[OutRecord],
        consumed: Offsets,
        group: str,
        then: ThenCallback | None = None,
    ) -> list[Position]:
        """Append ``records`` and store ``consumed`` as ``group``'s offsets, atomically.

        Either everything becomes visible to committed readers, or nothing does.
        ``then(positions_of_records)``, when given, is called inside the same atomic unit
        once ``records`` have their positions, and the records it returns are appended in
        the same transaction (a processor's replies carry the positions of their events).
        ``then`` may be called more than once (an adapter may call it with predicted
        positions and abort if they prove wrong): only records built from the real
        positions are ever committed, so it must depend on nothing but its argument.
        Raises ``Fenced`` when a newer owner of this partition exists.
        Returns the positions of ``records`` followed by those of ``then``'s records.
        """
        ...

    async def close(self) -> None:
        """Release resources (not ownership: a newer owner fences us anyway)."""
        ...


@runtime_checkable
class MultiCommit(Protocol):
    """Optional capability of an ``EventLog``: several owners' commits in one unit of I/O.

    Not part of ``EventLog`` (Kafka has one transactional producer per partition, so its
    commits cannot share a transaction); a caller checks ``isinstance(log, MultiCommit)`` or
    ``getattr(log, "commit_many", None)`` and otherwise calls each ``owner.commit``.

    Each batch ``(owner, records, consumed, group, then)`` keeps exactly the semantics of
    ``owner.commit(records, consumed, group, then)``: atomic by itself, ``Fenced`` when a
    newer owner exists (nothing of that batch visible). Result i is batch i's positions or
    the exception its commit would have raised. The batches are NOT atomic together: a
    fenced owner's batch is left out while the others commit. One owner may have several
    batches in one call: they apply in order, and once one of them fails its later batches
    fail too (a later batch was decided on the state the failed one left behind).
    """

    async def commit_many(
        self,
        batches: Sequence[
            tuple[PartitionOwner, Sequence[OutRecord], Offsets, str, ThenCallback | None]
        ],
    ) -> list[list[Position] | BaseException]: ...


@runtime_checkable
class KafkaCluster(Protocol):
    """Optional capability of an ``EventLog``: the log is a Kafka cluster other clients join.

    Not part of ``EventLog`` (the embedded log has no broker). A caller checks
    ``isinstance(log, KafkaCluster)``: the Kafka effect adapter then publishes through its own
    transactional producer on ``bootstrap_servers`` (the result, the outcome command and the
    runner's group offset in one Kafka transaction); on any other log it appends.
    """

    bootstrap_servers: str


# Called with the partitions newly assigned / revoked for a GroupConsumer.
RebalanceCallback = Callable[[set[tuple[str, int]]], Awaitable[None]]


@runtime_checkable
class GroupConsumer(Protocol):
    """A member of a consumer group; partitions are spread across live members."""

    async def start(self) -> None:
        """Join the group; ``on_assigned`` runs before records of new partitions flow."""
        ...

    def assignment(self) -> set[tuple[str, int]]:
        """The (topic, partition) pairs currently assigned to this member."""
        ...

    def joined(self) -> bool:
        """Whether this member is in its group now: its assignment is settled (no rebalance
        under way) and the group still knows it (Kafka: a coordinator is known; SQLite: its
        last heartbeat was written within the session timeout). Readiness, not safety."""
        ...

    async def getmany(self, timeout_ms: int = 200, max_records: int = 500) -> list[Record]:
        """Committed records from the assigned partitions, from each one's position."""
        ...

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Set the next offset to read for an assigned partition."""
        ...

    async def commit(self, offsets: Offsets) -> None:
        """Store the group's offsets (non-transactional: workers' hint acknowledgements)."""
        ...

    async def close(self) -> None:
        """Leave the group."""
        ...


@runtime_checkable
class EventLog(Protocol):
    """The partitioned append-only log."""

    topics: Topics

    async def start(self) -> None:
        """Connect (Kafka) or open the file (SQLite)."""
        ...

    async def close(self) -> None: ...

    async def ensure_topics(self, ready_classes: Sequence[str] = ("default",)) -> None:
        """Create every topic idempotently: commands/events/state with ``topics.partitions``,
        ``topics.compacted`` as compacted topics.

        A compacted topic keeps at least the latest committed record of every key: reading a
        partition from offset 0 and keeping each key's last value gives every key's latest
        value (Kafka removes older values some time later; the embedded log at once)."""
        ...

    async def ensure_topic(self, topic: str, partitions: int | None = None) -> int:
        """Create one topic idempotently (``partitions``: default ``topics.partitions``).

        Returns the topic's partition count: an existing topic keeps its own count, whatever
        ``partitions`` says. For a topic outside chronolog's own set (an effect's result topic
        on the embedded log)."""
        ...

    async def partitions_for(self, topic: str) -> int:
        """The partition count of an existing topic; ``LogError`` for an unknown one."""
        ...

    async def prefixed_topics(self) -> dict[str, int]:
        """Every topic under this log's prefix (``topics.prefix``), by name, with its
        partition count as stored now."""
        ...

    async def partition_count(self, topic: str) -> int:
        """The partition count of an existing topic as the log has it now: partitions any
        process added since this one first asked are counted (``partitions_for`` may answer
        a count learned earlier). A metadata request on Kafka, a query on SQLite: for a
        reader that follows a growing topic every few seconds, not for every record."""
        ...

    async def add_partitions(self, topic: str, partitions: int) -> int:
        """Grow ``topic`` to ``partitions`` partitions; returns its count after (a topic never
        shrinks: a count at or below the current one changes nothing). Records keep the
        partition they were written to; a keyed append hashes over the count the appending
        process knows, which may lag (so a partition owner must route what arrives —
        docs/design.md §18). Other processes see the new partitions within seconds: their
        group consumers are assigned them, and writing to or reading one refreshes the
        count."""
        ...

    async def append(self, records: Sequence[OutRecord]) -> list[Position]:
        """Non-transactional, durable append to existing topics (any topic of the log, e.g.
        clients emitting commands). Atomic on the embedded log, per record on Kafka."""
        ...

    async def read(
        self, topic: str, partition: int, offset: int, max_records: int = 1000,
        timeout_ms: int = 0,
    ) -> list[Record]:
        """Committed records of one partition from ``offset`` (inclusive), oldest first.

        Waits up to ``timeout_ms`` for at least one record when none is there yet.
        """
        ...

    async def end_offset(self, topic: str, partition: int) -> int:
        """The offset after the last committed record (Kafka: the last stable offset)."""
        ...

    async def start_offset(self, topic: str, partition: int) -> int:
        """The offset of the oldest record the partition still holds (Kafka's log start
        offset): 0 until ``delete_before`` removed records; the end offset when it removed
        them all. A read from below it returns records from it."""
        ...

    async def delete_before(self, topic: str, partition: int, offset: int) -> int:
        """Remove the partition's records below ``offset`` (Kafka's DeleteRecords) and
        return the start offset after. Only a prefix ever goes: the embedded logs delete in
        bounded batches, each its own transaction, oldest first, so a process killed half-way
        has removed a shorter prefix, never a hole. An ``offset`` at or below the start
        changes nothing; past the end, or on a compacted topic, it is refused
        (``LogError``). Deciding what may go is the caller's (``chronolog.processors.pruning``)."""
        ...

    async def write_quorum(self) -> str | None:
        """None when enough of the log's replicas are there to accept a write; else why not
        (Kafka: fewer brokers answer than the topics' min ISR; the embedded log: always
        None). Cheap and bounded: readiness probes call it every few seconds."""
        ...

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's stored next offset for the partition, or None."""
        ...

    async def store_offsets(self, group: str, offsets: Offsets) -> None:
        """Record ``offsets`` as ``group``'s committed offsets outside any membership (a
        group with no members: Kafka's "simple" offset commit): how a reader that keeps its
        own position elsewhere (the projector, in its database) tells the log how far it
        has read, so that the log's pruning waits for it. ``committed`` reads them."""
        ...

    async def acquire(self, partition: int, owner_id: str) -> PartitionOwner:
        """Become the single writer for input partition ``partition``, fencing older owners."""
        ...

    def group_consumer(
        self,
        group: str,
        topics: Sequence[str],
        member_id: str,
        on_assigned: RebalanceCallback | None = None,
        on_revoked: RebalanceCallback | None = None,
        wake_on: Sequence[str] = (),
        settle_s: float = 0.0,
    ) -> GroupConsumer:
        """Join ``group`` over ``topics`` (start it with ``await gc.start()``).

        ``wake_on``: the ``WAKE_HEADER`` values of records this member waits for besides
        records of its topics without that header (a hint for logs that wake their readers
        themselves; a log whose readers are woken by the broker ignores it).
        ``settle_s``: a group that forms (every member joined a moment ago) gets its first
        assignment once no member has joined for this long, not at each join (a log whose
        broker assigns ignores it: Kafka's ``group.initial.rebalance.delay.ms``)."""
        ...


@dataclass
class RecordBatch:
    """A convenience accumulator for a processor batch (outputs + consumed offsets)."""

    records: list[OutRecord] = field(default_factory=list)
    consumed: dict[tuple[str, int], int] = field(default_factory=dict)
