"""Fixtures for integration tests: a real log of each kind, processes, and bounded waits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log
from support.logs import started as started  # re-exported for the tests here
from support.polling import wait_until as wait_until  # re-exported for the tests here

ROOT = Path(__file__).resolve().parents[2]
CHRONOLOG = str(Path(sys.executable).parent / "chronolog")


@pytest.fixture(params=["sqlite", "kafka"])
def log_config(request: pytest.FixtureRequest, tmp_path: Path, topic_prefix: str) -> LogConfig:
    """A fresh log of each kind (4 partitions) under a unique topic prefix."""
    topics = Topics(prefix=topic_prefix, partitions=4)
    if request.param == "sqlite":
        return LogConfig("sqlite", str(tmp_path / "log.db"), topics)
    servers = request.getfixturevalue("kafka_bootstrap")
    return LogConfig("kafka", servers, topics)


def log_url(cfg: LogConfig) -> str:
    return f"sqlite://{cfg.target}" if cfg.kind == "sqlite" else f"kafka://{cfg.target}"


@pytest.fixture
async def event_log(log_config: LogConfig) -> AsyncIterator[Any]:
    async with started(open_log(log_config)) as lg:
        yield lg


class ProcessorProcess:
    """A ``chronolog processor`` subprocess (stopped by PID at teardown)."""

    def __init__(self, cfg: LogConfig, member: str, log_dir: Path,
                 env_extra: dict[str, str] | None = None) -> None:
        self.member = member
        self.log_path = log_dir / f"{member}.log"
        env = dict(os.environ, CHRONOLOG_LOG_LEVEL="INFO", **(env_extra or {}))
        self.proc = subprocess.Popen(
            [CHRONOLOG, "processor", "--log", log_url(cfg), "--topic-prefix", cfg.topics.prefix,
             "--partitions", str(cfg.topics.partitions), "--member-id", member, "--batch", "50"],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"), env=env, cwd=ROOT,
        )

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 20) -> int | None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def processes(tmp_path: Path) -> Any:
    started: list[ProcessorProcess] = []

    def start(cfg: LogConfig, member: str,
              env_extra: dict[str, str] | None = None) -> ProcessorProcess:
        p = ProcessorProcess(cfg, member, tmp_path, env_extra)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture
async def stores() -> AsyncIterator[list[Any]]:
    """The projection stores a test opened (``pgdb.open_store``), closed after it."""
    opened: list[Any] = []
    yield opened
    for store in opened:
        await store.close()


@pytest.fixture
async def sqlite_log(tmp_path: Path) -> AsyncIterator[Any]:
    """An embedded SQLite log of two partitions (a module may define its own)."""
    cfg = LogConfig("sqlite", str(tmp_path / "log.db"), Topics(partitions=2))
    async with started(open_log(cfg)) as lg:
        yield lg
