"""Effects are capabilities the operator grants, and they are isolated per destination.

Through the real processor and effect runner on an embedded log (one partition, so every
intent shares the partition), with real destinations on loopback: a PostgreSQL database
of the operator's (another database than the node's), the test HTTP server, a closed port.

* A tenant cannot name a destination it was not granted (the processor refuses the
  schedule; the runner refuses an intent that reached the log anyway), and no destination
  reaches the node's own database or chronolog's topics.
* A failing destination delays only its own effects: another tenant's effect behind it in
  the same partition is delivered while it is still retrying; its circuit breaker opens and
  postpones it; its give-up time is its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import orjson
import pytest

from chronolog.client import Client, Forbidden, Invalid
from chronolog.destinations import check_destinations, parse_destinations
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.effects.runner import EffectRunner, RunnerConfig
from chronolog.log.port import LogError, Topics
from chronolog.processors.runtime import Processor
from chronolog.settings import ConfigError, LogConfig, open_log
from chronolog.tenants import Tenant, Tenants
from support.net import free_port
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT
from .effect_servers import HookServer
from .pgdb import create_database, drop_database

FAR = "2099-01-01T00:00:00Z"
OUTCOMES = ("EffectSucceeded", "EffectFailed", "EffectUncertain")


def tenant(name: str, jobs: frozenset[str] | None = None, **dests: dict[str, Any]) -> Tenant:
    return Tenant(name, (f"{name}-token",), jobs, None, parse_destinations(name, dests))


@pytest.fixture
async def lg(tmp_path: Path) -> AsyncIterator[Any]:
    log_ = open_log(LogConfig("sqlite", str(tmp_path / "log.db"), Topics("t.", 1)))
    await log_.start()
    await log_.ensure_topics()
    yield log_
    await log_.close()


@pytest.fixture
async def two_databases(database_url: str) -> AsyncIterator[tuple[str, str]]:
    """(the node's read-model database, a database the operator grants to acme)."""
    node = await create_database(database_url, "node")
    ledger = await create_database(database_url, "ledger")
    for dsn in (node, ledger):
        conn = await asyncpg.connect(dsn)
        await conn.execute("CREATE TABLE secrets (tenant text, doc text)")
        await conn.execute("INSERT INTO secrets VALUES ('acme', 'acme-only')")
        await conn.close()
    yield node, ledger
    for dsn in (node, ledger):
        await drop_database(database_url, dsn)


class Node:
    """A processor (with a tenants registry, or open), a client and effect runners."""

    def __init__(self, lg: Any, tenants: Tenants | None) -> None:
        self.lg = lg
        self.proc = Processor(lg, f"p-{uuid.uuid4().hex[:6]}", tenants=tenants)
        self.client = Client(lg, principal="test", reply_timeout=30)
        self.tasks: list[tuple[Any, asyncio.Task[None]]] = []

    async def __aenter__(self) -> Node:
        self.tasks.append((self.proc, asyncio.create_task(self.proc.run())))
        await self.client.start()
        await wait_until(lambda: len(self.proc.partitions) == 1, 30, what="processor")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        for part, task in reversed(self.tasks):
            part.stop()
            await asyncio.wait_for(task, 30)

    async def runner(self, tenants: Tenants, **kw: Any) -> EffectRunner:
        fx = EffectRunner(self.lg, f"fx-{uuid.uuid4().hex[:6]}", tenants=tenants,
                          config=RunnerConfig(poll_ms=50, retry_initial=0.05, retry_max=0.2),
                          **kw)
        self.tasks.append((fx, asyncio.create_task(fx.run())))
        await wait_until(fx.ready.is_set, 30, what="runner assigned")
        return fx

    async def completed_run(self, tenant_: str, schedule: str) -> str:
        """Trigger a run of ``schedule``, claim and complete it; returns the run ID."""
        run_id = str((await self.client.trigger(tenant_, schedule, uuid.uuid4().hex))["run_id"])
        claim = await self.client.claim(tenant_, schedule, run_id, 1, "w1")
        data = orjson.dumps({"total": 57})
        await self.client.complete(tenant_, schedule, run_id, 1, claim["fence"], "w1",
                                   hashlib.sha256(data).hexdigest(), len(data),
                                   inline={"total": 57})
        return run_id


async def events(lg: Any) -> list[m.EventEnvelope]:
    end = await lg.end_offset(lg.topics.events, 0)
    recs = await lg.read(lg.topics.events, 0, 0, end + 1) if end else []
    return [codec.decode_event(r.value) for r in recs]


async def outcome(lg: Any, effect_id: str) -> Any:
    for e in await events(lg):
        if e.type in OUTCOMES and e.payload.effect_id == effect_id:  # type: ignore[union-attr]
            return e
    return None


def spec(job: str, *effects: dict[str, Any]) -> dict[str, Any]:
    return {"at": FAR, "job": {"type": job}, "overlap": "allow", "effects": list(effects)}


async def table_exists(dsn: str, name: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name))
    finally:
        await conn.close()


