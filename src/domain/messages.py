"""The message catalogue: schedule specs, commands, events, envelopes and replies (v1).

Every command and event is a pydantic v2 model with a ``type`` literal; ``Command`` and
``Event`` are discriminated unions on it. Envelopes carry routing and causation:

* ``CommandEnvelope``: command_id, type, tenant, principal, schedule_id, issued_at,
  reply_to, payload;
* ``EventEnvelope``: event_id, type, version, key, tenant, schedule_id, at (authority time),
  causation_id (the command_id), payload.

Every computed value (next_run_at, due_at, retry_at, lease_until, fence) is a field of the
event that carries it, so replay (``evolve``) never recomputes it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from chronolog.domain import limits as lim

# ---------------------------------------------------------------------------------------
# scalar types


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]


def _parse_seconds(value: Any) -> Any:
    if isinstance(value, str):
        from chronolog.domain.durations import parse_duration

        return parse_duration(value)
    return value


def _non_negative(value: float) -> float:
    if value < 0:
        raise ValueError(f"must not be negative, got {value}")
    if not value <= lim.MAX_DURATION_SECONDS:  # NaN fails too
        raise ValueError(f"must be at most {lim.MAX_DURATION_SECONDS} seconds (ten years), "
                         f"got {value:g}")
    return value


Seconds = Annotated[
    float,
    BeforeValidator(_parse_seconds),
    AfterValidator(_non_negative),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": lim.MAX_DURATION_SECONDS},
                {"type": "string", "description": "duration such as 90s, 15m, 2h, 1d"},
            ]
        }
    ),
]

# an instant of a definition: UTC, within the years chronolog computes with
Instant = Annotated[UtcDatetime, AfterValidator(lim.check_instant)]


def _check_params(value: dict[str, Any]) -> dict[str, Any]:
    """A job's params: NUL-free text, bounded depth, 64-bit integers, bounded size."""
    bad = lim.text_violation(value, "", lim.MAX_DEPTH)
    if bad is not None:
        raise ValueError(f"{bad[0]}: {bad[1]}" if bad[0] else bad[1])
    size = len(orjson.dumps(value))
    if size > lim.MAX_PARAMS_BYTES:
        raise ValueError(f"{size} bytes as JSON, at most {lim.MAX_PARAMS_BYTES}")
    return value


Params = Annotated[dict[str, Any], AfterValidator(_check_params)]

