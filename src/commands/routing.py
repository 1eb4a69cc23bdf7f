"""A partition's routing view as an aggregate: ``decide_routing`` and ``evolve_routing``.

Every partition folds its own view of the routing (docs/design.md §18) from its own log, on
the key ``routing_key()`` (``ROUTING_ID``): the routing versions it knows (``RoutingTable``)
and where it stands in them (``PartitionRouting``: the version it serves, the handover-dones
it has read). So a takeover — a fold from offset 0, or a snapshot plus the tail — has the
same view as the owner before it, and ``place`` (``chronolog.domain.routing``) answers the
same for every command.

Its commands are addressed to a partition, not placed by the key's hash:

* ``BeginHandover`` — routing version ``to_version`` is under way. The partition learns the
  versions (``RoutingVersionAdded``) and, when it serves the version before, hands over
  (``HandedOver``) and sends its ``HandoverDone`` to every other partition of the new
  version. The processor moves the keys whose home changes in the same transaction, ahead
  of those commands (``decider.move_out``, ``quota.move_out_quota``).
* ``HandoverDone`` — a sender's keys are all here: ``HandoverReceived`` (after
  ``RoutingVersionAdded`` when it names versions the partition did not know: a partition
  that a version adds learns it from the first handover-done it reads, whatever the order
  in which the partitions are sent ``BeginHandover``).

A repeated command changes nothing. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypeGuard, assert_never, get_args

import orjson

from chronolog.commands.aggregate import PROCESSOR, Aggregate, Decision, Draft, Send, TenantContext
from chronolog.commands.state_codec import StateDecodeError
from chronolog.domain import messages as m
from chronolog.domain.ids import ROUTING_ID, routing_key
from chronolog.domain.routing import (
    HERE,
    Forward,
    Here,
    PartitionRouting,
    RoutingTable,
    RoutingVersion,
    place,
)

__all__ = [
    "RoutingAggregate",
    "RoutingView",
    "decide_routing",
    "decode_view",
    "encode_view",
    "evolve_routing",
    "handover_command_id",
    "routing_aggregate",
    "routing_key",
    "table_of",
]


def table_of(partitions: tuple[int, ...] | list[int]) -> RoutingTable:
    """The table of these partition counts (oldest first), the last one still migrating
    when there are several (``ValueError`` for counts that make no table)."""
    versions = tuple(RoutingVersion(i + 1, n) for i, n in enumerate(partitions))
    return RoutingTable(versions, max(1, len(versions) - 1))


@dataclass(frozen=True, slots=True)
class RoutingView:
    """One partition's routing view: the versions it knows and where it stands.

    ``routing`` is None while no version it knows has the partition (a partition added by
    a change whose ``BeginHandover`` it has not read yet); the handover-dones it reads
    meanwhile wait in ``early``."""

    partition: int
    table: RoutingTable
    routing: PartitionRouting | None
    early: frozenset[tuple[int, int]] = field(default_factory=frozenset)

    @classmethod
    def initial(cls, partition: int, table: RoutingTable) -> RoutingView:
        """Before any routing event of the partition: the deployment's first table."""
        routing = (PartitionRouting.initial(partition, table)
                   if partition < table.partitions else None)
        return cls(partition, table, routing)

    def place(self, key_hash: int, held: bool) -> Here | Forward:
        """Where a command for the key is decided (``domain.routing.place``). A partition no
        known version has sends it to the key's home in the version clients route by."""
        if held:
            return HERE
        if self.routing is None:
            return Forward(self.table.current.home(key_hash))
        return place(key_hash, held, self.routing, self.handing_over_to())

    def may_hold(self, key_hash: int) -> bool:
        """Whether the key's home is this partition in some version it knows (a command on
        any other partition was placed by a wrong partitioner)."""
        return any(v.home(key_hash) == self.partition for v in self.table.versions)

    def handing_over_to(self) -> RoutingVersion | None:
        """The version after the one served, when the table has it (the next handover)."""
        if self.routing is None:
            return None
        nxt = self.routing.serves.version + 1
        return self.table.get(nxt) if nxt <= len(self.table.versions) else None


