"""The user CLI (``chronolog schedule|trigger|cancel|runs|run``) driving real services.

Every service and every CLI call is the real ``chronolog`` executable in its own process:
``chronolog processor``, ``chronolog projector``, ``chronolog worker --builtin-jobs`` (and on
Kafka ``chronolog api``), then the CLI goes through a schedule's whole life — bad input
(exit 2, one line), create, runs appear, pause, manual trigger (idempotent), a run with its
attempt and fence, resume, revise with ``--if-match`` (a stale one is a conflict: exit 1),
cancel too late (exit 1), delete. On the embedded SQLite log the CLI goes straight to the log
(``--log``, an operator's direct access); on real Kafka it goes through the HTTP API of the
running ``api`` process (``--url``/``--token``), and direct access to the same log must
print the same ``--json`` documents. Both with a fresh PostgreSQL database. Waits are bounded
polls; every process is stopped by PID and must exit 0. (The CLI against a dev node found
through its data directory: test_cli_http.py.)
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.docs import sh_block, sh_commands
from support.net import free_port
from support.polling import SPAWN_POLL, wait_until

from .conftest import CHRONOLOG, ROOT
from .pgdb import create_database, drop_database

pytestmark = pytest.mark.postgres

PARTITIONS = "2"


@pytest.fixture
def dsn(database_url: str) -> Iterator[str]:
    d = asyncio.run(create_database(database_url, "test_ops_cli"))
    yield d
    asyncio.run(drop_database(database_url, d))


def _env(**extra: str) -> dict[str, str]:
    """The environment without any CHRONOLOG_* setting of the developer's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return {**env, **extra}


