"""A dev node that prunes its log (docs/deployment.md, "Pruning the log"; docs/design.md
§20), as the docs show it: ``chronolog dev --retention ... --archive DIR``. Its events are
pruned behind its own audits and archived; a ``misfire: all`` schedule paused across the
pruning runs every paused instant once and no older one again; a request key still answers
its run after the events of that run are gone; the audit from the checkpoint, the full
audit of archive + log and ``archive verify`` pass — and the full audit without the archive
reports the pruned history as a gap."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from chronolog.archive import read_archive
from chronolog.archive.format import MARKER
from chronolog.domain import codec
from chronolog.log.port import Topics
from chronolog.log.sqlite import SqliteEventLog
from support.docs import sh_commands
from support.net import free_port
from support.polling import wait_until, wait_until_sync

from .conftest import CHRONOLOG, ROOT

RETENTION = "4s"  # the docs show 2m: the same command, with a window a test can wait out


def _docs_commands() -> list[list[str]]:
    return sh_commands(ROOT / "docs" / "deployment.md", "**Pruning the log.**")


def _cli(ddir: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    where = [] if ddir is None else ["--data-dir", str(ddir)]
    return subprocess.run([CHRONOLOG, *args, *where], capture_output=True, text=True,
                          env=env, timeout=120)


async def _instants(lg: SqliteEventLog, sid: str) -> list[str]:
    """The scheduled instants materialized for ``sid`` that the log holds."""
    return [env.payload.scheduled_at.isoformat() for p in range(lg.topics.partitions)
            for env in (codec.decode_event(r.value) for r in await _records(lg, p))
            if _scheduled(env, sid)]


async def test_a_dev_node_prunes_behind_its_audits_archives_and_loses_nothing(
    tmp_path: Path,
) -> None:
    dev, audit, full, verify = _docs_commands()
    assert dev[:2] == ["chronolog", "dev"] and "--retention" in dev and "--archive" in dev
    ddir = tmp_path / ".chronolog"
    archive = tmp_path / "archive"
    port = free_port()
    argv = list(dev[1:])
    argv[argv.index("--retention") + 1] = RETENTION
    argv[argv.index("--archive") + 1] = str(archive)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    env.update(CHRONOLOG_PRUNE_EVERY="1s", CHRONOLOG_AUDIT_EVERY="2s")
    err = tmp_path / "dev.err"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [CHRONOLOG, *argv, "--quiet", "--data-dir", str(ddir), "--port", str(port),
             "--partitions", "2", "--no-demo"], stdout=subprocess.DEVNULL, stderr=stderr,
            env=env, cwd=tmp_path)
    lg: Any = None
    try:
        def serving() -> bool:
            assert proc.poll() is None, f"chronolog dev exited: {err.read_text()[-3000:]}"
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200

        try:
            wait_until_sync(serving, 120, what="chronolog dev serving",
                            errors=(httpx.HTTPError, OSError))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{err.read_text()[-3000:]}") from None
        # 'tick' allows overlap: a manual trigger arriving while its every-1s run still
        # runs is materialized, not skipped as an overlap (which a loaded CI machine made it)
        for sid, extra in (("tick", ["--overlap", "allow"]),
                           ("all", ["--misfire", "all", "--overlap", "allow"])):
            done = _cli(ddir, "schedule", "create", sid, "--every", "1s", "--job", "noop",
                        *extra)
            assert done.returncode == 0, done.stderr
        first = _cli(ddir, "trigger", "tick", "--idempotency-key", "once", "--json")
        assert first.returncode == 0, first.stderr
        run_id = json.loads(first.stdout)["runId"]
        lg = SqliteEventLog(ddir / "log.db", Topics(partitions=2))
        await lg.start()
        where = await _materialized(lg, archive, run_id)
        await wait_until(lambda: _count(lg, "all", 3), 60, what="three runs of 'all'")
        assert _cli(ddir, "schedule", "pause", "all").returncode == 0
        paused_at = max(await _instants(lg, "all"))

        async def pruned_past_the_trigger() -> bool:
            return await lg.start_offset(lg.topics.events, where[0]) > where[1]

        await wait_until(pruned_past_the_trigger, 120, what="the trigger's events pruned")
        # the request key still answers its run, after its events were pruned
        again = _cli(ddir, "trigger", "tick", "--idempotency-key", "once", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["runId"] == run_id
        # misfire all: the paused span runs; nothing before the pause runs again (the full
        # audit below checks every instant once and none missing, over archive + log)
        assert _cli(ddir, "schedule", "resume", "all").returncode == 0

        async def caught_up() -> bool:
            return max(await _instants(lg, "all"), default="") > paused_at

        await wait_until(caught_up, 60, what="the catch-up after the pause")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
        if lg is not None:
            await lg.close()
    assert proc.returncode == 0, err.read_text()[-2000:]
    # the docs' audits: from the checkpoint, and the whole history from archive + log
    for argv in (audit, [*full[:-1], str(archive)]):
        done = _cli(ddir, *argv[1:])
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    done = _cli(None, *verify[1:-1], str(archive))
    assert done.returncode == 0 and done.stdout.startswith("archive ok"), done.stdout
    gap = _cli(ddir, "audit", "--full", "--no-save")
    assert gap.returncode == 1 and "archive_intact" in gap.stdout, gap.stdout
    # every instant of 'all' once, one second apart, across archive and log (overlap
    # allow: no instant is skipped because the run before it was still going)
    instants = sorted(await _whole_history(ddir, archive, "all"))
    assert len(instants) == len(set(instants)) and len(instants) > 3
    steps = {(b - a).total_seconds() for a, b in itertools.pairwise(instants)}
    assert steps == {1.0}, steps


async def _whole_history(ddir: Path, archive: Path, sid: str) -> list[datetime]:
    """The instants materialized for ``sid``: every event once, from the archive and the log."""
    records = {(p, r.offset): r for p in range(2) for r in read_archive(archive, p)}
    lg = SqliteEventLog(ddir / "log.db", Topics(partitions=2))
    await lg.start()
    try:
        for p in range(2):
            records.update({(p, r.offset): r for r in await _records(lg, p)})
    finally:
        await lg.close()
    return [env.payload.scheduled_at for env in
            (codec.decode_event(r.value) for r in records.values()) if _scheduled(env, sid)]


def _scheduled(env: Any, sid: str) -> bool:
    return (env.schedule_id == sid and env.type == "OccurrenceMaterialized"
            and env.payload.trigger == "schedule")


async def _records(lg: SqliteEventLog, p: int, start: int = 0) -> list[Any]:
    out: list[Any] = []
    offset = start
    while True:
        recs = await lg.read(lg.topics.events, p, offset, 2000)
        if not recs:
            return out
        out.extend(recs)
        offset = recs[-1].offset + 1


async def _materialized(lg: SqliteEventLog, archive: Path, run_id: str) -> tuple[int, int]:
    """(partition, offset) of the event that materialized ``run_id``: on the log, or already
    archived and pruned (the window is seconds long, and a loaded machine is slow to look)."""
    async def found() -> tuple[int, int] | None:
        for p in range(2):
            kept = list(read_archive(archive, p)) if (archive / MARKER).is_file() else []
            for r in kept + await _records(lg, p):
                env = codec.decode_event(r.value)
                if env.type == "OccurrenceMaterialized" and env.payload.run_id == run_id:
                    return p, r.offset
        return None

    where: list[tuple[int, int]] = []

    async def seen() -> bool:
        hit = await found()
        if hit is not None:
            where.append(hit)
        return hit is not None

    await wait_until(seen, 30, what=f"the run {run_id} on the log")
    return where[0]


async def _count(lg: SqliteEventLog, sid: str, n: int) -> bool:
    return len(await _instants(lg, sid)) >= n

