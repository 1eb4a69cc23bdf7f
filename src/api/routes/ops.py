"""Operations: ``/healthz`` (readiness: the log and the read model answer; the projection
watermark) and ``/metrics`` (Prometheus; an operator token whenever the tenants come from a
file)."""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from chronolog.api.auth import Bearer, require_operator
from chronolog.api.context import Context
from chronolog.api.errors import ApiError, ErrorBody, error_responses
from chronolog.queries.documents import iso
from chronolog.queries.metrics import render
from chronolog.readiness import database_reachable, log_reachable

router = APIRouter(tags=["ops"])


@router.get("/healthz", summary="Readiness: the log and the read model answer",
            responses={503: {"model": ErrorBody}})
async def healthz(ctx: Context) -> JSONResponse:
    """200 with the projection watermark while the API can do its work: its log and its
    read model answer (and, in a node running its parts in one process, those parts are
    ready). 503 otherwise, the message naming what is away: "log unreachable: ...", "read
    model unreachable: ...", "processor: restoring partitions [...]" (separated by "; ")."""
    away = await unavailable_services(ctx)
    if away:
        raise ApiError(503, "; ".join(away), headers={"Retry-After": "1"})
    body: dict[str, Any] = {"status": "ok"}
    if ctx.rm is not None:
        offsets, t = await ctx.rm.offsets()
        body["watermark"] = {"partitions": {str(p): n for p, n in sorted(offsets.items())},
                             "time": iso(t)}
    return JSONResponse(body)


async def unavailable_services(ctx: Any) -> list[str]:
    """What the API cannot reach now (empty: ready): its log (a bounded request, and its
    reply reader in its group) and its read model (``SELECT 1``)."""
    away: list[str] = []
    if ctx.log is not None:
        why = await log_reachable(ctx.log)
        if why is None and ctx.client is not None and not ctx.client.following():
            why = "log unreachable: the reply reader is not in its group"
        if why is not None:
            away.append(why)
    if ctx.pool is not None:
        why = await database_reachable(ctx.pool)
        if why is not None:
            away.append(why)
    if ctx.alongside is not None:
        away.extend(ctx.alongside())
    return away


@router.get("/metrics", summary="Prometheus metrics (an operator token)",
            response_class=Response, responses={
                200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
                **error_responses(403)})
async def prometheus(request: Request, creds: Bearer, ctx: Context) -> Response:
    require_operator(ctx, request, creds)
    if ctx.metrics is None:
        raise ApiError(503, "no read model configured")
    snap = await ctx.metrics.snapshot()
    return Response(render(snap), media_type="text/plain; version=0.0.4; charset=utf-8")
