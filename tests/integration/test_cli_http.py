"""The user CLI over the HTTP API, as a user runs it: real ``chronolog`` processes only.

* ``chronolog dev`` records where it serves in ``DATA_DIR/node.json`` (0600, the URL, its
  token and PID) once its API answers, and the CLI run in the directory above it — no
  ``--data-dir``, no ``--url``, no token — finds it: a schedule created, its runs listed
  and shown as the API's bodies (a schedule's whole life through the CLI over HTTP is
  test_ops_cli.py's, against ``chronolog api`` on Kafka); a clean stop removes the file
  and the CLI then says, in one line and exit status 2, how to point it at a node. A node
  killed with SIGKILL leaves a stale file the CLI ignores; a restarted node replaces it.
* Against ``chronolog api`` with no processor: a write that gets no reply is 503
  ``unavailable`` (exit 1, the API's body with ``--json``), the CLI's own bound gives up
  first when it is shorter, a missing or wrong token is one line saying so, a missing
  schedule is ``not_found``.
"""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.net import free_port
from support.polling import SPAWN_POLL, wait_until

from .conftest import CHRONOLOG, ROOT
from .test_ops_cli import (  # noqa: F401 - dsn: a fixture
    PARTITIONS,
    Cli,
    Services,
    _env,
    _one_line,
    dsn,
)

pytestmark = pytest.mark.postgres

NO_NODE = ("error: no chronolog node found at ./.chronolog; pass --url URL --token TOKEN (or "
           "set CHRONOLOG_URL, CHRONOLOG_TOKEN), or start one with 'chronolog dev'")


class DevNode:
    """A ``chronolog dev`` process on ``data_dir`` (stopped by its PID)."""

    def __init__(self, data_dir: Path, dsn: str, log: Path) -> None:  # noqa: F811
        self.port = free_port()
        self.log = log
        self._err = open(log, "wb")  # closed in stop
        self.proc = subprocess.Popen(
            [CHRONOLOG, "dev", "--quiet", "--no-demo", "--data-dir", str(data_dir), "--port",
             str(self.port), "--partitions", PARTITIONS, "--database-url", dsn],
            stdout=subprocess.DEVNULL, stderr=self._err, env=_env(), cwd=ROOT)

    def alive(self) -> None:
        assert self.proc.poll() is None, f"chronolog dev exited: {self.tail()}"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._err.close()
        return self.proc.returncode


@pytest.fixture
def nodes() -> Iterator[list[DevNode]]:
    started: list[DevNode] = []
    yield started
    for node in started:
        node.stop()


def _node_file(data_dir: Path, node: DevNode) -> Any:
    """The node's node.json once it is written (the API serves by then)."""
    path = data_dir / "node.json"

    def written() -> Any:
        node.alive()
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return doc if doc.get("pid") == node.proc.pid else None

    return wait_until(written, 60, interval=0.1, what="node.json of the dev node")


