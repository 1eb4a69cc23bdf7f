"""``/v1/schedules``: create, list, read, revise (whole or by a merge patch), pause, resume,
delete.

``GET /v1/schedules`` lists the tenant's schedules by ID (code-point order), ``limit`` (1-500,
default 100) at a time with ``nextCursor``; ``state`` (a comma-separated list, any case;
default every state but DELETED), ``jobType``, ``resourceClass`` and ``prefix`` (a literal
schedule-ID prefix) filter, and the cursor pins them (``chronolog.queries.read_model``).

``GET /v1/schedules/{id}`` (``chronolog.queries.read_model.schedule_document``) returns
``definition`` (the body of a PUT), ``state``, ``revision`` (also the ``ETag``),
``nextRunAt``, ``nextDueAt`` and ``preview``: the next 5 occurrences ``{scheduledAt, dueAt,
local}`` where ``dueAt`` includes the schedule's deterministic jitter (the same hash the
processor uses). An ACTIVE schedule's preview starts at its ``nextRunAt`` (which may be
slightly in the past when a tick is due); a PAUSED (or DELETED) schedule's preview is empty —
nothing runs while paused. A PAUSED schedule has ``resume`` instead: what a resume now would
run or skip, from the misfire planner the processor applies (``commands.backlog.plan_due``),
skips of one reason collapsed into ranges; ``delay`` schedules show only ``nextRunAt`` (later
instants depend on when runs finish). The preview does not count ``maxCount`` down (an
exhausted schedule has no ``nextRunAt`` and so no preview). A schedule with no further
instant (a one-shot that fired, ``end`` passed, ``maxCount`` reached) is ``COMPLETED`` with
``completedAt`` and ``completedReason`` (``at`` | ``end`` | ``max_count``): it no longer
counts against the quota, its runs stay listed, a PUT, pause, resume or trigger answers 409
and a DELETE deletes it.

Max schedules (429) is the processors' alone: a create of a tenant with a quota is answered
once the tenant's quota aggregate (one partition of the log) reserved a slot for it or
refused one, so the quota is exact under concurrency, whichever entry point sent the create.
The API does not pre-check it against the read model, which lags the log (it would refuse a
create right after a delete). The storage budget (429, ``storage_budget``) is the processors'
too: a create or revision whose params do not fit the tenant's hour is refused there.
The job-type check (403) is done here (early answer) and by the processor (the
authority). Creating a schedule whose job type no worker of its class has ever announced is
201 with ``warnings``; an app given ``known_job_types`` (the dev node) answers 400 naming the
job types it knows instead.

``PUT /v1/schedules/{id}`` replaces the whole definition; ``PATCH`` changes only what its
body names: a JSON merge patch (RFC 7396, ``application/merge-patch+json`` or
``application/json``) applied to the definition the read model holds at the ``If-Match``
revision, then validated and sent exactly as the same body of a PUT, with the same
``If-Match``, so the processor's revision check still refuses a concurrent revise (409). A
read model still older than that revision is read again once it has caught up with the log.
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from chronolog.api.auth import TenantDep
from chronolog.api.context import ConsistentDep, Context, with_warnings, written
from chronolog.api.errors import ApiError, error_responses
from chronolog.api.models import (
    MAX_SCHEDULE_ID,
    BackfillIn,
    PauseIn,
    RevisedOut,
    ScheduleCreated,
    ScheduleIn,
    ScheduleStateOut,
    ScheduleWritten,
)
from chronolog.api.routes.params import (
    IDEMPOTENCY_KEY,
    WRITE_HEADERS,
    ScheduleIdPath,
    if_match_revision,
)
from chronolog.domain import messages as m
from chronolog.queries.documents import (
    BackfillOut,
    ScheduleDefinition,
    ScheduleOut,
    SchedulePage,
    backfill_out,
    patched_definition,
    spec_limits,
    to_spec,
)
from chronolog.queries.read_model import (
    LIST_PAGE,
    MAX_PAGE,
    SCHEDULE_STATES,
    ScheduleQuery,
    decode_schedule_cursor,
    parse_schedule_states,
    schedule_document,
    schedules_page,
)
from chronolog.tenants import Tenant

router = APIRouter(tags=["schedules"])


@router.post("/v1/schedules", status_code=201, response_model=ScheduleCreated,
             responses={**error_responses(400, 403, 409, 429), 201: {"headers": WRITE_HEADERS}},
             summary="Create a schedule")
async def create_schedule(
    body: ScheduleIn, tenant: TenantDep, ctx: Context,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", **IDEMPOTENCY_KEY,
        description="the same key and body replays the first answer")] = None,
) -> JSONResponse:
    spec = to_spec(body)
    ctx.check_job(tenant, spec)
    await ctx.check_calendars(tenant, spec)
    warnings = await ctx.job_warnings(spec)
    reply, mark = await ctx.send(tenant, body.schedule_id,
                                  m.CreateSchedule(spec=spec, request_key=idempotency_key))
    created = written(ScheduleWritten(schedule_id=body.schedule_id,
                                      revision=reply.body["revision"],
                                      next_run_at=reply.body.get("next_run_at")), 201, mark)
    return with_warnings(created, warnings)


@router.get("/v1/schedules", response_model=SchedulePage, responses=error_responses(400),
            summary="The tenant's schedules by ID", dependencies=[ConsistentDep])
async def list_schedules(
    tenant: TenantDep, ctx: Context,
    state: Annotated[str | None, Query(
        description=f"comma-separated schedule states ({', '.join(SCHEDULE_STATES)}; any "
        "case); default: every state but DELETED")] = None,
    job_type: Annotated[str | None, Query(
        alias="jobType", description="only schedules of this job type",
        **spec_limits(m.JobSpec, "type"))] = None,
    resource_class: Annotated[str | None, Query(
        alias="resourceClass", description="only schedules of this resource class",
        **spec_limits(m.ScheduleSpec, "resource_class"))] = None,
    prefix: Annotated[str | None, Query(
        min_length=1, max_length=MAX_SCHEDULE_ID,
        description="only schedule IDs that start with this text (literally: % and _ "
        "are plain characters)")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = LIST_PAGE,
    after: Annotated[str | None, Query(description="nextCursor of the previous page (made "
                                       "with the same filters)")] = None,
) -> JSONResponse:
    read = ctx.read()
    q = ScheduleQuery(states=parse_schedule_states(state), job_type=job_type,
                      resource_class=resource_class, prefix=prefix)
    last = decode_schedule_cursor(after, q) if after else None
    page = await schedules_page(read, tenant.name, q, after=last, limit=limit,
                                partitions=await ctx.events_partitions())
    return JSONResponse(page)


@router.get("/v1/schedules/{schedule_id}", response_model=ScheduleOut,
            responses=error_responses(400, 404), summary="Read a schedule",
            dependencies=[ConsistentDep])
async def get_schedule(schedule_id: ScheduleIdPath, tenant: TenantDep,
                       ctx: Context) -> JSONResponse:
    row = await ctx.schedule_row(tenant, schedule_id)
    content = await schedule_document(ctx.read(), row, datetime.now(UTC))
    return JSONResponse(content, headers={"ETag": f'"{row["revision"]}"'})


def _revision(if_match: str | None) -> int:
    """The revision an ``If-Match`` names (428 without one, 400 for anything else)."""
    if if_match is None:
        raise ApiError(428, "If-Match with the current revision is required", "If-Match")
    return if_match_revision(if_match)


IfMatch = Annotated[str | None, Header(alias="If-Match",
                                       description="the revision being revised")]


async def _revise(ctx: Context, tenant: Tenant, schedule_id: str, body: ScheduleDefinition,
                  revision: int) -> JSONResponse:
    spec = to_spec(body)
    ctx.check_job(tenant, spec)
    await ctx.check_calendars(tenant, spec)
    reply, mark = await ctx.send(tenant, schedule_id,
                                  m.ReviseSchedule(spec=spec, expected_revision=revision))
    return written(RevisedOut(revision=reply.body["revision"],
                              next_run_at=reply.body.get("next_run_at")), 200, mark,
                   {"ETag": f'"{reply.body["revision"]}"'})


@router.put("/v1/schedules/{schedule_id}", response_model=RevisedOut,
            responses={**error_responses(400, 403, 404, 409, 428),
                       200: {"headers": WRITE_HEADERS}},
            summary="Revise a schedule: replace its whole definition (If-Match: revision)")
async def revise_schedule(
    schedule_id: ScheduleIdPath, body: ScheduleDefinition, tenant: TenantDep, ctx: Context,
    if_match: IfMatch = None,
) -> JSONResponse:
    return await _revise(ctx, tenant, schedule_id, body, _revision(if_match))


_PATCH_EXAMPLE = {"every": "30s", "job": {"params": {"region": "eu"}}, "end": None}
_PATCH_BODY = {"type": "object", "additionalProperties": True,
               "description": "a JSON merge patch (RFC 7396) of the definition: members "
               "given replace the current ones (objects merge, member by member), null "
               "removes an optional member, arrays replace whole",
               "examples": [_PATCH_EXAMPLE]}


@router.patch(
    "/v1/schedules/{schedule_id}", response_model=RevisedOut,
    responses={**error_responses(400, 403, 404, 409, 428), 200: {"headers": WRITE_HEADERS}},
    summary="Revise some fields of a schedule: a JSON merge patch (If-Match: revision)",
    dependencies=[ConsistentDep],
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/merge-patch+json": {"schema": _PATCH_BODY},
        "application/json": {"schema": _PATCH_BODY}}}})
async def patch_schedule(
    schedule_id: ScheduleIdPath, request: Request, tenant: TenantDep, ctx: Context,
    if_match: IfMatch = None,
) -> JSONResponse:
    revision = _revision(if_match)
    if not await request.body():
        raise ApiError(400, "a JSON body is required: the merge patch", None)
    try:
        patch = await request.json()
    except ValueError:
        raise ApiError(400, "the body is not valid JSON", None) from None
    if not isinstance(patch, dict):
        raise ApiError(400, "a merge patch of a definition is a JSON object", None)
    row = await _at_revision(ctx, tenant, schedule_id, revision)
    try:
        body = patched_definition(row["spec"], patch)
    except ValidationError as exc:  # answered exactly as the same body of a PUT
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in exc.errors()]) from None
    return await _revise(ctx, tenant, schedule_id, body, revision)


async def _at_revision(ctx: Context, tenant: Tenant, schedule_id: str,
                       revision: int) -> Any:
    """The schedule's row in the read model at ``revision``, the base of a patch. A newer
    one: 409, as the processor answers a stale revision. An older one: the read model lags,
    so it is read again once it has caught up with the schedule's partition of the log as
    it is now (503 if that takes longer than the consistency bound); still older, no such
    revision was ever written: 409. A schedule the read model does not hold yet (created a
    moment ago) is waited for the same way: 404 only if the log has it not either."""
    row = await ctx.read().schedule(tenant.name, schedule_id)
    if (row is None or row["revision"] < revision) and ctx.log is not None:
        required = await ctx.tail_of_partition(tenant.name, schedule_id)
        if not await ctx.reached(required, ctx.consistency_timeout):
            raise ApiError(503, f"the read model has not reached revision {revision} of "
                           f"'{schedule_id}' within {ctx.consistency_timeout:g}s; retry "
                           f"shortly", None, headers={"Retry-After": "1"})
        row = None  # read again, caught up
    if row is None:
        row = await ctx.schedule_row(tenant, schedule_id)  # 404 if it is still missing
    if row["revision"] != revision:
        raise ApiError(409, f"expected revision {revision}, current is {row['revision']}",
                       "If-Match", revision=row["revision"])
    return row


async def _lifecycle(ctx: Context, tenant: Tenant, schedule_id: str,
                     payload: Any) -> JSONResponse:
    reply, mark = await ctx.send(tenant, schedule_id, payload)
    b = reply.body
    return written(ScheduleStateOut(schedule_id=schedule_id, revision=b["revision"],
                                    state=b["state"], next_run_at=b.get("next_run_at")),
                   200, mark)


_LIFECYCLE: dict[str, Any] = {
    "response_model": ScheduleStateOut,
    "responses": {**error_responses(404), 200: {"headers": WRITE_HEADERS}}}


@router.post("/v1/schedules/{schedule_id}:pause", summary="Pause a schedule", **_LIFECYCLE)
async def pause_schedule(schedule_id: ScheduleIdPath, tenant: TenantDep, ctx: Context,
                         body: Annotated[PauseIn | None, Body()] = None) -> JSONResponse:
    reason = body.reason if body is not None else ""
    return await _lifecycle(ctx, tenant, schedule_id, m.PauseSchedule(reason=reason))


@router.post("/v1/schedules/{schedule_id}:resume", summary="Resume a schedule", **_LIFECYCLE)
async def resume_schedule(schedule_id: ScheduleIdPath, tenant: TenantDep,
                          ctx: Context) -> JSONResponse:
    return await _lifecycle(ctx, tenant, schedule_id, m.ResumeSchedule())


@router.delete("/v1/schedules/{schedule_id}", summary="Delete a schedule", **_LIFECYCLE)
async def delete_schedule(schedule_id: ScheduleIdPath, tenant: TenantDep,
                          ctx: Context) -> JSONResponse:
    return await _lifecycle(ctx, tenant, schedule_id, m.DeleteSchedule())


@router.post("/v1/schedules/{schedule_id}:backfill", response_model=BackfillOut,
             responses={**error_responses(400, 404, 409), 200: {"headers": WRITE_HEADERS}},
             summary="Run the schedule's instants of a past range (Idempotency-Key required)")
async def backfill_schedule(
    schedule_id: ScheduleIdPath, body: BackfillIn, tenant: TenantDep, ctx: Context,
    idempotency_key: Annotated[str, Header(
        alias="Idempotency-Key", **IDEMPOTENCY_KEY,
        description="the same key and body give the same backfill")],
) -> JSONResponse:
    reply, mark = await ctx.send(tenant, schedule_id, m.BackfillSchedule(
        request_key=idempotency_key, start=body.start, end=body.end, overlap=body.overlap))
    return written(backfill_out(reply.body), 200, mark)

