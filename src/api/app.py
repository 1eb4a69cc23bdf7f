"""The HTTP API (FastAPI): commands through the log, queries from the PostgreSQL read model.

``create_app(client, store, tenants, ...)`` wires the app: its services
(``chronolog.api.context``), error handlers (``errors``), auth (``auth``) and one router per
resource (``routes``: schedules, runs, workers, dlq, preview, ops), the browsable
docs (``docs``: ``/docs``, ``/redoc``, assets on the node) and the web dashboard
(``dashboard``: ``/`` and ``/ui/``, server-rendered pages on the same read model and
command paths). ``openapi_document()`` returns
its OpenAPI spec (written to ``schemas/api/openapi.json`` by ``make schemas``; a test checks
for drift). The contract is that document; decisions it leaves open are stated in the
modules that make them.

Conventions
-----------
* JSON fields are camelCase, times UTC ISO-8601 with ``Z``, durations are seconds (numbers)
  on output and numbers or text such as ``90s``/``15m`` on input.
* Every error is ``{"error": <status>, "field": <field or null>, "message": "..."}`` where
  ``<status>`` is a word: ``invalid`` (400), ``unauthorized`` (401), ``forbidden`` (403),
  ``not_found`` (404), ``method_not_allowed`` (405, with ``Allow``), ``timeout`` (408: a
  body not sent within the body timeout), ``conflict`` (409),
  ``too_large`` (413), ``unsupported_media_type`` (415), ``precondition_required`` (428),
  ``quota`` (429), ``internal`` (500: a bug, with an error id in the log), ``unavailable``
  (503) — the command reply statuses plus the HTTP-only ones. Validation is always 400
  (never FastAPI's 422), an unknown query parameter included; ``openapi_document`` lists
  every status each operation can answer.
* Limits (``chronolog.domain.limits``; docs/deployment.md, "Limits"): the request guard
  (``chronolog.api.limits.RequestGuard``) refuses oversized bodies, non-JSON bodies, deep
  nesting and NUL before FastAPI parses anything; path IDs must match their patterns; a
  tenant's commands pass its token bucket (429 with ``Retry-After``), and the processor
  holds its params and results to its storage budget (429, ``field`` ``storage_budget``,
  with ``Retry-After``: ``chronolog.domain.storage_budget``). ``/metrics`` takes an
  operator token whenever the tenants come from a file.
* Auth (``chronolog.api.auth``): ``Authorization: Bearer <token>`` -> tenant; every read and
  write is tenant-scoped.
* Writes send one command, wait for its reply, then (bounded, ``visible_timeout``) until
  the read model shows its events: ``X-Chronolog-Visible: true|false`` says which; reads
  may also wait for a write's ``X-Chronolog-Consistency`` token (``chronolog.api.context``).
  Every list carries a ``watermark``.
* Tracing (docs/tracing.md): with tracing on, a server span per request
  (``chronolog.telemetry.tracing.TracingMiddleware``), current while the request's command is
  sent, so its record carries the request's ``traceparent``; a run document's ``traceId`` is
  the run's trace.
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import asyncpg
from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute

from chronolog.api.context import ApiContext
from chronolog.api.cursors import (
    CONSISTENCY_HEADER,
    VISIBLE_HEADER,
    decode_token,
    encode_token,
)
from chronolog.api.dashboard import FORM_PATHS, install_dashboard
from chronolog.api.docs import install_docs
from chronolog.api.errors import STATUS_WORDS, ApiError, install_handlers
from chronolog.api.limits import RequestGuard
from chronolog.api.routes import calendars, dlq, ops, preview, runs, schedules, workers
from chronolog.api.server import ServerLimits, server_limits
from chronolog.api.sessions import SessionStore
from chronolog.client import Client
from chronolog.domain import limits as lim
from chronolog.environment import package_version
from chronolog.projections.store import PostgresProjectionStore
from chronolog.telemetry import tracing
from chronolog.telemetry.tracing import TracingMiddleware
from chronolog.tenants import DEFAULT_RETENTION_S, Tenants

# Newer FastAPI versions make request spans of their own once a global tracer provider is
# set (tracing on): turned off, the API's spans are TracingMiddleware's whatever the version
NATIVE_TRACING_OFF: dict[str, Any] = (
    {"telemetry": {"tracing": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})

__all__ = [
    "API_VERSION",
    "CONSISTENCY_HEADER",
    "VISIBLE_HEADER",
    "ApiError",
    "create_app",
    "decode_token",
    "encode_token",
    "openapi_document",
    "openapi_json",
]

API_VERSION = package_version()  # the package's: one version for the API and the CLI


async def known_query(request: Request) -> None:
    """A query parameter the route does not take is an error, not silently ignored."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    cache: dict[str, frozenset[str]] = request.app.state.chronolog.query_names
    names = cache.get(route.unique_id)
    if names is None:
        names = cache[route.unique_id] = _query_names(route.dependant)
    for name in request.query_params:
        if name not in names:
            raise ApiError(400, f"unknown query parameter '{name}'"
                           + (f" (this route takes {', '.join(sorted(names))})"
                              if names else ""), name)


