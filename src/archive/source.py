"""History as archive plus live log: what a whole-history reader (``chronolog audit --full
--archive DIR``) reads.

``ArchivedHistory(directory, log)`` answers ``read`` and ``end_offset`` as the log does, for
the readers of ``chronolog.log.reading`` and the move-barrier order of
``chronolog.projections.ordered``: a read of ``events`` below a partition's archived end is
served from the archive's segments (each checksum verified before its records are used:
``SegmentError`` otherwise), every other read from the log. So the events a pruned log no
longer holds come from the archive, and the ones it still holds — below the archived end as
well — are read once, from the archive.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from chronolog.archive.format import Entry
from chronolog.archive.store import check_archive, read_entries, read_segment
from chronolog.log.port import EventLog, Record, Topics


class ArchivedHistory:
    """Reads of ``events`` through the archive below its archived end, the log above it."""

    def __init__(self, directory: Path | str, log: EventLog) -> None:
        self.directory = Path(directory)
        self.log = log
        self.topics: Topics = log.topics
        check_archive(self.directory)
        self._entries: dict[int, list[Entry]] = {}
        # the segment read last: a reader takes it in several batches, read and checked once
        self._segment: tuple[Entry, list[Record]] | None = None

    def entries(self, partition: int) -> list[Entry]:
        """The manifest entries of ``partition`` (read once)."""
        if partition not in self._entries:
            self._entries[partition] = read_entries(self.directory, partition)
        return self._entries[partition]

    def archived_end(self, partition: int) -> int:
        """The next position after the archive of ``partition`` (0: nothing archived)."""
        entries = self.entries(partition)
        return entries[-1].end if entries else 0

    async def read(self, topic: str, partition: int, offset: int, max_records: int = 1000,
                   timeout_ms: int = 0) -> list[Record]:
        end = self.archived_end(partition)
        if topic != self.topics.events or offset >= end:
            return await self.log.read(topic, partition, offset, max_records, timeout_ms)
        archived = await asyncio.to_thread(self._archived, partition, offset, max_records)
        if archived:
            return archived
        # only transaction markers are archived from here on (Kafka): the log goes on
        return await self.log.read(topic, partition, end, max_records, timeout_ms)

    def _archived(self, partition: int, offset: int, max_records: int) -> list[Record]:
        """Archived records at or after ``offset``, from the segment holding it on (a
        segment whose records all lie below it — transaction markers at its end — gives
        way to the next)."""
        out: list[Record] = []
        for entry in self.entries(partition):
            if entry.end <= offset:
                continue
            out += [r for r in self._records(entry) if r.offset >= offset]
            if out:
                return out[:max_records]
        return out

    def _records(self, entry: Entry) -> list[Record]:
        if self._segment is None or self._segment[0] != entry:
            self._segment = (entry, read_segment(self.directory, entry))
        return self._segment[1]

    async def end_offset(self, topic: str, partition: int) -> int:
        return await self.log.end_offset(topic, partition)
