"""Pruning the log on both logs (docs/design.md §20): events go only once a snapshot, the
audit's checkpoint, the projectors and (when kept) the archive are past them; after it a
takeover from the snapshot holds exactly the fold of the whole history, the audit from its
checkpoint is clean, and ``audit --full`` proves the history from archive + log — or, with
no archive, reports the gap. A pruner killed with kill -9 while it archives and deletes
leaves no gap and nothing archived twice."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chronolog.archive import read_archive, verify
from chronolog.cli.audit import audit_log
from chronolog.log.audit_checkpoints import checkpoint_needs
from chronolog.log.port import OutRecord, Record
from chronolog.processors.config import ProcessorConfig
from chronolog.processors.pruning import Pruner
from chronolog.projections.projector import Projector
from chronolog.settings import LogConfig
from support.polling import wait_until

from .conftest import log_url
from .pgdb import module_database, open_store
from .takeovers import Running, fold_from_zero, some_history, take_over

HERE = Path(__file__).resolve().parent


async def _records(lg: Any, topic: str, p: int, start: int = 0) -> list[Record]:
    out: list[Record] = []
    end = await lg.end_offset(topic, p)
    offset = start
    while offset < end:
        recs = await lg.read(topic, p, offset, 2000)
        recs = [r for r in recs if r.offset < end]
        if not recs:
            break
        out.extend(recs)
        offset = recs[-1].offset + 1
    return out


async def _history(lg: Any) -> tuple[dict[int, int], dict[int, Any], dict[int, list[Record]]]:
    """A processor's history with snapshots: what a takeover from the latest marker reads
    first per partition, the fold from zero, and every event record."""
    async with Running(lg, "p1") as r:
        await some_history(r)
        await r.rounds(2)
        keep = {p: ps.snap.takeover_reads_from() for p, ps in r.proc.partitions.items()
                if ps.snap is not None}
    assert len(keep) == lg.topics.partitions and all(k is not None for k in keep.values())
    expected = await fold_from_zero(lg)
    events = {p: await _records(lg, lg.topics.events, p) for p in range(lg.topics.partitions)}
    return {p: int(k) for p, k in keep.items() if k is not None}, expected, events


async def _publish_projector(lg: Any) -> None:
    """The projectors' progress: everything applied (a projector publishes this itself)."""
    t = lg.topics
    await lg.store_offsets(t.projector_group, {
        (t.events, p): await lg.end_offset(t.events, p) for p in range(t.partitions)})


async def _starts(lg: Any) -> dict[int, int]:
    return {p: await lg.start_offset(lg.topics.events, p) for p in range(lg.topics.partitions)}


async def test_events_go_only_behind_the_snapshot_the_audit_and_the_projector(
    event_log: Any,
) -> None:
    t = event_log.topics
    keep, expected, _ = await _history(event_log)
    pruner = Pruner(event_log, retention_s=0)
    await _publish_projector(event_log)

    # no audit checkpoint and no archive: nothing goes
    for p in range(t.partitions):
        await pruner.prune_events(p, keep[p])
    assert set((await _starts(event_log)).values()) == {0}
    assert set(pruner.stats.held_by.values()) == {"audit checkpoint"}

    assert (await audit_log(event_log)).report.ok
    needs = await checkpoint_needs(event_log)
    assert needs is not None
    # the projector of partition 0 is behind: partition 0 keeps what it has not applied
    await event_log.store_offsets(t.projector_group, {(t.events, 0): 1})
    for p in range(t.partitions):
        await pruner.prune_events(p, keep[p])
    starts = await _starts(event_log)
    assert starts[0] <= 1 and pruner.stats.held_by[0] in ("projector", "snapshot")
    for p in range(1, t.partitions):
        assert starts[p] == min(keep[p], needs.get(p, 0)), p
    assert sum(starts.values()) > 0

    # a takeover from the snapshot holds exactly the fold of the whole history
    _, states, takeovers = await take_over(event_log, "p2")
    assert states == expected
    assert all(tk.from_snapshot for tk in takeovers.values())
    # the audit from its checkpoint is clean; from the beginning, without the archive, the
    # pruned history cannot be proved: a violation naming the gap, and no checkpoint saved
    assert (await audit_log(event_log)).report.ok
    full = await audit_log(event_log, full=True, save=False)
    gaps = [v for v in full.report.violations if v.check == "archive_intact"]
    assert {int(v.message.split(":")[0].split()[-1]) for v in gaps} == {
        p for p, s in starts.items() if s > 0}
    assert all("pruned" in v.message for v in gaps)
    # without a snapshot a pruned partition is not taken over (folding what is left would
    # build wrong states); the others are
    _, states_off, _ = await take_over(event_log, "p3", ProcessorConfig(snapshots=False))
    assert set(states_off) == {p for p, s in starts.items() if s == 0}
    assert all(states_off[p] == expected[p] for p in states_off)


