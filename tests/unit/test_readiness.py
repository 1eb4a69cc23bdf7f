"""chronolog.readiness: the readiness file a supervisor reads, and the probe loop."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chronolog.readiness import (
    READY_FILE_ENV,
    Readiness,
    database_reachable,
    log_reachable,
    probing,
    ready_file,
    watch,
)
from support.polling import wait_until


def _doc(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())


def test_the_file_says_ready_why_and_since_and_changes_only_when_readiness_does(
    tmp_path: Path,
) -> None:
    times = iter(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=n) for n in range(10))
    path = tmp_path / "sub" / "p.ready"
    r = Readiness("processor", path, clock=lambda: next(times))
    assert _doc(path) == {"ready": False, "reason": "starting", "since": "2026-01-01T00:00:00Z",
                          "process": "processor", "pid": os.getpid()}
    assert r.set(True, "owns partitions [0, 1]")
    assert _doc(path)["since"] == "2026-01-01T00:00:01Z"
    assert not r.set(True, "owns partitions [0, 1]")  # no change: not written again
    assert r.set(True, "owns partitions [0]")  # a new reason: written, same since
    assert _doc(path) == {**_doc(path), "ready": True, "reason": "owns partitions [0]",
                          "since": "2026-01-01T00:00:01Z"}
    assert r.set(False, "log unreachable:\n  no answer")  # one line
    assert _doc(path)["reason"] == "log unreachable: no answer"
    assert _doc(path)["since"] == "2026-01-01T00:00:02Z"
    # replaced atomically: no temporary file is left next to it
    assert sorted(p.name for p in path.parent.iterdir()) == ["p.ready"]


def test_the_file_comes_from_the_flag_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(READY_FILE_ENV, raising=False)
    assert ready_file(None) is None
    monkeypatch.setenv(READY_FILE_ENV, "/run/x.ready")
    assert ready_file(None) == "/run/x.ready"
    assert ready_file("/tmp/flag.ready") == "/tmp/flag.ready"


def test_a_file_that_cannot_be_written_does_not_stop_the_process(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    r = Readiness("worker", blocker / "w.ready")  # its directory cannot exist
    assert r.set(True, "consumes")  # recorded in memory, the write failure only logged
    assert r.ready


class _Recorded(Readiness):
    """Every readiness set, in order."""

    def __init__(self, *args: object, **kw: object) -> None:
        self.seen: list[tuple[bool, str]] = []
        super().__init__(*args, **kw)  # type: ignore[arg-type]

    def set(self, ready: bool, reason: str) -> bool:
        self.seen.append((ready, reason))
        return super().set(ready, reason)


async def test_watch_sets_what_the_probe_says_and_a_failing_probe_means_not_ready(
    tmp_path: Path,
) -> None:
    r = _Recorded("x", tmp_path / "x.ready")
    answers: list[object] = [(True, "fine"), RuntimeError("boom"), (True, "fine again")]

    async def probe() -> tuple[bool, str]:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]

    task = asyncio.create_task(watch(r, probe, interval=0.01))
    try:
        await wait_until(lambda: r.reason == "fine again", 10, what="the third answer")
    finally:
        task.cancel()
    assert r.seen[:3] == [(True, "fine"), (False, "probe failed: RuntimeError: boom"),
                          (True, "fine again")]


async def test_probing_says_stopped_when_the_process_leaves(tmp_path: Path) -> None:
    path = tmp_path / "y.ready"

    async def probe() -> tuple[bool, str]:
        return True, "serving"

    async with probing(Readiness("api", path), probe, interval=0.01) as r:
        await wait_until(lambda: r.ready, 10, what="ready")
        assert _doc(path)["ready"] is True
    assert _doc(path)["ready"] is False and _doc(path)["reason"] == "stopped"


class _Away:
    class topics:  # the shape of a log's topics
        commands = "c"

    async def write_quorum(self) -> str | None:
        return None

    async def end_offset(self, topic: str, partition: int) -> int:
        raise ConnectionRefusedError(111, "Connect call failed")

    async def fetchval(self, query: str) -> int:
        await asyncio.sleep(10)
        return 1


async def test_the_service_probes_name_what_is_away() -> None:
    assert (await log_reachable(_Away())).startswith(  # type: ignore[union-attr]
        "log unreachable: ConnectionRefusedError")
    assert await database_reachable(_Away(), timeout=0.05) == (
        "read model unreachable: no answer within 0.05s")
