"""Readiness, and the worker, effect runner and API through outages of their services.

Every long-running process writes its readiness to ``--ready-file`` (the API also answers
``/healthz``). With a broker of the test's own killed for ``OUTAGE_S`` seconds, the
processor, a worker, the effect runner, the projector and the API each say not ready, keep
running, log a bounded number of lines, say ready again once the broker is back and do
their work again; SIGTERM stops the worker, the effect runner and the API within
``STOP_BOUND_S`` while the broker is away (the processor and the projector:
``test_service_outages.py``). With a PostgreSQL of
the test's own stopped, the API answers 503 naming the read model (``/healthz`` and the
reads), the projector says not ready, both resume once it is back; SIGTERM stops the API in
its bound meanwhile.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.embedded_postgres import EmbeddedPostgres
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log
from support.net import free_port
from support.polling import wait_until

from .outages import OUTAGE_S, STOP_BOUND_S, OwnBroker, Service, broker, own_postgres
from .pgdb import create_database, drop_database

__all__ = ["broker", "own_postgres"]  # fixtures used here, defined in outages.py

AUTH = {"Authorization": "Bearer dev"}  # the API's dev tenant (no tenants file)
MAX_OUTAGE_LINES = 200  # log lines a process may write during an outage


@pytest.fixture
def dsn(database_url: str) -> Iterator[str]:
    d = asyncio.run(create_database(database_url, "test_readiness"))
    yield d
    asyncio.run(drop_database(database_url, d))


def _stop_all(services: list[Service]) -> None:
    for s in services:
        s.stop()


async def _healthz(http: httpx.AsyncClient) -> httpx.Response | None:
    try:
        return await http.get("/healthz", timeout=10)
    except httpx.HTTPError:
        return None  # not listening yet


async def _status(http: httpx.AsyncClient, want: int) -> httpx.Response | None:
    r = await _healthz(http)
    return r if r is not None and r.status_code == want else None


async def _event_types(cfg: LogConfig, tenant: str, schedule_id: str) -> list[str]:
    """The types of the events of one schedule, in log order."""
    lg = open_log(cfg)
    await lg.start()
    try:
        out: list[str] = []
        for p in range(cfg.topics.partitions):
            for rec in await lg.read(cfg.topics.events, p, 0, 100_000, 0):
                env = codec.decode_event(rec.value)
                if env.tenant == tenant and env.schedule_id == schedule_id:
                    out.append(env.type)
        return out
    finally:
        await lg.close()


# ------------------------------------------------------------------ the broker away


class KafkaNode:
    """A processor, a worker, the effect runner, the projector and the API on a broker of
    the test's own."""

    def __init__(self, broker: OwnBroker, dsn: str, tmp_path: Path, prefix: str) -> None:
        self.cfg = LogConfig("kafka", broker.bootstrap, Topics(prefix=prefix, partitions=4))
        flags = ["--log", f"kafka://{broker.bootstrap}", "--topic-prefix", prefix,
                 "--partitions", "4"]
        self.port = free_port()
        self.services = [
            Service("processor", ["processor", *flags, "--member-id", "p1"], tmp_path),
            Service("worker", ["worker", *flags, "--builtin-jobs", "--drain-timeout", "2",
                               "--results", str(tmp_path / "results")], tmp_path),
            Service("effects", ["effects", *flags, "--member-id", "e1"], tmp_path),
            Service("projector", ["projector", *flags, "--database-url", dsn], tmp_path),
            Service("api", ["api", *flags, "--database-url", dsn, "--port", str(self.port)],
                    tmp_path),
        ]
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", headers=AUTH)

    def by_name(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    async def ready(self) -> None:
        await wait_until(lambda: all(s.ready() for s in self.services), 120,
                         what="every process ready")
        await wait_until(lambda: _status(self.http, 200), 30, what="/healthz 200")

    async def broker_away(self, broker: OwnBroker) -> dict[str, str]:
        """Kill the broker; every process says it is not ready (the reasons)."""
        await broker.kill()
        reasons: dict[str, str] = await wait_until(
            lambda: {s.name: r for s in self.services if (r := s.not_ready())}
            if all(s.not_ready() for s in self.services) else None,
            60, what="every process not ready")
        return reasons

    async def close(self) -> None:
        await self.http.aclose()
        _stop_all(self.services)


@pytest.fixture
async def kafka_node(broker: OwnBroker, dsn: str, tmp_path: Path,
                     topic_prefix: str) -> AsyncIterator[KafkaNode]:
    node = KafkaNode(broker, dsn, tmp_path, topic_prefix)
    try:
        await node.ready()
        yield node
    finally:
        await node.close()


@pytest.mark.long(50)
@pytest.mark.kafka
@pytest.mark.postgres
async def test_every_process_is_not_ready_while_the_broker_is_away_and_resumes_by_itself(
    broker: OwnBroker, kafka_node: KafkaNode
) -> None:
    node = kafka_node
    before = {s.name: s.lines() for s in node.services}
    reasons = await node.broker_away(broker)
    assert "processors group" in reasons["processor"] or "log unreachable" in reasons[
        "processor"], reasons
    assert all(reasons.values()), reasons
    down = await wait_until(lambda: _status(node.http, 503), 30, what="/healthz 503")
    assert down.json()["message"].startswith("log unreachable"), down.json()
    # the outage itself: a duration (nothing to wait for), while the processes keep running
    await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - broker.killed_at)))
    for s in node.services:
        assert s.alive(), f"{s.name} stopped during the outage:\n{s.tail()}"
    during = {s.name: s.lines() - before[s.name] for s in node.services}
    assert all(n < MAX_OUTAGE_LINES for n in during.values()), during
    # a client that failed to start is stopped, not left to the collector (which reports
    # each one: hundreds of lines from a projector whose every read opened a reader)
    leaked = {s.name: n for s in node.services if (n := s.tail(10**9).count("Unclosed AIOKafka"))}
    assert not leaked, leaked

    await asyncio.to_thread(broker.start)  # the same data: topics, offsets, the group
    await node.ready()
    for s in node.services:
        assert s.alive(), f"{s.name} stopped:\n{s.tail()}"
    # they work again: the API creates through the processor and reads it back once the
    # projector has it; a run is performed by the worker and its effect recorded by the
    # effect runner (refused: no tenants file)
    r = await node.http.post("/v1/schedules", timeout=30, json={
        "scheduleId": "after", "every": "1s", "job": {"type": "noop", "params": {}}})
    assert r.status_code == 201, r.text
    token = {"X-Chronolog-Consistency": r.headers["X-Chronolog-Consistency"]}

    async def read_back() -> httpx.Response | None:
        # a 503 on the token says "retry shortly" (the projector is still catching up after
        # the outage): a client retries it, as the API's contract asks
        got = await node.http.get("/v1/schedules/after", timeout=30, headers=token)
        waiting = got.status_code == 503 and got.json().get("field") == "X-Chronolog-Consistency"
        return None if waiting else got

    # the projector resumes after its own backoff (up to 30 s between tries while the log
    # was away) and then catches up: on a loaded machine that has taken over a minute
    read = await wait_until(read_back, 150, what="the read model reaches the create's token")
    assert read.status_code == 200, read.text
    lg = open_log(node.cfg)
    await lg.start()
    try:
        async with Client(lg, reply_timeout=30) as client:
            at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
            await client.create_schedule("default", "with-effect", {
                "at": at, "job": {"type": "noop", "params": {}},
                "effects": [{"kind": "webhook", "destination": "nowhere"}]})
    finally:
        await lg.close()

    async def performed() -> list[str] | None:
        types = await _event_types(node.cfg, "default", "with-effect")
        return types if "ResultPublished" in types and "EffectFailed" in types else None

    await wait_until(performed, 90, interval=0.5, what="the run and its effect after the outage")


