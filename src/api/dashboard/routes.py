"""The dashboard's pages (GET, server-rendered) and actions (POST forms, then a redirect).

Pages read through the read model's functions the JSON API answers with
(``chronolog.queries.read_model``: ``schedules_page``, ``schedule_document``,
``runs_page``, ``run_document``, ``run_list_page``, ``dead_letters_page``, ``workers_page``)
plus the few views a page shows beside them (recent outcomes, occurrences, the next
instants with their DST marks, a schedule's events from the log). Actions call the JSON
API's route functions themselves (``chronolog.api.routes``): the same validation, the same
command, the same tenant checks and rate limit, the same wait for the read model — then
redirect (303) to the page they came from with what happened in a one-shot notice.

Every page and action is the session's tenant's: another tenant's schedule or run is 404,
exactly like a missing one, and is never listed.
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

import base64
import binascii
import hashlib
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from chronolog.api.context import Context
from chronolog.api.dashboard import session
from chronolog.api.dashboard.words import duration_words, exclusion_words, rule_words
from chronolog.api.errors import ApiError
from chronolog.api.models import PauseIn, ReconcileIn, ScheduleIn
from chronolog.api.routes import runs as run_routes
from chronolog.api.routes import schedules as schedule_routes
from chronolog.api.routes.params import RunIdPath, ScheduleIdPath
from chronolog.queries.documents import (
    InvalidDefinition,
    definition_of,
    iso,
    jsonable,
    plain_message,
)
from chronolog.queries.metrics import LATENESS_BUCKETS, MetricsSource
from chronolog.queries.read_model import (
    SCHEDULE_STATES,
    InvalidQuery,
    LetterQuery,
    RunQuery,
    ScheduleQuery,
    dead_letters_page,
    decode_run_cursor,
    decode_schedule_cursor,
    instants_with_dst,
    last_results,
    occurrences,
    parse_schedule_states,
    preview,
    recent_outcomes,
    run_document,
    run_list_page,
    runs_page,
    schedule_calendars,
    schedule_document,
    schedule_history,
    schedule_rows,
    schedules_page,
    workers_page,
)
from chronolog.tenants import Tenant

__all__ = ["HOME", "PREFIX", "router"]

PREFIX = "/ui"
HOME = f"{PREFIX}/"
FLASH_COOKIE = "chronolog_flash"
SCHEDULES_SHOWN = 50
RUNS_SHOWN = 20
RECENT = timedelta(hours=24)  # the window of a schedule's "recent outcomes"
# a schedule's own events, shown as its history (its revisions among them)
LIFECYCLE = ("ScheduleCreated", "ScheduleRevised", "SchedulePaused", "ScheduleResumed",
             "ScheduleDeleted", "ScheduleCompleted")

# every page: never cached (a tenant's data), never framed by another site (its buttons act),
# nothing loaded from anywhere but the node
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
}

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))


# ------------------------------------------------------------------ rendering


def _when(value: Any) -> str:
    """``2026-12-02T00:31:05.123Z`` -> ``2026-12-02 00:31:05 UTC``."""
    if not value:
        return "—"
    t = value if isinstance(value, datetime) else datetime.fromisoformat(
        str(value).replace("Z", "+00:00"))
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _local(text: Any) -> str:
    """``2026-12-02T09:00:00-05:00`` -> ``2026-12-02 09:00:00 −05:00``."""
    if not text:
        return "—"
    value = str(text)
    if len(value) >= 25 and value[10] == "T":
        return f"{value[:10]} {value[11:19]} {value[19:].replace('+00:00', 'UTC')}"
    return value


_BRIEF = ("attempt", "fence", "worker_id", "outcome", "error_class", "message", "reason",
          "decision", "note", "by", "effect_id", "retry_at", "lease_until", "state")


def _brief(payload: Any) -> str:
    """The telling fields of an event's payload, in one line."""
    if not isinstance(payload, dict):
        return ""
    shown = [f"{k}={payload[k]}" for k in _BRIEF if payload.get(k) not in (None, "", [], {})]
    return " · ".join(shown)[:300]


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


