"""The HTTP API (FastAPI): commands through the log, queries from the PostgreSQL read model.

``create_app(client, store, tenants, ...)`` builds the app; ``openapi_document()`` returns
its OpenAPI spec (written to ``schemas/api/openapi.json`` by ``make schemas``; a test checks
for drift). The contract is that document and docs/design.md §11; decisions they leave
open are stated here.

Conventions
-----------
* JSON fields are camelCase, times UTC ISO-8601 with ``Z``, durations are seconds (numbers)
  on output and numbers or text such as ``90s``/``15m`` on input.
* Every error is ``{"error": <status>, "field": <field or null>, "message": "..."}`` where
  ``<status>`` is a word: ``invalid`` (400), ``unauthorized`` (401), ``forbidden`` (403),
  ``not_found`` (404), ``method_not_allowed`` (405, with ``Allow``), ``conflict`` (409),
  ``too_large`` (413), ``unsupported_media_type`` (415), ``precondition_required`` (428),
  ``quota`` (429), ``internal`` (500: a bug, with an error id in the log), ``unavailable``
  (503) — the reply statuses of docs/design.md §6 plus the HTTP-only ones. A 409 may carry more
  (``revision``: the current one; ``state``: the run's state). Validation is always 400
  (never FastAPI's 422), an unknown query parameter included; ``openapi_document``
  lists every status each operation can answer.
* Limits (``chronolog.domain.limits``; README "Limits"): the request guard
  (``api_limits.RequestGuard``) refuses oversized bodies, non-JSON bodies, deep nesting
  and NUL before FastAPI parses anything; path IDs must match their patterns; a tenant's
  commands pass its token bucket (429 with ``Retry-After``). ``/metrics`` takes an
  operator token whenever the tenants come from a file.
* Auth: ``Authorization: Bearer <token>`` -> tenant (``Tenants.by_token``); a missing or
  unknown token is 401. Every read and write is tenant-scoped: another tenant's schedule or
  run is 404, exactly like a missing one.

Writes
------
A write validates what it can first (body shape, exactly one trigger, the trigger compiles:
cron / timezone / every / at / anchor / dst..., the tenant may run the job type), then sends
one command and waits — bounded, ``reply_timeout`` — for the processor's reply. No reply in
time is 503 ``unavailable``: the command may still be decided, so the message says to read
the resource (or retry with the same ``Idempotency-Key``) before retrying blindly.

Every successful write returns the header ``X-Chronolog-Consistency``: an opaque token that
encodes the log positions of the events the command caused (for a write that caused none,
e.g. an idempotent replay, just past the last record of its partition of ``events`` when the
reply came, which covers the events of the original). A read that sends it back in the same header waits
until the projection has passed those positions, at most ``consistency_timeout`` (5 s); if
it has not by then the read is **503** ``unavailable`` with ``Retry-After: 1`` — never
stale data presented as fresh. Reads without the header answer at once from whatever the
projection holds (every list carries the projection ``watermark``).

Max schedules (429) is the processors' alone: a create of a tenant with a quota is answered
once the tenant's quota aggregate (one partition of the log) reserved a slot for it or
refused one, so the quota is exact under concurrency, whichever entry point sent the create
(docs/design.md, "Tenant quota"). The API does not pre-check it against the read model,
which lags the log (it would refuse a create right after a delete). The job-type check
(403) is done here (early answer) and by the processor (the authority).

Run commands (cancel, redrive, reconcile) find the run's schedule — its partition key — in
the read model, so they honour a consistency token as reads do.

Schedules
---------
``GET /v1/schedules/{id}`` returns ``definition`` (the body of a PUT), ``state``,
``revision`` (also the ``ETag``), ``nextRunAt``, ``nextDueAt`` and ``preview``: the next 5
occurrences ``{scheduledAt, dueAt, local}`` where ``dueAt`` includes the schedule's
deterministic jitter (the same hash the processor uses). Preview decisions: an ACTIVE
schedule's preview starts at its ``nextRunAt`` (which may be slightly in the past when a
tick is due); a PAUSED (or DELETED) schedule's preview is empty — nothing runs while paused.
A PAUSED schedule has ``resume`` instead: what a resume now would run or skip, from the
misfire planner the processor applies (``commands.backlog.plan_due``), skips of one reason
collapsed into ranges; ``delay``
schedules show only ``nextRunAt`` (later instants depend on when runs finish). The preview
does not count ``maxCount`` down (an exhausted schedule has no ``nextRunAt`` and so no
preview). A schedule with no further instant (a one-shot that fired, ``end`` passed,
``maxCount`` reached) is ``COMPLETED`` with ``completedAt`` and ``completedReason``
(``at`` | ``end`` | ``max_count``): it no longer counts against the quota, its runs stay
listed, a PUT, pause, resume or trigger answers 409 and a DELETE deletes it.

Workers
-------
``GET /v1/workers`` lists the workers as they announced themselves (``chronolog.projections
.workers``), by worker ID with a ``nextCursor``, optionally only ``live=true|false``. Workers
are shared by every tenant, and which job types run where is an operator's fact: an operator
token sees every worker with all its job types; a tenant token sees every worker (its ID,
classes, slots, liveness) but only the job types that tenant may run (``allowed_jobs``; all of
them for a tenant without a list). A READY run's ``waiting`` (runs and run listings) says
when no live worker of its class serves its job type. Creating a schedule whose job type no
worker of its class has ever announced is 201 with ``warnings``; an app given
``known_job_types`` (the dev node) answers 400 naming the job types it knows instead.

History paging
--------------
``GET /v1/schedules/{id}/runs`` lists newest first by ``(scheduledAt, runId)``. The first
page fixes an upper bound (the newest key then); ``nextCursor`` encodes that bound and the
last key returned, and each next page is strictly below the last key and at or below the
bound. Keys are immutable and unique, so runs created while a client pages (above the bound)
never shift a page: nothing is skipped or repeated. The cursor also pins the schedule and
the ``state`` filter (a mismatch is 400 on ``after``).
"""

# no `from __future__ import annotations`: FastAPI resolves the local dependency aliases

import asyncio
import base64
import binascii
import time
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Iterable, Literal, Mapping

import asyncpg
import orjson
from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from starlette.exceptions import HTTPException as StarletteHTTPException

from chronolog.commands.backlog import plan_due
from chronolog.client import Client, ReplyTimeout
from chronolog.commands.decider import TenantContext, ungranted_effect
from chronolog.commands.state import policy_for
from chronolog.domain import limits as lim
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.domain.recurrence import (
    RecurrenceError,
    compile_trigger,
    jitter_offset,
    parse_instant,
    resolve_zone,
    upcoming,
)
from chronolog.log.partitioner import partition_for
from chronolog.log.port import LogError
from chronolog.api.limits import RateLimiter, RequestGuard
from chronolog.projections.metrics import MetricsSource, render
from chronolog.projections.store import PostgresProjectionStore
from chronolog.projections import workers as wk
from chronolog.tenants import Tenant, Tenants

__all__ = ["ApiError", "CONSISTENCY_HEADER", "create_app", "decode_token", "encode_token",
           "openapi_document", "openapi_json", "schedule_document"]

CONSISTENCY_HEADER = "X-Chronolog-Consistency"
API_VERSION = "1.0.0"
PREVIEW_COUNT = 5
MAX_PAGE = 500