@pytest.mark.long(20)
async def test_the_cli_finds_a_dev_node_through_its_data_directory(
    tmp_path: Path, dsn: str, nodes: list[DevNode],  # noqa: F811
) -> None:
    data_dir = tmp_path / ".chronolog"
    node = DevNode(data_dir, dsn, tmp_path / "dev.log")
    nodes.append(node)
    doc = await _node_file(data_dir, node)
    assert doc == {"url": f"http://127.0.0.1:{node.port}", "token": "dev",
                   "pid": node.proc.pid}
    assert stat.S_IMODE((data_dir / "node.json").stat().st_mode) == 0o600
    assert [p.name for p in data_dir.iterdir() if p.name.startswith(".node.json")] == []

    # in the directory that holds ./.chronolog: no flag, no variable, no token
    services = Services(tmp_path, _env())
    cli = Cli([], _env(), services, cwd=tmp_path)

    async def created() -> Any:
        r = await cli("schedule", "create", "nightly", "--every", "1s", "--job", "echo",
                      "--params", '{"n": 1}', "--idempotency-key", "c-1", "--json")
        return json.loads(r.out) if r.rc == 0 else None

    made = await wait_until(created, 60, interval=SPAWN_POLL, what="create answered")
    assert made["scheduleId"] == "nightly" and made["revision"] == 1 and made["nextRunAt"]
    page = await cli.poll("a succeeded run", "runs", "nightly", "--state", "SUCCEEDED",
                          until=lambda d: len(d["items"]) >= 1)
    ids = [i["runId"] for i in page["items"]]
    async with httpx.AsyncClient(base_url=doc["url"], timeout=30) as http:
        body = (await http.get(f"/v1/runs/{ids[0]}",
                               headers={"Authorization": "Bearer dev"})).json()
    assert await cli.ok("run", ids[0]) == body  # --json is the API's body
    assert body["result"]["inline"] == {"n": 1}
    workers = await cli.ok("workers", "list")
    assert [w["workerId"] for w in workers["items"]] == [f"dev-worker-{node.proc.pid}"]
    # a calendar over HTTP: put, named (an unknown one refused, naming it), shown, kept
    put = await cli.ok("calendar", "put", "ops", "--date", "2031-01-01",
                       "--window", "sat,sun 22:00-06:00 Europe/Paris")
    assert (put["name"], put["revision"]) == ("ops", 1)
    unknown = await cli("schedule", "create", "cal", "--every", "1h", "--job", "echo",
                        "--exclude", "ops", "--exclude", "nope", "--json")
    assert unknown.rc == 1 and json.loads(unknown.out)["field"] == "exclude[1]", unknown
    await cli.ok("schedule", "create", "cal", "--every", "1h", "--job", "echo",
                 "--exclude", "ops")
    shown = await cli.poll("the calendar named", "calendar", "show", "ops",
                           until=lambda d: d["usedBy"] == ["cal"])
    async with httpx.AsyncClient(base_url=doc["url"], timeout=30) as http:
        assert shown == (await http.get("/v1/calendars/ops",
                                        headers={"Authorization": "Bearer dev"})).json()
    named = await cli("calendar", "delete", "ops", "--json")
    assert named.rc == 1 and json.loads(named.out)["error"] == "conflict", named
    stale = await cli("calendar", "put", "ops", "--date", "2031-01-02", "--if-match", "7")
    assert stale.rc == 1 and _one_line(stale).endswith(
        "expected revision 7, current is 1"), stale
    # a token given wins over the node's own, the variable too
    env_wrong = await Cli([], {**_env(), "CHRONOLOG_TOKEN": "not-dev"}, services,
                          cwd=tmp_path)("run", ids[0])
    assert env_wrong.rc == 1 and "the token (from CHRONOLOG_TOKEN) is wrong" in env_wrong.err
    wrong = await cli("run", ids[0], "--token", "not-dev", "--json")
    assert wrong.rc == 1 and _one_line(wrong) == (
        f"error: unauthorized: unknown token: the token (from --token) is wrong for "
        f"{doc['url']}; pass the right one with --token TOKEN (or CHRONOLOG_TOKEN)")
    assert json.loads(wrong.out) == {"error": "unauthorized", "field": "Authorization",
                                     "message": "unknown token"}
    # and so does --data-dir over the working directory's
    elsewhere = await Cli([], _env(), services, cwd=ROOT)("runs", "nightly", "--data-dir",
                                                          str(data_dir), "--json")
    assert elsewhere.rc == 0 and json.loads(elsewhere.out)["items"]

    assert node.stop() == 0, node.tail()
    assert not (data_dir / "node.json").exists()  # a clean stop removes it
    gone = await cli("runs", "nightly")
    assert gone.rc == 2 and gone.out == "" and _one_line(gone) == NO_NODE


