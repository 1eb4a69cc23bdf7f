"""``chronolog backup`` / ``restore`` with an explicit SQLite log, PostgreSQL read model and
result store (the CLI as subprocesses, a real PostgreSQL): the restored read model equals
the original table for table, row for row; the restored log has every record with its
offsets; a non-empty target and bad input are refused with exit 2 and one line."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.port import OutRecord, Topics
from chronolog.log.sqlite import SqliteEventLog
from chronolog.projections.project import project

from .decider_log import ScheduleLog
from .pgdb import create_database, drop_database, schema_store

pytestmark = pytest.mark.postgres

CHRONOLOG = Path(sys.executable).parent / "chronolog"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def envelopes() -> list[m.EventEnvelope]:
    out = []
    for sid in ("nightly", "hourly", "billing"):
        sl = ScheduleLog("acme", sid)
        sl.do(m.CreateSchedule(spec=m.ScheduleSpec(every=60.0, job=m.JobSpec(type="report"))),
              T0)
        sl.do(m.TriggerRun(request_key=f"{sid}-once"), T0)
        out += sl.envelopes
    return out


async def fill(log_path: Path, dsn: str) -> None:
    """Append ``envelopes()`` to a new SQLite log and project them into ``dsn``."""
    lg = SqliteEventLog(str(log_path), Topics(partitions=3))
    await lg.start()
    await lg.ensure_topics()
    store = await schema_store(dsn, "public")
    try:
        for env in envelopes():
            [pos] = await lg.append([OutRecord(lg.topics.events, env.key.encode(),
                                               codec.encode_event(env))])
            tp = (pos.topic, pos.partition)
            await store.apply(project(env), {tp: (pos.offset, pos.offset + 1)},
                              last_event_at={tp: env.at})
    finally:
        await store.close()
        await lg.close()


@pytest.fixture
def deployment(database_url: str, tmp_path: Path) -> Iterator[dict[str, object]]:
    """A log file, its projected read model (database ``src``), a result store, and an empty
    database ``dst``."""
    log_path = tmp_path / "old" / "log.db"
    log_path.parent.mkdir()
    results = tmp_path / "old" / "results" / "r_1"
    results.mkdir(parents=True)
    (results / "a1-f1-0123456789abcdef").write_bytes(b'{"rows": 3}')
    src = asyncio.run(create_database(database_url, "backup_src"))
    dst = asyncio.run(create_database(database_url, "backup_dst"))

    asyncio.run(fill(log_path, src))
    yield {"log": log_path, "src": src, "dst": dst, "results": tmp_path / "old" / "results",
           "root": tmp_path}
    asyncio.run(drop_database(database_url, src))
    asyncio.run(drop_database(database_url, dst))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHRONOLOG), *args], capture_output=True, text=True, timeout=120)


async def read_model_rows(dsn: str) -> dict[str, list[tuple[object, ...]]]:
    conn = await asyncpg.connect(dsn)
    try:
        names = [r[0] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")]
        out = {}
        for n in names:
            rows = await conn.fetch(f'SELECT * FROM "{n}"')
            if n == "schema_migrations":  # applied_at: when each database was migrated
                rows = [r[:3] for r in rows]
            out[n] = sorted(tuple(str(v) for v in r) for r in rows)
        return out
    finally:
        await conn.close()


def log_records(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.execute("SELECT topic, partition, offset, key, value, headers, ts "
                                 "FROM records ORDER BY 1, 2, 3"))
    finally:
        conn.close()


def test_backup_and_restore_round_trip_every_part(deployment: dict[str, object]) -> None:
    root = deployment["root"]
    assert isinstance(root, Path)
    backup, new_log = root / "backup", root / "new" / "log.db"
    b = cli("backup", str(backup), "--log", f"sqlite://{deployment['log']}",
             "--database-url", str(deployment["src"]), "--results", str(deployment["results"]))
    assert b.returncode == 0, b.stderr
    assert "1 result objects" in b.stdout
    r = cli("restore", str(backup), "--log", f"sqlite://{new_log}",
             "--database-url", str(deployment["dst"]), "--results", str(root / "new" / "res"))
    assert r.returncode == 0, r.stderr
    before, after = asyncio.run(read_model_rows(str(deployment["src"]))), \
        asyncio.run(read_model_rows(str(deployment["dst"])))
    assert before == after
    assert len(before["schedules"]) == 3 and len(before["runs"]) == 3
    assert log_records(new_log) == log_records(deployment["log"])  # type: ignore[arg-type]
    assert (root / "new" / "res" / "r_1" / "a1-f1-0123456789abcdef").read_bytes() == \
        b'{"rows": 3}'

    # the restored deployment is not empty any more: a second restore is refused, naming why
    again = cli("restore", str(backup), "--log", f"sqlite://{root / 'other' / 'log.db'}",
                 "--database-url", str(deployment["dst"]))
    assert again.returncode == 2
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "the read model is not empty (table " in lines[0]
    assert not (root / "other" / "log.db").exists()
    log_full = cli("restore", str(backup), "--log", f"sqlite://{new_log}",
                    "--database-url", str(deployment["dst"]))
    assert log_full.returncode == 2 and f"error: --log: '{new_log}': not empty" in log_full.stderr


def test_bad_input_exits_2_with_one_line(deployment: dict[str, object], tmp_path: Path) -> None:
    root = deployment["root"]
    assert isinstance(root, Path)
    b = cli("backup", str(root / "bk"), "--log", f"sqlite://{deployment['log']}",
             "--database-url", str(deployment["src"]))
    assert b.returncode == 0, b.stderr
    kafka = cli("restore", str(root / "bk"), "--log", "kafka://127.0.0.1:1",
                 "--database-url", str(deployment["dst"]))
    assert kafka.returncode == 2 and "a backup of an SQLite log" in kafka.stderr
    missing = cli("backup", str(tmp_path / "b2"), "--log", f"sqlite://{tmp_path / 'no.db'}")
    assert missing.returncode == 2 and "no such file" in missing.stderr
    (tmp_path / "b3").mkdir()
    (tmp_path / "b3" / "manifest.json").write_text('{"format": "chronolog.backup", '
                                                    '"formatVersion": 9}')
    future = cli("restore", str(tmp_path / "b3"), "--log", f"sqlite://{tmp_path / 'n.db'}")
    assert future.returncode == 2 and "formatVersion 9" in future.stderr
    (tmp_path / "b3" / "manifest.json").write_text("{broken")
    broken = cli("restore", str(tmp_path / "b3"), "--log", f"sqlite://{tmp_path / 'n.db'}")
    assert broken.returncode == 2 and "manifest.json unreadable" in broken.stderr
    for r in (kafka, missing, future, broken):
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
