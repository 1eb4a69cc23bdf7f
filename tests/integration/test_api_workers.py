"""Jobs find their worker, through the HTTP API on both logs (a real processor, projector,
PostgreSQL and real workers; the app through ``httpx.ASGITransport``):

* ``GET /v1/workers`` lists the workers as they announced themselves — classes, job types,
  slots, started, last seen, live — an operator sees every job type, a tenant the ones it
  may run; paging by cursor; a stopped worker is not live;
* a READY run no live worker of its class serves says why (``waiting``) in the run, the run
  listing and the metrics, until a worker serving its job type starts;
* creating a schedule whose job type no worker of its class has ever served is 201 with
  ``warnings``; a dev node (the app given its known job types) answers 400 naming them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chronolog.tenants import Tenant, Tenants
from chronolog.workers import Worker
from support import greet_jobs
from support.polling import wait_until
from support.workers import serving

from .api_stack import ApiStack

pytestmark = pytest.mark.postgres

TENANTS = Tenants({
    "acme": Tenant("acme", ("acme-token",), None, 1000),
    "globex": Tenant("globex", ("globex-token",), frozenset({"report"}), 1000),
}, operator_tokens=("ops-token",))
ACME = {"Authorization": "Bearer acme-token"}
GLOBEX = {"Authorization": "Bearer globex-token"}
OPS = {"Authorization": "Bearer ops-token"}
WAITING = "no worker serves job type 'greet' in class 'default'"


def report_job(w: Worker) -> None:
    w.register("report", lambda ctx: {"report": "done"})


@contextlib.asynccontextmanager
async def api(lg: Any, dsn: str, **options: Any) -> AsyncIterator[ApiStack]:
    async with ApiStack(lg, dsn, TENANTS, **options) as stack:
        yield stack


async def workers(stack: ApiStack, headers: dict[str, str] = OPS, **params: Any) -> Any:
    assert stack.http is not None
    r = await stack.http.get("/v1/workers", headers=headers, params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def listed(stack: ApiStack, worker_id: str) -> bool:
    return worker_id in [w["workerId"] for w in (await workers(stack))["items"]]


async def create(stack: ApiStack, schedule_id: str, job: str, **extra: Any) -> Any:
    assert stack.http is not None
    return await stack.http.post("/v1/schedules", headers=ACME, json={
        "scheduleId": schedule_id, "at": datetime.now(UTC).isoformat(),
        "job": {"type": job, "params": {"name": "ada"}}, **extra})


async def test_get_workers_lists_each_worker_with_its_classes_job_types_and_liveness(
    event_log: Any, database_url: str, tmp_path: Path
) -> None:
    async with api(event_log, database_url) as stack:
        assert stack.http is not None
        async with serving(event_log, tmp_path, "w-a", greet_jobs.register, report_job), \
                serving(event_log, tmp_path, "w-b", Worker.builtin_jobs) as wb:
            async def both_live() -> Any:
                page = await workers(stack)
                return page if [w["live"] for w in page["items"]] == [True, True] else None

            page = await wait_until(both_live, 30, what="two live workers")
            a, b = page["items"]
            assert a["workerId"] == "w-a" and b["workerId"] == "w-b"
            assert a["classes"] == [{"resourceClass": "default",
                                     "jobTypes": ["greet", "report"], "slots": 4}]
            assert b["classes"][0]["jobTypes"] == ["echo", "fail", "noop", "sleep"]
            assert not a["stopped"] and a["startedAt"].endswith("Z") and \
                a["lastSeen"] >= a["startedAt"]
            assert page["nextCursor"] is None

            # a tenant sees the job types it may run, an operator every one
            seen = await workers(stack, GLOBEX)
            assert [c["jobTypes"] for w in seen["items"] for c in w["classes"]] == [["report"], []]
            assert [c["jobTypes"] for w in (await workers(stack, ACME))["items"]
                    for c in w["classes"]] == [["greet", "report"],
                                               ["echo", "fail", "noop", "sleep"]]

            first = await workers(stack, limit=1)
            assert [w["workerId"] for w in first["items"]] == ["w-a"] and first["nextCursor"]
            second = await workers(stack, limit=1, after=first["nextCursor"])
            assert [w["workerId"] for w in second["items"]] == ["w-b"]
            assert second["nextCursor"] is None
            bad = await stack.http.get("/v1/workers", headers=OPS,
                                       params={"after": first["nextCursor"], "live": "true"})
            assert bad.status_code == 400 and bad.json()["field"] == "after"
            for headers in ({}, {"Authorization": "Bearer nobody"}):
                r = await stack.http.get("/v1/workers", headers=headers)
                assert r.status_code == 401 and r.json()["field"] == "Authorization"

            wb.stop()

            async def b_stopped() -> Any:
                items = (await workers(stack))["items"]
                return items if items[1]["stopped"] and not items[1]["live"] else None

            await wait_until(b_stopped, 30, what="w-b stopped and not live")
            assert [w["workerId"] for w in (await workers(stack, live="true"))["items"]] == ["w-a"]
            assert [w["workerId"] for w in (await workers(stack, live="false"))["items"]] == ["w-b"]


async def test_a_ready_run_says_why_it_waits_until_a_worker_serving_its_job_type_starts(
    event_log: Any, database_url: str, tmp_path: Path
) -> None:
    async with api(event_log, database_url) as stack:
        assert stack.http is not None
        async with serving(event_log, tmp_path, "w-echo", Worker.builtin_jobs):
            await wait_until(lambda: listed(stack, "w-echo"), 30, what="the echo worker listed")
            assert (await create(stack, "greeting", "greet")).status_code == 201

            async def waiting_item() -> Any:
                r = await stack.http.get("/v1/schedules/greeting/runs", headers=ACME)
                items = r.json().get("items", []) if r.status_code == 200 else []
                return items[0] if items and items[0]["state"] == "READY" else None

            item = await wait_until(waiting_item, 30, what="a READY run")
            assert item["waiting"] == WAITING
            run = (await stack.http.get(f"/v1/runs/{item['runId']}", headers=ACME)).json()
            assert run["waiting"] == WAITING and run["attempts"] == []
            metric = ('chronolog_runs_waiting_without_worker{job_type="greet",'
                      'resource_class="default"} 1.0')
            assert metric in (await stack.http.get("/metrics", headers=OPS)).text

            async with serving(event_log, tmp_path, "w-greet", greet_jobs.register):
                async def succeeded() -> Any:
                    r = await stack.http.get(f"/v1/runs/{item['runId']}", headers=ACME)
                    return r.json() if r.json()["state"] == "SUCCEEDED" else None

                done = await wait_until(succeeded, 30, what="the greet run served")
            assert done["waiting"] is None
            assert [a["workerId"] for a in done["attempts"]] == ["w-greet"]
            runs = (await stack.http.get("/v1/schedules/greeting/runs", headers=ACME)).json()
            assert runs["items"][0]["waiting"] is None
            assert "chronolog_runs_waiting_without_worker{" not in (
                await stack.http.get("/metrics", headers=OPS)).text


async def test_creating_a_schedule_no_worker_of_its_class_has_served_answers_201_with_a_warning(
    event_log: Any, database_url: str, tmp_path: Path
) -> None:
    async with api(event_log, database_url) as stack:
        r = await create(stack, "early", "greet")
        assert r.status_code == 201, r.text
        assert r.json()["warnings"] == [
            "no worker of resource class 'default' has ever served job type 'greet': its runs "
            "will wait READY until one does"]
        async with serving(event_log, tmp_path, "w-greet", greet_jobs.register):
            await wait_until(lambda: listed(stack, "w-greet"), 30, what="the greet worker listed")
        # served once is enough: the worker has stopped since
        r = await create(stack, "later", "greet")
        assert r.status_code == 201 and "warnings" not in r.json()
        r = await create(stack, "on-gpu", "greet", resourceClass="gpu")
        assert r.status_code == 201 and "class 'gpu'" in r.json()["warnings"][0]


async def test_the_dev_node_refuses_a_job_type_it_does_not_know_naming_the_known_types(
    event_log: Any, database_url: str, tmp_path: Path
) -> None:
    async with api(event_log, database_url,
                   known_job_types={"default": ("echo", "noop")}) as stack:
        r = await create(stack, "typo", "ecoh")
        assert r.status_code == 400
        assert r.json()["field"] == "job.type"
        assert "'ecoh'" in r.json()["message"] and "known job types: echo, noop" in \
            r.json()["message"]
        r = await create(stack, "known", "echo")
        assert r.status_code == 201 and "warnings" not in r.json()
        async with serving(event_log, tmp_path, "w-greet", greet_jobs.register):
            await wait_until(lambda: listed(stack, "w-greet"), 30,
                             what="the attached worker listed")
            r = await create(stack, "attached", "greet")
            assert r.status_code == 201 and "warnings" not in r.json()
