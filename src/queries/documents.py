"""The JSON documents of the read side (camelCase pydantic models), shared by the HTTP API and
the CLI's ``--json`` output: a schedule's definition (the body of a PUT, shown again by a
GET), a schedule and lists of them, runs, workers, dead letters.

The definition models take their limits from the domain spec (``chronolog.domain.messages``)
through ``spec_field``, so a bound is written once. ``to_spec`` turns a definition into the
domain ``ScheduleSpec`` (``InvalidDefinition`` names the offending field) and
``definition_of`` turns a stored spec back into a definition; ``patched_definition`` applies a
JSON merge patch (``chronolog.domain.merge_patch``) to a stored spec's definition, as
``PATCH /v1/schedules/{id}`` and ``chronolog schedule revise`` do.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from chronolog.commands.calendars import MISSING
from chronolog.domain import limits as lim
from chronolog.domain import messages as m
from chronolog.domain.limits import MAX_RETRY_ATTEMPTS, PATTERN_WORDS
from chronolog.domain.membership import LIVE_S
from chronolog.domain.merge_patch import merge_patch
from chronolog.domain.recurrence import RecurrenceError, compile_trigger

__all__ = [
    "DEFINITION_EXAMPLE",
    "AttemptOut",
    "BackfillItem",
    "BackfillOut",
    "CamelModel",
    "DeadLetterItem",
    "DeadLetterPage",
    "DeadLetterWatermark",
    "DstIn",
    "EffectIn",
    "EffectOut",
    "ExcludedOut",
    "ExclusionOut",
    "InvalidDefinition",
    "JobIn",
    "MisfireIn",
    "PreviewItem",
    "ResultOut",
    "ResumeItem",
    "ResumePlan",
    "RetryIn",
    "RunItem",
    "RunListItem",
    "RunListPage",
    "RunOut",
    "RunPage",
    "ScheduleDefinition",
    "ScheduleOut",
    "SchedulePage",
    "ScheduleSummary",
    "WatermarkOut",
    "WorkerClassOut",
    "WorkerOut",
    "WorkerPage",
    "backfill_out",
    "body_error",
    "camel_path",
    "definition_document",
    "definition_of",
    "field_of",
    "jsonable",
    "patched_definition",
    "plain_message",
    "spec_field",
    "spec_limits",
    "to_spec",
]

_CONSTRAINTS = ("min_length", "max_length", "ge", "gt", "le", "lt", "multiple_of", "pattern")


def spec_limits(model: type[BaseModel], field: str, *only: str) -> dict[str, Any]:
    """The constraints (``min_length``, ``le``, ``pattern`` ...) of ``model.field`` in the
    domain spec, as ``Field`` keyword arguments; ``only`` picks some of them."""
    out: dict[str, Any] = {}
    for meta in model.model_fields[field].metadata:
        for name in _CONSTRAINTS:
            value = getattr(meta, name, None)
            if value is not None and (not only or name in only):
                out[name] = value
    missing = set(only) - set(out)
    if missing:
        raise LookupError(f"{model.__name__}.{field} has no {', '.join(sorted(missing))}")
    return out


def spec_field(model: type[BaseModel], field: str, *only: str, **kwargs: Any) -> Any:
    """``Field(**kwargs)`` with the constraints of ``model.field`` in the domain spec."""
    return Field(**kwargs, **spec_limits(model, field, *only))


def camel_path(name: str) -> str:
    """``retry.max_attempts`` -> ``retry.maxAttempts`` (header names stay as they are)."""
    if "-" in name or name[:1].isupper():
        return name
    return ".".join(to_camel(part) if "_" in part else part for part in name.split("."))


def field_of(loc: tuple[Any, ...]) -> str | None:
    """The camelCase field a pydantic error location points at (None: the whole input)."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    if parts and parts[0] in ("body", "query", "header", "path"):
        kind = parts.pop(0)
        if kind == "header" and parts:
            return parts[0]
    # union / tagged-union branch names that pydantic inserts
    parts = [p for p in parts if not p.startswith(("function-", "literal[", "str", "float",
                                                   "MisfireIn", "json-or-python"))]
    return camel_path(".".join(parts)) if parts else None


def _listed(values: Any) -> str:
    return str(values).replace("'", "")