def create_app(
    client: Client | None,
    store: PostgresProjectionStore | asyncpg.Pool | None,
    tenants: Tenants,
    *,
    projector: Any = None,
    projection: str = "main",
    reply_timeout: float = 10.0,
    consistency_timeout: float = 5.0,
    consistency_poll: float = 0.02,
    max_body_bytes: int = lim.MAX_BODY_BYTES,
    known_job_types: Mapping[str, Iterable[str]] | None = None,
    visible_timeout: float = 2.0,
    alongside: Callable[[], list[str]] | None = None,
    limits: ServerLimits | None = None,
    retention: float | None = None,
) -> FastAPI:
    """The API app. ``client`` sends commands (and gives the log: topics, end offsets);
    ``store`` (or an asyncpg pool) is the read model; ``projector``, when one runs in this
    process, serves read-your-writes waits and the fence-rejection metrics directly.
    ``max_body_bytes`` bounds a request body (413 past it). ``known_job_types`` (a dev node:
    resource class -> the job types its own workers have) makes creating a schedule whose
    job type neither those nor any announced worker of its class serve a 400 naming them;
    without it such a create is 201 with ``warnings``. ``visible_timeout`` bounds how long
    a write waits for the read model to show its events (``X-Chronolog-Visible``).
    ``alongside``: the parts of a node running in this process that are not ready, as
    ``"<part>: <reason>"`` (a dev node's processor while it restores): ``/healthz`` is 503
    while there is any. ``limits`` (default ``server_limits()``: the environment): the body
    timeout and the dashboard's session lifetimes (``chronolog.api.server``). ``retention``:
    the deployment's ``--retention`` (the default of tenants without their own), from which
    a run's result window is derived (410 past it)."""
    limits = limits or server_limits()
    pool: Any = store.pool if isinstance(store, PostgresProjectionStore) else store
    app = FastAPI(
        title="chronolog", version=API_VERSION,
        description="Event-sourced job scheduler: schedules, runs and their history.",
        dependencies=[Depends(known_query)],
        docs_url=None, redoc_url=None,  # served from the node's own assets (api/docs.py)
        **NATIVE_TRACING_OFF,
    )
    app.state.chronolog = ApiContext(
        client=client, pool=pool, tenants=tenants, projector=projector, projection=projection,
        reply_timeout=reply_timeout, consistency_timeout=consistency_timeout,
        consistency_poll=consistency_poll, known_job_types=known_job_types,
        visible_timeout=visible_timeout, alongside=alongside,
        sessions=SessionStore(limits.session_max_age, limits.session_idle),
        secure_cookies=limits.secure_cookies,
        retention=DEFAULT_RETENTION_S if retention is None else retention)
    app.add_middleware(
        RequestGuard, max_body_bytes=max_body_bytes, form_paths=FORM_PATHS,
        body_timeout=limits.body_timeout,
        error=lambda status, message, field: ApiError(status, message, field).response())
    if tracing.enabled:  # outermost: a span per request, current while it is handled
        app.add_middleware(TracingMiddleware)
    app.openapi = lambda: _documented(app)  # type: ignore[method-assign]
    install_handlers(app)
    install_docs(app)
    routers = [module.router for module in (schedules, calendars, runs, workers, dlq, preview,
                                            ops)]
    for router in routers:
        app.include_router(router)
    # the API's own routes (a 405 names the methods the routes of its path answer)
    app.state.api_routes = [r for router in routers for r in router.routes
                            if isinstance(r, APIRoute)]
    # the web dashboard: / and /ui/ (chronolog.api.dashboard)
    app.state.api_routes += [r for r in install_dashboard(app) if isinstance(r, APIRoute)]
    return app


def _query_names(dependant: Any) -> frozenset[str]:
    """The query parameters a route takes, its dependencies' included."""
    names: set[str] = set()
    todo = [dependant]
    while todo:
        d = todo.pop()
        names.update(p.alias for p in d.query_params)
        todo.extend(d.dependencies)
    return frozenset(names)


def _documented(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document with every status the server can answer: validation is
    400 (never FastAPI's 422); every route may answer 400 (an unknown query parameter) and
    500 (a bug: still the error body); a tenant route 401 and 503; a route with an ID in its
    path 404; a write 409, 413 (body size), 415 (not JSON) and 429 (rate limit)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = FastAPI.openapi(app)
    for path, item in doc["paths"].items():
        for method, op in item.items():
            codes = {400, 500}
            if path.startswith("/v1/"):
                codes |= {401, 503}
            if method in ("post", "put", "patch", "delete"):
                codes |= {409, 413, 415, 429}
            if "{" in path:
                codes.add(404)
            if path == "/metrics":
                codes |= {401, 403, 503}
            responses = op["responses"]
            responses.pop("422", None)
            for code in sorted(codes):
                responses.setdefault(str(code), {
                    "description": STATUS_WORDS[code],
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
    for unused in ("HTTPValidationError", "ValidationError"):
        doc.get("components", {}).get("schemas", {}).pop(unused, None)
    return doc


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document (no client, database or tenants needed)."""
    return create_app(None, None, Tenants()).openapi()


def openapi_json() -> str:
    """``schemas/api/openapi.json`` as ``make schemas`` writes it (stable key order)."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"
