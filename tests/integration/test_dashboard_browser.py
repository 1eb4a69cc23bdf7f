"""The web dashboard in a real browser (headless Chromium from Debian, driven by Playwright)
against a running node: ``run_node`` — processor, projector, the built-in worker, effect
runner and HTTP API on loopback — on the embedded log and a real PostgreSQL, two tenants.

One walk through it, as a person would: log in, create a schedule and see it run (the page
updates itself: no reload), pause it, follow a DEAD run from Attention to its redrive,
resolve a reconciliation with a reason, look at Health, and find that the other tenant's
schedule and run are neither listed nor reachable by URL. Every page is saved as a
screenshot under the test's output directory (``tmp_path / "screenshots"``), at 1280 px and
at a phone's width.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, async_playwright, expect

from chronolog.devnode.node import DevNode, run_node
from chronolog.devnode.supervisor import Supervisor
from chronolog.log.port import Topics
from chronolog.projections.store import PostgresProjectionStore
from chronolog.settings import LogConfig, open_log
from chronolog.tenants import Tenant, Tenants
from support.net import free_port
from support.polling import wait_until

from .browser import chromium_path
from .conftest import started
from .pgdb import schema_store

pytestmark = pytest.mark.postgres

TENANTS = Tenants({
    "acme": Tenant("acme", ("acme-token",), None, 100),
    "globex": Tenant("globex", ("globex-token",), None, 100),
})
ACME = {"Authorization": "Bearer acme-token"}
GLOBEX = {"Authorization": "Bearer globex-token"}
YEARLY = "0 0 1 1 *"  # no instant during the test: its runs are the ones triggered
WAIT_MS = 20_000


@pytest.fixture
async def node(tmp_path: Path, database_url: str) -> AsyncIterator[str]:
    """A running node; its base URL."""
    store: PostgresProjectionStore = await schema_store(database_url, max_size=8)
    cfg = LogConfig("sqlite", str(tmp_path / "log.db"), Topics(partitions=2))
    port = free_port()
    stop = asyncio.Event()
    url = f"http://127.0.0.1:{port}"
    try:
        async with started(open_log(cfg)) as lg:
            dev = DevNode(tmp_path, port, "127.0.0.1")
            task = asyncio.create_task(run_node(
                dev, lg, store, TENANTS, stop,
                supervisor=Supervisor(initial_backoff=0.2, max_backoff=1.0)))
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                async def healthy() -> bool:
                    if task.done():
                        task.result()
                    try:
                        return (await http.get("/healthz")).status_code == 200
                    except httpx.HTTPError:
                        return False

                await wait_until(healthy, 60, what="a healthy API")
            try:
                yield url
            finally:
                stop.set()
                await asyncio.wait_for(task, 90)
    finally:
        await store.close()


class Walk:
    """A browser page on the node, its screenshots and the confirmations it accepted."""

    def __init__(self, page: Page, base: str, shots: Path) -> None:
        self.page, self.base, self.shots = page, base, shots
        self.confirmed: list[str] = []
        self.requested: list[str] = []
        page.on("request", lambda request: self.requested.append(request.url))
        self.errors: list[str] = []  # the console's (a script error, a refused resource)
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))

        async def accept(dialog: Any) -> None:
            self.confirmed.append(dialog.message)
            await dialog.accept()

        page.on("dialog", accept)

    async def shot(self, name: str) -> None:
        await self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    async def create(self, schedule_id: str, kind: str, rule: str, job: str,
                     params: str) -> None:
        p = self.page
        await p.goto(f"{self.base}/ui/")
        await p.get_by_text("New schedule").click()
        await p.get_by_label("Schedule ID").fill(schedule_id)
        await p.get_by_label("Rule kind").select_option(kind)
        await p.get_by_label("Rule", exact=True).fill(rule)
        await p.get_by_label("Job type", exact=True).last.fill(job)
        await p.get_by_label("Params (JSON object)").fill(params)
        await p.get_by_role("button", name="Create schedule").click()
        await expect(p).to_have_url(f"{self.base}/ui/schedules/{schedule_id}")
        await expect(p.locator(".flash.ok")).to_contain_text(f"created '{schedule_id}'")

    async def trigger(self) -> str:
        """Trigger a run of the schedule on the page; its run ID."""
        p = self.page
        await p.locator("#live-head").get_by_role("button", name="Trigger now").click()
        flash = p.locator(".flash.ok")
        await expect(flash).to_contain_text("triggered run")
        found = re.search(r"run ([a-z]_[0-9a-f]+)", await flash.inner_text())
        assert found, await flash.inner_text()
        return found.group(1)


async def api(base: str, path: str, headers: dict[str, str] = ACME, *,
              method: str = "GET", **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        return await http.request(method, path, headers=headers, **kwargs)


async def test_a_person_works_through_the_dashboard_in_a_real_browser(
    node: str, tmp_path: Path,
) -> None:
    base = node
    shots = tmp_path / "screenshots"
    shots.mkdir()
    # the other tenant's schedule and run, made through the API
    r = await api(base, "/v1/schedules", GLOBEX, method="POST", json={
        "scheduleId": "globex-payroll", "cron": YEARLY, "job": {"type": "noop"}})
    assert r.status_code == 201, r.text
    r = await api(base, "/v1/schedules/globex-payroll/runs", {
        **GLOBEX, "Idempotency-Key": "g1"}, method="POST")
    assert r.status_code == 201, r.text
    their_run = r.json()["runId"]

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium_path())
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            expect.set_options(timeout=WAIT_MS)
            walk = Walk(page, base, shots)

            # log in: / sends a person without a session to the login form
            await page.goto(f"{base}/")
            await expect(page).to_have_url(re.compile(r"/ui/login\?next="))
            await walk.shot("login")
            await page.get_by_label("Tenant token").fill("acme-token")  # focused already
            await page.keyboard.press("Enter")  # the keyboard alone logs in
            await expect(page.get_by_role("heading", name="Schedules")).to_be_visible()
            await expect(page.get_by_test_id("tenant")).to_have_text("acme")
            await page.keyboard.press("Tab")  # the first stop is the skip link
            assert await page.evaluate("document.activeElement.textContent") == \
                "Skip to content"

            # create a schedule and see it run, the page updating itself
            await walk.create("nightly-echo", "every", "2s", "echo", '{"hello": "browser"}')
            await page.evaluate("window.notReloaded = true")
            succeeded = page.locator("#live-runs .badge.s-SUCCEEDED")
            await wait_until(lambda: _at_least(succeeded, 2), 30,
                             what="two succeeded runs shown without a reload")
            assert await page.evaluate("window.notReloaded === true")
            await expect(page.locator("#live-timeline .tick.s-SUCCEEDED").first).to_be_visible()
            await walk.shot("schedule")

            # pause it (confirmed first)
            await page.locator("#live-head").get_by_role("button", name="Pause").click()
            await expect(page.locator(".flash.ok")).to_contain_text("paused 'nightly-echo'")
            await expect(page.locator("#live-head .badge").first).to_have_text("PAUSED")
            assert walk.confirmed[-1] == "Pause schedule nightly-echo?"
            got = await api(base, "/v1/schedules/nightly-echo")
            assert got.json()["state"] == "PAUSED"

            # a run that fails permanently is DEAD: Attention -> the run -> redrive
            await walk.create("flaky-report", "cron", YEARLY, "fail",
                              '{"times": 1, "kind": "permanent"}')
            dead_run = await walk.trigger()
            await page.get_by_role("link", name="Attention").click()
            row = page.locator(f"#live-attention tr[data-run='{dead_run}']")
            await expect(row).to_be_visible()
            # with why it is DEAD: the reason and the last error, said once
            await expect(row).to_contain_text("permanent_error · permanent")
            await walk.shot("attention")
            await row.get_by_role("link", name=dead_run).click()
            await expect(page.locator("#live-run h1 .badge")).to_have_text("DEAD")
            await expect(page.locator("table.attempts")).to_contain_text("permanent")
            await walk.shot("run-dead")
            await page.get_by_role("button", name="Redrive").click()
            await expect(page.locator(".flash.ok")).to_contain_text(f"redrove run {dead_run}")
            await expect(page.locator("#live-run h1 .badge")).to_have_text("SUCCEEDED")
            await expect(page.locator("table.attempts tbody tr")).to_have_count(2)
            await expect(page.locator("ol.events")).to_contain_text("OccurrenceRedriven")
            assert walk.confirmed[-1].startswith(f"Redrive run {dead_run}?")
            await walk.shot("run")

            # an ambiguous failure waits in RECONCILING: resolve it with a reason
            await walk.create("invoice-mail", "cron", YEARLY, "fail",
                              '{"times": 1, "kind": "ambiguous"}')
            unsure = await walk.trigger()
            await page.get_by_role("link", name="Attention").click()
            card = page.locator(f"#live-attention article[data-run='{unsure}']")
            await expect(card).to_be_visible()
            await card.get_by_label("delivered").check()
            await card.get_by_label("Reason (required)").fill("the customer confirmed it")
            await walk.shot("attention-reconciling")
            await card.get_by_role("button", name="Resolve").click()
            await expect(page.locator(".flash.ok")).to_contain_text(
                f"resolved run {unsure}: delivered")
            await expect(card).to_have_count(0)
            got = await api(base, f"/v1/runs/{unsure}")
            assert got.json()["state"] != "RECONCILING", got.text
            assert got.json()["reconciliationResolution"]["note"] == \
                "the customer confirmed it"

            # health: the node's own worker, the projection
            await page.get_by_role("link", name="Health").click()
            await expect(page.get_by_role("heading", name="Workers")).to_be_visible()
            await expect(page.locator("#live-health")).to_contain_text("live")
            await walk.shot("health")

            # the other tenant's objects: not listed, not reachable by URL
            await page.goto(f"{base}/ui/")
            await expect(page.locator("[data-schedule='nightly-echo']")).to_be_visible()
            assert "globex-payroll" not in await page.content()
            await walk.shot("schedules")
            for url in ("/ui/schedules/globex-payroll", f"/ui/runs/{their_run}"):
                answer = await page.goto(f"{base}{url}")
                assert answer is not None and answer.status == 404, url
                await expect(page.get_by_role("heading", name="Not found")).to_be_visible()
            await walk.shot("not-found")

            # a phone's width: nothing wider than the screen
            await page.set_viewport_size({"width": 390, "height": 844})
            for url, name in (("/ui/", "schedules-phone"),
                              ("/ui/schedules/nightly-echo", "schedule-phone"),
                              (f"/ui/runs/{dead_run}", "run-phone"),
                              ("/ui/attention", "attention-phone"),
                              ("/ui/health", "health-phone")):
                await page.goto(f"{base}{url}")
                width = await page.evaluate("document.documentElement.scrollWidth")
                assert width <= 390, (url, width)
                await walk.shot(name)
            # offline: every request the pages made went to the node itself
            assert walk.requested and all(
                u.startswith((f"{base}/", "data:")) for u in walk.requested), {
                u for u in walk.requested if not u.startswith(base)}
            assert f"{base}/ui/static/htmx.min.js" in walk.requested
            # the 404 pages log their status; nothing else went wrong in any page
            assert [e for e in walk.errors if "404" not in e] == [], walk.errors
        finally:
            await browser.close()

    assert {p.name for p in shots.iterdir()} >= {
        "login.png", "schedule.png", "attention.png", "run.png", "health.png",
        "schedules.png", "not-found.png", "schedules-phone.png"}


async def _at_least(locator: Any, n: int) -> bool:
    return bool(await locator.count() >= n)
