"""The tenant-wide lists of the HTTP API — ``GET /v1/schedules``, ``GET /v1/runs``,
``GET /v1/dlq`` — on both logs, a real processor, projector and PostgreSQL.

One stack per backend for the module (``ApiStack``, with an operator token); tests keep
apart by schedule-ID prefix, job type or tenant. Each filter is shown to narrow, paging with
``limit=2`` while schedules or runs are created in between neither skips nor repeats, a
cursor is refused with other filters or when forged, another tenant's items never appear,
and a poison record on the commands topic is listed for its tenant (an operator sees every
dead letter, those naming no tenant included). The projector's fold of the ``dlq`` topic is
shown to keep one row per letter key, however often it is folded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import orjson
import pytest
import pytest_asyncio

from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog, OutRecord, Record, Topics
from chronolog.projections.dead_letters import DeadLetterFold
from chronolog.settings import LogConfig, open_log
from chronolog.tenants import Tenant, Tenants
from support.polling import wait_until

from .api_stack import ApiStack
from .pgdb import create_database, drop_database, schema_store

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio(loop_scope="module")]

TENANTS = Tenants({
    "acme": Tenant("acme", ("acme-token",)),
    "globex": Tenant("globex", ("globex-token",)),
    "umbrella": Tenant("umbrella", ("umbrella-token",)),  # only the runs paging test's
}, operator_tokens=("ops-token",))
ACME = {"Authorization": "Bearer acme-token"}
GLOBEX = {"Authorization": "Bearer globex-token"}
UMBRELLA = {"Authorization": "Bearer umbrella-token"}
OPS = {"Authorization": "Bearer ops-token"}

SUMMARY_KEYS = {"scheduleId", "state", "revision", "nextRunAt", "nextDueAt", "createdAt",
                "updatedAt", "definition"}
RUN_ITEM_KEYS = {"runId", "scheduleId", "scheduledAt", "state", "attempt", "startedAt",
                 "finishedAt", "waiting", "jobType", "traceId"}
LETTER_KEYS = {"consumer", "topic", "partition", "offset", "tenant", "scheduleId", "reason",
               "errorClass", "commandId", "original", "originalSize", "at"}
NEVER = {"cron": "0 0 1 1 *", "timezone": "UTC"}  # no scheduled run during a test


@pytest.fixture(scope="module", params=["sqlite", "kafka"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> LogConfig:
    topics = Topics(prefix=f"lists{uuid.uuid4().hex[:8]}.", partitions=4)
    if request.param == "sqlite":
        return LogConfig("sqlite", str(tmp_path_factory.mktemp("lists") / "log.db"), topics)
    return LogConfig("kafka", request.getfixturevalue("kafka_bootstrap"), topics)


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    dsn = asyncio.run(create_database(database_url, "test_api_lists"))
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
    async with ApiStack(lg, module_dsn, TENANTS) as s:
        yield s


def http_of(stack: ApiStack) -> httpx.AsyncClient:
    assert stack.http is not None
    return stack.http


def uid(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def assert_invalid(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] == "invalid" and body["field"] == field and body["message"], body


async def create(stack: ApiStack, schedule_id: str, body: dict[str, Any],
                 headers: dict[str, str] = ACME) -> httpx.Response:
    r = await http_of(stack).post("/v1/schedules", json={"scheduleId": schedule_id, **body},
                                  headers=headers)
    assert r.status_code == 201, r.text
    return r


async def trigger(stack: ApiStack, schedule_id: str, key: str,
                  headers: dict[str, str] = ACME) -> str:
    r = await http_of(stack).post(f"/v1/schedules/{schedule_id}/runs",
                                  headers={**headers, "Idempotency-Key": key})
    assert r.status_code == 201, r.text
    return str(r.json()["runId"])


async def page_all(http: httpx.AsyncClient, path: str, params: dict[str, Any],
                   headers: dict[str, str], between: Any = None) -> list[dict[str, Any]]:
    """Every item of a list, page by page (``between()`` awaited before each next page)."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = await http.get(path, params={**params, **({"after": cursor} if cursor else {})},
                           headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"items", "nextCursor", "watermark"}
        assert len(body["items"]) <= params.get("limit", 100)
        items += body["items"]
        cursor = body["nextCursor"]
        if cursor is None:
            return items
        if between is not None:
            await between()