class Services:
    """Service processes (stopped by PID, SIGTERM then a bounded wait)."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.files: list[Any] = []

    def start(self, name: str, args: list[str]) -> None:
        stderr = open(self.log_dir / f"{name}.log", "wb")  # closed in stop_all
        self.files.append(stderr)
        self.procs[name] = subprocess.Popen(
            [CHRONOLOG, *args], stdout=subprocess.DEVNULL, stderr=stderr, env=self.env,
            cwd=ROOT)

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            assert p.poll() is None, f"{name} exited {p.returncode}: {self.tail(name)}"

    def tail(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]

    def failed(self, codes: dict[str, int | None]) -> str:
        """Each process that did not exit 0: its status and the end of its log, whole."""
        return "\n".join(f"{name} exited {code}:\n{self.tail(name)}"
                         for name, code in codes.items() if code != 0)

    def stop_all(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for name, p in reversed(list(self.procs.items())):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
            codes[name] = p.returncode
        for f in self.files:
            f.close()
        return codes


def start_stack(services: Services, log_args: list[str], dsn: str,
                tmp_path: Path, api_port: int | None = None) -> None:
    """A processor, a projector and a worker with the built-in jobs (and an API on
    ``api_port``) on the log of ``log_args``."""
    services.start("processor", ["processor", *log_args])
    services.start("projector", ["projector", *log_args, "--database-url", dsn])
    services.start("worker", ["worker", *log_args, "--builtin-jobs",
                              "--results", str(tmp_path / "results")])
    if api_port is not None:
        services.start("api", ["api", *log_args, "--database-url", dsn, "--port",
                               str(api_port)])


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.rc == 0, f"rc={self.rc} stderr={self.err!r}"
        return json.loads(self.out)


class Cli:
    """Runs ``chronolog <args> <common flags>`` and collects its exit status and output."""

    def __init__(self, common: list[str], env: dict[str, str], services: Services,
                 cwd: Path = ROOT) -> None:
        self.common = common
        self.env = env
        self.services = services
        self.cwd = cwd

    async def __call__(self, *args: str) -> Result:
        proc = await asyncio.create_subprocess_exec(
            CHRONOLOG, *args, *self.common, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self.env, cwd=self.cwd)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"chronolog {' '.join(args)} did not finish within 60 s") from None
        assert proc.returncode is not None
        return Result(proc.returncode, out.decode(), err.decode())

    async def ok(self, *args: str) -> Any:
        return (await self(*args, "--json")).json()

    async def poll(self, what: str, *args: str, until: Any, timeout: float = 30) -> Any:
        """Run a JSON read until ``until(doc)`` holds (bounded); the doc that satisfied it."""
        async def check() -> Any:
            self.services.check_alive()
            r = await self(*args, "--json")
            if r.rc != 0:
                return None
            doc = json.loads(r.out)
            return doc if until(doc) else None

        return await wait_until(check, timeout, interval=SPAWN_POLL, what=what)


def _one_line(r: Result) -> str:
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    return lines[0]


async def _lifecycle(cli: Cli, job: str = "echo", *, http: bool = False,
                     calendars: bool = False) -> list[str]:
    """A schedule's whole life through the CLI; the IDs of its runs at the end.

    ``http``: the CLI goes through the HTTP API (else straight to the log). ``calendars``:
    a calendar's too (``_calendars``; over HTTP: test_cli_http.py)."""
    # bad input: exit 2 and one line naming the field and value, nothing sent
    for args, line in (
        (["--cron", "61 * * * *"], "error: --cron: '61 * * * *': "),
        (["--every", "soon"], "error: --every: 'soon': "),
        (["--cron", "0 9 * * *", "--tz", "Mars/Olympus"], "error: --tz: 'Mars/Olympus': "),
        (["--every", "1s", "--lease", "long"], "error: --lease: 'long': "),
        (["--every", "1s", "--params", "[1]"], "error: --params: '[1]': "),
    ):
        r = await cli("schedule", "create", "bad", *args, "--job", job)
        assert r.rc == 2, (args, r)
        assert _one_line(r).startswith(line), (args, r.err)
        assert r.out == ""

    # create (the processor may not own its partitions yet: retry with the same key)
    async def created() -> Any:
        cli.services.check_alive()
        r = await cli("schedule", "create", "nightly", "--every", "1s", "--job", job,
                      "--params", '{"n": 1}', "--overlap", "skip", "--idempotency-key", "c-1",
                      "--timeout", "5", "--json")
        return json.loads(r.out) if r.rc == 0 else None

    doc = await wait_until(created, 90, interval=SPAWN_POLL, what="create answered")
    assert doc["scheduleId"] == "nightly" and doc["revision"] == 1 and doc["nextRunAt"]
    again = await cli("schedule", "create", "nightly", "--every", "1s", "--job", job,
                      "--params", '{"n": 2}', "--idempotency-key", "c-1")
    assert again.rc == 1 and _one_line(again).startswith("error: conflict: "), again

    # runs appear and succeed
    page = await cli.poll("two succeeded runs", "runs", "nightly", "--state", "SUCCEEDED",
                          until=lambda d: len(d["items"]) >= 2)
    assert set(page) == {"items", "nextCursor", "watermark"}
    first = page["items"][-1]
    assert first["scheduleId"] == "nightly" and first["attempt"] == 1
    before = await cli.ok("run", first["runId"])
    assert before["attempts"][0]["outcome"] == "succeeded"
    assert before["result"]["inline"] == {"n": 1}
    one = await cli.ok("runs", "nightly", "--limit", "1")
    assert len(one["items"]) == 1 and one["nextCursor"]
    two = await cli.ok("runs", "nightly", "--limit", "1", "--after", one["nextCursor"])
    assert two["items"][0]["runId"] != one["items"][0]["runId"]

    # pause: no preview, then a manual trigger runs anyway (idempotent by key)
    paused = await cli.ok("schedule", "pause", "nightly", "--reason", "maintenance")
    assert paused["state"] == "PAUSED" and paused["scheduleId"] == "nightly"
    show = await cli.poll("the pause projected", "schedule", "show", "nightly",
                          until=lambda d: d["state"] == "PAUSED")
    assert show["preview"] == [] and show["definition"]["every"] == 1.0
    assert show["pauseReason"] == "maintenance"
    plan = await cli.poll("instants due while paused", "schedule", "show", "nightly",
                          until=lambda d: len(d["resume"]["instants"]) >= 2)
    *older, newest = plan["resume"]["instants"]  # misfire latest (the default)
    assert newest["action"] == "run" and {i["reason"] for i in older} == {"coalesced"}
    human = await cli("schedule", "show", "nightly")
    assert human.rc == 0 and "a resume now would" in human.out and "coalesced" in human.out
    trig = await cli.ok("trigger", "nightly", "--idempotency-key", "t-1",
                        "--params", '{"manual": true}')
    assert trig["runId"] and trig["state"] in ("READY", "PENDING")
    same = await cli.ok("trigger", "nightly", "--idempotency-key", "t-1",
                        "--params", '{"manual": true}')
    assert same["runId"] == trig["runId"]
    run = await cli.poll("the manual run succeeded", "run", trig["runId"],
                         until=lambda d: d["state"] == "SUCCEEDED")
    assert run["trigger"] == "manual" and run["requestKey"] == "t-1"
    (attempt,) = run["attempts"]
    assert attempt["outcome"] == "succeeded" and attempt["workerId"]
    assert attempt["fence"] > before["attempts"][0]["fence"]  # fences only grow
    assert run["result"]["inline"] == {"n": 1, "manual": True}  # merged over the job's
    human = await cli("run", trig["runId"])
    assert human.rc == 0 and "fence" in human.out and trig["runId"] in human.out

    # a finished run cannot be cancelled or redriven: exit 1 with one line
    late = await cli("cancel", trig["runId"])
    assert late.rc == 1 and _one_line(late) == "error: conflict: too late: run is SUCCEEDED"
    redrive = await cli("redrive", trig["runId"], "--schedule", "nightly")
    assert redrive.rc == 1 and _one_line(redrive).startswith("error: conflict: ")

    # resume, revise with the current revision, then with a stale one
    resumed = await cli.ok("schedule", "resume", "nightly")
    assert resumed["state"] == "ACTIVE"
    rev = resumed["revision"]
    revised = await cli.ok("schedule", "revise", "nightly", "--if-match", str(rev),
                           "--every", "2s", "--job", job, "--params", '{"n": 3}')
    assert revised["revision"] == rev + 1 and revised["nextRunAt"]
    stale = await cli("schedule", "revise", "nightly", "--if-match", str(rev), "--every", "3s",
                      "--job", job, "--json")
    assert stale.rc == 1
    assert _one_line(stale) == f"error: conflict: expected revision {rev}, current is {rev + 1}"
    assert json.loads(stale.out) == {"error": "conflict", "field": "If-Match", "message":
                                     f"expected revision {rev}, current is {rev + 1}",
                                     "revision": rev + 1}
    show = await cli.poll("the revision projected", "schedule", "show", "nightly",
                          until=lambda d: d["revision"] == rev + 1)
    assert show["definition"]["every"] == 2.0 and len(show["preview"]) == 5

    # delete; reads say so; unknown things are not_found (exit 1)
    deleted = await cli.ok("schedule", "delete", "nightly")
    assert deleted["state"] == "DELETED"
    listed = await cli.poll("the delete projected", "schedule", "list", "--state", "DELETED",
                            until=lambda d: [i["scheduleId"] for i in d["items"]] == ["nightly"])
    assert listed["items"][0]["definition"]["job"]["type"] == job
    missing = await cli("run", "r_nope")
    assert missing.rc == 1 and _one_line(missing) == "error: not_found: no run 'r_nope'"
    missing = await cli("schedule", "pause", "ghost")
    assert missing.rc == 1 and _one_line(missing) == "error: not_found: no such schedule"

    # a one-shot ends COMPLETED once it fired; only delete applies to it then
    at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    once = await cli.ok("schedule", "create", "once", "--at", at, "--job", job)
    assert once["scheduleId"] == "once"
    done = await cli.poll("the one-shot completed", "schedule", "show", "once",
                          until=lambda d: d["state"] == "COMPLETED")
    assert done["completedReason"] == "at" and done["nextRunAt"] is None
    human = await cli("schedule", "show", "once")
    assert human.rc == 0 and "completed" in human.out and "(at)" in human.out
    listed = await cli.ok("schedule", "list", "--state", "COMPLETED")
    assert [i["scheduleId"] for i in listed["items"]] == ["once"]
    both = await cli.ok("schedule", "list", "--state", "completed,deleted")
    assert [i["scheduleId"] for i in both["items"]] == ["nightly", "once"]
    refused = await cli("schedule", "pause", "once")
    assert refused.rc == 1 and _one_line(refused).startswith("error: conflict: schedule is "
                                                             "COMPLETED")

    if calendars:
        await _calendars(cli, job)

    # the history, all pages: stable now that nothing runs
    final = await cli.ok("runs", "nightly", "--limit", "500")
    ids = [i["runId"] for i in final["items"]]
    assert trig["runId"] in ids and first["runId"] in ids and len(ids) == len(set(ids))
    return ids


