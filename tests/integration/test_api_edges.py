"""The API's edges: the dashboard's server-side sessions, failed authentication, what a slow
or forging client can hold, and the docs pages' headers.

Sessions, failed authentication and consistency tokens run on a real processor, projector
and PostgreSQL read model (``ApiStack``, embedded log); the connection bounds on a real
uvicorn server on loopback, spoken to with raw sockets.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from chronolog.api.app import create_app
from chronolog.api.cursors import CONSISTENCY_HEADER, encode_token
from chronolog.api.server import Server, ServerLimits, server_config
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log
from chronolog.tenants import Tenant, Tenants
from support.net import free_port
from support.polling import wait_until

from .api_stack import ACME, TENANTS, ApiStack
from .conftest import started
from .test_dashboard_http import cookie_headers, csrf_of, login

pytestmark = pytest.mark.postgres


@pytest.fixture
async def stack(tmp_path: Path, database_url: str) -> AsyncIterator[ApiStack]:
    cfg = LogConfig("sqlite", str(tmp_path / "log.db"), Topics(prefix="edges.", partitions=4))
    async with started(open_log(cfg)) as lg, ApiStack(lg, database_url,
                                                      visible_timeout=0.2) as s:
        yield s


def browser(stack: ApiStack, source: str = "127.0.0.1") -> httpx.AsyncClient:
    """A client with its own cookie jar, seen by the app as coming from ``source``."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=stack.app, client=(source, 4321)),
                             base_url="http://chronolog.test")


# ------------------------------------------------------------------ dashboard sessions


async def test_the_session_cookie_is_a_random_id_not_the_token_nor_a_bearer_token(
    stack: ApiStack,
) -> None:
    async with browser(stack) as http:
        r = await login(http, "acme-token")
        assert r.status_code == 303
        cookie = http.cookies["chronolog_session"]
        assert len(cookie) >= 40 and "acme-token" not in cookie
        assert base64.urlsafe_b64encode(b"acme-token").decode().rstrip("=") not in cookie
        assert (await http.get("/ui/")).status_code == 200
        async with browser(stack) as api:
            r = await api.get("/v1/schedules", headers={"Authorization": f"Bearer {cookie}"})
            assert r.status_code == 401, r.text


async def test_a_copied_cookie_fails_after_logout(stack: ApiStack) -> None:
    async with browser(stack) as http:
        await login(http, "acme-token")
        cookie = http.cookies["chronolog_session"]
        home = await http.get("/ui/")
        assert home.status_code == 200
        out = await http.post("/ui/logout", data={"csrf": csrf_of(home)})
        assert out.status_code == 303
    async with browser(stack) as thief:  # the copy, replayed after the logout
        thief.cookies.set("chronolog_session", cookie)
        r = await thief.get("/ui/")
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
        r = await thief.get("/ui/watermark")
        assert r.status_code == 401
        r = await thief.get("/v1/schedules", headers={"Authorization": f"Bearer {cookie}"})
        assert r.status_code == 401


async def test_csrf_rotates_with_the_session(stack: ApiStack) -> None:
    async with browser(stack) as http:
        await login(http, "acme-token")
        first_cookie = http.cookies["chronolog_session"]
        first = csrf_of(await http.get("/ui/"))
        assert csrf_of(await http.get("/ui/")) == first  # stable within a session
        r = await login(http, "acme-token")  # a new login: a new session
        assert r.status_code == 303
        assert "chronolog_session" in cookie_headers(r)
        second = csrf_of(await http.get("/ui/"))
        assert second != first and http.cookies["chronolog_session"] != first_cookie
        s = "edge-csrf"
        await stack_create(stack, s)
        r = await http.post(f"/ui/schedules/{s}/pause", data={"csrf": first})
        assert r.status_code == 403  # the old session's token is dead
        r = await http.post(f"/ui/schedules/{s}/pause", data={"csrf": second})
        assert r.status_code == 303
    async with browser(stack) as old:  # the old session itself was ended by the new login
        old.cookies.set("chronolog_session", first_cookie)
        assert (await old.get("/ui/")).status_code == 303


