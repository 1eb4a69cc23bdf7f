"""``GET /v1/workers``: the workers as they announced themselves, by worker ID with a
``nextCursor``, optionally only ``live=true|false``.

Workers are shared by every tenant, and which job types run where is an operator's fact: an
operator token sees every worker with all its job types; a tenant token sees every worker
(its ID, classes, slots, liveness) but only the job types that tenant may run
(``allowed_jobs``; all of them for a tenant without a list).
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from chronolog.api.auth import Viewer
from chronolog.api.context import Context
from chronolog.api.errors import error_responses
from chronolog.queries.documents import WorkerPage, jsonable
from chronolog.queries.read_model import MAX_PAGE, decode_worker_cursor, workers_page

router = APIRouter(tags=["workers"])


@router.get("/v1/workers", response_model=WorkerPage, responses=error_responses(400),
            summary="Workers: their classes, job types and liveness")
async def list_workers(
    who: Viewer, ctx: Context,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: Annotated[str | None, Query(description="nextCursor of the previous page")] = None,
    live: Annotated[bool | None, Query(description="only live (true) or not live "
                                       "(false) workers")] = None,
) -> JSONResponse:
    read = ctx.read()
    last = decode_worker_cursor(after, live) if after else None
    page = await workers_page(read.pool, after=last, limit=limit, live=live,
                              allowed=None if who is None else who.allowed_jobs)
    return JSONResponse(jsonable(page))
