"""The API's error answers: one JSON body for every error, and the exception handlers that
turn FastAPI's, Starlette's and pydantic's errors into it.

Every error is ``{"error": <status>, "field": <field or null>, "message": "..."}`` where
``<status>`` is a word (``STATUS_WORDS``); a 409 may carry more (``revision``: the current
one; ``state``: the run's state). Validation is always 400, never FastAPI's 422; a 405
names the allowed methods in ``Allow``. A request that fails because the read model or the
log is away (a refused or lost connection, a database shutting down or starting) is 503
``unavailable`` with ``Retry-After: 1`` and the message ``read model unreachable: ...`` or
``log unreachable: ...`` — not a 500 with a traceback per request; such failures are
logged once, then once per ``chronolog.logging.SUMMARY_S`` with the count held back.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from chronolog.lifecycle import unavailable
from chronolog.log.port import LogError
from chronolog.logging import Throttle
from chronolog.queries.documents import (
    InvalidDefinition,
    body_error,
    camel_path,
    field_of,
    plain_message,
)
from chronolog.queries.read_model import InvalidQuery

__all__ = ["STATUS_WORDS", "ApiError", "ErrorBody", "error_responses", "install_handlers"]

log = structlog.get_logger("chronolog.api")
_throttle = Throttle()
# the failures of a service that is away (chronolog.lifecycle.unavailable), and the log's
UNAVAILABLE = (OSError, LogError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
               asyncpg.InternalClientError, asyncpg.exceptions.OperatorInterventionError,
               asyncpg.exceptions.TooManyConnectionsError)

STATUS_WORDS = {
    400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 408: "timeout", 409: "conflict", 410: "gone", 413: "too_large",
    415: "unsupported_media_type", 422: "invalid", 428: "precondition_required", 429: "quota",
    500: "internal",
    503: "unavailable",
}


class ApiError(Exception):
    """An error answer: ``{"error", "field", "message", **extra}`` with an HTTP status."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers
        self.extra = extra

    @classmethod
    def invalid(cls, exc: InvalidDefinition | InvalidQuery) -> ApiError:
        """The 400 of a definition or query parameter the domain or read model refused."""
        return cls(400, exc.message, exc.field)

    def response(self) -> JSONResponse:
        body = {"error": STATUS_WORDS.get(self.status, str(self.status)), "field": self.field,
                "message": self.message, **self.extra}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class ErrorBody(BaseModel):
    """Every error answer."""

    error: str = Field(description="invalid | unauthorized | forbidden | not_found | "
                       "method_not_allowed | conflict | too_large | unsupported_media_type | "
                       "precondition_required | quota | internal | unavailable")
    field: str | None = Field(description="the offending field, header or parameter")
    message: str
    revision: int | None = Field(default=None,
                                 description="409 on a schedule: the current revision")
    state: str | None = Field(default=None, description="409 on a run: its state")


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """A route's documented error answers: ``codes`` plus 401 and 503 (every tenant route)."""
    return {c: {"model": ErrorBody, "description": STATUS_WORDS[c]} for c in (401, 503, *codes)}


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _refused(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, (InvalidDefinition, InvalidQuery))
    return ApiError.invalid(exc).response()


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errs = exc.errors()
    err = errs[0] if errs else {}
    loc = tuple(err.get("loc", ()))
    if err.get("type") == "json_invalid":
        return ApiError(400, "the body is not valid JSON", None).response()
    if err.get("type") == "missing" and loc == ("body",):
        return ApiError(400, "a JSON body is required", None).response()
    if loc[:1] == ("path",):
        field = field_of(loc)
        msg = plain_message(err)
        shown = str(err.get("input", ""))[:60].encode("unicode_escape").decode()
        return ApiError(400, f"invalid {field} '{shown}': {msg}", field).response()
    message, field = body_error(err)
    return ApiError(400, message, field).response()


async def _model(_: Request, exc: Exception) -> JSONResponse:
    """A command model refused what the request models let through (a message-level
    rule): still a 400 naming the field."""
    assert isinstance(exc, ValidationError)
    err = exc.errors()[0]
    loc = tuple(p for p in err.get("loc", ()) if p not in ("payload", "spec"))
    msg = plain_message(err)
    field = field_of(loc)
    if field is None and ": " in msg:  # a whole-command rule names its path first
        path, msg = msg.split(": ", 1)
        field = camel_path(path.removeprefix("payload.").removeprefix("spec."))
    return ApiError(400, f"{field}: {msg}" if field else msg, field).response()


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:  # every method some route of this path answers
        path = request.scope.get("path", "")
        routes: list[APIRoute] = request.app.state.api_routes
        methods = {meth for r in routes if r.path_regex.match(path) for meth in r.methods or ()}
        headers["Allow"] = ", ".join(sorted(methods))
        return ApiError(405, f"method {request.method} not allowed here (allowed: "
                        f"{headers['Allow']})", None, headers=headers).response()
    return ApiError(exc.status_code, str(exc.detail), None,
                    headers=headers or None).response()


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    if not (unavailable(exc) or isinstance(exc, LogError)):
        raise exc  # not a service away: a bug, answered 500 by the request guard
    what = _service_of(exc)
    text = f"{type(exc).__name__}: {exc}"[:300]
    held = _throttle.take(what)
    if held is not None:
        log.warning("api_service_unavailable", service=what, error=text,
                    path=request.url.path, **({"held_back": held} if held else {}))
    return ApiError(503, f"{what} unreachable: {text}", None,
                    headers={"Retry-After": "1"}).response()


def _service_of(exc: BaseException) -> str:
    """Which service a failure comes from: the log, the read model (asyncpg's errors, or a
    refused connection raised inside asyncpg), or, when that cannot be told, a service."""
    if isinstance(exc, LogError):
        return "log"
    if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError
                  | asyncpg.InternalClientError):
        return "read model"
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module.startswith("asyncpg"):
            return "read model"
        if module.startswith(("aiokafka", "chronolog.log")):
            return "log"
        tb = tb.tb_next
    return "a service"


def install_handlers(app: FastAPI) -> None:
    """Every error the app answers becomes the error body."""
    for kind in UNAVAILABLE:
        app.add_exception_handler(kind, _unavailable)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(InvalidDefinition, _refused)
    app.add_exception_handler(InvalidQuery, _refused)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(ValidationError, _model)
    app.add_exception_handler(StarletteHTTPException, _http)
