"""Hostile and careless requests against the API: every limit answers the JSON error body.

A real processor, projector and PostgreSQL behind the app (``ApiStack`` on the SQLite log:
none of these paths depends on the log). Each test names one limit (docs/deployment.md, "Limits").
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from chronolog.api.app import CONSISTENCY_HEADER, create_app
from chronolog.domain.limits import MAX_BODY_BYTES, MAX_DOCUMENT_DEPTH
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log
from chronolog.tenants import RateLimit, Tenant, Tenants

from .api_stack import ApiStack
from .conftest import started
from .pgdb import create_database, drop_database, schema_store

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio(loop_scope="module")]

LIMITED = Tenants({
    "acme": Tenant("acme", ("acme-token",), None, 1000),
    "slow": Tenant("slow", ("slow-token",), None, 1000, min_interval=120.0),
    "bursty": Tenant("bursty", ("bursty-token",), None, 1000, rate_limit=RateLimit(0.2, 2)),
    "thrifty": Tenant("thrifty", ("thrifty-token",), None, 1000, storage_budget=100_000),
}, operator_tokens=("ops-token",))
ACME = {"Authorization": "Bearer acme-token"}
SLOW = {"Authorization": "Bearer slow-token"}
BURSTY = {"Authorization": "Bearer bursty-token"}
THRIFTY = {"Authorization": "Bearer thrifty-token"}
JOB = {"type": "report"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory
                ) -> AsyncIterator[ApiStack]:
    cfg = LogConfig("sqlite", str(tmp_path_factory.mktemp("limits") / "log.db"),
                    Topics(prefix=f"lim{uuid.uuid4().hex[:8]}.", partitions=2))
    dsn = await create_database(database_url, "test_api_limits")
    try:
        async with started(open_log(cfg)) as lg, ApiStack(lg, dsn, LIMITED) as s:
            yield s
    finally:
        await drop_database(database_url, dsn)


@pytest.fixture
def http(stack: ApiStack) -> httpx.AsyncClient:
    assert stack.http is not None
    return stack.http


def sid() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def error(r: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """``r`` is the JSON error body with ``status`` (and names ``field`` when given)."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) >= {"error", "field", "message"} and body["message"], body
    if field is not None:
        assert body["field"] == field, body
    return body


async def create(http: httpx.AsyncClient, body: dict[str, Any],
                 headers: dict[str, str] = ACME) -> httpx.Response:
    return await http.post("/v1/schedules", json=body, headers=headers)


# ------------------------------------------------------------------ request body


async def test_a_body_over_the_size_limit_is_413(http: httpx.AsyncClient) -> None:
    big = {"scheduleId": sid(), "every": "1h",
           "job": {"type": "report", "params": {"blob": "x" * (MAX_BODY_BYTES + 1)}}}
    error(await create(http, big), 413)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    r = await http.post("/v1/schedules", content=chunks(),
                        headers={**ACME, "Content-Type": "application/json"})
    error(r, 413)


async def test_params_over_64_kib_are_400_naming_job_params(http: httpx.AsyncClient) -> None:
    body = {"scheduleId": sid(), "every": "1h",
            "job": {"type": "report", "params": {"blob": "x" * 70_000}}}
    error(await create(http, body), 400, "job.params")


async def test_deep_nesting_is_400_before_any_parser_recurses(http: httpx.AsyncClient) -> None:
    for depth in (250, 990):
        raw = b'{"scheduleId": "d", "every": "1h", "job": {"type": "r", "params": {"a": ' + \
            b"[" * depth + b"]" * depth + b"}}}"
        r = await http.post("/v1/schedules", content=raw,
                            headers={**ACME, "Content-Type": "application/json"})
        assert str(MAX_DOCUMENT_DEPTH) in error(r, 400)["message"]
    nested: Any = 1
    for _ in range(33):  # params deeper than 32, the body still within its bound
        nested = {"n": nested}
    error(await create(http, {"scheduleId": sid(), "every": "1h",
                              "job": {"type": "r", "params": nested}}), 400, "job.params")


async def test_nul_in_any_text_is_400_naming_the_field(http: httpx.AsyncClient) -> None:
    s = sid()
    cases = [
        ({"scheduleId": s, "every": "1h", "job": {"type": "r", "params": {"k": "a\u0000"}}},
         "job.params.k"),
        ({"scheduleId": s, "every": "1h", "job": {"type": "r", "params": {"a\u0000": 1}}},
         "job.params"),
        ({"scheduleId": s, "every": "1h", "job": {"type": "r\u0000"}}, "job.type"),
        ({"scheduleId": s, "cron": "0 3 * * *\u0000", "job": JOB}, "cron"),
    ]
    for body, field in cases:
        error(await create(http, body), 400, field)
    r = await http.post(f"/v1/schedules/{s}/runs", json={"params": {"p": ["\u0000"]}},
                        headers={**ACME, "Idempotency-Key": "k"})
    error(r, 400, "params.p.0")


