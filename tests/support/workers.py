"""A real worker serving in-process for the duration of a block, on any log."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from chronolog.workers import FilesystemResultStore, Worker


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
