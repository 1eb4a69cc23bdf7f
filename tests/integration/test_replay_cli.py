"""``chronolog replay`` against a real PostgreSQL (``CHRONOLOG_TEST_DATABASE_URL``) and a real
SQLite log file, the CLI run as a subprocess.

The "live" tables are built the way the projector builds them — every event through
``project`` and ``PostgresProjectionStore.apply`` with its offset, here one event per
transaction — in one schema; ``chronolog replay`` rebuilds another schema from offset 0 with
other batch sizes; the two must be equal row for row (``projection_offsets.updated_at``,
the wall clock of the write, excepted).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from chronolog.cli.replay import connect_store, reset
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord, Topics
from chronolog.log.sqlite import SqliteEventLog
from chronolog.projections.project import project
from chronolog.projections.store import TABLES

from .decider_log import ScheduleLog

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TENANT = "acme"
PARTITIONS = 3
CHRONOLOG = Path(sys.executable).parent / "chronolog"
KEYS = {"schedules": "tenant, schedule_id", "runs": "run_id", "attempts": "run_id, attempt",
        "effects": "effect_id"}


def _events(schedule_id: str) -> list[m.EventEnvelope]:
    """One schedule through the real decider: runs, a retry, an effect, a manual run."""
    sl = ScheduleLog(TENANT, schedule_id)

    def claim_and(run_id: str, now: datetime, fail: bool = False) -> None:
        c = sl.claim(run_id, now)
        if fail:
            sl.do(m.FailRun(run_id=run_id, attempt=c.attempt, fence=c.fence, worker_id="w1"),
                  now + timedelta(seconds=1))
        else:
            sl.do(m.CompleteRun(run_id=run_id, attempt=c.attempt, fence=c.fence, worker_id="w1",
                                checksum="sha256:ab", size=2, inline={"ok": 1}),
                  now + timedelta(seconds=1))

    sl.do(m.CreateSchedule(spec=m.ScheduleSpec(every=60.0, job=m.JobSpec(type="report"),
                                               effects=[{"kind": "webhook",
                                                         "destination": "d-webhook"}],
                                               misfire="all")), T0)
    for k in range(4):
        now = T0 + timedelta(minutes=k)
        run_id = sl.materialized(sl.do(m.Tick(), now))
        claim_and(run_id, now + timedelta(seconds=1), fail=(k == 1))
        if k == 1:
            retry_at = sl.state.run(run_id).retry_at  # type: ignore[union-attr]
            assert retry_at is not None
            sl.do(m.Tick(), retry_at)
            claim_and(run_id, retry_at)
    sl.do(m.TriggerRun(request_key="by-hand"), T0 + timedelta(minutes=5))
    sl.do(m.PauseSchedule(reason="maintenance"), T0 + timedelta(minutes=6))
    return sl.envelopes


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[m.EventEnvelope]]:
    envs = [e for sid in ("nightly", "hourly", "reports-eu", "billing") for e in _events(sid)]
    # as processors write them: in authority-time order (stable: each schedule keeps its order)
    envs.sort(key=lambda e: e.at)
    assert len({partition_for(e.key.encode(), PARTITIONS) for e in envs}) > 1
    path = tmp_path_factory.mktemp("replay") / "log.db"

    async def write() -> None:
        log = SqliteEventLog(str(path), Topics(partitions=PARTITIONS), synchronous="NORMAL")
        await log.start()
        await log.ensure_topics()
        for e in envs:  # one append per event: offsets follow the decider's order
            await log.append([OutRecord(topic=log.topics.events, key=e.key.encode(),
                                        value=codec.encode_event(e))])
        await log.close()

    asyncio.run(write())
    return path, envs


@pytest.fixture
def schemas(database_url: str) -> Iterator[list[str]]:
    """Schema names to use; dropped afterwards."""
    made: list[str] = []
    yield made

    async def drop() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            for s in made:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def _schema(schemas: list[str], what: str) -> str:
    name = f"t_{what}_{uuid.uuid4().hex[:8]}"
    schemas.append(name)
    return name


async def _live(database_url: str, schema: str, log_path: Path) -> None:
    """Project the log event by event, one transaction each, as a live projector would."""
    store = await connect_store(database_url, schema)
    log = SqliteEventLog(str(log_path), Topics(partitions=PARTITIONS))
    try:
        await reset(store, schema)
        for p in range(PARTITIONS):
            for rec in await log.read(log.topics.events, p, 0, max_records=100_000):
                env = codec.decode_event(rec.value)
                await store.apply(project(env), {(rec.topic, p): (rec.offset, rec.offset + 1)},
                                  last_event_at={(rec.topic, p): env.at})
    finally:
        await log.close()
        await store.close()


async def _dump(database_url: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        out = {t: [tuple(r) for r in await conn.fetch(f'SELECT * FROM "{t}" ORDER BY {KEYS[t]}')]
               for t in TABLES}
        out["projection_offsets"] = [tuple(r) for r in await conn.fetch(
            "SELECT projection, topic, partition, next_offset, last_event_at "
            "FROM projection_offsets ORDER BY topic, partition")]
        return out
    finally:
        await conn.close()


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return subprocess.run([str(CHRONOLOG), "replay", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("batch", ["1000", "7"])
def test_a_rebuild_equals_the_live_tables_row_for_row(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
    batch: str,
) -> None:
    path, envs = log_file
    live, rebuilt = _schema(schemas, "live"), _schema(schemas, "replay")
    asyncio.run(_live(database_url, live, path))
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", rebuilt, "--batch", batch)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"replay done: {len(envs)} events from {PARTITIONS} partitions "
                                  f"into schema {rebuilt}")
    a, b = asyncio.run(_dump(database_url, live)), asyncio.run(_dump(database_url, rebuilt))
    assert all(a[t] for t in TABLES), "every table has rows"
    for table in a:
        assert a[table] == b[table], table


def test_a_second_replay_starts_again_from_empty_tables(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
) -> None:
    path, _envs = log_file
    target = _schema(schemas, "again")
    first = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                    "--schema", target)
    again = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                    "--schema", target)
    assert first.returncode == again.returncode == 0, again.stderr
    assert first.stdout == again.stdout


def test_to_offset_and_until_rebuild_a_prefix_of_every_partition(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
) -> None:
    path, envs = log_file
    by_partition: dict[int, list[m.EventEnvelope]] = {}
    for e in envs:
        by_partition.setdefault(partition_for(e.key.encode(), PARTITIONS), []).append(e)

    target = _schema(schemas, "prefix")
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", target, "--to-offset", "5")
    assert proc.returncode == 0, proc.stderr
    offsets = {r[2]: r[3] for r in asyncio.run(_dump(database_url, target))["projection_offsets"]}
    assert offsets == {p: min(5, len(evs)) for p, evs in by_partition.items()}

    until = T0 + timedelta(minutes=2)
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", target, "--until", until.isoformat().replace("+00:00", "Z"))
    assert proc.returncode == 0, proc.stderr
    dump = asyncio.run(_dump(database_url, target))
    offsets = {r[2]: r[3] for r in dump["projection_offsets"]}
    assert offsets == {p: sum(1 for e in evs if e.at <= until)
                       for p, evs in by_partition.items()}
    assert max(r[-1] for r in dump["projection_offsets"]) <= until  # last_event_at


@pytest.mark.parametrize("args, fragment", [
    (["--database-url", "mysql://x"], "invalid database-url 'mysql://x'"),
    (["--database-url", "postgresql://u@127.0.0.1:1/db"], "cannot connect to database-url"),
    (["--schema", "Bad-Name"], "invalid schema 'Bad-Name'"),
    (["--until", "yesterday"], "invalid until 'yesterday'"),
    (["--to-offset", "-1"], "invalid to-offset '-1'"),
])
def test_bad_input_exits_2_with_one_line(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], args: list[str],
    fragment: str,
) -> None:
    path, _ = log_file
    base = ["--log", f"sqlite:///{path}"]
    if "--database-url" not in args:
        base += ["--database-url", database_url]
    proc = _replay(*base, *args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr


def test_an_undecodable_record_is_skipped_and_named_as_the_live_projector_skips_it(
    database_url: str, tmp_path: Path, schemas: list[str],
) -> None:
    envs = _events("nightly")
    path = tmp_path / "log.db"

    async def write() -> None:
        log = SqliteEventLog(str(path), Topics(partitions=1), synchronous="NORMAL")
        await log.start()
        await log.ensure_topics()
        await log.append([OutRecord(topic=log.topics.events, key=e.key.encode(),
                                    value=codec.encode_event(e)) for e in envs[:3]])
        await log.append([OutRecord(topic=log.topics.events, key=b"acme/nightly",
                                    value=b"{not json")])
        await log.close()

    asyncio.run(write())
    target = _schema(schemas, "junk")
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", target)
    assert proc.returncode == 0, proc.stderr
    assert "note: skipped a record that does not decode: p0@3: event is not JSON" in proc.stderr
    offsets = asyncio.run(_dump(database_url, target))["projection_offsets"]
    assert [(r[2], r[3]) for r in offsets] == [(0, 4)]  # the events before it, and past it
