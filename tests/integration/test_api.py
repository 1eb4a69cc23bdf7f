"""The HTTP API contract (docs/design.md §11, schemas/api/openapi.json) on both logs, a real
processor and a real PostgreSQL.

One stack per backend for the module (processor, client, projector, app through
``httpx.ASGITransport``); tests keep apart by schedule ID. Every status code of the contract
is exercised, with the error body shape, camelCase fields, tenant isolation, cursor paging
while new runs arrive, and read-your-writes: by default (``X-Chronolog-Visible``) and
through ``X-Chronolog-Consistency``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import httpx
import pytest
import pytest_asyncio

from chronolog.api.app import CONSISTENCY_HEADER, VISIBLE_HEADER, create_app
from chronolog.log.port import EventLog, Topics
from chronolog.settings import LogConfig, open_log
from chronolog.telemetry.ids import run_trace_id
from support.polling import wait_until

from .api_stack import ACME, GLOBEX, HOOLI, INITECH, TENANTS, ApiStack
from .pgdb import create_database, drop_database

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio(loop_scope="module")]

CRON = {"cron": "*/5 * * * *", "timezone": "Europe/Berlin", "job": {"type": "report"}}


@pytest.fixture(scope="module", params=["sqlite", "kafka"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> LogConfig:
    topics = Topics(prefix=f"api{uuid.uuid4().hex[:8]}.", partitions=4)
    if request.param == "sqlite":
        return LogConfig("sqlite", str(tmp_path_factory.mktemp("api") / "log.db"), topics)
    return LogConfig("kafka", request.getfixturevalue("kafka_bootstrap"), topics)


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    dsn = asyncio.run(create_database(database_url, "test_api"))
    yield dsn
    asyncio.run(drop_database(database_url, dsn))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lg(backend: LogConfig) -> AsyncIterator[EventLog]:
    log_ = open_log(backend)
    await log_.start()
    await log_.ensure_topics()
    yield log_
    await log_.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(lg: EventLog, module_dsn: str) -> AsyncIterator[ApiStack]:
    async with ApiStack(lg, module_dsn) as s:
        yield s


def sid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def assert_error(
    r: httpx.Response, status: int, error: str, field: str | None = None
) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) >= {"error", "field", "message"}, body
    assert body["error"] == error and isinstance(body["message"], str) and body["message"]
    if field is not None:
        assert body["field"] == field, body
    return body


async def create(stack: ApiStack, body: dict[str, Any], headers: dict[str, str] = ACME,
                 **extra: str) -> httpx.Response:
    assert stack.http is not None
    return await stack.http.post("/v1/schedules", json=body, headers={**headers, **extra})


def consistent(r: httpx.Response, headers: dict[str, str] = ACME) -> dict[str, str]:
    return {**headers, CONSISTENCY_HEADER: r.headers[CONSISTENCY_HEADER]}


# ------------------------------------------------------------------ auth and errors


async def test_missing_or_unknown_token_is_401_with_the_error_body(stack: ApiStack) -> None:
    assert stack.http is not None
    r = await stack.http.get("/v1/schedules/x")
    assert_error(r, 401, "unauthorized", "Authorization")
    assert r.headers["www-authenticate"] == "Bearer"
    r = await stack.http.get("/v1/schedules/x", headers={"Authorization": "Bearer nope"})
    assert_error(r, 401, "unauthorized", "Authorization")
    r = await stack.http.post("/v1/schedules", json={}, headers={"Authorization": "Basic x"})
    assert_error(r, 401, "unauthorized")


async def test_an_effect_must_name_a_destination_granted_to_the_tenant(stack: ApiStack) -> None:
    base = {"scheduleId": sid(), **CRON}
    r = await create(stack, {**base, "effects": [{"kind": "webhook", "destination": "hook"}]},
                     headers=GLOBEX)
    assert_error(r, 403, "forbidden", "effects[0].destination")
    r = await create(stack, {**base, "effects": [{"kind": "email", "destination": "hook"}]})
    assert_error(r, 400, "invalid", "effects[0].kind")
    # a tenant cannot bring its own target (URL, DSN, SQL, host) at all
    r = await create(stack, {**base, "effects": [
        {"kind": "postgres", "destination": "hook", "config": {"sql": "SELECT 1"}}]})
    assert_error(r, 400, "invalid")
    r = await create(stack, {**base, "effects": [
        {"kind": "webhook", "destination": "hook", "headers": {"Host": "169.254.169.254"}}]})
    assert_error(r, 400, "invalid")


async def test_create_then_read_with_the_consistency_token(stack: ApiStack) -> None:
    assert stack.http is not None
    s = sid()
    body = {"scheduleId": s, **CRON, "jitter": "30s", "misfire": "all", "overlap": "buffer_one",
            "retry": {"maxAttempts": 5, "initialBackoff": "2s", "maxBackoff": 60, "maxAge": "1h"},
            "lease": "45s", "startDeadline": "10m", "dst": {"ambiguous": "both",
                                                             "nonexistent": "skip"},
            "effects": [{"kind": "webhook", "destination": "hook",
                         "headers": {"X-Trace": "t1"}}]}
    r = await create(stack, body, **{"Idempotency-Key": "k1"})
    assert r.status_code == 201, r.text
    out = r.json()
    # no worker runs here: nothing has ever served 'report', which the body warns about
    assert set(out) == {"scheduleId", "revision", "nextRunAt", "warnings"}
    assert out["scheduleId"] == s and out["revision"] == 1 and out["nextRunAt"].endswith("Z")
    assert r.headers[CONSISTENCY_HEADER]

    g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))
    assert g.status_code == 200, g.text
    got = g.json()
    assert got["state"] == "ACTIVE" and got["revision"] == 1 and g.headers["etag"] == '"1"'
    assert got["nextRunAt"] == out["nextRunAt"]
    d = got["definition"]
    assert d["cron"] == "*/5 * * * *" and d["timezone"] == "Europe/Berlin"
    assert d["retry"] == {"maxAttempts": 5, "initialBackoff": 2.0, "maxBackoff": 60.0,
                          "multiplier": 2.0, "maxAge": 3600.0}
    assert d["misfire"]["policy"] == "all" and "maxCatchup" in d["misfire"]
    assert d["startDeadline"] == 600.0 and d["dst"] == {"ambiguous": "both", "nonexistent": "skip"}
    assert d["job"] == {"type": "report", "params": {}}
    assert d["resourceClass"] == "default"
    preview = got["preview"]
    assert len(preview) == 5 and preview[0]["scheduledAt"] == out["nextRunAt"]
    times = [datetime.fromisoformat(p["scheduledAt"]) for p in preview]
    assert all(b - a == timedelta(minutes=5) for a, b in pairwise(times))
    for p, t in zip(preview, times, strict=True):
        due = datetime.fromisoformat(p["dueAt"])
        assert timedelta(0) <= due - t < timedelta(seconds=30)
        assert p["local"].endswith(("+01:00", "+02:00"))
    assert any(p["dueAt"] != p["scheduledAt"] for p in preview)  # jitter is applied


async def test_a_cron_with_specials_is_created_and_previewed(stack: ApiStack) -> None:
    assert stack.http is not None
    s = sid()
    r = await create(stack, {"scheduleId": s, "cron": "0 18 LW * *", "timezone": "America/New_York",
                             "job": {"type": "report"}})
    assert r.status_code == 201, r.text
    g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))
    assert g.status_code == 200, g.text
    assert g.json()["definition"]["cron"] == "0 18 LW * *"
    for p in g.json()["preview"]:  # each instant is 18:00 on the last weekday of its month
        local = datetime.fromisoformat(p["local"])
        later = [local.date() + timedelta(days=k) for k in range(1, 4)]
        assert local.hour == 18 and local.weekday() < 5
        assert all(d.month != local.month or d.weekday() >= 5 for d in later), p
    r = await stack.http.get("/v1/preview", params={
        "cron": "30 2 ? 3 SUN#2", "timezone": "America/New_York", "count": 2,
        "from": "2026-01-01T00:00:00Z"}, headers=ACME)
    assert r.status_code == 200, r.text
    shifted = "the wall time does not exist that day (clocks go forward): shifted forward"
    assert r.json() == {"instants": [  # the second Sunday of March is the day of the gap
        {"utc": "2026-03-08T07:00:00Z", "local": "2026-03-08T03:00:00-04:00",
         "dst": "shifted", "note": shifted},
        {"utc": "2027-03-14T07:00:00Z", "local": "2027-03-14T03:00:00-04:00",
         "dst": "shifted", "note": shifted},
    ], "skipped": []}


async def test_numbers_in_other_scripts_are_400_naming_the_field(stack: ApiStack) -> None:
    assert stack.http is not None
    for body, field in (({"cron": "0 ¹ * * *"}, "cron"), ({"cron": "0 9 * * 5#٣"}, "cron"),
                        ({"every": "١h"}, "every"), ({"every": "9" * 5000 + "w"}, "every"),
                        ({"at": "2030-01-0١T00:00:00Z"}, "at")):
        r = await create(stack, {"scheduleId": sid(), **body, "job": {"type": "a"}})
        assert_error(r, 400, "invalid", field)
    for params, field in (({"cron": "*/² * * * *"}, "cron"), ({"every": "٣m"}, "every"),
                          ({"cron": "@daily", "from": "2026-01-0١"}, "from")):
        assert_error(await stack.http.get("/v1/preview", params=params, headers=ACME), 400,
                     "invalid", field)


async def test_invalid_bodies_are_400_naming_the_field(stack: ApiStack) -> None:
    assert stack.http is not None
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"cron": "61 * * * *", "job": {"type": "a"}}, "cron"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus", "job": {"type": "a"}}, "timezone"),
        ({"every": "soon", "job": {"type": "a"}}, "every"),
        ({"every": 0, "job": {"type": "a"}}, "every"),
        ({"cron": "0 9 * * *", "every": "1h", "job": {"type": "a"}}, "every"),
        ({"job": {"type": "a"}}, "cron"),
        ({"every": "1h"}, "job"),
        ({"every": "1h", "job": {"type": "a"}, "retry": {"maxAttempts": 0}}, "retry.maxAttempts"),
        ({"every": "1h", "job": {"type": "a"}, "retry": {"maxAttempts": 1000}},
         "retry.maxAttempts"),
        ({"every": "1h", "job": {"type": "a"}, "misfire": "sometimes"}, None),
        ({"every": "1h", "job": {"type": "a"}, "overlap": "maybe"}, "overlap"),
        ({"every": "1h", "job": {"type": "a"}, "color": "red"}, "color"),
        ({"every": "1h", "job": {"type": "a"}, "dst": {"ambiguous": "twice"}}, "dst.ambiguous"),
    ]
    for body, field in cases:
        r = await create(stack, {"scheduleId": sid(), **body})
        assert_error(r, 400, "invalid", field)
    r = await create(stack, {"scheduleId": "bad id!", "every": "1h", "job": {"type": "a"}})
    assert_error(r, 400, "invalid", "scheduleId")
    r = await stack.http.post("/v1/schedules", content=b"{nope", headers={
        **ACME, "Content-Type": "application/json"})
    body = assert_error(r, 400, "invalid")
    assert body["field"] is None


async def test_job_type_not_allowed_is_403(stack: ApiStack) -> None:
    r = await create(stack, {"scheduleId": sid(), "every": "1h", "job": {"type": "mine"}},
                     GLOBEX)
    assert_error(r, 403, "forbidden", "job.type")
    r = await create(stack, {"scheduleId": sid(), "every": "1h", "job": {"type": "report"}},
                     GLOBEX)
    assert r.status_code == 201


async def test_taken_id_and_idempotency_key(stack: ApiStack) -> None:
    s = sid()
    body = {"scheduleId": s, "every": "1h", "job": {"type": "a"}}
    first = await create(stack, body, **{"Idempotency-Key": "same"})
    assert first.status_code == 201
    again = await create(stack, body, **{"Idempotency-Key": "same"})
    # the processor answers a replay with the schedule as it is now (nextRunAt may have moved)
    assert again.status_code == 201
    assert {k: again.json()[k] for k in ("scheduleId", "revision")} == \
        {k: first.json()[k] for k in ("scheduleId", "revision")}
    other = await create(stack, {**body, "every": "2h"}, **{"Idempotency-Key": "same"})
    assert_error(other, 409, "conflict", "Idempotency-Key")
    taken = await create(stack, body)
    err = assert_error(taken, 409, "conflict", "scheduleId")
    assert err["revision"] == 1


async def test_a_fired_one_shot_completes_keeps_its_runs_and_frees_its_quota_slot(
    stack: ApiStack,
) -> None:
    assert stack.http is not None
    once = sid("once")
    at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    r = await create(stack, {"scheduleId": once, "at": at, "job": {"type": "a"}}, HOOLI)
    assert r.status_code == 201, r.text

    async def completed() -> dict[str, Any] | None:
        g = await stack.http.get(f"/v1/schedules/{once}", headers=HOOLI)  # type: ignore[union-attr]
        return g.json() if g.status_code == 200 and g.json()["state"] == "COMPLETED" else None

    doc = await wait_until(completed, 20, what="the one-shot COMPLETED")
    assert doc["completedReason"] == "at" and doc["completedAt"] and doc["nextRunAt"] is None
    runs = (await stack.http.get(f"/v1/schedules/{once}/runs", headers=HOOLI)).json()["items"]
    assert len(runs) == 1 and runs[0]["state"] == "READY"  # its history stays
    # the tenant's only slot is free again (max_schedules = 1), and still enforced
    r = await create(stack, {"scheduleId": sid(), "every": "1h", "job": {"type": "a"}}, HOOLI)
    assert r.status_code == 201, r.text
    await stack.http.get(f"/v1/schedules/{r.json()['scheduleId']}", headers=consistent(r, HOOLI))
    assert_error(await create(stack, {"scheduleId": sid(), "every": "1h", "job": {"type": "a"}},
                              HOOLI), 429, "quota")
    # only delete applies to a completed schedule
    put = await stack.http.put(f"/v1/schedules/{once}", json={"every": "1h", "job": {"type": "a"}},
                               headers={**HOOLI, "If-Match": str(doc["revision"])})
    assert "COMPLETED" in assert_error(put, 409, "conflict")["message"]
    assert_error(await stack.http.post(f"/v1/schedules/{once}:pause", headers=HOOLI), 409,
                 "conflict")
    r = await stack.http.delete(f"/v1/schedules/{once}", headers=HOOLI)
    assert r.status_code == 200 and r.json()["state"] == "DELETED"


async def test_max_schedules_is_429(stack: ApiStack) -> None:
    assert stack.http is not None
    made = []
    for _ in range(2):
        r = await create(stack, {"scheduleId": sid(), "every": "1h", "job": {"type": "a"}},
                         INITECH)
        assert r.status_code == 201
        made.append(r)
    # the processors answer at once (the quota aggregate), whatever the projection has seen
    r = await create(stack, {"scheduleId": sid(), "every": "1h", "job": {"type": "a"}}, INITECH)
    err = assert_error(r, 429, "quota")
    assert "max 2" in err["message"], err
    # a replay of an existing schedule is not a new one: the processor answers it
    again = await create(stack, {"scheduleId": made[0].json()["scheduleId"], "every": "1h",
                                 "job": {"type": "a"}}, INITECH)
    assert_error(again, 409, "conflict")
    # a delete frees a slot, without waiting for the projection
    gone = await stack.http.delete(f"/v1/schedules/{made[0].json()['scheduleId']}",
                                   headers=INITECH)
    assert gone.status_code in (200, 204), gone.text

    async def slot_free() -> bool:  # the release is one more step of the saga
        r = await create(stack, {"scheduleId": sid(), "every": "1h", "job": {"type": "a"}},
                         INITECH)
        assert r.status_code in (201, 429), r.text
        return r.status_code == 201

    await wait_until(slot_free, 20, what="a create after the delete accepted")
    full = await create(stack, {"scheduleId": sid(), "every": "1h", "job": {"type": "a"}},
                        INITECH)
    assert_error(full, 429, "quota")


# ------------------------------------------------------------------ revise, pause, delete


async def test_a_paused_schedule_shows_what_a_resume_would_run_or_skip(stack: ApiStack) -> None:
    assert stack.http is not None
    s = sid("resume")
    r = await create(stack, {"scheduleId": s, "every": "1s", "job": {"type": "a"},
                             "overlap": "allow", "misfire": "latest"})
    assert r.status_code == 201, r.text
    r = await stack.http.post(f"/v1/schedules/{s}:pause", headers=ACME)
    assert r.status_code == 200, r.text

    async def plan_of_a_backlog() -> dict[str, Any] | None:
        g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))  # type: ignore[union-attr]
        plan = g.json()["resume"]
        return plan if sum(i["count"] for i in plan["instants"]) >= 3 else None

    plan = await wait_until(plan_of_a_backlog, 20, what="three instants due while paused")
    *older, newest = plan["instants"]
    assert (newest["action"], newest["reason"]) == ("run", None)
    assert {(i["action"], i["reason"]) for i in older} == {("skip", "coalesced")}
    r = await stack.http.post(f"/v1/schedules/{s}:resume", headers=ACME)
    assert r.status_code == 200, r.text
    g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))
    assert g.json()["state"] == "ACTIVE" and g.json()["resume"] is None
    page = (await stack.http.get(f"/v1/schedules/{s}/runs", headers=consistent(r))).json()
    paused_span = [i for i in page["items"]
                   if i["scheduledAt"] >= plan["instants"][0]["scheduledAt"]]
    ran = [i for i in paused_span if i["state"] != "SKIPPED"]
    # the resume did what the plan said: the newest instant ran, the older were coalesced
    assert len(ran) >= 1 and ran[-1]["scheduledAt"] >= newest["scheduledAt"]
    resumed = [i for i in ran if i["scheduledAt"] <= newest["scheduledAt"]]
    assert len(resumed) <= 1
    for item in paused_span:
        if item["state"] == "SKIPPED":
            one = (await stack.http.get(f"/v1/runs/{item['runId']}", headers=ACME)).json()
            assert one["skippedReason"] == "coalesced"


async def test_put_needs_if_match_and_the_current_revision(stack: ApiStack) -> None:
    assert stack.http is not None
    s = sid()
    assert (await create(stack, {"scheduleId": s, "every": "1h",
                                 "job": {"type": "a"}})).status_code == 201
    new = {"every": "30m", "job": {"type": "a", "params": {"v": 2}}}
    r = await stack.http.put(f"/v1/schedules/{s}", json=new, headers=ACME)
    assert_error(r, 428, "precondition_required", "If-Match")
    r = await stack.http.put(f"/v1/schedules/{s}", json=new, headers={**ACME, "If-Match": "x"})
    assert_error(r, 400, "invalid", "If-Match")
    for bad in ("²".encode("latin-1"), b"9" * 5000, str(2**63).encode()):  # isdigit, not a revision
        r = await stack.http.put(f"/v1/schedules/{s}", json=new, headers={**ACME, "If-Match": bad})
        assert_error(r, 400, "invalid", "If-Match")
    r = await stack.http.put(f"/v1/schedules/{s}", json=new, headers={**ACME, "If-Match": '"1"'})
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"revision", "nextRunAt"} and r.json()["revision"] == 2
    stale = await stack.http.put(f"/v1/schedules/{s}", json=new, headers={**ACME, "If-Match": "1"})
    assert assert_error(stale, 409, "conflict", "If-Match")["revision"] == 2
    g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))
    assert g.json()["revision"] == 2 and g.json()["definition"]["every"] == 1800.0
    assert g.json()["definition"]["job"]["params"] == {"v": 2}
    r = await stack.http.put(f"/v1/schedules/{sid()}", json=new, headers={**ACME, "If-Match": "1"})
    assert_error(r, 404, "not_found")
    r = await stack.http.put(f"/v1/schedules/{s}", json={"every": "1h"}, headers={
        **ACME, "If-Match": "2"})
    assert_error(r, 400, "invalid", "job")


async def _patch(stack: ApiStack, s: str, patch: Any, revision: str | None,
                 headers: dict[str, str] = ACME,
                 content_type: str = "application/merge-patch+json") -> httpx.Response:
    assert stack.http is not None
    extra = {"If-Match": revision} if revision is not None else {}
    return await stack.http.patch(f"/v1/schedules/{s}", content=json.dumps(patch),
                                  headers={**headers, **extra, "Content-Type": content_type})


async def test_patch_changes_only_the_fields_it_names(stack: ApiStack) -> None:
    assert stack.http is not None
    s = sid("patch")
    r = await create(stack, {"scheduleId": s, "cron": "0 9 * * 1-5", "timezone": "Europe/Paris",
                             "end": "2031-01-01T00:00:00Z", "priority": 5,
                             "job": {"type": "report", "params": {"region": "eu", "n": 1}}})
    assert r.status_code == 201, r.text
    r = await _patch(stack, s, {"cron": None, "every": "30s"}, "1")
    assert r.status_code == 200, r.text
    assert r.json()["revision"] == 2 and r.headers["etag"] == '"2"'
    d = (await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))).json()["definition"]
    assert d["every"] == 30.0 and "cron" not in d and d["timezone"] == "Europe/Paris"
    assert d["job"] == {"type": "report", "params": {"region": "eu", "n": 1}}
    assert d["end"] == "2031-01-01T00:00:00Z" and d["priority"] == 5
    # params merge member by member; null removes an optional member; plain JSON is accepted
    r = await _patch(stack, s, {"job": {"params": {"n": 2, "region": None}}, "end": None},
                     '"2"', content_type="application/json")
    assert r.status_code == 200, r.text
    d = (await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))).json()["definition"]
    assert d["job"] == {"type": "report", "params": {"n": 2}} and "end" not in d
    assert d["every"] == 30.0 and d["priority"] == 5
    # an empty patch is a revision that changes nothing
    r = await _patch(stack, s, {}, "3")
    assert r.status_code == 200 and r.json()["revision"] == 4, r.text
    same = (await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))).json()
    assert same["definition"] == d and same["revision"] == 4


async def test_patch_refuses_what_a_put_refuses(stack: ApiStack) -> None:
    s = sid("patch")
    r = await create(stack, {"scheduleId": s, "every": "1h", "job": {"type": "a"}})
    assert r.status_code == 201, r.text
    # the merged definition is validated as a PUT body: 400 naming the field, nothing sent
    assert_error(await _patch(stack, s, {"maxCount": 0}, "1"), 400, "invalid", "maxCount")
    assert_error(await _patch(stack, s, {"job": {"type": None}}, "1"), 400, "invalid",
                 "job.type")
    assert_error(await _patch(stack, s, {"colour": "red"}, "1"), 400, "invalid", "colour")
    body = assert_error(await _patch(stack, s, {"cron": "0 9 * * *"}, "1"), 400, "invalid")
    assert "exactly one of cron, every, at, delay" in body["message"]
    assert_error(await _patch(stack, s, ["every"], "1"), 400, "invalid")
    assert_error(await _patch(stack, s, {"every": "2h"}, None), 428, "precondition_required",
                 "If-Match")
    assert_error(await _patch(stack, s, {"every": "2h"}, "x"), 400, "invalid", "If-Match")
    # nothing was written by the refusals: revision 1 is still current
    r = await _patch(stack, s, {"every": "2h"}, "1")
    assert r.status_code == 200 and r.json()["revision"] == 2, r.text
    # a stale If-Match: the PUT's 409 with the current revision
    stale = await _patch(stack, s, {"every": "3h"}, "1")
    assert assert_error(stale, 409, "conflict", "If-Match")["revision"] == 2
    # a revision never written: the same 409, once the read model has caught up
    ahead = await _patch(stack, s, {"every": "3h"}, "7")
    assert assert_error(ahead, 409, "conflict", "If-Match")["revision"] == 2
    # no such schedule, or another tenant's: 404
    assert_error(await _patch(stack, sid(), {"every": "3h"}, "1"), 404, "not_found",
                 "scheduleId")
    assert_error(await _patch(stack, s, {"every": "3h"}, "2", headers=GLOBEX), 404,
                 "not_found", "scheduleId")
    # not JSON by its content type: 415
    assert_error(await _patch(stack, s, {"every": "3h"}, "2", content_type="text/plain"), 415,
                 "unsupported_media_type")


async def _patch_while_unprojected(
    stack: ApiStack, write: Callable[[httpx.AsyncClient], Awaitable[httpx.Response]],
    s: str, patch: dict[str, Any], if_match: str,
) -> httpx.Response:
    """With the projector paused: ``write`` through an app that does not wait for the read
    model (answered, not yet visible), then a patch of ``s`` at ``if_match``, which must wait
    and write nothing; its answer once the projector resumes."""
    assert stack.store is not None
    await stack.pause_projector()
    try:
        quick = create_app(stack.client, stack.store, TENANTS, visible_timeout=0.2)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=quick),
                                     base_url="http://t") as http:
            r = await write(http)
        assert r.status_code in (200, 201) and r.headers[VISIBLE_HEADER] == "false", r.text
        patching = asyncio.create_task(_patch(stack, s, patch, if_match))
        stored = await stack.store.offsets()
        assert not patching.done() and stored == await stack.store.offsets()
    finally:
        stack.resume_projector()
    return await asyncio.wait_for(patching, 10)


async def test_patch_of_a_revision_the_read_model_lacks_waits_for_it(stack: ApiStack) -> None:
    """The base of a patch is the definition at its If-Match revision, never an older one
    the read model still holds: the patch waits for the projection, then merges."""
    assert stack.http is not None
    s = sid("behind")
    assert (await create(stack, {"scheduleId": s, "every": "1h", "job": {
        "type": "a", "params": {"v": 1}}})).status_code == 201
    done = await _patch_while_unprojected(
        stack, lambda http: http.put(f"/v1/schedules/{s}", headers={**ACME, "If-Match": "1"},
                                     json={"every": "2h", "job": {"type": "a",
                                                                  "params": {"v": 2}}}),
        s, {"job": {"params": {"w": 3}}}, "2")
    assert done.status_code == 200 and done.json()["revision"] == 3, done.text
    d = (await stack.http.get(f"/v1/schedules/{s}", headers=consistent(done))).json()
    assert d["definition"]["every"] == 7200.0
    assert d["definition"]["job"]["params"] == {"v": 2, "w": 3}


async def test_patch_of_a_schedule_the_read_model_lacks_yet_waits_for_it(
        stack: ApiStack) -> None:
    """Created a moment ago, not yet in the read model: the patch waits for the projection
    of the schedule's partition, then merges — not 404."""
    assert stack.http is not None
    s = sid("fresh")
    done = await _patch_while_unprojected(
        stack, lambda http: http.post("/v1/schedules", headers=ACME, json={
            "scheduleId": s, "every": "1h", "job": {"type": "a", "params": {"v": 1}}}),
        s, {"job": {"params": {"w": 2}}}, "1")
    assert done.status_code == 200 and done.json()["revision"] == 2, done.text
    d = (await stack.http.get(f"/v1/schedules/{s}", headers=consistent(done))).json()
    assert d["definition"]["job"]["params"] == {"v": 1, "w": 2}