async def _calendars(cli: Cli, job: str) -> None:
    """A calendar through the CLI: put, named by a schedule whose instants it excludes (the
    run says by what), shown, listed, not deleted while named, deleted once not."""
    bad = await cli("calendar", "put", "bad", "--window", "sat 25:00-06:00")
    assert bad.rc == 2 and "windows[0].start" in _one_line(bad), bad
    bad = await cli("calendar", "put", "bad", "--range", "2026-12-24")
    assert bad.rc == 2 and _one_line(bad).startswith("error: --range: '2026-12-24': FROM..TO"), bad
    today = datetime.now(UTC).date().isoformat()
    put = await cli.ok("calendar", "put", "ops", "--date", today, "--window",
                       "mon-fri 12:00-13:00 Europe/Paris")
    assert (put["name"], put["revision"]) == ("ops", 1)
    unknown = await cli("schedule", "create", "cal", "--every", "1s", "--job", job,
                        "--exclude", "ops,nope")
    assert unknown.rc == 1 and "exclude[1]" in unknown.err and "nope" in unknown.err, unknown
    made = await cli.ok("schedule", "create", "cal", "--every", "1s", "--job", job,
                        "--exclude", "ops")
    assert made["scheduleId"] == "cal"
    page = await cli.poll("an excluded instant", "runs", "cal", "--state", "SKIPPED",
                          until=lambda d: bool(d["items"]))
    run = await cli.ok("run", page["items"][0]["runId"])
    assert run["exclusion"] == {"calendar": "ops", "revision": 1, "entry": today}
    shown = await cli.poll("the calendar named", "calendar", "show", "ops",
                           until=lambda d: d["usedBy"] == ["cal"])
    assert shown["definition"]["windows"][0]["days"] == ["mon", "tue", "wed", "thu", "fri"]
    human = await cli("calendar", "show", "ops")
    assert human.rc == 0 and today in human.out and "cal" in human.out, human
    assert [c["name"] for c in (await cli.ok("calendar", "list"))["items"]] == ["ops"]
    named = await cli("calendar", "delete", "ops")
    assert named.rc == 1 and "'cal'" not in named.err and "cal" in named.err, named
    await cli.ok("schedule", "delete", "cal")

    async def deleted() -> bool:  # once the schedule's unsubscription reached the calendar
        cli.services.check_alive()
        return (await cli("calendar", "delete", "ops", "--if-match", "1")).rc == 0

    await wait_until(deleted, 30, interval=SPAWN_POLL, what="the calendar deleted")
    gone = await cli("calendar", "show", "ops")
    assert gone.rc == 1 and _one_line(gone) == "error: not_found: no calendar 'ops'", gone


