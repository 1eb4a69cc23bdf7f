"""Backups that verify: ``chronolog restore`` checks every file of a backup (size, SHA-256,
the log's integrity, every count) before it writes anything, stages every part beside the
target and makes it visible only when whole; ``chronolog backup verify`` runs the same check
alone. The CLI as real subprocesses, a real PostgreSQL, an SQLite log.

One good backup per module; each test damages a copy of it. A refused backup leaves the
target exactly as it was — empty — which the restore of the good backup into the same target
right after proves: it succeeds, and the target then holds exactly the backed-up read model
(what a node serves), log records and result objects, and ``chronolog audit`` is clean."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from chronolog.projections.migrate import ADVISORY_LOCK_KEY
from support.polling import wait_until_sync

from .pgdb import create_database, drop_database, schema_store
from .test_backup_cli import CHRONOLOG, cli, fill, log_records, read_model_rows

pytestmark = pytest.mark.postgres

OBJECT = "results/r_1/a1-f1-0123456789abcdef"


@pytest.fixture(scope="module")
def good(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A deployment (SQLite log, read model, one result object) and a good backup of it."""
    root = tmp_path_factory.mktemp("good")
    log = root / "old" / "log.db"
    (root / "old" / "results" / "r_1").mkdir(parents=True)
    (root / "old" / OBJECT).write_bytes(b'{"rows": 3}')
    src = asyncio.run(create_database(database_url, "verify_src"))
    asyncio.run(fill(log, src))
    b = cli("backup", str(root / "backup"), "--log", f"sqlite://{log}", "--database-url", src,
            "--results", str(root / "old" / "results"))
    assert b.returncode == 0, b.stderr
    yield {"backup": root / "backup", "log": log, "rows": asyncio.run(read_model_rows(src)),
           "records": log_records(log)}
    asyncio.run(drop_database(database_url, src))


