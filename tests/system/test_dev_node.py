"""`chronolog dev` and `make run` as a user runs them: real processes, real HTTP.

A node on a fresh data directory runs an `every: 1s` echo schedule created through the API,
is stopped with SIGTERM, restarted on the same directory, keeps its whole history, goes on
without repeating a scheduled instant, and `chronolog audit` passes on its log. A node whose
projector fails (its table is gone) restarts it with backoff and says so on stderr, and goes
on once the table is back, without stopping the API.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from support.net import free_port
from support.polling import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
AUTH = {"Authorization": "Bearer dev"}


# the API may not listen yet: a refused connection is "not yet"
wait_for = partial(wait_until_sync, errors=(httpx.HTTPError, OSError))


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # not under pytest's tmp_path: the embedded PostgreSQL runs as another system user,
    # and pytest keeps its temporary root private (mode 0700)
    d = Path(tempfile.mkdtemp(prefix="chronolog-dev-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Node:
    def __init__(self, data_dir: Path, port: int, log: Path, *extra: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [CHRONOLOG, "dev", "--quiet", "--data-dir", str(data_dir), "--port", str(port),
             "--partitions", "4", "--no-demo", *extra],
            stdout=open(log.with_suffix(".out"), "wb"), stderr=open(log, "wb"), cwd=ROOT,
        )

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError("chronolog dev did not stop within 30 s of SIGTERM") from None
        return self.proc.returncode


def runs(url: str, state: str | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 100}
        if cursor:
            params["after"] = cursor
        if state:
            params["state"] = state
        r = httpx.get(f"{url}/v1/schedules/tick/runs", params=params, headers=AUTH, timeout=5)
        r.raise_for_status()
        body = r.json()
        items += body["items"]
        cursor = body["nextCursor"]
        if not cursor:
            return items


def test_dev_node_survives_a_restart_without_losing_or_repeating_an_occurrence(
    data_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    node = Node(data_dir, port, tmp_path / "dev1.log")
    try:
        wait_for(node.healthy, 60, "a healthy API")
        r = httpx.post(f"{node.url}/v1/schedules", headers=AUTH, timeout=10, json={
            "scheduleId": "tick", "every": "1s", "job": {"type": "echo", "params": {"n": 1}},
            "misfire": "all", "overlap": "allow"})
        assert r.status_code == 201, r.text
        first = wait_for(lambda: len(runs(node.url, "SUCCEEDED")) >= 3 and runs(node.url),
                         60, "three SUCCEEDED runs")
    finally:
        assert node.stop() == 0, (tmp_path / "dev1.log").read_text()[-2000:]
    before = {r["runId"] for r in first if r["state"] == "SUCCEEDED"}

    node = Node(data_dir, port, tmp_path / "dev2.log")
    try:
        wait_for(node.healthy, 60, "a healthy API after restart")
        after = wait_for(
            lambda: (lambda items: items if len([i for i in items if i["state"] == "SUCCEEDED"])
                     >= len(before) + 3 else None)(runs(node.url)),
            60, "new runs after the restart")
    finally:
        assert node.stop() == 0, (tmp_path / "dev2.log").read_text()[-2000:]
    ids = {r["runId"] for r in after}
    assert before <= ids, "history from before the restart is gone"
    instants = Counter(r["scheduledAt"] for r in after)
    assert [k for k, n in instants.items() if n > 1] == []
    audit = subprocess.run([CHRONOLOG, "audit", "--data-dir", str(data_dir)],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "0 violations" in audit.stdout


def test_make_run_reaches_a_healthy_api(data_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    log = open(tmp_path / "make-run.log", "wb")
    proc = subprocess.Popen(
        ["make", "run", f"ARGS=--quiet --no-demo --port {port} --data-dir {data_dir}"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ),
    )
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code
                 == 200, 90, "make run -> /healthz")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group make run started
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
            raise AssertionError("make run did not stop within 30 s") from None


def _sql(dsn: str, *statements: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture
def fresh_database(database_url: str) -> Iterator[str]:
    name = f"dev_{uuid.uuid4().hex[:10]}"
    _sql(database_url, f'CREATE DATABASE "{name}"')
    yield urlunsplit(urlsplit(database_url)._replace(path="/" + name))
    _sql(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_dev_node_restarts_a_failed_part_and_says_so(
    data_dir: Path, tmp_path: Path, fresh_database: str
) -> None:
    port = free_port()
    stderr = tmp_path / "dev.log"
    node = Node(data_dir, port, stderr, "--database-url", fresh_database)
    try:
        wait_for(node.healthy, 60, "a healthy API")
        r = httpx.post(f"{node.url}/v1/schedules", headers=AUTH, timeout=10, json={
            "scheduleId": "tick", "every": "1s", "job": {"type": "echo"}, "overlap": "allow"})
        assert r.status_code == 201, r.text
        wait_for(lambda: len(runs(node.url, "SUCCEEDED")) >= 1, 60, "a SUCCEEDED run")
        _sql(fresh_database, "ALTER TABLE projection_offsets RENAME TO offsets_away")
        wait_for(lambda: stderr.read_text().count("chronolog: projector failed") >= 2, 60,
                 "the projector restarted twice, said on stderr")
        assert node.proc.poll() is None, "the node stopped"
        _sql(fresh_database, "ALTER TABLE offsets_away RENAME TO projection_offsets")
        before = len(runs(node.url, "SUCCEEDED"))
        wait_for(lambda: len(runs(node.url, "SUCCEEDED")) >= before + 2, 60,
                 "runs projected again after the restarts")
        text = stderr.read_text()
        assert "restarting it in 0.5 s (restart 1)" in text
        assert "restarting it in 1.0 s (restart 2)" in text
        assert "part_restarting" in text  # the log line
    finally:
        assert node.stop() == 0, stderr.read_text()[-2000:]


def test_dev_banner_keeps_the_token_off_redirected_output_and_metrics_are_open(
    data_dir: Path, tmp_path: Path
) -> None:
    node = Node(data_dir, free_port(), tmp_path / "dev.log")
    try:
        wait_for(node.healthy, 60, "a healthy API")
        out = tmp_path / "dev.out"
        banner = wait_for(lambda: "chronolog dev is running" in out.read_text()
                          and out.read_text(), 30, "the banner")
        # a dev node without a tenants file: /metrics needs no token
        assert httpx.get(f"{node.url}/metrics", timeout=10).status_code == 200
        # the banner names the web dashboard, which / leads to
        home = httpx.get(f"{node.url}/", timeout=10)
        assert home.status_code == 303 and home.headers["location"] == "/ui/"
    finally:
        assert node.stop() == 0, (tmp_path / "dev.log").read_text()[-2000:]
    assert "token: <token>" in banner and "Bearer <token>" in banner, banner
    assert f"web dashboard: {node.url}/  (log in" in banner, banner
    assert "Bearer dev" not in banner and "token: dev" not in banner, banner


# ------------------------------------------------------------------ one node per directory

STOP_BOUND_S = 10  # a chronolog process stops this soon after SIGTERM, whatever its clients do


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postgres" / "postmaster.pid").read_text().splitlines()[0])


def create_schedules(url: str, n: int) -> list[str]:
    ids = [f"s{i}" for i in range(n)]
    for sid in ids:
        r = httpx.post(f"{url}/v1/schedules", headers=AUTH, timeout=10, json={
            "scheduleId": sid, "cron": "0 9 * * *", "job": {"type": "echo"}})
        assert r.status_code == 201, r.text
    return ids


def listed(url: str) -> list[str]:
    body = httpx.get(f"{url}/v1/schedules", headers=AUTH, params={"limit": 100},
                     timeout=5).json()
    return sorted(s["scheduleId"] for s in body["items"])


@pytest.mark.long(30)
def test_a_second_node_on_a_data_directory_in_use_is_refused_and_the_first_keeps_serving(
    data_dir: Path, tmp_path: Path,
) -> None:
    from chronolog.embedded_postgres import pid_alive

    node = Node(data_dir, free_port(), tmp_path / "first.log")
    try:
        wait_for(node.healthy, 60, "a healthy API")
        ids = create_schedules(node.url, 14)
        wait_for(lambda: listed(node.url) == sorted(ids), 30, "every schedule listed")
        node_file = (data_dir / "node.json").read_bytes()
        pg = postmaster_pid(data_dir)
        other = free_port()
        second = subprocess.run(
            [CHRONOLOG, "dev", "--quiet", "--data-dir", str(data_dir), "--port", str(other),
             "--partitions", "4", "--no-demo"],
            capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert second.returncode == 2, second.stderr
        assert second.stderr.splitlines() == [
            f"error: the data directory {data_dir} is in use by the node with PID "
            f"{node.proc.pid} at {node.url} (stop it first, or use --data-dir elsewhere)"]
        assert node.healthy()
        assert (data_dir / "node.json").read_bytes() == node_file
        assert not (data_dir / "dev.log").exists()
        assert postmaster_pid(data_dir) == pg and pid_alive(pg)
        assert listed(node.url) == sorted(ids)
        with pytest.raises(httpx.ConnectError):  # it never served
            httpx.get(f"http://127.0.0.1:{other}/healthz", timeout=2)
    finally:
        assert node.stop() == 0, (tmp_path / "first.log").read_text()[-2000:]
    assert not pid_alive(pg)


def test_a_node_killed_with_sigkill_leaves_no_postgresql_and_the_next_start_takes_over(
    data_dir: Path, tmp_path: Path,
) -> None:
    from chronolog.embedded_postgres import pid_alive

    port = free_port()
    node = Node(data_dir, port, tmp_path / "killed.log")
    try:
        wait_for(node.healthy, 60, "a healthy API")
        ids = create_schedules(node.url, 3)
        wait_for(lambda: listed(node.url) == ids, 30, "every schedule listed")
        orphan = postmaster_pid(data_dir)
    finally:
        node.proc.kill()  # SIGKILL: no clean stop, its PostgreSQL is left to the watchdog
        node.proc.wait()
    # started at once, while the watchdog may still hold the directory
    later = Node(data_dir, port, tmp_path / "later.log")
    try:
        wait_for(later.healthy, 90, "a healthy API on the same directory")
        assert not pid_alive(orphan), "the killed node's PostgreSQL is still running"
        fresh = postmaster_pid(data_dir)
        assert fresh != orphan and pid_alive(fresh)
        wait_for(lambda: listed(later.url) == ids, 30, "the schedules created before")
    finally:
        assert later.stop() == 0, (tmp_path / "later.log").read_text()[-2000:]
    assert not pid_alive(fresh)


def test_without_a_next_start_the_watchdog_stops_the_postgresql_of_a_killed_node(
    data_dir: Path, tmp_path: Path,
) -> None:
    from chronolog.embedded_postgres import pid_alive

    node = Node(data_dir, free_port(), tmp_path / "killed.log")
    try:
        wait_for(node.healthy, 60, "a healthy API")
        orphan = postmaster_pid(data_dir)
    finally:
        node.proc.kill()
        node.proc.wait()
    wait_for(lambda: not pid_alive(orphan), 40, "the killed node's PostgreSQL stopped")


def test_a_request_left_open_does_not_hold_up_a_stop(data_dir: Path, tmp_path: Path) -> None:
    import socket
    import time

    node = Node(data_dir, free_port(), tmp_path / "dev.log")
    try:
        wait_for(node.healthy, 60, "a healthy API")
        with socket.create_connection(("127.0.0.1", node.port), timeout=5) as sock:
            # a request whose body never comes: the server waits on it
            sock.sendall(b"POST /v1/schedules HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer dev"
                         b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            wait_for(node.healthy, 10, "the API serving beside the open request")
            node.proc.send_signal(signal.SIGINT)
            began = time.monotonic()
            status = node.proc.wait(STOP_BOUND_S + 20)
            took = time.monotonic() - began
    finally:
        node.stop()
    assert status == 0, (tmp_path / "dev.log").read_text()[-2000:]
    assert took <= STOP_BOUND_S, f"stopped after {took:.1f}s"