@pytest.mark.long(45)
async def test_lifecycle_on_the_embedded_log(tmp_path: Path, dsn: str) -> None:
    log_args = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", PARTITIONS,
                "--topic-prefix", f"t{uuid.uuid4().hex[:8]}."]
    env = _env()
    services = Services(tmp_path, env)
    start_stack(services, log_args, dsn, tmp_path)
    try:
        cli = Cli([*log_args, "--database-url", dsn], env, services)
        await wait_until(lambda: (tmp_path / "log.db").exists(), 30, what="the log file")
        await _lifecycle(cli, calendars=True)
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


@pytest.mark.long(110)
@pytest.mark.kafka
async def test_lifecycle_through_the_api_on_kafka_and_direct_access_prints_the_same(
    tmp_path: Path, dsn: str, kafka_bootstrap: str,
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\ntokens = ["acme-token"]\nallowed_jobs = ["echo"]\n'
                       "max_schedules = 10\n")
    log_args = ["--log", f"kafka://{kafka_bootstrap}", "--partitions", PARTITIONS,
                "--topic-prefix", f"t{uuid.uuid4().hex[:10]}."]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env(CHRONOLOG_TENANTS=str(tenants))
    services = Services(tmp_path, env)
    start_stack(services, log_args, dsn, tmp_path, api_port=port)
    try:
        api = Cli(["--url", url, "--token", "acme-token"], env, services)
        direct = Cli([*log_args, "--database-url", dsn], env, services)
        # the token names the tenant, whose job types the API checks
        forbidden = await wait_until(
            lambda: _answered(api("schedule", "create", "x", "--every", "1s", "--job",
                                  "report")), 60, interval=SPAWN_POLL, what="the API answers")
        assert forbidden.rc == 1
        assert _one_line(forbidden) == "error: forbidden: job type 'report' not allowed"
        # direct access: the tenants file names one tenant, the CLI uses it and checks it
        forbidden = await direct("schedule", "create", "x", "--every", "1s", "--job", "report")
        assert forbidden.rc == 1
        assert _one_line(forbidden) == "error: forbidden: job type 'report' not allowed"
        unknown = await direct("schedule", "list", "--tenant", "globex")
        assert unknown.rc == 2 and "error: --tenant: 'globex'" in _one_line(unknown)
        no_tenant = await api("schedule", "show", "x", "--tenant", "acme")
        assert no_tenant.rc == 2 and _one_line(no_tenant).startswith(
            "error: --tenant applies to direct access to the log (--log)")

        ids = await _lifecycle(api, http=True)

        # the same documents, whichever way they are read
        api_page = await api.ok("runs", "nightly", "--limit", "500")
        direct_page = await direct.ok("runs", "nightly", "--limit", "500")
        assert [i["runId"] for i in api_page["items"]] == ids
        assert direct_page["items"] == api_page["items"]
        assert direct_page["nextCursor"] == api_page["nextCursor"] is None
        assert direct_page["watermark"].keys() == api_page["watermark"].keys()
        assert await direct.ok("schedule", "show", "nightly") == \
            await api.ok("schedule", "show", "nightly")
        assert await direct.ok("run", ids[0]) == await api.ok("run", ids[0])
        one = await api.ok("runs", "nightly", "--limit", "1")
        assert one["nextCursor"]  # the API's cursor pages the direct listing too
        assert (await direct.ok("runs", "nightly", "--limit", "1", "--after",
                                one["nextCursor"]))["items"] == \
            (await api.ok("runs", "nightly", "--limit", "1", "--after",
                          one["nextCursor"]))["items"]
        # a write replayed by its key answers the same body both ways, byte for byte
        create = ["schedule", "create", "later", "--at", "2030-01-01T09:00:00Z", "--job",
                  "echo", "--idempotency-key", "later-1", "--json"]
        first = await api(*create)
        replay = await direct(*create)
        assert first.rc == replay.rc == 0 and first.out == replay.out, (first, replay)
        assert json.loads(first.out) == {"scheduleId": "later", "revision": 1,
                                         "nextRunAt": "2030-01-01T09:00:00Z"}
        # and a refusal the same error body
        refused_api = await api("schedule", "pause", "once", "--json")
        refused_direct = await direct("schedule", "pause", "once", "--json")
        assert refused_api.rc == refused_direct.rc == 1
        assert json.loads(refused_api.out) == json.loads(refused_direct.out)
        assert json.loads(refused_api.out)["error"] == "conflict"
        assert refused_api.err == refused_direct.err

        # the token and URL from the environment, the flags winning over it
        env_cli = Cli([], {**env, "CHRONOLOG_URL": url, "CHRONOLOG_TOKEN": "acme-token"},
                      services)
        assert await env_cli.ok("run", ids[0]) == await api.ok("run", ids[0])
        wrong = await env_cli("run", ids[0], "--token", "nope")
        assert wrong.rc == 1 and _one_line(wrong).startswith("error: unauthorized: ")
        assert _one_line(wrong) == (f"error: unauthorized: unknown token: the token (from "
                                    f"--token) is wrong for {url}; pass the right one with "
                                    f"--token TOKEN (or CHRONOLOG_TOKEN)")
        env_wrong = Cli([], {**env, "CHRONOLOG_URL": url, "CHRONOLOG_TOKEN": "nope"}, services)
        wrong = await env_wrong("run", ids[0])
        assert wrong.rc == 1 and "the token (from CHRONOLOG_TOKEN) is wrong" in wrong.err

        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            auth = {"Authorization": "Bearer acme-token"}
            body = (await http.get(f"/v1/runs/{ids[0]}", headers=auth)).json()
            assert body == await api.ok("run", ids[0])
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