@pytest.fixture
def target(database_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """An empty deployment: a new database, a log path and a result store that do not exist."""
    dst = asyncio.run(create_database(database_url, "verify_dst"))
    yield {"dsn": dst, "log": tmp_path / "new" / "log.db", "results": tmp_path / "new" / "res",
           "root": tmp_path / "new"}
    asyncio.run(drop_database(database_url, dst))


def _restore_args(backup: Path, target: dict[str, Any]) -> list[str]:
    return ["restore", str(backup), "--log", f"sqlite://{target['log']}",
            "--database-url", target["dsn"], "--results", str(target["results"])]


def _restore(backup: Path, target: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cli(*_restore_args(backup, target))


async def _public_rows(dsn: str) -> dict[str, int]:
    """Rows per table of the target's read model, and any staging schema left as a key."""
    conn = await asyncpg.connect(dsn)
    try:
        out = {}
        for (name,) in await conn.fetch("SELECT tablename FROM pg_tables "
                                        "WHERE schemaname = 'public'"):
            out[name] = int(await conn.fetchval(f'SELECT count(*) FROM "{name}"'))
        for (name,) in await conn.fetch("SELECT nspname FROM pg_namespace "
                                        "WHERE nspname LIKE 'chronolog_restore_%'"):
            out[f"schema {name}"] = -1
        return out
    finally:
        await conn.close()


def _assert_nothing_written(target: dict[str, Any]) -> None:
    assert not target["root"].exists()
    assert asyncio.run(_public_rows(target["dsn"])) == {}


def _assert_empty(target: dict[str, Any]) -> None:
    """The target holds nothing visible: no log records, no read-model rows, no objects."""
    assert not target["log"].exists()
    assert not target["results"].exists()
    rows = asyncio.run(_public_rows(target["dsn"]))
    assert not any(n > 0 for name, n in rows.items()
                   if name != "schema_migrations" and not name.startswith("schema ")), rows


def _assert_restores(good: dict[str, Any], target: dict[str, Any]) -> None:
    """The good backup restores into the target, which then holds exactly what it holds."""
    r = _restore(good["backup"], target)
    assert r.returncode == 0, r.stderr
    assert asyncio.run(read_model_rows(target["dsn"])) == good["rows"]
    assert len(good["rows"]["schedules"]) == 3 and len(good["rows"]["runs"]) == 3
    assert log_records(target["log"]) == good["records"]
    assert (target["results"] / OBJECT.removeprefix("results/")).read_bytes() == b'{"rows": 3}'
    assert sorted(p.name for p in target["root"].iterdir()) == ["log.db", "res"]
    assert [n for n in asyncio.run(_public_rows(target["dsn"])) if n.startswith("schema ")] == []
    audit = cli("audit", "--log", f"sqlite://{target['log']}")
    assert audit.returncode == 0 and audit.stdout.startswith("audit ok: "), audit.stdout


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    return lines[0]


def _copy(good: dict[str, Any], tmp_path: Path) -> Path:
    bad = tmp_path / "bad"
    shutil.copytree(good["backup"], bad)
    return bad


def _truncate(name: str, keep: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:keep(len(data))])
    return damage


def _flip(name: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        data = bytearray((folder / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (folder / name).write_bytes(bytes(data))
    return damage


def _alter_manifest(folder: Path) -> None:
    """One byte of a value changed, the JSON still well-formed."""
    text = (folder / "manifest.json").read_text()
    at = text.index('"createdAt": "') + len('"createdAt": "')
    digit = text[at]
    (folder / "manifest.json").write_text(text[:at] + str((int(digit) + 1) % 10) + text[at + 1:])


def _delete(name: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).unlink()


def _extra(folder: Path) -> None:
    (folder / "readmodel" / "notes.txt").write_text("an operator's note\n")


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated log.db": (_truncate("log.db", lambda n: n // 2),
                         "log.db is {half} bytes, the manifest says"),
    "cut read-model copy": (_truncate("readmodel/schedules.copy", lambda n: n - 10),
                            "readmodel/schedules.copy is"),
    "one byte of log.db": (_flip("log.db"), "log.db does not match its SHA-256 (altered)"),
    "one byte of a read-model copy": (_flip("readmodel/runs.copy"),
                                      "readmodel/runs.copy does not match its SHA-256"),
    "one byte of a result object": (_flip(OBJECT), f"{OBJECT} does not match its SHA-256"),
    "one byte of the manifest": (_alter_manifest,
                                 "manifest.json does not match its manifestSha256"),
    "a missing read-model copy": (_delete("readmodel/runs.copy"),
                                  "readmodel/runs.copy is missing"),
    "a missing result object": (_delete(OBJECT), f"{OBJECT} is missing"),
    "an extra unlisted file": (_extra, "readmodel/notes.txt is not listed in manifest.json"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_backup_is_refused_in_one_line_and_nothing_is_written(
    good: dict[str, Any], target: dict[str, Any], tmp_path: Path, damage: str,
) -> None:
    bad = _copy(good, tmp_path)
    fn, expected = DAMAGES[damage]
    fn(bad)
    half = (good["backup"] / "log.db").stat().st_size // 2
    line = _one_line(_restore(bad, target))
    assert line.startswith(f"error: backup: '{bad}': ") and expected.format(half=half) in line
    _assert_nothing_written(target)
    _assert_restores(good, target)


def _rewrite_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Edit the manifest and give it consistent checksums again (a damage only the content
    checks can see)."""
    from chronolog.cli.backup_check import file_entries, manifest_checksum

    doc = json.loads((folder / "manifest.json").read_text())
    change(doc)
    if doc["formatVersion"] == 2:
        doc["files"] = file_entries(folder)
        doc["manifestSha256"] = manifest_checksum(doc)
    (folder / "manifest.json").write_text(json.dumps(doc))


def test_the_contents_are_checked_against_the_counts_behind_consistent_checksums(
    good: dict[str, Any], target: dict[str, Any], tmp_path: Path,
) -> None:
    bad = _copy(good, tmp_path)
    _truncate("readmodel/runs.copy", lambda n: n - 2)(bad)
    _rewrite_manifest(bad, lambda doc: None)
    assert "readmodel/runs.copy is cut off after" in _one_line(_restore(bad, target))
    miscounted = tmp_path / "miscounted"
    shutil.copytree(good["backup"], miscounted)
    _rewrite_manifest(miscounted, lambda doc: doc["log"]["records"].update(
        {k: v + 1 for k, v in doc["log"]["records"].items()}))
    assert "log.db holds 6 records, the manifest says 7" in \
        _one_line(_restore(miscounted, target))
    _assert_nothing_written(target)
    _assert_restores(good, target)


def test_a_format_1_backup_restores_only_knowingly_and_its_contents_are_still_checked(
    good: dict[str, Any], target: dict[str, Any], tmp_path: Path,
) -> None:
    def to_v1(doc: dict[str, Any]) -> None:
        doc["formatVersion"] = 1
        del doc["files"], doc["manifestSha256"]

    old = _copy(good, tmp_path)
    _rewrite_manifest(old, to_v1)
    refused = _one_line(_restore(old, target))
    assert "formatVersion 1, which has no checksums" in refused
    assert "--accept-unverified" in refused
    cut = tmp_path / "cut"
    shutil.copytree(old, cut)
    _truncate("log.db", lambda n: n // 2)(cut)
    line = _one_line(cli(*_restore_args(cut, target), "--accept-unverified"))
    assert "log.db " in line and "SQLite" in line
    _assert_nothing_written(target)
    verified = cli("backup", "verify", str(old), "--accept-unverified")
    assert verified.returncode == 0 and "NO checksums (format 1)" in verified.stdout
    r = cli(*_restore_args(old, target), "--accept-unverified")
    assert r.returncode == 0, r.stderr
    assert asyncio.run(read_model_rows(target["dsn"])) == good["rows"]


def test_backup_verify_says_ok_in_one_line_or_names_the_first_problem(
    good: dict[str, Any], tmp_path: Path,
) -> None:
    r = cli("backup", "verify", str(good["backup"]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith(f"backup ok: {good['backup']}: ")
    assert "sizes and SHA-256 match; 6 log records (sqlite)" in r.stdout
    assert "1 result objects" in r.stdout
    bad = _copy(good, tmp_path)
    _flip("readmodel/runs.copy")(bad)
    _delete(OBJECT)(bad)  # listed after readmodel/: the first problem is the altered copy
    assert _one_line(cli("backup", "verify", str(bad))) == \
        f"error: backup: '{bad}': readmodel/runs.copy does not match its SHA-256 (altered)"
    not_a_backup = _one_line(cli("backup", "verify", str(tmp_path / "nothing")))
    assert not_a_backup == f"error: backup: '{tmp_path / 'nothing'}': no such directory"


class _Holding:
    """A session of the test's own that holds a lock the restore will wait for."""

    def __init__(self, dsn: str, *sql: str) -> None:
        self.dsn, self.sql = dsn, sql

    async def __aenter__(self) -> _Holding:
        self.conn = await asyncpg.connect(self.dsn)
        self.tx = self.conn.transaction()
        await self.tx.start()
        for statement in self.sql:
            await self.conn.execute(statement)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.tx.rollback()
        await self.conn.close()


async def _killed_at(target: dict[str, Any], backup: Path, ready: Callable[[], bool],
                     *hold: str) -> None:
    """Start a restore, hold it at a lock, wait for ``ready``, kill it with SIGKILL."""
    async with _Holding(target["dsn"], *hold):
        proc = subprocess.Popen([str(CHRONOLOG), *_restore_args(backup, target)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            await asyncio.to_thread(wait_until_sync, ready, 60, "the restore at its lock")
            assert proc.poll() is None
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


async def _migrated(dsn: str) -> None:
    store = await schema_store(dsn, "public")
    await store.close()


def _staged(target: dict[str, Any]) -> bool:
    return (target["log"].parent / ".log.db.restore-staging").exists() and any(
        n.startswith("schema ") for n in asyncio.run(_public_rows(target["dsn"])))


def test_a_restore_killed_while_staging_leaves_the_target_empty_and_runs_again(
    good: dict[str, Any], target: dict[str, Any],
) -> None:
    # the staging read model waits for the migration lock, which the test holds
    asyncio.run(_killed_at(target, good["backup"], lambda: _staged(target),
                           f"SELECT pg_advisory_lock({ADVISORY_LOCK_KEY})"))
    _assert_empty(target)
    _assert_restores(good, target)


def test_a_restore_killed_while_swapping_in_leaves_the_target_empty_and_runs_again(
    good: dict[str, Any], target: dict[str, Any],
) -> None:
    # an empty, migrated read model whose table the test keeps locked: the swap waits
    asyncio.run(_migrated(target["dsn"]))
    journal = target["log"].parent / "log.db.restore.json"
    asyncio.run(_killed_at(target, good["backup"], journal.exists,
                           "LOCK TABLE public.schedules IN ACCESS SHARE MODE"))
    _assert_empty(target)
    assert json.loads(journal.read_text())["manifest"] == hashlib.sha256(
        (good["backup"] / "manifest.json").read_bytes()).hexdigest()
    _assert_restores(good, target)
