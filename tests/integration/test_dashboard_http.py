"""The web dashboard over plain HTTP: its session cookie, its CSRF protection and its tenant
scoping, on a real processor, projector and PostgreSQL read model (``ApiStack``), on the
embedded log and on Kafka.

The session cookie is HttpOnly and SameSite=Strict; every action without the session's CSRF
token (or with another session's, or from another origin) is 403 and sends nothing; another
tenant's schedules and runs are neither listed nor reachable by URL (404); actions go
through the JSON API's command paths, so what they do is what the API reads back.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from support.polling import wait_until

from .api_stack import ACME, GLOBEX, ApiStack

pytestmark = pytest.mark.postgres


@pytest.fixture
async def stack(event_log: Any, database_url: str) -> AsyncIterator[ApiStack]:
    """The stack on each log (the pages read the log too: a schedule's events, offsets)."""
    async with ApiStack(event_log, database_url) as s:
        yield s


def sid() -> str:
    return f"dash-{uuid.uuid4().hex[:8]}"


def cookie_headers(r: httpx.Response) -> dict[str, str]:
    """``Set-Cookie`` headers of a response by cookie name."""
    return {h.split("=", 1)[0]: h for h in r.headers.get_list("set-cookie")}


async def login(http: httpx.AsyncClient, token: str) -> httpx.Response:
    """Log in through the form; the client keeps the cookies."""
    form = await http.get("/ui/login")
    assert form.status_code == 200, form.text
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None, form.text
    return await http.post("/ui/login", data={"csrf": nonce.group(1), "token": token,
                                              "next": "/ui/"})


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None and found.group(1), page.text[:500]
    return found.group(1)


def client_of(stack: ApiStack) -> httpx.AsyncClient:
    """A fresh browser-like client on the stack's app (its own cookie jar)."""
    assert stack.app is not None
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=stack.app),
                             base_url="http://chronolog.test")


async def create(stack: ApiStack, headers: dict[str, str], schedule_id: str,
                 **spec: Any) -> None:
    assert stack.http is not None
    body = {"scheduleId": schedule_id, "cron": "0 0 1 1 *", "job": {"type": "report"}, **spec}
    r = await stack.http.post("/v1/schedules", json=body, headers=headers)
    assert r.status_code == 201, r.text
    http = stack.http

    async def shown() -> bool:  # the pages read the read model: wait until it has it
        return (await http.get(f"/v1/schedules/{schedule_id}", headers=headers)
                ).status_code == 200

    await wait_until(shown, 60, what=f"schedule {schedule_id} in the read model")


async def state_of(stack: ApiStack, headers: dict[str, str], schedule_id: str) -> str:
    assert stack.http is not None
    r = await stack.http.get(f"/v1/schedules/{schedule_id}", headers=headers)
    assert r.status_code == 200, r.text
    return str(r.json()["state"])


async def test_login_sets_an_httponly_strict_session_cookie_and_pages_need_it(
    stack: ApiStack,
) -> None:
    async with client_of(stack) as http:
        r = await http.get("/")
        assert r.status_code == 303 and r.headers["location"] == "/ui/"
        r = await http.get("/ui/")
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=")
        form = await http.get("/ui/login")
        login_cookie = cookie_headers(form)["chronolog_login"]
        assert "HttpOnly" in login_cookie and "samesite=strict" in login_cookie.lower()

        bad = await http.post("/ui/login", data={"csrf": csrf_of(form), "token": "nope"})
        assert bad.status_code == 401 and "unknown token" in bad.text
        assert "chronolog_session" not in cookie_headers(bad)

        ok = await login(http, "acme-token")
        assert ok.status_code == 303 and ok.headers["location"] == "/ui/"
        session = cookie_headers(ok)["chronolog_session"]
        assert "HttpOnly" in session and "samesite=strict" in session.lower()
        assert "Path=/" in session and "Secure" not in session  # plain HTTP on loopback
        home = await http.get("/ui/")
        assert home.status_code == 200 and "tenant <strong" in home.text and "acme" in home.text
        assert home.headers["cache-control"] == "no-store"
        assert home.headers["x-frame-options"] == "DENY"  # its buttons act: never framed
        assert "frame-ancestors 'none'" in home.headers["content-security-policy"]
        assert "logged in as tenant &#39;acme&#39;" in home.text  # the one-shot notice

        out = await http.post("/ui/logout", data={"csrf": csrf_of(home)})
        assert out.status_code == 303
        assert (await http.get("/ui/")).status_code == 303  # logged out