templates.env.filters["when"] = _when
templates.env.filters["local"] = _local
templates.env.filters["brief"] = _brief
templates.env.filters["pretty"] = _json
templates.env.filters["seconds"] = duration_words
templates.env.filters["excluded"] = exclusion_words
templates.env.globals["STATES"] = SCHEDULE_STATES
# a run state's mark in the timeline (the state is also written out for screen readers and
# in the tooltip: colour is never the only cue)
templates.env.globals["GLYPHS"] = {
    "SUCCEEDED": "✓", "DEAD": "✗", "SKIPPED": "⤼", "RECONCILING": "?", "CANCELLED": "⊘",
    "LEASED": "▶", "READY": "…", "PENDING": "…", "RETRY_WAIT": "↻"}


def _flash(request: Request) -> dict[str, Any] | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        data = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (binascii.Error, orjson.JSONDecodeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    form = data.get("form")
    return {"kind": "error" if data.get("kind") == "error" else "ok",
            "text": str(data.get("text", ""))[:500],
            "form": {str(k): str(v) for k, v in form.items()} if isinstance(form, dict) else {}}


async def mark(ctx: Any) -> str:
    """The projection's watermark as one opaque value (what ``/ui/watermark`` answers). A
    page reads it before its data and carries it: the page's poll refreshes the page's live
    parts as soon as the watermark differs, so nothing projected after the read is missed."""
    offsets, t = await ctx.read().offsets()
    raw = orjson.dumps({"p": {str(k): v for k, v in sorted(offsets.items())}, "t": iso(t)})
    return hashlib.sha256(raw).hexdigest()[:16]


def page(request: Request, template: str, tenant: Tenant | None, status: int = 200,
         **values: Any) -> HTMLResponse:
    """A page for the session's tenant, with the CSRF token its forms carry (and
    ``watermark``: ``mark`` read before the page's data, for its live parts)."""
    got = session.session_of(request) if tenant is not None else None
    flash = _flash(request)
    response = templates.TemplateResponse(request, template, {
        "tenant": tenant, "csrf": got[0].csrf if got is not None else "",
        "flash": flash, "here": _here(request), "watermark": "", **values},
        status_code=status)
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path="/")
    response.headers.update(PAGE_HEADERS)
    return response


def _here(request: Request) -> str:
    q = request.url.query
    return request.url.path + (f"?{q}" if q else "")


def not_found(request: Request, tenant: Tenant, what: str) -> HTMLResponse:
    return page(request, "error.html", tenant, 404, title="Not found", message=what)


def redirect(request: Request, to: str, text: str | None = None, kind: str = "ok",
             form: dict[str, str] | None = None) -> RedirectResponse:
    """303 to ``to`` with a one-shot notice (and the fields of a refused form, to fill it
    in again, when they fit in a cookie)."""
    response = RedirectResponse(to, status_code=303)
    if text is not None:
        note: dict[str, Any] = {"kind": kind, "text": text[:500]}
        kept = {k: v for k, v in (form or {}).items() if k not in ("csrf", "idempotency")}
        if kept and len(orjson.dumps(kept)) <= 1500:
            note["form"] = kept
        value = base64.urlsafe_b64encode(orjson.dumps(note))
        session.set_cookie(response, request, FLASH_COOKIE, value.decode().rstrip("="), 60)
    return response


def _safe_next(value: str | None, default: str) -> str:
    """A dashboard path to go back to (never another site)."""
    if value and value.startswith(PREFIX + "/") and "//" not in value and "\\" not in value:
        return value
    return default


# ------------------------------------------------------------------ who is asking


def _tenant(request: Request, ctx: Any) -> Tenant | None:
    got = session.session_of(request)
    return got[1] if got is not None else None


