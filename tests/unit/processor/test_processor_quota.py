"""The tenant quota is exact under concurrency, on the in-memory log: creates sent all at once to
schedules on every partition, decided by two processors (so a schedule's processor and the
processor of the tenant's quota aggregate differ), end with exactly ``max_schedules`` live
schedules; a delete gives exactly one slot back; a processor restored from the log keeps
the count; and the audit of the log finds the quota kept and every reservation balanced."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from chronolog.audit.auditor import audit
from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import QUOTA_ID, partition_key, quota_key
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord
from chronolog.processors.config import OpenTenants
from chronolog.processors.runtime import Processor
from support.polling import wait_until
from support.processors import events, read_all

QUOTA = 10
CREATES = 50
SPEC = m.ScheduleSpec.model_validate({"every": "1h", "job": {"type": "echo", "params": {}}})


class Quota(OpenTenants):
    """Every tenant may hold ``QUOTA`` schedules (every job type, default interval)."""

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]:
        return (None, QUOTA)


class Processors:
    """``members`` in-process processors (one group) and a client, on one log."""

    def __init__(self, lg: Any, members: tuple[str, ...]) -> None:
        self.lg = lg
        self.procs = [Processor(lg, name, tenants=Quota()) for name in members]
        self.client = Client(lg, reply_timeout=60)
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Processors:
        await self.client.start()
        for i, proc in enumerate(self.procs):  # one at a time: each join is one rebalance
            self.tasks.append(asyncio.create_task(proc.run()))
            await wait_until(lambda i=i: self._settled(i + 1), 60,
                             what=f"every partition owned by the first {i + 1} processors")
        return self

    def _settled(self, started: int) -> bool:
        owned = [set(p.partitions) for p in self.procs[:started]]
        return (all(owned) and sum(map(len, owned)) == self.lg.topics.partitions
                and set().union(*owned) == set(range(self.lg.topics.partitions)))

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        for p in self.procs:
            p.stop()
        await asyncio.wait_for(asyncio.gather(*self.tasks), 60)

    async def create(self, schedule_id: str) -> m.Reply:
        reply = await self.client.send(self.client.envelope(
            "acme", schedule_id, m.CreateSchedule(spec=SPEC)))
        return reply


def live_schedules(evs: list[m.EventEnvelope]) -> set[str]:
    live: set[str] = set()
    for e in evs:
        if e.type == "ScheduleCreated":
            live.add(e.schedule_id)
        elif e.type == "ScheduleDeleted":
            live.discard(e.schedule_id)
    return live


async def test_concurrent_creates_across_partitions_end_with_exactly_the_quota(
    event_log: Any,
) -> None:
    run = uuid.uuid4().hex[:6]
    ids = [f"q{run}-{i}" for i in range(CREATES)]
    n = event_log.topics.partitions
    assert len({partition_for(partition_key("acme", s).encode(), n) for s in ids}) == n
    async with Processors(event_log, ("p1", "p2")) as ps:
        replies = await asyncio.gather(*(ps.create(s) for s in ids))
        statuses = [r.status for r in replies]
        assert statuses.count("ok") == QUOTA, statuses
        assert statuses.count("quota") == CREATES - QUOTA, statuses
        assert all("max 10" in r.reason for r in replies if r.status == "quota")
        created = {s for s, r in zip(ids, replies, strict=True) if r.status == "ok"}
        assert live_schedules(await events(event_log)) == created

        # a delete gives exactly one slot back
        gone = sorted(created)[0]
        await ps.client.delete("acme", gone)
        await wait_until(lambda: _released(event_log, gone), 30, what="the slot released")
        again = await asyncio.gather(*(ps.create(f"q{run}-more-{i}") for i in range(5)))
        assert sorted(r.status for r in again) == ["ok"] + ["quota"] * 4

    # restored from the log (another member takes every partition): still full
    async with Processors(event_log, ("p3",)) as ps:
        assert (await ps.create(f"q{run}-after-restore")).status == "quota"

    evs = await events(event_log)
    assert len(live_schedules(evs)) == QUOTA
    report = audit(evs)
    assert report.ok, report.violations
    assert any(e.schedule_id == QUOTA_ID for e in evs)


async def _released(lg: Any, schedule_id: str) -> bool:
    return any(e.payload.schedule_id == schedule_id for e in await _of(lg, "QuotaSlotReleased"))


async def test_raw_commands_cannot_take_the_quota_key_or_move_slots(event_log: Any) -> None:
    run = uuid.uuid4().hex[:6]
    async with Processors(event_log, ("p1",)) as ps:
        c = ps.client
        as_schedule = await c.send(c.envelope("acme", QUOTA_ID, m.CreateSchedule(spec=SPEC)))
        assert (as_schedule.status, as_schedule.body.get("field")) == ("invalid", "scheduleId")
        forged_reserve = await c.send(c.envelope("acme", QUOTA_ID, m.ReserveQuotaSlot(
            schedule_id=f"q{run}", create_command_id="mine")))
        assert forged_reserve.status == "forbidden"
        forged_answer = await c.send(c.envelope("acme", f"q{run}", m.AnswerQuotaSlot(
            create_command_id="mine", granted=True)))
        assert forged_answer.status == "forbidden"
        # the processor still decides, and the quota is untouched: a create sent twice
        # (the same command, as a client re-sends it) takes one slot and is answered once
        env = c.envelope("acme", f"q{run}", m.CreateSchedule(spec=SPEC))
        twice = await c.submit([env, env])
        [reply, _] = await c.collect([env, env], twice)
        assert reply is not None and reply.status == "ok"
    evs = await events(event_log)
    assert [e.type for e in evs if e.schedule_id == QUOTA_ID] == ["QuotaSlotReserved",
                                                                  "QuotaSlotConfirmed"]
    replies = [r for r in await read_all(event_log, event_log.topics.replies)
               if r.key == env.command_id.encode()]
    # the copy came before the quota's answer (same partition, lower offset): it waited too
    assert len(replies) == 1


async def test_a_reservation_left_open_is_released_at_its_end_after_a_restore(
    event_log: Any,
) -> None:
    """A processor stopped after reserving a slot whose create never confirms: its successor
    rebuilds the reservation and its timer from the log, and the Tick at its end releases it
    with that time written into the event."""
    run = uuid.uuid4().hex[:6]
    ended = datetime.now(UTC) - timedelta(seconds=1)
    key = quota_key("acme")
    reserved = m.QuotaSlotReserved(schedule_id=f"q{run}", create_command_id=f"c{run}",
                                   max_schedules=QUOTA, expires_at=ended)
    await event_log.append([OutRecord(event_log.topics.events, key.encode(), codec.encode_event(
        m.EventEnvelope(event_id=f"quota:reserve:{run}.0", type=reserved.type, key=key,
                        tenant="acme", schedule_id=QUOTA_ID, at=ended - timedelta(seconds=60),
                        causation_id=f"quota:reserve:{run}", payload=reserved)))])
    async with Processors(event_log, ("p1",)):
        released = await wait_until(lambda: _of(event_log, "QuotaSlotReleased"), 30,
                                    what="the reservation released at its end")
    [ev] = released
    assert (ev.payload.schedule_id, ev.payload.reason) == (f"q{run}", "expired")
    assert ev.payload.released_at >= ended and ev.payload.released_at == ev.at


async def _of(lg: Any, type_: str) -> list[m.EventEnvelope]:
    return [e for e in await events(lg) if e.type == type_]