# pydantic's error types as a user reads them (``plain_message``); {name}: the error's context
_PLAIN = {
    "dict_type": "must be a JSON object", "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object", "mapping_type": "must be a JSON object",
    "list_type": "must be a JSON array", "tuple_type": "must be a JSON array",
    "set_type": "must be a JSON array", "string_type": "must be a string",
    "int_type": "must be an integer", "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number", "float_type": "must be a number",
    "float_parsing": "must be a number", "bool_type": "must be true or false",
    "bool_parsing": "must be true or false", "missing": "is required",
    "extra_forbidden": "unknown field", "json_invalid": "not valid JSON",
    "none_required": "must be null",
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
    "string_too_short": "must be at least {min_length} characters",
    "string_too_long": "must be at most {max_length} characters",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items",
    "literal_error": "must be one of {expected}", "enum": "must be one of {expected}",
    "union_tag_invalid": "must be one of {expected_tags}",
    "datetime_type": "must be an ISO-8601 date-time such as 2026-03-08T09:00:00Z",
    "datetime_parsing": "must be an ISO-8601 date-time such as 2026-03-08T09:00:00Z",
    "datetime_from_date_parsing": "must be an ISO-8601 date-time such as "
                                  "2026-03-08T09:00:00Z",
    "timezone_aware": "must have a UTC offset (Z or +HH:MM)",
}


def plain_message(err: Mapping[str, Any]) -> str:
    """A pydantic error's message in plain words (``must be a JSON object``, ``must be at
    least 1``, an ID pattern's rule), not pydantic's own (``Input should be a valid
    dictionary``); a rule of chronolog's (a value error) as it says it."""
    kind = str(err.get("type", ""))
    ctx = dict(err.get("ctx") or {})
    if kind == "string_too_short" and ctx.get("min_length") == 1:
        return "must not be empty"
    if kind == "string_pattern_mismatch":
        return PATTERN_WORDS.get(str(ctx.get("pattern")), "has characters that are not allowed")
    template = _PLAIN.get(kind)
    if template is not None:
        try:
            return template.format(**{k: _listed(v) for k, v in ctx.items()})
        except (KeyError, IndexError):
            pass
    return str(err.get("msg", "invalid")).removeprefix("Value error, ")


def body_error(err: Mapping[str, Any]) -> tuple[str, str | None]:
    """The message and camelCase field of a pydantic error in a request body, as the API's
    400 says them: ``x is required``, ``x: unknown field 'x'``, ``x: <why>``."""
    field = field_of(tuple(err.get("loc", ())))
    msg = plain_message(err)
    if err.get("type") == "extra_forbidden":
        msg = f"unknown field '{field}'"
    elif err.get("type") == "missing" and field:
        return f"{field} is required", field
    return (f"{field}: {msg}" if field else msg), field


def jsonable(model: BaseModel) -> Any:
    """A document as JSON-ready data (camelCase keys)."""
    return model.model_dump(mode="json", by_alias=True)


def iso(t: datetime | None) -> str | None:
    """``2026-11-29T10:37:28.123456Z`` (None stays None)."""
    return None if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def is_null(value: Any) -> bool:
    """``Field(default=None, exclude_if=is_null)``: a member a document leaves out when it
    is null — one about few items (an excluded instant, a run a calendar excluded), so every
    other item keeps the shape it had."""
    return value is None


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              defer_build=True)


# =======================================================================================
# a schedule's definition


class JobIn(CamelModel):
    type: str = spec_field(m.JobSpec, "type")
    params: m.Params = Field(default_factory=dict)
    timeout: m.Seconds | None = None


class MisfireIn(CamelModel):
    policy: Literal["skip", "latest", "all"] = "latest"
    grace: m.Seconds | None = None
    max_catchup: int | None = spec_field(m.MisfireSpec, "max_catchup", default=None)
    max_age: m.Seconds | None = None


class RetryIn(CamelModel):
    # at most the node's ceiling (a tenant's lower one is the processor's to hold)
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_RETRY_ATTEMPTS)
    initial_backoff: m.Seconds | None = None
    max_backoff: m.Seconds | None = None
    multiplier: float | None = spec_field(m.RetrySpec, "multiplier", default=None)
    max_age: m.Seconds | None = None


class DstIn(CamelModel):
    ambiguous: Literal["first", "second", "both"] = "first"
    nonexistent: Literal["shift_forward", "skip"] = "shift_forward"