Status = Literal["ok", "invalid", "forbidden", "not_found", "conflict", "quota", "stale_fence"]
ErrorClass = Literal["transient", "permanent", "ambiguous"]
RunState = Literal[
    "PENDING",
    "READY",
    "LEASED",
    "RETRY_WAIT",
    "SUCCEEDED",
    "DEAD",
    "RECONCILING",
    "CANCELLED",
    "SKIPPED",
]
TERMINAL_STATES: frozenset[str] = frozenset({"SUCCEEDED", "DEAD", "CANCELLED", "SKIPPED"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------
# schedule specification


class JobSpec(_Model):
    """What a run executes: a registered job type and its parameters."""

    type: str = Field(min_length=1, max_length=200)
    params: Params = Field(default_factory=dict)
    timeout: Seconds | None = None


class MisfireSpec(_Model):
    """What to do with instants missed while paused or down.

    ``skip``: instants later than ``grace`` are skipped (recorded); ``latest``: only the
    most recent missed instant runs; ``all``: every missed instant runs, bounded by
    ``max_catchup`` (the most recent ones) and ``max_age`` — the rest are skipped with a
    reason, and the schedule always continues (no cliff).
    """

    policy: Literal["skip", "latest", "all"] = "latest"
    grace: Seconds = 60.0
    max_catchup: int = Field(default=100, ge=1, le=100_000)
    max_age: Seconds = 86_400.0


def _misfire_from_string(value: Any) -> Any:
    return {"policy": value} if isinstance(value, str) else value


class RetrySpec(_Model):
    """Retry of transient failures: exponential backoff with deterministic jitter."""

    max_attempts: int = Field(default=3, ge=1, le=1000)
    initial_backoff: Seconds = 1.0
    max_backoff: Seconds = 300.0
    multiplier: float = Field(default=2.0, ge=1.0, le=10.0)
    max_age: Seconds = 86_400.0


class DstSpec(_Model):
    """Daylight-saving handling for fixed-time cron jobs (DESIGN §4)."""

    ambiguous: Literal["first", "second", "both"] = "first"
    nonexistent: Literal["shift_forward", "skip"] = "shift_forward"


class EffectSpec(_Model):
    """An external action performed after a result is published, with a stable ID."""

    kind: Literal["webhook", "email", "postgres", "kafka"]
    name: str = Field(default="", max_length=100, pattern=r"^[A-Za-z0-9_.-]*$")
    config: dict[str, Any] = Field(default_factory=dict)

    @property
    def effect_name(self) -> str:
        return self.name or {"email": "send"}.get(self.kind, self.kind)


OverlapPolicy = Literal["allow", "skip", "buffer_one", "buffer_all", "cancel_previous"]


class ScheduleSpec(_Model):
    """A recurring (or one-shot) rule plus the job it runs and its policies."""

    cron: str | None = None
    every: Seconds | None = None
    at: Instant | None = None
    delay: Seconds | None = None
    timezone: str = "UTC"
    anchor: Instant | None = None
    start: Instant | None = None
    end: Instant | None = None
    max_count: int | None = Field(default=None, ge=1, le=lim.MAX_COUNT)
    job: JobSpec
    misfire: Annotated[MisfireSpec, BeforeValidator(_misfire_from_string)] = Field(
        default_factory=MisfireSpec
    )
    overlap: OverlapPolicy = "skip"
    retry: RetrySpec = Field(default_factory=RetrySpec)
    lease: Seconds = 30.0
    start_deadline: Seconds | None = None
    jitter: Seconds = 0.0
    dst: DstSpec = Field(default_factory=DstSpec)
    effects: tuple[EffectSpec, ...] = ()
    resource_class: str = Field(default="default", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    priority: int = Field(default=0, ge=-100, le=100)

    @model_validator(mode="after")
    def _exactly_one_trigger(self) -> "ScheduleSpec":
        given = [n for n in ("cron", "every", "at", "delay") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "exactly one of cron, every, at, delay is required"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.every is not None and self.every <= 0:
            raise ValueError(f"every must be positive, got {self.every}")
        if self.delay is not None and self.delay <= 0:
            raise ValueError(f"delay must be positive, got {self.delay}")
        if self.lease <= 0:
            raise ValueError(f"lease must be positive, got {self.lease}")
        if self.start and self.end and self.end <= self.start:
            raise ValueError("end must be after start")
        names = [e.effect_name for e in self.effects]
        if len(set(names)) != len(names):
            raise ValueError("effect names must be unique within a schedule")
        return self


# ---------------------------------------------------------------------------------------
# commands


class CreateSchedule(_Model):
    type: Literal["CreateSchedule"] = "CreateSchedule"
    spec: ScheduleSpec
    request_key: str | None = None


class ReviseSchedule(_Model):
    type: Literal["ReviseSchedule"] = "ReviseSchedule"
    spec: ScheduleSpec
    expected_revision: int = Field(ge=1, le=lim.MAX_INT)


class PauseSchedule(_Model):
    type: Literal["PauseSchedule"] = "PauseSchedule"
    reason: str = ""


class ResumeSchedule(_Model):
    type: Literal["ResumeSchedule"] = "ResumeSchedule"


class DeleteSchedule(_Model):
    type: Literal["DeleteSchedule"] = "DeleteSchedule"


class TriggerRun(_Model):
    type: Literal["TriggerRun"] = "TriggerRun"
    request_key: str = Field(min_length=1, max_length=200)
    params: Params | None = None


class CancelRun(_Model):
    type: Literal["CancelRun"] = "CancelRun"
    run_id: str
    reason: str = ""


class RedriveRun(_Model):
    type: Literal["RedriveRun"] = "RedriveRun"
    run_id: str


class ResolveReconciliation(_Model):
    type: Literal["ResolveReconciliation"] = "ResolveReconciliation"
    run_id: str
    decision: Literal["delivered", "retry", "abandon"]
    note: str = ""
    effect_id: str | None = None


class ClaimRun(_Model):
    type: Literal["ClaimRun"] = "ClaimRun"
    run_id: str
    attempt: int = Field(ge=1, le=lim.MAX_INT)
    worker_id: str


class Heartbeat(_Model):
    type: Literal["Heartbeat"] = "Heartbeat"
    run_id: str
    attempt: int = Field(ge=1, le=lim.MAX_INT)
    fence: int = Field(ge=1, le=lim.MAX_INT)
    worker_id: str


class CompleteRun(_Model):
    type: Literal["CompleteRun"] = "CompleteRun"
    run_id: str
    attempt: int = Field(ge=1, le=lim.MAX_INT)
    fence: int = Field(ge=1, le=lim.MAX_INT)
    worker_id: str
    checksum: str
    size: int = Field(ge=0, le=lim.MAX_INT)
    uri: str | None = None
    inline: Any = None


class FailRun(_Model):
    type: Literal["FailRun"] = "FailRun"
    run_id: str
    attempt: int = Field(ge=1, le=lim.MAX_INT)
    fence: int = Field(ge=1, le=lim.MAX_INT)
    worker_id: str
    error_class: ErrorClass = "transient"
    message: str = ""


class RecordEffectOutcome(_Model):
    type: Literal["RecordEffectOutcome"] = "RecordEffectOutcome"
    run_id: str
    effect_id: str
    outcome: Literal["succeeded", "failed", "uncertain"]
    evidence: dict[str, Any] = Field(default_factory=dict)


class Tick(_Model):
    """A timer the processor gives itself: act on everything due at ``now``."""

    type: Literal["Tick"] = "Tick"


Command = Annotated[
    Union[
        CreateSchedule,
        ReviseSchedule,
        PauseSchedule,
        ResumeSchedule,
        DeleteSchedule,
        TriggerRun,
        CancelRun,
        RedriveRun,
        ResolveReconciliation,
        ClaimRun,
        Heartbeat,
        CompleteRun,
        FailRun,
        RecordEffectOutcome,
        Tick,
    ],
    Field(discriminator="type"),
]


class CommandEnvelope(_Model):
    command_id: str = Field(min_length=1, max_length=200)
    type: str
    tenant: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    principal: str = ""
    schedule_id: str = Field(min_length=1, max_length=200, pattern=lim.SCHEDULE_ID_PATTERN)
    issued_at: UtcDatetime
    reply_to: str | None = None
    payload: Command

    @model_validator(mode="before")
    @classmethod
    def _clean_text(cls, data: Any) -> Any:
        """No NUL in any text or key, bounded nesting, 64-bit integers — in every field of
        every command (PostgreSQL and the JSON codec refuse them further down)."""
        bad = lim.text_violation(data, "", lim.MAX_DOCUMENT_DEPTH)
        if bad is not None:
            raise ValueError(f"{bad[0]}: {bad[1]}" if bad[0] else bad[1])
        return data

    @model_validator(mode="after")
    def _type_matches_payload(self) -> "CommandEnvelope":
        if self.type != self.payload.type:
            raise ValueError(f"type {self.type!r} does not match payload {self.payload.type!r}")
        return self


# ---------------------------------------------------------------------------------------
# events


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ScheduleCreated(_Event):
    type: Literal["ScheduleCreated"] = "ScheduleCreated"
    revision: int
    spec: ScheduleSpec
    request_key: str | None = None
    created_at: UtcDatetime
    anchor: UtcDatetime
    next_run_at: UtcDatetime | None
    next_due_at: UtcDatetime | None


class ScheduleRevised(_Event):
    type: Literal["ScheduleRevised"] = "ScheduleRevised"
    revision: int
    spec: ScheduleSpec
    anchor: UtcDatetime
    next_run_at: UtcDatetime | None
    next_due_at: UtcDatetime | None


class SchedulePaused(_Event):
    type: Literal["SchedulePaused"] = "SchedulePaused"
    reason: str = ""
    paused_at: UtcDatetime


class ScheduleResumed(_Event):
    type: Literal["ScheduleResumed"] = "ScheduleResumed"
    resumed_at: UtcDatetime
    next_run_at: UtcDatetime | None
    next_due_at: UtcDatetime | None


class ScheduleDeleted(_Event):
    type: Literal["ScheduleDeleted"] = "ScheduleDeleted"


class NextRunPlanned(_Event):
    """The schedule's next instant changed outside materialization (fixed-delay schedules)."""

    type: Literal["NextRunPlanned"] = "NextRunPlanned"
    next_run_at: UtcDatetime | None
    next_due_at: UtcDatetime | None


class OccurrenceMaterialized(_Event):
    type: Literal["OccurrenceMaterialized"] = "OccurrenceMaterialized"
    run_id: str
    scheduled_at: UtcDatetime
    due_at: UtcDatetime
    revision: int
    job: JobSpec
    trigger: Literal["schedule", "manual"] = "schedule"
    request_key: str | None = None
    request_digest: str | None = None  # digest of a manual trigger's params
    state: Literal["PENDING", "READY"]
    start_deadline_at: UtcDatetime | None = None
    resource_class: str = "default"
    priority: int = 0
    sequence: int
    # the schedule's next instant after this one (None: manual trigger leaves it unchanged)
    next_run_at: UtcDatetime | None = None
    next_due_at: UtcDatetime | None = None
    advances_schedule: bool = True


class OccurrenceSkipped(_Event):
    """An instant (or a collapsed range of ``count`` instants) that will not run, and why."""

    type: Literal["OccurrenceSkipped"] = "OccurrenceSkipped"
    run_id: str
    scheduled_at: UtcDatetime
    reason: Literal[
        "misfire",
        "misfire_max_age",
        "misfire_max_catchup",
        "paused",
        "overlap",
        "overlap_buffer_full",
        "start_deadline",
        "dst_nonexistent",
        "superseded",
    ]
    through: UtcDatetime | None = None
    count: int = 1
    materialized: bool = False  # True: an existing PENDING/READY run was skipped
    revision: int = 0
    request_key: str | None = None  # a manual trigger skipped by the overlap policy
    request_digest: str | None = None
    next_run_at: UtcDatetime | None = None
    next_due_at: UtcDatetime | None = None
    advances_schedule: bool = True


class OccurrenceReady(_Event):
    type: Literal["OccurrenceReady"] = "OccurrenceReady"
    run_id: str
    attempt: int
    resource_class: str = "default"
    priority: int = 0


class FenceAdvanced(_Event):
    type: Literal["FenceAdvanced"] = "FenceAdvanced"
    fence: int
    run_id: str
    reason: Literal["claim", "lease_expired", "cancelled", "superseded"]


class AttemptClaimed(_Event):
    type: Literal["AttemptClaimed"] = "AttemptClaimed"
    run_id: str
    attempt: int
    fence: int
    worker_id: str
    claimed_at: UtcDatetime
    lease_until: UtcDatetime


class LeaseExtended(_Event):
    type: Literal["LeaseExtended"] = "LeaseExtended"
    run_id: str
    attempt: int
    fence: int
    lease_until: UtcDatetime


class LeaseExpired(_Event):
    type: Literal["LeaseExpired"] = "LeaseExpired"
    run_id: str
    attempt: int
    fence: int
    lease_until: UtcDatetime


class AttemptFailed(_Event):
    type: Literal["AttemptFailed"] = "AttemptFailed"
    run_id: str
    attempt: int
    fence: int
    worker_id: str
    error_class: ErrorClass
    message: str = ""


class RetryScheduled(_Event):
    type: Literal["RetryScheduled"] = "RetryScheduled"
    run_id: str
    attempt: int  # the attempt that will run next
    retry_at: UtcDatetime


class OccurrenceDeadLettered(_Event):
    type: Literal["OccurrenceDeadLettered"] = "OccurrenceDeadLettered"
    run_id: str
    reason: Literal["max_attempts", "max_age", "permanent_error", "reconciliation_abandoned"]
    message: str = ""


class OccurrenceRedriven(_Event):
    type: Literal["OccurrenceRedriven"] = "OccurrenceRedriven"
    run_id: str
    attempt: int  # the next attempt number (history continues)
    by: str = ""
    # the retry budget's max age counts from here after a redrive (None: from scheduled_at)
    redriven_at: UtcDatetime | None = None


class ResultPublished(_Event):
    type: Literal["ResultPublished"] = "ResultPublished"
    run_id: str
    attempt: int
    fence: int
    worker_id: str
    checksum: str
    size: int
    uri: str | None = None
    inline: Any = None
    finished_at: UtcDatetime


class CompletionRejected(_Event):
    type: Literal["CompletionRejected"] = "CompletionRejected"
    run_id: str
    attempt: int
    fence: int
    current_fence: int
    worker_id: str
    checksum: str
    reason: Literal["stale_fence", "lease_expired", "not_leased", "checksum_conflict"]


class CancellationRequested(_Event):
    type: Literal["CancellationRequested"] = "CancellationRequested"
    run_id: str
    by: str = ""
    reason: str = ""


class OccurrenceCancelled(_Event):
    type: Literal["OccurrenceCancelled"] = "OccurrenceCancelled"
    run_id: str
    by: str = ""
    reason: str = ""


class ReconciliationRequired(_Event):
    type: Literal["ReconciliationRequired"] = "ReconciliationRequired"
    run_id: str
    reason: str
    effect_id: str | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)


class ReconciliationResolved(_Event):
    type: Literal["ReconciliationResolved"] = "ReconciliationResolved"
    run_id: str
    decision: Literal["delivered", "retry", "abandon"]
    by: str = ""
    note: str = ""
    effect_id: str | None = None


class EffectIntended(_Event):
    type: Literal["EffectIntended"] = "EffectIntended"
    effect_id: str
    run_id: str
    kind: Literal["webhook", "email", "postgres", "kafka"]
    config: dict[str, Any] = Field(default_factory=dict)
    checksum: str
    uri: str | None = None
    inline: Any = None
    attempt: int = 1  # the effect's delivery attempt (bumped by a reconciliation retry)


class EffectSucceeded(_Event):
    type: Literal["EffectSucceeded"] = "EffectSucceeded"
    effect_id: str
    run_id: str
    evidence: dict[str, Any] = Field(default_factory=dict)


class EffectUncertain(_Event):
    type: Literal["EffectUncertain"] = "EffectUncertain"
    effect_id: str
    run_id: str
    evidence: dict[str, Any] = Field(default_factory=dict)


class EffectFailed(_Event):
    type: Literal["EffectFailed"] = "EffectFailed"
    effect_id: str
    run_id: str
    evidence: dict[str, Any] = Field(default_factory=dict)


Event = Annotated[
    Union[
        ScheduleCreated,
        ScheduleRevised,
        SchedulePaused,
        ScheduleResumed,
        ScheduleDeleted,
        NextRunPlanned,
        OccurrenceMaterialized,
        OccurrenceSkipped,
        OccurrenceReady,
        AttemptClaimed,
        FenceAdvanced,
        LeaseExtended,
        LeaseExpired,
        AttemptFailed,
        RetryScheduled,
        OccurrenceDeadLettered,
        OccurrenceRedriven,
        ResultPublished,
        CompletionRejected,
        CancellationRequested,
        OccurrenceCancelled,
        ReconciliationRequired,
        ReconciliationResolved,
        EffectIntended,
        EffectSucceeded,
        EffectUncertain,
        EffectFailed,
    ],
    Field(discriminator="type"),
]

EVENT_TYPES: tuple[type[BaseModel], ...] = Event.__origin__.__args__  # type: ignore[attr-defined]
COMMAND_TYPES: tuple[type[BaseModel], ...] = Command.__origin__.__args__  # type: ignore[attr-defined]
CURRENT_VERSION = 1


class EventEnvelope(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: str
    type: str
    version: int = CURRENT_VERSION
    key: str
    tenant: str
    schedule_id: str
    at: UtcDatetime
    causation_id: str | None = None
    payload: Event


# ---------------------------------------------------------------------------------------
# replies


class LogPosition(_Model):
    topic: str
    partition: int
    offset: int


class Reply(BaseModel):
    """The answer to one command, correlated by ``command_id``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    command_id: str
    status: Status
    reason: str = ""
    body: dict[str, Any] = Field(default_factory=dict)
    positions: tuple[LogPosition, ...] = ()
    tenant: str = ""
    schedule_id: str = ""


class DeadLetter(BaseModel):
    """A command that could not be parsed or validated, kept with its original bytes."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    reason: str
    original: str  # the original bytes, base64
    source_partition: int
    source_offset: int
    command_id: str | None = None
