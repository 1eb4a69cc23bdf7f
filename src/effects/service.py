"""An effect runner as a process: served until SIGTERM/SIGINT (it finishes the intents at
hand, or leaves waiting ones unrecorded), waiting through a log outage, its readiness written
to a file when one is named (``chronolog.readiness``): ready while its consumer is in the
effects group with every assigned partition folded and the log answers."""

from __future__ import annotations

from typing import Any

from chronolog.effects.runner import EffectRunner
from chronolog.lifecycle import serve_log
from chronolog.readiness import Readiness, log_reachable, probing


async def run_effects(log_: Any, member: str, database_url: str | None,
                      result_store: Any | None, tenants: Any = None,
                      ready_file: str | None = None) -> int:
    runner = EffectRunner(log_, member, database_url=database_url, result_store=result_store,
                          tenants=tenants)

    async def probe() -> tuple[bool, str]:
        ready, reason = runner.readiness()
        away = await log_reachable(log_) if ready else None
        return (False, away) if away else (ready, reason)

    async with probing(Readiness("effects", ready_file), probe):
        return await serve_log(log_, runner.run, runner.stop, "effects")