# ---------------------------------------------------------------------- granted destinations


def ledger_destination(dsn: str) -> dict[str, Any]:
    return {"kind": "postgres", "dsn": dsn,
            "sql": "INSERT INTO secrets VALUES ('acme', $1::text)"}


async def test_a_tenant_cannot_name_a_destination_it_was_not_granted(
    lg: Any, two_databases: tuple[str, str],
) -> None:
    """A tenant allowed only ``noop`` cannot reach another tenant's database (or the node's)
    through a postgres effect: the processor refuses the schedule, naming the field."""
    _node_db, ledger = two_databases
    tenants = Tenants({"acme": tenant("acme", ledger=ledger_destination(ledger)),
                       "mallory": tenant("mallory", frozenset({"noop"}))})
    async with Node(lg, tenants) as node:
        with pytest.raises(Forbidden) as refused:
            await node.client.create_schedule("mallory", "steal", spec(
                "noop", {"kind": "postgres", "destination": "ledger"}))
        with pytest.raises(Invalid) as wrong_kind:
            await node.client.create_schedule("acme", "mixup", spec(
                "noop", {"kind": "webhook", "destination": "ledger"}))
        await node.client.create_schedule("acme", "books", spec(
            "noop", {"kind": "postgres", "destination": "ledger"}))
    assert refused.value.field == "effects[0].destination"
    assert "not granted" in refused.value.reason
    assert wrong_kind.value.field == "effects[0].kind"
    # and a schedule cannot carry a DSN or SQL of its own at all
    with pytest.raises(ValueError, match="config"):
        m.EffectSpec.model_validate({"kind": "postgres", "destination": "ledger",
                                     "config": {"dsn": ledger, "sql": "SELECT 1"}})


async def test_the_runner_refuses_an_intent_for_a_destination_not_granted(
    lg: Any, two_databases: tuple[str, str],
) -> None:
    """An intent that reached the log without the processor's check (an open processor)
    naming another tenant's destination is recorded as failed; nothing touches either
    database. A destination on the node's own database is refused too."""
    node_db, ledger = two_databases
    tenants = Tenants({
        "acme": tenant("acme", ledger=ledger_destination(ledger),
                       sneaky=ledger_destination(node_db),
                       # the node's server again: another spelling, another database on it
                       sneakier=ledger_destination(
                           node_db.replace("127.0.0.1", "127.1").rsplit("/", 1)[0]
                           + "/postgres")),
        "mallory": tenant("mallory", frozenset({"noop"}))})
    async with Node(lg, None) as node:  # the processor checks nothing
        await node.client.create_schedule("mallory", "steal", spec(
            "noop", {"kind": "postgres", "destination": "ledger"}))
        await node.client.create_schedule("acme", "own", spec(
            "noop", {"kind": "postgres", "destination": "sneaky"}))
        await node.client.create_schedule("acme", "own2", spec(
            "noop", {"kind": "postgres", "destination": "sneakier"}))
        await node.runner(tenants, database_url=node_db)
        stolen = await node.completed_run("mallory", "steal")
        own = await node.completed_run("acme", "own")
        own2 = await node.completed_run("acme", "own2")
        got = await wait_until(lambda: outcome(lg, f"postgres-{stolen}"), 20, what="outcome")
        own_got = await wait_until(lambda: outcome(lg, f"postgres-{own}"), 20, what="outcome")
        own2_got = await wait_until(lambda: outcome(lg, f"postgres-{own2}"), 20,
                                    what="outcome")
    assert got.type == "EffectFailed"
    assert "not granted to tenant 'mallory'" in got.payload.evidence["reason"]
    for got_own in (own_got, own2_got):
        assert got_own.type == "EffectFailed"
        assert "node's own database" in got_own.payload.evidence["reason"]
    for dsn in (node_db, ledger):
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM secrets") == 1
        finally:
            await conn.close()
        assert not await table_exists(dsn, "chronolog_inbox")


