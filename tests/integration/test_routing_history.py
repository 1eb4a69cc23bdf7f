"""The routing history on the log (chronolog.log.routing_history), on both logs: every
process folds the same table from it, a deployment that never changed has version 1 with its
topics' count, of two changes begun at once the first appended wins, and clients place
commands by the active version."""

from __future__ import annotations

from typing import Any

from chronolog.client import Client
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.domain.routing import RoutingChange, RoutingTable, RoutingVersion
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord
from chronolog.log.routing_history import append_change, read_history, read_routing
from chronolog.settings import LogConfig, open_log

from .conftest import started


async def test_a_deployment_that_never_changed_routes_by_its_topics_count(
    event_log: Any,
) -> None:
    assert await read_history(event_log) == []
    assert await read_routing(event_log) == RoutingTable.initial(
        event_log.topics.partitions)


async def test_every_process_folds_the_same_table_and_the_first_change_wins(
    event_log: Any, log_config: LogConfig,
) -> None:
    n = event_log.topics.partitions
    await append_change(event_log, RoutingChange(1, n, True))
    begun = await append_change(event_log, RoutingChange(2, n * 2, False))
    assert begun.migrating == RoutingVersion(2, n * 2) and begun.active == 1
    # a record that is no change is ignored; a rival change loses
    await event_log.append([OutRecord(event_log.topics.routing, b"routing", b"{not json",
                                      partition=0)])
    rival = await append_change(event_log, RoutingChange(2, n * 3, False))
    assert rival == begun
    async with started(open_log(log_config)) as other:  # another process
        assert await read_routing(other) == begun
        done = await append_change(other, RoutingChange(2, n * 2, True))
    assert done.current == RoutingVersion(2, n * 2) and done.migrating is None
    assert await read_routing(event_log) == done
    assert [c.version for c in await read_history(event_log)] == [1, 2, 2, 2]


async def test_a_client_places_commands_by_the_active_routing_version(event_log: Any) -> None:
    t = event_log.topics
    n = t.partitions
    key_of = {sid: partition_key("acme", sid).encode() for sid in (f"s{i}" for i in range(40))}
    sid = next(s for s, k in key_of.items() if partition_for(k, n) != partition_for(k, n * 2))
    await append_change(event_log, RoutingChange(1, n, True))
    await append_change(event_log, RoutingChange(2, n * 2, False))
    await event_log.add_partitions(t.commands, n * 2)  # the topic has the new count already

    async def placed_on() -> int:
        async with Client(event_log, reply_timeout=1) as client:
            await client.submit([client.envelope("acme", sid, m.PauseSchedule())])
        ends = {p: await event_log.end_offset(t.commands, p) for p in range(n * 2)}
        [p] = [p for p, end in ends.items() if end > placed.get(p, 0)]
        placed.update(ends)
        return p

    placed: dict[int, int] = {}
    # while the change is under way: by the version clients route by (the old one)
    assert await placed_on() == partition_for(key_of[sid], n)
    await append_change(event_log, RoutingChange(2, n * 2, True))
    assert await placed_on() == partition_for(key_of[sid], n * 2)