def handover_command_id(version: int, sender: int, receiver: int) -> str:
    return f"routing:done:{version}:{sender}:{receiver}"


RoutingDecision = Decision[m.RoutingEvent]
RoutingDraft = Draft[RoutingView, m.RoutingEvent]


def decide_routing(view: RoutingView, command: m.CommandEnvelope) -> RoutingDecision:
    """Decide one command of a partition's routing view."""
    p = command.payload
    if not isinstance(p, (m.BeginHandover, m.HandoverDone)):
        return Decision(status="invalid", field="scheduleId",
                        reason=f"schedule ID '{ROUTING_ID}' is a partition's routing view")
    if command.principal != PROCESSOR:
        return Decision(status="forbidden", reason="only the processor changes the routing")
    if isinstance(p, m.HandoverDone):
        return _received(view, p)
    return _begin(view, p)


def _received(view: RoutingView, p: m.HandoverDone) -> RoutingDecision:
    """A handover-done is recorded once; the versions it names are learned first."""
    d: RoutingDraft = Draft(view, evolve_routing)
    if p.partitions:
        refused = _learn(d, p.partitions)
        if refused is not None:
            return refused
    after = d.state
    seen = after.early if after.routing is None else after.routing.received
    if (p.version, p.sender) not in seen:
        d.emit(m.HandoverReceived(version=p.version, sender=p.sender))
    return d.decision()


def _learn(d: RoutingDraft, partitions: tuple[int, ...]) -> RoutingDecision | None:
    """Emit the event that adds the versions of ``partitions`` the view does not know (none
    when it knows them all); a refusal when they do not extend the known ones."""
    known = tuple(v.partitions for v in d.state.table.versions)
    if partitions[:len(known)] != known[:len(partitions)]:
        return Decision(status="conflict", field="partitions",
                        reason=f"routing versions {list(partitions)} do not extend the "
                        f"known ones {list(known)}")
    if len(partitions) <= len(known):
        return None
    try:
        table_of(partitions)
    except ValueError as exc:
        return Decision(status="invalid", field="partitions", reason=str(exc))
    d.emit(m.RoutingVersionAdded(partitions=partitions))
    return None


def _begin(view: RoutingView, p: m.BeginHandover) -> RoutingDecision:
    """Learn the versions; hand over when this partition serves the one before."""
    if p.to_version != len(p.partitions):
        return Decision(status="invalid", field="to_version",
                        reason=f"version {p.to_version} of {len(p.partitions)} versions")
    d: RoutingDraft = Draft(view, evolve_routing)
    refused = _learn(d, p.partitions)
    if refused is not None:
        return refused
    after = d.state
    if after.routing is None:
        return Decision(status="invalid", field="partitions",
                        reason=f"no routing version has partition {view.partition}")
    serves = after.routing.serves.version
    if serves >= p.to_version:
        return d.decision()  # handed over already (or new in it): nothing to do
    if serves != p.to_version - 1:
        return Decision(status="conflict", field="to_version",
                        reason=f"partition {view.partition} serves version {serves}: it "
                        f"hands over to {serves + 1} first")
    to = after.table.get(p.to_version)
    d.emit(m.HandedOver(version=to.version))
    for q in range(to.partitions):
        if q != view.partition:
            d.send(Send(ROUTING_ID, handover_command_id(to.version, view.partition, q),
                        m.HandoverDone(version=to.version, sender=view.partition,
                                       partitions=p.partitions), partition=q))
    return d.decision()


