"""Runs: trigger one now, list a schedule's runs or the tenant's (newest first, paged by
``nextCursor``), read one, and the run commands cancel, redrive and reconcile.

``GET /v1/runs`` lists the runs of every schedule of the tenant, newest first by
``(scheduledAt, runId)``, ``limit`` (1-500, default 100) at a time; ``state``, ``jobType``,
``scheduleId``, ``from`` (inclusive) and ``to`` (exclusive, on ``scheduledAt``; instants with
an offset or ``Z``) filter, and the cursor pins them. Each item is a schedule's run item
with its ``jobType``.

A run command finds the run's schedule — its partition key — in the read model, so it
honours a consistency token as reads do. A READY run's ``waiting`` says when no live worker
of its class serves its job type.
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query
from fastapi.responses import JSONResponse

from chronolog.api.auth import TenantDep
from chronolog.api.context import ConsistentDep, Context, written
from chronolog.api.errors import ApiError, error_responses
from chronolog.api.models import (
    MAX_SCHEDULE_ID,
    CancelIn,
    ReconcileIn,
    RunCreated,
    RunWritten,
    TriggerIn,
)
from chronolog.api.routes.params import IDEMPOTENCY_KEY, WRITE_HEADERS, RunIdPath, ScheduleIdPath
from chronolog.domain import limits as lim
from chronolog.domain import messages as m
from chronolog.domain.durations import format_duration
from chronolog.queries.documents import (
    ResultOut,
    RunListPage,
    RunOut,
    RunPage,
    jsonable,
    spec_limits,
)
from chronolog.queries.read_model import (
    LIST_PAGE,
    MAX_PAGE,
    RUN_STATES,
    RunQuery,
    decode_run_cursor,
    decode_run_list_cursor,
    parse_list_instant,
    parse_run_states,
    result_expired,
    run_document,
    run_list_page,
    runs_page,
)
from chronolog.telemetry.ids import run_trace_id

router = APIRouter(tags=["runs"])


@router.post("/v1/schedules/{schedule_id}/runs", status_code=201, response_model=RunCreated,
             responses={**error_responses(400, 404, 409), 201: {"headers": WRITE_HEADERS}},
             summary="Trigger a run now (Idempotency-Key required)")
async def trigger_run(
    schedule_id: ScheduleIdPath, tenant: TenantDep, ctx: Context,
    idempotency_key: Annotated[str, Header(
        alias="Idempotency-Key", **IDEMPOTENCY_KEY,
        description="the same key and body give the same run")],
    body: Annotated[TriggerIn | None, Body()] = None,
) -> JSONResponse:
    params = body.params if body is not None else None
    reply, mark = await ctx.send(tenant, schedule_id,
                                  m.TriggerRun(request_key=idempotency_key, params=params))
    run_id = reply.body["run_id"]
    return written(RunCreated(run_id=run_id, trace_id=run_trace_id(run_id),
                              state=reply.body["state"]), 201, mark)


@router.get("/v1/schedules/{schedule_id}/runs", response_model=RunPage,
            responses=error_responses(400, 404),
            summary="A schedule's runs, newest first", dependencies=[ConsistentDep])
async def list_runs(
    schedule_id: ScheduleIdPath, tenant: TenantDep, ctx: Context,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    after: Annotated[str | None, Query(description="nextCursor of the previous page")] = None,
    state: Annotated[str | None, Query(description="comma-separated run states")] = None,
) -> JSONResponse:
    read = ctx.read()
    states = parse_run_states(state)
    await ctx.schedule_row(tenant, schedule_id)
    cursor = decode_run_cursor(after, schedule_id, states) if after else None
    page = await runs_page(read, tenant.name, schedule_id, states=states, after=cursor,
                           limit=limit, partitions=await ctx.events_partitions())
    return JSONResponse(jsonable(page))


_INSTANT = ("an ISO-8601 instant with an offset or Z, e.g. 2026-03-08T09:00:00Z "
            "(1970-01-01 to 2999-12-31)")


@router.get("/v1/runs", response_model=RunListPage, responses=error_responses(400),
            summary="The tenant's runs, newest first", dependencies=[ConsistentDep])
async def list_all_runs(
    tenant: TenantDep, ctx: Context,
    state: Annotated[str | None, Query(
        description=f"comma-separated run states ({', '.join(RUN_STATES)}; any case)")] = None,
    job_type: Annotated[str | None, Query(
        alias="jobType", description="only runs of this job type",
        **spec_limits(m.JobSpec, "type"))] = None,
    schedule_id: Annotated[str | None, Query(
        alias="scheduleId", description="only this schedule's runs",
        max_length=MAX_SCHEDULE_ID, pattern=lim.SCHEDULE_ID_PATTERN)] = None,
    from_: Annotated[str | None, Query(
        alias="from", description=f"only runs scheduled at or after this instant: {_INSTANT}",
        max_length=64, json_schema_extra={"format": "date-time"})] = None,
    to: Annotated[str | None, Query(
        description=f"only runs scheduled before this instant: {_INSTANT}",
        max_length=64, json_schema_extra={"format": "date-time"})] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = LIST_PAGE,
    after: Annotated[str | None, Query(description="nextCursor of the previous page (made "
                                       "with the same filters)")] = None,
) -> JSONResponse:
    read = ctx.read()
    states = parse_run_states(state)
    q = RunQuery(states=tuple(states) if states else None, job_type=job_type,
                 schedule_id=schedule_id,
                 since=parse_list_instant(from_, "from") if from_ is not None else None,
                 until=parse_list_instant(to, "to") if to is not None else None)
    cursor = decode_run_list_cursor(after, q) if after else None
    page = await run_list_page(read, tenant.name, q, after=cursor, limit=limit,
                               partitions=await ctx.events_partitions())
    return JSONResponse(jsonable(page))


@router.get("/v1/runs/{run_id}", response_model=RunOut, responses=error_responses(400, 404),
            summary="A run with its attempts, result and effects",
            dependencies=[ConsistentDep])
async def get_run(run_id: RunIdPath, tenant: TenantDep, ctx: Context) -> JSONResponse:
    doc = await run_document(ctx.read(), tenant.name, run_id)
    if doc is None:
        raise ApiError(404, f"no run '{run_id}'", "runId")
    return JSONResponse(doc, headers={"ETag": f'"{doc["revision"]}"'})


@router.get("/v1/runs/{run_id}/result", response_model=ResultOut,
            responses=error_responses(400, 404, 410),
            summary="A run's result (410 once past the tenant's result_retention)",
            dependencies=[ConsistentDep])
async def get_run_result(run_id: RunIdPath, tenant: TenantDep, ctx: Context) -> JSONResponse:
    """The result of a succeeded run: its location (``uri``) or its inline value, with its
    checksum and size. 410 Gone once the run finished longer ago than the tenant's
    ``result_retention`` (its object is, or is about to be, removed by ``chronolog gc``)."""
    read = ctx.read()
    doc = await run_document(read, tenant.name, run_id)
    if doc is None:
        raise ApiError(404, f"no run '{run_id}'", "runId")
    if doc.get("result") is None:
        raise ApiError(404, f"run '{run_id}' has no result ({doc['state']})", "runId")
    window = ctx.tenants.result_retention(tenant.name, ctx.retention)
    row = await read.run(tenant.name, run_id)
    _, now = await read.offsets()
    if row is not None and result_expired(row["finished_at"], now, window):
        raise ApiError(410, f"the result of run '{run_id}' is past the tenant's "
                       f"result_retention ({format_duration(window)} after the run "
                       "finished)", "result_retention")
    return JSONResponse(doc["result"])


_RUN_WRITE: dict[str, Any] = {"response_model": RunWritten, "dependencies": [ConsistentDep]}


@router.post("/v1/runs/{run_id}:cancel", summary="Cancel a run",
             responses={**error_responses(404, 409),
                        200: {"description": "cancelled", "headers": WRITE_HEADERS},
                        202: {"model": RunWritten, "description": "cancellation requested "
                              "(the run is executing)", "headers": WRITE_HEADERS}},
             **_RUN_WRITE)
async def cancel_run(run_id: RunIdPath, tenant: TenantDep, ctx: Context,
                     body: Annotated[CancelIn | None, Body()] = None) -> JSONResponse:
    r = await ctx.run_row(tenant, run_id)
    reply, mark = await ctx.send(tenant, r["schedule_id"], m.CancelRun(
        run_id=run_id, reason=body.reason if body else "", scheduled_at=r["scheduled_at"]))
    outcome = reply.body.get("outcome")
    return written(RunWritten(run_id=run_id, state=reply.body.get("state", ""),
                              outcome=outcome), 202 if outcome == "requested" else 200, mark)


@router.post("/v1/runs/{run_id}:redrive", summary="Redrive a DEAD run (same run ID)",
             responses={**error_responses(404, 409), 200: {"headers": WRITE_HEADERS}},
             **_RUN_WRITE)
async def redrive_run(run_id: RunIdPath, tenant: TenantDep, ctx: Context) -> JSONResponse:
    r = await ctx.run_row(tenant, run_id)
    reply, mark = await ctx.send(tenant, r["schedule_id"], m.RedriveRun(
        run_id=run_id, scheduled_at=r["scheduled_at"]))
    return written(RunWritten(run_id=run_id, state=reply.body.get("state", "READY"),
                              attempt=reply.body.get("attempt")), 200, mark)


@router.post("/v1/runs/{run_id}:reconcile", summary="Resolve a RECONCILING run",
             responses={**error_responses(400, 404, 409), 200: {"headers": WRITE_HEADERS}},
             **_RUN_WRITE)
async def reconcile_run(run_id: RunIdPath, body: ReconcileIn, tenant: TenantDep,
                        ctx: Context) -> JSONResponse:
    r = await ctx.run_row(tenant, run_id)
    reply, mark = await ctx.send(tenant, r["schedule_id"], m.ResolveReconciliation(
        run_id=run_id, decision=body.decision, note=body.note, effect_id=body.effect_id))
    return written(RunWritten(run_id=run_id, state=reply.body.get("state", "")), 200, mark)