def _login_redirect(request: Request) -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/login?next={quote(_here(request), safe='')}",
                            status_code=303)


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST (the last value of a repeated field)."""
    body = await request.body()
    try:
        return dict(parse_qsl(body.decode(), keep_blank_values=True))
    except UnicodeDecodeError:
        return {}


def _refused(request: Request, tenant: Tenant | None, message: str,
             status: int = 403) -> Response:
    """A refused action: JSON for a client that asks for it, a page otherwise."""
    if "application/json" in request.headers.get("accept", ""):
        return ApiError(status, message, "csrf" if status == 403 else None).response()
    return page(request, "error.html", tenant, status, title="Refused", message=message)


async def _action(request: Request, ctx: Any) -> tuple[Tenant, dict[str, str]] | Response:
    """The tenant and form of an action, or the refusal: not logged in (401), or a
    missing or wrong CSRF token or a foreign Origin (403)."""
    tenant = _tenant(request, ctx)
    if tenant is None:
        return _refused(request, None, "not logged in: log in first", 401)
    form = await _form(request)
    if not session.origin_ok(request):
        return _refused(request, tenant, "the request came from another origin")
    if not session.csrf_ok(request, form.get("csrf")):
        return _refused(request, tenant, "missing or invalid CSRF token: reload the page "
                        "and try again")
    return tenant, form


def _problem(exc: Exception) -> str:
    """What a refused command or form says, in one line."""
    if isinstance(exc, ApiError):
        return exc.message if not exc.field or exc.field in exc.message \
            else f"{exc.field}: {exc.message}"
    if isinstance(exc, InvalidDefinition | InvalidQuery):
        return exc.message if not exc.field else f"{exc.field}: {exc.message}"
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        msg = plain_message(err)
        return f"{where}: {msg}" if where else msg
    return str(exc)


_REFUSALS = (ApiError, InvalidDefinition, InvalidQuery, ValidationError)


# ------------------------------------------------------------------ login


@router.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    return RedirectResponse(HOME, status_code=303)


@router.get(f"{PREFIX}/login")
async def login_page(request: Request, ctx: Context,
                     next: Annotated[str | None, Query(max_length=2000)] = None
                     ) -> Response:
    nonce = session.login_nonce()
    response = page(request, "login.html", None, title="Log in", login_csrf=nonce,
                    next=_safe_next(next, HOME), error=None)
    session.set_cookie(response, request, session.LOGIN_COOKIE, nonce, 3600)
    return response


@router.post(f"{PREFIX}/login")
async def login(request: Request, ctx: Context) -> Response:
    form = await _form(request)
    target = _safe_next(form.get("next"), HOME)
    if not session.origin_ok(request) or not session.login_ok(request, form.get("csrf")):
        return _refused(request, None, "missing or invalid CSRF token: reload the login "
                        "page and try again")
    token = form.get("token", "").strip()
    throttled = ctx.auth_failures.refusal(request)
    if throttled is not None:
        return throttled
    tenant = ctx.tenants.by_token(token) if token else None
    if tenant is None:
        if token:
            ctx.auth_failures.failed(request)
        nonce = session.login_nonce()
        refused = page(request, "login.html", None, 401, login_csrf=nonce, next=target,
                       error="unknown token" if token else "a token is required")
        session.set_cookie(refused, request, session.LOGIN_COOKIE, nonce, 3600)
        return refused
    response = redirect(request, target, f"logged in as tenant '{tenant.name}'")
    session.set_session(response, request, tenant, token)
    return response


@router.post(f"{PREFIX}/logout")
async def logout(request: Request, ctx: Context) -> Response:
    got = await _action(request, ctx)
    if isinstance(got, Response):
        return got
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    session.clear_session(response, request)
    return response


# ------------------------------------------------------------------ schedules


@router.get(HOME)
async def schedules_list(
    request: Request, ctx: Context,
    state: Annotated[str | None, Query(max_length=100)] = None,
    job_type: Annotated[str | None, Query(alias="jobType", max_length=200)] = None,
    prefix: Annotated[str | None, Query(max_length=200)] = None,
    after: Annotated[str | None, Query(max_length=2000)] = None,
) -> Response:
    tenant = _tenant(request, ctx)
    if tenant is None:
        return _login_redirect(request)
    rm = ctx.read()
    wm = await mark(ctx)
    problem = None
    items: list[dict[str, Any]] = []
    page_doc: dict[str, Any] = {"nextCursor": None}
    try:
        q = ScheduleQuery(states=parse_schedule_states(state), job_type=job_type or None,
                          prefix=prefix or None)
        cursor = decode_schedule_cursor(after, q) if after else None
        page_doc = await schedules_page(rm, tenant.name, q, after=cursor,
                                        limit=SCHEDULES_SHOWN,
                                        partitions=await ctx.events_partitions())
    except InvalidQuery as exc:
        problem = _problem(exc)
    else:
        ids = [i["scheduleId"] for i in page_doc["items"]]
        rows = await schedule_rows(rm, tenant.name, ids)
        counts = await recent_outcomes(rm, tenant.name, ids, datetime.now(UTC) - RECENT)
        last = await last_results(rm, tenant.name, ids)
        calendars = await schedule_calendars(rm, *rows.values())
        for item in page_doc["items"]:
            sid = item["scheduleId"]
            d = item["definition"]
            row = rows.get(sid)
            items.append({**item, "words": rule_words(d), "cron": d.get("cron"),
                          "zone": d.get("timezone") or "UTC", "jobType": d["job"]["type"],
                          "next": [{"local": p.local,
                                    "excluded": exclusion_words(jsonable(p.excluded))
                                    if p.excluded is not None else ""}
                                   for p in preview(row, 3, calendars)] if row else [],
                          "counts": counts.get(sid, {}), "last": last.get(sid)})
    filters = {"state": state or "", "jobType": job_type or "", "prefix": prefix or ""}
    more = None
    if page_doc.get("nextCursor"):
        more = "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in filters.items() if v)
        more += ("&" if len(more) > 1 else "") + f"after={page_doc['nextCursor']}"
    return page(request, "schedules.html", tenant, watermark=wm, title="Schedules", items=items,
                filters=filters, problem=problem, more=more,
                idempotency=secrets.token_hex(16))


@router.get(PREFIX + "/schedules/{schedule_id}")
async def schedule_page(
    request: Request, schedule_id: ScheduleIdPath, ctx: Context,
    after: Annotated[str | None, Query(max_length=2000)] = None,
) -> Response:
    tenant = _tenant(request, ctx)
    if tenant is None:
        return _login_redirect(request)
    rm = ctx.read()
    wm = await mark(ctx)
    row = await rm.schedule(tenant.name, schedule_id)
    if row is None:
        return not_found(request, tenant, f"no schedule '{schedule_id}'")
    calendars = await schedule_calendars(rm, row)
    doc = await schedule_document(rm, row, datetime.now(UTC), calendars)
    problem = None
    try:
        cursor = decode_run_cursor(after, schedule_id, None) if after else None
    except InvalidQuery as exc:
        cursor, problem = None, _problem(exc)
    runs = jsonable(await runs_page(rm, tenant.name, schedule_id, states=None, after=cursor,
                                    limit=RUNS_SHOWN,
                                    partitions=await ctx.events_partitions()))
    lifecycle, complete = await schedule_history(ctx.log, ctx.topics, tenant.name,
                                                 schedule_id, types=LIFECYCLE)
    revisions = [{"revision": e["payload"]["revision"], "at": e["at"], "type": e["type"],
                  "spec": _definition(e["payload"]["spec"])}
                 for e in lifecycle if e["type"] in ("ScheduleCreated", "ScheduleRevised")]
    return page(request, "schedule.html", tenant, watermark=wm,
                title=f"Schedule {schedule_id}", s=doc,
                words=rule_words(doc["definition"]), instants=instants_with_dst(row, 10, calendars),
                occurrences=await occurrences(rm, tenant.name, schedule_id),
                runs=runs, problem=problem, revisions=list(reversed(revisions)),
                lifecycle=list(reversed(lifecycle)), history_complete=complete,
                idempotency=secrets.token_hex(16))


def _definition(spec: Any) -> Any:
    """A stored spec as the definition the API shows (camelCase), or as it is."""
    try:
        return definition_of(spec).model_dump(mode="json", by_alias=True, exclude_none=True)
    except (ValidationError, ValueError):
        return spec


async def _schedule_action(request: Request, ctx: Any, schedule_id: str, verb: str) -> Response:
    got = await _action(request, ctx)
    if isinstance(got, Response):
        return got
    tenant, form = got
    back = _safe_next(form.get("next"), f"{PREFIX}/schedules/{quote(schedule_id)}")
    try:
        if verb == "pause":
            await schedule_routes.pause_schedule(schedule_id, tenant, ctx,
                                                 PauseIn(reason=form.get("reason", "")))
            text = f"paused '{schedule_id}'"
        elif verb == "resume":
            await schedule_routes.resume_schedule(schedule_id, tenant, ctx)
            text = f"resumed '{schedule_id}'"
        elif verb == "delete":
            await schedule_routes.delete_schedule(schedule_id, tenant, ctx)
            text = f"deleted '{schedule_id}'"
            if back.startswith(f"{PREFIX}/schedules/"):
                back = HOME
        else:
            key = form.get("idempotency") or secrets.token_hex(16)
            r = await run_routes.trigger_run(schedule_id, tenant, ctx, key, None)
            run_id = orjson.loads(r.body)["runId"]
            text = f"triggered run {run_id} of '{schedule_id}'"
    except _REFUSALS as exc:
        return redirect(request, back, f"{verb} '{schedule_id}' refused: {_problem(exc)}",
                        "error")
    return redirect(request, back, text)


def _schedule_route(verb: str) -> Callable[..., Awaitable[Response]]:
    async def act(request: Request, schedule_id: ScheduleIdPath, ctx: Context) -> Response:
        return await _schedule_action(request, ctx, schedule_id, verb)

    return act


# one route per action, the same handler: /ui/schedules/{id}/pause|resume|trigger|delete
for _verb in ("pause", "resume", "trigger", "delete"):
    router.add_api_route(PREFIX + "/schedules/{schedule_id}/" + _verb, _schedule_route(_verb),
                         methods=["POST"], name=f"schedule_{_verb}")


def definition_from_form(form: dict[str, str]) -> ScheduleIn:
    """The create form as ``POST /v1/schedules``'s body: one rule (``kind``: cron, every
    or at, with ``rule``), ``timezone``, ``jobType``, ``params`` (a JSON object),
    ``overlap``, ``maxAttempts``."""
    kind = form.get("kind", "cron")
    if kind not in ("cron", "every", "at"):
        raise InvalidDefinition(f"invalid kind '{kind[:40]}': expected cron, every or at",
                                "kind")
    body: dict[str, Any] = {"scheduleId": form.get("scheduleId", "").strip(),
                            kind: form.get("rule", "").strip(),
                            "job": {"type": form.get("jobType", "").strip()}}
    if form.get("timezone", "").strip():
        body["timezone"] = form["timezone"].strip()
    params = form.get("params", "").strip()
    if params:
        try:
            body["job"]["params"] = orjson.loads(params)
        except orjson.JSONDecodeError:
            raise InvalidDefinition("params must be a JSON object", "job.params") from None
    if form.get("overlap"):
        body["overlap"] = form["overlap"]
    if form.get("maxAttempts", "").strip():
        body["retry"] = {"maxAttempts": form["maxAttempts"].strip()}
    return ScheduleIn.model_validate(body)


@router.post(PREFIX + "/schedules")
async def create(request: Request, ctx: Context) -> Response:
    got = await _action(request, ctx)
    if isinstance(got, Response):
        return got
    tenant, form = got
    try:
        body = definition_from_form(form)
        r = await schedule_routes.create_schedule(body, tenant, ctx,
                                                  form.get("idempotency") or None)
    except _REFUSALS as exc:
        return redirect(request, HOME, f"create refused: {_problem(exc)}", "error", form)
    warnings = orjson.loads(r.body).get("warnings") or []
    text = f"created '{body.schedule_id}'" + "".join(f" — {w}" for w in warnings)
    return redirect(request, f"{PREFIX}/schedules/{quote(body.schedule_id)}", text)


# ------------------------------------------------------------------ runs


@router.get(PREFIX + "/runs/{run_id}")
async def run_page(request: Request, run_id: RunIdPath, ctx: Context) -> Response:
    tenant = _tenant(request, ctx)
    if tenant is None:
        return _login_redirect(request)
    wm = await mark(ctx)
    doc = await run_document(ctx.read(), tenant.name, run_id)
    if doc is None:
        return not_found(request, tenant, f"no run '{run_id}'")
    events, complete = await schedule_history(ctx.log, ctx.topics, tenant.name,
                                              doc["scheduleId"], run_id=run_id)
    beats: dict[int, int] = {}
    for e in events:
        if e["type"] == "LeaseExtended":
            n = int(e["payload"]["attempt"])
            beats[n] = beats.get(n, 0) + 1
    return page(request, "run.html", tenant, watermark=wm, title=f"Run {run_id}", r=doc,
                events=events, history_complete=complete, heartbeats=beats)


async def _run_action(request: Request, ctx: Any, run_id: str, verb: str) -> Response:
    got = await _action(request, ctx)
    if isinstance(got, Response):
        return got
    tenant, form = got
    back = _safe_next(form.get("next"), f"{PREFIX}/runs/{run_id}")
    try:
        if verb == "redrive":
            await run_routes.redrive_run(run_id, tenant, ctx)
            text = f"redrove run {run_id}"
        elif verb == "cancel":
            await run_routes.cancel_run(run_id, tenant, ctx, None)
            text = f"cancel of run {run_id} sent"
        else:
            note = form.get("reason", "").strip()
            if not note:
                raise ApiError(400, "a reason is required to resolve a reconciliation",
                               "reason")
            body = ReconcileIn(decision=form.get("decision", ""),  # type: ignore[arg-type]
                               note=note, effect_id=form.get("effectId") or None)
            await run_routes.reconcile_run(run_id, body, tenant, ctx)
            text = f"resolved run {run_id}: {body.decision}"
    except _REFUSALS as exc:
        return redirect(request, back, f"{verb} of run {run_id} refused: {_problem(exc)}",
                        "error")
    return redirect(request, back, text)


def _run_route(verb: str) -> Callable[..., Awaitable[Response]]:
    async def act(request: Request, run_id: RunIdPath, ctx: Context) -> Response:
        return await _run_action(request, ctx, run_id, verb)

    return act


# the same for a run: /ui/runs/{id}/redrive|reconcile|cancel
for _verb in ("redrive", "reconcile", "cancel"):
    router.add_api_route(PREFIX + "/runs/{run_id}/" + _verb, _run_route(_verb),
                         methods=["POST"], name=f"run_{_verb}")


# ------------------------------------------------------------------ attention


def dead_why(doc: dict[str, Any]) -> str:
    """Why a run is DEAD, in one line: its reason and message, and its last error when it
    says more (a permanent error's message is the error's own: said once)."""
    reason, message = doc.get("deadReason") or "", doc.get("deadMessage") or ""
    kind, text = doc.get("lastErrorClass"), doc.get("lastError")
    error = f"{kind}: {text}" if kind and text else kind or text or ""
    if message and error.endswith(message):  # a permanent error's message is the error's
        message = ""
    head = f"{reason}: {message}" if reason and message else reason or message
    return " · ".join(part for part in (head, error) if part)


@router.get(PREFIX + "/attention")
async def attention(request: Request, ctx: Context) -> Response:
    tenant = _tenant(request, ctx)
    if tenant is None:
        return _login_redirect(request)
    rm = ctx.read()
    wm = await mark(ctx)
    n = await ctx.events_partitions()

    async def runs_in(state: str) -> list[dict[str, Any]]:
        got = await run_list_page(rm, tenant.name, RunQuery(states=(state,)), after=None,
                                  limit=100, partitions=n)
        return list(jsonable(got)["items"])

    dead = []
    for item in await runs_in("DEAD"):
        doc = await run_document(rm, tenant.name, item["runId"])
        dead.append({**item, "why": dead_why(doc) if doc is not None else ""})
    reconciling = []
    for item in await runs_in("RECONCILING"):
        doc = await run_document(rm, tenant.name, item["runId"])
        if doc is not None:
            reconciling.append(doc)
    waiting = [r for r in await runs_in("READY") if r.get("waiting")]
    who = None if ctx.tenants.operator_tokens is None else tenant.name
    letters = jsonable(await dead_letters_page(
        rm, LetterQuery(tenant=who), after=None, limit=100, dlq_topic=ctx.topics.dlq,
        partitions=await ctx.topic_partitions(ctx.topics.dlq)))["items"]
    return page(request, "attention.html", tenant, watermark=wm, title="Attention", dead=dead,
                reconciling=reconciling, waiting=waiting, letters=letters)


# ------------------------------------------------------------------ health


def _quantile(cumulative: list[int], total: int, q: float) -> str:
    """The upper bound of the bucket the ``q`` quantile falls in (a histogram's honest
    answer: "at most")."""
    if total <= 0:
        return "—"
    need = q * total
    for bound, n in zip(LATENESS_BUCKETS, cumulative, strict=False):
        if n >= need:
            return f"≤ {bound * 1000:g} ms" if bound < 1 else f"≤ {duration_words(bound)}"
    return f"> {duration_words(LATENESS_BUCKETS[-1])}"


@router.get(PREFIX + "/health")
async def health(request: Request, ctx: Context) -> Response:
    tenant = _tenant(request, ctx)
    if tenant is None:
        return _login_redirect(request)
    rm = ctx.read()
    wm = await mark(ctx)
    offsets, wm_time = await rm.offsets()
    processors: list[dict[str, Any]] = []
    projection: list[dict[str, Any]] = []
    log = ctx.log
    if log is not None:
        topics = ctx.topics
        group = topics.processor_group
        for p in range(await ctx.topic_partitions(topics.commands)):
            end = await log.end_offset(topics.commands, p)
            done = await log.committed(group, topics.commands, p)
            processors.append({"partition": p, "end": end, "committed": done,
                               "backlog": None if done is None else max(0, end - done)})
        for p in range(await ctx.events_partitions()):
            end = await log.end_offset(topics.events, p)
            have = offsets.get(p, 0)
            projection.append({"partition": p, "end": end, "projected": have,
                               "lag": max(0, end - have)})
    workers = jsonable(await workers_page(rm.pool, after=None, limit=100, live=None,
                                          allowed=tenant.allowed_jobs))["items"]
    state = request.app.state
    if getattr(state, "dashboard_metrics", None) is None:  # its own: /metrics keeps its rates
        state.dashboard_metrics = MetricsSource(rm.pool, ctx.log, ctx.projection, ctx.projector)
    snap = await state.dashboard_metrics.snapshot()
    lateness = [{"resourceClass": rc, "runs": total,
                 "p50": _quantile(counts, total, 0.5), "p99": _quantile(counts, total, 0.99),
                 "mean": f"{total_s / total * 1000:.0f} ms" if total else "—"}
                for t, rc, counts, total, total_s in snap.lateness if t == tenant.name]
    return page(request, "health.html", tenant, watermark=wm, title="Health", processors=processors,
                projection=projection, watermark_time=wm_time, workers=workers,
                lateness=lateness, lag_seconds=snap.lag_seconds)


# ------------------------------------------------------------------ live updates


@router.get(PREFIX + "/watermark")
async def watermark(request: Request, ctx: Context) -> Response:
    """The projection's watermark as one opaque value: the pages poll it and refresh
    their live parts when it moves."""
    if _tenant(request, ctx) is None:
        return ApiError(401, "not logged in", None).response()
    _, t = await ctx.read().offsets()
    return JSONResponse({"watermark": await mark(ctx), "time": iso(t)},
                        headers={"Cache-Control": "no-store"})



@router.get(PREFIX + "/{rest:path}")
async def unknown(request: Request, rest: str, ctx: Context) -> Response:
    """Any other dashboard path: a 404 page (not the API's JSON)."""
    tenant = _tenant(request, ctx)
    if tenant is None:
        return _login_redirect(request)
    return not_found(request, tenant, f"no page '{PREFIX}/{rest[:100]}'")
