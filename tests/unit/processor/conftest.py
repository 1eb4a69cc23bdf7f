"""The processor's unit tests: each runs on a fresh in-memory log (``MemoryEventLog``, 4
partitions, its topics created), so the processor, its clients and workers run in the test's
process without a database file or a broker. What only a real log can show stays with the
integration tests on SQLite and Kafka."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from chronolog.log.memory import MemoryEventLog
from chronolog.log.port import Topics
from support.logs import started


@pytest.fixture
async def event_log() -> AsyncIterator[MemoryEventLog]:
    async with started(MemoryEventLog(Topics(partitions=4))) as lg:
        yield lg
