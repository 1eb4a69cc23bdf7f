"""The aggregate protocol: what a partition task needs of every kind of state it decides.

A partition holds three kinds of aggregate, each a pure decider over its own state, its own
commands and its own events:

* a **schedule** (``chronolog.commands.decider``), keyed ``tenant/schedule-id``;
* a tenant's **quota** (``chronolog.commands.quota``), keyed ``tenant/@quota``;
* the partition's **routing view** (``chronolog.commands.routing``), on the routing key.

Each conforms to ``Aggregate[S, C, E]`` — state ``S``, command payloads ``C``, events ``E``
(the unions ``ScheduleEvent``, ``QuotaEvent``, ``RoutingEvent`` of ``domain.messages``, so
mypy checks that every ``evolve`` handles every event of its aggregate and no other):

* ``initial(tenant, schedule_id)`` — the state before the first event;
* ``decide(state, command, now, tenant)`` — a ``Decision``: a status, events, a reply body
  and the commands it sends other aggregates (``Send``), written in the same transaction.
  Rejections are data (a non-``ok`` status), never exceptions;
* ``evolve(state, event)`` — fold one event; never recomputes a value the event carries;
* ``wakeup(state)`` — the earliest instant a ``Tick`` would change something (its timer);
* ``move_out(state, to_partition, version, from_partition)`` — the handover rule: the
  state leaves the partition and an adopt command carries it to its new home (the routing
  view is the partition itself and never moves: it refuses);
* ``accepts(payload)`` / ``owns(event)`` — whether a command payload or an event is one of
  the aggregate's own (its union);
* ``encode(state)`` / ``decode(state, shape, version)`` — the state as an adopt command
  carries it to another partition.

Every decider works on a ``Draft``: a copy of the state that folds each event as it is
emitted, so a command that emits several dependent events sees a consistent state at every
step. A partition's ``PartitionAggregates`` (``chronolog.commands.registry``) map a
command's schedule ID to the aggregate that decides it; the processor builds them for each
partition it owns and gives them to the partition's task.

Pure: no I/O, no clock, no randomness; time enters as ``now``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeGuard, TypeVar

from chronolog.domain import messages as m
from chronolog.domain.limits import (
    DEFAULT_EXECUTION_TIMEOUT_SECONDS,
    MAX_RETRY_ATTEMPTS,
    MIN_INTERVAL_SECONDS,
    MIN_RETRY_BACKOFF_SECONDS,
)

__all__ = [
    "OPEN_TENANT",
    "PROCESSOR",
    "Aggregate",
    "Decision",
    "Draft",
    "Send",
    "TenantContext",
]

PROCESSOR = "processor"  # the principal of the commands processors send themselves

S = TypeVar("S")
C = TypeVar("C", covariant=True)
E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class TenantContext:
    """Tenant policy as seen by the processor: allowed job types, schedule quota, the
    shortest interval a recurring schedule may have (seconds), and the retry bounds: the
    most ``retry.maxAttempts`` a schedule may ask for and the shortest wait before a retry
    (a smaller ``retry.initialBackoff`` is raised to it; the wait is written into the
    ``RetryScheduled`` event as its ``retry_at``)."""

    allowed_jobs: frozenset[str] | None = None  # None: every job type
    max_schedules: int | None = None  # set: creates go through the quota saga
    # the effect destinations the operator granted, name -> kind; None: not checked here
    destinations: Mapping[str, str] | None = None
    min_interval: float = MIN_INTERVAL_SECONDS
    max_attempts: int = MAX_RETRY_ATTEMPTS
    min_backoff: float = MIN_RETRY_BACKOFF_SECONDS
    # the longest an attempt may run (seconds), and per job type (overrides it)
    execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT_SECONDS
    job_timeouts: Mapping[str, float] | None = None
    # the concurrency rule of each job type, for runs whose schedule declares none
    job_concurrency: Mapping[str, m.ConcurrencySpec] | None = None
    # extra wait of a retry scheduled now: the tenant's retries per minute are spent
    retry_delay: float = 0.0
    # a CompleteRun whose result is over the tenant's storage budget (its bytes do not fit
    # the hour's window, decided by the processor): the error class and message the attempt
    # fails with instead of publishing the result (None: the result fits)
    result_refusal: tuple[m.ErrorClass, str] | None = None

    def timeout_for(self, job: m.JobSpec) -> float:
        """An attempt's execution timeout: the tenant's for the job type, or the job's own
        timeout when that is shorter (a job may lower the tenant's, never raise it)."""
        ceiling = (self.job_timeouts or {}).get(job.type, self.execution_timeout)
        return ceiling if job.timeout is None else min(job.timeout, ceiling)

    def allows(self, job_type: str) -> bool:
        return (self.allowed_jobs is None or "*" in self.allowed_jobs
                or job_type in self.allowed_jobs)


OPEN_TENANT = TenantContext()


@dataclass(frozen=True, slots=True)
class Send:
    """A command the processor sends through ``commands`` in the decision's transaction, to
    the aggregate ``schedule_id`` of the same tenant (the quota saga's steps; a moved key's
    adopt command; a handover-done to another partition). ``partition``: the partition it
    is appended to (None: the aggregate's home, as the sender routes it)."""

    schedule_id: str
    command_id: str
    payload: m.Command
    partition: int | None = None


@dataclass(slots=True)
class Decision(Generic[E]):
    """The outcome of one command: a status, a reason, a reply body and the events.

    ``sends``: commands to other aggregates, written with the events. ``answers``: the
    command the reply answers when it is not the decided one (a held create answered by the
    quota saga), and ``answers_client`` the client waiting for it (that command's
    ``reply_to``). ``deferred``: no reply now, the saga answers later.
    """

    status: m.Status = "ok"
    events: list[E] = field(default_factory=list)
    body: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    sends: list[Send] = field(default_factory=list)
    field: str | None = None
    answers: str | None = None
    answers_client: str | None = None
    deferred: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Draft(Generic[S, E]):
    """A scratch copy of a state: ``emit`` appends an event and folds it at once (with the
    aggregate's ``evolve``), ``send`` adds a command to another aggregate. ``state`` must
    already be a copy the caller may change (each aggregate knows how to copy its own)."""

    __slots__ = ("_evolve", "events", "sends", "state")

    def __init__(self, state: S, evolve: Callable[[S, E], S]) -> None:
        self.state = state
        self._evolve = evolve
        self.events: list[E] = []
        self.sends: list[Send] = []

    def emit(self, event: E) -> None:
        self.events.append(event)
        self.state = self._evolve(self.state, event)

    def send(self, send: Send) -> None:
        self.sends.append(send)

    def decision(self, **fields: Any) -> Decision[E]:
        """An ``ok`` decision (unless ``fields`` say otherwise) with the draft's events and
        sends."""
        return Decision(events=self.events, sends=self.sends, **fields)


class Aggregate(Protocol[S, C, E]):
    """What a partition task needs of an aggregate (module docstring)."""

    @property
    def kind(self) -> str:
        """``schedule``, ``quota`` or ``routing``."""
        ...

    def initial(self, tenant: str, schedule_id: str) -> S: ...

    def decide(self, state: S, command: m.CommandEnvelope, now: datetime,
               tenant: TenantContext) -> Decision[E]: ...

    def evolve(self, state: S, event: E) -> S: ...

    def wakeup(self, state: S) -> datetime | None: ...

    def move_out(self, state: S, to_partition: int, version: int,
                 from_partition: int) -> Decision[E]: ...

    def accepts(self, payload: m.Command) -> TypeGuard[C]:
        """Whether the command payload is one this aggregate decides (``decide`` refuses
        the others as data)."""
        ...

    def owns(self, event: m.Event) -> TypeGuard[E]:
        """Whether the event is one of this aggregate's (a fold of the log hands each event
        to the aggregate of its schedule ID; an event of another kind changes nothing)."""
        ...

    def encode(self, state: S) -> tuple[str, str | None]:
        """The state as an adopt command carries it: JSON text and, for a schedule, its
        spec's shape (``chronolog.commands.state_codec``)."""
        ...

    def decode(self, state: str, shape: str | None, version: int) -> S:
        """The state ``encode`` gave (``version``: the codec version it was written in);
        ``StateDecodeError`` for anything else."""
        ...
