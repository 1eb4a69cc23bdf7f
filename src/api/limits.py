"""The HTTP API's outer guard and its per-tenant rate limit.

``RequestGuard`` is an ASGI middleware between the server and the app. Before FastAPI reads
anything it refuses, with the JSON error body:

* a body not received within ``body_timeout`` seconds of the request head (408: a client
  trickling a body cannot hold the request open);
* a body larger than ``max_body_bytes`` (413; by ``Content-Length`` or while reading) —
  bodies of GET, HEAD and OPTIONS are never read, so never refused either;
* a non-empty body that is not JSON by its ``Content-Type`` (415) — except an HTML form
  (``application/x-www-form-urlencoded``) posted to one of ``form_paths`` (the
  dashboard's actions), whose fields are checked for NUL like a query;
* a body nested deeper than ``limits.MAX_DOCUMENT_DEPTH`` (400) — counted without parsing,
  so no parser recurses into a hostile document;
* NUL in any text or key of the body (400 naming the field) or in a query parameter (400
  naming the parameter).

It also turns any exception that escapes the app into a JSON 500 whose message carries an
error id, logged with the traceback: no plain-text 500 leaves the API.

``RateLimiter`` is a token bucket per tenant (``Tenant.rate_limit``), for commands.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import structlog

from chronolog.domain.limits import MAX_BODY_BYTES, MAX_DOCUMENT_DEPTH, json_depth, text_violation
from chronolog.tenants import RateLimit
from chronolog.wakeup import wait_within

__all__ = ["RateLimiter", "RequestGuard"]

log = structlog.get_logger("chronolog.api")

# (status, message, field) -> a complete ASGI response
ErrorResponder = Callable[[int, str, "str | None"], Any]
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def _is_form(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == \
        "application/x-www-form-urlencoded"


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


class RequestGuard:
    """See the module docstring. ``error(status, message, field)`` builds the response."""

    def __init__(self, app: ASGIApp, *, error: ErrorResponder,
                 max_body_bytes: int = MAX_BODY_BYTES,
                 form_paths: tuple[str, ...] = (), body_timeout: float = 30.0) -> None:
        self.app = app
        self.body_timeout = body_timeout
        self.error = error
        self.max_body_bytes = max_body_bytes
        self.form_paths = form_paths

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            refusal, receive = await self._check(scope, receive)
            if refusal is not None:
                await refusal(scope, receive, send_tracked)
                return
            await self.app(scope, receive, send_tracked)
        except Exception:  # any bug becomes a JSON 500, never plain text
            error_id = uuid.uuid4().hex[:12]
            log.exception("api_internal_error", error_id=error_id, method=scope.get("method"),
                          path=scope.get("path"))
            if not started:
                await self.error(500, f"internal error (id {error_id}); it was logged",
                                 None)(scope, receive, send)

    async def _check(self, scope: dict[str, Any], receive: Any) -> tuple[Any, Any]:
        """A refusal response (or None) and the ``receive`` the app should use."""
        query = scope.get("query_string", b"").decode("latin-1")
        for name, value in parse_qsl(query, keep_blank_values=True):
            if "\x00" in name or "\x00" in value:
                return self.error(400, f"query parameter '{name.replace(chr(0), '')}' must "
                                  "not contain NUL (\\u0000)", name.replace("\x00", "")), receive
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return None, receive  # no route reads a body here: it is never read
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large(), receive
        try:
            body = await self._read(receive)
        except _TooLarge:
            return self._too_large(), receive
        except _TooSlow:
            return self.error(408, f"the body was not received within "
                              f"{self.body_timeout:g}s", None), receive
        replay = _replay(body, receive)
        if not body:
            return None, replay
        if _is_form(headers.get("content-type", "")) and self.form_paths and str(
                scope.get("path", "")).startswith(self.form_paths):
            try:
                fields = parse_qsl(body.decode(), keep_blank_values=True)
            except UnicodeDecodeError:
                return self.error(400, "the form is not UTF-8", None), replay
            for name, value in fields:
                if "\x00" in name or "\x00" in value:
                    field = name.replace("\x00", "")
                    return self.error(400, f"form field '{field}' must not contain NUL "
                                      "(\\u0000)", field), replay
            return None, replay
        if not _is_json(headers.get("content-type", "")):
            shown = headers.get("content-type") or "none"
            return self.error(415, f"the body must be JSON (Content-Type: application/json), "
                              f"got Content-Type {shown}", "Content-Type"), replay
        if json_depth(body, MAX_DOCUMENT_DEPTH) > MAX_DOCUMENT_DEPTH:
            return self.error(400, f"the body is nested deeper than {MAX_DOCUMENT_DEPTH} "
                              "levels", None), replay
        try:
            parsed = json.loads(body)
        except ValueError:
            return None, replay  # the app answers "not valid JSON"
        bad = text_violation(parsed, "", MAX_DOCUMENT_DEPTH)
        if bad is not None:
            where, problem = bad
            return self.error(400, f"{where}: {problem}" if where else problem,
                              where or None), replay
        return None, replay

    def _too_large(self) -> Any:
        return self.error(413, f"the body is larger than {self.max_body_bytes} bytes", None)

    async def _read(self, receive: Any) -> bytes:
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        while True:
            try:
                message = await wait_within(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise _TooSlow from None
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, then: Any) -> Any:
    """A ``receive`` that gives ``body`` once, then the server's own (a disconnect)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive


class RateLimiter:
    """A token bucket per tenant; ``take`` answers None (allowed) or seconds to wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)

    def take(self, tenant: str, limit: RateLimit | None) -> int | None:
        if limit is None:
            return None
        now = self.clock()
        tokens, at = self.buckets.get(tenant, (float(limit.burst), now))
        tokens = min(float(limit.burst), tokens + (now - at) * limit.per_second)
        if tokens >= 1.0:
            self.buckets[tenant] = (tokens - 1.0, now)
            return None
        self.buckets[tenant] = (tokens, now)
        return max(1, math.ceil((1.0 - tokens) / limit.per_second))