async def test_patch_and_a_concurrent_revise_one_wins(stack: ApiStack) -> None:
    """Two revisions from the same revision: the processor's check refuses the second,
    whichever of PUT and PATCH it is."""
    assert stack.http is not None
    s = sid("race")
    assert (await create(stack, {"scheduleId": s, "every": "1h",
                                 "job": {"type": "a"}})).status_code == 201
    put = stack.http.put(f"/v1/schedules/{s}", json={"every": "2h", "job": {"type": "a"}},
                         headers={**ACME, "If-Match": "1"})
    patch = _patch(stack, s, {"job": {"params": {"k": 1}}}, "1")
    answers = await asyncio.gather(put, patch)
    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    loser = next(a for a in answers if a.status_code == 409)
    assert loser.json()["field"] == "If-Match" and loser.json()["revision"] == 2


async def test_pause_resume_delete_with_colons_in_the_path(stack: ApiStack) -> None:
    assert stack.http is not None
    s = f"nightly:{uuid.uuid4().hex[:6]}:pause"  # IDs may hold colons, even ':pause'
    assert (await create(stack, {"scheduleId": s, **CRON})).status_code == 201
    r = await stack.http.post(f"/v1/schedules/{s}:pause", headers=ACME)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "PAUSED" and r.json()["scheduleId"] == s
    g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))
    assert g.json()["state"] == "PAUSED" and g.json()["preview"] == []
    r = await stack.http.post(f"/v1/schedules/{s}:resume", headers=ACME)
    assert r.status_code == 200 and r.json()["state"] == "ACTIVE"
    g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))
    assert g.json()["state"] == "ACTIVE" and len(g.json()["preview"]) == 5
    r = await stack.http.delete(f"/v1/schedules/{s}", headers=ACME)
    assert r.status_code == 200 and r.json()["state"] == "DELETED"
    g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))
    assert g.json()["state"] == "DELETED" and g.json()["nextRunAt"] is None
    for path in (f"/v1/schedules/{sid()}:pause", f"/v1/schedules/{sid()}:resume"):
        assert_error(await stack.http.post(path, headers=ACME), 404, "not_found")
    assert_error(await stack.http.delete(f"/v1/schedules/{sid()}", headers=ACME), 404, "not_found")
    # not an action: the path names schedule "<id>:explode", which has no POST
    assert_error(await stack.http.post(f"/v1/schedules/{s}:explode", headers=ACME), 405,
                 "method_not_allowed")