class EffectIn(CamelModel):
    """An effect: a destination the operator granted the tenant, by name, and its options."""

    kind: Literal["webhook", "email", "postgres", "kafka"]
    name: str = spec_field(m.EffectSpec, "name", default="")
    destination: str = spec_field(m.EffectSpec, "destination",
                             description="a destination named in the tenants file")
    headers: dict[str, str] | None = Field(
        default=None, description="webhook only: extra request headers (never Host, "
        "hop-by-hop, forwarding or authorization headers)")
    # the spec's pattern on subject is left to the command model (its message names the field)
    subject: str | None = spec_field(m.EffectSpec, "subject", "max_length", default=None,
                                description="email only")
    give_up_after: m.Seconds | None = Field(
        default=None, description="stop retrying after this long (capped by the destination)")


class ConcurrencyIn(CamelModel):
    """At most ``limit`` runs with the same key LEASED at once, across every worker."""

    key: str = Field(min_length=1, max_length=200, description="a constant, or a template "
                     "over the job's params: customer-{customerId} names params.customerId")
    limit: int = spec_field(m.ConcurrencySpec, "limit")


# the definition the API documentation shows (ReDoc samples a body from it): valid as it is,
# with one rule (``every``), not every member of the schema at once
DEFINITION_EXAMPLE: dict[str, Any] = {
    "every": "15m", "job": {"type": "echo", "params": {"region": "eu"}},
    "retry": {"maxAttempts": 3}, "overlap": "skip"}


class ScheduleDefinition(CamelModel):
    """A schedule's definition: exactly one of cron / every / at / delay, the job, policies."""

    model_config = ConfigDict(json_schema_extra={"examples": [DEFINITION_EXAMPLE]})

    cron: str | None = Field(default=None, description="5-field cron (with L, L-n, nW, LW, nL, "
                             "n#k and wrapping ranges such as FRI-MON; see docs/tour.md) or an "
                             "@daily-style macro")
    timezone: str | None = Field(default=None, description="IANA zone for cron (default UTC)")
    every: m.Seconds | None = Field(default=None, description="interval (seconds or 15m, 1h...)")
    anchor: m.Instant | None = Field(default=None, description="alignment of every")
    at: m.Instant | None = Field(default=None, description="one-shot instant")
    delay: m.Seconds | None = Field(default=None, description="fixed delay after each run")
    start: m.Instant | None = None
    end: m.Instant | None = None
    max_count: int | None = spec_field(m.ScheduleSpec, "max_count", default=None)
    job: JobIn
    misfire: Literal["skip", "latest", "all"] | MisfireIn | None = None
    overlap: m.OverlapPolicy | None = None
    retry: RetryIn | None = None
    lease: m.Seconds | None = None
    start_deadline: m.Seconds | None = None
    jitter: m.Seconds | None = None
    dst: DstIn | None = None
    effects: list[EffectIn] | None = None
    resource_class: str | None = spec_field(m.ScheduleSpec, "resource_class", default=None)
    priority: int | None = spec_field(m.ScheduleSpec, "priority", default=None)
    concurrency: ConcurrencyIn | None = None
    exclude: list[str] | None = spec_field(
        m.ScheduleSpec, "exclude", default=None, description="the tenant's calendars, by "
        "name, whose exclusions this schedule's instants skip (each such instant is recorded "
        "SKIPPED, reason excluded, naming the first calendar that excludes it); a calendar "
        "that does not exist excludes every instant")
    labels: dict[str, str] | None = Field(
        default=None, description=f"free-form key/value pairs the scheduler never acts on, "
        f"for the tools that manage the schedule (at most {lim.MAX_LABELS}; keys of lower-case "
        f"letters, digits and . - /, 1-63 characters; values of at most "
        f"{lim.MAX_LABEL_VALUE} printable characters). `chronolog apply` records the set it "
        f"applied the schedule from in `chronolog.dev/applied-by`")


class InvalidDefinition(ValueError):
    """A definition the domain refuses; ``field`` is the camelCase field it is about."""

    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


_SPEC_FIELDS = frozenset({"every", "delay", "lease", "end", "start"})