async def stack_create(stack: ApiStack, schedule_id: str) -> None:
    assert stack.http is not None
    r = await stack.http.post("/v1/schedules", headers=ACME, json={
        "scheduleId": schedule_id, "cron": "0 0 1 1 *", "job": {"type": "report"}})
    assert r.status_code == 201, r.text


async def test_an_idle_or_expired_session_is_refused(stack: ApiStack) -> None:
    sessions = stack.app.state.chronolog.sessions
    assert (sessions.max_age, sessions.idle) == (12 * 3600, 30 * 60)  # the defaults
    now = [1000.0]
    sessions.clock = lambda: now[0]
    async with browser(stack) as http:
        await login(http, "acme-token")
        now[0] += 29 * 60
        assert (await http.get("/ui/")).status_code == 200  # within the idle bound
        now[0] += 31 * 60
        assert (await http.get("/ui/")).status_code == 303  # idle too long
        start = now[0]
        await login(http, "acme-token")
        while True:  # active every 29 minutes: the absolute bound still ends it
            now[0] += 29 * 60
            if (await http.get("/ui/")).status_code != 200:
                break
            assert now[0] - start <= 12 * 3600
        assert now[0] - start > 12 * 3600
    assert len(sessions) == 0


async def test_a_session_ends_when_its_token_no_longer_names_its_tenant(
    stack: ApiStack,
) -> None:
    ctx = stack.app.state.chronolog
    async with browser(stack) as http:
        await login(http, "acme-token")
        assert (await http.get("/ui/")).status_code == 200
        ctx.tenants = Tenants({**TENANTS.tenants, "acme": Tenant(
            "acme", ("acme-new-token",), None, 1000)})  # the token was revoked
        assert (await http.get("/ui/")).status_code == 303
        ctx.tenants = TENANTS  # and coming back does not revive the session
        assert (await http.get("/ui/")).status_code == 303


# ------------------------------------------------------------------ failed authentication