# ------------------------------------------------------------------ runs


async def _schedule(stack: ApiStack, headers: dict[str, str] = ACME) -> str:
    s = sid()
    r = await create(stack, {"scheduleId": s, "every": "1h", "overlap": "allow",
                             "retry": {"maxAttempts": 1}, "job": {"type": "report"}}, headers)
    assert r.status_code == 201, r.text
    return s


async def _trigger(stack: ApiStack, s: str, key: str, body: Any = None,
                   headers: dict[str, str] = ACME) -> httpx.Response:
    assert stack.http is not None
    kw: dict[str, Any] = {"json": body} if body is not None else {}
    return await stack.http.post(f"/v1/schedules/{s}/runs",
                                 headers={**headers, "Idempotency-Key": key}, **kw)


async def test_manual_trigger_and_run_detail(stack: ApiStack) -> None:
    assert stack.http is not None
    s = await _schedule(stack)
    r = await stack.http.post(f"/v1/schedules/{s}/runs", headers=ACME)
    assert_error(r, 400, "invalid", "Idempotency-Key")
    r = await _trigger(stack, s, "k1", {"params": {"x": 1}})
    assert r.status_code == 201, r.text
    assert set(r.json()) == {"runId", "state", "traceId"} and r.json()["state"] == "READY"
    run_id = r.json()["runId"]
    assert r.json()["traceId"] == run_trace_id(run_id)
    same = await _trigger(stack, s, "k1", {"params": {"x": 1}})
    assert same.status_code == 201 and same.json()["runId"] == run_id
    other = await _trigger(stack, s, "k1", {"params": {"x": 2}})
    assert_error(other, 409, "conflict", "Idempotency-Key")
    assert_error(await _trigger(stack, sid(), "k1"), 404, "not_found")

    g = await stack.http.get(f"/v1/runs/{run_id}", headers=consistent(r))
    assert g.status_code == 200, g.text
    run = g.json()
    assert run["runId"] == run_id and run["scheduleId"] == s and run["state"] == "READY"
    assert run["revision"] == 1 and run["trigger"] == "manual" and run["params"] == {"x": 1}
    assert run["attempts"] == [] and run["result"] is None and run["effects"] == []
    assert run["cancellationRequested"] is False and run["skippedReason"] is None
    assert run["scheduledAt"].endswith("Z")
    assert_error(await stack.http.get("/v1/runs/r_nope", headers=ACME), 404, "not_found")