async def test_a_login_without_its_csrf_token_is_refused(stack: ApiStack) -> None:
    async with client_of(stack) as http:
        await http.get("/ui/login")
        r = await http.post("/ui/login", data={"token": "acme-token"})
        assert r.status_code == 403 and "CSRF" in r.text
        assert "chronolog_session" not in cookie_headers(r)
        r = await http.post("/ui/login", data={"token": "acme-token", "csrf": "forged"})
        assert r.status_code == 403


async def test_every_action_without_the_sessions_csrf_token_is_403_and_sends_nothing(
    stack: ApiStack,
) -> None:
    s = sid()
    await create(stack, ACME, s)
    async with client_of(stack) as other:
        await login(other, "globex-token")
        others = csrf_of(await other.get("/ui/"))
    async with client_of(stack) as http:
        await login(http, "acme-token")
        page = await http.get(f"/ui/schedules/{s}")
        assert page.status_code == 200
        token = csrf_of(page)
        refusals = [
            ({}, {}),                                                    # no token
            ({"csrf": "0" * 64}, {}),                                    # a wrong one
            ({"csrf": others}, {}),                                      # another session's
            ({"csrf": token}, {"Origin": "http://evil.example"}),        # another origin
        ]
        for action in ("pause", "delete", "trigger"):
            for data, headers in refusals:
                r = await http.post(f"/ui/schedules/{s}/{action}", data=data, headers=headers)
                assert r.status_code == 403, (action, data, r.text)
                assert "<title>Refused" in r.text
        r = await http.post(f"/ui/schedules/{s}/pause", headers={"Accept": "application/json"})
        assert r.status_code == 403
        assert r.json()["error"] == "forbidden" and r.json()["field"] == "csrf"
        r = await http.post("/ui/schedules", data={"scheduleId": sid(), "kind": "every",
                                                   "rule": "1h", "jobType": "report"})
        assert r.status_code == 403
        r = await http.post("/ui/runs/r_0123456789abcdef0123/redrive", data={})
        assert r.status_code == 403
        assert await state_of(stack, ACME, s) == "ACTIVE"  # nothing was sent
        assert stack.http is not None
        runs = await stack.http.get(f"/v1/schedules/{s}/runs", headers=ACME)
        assert runs.json()["items"] == []

        # with its token the same action goes through the API's command path
        r = await http.post(f"/ui/schedules/{s}/pause", data={"csrf": token,
                                                              "next": f"/ui/schedules/{s}"})
        assert r.status_code == 303 and r.headers["location"] == f"/ui/schedules/{s}"
        assert await state_of(stack, ACME, s) == "PAUSED"
        again = await http.get(f"/ui/schedules/{s}")
        assert f"paused &#39;{s}&#39;" in again.text and "PAUSED" in again.text
        history = again.text[again.text.index("<h3>History</h3>"):]
        assert history.index("SchedulePaused") < history.index("ScheduleCreated")  # newest first

    async with client_of(stack) as anonymous:  # no session at all: 401, nothing sent
        r = await anonymous.post(f"/ui/schedules/{s}/resume", data={"csrf": token})
        assert r.status_code == 401
    assert await state_of(stack, ACME, s) == "PAUSED"

    async with client_of(stack) as http:  # resume, then delete, through the dashboard
        await login(http, "acme-token")
        token = csrf_of(await http.get("/ui/"))
        r = await http.post(f"/ui/schedules/{s}/resume", data={"csrf": token})
        assert r.status_code == 303 and await state_of(stack, ACME, s) == "ACTIVE"
        r = await http.post(f"/ui/schedules/{s}/delete", data={
            "csrf": token, "next": f"/ui/schedules/{s}"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/"  # it is gone
        assert await state_of(stack, ACME, s) == "DELETED"
        listed = await http.get("/ui/")
        assert f"deleted &#39;{s}&#39;" in listed.text
        assert f'data-schedule="{s}"' not in listed.text  # the list leaves DELETED out
        deleted = await http.get("/ui/", params={"state": "DELETED"})
        assert f'data-schedule="{s}"' in deleted.text


@pytest.mark.parametrize("decision", ["retry", "abandon"])
async def test_a_reconciliation_is_resolved_through_the_dashboard(
    stack: ApiStack, decision: str,
) -> None:
    assert stack.http is not None
    s = sid()
    await create(stack, ACME, s)
    run = (await stack.http.post(f"/v1/schedules/{s}/runs", headers={
        **ACME, "Idempotency-Key": "k"})).json()["runId"]
    claim = await stack.client.claim("acme", s, run, 1, "w-1")
    await stack.client.fail("acme", s, run, 1, claim["fence"], "w-1", "ambiguous", "timeout")

    async def reconciling() -> bool:
        g = await stack.http.get(f"/v1/runs/{run}", headers=ACME)
        return g.json()["state"] == "RECONCILING"

    await wait_until(reconciling, 20, what="run RECONCILING in the read model")
    async with client_of(stack) as http:
        await login(http, "acme-token")
        attention = await http.get("/ui/attention")
        card = attention.text[attention.text.index(f'<article class="card" data-run="{run}"'):]
        assert 'value="retry"' in card and 'value="abandon"' in card and "Reason" in card
        r = await http.post(f"/ui/runs/{run}/reconcile", data={
            "csrf": csrf_of(attention), "decision": decision, "reason": "checked by hand",
            "next": "/ui/attention"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/attention"
        shown = await http.get("/ui/attention")
        assert f"resolved run {run}: {decision}" in shown.text
        assert f'data-run="{run}"' not in shown.text[shown.text.index('id="h-reconciling"'):
                                                     shown.text.index('id="h-waiting"')]
    got = (await stack.http.get(f"/v1/runs/{run}", headers=ACME)).json()
    assert got["reconciliationResolution"]["decision"] == decision
    assert got["reconciliationResolution"]["note"] == "checked by hand"
    assert got["state"] == ("READY" if decision == "retry" else "DEAD")


async def test_another_tenants_objects_are_neither_listed_nor_reachable(
    stack: ApiStack,
) -> None:
    assert stack.http is not None
    mine, theirs = sid(), sid()
    await create(stack, GLOBEX, mine)
    await create(stack, ACME, theirs)
    t = await stack.http.post(f"/v1/schedules/{theirs}/runs", headers={
        **ACME, "Idempotency-Key": "k1"})
    assert t.status_code == 201, t.text
    their_run = t.json()["runId"]
    async with client_of(stack) as http:
        await login(http, "globex-token")
        listed = await http.get("/ui/")
        assert listed.status_code == 200 and f'data-schedule="{mine}"' in listed.text
        assert theirs not in listed.text
        searched = await http.get("/ui/", params={"prefix": theirs})
        assert searched.status_code == 200 and "No schedules match" in searched.text
        assert f"/ui/schedules/{theirs}" not in searched.text
        for url in (f"/ui/schedules/{theirs}", f"/ui/runs/{their_run}"):
            r = await http.get(url)
            assert r.status_code == 404, url
            assert theirs not in r.text.replace(f"no schedule &#39;{theirs}&#39;", "")
        attention = await http.get("/ui/attention")
        assert attention.status_code == 200 and their_run not in attention.text

        # an action on their schedule with a valid session and token changes nothing
        token = csrf_of(listed)
        r = await http.post(f"/ui/schedules/{theirs}/pause", data={"csrf": token})
        assert r.status_code == 303
        shown = await http.get(r.headers["location"])
        assert "refused" in shown.text and "no schedule" in shown.text
        r = await http.post(f"/ui/runs/{their_run}/cancel", data={"csrf": token})
        assert r.status_code == 303
    assert await state_of(stack, ACME, theirs) == "ACTIVE"
    run = await stack.http.get(f"/v1/runs/{their_run}", headers=ACME)
    assert run.json()["state"] == "READY" and not run.json()["cancellationRequested"]


async def test_a_refused_form_names_the_field_and_a_reconciliation_needs_a_reason(
    stack: ApiStack,
) -> None:
    assert stack.http is not None
    s = sid()
    async with client_of(stack) as http:
        home = (await http.get("/ui/"))
        await login(http, "acme-token")
        home = await http.get("/ui/")
        token = csrf_of(home)
        r = await http.post("/ui/schedules", data={
            "csrf": token, "scheduleId": s, "kind": "cron", "rule": "61 * * * *",
            "jobType": "report"})
        assert r.status_code == 303
        shown = await http.get(r.headers["location"])
        assert "create refused" in shown.text and "cron" in shown.text
        # the form comes back open with what was typed
        assert '<details class="card" id="create" open>' in shown.text
        assert f'value="{s}"' in shown.text and 'value="61 * * * *"' in shown.text
        r = await http.post("/ui/schedules", data={
            "csrf": token, "scheduleId": s, "kind": "every", "rule": "1h",
            "jobType": "report", "params": "[1"})
        shown = await http.get(r.headers["location"])
        assert "job.params" in shown.text
        r = await http.post("/ui/schedules", data={
            "csrf": token, "scheduleId": s, "kind": "every", "rule": "1h",
            "jobType": "report", "params": '{"n": 1}', "idempotency": "create-1"})
        assert r.status_code == 303 and r.headers["location"] == f"/ui/schedules/{s}"
        # the write waited for the read model at most its visible timeout (2 s): a loaded
        # machine may need longer before the schedule is shown
        async def shown_by_api() -> dict[str, Any] | None:
            got = await stack.http.get(f"/v1/schedules/{s}", headers=ACME)
            return got.json() if got.status_code == 200 else None

        body = await wait_until(shown_by_api, 30, what="the created schedule in the read model")
        assert body["definition"]["job"] == {"type": "report", "params": {"n": 1}}

        run = (await stack.http.post(f"/v1/schedules/{s}/runs", headers={
            **ACME, "Idempotency-Key": "k2"})).json()["runId"]
        r = await http.post(f"/ui/runs/{run}/reconcile", data={
            "csrf": token, "decision": "delivered", "reason": "  "})
        shown = await http.get(r.headers["location"])
        assert "a reason is required" in shown.text
        r = await http.post("/ui/schedules", data={"csrf": token, "scheduleId": "a\x00b"})
        assert r.status_code == 400 and r.json()["field"] == "scheduleId"


async def test_the_pages_show_the_read_models_facts_and_page_the_runs(stack: ApiStack) -> None:
    assert stack.http is not None
    s = sid()
    await create(stack, ACME, s, cron="30 2 * * SUN#2", timezone="America/New_York",
                 overlap="allow")
    run_ids = []
    for n in range(23):  # no worker serves 'report' here: each waits READY
        t = await stack.http.post(f"/v1/schedules/{s}/runs", headers={
            **ACME, "Idempotency-Key": f"page-{n}"})
        assert t.status_code == 201, t.text
        run_ids.append(t.json()["runId"])
    async with client_of(stack) as http:
        await login(http, "acme-token")
        listed = await http.get("/ui/", params={"prefix": s})
        row = listed.text[listed.text.index(f'data-schedule="{s}"'):]
        row = row[:row.index("</tr>")]
        assert "at 02:30 on the second Sunday of the month (America/New_York)" in row
        assert "<code>30 2 * * SUN#2</code>" in row and "zone America/New_York" in row
        assert "ready 23" in row, row  # the outcomes of the last 24 hours, by state

        page = await http.get(f"/ui/schedules/{s}")
        assert page.status_code == 200
        assert page.text.count('class="badge dst-shifted"') == 1  # March's second Sunday
        assert page.text.count("<tr data-run=") == 20  # the first page, newest first
        table = page.text[page.text.index('id="h-runs"'):]
        assert table.index(run_ids[-1]) < table.index(run_ids[-2])  # newest first
        older = re.search(r'href="(/ui/schedules/[^"?]+\?after=[^"]+)">Older runs', page.text)
        assert older is not None
        rest = await http.get(older.group(1))
        assert rest.status_code == 200 and rest.text.count("<tr data-run=") == 3
        shown = set(re.findall(r'<tr data-run="([^"]+)"', page.text + rest.text))
        assert shown == set(run_ids)  # nothing skipped, nothing twice
        assert "Revision 1 — created" in page.text

        run = await http.get(f"/ui/runs/{run_ids[0]}")
        assert run.status_code == 200
        assert "OccurrenceMaterialized" in run.text and "Not claimed yet." in run.text
        attention = await http.get("/ui/attention")
        waiting = attention.text[attention.text.index('id="h-waiting"'):]
        waiting = waiting[:waiting.index("</section>")]
        assert run_ids[0] in waiting and "report" in waiting
        nowhere = await http.get("/ui/no/such/page")
        assert nowhere.status_code == 404 and "<title>Not found" in nowhere.text
        health = await http.get("/ui/health")
        assert health.status_code == 200 and "Commands partition" in health.text
        mark = await http.get("/ui/watermark")
        assert mark.status_code == 200 and len(mark.json()["watermark"]) == 16
        assert f'data-watermark="{mark.json()["watermark"]}"' in (await http.get("/ui/")).text
    async with client_of(stack) as anonymous:
        assert (await anonymous.get("/ui/watermark")).status_code == 401