def to_spec(defn: ScheduleDefinition) -> m.ScheduleSpec:
    """The domain spec of a definition; ``InvalidDefinition`` naming the field when the
    spec refuses it or its trigger does not compile."""
    given = [n for n in ("cron", "every", "at", "delay") if getattr(defn, n) is not None]
    if len(given) != 1:
        raise InvalidDefinition("exactly one of cron, every, at, delay is required"
                                + (f" (got {', '.join(given)})" if given else ""),
                                given[1] if len(given) > 1 else "cron")
    if defn.anchor is not None and defn.every is None:
        raise InvalidDefinition("anchor only applies to every", "anchor")
    data = defn.model_dump(exclude_none=True, exclude={"schedule_id"})
    data["effects"] = tuple(data.get("effects", ()))
    for key in ("retry", "misfire", "dst"):
        if isinstance(data.get(key), dict):
            data[key] = {k: v for k, v in data[key].items() if v is not None}
    try:
        spec = m.ScheduleSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = plain_message(err)
        field = field_of(tuple(err.get("loc", ())))
        if field is None:  # a whole-spec rule: its message starts with the field it is about
            first = msg.split(" ", 1)[0]
            field = {"effect": "effects", "concurrency.key": "concurrency.key"}.get(
                first, first if first in _SPEC_FIELDS else None)
        raise InvalidDefinition(msg, field) from None
    try:
        compile_trigger(
            cron=spec.cron, every=spec.every, at=spec.at, delay=spec.delay,
            timezone=spec.timezone, anchor=spec.anchor or datetime.now(UTC),
            start=spec.start, end=spec.end, dst_ambiguous=spec.dst.ambiguous,
            dst_nonexistent=spec.dst.nonexistent,
        )
    except RecurrenceError as exc:
        raise InvalidDefinition(str(exc), camel_path(exc.field)) from None
    return spec


def definition_of(spec_json: Any) -> ScheduleDefinition:
    """The definition of a stored (snake_case) spec, as JSON text or data."""
    raw = orjson.loads(spec_json) if isinstance(spec_json, (str, bytes)) else spec_json
    spec = m.ScheduleSpec.model_validate(raw, context=m.STORED)
    data = spec.model_dump()
    data["effects"] = list(data["effects"])
    data["exclude"] = list(data["exclude"]) or None  # none: left out of the document
    data["labels"] = data["labels"] or None  # likewise
    return ScheduleDefinition.model_validate(data)


def definition_document(spec_json: Any) -> dict[str, Any]:
    """A stored spec's definition as a GET shows it (camelCase JSON, no null member)."""
    doc: dict[str, Any] = definition_of(spec_json).model_dump(mode="json", by_alias=True,
                                                              exclude_none=True)
    return doc


def patched_definition(spec_json: Any, patch: dict[str, Any]) -> ScheduleDefinition:
    """The definition of a stored spec with the merge patch ``patch`` applied, validated as
    the body of a PUT (``ValidationError`` locates the field in the definition; ``to_spec``
    then checks what the domain checks)."""
    return ScheduleDefinition.model_validate(merge_patch(definition_document(spec_json), patch))


# =======================================================================================
# a schedule


class ExcludedOut(CamelModel):
    """An upcoming instant a calendar the schedule names excludes (it is recorded SKIPPED,
    reason ``excluded``, when it comes): the calendar and its entry that excludes it."""

    calendar: str = Field(description="the first calendar of `exclude` that excludes it")
    entry: str = Field(description="the calendar's entry that excludes it, such as "
                       "2026-12-25, 2026-12-24..2026-12-26 or sat,sun 22:00-06:00 "
                       f"Europe/Paris; `{MISSING}` when no calendar of that name exists "
                       "(it excludes every instant)")


class PreviewItem(CamelModel):
    scheduled_at: datetime
    due_at: datetime
    local: str
    excluded: ExcludedOut | None = Field(
        default=None, exclude_if=is_null, description="a calendar the schedule names "
        "excludes this instant (as the calendars read now): it will be recorded SKIPPED, "
        "reason excluded, not run; absent when none does")


class ResumeItem(CamelModel):
    """A due instant (or a range of ``count`` consecutive ones, ``scheduledAt`` ..
    ``through``) and what a resume now does with it: ``run`` or ``skip`` for ``reason``."""

    scheduled_at: datetime
    through: datetime | None = None
    count: int = 1
    action: Literal["run", "skip"]
    reason: str | None = None
    excluded: ExcludedOut | None = Field(
        default=None, exclude_if=is_null, description="reason excluded: the calendar (as "
        "read now) and its entry that exclude the instant; absent otherwise")