async def test_cancel_redrive_reconcile(stack: ApiStack) -> None:
    assert stack.http is not None
    s = await _schedule(stack)
    ready = (await _trigger(stack, s, "a")).json()["runId"]
    r = await stack.http.post(f"/v1/runs/{ready}:cancel", headers=consistent(
        await _trigger(stack, s, "a")))
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "CANCELLED" and r.json()["outcome"] == "cancelled"
    assert_error(await stack.http.post(f"/v1/runs/{ready}:cancel", headers=ACME), 409, "conflict")
    assert_error(await stack.http.post(f"/v1/runs/{ready}:redrive", headers=ACME), 409,
                 "conflict")
    assert_error(await stack.http.post(f"/v1/runs/{ready}:reconcile", json={"decision": "retry"},
                                       headers=ACME), 409, "conflict")
    assert_error(await stack.http.post(f"/v1/runs/{ready}:reconcile", json={"decision": "maybe"},
                                       headers=ACME), 400, "invalid", "decision")

    # a running (LEASED) run: cancellation is requested -> 202
    t = await _trigger(stack, s, "b")
    leased = t.json()["runId"]
    claim = await stack.client.claim("acme", s, leased, 1, "w1")
    r = await stack.http.post(f"/v1/runs/{leased}:cancel", headers=consistent(t))
    assert r.status_code == 202, r.text
    assert r.json()["outcome"] == "requested"
    g = (await stack.http.get(f"/v1/runs/{leased}", headers=consistent(r))).json()
    assert g["cancellationRequested"] is True and g["state"] == "LEASED"
    assert g["attempts"][0]["workerId"] == "w1" and g["attempts"][0]["outcome"] is None
    assert g["attempts"][0]["fence"] == claim["fence"]
    assert set(g["attempts"][0]) >= {"attempt", "fence", "workerId", "claimedAt", "leaseUntil",
                                     "outcome"}

    # another run fails permanently -> DEAD -> redrive keeps the run ID
    t = await _trigger(stack, s, "c")
    doomed = t.json()["runId"]
    claim = await stack.client.claim("acme", s, doomed, 1, "w2")
    await stack.client.fail("acme", s, doomed, 1, claim["fence"], "w2", "permanent", "boom")

    async def dead() -> bool:
        g = await stack.http.get(f"/v1/runs/{doomed}", headers=consistent(t))
        return g.status_code == 200 and g.json()["state"] == "DEAD"

    await wait_until(dead, 30, what="run DEAD in the read model")
    g = (await stack.http.get(f"/v1/runs/{doomed}", headers=ACME)).json()
    assert g["attempts"][0]["outcome"] == "failed" and g["deadReason"] == "permanent_error"
    r = await stack.http.post(f"/v1/runs/{doomed}:redrive", headers=ACME)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "READY" and r.json()["attempt"] == 2
    assert_error(await stack.http.post("/v1/runs/r_nope:cancel", headers=ACME), 404, "not_found")


