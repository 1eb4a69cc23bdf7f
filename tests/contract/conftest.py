"""Fixtures for the EventLog contract suite: every test runs against SQLite, Kafka and the
in-memory log.

``event_log`` is a started log with its topics created (4 partitions, a fresh prefix per
test). ``open_log()`` opens *another* instance on the same backend — the same database file,
the same broker and prefix, or the same in-memory store — standing for a second process.
The Kafka params need a real broker (``KAFKA_BOOTSTRAP_SERVERS``); without one they fail,
they never skip.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from chronolog.log.memory import MemoryEventLog, MemoryStore
from chronolog.log.port import EventLog, Topics

PARTITIONS = 4

OpenLog = Callable[[], Awaitable[EventLog]]


@pytest.fixture(params=["sqlite", "kafka", "memory"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_log(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, topic_prefix: str
) -> AsyncIterator[OpenLog]:
    topics = Topics(prefix=topic_prefix, partitions=PARTITIONS)
    opened: list[EventLog] = []
    store = MemoryStore()  # what the memory logs of one test share, as processes share a file

    async def _open() -> EventLog:
        log: EventLog
        if backend == "memory":
            log = MemoryEventLog(topics, store)
        elif backend == "sqlite":
            from chronolog.log.sqlite import SqliteEventLog

            log = SqliteEventLog(tmp_path / "log.db", topics)
        else:
            from chronolog.log.kafka import KafkaEventLog

            bootstrap = request.getfixturevalue("kafka_bootstrap")
            log = KafkaEventLog(bootstrap, topics)
        await log.start()
        opened.append(log)
        return log

    yield _open
    for log in reversed(opened):
        await log.close()
    # Run finalizers now, at a harmless point: a fenced aiokafka producer leaves a Future
    # whose "exception was never retrieved" report formats a traceback (ast.parse). If the
    # GC ran it *inside* another ast.parse (pytest's assertion rewriting of a module
    # imported later), CPython 3.11.7 raises "AST constructor recursion depth mismatch".
    gc.collect()


@pytest.fixture
async def event_log(open_log: OpenLog) -> EventLog:
    log = await open_log()
    await log.ensure_topics()
    return log
