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

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from chronolog.domain import limits as lim
from chronolog.domain.calendars import MAX_EXCLUDE, CalendarName, CalendarSpec
from chronolog.domain.durations import parse_duration

# ---------------------------------------------------------------------------------------
# scalar types


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]


def _parse_seconds(value: Any) -> Any:
    if isinstance(value, str):
        return parse_duration(value)
    return value


def _stored(info: ValidationInfo) -> bool:
    """Validating a record already in the log or the read model (``context=STORED``): the
    input limits are for new input; what the log holds must always decode."""
    return bool(info.context and info.context.get("stored"))


def _non_negative(value: float, info: ValidationInfo) -> float:
    if value < 0:
        raise ValueError(f"must not be negative, got {value}")
    if _stored(info):
        return value
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
def _check_instant(value: datetime, info: ValidationInfo) -> datetime:
    return value if _stored(info) else lim.check_instant(value)


Instant = Annotated[UtcDatetime, AfterValidator(_check_instant)]


def _check_params(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    """A job's params: NUL-free text, bounded depth, 64-bit integers, bounded size."""
    if _stored(info):
        return value
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


# defer_build: a model's validator is built when it is first used, not at import: a command
# line invocation uses a few of these models, and building all of them took about a tenth of
# its start-up (every `chronolog` process imports this module)
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


# ---------------------------------------------------------------------------------------
# schedule specification


class JobSpec(_Model):
    """What a run executes: a registered job type and its parameters."""

    type: str = Field(min_length=1, max_length=200)
    params: Params = Field(default_factory=dict)
    timeout: Seconds | None = None


class MisfireSpec(_Model):
    """What to do with instants missed while paused or down.

    One late instant: on time within ``grace``; later, ``skip`` skips it, ``latest`` and
    ``all`` run it (within ``max_age``). Several due at once (a backlog), whatever the grace:
    ``latest`` runs only the newest (the older are skipped as ``coalesced``); ``skip`` only
    the newest, if within ``grace``; ``all`` every one, in order, bounded by ``max_catchup``
    (the most recent ones) and ``max_age``. Skips are recorded with a reason, and the
    schedule always continues (no cliff).
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
    """Daylight-saving handling for fixed-time cron jobs (docs/design.md §4)."""

    ambiguous: Literal["first", "second", "both"] = "first"
    nonexistent: Literal["shift_forward", "skip"] = "shift_forward"


# Headers a tenant may never set on a webhook effect: routing (Host, Forwarded, X-Forwarded-*),
# hop-by-hop and framing headers, and the ones the adapter or the operator own.
DENIED_EFFECT_HEADERS = frozenset({
    "host", "connection", "keep-alive", "proxy-authorization", "proxy-authenticate",
    "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "content-length",
    "content-type", "content-encoding", "expect", "forwarded", "via", "x-real-ip",
    "idempotency-key", "authorization", "cookie", "metadata-flavor", "x-aws-ec2-metadata-token",
})
# the headers of a signed webhook delivery (Standard Webhooks): the adapter's own on every
# try. A new definition may not set them (one stored before this rule decodes as it was; the
# adapter replaces them when it sends)
WEBHOOK_SIGNATURE_HEADERS = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature"})
MAX_EFFECT_HEADERS = 16
_HEADER_NAME = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$"
_HEADER_VALUE = r"^[\x20-\x7e]{0,512}$"
MAX_EFFECT_GIVE_UP = 7 * 86_400.0
STORED = {"stored": True}  # validation context of records already in the log or read model
# validation context of a command whose JSON text passed ``limits.plainly_clean_json``
TEXT_CHECKED = {"text_checked": True}


def effect_header_denied(name: str) -> bool:
    """A header a tenant may not choose (routing, hop-by-hop, framing or owned by others)."""
    low = name.lower()
    return low in DENIED_EFFECT_HEADERS or low.startswith(("x-forwarded-", "proxy-"))


EffectHeaderName = Annotated[str, Field(pattern=_HEADER_NAME)]
EffectHeaderValue = Annotated[str, Field(pattern=_HEADER_VALUE)]


class EffectSpec(_Model):
    """An external action performed after a result is published, with a stable ID.

    ``destination`` names a destination the operator granted to the tenant (the tenants
    file); where it points and how it is reached are the operator's. A tenant chooses only
    ``headers`` (webhook; never Host, hop-by-hop or routing headers), ``subject`` (email)
    and ``give_up_after`` (capped by the destination's own).
    """

    kind: Literal["webhook", "email", "postgres", "kafka"]
    name: str = Field(default="", max_length=100, pattern=r"^[A-Za-z0-9_.-]*$")
    destination: str = Field(min_length=1, max_length=100, pattern=lim.NAME_PATTERN)
    headers: dict[EffectHeaderName, EffectHeaderValue] = Field(
        default_factory=dict, max_length=MAX_EFFECT_HEADERS)
    subject: str | None = Field(default=None, max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")
    give_up_after: Seconds | None = None

    @model_validator(mode="before")
    @classmethod
    def _stored_before_destinations(cls, value: Any, info: ValidationInfo) -> Any:
        """A stored effect written before destinations existed (``{kind, name, config}``)
        still decodes: it names the destination of its effect name and its ``config`` (a
        target the tenant wrote) is dropped — it reaches nothing unless the operator grants
        that tenant a destination of that name. Only for records already stored
        (``context=STORED``); a new spec with ``config`` is invalid."""
        if (isinstance(value, dict) and "config" in value and "destination" not in value
                and info.context and info.context.get("stored")):
            kind = value.get("kind")
            name = value.get("name") or {"email": "send"}.get(str(kind), kind)
            value = {k: v for k, v in value.items() if k != "config"}
            value["destination"] = name
        return value

    @model_validator(mode="after")
    def _options_fit_the_kind(self, info: ValidationInfo) -> EffectSpec:
        stored = bool(info.context and info.context.get("stored"))
        denied = sorted(h for h in self.headers if effect_header_denied(h) or (
            not stored and h.lower() in WEBHOOK_SIGNATURE_HEADERS))
        if denied:
            raise ValueError(f"effect header '{denied[0]}' may not be set by a schedule")
        if self.headers and self.kind != "webhook":
            raise ValueError("effect headers apply to webhook effects only")
        if self.subject is not None and self.kind != "email":
            raise ValueError("effect subject applies to email effects only")
        if self.give_up_after is not None and not 0 < self.give_up_after <= MAX_EFFECT_GIVE_UP:
            raise ValueError(f"effect give_up_after must be in (0, {MAX_EFFECT_GIVE_UP:g}] "
                             f"seconds, got {self.give_up_after}")
        return self

    @property
    def effect_name(self) -> str:
        return self.name or {"email": "send"}.get(self.kind, self.kind)

    def options(self) -> dict[str, Any]:
        """The tenant-chosen options carried by the EffectIntended event."""
        out: dict[str, Any] = {}
        if self.headers:
            out["headers"] = dict(self.headers)
        if self.subject is not None:
            out["subject"] = self.subject
        if self.give_up_after is not None:
            out["give_up_after"] = self.give_up_after
        return out


OverlapPolicy = Literal["allow", "skip", "buffer_one", "buffer_all", "cancel_previous"]

# a concurrency key's template: text with ``{param}`` placeholders naming the job's params
KEY_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.-]{1,100})\}")


class ConcurrencySpec(_Model):
    """At most ``limit`` runs with the same key are LEASED at once, across every worker and
    partition of the tenant (``chronolog.commands.permits``). ``key`` is a constant or a
    template over the job's params: ``"customer-{customer_id}"``."""

    key: str = Field(min_length=1, max_length=200)
    limit: int = Field(ge=1, le=100_000)

    @field_validator("key")
    @classmethod
    def _template(cls, v: str) -> str:
        rest = KEY_PLACEHOLDER.sub("", v)
        if "{" in rest or "}" in rest:
            raise ValueError("a brace outside a {param} placeholder")
        if not rest.isprintable():
            raise ValueError("a control character in the key")
        return v

    def placeholders(self) -> list[str]:
        """The job params the key names, in order."""
        return KEY_PLACEHOLDER.findall(self.key)

    def render(self, params: dict[str, Any]) -> str:
        """The key of a run with ``params`` (a string param as it is, any other as JSON)."""
        def value(match: re.Match[str]) -> str:
            v = params.get(match.group(1))
            return v if isinstance(v, str) else orjson.dumps(v).decode()
        return KEY_PLACEHOLDER.sub(value, self.key)


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
    resource_class: str = Field(default="default", pattern=lim.RESOURCE_CLASS_PATTERN)
    priority: int = Field(default=0, ge=-100, le=100)
    concurrency: ConcurrencySpec | None = None
    # the tenant's calendars whose exclusions the schedule's instants skip (in this order:
    # the first that excludes an instant is named in its skip)
    exclude: tuple[CalendarName, ...] = Field(default=(), max_length=MAX_EXCLUDE)
    # free-form key/value pairs the scheduler never acts on, for the tools that manage the
    # schedule (``chronolog apply`` records the set it applied the schedule from in
    # ``chronolog.dev/applied-by``)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > lim.MAX_LABELS:
            raise ValueError(f"{len(v)} labels, at most {lim.MAX_LABELS}")
        for key, value in v.items():
            if not re.fullmatch(lim.LABEL_KEY_PATTERN, key):
                raise ValueError(f"label key '{key[:80]}': "
                                 f"{lim.PATTERN_WORDS[lim.LABEL_KEY_PATTERN]}")
            if len(value) > lim.MAX_LABEL_VALUE:
                raise ValueError(f"label '{key}': a value of at most {lim.MAX_LABEL_VALUE} "
                                 f"characters")
            if not value.isprintable():
                raise ValueError(f"label '{key}': a value of printable characters only (no "
                                 f"control characters or line breaks)")
        return v

    @field_validator("exclude")
    @classmethod
    def _each_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        seen = [n for i, n in enumerate(v) if n in v[:i]]
        if seen:
            raise ValueError(f"calendar '{seen[0]}' is named twice")
        return v

    @field_validator("resource_class")
    @classmethod
    def _not_a_pool_topic(cls, v: str) -> str:
        if v.lower().startswith("pool-"):  # ready.pool-<pool>.<class> carries pools' runs
            raise ValueError("a resource class may not start with 'pool-'")
        return v

    @model_validator(mode="after")
    def _exactly_one_trigger(self) -> ScheduleSpec:
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

    @model_validator(mode="after")
    def _key_names_params(self, info: ValidationInfo) -> ScheduleSpec:
        """A new definition's key names params its job has (a stored spec is not checked
        again: a snapshot stores specs without their params)."""
        if self.concurrency is not None and not (info.context and info.context.get("stored")):
            missing = [n for n in self.concurrency.placeholders() if n not in self.job.params]
            if missing:
                names = ", ".join(f"{{{n}}}" for n in missing)
                raise ValueError(f"concurrency.key uses {names}, but job.params has no "
                                 f"{' and no '.join(missing)}")
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


class BackfillSchedule(_Model):
    """Run every instant of the schedule's rule in [``start``, ``end``) that the schedule
    has not accounted for itself, each as its own run (``trigger: backfill``); idempotent by
    ``request_key`` and by instant (``decider._backfill``). ``overlap``: ``buffer_all``, its
    runs one after another; ``allow``, side by side."""

    type: Literal["BackfillSchedule"] = "BackfillSchedule"
    request_key: str = Field(min_length=1, max_length=200)
    start: Instant
    end: Instant
    overlap: Literal["buffer_all", "allow"] = "buffer_all"


class CancelRun(_Model):
    type: Literal["CancelRun"] = "CancelRun"
    run_id: str
    reason: str = ""
    # the run's instant as the sender read it (the read model): lets the decider tell a
    # finished run it no longer holds from a run ID it never had
    scheduled_at: datetime | None = None


class RedriveRun(_Model):
    type: Literal["RedriveRun"] = "RedriveRun"
    run_id: str
    scheduled_at: datetime | None = None  # as CancelRun's


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
    # why, when the worker knows: "timeout" (the execution timeout elapsed)
    reason: Literal["timeout"] | None = None


class RecordEffectOutcome(_Model):
    type: Literal["RecordEffectOutcome"] = "RecordEffectOutcome"
    run_id: str
    effect_id: str
    outcome: Literal["succeeded", "failed", "uncertain"]
    evidence: dict[str, Any] = Field(default_factory=dict)


# The tenant quota saga (see docs/design.md, "Tenant quota"): commands the processors send
# each other through ``commands``, in the transaction of the decision that emits them. The
# first three go to the tenant's quota aggregate (schedule ID ``QUOTA_ID``), the answer goes
# back to the schedule. Only the processor (principal ``processor``) may send them.


class ReserveQuotaSlot(_Model):
    """Hold one of the tenant's schedule slots for ``schedule_id`` while it is created."""

    type: Literal["ReserveQuotaSlot"] = "ReserveQuotaSlot"
    schedule_id: str
    create_command_id: str


class ConfirmQuotaSlot(_Model):
    """The schedule reserved under ``create_command_id`` was created: its slot is taken."""

    type: Literal["ConfirmQuotaSlot"] = "ConfirmQuotaSlot"
    schedule_id: str
    create_command_id: str


class ReleaseQuotaSlot(_Model):
    """Give back the slot (reserved or taken) held under ``create_command_id``."""

    type: Literal["ReleaseQuotaSlot"] = "ReleaseQuotaSlot"
    schedule_id: str
    create_command_id: str
    reason: str


class AnswerQuotaSlot(_Model):
    """The quota aggregate's answer to a reservation, sent to the schedule being created."""

    type: Literal["AnswerQuotaSlot"] = "AnswerQuotaSlot"
    create_command_id: str
    granted: bool
    expires_at: UtcDatetime | None = None  # a granted reservation's end
    reason: str = ""


# Concurrency permits (``chronolog.commands.permits``): a run with a concurrency key asks the
# key's aggregate (schedule ID ``limit_id(key)``) for a permit when it becomes READY and gives
# it back when it stops being READY or LEASED; the grant goes back to the run's schedule.
# Only the processor (principal ``processor``) may send them.


class _PermitRequest(_Model):
    """One request of run ``run_id`` of ``schedule_id`` for a permit of ``key``, named
    ``ask`` (a run asks again after each time it gave its permit back)."""

    key: str
    run_id: str
    schedule_id: str
    ask: str


class AcquirePermit(_PermitRequest):
    """Ask for one of ``limit`` permits of the key."""

    type: Literal["AcquirePermit"] = "AcquirePermit"
    limit: int = Field(ge=1, le=100_000)


class ReleasePermit(_PermitRequest):
    """Give back the permit (or withdraw the request) named ``ask``."""

    type: Literal["ReleasePermit"] = "ReleasePermit"


class GrantPermit(_Model):
    """The key's aggregate granted request ``ask`` of run ``run_id``: it may be leased."""

    type: Literal["GrantPermit"] = "GrantPermit"
    key: str
    run_id: str
    ask: str


# Calendars (``chronolog.commands.calendars``): a tenant's calendar is an aggregate of its own
# (schedule ID ``calendar_id(name)``), revised by people and tools; the schedules that name it
# subscribe (only the processor sends those) and hold a copy of each revision.


class PutCalendar(_Model):
    """Create calendar ``name`` (``expected_revision`` None: it must not exist, unless it
    holds this very spec already) or revise it (``expected_revision``: its current one)."""

    type: Literal["PutCalendar"] = "PutCalendar"
    name: CalendarName
    spec: CalendarSpec
    expected_revision: int | None = Field(default=None, ge=1, le=lim.MAX_INT)


class DeleteCalendar(_Model):
    """Delete calendar ``name`` (at ``expected_revision`` when given); refused while a
    schedule names it."""

    type: Literal["DeleteCalendar"] = "DeleteCalendar"
    name: CalendarName
    expected_revision: int | None = Field(default=None, ge=1, le=lim.MAX_INT)


class SubscribeCalendar(_Model):
    """Schedule ``schedule_id`` names the calendar: send it each revision, this one first."""

    type: Literal["SubscribeCalendar"] = "SubscribeCalendar"
    name: CalendarName
    schedule_id: str


class UnsubscribeCalendar(_Model):
    """Schedule ``schedule_id`` no longer names the calendar (revised, completed, deleted)."""

    type: Literal["UnsubscribeCalendar"] = "UnsubscribeCalendar"
    name: CalendarName
    schedule_id: str


class CopyCalendar(_Model):
    """A calendar's revision, sent to a schedule that names it (``spec`` None: the calendar
    does not exist at this revision — never put, or deleted)."""

    type: Literal["CopyCalendar"] = "CopyCalendar"
    name: CalendarName
    revision: int = Field(ge=0, le=lim.MAX_INT)
    spec: CalendarSpec | None = None


# Changing the partition count (docs/design.md §18): commands the partition owners send each
# other through ``commands``, in the transaction of the decision that emits them, to an
# explicit partition. Only the processor (principal ``processor``) may send them.


class AdoptKey(_Model):
    """Take over a key moved out of ``from_partition`` by its handover to routing version
    ``version``: ``state`` is its whole state as the state codec encodes it (JSON text of
    ``state_version``), ``shape`` its spec shape (None: a state without a spec)."""

    type: Literal["AdoptKey"] = "AdoptKey"
    kind: Literal["schedule", "quota"] = "schedule"
    state: str
    shape: str | None = None
    state_version: int = Field(ge=1, le=lim.MAX_INT)
    from_partition: int = Field(ge=0, le=lim.MAX_INT)
    version: int = Field(ge=1, le=lim.MAX_INT)


class BeginHandover(_Model):
    """Routing version ``to_version`` is under way (``partitions``: the partition count of
    every version, oldest first). A partition serving the version before hands its keys
    over; one that no earlier version had learns the version it serves from the start."""

    type: Literal["BeginHandover"] = "BeginHandover"
    partitions: tuple[int, ...] = Field(min_length=2)
    to_version: int = Field(ge=2, le=lim.MAX_INT)


class HandoverDone(_Model):
    """Partition ``sender`` handed over to ``version``: every key it moved to the receiving
    partition is ahead of this command there (and so is nothing it forwards after it)."""

    type: Literal["HandoverDone"] = "HandoverDone"
    version: int = Field(ge=2, le=lim.MAX_INT)
    sender: int = Field(ge=0, le=lim.MAX_INT)
    # the routing versions' partition counts, as ``BeginHandover`` carries them: a partition
    # the version adds learns it from the first handover-done it reads
    partitions: tuple[int, ...] = ()


class Tick(_Model):
    """A timer the processor gives itself: act on everything due at ``now``. ``resumed``:
    the schedule's first, due already when the processor took its partition over."""

    type: Literal["Tick"] = "Tick"
    # taken over: a start, a restart, a failover, a rebalance, a restore from a snapshot.
    # What is due then became due while no processor decided the schedule — a gap, not a
    # busy worker pool (``backlog.Backlog.coalesces_unstarted``). Ticks are never written to
    # the log (one read from ``commands`` is dead-lettered); one without the field decodes
    # as not resumed.
    resumed: bool = False


# the commands of each aggregate (``chronolog.commands.aggregate``): a schedule's, a tenant
# quota's and a partition routing view's. ``Tick`` is the processor's own timer; ``AdoptKey``
# installs a moved key (a schedule or a quota).
ScheduleCommand = (
    CreateSchedule
    | ReviseSchedule
    | PauseSchedule
    | ResumeSchedule
    | DeleteSchedule
    | TriggerRun
    | BackfillSchedule
    | CancelRun
    | RedriveRun
    | ResolveReconciliation
    | ClaimRun
    | Heartbeat
    | CompleteRun
    | FailRun
    | RecordEffectOutcome
    | AnswerQuotaSlot
    | GrantPermit
    | CopyCalendar
    | AdoptKey
    | Tick
)
QuotaCommand = (ReserveQuotaSlot | ConfirmQuotaSlot | ReleaseQuotaSlot | AcquirePermit
                | ReleasePermit | PutCalendar | DeleteCalendar | SubscribeCalendar
                | UnsubscribeCalendar | AdoptKey | Tick)
RoutingCommand = BeginHandover | HandoverDone

Command = Annotated[ScheduleCommand | QuotaCommand | RoutingCommand, Field(discriminator="type")]


class CommandEnvelope(_Model):
    """A command to one aggregate. Members at their default may be left out (chronolog writes
    them so); a payload without ``type`` has the envelope's."""

    command_id: str = Field(min_length=1, max_length=200)
    type: str
    tenant: str = Field(min_length=1, max_length=100, pattern=lim.NAME_PATTERN)
    principal: str = ""
    schedule_id: str = Field(min_length=1, max_length=200, pattern=lim.SCHEDULE_ID_PATTERN)
    issued_at: UtcDatetime
    reply_to: str | None = None
    payload: Command

    @model_validator(mode="before")
    @classmethod
    def _clean_text(cls, data: Any, info: ValidationInfo) -> Any:
        """No NUL in any text or key, bounded nesting, 64-bit integers — in every field of
        every command (PostgreSQL and the JSON codec refuse them further down). Skipped for
        JSON text already found plainly clean (``context=TEXT_CHECKED``, ``decode_command``)."""
        if info.context and info.context.get("text_checked"):
            return data
        bad = lim.text_violation(data, "", lim.MAX_DOCUMENT_DEPTH)
        if bad is not None:
            raise ValueError(f"{bad[0]}: {bad[1]}" if bad[0] else bad[1])
        return data

    @model_validator(mode="before")
    @classmethod
    def _payload_type_from_envelope(cls, data: Any) -> Any:
        """A payload written without its ``type`` (the compact encoding leaves out members
        at their default, and a payload's ``type`` is the envelope's) takes the envelope's."""
        if isinstance(data, dict):
            payload = data.get("payload")
            if isinstance(payload, dict) and "type" not in payload and isinstance(
                    data.get("type"), str):
                return {**data, "payload": {**payload, "type": data["type"]}}
        return data

    @model_validator(mode="after")
    def _type_matches_payload(self) -> CommandEnvelope:
        if self.type != self.payload.type:
            raise ValueError(f"type {self.type!r} does not match payload {self.payload.type!r}")
        return self


# ---------------------------------------------------------------------------------------
# events


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


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


class ScheduleCompleted(_Event):
    """The schedule has no further instant and has ended (terminal): a one-shot's instant was
    handled (``at``), its rule has no instant left before ``end`` (``end``), or it had
    ``max_count`` runs (``max_count``). It leaves the tenant's quota; its runs stay and those
    still going finish."""

    type: Literal["ScheduleCompleted"] = "ScheduleCompleted"
    reason: Literal["at", "end", "max_count"]
    completed_at: UtcDatetime
    last_scheduled_at: UtcDatetime | None = None  # its last instant (run or skipped)
    count: int = 0  # the runs it had


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
    trigger: Literal["schedule", "manual", "backfill"] = "schedule"
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
    # a backfill's run that goes one at a time: the concurrency key and limit it asks a
    # permit of (``chronolog.commands.permits``)
    permit_key: str | None = None
    permit_limit: int | None = None


class BackfillRequested(_Event):
    """A backfill of [``start``, ``end``): its ``instants``, of which ``runs`` became runs
    (their OccurrenceMaterialized follow), ``accounted`` were the schedule's own,
    ``backfilled`` ran in an earlier backfill and ``excluded`` a calendar excludes."""

    type: Literal["BackfillRequested"] = "BackfillRequested"
    request_key: str
    digest: str
    start: UtcDatetime
    end: UtcDatetime
    overlap: str
    instants: int
    runs: int
    accounted: int
    backfilled: int
    excluded: int = 0  # excluded by a calendar the schedule names (not run)


class OccurrenceSkipped(_Event):
    """An instant (or a collapsed range of ``count`` instants) that will not run, and why."""

    type: Literal["OccurrenceSkipped"] = "OccurrenceSkipped"
    run_id: str
    scheduled_at: UtcDatetime
    reason: Literal[
        "misfire",
        "misfire_max_age",
        "misfire_max_catchup",
        "coalesced",
        "paused",
        "overlap",
        "overlap_buffer_full",
        "start_deadline",
        "dst_nonexistent",
        "superseded",
        "excluded",
    ]
    through: UtcDatetime | None = None
    count: int = 1
    materialized: bool = False  # True: an existing PENDING/READY run was skipped
    revision: int = 0
    request_key: str | None = None  # a manual trigger skipped by the overlap policy
    request_digest: str | None = None
    next_run_at: UtcDatetime | None = None
    next_due_at: UtcDatetime | None = None
    # ``excluded``: the calendar that excludes the instant, the revision of it the schedule
    # held, and its entry that does (``domain.calendars.excluded_by``)
    calendar: str | None = None
    calendar_revision: int | None = None
    excluded_by: str | None = None
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
    # the attempt's execution timeout (seconds): the job's own, at most the tenant's; the
    # worker cancels the handler when it elapses (None: an event written before it existed)
    timeout: float | None = None


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
    reason: Literal["timeout"] | None = None  # FailRun's


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
    destination: str = ""  # the operator-granted destination, by name
    config: dict[str, Any] = Field(default_factory=dict)  # the tenant's options only
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


# the tenant quota saga, on the schedule's key: a create waiting for a slot, and its end when
# the answer is no (the yes is the ordinary ScheduleCreated)


class ScheduleCreationHeld(_Event):
    """A create of a tenant with a quota passed every other check; it waits for a slot."""

    type: Literal["ScheduleCreationHeld"] = "ScheduleCreationHeld"
    command_id: str
    request_key: str | None = None
    spec: ScheduleSpec
    reply_to: str | None = None  # the client waiting for the answer (the create's reply_to)


class ScheduleCreationRefused(_Event):
    """A held create was answered: no slot, or it no longer passed its checks."""

    type: Literal["ScheduleCreationRefused"] = "ScheduleCreationRefused"
    command_id: str
    status: Status
    reason: str
    release: bool  # a slot had been reserved for it and is given back


# the tenant quota saga, on the tenant's quota key: slots reserved, taken and given back;
# every count and limit is written into the event


class QuotaSlotReserved(_Event):
    type: Literal["QuotaSlotReserved"] = "QuotaSlotReserved"
    schedule_id: str
    create_command_id: str
    max_schedules: int | None
    expires_at: UtcDatetime


class QuotaSlotRefused(_Event):
    type: Literal["QuotaSlotRefused"] = "QuotaSlotRefused"
    schedule_id: str
    create_command_id: str
    max_schedules: int | None
    taken: int
    reserved: int
    reason: str


class QuotaSlotConfirmed(_Event):
    type: Literal["QuotaSlotConfirmed"] = "QuotaSlotConfirmed"
    schedule_id: str
    create_command_id: str
    late: bool = False  # its reservation had expired before the schedule was created


class QuotaSlotReleased(_Event):
    type: Literal["QuotaSlotReleased"] = "QuotaSlotReleased"
    schedule_id: str
    create_command_id: str
    reason: str  # rejected | expired | the event that ended the schedule (ScheduleDeleted, ...)
    released_at: UtcDatetime


# concurrency permits: on a concurrency key's aggregate, each request granted, queued or
# ended (``holders``: the permits held after the event, written in, as is the limit) ...


class _PermitStep(_Event):
    key: str
    run_id: str
    schedule_id: str
    ask: str
    holders: int


class PermitGranted(_PermitStep):
    type: Literal["PermitGranted"] = "PermitGranted"
    limit: int


class PermitQueued(_PermitStep):
    type: Literal["PermitQueued"] = "PermitQueued"
    limit: int
    position: int  # 1: next in line


class PermitReleased(_PermitStep):
    type: Literal["PermitReleased"] = "PermitReleased"
    held: bool  # False: a queued request withdrawn


# ... and on the run's schedule: the run waits for a permit, got it, gave it back


class _RunPermitStep(_Event):
    run_id: str
    ask: str


class RunAwaitsPermit(_RunPermitStep):
    type: Literal["RunAwaitsPermit"] = "RunAwaitsPermit"
    key: str  # the rendered key
    limit: int


class RunPermitted(_RunPermitStep):
    type: Literal["RunPermitted"] = "RunPermitted"


class RunPermitReturned(_RunPermitStep):
    type: Literal["RunPermitReturned"] = "RunPermitReturned"


# calendars: on a calendar's aggregate, each revision, its deletion and each schedule that
# names it or stops naming it ...


class CalendarRevised(_Event):
    type: Literal["CalendarRevised"] = "CalendarRevised"
    name: str
    revision: int
    spec: CalendarSpec


class CalendarDeleted(_Event):
    type: Literal["CalendarDeleted"] = "CalendarDeleted"
    name: str
    revision: int


class CalendarSubscribed(_Event):
    type: Literal["CalendarSubscribed"] = "CalendarSubscribed"
    name: str
    schedule_id: str


class CalendarUnsubscribed(_Event):
    type: Literal["CalendarUnsubscribed"] = "CalendarUnsubscribed"
    name: str
    schedule_id: str


# ... and on a schedule that names it: the revision it holds from now on (``spec`` None: the
# calendar does not exist)


class CalendarCopied(_Event):
    type: Literal["CalendarCopied"] = "CalendarCopied"
    name: str
    revision: int
    spec: CalendarSpec | None = None


# changing the partition count (docs/design.md §18): a key leaving and entering a partition
# (on the key), and a partition's routing view (on the partition's routing key, ``ROUTING_ID``)


class KeyMovedOut(_Event):
    """The key's state left this partition for ``to_partition`` (routing version
    ``version``): from here on the partition holds nothing of it."""

    type: Literal["KeyMovedOut"] = "KeyMovedOut"
    to_partition: int
    version: int


class KeyMovedIn(_Event):
    """The key's state, moved out of ``from_partition``, is installed here exactly as it
    was: ``state`` (JSON text of the state codec's ``state_version``) and its spec ``shape``."""

    type: Literal["KeyMovedIn"] = "KeyMovedIn"
    kind: Literal["schedule", "quota"] = "schedule"
    state: str
    shape: str | None = None
    state_version: int
    from_partition: int
    version: int


class RoutingVersionAdded(_Event):
    """The partition learned the routing versions ``partitions`` (counts, oldest first)."""

    type: Literal["RoutingVersionAdded"] = "RoutingVersionAdded"
    partitions: tuple[int, ...]


class HandedOver(_Event):
    """The partition handed over to ``version`` (the keys it moved out are moved in this
    transaction) and serves it from here on."""

    type: Literal["HandedOver"] = "HandedOver"
    version: int
    moved: int = 0


class HandoverReceived(_Event):
    """The partition read ``sender``'s handover-done for ``version``."""

    type: Literal["HandoverReceived"] = "HandoverReceived"
    version: int
    sender: int


# the events of each aggregate: a schedule's, a tenant quota's and a partition routing
# view's (a moved key's two events are both a schedule's and a quota's)
ScheduleEvent = (
    ScheduleCreated
    | ScheduleRevised
    | SchedulePaused
    | ScheduleResumed
    | ScheduleDeleted
    | ScheduleCompleted
    | NextRunPlanned
    | OccurrenceMaterialized
    | OccurrenceSkipped
    | OccurrenceReady
    | AttemptClaimed
    | FenceAdvanced
    | LeaseExtended
    | LeaseExpired
    | AttemptFailed
    | RetryScheduled
    | OccurrenceDeadLettered
    | OccurrenceRedriven
    | ResultPublished
    | CompletionRejected
    | CancellationRequested
    | OccurrenceCancelled
    | ReconciliationRequired
    | ReconciliationResolved
    | EffectIntended
    | EffectSucceeded
    | EffectUncertain
    | EffectFailed
    | ScheduleCreationHeld
    | ScheduleCreationRefused
    | BackfillRequested
    | RunAwaitsPermit
    | RunPermitted
    | RunPermitReturned
    | CalendarCopied
    | KeyMovedOut
    | KeyMovedIn
)
QuotaEvent = (
    QuotaSlotReserved | QuotaSlotRefused | QuotaSlotConfirmed | QuotaSlotReleased
    | PermitGranted | PermitQueued | PermitReleased | CalendarRevised | CalendarDeleted
    | CalendarSubscribed | CalendarUnsubscribed | KeyMovedOut | KeyMovedIn
)
RoutingEvent = RoutingVersionAdded | HandedOver | HandoverReceived

Event = Annotated[ScheduleEvent | QuotaEvent | RoutingEvent, Field(discriminator="type")]

EVENT_TYPES: tuple[type[BaseModel], ...] = Event.__origin__.__args__  # type: ignore[attr-defined]
COMMAND_TYPES: tuple[type[BaseModel], ...] = Command.__origin__.__args__  # type: ignore[attr-defined]
CURRENT_VERSION = 1


class EventEnvelope(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

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


# a reply's positions: ``[topic, partition, offset]`` as written since the compact format,
# ``{topic, partition, offset}`` before it
_POSITIONS_SCHEMA: dict[str, Any] = {"type": "array", "items": {"anyOf": [
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"},
                                      {"type": "integer"}], "minItems": 3, "maxItems": 3},
    {"type": "object", "required": ["topic", "partition", "offset"],
     "properties": {"topic": {"type": "string"}, "partition": {"type": "integer"},
                    "offset": {"type": "integer"}}}]}}


class Reply(BaseModel):
    """The answer to one command, correlated by ``command_id``. Members at their default
    (an empty ``reason``, ``body`` or ``positions``) may be left out."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    command_id: str
    status: Status
    reason: str = ""
    body: dict[str, Any] = Field(default_factory=dict)
    positions: Annotated[tuple[LogPosition, ...], WithJsonSchema(_POSITIONS_SCHEMA)] = ()
    tenant: str = ""
    schedule_id: str = ""

    @field_validator("positions", mode="before")
    @classmethod
    def _positions_as_triples(cls, value: Any) -> Any:
        """A position written compactly, ``[topic, partition, offset]``, reads as one of
        ``{topic, partition, offset}`` (both are stored)."""
        if isinstance(value, (list, tuple)):
            return [dict(zip(("topic", "partition", "offset"), p, strict=True))
                    if isinstance(p, (list, tuple)) and len(p) == 3 else p for p in value]
        return value


class DeadLetter(BaseModel):
    """A record a consumer could not use, kept with its reason and its original bytes.

    Every consumer (processor, projector, effect runner, workers, reply readers) writes one
    to the ``dlq`` topic for a record it skips: which record (``source_topic``,
    ``source_partition``, ``source_offset``), who skipped it (``consumer``), why
    (``error_class`` and ``reason``, the error's message) and the record's bytes
    (``original``, base64, at most its first 64 KiB; ``original_size`` is
    the whole size), and the ``tenant`` and ``schedule_id`` the record names, when it names
    them (its JSON's ``tenant`` / ``schedule_id``, else a ``tenant/schedule_id`` key of
    ``commands`` or ``events``; ``chronolog.log.dead_letters.named_by``). Records written
    before these fields existed read back with their defaults (a command the processor
    could not parse).
    """

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    reason: str
    original: str  # the original bytes (a prefix of them when original_size is larger), base64
    source_partition: int
    source_offset: int
    command_id: str | None = None
    source_topic: str = ""
    consumer: str = "processor"
    error_class: str = "DecodeError"
    original_size: int | None = None
    dead_lettered_at: datetime | None = None
    tenant: str | None = None
    schedule_id: str | None = None
