"""The doorbell between processes of one embedded log file: rings carry the topics written."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

from chronolog.log.doorbell import ALL, Doorbell, topic_bit
from chronolog.log.port import WAKE_HEADER, OutRecord, Topics
from chronolog.log.sqlite import SqliteEventLog, group_path
from support.polling import wait_until


def _two_topics_on_different_bits(prefix: str) -> tuple[str, str]:
    first = f"{prefix}a"
    other = next(t for t in (f"{prefix}b{i}" for i in range(100))
                 if topic_bit(t) != topic_bit(first))
    return first, other


async def test_a_ring_wakes_a_reader_of_the_topic_written(tmp_path: Path) -> None:
    reader, ringer = Doorbell(tmp_path / "log.db"), Doorbell(tmp_path / "log.db")
    reader.open()
    ringer.open()
    try:
        interest = topic_bit("t.ready.default")
        seen = reader.mark(interest)
        ringer.ring(interest)
        await reader.wait(seen, 30, interest)
        assert reader.mark(interest) != seen
    finally:
        reader.close()
        ringer.close()


async def test_a_ring_of_another_topic_does_not_wake_a_reader(tmp_path: Path) -> None:
    mine, other = _two_topics_on_different_bits("t.")
    reader, ringer = Doorbell(tmp_path / "log.db"), Doorbell(tmp_path / "log.db")
    reader.open()
    ringer.open()
    try:
        seen_mine, seen_any = reader.mark(topic_bit(mine)), reader.mark(ALL)
        ringer.ring(topic_bit(other))
        await reader.wait(seen_any, 30, ALL)  # the ring arrived ...
        assert reader.mark(ALL) != seen_any
        assert reader.mark(topic_bit(mine)) == seen_mine  # ... and does not count for mine
    finally:
        reader.close()
        ringer.close()


@contextlib.asynccontextmanager
async def _bell_and_writer(tmp_path: Path, topics: Topics) -> AsyncIterator[tuple[Doorbell,
                                                                                 SqliteEventLog]]:
    """A reader's bell (registered before the writer lists the bells) and a started writer
    whose topic creation (a ring that wakes everybody) the bell has heard already."""
    path = tmp_path / "log.db"
    bell = Doorbell(path)
    bell.open()
    writer = SqliteEventLog(path, topics)
    try:
        await writer.start()
        created = bell.mark(ALL)
        await writer.ensure_topics()
        await bell.wait(created, 30, ALL)
        yield bell, writer
    finally:
        await writer.close()
        bell.close()


async def _rung(bell: Doorbell, writer: SqliteEventLog, record: OutRecord,
                names: tuple[str, str]) -> tuple[bool, bool]:
    """Append ``record``: whether the bell counted a ring for each of ``names``."""
    before = [bell.mark(topic_bit(n)) for n in names]
    seen_any = bell.mark(ALL)
    await writer.append([record])
    await bell.wait(seen_any, 30, ALL)
    return bell.mark(topic_bit(names[0])) != before[0], bell.mark(topic_bit(names[1])) != before[1]


async def test_an_append_rings_the_bits_of_the_topics_it_wrote(tmp_path: Path) -> None:
    topics = Topics(prefix="t.", partitions=2)
    written = topics.events
    quiet = next(t for t in (topics.commands, topics.replies, topics.dlq, topics.effects)
                 if topic_bit(t) != topic_bit(written))
    async with _bell_and_writer(tmp_path, topics) as (bell, writer):
        rung = await _rung(bell, writer, OutRecord(topic=written, key=b"k", value=b"v"),
                           (written, quiet))
    assert rung == (True, False)


async def test_a_record_with_a_wake_header_rings_its_name_instead_of_its_topic(
    tmp_path: Path
) -> None:
    topics = Topics(prefix="t.", partitions=2)
    client = next(c for c in (f"client-{i}" for i in range(100))
                  if topic_bit(c) != topic_bit(topics.replies))
    async with _bell_and_writer(tmp_path, topics) as (bell, writer):
        rung = await _rung(bell, writer, OutRecord(topic=topics.replies, key=b"c1", value=b"{}",
                                                   headers=((WAKE_HEADER, client.encode()),)),
                           (client, topics.replies))
    assert rung == (True, False)


def _heartbeat_until(path: Path, member_id: str) -> float:
    with contextlib.closing(sqlite3.connect(group_path(path))) as conn:
        row = conn.execute("SELECT heartbeat_until FROM members WHERE member_id = ?",
                           (member_id,)).fetchone()
    return float(row[0]) if row else 0.0


async def test_a_group_membership_renewed_rings_nobody_and_a_member_joining_rings_everybody(
    tmp_path: Path
) -> None:
    topics = Topics(prefix="t.", partitions=2)
    path = tmp_path / "log.db"
    async with _bell_and_writer(tmp_path, topics) as (bell, _writer):
        log = SqliteEventLog(path, topics, heartbeat_interval_s=0.05)
        await log.start()
        first = log.group_consumer("g", [topics.commands], "m1")
        second = log.group_consumer("g", [topics.commands], "m2")
        try:
            before = bell.mark(ALL)
            await first.start()
            await bell.wait(before, 30, ALL)
            assert bell.mark(ALL) != before  # joining rings
            # renewals: heartbeat_until moves on, several times, without a ring
            quiet = bell.mark(ALL)
            renewed = _heartbeat_until(path, "m1")
            for _ in range(3):
                renewed = await wait_until(
                    lambda r=renewed: (u := _heartbeat_until(path, "m1")) > r and u, 30,
                    what="a renewal")
            assert bell.mark(ALL) == quiet
            await second.start()
            await bell.wait(quiet, 30, ALL)
            assert bell.mark(ALL) != quiet  # the second member joining rings
        finally:
            await second.close()
            await first.close()
            await log.close()