async def _answered(call: Any) -> Result | None:
    """A CLI result unless the API was not reachable yet or not ready (unavailable)."""
    r = await call
    return None if "error: unavailable: " in r.err else r


async def test_the_tenant_quota_through_the_cli(tmp_path: Path, dsn: str) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\ntokens = ["acme-token"]\nmax_schedules = 1\n')
    log_args = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", PARTITIONS,
                "--topic-prefix", f"t{uuid.uuid4().hex[:8]}."]
    env = _env(CHRONOLOG_TENANTS=str(tenants))
    services = Services(tmp_path, env)
    services.start("processor", ["processor", *log_args])
    try:
        cli = Cli([*log_args, "--database-url", dsn], env, services)
        await wait_until(lambda: (tmp_path / "log.db").exists(), 30, what="the log file")
        first = await cli.ok("schedule", "create", "one", "--every", "1h", "--job", "echo")
        assert first["revision"] == 1
        over = await cli("schedule", "create", "two", "--every", "1h", "--job", "echo")
        assert over.rc == 1
        assert _one_line(over) == "error: quota: tenant has 1 active schedules (max 1)"
        await cli.ok("schedule", "delete", "one")

        async def created() -> bool:  # the slot comes back one step of the saga later
            services.check_alive()
            r = await cli("schedule", "create", "two", "--every", "1h", "--job", "echo")
            assert r.rc in (0, 1), r.err
            return r.rc == 0

        await wait_until(created, 30, interval=SPAWN_POLL, what="a create after the delete")
        still = await cli("schedule", "create", "three", "--every", "1h", "--job", "echo")
        assert still.rc == 1 and _one_line(still).startswith("error: quota: ")
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