async def test_the_node_database_and_chronolog_topics_are_refused_at_start(
    two_databases: tuple[str, str],
) -> None:
    node_db, ledger = two_databases
    topics = Topics("chronolog.", 4)
    # the ledger of the check must be another server: any database on the node's is refused
    elsewhere = ledger.replace(f":{urlsplit(ledger).port}/", f":{free_port()}/")
    ok = Tenants({"acme": tenant("acme", ledger=ledger_destination(elsewhere),
                                 out={"kind": "kafka", "topic": "chronolog.effects.out"},
                                 orders={"kind": "kafka", "topic": "acme.orders"})})
    check_destinations(ok, topics, node_db)  # nothing refused
    own_db = Tenants({"acme": tenant("acme", books=ledger_destination(
        node_db.replace("127.0.0.1", "localhost")))})
    with pytest.raises(ConfigError, match=r"tenants\.acme\.destinations\.books: dsn "
                       r"reaches the node's own database server"):
        check_destinations(own_db, topics, node_db)
    same_server = Tenants({"acme": tenant("acme", books=ledger_destination(ledger))})
    with pytest.raises(ConfigError, match=r"destinations\.books: dsn reaches the node's own"):
        check_destinations(same_server, topics, node_db)
    for topic in ("chronolog.events", "chronolog.commands", "chronolog.ready.default"):
        own_topic = Tenants({"acme": tenant("acme", out={"kind": "kafka", "topic": topic})})
        with pytest.raises(ConfigError, match=r"destinations\.out: topic .* chronolog's own"):
            check_destinations(own_topic, topics, node_db)


@pytest.mark.parametrize("command", ["effects", "dev"])
@pytest.mark.parametrize("destination", [
    'kind = "postgres"\ndsn = "NODE"\nsql = "SELECT 1"',
    # the same server in other spellings, another database on it
    'kind = "postgres"\ndsn = "postgresql://chronolog@0.0.0.0:5432/postgres"\nsql = "SELECT 1"',
    'kind = "postgres"\ndsn = "postgresql://chronolog@[::ffff:127.0.0.1]:5432/x"\nsql = "SELECT 1"',
    'kind = "postgres"\ndsn = "postgresql://chronolog@/x?host=/postgres&port=5432"\n'
    'sql = "SELECT 1"',
    'kind = "kafka"\ntopic = "chronolog.events"'])