async def test_cancel_or_redrive_of_a_finished_run_the_processor_let_go_is_409(
        stack: ApiStack) -> None:
    """Only the newest finished run stays in the processor's state: a cancel or redrive of an
    older one is a conflict saying it finished (naming its final state when the state
    remembers it: a manual run's request key keeps it), not 404, which stays for a run ID
    that never existed."""
    assert stack.http is not None
    s = await _schedule(stack)
    first = (await _trigger(stack, s, "first")).json()["runId"]
    r = await stack.http.post(f"/v1/runs/{first}:cancel", headers=ACME)
    assert r.status_code == 200, r.text
    second = (await _trigger(stack, s, "second")).json()["runId"]
    r = await stack.http.post(f"/v1/runs/{second}:cancel", headers=ACME)
    assert r.status_code == 200, r.text  # the newest finished run: the first one is let go
    body = assert_error(await stack.http.post(f"/v1/runs/{first}:cancel", headers=consistent(r)),
                        409, "conflict")
    assert body["state"] == "CANCELLED", body
    assert body["message"] == ("run is CANCELLED and no longer held by the processor: it can "
                               "no longer be cancelled")
    body = assert_error(await stack.http.post(f"/v1/runs/{first}:redrive", headers=ACME),
                        409, "conflict")
    assert body["message"] == "only a DEAD run can be redriven; run is CANCELLED"

    # scheduled runs: the API sends the run's instant, by which the processor knows its ID
    ticking = sid()
    r = await create(stack, {"scheduleId": ticking, "every": "1s", "overlap": "allow",
                             "job": {"type": "report"}})
    assert r.status_code == 201, r.text

    async def two_runs() -> list[str] | None:
        g = await stack.http.get(f"/v1/schedules/{ticking}/runs", headers=ACME)
        items = g.json()["items"] if g.status_code == 200 else []
        ready = sorted(items, key=lambda i: i["scheduledAt"])
        return [i["runId"] for i in ready[:2]] if len(ready) >= 2 else None

    older, newer = await wait_until(two_runs, 30, what="two scheduled runs in the read model")
    for run_id in (older, newer):
        r = await stack.http.post(f"/v1/runs/{run_id}:cancel", headers=ACME)
        assert r.status_code == 200, r.text
    for action, verb in (("cancel", "cancelled"), ("redrive", "redriven")):
        body = assert_error(await stack.http.post(f"/v1/runs/{older}:{action}",
                                                  headers=consistent(r)), 409, "conflict")
        assert body["message"] == ("run has finished and is no longer held by the processor: "
                                   f"it can no longer be {verb}"), body
    assert_error(await stack.http.post("/v1/runs/r_nope:redrive", headers=ACME), 404,
                 "not_found")
    r = await stack.http.post(f"/v1/schedules/{ticking}:pause", headers=ACME)
    assert r.status_code == 200, r.text