@pytest.mark.long(45)
async def test_the_storage_budget_through_the_cli_and_the_api(tmp_path: Path, dsn: str) -> None:
    """Past the tenant's storage budget a write is one line on stderr, exit 1, straight to the
    log and through the API alike (``--json``: the API's body, ``field`` the tenants-file
    setting), and the API's 429 says when to retry (``Retry-After``)."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\ntokens = ["acme-token"]\nstorage_budget = 100000\n')
    log_args = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", PARTITIONS,
                "--topic-prefix", f"t{uuid.uuid4().hex[:8]}."]
    port = free_port()
    env = _env(CHRONOLOG_TENANTS=str(tenants))
    services = Services(tmp_path, env)
    services.start("processor", ["processor", *log_args])
    services.start("api", ["api", *log_args, "--database-url", dsn, "--port", str(port)])
    refused = ("error: quota: over the storage budget of tenant 'acme' (storage_budget = "
               "100000 bytes an hour): the params of TriggerRun, 8 bytes, does not fit this "
               "hour; retry in ")
    try:
        direct = Cli([*log_args, "--database-url", dsn, "--tenant", "acme"], env, services)
        await wait_until(lambda: (tmp_path / "log.db").exists(), 30, what="the log file")
        began = time.time()  # the hour's window starts at the create's at the latest
        await direct.ok("schedule", "create", "s1", "--every", "24h", "--job", "echo",
                        "--params", json.dumps({"p": "x" * 59_992}))  # 60,000 bytes
        await direct.ok("trigger", "s1", "--params", json.dumps({"p": "x" * 39_992}))
        over = await direct("trigger", "s1", "--params", '{"p": ""}')
        assert over.rc == 1 and _one_line(over).startswith(refused), over.err
        as_json = await direct("trigger", "s1", "--params", '{"p": ""}', "--json")
        assert json.loads(as_json.out)["field"] == "storage_budget"

        api = Cli(["--url", f"http://127.0.0.1:{port}", "--token", "acme-token"], env, services)
        through = await wait_until(lambda: _answered(api("trigger", "s1", "--params",
                                                         '{"p": ""}', "--json")),
                                   30, interval=SPAWN_POLL, what="the API's answer")
        assert through.rc == 1 and _one_line(through).startswith(refused), through.err
        body = json.loads(through.out)
        assert (body["error"], body["field"]) == ("quota", "storage_budget")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            r = await http.post("/v1/schedules/s1/runs", json={"params": {"p": ""}}, headers={
                "Authorization": "Bearer acme-token", "Idempotency-Key": "k-over"})
        assert r.status_code == 429 and r.json()["field"] == "storage_budget", r.text
        assert r.json()["message"].endswith(f"retry in {r.headers['retry-after']}s")
        # the window opened with the create: what is left of its hour, whatever this took
        assert 3600 - (time.time() - began) - 2 <= int(r.headers["retry-after"]) <= 3601
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


async def _node_on_sqlite(tmp_path: Path, dsn: str) -> tuple[Services, Cli, Cli, str]:
    """A processor, a projector and an API on an embedded log, answering; the CLI through
    the API and straight on the log (one tenant, ``acme``), and the API's URL."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[tenants.acme]\ntokens = ["acme-token"]\n')
    log_args = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", PARTITIONS,
                "--topic-prefix", f"t{uuid.uuid4().hex[:8]}."]
    url = f"http://127.0.0.1:{free_port()}"
    env = _env(CHRONOLOG_TENANTS=str(tenants))
    services = Services(tmp_path, env)
    services.start("processor", ["processor", *log_args])
    services.start("projector", ["projector", *log_args, "--database-url", dsn])
    services.start("api", ["api", *log_args, "--database-url", dsn, "--port",
                           url.rsplit(":", 1)[1]])
    direct = Cli([*log_args, "--database-url", dsn], env, services)
    api = Cli(["--url", url, "--token", "acme-token"], env, services)
    try:
        await wait_until(lambda: _answered(api("schedule", "list", "--json")), 60,
                         interval=SPAWN_POLL, what="the API answers")
    except BaseException:
        services.stop_all()
        raise
    return services, api, direct, url