async def test_a_stale_node_file_is_ignored_and_a_restart_replaces_it(
    tmp_path: Path, dsn: str, nodes: list[DevNode],  # noqa: F811
) -> None:
    data_dir = tmp_path / ".chronolog"
    first = DevNode(data_dir, dsn, tmp_path / "dev1.log")
    nodes.append(first)
    await _node_file(data_dir, first)
    cli = Cli(["--json"], _env(), Services(tmp_path, _env()), cwd=tmp_path)
    assert (await cli("workers", "list")).rc == 0
    first.stop(signal.SIGKILL)  # no clean stop: the file stays, naming a process that is gone
    assert json.loads((data_dir / "node.json").read_text())["pid"] == first.proc.pid
    stale = await cli("workers", "list")
    assert stale.rc == 2 and stale.out == "" and _one_line(stale) == NO_NODE

    second = DevNode(data_dir, dsn, tmp_path / "dev2.log")
    nodes.append(second)
    doc = await _node_file(data_dir, second)
    assert doc["url"] == f"http://127.0.0.1:{second.port}"
    listed = await cli("workers", "list")
    assert listed.rc == 0, listed.err
    assert f"dev-worker-{second.proc.pid}" in [w["workerId"]
                                               for w in json.loads(listed.out)["items"]]
    assert second.stop() == 0, second.tail()
    assert not (data_dir / "node.json").exists()


async def test_refusals_and_an_api_without_a_processor(tmp_path: Path, dsn: str) -> None:  # noqa: F811
    log_args = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", PARTITIONS,
                "--topic-prefix", f"t{uuid.uuid4().hex[:8]}."]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    services = Services(tmp_path, _env())
    services.start("api", ["api", *log_args, "--database-url", dsn, "--port", str(port),
                           "--reply-timeout", "1"])
    try:
        cli = Cli(["--url", url, "--token", "dev"], _env(), services)
        await cli.poll("the API answers", "workers", "list", until=lambda d: "items" in d)

        # no processor: the API answers 503 once its own bound passed
        create = await cli("schedule", "create", "s1", "--every", "1h", "--job", "echo",
                           "--json")
        assert create.rc == 1
        line = _one_line(create)
        assert line.startswith("error: unavailable: no reply from the processor within 1s"), line
        assert json.loads(create.out)["error"] == "unavailable"
        # the CLI's bound, shorter, gives up first; the trigger's key is named for a retry
        trig = await cli("trigger", "s1", "--timeout", "0.3")
        line = _one_line(trig)
        assert trig.rc == 1 and line.startswith(f"error: unavailable: no answer from {url} "
                                                f"within 0.3s; the command may still be "
                                                f"decided"), line
        assert "(this trigger's key: --idempotency-key cli-" in line
        kept = await cli("trigger", "s1", "--timeout", "0.3", "--idempotency-key", "k-1")
        assert kept.rc == 1 and "this trigger's key" not in kept.err
        assert "retry with the same --idempotency-key" in kept.err

        # reads answer without a processor
        missing = await cli("schedule", "show", "ghost", "--json")
        assert missing.rc == 1 and _one_line(missing) == "error: not_found: no schedule 'ghost'"
        assert json.loads(missing.out) == {"error": "not_found", "field": "scheduleId",
                                           "message": "no schedule 'ghost'"}
        runs = await cli("runs", "ghost")
        assert runs.rc == 1 and _one_line(runs) == "error: not_found: no schedule 'ghost'"

        # a missing or wrong token: one line each, the API's body with --json
        anonymous = Cli(["--url", url], _env(), services)
        none = await anonymous("schedule", "show", "ghost", "--json")
        assert none.rc == 1 and _one_line(none) == (
            "error: unauthorized: missing bearer token: no token given; pass --token TOKEN "
            "(or set CHRONOLOG_TOKEN)")
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            assert json.loads(none.out) == (await http.get("/v1/schedules/ghost")).json()
        bad = await anonymous("schedule", "show", "ghost", "--token", "guess")
        assert bad.rc == 1 and _one_line(bad).startswith("error: unauthorized: unknown token: "
                                                         "the token (from --token) is "
                                                         "wrong for ")
        # the variable when no flag is given
        env_token = Cli(["--url", url], {**_env(), "CHRONOLOG_TOKEN": "dev"}, services)
        assert (await env_token("schedule", "show", "ghost")).err.strip() == \
            "error: not_found: no schedule 'ghost'"
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)

