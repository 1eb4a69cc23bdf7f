"""Fault injection on real processor processes, on both logs: SIGSTOP zombies, kill -9,
and join/leave rebalances under a stream of due occurrences.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter, defaultdict
from datetime import timedelta
from itertools import pairwise
from typing import Any

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord
from chronolog.settings import LogConfig
from support.polling import wait_until
from support.processors import read_all

SPEC = m.ScheduleSpec.model_validate(
    {"every": "1s", "job": {"type": "noop"}, "overlap": "allow",
     "misfire": {"policy": "all", "grace": "5m"}}
)


def ids_per_partition(n_partitions: int, per: int = 1) -> list[str]:
    """Schedule ids such that every partition gets ``per`` of them."""
    out: dict[int, list[str]] = defaultdict(list)
    i = 0
    while any(len(out[p]) < per for p in range(n_partitions)):
        sid = f"s{i}"
        p = partition_for(partition_key("acme", sid).encode(), n_partitions)
        if len(out[p]) < per:
            out[p].append(sid)
        i += 1
    return [s for p in range(n_partitions) for s in out[p]]


async def decoded_events(lg: Any) -> list[tuple[Any, m.EventEnvelope]]:
    return [(r, codec.decode_event(r.value)) for r in await read_all(lg, lg.topics.events)]


def writer(rec: Any) -> str:
    return dict(rec.headers).get("processor", b"").decode()


def trigger(client: Client, sid: str, key: str) -> m.CommandEnvelope:
    return client.envelope("acme", sid, m.TriggerRun(request_key=key), command_id=uuid.uuid4().hex)


async def test_zombie_processor_is_fenced_after_takeover(
    log_config: LogConfig, event_log: Any, processes: Any
) -> None:
    sids = ids_per_partition(log_config.topics.partitions)
    a = processes(log_config, "proc-a")
    async with Client(event_log, reply_timeout=60) as client:
        for sid in sids:  # A owns every partition once each of these is answered
            await client.create_schedule("acme", sid, {"every": "1h", "job": {"type": "noop"},
                                                       "overlap": "allow"})
        a.signal(signal.SIGSTOP)
        b = processes(log_config, "proc-b")
        during = [trigger(client, sid, f"during-{sid}") for sid in sids]
        replies = await asyncio.gather(*(client.send(env, timeout=60) for env in during))
        assert all(r.status == "ok" for r in replies)
        a.signal(signal.SIGCONT)  # the zombie wakes up with stale ownership
        after = [trigger(client, sid, f"after-{sid}") for sid in sids]
        replies = await asyncio.gather(*(client.send(env, timeout=60) for env in after))
        assert all(r.status == "ok" for r in replies)
        sent = during + after

    events = await decoded_events(event_log)
    # no duplicate event and every command decided exactly once
    ids = Counter(e.event_id for _, e in events)
    assert [k for k, n in ids.items() if n > 1] == []
    causes = Counter(e.causation_id for _, e in events if e.type == "OccurrenceMaterialized")
    assert all(causes[env.command_id] == 1 for env in sent)
    # zombie fencing: in every partition the writers' ownership epochs never go back, so
    # nothing from an owner appears after a newer owner's first event
    by_partition: dict[int, list[tuple[Any, m.EventEnvelope]]] = defaultdict(list)
    for rec, env in events:
        by_partition[rec.partition].append((rec, env))
    for p, items in by_partition.items():
        items.sort(key=lambda x: x[0].offset)
        epochs = [int(dict(rec.headers)["epoch"]) for rec, _ in items]
        assert epochs == sorted(epochs), f"partition {p}: a fenced owner wrote after takeover"
    # every trigger sent while A was paused was decided by B
    b_causes = {e.causation_id for rec, e in events if writer(rec) == "proc-b"}
    assert {env.command_id for env in during} <= b_causes
    b.stop()
    a.stop()


async def test_kill_9_mid_batch_loses_nothing_and_duplicates_nothing(
    log_config: LogConfig, event_log: Any, processes: Any
) -> None:
    a = processes(log_config, "proc-a")
    sids = ids_per_partition(log_config.topics.partitions)
    async with Client(event_log, reply_timeout=60) as client:
        for sid in sids:
            await client.create_schedule("acme", sid, {"every": "1h", "job": {"type": "noop"},
                                                       "overlap": "allow"})
        envs = [trigger(client, sids[i % len(sids)], f"k{i}") for i in range(400)]
        await event_log.append([
            OutRecord(event_log.topics.commands, partition_key(e.tenant, e.schedule_id).encode(),
                      codec.encode_command(e)) for e in envs
        ])

        async def decided() -> int:
            return sum(1 for _, e in await decoded_events(event_log)
                       if e.type == "OccurrenceMaterialized" and e.payload.trigger == "manual")

        await wait_until(lambda: _at_least(decided(), 20), 60, what="some decisions")
        a.signal(signal.SIGKILL)  # in the middle of the stream
        processes(log_config, "proc-b")
        await wait_until(lambda: _at_least(decided(), len(envs)), 90, what="all decisions")
    events = await decoded_events(event_log)
    causes = Counter(e.causation_id for _, e in events
                     if e.type == "OccurrenceMaterialized" and e.payload.trigger == "manual")
    assert all(causes[e.command_id] == 1 for e in envs)
    assert len(causes) == len(envs)


async def _at_least(aw: Any, n: int) -> bool:
    return (await aw) >= n


async def test_rebalances_never_duplicate_or_miss_an_occurrence(
    log_config: LogConfig, event_log: Any, processes: Any
) -> None:
    sids = ids_per_partition(log_config.topics.partitions, per=2)
    a = processes(log_config, "proc-a")
    async with Client(event_log, reply_timeout=60) as client:
        for sid in sids:
            await client.create_schedule("acme", sid, SPEC)
        b = processes(log_config, "proc-b")  # join

        async def instants() -> int:
            return sum(1 for _, e in await decoded_events(event_log)
                       if e.type == "OccurrenceMaterialized")

        await wait_until(lambda: _at_least(instants(), len(sids) * 4), 60, what="occurrences")
        a.stop()  # leave (SIGTERM: finishes its transaction, leaves the group)
        base = await instants()
        await wait_until(lambda: _at_least(instants(), base + len(sids) * 3), 60,
                         what="occurrences after A left")
        c = processes(log_config, "proc-c")  # join again
        base = await instants()
        await wait_until(lambda: _at_least(instants(), base + len(sids) * 3), 60,
                         what="occurrences after C joined")
        b.stop()
        c.stop()
    per_schedule: dict[str, list[Any]] = defaultdict(list)
    for _, e in await decoded_events(event_log):
        if e.type in ("OccurrenceMaterialized", "OccurrenceSkipped"):
            per_schedule[e.schedule_id].append(e.payload)
    for sid in sids:
        got = sorted(p.scheduled_at for p in per_schedule[sid]
                     if p.type == "OccurrenceMaterialized")
        assert len(got) == len(set(got)), f"{sid}: an instant materialized twice"
        assert not [p for p in per_schedule[sid] if p.type == "OccurrenceSkipped"], sid
        gaps = [b - a for a, b in pairwise(got) if b - a != timedelta(seconds=1)]
        assert gaps == [], f"{sid}: missed instants {gaps}"
