"""Services that die under running processes: bounded logs, a bounded stop, and resumption.

A broker under a processor: each Kafka test starts its own single-node Kafka
(``scripts/kafka.sh`` with its own state directory and ports; ``outages.py``) so that it can
kill it by PID and start it again on the same data. A database under a projector: its own
embedded PostgreSQL, stopped and started again on the same data and port. The suite's
shared services are never touched. The other processes (worker, effect runner, API) and
their readiness through outages: ``test_readiness_outages.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from chronolog.client import Client
from chronolog.embedded_postgres import EmbeddedPostgres
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT
from .outages import STOP_BOUND_S, OwnBroker, broker, own_postgres

__all__ = ["broker", "own_postgres"]  # fixtures used here, defined in outages.py

SPEC = {"every": "1s", "job": {"type": "echo", "params": {}}}


def _processor(broker: OwnBroker, prefix: str, log_path: Path) -> subprocess.Popen[bytes]:
    # library errors summarized every 3 s instead of 30 s: the summary shows within the test
    env = dict(os.environ, CHRONOLOG_LOG_LEVEL="INFO", CHRONOLOG_LOG_SUMMARY_S="3")
    return subprocess.Popen(
        [CHRONOLOG, "processor", "--log", f"kafka://{broker.bootstrap}", "--topic-prefix", prefix,
         "--partitions", "4", "--member-id", "outage-p"],
        stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"), env=env, cwd=ROOT)


def _load(broker: OwnBroker, prefix: str) -> subprocess.Popen[bytes]:
    """Creates one schedule after the other until killed (commands in flight at the fault)."""
    code = f"""
import asyncio
from chronolog.client import Client
from chronolog.log.port import Topics
from chronolog.embedded_postgres import EmbeddedPostgres
from chronolog.settings import LogConfig, open_log
async def main():
    lg = open_log(LogConfig("kafka", "{broker.bootstrap}", Topics(prefix="{prefix}", partitions=4)))
    await lg.start()
    client = Client(lg, reply_timeout=5)
    await client.start()
    i = 0
    while True:
        try:
            await client.create_schedule("t", f"load-{{i}}", {SPEC!r})
            print("created", flush=True)
        except Exception:
            await asyncio.sleep(0.2)
        i += 1