async def test_result_is_shown_with_checksum_size_and_inline(stack: ApiStack) -> None:
    assert stack.http is not None
    s = await _schedule(stack)
    run_id = (await _trigger(stack, s, "k")).json()["runId"]
    claim = await stack.client.claim("acme", s, run_id, 1, "w9")
    reply = await stack.client.send(stack.client.envelope("acme", s, __import__(
        "chronolog.domain.messages", fromlist=["CompleteRun"]).CompleteRun(
        run_id=run_id, attempt=1, fence=claim["fence"], worker_id="w9", checksum="sha256:ab",
        size=2, inline={"ok": True})))
    assert reply.status == "ok"
    from chronolog.api.app import encode_token
    token = encode_token({p.partition: p.offset + 1 for p in reply.positions})
    g = await stack.http.get(f"/v1/runs/{run_id}", headers={**ACME, CONSISTENCY_HEADER: token})
    run = g.json()
    assert run["state"] == "SUCCEEDED"
    assert run["result"] == {"checksum": "sha256:ab", "size": 2, "inline": {"ok": True},
                             "attempt": 1}
    assert run["attempts"][0]["outcome"] == "succeeded" and run["startedAt"] and run["finishedAt"]


async def test_tenant_isolation(stack: ApiStack) -> None:
    assert stack.http is not None
    s = await _schedule(stack)
    t = await _trigger(stack, s, "k")
    run_id = t.json()["runId"]
    await stack.http.get(f"/v1/runs/{run_id}", headers=consistent(t))
    for method, path in (("GET", f"/v1/schedules/{s}"), ("GET", f"/v1/schedules/{s}/runs"),
                         ("GET", f"/v1/runs/{run_id}"), ("POST", f"/v1/runs/{run_id}:cancel"),
                         ("POST", f"/v1/schedules/{s}:pause"), ("DELETE", f"/v1/schedules/{s}")):
        r = await stack.http.request(method, path, headers=GLOBEX)
        assert_error(r, 404, "not_found")
    r = await stack.http.put(f"/v1/schedules/{s}", json={"every": "1h", "job": {"type": "report"}},
                             headers={**GLOBEX, "If-Match": "1"})
    assert_error(r, 404, "not_found")
    # the same schedule ID is free for the other tenant
    r = await create(stack, {"scheduleId": s, "every": "1h", "job": {"type": "report"}}, GLOBEX)
    assert r.status_code == 201
    g = await stack.http.get(f"/v1/schedules/{s}", headers=ACME)
    assert g.json()["state"] == "ACTIVE" and g.json()["definition"]["overlap"] == "allow"


# ------------------------------------------------------------------ history paging