@pytest.mark.kafka
@pytest.mark.postgres
async def test_sigterm_stops_the_worker_effect_runner_and_api_within_bound_while_broker_away(
    broker: OwnBroker, kafka_node: KafkaNode
) -> None:
    node = kafka_node
    await node.broker_away(broker)
    await wait_until(lambda: _status(node.http, 503), 30, what="/healthz 503")
    stopping = [node.by_name(n) for n in ("worker", "effects", "api")]
    for s in stopping:
        s.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    statuses = await asyncio.gather(*(asyncio.to_thread(s.proc.wait, STOP_BOUND_S + 1)
                                      for s in stopping))
    took = time.monotonic() - started
    assert took <= STOP_BOUND_S, f"stopped after {took:.1f}s"
    for s, status in zip(stopping, statuses, strict=True):
        assert status in (0, 1), f"{s.name} exited {status}:\n{s.tail()}"


# ------------------------------------------------------------------ the database away


class SqliteNode:
    """A processor, the projector and the API on an embedded log, a PostgreSQL of the
    test's own as the read model."""

    def __init__(self, tmp_path: Path, dsn: str) -> None:
        self.cfg = LogConfig("sqlite", str(tmp_path / "log.db"), Topics(partitions=4))
        flags = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", "4"]
        self.port = free_port()
        self.services = {
            "processor": Service("processor", ["processor", *flags], tmp_path),
            "projector": Service("projector", ["projector", *flags, "--database-url", dsn],
                                 tmp_path),
            "api": Service("api", ["api", *flags, "--database-url", dsn,
                                   "--port", str(self.port)], tmp_path),
        }
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", headers=AUTH)
        self.before: dict[str, int] = {}  # log lines of each when the database went away

    async def ready(self) -> None:
        await wait_until(lambda: all(s.ready() for s in self.services.values()), 120,
                         what="every process ready")
        await wait_until(lambda: _status(self.http, 200), 30, what="/healthz 200")

    async def close(self) -> None:
        await self.http.aclose()
        _stop_all(list(self.services.values()))


