"""The archive of real events (docs/design.md §19): a real processor writes ``events`` on a
SQLite log and on Kafka, every partition is archived in several segments through the
EventLog port, and the archive reads back what the log holds and verifies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chronolog.archive import ArchiveWriter, archived_end, read_archive, verify
from chronolog.archive.store import read_entries
from chronolog.log.reading import read_partition
from support.processors import SPEC, Running

from .conftest import wait_until


def _fields(records: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.partition, r.offset, r.key, r.value, r.headers) for r in records]


async def test_real_events_archived_in_segments_read_back_equal_and_verify(
    event_log: Any, tmp_path: Path
) -> None:
    async with Running(event_log, "p1") as r:
        for i in range(8):
            await r.client.create_schedule("acme", f"s{i}", SPEC)
        await r.client.trigger("acme", "s2", "manual-1", {"y": 2})
        await wait_until(lambda: r.proc.stats.ticks > 8, 30, what="some ticks")
    topic = event_log.topics.events
    directory = tmp_path / "archive"
    writer = ArchiveWriter(directory, topic)
    live: dict[int, list[Any]] = {}
    for p in range(event_log.topics.partitions):
        end = await event_log.end_offset(topic, p)
        batches = [b async for b in read_partition(event_log, topic, p, stop=end, batch=3)]
        live[p] = [rec for b in batches for rec in b]
        for i, batch in enumerate(batches):
            # each segment starts where the archive ends (so a transaction marker before its
            # first record is inside it); the last one covers up to the log's end
            writer.append(p, batch, end=end if i == len(batches) - 1 else None)
        assert archived_end(directory, p) == (end if batches else None)
        assert _fields(list(read_archive(directory, p))) == _fields(live[p])
    assert sum(len(v) for v in live.values()) > 10
    entries = [e for p in live for e in read_entries(directory, p)]
    assert len(entries) > len(live)  # several segments a partition
    report = verify(directory)
    assert report.ok, report.problems
    assert report.records == sum(len(v) for v in live.values())
    # Kafka's offsets are sparse (a commit marker after each transaction): segments then
    # cover positions no record has — at least the marker after a partition's last record;
    # SQLite's are dense
    dense = all(e.start == e.first_offset and e.end == e.last_offset + 1 for e in entries)
    assert dense == (event_log.__class__.__name__ == "SqliteEventLog")
