"""Kafka with SASL/SCRAM and an ACL set per role, on a real broker of its own
(``scripts/kafka.sh up --sasl``: no ACL, no access; see tests/integration/sasl_kafka.py).

* the ACL sets are sufficient: a processor, a projector, a worker and an API, each the real
  ``chronolog`` executable under its own principal with exactly its role's ACLs (applied by
  ``chronolog kafka-acls --apply`` as the admin), complete a scheduled run end to end, and
  ``chronolog audit`` and ``replay`` run as the reader and ``backup`` as the operator — none
  of them refused anything; a
  kafka effect publishes as the effects principal;
* they are narrow: a worker principal can neither write ``events`` nor read ``events`` or
  ``state``; a worker of pool b cannot read pool a's ``ready.pool-a.<class>`` (the rogue
  worker: it tries to consume them in a group and gets an authorization error, none of pool
  a's records); a pool-less worker cannot either; an API principal cannot read ready topics;
* an unauthenticated client and a wrong password are refused.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)

from chronolog.log.kafka import KafkaEventLog
from chronolog.log.kafka_acls import acls_for, apply_acls
from chronolog.log.kafka_config import KafkaAuth
from chronolog.log.port import LogError, OutRecord, Topics
from support.net import free_port
from support.polling import SPAWN_POLL, wait_until

from .conftest import CHRONOLOG, ROOT
from .pgdb import create_database, drop_database
from .sasl_kafka import SaslKafka, sasl_kafka
from .test_ops_cli import Cli, Services, _answered, _env

pytestmark = pytest.mark.postgres

CLASS = "default"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslKafka]:
    yield from sasl_kafka(tmp_path_factory.mktemp("sasl-kafka"))


@pytest.fixture
def dsn(database_url: str) -> Iterator[str]:
    d = asyncio.run(create_database(database_url, "test_kafka_acls"))
    yield d
    asyncio.run(drop_database(database_url, d))


async def _log(broker: SaslKafka, topics: Topics, auth: KafkaAuth) -> KafkaEventLog:
    lg = KafkaEventLog(broker.bootstrap, topics, auth=auth, request_timeout_ms=10000)
    await lg.start()
    return lg


@pytest.fixture
async def deployment(broker: SaslKafka) -> AsyncIterator[Topics]:
    """A fresh prefix whose topics the admin created (ready topics of pools a and b too)."""
    topics = Topics(prefix=f"a{uuid.uuid4().hex[:8]}.", partitions=2)
    admin = await _log(broker, topics, broker.auth("admin"))
    try:
        await admin.ensure_topics([CLASS, f"pool-a.{CLASS}", f"pool-b.{CLASS}"])
        yield topics
    finally:
        await admin.close()


@pytest.fixture
async def seeded(broker: SaslKafka, deployment: Topics) -> Topics:
    """The deployment with a record in each of pool a's ready topic, events and state."""
    admin = await _log(broker, deployment, broker.auth("admin"))
    try:
        await admin.append([
            OutRecord(deployment.ready(f"pool-a.{CLASS}"), b"k", b"pool a's job"),
            OutRecord(deployment.events, b"k", b"an event"),
            OutRecord(deployment.state, b"k", b"a state")])
    finally:
        await admin.close()
    return deployment


async def _grant(broker: SaslKafka, topics: Topics, role: str, user: str,
                 pool: str | None = None) -> None:
    admin = await _log(broker, topics, broker.auth("admin"))
    try:
        await apply_acls(admin._admin, acls_for(role, f"User:{user}", topics, pool))
    finally:
        await admin.close()