@pytest.mark.long(35)
async def test_revise_changes_only_the_flags_given_through_the_api_and_the_log(
    tmp_path: Path, dsn: str,
) -> None:
    """``schedule revise`` merges its flags into the current definition, through the API
    (``PATCH``) and straight on the log alike; ``schedule create`` takes every field."""
    services, api, direct, _url = await _node_on_sqlite(tmp_path, dsn)
    try:
        # every field of the API's body has its create flag, and reaches the definition
        made = await api.ok(
            "schedule", "create", "full", "--every", "1h", "--anchor", "2030-01-01T00:30:00Z",
            "--start", "2030-01-01T00:00:00Z", "--end", "2031-01-01T00:00:00Z",
            "--max-count", "5", "--job", "echo", "--params", '{"a": 1}', "--job-timeout", "5m",
            "--misfire", "all", "--misfire-grace", "2m", "--misfire-max-catchup", "7",
            "--misfire-max-age", "1d", "--overlap", "allow", "--max-attempts", "4",
            "--retry-initial-backoff", "2s", "--retry-max-backoff", "1m",
            "--retry-multiplier", "3", "--retry-max-age", "2h", "--lease", "45s",
            "--start-deadline", "10m", "--jitter", "5s", "--resource-class", "gpu",
            "--priority", "-7", "--effects", "[]")
        assert made["revision"] == 1
        full = (await api.ok("schedule", "show", "full"))["definition"]
        assert full == {
            "every": 3600.0, "anchor": "2030-01-01T00:30:00Z", "timezone": "UTC",
            "start": "2030-01-01T00:00:00Z", "end": "2031-01-01T00:00:00Z", "maxCount": 5,
            "job": {"type": "echo", "params": {"a": 1}, "timeout": 300.0},
            "misfire": {"policy": "all", "grace": 120.0, "maxCatchup": 7, "maxAge": 86400.0},
            "overlap": "allow",
            "retry": {"maxAttempts": 4, "initialBackoff": 2.0, "maxBackoff": 60.0,
                      "multiplier": 3.0, "maxAge": 7200.0},
            "lease": 45.0, "startDeadline": 600.0, "jitter": 5.0,
            "dst": {"ambiguous": "first", "nonexistent": "shift_forward"}, "effects": [],
            "resourceClass": "gpu", "priority": -7}

        lines: dict[str, list[str]] = {"api": [], "direct": []}
        for name, cli in (("api", api), ("direct", direct)):
            sid = f"keep-{name}"
            await cli.ok("schedule", "create", sid, "--cron", "0 9 * * *", "--tz",
                         "Europe/Paris", "--job", "echo", "--params", '{"a": 1, "b": 2}',
                         "--max-attempts", "4")
            # --every alone: the job and its params stay; the other rule goes
            assert (await cli.ok("schedule", "revise", sid, "--if-match", "1", "--every",
                                 "30s"))["revision"] == 2
            d = (await cli.poll("revision 2", "schedule", "show", sid,
                                until=lambda doc: doc["revision"] == 2))["definition"]
            assert d["every"] == 30.0 and "cron" not in d and d["timezone"] == "Europe/Paris"
            assert d["job"] == {"type": "echo", "params": {"a": 1, "b": 2}}
            assert d["retry"]["maxAttempts"] == 4
            # --params alone: merged into the params (null removes a key), nothing else
            await cli.ok("schedule", "revise", sid, "--if-match", "2", "--params",
                         '{"b": null, "c": 3}', "--priority", "9")
            d = (await cli.poll("revision 3", "schedule", "show", sid,
                                until=lambda doc: doc["revision"] == 3))["definition"]
            assert d["job"] == {"type": "echo", "params": {"a": 1, "c": 3}}
            assert d["every"] == 30.0 and d["priority"] == 9 and d["retry"]["maxAttempts"] == 4
            # a stale revision, and a merged definition that does not hold: exit 1, one line
            stale = await cli("schedule", "revise", sid, "--if-match", "2", "--every", "1m",
                              "--json")
            assert stale.rc == 1 and json.loads(stale.out)["revision"] == 3
            bad = await cli("schedule", "revise", sid, "--if-match", "3", "--cron",
                            "0 9 * * *", "--anchor", "2030-01-01T00:00:00Z")
            assert bad.rc == 2
            inverted = await cli("schedule", "revise", sid, "--if-match", "3", "--start",
                               "2032-01-01T00:00:00Z", "--end", "2031-01-01T00:00:00Z",
                               "--json")
            assert inverted.rc == 1 and json.loads(inverted.out)["error"] == "invalid"
            missing = await cli("schedule", "revise", "nope", "--if-match", "1", "--every",
                                "1m")
            assert missing.rc == 1
            lines[name] = [_one_line(stale), _one_line(inverted), _one_line(missing)]
            # --spec: the whole definition, replaced
            spec = tmp_path / f"{sid}.json"
            spec.write_text(json.dumps({"every": "2h", "job": {"type": "echo"}}))
            await cli.ok("schedule", "revise", sid, "--if-match", "3", "--spec", str(spec))
            d = (await cli.poll("revision 4", "schedule", "show", sid,
                                until=lambda doc: doc["revision"] == 4))["definition"]
            assert d["job"] == {"type": "echo", "params": {}} and d["retry"]["maxAttempts"] == 3
        # both ways say the same
        assert lines["api"] == lines["direct"], lines
        assert lines["api"] == [
            "error: conflict: expected revision 2, current is 3",
            "error: --end: must be after --start",
            "error: not_found: no schedule 'nope'"]
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