async def test_wrong_tokens_are_logged_without_the_token_then_slowed_for_that_source_only(
    stack: ApiStack,
) -> None:
    guess = "guess-0123456789abcdef"
    with structlog.testing.capture_logs() as logs:
        async with browser(stack, "10.1.1.1") as attacker:
            codes = [(await attacker.get("/v1/schedules", headers={
                "Authorization": f"Bearer {guess}{i}"})).status_code for i in range(20)]
            assert codes[0] == 401 and codes[-1] == 429, codes
            r = await attacker.get("/v1/schedules", headers=ACME)  # even a right one waits
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"] == "quota" and r.json()["field"] == "Authorization"
            form = await attacker.get("/ui/login")
            r = await attacker.post("/ui/login", data={"csrf": csrf_of(form),
                                                       "token": "acme-token"})
            assert r.status_code == 429  # the dashboard's login too
        async with browser(stack, "10.2.2.2") as other:
            assert (await other.get("/v1/schedules", headers=ACME)).status_code == 200
            r = await other.get("/v1/schedules", headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401
    failed = [e for e in logs if e["event"] == "api_auth_failed"]
    mine = [e for e in failed if e["source"] == "10.1.1.1"]
    assert 1 <= len(mine) <= 3, failed  # a line, not one per failure
    assert mine[0]["path"] == "/v1/schedules"
    assert any(e["source"] == "10.2.2.2" for e in failed)
    assert guess[:6] not in repr(logs)  # never the token, nor its beginning


async def test_failed_dashboard_logins_count_too(stack: ApiStack) -> None:
    async with browser(stack, "10.3.3.3") as http:
        statuses = []
        for _ in range(12):
            form = await http.get("/ui/login")
            r = await http.post("/ui/login", data={"csrf": csrf_of(form), "token": "wrong"})
            statuses.append(r.status_code)
        assert statuses[0] == 401 and statuses[-1] == 429, statuses


# ------------------------------------------------------------------ consistency tokens


async def test_a_forged_consistency_token_is_refused_at_once(stack: ApiStack) -> None:
    assert stack.http is not None
    forged = encode_token({0: 10**9})
    t0 = time.monotonic()
    r = await stack.http.get("/v1/schedules", headers={**ACME, CONSISTENCY_HEADER: forged})
    assert time.monotonic() - t0 < 1.0
    assert r.status_code == 400 and r.json()["field"] == CONSISTENCY_HEADER, r.text
    r = await stack.http.get("/v1/schedules", headers={
        **ACME, CONSISTENCY_HEADER: encode_token({99: 1})})  # no such partition
    assert r.status_code == 400


async def test_waits_for_consistency_tokens_are_capped(stack: ApiStack) -> None:
    assert stack.http is not None
    ctx = stack.app.state.chronolog
    ctx.max_consistency_waits = 1
    await stack.pause_projector()
    r = await stack.http.post("/v1/schedules", headers=ACME, json={
        "scheduleId": "edge-wait", "cron": "0 0 1 1 *", "job": {"type": "report"}})
    assert r.status_code == 201 and r.headers["X-Chronolog-Visible"] == "false"
    token = r.headers[CONSISTENCY_HEADER]
    waiting = asyncio.create_task(stack.http.get("/v1/schedules/edge-wait", headers={
        **ACME, CONSISTENCY_HEADER: token}))
    await wait_until(lambda: ctx._waiting == 1, 5, what="one read waiting")
    t0 = time.monotonic()
    r = await stack.http.get("/v1/schedules/edge-wait", headers={
        **ACME, CONSISTENCY_HEADER: token})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
    assert time.monotonic() - t0 < 1.0
    stack.resume_projector()
    assert (await waiting).status_code == 200


# ------------------------------------------------------------------ the server's bounds


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    """Start the API (no log, no read model: the bounds come before either) on loopback
    with the given limits; the server's port."""
    servers: list[tuple[Server, asyncio.Task[None]]] = []

    async def start(limits: ServerLimits) -> int:
        port = free_port()
        app = create_app(None, None, Tenants(), limits=limits)
        server = Server(server_config(app, "127.0.0.1", port, limits, log_level="warning",
                                      lifespan="off"))
        task = asyncio.create_task(server.serve())
        servers.append((server, task))
        await wait_until(lambda: server.started, 10, what="the server to start")
        return port

    yield start
    for server, task in servers:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


async def closed(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closes the connection within ``within`` seconds."""
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except (ConnectionResetError, TimeoutError):
        return False


async def test_a_half_sent_request_is_closed_after_the_header_timeout(serve: Any) -> None:
    port = await serve(ServerLimits(header_timeout=1.0))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /docs HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
    await writer.drain()
    t0 = time.monotonic()
    assert await closed(reader, 5.0), "the half-sent request was held past 5 s"
    assert 0.8 <= time.monotonic() - t0 < 3.0
    writer.close()

    # a complete request is answered, and the next one on the connection is bounded too
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /docs HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
    await reader.readexactly(length)
    writer.write(b"GET /docs HTTP/1.1\r\nHo")
    await writer.drain()
    assert await closed(reader, 5.0)
    writer.close()


async def test_a_slow_body_is_answered_408(serve: Any) -> None:
    port = await serve(ServerLimits(body_timeout=1.0))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/schedules HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: 100\r\n\r\n{\"a\":")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 408"), head
    writer.close()


async def test_connections_over_the_cap_are_refused(serve: Any) -> None:
    port = await serve(ServerLimits(max_connections=3, header_timeout=30.0))
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await closed(reader, 3.0) or reader.at_eof(), "a 4th connection was held"
    writer.close()
    # one of the three leaves: a new connection is served again
    held.pop()[1].close()
    async def served() -> bool:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            try:
                return (await http.get("/docs")).status_code == 200
            except httpx.TransportError:
                return False
    await wait_until(served, 5, what="a connection under the cap to be served")
    for _, w in held:
        w.close()


# ------------------------------------------------------------------ docs pages


async def test_docs_and_redoc_send_framing_sniffing_and_content_security_headers() -> None:
    app = create_app(None, None, Tenants())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://chronolog.test") as http:
        for path in ("/docs", "/redoc"):
            r = await http.get(path)
            assert r.status_code == 200
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
            csp = r.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert "unsafe-eval" not in csp and "script-src 'self'" in csp
            for inline in re.findall(r"<script>(.*?)</script>", r.text, re.S):  # allowed
                digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
                assert f"'sha256-{digest}'" in csp
            for src in re.findall(r'(?:src|href)="([^"]+)"', r.text):  # all on the node
                assert src.startswith("/"), src