def _apply_with_cli(broker: SaslKafka, topics: Topics, role: str, user: str) -> str:
    """``chronolog kafka-acls --apply`` as the admin; its output."""
    done = subprocess.run(
        [CHRONOLOG, "kafka-acls", "--role", role, "--principal", f"User:{user}",
         "--topic-prefix", topics.prefix, "--apply", "--log", f"kafka://{broker.bootstrap}"],
        env=_env(**broker.env("admin")), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.long(40)
async def test_each_role_under_its_own_principal_completes_a_scheduled_run(
    broker: SaslKafka, deployment: Topics, dsn: str, tmp_path: Path,
) -> None:
    topics = deployment
    for role, user in (("processor", "processor"), ("projector", "projector"),
                       ("api", "api"), ("worker", "worker")):
        out = _apply_with_cli(broker, topics, role, user)
        assert f"applied {len(acls_for(role, f'User:{user}', topics))} ACLs" in out
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\ntokens = ["acme-token"]\nallowed_jobs = ["echo"]\n')
    log_args = ["--log", f"kafka://{broker.bootstrap}", "--partitions", "2",
                "--topic-prefix", topics.prefix]
    port = free_port()
    services = Services(tmp_path, _env(CHRONOLOG_TENANTS=str(tenants)))

    def start(name: str, args: list[str]) -> None:
        services.env = _env(CHRONOLOG_TENANTS=str(tenants), **broker.env(name))
        services.start(name, args)

    start("processor", ["processor", *log_args])
    start("projector", ["projector", *log_args, "--database-url", dsn])
    start("worker", ["worker", *log_args, "--builtin-jobs", "--results",
                     str(tmp_path / "results")])
    start("api", ["api", *log_args, "--database-url", dsn, "--port", str(port)])
    try:
        api = Cli(["--url", f"http://127.0.0.1:{port}", "--token", "acme-token"], _env(),
                  services)
        created = await wait_until(
            lambda: _answered(api("schedule", "create", "nightly", "--every", "1s", "--job",
                                  "echo", "--params", '{"n": 1}', "--idempotency-key", "c-1",
                                  "--json")), 120, interval=SPAWN_POLL, what="the API answers")
        assert created.rc == 0, created
        page = await api.poll("a succeeded run", "runs", "nightly", "--state", "SUCCEEDED",
                              until=lambda d: len(d["items"]) >= 1, timeout=120)
        run = await api.ok("run", page["items"][-1]["runId"])
        assert run["result"]["inline"] == {"n": 1}
        # the operators' readers: audit and replay as the reader principal
        _apply_with_cli(broker, topics, "reader", "reader")
        reader = _env(CHRONOLOG_TOPIC_PREFIX=topics.prefix, **broker.env("reader"))
        for args in (["audit"], ["replay", "--database-url", dsn, "--schema", "replayed"]):
            done = subprocess.run([CHRONOLOG, *args, "--log", f"kafka://{broker.bootstrap}"],
                                  env=reader, cwd=ROOT, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        # and a backup as the operator
        _apply_with_cli(broker, topics, "operator", "operator")
        done = subprocess.run(
            [CHRONOLOG, "backup", str(tmp_path / "backup"), "--log",
             f"kafka://{broker.bootstrap}", "--database-url", dsn, "--results",
             str(tmp_path / "results")],
            env=_env(CHRONOLOG_TOPIC_PREFIX=topics.prefix, **broker.env("operator")), cwd=ROOT,
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert (tmp_path / "backup" / "manifest.json").is_file()
        # and nothing any of them did was refused (the broker logs each refusal)
        refused = [line for line in (broker.state / "broker.log").read_text().splitlines()
                   if " is Denied " in line and topics.prefix in line]
        assert refused == []
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


async def _refused(coro: object) -> LogError:
    with pytest.raises(LogError) as info:
        await coro  # type: ignore[misc]
    return info.value


async def _rogue_consume(broker: SaslKafka, user: str, topic: str, group: str,
                         refusal: type[Exception] = TopicAuthorizationFailedError
                         ) -> list[bytes]:
    """Consume ``topic`` in ``group`` as ``user`` until refused (bounded); what it got."""
    got: list[bytes] = []
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                **broker.auth(user).client_kwargs())
    try:
        with pytest.raises(refusal):
            await consumer.start()
            async with asyncio.timeout(30):
                while True:
                    for recs in (await consumer.getmany(timeout_ms=200)).values():
                        got += [r.value for r in recs]
    finally:
        await consumer.stop()
    return got


async def test_a_worker_principal_reaches_only_its_pools_assignments(
    broker: SaslKafka, seeded: Topics,
) -> None:
    topics = seeded
    await _grant(broker, topics, "worker", "worker-a", "a")
    await _grant(broker, topics, "worker", "worker-b", "b")
    await _grant(broker, topics, "worker", "worker")
    pool_a = topics.ready(f"pool-a.{CLASS}")
    own = await _log(broker, topics, broker.auth("worker-a"))
    try:  # pool a's worker reads its assignment
        assert [r.value for r in await own.read(pool_a, 0, 0, 10, 2000)] + \
            [r.value for r in await own.read(pool_a, 1, 0, 10, 2000)] == [b"pool a's job"]
    finally:
        await own.close()
    rogue = await _log(broker, topics, broker.auth("worker-b"))
    try:
        for p in (0, 1):
            err = await _refused(rogue.read(pool_a, p, 0, 10, 500))
            assert "TopicAuthorizationFailed" in str(err)
            assert "TopicAuthorizationFailed" in str(
                await _refused(rogue.read(topics.events, p, 0, 10, 500)))
            assert "TopicAuthorizationFailed" in str(
                await _refused(rogue.read(topics.state, p, 0, 10, 500)))
        await _refused(rogue.append([OutRecord(topics.events, b"k", b"forged")]))
        assert await rogue.read(topics.ready(f"pool-b.{CLASS}"), 0, 0, 10, 200) == []
    finally:
        await rogue.close()
    # the rogue worker consumes pool a's topic in a group of its own pool: the topic is
    # refused; in pool a's group: the group is refused (it cannot be handed pool a's
    # partitions and hold them idle); nothing received either way
    got = await _rogue_consume(broker, "worker-b", pool_a, f"{topics.prefix}workers.pool-b.x")
    assert got == []
    got = await _rogue_consume(broker, "worker-b", pool_a, f"{topics.prefix}workers.pool-a.x",
                               GroupAuthorizationFailedError)
    assert got == []
    # a pool-less worker reads ready.<class> but no pool's topic
    plain = await _log(broker, topics, broker.auth("worker"))
    try:
        assert await plain.read(topics.ready(CLASS), 0, 0, 10, 200) == []
        assert "TopicAuthorizationFailed" in str(
            await _refused(plain.read(pool_a, 0, 0, 10, 500)))
    finally:
        await plain.close()
    assert await _rogue_consume(broker, "worker", pool_a, f"{topics.prefix}workers.y") == []
    assert await _rogue_consume(broker, "worker", pool_a, f"{topics.prefix}workers.pool-a.y",
                                GroupAuthorizationFailedError) == []


async def test_an_api_principal_cannot_read_ready_topics(
    broker: SaslKafka, seeded: Topics,
) -> None:
    topics = seeded
    await _grant(broker, topics, "api", "api")
    api = await _log(broker, topics, broker.auth("api"))
    try:
        for cls in (CLASS, f"pool-a.{CLASS}"):
            assert "TopicAuthorizationFailed" in str(
                await _refused(api.read(topics.ready(cls), 0, 0, 10, 500)))
    finally:
        await api.close()
    assert await _rogue_consume(broker, "api", topics.ready(f"pool-a.{CLASS}"),
                                f"{topics.prefix}client-x") == []


async def test_an_unauthenticated_client_and_a_wrong_password_are_refused(
    broker: SaslKafka,
) -> None:
    topics = Topics(prefix="nobody.", partitions=1)
    for auth in (KafkaAuth(), broker.auth("worker", "not-the-password")):
        lg = KafkaEventLog(broker.bootstrap, topics, auth=auth, request_timeout_ms=3000)
        with pytest.raises(LogError) as info:
            await lg.start()
        assert isinstance(info.value.__cause__, KafkaConnectionError), info.value
    # the right password is let in (the refusals above are not a broker that is away), once
    # the worker role is granted here (this test may be the first of the module on its broker)
    await _grant(broker, topics, "worker", "worker")
    lg = await _log(broker, topics, broker.auth("worker"))
    await lg.close()


async def test_a_kafka_effect_publishes_as_the_effects_principal(
    broker: SaslKafka, deployment: Topics,
) -> None:
    """The kafka effect's transactional producer speaks as the log's principal, and the
    effects role's ACLs let it publish to ``effects.out`` in its transaction."""
    from chronolog.domain import messages as m
    from chronolog.effect_adapters.kafka_topic import KafkaEffectAdapter

    topics = deployment
    await _grant(broker, topics, "effects", "effects")
    lg = await _log(broker, topics, broker.auth("effects"))
    adapter = KafkaEffectAdapter(lg, "m1")
    try:
        intent = m.EffectIntended(effect_id="kafka-r1", run_id="r1", kind="kafka",
                                  config={}, checksum="c1", inline={"total": 57}, attempt=1)
        out = await adapter.perform(intent, intent.inline)
        assert out.status == "succeeded", out
        assert out.evidence["transactional_id"] == f"{topics.prefix}effects-m1"
    finally:
        await adapter.close()
        await lg.close()
    admin = await _log(broker, topics, broker.auth("admin"))
    try:
        recs = await admin.read(topics.effects, out.evidence["partition"],
                                out.evidence["offset"], 1, 2000)
        assert [r.key for r in recs] == [b"kafka-r1"]
    finally:
        await admin.close()


def test_only_a_principal_allowed_to_alter_acls_can_apply_them(broker: SaslKafka) -> None:
    args = [CHRONOLOG, "kafka-acls", "--role", "worker", "--principal", "User:worker-b",
            "--pool", "b", "--topic-prefix", "elsewhere.", "--apply"]
    refused = subprocess.run([*args, "--log", f"kafka://{broker.bootstrap}"],
                             env=_env(**broker.env("worker-b")), cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("error: the broker refused 'ALLOW DESCRIBE "), refused
    no_log = subprocess.run([*args, "--log", "sqlite:///tmp/x.db"], env=_env(), cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert no_log.returncode == 2
    assert no_log.stderr.strip() == ("error: --log: 'sqlite:///tmp/x.db': --apply needs "
                                     "kafka://HOST:PORT")
