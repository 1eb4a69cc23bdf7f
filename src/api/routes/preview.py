"""``GET /v1/preview``: the next instants of a rule (cron, every or at), without a schedule,
each marked as ``chronolog preview`` and the dashboard mark it (``dst``, ``note``: what
daylight saving time did to it), with the instants a transition left out under ``skipped``."""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from chronolog.api.auth import TenantDep
from chronolog.api.errors import ApiError, error_responses
from chronolog.api.models import InstantOut, PreviewOut
from chronolog.domain.recurrence import (
    RecurrenceError,
    compile_trigger,
    dst_marks,
    marked_rows,
    parse_instant,
    resolve_zone,
    upcoming,
)
from chronolog.queries.documents import camel_path, jsonable
from chronolog.queries.read_model import PREVIEW_COUNT

router = APIRouter(tags=["preview"])


@router.get("/v1/preview", response_model=PreviewOut, responses=error_responses(400),
            summary="The next instants of a rule")
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
                 else datetime.now(UTC).replace(microsecond=0))
        if every is not None:
            anchor_at = parse_instant(anchor, timezone_, field="anchor") if anchor else start
            trigger = compile_trigger(every=every, anchor=anchor_at, timezone=timezone_)
        else:
            trigger = compile_trigger(cron=cron, at=at, timezone=timezone_)
    except RecurrenceError as exc:
        raise ApiError(400, str(exc), camel_path(exc.field)) from None
    rows = [InstantOut.model_validate(row)
            for row in marked_rows(dst_marks(trigger, upcoming(trigger, start, count)), zone)]
    return JSONResponse(jsonable(PreviewOut(
        instants=[row for row in rows if row.dst != "skipped"],
        skipped=[row for row in rows if row.dst == "skipped"])))
