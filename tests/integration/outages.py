"""Services a test owns so that it can take them away: a Kafka broker (``scripts/kafka.sh``
with its own state directory and ports, killed and started again by PID), an embedded
PostgreSQL (stopped and started again on its data and port), and chronolog processes with
their readiness files. The suite's shared services are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chronolog.embedded_postgres import EmbeddedPostgres
from support.net import free_port
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT

SCRIPT = ROOT / "scripts" / "kafka.sh"
STOP_BOUND_S = 10  # a chronolog process stops this soon after SIGTERM, whatever its services do
OUTAGE_S = 30  # how long a service stays away in the outage tests


# A broker killed under its clients listens on another loopback address than they connect
# from: on 127.0.0.1 a client retrying its connection (thousands a minute) can get the
# broker's port as its own source port and connect to itself, holding the port so that the
# broker cannot start again. Connections to 127.0.0.2 come from 127.0.0.1.
BROKER_HOST = "127.0.0.2"


class OwnBroker:
    """A broker of this test alone, started, killed and restarted by PID through kafka.sh."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.env = dict(os.environ, KAFKA_STATE_DIR=str(state), KAFKA_HOST=BROKER_HOST,
                        KAFKA_PORT=str(free_port(BROKER_HOST)),
                        KAFKA_CONTROLLER_PORT=str(free_port(BROKER_HOST)))
        self.bootstrap = f"{BROKER_HOST}:{self.env['KAFKA_PORT']}"
        self.killed_at = 0.0

    def _run(self, command: str) -> None:
        subprocess.run(["bash", str(SCRIPT), command], env=self.env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)

    def up(self) -> None:
        self._run("up")

    def start(self) -> None:
        """Again, on the data it had: the same topics and records."""
        self._run("start")

    async def kill(self) -> None:
        """kill -9, and wait until the process is gone (its ports free again)."""
        pid = int((self.state / "broker.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        self.killed_at = time.monotonic()
        await wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30, what="the broker gone")
        (self.state / "broker.pid").unlink()

    def down(self) -> None:
        self._run("down")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[OwnBroker]:
    b = OwnBroker(tmp_path / "kafka")
    b.up()
    try:
        yield b
    finally:
        b.down()


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    # outside pytest's basetemp: a root-run cluster's ancestors must stay traversable
    path = Path(tempfile.mkdtemp(prefix="chronolog-outage-pg-"))
    server = EmbeddedPostgres(path / "pg", port=free_port(), fast=True)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(path, ignore_errors=True)


class Service:
    """A ``chronolog <role>`` subprocess with its stderr and its readiness file."""

    def __init__(self, name: str, args: list[str], tmp_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = tmp_path / f"{name}.log"
        self.ready_path = tmp_path / f"{name}.ready"
        # library errors summarized every 3 s instead of 30 s: the summary shows in a test
        environ = dict(os.environ, CHRONOLOG_LOG_LEVEL="INFO", CHRONOLOG_LOG_SUMMARY_S="3",
                       **(env or {}))
        self.proc = subprocess.Popen(
            [CHRONOLOG, *args, "--ready-file", str(self.ready_path)],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"), env=environ, cwd=ROOT)

    def readiness(self) -> dict[str, Any]:
        """The readiness file as written last (``{}`` before the first write)."""
        try:
            doc: dict[str, Any] = json.loads(self.ready_path.read_text())
        except (OSError, ValueError):
            return {}
        return doc

    def ready(self) -> bool:
        return self.readiness().get("ready") is True

    def not_ready(self) -> str | None:
        """The reason when the file says not ready (after having been written)."""
        doc = self.readiness()
        return str(doc["reason"]) if doc and doc.get("ready") is False else None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def lines(self) -> int:
        return len(self.log_path.read_bytes().splitlines())

    def tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def outage_logged(text: str) -> bool:
    """The log of a process shows a broker outage (the library's connection errors)."""
    return "Connect call failed" in text or "NodeNotReadyError" in text
