"""``chronolog replay`` of a pruned log (docs/design.md §9, "Replay of the window"), on both
logs and a real PostgreSQL: a processor with snapshots and a live projector, the log pruned
behind the snapshots, more history after it; the replay from each pruned partition's latest
snapshot and the retained events equals the live read model row for row — every column but
those a state does not carry (``STAND_INS``), where a row made from a state differs — with
both read models keeping the runs finished since the pruning (the window). With the archive
of what was pruned, the replay folds the whole history instead and equals the live read
model exactly."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from chronolog.archive.source import ArchivedHistory
from chronolog.cli.replay import ReplayError, rebuild, refuse_pruned
from chronolog.log.reading import read_partition
from chronolog.processors.pruning import Pruner
from chronolog.projections.projector import Projector
from chronolog.projections.retention import RetentionPolicy, prune
from chronolog.projections.window import STAND_INS
from chronolog.settings import LogConfig
from support.docs import sh_commands
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT, log_url
from .pgdb import module_database, open_store
from .takeovers import Running, some_history

pytestmark = pytest.mark.postgres

KEYS = {"schedules": ("tenant", "schedule_id"), "runs": ("run_id",),
        "attempts": ("run_id", "attempt"), "effects": ("effect_id",), "ready_runs": ("run_id",),
        "open_attempts": ("run_id", "attempt"), "calendars": ("tenant", "name")}


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    yield from module_database(database_url, "test_replay_window")


def _docs_commands() -> list[list[str]]:
    """The replay commands docs/deployment.md shows for a pruned log."""
    return sh_commands(ROOT / "docs" / "deployment.md", "`chronolog replay` of a pruned log",
                       "chronolog replay")


def _replay(cmd: list[str], cfg: LogConfig, dsn: str, schema: str, retention: float,
            archive: Path) -> subprocess.CompletedProcess[str]:
    """A documented command on this log and database, with the test's window and archive."""
    args = list(cmd[1:])
    args[args.index("--retention") + 1] = f"{retention}s"
    if "--archive" in args:
        args[args.index("--archive") + 1] = str(archive)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return subprocess.run(
        [CHRONOLOG, *args, "--log", log_url(cfg), "--database-url", dsn, "--schema", schema],
        capture_output=True, text=True, timeout=300,
        env={**env, "CHRONOLOG_TOPIC_PREFIX": cfg.topics.prefix})


async def _complete(r: Running, tenant: str, sid: str, key: str) -> str:
    """A manual run of ``sid``, claimed and completed; its run ID."""
    run_id = str((await r.client.trigger(tenant, sid, key))["run_id"])
    held = await r.client.claim(tenant, sid, run_id, 1, "w1")
    await r.client.complete(tenant, sid, run_id, 1, held["fence"], "w1",
                            checksum="sha256:ab", size=2, inline={"ok": 1})
    return run_id


async def _caught_up(lg: Any, projector: Projector) -> dict[int, int]:
    """The end offsets of ``events`` now, once the projector applied every event below."""
    t = lg.topics
    ends = {p: await lg.end_offset(t.events, p) for p in range(t.partitions)}
    last = {}
    for p, end in ends.items():
        recs = await lg.read(t.events, p, max(await lg.start_offset(t.events, p), end - 50), 100)
        last[p] = max(r.offset for r in recs if r.offset < end)

    async def applied() -> bool:
        marks = projector.watermark().partitions
        return all(marks.get(p, 0) > o for p, o in last.items())

    await wait_until(applied, 60, what="the live projector caught up")
    return ends


async def _rows(dsn: str, schema: str) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": f'"{schema}"'})
    try:
        out = {}
        for table, key in KEYS.items():
            out[table] = {tuple(r[k] for k in key): dict(r)
                          for r in await conn.fetch(f'SELECT * FROM "{table}"')}
        out["projection_offsets"] = {
            (r["topic"], r["partition"]): {"next_offset": r["next_offset"],
                                           "last_event_at": r["last_event_at"]}
            for r in await conn.fetch("SELECT * FROM projection_offsets")}
        return out
    finally:
        await conn.close()


async def _schema_of(store: Any) -> str:
    return str(await store.pool.fetchval("SELECT current_schema()"))


