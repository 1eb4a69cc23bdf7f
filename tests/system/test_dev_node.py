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