asyncio.run(main())
"""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=ROOT)


async def _client(broker: OwnBroker, prefix: str) -> tuple[Any, Client]:
    lg = open_log(LogConfig("kafka", broker.bootstrap, Topics(prefix=prefix, partitions=4)))
    await lg.start()
    await lg.ensure_topics()
    client = Client(lg, reply_timeout=5)
    await client.start()
    return lg, client


async def _created(client: Client, schedule_id: str) -> bool:
    try:
        await client.create_schedule("t", schedule_id, SPEC)
        return True
    except Exception:  # noqa: BLE001 - not yet: the processor is still taking over
        return False


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.kill()
        p.wait(10)


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


async def _outage_logged(log_path: Path) -> bool:
    text = log_path.read_text(errors="replace")
    return "Connect call failed" in text or "NodeNotReadyError" in text


@pytest.mark.kafka
async def test_sigterm_stops_a_processor_within_its_bound_while_the_broker_is_dead(
    broker: OwnBroker, tmp_path: Path
) -> None:
    prefix = "outage1."
    lg, client = await _client(broker, prefix)
    await client.close()
    await lg.close()
    log_path = tmp_path / "processor.log"
    proc = _processor(broker, prefix, log_path)
    load = _load(broker, prefix)
    try:
        assert load.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(load.stdout.readline), 60)
        assert line.startswith(b"created")  # the processor answers: commands are flowing
        await broker.kill()  # under load: a transaction of the processor is likely in flight
        await wait_until(lambda: _outage_logged(log_path), 60, what="the outage in the log")
        proc.send_signal(signal.SIGTERM)
        status = await asyncio.to_thread(proc.wait, STOP_BOUND_S)
        assert status in (0, 1), log_path.read_text(errors="replace")[-3000:]
    finally:
        _stop(load)
        _stop(proc)


@pytest.mark.kafka
# alone on the machine: its own broker starts, dies and comes back under deadlines that a
# machine loaded by the parallel phase (a three-broker chaos run beside it) could outlast
@pytest.mark.serial
async def test_a_processor_rides_out_a_broker_outage_with_few_log_lines_and_resumes(
    broker: OwnBroker, tmp_path: Path
) -> None:
    prefix = "outage2."
    log_path = tmp_path / "processor.log"
    lg, client = await _client(broker, prefix)
    proc = _processor(broker, prefix, log_path)
    try:
        await wait_until(lambda: _created(client, "before"), 60, what="a create answered")
        await client.close()
        await lg.close()
        before = _lines(log_path)
        await broker.kill()
        await wait_until(lambda: _outage_logged(log_path), 60, what="the outage in the log")
        # the outage lasts while the library retries: its repeated errors are summarized
        await wait_until(lambda: "more like this" in log_path.read_text(errors="replace")
                         or None, 90, interval=0.5, what="a summary line of held-back errors")
        during = _lines(log_path) - before
        assert proc.poll() is None, "the processor stopped while the broker was down"
        assert during < 200, f"{during} log lines during the outage"
        broker.start()  # the same data: the processor's topics and offsets are back
        lg, client = await _client(broker, prefix)
        await wait_until(lambda: _created(client, "after"), 120, interval=0.5,
                         what="a create answered after the broker returned")
        assert proc.poll() is None
    finally:
        await client.close()
        await lg.close()
        _stop(proc)


# -- a database outage under a projector


async def _projected(dsn: str, schedule_id: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError):
        return False
    try:
        return bool(await conn.fetchval(
            "SELECT count(*) FROM schedules WHERE schedule_id = $1", schedule_id))
    except asyncpg.PostgresError:
        return False  # not migrated yet
    finally:
        await conn.close()


async def _migrated(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        return bool(await conn.fetchval("SELECT to_regclass('schedules') IS NOT NULL"))
    finally:
        await conn.close()


class ProjectorNode:
    """A processor and a projector (subprocesses) on an embedded log, and a client."""

    def __init__(self, tmp_path: Path, dsn: str) -> None:
        self.tmp_path, self.dsn = tmp_path, dsn
        self.logs = {name: tmp_path / f"{name}.log" for name in ("processor", "projector")}
        common = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", "4"]
        env = dict(os.environ, CHRONOLOG_LOG_LEVEL="INFO")
        self.procs = {
            name: subprocess.Popen([CHRONOLOG, name, *common, *extra], stdout=subprocess.DEVNULL,
                                   stderr=open(self.logs[name], "wb"), env=env, cwd=ROOT)
            for name, extra in (("processor", []), ("projector", ["--database-url", dsn]))}
        self.lg = open_log(LogConfig("sqlite", str(tmp_path / "log.db"), Topics(partitions=4)))
        self.client = Client(self.lg, reply_timeout=30)

    async def start(self) -> None:
        await self.lg.start()
        await self.lg.ensure_topics()
        await self.client.start()
        await wait_until(lambda: _created(self.client, "before"), 60, what="a create answered")
        await wait_until(lambda: _projected(self.dsn, "before"), 60, what="'before' projected")

    async def waiting_for_database(self, pg: EmbeddedPostgres) -> None:
        """Once started, the database stops and a create comes: the projector tries, and
        waits."""
        await self.start()
        await asyncio.to_thread(pg.stop)
        await self.client.create_schedule("t", "during", SPEC)
        await wait_until(lambda: "projector_waiting_for_service" in
                         self.logs["projector"].read_text(errors="replace"), 60,
                         what="the projector waiting for its database")

    async def close(self) -> None:
        await self.client.close()
        await self.lg.close()
        for p in self.procs.values():
            _stop(p)


@pytest.fixture
async def node_without_database(own_postgres: EmbeddedPostgres,
                                tmp_path: Path) -> AsyncIterator[ProjectorNode]:
    """A node whose projector's database went away under it, the projector waiting."""
    node = ProjectorNode(tmp_path, await asyncio.to_thread(own_postgres.start))
    try:
        await node.waiting_for_database(own_postgres)
        yield node
    finally:
        await node.close()


@pytest.mark.postgres
async def test_a_projector_rides_out_a_database_outage_and_catches_up(
    own_postgres: EmbeddedPostgres, node_without_database: ProjectorNode
) -> None:
    node = node_without_database
    projector = node.procs["projector"]
    assert projector.poll() is None, node.logs["projector"].read_text()[-3000:]
    await asyncio.to_thread(own_postgres.start)  # the same data, the same port
    await wait_until(lambda: _projected(node.dsn, "during"), 120, interval=0.5,
                     what="'during' projected once the database is back")
    assert projector.poll() is None
    assert _lines(node.logs["projector"]) < 200


@pytest.mark.postgres
async def test_sigterm_stops_a_projector_within_its_bound_while_the_database_is_down(
    node_without_database: ProjectorNode
) -> None:
    node = node_without_database
    projector = node.procs["projector"]
    projector.send_signal(signal.SIGTERM)
    status = await asyncio.to_thread(projector.wait, STOP_BOUND_S)
    assert status in (0, 1), node.logs["projector"].read_text(errors="replace")[-3000:]