class ResumePlan(CamelModel):
    """What resuming a paused schedule at ``asOf`` would do under its misfire policy."""

    as_of: datetime
    instants: list[ResumeItem]
    truncated: bool = False  # more items than listed
    more_due: int = 0  # instants due beyond one decision: the ticks after the resume take them


class ScheduleOut(CamelModel):
    schedule_id: str
    state: Literal["ACTIVE", "PAUSED", "COMPLETED", "DELETED"]
    revision: int
    next_run_at: datetime | None
    next_due_at: datetime | None
    created_at: datetime
    updated_at: datetime
    paused_at: datetime | None
    pause_reason: str | None
    deleted_at: datetime | None
    completed_at: datetime | None = None
    completed_reason: Literal["at", "end", "max_count"] | None = None
    definition: ScheduleDefinition
    preview: list[PreviewItem]
    resume: ResumePlan | None = None  # a PAUSED schedule: what a resume now would run or skip


class WatermarkOut(CamelModel):
    partitions: dict[str, int] = Field(description="partition -> next offset projected")
    time: datetime | None = Field(description="authority time of the last event projected")


class ScheduleSummary(CamelModel):
    """A schedule in a list (``read_model.schedule_summary``)."""

    schedule_id: str
    state: Literal["ACTIVE", "PAUSED", "COMPLETED", "DELETED"]
    revision: int
    next_run_at: datetime | None
    next_due_at: datetime | None
    created_at: datetime
    updated_at: datetime
    definition: ScheduleDefinition


class SchedulePage(CamelModel):
    """``GET /v1/schedules``: a page of the tenant's schedules by ID."""

    items: list[ScheduleSummary]
    next_cursor: str | None = Field(description="the `after` of the next page (null: none)")
    watermark: WatermarkOut


# =======================================================================================
# runs


class ExclusionOut(CamelModel):
    """Why a run was skipped with reason ``excluded``: the calendar, the revision of it the
    schedule held, and its entry that excluded the instant."""

    calendar: str
    revision: int = Field(description="the calendar's revision the schedule decided with "
                          "(0: the calendar never existed)")
    entry: str = Field(description="the entry that excluded the instant, such as 2026-12-25; "
                       f"`{MISSING}` when the calendar did not exist")


class RunItem(CamelModel):
    run_id: str
    trace_id: str = Field(description="the run's OpenTelemetry trace ID (32 hex digits), "
                          "derived from its run ID: with tracing on, every span of the run "
                          "is in this trace (docs/tracing.md)")
    schedule_id: str
    scheduled_at: datetime
    state: str
    attempt: int
    started_at: datetime | None
    finished_at: datetime | None
    waiting: str | None = Field(default=None, description="why a READY run waits, e.g. no "
                                "live worker of its resource class serves its job type")
    exclusion: ExclusionOut | None = Field(
        default=None, exclude_if=is_null, description="a run SKIPPED with reason excluded: "
        "the calendar that excluded it (absent otherwise)")


class RunPage(CamelModel):
    items: list[RunItem]
    next_cursor: str | None
    watermark: WatermarkOut


class RunListItem(RunItem):
    """A run in the tenant-wide list: a schedule's run item and its job type."""

    job_type: str | None


class RunListPage(CamelModel):
    """``GET /v1/runs``: a page of the tenant's runs, newest first."""

    items: list[RunListItem]
    next_cursor: str | None = Field(description="the `after` of the next page (null: none)")
    watermark: WatermarkOut


class AttemptOut(CamelModel):
    attempt: int
    fence: int
    worker_id: str
    claimed_at: datetime
    lease_until: datetime
    outcome: str | None
    error_class: str | None
    error: str | None
    finished_at: datetime | None


class ResultOut(CamelModel):
    checksum: str
    size: int
    uri: str | None = None
    inline: Any = None
    attempt: int | None = None


class EffectOut(CamelModel):
    effect_id: str
    kind: str
    state: str
    attempts: int
    evidence: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime


# =======================================================================================
# a backfill's answer


class BackfillItem(CamelModel):
    scheduled_at: datetime
    run_id: str | None = Field(default=None, description="the run made for this instant")
    reason: Literal["accounted", "backfilled", "excluded"] | None = Field(
        default=None, description="why it is not run: accounted (the schedule's own "
        "instant: it ran, was skipped with a reason, or will), backfilled (an earlier "
        "backfill ran it), excluded (a calendar the schedule names excludes it)")
    calendar: str | None = Field(default=None, description="excluded: the calendar")
    excluded_by: str | None = Field(default=None, description="excluded: the calendar's "
                                    "entry that excludes the instant")


