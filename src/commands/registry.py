"""The aggregates of one partition, and which of them decides a command.

A command names its aggregate by its schedule ID: a reserved ID names a tenant's quota
(``QUOTA_ID``) or one of its concurrency keys (``limit_id``, decided by the quota aggregate,
``chronolog.commands.permits``), or the partition's routing view (``ROUTING_ID``); every
other ID is a schedule's. The processor builds a ``PartitionAggregates`` for each partition
it owns (the routing view is the partition's own, so it knows the partition and the routing
table it starts from) and gives it to the partition's task, which routes each command through
``kind_of`` and decides it with that aggregate. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from chronolog.commands.aggregate import Aggregate
from chronolog.commands.decider import SCHEDULE
from chronolog.commands.quota import QUOTA
from chronolog.commands.routing import RoutingView, routing_aggregate
from chronolog.commands.state import QuotaState, ScheduleState
from chronolog.domain import messages as m
from chronolog.domain.ids import ROUTING_ID, is_quota_id
from chronolog.domain.routing import RoutingTable

__all__ = ["AggregateKind", "PartitionAggregates"]

AggregateKind = Literal["schedule", "quota", "routing"]


@dataclass(frozen=True, slots=True)
class PartitionAggregates:
    """The three aggregates a partition's task decides."""

    schedule: Aggregate[ScheduleState, m.ScheduleCommand, m.ScheduleEvent]
    quota: Aggregate[QuotaState, m.QuotaCommand, m.QuotaEvent]
    routing: Aggregate[RoutingView, m.RoutingCommand, m.RoutingEvent]

    @classmethod
    def of_partition(cls, partition: int, table: RoutingTable) -> PartitionAggregates:
        """The aggregates of ``partition``, whose routing view starts from ``table``."""
        return cls(SCHEDULE, QUOTA, routing_aggregate(partition, table))

    @staticmethod
    def kind_of(schedule_id: str) -> AggregateKind:
        """The kind of aggregate a command for ``schedule_id`` is decided by."""
        if is_quota_id(schedule_id):
            return "quota"
        if schedule_id == ROUTING_ID:
            return "routing"
        return "schedule"
