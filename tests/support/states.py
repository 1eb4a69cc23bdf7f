"""Comparing aggregate states field by field (snapshot round trips, restores)."""

from __future__ import annotations

from typing import Any

from chronolog.commands.quota import QuotaState
from chronolog.commands.state import QuotaWait, ScheduleState


def every_field(s: ScheduleState) -> tuple[Any, ...]:
    """Everything a schedule state holds, in order (``snapshot()`` sorts the manual keys and
    leaves out the quota wait and the trigger)."""
    quota: Any = s.quota
    if isinstance(quota, QuotaWait):
        quota = (quota.command_id, quota.request_key, quota.spec.model_dump(), quota.reply_to)
    return (s.snapshot(), list((s.manual or {}).items()), quota, s.trigger,
            None if s.policy is None else s.policy.spec.model_dump(),
            [type(r.result) for r in (s.runs or {}).values()],
            None if s.done is None else type(s.done.result))


def quota_fields(q: QuotaState) -> tuple[Any, ...]:
    return (q.tenant, list(q.slots.items()))


def partition_fields(states: dict[str, ScheduleState],
                     quotas: dict[str, QuotaState]) -> dict[str, Any]:
    """key -> every field, for a partition's schedule and quota states."""
    out: dict[str, Any] = {k: every_field(v) for k, v in states.items()}
    out.update({k: quota_fields(v) for k, v in quotas.items()})
    return out
