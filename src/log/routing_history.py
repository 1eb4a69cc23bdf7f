"""The deployment's routing history on the log: the ``routing`` topic.

One partition, one record per ``RoutingChange`` (``chronolog.domain.routing``), oldest
first, never compacted: the whole history of partition-count changes, a few records for the
life of a deployment. Every process folds it the same way (``follow``), so they agree on the
table whatever order they read it in, and a change two operators begin at once is the one
appended first. A log whose ``routing`` topic is empty (or missing: a deployment created
before it existed) has never changed its count: its table is version 1 with the partition
count of ``commands`` — a change writes version 1 before it adds any partition.
"""

from __future__ import annotations

import orjson

from chronolog.domain.routing import RoutingChange, RoutingTable, follow
from chronolog.log.port import EventLog, LogError, OutRecord
from chronolog.log.reading import read_partition

__all__ = ["append_change", "decode_change", "encode_change", "read_history", "read_routing"]

ROUTING_KEY = b"routing"


def encode_change(change: RoutingChange) -> bytes:
    return orjson.dumps({"version": change.version, "partitions": change.partitions,
                         "done": change.done})


def decode_change(value: bytes) -> RoutingChange | None:
    """The change a record holds; None for a record that is not one (ignored by the fold)."""
    try:
        body = orjson.loads(value)
        version, partitions, done = body["version"], body["partitions"], body["done"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not (isinstance(version, int) and isinstance(partitions, int)
            and isinstance(done, bool)) or version < 1 or partitions < 1:
        return None
    return RoutingChange(version, partitions, done)


async def read_history(log: EventLog) -> list[RoutingChange]:
    """Every change on the ``routing`` topic, oldest first (empty: none, or no topic)."""
    topic = log.topics.routing
    try:
        await log.partitions_for(topic)
    except LogError:
        return []
    out: list[RoutingChange] = []
    async for records in read_partition(log, topic, 0):
        out.extend(c for c in (decode_change(r.value) for r in records) if c is not None)
    return out


async def read_routing(log: EventLog) -> RoutingTable:
    """The deployment's routing table now (see the module docstring)."""
    table: RoutingTable | None = None
    for change in await read_history(log):
        table = follow(table, change)
    if table is None:
        table = RoutingTable.initial(await log.partitions_for(log.topics.commands))
    return table


async def append_change(log: EventLog, change: RoutingChange) -> RoutingTable:
    """Append ``change`` to the history; returns the table folded from the history after it
    (which does not include ``change`` when another change won the race)."""
    await log.append([OutRecord(log.topics.routing, ROUTING_KEY, encode_change(change),
                                partition=0)])
    return await read_routing(log)
