"""A schedule driven through the real decider, recorded as event envelopes (test helper).

The log files that the audit and replay CLI tests write are built from these envelopes, so
they hold exactly what a processor would have committed for those commands.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from chronolog.commands.decider import decide, evolve
from chronolog.commands.state import initial_state
from chronolog.domain import messages as m


class ScheduleLog:
    """Decide commands for one schedule; keep the state and the envelopes of its events."""

    def __init__(self, tenant: str, schedule_id: str) -> None:
        self.tenant = tenant
        self.schedule_id = schedule_id
        self.state = initial_state(tenant, schedule_id)
        self.envelopes: list[m.EventEnvelope] = []
        self._n = 0

    def do(self, payload: Any, now: datetime) -> list[Any]:
        """Decide ``payload`` at ``now`` (it must be accepted); return its events."""
        self._n += 1
        cid = f"{self.schedule_id}-c{self._n}"
        dec = decide(self.state, m.CommandEnvelope(
            command_id=cid, type=payload.type, tenant=self.tenant,
            schedule_id=self.schedule_id, issued_at=now, payload=payload), now)
        assert dec.ok, dec.reason
        for i, ev in enumerate(dec.events):
            evolve(self.state, ev)
            self.envelopes.append(m.EventEnvelope(
                event_id=f"{cid}.{i}", type=ev.type, key=f"{self.tenant}/{self.schedule_id}",
                tenant=self.tenant, schedule_id=self.schedule_id, at=now, causation_id=cid,
                payload=ev))
        return list(dec.events)

    def claim(self, run_id: str, now: datetime, worker: str = "w1") -> m.AttemptClaimed:
        """Claim a READY run; return the AttemptClaimed event."""
        run = self.state.run(run_id)
        assert run is not None
        evs = self.do(m.ClaimRun(run_id=run_id, attempt=run.attempt, worker_id=worker), now)
        return next(e for e in evs if isinstance(e, m.AttemptClaimed))

    def materialized(self, events: list[Any]) -> str:
        """The run ID of the first occurrence materialized among ``events``."""
        return next(e for e in events if isinstance(e, m.OccurrenceMaterialized)).run_id