async def test_with_an_archive_what_goes_is_archived_first_and_the_full_audit_proves_it(
    event_log: Any, tmp_path: Path,
) -> None:
    t = event_log.topics
    archive = tmp_path / "archive"
    keep, expected, events = await _history(event_log)
    await _publish_projector(event_log)
    pruner = Pruner(event_log, retention_s=0, archive=archive)
    # no checkpoint is needed with an archive: it holds what the audit has not seen
    for p in range(t.partitions):
        await pruner.prune_events(p, keep[p])
    starts = await _starts(event_log)
    assert starts == keep
    assert verify(archive).ok
    for p in range(t.partitions):
        archived = list(read_archive(archive, p))
        assert [(r.offset, r.key, r.value) for r in archived] == [
            (r.offset, r.key, r.value) for r in events[p] if r.offset < starts[p]]
    # pruning again archives nothing twice
    before = pruner.stats.archived
    for p in range(t.partitions):
        await pruner.prune_events(p, keep[p])
    assert pruner.stats.archived == before and verify(archive).ok

    full = await audit_log(event_log, full=True, archive=archive)
    assert full.report.ok, full.report.violations
    assert full.report.events == sum(len(v) for v in events.values())
    assert (await audit_log(event_log, archive=archive)).report.ok
    # a takeover without a snapshot folds the archive, then the log
    _, states, _ = await take_over(event_log, "p2",
                                   ProcessorConfig(snapshots=False, archive=str(archive)))
    assert states == expected


async def test_kill_9_while_pruning_and_archiving_leaves_no_gap_and_nothing_twice(
    event_log: Any, log_config: LogConfig, tmp_path: Path,
) -> None:
    t = event_log.topics
    archive = tmp_path / "archive"
    partitions = (0, 1)
    for p in partitions:
        for i in range(0, 24_000, 2_000):
            await event_log.append([OutRecord(t.events, b"k/%d" % (i + j), b"v" * 150 +
                                              b"%d" % (i + j), partition=p)
                                    for j in range(2_000)])
    originals = {p: await _records(event_log, t.events, p) for p in partitions}
    await _publish_projector(event_log)
    url = log_url(log_config)
    rng = random.Random(7)
    for cycle in range(3):
        child = subprocess.Popen(
            [sys.executable, str(HERE / "prune_once.py"), url, t.prefix, str(t.partitions),
             str(archive), ",".join(map(str, partitions))],
            stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "pruning"
        await asyncio.sleep(rng.uniform(0.05, 0.6))
        child.kill()  # SIGKILL
        child.wait(30)
        # never a record deleted that the archive does not hold
        for p in partitions:
            start = await event_log.start_offset(t.events, p)
            held = list(read_archive(archive, p)) if (archive / f"p{p:04d}").exists() else []
            assert start == 0 or (held and held[-1].offset >= start - 1), (cycle, p, start)
    pruner = Pruner(event_log, retention_s=0, archive=archive)
    for p in partitions:
        await pruner.prune_events(p, await event_log.end_offset(t.events, p))
    report = verify(archive)
    assert report.ok, report.problems
    for p in partitions:
        start = await event_log.start_offset(t.events, p)
        assert start > 0
        archived = [(r.offset, r.key, r.value) for r in read_archive(archive, p)]
        assert archived == [(r.offset, r.key, r.value) for r in originals[p]
                            if r.offset <= archived[-1][0]]
        assert archived[-1][0] >= start - 1
        assert [r.offset for r in await _records(event_log, t.events, p, start)] == [
            r.offset for r in originals[p] if r.offset >= start]


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    yield from module_database(database_url, "test_pruning")


async def test_a_projector_publishes_how_far_it_applied_events(
    event_log: Any, module_dsn: str, stores: list[Any],
) -> None:
    store = await open_store(module_dsn, stores)
    t = event_log.topics
    async with Running(event_log, "p1") as r:
        await some_history(r)
    projector = Projector(event_log, store)
    projector.progress_every_s = 0.05
    task = asyncio.create_task(projector.run())
    try:
        last = {p: (await _records(event_log, t.events, p))[-1].offset
                for p in range(t.partitions)}

        async def published() -> bool:
            applied = projector.watermark().partitions
            if not all(applied.get(p, 0) > o for p, o in last.items()):
                return False  # not caught up yet
            return all([await event_log.committed(t.projector_group, t.events, p)
                        == applied[p] for p in last])

        await wait_until(published, 60, what="the projector's offsets on the log")
    finally:
        projector.stop()
        await asyncio.wait_for(task, 30)


async def test_transient_topics_go_by_age_and_commands_only_once_decided(event_log: Any) -> None:
    t = event_log.topics
    ready = t.ready("default")
    for topic in (t.commands, t.replies, ready):
        await event_log.append([OutRecord(topic, None, b"x%d" % i, partition=1)
                                for i in range(10)])
    await event_log.store_offsets(t.processor_group, {(t.commands, 1): 6})
    young = Pruner(event_log, retention_s=3600, transient_s=3600)
    await young.prune_transient(1)  # all of it younger than the hour: nothing goes
    assert [await event_log.start_offset(x, 1) for x in (t.commands, t.replies, ready)] == [
        0, 0, 0]
    old = Pruner(event_log, retention_s=0, transient_s=0, min_transient_s=0)
    await old.prune_transient(1)
    # commands below what the processors decided; replies and assignments by age alone
    assert await event_log.start_offset(t.commands, 1) == 6
    assert await event_log.start_offset(t.replies, 1) == 10
    assert await event_log.start_offset(ready, 1) == 10
    assert await event_log.start_offset(t.commands, 0) == 0
