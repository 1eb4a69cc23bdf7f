"""``GET /v1/dlq``: dead letters — the records consumers skipped, with the reason — as the
projector folds them from the ``dlq`` topic (``chronolog.projections.dead_letters``).

Oldest first, ``limit`` (1-500, default 100) at a time with ``nextCursor``; ``consumer``
keeps one consumer's (``processor``, ``projector``, ``effects``, ``worker``,
``client:<id>``; a trailing ``*`` matches a prefix: ``client*``), and the cursor pins it.

A tenant token sees the dead letters whose record names that tenant (its JSON's
``tenant``, else a ``tenant/schedule`` key of ``commands`` or ``events``); an operator token
(``[operators] tokens`` of the tenants file) sees every one, those that name no tenant
included. Without a tenants file (a dev node: one tenant, ``/metrics`` open) every token
sees every one, as with ``/metrics``.
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from chronolog.api.auth import Viewer
from chronolog.api.context import Context
from chronolog.api.errors import error_responses
from chronolog.queries.documents import DeadLetterPage, jsonable
from chronolog.queries.read_model import (
    LIST_PAGE,
    MAX_PAGE,
    LetterQuery,
    dead_letters_page,
    decode_letter_cursor,
)

router = APIRouter(tags=["dlq"])


@router.get("/v1/dlq", response_model=DeadLetterPage, responses=error_responses(400),
            summary="Dead letters, oldest first (a tenant's own; all for an operator)")
async def list_dead_letters(
    who: Viewer, ctx: Context,
    consumer: Annotated[str | None, Query(
        min_length=1, max_length=200,
        description="only this consumer's (processor, projector, effects, worker, "
        "client:<id>; a trailing * matches a prefix)")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = LIST_PAGE,
    after: Annotated[str | None, Query(description="nextCursor of the previous page (made "
                                       "with the same consumer)")] = None,
) -> JSONResponse:
    read = ctx.read()
    tenant = None if who is None or ctx.tenants.operator_tokens is None else who.name
    q = LetterQuery(tenant=tenant, consumer=consumer)
    cursor = decode_letter_cursor(after, q) if after else None
    page = await dead_letters_page(read, q, after=cursor, limit=limit,
                                   dlq_topic=ctx.topics.dlq,
                                   partitions=await ctx.topic_partitions(ctx.topics.dlq))
    return JSONResponse(jsonable(page))
