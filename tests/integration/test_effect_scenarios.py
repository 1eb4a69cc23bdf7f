"""Two effect scenarios end to end, on both logs, with the effect runner.

(1) The crash-and-redelivery timeline of docs/design.md §5: worker A claims, a duplicate
hint to B is refused while A's lease holds, A calls the destination with the effect's stable
key and the response is lost (the destination committed receipt_900), A's lease expires, B
claims with a higher fence, A's late completion is rejected (stale_fence), B completes, a
third delivery finds the run terminal, and the effect runner delivers the webhook with the
same Idempotency-Key: the destination saw the key twice and committed ONE effect; the
canonical result is B's.

(2) The same without destination deduplication (contract ``none``, docs/design.md §8): an
SMTP server that drops its reply after DATA. The effect ends EffectUncertain and the run
RECONCILING; a restarted runner sends nothing again; ``chronolog reconcile list`` shows it
and ``chronolog reconcile resolve --decision delivered`` moves it back to SUCCEEDED, with
who and why in the event.

Also: the runner end to end with a Kafka-topic effect (a Kafka transaction on the Kafka log,
the at-least-once append on the embedded log) and a PostgreSQL-inbox effect, restarted.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from chronolog.client import Client, Conflict, StaleFence
from chronolog.commands.decider import fold
from chronolog.destinations import parse_destinations
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.effects.runner import EffectRunner, RunnerConfig
from chronolog.processors.runtime import Processor
from chronolog.settings import LogConfig
from chronolog.tenants import Tenant, Tenants
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT, log_url
from .effect_servers import HookServer, SmtpServer

TENANT, SCHEDULE = "acme", "invoice-57"
FAR = "2099-01-01T00:00:00Z"


async def all_events(lg: Any) -> list[m.EventEnvelope]:
    out = []
    for p in range(lg.topics.partitions):
        end = await lg.end_offset(lg.topics.events, p)
        offset = 0
        while offset < end:
            recs = await lg.read(lg.topics.events, p, offset, 1000)
            if not recs:
                break
            out.extend(codec.decode_event(r.value) for r in recs)
            offset = recs[-1].offset + 1
    return out


def granted(**destinations: dict[str, Any]) -> Tenants:
    """The test tenant with these destinations (tables as in the tenants file)."""
    return Tenants({TENANT: Tenant(TENANT, (), None, None,
                                   parse_destinations(TENANT, destinations))})


def of_type(evs: list[m.EventEnvelope], typ: str, **match: Any) -> list[Any]:
    return [e.payload for e in evs if e.type == typ
            and all(getattr(e.payload, k) == v for k, v in match.items())]


async def run_state(lg: Any, run_id: str) -> tuple[str | None, dict[str, Any]]:
    # fold the schedule's own events and this run's (the decider keeps only the newest
    # finished run of a schedule, so other runs finishing later would retire this one)
    evs = [e.payload for e in await all_events(lg) if e.schedule_id == SCHEDULE
           and getattr(e.payload, "run_id", run_id) == run_id]
    run = fold(TENANT, SCHEDULE, evs).run(run_id)
    if run is None:
        return None, {}
    return run.state, {k: v[0] for k, v in (run.effects or {}).items()}


class Stack:
    """An in-process processor and client, plus effect runners started on demand."""

    def __init__(self, lg: Any) -> None:
        self.lg = lg
        self.proc = Processor(lg, "p1")
        self.client = Client(lg, principal="test", reply_timeout=30)
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Stack:
        self.tasks.append(asyncio.create_task(self.proc.run()))
        await self.client.start()
        await wait_until(lambda: len(self.proc.partitions) == self.lg.topics.partitions,
                         30, what="processor partitions")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        self.proc.stop()
        await asyncio.wait_for(self.tasks[0], 30)

    async def runner(self, member: str, **kw: Any) -> tuple[EffectRunner, asyncio.Task[None]]:
        fx = EffectRunner(self.lg, member, config=RunnerConfig(poll_ms=50, retry_initial=0.05),
                          **kw)
        task = asyncio.create_task(fx.run())
        await wait_until(fx.ready.is_set, 30, what=f"runner {member} assigned")
        return fx, task

    @staticmethod
    async def stop(fx: EffectRunner, task: asyncio.Task[None]) -> None:
        fx.stop()
        await asyncio.wait_for(task, 30)

    async def new_run(self, key: str) -> str:
        return str((await self.client.trigger(TENANT, SCHEDULE, key))["run_id"])

    async def complete(self, run_id: str, attempt: int, fence: int, worker: str,
                       result: Any) -> dict[str, Any]:
        data = orjson.dumps(result)
        return await self.client.complete(TENANT, SCHEDULE, run_id, attempt, fence, worker,
                                          hashlib.sha256(data).hexdigest(), len(data),
                                          inline=result)

    async def quick_run(self, key: str) -> str:
        """A run claimed and completed at once (a marker to see a runner catch up)."""
        run_id = await self.new_run(key)
        claim = await self.client.claim(TENANT, SCHEDULE, run_id, 1, "worker-M")
        await self.complete(run_id, 1, claim["fence"], "worker-M", {"marker": key})
        return run_id


async def crash_and_redelivery(
    s: Stack, lg: Any, before_lease_expiry: Any = None
) -> dict[str, Any]:
    """The crash-and-redelivery timeline up to B's completion; returns the identities involved."""
    c = s.client
    run_id = await s.new_run("2026-10-08T12:00Z")
    a = await c.claim(TENANT, SCHEDULE, run_id, 1, "worker-A")  # A's fence
    with pytest.raises(Conflict):  # duplicate hint delivered to B while A's lease holds
        await c.claim(TENANT, SCHEDULE, run_id, 1, "worker-B")
    if before_lease_expiry is not None:
        await before_lease_expiry(run_id)
    # A stalls past its lease; by authority time the lease expires and the run is READY
    await wait_until(lambda: _state_is(lg, run_id, "READY"), 20, what="A's lease expired")
    b = await c.claim(TENANT, SCHEDULE, run_id, 2, "worker-B")  # a higher fence
    assert b["fence"] > a["fence"]
    with pytest.raises(StaleFence):  # A's late receipt: completion with the old fence
        await s.complete(run_id, 1, a["fence"], "worker-A", {"invoice": 57, "by": "A"})
    await s.complete(run_id, 2, b["fence"], "worker-B", {"invoice": 57, "by": "B"})
    with pytest.raises(Conflict):  # C receives another delivery: the run is terminal
        await c.claim(TENANT, SCHEDULE, run_id, 2, "worker-C")
    return {"run_id": run_id, "a": a, "b": b}