async def test_a_replay_of_the_window_equals_the_live_read_model_for_the_window(
    event_log: Any, log_config: LogConfig, module_dsn: str, stores: list[Any], tmp_path: Path,
) -> None:
    t = event_log.topics
    archive = tmp_path / "archive"
    live = await open_store(module_dsn, stores)
    projector = Projector(event_log, live)
    task = asyncio.create_task(projector.run())
    try:
        async with Running(event_log, "p1") as r:
            await some_history(r)
            # calendars: one put before the cut only (its row from its state), one revised
            # after it too
            await r.client.put_calendar("acme", "hol", {"dates": ["2026-12-25"]})
            await r.client.put_calendar("acme", "ops", {"windows": [{"start": "02:00",
                                                                      "end": "03:00"}]})
            gone = await _complete(r, "acme", "s5", "early-done")  # finished before the cut
            early = str((await r.client.trigger("open", "s4", "early-live"))["run_id"])
            await r.rounds(2)
            keep = {p: ps.snap.takeover_reads_from() for p, ps in r.proc.partitions.items()
                    if ps.snap is not None}
            assert len(keep) == t.partitions and all(k is not None for k in keep.values())
            pruner = Pruner(event_log, retention_s=0, archive=archive)
            await _caught_up(event_log, projector)
            await event_log.store_offsets(t.projector_group, {
                (t.events, p): await event_log.end_offset(t.events, p)
                for p in range(t.partitions)})
            for p in range(t.partitions):
                await pruner.prune_events(p, keep[p])
            starts = {p: await event_log.start_offset(t.events, p) for p in range(t.partitions)}
            assert all(s > 0 for s in starts.values()), starts
            cut = datetime.now(UTC)
            # the window's own history: a run made before the cut cancelled, a run made and
            # finished after it, a schedule paused with a reason
            await r.client.cancel("open", "s4", early, reason="late")
            late = await _complete(r, "acme", "s7", "late-done")
            await r.client.pause("open", "s6", reason="window")
            await r.client.put_calendar("acme", "ops", {"dates": ["2027-01-01"]},
                                        expected_revision=1)
            ticks = r.proc.stats.ticks
            await wait_until(lambda: r.proc.stats.ticks > ticks + 12, 30, what="more ticks")
            await r.rounds(2)
        ends = await _caught_up(event_log, projector)
    finally:
        projector.stop()
        await asyncio.wait_for(task, 30)

    # the window: runs finished since the cut (the live read model prunes the others too)
    now = await live.pool.fetchval("SELECT max(last_event_at) FROM projection_offsets")
    policy = RetentionPolicy(default=(now - cut).total_seconds())
    await prune(live.pool, policy, projection=live.projection, topic=t.events)
    expected = await _rows(module_dsn, await _schema_of(live))
    assert gone not in {k[0] for k in expected["runs"]}
    assert {early, late} <= {k[0] for k in expected["runs"]}

    # without the archive: each pruned partition from its snapshot and the retained events
    plan = await refuse_pruned(event_log, ends)
    assert set(plan.windows) == set(range(t.partitions)) and not plan.archived
    # a state cannot be undone: a replay stopping before a snapshot is refused
    for stop in ({p: s + 1 for p, s in starts.items()}, ends):
        with pytest.raises(ReplayError, match="cannot stop before that"):
            await refuse_pruned(event_log, stop, until=None if stop is not ends else cut)
    schema = f"w_{(await _schema_of(live))[2:]}"
    stats = await rebuild(event_log, module_dsn, schema=schema, retention=policy, stops=ends,
                          windows=plan.windows)
    assert stats.window_events > 0
    got = await _rows(module_dsn, schema)
    assert got["projection_offsets"] == expected["projection_offsets"]
    made_from_states = 0
    for table in KEYS:
        assert set(got[table]) == set(expected[table]), (
            table, set(got[table]) ^ set(expected[table]))
        for key, row in expected[table].items():
            differ = {c for c, v in row.items() if got[table][key][c] != v}
            assert differ <= STAND_INS[table], (table, key, differ)
            made_from_states += bool(differ)
    # the schedules created before the log's start, and their runs, came from states
    assert made_from_states > 0
    assert expected["schedules"][("open", "s6")]["pause_reason"] == "window"
    assert got["schedules"][("open", "s6")]["pause_reason"] == "window"
    assert got["runs"][(early,)]["state"] == "CANCELLED"
    assert {k: (v["revision"], v["spec"]) for k, v in got["calendars"].items()} == {
        ("acme", "hol"): (1, '{"dates": ["2026-12-25"]}'),
        ("acme", "ops"): (2, '{"dates": ["2027-01-01"]}')}
    # the commands of the docs: the same rows, and each says how a partition was read
    window_cmd, archive_cmd = _docs_commands()
    cli = f"c_{(await _schema_of(live))[2:]}"
    proc = _replay(window_cmd, log_config, module_dsn, cli, policy.default, archive)
    assert proc.returncode == 0, proc.stderr
    # every retained event folded once: before its state, or after it
    retained = 0
    for p in range(t.partitions):
        async for recs in read_partition(event_log, t.events, p, starts[p]):
            retained += len(recs)
    assert proc.stdout.startswith(f"replay done: {retained} events from {t.partitions} ")
    assert [n.split(": replayed from its snapshot (")[0] for n in proc.stderr.splitlines()] == [
        f"note: partition {p} was pruned below offset {starts[p]}" for p in sorted(starts)]
    assert await _rows(module_dsn, cli) == got

    # with the archive of what went: the whole history, exactly the live rows
    plan = await refuse_pruned(event_log, ends, ArchivedHistory(archive, event_log))
    assert plan.archived == starts and not plan.windows
    whole = f"a_{(await _schema_of(live))[2:]}"
    proc = _replay(archive_cmd, log_config, module_dsn, whole, policy.default, archive)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"note: partition {p} was pruned below offset {starts[p]}: its history was read "
        "from the archive, then the log" for p in sorted(starts)]
    assert await _rows(module_dsn, whole) == expected
