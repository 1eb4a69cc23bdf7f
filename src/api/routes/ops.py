"""Operations: ``/healthz`` (liveness, database reachability, the projection watermark) and
``/metrics`` (Prometheus; an operator token whenever the tenants come from a file)."""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from chronolog.api.auth import Bearer, require_operator
from chronolog.api.context import Context
from chronolog.api.errors import ApiError, ErrorBody, error_responses
from chronolog.projections.documents import iso
from chronolog.projections.metrics import render

router = APIRouter(tags=["ops"])


@router.get("/healthz", summary="Liveness and database reachability",
            responses={503: {"model": ErrorBody}})
async def healthz(ctx: Context) -> JSONResponse:
    try:
        if ctx.pool is not None:
            await asyncio.wait_for(ctx.pool.fetchval("SELECT 1"), 5)
    except Exception as exc:  # noqa: BLE001 - any failure is "not healthy"
        raise ApiError(503, f"database unreachable: {exc}") from None
    body: dict[str, Any] = {"status": "ok"}
    if ctx.rm is not None:
        offsets, t = await ctx.rm.offsets()
        body["watermark"] = {"partitions": {str(p): n for p, n in sorted(offsets.items())},
                             "time": iso(t)}
    return JSONResponse(body)


@router.get("/metrics", summary="Prometheus metrics (an operator token)",
            response_class=Response, responses={
                200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
                **error_responses(403)})
async def prometheus(creds: Bearer, ctx: Context) -> Response:
    require_operator(ctx.tenants, creds)
    if ctx.metrics is None:
        raise ApiError(503, "no read model configured")
    snap = await ctx.metrics.snapshot()
    return Response(render(snap), media_type="text/plain; version=0.0.4; charset=utf-8")
