"""``chronolog schedule list`` and ``chronolog runs`` (without a schedule ID) through the HTTP
API's lists, ``GET /v1/schedules`` and ``GET /v1/runs``, with real processes.

``chronolog processor``, ``projector``, ``worker --builtin-jobs`` and ``api`` on the embedded
log; the CLI (``--url``, ``--token``) creates five schedules of different job types, states
and resource classes, waits until nothing moves any more, then each filter and each page
must print exactly the API's body for the same query — and hold what the filter says.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.net import free_port
from support.polling import SPAWN_POLL, wait_until

from .test_ops_cli import (  # noqa: F401 - dsn: a fixture
    PARTITIONS,
    Cli,
    Services,
    _env,
    dsn,
    start_stack,
)

pytestmark = pytest.mark.postgres

AUTH = {"Authorization": "Bearer dev"}


async def _pages(cli: Cli, *args: str) -> list[dict[str, Any]]:
    """Every item of a paged CLI list, following nextCursor."""
    items: list[dict[str, Any]] = []
    after: list[str] = []
    while True:
        doc = await cli.ok(*args, *after)
        items += doc["items"]
        if not doc["nextCursor"]:
            return items
        after = ["--after", doc["nextCursor"]]


@pytest.mark.long(75)
async def test_schedule_list_and_runs_across_schedules_print_the_apis_lists(
    tmp_path: Path, dsn: str,  # noqa: F811
) -> None:
    log_args = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", PARTITIONS,
                "--topic-prefix", f"t{uuid.uuid4().hex[:8]}."]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    services = Services(tmp_path, _env())
    start_stack(services, log_args, dsn, tmp_path, api_port=port)
    start = datetime.now(UTC) - timedelta(seconds=1)
    try:
        cli = Cli(["--url", url, "--token", "dev"], _env(), services)
        now = datetime.now(UTC).isoformat()
        gpu = tmp_path / "gpu.json"
        gpu.write_text(json.dumps({"every": "1h", "job": {"type": "echo"},
                                   "resourceClass": "gpu"}))
        for sid, rule in (("rep-1", ["--at", now, "--job", "echo"]),
                          ("rep-2", ["--at", now, "--job", "noop"]),
                          ("ping-1", ["--every", "1h", "--job", "echo"]),
                          ("ping-2", ["--every", "1h", "--job", "noop"]),
                          ("gpu-1", ["--spec", str(gpu)])):
            async def created(sid: str = sid, rule: list[str] = rule) -> bool:
                services.check_alive()
                r = await cli("schedule", "create", sid, *rule, "--idempotency-key", sid,
                              "--timeout", "5")
                return r.rc == 0
            await wait_until(created, 90, interval=SPAWN_POLL, what=f"{sid} created")

        # the first instant of each runs at once; ping-2 is paused after its run
        await cli.poll("ping-2 ran", "runs", "ping-2", "--state", "SUCCEEDED",
                       until=lambda d: len(d["items"]) == 1)
        assert (await cli.ok("schedule", "pause", "ping-2"))["state"] == "PAUSED"

        def settled(doc: dict[str, Any]) -> bool:
            states = {i["scheduleId"]: i["state"] for i in doc["items"]}
            return states == {"rep-1": "COMPLETED", "rep-2": "COMPLETED", "ping-1": "ACTIVE",
                              "ping-2": "PAUSED", "gpu-1": "ACTIVE"}

        await cli.poll("every schedule settled", "schedule", "list", until=settled, timeout=60)
        await cli.poll("every run settled", "runs",
                       until=lambda d: sorted((i["scheduleId"], i["state"]) for i in d["items"])
                       == [("gpu-1", "READY"), ("ping-1", "SUCCEEDED"),
                           ("ping-2", "SUCCEEDED"), ("rep-1", "SUCCEEDED"),
                           ("rep-2", "SUCCEEDED")], timeout=60)

        # a connection per request: between two of them a CLI call can take longer than
        # the server keeps an idle connection (5 s), and a request sent on one it is closing
        # fails ("Server disconnected without sending a response")
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30,
                                     limits=httpx.Limits(max_keepalive_connections=0)) as http:
            async def same(path: str, params: dict[str, str], *argv: str) -> Any:
                """The CLI prints the API's body for the same query (nothing moves now)."""
                doc = await cli.ok(*argv)
                answer = await http.get(path, params=params)
                assert answer.status_code == 200, answer.text
                assert doc == answer.json(), argv
                return doc

            # schedule list: every filter, and pages
            everything = await same("/v1/schedules", {}, "schedule", "list")
            assert {i["scheduleId"] for i in everything["items"]} == {
                "rep-1", "rep-2", "ping-1", "ping-2", "gpu-1"}
            assert set(everything) == {"items", "nextCursor", "watermark"}
            assert everything["nextCursor"] is None
            assert set(everything["items"][0]) == {"scheduleId", "state", "revision",
                                                   "nextRunAt", "nextDueAt", "createdAt",
                                                   "updatedAt", "definition"}
            for argv, params, ids in (
                (["--state", "PAUSED"], {"state": "PAUSED"}, {"ping-2"}),
                (["--state", "active,paused"], {"state": "ACTIVE,PAUSED"},
                 {"ping-1", "ping-2", "gpu-1"}),
                (["--job-type", "noop"], {"jobType": "noop"}, {"rep-2", "ping-2"}),
                (["--resource-class", "gpu"], {"resourceClass": "gpu"}, {"gpu-1"}),
                (["--prefix", "rep-"], {"prefix": "rep-"}, {"rep-1", "rep-2"}),
                (["--state", "COMPLETED", "--job-type", "echo"],
                 {"state": "COMPLETED", "jobType": "echo"}, {"rep-1"}),
                (["--prefix", "nothing-"], {"prefix": "nothing-"}, set()),
            ):
                doc = await same("/v1/schedules", params, "schedule", "list", *argv)
                assert {i["scheduleId"] for i in doc["items"]} == ids, argv
            page = await same("/v1/schedules", {"limit": "2"}, "schedule", "list",
                              "--limit", "2")
            assert len(page["items"]) == 2 and page["nextCursor"]
            await same("/v1/schedules", {"limit": "2", "after": page["nextCursor"]},
                       "schedule", "list", "--limit", "2", "--after", page["nextCursor"])
            paged = await _pages(cli, "schedule", "list", "--limit", "2")
            assert [i["scheduleId"] for i in paged] == [i["scheduleId"]
                                                        for i in everything["items"]]
            other = await cli("schedule", "list", "--limit", "2", "--state", "PAUSED",
                              "--after", page["nextCursor"])
            assert other.rc == 2 and other.out == ""  # checked before sending, as the API does
            assert other.err.strip() == "error: --after: the cursor belongs to another query"
            text = await cli("schedule", "list", "--limit", "2")
            assert text.rc == 0 and f"more: --after {page['nextCursor']}" in text.out
            assert all(i["scheduleId"] in text.out for i in page["items"])

            # runs across schedules: every filter, and pages
            runs = await same("/v1/runs", {}, "runs")
            assert set(runs) == {"items", "nextCursor", "watermark"}
            assert {(i["scheduleId"], i["jobType"]) for i in runs["items"]} == {
                ("rep-1", "echo"), ("rep-2", "noop"), ("ping-1", "echo"), ("ping-2", "noop"),
                ("gpu-1", "echo")}
            for argv, params, ids in (
                (["--job-type", "noop"], {"jobType": "noop"}, {"rep-2", "ping-2"}),
                (["--state", "READY"], {"state": "READY"}, {"gpu-1"}),
                (["--state", "ready,succeeded", "--job-type", "echo"],
                 {"state": "READY,SUCCEEDED", "jobType": "echo"}, {"rep-1", "ping-1", "gpu-1"}),
                (["rep-1", "--job-type", "echo"], {"scheduleId": "rep-1", "jobType": "echo"},
                 {"rep-1"}),
                (["rep-1", "--job-type", "noop"], {"scheduleId": "rep-1", "jobType": "noop"},
                 set()),
                (["--from", start.isoformat()], {"from": _z(start)},
                 {"rep-1", "rep-2", "ping-1", "ping-2", "gpu-1"}),
                (["--from", "2999-01-01T00:00:00Z"], {"from": "2999-01-01T00:00:00Z"}, set()),
                (["--to", _z(start)], {"to": _z(start)}, set()),
            ):
                doc = await same("/v1/runs", params, "runs", *argv)
                assert {i["scheduleId"] for i in doc["items"]} == ids, argv
                assert len(doc["items"]) == len(ids), argv  # one run each
            ready = (await cli.ok("runs", "--state", "READY"))["items"][0]
            assert ready["jobType"] == "echo" and "gpu" in (ready["waiting"] or "")
            first = await same("/v1/runs", {"limit": "2"}, "runs", "--limit", "2")
            assert len(first["items"]) == 2 and first["nextCursor"]
            await same("/v1/runs", {"limit": "2", "after": first["nextCursor"]},
                       "runs", "--limit", "2", "--after", first["nextCursor"])
            paged = await _pages(cli, "runs", "--limit", "2")
            assert [i["runId"] for i in paged] == [i["runId"] for i in runs["items"]]
            other = await cli("runs", "--limit", "2", "--job-type", "echo", "--after",
                              first["nextCursor"])
            assert other.rc == 2 and other.err.strip() == ("error: --after: the cursor belongs "
                                                          "to another query")
            text = await cli("runs")
            assert text.rc == 0 and "schedule" in text.out and "job" in text.out
            assert all(i["runId"] in text.out for i in runs["items"])
            # with an ID and no other filter: the schedule's own list, as before
            own = await same("/v1/schedules/rep-1/runs", {}, "runs", "rep-1")
            assert [i["scheduleId"] for i in own["items"]] == ["rep-1"]
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


def _z(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")
