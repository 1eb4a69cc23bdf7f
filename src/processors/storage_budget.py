"""A processor's tenants' storage budgets: where the pure window
(``chronolog.domain.storage_budget``) meets the commands a partition task decides.

* ``result_refusal`` — before a CompleteRun is decided: whether its result fits the tenant's
  hour; if not, the failure the decider records instead of publishing it (transient, its
  retry no sooner than the result would fit; permanent when it is larger than the whole
  budget), handed to the decider as data (``TenantContext.result_refusal``);
* ``within`` — after a schedule's decision: a decision that would write params past the
  budget becomes a ``quota`` refusal naming ``storage_budget`` with ``retry_after``; any
  other decision that writes is counted (its params, the results it published).

In memory, per processor: the budget holds per node over the partitions it owns (after a
restart or a partition move the new owner's window starts empty; docs/design.md §9,
"Storage budget").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from chronolog.commands.aggregate import Decision
from chronolog.commands.decider import ScheduleDecision
from chronolog.domain import messages as m
from chronolog.domain.storage_budget import (
    SETTING,
    StorageBudgets,
    params_bytes,
    refusal_reason,
    result_bytes,
    retry_after,
)

__all__ = ["StorageGate"]


@dataclass
class StorageGate:
    """The tenants' windows of one processor; ``budget`` (None: no budget) is the tenant's
    ``storage_budget``, looked up by the caller."""

    windows: StorageBudgets = field(default_factory=StorageBudgets)

    def result_refusal(self, budget: int | None, env: m.CommandEnvelope, now: datetime
                       ) -> tuple[tuple[m.ErrorClass, str] | None, float]:
        """How a CompleteRun's attempt fails when its result does not fit this hour, and the
        seconds its retry must wait at least; ``(None, 0)``: it fits, or not a CompleteRun."""
        p = env.payload
        if budget is None or not isinstance(p, m.CompleteRun):
            return None, 0.0
        size = result_bytes(p.size, p.inline)
        wait = self.windows.wait(env.tenant, size, budget, now.timestamp())
        if wait is None:
            return None, 0.0
        reason = refusal_reason(env.tenant, "the result", size, budget, wait)
        if math.isinf(wait):
            return ("permanent", reason), 0.0
        return ("transient", reason), float(retry_after(wait))

    def within(self, budget: int | None, env: m.CommandEnvelope, now: datetime,
               dec: ScheduleDecision) -> ScheduleDecision:
        """``dec``, its params and results counted; or, when it would write params that do
        not fit this hour, a ``quota`` refusal naming the budget with the seconds until they
        would (``retry_after``). Only a decision that writes is refused: a repeated command
        answered from its state writes nothing."""
        if budget is None or not dec.ok or not dec.events:
            return dec
        now_s = now.timestamp()
        size = params_bytes(env.payload)
        if size:
            wait = self.windows.wait(env.tenant, size, budget, now_s)
            if wait is not None:
                what = f"the params of {env.payload.type}"
                return Decision(status="quota", field=SETTING,
                                reason=refusal_reason(env.tenant, what, size, budget, wait),
                                body={"retry_after": retry_after(wait)})
        size += sum(result_bytes(ev.size, ev.inline) for ev in dec.events
                    if isinstance(ev, m.ResultPublished))
        if size:
            self.windows.take(env.tenant, size, now_s)
        return dec
