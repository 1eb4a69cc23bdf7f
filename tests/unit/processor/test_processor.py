"""The processor on the in-memory log: decisions, timers, replies, duplicates, dispatch to
offering workers, dead letters, restore and fencing, through its public surface and what it
writes to the log."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson

from chronolog.client import Client, Conflict, NotFound
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.domain.offers import OFFER_HEADER, Offer
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord
from chronolog.processors.config import ProcessorConfig
from chronolog.processors.runtime import Processor
from support.polling import wait_until
from support.processors import SPEC, Running, events, read_all


async def test_create_schedule_replies_with_positions_of_its_events(event_log: Any) -> None:
    async with Running(event_log) as r:
        reply = await r.client.send(r.client.envelope(
            "acme", "s1", m.CreateSchedule(spec=m.ScheduleSpec.model_validate(SPEC))))
        assert reply.status == "ok" and reply.body["revision"] == 1
        assert len(reply.positions) == 1
        pos = reply.positions[0]
        recs = await event_log.read(pos.topic, pos.partition, pos.offset, 1)
        env = codec.decode_event(recs[0].value)
        assert env.type == "ScheduleCreated" and env.causation_id == reply.command_id


async def offer(lg: Any, worker_id: str, window: int, job_types: Any = None,
                partitions: Any = None) -> None:
    """What a worker writes to be given runs: an offer on each partition of commands."""
    value = Offer(worker_id, "default", window,
                  None if job_types is None else frozenset(job_types)).encode()
    await lg.append([OutRecord(lg.topics.commands, None, value, partition=p,
                               headers=(OFFER_HEADER,))
                     for p in (partitions if partitions is not None
                               else range(lg.topics.partitions))])


async def of_type(lg: Any, type_: str) -> list[Any]:
    return [e for e in await events(lg) if e.type == type_]


async def test_a_due_run_is_assigned_to_an_offering_worker_with_its_claim(event_log: Any) -> None:
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s1", SPEC)
        await offer(event_log, "w1", 4)
        claims = await wait_until(lambda: of_type(event_log, "AttemptClaimed"), 20,
                                  what="a run assigned")
        assert {c.payload.worker_id for c in claims} == {"w1"}
        records = await read_all(event_log, event_log.topics.ready("default"))
        assigned = {body["run_id"]: (rec, body) for rec in records
                    for body in [codec.decode_assignment(rec.value, rec.key)]}
        partition = partition_for(partition_key("acme", "s1").encode(),
                                  event_log.topics.partitions)
        for c in claims:
            rec, body = assigned[c.payload.run_id]  # written with the claim's events
            assert rec.partition == partition
            assert (body["assignee"], body["fence"], body["attempt"]) == (
                "w1", c.payload.fence, c.payload.attempt)
            assert body["job_type"] == "echo" and body["params"] == {"x": 1}


async def test_workers_offers_are_counted_apart_from_commands(event_log: Any) -> None:
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s1", SPEC)
        commands = r.proc.stats.commands
        assert commands >= 1 and r.proc.stats.offers == 0
        for _ in range(3):  # an idle worker renews its offers every second
            await offer(event_log, "w1", 4)
        partitions = event_log.topics.partitions
        await wait_until(lambda: r.proc.stats.offers == 3 * partitions, 20,
                         what="the offers decided")
        assert r.proc.stats.commands == commands


async def test_a_run_no_offering_worker_can_handle_waits_ready_and_burns_no_attempt(
    event_log: Any
) -> None:
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s1", SPEC)
        await offer(event_log, "w-other", 4, job_types=["other"])
        ready = await wait_until(lambda: of_type(event_log, "OccurrenceMaterialized"), 20,
                                 what="a READY run")
        assert ready[0].payload.state == "READY"
        # the offer was decided before the run was due (same partition, earlier offset)
        assert not await of_type(event_log, "AttemptClaimed")
        await offer(event_log, "w-echo", 4, job_types=["echo"])
        [first, *_] = await wait_until(lambda: of_type(event_log, "AttemptClaimed"), 20,
                                       what="the run assigned once a worker takes echo")
    assert first.payload.worker_id == "w-echo"
    assert first.payload.run_id == ready[0].payload.run_id and first.payload.attempt == 1


async def test_waiting_runs_go_to_seats_in_turn_across_tenants(event_log: Any) -> None:
    """Tenant a's runs became ready first; one seat of two runs serves a, then b (first come,
    first served would give a both)."""
    n = event_log.topics.partitions

    def on_partition_0(tenant: str, count: int) -> list[str]:
        ids = (f"{tenant}{i}" for i in range(1000))
        return [s for s in ids if partition_for(partition_key(tenant, s).encode(), n) == 0][:count]

    now = datetime.now(UTC).isoformat()
    one_shot = {"at": now, "job": {"type": "echo", "params": {}}}
    async with Running(event_log) as r:
        for tenant, count in (("a", 4), ("b", 1)):
            for sid in on_partition_0(tenant, count):
                await r.client.create_schedule(tenant, sid, one_shot)
        ready = await of_type(event_log, "OccurrenceMaterialized")
        assert len(ready) == 5 and {e.payload.state for e in ready} == {"READY"}
        await offer(event_log, "w1", 2, partitions=[0])
        claims = await wait_until(
            lambda: _at_least(of_type(event_log, "AttemptClaimed"), 2), 20,
            what="two runs assigned")
    assert sorted(c.tenant for c in claims) == ["a", "b"]


async def _at_least(found: Any, n: int) -> Any:
    items = await found
    return items if len(items) >= n else None


async def test_rejections_are_typed_errors(event_log: Any) -> None:
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s1", SPEC)
        try:
            await r.client.create_schedule("acme", "s1", SPEC)
        except Conflict as exc:
            assert "taken" in exc.reason
        else:
            raise AssertionError("a second create of s1 must conflict")
        try:
            await r.client.pause("acme", "nope")
        except NotFound:
            pass
        else:
            raise AssertionError("pausing an unknown schedule must be not_found")


async def test_duplicate_command_id_is_answered_with_the_original_reply(event_log: Any) -> None:
    async with Running(event_log) as r:
        env = r.client.envelope("acme", "s1", m.CreateSchedule(
            spec=m.ScheduleSpec.model_validate(SPEC)))
        first = await r.client.send(env)
        again = await r.client.send(env)  # a client re-sending after a timeout
        assert first == again and first.status == "ok"
        created = [e for e in await events(event_log) if e.type == "ScheduleCreated"]
        assert len(created) == 1


async def test_malformed_command_goes_to_dlq_and_the_processor_keeps_running(
    event_log: Any,
) -> None:
    async with Running(event_log) as r:
        bad = orjson.dumps({"command_id": "bad-1", "type": "ClaimRun", "tenant": "acme",
                            "schedule_id": "s1", "issued_at": "2026-01-01T00:00:00Z",
                            "payload": {"type": "ClaimRun", "run_id": "r"}})
        await event_log.append([OutRecord(event_log.topics.commands, b"acme/s1", bad)])
        await event_log.append([OutRecord(event_log.topics.commands, b"acme/s1", b"\x00garbage")])

        async def dead() -> list[Any]:
            return await read_all(event_log, event_log.topics.dlq)

        letters = await wait_until(lambda: _two(dead()), 20, what="two dead letters")
        decoded = [codec.decode_dead_letter(x.value) for x in letters]
        assert any("attempt" in d.reason or "worker_id" in d.reason for d in decoded)
        assert any(d.original for d in decoded)
        # still deciding
        body = await r.client.create_schedule("acme", "s2", SPEC)
        assert body["revision"] == 1


async def _two(aw: Any) -> list[Any] | None:
    out = await aw
    return out if len(out) >= 2 else None


async def test_unique_command_ids_each_cause_one_decision(event_log: Any) -> None:
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s1", SPEC)
        ids = [uuid.uuid4().hex for _ in range(30)]
        await asyncio.gather(*(
            r.client.call("acme", "s1", m.TriggerRun(request_key=f"k{i}"), command_id=cid)
            for i, cid in enumerate(ids)
        ))
        causes = [e.causation_id for e in await events(event_log)
                  if e.type == "OccurrenceMaterialized" and e.payload.trigger == "manual"]
        assert sorted(causes) == sorted(ids)


async def test_a_slow_transaction_delays_only_its_own_partition(event_log: Any) -> None:
    """Per-partition commit chains: no barrier across partitions, order kept within one."""
    from chronolog.domain.ids import partition_key
    from chronolog.log.partitioner import partition_for
    from chronolog.processors.config import ProcessorConfig

    n = event_log.topics.partitions
    slow_id = "slow"
    slow_p = partition_for(partition_key("acme", slow_id).encode(), n)
    fast_id = next(f"fast{i}" for i in range(100)
                   if partition_for(partition_key("acme", f"fast{i}").encode(), n) != slow_p)
    gate = asyncio.Event()
    held: list[int] = []
    acquire = event_log.acquire

    async def gated_acquire(p: int, member: str) -> Any:
        owner = await acquire(p, member)
        if p == slow_p:
            commit = owner.commit

            async def held_commit(*args: Any, **kwargs: Any) -> Any:
                held.append(len(held))
                await gate.wait()  # this partition's transaction is slow
                return await commit(*args, **kwargs)

            owner.commit = held_commit
        return owner

    event_log.acquire = gated_acquire
    proc = Processor(event_log, "p1", config=ProcessorConfig(commit_chains=True))
    client = Client(event_log, reply_timeout=30)
    task = asyncio.create_task(proc.run())
    await client.start()
    try:
        await wait_until(lambda: len(proc.partitions) == n, 30, what="partitions assigned")
        spec = m.ScheduleSpec.model_validate(SPEC)
        created = asyncio.create_task(client.send(client.envelope(
            "acme", slow_id, m.CreateSchedule(spec=spec))))
        await wait_until(lambda: held, 10, what="the slow partition's commit to start")
        paused = asyncio.create_task(client.send(client.envelope(
            "acme", slow_id, m.PauseSchedule())))
        fast = await asyncio.wait_for(client.send(client.envelope(
            "acme", fast_id, m.CreateSchedule(spec=spec))), 20)
        assert fast.status == "ok"  # committed while the slow partition's commit is held
        assert not created.done() and not paused.done()
        gate.set()
        first, second = await asyncio.wait_for(asyncio.gather(created, paused), 20)
        assert (first.status, second.status) == ("ok", "ok")
        assert first.positions[-1].offset < second.positions[0].offset  # chain order kept
    finally:
        gate.set()
        await client.close()
        proc.stop()
        await asyncio.wait_for(task, 30)


async def test_a_record_on_events_that_is_no_event_is_skipped_when_a_partition_is_restored(
    event_log: Any,
) -> None:
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s1", SPEC)
    ends = [await event_log.end_offset(event_log.topics.events, p)
            for p in range(event_log.topics.partitions)]
    p = next(p for p, end in enumerate(ends) if end > 0)
    [pos] = await event_log.append([OutRecord(event_log.topics.events, b"x",
                                              b'{"effect": "written here by mistake"}',
                                              partition=p)])
    async with Running(event_log, "p2") as again:  # restores every partition, this one too
        assert again.proc.partitions[p].states  # s1 restored around the poison record
        body = await again.client.pause("acme", "s1")
        assert body["state"] == "PAUSED"
    letters = [codec.decode_dead_letter(x.value) for x in await read_all(event_log,
                                                                         event_log.topics.dlq)]
    assert [(d.consumer, d.source_partition, d.source_offset) for d in letters
            if d.source_topic == event_log.topics.events] == [("processor", p, pos.offset)]


async def test_downtime_is_caught_up_by_each_misfire_policy_after_a_restart(
    event_log: Any,
) -> None:
    """The processor is down for 35 s (the restarted one's clock runs 35 s ahead): each
    ``every 2s`` schedule's backlog goes by its misfire policy."""
    from datetime import timedelta

    from chronolog.environment import utc_now

    spec = {"every": "2s", "job": {"type": "echo"}, "overlap": "skip"}
    async with Running(event_log, "p1") as r:
        for policy in ("latest", "skip", "all"):
            await r.client.create_schedule("acme", f"down-{policy}", {**spec, "misfire": policy})
    down = timedelta(seconds=35)
    later = Processor(event_log, "p2", clock=lambda: utc_now() + down)
    task = asyncio.create_task(later.run())
    try:
        async def caught_up() -> dict[str, list[Any]] | None:
            by_sid: dict[str, list[Any]] = {}
            for e in await events(event_log):
                by_sid.setdefault(e.schedule_id, []).append(e)
            done = len(by_sid) == 3 and all(
                any(e.type in ("OccurrenceMaterialized", "OccurrenceSkipped")
                    and e.payload.scheduled_at - evs[0].payload.created_at > timedelta(seconds=30)
                    for e in evs)
                for evs in by_sid.values())
            return by_sid if done else None

        by_sid = await wait_until(caught_up, 30, what="the backlogs decided")
    finally:
        later.stop()
        await asyncio.wait_for(task, 30)

    def backlog(sid: str) -> tuple[list[Any], list[Any]]:
        """The restart's first Tick that found the backlog: its materializations, skips."""
        evs = by_sid[sid]
        created = evs[0].payload.created_at
        cause = next(e.causation_id for e in evs if e.type in ("OccurrenceMaterialized",
                                                               "OccurrenceSkipped")
                     and e.payload.scheduled_at > created + timedelta(seconds=3))
        mine = [e.payload for e in evs if e.causation_id == cause]
        return ([p for p in mine if p.type == "OccurrenceMaterialized"],
                [p for p in mine if p.type == "OccurrenceSkipped"])

    ran, skipped = backlog("down-latest")
    assert len(ran) == 1 and {s.reason for s in skipped} == {"coalesced"}
    assert all(s.scheduled_at < ran[0].scheduled_at for s in skipped)
    assert sum(s.count for s in skipped if not s.materialized) >= 14
    assert [s.materialized for s in skipped].count(True) == 1  # the READY run left behind
    ran, skipped = backlog("down-skip")
    # skip: only the newest, on time, may run — and it meets the overlap policy: the READY
    # run left behind (35 s late, within the grace) holds the guard
    assert ran == [] and [s.reason for s in skipped][-1] == "overlap"
    assert {s.reason for s in skipped[:-1]} == {"misfire"}
    ran, skipped = backlog("down-all")
    assert skipped == [] and len(ran) >= 15
    assert {p.state for p in ran} == {"PENDING"}  # queued behind the run left behind


async def test_one_instant_missed_in_a_restart_is_decided_before_a_claim_read_after_it(
    event_log: Any,
) -> None:
    """An ``every 10s`` schedule's first run is READY, never claimed, when the processor
    stops; it comes back 11 s later (the restarted one's clock runs ahead), after a worker
    that came back first asked to claim that run. Exactly one instant (the 10 s one) fell in
    the gap. Each schedule's first Tick after the take-over (``Tick(resumed=True)``) is
    decided before that claim: under ``latest`` the stale run is coalesced, the claim finds
    it skipped and the on-time instant runs; under ``skip`` the stale run keeps its place
    (the claim takes it) and the on-time instant meets the overlap guard."""
    from datetime import timedelta

    from chronolog.environment import utc_now

    spec = {"every": "10s", "job": {"type": "echo"}}  # overlap skip (the default)
    async with Running(event_log, "p1") as r:
        for policy in ("latest", "skip"):
            await r.client.create_schedule("acme", f"gap-{policy}", {**spec, "misfire": policy})
    stale = {e.schedule_id: e.payload for e in await of_type(event_log, "OccurrenceMaterialized")}
    assert sorted(stale) == ["gap-latest", "gap-skip"]
    first = max(p.scheduled_at for p in stale.values())
    assert min(p.scheduled_at for p in stale.values()) > first - timedelta(seconds=1)
    worker = Client(event_log, reply_timeout=30)
    await worker.start()
    try:
        claims = [worker.envelope("acme", sid, m.ClaimRun(run_id=p.run_id, attempt=1,
                                                         worker_id="w1"))
                  for sid, p in sorted(stale.items())]
        futs = await worker.submit(claims)  # on the log before the processor is back
        resumed_at = utc_now()
        later = Processor(event_log, "p2", clock=lambda: (
            first + timedelta(seconds=11) + (utc_now() - resumed_at)))
        task = asyncio.create_task(later.run())
        try:
            latest_reply, skip_reply = await worker.collect(claims, futs, 30)
        finally:
            later.stop()
            await asyncio.wait_for(task, 30)
    finally:
        await worker.close()
    assert latest_reply is not None and skip_reply is not None
    after = [e for e in await events(event_log) if e.causation_id
             and e.causation_id.startswith("tick:") and e.causation_id.endswith(":resumed")]
    by_sid: dict[str, list[Any]] = {}
    for e in after:
        by_sid.setdefault(e.schedule_id, []).append(e.payload)
    def on_time(sid: str) -> datetime:  # each schedule's instants count from its creation
        return stale[sid].scheduled_at + timedelta(seconds=10)

    # latest: the run left behind is coalesced into the on-time instant, which runs
    skipped, ran = by_sid["gap-latest"]
    assert (skipped.type, skipped.run_id, skipped.reason, skipped.materialized) == (
        "OccurrenceSkipped", stale["gap-latest"].run_id, "coalesced", True)
    assert (ran.type, ran.scheduled_at, ran.state) == (
        "OccurrenceMaterialized", on_time("gap-latest"), "READY")
    # the claim came after: the run was skipped
    assert (latest_reply.status, latest_reply.body.get("state")) == ("conflict", "SKIPPED"), (
        latest_reply)
    # skip: the run left behind keeps its place and the guard; the worker's claim takes it
    [overlap] = by_sid["gap-skip"]
    assert (overlap.type, overlap.scheduled_at, overlap.reason) == (
        "OccurrenceSkipped", on_time("gap-skip"), "overlap")
    assert skip_reply.status == "ok"
    claimed = await of_type(event_log, "AttemptClaimed")
    assert [c.payload.run_id for c in claimed] == [stale["gap-skip"].run_id]


async def test_a_run_left_ready_waits_for_its_schedules_resumed_tick_before_a_worker_gets_it(
    event_log: Any,
) -> None:
    """40 ``every 60s`` schedules of one partition each have a run left READY when the
    processor stops, and one instant each falls in the gap; a worker offers capacity before
    the processor is back. Its ticks go 16 a batch (``ticks_per_step``), so some schedules
    still wait for their resumed Tick when the worker is seated: their READY runs are not
    assigned before it, and every one of them is coalesced, none claimed."""
    from datetime import timedelta

    from chronolog.environment import utc_now

    n = event_log.topics.partitions
    sids = [sid for sid in (f"gap-{i}" for i in range(400))
            if partition_for(partition_key("acme", sid).encode(), n) == 0][:40]
    async with Running(event_log, "p1") as r:
        for sid in sids:
            await r.client.create_schedule("acme", sid, {"every": "60s", "job": {"type": "echo"}})
    stale = {e.payload.run_id: e.payload.scheduled_at
             for e in await of_type(event_log, "OccurrenceMaterialized")}
    assert len(stale) == 40
    await offer(event_log, "w1", 100)
    first = max(stale.values())  # each schedule's 60 s instant is due, none's 120 s one
    resumed_at = utc_now()
    later = Processor(event_log, "p2", config=ProcessorConfig(ticks_per_step=1),
                      clock=lambda: first + timedelta(seconds=61) + (utc_now() - resumed_at))
    task = asyncio.create_task(later.run())
    try:
        async def decided() -> tuple[set[str], set[str]] | None:
            """Each stale run coalesced or claimed, and the worker took an on-time run."""
            got = {e.payload.run_id for e in await of_type(event_log, "OccurrenceSkipped")
                   if e.payload.reason == "coalesced"}
            claimed = {e.payload.run_id for e in await of_type(event_log, "AttemptClaimed")}
            done = len((got | claimed) & set(stale)) == 40 and claimed - set(stale)
            return (got, claimed) if done else None

        coalesced, claimed = await wait_until(decided, 30, what="the stale runs decided")
    finally:
        later.stop()
        await asyncio.wait_for(task, 30)
    assert claimed & set(stale) == set()
    assert coalesced == set(stale)


async def test_a_partition_fenced_away_but_still_assigned_is_acquired_again(
    event_log: Any
) -> None:
    """Another owner fenced us on a partition the group still assigns to us (it then let the
    partition go): after ``fenced_retry_s`` we acquire it again instead of leaving it
    without an owner, and the command in flight is answered."""
    proc = Processor(event_log, "p1", config=ProcessorConfig(fenced_retry_s=0.5))
    client = Client(event_log, reply_timeout=60)
    task = asyncio.create_task(proc.run())
    try:
        await client.start()
        await wait_until(lambda: len(proc.partitions) == event_log.topics.partitions, 30,
                         what="partitions assigned")
        p = partition_for(partition_key("acme", "fenced").encode(), event_log.topics.partitions)
        intruder = await event_log.acquire(p, "intruder")  # fences p1's owner of p
        await intruder.close()
        body = await client.create_schedule("acme", "fenced", SPEC)
        assert body["revision"] == 1
        assert proc.stats.fenced >= 1 and p in proc.partitions
    finally:
        await client.close()
        proc.stop()
        await asyncio.wait_for(task, 30)