_STATUS_WORDS = {
    400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
    422: "invalid", 428: "precondition_required", 429: "quota", 500: "internal",
    503: "unavailable",
}
_REPLY_HTTP = {"invalid": 400, "forbidden": 403, "not_found": 404, "conflict": 409,
               "quota": 429, "stale_fence": 409}


# =======================================================================================
# errors


class ApiError(Exception):
    """An error answer: ``{"error", "field", "message", **extra}`` with an HTTP status."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers
        self.extra = extra

    def response(self) -> JSONResponse:
        body = {"error": _STATUS_WORDS.get(self.status, str(self.status)), "field": self.field,
                "message": self.message, **self.extra}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _camel_path(name: str) -> str:
    """``retry.max_attempts`` -> ``retry.maxAttempts`` (header names stay as they are)."""
    if "-" in name or name[:1].isupper():
        return name
    return ".".join(to_camel(part) if "_" in part else part for part in name.split("."))


def _loc_field(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if not isinstance(p, int)]
    if parts and parts[0] in ("body", "query", "header", "path"):
        kind = parts.pop(0)
        if kind == "header" and parts:
            return parts[0]
    # union / tagged-union branch names that pydantic inserts
    parts = [p for p in parts if not p.startswith(("function-", "literal[", "str", "float",
                                                   "MisfireIn", "json-or-python"))]
    return _camel_path(".".join(parts)) if parts else None


class ErrorBody(BaseModel):
    """Every error answer."""

    error: str = Field(description="invalid | unauthorized | forbidden | not_found | "
                       "method_not_allowed | conflict | too_large | unsupported_media_type | "
                       "precondition_required | quota | internal | unavailable")
    field: str | None = Field(description="the offending field, header or parameter")
    message: str
    revision: int | None = Field(default=None, description="409 on a schedule: the current revision")
    state: str | None = Field(default=None, description="409 on a run: its state")


# =======================================================================================
# request / response models (camelCase)


class _Api(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class JobIn(_Api):
    type: str = Field(min_length=1, max_length=200)
    params: m.Params = Field(default_factory=dict)
    timeout: m.Seconds | None = None


class MisfireIn(_Api):
    policy: Literal["skip", "latest", "all"] = "latest"
    grace: m.Seconds | None = None
    max_catchup: int | None = Field(default=None, ge=1, le=100_000)
    max_age: m.Seconds | None = None


class RetryIn(_Api):
    max_attempts: int | None = Field(default=None, ge=1, le=1000)
    initial_backoff: m.Seconds | None = None
    max_backoff: m.Seconds | None = None
    multiplier: float | None = Field(default=None, ge=1.0, le=10.0)
    max_age: m.Seconds | None = None


class DstIn(_Api):
    ambiguous: Literal["first", "second", "both"] = "first"
    nonexistent: Literal["shift_forward", "skip"] = "shift_forward"


class EffectIn(_Api):
    """An effect: a destination the operator granted the tenant, by name, and its options."""

    kind: Literal["webhook", "email", "postgres", "kafka"]
    name: str = Field(default="", max_length=100, pattern=r"^[A-Za-z0-9_.-]*$")
    destination: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$",
                             description="a destination named in the tenants file")
    headers: dict[str, str] | None = Field(
        default=None, description="webhook only: extra request headers (never Host, "
        "hop-by-hop, forwarding or authorization headers)")
    subject: str | None = Field(default=None, max_length=200, description="email only")
    give_up_after: m.Seconds | None = Field(
        default=None, description="stop retrying after this long (capped by the destination)")


class ScheduleDefinition(_Api):
    """A schedule's definition: exactly one of cron / every / at / delay, the job, policies."""

    cron: str | None = Field(default=None, description="5-field cron (with L, L-n, nW, LW, nL, n#k and wrapping ranges such as FRI-MON; see the README) or an @daily-style macro")
    timezone: str | None = Field(default=None, description="IANA zone for cron (default UTC)")
    every: m.Seconds | None = Field(default=None, description="interval (seconds or 15m, 1h...)")
    anchor: m.Instant | None = Field(default=None, description="alignment of every")
    at: m.Instant | None = Field(default=None, description="one-shot instant")
    delay: m.Seconds | None = Field(default=None, description="fixed delay after each run")
    start: m.Instant | None = None
    end: m.Instant | None = None
    max_count: int | None = Field(default=None, ge=1, le=lim.MAX_COUNT)
    job: JobIn
    misfire: Literal["skip", "latest", "all"] | MisfireIn | None = None
    overlap: Literal["allow", "skip", "buffer_one", "buffer_all", "cancel_previous"] | None = None
    retry: RetryIn | None = None
    lease: m.Seconds | None = None
    start_deadline: m.Seconds | None = None
    jitter: m.Seconds | None = None
    dst: DstIn | None = None
    effects: list[EffectIn] | None = None
    resource_class: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    priority: int | None = Field(default=None, ge=-100, le=100)


class ScheduleIn(ScheduleDefinition):
    """``POST /v1/schedules``."""

    schedule_id: str = Field(min_length=1, max_length=200, pattern=lim.SCHEDULE_ID_PATTERN)


class TriggerIn(_Api):
    params: m.Params | None = None


class CancelIn(_Api):
    reason: str = Field(default="", max_length=1000)


class ReconcileIn(_Api):
    decision: Literal["delivered", "retry", "abandon"]
    note: str = Field(default="", max_length=2000)
    effect_id: str | None = Field(default=None, max_length=200)


class ScheduleWritten(_Api):
    schedule_id: str
    revision: int
    next_run_at: datetime | None


class ScheduleCreated(ScheduleWritten):
    warnings: list[str] | None = Field(
        default=None, description="present when the schedule was created but may not run as "
        "meant, e.g. no worker of its resource class has ever served its job type")


class ScheduleStateOut(ScheduleWritten):
    state: Literal["ACTIVE", "PAUSED", "COMPLETED", "DELETED"]


class RevisedOut(_Api):
    revision: int
    next_run_at: datetime | None


class PreviewItem(_Api):
    scheduled_at: datetime
    due_at: datetime
    local: str


class ResumeItem(_Api):
    """A due instant (or a range of ``count`` consecutive ones, ``scheduledAt`` ..
    ``through``) and what a resume now does with it: ``run`` or ``skip`` for ``reason``."""

    scheduled_at: datetime
    through: datetime | None = None
    count: int = 1
    action: Literal["run", "skip"]
    reason: str | None = None


class ResumePlan(_Api):
    """What resuming a paused schedule at ``asOf`` would do under its misfire policy."""

    as_of: datetime
    instants: list[ResumeItem]
    truncated: bool = False  # more items than listed
    more_due: int = 0  # instants due beyond one decision: the ticks after the resume take them


class ScheduleOut(_Api):
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


class RunCreated(_Api):
    run_id: str
    state: str


class RunItem(_Api):
    run_id: str
    schedule_id: str
    scheduled_at: datetime
    state: str
    attempt: int
    started_at: datetime | None
    finished_at: datetime | None
    waiting: str | None = Field(default=None, description="why a READY run waits, e.g. no "
                                "live worker of its resource class serves its job type")


class WatermarkOut(_Api):
    partitions: dict[str, int] = Field(description="partition -> next offset projected")
    time: datetime | None = Field(description="authority time of the last event projected")


class RunPage(_Api):
    items: list[RunItem]
    next_cursor: str | None
    watermark: WatermarkOut


class AttemptOut(_Api):
    attempt: int
    fence: int
    worker_id: str
    claimed_at: datetime
    lease_until: datetime
    outcome: str | None
    error_class: str | None
    error: str | None
    finished_at: datetime | None