async def test_cursor_paging_never_skips_or_repeats_while_runs_arrive(stack: ApiStack) -> None:
    assert stack.http is not None
    s = await _schedule(stack)
    last: httpx.Response | None = None
    for i in range(7):
        last = await _trigger(stack, s, f"pre-{i}")
    assert last is not None
    first = await stack.http.get(f"/v1/schedules/{s}/runs", params={"limit": 2},
                                 headers=consistent(last))
    assert first.status_code == 200, first.text
    page = first.json()
    assert set(page) == {"items", "nextCursor", "watermark"}
    assert set(page["items"][0]) == {"runId", "scheduleId", "scheduledAt", "state", "attempt",
                                     "startedAt", "finishedAt", "waiting", "traceId"}
    wm = page["watermark"]
    assert set(wm["partitions"]) == {"0", "1", "2", "3"} and wm["time"].endswith("Z")
    seen = list(page["items"])
    cursor = page["nextCursor"]
    n = 0
    while cursor:
        n += 1
        arrived = await _trigger(stack, s, f"during-{n}")  # new runs while paging
        r = await stack.http.get(f"/v1/schedules/{s}/runs", params={"limit": 2, "after": cursor},
                                 headers=consistent(arrived))
        assert r.status_code == 200, r.text
        seen += r.json()["items"]
        cursor = r.json()["nextCursor"]
    keys = [(i["scheduledAt"], i["runId"]) for i in seen]
    # 7 manual runs (+ the schedule's own first run once its tick came): no repeats, in order
    assert len(keys) == len(set(keys)) >= 7
    assert keys == sorted(keys, reverse=True)
    everything = await stack.http.get(f"/v1/schedules/{s}/runs", params={"limit": 500},
                                      headers=consistent(arrived))
    all_keys = [(i["scheduledAt"], i["runId"]) for i in everything.json()["items"]]
    # nothing at or below the first page's bound was skipped; everything newer arrived later
    assert [k for k in all_keys if k <= keys[0]] == keys
    assert len([k for k in all_keys if k > keys[0]]) == n

    # filters and bad input
    r = await stack.http.get(f"/v1/schedules/{s}/runs", params={"state": "ready,leased"},
                             headers=ACME)
    assert r.status_code == 200 and all(i["state"] in ("READY", "LEASED")
                                        for i in r.json()["items"])
    for params, field in (({"limit": 0}, "limit"), ({"limit": 501}, "limit"),
                          ({"state": "BOGUS"}, "state"), ({"after": "garbage"}, "after")):
        assert_error(await stack.http.get(f"/v1/schedules/{s}/runs", params=params, headers=ACME),
                     400, "invalid", field)
    assert_error(await stack.http.get(f"/v1/schedules/{s}/runs",
                                      params={"after": first.json()["nextCursor"],
                                              "state": "READY"},
                                      headers=ACME), 400, "invalid", "after")
    assert_error(await stack.http.get(f"/v1/schedules/{sid()}/runs", headers=ACME), 404,
                 "not_found")


# ------------------------------------------------------------------ read-your-writes


async def test_every_write_is_seen_by_the_next_read_without_any_header(stack: ApiStack) -> None:
    assert stack.http is not None
    http = stack.http
    s = sid()
    definition = {"every": "1h", "overlap": "allow", "retry": {"maxAttempts": 1},
                  "job": {"type": "report"}}
    r = await create(stack, {"scheduleId": s, **definition})
    assert r.status_code == 201, r.text
    assert r.headers[VISIBLE_HEADER] == "true" and r.headers[CONSISTENCY_HEADER]
    g = await http.get(f"/v1/schedules/{s}", headers=ACME)  # no token
    assert g.status_code == 200, g.text
    assert g.json()["revision"] == 1
    listed = await http.get("/v1/schedules", params={"prefix": s}, headers=ACME)
    assert [i["scheduleId"] for i in listed.json()["items"]] == [s]

    r = await http.put(f"/v1/schedules/{s}", json={**definition, "every": "2h"},
                       headers={**ACME, "If-Match": "1"})
    assert r.status_code == 200 and r.headers[VISIBLE_HEADER] == "true", r.text
    assert (await http.get(f"/v1/schedules/{s}", headers=ACME)).json()["revision"] == 2
    for action, state in ((":pause", "PAUSED"), (":resume", "ACTIVE")):
        r = await http.post(f"/v1/schedules/{s}{action}", headers=ACME)
        assert r.status_code == 200 and r.headers[VISIBLE_HEADER] == "true", r.text
        assert (await http.get(f"/v1/schedules/{s}", headers=ACME)).json()["state"] == state

    t = await _trigger(stack, s, "rw")
    assert t.status_code == 201 and t.headers[VISIBLE_HEADER] == "true", t.text
    run_id = t.json()["runId"]
    g = await http.get(f"/v1/runs/{run_id}", headers=ACME)
    assert g.status_code == 200 and g.json()["state"] == "READY", g.text
    again = await _trigger(stack, s, "rw")  # an idempotent replay: no new event
    assert again.status_code == 201 and again.headers[VISIBLE_HEADER] == "true"
    r = await http.post(f"/v1/runs/{run_id}:cancel", headers=ACME)
    assert r.status_code == 200 and r.headers[VISIBLE_HEADER] == "true", r.text
    assert (await http.get(f"/v1/runs/{run_id}", headers=ACME)).json()["state"] == "CANCELLED"

    # a DEAD run (failed through the log, read with its token), redriven through the API
    t = await _trigger(stack, s, "rw-dead")
    doomed = t.json()["runId"]
    claim = await stack.client.claim("acme", s, doomed, 1, "w-rw")
    await stack.client.fail("acme", s, doomed, 1, claim["fence"], "w-rw", "permanent", "boom")

    async def dead() -> bool:
        g = await http.get(f"/v1/runs/{doomed}", headers=consistent(t))
        return g.status_code == 200 and g.json()["state"] == "DEAD"

    await wait_until(dead, 30, what="run DEAD in the read model")
    r = await http.post(f"/v1/runs/{doomed}:redrive", headers=ACME)
    assert r.status_code == 200 and r.headers[VISIBLE_HEADER] == "true", r.text
    g = (await http.get(f"/v1/runs/{doomed}", headers=ACME)).json()
    assert g["state"] == "READY" and g["attempt"] == 2

    r = await http.delete(f"/v1/schedules/{s}", headers=ACME)
    assert r.status_code == 200 and r.headers[VISIBLE_HEADER] == "true", r.text
    assert (await http.get(f"/v1/schedules/{s}", headers=ACME)).json()["state"] == "DELETED"


async def test_a_write_the_read_model_does_not_show_in_time_is_still_accepted(
    stack: ApiStack,
) -> None:
    assert stack.http is not None and stack.store is not None
    app = create_app(stack.client, stack.store, TENANTS, visible_timeout=0.3)
    await stack.pause_projector()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as http:
            s = sid()
            r = await http.post("/v1/schedules", json={"scheduleId": s, "every": "1h",
                                                       "job": {"type": "a"}}, headers=ACME)
            # the bound passed: still the normal answer, saying it is not visible yet
            assert r.status_code == 201, r.text
            assert r.headers[VISIBLE_HEADER] == "false"
            assert r.json()["scheduleId"] == s and r.json()["revision"] == 1
            assert r.headers[CONSISTENCY_HEADER]
            assert_error(await http.get(f"/v1/schedules/{s}", headers=ACME), 404, "not_found")
    finally:
        stack.resume_projector()
    g = await stack.http.get(f"/v1/schedules/{s}", headers=consistent(r))
    assert g.status_code == 200 and g.json()["scheduleId"] == s


