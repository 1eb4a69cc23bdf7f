"""Dashboard pages that need no read model: the login page (in-process ASGI app), and the
words a dead run is listed with on the Attention page (``dead_why``)."""

from __future__ import annotations

import re

import httpx

from chronolog.api.app import create_app
from chronolog.api.dashboard.routes import dead_why
from chronolog.tenants import Tenants


async def test_the_login_page_is_titled() -> None:
    app = create_app(None, None, Tenants())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node.test") as http:
        page = await http.get("/ui/login")
    assert page.status_code == 200
    title = re.search(r"<title>(.*?)</title>", page.text, re.S)
    assert title is not None and title.group(1).strip() == "Log in · chronolog"


def test_a_dead_run_is_listed_with_its_reason_and_last_error() -> None:
    assert dead_why({"deadReason": "max_attempts", "deadMessage": "3 attempts used",
                     "lastErrorClass": "transient", "lastError": "timeout"}) == (
        "max_attempts: 3 attempts used · transient: timeout")
    assert dead_why({"deadReason": "max_age", "deadMessage": None, "lastErrorClass": None,
                     "lastError": None}) == "max_age"


def test_a_permanent_errors_message_is_said_once() -> None:
    why = dead_why({"deadReason": "permanent_error", "deadMessage": "no region eu-x",
                    "lastErrorClass": "permanent", "lastError": "no region eu-x"})
    assert why == "permanent_error · permanent: no region eu-x"
    assert why.count("no region") == 1