async def test_the_cli_exits_2_on_a_destination_the_node_must_refuse(
    tmp_path: Path, command: str, destination: str,
) -> None:
    node_db = "postgresql://chronolog@127.0.0.1:5432/readmodel"
    path = tmp_path / "tenants.toml"
    path.write_text('[tenants.acme]\ntokens = ["t"]\n[tenants.acme.destinations.x]\n'
                    + destination.replace("NODE", node_db) + "\n")
    proc = await asyncio.create_subprocess_exec(
        CHRONOLOG, command, "--data-dir", str(tmp_path / "data"), "--tenants", str(path),
        "--database-url", node_db, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, err
    assert b"tenants.acme.destinations.x" in err


# ---------------------------------------------------------------------- isolation


def hook_destination(url: str, **kw: Any) -> dict[str, Any]:
    return {"kind": "webhook", "url": url, "allow_private": True, "timeout": "2s",
            "max_attempts": 1, **kw}


async def a_and_b_schedules(node: Node) -> None:
    """Schedule ``sa`` of tenant a (webhook to its ``down``), ``sb`` of b (to its ``up``)."""
    await node.client.create_schedule("a", "sa", spec(
        "noop", {"kind": "webhook", "destination": "down"}))
    await node.client.create_schedule("b", "sb", spec(
        "noop", {"kind": "webhook", "destination": "up"}))


async def test_a_failing_destination_delays_only_its_own_effects(lg: Any) -> None:
    """Tenant A's destination is a closed port; B's effect, behind A's in the same partition,
    is delivered while A's is still being retried. A's circuit breaker opens and postpones
    it, and the partition's offset stays before A's open intent."""
    hook = await HookServer().start()
    tenants = Tenants({
        "a": tenant("a", down=hook_destination(f"http://127.0.0.1:{free_port()}/hook",
                                                breaker_failures=2, breaker_cooldown="300ms")),
        "b": tenant("b", up=hook_destination(hook.url))})
    try:
        async with Node(lg, tenants) as node:
            await a_and_b_schedules(node)
            fx = await node.runner(tenants)
            run_a = await node.completed_run("a", "sa")  # A's intent first in the partition
            run_b = await node.completed_run("b", "sb")
            b_done = await wait_until(lambda: outcome(lg, f"webhook-{run_b}"), 10,
                                      what="B delivered while A retries")
            a_when_b_done = await outcome(lg, f"webhook-{run_a}")
            await wait_until(lambda: fx.stats.postponed > 0, 10, what="A's breaker opened")
            a_intent = next(i for i, e in enumerate(await events(lg))
                            if e.type == "EffectIntended" and e.payload.run_id == run_a)
            committed = await lg.committed(fx.group, lg.topics.events, 0)
            a_still_open = await outcome(lg, f"webhook-{run_a}")
    finally:
        await hook.close()
    assert b_done.type == "EffectSucceeded" and b_done.payload.evidence["status"] == 200
    assert a_when_b_done is None and a_still_open is None  # A is still being retried
    assert fx.stats.retries >= 2
    assert committed is None or committed <= a_intent  # A's intent is never skipped


async def webhook_outcome(lg: Any, tenants: Tenants, tenant_: str, destination: str) -> Any:
    """Through the processor and a runner: one run of a schedule with one webhook effect to
    ``destination``; the outcome event of that effect."""
    async with Node(lg, tenants) as node:
        await node.client.create_schedule(tenant_, "s", spec(
            "noop", {"kind": "webhook", "destination": destination}))
        await node.runner(tenants)
        run_id = await node.completed_run(tenant_, "s")
        return await wait_until(lambda: outcome(lg, f"webhook-{run_id}"), 20, what="outcome")


async def test_the_give_up_time_is_the_destinations(lg: Any) -> None:
    tenants = Tenants({"a": tenant("a", down=hook_destination(
        f"http://127.0.0.1:{free_port()}/hook", give_up_after="1s"))})
    got = await webhook_outcome(lg, tenants, "a", "down")
    assert got.type == "EffectUncertain" and "gave up" in got.payload.evidence["reason"]


# ---------------------------------------------------------------------- webhook targets


def webhook_intent(url: str, tenant_headers: dict[str, str] | None = None,
                   **dest: Any) -> m.EffectIntended:
    """The intent as the runner hands it to the adapter: the operator's destination plus the
    tenant's options (``adapter_config``)."""
    from chronolog.destinations import adapter_config

    d = parse_destinations("acme", {"d": {"kind": "webhook", "url": url, "timeout": "2s",
                                          "max_attempts": 1, **dest}})["d"]
    options = {"headers": tenant_headers} if tenant_headers else {}
    run_id = f"r_{uuid.uuid4().hex[:8]}"
    return m.EffectIntended(effect_id=f"webhook-{run_id}", run_id=run_id, kind="webhook",
                            destination="d", config=adapter_config(d, options), checksum="c",
                            inline={"total": 57})


async def perform(i: m.EffectIntended) -> Any:
    from chronolog.effect_adapters.webhook import WebhookEffectAdapter

    adapter = WebhookEffectAdapter()
    try:
        return await adapter.perform(i, i.inline)
    finally:
        await adapter.close()


@pytest.fixture
async def hook() -> AsyncIterator[HookServer]:
    srv = await HookServer().start()
    yield srv
    await srv.close()


async def test_webhook_to_loopback_is_refused_by_default_and_nothing_reaches_it(
    hook: HookServer,
) -> None:
    refused = await perform(webhook_intent(hook.url))
    by_name = await perform(webhook_intent(hook.url.replace("127.0.0.1", "localhost")))
    mapped = await perform(webhook_intent(hook.url.replace("127.0.0.1", "[::ffff:127.0.0.1]")))
    assert hook.requests == []  # nothing reached the server
    for out in (refused, by_name, mapped):
        assert out.status == "failed", out
        assert "not a public address" in out.evidence["reason"]
    allowed = await perform(webhook_intent(hook.url, allow_private=True))
    assert allowed.status == "succeeded" and len(hook.requests) == 1


async def test_metadata_addresses_are_refused_even_when_private_addresses_are_allowed() -> None:
    out = await perform(webhook_intent("http://169.254.169.254/latest/meta-data/",
                                       allow_private=True))
    assert out.status == "failed" and "metadata" in out.evidence["reason"]


async def test_a_redirect_is_not_followed(hook: HookServer) -> None:
    inner = await HookServer().start()
    try:
        hook.plan = ["redirect"]
        hook.redirect_to = inner.url
        out = await perform(webhook_intent(hook.url, allow_private=True))
    finally:
        await inner.close()
    assert out.status == "failed" and out.evidence["status"] == 307
    assert "redirect" in out.evidence["reason"]
    assert inner.requests == [] and len(hook.requests) == 1


async def test_a_tenant_cannot_choose_the_host_header(hook: HookServer) -> None:
    with pytest.raises(ValueError, match="effect header 'Host' may not be set"):
        m.EffectSpec.model_validate({"kind": "webhook", "destination": "d",
                                     "headers": {"Host": "metadata.google.internal"}})
    # an intent carrying one anyway (written before this rule) does not send it
    out = await perform(webhook_intent(hook.url, {"Host": "metadata.google.internal",
                                                  "X-Forwarded-For": "10.0.0.1",
                                                  "X-Trace": "t-1"}, allow_private=True))
    assert out.status == "succeeded"
    (_, headers), = hook.requests
    assert headers["host"] == f"127.0.0.1:{hook.port}"
    assert headers["x-trace"] == "t-1" and "x-forwarded-for" not in headers


async def test_evidence_carries_no_response_body(hook: HookServer) -> None:
    hook.plan = ["400"]
    out = await perform(webhook_intent(hook.url, allow_private=True))
    assert out.status == "failed" and out.evidence["status"] == 400
    text = orjson.dumps(out.evidence).decode()
    assert hook.secret not in text and "bad request" not in text
    assert out.evidence["body_bytes"] > 0


async def test_the_runner_refuses_a_loopback_webhook_by_default(lg: Any, hook: HookServer) -> None:
    tenants = Tenants({"acme": tenant("acme", internal={"kind": "webhook", "url": hook.url})})
    got = await webhook_outcome(lg, tenants, "acme", "internal")
    assert got.type == "EffectFailed" and "not a public address" in got.payload.evidence["reason"]
    assert hook.requests == []


async def test_with_too_many_open_intents_the_runner_waits_and_loses_nothing(lg: Any) -> None:
    """``max_open`` bounds the intents held open: B's intent, read while A's holds the only
    slot, is put back and delivered once A's gives up."""
    hook = await HookServer().start()
    tenants = Tenants({
        "a": tenant("a", down=hook_destination(f"http://127.0.0.1:{free_port()}/hook",
                                                give_up_after="1s")),
        "b": tenant("b", up=hook_destination(hook.url))})
    try:
        async with Node(lg, tenants) as node:
            await a_and_b_schedules(node)
            fx = EffectRunner(lg, "fx-capped", tenants=tenants, config=RunnerConfig(
                poll_ms=50, retry_initial=0.05, retry_max=0.2, max_open=1))
            node.tasks.append((fx, asyncio.create_task(fx.run())))
            await wait_until(fx.ready.is_set, 30, what="runner assigned")
            run_a = await node.completed_run("a", "sa")
            await wait_until(lambda: fx.open_intents == 1, 10, what="A open")
            run_b = await node.completed_run("b", "sb")
            b_done = await wait_until(lambda: outcome(lg, f"webhook-{run_b}"), 20, what="B")
            a_done = await outcome(lg, f"webhook-{run_a}")
    finally:
        await hook.close()
    assert a_done is not None and a_done.type == "EffectUncertain"  # A settled first
    assert b_done.type == "EffectSucceeded" and len(hook.requests) == 1


async def test_a_kafka_destination_on_another_cluster_gets_the_result_keyed_by_effect(
    lg: Any, kafka_bootstrap: str, topic_prefix: str,
) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"{topic_prefix}acme.results"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    tenants = Tenants({"acme": tenant("acme", results={
        "kind": "kafka", "topic": topic, "bootstrap": kafka_bootstrap})})
    async with Node(lg, tenants) as node:
        await node.client.create_schedule("acme", "s", spec(
            "noop", {"kind": "kafka", "destination": "results"}))
        await node.runner(tenants)
        run_id = await node.completed_run("acme", "s")
        got = await wait_until(lambda: outcome(lg, f"kafka-{run_id}"), 60, what="published")
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    records: list[Any] = []
    try:
        async def read() -> bool:
            batch = await consumer.getmany(timeout_ms=500)
            records.extend(r for recs in batch.values() for r in recs)
            return bool(records)

        await wait_until(read, 30, what="the record on the other cluster")
    finally:
        await consumer.stop()
    assert got.type == "EffectSucceeded"
    assert got.payload.evidence["contract"].startswith("at-least-once")
    assert [r.key for r in records] == [f"kafka-{run_id}".encode()]
    assert orjson.loads(records[0].value)["result"] == {"total": 57}
    with pytest.raises(LogError):  # nothing went to the node's own log
        await lg.partitions_for(topic)