class ResultOut(_Api):
    checksum: str
    size: int
    uri: str | None = None
    inline: Any = None
    attempt: int | None = None


class EffectOut(_Api):
    effect_id: str
    kind: str
    state: str
    attempts: int
    evidence: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime


class RunOut(_Api):
    run_id: str
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


class WorkerClassOut(_Api):
    resource_class: str
    job_types: list[str]
    slots: int


class WorkerOut(_Api):
    worker_id: str
    classes: list[WorkerClassOut]
    started_at: datetime
    last_seen: datetime
    live: bool = Field(description="not stopped, and announced itself within the last "
                       f"{wk.LIVE_S:g} s")
    stopped: bool = Field(description="its last announcement said it was stopping")


class WorkerPage(_Api):
    items: list[WorkerOut]
    next_cursor: str | None


class RunWritten(_Api):
    run_id: str
    state: str
    outcome: str | None = None
    attempt: int | None = None


class InstantOut(_Api):
    utc: str
    local: str


class PreviewOut(_Api):
    instants: list[InstantOut]


def _jsonable(model: BaseModel) -> Any:
    return model.model_dump(mode="json", by_alias=True)


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


# =======================================================================================
# consistency tokens


def encode_token(required: dict[int, int]) -> str:
    """An opaque token for ``partition -> next offset the projection must reach``."""
    raw = orjson.dumps({"v": 1, "p": {str(p): n for p, n in sorted(required.items())}})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> dict[int, int]:
    """The requirement of a token; ``ValueError`` when it is not one of ours."""
    try:
        raw = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(raw, dict) or raw.get("v") != 1 or not isinstance(raw.get("p"), dict):
            raise ValueError("not a consistency token")
        out = {int(p): int(n) for p, n in raw["p"].items()}
    except (binascii.Error, orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
        raise ValueError("not a consistency token") from None
    if any(p < 0 or n < 0 for p, n in out.items()):
        raise ValueError("not a consistency token")
    return out


def _encode_cursor(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")


def _decode_cursor(text: str) -> dict[str, Any]:
    try:
        raw = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if not isinstance(raw, dict) or lim.text_violation(raw) is not None:
            raise ValueError  # a forged cursor: nothing of it reaches the database
        raw["b"] = (datetime.fromisoformat(raw["b"][0]), str(raw["b"][1]))
        raw["l"] = (datetime.fromisoformat(raw["l"][0]), str(raw["l"][1]))
        if raw["b"][0].tzinfo is None or raw["l"][0].tzinfo is None:
            raise ValueError
        return raw
    except (binascii.Error, orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        raise ApiError(400, f"invalid after '{text[:40]}': not a cursor of this API", "after") from None


def _decode_worker_cursor(text: str, live: bool | None) -> str:
    """The last worker ID of a ``GET /v1/workers`` cursor made for the same ``live``."""
    try:
        raw = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, orjson.JSONDecodeError, ValueError):
        raw = None
    if not isinstance(raw, dict) or raw.get("k") != "workers" or not isinstance(
            raw.get("l"), str) or lim.text_violation(raw) is not None:
        raise ApiError(400, f"invalid after '{text[:40]}': not a cursor of this API", "after")
    if raw.get("f") != live:
        raise ApiError(400, "invalid after: the cursor belongs to another query", "after")
    return str(raw["l"])


# =======================================================================================
# spec conversion


def _to_spec(defn: ScheduleDefinition) -> m.ScheduleSpec:
    """The domain spec of an API definition (400 naming the field when it is invalid)."""
    given = [n for n in ("cron", "every", "at", "delay") if getattr(defn, n) is not None]
    if len(given) != 1:
        raise ApiError(400, "exactly one of cron, every, at, delay is required"
                       + (f" (got {', '.join(given)})" if given else ""),
                       given[1] if len(given) > 1 else "cron")
    if defn.anchor is not None and defn.every is None:
        raise ApiError(400, "anchor only applies to every", "anchor")
    if defn.timezone is not None and defn.cron is None and defn.at is None:
        # every/delay are elapsed time; the zone only labels them, but it must still exist
        pass
    data = defn.model_dump(exclude_none=True, exclude={"schedule_id"})
    data["effects"] = tuple(data.get("effects", ()))
    for key in ("retry", "misfire", "dst"):
        if isinstance(data.get(key), dict):
            data[key] = {k: v for k, v in data[key].items() if v is not None}
    try:
        spec = m.ScheduleSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        field = _loc_field(tuple(err.get("loc", ())))
        if field is None:  # a whole-spec rule: its message starts with the field it is about
            first = msg.split(" ", 1)[0]
            field = {"effect": "effects"}.get(first, first if first in _SPEC_FIELDS else None)
        raise ApiError(400, msg, field) from None
    try:
        compile_trigger(
            cron=spec.cron, every=spec.every, at=spec.at, delay=spec.delay,
            timezone=spec.timezone, anchor=spec.anchor or datetime.now(timezone.utc),
            start=spec.start, end=spec.end, dst_ambiguous=spec.dst.ambiguous,
            dst_nonexistent=spec.dst.nonexistent,
        )
    except RecurrenceError as exc:
        raise ApiError(400, str(exc), _camel_path(exc.field)) from None
    return spec


_SPEC_FIELDS = frozenset({"every", "delay", "lease", "end", "start"})


def _definition(spec_json: Any) -> ScheduleDefinition:
    """The API definition of a stored (snake_case) spec."""
    raw = orjson.loads(spec_json) if isinstance(spec_json, (str, bytes)) else spec_json
    spec = m.ScheduleSpec.model_validate(raw, context=m.STORED)
    data = spec.model_dump()
    data["effects"] = list(data["effects"])
    return ScheduleDefinition.model_validate(data)


def _stored_spec(row: asyncpg.Record) -> m.ScheduleSpec:
    return m.ScheduleSpec.model_validate(orjson.loads(row["spec"]), context=m.STORED)


def _recurrence(row: asyncpg.Record, spec: m.ScheduleSpec, first: datetime) -> Any:
    """The recurrence of a stored cron / every schedule (None for at / delay)."""
    if spec.cron is None and spec.every is None:
        return None
    return compile_trigger(
        cron=spec.cron, every=spec.every, timezone=spec.timezone,
        anchor=row["anchor"] or spec.anchor or first, start=spec.start, end=spec.end,
        dst_ambiguous=spec.dst.ambiguous, dst_nonexistent=spec.dst.nonexistent,
    )


def _preview(row: asyncpg.Record, count: int = PREVIEW_COUNT) -> list[PreviewItem]:
    if row["state"] != "ACTIVE" or row["next_run_at"] is None:
        return []
    spec = _stored_spec(row)
    first: datetime = row["next_run_at"]
    instants = [first]
    trigger = _recurrence(row, spec, first)
    if trigger is not None:
        instants += upcoming(trigger, first, count - 1)
    zone = resolve_zone(spec.timezone)
    out = []
    for t in instants[:count]:
        due = t + timedelta(seconds=jitter_offset(row["schedule_id"], t, spec.jitter)) \
            if spec.jitter > 0 else t
        out.append(PreviewItem(scheduled_at=t, due_at=due,
                               local=t.astimezone(zone).isoformat(timespec="seconds")))
    return out


RESUME_ITEMS_SHOWN = 200


def _resume_plan(row: asyncpg.Record, runs_so_far: int, now: datetime) -> ResumePlan:
    """What a resume at ``now`` would run or skip: the decider's own plan (``plan_due``)
    for the paused schedule's next instant, its policy and the runs it already had."""
    first: datetime | None = row["next_run_at"]
    if first is None:
        return ResumePlan(as_of=now, instants=[])
    spec = _stored_spec(row)
    pol = policy_for(spec)
    plan = plan_due(row["schedule_id"], pol, _recurrence(row, spec, first), first, now, "paused")
    items: list[ResumeItem] = []
    for p in plan.within_count(runs_so_far, spec.max_count):
        last = items[-1] if items else None
        if (last is not None and not p.runs and last.action == "skip"
                and last.reason == p.reason):
            last.through, last.count = p.instant, last.count + 1
            continue
        items.append(ResumeItem(scheduled_at=p.instant, action="run" if p.runs else "skip",
                                reason=p.reason))
    return ResumePlan(as_of=now, instants=items[:RESUME_ITEMS_SHOWN],
                      truncated=len(items) > RESUME_ITEMS_SHOWN, more_due=plan.later)


async def schedule_document(rm: "ReadModel", row: asyncpg.Record, now: datetime
                            ) -> dict[str, Any]:
    """The body of ``GET /v1/schedules/{id}`` for a schedules row (``chronolog schedule
    show`` prints the same); ``now`` is when a resume is supposed to happen."""
    resume = None
    if row["state"] == "PAUSED":
        runs = await rm.runs_so_far(row["tenant"], row["schedule_id"])
        resume = _resume_plan(row, runs, now)
    out = ScheduleOut(
        schedule_id=row["schedule_id"], state=row["state"], revision=row["revision"],
        next_run_at=row["next_run_at"], next_due_at=row["next_due_at"],
        created_at=row["created_at"], updated_at=row["updated_at"],
        paused_at=row["paused_at"], pause_reason=row["pause_reason"],
        deleted_at=row["deleted_at"], completed_at=row["completed_at"],
        completed_reason=row["completed_reason"], definition=_definition(row["spec"]),
        preview=_preview(row), resume=resume,
    )
    content = out.model_dump(mode="json", by_alias=True)
    content["definition"] = out.definition.model_dump(mode="json", by_alias=True,
                                                      exclude_none=True)
    return content


# =======================================================================================
# the read model


class ReadModel:
    """The API's queries; every one is tenant-scoped."""

    def __init__(self, pool: asyncpg.Pool, topic: str, projection: str = "main") -> None:
        self.pool = pool
        self.topic = topic
        self.projection = projection

    async def offsets(self) -> tuple[dict[int, int], datetime | None]:
        rows = await self.pool.fetch(
            "SELECT partition, next_offset, last_event_at FROM projection_offsets "
            "WHERE projection = $1 AND topic = $2", self.projection, self.topic)
        times = [r["last_event_at"] for r in rows if r["last_event_at"] is not None]
        return {r["partition"]: r["next_offset"] for r in rows}, (max(times) if times else None)

    async def schedule(self, tenant: str, schedule_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT * FROM schedules WHERE tenant = $1 AND schedule_id = $2", tenant, schedule_id)

    async def runs_so_far(self, tenant: str, schedule_id: str) -> int:
        """How many scheduled runs the schedule has had (its last sequence number)."""
        n = await self.pool.fetchval(
            "SELECT max(sequence) FROM runs WHERE tenant = $1 AND schedule_id = $2",
            tenant, schedule_id)
        return int(n or 0)

    async def run(self, tenant: str, run_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT * FROM runs WHERE run_id = $1 AND tenant = $2", run_id, tenant)

    async def attempts(self, run_id: str) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            "SELECT * FROM attempts WHERE run_id = $1 ORDER BY attempt", run_id)

    async def effects(self, run_id: str) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            "SELECT * FROM effects WHERE run_id = $1 ORDER BY created_at, effect_id", run_id)

    async def newest_run_key(self, tenant: str, schedule_id: str) -> tuple[datetime, str] | None:
        row = await self.pool.fetchrow(
            "SELECT scheduled_at, run_id FROM runs WHERE tenant = $1 AND schedule_id = $2 "
            "ORDER BY scheduled_at DESC, run_id DESC LIMIT 1", tenant, schedule_id)
        return None if row is None else (row["scheduled_at"], row["run_id"])

    async def runs_page(
        self, tenant: str, schedule_id: str, bound: tuple[datetime, str],
        last: tuple[datetime, str] | None, states: list[str] | None, limit: int,
    ) -> list[asyncpg.Record]:
        sql = ("SELECT run_id, schedule_id, scheduled_at, state, attempt, started_at, "
               "finished_at, job_type, resource_class FROM runs "
               "WHERE tenant = $1 AND schedule_id = $2 "
               "AND (scheduled_at, run_id) <= ($3, $4)")
        args: list[Any] = [tenant, schedule_id, bound[0], bound[1]]
        if last is not None:
            sql += " AND (scheduled_at, run_id) < ($5, $6)"
            args += [last[0], last[1]]
        if states:
            args.append(states)
            sql += f" AND state = ANY(${len(args)}::text[])"
        args.append(limit)
        sql += f" ORDER BY scheduled_at DESC, run_id DESC LIMIT ${len(args)}"
        return await self.pool.fetch(sql, *args)


# =======================================================================================
# the app


_bearer = HTTPBearer(auto_error=False, description="a tenant token")

ScheduleIdPath = Annotated[str, Path(max_length=200, pattern=lim.SCHEDULE_ID_PATTERN,
                                     description="a schedule ID")]
RunIdPath = Annotated[str, Path(max_length=64, pattern=lim.RUN_ID_PATTERN,
                                description="a run ID")]

def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorBody, "description": _STATUS_WORDS[c]} for c in (401, 503, *codes)}


