"""Real workers serving in-process for the duration of a block, on any log, and reading what
their runs wrote: shared by the unit tests on the in-memory log and the integration tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.workers import FilesystemResultStore, Worker
from support import worker_jobs
from support.processors import events, read_all


@contextlib.asynccontextmanager
async def serving(lg: Any, tmp: Path, worker_id: str,
                  *registers: Callable[[Worker], None]) -> AsyncIterator[Worker]:
    """A worker with the job types ``registers`` register, announcing itself every 0.2 s."""
    w = Worker(lg, worker_id=worker_id, result_store=FilesystemResultStore(tmp / "results"),
               reply_timeout=5, announce_interval=0.2)
    for register in registers:
        register(w)
    async with running(w):
        yield w


@contextlib.asynccontextmanager
async def running(w: Worker) -> AsyncIterator[Worker]:
    """``w`` serves until the block ends; then it drains (bounded)."""
    task = asyncio.create_task(w.run())
    try:
        await w.wait_started()
        yield w
    finally:
        w.stop()
        await asyncio.wait_for(task, 60)


FAR = (datetime.now(UTC) + timedelta(days=365)).isoformat()


def manual_spec(
    job: str, params: dict[str, Any], lease: str = "30s", **extra: Any
) -> dict[str, Any]:
    """A schedule that only runs when triggered (its one instant is a year away)."""
    return {"at": FAR, "job": {"type": job, "params": params}, "overlap": "allow",
            "lease": lease, **extra}


async def published(lg: Any, run_id: str | None = None) -> list[m.ResultPublished]:
    return [e.payload for e in await events(lg) if e.type == "ResultPublished"
            and (run_id is None or e.payload.run_id == run_id)]


async def of_type(lg: Any, type_: str, run_id: str) -> list[Any]:
    return [e.payload for e in await events(lg)
            if e.type == type_ and getattr(e.payload, "run_id", None) == run_id]


def invocations(path: Path, run_id: str) -> list[list[str]]:
    if not path.exists():
        return []
    return [ln.split() for ln in path.read_text().splitlines() if ln.startswith(run_id + " ")]


async def assignments_for(lg: Any, run_id: str) -> list[Any]:
    return [r for r in await read_all(lg, lg.topics.ready("default"))
            if codec.decode_assignment(r.value, r.key)["run_id"] == run_id]


async def all_acknowledged(lg: Any, group: str) -> bool:
    """Every assignment record is below the group's committed offset (Kafka's end offset
    also counts transaction markers, so compare with the last record, not with the end)."""
    topic = lg.topics.ready("default")
    last: dict[int, int] = {}
    for rec in await read_all(lg, topic):
        last[rec.partition] = max(last.get(rec.partition, -1), rec.offset)
    for p, off in last.items():
        if (await lg.committed(group, topic, p) or 0) <= off:
            return False
    return True


@contextlib.asynccontextmanager
async def serving_test_jobs(lg: Any, store: Any, worker_id: str, group: str | None = None,
                  **kw: Any) -> AsyncIterator[Worker]:
    """A worker with the built-in jobs and those of ``support.worker_jobs``."""
    w = Worker(lg, worker_id=worker_id, result_store=store, group=group, reply_timeout=5, **kw)
    w.builtin_jobs()
    worker_jobs.register(w)
    task = asyncio.create_task(w.run())
    await w.wait_started()
    try:
        yield w
    finally:
        w.stop()
        await asyncio.wait_for(task, 60)