class BackfillOut(CamelModel):
    backfill_id: str = Field(description="the request's Idempotency-Key")
    start: datetime = Field(alias="from")
    end: datetime = Field(alias="to")
    overlap: str
    instants: int = Field(description="instants of the rule in the range")
    runs: int = Field(description="runs this backfill made")
    repeated: bool = Field(description="the same key and range again: answered as before, "
                           "nothing new (items left out)")
    items: list[BackfillItem]


def backfill_out(b: dict[str, Any]) -> BackfillOut:
    """A backfill's answer (the decider's body) as the API shows it."""
    return BackfillOut.model_validate({
        "backfill_id": b["backfill_id"], "from": b["from"], "to": b["to"],
        "overlap": b["overlap"], "instants": b["instants"], "runs": b["runs"],
        "repeated": b["repeated"],
        "items": [{"scheduled_at": i["scheduled_at"], "run_id": i.get("run_id"),
                   "reason": i.get("reason"), "calendar": i.get("calendar"),
                   "excluded_by": i.get("excluded_by")} for i in b["items"]]})


class RunOut(CamelModel):
    run_id: str
    trace_id: str = Field(description="the run's OpenTelemetry trace ID (32 hex digits), "
                          "derived from its run ID: with tracing on, every span of the run "
                          "is in this trace (docs/tracing.md)")
    schedule_id: str
    revision: int
    trigger: str
    request_key: str | None
    scheduled_at: datetime
    due_at: datetime | None
    state: str
    attempt: int
    job_type: str | None
    params: dict[str, Any] | None
    resource_class: str | None
    priority: int | None
    ready_at: datetime | None
    retry_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    lateness_ms: int | None
    attempts: list[AttemptOut]
    result: ResultOut | None
    skipped_reason: str | None
    skipped_through: datetime | None
    skipped_count: int
    cancellation_requested: bool
    cancel_reason: str | None
    dead_reason: str | None
    dead_message: str | None
    last_error_class: str | None
    last_error: str | None
    reconciliation: dict[str, Any] | None
    reconciliation_resolution: dict[str, Any] | None
    effects: list[EffectOut]
    waiting: str | None = Field(default=None, description="why a READY run waits, e.g. no "
                                "live worker of its resource class serves its job type")
    exclusion: ExclusionOut | None = Field(
        default=None, exclude_if=is_null, description="a run SKIPPED with reason excluded: "
        "the calendar that excluded it (absent otherwise)")


# =======================================================================================
# workers


class WorkerClassOut(CamelModel):
    resource_class: str
    job_types: list[str]
    slots: int


class WorkerOut(CamelModel):
    worker_id: str
    classes: list[WorkerClassOut]
    started_at: datetime
    last_seen: datetime
    live: bool = Field(description="not stopped, and announced itself within the last "
                       f"{LIVE_S:g} s")
    stopped: bool = Field(description="its last announcement said it was stopping")


class WorkerPage(CamelModel):
    items: list[WorkerOut]
    next_cursor: str | None



# =======================================================================================
# dead letters


class DeadLetterItem(CamelModel):
    """A dead letter (``chronolog.domain.messages.DeadLetter``): the record a consumer
    skipped (``topic``, ``partition``, ``offset``), who skipped it and why, what it names."""

    consumer: str = Field(description="processor, projector, effects, worker, client:<id>, "
                          "...")
    topic: str = Field(description="the skipped record's topic")
    partition: int
    offset: int
    tenant: str | None = Field(description="the tenant the record names (null: none)")
    schedule_id: str | None = Field(description="the schedule ID the record names (null: none)")
    reason: str = Field(description="the error's message")
    error_class: str
    command_id: str | None
    original: str = Field(description="the record's bytes (its first 64 KiB), base64")
    original_size: int | None = Field(description="the record's whole size in bytes")
    at: datetime = Field(description="when it was dead-lettered")


class DeadLetterWatermark(CamelModel):
    partitions: dict[str, int] = Field(description="dlq partition -> next offset listed")


class DeadLetterPage(CamelModel):
    """``GET /v1/dlq``: a page of dead letters, oldest first."""

    items: list[DeadLetterItem]
    next_cursor: str | None = Field(description="the `after` of the next page (null: none)")
    watermark: DeadLetterWatermark
