"""The handler SDK (``chronolog.workers.job``): the cancel signal; no import cycle."""

from __future__ import annotations

import ast
import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

from chronolog.workers.job import Cancelled, JobContext


def _ctx() -> JobContext:
    return JobContext(run_id="r1", attempt=1, fence=1, scheduled_at=datetime.now(UTC),
                      params={}, tenant="t", schedule_id="s", job_type="noop", worker_id="w",
                      lease_seconds=30.0, timeout=None, log=None)


async def test_cancel_wakes_a_sleeping_handler_with_the_first_reason() -> None:
    ctx = _ctx()
    sleeper = asyncio.ensure_future(ctx.sleep(30))
    await asyncio.sleep(0)
    ctx.cancel("lease lost")
    ctx.cancel("worker shutting down")
    with pytest.raises(Cancelled, match="lease lost"):
        await asyncio.wait_for(sleeper, 5)
    assert ctx.is_cancelled and ctx.cancelled.is_set()
    with pytest.raises(Cancelled):
        ctx.check_cancelled()
    with pytest.raises(Cancelled):
        ctx.sleep_sync(30)


async def test_cancel_wakes_a_handler_thread_sleeping_in_sleep_sync() -> None:
    ctx = _ctx()
    started = threading.Event()

    def handler() -> None:
        started.set()
        ctx.sleep_sync(30)

    thread = asyncio.ensure_future(asyncio.to_thread(handler))
    assert await asyncio.to_thread(started.wait, 5)
    ctx.cancel("cancel requested")
    with pytest.raises(Cancelled, match="cancel requested"):
        await asyncio.wait_for(thread, 5)


async def test_on_cancel_runs_its_callback_once_at_the_cancel_or_at_once_after_it() -> None:
    ctx = _ctx()
    seen: list[str] = []
    ctx.on_cancel(lambda: seen.append("before"))
    assert seen == []
    ctx.cancel("timeout")
    ctx.cancel("again")
    ctx.on_cancel(lambda: seen.append("after"))
    assert seen == ["before", "after"]


def _imported(module: ModuleType) -> set[str]:
    tree = ast.parse(Path(str(module.__file__)).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_job_sdk_and_the_builtin_jobs_do_not_import_the_worker_runtime() -> None:
    # the runtime imports both; neither may import it back (not even for type checking)
    import chronolog.workers.builtin as builtin
    import chronolog.workers.job as job

    assert "chronolog.workers.runtime" not in _imported(job)
    assert "chronolog.workers.runtime" not in _imported(builtin)