def forged(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")


# ------------------------------------------------------------------ GET /v1/schedules


async def test_schedule_filters_each_narrow_the_list(stack: ApiStack) -> None:
    http = http_of(stack)
    p = uid("f")
    job = uid("job-")
    await create(stack, f"{p}-cron", {**NEVER, "job": {"type": "report"}})
    await create(stack, f"{p}-gpu", {"every": "1h", "resourceClass": "gpu",
                                     "job": {"type": job}})
    await create(stack, f"{p}-paused", {**NEVER, "job": {"type": "report"}})
    assert (await http.post(f"/v1/schedules/{p}-paused:pause", headers=ACME)).status_code == 200
    await create(stack, f"{p}-gone", {**NEVER, "job": {"type": "report"}})
    assert (await http.delete(f"/v1/schedules/{p}-gone", headers=ACME)).status_code == 200
    at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    await create(stack, f"{p}-once", {"at": at, "job": {"type": "report"}})

    async def listed(**params: Any) -> list[str]:
        r = await http.get("/v1/schedules", params={"prefix": p, **params}, headers=ACME)
        assert r.status_code == 200, r.text
        return [i["scheduleId"] for i in r.json()["items"]]

    async def completed() -> bool:
        return await listed(state="COMPLETED") == [f"{p}-once"]

    await wait_until(completed, 30, what="the one-shot COMPLETED")
    everything = [f"{p}-{n}" for n in ("cron", "gone", "gpu", "once", "paused")]
    # by ID; the default leaves DELETED out
    assert await listed() == [s for s in everything if not s.endswith("gone")]
    assert await listed(state="deleted") == [f"{p}-gone"]
    assert await listed(state="Paused, active") == [f"{p}-cron", f"{p}-gpu"] + [f"{p}-paused"]
    assert await listed(state="ACTIVE,PAUSED,COMPLETED,DELETED") == everything
    assert await listed(jobType=job) == [f"{p}-gpu"]
    assert await listed(jobType=job, state="PAUSED") == []
    assert await listed(resourceClass="gpu") == [f"{p}-gpu"]
    assert await listed(resourceClass="default", state="ACTIVE") == [f"{p}-cron"]
    assert await listed(prefix=f"{p}-g", state="ACTIVE,DELETED") == [f"{p}-gone", f"{p}-gpu"]

    # each item is a schedule's summary, the same as the schedule's own document says
    r = await http.get("/v1/schedules", params={"prefix": f"{p}-gpu"}, headers=ACME)
    page = r.json()
    assert page["nextCursor"] is None and set(page["watermark"]) == {"partitions", "time"}
    (item,) = page["items"]
    assert set(item) == SUMMARY_KEYS
    one = (await http.get(f"/v1/schedules/{p}-gpu", headers=ACME)).json()
    assert {k: one[k] for k in SUMMARY_KEYS} == item
    assert item["definition"]["resourceClass"] == "gpu" and item["definition"]["every"] == 3600


async def test_the_id_prefix_is_literal(stack: ApiStack) -> None:
    http = http_of(stack)
    p = uid("lit")
    for suffix in ("_a", "Xa", "x_b", "c"):
        await create(stack, f"{p}{suffix}", {**NEVER, "job": {"type": "report"}})

    async def listed(prefix: str) -> list[str]:
        r = await http.get("/v1/schedules", params={"prefix": prefix}, headers=ACME)
        assert r.status_code == 200, r.text
        return [i["scheduleId"] for i in r.json()["items"]]

    assert await listed(f"{p}_") == [f"{p}_a"]  # not LIKE's "any one character"
    assert await listed(f"{p}%") == []  # not LIKE's "anything"
    assert await listed(f"{p}x_") == [f"{p}x_b"]
    assert await listed(p) == sorted(f"{p}{s}" for s in ("_a", "Xa", "x_b", "c"))
    assert await listed(f"{p}\u00e9") == []  # a character no ID has


async def test_schedule_paging_neither_skips_nor_repeats_while_schedules_are_created(
    stack: ApiStack,
) -> None:
    http = http_of(stack)
    p = uid("pg")
    first = [f"{p}-{i:02d}" for i in range(1, 8)]
    for s in reversed(first):
        await create(stack, s, {**NEVER, "job": {"type": "report"}})
    made: list[str] = []

    async def between() -> None:  # one ID sorting before every page, one after every page
        n = len(made) // 2
        for s in (f"{p}-00-{n}", f"{p}-99-{n}"):
            await create(stack, s, {**NEVER, "job": {"type": "report"}})
            made.append(s)

    items = await page_all(http, "/v1/schedules", {"prefix": p, "limit": 2}, ACME, between)
    seen = [i["scheduleId"] for i in items]
    assert len(seen) == len(set(seen))
    assert seen == sorted(seen)
    assert made  # schedules were created between the pages
    # every schedule there from the start, once; of the new ones exactly those sorting after
    # the pages already read (and nothing before them)
    assert seen == first + sorted(s for s in made if "-99-" in s)

    # the cursor pins its filters; a forged one is refused before the database
    r = await http.get("/v1/schedules", params={"prefix": p, "limit": 2}, headers=ACME)
    cursor = r.json()["nextCursor"]
    assert cursor
    for other in ({"prefix": f"{p}-0"}, {"state": "PAUSED"}, {"jobType": "report"},
                  {"resourceClass": "default"}, {}):
        r = await http.get("/v1/schedules", params={**other, "after": cursor, "limit": 2},
                           headers=ACME)
        assert_invalid(r, "after")
    pinned = {"s": "ACTIVE,COMPLETED,PAUSED", "j": None, "r": None, "p": p}
    for bad in ("garbage", forged({"k": "schedules", "f": pinned, "l": "x\u0000"}),
                forged({"k": "schedules", "f": pinned, "l": "' OR 1=1 --"}),
                forged({"k": "schedules", "f": pinned, "l": 42}),
                forged({"k": "runs", "f": pinned, "l": f"{p}-01"})):
        r = await http.get("/v1/schedules", params={"prefix": p, "after": bad}, headers=ACME)
        assert_invalid(r, "after")
    # a cursor of our own shape goes on after its ID
    ok = forged({"k": "schedules", "f": pinned, "l": f"{p}-05"})
    r = await http.get("/v1/schedules", params={"prefix": p, "after": ok}, headers=ACME)
    assert [i["scheduleId"] for i in r.json()["items"]] == \
        first[5:] + sorted(s for s in made if "-99-" in s)


async def test_bad_schedule_list_queries_are_400_naming_the_field(stack: ApiStack) -> None:
    http = http_of(stack)
    for params, field in (({"state": "BOGUS"}, "state"), ({"state": "active,nope"}, "state"),
                          ({"limit": 0}, "limit"), ({"limit": 501}, "limit"),
                          ({"limit": "x"}, "limit"), ({"jobType": ""}, "jobType"),
                          ({"jobType": "j" * 201}, "jobType"),
                          ({"resourceClass": "no spaces"}, "resourceClass"),
                          ({"prefix": ""}, "prefix"), ({"prefix": "p" * 201}, "prefix"),
                          ({"after": "%%%"}, "after"), ({"colour": "red"}, "colour")):
        assert_invalid(await http.get("/v1/schedules", params=params, headers=ACME), field)
    r = await http.get("/v1/schedules")
    assert r.status_code == 401 and r.json()["field"] == "Authorization"


# ------------------------------------------------------------------ GET /v1/runs


async def test_run_filters_each_narrow_the_list(stack: ApiStack) -> None:
    http = http_of(stack)
    p = uid("rf")
    job_a, job_b = uid("ja-"), uid("jb-")
    await create(stack, f"{p}-a", {**NEVER, "overlap": "allow", "job": {"type": job_a}})
    await create(stack, f"{p}-b", {**NEVER, "overlap": "allow", "job": {"type": job_b}})
    a_runs = [await trigger(stack, f"{p}-a", f"k{i}") for i in range(3)]
    b_runs = [await trigger(stack, f"{p}-b", f"k{i}") for i in range(2)]
    cancelled = await http.post(f"/v1/runs/{a_runs[1]}:cancel", headers=ACME)
    assert cancelled.status_code == 200, cancelled.text

    async def listed(**params: Any) -> list[dict[str, Any]]:
        r = await http.get("/v1/runs", params=params, headers=ACME)
        assert r.status_code == 200, r.text
        return list(r.json()["items"])

    mine = await listed(scheduleId=f"{p}-a")
    assert [i["runId"] for i in mine] == list(reversed(a_runs))  # newest first
    assert all(set(i) == RUN_ITEM_KEYS and i["jobType"] == job_a for i in mine)
    keys = [(i["scheduledAt"], i["runId"]) for i in mine]
    assert keys == sorted(keys, reverse=True)
    assert [i["runId"] for i in await listed(jobType=job_b)] == list(reversed(b_runs))
    assert [i["runId"] for i in await listed(scheduleId=f"{p}-a", state="cancelled")] == \
        [a_runs[1]]
    assert {i["runId"] for i in await listed(scheduleId=f"{p}-a", state="READY,Cancelled")} \
        == set(a_runs)
    assert await listed(scheduleId=f"{p}-a", jobType=job_b) == []

    # [from, to) on scheduledAt, with an offset or Z
    middle = next(i for i in mine if i["runId"] == a_runs[1])["scheduledAt"]
    since = await listed(scheduleId=f"{p}-a", **{"from": middle})
    assert [i["runId"] for i in since] == [a_runs[2], a_runs[1]]  # from is inclusive
    until = await listed(scheduleId=f"{p}-a", to=middle)
    assert [i["runId"] for i in until] == [a_runs[0]]  # to is exclusive
    t = datetime.fromisoformat(middle.replace("Z", "+00:00")).astimezone(
        ZoneInfo("Asia/Kolkata"))
    assert [i["runId"] for i in await listed(scheduleId=f"{p}-a", to=t.isoformat())] == \
        [a_runs[0]]
    assert await listed(scheduleId=f"{p}-a", **{"from": middle, "to": middle}) == []
    assert [i["runId"] for i in await listed(jobType=job_a, **{"from": middle}, limit=1)] == \
        [a_runs[2]]


async def test_bad_run_list_queries_are_400_naming_the_field(stack: ApiStack) -> None:
    http = http_of(stack)
    for params, field in (
        ({"state": "BOGUS"}, "state"), ({"limit": 0}, "limit"), ({"limit": 501}, "limit"),
        ({"scheduleId": "../x"}, "scheduleId"), ({"scheduleId": "."}, "scheduleId"),
        ({"jobType": ""}, "jobType"),
        ({"from": "2026-01-01T00:00:00"}, "from"),  # no offset
        ({"from": "2026-01-01"}, "from"), ({"from": "yesterday"}, "from"),
        ({"to": "3000-01-01T00:00:00Z"}, "to"), ({"to": "1969-12-31T23:59:59Z"}, "to"),
        ({"to": "２０２６-01-01T00:00:00Z"}, "to"),
        ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
        ({"after": "garbage"}, "after"), ({"page": "2"}, "page"),
    ):
        assert_invalid(await http.get("/v1/runs", params=params, headers=ACME), field)


async def test_run_paging_neither_skips_nor_repeats_while_runs_arrive(stack: ApiStack) -> None:
    http = http_of(stack)
    s = uid("rp")
    await create(stack, s, {**NEVER, "overlap": "allow", "job": {"type": "report"}},
                 headers=UMBRELLA)
    before = [await trigger(stack, s, f"pre-{i}", UMBRELLA) for i in range(7)]
    during: list[str] = []

    async def between() -> None:
        during.append(await trigger(stack, s, f"during-{len(during)}", UMBRELLA))

    items = await page_all(http, "/v1/runs", {"limit": 2}, UMBRELLA, between)
    seen = [i["runId"] for i in items]
    keys = [(i["scheduledAt"], i["runId"]) for i in items]
    assert during and len(seen) == len(set(seen))
    assert keys == sorted(keys, reverse=True)
    # exactly the runs there when the first page was read; the newer ones above its bound
    assert seen == list(reversed(before))
    everything = await page_all(http, "/v1/runs", {"limit": 500}, UMBRELLA)
    assert [i["runId"] for i in everything] == list(reversed(before + during))

    # the cursor pins the filters; a schedule's own cursor is another query's
    r = await http.get("/v1/runs", params={"limit": 2}, headers=UMBRELLA)
    cursor = r.json()["nextCursor"]
    for other in ({"state": "READY"}, {"scheduleId": s}, {"jobType": "report"},
                  {"from": "2026-01-01T00:00:00Z"}, {"to": "2999-01-01T00:00:00Z"}):
        r = await http.get("/v1/runs", params={**other, "after": cursor}, headers=UMBRELLA)
        assert_invalid(r, "after")
    r = await http.get(f"/v1/schedules/{s}/runs", params={"after": cursor}, headers=UMBRELLA)
    assert_invalid(r, "after")
    own = (await http.get(f"/v1/schedules/{s}/runs", params={"limit": 2},
                          headers=UMBRELLA)).json()["nextCursor"]
    assert_invalid(await http.get("/v1/runs", params={"after": own}, headers=UMBRELLA),
                   "after")
    pinned = {"s": None, "j": None, "i": None, "a": None, "b": None}
    t = "2026-01-01T00:00:00+00:00"
    for bad in (forged({"k": "runs", "f": pinned, "b": [t, "r_x"], "l": [t, "r x"]}),
                forged({"k": "runs", "f": pinned, "b": ["2026-01-01T00:00:00", "r_x"],
                        "l": [t, "r_x"]}),
                forged({"k": "runs", "f": pinned, "b": [t, "r_x"], "l": [t]}),
                forged({"k": "runs", "f": pinned, "b": [t, "r\u0000"], "l": [t, "r_x"]})):
        assert_invalid(await http.get("/v1/runs", params={"after": bad}, headers=UMBRELLA),
                       "after")


# ------------------------------------------------------------------ isolation


async def test_another_tenants_items_never_appear(stack: ApiStack) -> None:
    http = http_of(stack)
    p = uid("iso")
    await create(stack, f"{p}-acme", {**NEVER, "job": {"type": "report"}})
    await create(stack, f"{p}-globex", {**NEVER, "job": {"type": "report"}}, headers=GLOBEX)
    theirs = await trigger(stack, f"{p}-globex", "k", GLOBEX)
    ours = await trigger(stack, f"{p}-acme", "k")

    acme = await page_all(http, "/v1/schedules", {"prefix": p}, ACME)
    assert [i["scheduleId"] for i in acme] == [f"{p}-acme"]
    globex = await page_all(http, "/v1/schedules", {"prefix": p}, GLOBEX)
    assert [i["scheduleId"] for i in globex] == [f"{p}-globex"]
    assert await page_all(http, "/v1/runs", {"scheduleId": f"{p}-globex"}, ACME) == []
    acme_runs = {i["runId"] for i in await page_all(http, "/v1/runs", {"limit": 500}, ACME)}
    assert ours in acme_runs and theirs not in acme_runs
    globex_runs = {i["runId"] for i in await page_all(http, "/v1/runs", {"limit": 500}, GLOBEX)}
    assert theirs in globex_runs and ours not in globex_runs
    # an operator token is no tenant's: it lists neither tenant's schedules or runs
    assert (await http.get("/v1/schedules", headers=OPS)).status_code == 401
    assert (await http.get("/v1/runs", headers=OPS)).status_code == 401


# ------------------------------------------------------------------ GET /v1/dlq


def _raw_create(command_id: str, tenant: str, schedule_id: str) -> bytes:
    """A CreateSchedule whose decision raises (jitter 1e300), as a careless client writes
    it straight to the log."""
    return json.dumps({"command_id": command_id, "type": "CreateSchedule", "tenant": tenant,
                       "principal": "careless", "schedule_id": schedule_id,
                       "issued_at": "2026-01-01T00:00:00Z",
                       "payload": {"type": "CreateSchedule", "spec": {
                           "every": "1s", "jitter": 1e300, "job": {"type": "echo"}}}}).encode()


async def test_poison_on_the_commands_topic_is_listed_for_its_tenant(
    stack: ApiStack, lg: EventLog,
) -> None:
    http = http_of(stack)
    t = lg.topics
    garbage_id, jitter_id = uid("garbage-"), uid("jitter-")
    command_id = uid("c-")
    cmd = await lg.append([
        OutRecord(t.commands, f"acme/{garbage_id}".encode(), b"\xff\x00 not a command"),
        OutRecord(t.commands, f"globex/{jitter_id}".encode(),
                  _raw_create(command_id, "globex", jitter_id)),
    ])
    # bytes that name no tenant, on events: the projector's letter, an operator's only
    ev = await lg.append([OutRecord(t.events, None, uuid.uuid4().bytes + b" not an event",
                                    partition=1)])

    def key(i: dict[str, Any]) -> tuple[str, str, int, int]:
        return i["consumer"], i["topic"], i["partition"], i["offset"]

    garbage = ("processor", t.commands, cmd[0].partition, cmd[0].offset)
    jitter = ("processor", t.commands, cmd[1].partition, cmd[1].offset)
    nameless = ("projector", t.events, 1, ev[0].offset)

    async def listed(headers: dict[str, str], **params: Any) -> dict[Any, dict[str, Any]]:
        return {key(i): i for i in await page_all(http, "/v1/dlq", params, headers)}

    async def operator_sees_all() -> bool:
        return {garbage, jitter, nameless} <= set(await listed(OPS))

    await wait_until(operator_sees_all, 30, what="the dead letters listed")
    acme = await listed(ACME)
    assert garbage in acme and jitter not in acme and nameless not in acme
    item = acme[garbage]
    assert set(item) == LETTER_KEYS
    assert item["tenant"] == "acme" and item["scheduleId"] == garbage_id
    assert item["commandId"] is None and item["originalSize"] == len(b"\xff\x00 not a command")
    assert base64.b64decode(item["original"]) == b"\xff\x00 not a command"
    assert item["reason"] and item["errorClass"] and item["at"].endswith("Z")
    globex = await listed(GLOBEX)
    assert jitter in globex and garbage not in globex and nameless not in globex
    assert globex[jitter]["commandId"] == command_id
    assert globex[jitter]["tenant"] == "globex" and globex[jitter]["scheduleId"] == jitter_id
    everyone = await listed(OPS)
    assert everyone[nameless]["tenant"] is None and everyone[nameless]["scheduleId"] is None
    assert all(i["tenant"] == "acme" for i in acme.values())

    # oldest first, paged; the consumer filter (exact, or a prefix with *) and its cursor
    ordered = await page_all(http, "/v1/dlq", {"limit": 1}, OPS)
    assert [key(i) for i in ordered] == list(everyone)  # the same letters, the same order
    times = [i["at"] for i in ordered]
    assert times == sorted(times)
    assert set(await listed(OPS, consumer="projector")) == \
        {k for k in everyone if k[0] == "projector"}
    assert set(await listed(OPS, consumer="proc*")) == \
        {k for k in everyone if k[0].startswith("proc")}
    assert await listed(ACME, consumer="projector") == {}
    r = await http.get("/v1/dlq", params={"limit": 1, "consumer": "proc*"}, headers=OPS)
    cursor = r.json()["nextCursor"]
    assert cursor and set(r.json()["watermark"]) == {"partitions"}
    assert_invalid(await http.get("/v1/dlq", params={"after": cursor}, headers=OPS), "after")
    assert_invalid(await http.get("/v1/dlq", params={"after": cursor, "consumer": "proc*"},
                                  headers=ACME), "after")  # another tenant's view
    for params, field in (({"limit": 0}, "limit"), ({"limit": 501}, "limit"),
                          ({"consumer": ""}, "consumer"), ({"after": "nope"}, "after"),
                          ({"tenant": "acme"}, "tenant")):
        assert_invalid(await http.get("/v1/dlq", params=params, headers=OPS), field)
    assert (await http.get("/v1/dlq")).status_code == 401


async def test_the_dlq_fold_keeps_one_row_per_letter_key_however_often_it_runs(
    lg: EventLog, module_dsn: str,
) -> None:
    store = await schema_store(module_dsn)
    try:
        fold = DeadLetterFold(lg, store.pool, store.projection)
        skipped = Record(lg.topics.events, 2, 10**6 + 7, b"acme/fold", b"not an event")
        writer = DeadLetters(lg, "fold-test")
        await writer.put(skipped, ValueError("first"))
        await writer.put(skipped, ValueError("again, after a crash"))  # the same key

        async def rows() -> list[tuple[Any, ...]]:
            return [tuple(r) for r in await store.pool.fetch(
                "SELECT consumer, source_topic, source_partition, source_offset, tenant, "
                "schedule_id, reason FROM dead_letters WHERE consumer = 'fold-test'")]

        async def folded() -> list[tuple[Any, ...]]:
            await fold.step()
            return await rows()

        got = await wait_until(folded, 30, what="the letters folded")
        assert got == [("fold-test", lg.topics.events, 2, 10**6 + 7, "acme", "fold", "first")]
        # folded again from offset 0 (a replay of the topic): the same rows
        await store.pool.execute("DELETE FROM projection_offsets WHERE topic = $1",
                                 lg.topics.dlq)
        while await fold.step():
            pass
        assert await rows() == got
        assert sum(1 for _ in await store.pool.fetch(
            "SELECT 1 FROM dead_letters WHERE consumer = 'fold-test'")) == 1
    finally:
        await store.close()