_WRITE_HEADERS = {CONSISTENCY_HEADER: {
    "description": "opaque read-your-writes token: send it back on reads",
    "schema": {"type": "string"}}}


def create_app(
    client: Client | None,
    store: PostgresProjectionStore | asyncpg.Pool | None,
    tenants: Tenants,
    *,
    projector: Any = None,
    projection: str = "main",
    reply_timeout: float = 10.0,
    consistency_timeout: float = 5.0,
    consistency_poll: float = 0.02,
    max_body_bytes: int = lim.MAX_BODY_BYTES,
    known_job_types: Mapping[str, Iterable[str]] | None = None,
) -> FastAPI:
    """The API app. ``client`` sends commands (and gives the log: topics, end offsets);
    ``store`` (or an asyncpg pool) is the read model; ``projector``, when one runs in this
    process, serves read-your-writes waits and the fence-rejection metrics directly.
    ``max_body_bytes`` bounds a request body (413 past it). ``known_job_types`` (a dev node:
    resource class -> the job types its own workers have) makes creating a schedule whose
    job type neither those nor any announced worker of its class serve a 400 naming them;
    without it such a create is 201 with ``warnings``."""
    pool: Any = store.pool if isinstance(store, PostgresProjectionStore) else store
    log_ = client.log if client is not None else None
    topics = client.topics if client is not None else m_topics_default()
    rm = ReadModel(pool, topics.events, projection) if pool is not None else None
    metrics = MetricsSource(pool, log_, projection, projector) if pool is not None else None
    partitions_cache: dict[str, int] = {}

    query_names: dict[str, frozenset[str]] = {}

    async def known_query(request: Request) -> None:
        """A query parameter the route does not take is an error, not silently ignored."""
        route = request.scope.get("route")
        if not isinstance(route, APIRoute):
            return
        names = query_names.get(route.unique_id)
        if names is None:
            names = query_names[route.unique_id] = _query_names(route.dependant)
        for name in request.query_params:
            if name not in names:
                raise ApiError(400, f"unknown query parameter '{name}'"
                               + (f" (this route takes {', '.join(sorted(names))})"
                                  if names else ""), name)

    app = FastAPI(
        title="chronolog", version=API_VERSION,
        description="Event-sourced job scheduler: schedules, runs and their history.",
        dependencies=[Depends(known_query)],
    )
    app.add_middleware(
        RequestGuard, max_body_bytes=max_body_bytes,
        error=lambda status, message, field: ApiError(status, message, field).response())
    app.openapi = lambda: _documented(app)  # type: ignore[method-assign]
    limiter = RateLimiter()

    # ---------------------------------------------------------------- error handlers

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        err = errs[0] if errs else {}
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid":
            return ApiError(400, "the body is not valid JSON", None).response()
        if err.get("type") == "missing" and loc == ("body",):
            return ApiError(400, "a JSON body is required", None).response()
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        field = _loc_field(loc)
        if err.get("type") == "extra_forbidden":
            msg = f"unknown field '{field}'"
        elif err.get("type") == "missing" and field:
            return ApiError(400, f"{field} is required", field).response()
        elif loc[:1] == ("path",):
            shown = str(err.get("input", ""))[:60].encode("unicode_escape").decode()
            return ApiError(400, f"invalid {field} '{shown}': {msg}", field).response()
        return ApiError(400, f"{field}: {msg}" if field else msg, field).response()

    @app.exception_handler(ValidationError)
    async def _model(_: Request, exc: ValidationError) -> JSONResponse:
        """A command model refused what the request models let through (a message-level
        rule): still a 400 naming the field."""
        err = exc.errors()[0]
        loc = tuple(p for p in err.get("loc", ()) if p not in ("payload", "spec"))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        field = _loc_field(loc)
        if field is None and ": " in msg:  # a whole-command rule names its path first
            path, msg = msg.split(": ", 1)
            field = _camel_path(path.removeprefix("payload.").removeprefix("spec."))
        return ApiError(400, f"{field}: {msg}" if field else msg, field).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # every method some route of this path answers
            path = request.scope.get("path", "")
            methods = {meth for r in app.router.routes if isinstance(r, APIRoute)
                       and r.path_regex.match(path) for meth in r.methods or ()}
            headers["Allow"] = ", ".join(sorted(methods))
            return ApiError(405, f"method {request.method} not allowed here (allowed: "
                            f"{headers['Allow']})", None, headers=headers).response()
        return ApiError(exc.status_code, str(exc.detail), None,
                        headers=headers or None).response()

    # ---------------------------------------------------------------- dependencies

    async def tenant_of(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Tenant:
        if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
            raise ApiError(401, "missing bearer token", "Authorization",
                           headers={"WWW-Authenticate": "Bearer"})
        tenant = tenants.by_token(creds.credentials)
        if tenant is None:
            raise ApiError(401, "unknown token", "Authorization",
                           headers={"WWW-Authenticate": "Bearer"})
        return tenant

    TenantDep = Annotated[Tenant, Depends(tenant_of)]

    def need_rm() -> ReadModel:
        if rm is None:
            raise ApiError(503, "no read model configured")
        return rm

    async def consistent(
        token: Annotated[str | None, Header(alias=CONSISTENCY_HEADER,
                                            description="a token from a write response")] = None,
    ) -> None:
        """Wait (bounded) until the projection reached the token's positions."""
        if not token:
            return
        try:
            required = decode_token(token)
        except ValueError:
            raise ApiError(400, f"invalid {CONSISTENCY_HEADER}: not a token of this API",
                           CONSISTENCY_HEADER) from None
        if not required:
            return
        if projector is not None:
            if await projector.wait_for(required, consistency_timeout):
                return
        else:
            read = need_rm()
            deadline = time.monotonic() + consistency_timeout
            while True:
                have, _ = await read.offsets()
                if all(have.get(p, 0) >= n for p, n in required.items()):
                    return
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(consistency_poll)
        raise ApiError(503, f"the read model has not reached the consistency token within "
                       f"{consistency_timeout:g}s; retry shortly", CONSISTENCY_HEADER,
                       headers={"Retry-After": "1"})

    ConsistentDep = Depends(consistent)

    async def send(tenant: Tenant, schedule_id: str, payload: Any
                   ) -> tuple[m.Reply, str]:
        """Send one command; the ok reply and its consistency token, or an ApiError."""
        if client is None:
            raise ApiError(503, "no command client configured")
        limit = tenant.rate_limit
        wait = limiter.take(tenant.name, limit)
        if wait is not None and limit is not None:
            raise ApiError(429, f"tenant '{tenant.name}' sends commands faster than its rate "
                           f"limit ({limit.per_second:g}/s, burst {limit.burst}); retry in "
                           f"{wait}s", None, headers={"Retry-After": str(wait)})
        env = client.envelope(tenant.name, schedule_id, payload)
        env = env.model_copy(update={"principal": f"api:{tenant.name}"})
        try:
            reply = await client.send(env, reply_timeout)
        except ReplyTimeout:
            raise ApiError(503, f"no reply from the processor within {reply_timeout:g}s; the "
                           "command may still be decided: read the resource (or retry with the "
                           "same Idempotency-Key) before retrying", None,
                           headers={"Retry-After": "1"}) from None
        except LogError as exc:
            raise ApiError(503, f"the log is unavailable: {exc}", None,
                           headers={"Retry-After": "1"}) from None
        if reply.status != "ok":
            body = dict(reply.body)
            field = body.pop("field", None)
            extra = {k: v for k, v in (("revision", body.get("revision")),
                                       ("state", body.get("state"))) if v is not None}
            raise ApiError(_REPLY_HTTP.get(reply.status, 409), reply.reason or reply.status,
                           _camel_path(field) if isinstance(field, str) else None, **extra)
        required: dict[int, int] = {}
        for pos in reply.positions:
            if pos.topic == topics.events:
                required[pos.partition] = max(required.get(pos.partition, 0), pos.offset + 1)
        if not required and log_ is not None:
            required = await tail_of_partition(tenant.name, schedule_id)
        return reply, encode_token(required)

    async def tail_of_partition(tenant_name: str, schedule_id: str) -> dict[int, int]:
        """For a reply without events: just past the last record of its partition of events.

        (Not the end offset itself: on Kafka the end may be a transaction marker, which the
        projection never stores as consumed.)"""
        assert log_ is not None
        n = await events_partitions()
        p = partition_for(partition_key(tenant_name, schedule_id).encode(), n)
        end = await log_.end_offset(topics.events, p)
        if end == 0:
            return {}
        recs = await log_.read(topics.events, p, max(0, end - 16), 16, 0)
        offsets = [r.offset for r in recs if r.offset < end]
        return {p: max(offsets) + 1} if offsets else {}

    async def events_partitions() -> int:
        n = partitions_cache.get("events")
        if n is None:
            assert log_ is not None
            n = partitions_cache["events"] = await log_.partitions_for(topics.events)
        return n

    def with_warnings(response: JSONResponse, warnings: list[str]) -> JSONResponse:
        if not warnings:
            return response
        body = orjson.loads(response.body)
        body["warnings"] = warnings
        return JSONResponse(body, status_code=response.status_code,
                            headers={CONSISTENCY_HEADER: response.headers[CONSISTENCY_HEADER]})

    def written(content: BaseModel, status: int, token: str,
                headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(_jsonable(content), status_code=status,
                            headers={CONSISTENCY_HEADER: token, **(headers or {})})

    async def schedule_row(tenant: Tenant, schedule_id: str) -> asyncpg.Record:
        row = await need_rm().schedule(tenant.name, schedule_id)
        if row is None:
            raise ApiError(404, f"no schedule '{schedule_id}'", "scheduleId")
        return row

    async def run_row(tenant: Tenant, run_id: str) -> asyncpg.Record:
        row = await need_rm().run(tenant.name, run_id)
        if row is None:
            raise ApiError(404, f"no run '{run_id}'", "runId")
        return row

    def check_job(tenant: Tenant, spec: m.ScheduleSpec) -> None:
        if tenant.allowed_jobs is not None and spec.job.type not in tenant.allowed_jobs:
            raise ApiError(403, f"job type '{spec.job.type}' not allowed", "job.type")
        refused = ungranted_effect(spec, TenantContext(destinations={
            name: d.kind for name, d in tenant.destinations.items()}))
        if refused is not None:
            raise ApiError(403 if refused.status == "forbidden" else 400, refused.reason,
                           refused.field)

    # ---------------------------------------------------------------- schedules

    async def job_warnings(spec: m.ScheduleSpec) -> list[str]:
        """What to warn about (or, on a dev node, refuse) in a new schedule's job type."""
        if pool is None:
            return []
        cls, job = spec.resource_class, spec.job.type
        if job in (known_job_types or {}).get(cls, ()) or await wk.ever_served(pool, cls, job):
            return []
        if known_job_types is not None:
            known = sorted({*known_job_types.get(cls, ()), *await wk.served_types(pool, cls)})
            raise ApiError(400, f"job type '{job}' is not served in resource class '{cls}' "
                           f"(known job types: {', '.join(known) or 'none'}); start a worker "
                           f"that serves it first", "job.type")
        return [f"no worker of resource class '{cls}' has ever served job type '{job}': its "
                f"runs will wait READY until one does"]

    @app.post("/v1/schedules", status_code=201, response_model=ScheduleCreated,
              responses={**_errors(400, 403, 409, 429), 201: {"headers": _WRITE_HEADERS}},
              tags=["schedules"], summary="Create a schedule")
    async def create_schedule(
        body: ScheduleIn, tenant: TenantDep,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key", min_length=1, max_length=200,
            description="the same key and body replays the first answer")] = None,
    ) -> JSONResponse:
        spec = _to_spec(body)
        check_job(tenant, spec)
        warnings = await job_warnings(spec)
        reply, token = await send(tenant, body.schedule_id,
                                  m.CreateSchedule(spec=spec, request_key=idempotency_key))
        created = written(ScheduleWritten(schedule_id=body.schedule_id,
                                          revision=reply.body["revision"],
                                          next_run_at=reply.body.get("next_run_at")), 201, token)
        return with_warnings(created, warnings)

    @app.get("/v1/schedules/{schedule_id}", response_model=ScheduleOut,
             responses=_errors(400, 404), tags=["schedules"], summary="Read a schedule",
             dependencies=[ConsistentDep])
    async def get_schedule(schedule_id: ScheduleIdPath, tenant: TenantDep) -> JSONResponse:
        row = await schedule_row(tenant, schedule_id)
        content = await schedule_document(need_rm(), row, datetime.now(timezone.utc))
        return JSONResponse(content, headers={"ETag": f'"{row["revision"]}"'})

    @app.put("/v1/schedules/{schedule_id}", response_model=RevisedOut,
             responses={**_errors(400, 403, 404, 409, 428), 200: {"headers": _WRITE_HEADERS}},
             tags=["schedules"], summary="Revise a schedule (If-Match: revision)")
    async def revise_schedule(
        schedule_id: ScheduleIdPath, body: ScheduleDefinition, tenant: TenantDep,
        if_match: Annotated[str | None, Header(alias="If-Match",
                                               description="the revision being revised")] = None,
    ) -> JSONResponse:
        if if_match is None:
            raise ApiError(428, "If-Match with the current revision is required", "If-Match")
        text = if_match.strip().removeprefix("W/").strip('"')
        # ASCII digits only (isdigit also takes '²'), and a revision fits a bigint
        if not (text.isascii() and text.isdigit()) or len(text) > 19 or not 1 <= int(text) <= lim.MAX_INT:
            raise ApiError(400, f"invalid If-Match '{if_match}': expected a revision", "If-Match")
        spec = _to_spec(body)
        check_job(tenant, spec)
        reply, token = await send(tenant, schedule_id,
                                  m.ReviseSchedule(spec=spec, expected_revision=int(text)))
        return written(RevisedOut(revision=reply.body["revision"],
                                  next_run_at=reply.body.get("next_run_at")), 200, token,
                       {"ETag": f'"{reply.body["revision"]}"'})

    async def _lifecycle(tenant: Tenant, schedule_id: str, payload: Any) -> JSONResponse:
        reply, token = await send(tenant, schedule_id, payload)
        b = reply.body
        return written(ScheduleStateOut(schedule_id=schedule_id, revision=b["revision"],
                                        state=b["state"], next_run_at=b.get("next_run_at")),
                       200, token)

    _life: dict[str, Any] = {"response_model": ScheduleStateOut, "tags": ["schedules"],
             "responses": {**_errors(404), 200: {"headers": _WRITE_HEADERS}}}

    @app.post("/v1/schedules/{schedule_id}:pause", summary="Pause a schedule", **_life)
    async def pause_schedule(schedule_id: ScheduleIdPath, tenant: TenantDep) -> JSONResponse:
        return await _lifecycle(tenant, schedule_id, m.PauseSchedule())

    @app.post("/v1/schedules/{schedule_id}:resume", summary="Resume a schedule", **_life)
    async def resume_schedule(schedule_id: ScheduleIdPath, tenant: TenantDep) -> JSONResponse:
        return await _lifecycle(tenant, schedule_id, m.ResumeSchedule())

    @app.delete("/v1/schedules/{schedule_id}", summary="Delete a schedule", **_life)
    async def delete_schedule(schedule_id: ScheduleIdPath, tenant: TenantDep) -> JSONResponse:
        return await _lifecycle(tenant, schedule_id, m.DeleteSchedule())

    # ---------------------------------------------------------------- runs

    @app.post("/v1/schedules/{schedule_id}/runs", status_code=201, response_model=RunCreated,
              responses={**_errors(400, 404, 409), 201: {"headers": _WRITE_HEADERS}},
              tags=["runs"], summary="Trigger a run now (Idempotency-Key required)")
    async def trigger_run(
        schedule_id: ScheduleIdPath, tenant: TenantDep,
        idempotency_key: Annotated[str, Header(
            alias="Idempotency-Key", min_length=1, max_length=200,
            description="the same key and body give the same run")],
        body: Annotated[TriggerIn | None, Body()] = None,
    ) -> JSONResponse:
        params = body.params if body is not None else None
        reply, token = await send(tenant, schedule_id,
                                  m.TriggerRun(request_key=idempotency_key, params=params))
        return written(RunCreated(run_id=reply.body["run_id"], state=reply.body["state"]),
                       201, token)

    @app.get("/v1/schedules/{schedule_id}/runs", response_model=RunPage,
             responses=_errors(400, 404), tags=["runs"],
             summary="A schedule's runs, newest first", dependencies=[ConsistentDep])
    async def list_runs(
        schedule_id: ScheduleIdPath, tenant: TenantDep,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        after: Annotated[str | None, Query(description="nextCursor of the previous page")] = None,
        state: Annotated[str | None, Query(description="comma-separated run states")] = None,
    ) -> JSONResponse:
        read = need_rm()
        states: list[str] | None = None
        if state:
            states = sorted({s.strip().upper() for s in state.split(",") if s.strip()})
            bad = [s for s in states if s not in _RUN_STATES]
            if bad or not states:
                raise ApiError(400, f"invalid state '{state}': expected {', '.join(_RUN_STATES)}",
                               "state")
        await schedule_row(tenant, schedule_id)
        offsets, wm_time = await read.offsets()  # read before the rows: a lower bound
        cur: dict[str, Any] | None = None
        if after:
            cur = _decode_cursor(after)
            if cur.get("s") != schedule_id or cur.get("f") != (",".join(states) if states else None):
                raise ApiError(400, "invalid after: the cursor belongs to another query", "after")
            bound, last = cur["b"], cur["l"]
        else:
            newest = await read.newest_run_key(tenant.name, schedule_id)
            bound, last = newest, None
        rows = [] if bound is None else await read.runs_page(
            tenant.name, schedule_id, bound, last, states, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = None
        if more:
            tail = rows[-1]
            next_cursor = _encode_cursor({
                "s": schedule_id, "f": ",".join(states) if states else None,
                "b": [bound[0].isoformat(), bound[1]],  # type: ignore[index]
                "l": [tail["scheduled_at"].isoformat(), tail["run_id"]],
            })
        n = await events_partitions() if log_ is not None else 0
        parts = {str(p): offsets.get(p, 0) for p in range(n)} or \
            {str(p): v for p, v in sorted(offsets.items())}
        served = await wk.live_served(read.pool) if any(
            r["state"] == "READY" for r in rows) else frozenset()
        page = RunPage(
            items=[RunItem(run_id=r["run_id"], schedule_id=r["schedule_id"],
                           scheduled_at=r["scheduled_at"], state=r["state"],
                           attempt=r["attempt"], started_at=r["started_at"],
                           finished_at=r["finished_at"],
                           waiting=wk.waiting_for(r["state"], r["resource_class"],
                                                  r["job_type"], served)) for r in rows],
            next_cursor=next_cursor, watermark=WatermarkOut(partitions=parts, time=wm_time),
        )
        return JSONResponse(_jsonable(page))

    @app.get("/v1/runs/{run_id}", response_model=RunOut, responses=_errors(400, 404),
             tags=["runs"], summary="A run with its attempts, result and effects",
             dependencies=[ConsistentDep])
    async def get_run(run_id: RunIdPath, tenant: TenantDep) -> JSONResponse:
        r = await run_row(tenant, run_id)
        read = need_rm()
        attempts = await read.attempts(run_id)
        effects = await read.effects(run_id)
        result = None
        if r["result_checksum"] is not None:
            result = ResultOut(checksum=r["result_checksum"], size=r["result_size"] or 0,
                               uri=r["result_uri"], attempt=r["result_attempt"],
                               inline=_json(r["result_inline"]) if r["result_uri"] is None else None)
        out = RunOut(
            run_id=r["run_id"], schedule_id=r["schedule_id"], revision=r["revision"],
            trigger=r["trigger"], request_key=r["request_key"], scheduled_at=r["scheduled_at"],
            due_at=r["due_at"], state=r["state"], attempt=r["attempt"], job_type=r["job_type"],
            params=_json(r["params"]), resource_class=r["resource_class"],
            priority=r["priority"], ready_at=r["ready_at"], retry_at=r["retry_at"],
            started_at=r["started_at"], finished_at=r["finished_at"],
            lateness_ms=r["lateness_ms"],
            attempts=[AttemptOut(attempt=a["attempt"], fence=a["fence"], worker_id=a["worker_id"],
                                 claimed_at=a["claimed_at"], lease_until=a["lease_until"],
                                 outcome=a["outcome"], error_class=a["error_class"],
                                 error=a["error"], finished_at=a["finished_at"])
                      for a in attempts],
            result=result, skipped_reason=r["skipped_reason"],
            skipped_through=r["skipped_through"], skipped_count=r["skipped_count"],
            cancellation_requested=r["cancellation_requested"], cancel_reason=r["cancel_reason"],
            dead_reason=r["dead_reason"], dead_message=r["dead_message"],
            last_error_class=r["last_error_class"], last_error=r["last_error"],
            reconciliation=_json(r["reconciliation"]),
            reconciliation_resolution=_json(r["reconciliation_resolution"]),
            effects=[EffectOut(effect_id=e["effect_id"], kind=e["kind"], state=e["state"],
                               attempts=e["attempts"], evidence=_json(e["evidence"]),
                               created_at=e["created_at"], updated_at=e["updated_at"])
                     for e in effects],
            waiting=wk.waiting_for(r["state"], r["resource_class"], r["job_type"],
                                   await wk.live_served(read.pool))
            if r["state"] == "READY" else None,
        )
        content = _jsonable(out)
        if result is not None:  # uri | inline: exactly one of them is shown
            content["result"].pop("inline" if result.uri is not None else "uri")
        return JSONResponse(content, headers={"ETag": f'"{r["revision"]}"'})

    # a run command finds the run's schedule (its partition key) in the read model, so it
    # honours a consistency token too
    _run_write: dict[str, Any] = {"response_model": RunWritten, "tags": ["runs"], "dependencies": [ConsistentDep]}

    @app.post("/v1/runs/{run_id}:cancel", summary="Cancel a run",
              responses={**_errors(404, 409), 200: {"description": "cancelled",
                                                    "headers": _WRITE_HEADERS},
                         202: {"model": RunWritten, "description": "cancellation requested "
                               "(the run is executing)", "headers": _WRITE_HEADERS}},
              **_run_write)
    async def cancel_run(run_id: RunIdPath, tenant: TenantDep,
                         body: Annotated[CancelIn | None, Body()] = None) -> JSONResponse:
        r = await run_row(tenant, run_id)
        reply, token = await send(tenant, r["schedule_id"], m.CancelRun(
            run_id=run_id, reason=body.reason if body else ""))
        outcome = reply.body.get("outcome")
        return written(RunWritten(run_id=run_id, state=reply.body.get("state", ""),
                                  outcome=outcome), 202 if outcome == "requested" else 200, token)

    @app.post("/v1/runs/{run_id}:redrive", summary="Redrive a DEAD run (same run ID)",
              responses={**_errors(404, 409), 200: {"headers": _WRITE_HEADERS}}, **_run_write)
    async def redrive_run(run_id: RunIdPath, tenant: TenantDep) -> JSONResponse:
        r = await run_row(tenant, run_id)
        reply, token = await send(tenant, r["schedule_id"], m.RedriveRun(run_id=run_id))
        return written(RunWritten(run_id=run_id, state=reply.body.get("state", "READY"),
                                  attempt=reply.body.get("attempt")), 200, token)

    @app.post("/v1/runs/{run_id}:reconcile", summary="Resolve a RECONCILING run",
              responses={**_errors(400, 404, 409), 200: {"headers": _WRITE_HEADERS}},
              **_run_write)
    async def reconcile_run(run_id: RunIdPath, body: ReconcileIn, tenant: TenantDep) -> JSONResponse:
        r = await run_row(tenant, run_id)
        reply, token = await send(tenant, r["schedule_id"], m.ResolveReconciliation(
            run_id=run_id, decision=body.decision, note=body.note, effect_id=body.effect_id))
        return written(RunWritten(run_id=run_id, state=reply.body.get("state", "")), 200, token)

    # ---------------------------------------------------------------- workers

    async def viewer(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Tenant | None:
        """An operator (None: sees every job type) or a tenant (sees the job types it may
        run); anyone else is 401."""
        token = creds.credentials if creds is not None and creds.scheme.lower() == "bearer" \
            else ""
        if token and tenants.operator_tokens is not None and tenants.is_operator(token):
            return None
        return await tenant_of(creds)

    @app.get("/v1/workers", response_model=WorkerPage, responses=_errors(400),
             tags=["workers"], summary="Workers: their classes, job types and liveness")
    async def list_workers(
        who: Annotated[Tenant | None, Depends(viewer)],
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        after: Annotated[str | None, Query(description="nextCursor of the previous page")] = None,
        live: Annotated[bool | None, Query(description="only live (true) or not live "
                                           "(false) workers")] = None,
    ) -> JSONResponse:
        read = need_rm()
        last: str | None = None
        if after:
            last = _decode_worker_cursor(after, live)
        rows = await wk.workers_page(read.pool, after=last, limit=limit + 1, live=live)
        more = len(rows) > limit
        rows = rows[:limit]
        allowed = None if who is None else who.allowed_jobs
        items = [worker_out(w, allowed) for w in rows]
        page = WorkerPage(items=items, next_cursor=_encode_cursor(
            {"k": "workers", "l": rows[-1].worker_id, "f": live}) if more else None)
        return JSONResponse(_jsonable(page))

    # ---------------------------------------------------------------- preview, ops

    @app.get("/v1/preview", response_model=PreviewOut, responses=_errors(400),
             tags=["preview"], summary="The next instants of a rule")
    async def preview(
        tenant: TenantDep,
        cron: str | None = None, timezone_: Annotated[str, Query(alias="timezone")] = "UTC",
        every: str | None = None, at: str | None = None, anchor: str | None = None,
        count: Annotated[int, Query(ge=1, le=1000)] = PREVIEW_COUNT,
        from_: Annotated[str | None, Query(alias="from")] = None,
    ) -> JSONResponse:
        given = [n for n, v in (("cron", cron), ("every", every), ("at", at)) if v is not None]
        if len(given) != 1:
            raise ApiError(400, "exactly one of cron, every, at is required",
                           given[1] if len(given) > 1 else "cron")
        try:
            zone = resolve_zone(timezone_)
            start = (parse_instant(from_, timezone_, field="from") if from_
                     else datetime.now(timezone.utc).replace(microsecond=0))
            if every is not None:
                anchor_at = parse_instant(anchor, timezone_, field="anchor") if anchor else start
                trigger = compile_trigger(every=every, anchor=anchor_at, timezone=timezone_)
            else:
                trigger = compile_trigger(cron=cron, at=at, timezone=timezone_)
        except RecurrenceError as exc:
            raise ApiError(400, str(exc), _camel_path(exc.field)) from None
        rows = [InstantOut(utc=t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                           local=t.astimezone(zone).isoformat(timespec="seconds"))
                for t in upcoming(trigger, start, count)]
        return JSONResponse(_jsonable(PreviewOut(instants=rows)))

    @app.get("/healthz", tags=["ops"], summary="Liveness and database reachability",
             responses={503: {"model": ErrorBody}})
    async def healthz() -> JSONResponse:
        try:
            if pool is not None:
                await asyncio.wait_for(pool.fetchval("SELECT 1"), 5)
        except Exception as exc:  # noqa: BLE001 - any failure is "not healthy"
            raise ApiError(503, f"database unreachable: {exc}") from None
        body: dict[str, Any] = {"status": "ok"}
        if rm is not None:
            offsets, t = await rm.offsets()
            body["watermark"] = {"partitions": {str(p): n for p, n in sorted(offsets.items())},
                                 "time": _iso(t)}
        return JSONResponse(body)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics (an operator token)",
             response_class=Response, responses={
                 200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
                 **_errors(403)})
    async def prometheus(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Response:
        if tenants.operator_tokens is not None:  # a tenants file: operators only
            token = creds.credentials if creds is not None else ""
            if not token:
                raise ApiError(401, "missing bearer token (an operator token)",
                               "Authorization", headers={"WWW-Authenticate": "Bearer"})
            if not tenants.is_operator(token):
                if tenants.by_token(token) is not None:
                    raise ApiError(403, "a tenant token cannot read /metrics: use an "
                                   "operator token", "Authorization")
                raise ApiError(401, "unknown token", "Authorization",
                               headers={"WWW-Authenticate": "Bearer"})
        if metrics is None:
            raise ApiError(503, "no read model configured")
        snap = await metrics.snapshot()
        return Response(render(snap), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


_RUN_STATES: tuple[str, ...] = ("PENDING", "READY", "LEASED", "RETRY_WAIT", "SUCCEEDED", "DEAD",
                                "RECONCILING", "CANCELLED", "SKIPPED")


def worker_out(w: "wk.WorkerRow", allowed: Iterable[str] | None) -> WorkerOut:
    """A worker as the API shows it; ``allowed`` limits the job types shown (a tenant's)."""
    classes = wk.jobs_in(w.classes, allowed)
    return WorkerOut(worker_id=w.worker_id, started_at=w.started_at, last_seen=w.last_seen,
                     live=w.live, stopped=w.stopped,
                     classes=[WorkerClassOut(resource_class=c, job_types=list(s["jobTypes"]),
                                             slots=int(s.get("slots", 0)))
                              for c, s in sorted(classes.items())])


def _json(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return orjson.loads(value)
    return value


def m_topics_default() -> Any:
    from chronolog.log.port import Topics

    return Topics()


def _query_names(dependant: Any) -> frozenset[str]:
    """The query parameters a route takes, its dependencies' included."""
    names: set[str] = set()
    todo = [dependant]
    while todo:
        d = todo.pop()
        names.update(p.alias for p in d.query_params)
        todo.extend(d.dependencies)
    return frozenset(names)


def _documented(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document with every status the server can answer: validation is
    400 (never FastAPI's 422); every route may answer 400 (an unknown query parameter) and
    500 (a bug: still the error body); a tenant route 401 and 503; a route with an ID in its
    path 404; a write 409, 413 (body size), 415 (not JSON) and 429 (rate limit)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = FastAPI.openapi(app)
    for path, item in doc["paths"].items():
        for method, op in item.items():
            codes = {400, 500}
            if path.startswith("/v1/"):
                codes |= {401, 503}
            if method in ("post", "put", "delete"):
                codes |= {409, 413, 415, 429}
            if "{" in path:
                codes.add(404)
            if path == "/metrics":
                codes |= {401, 403, 503}
            responses = op["responses"]
            responses.pop("422", None)
            for code in sorted(codes):
                responses.setdefault(str(code), {
                    "description": _STATUS_WORDS[code],
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
    for unused in ("HTTPValidationError", "ValidationError"):
        doc.get("components", {}).get("schemas", {}).pop(unused, None)
    return doc


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document (no client, database or tenants needed)."""
    return create_app(None, None, Tenants()).openapi()


def openapi_json() -> str:
    """``schemas/api/openapi.json`` as ``make schemas`` writes it (stable key order)."""
    import json

    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"

