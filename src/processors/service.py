"""A partition-owning processor as a process: built from its log and tenants file, served
until SIGTERM/SIGINT (it then finishes its open transaction and leaves the group), its
readiness written to a file when one is named (``chronolog.readiness``): ready while it is in
the group, every partition assigned to it is restored, the last commit of each succeeded and
the log answers."""

from __future__ import annotations

import os
from typing import Any

from chronolog.lifecycle import serve_log
from chronolog.processors.clock import CLOCK_STEP_HOLD_S, CLOCK_STEP_S
from chronolog.processors.config import GROUP_SETTLE_S, ProcessorConfig
from chronolog.processors.runtime import Processor
from chronolog.readiness import Readiness, log_reachable, probing
from chronolog.tenants import DEFAULT_RETENTION_S, load_tenants


async def run_processor(log_: Any, member: str, batch: int = 500,
                        tenants_path: str | None = None, ready_file: str | None = None,
                        retention_s: float = DEFAULT_RETENTION_S,
                        archive: str | None = None, prune_every_s: float = 30.0,
                        clock_step: tuple[float | None, float | None] = (
                            CLOCK_STEP_S, CLOCK_STEP_HOLD_S)) -> int:
    """``retention_s``: the log's window (the longest of the deployment's and the tenants'
    retention); ``archive``: where events go before they are pruned; ``clock_step``: the
    clock-step guard's bound and hold (``chronolog.processors.clock``)."""
    tenants = None
    path = tenants_path or os.environ.get("CHRONOLOG_TENANTS")
    if path:
        tenants = load_tenants(path)
    proc = Processor(log_, member, tenants=tenants, config=ProcessorConfig(
        batch_max=batch, retention_s=retention_s, archive=archive,
        prune_every_s=prune_every_s, group_settle_s=GROUP_SETTLE_S,
        clock_step_s=clock_step[0], clock_step_hold_s=clock_step[1]))

    async def probe() -> tuple[bool, str]:
        ready, reason = proc.readiness()
        away = await log_reachable(log_) if ready else None
        return (False, away) if away else (ready, reason)

    async with probing(Readiness("processor", ready_file), probe):
        return await serve_log(log_, proc.run, proc.stop, "processor")