async def _state_is(lg: Any, run_id: str, state: str) -> bool:
    return (await run_state(lg, run_id))[0] == state


def assert_canonical_result_is_bs(evs: list[m.EventEnvelope], ids: dict[str, Any]) -> None:
    published = of_type(evs, "ResultPublished", run_id=ids["run_id"])
    assert len(published) == 1 and published[0].worker_id == "worker-B"
    assert published[0].inline == {"invoice": 57, "by": "B"}
    rejected = of_type(evs, "CompletionRejected", run_id=ids["run_id"])
    assert [(r.worker_id, r.fence, r.reason) for r in rejected] == [
        ("worker-A", ids["a"]["fence"], "stale_fence")]


# ------------------------------------------ (1) redelivery, deduplicating webhook


async def test_redelivery_with_a_deduplicating_webhook_commits_one_effect(
    event_log: Any,
) -> None:
    hook = await HookServer(dedup=True).start()
    spec = {"at": FAR, "job": {"type": "invoice"}, "lease": "1s", "overlap": "allow",
            "effects": [{"kind": "webhook", "destination": "hook"}]}
    tenants = granted(hook={"kind": "webhook", "url": hook.url, "backoff": "20ms",
                            "timeout": "3s", "allow_private": True})
    try:
        async with Stack(event_log) as s:
            await s.client.create_schedule(TENANT, SCHEDULE, spec)

            async def a_calls_the_destination(run_id: str) -> None:
                # 4.8 s: A performs the action with the stable key; the destination commits
                # receipt_900 and the response is lost
                hook.plan = ["drop"]
                async with httpx.AsyncClient() as http:
                    with pytest.raises(httpx.HTTPError):
                        await http.post(hook.url, json={"run_id": run_id, "by": "A"},
                                        headers={"Idempotency-Key": f"webhook-{run_id}"})

            ids = await crash_and_redelivery(s, event_log, a_calls_the_destination)
            effect_id = f"webhook-{ids['run_id']}"
            fx, task = await s.runner("fx1", tenants=tenants)

            async def delivered() -> list[Any]:
                return of_type(await all_events(event_log), "EffectSucceeded", effect_id=effect_id)

            ok = await wait_until(delivered, 20, what="webhook delivered")
            await s.stop(fx, task)
            # a restarted runner does not repeat it (a marker run proves it caught up)
            fx2, task2 = await s.runner("fx2", tenants=tenants)
            marker = await s.quick_run("marker")
            await wait_until(lambda: _effect_done(event_log, f"webhook-{marker}"), 20,
                             what="marker delivered")
            await s.stop(fx2, task2)
            evs = await all_events(event_log)
    finally:
        await hook.close()

    assert hook.keys_seen.count(effect_id) == 2  # A's call and the runner's delivery
    assert [x["key"] for x in hook.committed].count(effect_id) == 1  # ONE external effect
    assert len(ok) == 1 and ok[0].evidence["receipt"] == "receipt_900"
    assert_canonical_result_is_bs(evs, ids)
    assert len(of_type(evs, "EffectIntended", effect_id=effect_id)) == 1
    assert (await run_state(event_log, ids["run_id"])) == ("SUCCEEDED", {effect_id: "SUCCEEDED"})