async def test_a_read_with_the_token_waits_for_the_projection(stack: ApiStack) -> None:
    assert stack.http is not None and stack.store is not None
    quick = create_app(stack.client, stack.store, TENANTS, visible_timeout=0.2)
    await stack.pause_projector()
    try:
        s = sid()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=quick),
                                     base_url="http://t") as http:
            r = await http.post("/v1/schedules", json={"scheduleId": s, "every": "1h",
                                                       "job": {"type": "a"}}, headers=ACME)
        assert r.status_code == 201 and r.headers[VISIBLE_HEADER] == "false"
        plain = await stack.http.get(f"/v1/schedules/{s}", headers=ACME)
        assert_error(plain, 404, "not_found")  # no token: whatever the projection holds now
        waiting = asyncio.create_task(stack.http.get(f"/v1/schedules/{s}", headers=consistent(r)))
        assert stack.store is not None
        stored = await stack.store.offsets()
        assert not waiting.done() and stored == await stack.store.offsets()
    finally:
        stack.resume_projector()
    got = await asyncio.wait_for(waiting, 10)
    assert got.status_code == 200 and got.json()["scheduleId"] == s
    r = await stack.http.get(f"/v1/schedules/{s}", headers={**ACME, CONSISTENCY_HEADER: "zz"})
    assert_error(r, 400, "invalid", CONSISTENCY_HEADER)


async def test_a_token_the_projection_does_not_reach_in_time_is_503(
    stack: ApiStack, lg: EventLog
) -> None:
    assert stack.store is not None and stack.http is not None
    app = create_app(stack.client, stack.store, TENANTS, consistency_timeout=0.3)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as http:
        await stack.pause_projector()
        try:
            s = sid()
            written = await http.post("/v1/schedules", headers=ACME, json={
                "scheduleId": s, "cron": "0 0 1 1 *", "job": {"type": "report"}})
            assert written.status_code == 201, written.text
            r = await http.get(f"/v1/schedules/{s}", headers=consistent(written))
            assert_error(r, 503, "unavailable", CONSISTENCY_HEADER)
            assert r.headers["retry-after"] == "1"
        finally:
            stack.resume_projector()
        # a token past anything the log has written is no write's: refused at once
        from chronolog.api.app import encode_token
        far = encode_token({0: 10**9})
        r = await http.get("/v1/schedules/x", headers={**ACME, CONSISTENCY_HEADER: far})
        assert_error(r, 400, "invalid", CONSISTENCY_HEADER)


async def test_no_reply_in_time_is_503_saying_the_command_may_still_be_decided(
    stack: ApiStack, lg: EventLog
) -> None:
    # a client on a topic prefix no processor serves
    from chronolog.client import Client
    idle_topics = Topics(prefix=f"idle{uuid.uuid4().hex[:6]}.", partitions=1)
    other = open_log(_config_like(lg, idle_topics))
    await other.start()
    await other.ensure_topics()
    client = Client(other, reply_timeout=0.5)
    await client.start()
    try:
        assert stack.store is not None
        app = create_app(client, stack.store, TENANTS, reply_timeout=0.5)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as http:
            r = await http.post("/v1/schedules", json={"scheduleId": sid(), "every": "1h",
                                                       "job": {"type": "a"}}, headers=ACME)
            body = assert_error(r, 503, "unavailable")
            assert "may still be decided" in body["message"]
    finally:
        await client.close()
        await other.close()


def _config_like(lg: EventLog, topics: Topics) -> LogConfig:
    path = getattr(lg, "path", None)
    if path is not None:
        return LogConfig("sqlite", str(path), topics)
    return LogConfig("kafka", lg.bootstrap_servers, topics)


# ------------------------------------------------------------------ preview, health, metrics


async def test_preview_endpoint(stack: ApiStack) -> None:
    assert stack.http is not None
    r = await stack.http.get("/v1/preview", params={
        "cron": "30 2 * * *", "timezone": "Europe/Berlin", "count": 3,
        "from": "2026-03-28T00:00:00Z"}, headers=ACME)
    assert r.status_code == 200, r.text
    assert r.json() == {"instants": [
        {"utc": "2026-03-28T01:30:00Z", "local": "2026-03-28T02:30:00+01:00", "dst": None,
         "note": None},
        {"utc": "2026-03-29T01:00:00Z", "local": "2026-03-29T03:00:00+02:00",  # DST gap
         "dst": "shifted", "note": "the wall time does not exist that day (clocks go "
         "forward): shifted forward"},
        {"utc": "2026-03-30T00:30:00Z", "local": "2026-03-30T02:30:00+02:00", "dst": None,
         "note": None},
    ], "skipped": []}
    r = await stack.http.get("/v1/preview", params={"every": "90m", "from": "2026-01-01T00:00:00Z",
                                                    "count": 2}, headers=ACME)
    assert [i["utc"] for i in r.json()["instants"]] == ["2026-01-01T01:30:00Z",
                                                        "2026-01-01T03:00:00Z"]
    for params, field in (({"cron": "nope"}, "cron"), ({"cron": "* * * * *", "timezone": "X/Y"},
                                                        "timezone"),
                          ({"every": "-1m"}, "every"), ({}, "cron"),
                          ({"cron": "* * * * *", "count": 0}, "count")):
        assert_error(await stack.http.get("/v1/preview", params=params, headers=ACME), 400,
                     "invalid", field)


async def test_healthz_and_metrics(stack: ApiStack) -> None:
    assert stack.http is not None
    h = await stack.http.get("/healthz")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    s = await _schedule(stack)
    run_id = (await _trigger(stack, s, "m")).json()["runId"]
    claim = await stack.client.claim("acme", s, run_id, 1, "wm")
    assert claim["fence"] >= 1
    # the claim is projected (and counted) asynchronously
    await wait_until(lambda: _has_lateness(stack), 20, what="lateness sample for acme")
    r = await stack.http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ("chronolog_run_start_lateness_seconds_bucket",
                 "chronolog_oldest_due_age_seconds", "chronolog_expired_leases",
                 "chronolog_runs_skipped_total", "chronolog_runs_finished_total",
                 "chronolog_projection_lag_events", "chronolog_projection_lag_seconds",
                 "chronolog_commands_total", "chronolog_events_total",
                 "chronolog_commands_per_second", "chronolog_events_per_second"):
        assert name in text, name
    assert_error(await stack.http.get("/nowhere"), 404, "not_found")


async def _has_lateness(stack: ApiStack) -> bool:
    assert stack.http is not None
    text = (await stack.http.get("/metrics")).text
    return ('chronolog_run_start_lateness_seconds_count{resource_class="default",tenant="acme"}'
            in text)


async def test_read_your_writes_through_an_in_process_projector(stack: ApiStack) -> None:
    # `chronolog api --with-projector`: the wait is on the projector itself, not on polling
    assert stack.store is not None and stack.projector is not None
    app = create_app(stack.client, stack.store, TENANTS, projector=stack.projector)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as http:
        s = sid()
        r = await http.post("/v1/schedules", json={"scheduleId": s, "every": "1h",
                                                   "job": {"type": "a"}}, headers=ACME)
        assert r.status_code == 201 and r.headers[VISIBLE_HEADER] == "true"
        g = await http.get(f"/v1/schedules/{s}", headers=ACME)  # no token needed
        assert g.status_code == 200 and g.json()["revision"] == 1
        g = await http.get(f"/v1/schedules/{s}", headers=consistent(r))
        assert g.status_code == 200 and g.json()["revision"] == 1
        text = (await http.get("/metrics")).text
        assert "chronolog_fence_rejections" in text  # only with a projector in the process