async def test_the_tours_revise_commands_do_what_it_says(tmp_path: Path, dsn: str) -> None:
    """docs/tour.md, "Revising a schedule": its commands, run as shown, then its PATCH."""
    tour = ROOT / "docs" / "tour.md"
    section = "**Revising a schedule.**"
    services, api, _direct, url = await _node_on_sqlite(tmp_path, dsn)
    try:
        commands = sh_commands(tour, section, prefix=".venv/bin/chronolog ")
        assert len(commands) == 5
        for words in commands:
            r = await api(*words[1:])
            assert r.rc == 0, (words, r.err)
        d = (await api.ok("schedule", "show", "digest"))["definition"]
        assert d["cron"] == "0 9 * * 1-5" and "every" not in d
        assert d["timezone"] == "Europe/Paris" and d["priority"] == 5
        assert d["job"] == {"type": "echo", "params": {"to": "ops", "n": 3}}
        assert d["end"] == "2031-01-01T00:00:00Z"

        curl = sh_block(tour, section, after=1)
        assert '-X PATCH "$API/v1/schedules/digest"' in curl
        found = [re.search(pattern, curl) for pattern in
                 (r"If-Match: (\d+)'", r"Content-Type: ([^']+)'", r"-d '([^']+)'")]
        assert all(found), curl
        revision, media_type, body = (f.group(1) for f in found if f)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            r = await http.patch("/v1/schedules/digest", content=body, headers={
                "Authorization": "Bearer acme-token", "If-Match": revision,
                "Content-Type": media_type})
            assert r.status_code == 200 and r.json()["revision"] == 5, r.text
            d = (await http.get("/v1/schedules/digest", headers={
                "Authorization": "Bearer acme-token"})).json()["definition"]
        assert "end" not in d and d["job"]["params"] == {"to": "ops"}
        assert d["cron"] == "0 9 * * 1-5" and d["priority"] == 5
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)
