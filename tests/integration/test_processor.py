"""The processor on both logs: what needs a real log or reaches inside the processor —
restore by a second processor, decisions that raise or cannot be applied (the decider
replaced in the processor's module), a restore outlasting the group session. The rest of the
processor's behaviour is unit-tested on the in-memory log (tests/unit/processor/)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord
from chronolog.processors.runtime import Processor
from support.polling import wait_until
from support.processors import SPEC, Running, events, read_all


async def test_restart_restores_the_same_state(event_log: Any) -> None:
    async with Running(event_log, "p1") as r:
        for i in range(5):
            await r.client.create_schedule("acme", f"s{i}", SPEC)
        await r.client.pause("acme", "s1")
        await r.client.trigger("acme", "s2", "manual-1", {"y": 2})
        await wait_until(lambda: r.proc.stats.ticks > 5, 20, what="some ticks")
        r.proc.stop()
        assert r.task is not None
        await asyncio.wait_for(r.task, 30)
        before = {}
        # the live state at stop time is what the events say; fold them independently
    from chronolog.commands.decider import fold

    by_key: dict[str, list[Any]] = {}
    for e in await events(event_log):
        by_key.setdefault(e.key, []).append(e)
    before = {k: fold(v[0].tenant, v[0].schedule_id, [e.payload for e in v]).snapshot()
              for k, v in by_key.items()}
    restored = Processor(event_log, "p2")
    consumer = event_log.group_consumer(restored.group, [event_log.topics.commands], "probe")
    restored._consumer = consumer
    await consumer.start()
    try:
        await restored._on_assigned({(event_log.topics.commands, p)
                                     for p in range(event_log.topics.partitions)})
        after = {k: st.snapshot() for ps in restored.partitions.values()
                 for k, st in ps.states.items()}
        assert after == before and len(after) == 5
    finally:
        await consumer.close()
        for p in list(restored.partitions):
            await restored._drop(p, "test")


async def _reply_to(lg: Any, command_id: str) -> m.Reply | None:
    for rec in await read_all(lg, lg.topics.replies):
        if rec.key == command_id.encode():
            return codec.decode_reply(rec.value)
    return None


def _raw_create(command_id: str, schedule_id: str, spec: dict[str, Any]) -> bytes:
    # the standard library's json: it writes integers of any size (orjson refuses past 64 bits)
    return json.dumps({"command_id": command_id, "type": "CreateSchedule", "tenant": "acme",
                       "principal": "test", "schedule_id": schedule_id,
                       "issued_at": "2026-01-01T00:00:00Z",
                       "payload": {"type": "CreateSchedule", "spec": spec}}).encode()


async def test_a_command_whose_decision_raises_is_rejected_and_dead_lettered_not_a_crash(
    event_log: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chronolog.commands.decider import SCHEDULE

    real = SCHEDULE.decide

    def buggy(st: Any, env: Any, now: Any, tenant: Any) -> Any:  # a decider bug, test-only
        if env.schedule_id == "bug":
            raise ZeroDivisionError("a bug in decide")
        return real(st, env, now, tenant)

    monkeypatch.setattr(SCHEDULE, "decide", buggy)  # the schedule aggregate every task uses
    async with Running(event_log) as r:
        cmds = event_log.topics.commands
        await event_log.append([
            OutRecord(cmds, b"acme/bug", _raw_create("c-bug", "bug", SPEC)),
            # a jitter the decider cannot add to a date (or, with input bounds, refused)
            OutRecord(cmds, b"acme/huge", _raw_create(
                "c-huge", "huge", {**SPEC, "every": "1m", "jitter": 1e300})),
            # an integer orjson cannot write back (past 64 bits) in the event's params
            OutRecord(cmds, b"acme/wide", _raw_create(
                "c-wide", "wide", {**SPEC, "job": {"type": "echo", "params": {"n": 2**70}}})),
        ])
        replies = {}
        for cid in ("c-bug", "c-huge", "c-wide"):
            replies[cid] = await wait_until(lambda cid=cid: _reply_to(event_log, cid), 20,
                                            what=f"the reply to {cid}")
        assert replies["c-bug"].status == "invalid"
        assert "ZeroDivisionError: a bug in decide" in replies["c-bug"].reason
        assert replies["c-huge"].status == "invalid"
        assert "jitter" in replies["c-huge"].reason or "OverflowError" in replies["c-huge"].reason
        assert replies["c-wide"].status == "invalid" and "64 bits" in replies["c-wide"].reason
        # the bug raised in decide; the value past 64 bits was refused when decoded
        assert r.proc.stats.decide_errors >= 1
        letters = {d.command_id: d for d in (codec.decode_dead_letter(x.value) for x in
                                             await read_all(event_log, event_log.topics.dlq))}
        assert letters["c-bug"].error_class == "ZeroDivisionError"
        assert letters["c-bug"].consumer == "processor"
        assert letters["c-bug"].source_topic == cmds
        assert {"c-bug", "c-huge", "c-wide"} <= set(letters)
        # no event of them was written, and the processor still decides
        assert not [e for e in await events(event_log) if e.schedule_id in ("bug", "huge", "wide")]
        assert (await r.client.create_schedule("acme", "after", SPEC))["revision"] == 1
        # the same commands again (a client re-sending) get the same answer, not a crash
        await event_log.append([OutRecord(cmds, b"acme/bug", _raw_create("c-bug", "bug", SPEC))])
        assert (await r.client.create_schedule("acme", "after2", SPEC))["revision"] == 1


async def test_raw_commands_of_any_producer_are_held_to_the_storage_budget(
    event_log: Any,
) -> None:
    """Creates written straight to ``commands`` (no client, no API) count against the tenant's
    storage budget like any other: past it the reply is ``quota`` naming ``storage_budget``
    and nothing of the create is written."""
    from chronolog.tenants import Tenant, Tenants

    tenants = Tenants({"acme": Tenant("acme", ("t",), storage_budget=100_000)})

    def create(schedule_id: str, pad: int) -> OutRecord:
        spec = {**SPEC, "job": {"type": "echo", "params": {"p": "x" * pad}}}
        return OutRecord(event_log.topics.commands, f"acme/{schedule_id}".encode(),
                         _raw_create(f"c-{schedule_id}", schedule_id, spec))

    async with Running(event_log, tenants=tenants):
        await event_log.append([create("fits", 59_992)])  # 60,000 bytes of params
        fits = await wait_until(lambda: _reply_to(event_log, "c-fits"), 30, what="a reply")
        assert fits.status == "ok", fits
        await event_log.append([create("over", 39_993)])  # 40,001 more: one byte over
        over = await wait_until(lambda: _reply_to(event_log, "c-over"), 30, what="a reply")
        assert (over.status, over.body["field"]) == ("quota", "storage_budget"), over
        assert 3500 < over.body["retry_after"] <= 3601
        assert "storage_budget = 100000 bytes an hour" in over.reason
        assert not [e for e in await events(event_log) if e.schedule_id == "over"]


async def test_a_decision_that_cannot_be_applied_rebuilds_the_partition_and_is_dead_lettered(
    event_log: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chronolog.commands.decider import SCHEDULE

    real = SCHEDULE.evolve

    def buggy(st: Any, ev: Any) -> Any:  # a bug in evolve, test-only: half-applied, raises
        after = real(st, ev)
        if st.schedule_id == "half" and ev.type == "ScheduleCreated":
            raise KeyError("a bug in evolve")
        return after

    monkeypatch.setattr(SCHEDULE, "evolve", buggy)  # the schedule aggregate every task uses
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "before", SPEC)
        await event_log.append([OutRecord(event_log.topics.commands, b"acme/half",
                                          _raw_create("c-half", "half", SPEC))])
        reply = await wait_until(lambda: _reply_to(event_log, "c-half"), 30,
                                 what="the reply to c-half")
        assert reply.status == "invalid" and "KeyError" in reply.reason
        assert r.proc.stats.apply_errors == 1  # once: read again, it was not decided again
        # the rebuilt partition holds no trace of the half-applied schedule; others go on
        p = next(p for p, ps in r.proc.partitions.items() if "acme/before" in ps.states)
        assert all("acme/half" not in ps.states for ps in r.proc.partitions.values())
        assert not [e for e in await events(event_log) if e.schedule_id == "half"]
        assert (await r.client.pause("acme", "before"))["state"] == "PAUSED"
        assert p in r.proc.partitions
        [letter] = [d for d in (codec.decode_dead_letter(x.value) for x in
                                await read_all(event_log, event_log.topics.dlq))
                    if d.command_id == "c-half"]
        assert letter.error_class == "KeyError" and letter.consumer == "processor"


class _HeldRestore(Processor):
    """A processor whose restore of one partition waits for ``release`` — the stand-in for
    a partition with a long history (a fold from offset 0 of millions of events)."""

    def __init__(self, lg: Any, member: str, partition: int) -> None:
        super().__init__(lg, member)
        self.held_partition = partition
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.stopped = asyncio.Event()  # the held restore was cancelled

    async def _restore(self, ps: Any, takeover: Any = None) -> None:
        if ps.partition == self.held_partition:
            self.holding.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.stopped.set()
                raise
        await super()._restore(ps, takeover)


async def test_a_partition_revoked_mid_restore_stops_its_restore_and_is_taken_over_when_back(
    event_log: Any,
) -> None:
    """Processors started together each take every partition for a moment: a restore of a
    partition the group then gives to another member stops (after ``abandoned_restore_s``,
    in case it comes back) and frees its slot instead of folding a history nobody will
    use. Given back later, the partition is taken over again from the start and served."""
    lg = event_log
    n = lg.topics.partitions
    held = n - 1  # range assignment over [p1, p2]: the last partition goes to p2
    p1 = _HeldRestore(lg, "p1", held)
    p1.abandoned_restore_s = 1.0
    first = asyncio.create_task(p1.run())
    p2 = Processor(lg, "p2")
    second: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(p1.holding.wait(), 60)
        second = asyncio.create_task(p2.run())
        await wait_until(lambda: held in p2.partitions, 60, what="p2 serving the partition")
        await asyncio.wait_for(p1.stopped.wait(), 30)
        await wait_until(lambda: f"restoring partitions [{held}]" not in p1.readiness()[1],
                         30, what="p1 no longer restoring it")
        assert held not in p1.partitions
        assert held not in [t.partition for t in p1.takeovers]
        # p2 leaves: the partition comes back to p1, which restores it afresh
        p1.release.set()
        p2.stop()
        await asyncio.wait_for(second, 60)
        await wait_until(lambda: set(p1.partitions) == set(range(n)), 60,
                         what="p1 serving every partition again")
        assert [t.partition for t in p1.takeovers].count(held) == 1
        assert p1.readiness()[0], p1.readiness()
    finally:
        p1.release.set()
        p1.stop()
        p2.stop()
        await asyncio.wait_for(first, 60)
        if second is not None:
            await asyncio.wait_for(second, 60)


async def test_a_processor_asked_to_stop_takes_over_no_partition_the_group_then_gives_it(
    event_log: Any,
) -> None:
    """The processors of a deployment stopped together leave one after another, and the
    group hands the partitions of each that left to those still there: one already stopping
    must not restore them (that only held its own stop up past its bound, and the next owner
    restores them anyway). Here the group gives every partition to a processor that was asked
    to stop before it joined."""
    proc = Processor(event_log, "p1")
    proc.stop()
    await asyncio.wait_for(proc.run(), 60)
    assert list(proc.takeovers) == [] and proc.partitions == {}


def _group_session_timeout_s(lg: Any) -> float:
    from chronolog.log.kafka import GROUP_SESSION_TIMEOUT_S
    return float(getattr(lg, "session_timeout_s", GROUP_SESSION_TIMEOUT_S))


async def test_a_restore_longer_than_the_group_session_keeps_the_member_and_is_taken_over_once(
    event_log: Any,
) -> None:
    """Kafka sends no heartbeat while a rebalance callback runs: a take-over done inside it
    that outlasts the session timeout got the member dropped, and after rejoining it took
    the partition over again from the start — for ever, on a long enough history. The
    restore goes on in the background instead; the other partitions are served meanwhile,
    and a command sent to the restoring partition is decided once it is restored."""
    lg = event_log
    n = lg.topics.partitions
    ids = {partition_for(partition_key("acme", f"s{i}").encode(), n): f"s{i}"
           for i in range(200)}
    held, other = 0, next(p for p in ids if p != 0)
    proc = _HeldRestore(lg, "p1", held)
    client = Client(lg, reply_timeout=120)
    task = asyncio.create_task(proc.run())
    await client.start()
    try:
        await asyncio.wait_for(proc.holding.wait(), 60)
        await wait_until(lambda: set(proc.partitions) == set(range(n)) - {held}, 60,
                         what="every other partition served while one restores")
        # once the rebalance settled, the process says what it waits for
        await wait_until(lambda: f"restoring partitions [{held}]" in proc.readiness()[1], 30,
                         what="readiness naming the partition being restored")
        assert not proc.readiness()[0]
        # a command for the restoring partition is sent, and one for another partition is
        # decided meanwhile
        waiting = asyncio.create_task(client.create_schedule("acme", ids[held], SPEC))
        reply = await client.create_schedule("acme", ids[other], SPEC)
        assert reply["revision"] == 1
        # the restore is held past the session timeout: a duration, nothing to wait for
        await asyncio.sleep(_group_session_timeout_s(lg) + 3)
        assert proc._consumer is not None and proc._consumer.joined()
        assert not waiting.done()
        proc.release.set()
        created = await asyncio.wait_for(waiting, 60)
        assert created["revision"] == 1
        assert [t.partition for t in proc.takeovers].count(held) == 1
        assert set(proc.partitions) == set(range(n))
        assert proc.readiness()[0], proc.readiness()
    finally:
        proc.release.set()
        await client.close()
        proc.stop()
        await asyncio.wait_for(task, 60)
    created_events = [e for e in await events(lg) if e.type == "ScheduleCreated"]
    assert sorted(e.schedule_id for e in created_events) == sorted([ids[held], ids[other]])
