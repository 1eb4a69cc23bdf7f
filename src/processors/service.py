"""A partition-owning processor as a process: built from its log and tenants file, served
until SIGTERM/SIGINT (it then finishes its open transaction and leaves the group)."""

from __future__ import annotations

import os
from typing import Any

from chronolog.lifecycle import serve_log
from chronolog.processors.runtime import Processor, ProcessorConfig
from chronolog.tenants import load_tenants


async def run_processor(log_: Any, member: str, batch: int = 500,
                        tenants_path: str | None = None) -> int:
    tenants = None
    path = tenants_path or os.environ.get("CHRONOLOG_TENANTS")
    if path:
        tenants = load_tenants(path)
    proc = Processor(log_, member, tenants=tenants, config=ProcessorConfig(batch_max=batch))
    return await serve_log(log_, proc.run, proc.stop)