async def test_a_body_that_is_not_json_by_content_type_is_415(http: httpx.AsyncClient) -> None:
    raw = json.dumps({"scheduleId": sid(), "every": "1h", "job": JOB}).encode()
    r = await http.post("/v1/schedules", content=raw,
                        headers={**ACME, "Content-Type": "text/plain"})
    error(r, 415, "Content-Type")
    r = await http.post("/v1/schedules", content=raw, headers=ACME)  # no Content-Type at all
    error(r, 415, "Content-Type")
    r = await http.post("/v1/schedules", content=raw,
                        headers={**ACME, "Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 201, r.text


# ------------------------------------------------------------------ IDs, query, methods


BAD_IDS = ["%00", "a%00b", "%FF", "a%0D%0Ab", "x" * 4000, "%2E", "%2E%2E"]


async def test_bad_schedule_and_run_ids_are_json_400_on_every_route(
    http: httpx.AsyncClient,
) -> None:
    body = {"every": "1h", "job": JOB}
    for bad in BAD_IDS:
        calls = [
            ("GET", f"/v1/schedules/{bad}", {}),
            ("PUT", f"/v1/schedules/{bad}", {"json": body, "headers": {"If-Match": '"1"'}}),
            ("DELETE", f"/v1/schedules/{bad}", {}),
            ("POST", f"/v1/schedules/{bad}:pause", {}),
            ("POST", f"/v1/schedules/{bad}:resume", {}),
            ("POST", f"/v1/schedules/{bad}/runs", {"headers": {"Idempotency-Key": "k"}}),
            ("GET", f"/v1/schedules/{bad}/runs", {}),
            ("GET", f"/v1/runs/{bad}", {}),
            ("POST", f"/v1/runs/{bad}:cancel", {}),
            ("POST", f"/v1/runs/{bad}:redrive", {}),
            ("POST", f"/v1/runs/{bad}:reconcile", {"json": {"decision": "retry"}}),
        ]
        for method, path, kw in calls:
            headers = {**ACME, **kw.pop("headers", {})}
            # a raw target: the client must not normalise "%2E%2E" away
            url = httpx.URL("http://chronolog.test").copy_with(raw_path=path.encode())
            r = await http.request(method, url, headers=headers, **kw)
            assert r.status_code in (400, 404), (method, path[:40], r.status_code, r.text)
            error(r, r.status_code)
    for dots in (".", ".."):
        error(await create(http, {"scheduleId": dots, **body}), 400, "scheduleId")


async def test_a_forged_cursor_never_reaches_the_database(http: httpx.AsyncClient) -> None:
    s = sid()
    made = await create(http, {"scheduleId": s, "every": "1h", "job": JOB})
    assert made.status_code == 201, made.text
    seen = {**ACME, CONSISTENCY_HEADER: made.headers[CONSISTENCY_HEADER]}
    for forged in [
        {"s": s, "f": None, "b": ["2026-01-01T00:00:00+00:00", "r\u0000"],
         "l": ["2026-01-01T00:00:00+00:00", "r"]},
        {"s": s, "f": None, "b": ["2026-01-01T00:00:00", "r"],
         "l": ["2026-01-01T00:00:00", "r"]},
    ]:
        after = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode()
        r = await http.get(f"/v1/schedules/{s}/runs", params={"after": after}, headers=seen)
        error(r, 400, "after")


async def test_an_unknown_query_parameter_is_400_naming_it(http: httpx.AsyncClient) -> None:
    r = await http.get("/v1/preview", params={"cron": "0 3 * * *", "colour": "red"},
                       headers=ACME)
    error(r, 400, "colour")
    r = await http.get("/v1/schedules/x", params={"limit": "5"}, headers=ACME)
    error(r, 400, "limit")
    r = await http.get("/v1/preview", params={"cron": "0 3 * * *\u0000"}, headers=ACME)
    error(r, 400, "cron")


async def test_other_methods_are_405_with_the_allow_header(http: httpx.AsyncClient) -> None:
    r = await http.request("OPTIONS", "/v1/schedules/x:pause", headers=ACME)
    error(r, 405)
    assert "POST" in r.headers["allow"].split(", ")
    r = await http.request("PATCH", "/v1/schedules", headers=ACME)
    error(r, 405)
    assert r.headers["allow"] == "GET, POST"  # list and create


# ------------------------------------------------------------------ numbers and dates


async def test_out_of_range_numbers_and_dates_are_400_naming_the_field(
    http: httpx.AsyncClient,
) -> None:
    base = {"scheduleId": sid(), "job": JOB}
    cases = [
        ({**base, "every": "1h", "jitter": 1e300}, "jitter"),
        ({**base, "delay": 1.77e308}, "delay"),
        ({**base, "every": "99999999999999999999w"}, "every"),
        ({**base, "every": "1h", "maxCount": 2**64 + 1}, "maxCount"),
        ({**base, "every": "1h", "maxCount": 10**12}, "maxCount"),
        ({**base, "at": "9999-12-31T23:59:59Z"}, "at"),
        ({**base, "every": "1h", "lease": "1e300s"}, "lease"),
    ]
    for body, field in cases:
        error(await create(http, body), 400, field)
    for params, field in [
        ({"every": "99999999999999999999w"}, "every"),
        ({"every": "1h", "from": "9999-12-31T23:59:59Z"}, "from"),
        ({"every": "3650d", "from": "2999-01-01T00:00:00Z", "count": "1000"}, None),
    ]:
        r = await http.get("/v1/preview", params=params, headers=ACME)
        if field is None:  # runs out at the end of the calendar, no overflow
            assert r.status_code == 200 and 0 < len(r.json()["instants"]) < 1000, r.text
        else:
            error(r, 400, field)


# ------------------------------------------------------------------ tenant policies


async def test_intervals_below_the_tenants_minimum_are_400_naming_the_field(
    http: httpx.AsyncClient,
) -> None:
    error(await create(http, {"scheduleId": sid(), "every": "1ms", "job": JOB}), 400, "every")
    error(await create(http, {"scheduleId": sid(), "delay": 0.5, "job": JOB}), 400, "delay")
    r = await create(http, {"scheduleId": sid(), "every": "1s", "job": JOB})
    assert r.status_code == 201, r.text  # the default minimum is one second
    # a tenant whose minimum is two minutes: an every-minute cron fires too often
    error(await create(http, {"scheduleId": sid(), "every": "90s", "job": JOB}, SLOW), 400,
          "every")
    error(await create(http, {"scheduleId": sid(), "cron": "* 3 * * *", "job": JOB}, SLOW),
          400, "cron")
    r = await create(http, {"scheduleId": sid(), "cron": "*/5 * * * *", "job": JOB}, SLOW)
    assert r.status_code == 201, r.text


async def test_commands_past_the_tenants_rate_are_429_with_retry_after(
    http: httpx.AsyncClient,
) -> None:
    answers = [await create(http, {"scheduleId": sid(), "every": "1h", "job": JOB}, BURSTY)
               for _ in range(3)]
    assert [r.status_code for r in answers[:2]] == [201, 201], answers[1].text
    error(answers[2], 429)
    assert int(answers[2].headers["retry-after"]) >= 1
    # another tenant is not held back by it
    r = await create(http, {"scheduleId": sid(), "every": "1h", "job": JOB})
    assert r.status_code == 201, r.text


async def test_writes_past_the_tenants_storage_budget_are_429_naming_it_with_retry_after(
    http: httpx.AsyncClient,
) -> None:
    schedule_id = sid()
    params = {"p": "x" * 59_992}  # 60,000 bytes as JSON
    r = await create(http, {"scheduleId": schedule_id, "every": "24h", "overlap": "allow",
                            "job": {"type": "report", "params": params}}, THRIFTY)
    assert r.status_code == 201, r.text
    runs = f"/v1/schedules/{schedule_id}/runs"
    r = await http.post(runs, headers={**THRIFTY, "Idempotency-Key": "k1"},
                        json={"params": {"p": "x" * 39_992}})  # 40,000: the budget exactly
    assert r.status_code == 201, r.text
    r = await http.post(runs, headers={**THRIFTY, "Idempotency-Key": "k2"},
                        json={"params": {"p": ""}})  # 8 bytes more: refused
    body = error(r, 429, "storage_budget")
    assert body["error"] == "quota"
    assert body["message"].startswith(
        "over the storage budget of tenant 'thrifty' (storage_budget = 100000 bytes an hour): "
        "the params of TriggerRun, 8 bytes, does not fit this hour; retry in ")
    wait = int(r.headers["retry-after"])
    # when the create, the hour's first write, leaves the window: an hour after it, counted
    # from the whole second after it (docs/design.md §9)
    assert 3500 < wait <= 3601
    assert body["message"].endswith(f"retry in {wait}s")
    # a revision with params is refused the same way; another tenant is not held back
    r = await http.put(f"/v1/schedules/{schedule_id}", headers={**THRIFTY, "If-Match": '"1"'},
                       json={"every": "24h", "job": {"type": "report", "params": {"p": ""}}})
    error(r, 429, "storage_budget")
    r = await create(http, {"scheduleId": sid(), "every": "1h",
                            "job": {"type": "report", "params": params}})
    assert r.status_code == 201, r.text


async def test_metrics_need_an_operator_token(http: httpx.AsyncClient) -> None:
    error(await http.get("/metrics"), 401, "Authorization")
    error(await http.get("/metrics", headers={"Authorization": "Bearer nope"}), 401)
    error(await http.get("/metrics", headers=ACME), 403, "Authorization")
    r = await http.get("/metrics", headers={"Authorization": "Bearer ops-token"})
    assert r.status_code == 200 and "chronolog_" in r.text


async def test_a_bug_is_a_json_500_with_an_error_id(stack: ApiStack) -> None:
    store = await schema_store(stack.dsn, max_size=2)
    app = create_app(stack.client, store, LIMITED)

    async def broken(*_: Any) -> None:
        raise RuntimeError("a bug in a query")  # not an outage: nothing to retry

    app.state.chronolog.read().schedule = broken
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://chronolog.test") as http:
            r = await http.get("/v1/schedules/x", headers=ACME)
    finally:
        await store.close()
    body = error(r, 500)
    assert body["error"] == "internal" and "id " in body["message"]
