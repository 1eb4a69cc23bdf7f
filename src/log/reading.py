"""Reading a partition to a fixed end through the EventLog port (restore, audit, gc, tools).

``read_partition`` yields batches of committed records of one partition from an offset up to
the end offset taken when it starts, so a live log is read to a fixed point and the
iteration ends; on Kafka, commit markers and aborted data below that end are skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from chronolog.log.port import Record

READ_BATCH = 2000


class Readable(Protocol):
    """What is read: the log (``EventLog``), or history as archive plus log
    (``chronolog.archive.source.ArchivedHistory``)."""

    async def read(self, topic: str, partition: int, offset: int, max_records: int = 1000,
                   timeout_ms: int = 0) -> list[Record]: ...

    async def end_offset(self, topic: str, partition: int) -> int: ...


async def read_partition(
    log: Readable, topic: str, partition: int, start: int = 0, stop: int | None = None,
    batch: int = READ_BATCH,
) -> AsyncIterator[list[Record]]:
    """Batches of committed records of one partition, offsets in ``[start, stop)``.

    ``stop`` defaults to the end offset when reading starts, so a live log is read to a
    fixed point and the iteration ends.
    """
    end = await log.end_offset(topic, partition) if stop is None else stop
    offset = start
    while offset < end:
        records = await log.read(topic, partition, offset, max_records=batch, timeout_ms=0)
        records = [r for r in records if r.offset < end]
        if not records:
            return  # only aborted data / control markers remain below the end (Kafka)
        yield records
        offset = records[-1].offset + 1
