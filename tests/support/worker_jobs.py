"""Jobs for the worker integration tests, loaded by ``chronolog worker --jobs <this file>``.

``record``: appends ``run_id attempt fence worker_id`` to ``params["file"]`` (so a test can
count handler invocations across processes), then returns a result that names the attempt,
padded with ``params["pad"]`` bytes so that it can be made larger than the inline limit.
"""

from __future__ import annotations

import os
from typing import Any


def record_invocation(ctx: Any) -> dict[str, Any]:
    line = f"{ctx.run_id} {ctx.attempt} {ctx.fence} {ctx.worker_id}\n"
    fd = os.open(ctx.params["file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"run_id": ctx.run_id, "attempt": ctx.attempt, "fence": ctx.fence,
            "worker": ctx.worker_id, "pad": "x" * int(ctx.params.get("pad", 0))}


def register(worker: Any) -> None:
    worker.register("record", record_invocation)  # a sync handler: runs in a thread
