"""The processor's own commands: a timer's Tick, an assignment's ClaimRun on a worker's
behalf, and the command ID of a record that did not decode (for its ``invalid`` reply)."""

from __future__ import annotations

from datetime import datetime

import orjson

from chronolog.commands.state import QuotaState, ScheduleState
from chronolog.domain import messages as m

__all__ = ["INTERNAL_COMMANDS", "assign_envelope", "sniff_command_id", "tick_envelope"]

# command IDs of the processor's own commands, answered by no reply of their own
INTERNAL_COMMANDS = ("tick:", "assign:", "quota:", "move:", "routing:")


def tick_envelope(st: ScheduleState | QuotaState, command_id: str,
                   now: datetime, resumed: bool = False) -> m.CommandEnvelope:
    return m.CommandEnvelope.model_construct(
        command_id=command_id, type="Tick", tenant=st.tenant, principal="processor",
        schedule_id=st.schedule_id, issued_at=now, reply_to=None,
        payload=m.Tick(resumed=resumed),
    )


def assign_envelope(st: ScheduleState, command_id: str, now: datetime, run_id: str,
                     attempt: int, worker_id: str) -> m.CommandEnvelope:
    return m.CommandEnvelope.model_construct(
        command_id=command_id, type="ClaimRun", tenant=st.tenant, principal="processor",
        schedule_id=st.schedule_id, issued_at=now, reply_to=None,
        payload=m.ClaimRun.model_construct(type="ClaimRun", run_id=run_id, attempt=attempt,
                                           worker_id=worker_id),
    )


def sniff_command_id(value: bytes) -> str | None:
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    cid = raw.get("command_id") if isinstance(raw, dict) else None
    return cid if isinstance(cid, str) and cid else None
