"""Processors that write snapshots often, their takeovers, and the fold of ``events`` from
offset 0 to compare them with: shared by the snapshot and the pruning tests."""

from __future__ import annotations

import asyncio
from typing import Any

from chronolog.client import Client
from chronolog.commands.decider import fold
from chronolog.commands.quota import QuotaState, evolve_quota
from chronolog.domain import codec
from chronolog.domain.ids import QUOTA_ID
from chronolog.processors.config import OpenTenants, ProcessorConfig
from chronolog.processors.restore import Takeover
from chronolog.processors.runtime import Processor
from support.polling import wait_until
from support.states import partition_fields

FAST = ProcessorConfig(snapshot_interval_s=0.2, snapshot_chunk=3)
EVERY = {"every": "1s", "job": {"type": "noop", "params": {}}, "overlap": "allow"}


class Quota(OpenTenants):
    """Tenant ``acme`` may hold 40 schedules: creates go through its quota aggregate."""

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]:
        return (None, 40 if tenant == "acme" else None)


async def fold_from_zero(lg: Any) -> dict[int, dict[str, Any]]:
    """Every partition's states, folded from offset 0 with the decider (independently)."""
    out: dict[int, dict[str, Any]] = {}
    for p in range(lg.topics.partitions):
        events: dict[str, list[Any]] = {}
        first: dict[str, Any] = {}
        end = await lg.end_offset(lg.topics.events, p)
        offset = 0
        while offset < end:
            recs = await lg.read(lg.topics.events, p, offset, 2000)
            if not recs:
                break
            for rec in recs:
                env = codec.decode_event(rec.value)
                events.setdefault(env.key, []).append(env.payload)
                first.setdefault(env.key, env)
            offset = recs[-1].offset + 1
        states, quotas = {}, {}
        for key, evs in events.items():
            if first[key].schedule_id == QUOTA_ID:
                q = quotas[key] = QuotaState(first[key].tenant)
                for e in evs:
                    evolve_quota(q, e)
            else:
                states[key] = fold(first[key].tenant, first[key].schedule_id, evs)
        out[p] = partition_fields(states, quotas)
    return out


async def take_over(lg: Any, member: str, config: ProcessorConfig | None = None,
                    ) -> tuple[Processor, dict[int, dict[str, Any]], dict[int, Takeover]]:
    """A processor taking every partition over (restore only, its loop not started): its
    states per partition and how each takeover went."""
    proc = Processor(lg, member, tenants=Quota(), config=config)
    consumer = lg.group_consumer(proc.group, [lg.topics.commands], f"{member}-probe")
    proc._consumer = consumer
    await consumer.start()
    try:
        async def everything() -> bool:  # a killed member's partitions move once it expires
            await consumer.getmany(timeout_ms=100)
            return len(consumer.assignment()) == lg.topics.partitions

        await wait_until(everything, 60, what="every partition assigned to the probe")
        await proc._on_assigned({(lg.topics.commands, p) for p in range(lg.topics.partitions)})

        def restored() -> bool:  # a restore longer than the inline wait goes on in its task
            proc._install_restored()  # what the loop's step would do
            return not proc._restoring

        await wait_until(restored, 60, what="every take-over restored or failed")
        states = {p: partition_fields(ps.states, ps.quotas) for p, ps in proc.partitions.items()}
        takeovers = {t.partition: t for t in proc.takeovers}
    finally:
        await consumer.close()
        for p in list(proc.partitions):
            await proc._drop(p, "test")
    return proc, states, takeovers


class Running:
    """An in-process processor (snapshots every 0.2 s, 3 states a chunk) and a client."""

    def __init__(self, lg: Any, member: str) -> None:
        self.lg = lg
        self.proc = Processor(lg, member, tenants=Quota(), config=FAST)
        self.client = Client(lg, reply_timeout=60)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.proc.run())
        await self.client.start()
        await wait_until(lambda: len(self.proc.partitions) == self.lg.topics.partitions,
                         60, what="partitions assigned")
        return self

    async def rounds(self, n: int) -> None:
        """Wait until every partition completed ``n`` more snapshot rounds."""
        want = {p: ps.snap.stats.rounds + n for p, ps in self.proc.partitions.items()
                if ps.snap is not None}
        assert len(want) == self.lg.topics.partitions
        await wait_until(lambda: all(
            ps.snap is not None and ps.snap.stats.rounds >= want[p]
            for p, ps in self.proc.partitions.items()), 60, what=f"{n} snapshot rounds")

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        self.proc.stop()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)


async def some_history(r: Running) -> None:
    """Schedules of two tenants (one with a quota) firing every second, a manual run, a
    paused and a deleted schedule."""
    for i in range(12):
        await r.client.create_schedule("acme" if i % 2 else "open", f"s{i}", EVERY)
    await r.client.trigger("acme", "s1", "manual-1", {"y": 2})
    await r.client.pause("open", "s2")
    await r.client.delete("acme", "s3")
    await wait_until(lambda: r.proc.stats.ticks > 30, 30, what="some ticks")
