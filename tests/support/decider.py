"""Given/when/then helpers for the decider tests (in the style of fmodel's decider tests).

A test takes them as the ``gwt`` fixture (``tests/unit/decider/conftest.py``), typed
``GivenWhenThen``:

* ``gwt.given(*events)`` folds events from the initial state (fmodel's *given*);
* ``gwt.when(state, command, now)`` decides one command and returns the ``Decision``;
* ``gwt.story()`` builds a ``Story``: a schedule driven by commands, whose ``given`` steps
  must be accepted (their events become the history) and whose ``when`` step returns the
  decision under test (and applies its events, so a test can chain several whens);
* ``gwt.spec(**overrides)``, ``gwt.T0``, ``gwt.sec(n)``, ``gwt.names(decision)``,
  ``gwt.one(decision, EventType)`` and ``gwt.all(decision, EventType)`` keep tests short.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

from chronolog.commands.aggregate import Decision, TenantContext
from chronolog.commands.decider import decide, evolve, fold
from chronolog.commands.state import ScheduleState, initial_state
from chronolog.domain import messages as m

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday, 09:00 UTC
TENANT = "acme"
SCHEDULE = "s1"
E = TypeVar("E")


def sec(n: float) -> timedelta:
    """``n`` seconds."""
    return timedelta(seconds=n)


def spec(**overrides: Any) -> m.ScheduleSpec:
    """A schedule spec: every minute, job ``report``, overlap allow unless overridden."""
    base: dict[str, Any] = {"every": 60.0, "job": {"type": "report", "params": {"n": 1}},
                            "overlap": "allow"}
    if any(k in overrides for k in ("cron", "at", "delay")):
        base.pop("every")
    base.update(overrides)
    return m.ScheduleSpec.model_validate(base)


def envelope(payload: Any, schedule_id: str = SCHEDULE, principal: str = "alice",
             issued_at: datetime = T0, command_id: str = "c-1") -> m.CommandEnvelope:
    """Wrap a command payload in its envelope."""
    return m.CommandEnvelope(command_id=command_id, type=payload.type, tenant=TENANT,
                             principal=principal, schedule_id=schedule_id,
                             issued_at=issued_at, payload=payload)


def given(*events: Any, schedule_id: str = SCHEDULE) -> ScheduleState:
    """The state after ``events`` (fmodel's *given*: history as events)."""
    return fold(TENANT, schedule_id, list(events))


def when(state: ScheduleState, command: Any, now: datetime,
         tenant: TenantContext | None = None) -> Decision:
    """Decide ``command`` (a payload or an envelope) at ``now``; the state is not changed."""
    env = (command if isinstance(command, m.CommandEnvelope)
           else envelope(command, state.schedule_id))
    if tenant is None:
        return decide(state, env, now)
    return decide(state, env, now, tenant)


def names(decision: Decision) -> list[str]:
    """The event type names of a decision, in order."""
    return [type(e).__name__ for e in decision.events]


def all_of(decision: Decision, kind: type[E]) -> list[E]:
    """Every event of type ``kind`` in a decision."""
    return [e for e in decision.events if isinstance(e, kind)]


def one(decision: Decision, kind: type[E]) -> E:
    """The single event of type ``kind`` in a decision (fails if there are 0 or several)."""
    found = all_of(decision, kind)
    assert len(found) == 1, f"expected one {kind.__name__}, got {names(decision)}"
    return found[0]


@dataclass
class Story:
    """One schedule driven through commands: ``given`` steps build history, ``when`` decides."""

    schedule_id: str = SCHEDULE
    state: ScheduleState = field(init=False)
    history: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = initial_state(TENANT, self.schedule_id)

    def given(self, command: Any, now: datetime, tenant: TenantContext | None = None) -> Decision:
        """A setup step: it must be accepted; its events join the history."""
        decision = when(self.state, command, now, tenant)
        assert decision.ok, f"setup step {command!r} refused: {decision.status} {decision.reason}"
        self._apply(decision)
        return decision

    def given_events(self, *events: Any) -> Story:
        """Append raw events to the history."""
        for e in events:
            self.history.append(e)
            evolve(self.state, e)
        return self

    def when(self, command: Any, now: datetime, tenant: TenantContext | None = None) -> Decision:
        """The step under test: decide and apply (so a test may chain further steps)."""
        decision = when(self.state, command, now, tenant)
        self._apply(decision)
        return decision

    def _apply(self, decision: Decision) -> None:
        for e in decision.events:
            self.history.append(e)
            evolve(self.state, e)

    # -- common setups ----------------------------------------------------------------

    def create(self, now: datetime = T0, **overrides: Any) -> Story:
        self.given(m.CreateSchedule(spec=spec(**overrides), request_key="create-1"), now)
        return self

    def materialize(self, now: datetime) -> list[m.OccurrenceMaterialized]:
        """Tick at ``now``; return the occurrences it materialized."""
        return all_of(self.given(m.Tick(), now), m.OccurrenceMaterialized)

    def claim(self, run_id: str, now: datetime, worker: str = "w1") -> m.AttemptClaimed:
        run = self.state.run(run_id)
        assert run is not None
        d = self.given(m.ClaimRun(run_id=run_id, attempt=run.attempt, worker_id=worker), now)
        return one(d, m.AttemptClaimed)

    def fail(
        self, claimed: m.AttemptClaimed, now: datetime, error_class: str = "transient"
    ) -> Decision:
        return self.given(m.FailRun(run_id=claimed.run_id, attempt=claimed.attempt,
                                    fence=claimed.fence, worker_id=claimed.worker_id,
                                    error_class=error_class, message="boom"), now)

    def dead(self, key: str, now: datetime) -> str:
        """A manual run triggered with request key ``key``, claimed and failed for good: its
        run ID (the run is DEAD)."""
        env = envelope(m.TriggerRun(request_key=key), self.schedule_id, command_id=f"c-{key}")
        run_id: str = self.given(env, now).body["run_id"]
        self.fail(self.claim(run_id, now), now, "permanent")
        return run_id

    def run(self, run_id: str) -> Any:
        r = self.state.run(run_id)
        assert r is not None, f"no run {run_id}"
        return r

    def replayed(self) -> ScheduleState:
        """The fold of the whole history from scratch."""
        return fold(TENANT, self.schedule_id, self.history)


def complete(claimed: m.AttemptClaimed, checksum: str = "sha256:aa", fence: int | None = None,
             worker: str | None = None) -> m.CompleteRun:
    """A CompleteRun for a claimed attempt."""
    return m.CompleteRun(run_id=claimed.run_id, attempt=claimed.attempt,
                         fence=claimed.fence if fence is None else fence,
                         worker_id=worker or claimed.worker_id, checksum=checksum, size=3,
                         inline={"ok": True})


def heartbeat(claimed: m.AttemptClaimed, fence: int | None = None) -> m.Heartbeat:
    """A Heartbeat for a claimed attempt."""
    return m.Heartbeat(run_id=claimed.run_id, attempt=claimed.attempt,
                       fence=claimed.fence if fence is None else fence,
                       worker_id=claimed.worker_id)


class GivenWhenThen:
    """The helpers above under one name, as the ``gwt`` fixture hands them to a test."""

    T0: ClassVar[datetime] = T0
    TENANT: ClassVar[str] = TENANT
    m = m
    TenantContext = TenantContext
    story = Story
    sec = staticmethod(sec)
    spec = staticmethod(spec)
    envelope = staticmethod(envelope)
    given = staticmethod(given)
    when = staticmethod(when)
    names = staticmethod(names)
    one = staticmethod(one)
    all = staticmethod(all_of)
    complete = staticmethod(complete)
    heartbeat = staticmethod(heartbeat)
