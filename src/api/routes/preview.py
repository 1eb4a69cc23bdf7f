"""``GET /v1/preview``: the next instants of a rule (cron, every or at), without a schedule,
each marked as ``chronolog preview`` and the dashboard mark it (``dst``, ``note``: what
daylight saving time did to it), with the instants a transition left out under ``skipped``.
``exclude`` names the tenant's calendars as a schedule's ``exclude`` does: an instant one of
them excludes is still listed, marked ``excluded`` ``{calendar, entry}`` (the first that
excludes it, as the calendars read now; one that does not exist excludes every instant)."""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import Field

from chronolog.api.auth import TenantDep
from chronolog.api.context import Context
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
from chronolog.queries.documents import ExcludedOut, camel_path, is_null, jsonable
from chronolog.queries.exclusions import mark_excluded, parse_exclude
from chronolog.queries.read_model import PREVIEW_COUNT

router = APIRouter(tags=["preview"])


class PreviewInstantOut(InstantOut):
    """An instant of the rule, with its DST mark and the calendar that excludes it."""

    excluded: ExcludedOut | None = Field(
        default=None, exclude_if=is_null, description="one of the `exclude` calendars "
        "excludes this instant: a schedule naming them would record it SKIPPED (reason "
        "excluded), not run it; absent when none does or none is named")


class RulePreviewOut(PreviewOut):
    instants: list[PreviewInstantOut] = Field(  # type: ignore[assignment]
        description="the next `count` instants the rule fires at (an excluded one is listed, "
        "marked `excluded`)")


@router.get("/v1/preview", response_model=RulePreviewOut, responses=error_responses(400),
            summary="The next instants of a rule")
async def preview(
    tenant: TenantDep, ctx: Context,
    cron: str | None = None, timezone_: Annotated[str, Query(alias="timezone")] = "UTC",
    every: str | None = None, at: str | None = None, anchor: str | None = None,
    count: Annotated[int, Query(ge=1, le=1000)] = PREVIEW_COUNT,
    from_: Annotated[str | None, Query(alias="from")] = None,
    exclude: Annotated[str | None, Query(
        max_length=1100, description="comma-separated names of the tenant's calendars, as "
        "a schedule's `exclude`: mark the instants they exclude")] = None,
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
    try:
        names = parse_exclude(exclude)
    except ValueError as exc:
        raise ApiError(400, str(exc), "exclude") from None
    marks = dst_marks(trigger, upcoming(trigger, start, count))
    kept = [mark.at for mark in marks if mark.mark != "skipped"]
    calendars = await ctx.read().calendars(tenant.name, names) if names else {}
    excluded = dict(zip(kept, mark_excluded(names, calendars, kept), strict=True))
    rows = list(zip(marks, marked_rows(marks, zone), strict=True))
    return JSONResponse(jsonable(RulePreviewOut(
        instants=[PreviewInstantOut.model_validate({**row, "excluded": excluded[mark.at]})
                  for mark, row in rows if mark.mark != "skipped"],
        skipped=[InstantOut.model_validate(row) for mark, row in rows
                 if mark.mark == "skipped"])))
