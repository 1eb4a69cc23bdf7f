"""``/v1/calendars``: a tenant's exclusion calendars — put (create or revise), read, list,
delete (docs/design.md §23, docs/tour.md "Calendars").

``PUT /v1/calendars/{name}`` with a calendar (``timezone``, ``dates``, ``ranges``,
``windows``; ``chronolog.domain.calendars``) creates it (201) — without ``If-Match``: a
calendar that exists already is a 409 naming its revision, unless it holds this very
definition (200, the same revision: a PUT may be repeated) — or revises it (200) with
``If-Match: "<revision>"``, its current revision (409 on a stale one, 404 when there is none).
The answer is ``{name, revision}`` with the revision as ``ETag``.

``GET /v1/calendars/{name}`` returns the calendar's document (``chronolog.queries.calendars``)
with its revision as ``ETag``; ``GET /v1/calendars`` lists the tenant's calendars by name,
``limit`` (1-500, default 100) at a time, ``nextCursor`` for the next page.

``DELETE /v1/calendars/{name}`` (``If-Match`` optional) deletes it — refused (409) while a
schedule names it in its ``exclude``: the calendar's own aggregate knows its subscribers, so
the refusal is exact, not a read-model guess.

The revision rules are the processor's: a calendar is an aggregate on the log
(``chronolog.commands.calendars``), so two concurrent revisions of one revision cannot both
succeed whichever entry point sent them.
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query
from fastapi.responses import JSONResponse

from chronolog.api.auth import TenantDep
from chronolog.api.context import ConsistentDep, Context, written
from chronolog.api.errors import ApiError, error_responses
from chronolog.api.models import CalendarRemoved, CalendarWritten
from chronolog.api.routes.params import WRITE_HEADERS, if_match_revision
from chronolog.domain import messages as m
from chronolog.domain.calendars import CALENDAR_NAME_PATTERN, CalendarSpec
from chronolog.domain.ids import calendar_id
from chronolog.queries.calendars import (
    CALENDARS_PAGE,
    CalendarOut,
    CalendarPage,
    calendar_document,
    calendar_page,
)
from chronolog.queries.read_model import MAX_PAGE

router = APIRouter(tags=["calendars"])

CalendarNamePath = Annotated[str, Path(max_length=100, pattern=CALENDAR_NAME_PATTERN,
                                       description="a calendar's name")]
OptionalIfMatch = Annotated[str | None, Header(
    alias="If-Match", description="the calendar's current revision (required to revise; "
    "optional to delete)")]


@router.put("/v1/calendars/{name}", response_model=CalendarWritten,
            responses={**error_responses(400, 404, 409),
                       200: {"headers": WRITE_HEADERS}, 201: {"headers": WRITE_HEADERS}},
            summary="Create or revise a calendar (revise: If-Match: revision)")
async def put_calendar(name: CalendarNamePath, body: CalendarSpec, tenant: TenantDep,
                       ctx: Context, if_match: OptionalIfMatch = None) -> JSONResponse:
    expected = None if if_match is None else if_match_revision(if_match)
    reply, mark = await ctx.send(tenant, calendar_id(name), m.PutCalendar(
        name=name, spec=body, expected_revision=expected))
    revision = reply.body["revision"]
    return written(CalendarWritten(name=name, revision=revision),
                   201 if reply.body.get("created") else 200, mark,
                   {"ETag": f'"{revision}"'})


@router.get("/v1/calendars/{name}", response_model=CalendarOut,
            responses=error_responses(400, 404), summary="Read a calendar",
            dependencies=[ConsistentDep])
async def get_calendar(name: CalendarNamePath, tenant: TenantDep, ctx: Context) -> JSONResponse:
    doc = await calendar_document(ctx.read().pool, tenant.name, name)
    if doc is None:
        raise ApiError(404, f"no calendar '{name}'", "name")
    return JSONResponse(doc.model_dump(mode="json", by_alias=True),
                        headers={"ETag": f'"{doc.revision}"'})


@router.get("/v1/calendars", response_model=CalendarPage, responses=error_responses(400),
            summary="The tenant's calendars by name", dependencies=[ConsistentDep])
async def list_calendars(
    tenant: TenantDep, ctx: Context,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = CALENDARS_PAGE,
    after: Annotated[str | None, Query(max_length=100, pattern=CALENDAR_NAME_PATTERN,
                                       description="nextCursor of the previous page")] = None,
) -> JSONResponse:
    page = await calendar_page(ctx.read().pool, tenant.name, after, limit)
    return JSONResponse(page.model_dump(mode="json", by_alias=True, exclude_none=True))


@router.delete("/v1/calendars/{name}", response_model=CalendarRemoved,
               responses={**error_responses(400, 404, 409), 200: {"headers": WRITE_HEADERS}},
               summary="Delete a calendar no schedule names")
async def delete_calendar(name: CalendarNamePath, tenant: TenantDep, ctx: Context,
                          if_match: OptionalIfMatch = None) -> JSONResponse:
    expected = None if if_match is None else if_match_revision(if_match)
    reply, mark = await ctx.send(tenant, calendar_id(name), m.DeleteCalendar(
        name=name, expected_revision=expected))
    return written(CalendarRemoved(name=name, revision=reply.body["revision"]), 200, mark)
