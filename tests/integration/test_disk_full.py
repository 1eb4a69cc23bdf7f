"""The embedded SQLite log on a full disk: appends fail clearly, nothing is corrupted, and the
processor and the client carry on once space returns.

The log lives on a tmpfs of the test's own (``mount -t tmpfs -o size=16m``: the test needs
root, CAP_SYS_ADMIN, and fails saying so without it); a filler file takes the last byte. A
client's create then raises ``LogFull`` naming the disk full, the processor's commits fail
and its readiness file says so, and it keeps running. Once the filler is deleted the
processor is ready again and takes the commands of the client again; the log reopens,
``PRAGMA integrity_check`` is ``ok`` and ``chronolog audit`` exits 0.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chronolog.client import Client
from chronolog.log.port import LogError, LogFull, Topics
from chronolog.settings import LogConfig, open_log
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT
from .outages import Service

SPEC = {"every": "1s", "job": {"type": "noop", "params": {}}, "misfire": "all"}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of this test's own."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail("the full-disk test mounts a tmpfs and needs root (CAP_SYS_ADMIN): "
                    f"{done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


def _fill(path: Path) -> int:
    """Zeros into ``path`` until the file system has no byte left; how many were written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            block = b"\0" * size
            while True:
                try:
                    written += f.write(block) or 0
                except OSError:
                    break
    return written


async def _create(client: Client, schedule_id: str) -> BaseException | None:
    """None when created; the error otherwise."""
    try:
        await client.create_schedule("t", schedule_id, SPEC)
    except Exception as exc:  # noqa: BLE001 - what the client says is the point
        return exc
    return None


async def test_a_full_disk_fails_appends_clearly_and_the_log_recovers_intact(
    small_disk: Path, tmp_path: Path
) -> None:
    db = small_disk / "log.db"
    cfg = LogConfig("sqlite", str(db), Topics(partitions=4))
    processor = Service("processor", ["processor", "--log", f"sqlite://{db}",
                                      "--partitions", "4"], tmp_path)
    lg = open_log(cfg)
    try:
        await lg.start()
        await lg.ensure_topics()
        client = Client(lg, reply_timeout=20)
        await client.start()
        await wait_until(processor.ready, 60, what="the processor ready")
        assert await _create(client, "before") is None  # ticking every second from now on

        filler = small_disk / "filler"
        assert await asyncio.to_thread(_fill, filler) > 0
        refused = await _create(client, "while-full")
        assert isinstance(refused, LogFull), repr(refused)
        assert isinstance(refused, LogError) and "disk full" in str(refused)
        # the processor's commits (the ticks of 'before') fail: not ready, and why
        reason = await wait_until(processor.not_ready, 30, what="the processor not ready")
        assert "disk full" in reason, reason
        assert processor.alive(), processor.tail()

        filler.unlink()
        await wait_until(processor.ready, 60, what="the processor ready again")
        tries = iter(range(1000))  # a create that timed out may have been decided: a new ID
        await wait_until(lambda: _create_ok(client, f"after-{next(tries)}"), 60,
                         what="a create answered once space returned")
        assert processor.alive(), processor.tail()
        await client.close()
    finally:
        processor.stop()
        await lg.close()

    # nothing is corrupted: the file is consistent and every guarantee of the log holds
    conn = sqlite3.connect(str(db))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    audit = await asyncio.to_thread(
        subprocess.run, [CHRONOLOG, "audit", "--log", f"sqlite://{db}", "--partitions", "4"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def _create_ok(client: Client, schedule_id: str) -> bool:
    return await _create(client, schedule_id) is None