def evolve_routing(view: RoutingView, event: m.RoutingEvent) -> RoutingView:
    """Fold one routing event (returns the new view; views are immutable)."""
    match event:
        case m.RoutingVersionAdded():
            table = table_of(event.partitions)
            routing = view.routing
            early = view.early
            if routing is None and view.partition < table.partitions:
                routing = PartitionRouting.initial(view.partition, table)
                for version, sender in sorted(early):
                    routing = routing.handover_received(version, sender)
                early = frozenset()
            return RoutingView(view.partition, table, routing, early)
        case m.HandedOver():
            assert view.routing is not None, "a partition no version has handed over"
            return replace(view, routing=view.routing.handed_over(
                view.table.get(event.version)))
        case m.HandoverReceived():
            if view.routing is None:
                return replace(view, early=view.early | {(event.version, event.sender)})
            return replace(view, routing=view.routing.handover_received(event.version,
                                                                        event.sender))
        case _:
            assert_never(event)


def encode_view(view: RoutingView) -> bytes:
    """The view as a snapshot stores it (``chronolog.processors.snapshots``)."""
    r = view.routing
    return orjson.dumps([
        view.partition, [v.partitions for v in view.table.versions], view.table.active,
        None if r is None else r.serves.version, None if r is None else sorted(r.received),
        sorted(view.early)])


def decode_view(data: bytes) -> RoutingView:
    """The view ``encode_view`` encoded (``ValueError`` for anything else)."""
    try:
        partition, counts, active, serves, received, early = orjson.loads(data)
        versions = tuple(RoutingVersion(i + 1, int(n)) for i, n in enumerate(counts))
        table = RoutingTable(versions, int(active))
        routing = None
        if serves is not None:
            now = table.get(int(serves))
            before = table.get(now.version - 1) if now.version > 1 else None
            routing = PartitionRouting(int(partition), now, before,
                                       frozenset((int(v), int(s)) for v, s in received))
        return RoutingView(int(partition), table, routing,
                           frozenset((int(v), int(s)) for v, s in early))
    except (TypeError, KeyError) as exc:
        raise ValueError(f"not a routing view: {exc}") from exc


_ROUTING_COMMANDS: tuple[type, ...] = get_args(m.RoutingCommand)
_ROUTING_EVENTS: tuple[type, ...] = get_args(m.RoutingEvent)


class RoutingAggregate:
    """One partition's routing view, on the routing key: ``decide_routing``,
    ``evolve_routing`` and the view's codec. It has no timer, and never moves: it is the
    partition's own."""

    kind = "routing"

    def __init__(self, partition: int, table: RoutingTable) -> None:
        self.partition = partition
        self.table = table

    def initial(self, tenant: str, schedule_id: str) -> RoutingView:
        return RoutingView.initial(self.partition, self.table)

    def decide(self, state: RoutingView, command: m.CommandEnvelope, now: datetime,
               tenant: TenantContext) -> RoutingDecision:
        return decide_routing(state, command)

    def evolve(self, state: RoutingView, event: m.RoutingEvent) -> RoutingView:
        return evolve_routing(state, event)

    def wakeup(self, state: RoutingView) -> datetime | None:
        return None

    def move_out(self, state: RoutingView, to_partition: int, version: int,
                 from_partition: int) -> RoutingDecision:
        return Decision(status="invalid", field="scheduleId",
                        reason="a partition's routing view stays with its partition")

    def accepts(self, payload: m.Command) -> TypeGuard[m.RoutingCommand]:
        return isinstance(payload, _ROUTING_COMMANDS)

    def owns(self, event: m.Event) -> TypeGuard[m.RoutingEvent]:
        return isinstance(event, _ROUTING_EVENTS)

    def encode(self, state: RoutingView) -> tuple[str, str | None]:
        return encode_view(state).decode(), None

    def decode(self, state: str, shape: str | None, version: int) -> RoutingView:
        try:
            return decode_view(state.encode())
        except ValueError as exc:  # orjson.JSONDecodeError is one
            raise StateDecodeError(str(exc)) from exc


def routing_aggregate(partition: int, table: RoutingTable) -> Aggregate[
        RoutingView, m.RoutingCommand, m.RoutingEvent]:
    """The routing view of ``partition`` (before its first event: ``table``)."""
    return RoutingAggregate(partition, table)
