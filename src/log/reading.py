"""Reading a partition to a fixed end through the EventLog port (restore, audit, gc, tools).

``read_partition`` yields batches of committed records of one partition from an offset up to
the end offset taken when it starts, so a live log is read to a fixed point and the
iteration ends; on Kafka, commit markers and aborted data below that end are skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from chronolog.log.port import EventLog, Record

READ_BATCH = 2000


async def read_partition(
    log: EventLog, topic: str, partition: int, start: int = 0, stop: int | None = None,
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