@pytest.fixture
async def node_without_database(own_postgres: EmbeddedPostgres,
                                tmp_path: Path) -> AsyncIterator[SqliteNode]:
    """A node whose read model went away under it, once it had a schedule."""
    node = SqliteNode(tmp_path, await asyncio.to_thread(own_postgres.start))
    try:
        await node.ready()
        r = await node.http.post("/v1/schedules", timeout=30, json={
            "scheduleId": "before", "every": "1s", "job": {"type": "noop", "params": {}}})
        assert r.status_code == 201, r.text
        node.before = {n: s.lines() for n, s in node.services.items()}
        await asyncio.to_thread(own_postgres.stop)
        yield node
    finally:
        await node.close()


async def _read_model_away(node: SqliteNode) -> dict[str, Any]:
    """/healthz and a read answer 503 naming the read model; the projector is not ready."""
    down = await wait_until(lambda: _status(node.http, 503), 30, what="/healthz 503")
    await wait_until(lambda: node.services["projector"].not_ready(), 60,
                     what="the projector not ready")
    read = await node.http.get("/v1/schedules/before", timeout=30)
    return {"healthz": down.json(), "read": (read.status_code, read.json())}


@pytest.mark.long(35)
@pytest.mark.postgres
async def test_the_api_and_projector_say_the_read_model_is_away_and_resume_by_themselves(
    own_postgres: EmbeddedPostgres, node_without_database: SqliteNode
) -> None:
    node = node_without_database
    seen = await _read_model_away(node)
    assert seen["healthz"]["message"].startswith("read model unreachable"), seen
    assert seen["read"][0] == 503, seen  # a service away, not a bug (500)
    assert seen["read"][1]["message"].startswith("read model unreachable"), seen
    assert node.services["processor"].ready()  # it does not use the read model
    await asyncio.sleep(OUTAGE_S)  # the outage itself: a duration, nothing to wait for
    for name, s in node.services.items():
        assert s.alive(), f"{name} stopped during the outage:\n{s.tail()}"
        assert s.lines() - node.before[name] < MAX_OUTAGE_LINES, (name, s.tail())
    await asyncio.to_thread(own_postgres.start)  # the same data, the same port
    await node.ready()
    r = await node.http.post("/v1/schedules", timeout=30, json={
        "scheduleId": "after", "every": "1s", "job": {"type": "noop", "params": {}}})
    assert r.status_code == 201, r.text
    token = r.headers["X-Chronolog-Consistency"]
    shown = await wait_until(lambda: _read_after(node, token), 60, what="'after' readable")
    assert shown["scheduleId"] == "after"


def _unreachable(service: Any) -> str | None:
    """The service's reason for not being ready, once it names the read model (None before)."""
    why = service.not_ready()
    return why if why is not None and why.startswith("read model unreachable") else None


async def _read_after(node: SqliteNode, token: str) -> dict[str, Any] | None:
    r = await node.http.get("/v1/schedules/after", timeout=30,
                            headers={"X-Chronolog-Consistency": token})
    return r.json() if r.status_code == 200 else None


@pytest.mark.postgres
async def test_sigterm_stops_the_api_within_its_bound_while_the_read_model_is_away(
    node_without_database: SqliteNode
) -> None:
    node = node_without_database
    await _read_model_away(node)
    api = node.services["api"]
    api.proc.send_signal(signal.SIGTERM)
    status = await asyncio.to_thread(api.proc.wait, STOP_BOUND_S)
    assert status in (0, 1), api.tail()


@pytest.mark.long(45)
@pytest.mark.postgres
async def test_the_api_and_projector_started_while_the_read_model_is_away_wait_for_it(
    own_postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = await asyncio.to_thread(own_postgres.start)
    await asyncio.to_thread(own_postgres.stop)
    node = SqliteNode(tmp_path, dsn)  # its processes start now, the database away
    try:
        for name in ("projector", "api"):
            # its first report may be "starting": it says why once it has tried the database
            why = await wait_until(lambda name=name: _unreachable(node.services[name]), 60,
                                   what=f"the {name} not ready, the read model unreachable")
            assert why.startswith("read model unreachable"), why
        await asyncio.sleep(OUTAGE_S)  # the outage itself: a duration, nothing to wait for
        for name, s in node.services.items():
            assert s.alive(), f"{name} exited while the database was away:\n{s.tail()}"
            assert s.lines() < MAX_OUTAGE_LINES, (name, s.tail())
        await asyncio.to_thread(own_postgres.start)  # the same data, the same port
        await node.ready()
        r = await node.http.post("/v1/schedules", timeout=30, json={
            "scheduleId": "late", "every": "1s", "job": {"type": "noop", "params": {}}})
        assert r.status_code == 201, r.text
    finally:
        await node.close()
