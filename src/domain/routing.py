"""Routing versions: which partition holds a schedule key while the partition count changes.

A key is placed on partition ``h % P`` of ``commands`` / ``events`` / ``state``, where ``h``
is the key's positive murmur2 hash (``chronolog.log.partitioner``) and ``P`` the partition
count of a *routing version*. Changing P (docs/design.md §18) adds routing version v+1 with
the new count; until every partition has handed its keys over to v+1, a key has two
candidate homes — ``old = h % P_v`` and ``new = h % P_v+1`` — and exactly one of them holds
its state at any moment. This module holds the rule each partition owner applies to a
command for a key it does not hold: decide it here, or forward it (append it, in the
owner's transaction, to the partition that may hold it).

A partition's view (``PartitionRouting``) is folded from its own log:

* the routing version it *serves*. A partition serves v until it has handed over — every
  key whose home in v+1 is elsewhere moved out, in one transaction with a *handover-done*
  command to every partition of v+1 — then v+1. A partition that no earlier version had
  serves the first version that has it, from the start.
* ``received``: the partitions whose handover-done for the version it serves it has read.
  A handover-done is appended after every key its sender moves to it, so once it is read,
  nothing more of the sender's keys is on its way.

``place`` never sends a command around in a circle: a key's new home forwards its commands to
the old home only until it has read the old home's handover-done; the old home forwards them
back only after its handover, whose handover-done is ahead of the forwarded command in the
new home's partition — the second time, the new home decides it. A partition that is a key's
home in v+1 but still serves v decides a command for it once it has read the handover-done of
the key's home in v, rather than send it back there. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HERE", "Forward", "Here", "PartitionRouting", "RoutingChange", "RoutingTable",
           "RoutingVersion", "follow", "place"]


@dataclass(frozen=True, slots=True)
class RoutingVersion:
    """One routing version: keys are placed on ``hash % partitions``."""

    version: int
    partitions: int

    def home(self, key_hash: int) -> int:
        return key_hash % self.partitions


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """The deployment's routing versions, oldest first, and the one clients route by.

    ``active`` is the last version whose change completed: clients send a key's commands to
    its home there (a partition owner forwards whatever moved since). A change under way is
    the one version after ``active`` (``migrating``)."""

    versions: tuple[RoutingVersion, ...] = (RoutingVersion(1, 12),)
    active: int = 1

    def __post_init__(self) -> None:
        numbers = [v.version for v in self.versions]
        if not numbers or numbers != list(range(1, len(numbers) + 1)):
            raise ValueError(f"routing versions must be 1, 2, ... in order, got {numbers}")
        if any(v.partitions < 1 for v in self.versions):
            raise ValueError("a routing version needs at least one partition")
        if not len(numbers) - 1 <= self.active <= len(numbers):
            raise ValueError(f"active version {self.active} of {numbers}: only the last "
                             "version may still be migrating")

    @classmethod
    def initial(cls, partitions: int) -> RoutingTable:
        return cls((RoutingVersion(1, partitions),), 1)

    def get(self, version: int) -> RoutingVersion:
        if not 1 <= version <= len(self.versions):
            raise KeyError(f"no routing version {version}")
        return self.versions[version - 1]

    @property
    def current(self) -> RoutingVersion:
        """The version clients route by."""
        return self.get(self.active)

    @property
    def migrating(self) -> RoutingVersion | None:
        """The version a change under way moves keys to (None: no change under way)."""
        last = self.versions[-1]
        return last if last.version > self.active else None

    @property
    def partitions(self) -> int:
        """The partitions that exist: the largest count of any version (a change adds
        partitions, never removes one; one that no version uses any more stays empty)."""
        return max(v.partitions for v in self.versions)

    def begin(self, partitions: int) -> RoutingTable:
        """This table with a change to ``partitions`` under way (``ValueError`` while another
        is, or for the count already active)."""
        if self.migrating is not None:
            raise ValueError(f"a change to {self.migrating.partitions} partitions is under "
                             "way: it must complete first")
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        if partitions == self.current.partitions:
            raise ValueError(f"the deployment has {partitions} partitions already")
        if partitions < self.current.partitions:
            # a Kafka topic never loses partitions; and the forwarding rule's bound of two
            # hops holds for a growing count only (a shrinking one can take three)
            raise ValueError(f"the partition count can only grow: {partitions} < "
                             f"{self.current.partitions}")
        return RoutingTable((*self.versions, RoutingVersion(len(self.versions) + 1,
                                                            partitions)), self.active)

    def complete(self) -> RoutingTable:
        """This table with the change under way completed (clients route by it)."""
        if self.migrating is None:
            raise ValueError("no change is under way")
        return RoutingTable(self.versions, self.active + 1)

    def first_serving(self, partition: int) -> RoutingVersion:
        """The version a partition serves before any handover of its own: the first one
        that has it (``ValueError``: no version has it)."""
        for v in self.versions:
            if partition < v.partitions:
                return v
        raise ValueError(f"partition {partition}: no routing version has it")


@dataclass(frozen=True, slots=True)
class PartitionRouting:
    """A partition owner's view of the routing, folded from its own log: the version it
    serves (``serves``), the version before it (``previous``: None for the first), and the
    handover-dones it has read, as (version, sender) — kept from the version it serves on
    (one for the next version can arrive before this partition's own handover)."""

    partition: int
    serves: RoutingVersion
    previous: RoutingVersion | None = None
    received: frozenset[tuple[int, int]] = field(default_factory=frozenset)

    @classmethod
    def initial(cls, partition: int, table: RoutingTable) -> PartitionRouting:
        """Before any event of the partition: it serves the first version that has it."""
        first = table.first_serving(partition)
        previous = table.get(first.version - 1) if first.version > 1 else None
        return cls(partition, first, previous)

    def handed_over(self, to: RoutingVersion) -> PartitionRouting:
        """After this partition's own handover to ``to`` (the version after ``serves``)."""
        if to.version != self.serves.version + 1:
            raise ValueError(f"partition {self.partition} serves version "
                             f"{self.serves.version}: it cannot hand over to {to.version}")
        kept = {r for r in self.received if r[0] >= to.version}
        return PartitionRouting(self.partition, to, self.serves,
                                frozenset(kept | {(to.version, self.partition)}))

    def handover_received(self, version: int, sender: int) -> PartitionRouting:
        """After reading ``sender``'s handover-done for ``version`` (one of a version older
        than the one served is history: no change)."""
        if version < self.serves.version:
            return self
        return PartitionRouting(self.partition, self.serves, self.previous,
                                self.received | {(version, sender)})

    def has_received(self, sender: int) -> bool:
        """Whether ``sender``'s handover-done for the version served was read here."""
        return (self.serves.version, sender) in self.received


@dataclass(frozen=True, slots=True)
class Here:
    """Decide the command on this partition."""


@dataclass(frozen=True, slots=True)
class Forward:
    """Append the command to ``partition`` of ``commands`` instead of deciding it."""

    partition: int


HERE = Here()


def place(key_hash: int, held: bool, here: PartitionRouting,
          after: RoutingVersion | None = None) -> Here | Forward:
    """Where a command for the key of ``key_hash`` is decided, seen from ``here`` (``held``:
    the key's state is on this partition now; ``after``: the version after the one served,
    when this partition knows it).

    A key held here is decided here. Any other key: with ``new`` its home in the version
    this partition serves and ``old`` its home in the version before — forwarded to ``new``
    when that is another partition; decided here when it never moved (no version before, or
    ``old == new``) or its old home's handover-done was read here (it holds nothing of the
    key: the key is new); forwarded to ``old`` otherwise (the key may still be there).

    One more case, before a partition's own handover: a key whose home in the served version
    has handed over to ``after`` (its handover-done read here), and whose home in ``after``
    is this partition, is decided here — what that home moved of it came before the
    handover-done, so not held, the key is new; sent back there it would only be forwarded
    here again."""
    if held:
        return HERE
    new = here.serves.home(key_hash)
    if new != here.partition:
        if (after is not None and after.version == here.serves.version + 1
                and (after.version, new) in here.received
                and after.home(key_hash) == here.partition):
            return HERE
        return Forward(new)
    if here.previous is None:
        return HERE
    old = here.previous.home(key_hash)
    if old == new or here.has_received(old):
        return HERE
    return Forward(old)


@dataclass(frozen=True, slots=True)
class RoutingChange:
    """One record of the deployment's routing history (the log's ``routing`` topic): version
    ``version`` with ``partitions`` partitions begins (``done`` False: its handovers are
    under way) or is complete (``done`` True: clients route by it). The history starts with
    version 1, complete: the count the deployment was created with."""

    version: int
    partitions: int
    done: bool


def follow(table: RoutingTable | None, change: RoutingChange) -> RoutingTable | None:
    """The table after ``change``; a change that does not follow from ``table`` changes
    nothing (two operators beginning a change at once: the first on the log wins; a
    repeated record is a no-op). So every process folding the same history agrees."""
    if table is None:
        if change.version == 1 and change.done and change.partitions >= 1:
            return RoutingTable.initial(change.partitions)
        return None
    migrating = table.migrating
    if migrating is None:
        if (not change.done and change.version == table.active + 1
                and change.partitions > table.current.partitions):  # grows (``begin``)
            return table.begin(change.partitions)
        return table
    if change.done and change.version == migrating.version \
            and change.partitions == migrating.partitions:
        return table.complete()
    return table