async def _effect_done(lg: Any, effect_id: str) -> bool:
    evs = await all_events(lg)
    return any(e.type in ("EffectSucceeded", "EffectFailed", "EffectUncertain")
               and e.payload.effect_id == effect_id for e in evs)


# -------------------------------------------------- (2) lost SMTP reply, reconcile


async def cli(cfg: LogConfig, *args: str) -> tuple[int, str, str]:
    """Run the ``chronolog`` CLI without blocking the in-process processor."""
    proc = await asyncio.create_subprocess_exec(
        CHRONOLOG, *args, "--log", log_url(cfg), "--topic-prefix", cfg.topics.prefix,
        "--partitions", str(cfg.topics.partitions), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_lost_smtp_reply_goes_to_reconciliation_and_is_never_resent(
    event_log: Any, log_config: LogConfig,
) -> None:
    smtp = SmtpServer().start()
    smtp.handler.drop_after_data = 1
    spec = {"at": FAR, "job": {"type": "invoice"}, "lease": "1s", "overlap": "allow",
            "effects": [{"kind": "email", "destination": "mail"}]}
    tenants = granted(mail={"kind": "email", "host": "127.0.0.1", "port": smtp.port,
                            "from": "billing@example.com", "to": ["customer@example.com"],
                            "timeout": "3s"})
    try:
        async with Stack(event_log) as s:
            await s.client.create_schedule(TENANT, SCHEDULE, spec)
            ids = await crash_and_redelivery(s, event_log)
            run_id = ids["run_id"]
            effect_id = f"send-{run_id}"
            fx, task = await s.runner("fx1", tenants=tenants)
            await wait_until(lambda: _state_is(event_log, run_id, "RECONCILING"), 20,
                             what="run reconciling")
            await s.stop(fx, task)
            fx2, task2 = await s.runner("fx2", tenants=tenants)  # restart: must not resend
            marker = await s.quick_run("marker")
            await wait_until(lambda: _effect_done(event_log, f"send-{marker}"), 20,
                             what="marker email")
            await s.stop(fx2, task2)

            rc, out, err = await cli(log_config, "reconcile", "list", "--json")
            assert rc == 0, err
            listed = orjson.loads(out)
            assert [(i["run_id"], i["effect_id"], i["kind"]) for i in listed] == [
                (run_id, effect_id, "email")]
            assert listed[0]["evidence"]["phase"] == "data"

            rc, out, err = await cli(
                log_config, "reconcile", "resolve", run_id, "--schedule", SCHEDULE,
                "--tenant", TENANT, "--decision", "delivered", "--effect", effect_id,
                "--note", "customer confirmed receipt by phone", "--by", "alice")
            assert rc == 0, err
            assert orjson.loads(out)["state"] == "SUCCEEDED"
            rc, out, _ = await cli(log_config, "reconcile", "list", "--json")
            assert rc == 0 and orjson.loads(out) == []
            evs = await all_events(event_log)
    finally:
        smtp.stop()

    ours = [msg for msg in smtp.messages if f"<{effect_id}.1@chronolog>".encode() in msg]
    assert len(ours) == 1 and len(smtp.messages) == 2  # ours once, plus the marker
    uncertain = of_type(evs, "EffectUncertain", effect_id=effect_id)
    assert len(uncertain) == 1 and uncertain[0].evidence["phase"] == "data"
    assert len(of_type(evs, "ReconciliationRequired", effect_id=effect_id)) == 1
    resolved = of_type(evs, "ReconciliationResolved", run_id=run_id)
    assert [(r.decision, r.by, r.note, r.effect_id) for r in resolved] == [
        ("delivered", "alice", "customer confirmed receipt by phone", effect_id)]
    assert_canonical_result_is_bs(evs, ids)
    assert (await run_state(event_log, run_id)) == ("SUCCEEDED", {effect_id: "SUCCEEDED"})


# ---------------------------------------------------------------------- kafka + postgres


async def test_runner_kafka_topic_and_postgres_inbox_effects_once_across_a_restart(
    event_log: Any, database_url: str,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    inbox, biz = f"inbox_{suffix}", f"invoices_{suffix}"
    topic = event_log.topics.effects
    conn = await asyncpg.connect(database_url)
    await conn.execute(f"CREATE TABLE {biz} (effect_id text, doc jsonb)")
    spec = {"at": FAR, "job": {"type": "invoice"}, "overlap": "allow", "effects": [
        {"kind": "kafka", "destination": "out"},
        {"kind": "postgres", "destination": "ledger"}]}
    # the destination database is the operator's (here the test database); the runner is
    # given no node database, so nothing is refused
    tenants = granted(out={"kind": "kafka", "topic": topic},
                      ledger={"kind": "postgres", "dsn": database_url, "inbox_table": inbox,
                              "sql": f"INSERT INTO {biz} VALUES ($2, $1::jsonb)"})
    try:
        async with Stack(event_log) as s:
            await s.client.create_schedule(TENANT, SCHEDULE, spec)
            fx, task = await s.runner("fx1", tenants=tenants)
            run_id = await s.quick_run("one")
            for eid in (f"kafka-{run_id}", f"postgres-{run_id}"):
                await wait_until(lambda eid=eid: _effect_done(event_log, eid), 30, what=eid)
            await s.stop(fx, task)
            fx2, task2 = await s.runner("fx2", tenants=tenants)
            marker = await s.quick_run("marker")
            await wait_until(lambda: _effect_done(event_log, f"postgres-{marker}"), 30,
                             what="marker")
            await s.stop(fx2, task2)
            evs = await all_events(event_log)
        published: list[Any] = []
        for p in range(await event_log.partitions_for(topic)):  # read_committed reads
            published += await event_log.read(topic, p, 0, 1000)
        rows = await conn.fetch(f"SELECT effect_id FROM {biz} ORDER BY effect_id")
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {biz}; DROP TABLE IF EXISTS {inbox}")
        await conn.close()
    keys = [r.key.decode() for r in published]
    assert sorted(keys) == sorted([f"kafka-{run_id}", f"kafka-{marker}"])
    assert orjson.loads(published[keys.index(f"kafka-{run_id}")].value)["result"] == {
        "marker": "one"}
    assert [r["effect_id"] for r in rows] == sorted([f"postgres-{run_id}", f"postgres-{marker}"])
    ok = of_type(evs, "EffectSucceeded", run_id=run_id)
    assert sorted(e.effect_id for e in ok) == sorted([f"kafka-{run_id}", f"postgres-{run_id}"])
    kafka_ev = next(e for e in ok if e.effect_id == f"kafka-{run_id}").evidence
    if type(event_log).__name__ == "KafkaEventLog":
        assert kafka_ev["contract"] == "transactional"
    else:
        assert kafka_ev["contract"].startswith("at-least-once")


async def test_kafka_transaction_carries_the_outcome_so_a_crash_before_recording_repeats_nothing(
    kafka_bootstrap: str, topic_prefix: str,
) -> None:
    """A runner that dies right after its Kafka transaction committed (before it recorded the
    outcome) leaves the result, the outcome command and its group offset, all or nothing: the
    next runner does not publish again, and the processor still records EffectSucceeded."""
    from chronolog.effect_adapters.base import EffectContext
    from chronolog.effect_adapters.kafka_topic import KafkaEffectAdapter
    from chronolog.log.port import Topics
    from chronolog.settings import open_log

    lg = open_log(LogConfig("kafka", kafka_bootstrap, Topics(prefix=topic_prefix, partitions=2)))
    await lg.start()
    await lg.ensure_topics()
    topic = lg.topics.effects
    spec = {"at": FAR, "job": {"type": "invoice"}, "overlap": "allow",
            "effects": [{"kind": "kafka", "destination": "out"}]}
    try:
        async with Stack(lg) as s:
            await s.client.create_schedule(TENANT, SCHEDULE, spec)
            run_id = await s.quick_run("one")
            effect_id = f"kafka-{run_id}"
            found = []
            for q in range(2):
                found += [r for r in await lg.read(lg.topics.events, q, 0, 1000)
                          if codec.decode_event(r.value).type == "EffectIntended"]
            rec = found[0]
            p = rec.partition
            env = codec.decode_event(rec.value)
            crashed = EffectRunner(lg, "crashy")  # used for its envelope only; never started
            ctx = EffectContext(
                tenant=TENANT, schedule_id=SCHEDULE, intended_at=env.at, runner_id="crashy",
                group=crashed.group, events_topic=rec.topic, partition=p, offset=rec.offset,
                outcome_envelope=lambda st, ev: crashed.outcome_envelope(env, env.payload, st, ev))
            adapter = KafkaEffectAdapter(lg, "crashy")
            out = await adapter.perform(env.payload, env.payload.inline, ctx)
            await adapter.close()  # "crash": the outcome is never sent by this runner
            assert out.status == "succeeded" and out.recorded
            # the group offset moved past the intent in the same transaction, so the next
            # runner starts after it whether or not the outcome event exists yet (the broker
            # confirms a commit a moment before offset fetches see it: wait, bounded)

            async def offset_moved() -> bool:
                return await lg.committed(crashed.group, rec.topic, p) == rec.offset + 1

            await wait_until(offset_moved, 10, what="the group offset committed with the txn")
            await wait_until(lambda: _effect_done(lg, effect_id), 30, what="outcome via txn")
            fx, task = await s.runner("fx2", tenants=granted(out={"kind": "kafka", "topic": topic}))
            marker = await s.quick_run("marker")
            await wait_until(lambda: _effect_done(lg, f"kafka-{marker}"), 30, what="marker")
            await s.stop(fx, task)
            evs = await all_events(lg)
        published = []
        for q in range(await lg.partitions_for(topic)):
            published += [r.key.decode() for r in await lg.read(topic, q, 0, 1000)]
    finally:
        await lg.close()
    assert sorted(published) == sorted([effect_id, f"kafka-{marker}"])
    assert len(of_type(evs, "EffectSucceeded", effect_id=effect_id)) == 1
