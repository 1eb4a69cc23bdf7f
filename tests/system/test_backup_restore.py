"""The backup and restore drill on the dev node (the SQLite log, the embedded PostgreSQL, the
result store), as an operator runs it: real ``chronolog dev`` processes, real HTTP, a real
webhook destination on loopback.

A manual run with an idempotency key finishes while its webhook destination is down, so its
effect intent is in the outbox, unperformed. ``chronolog backup`` copies the running node;
the node stops; ``chronolog restore`` refuses a non-empty deployment and fills an empty one;
a node started on it answers the same key with the original run, and performs the pending
effect — once — when the destination comes up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.net import free_port
from support.polling import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
AUTH = {"Authorization": "Bearer drill-token"}
wait_for = partial(wait_until_sync, errors=(httpx.HTTPError, OSError))


class Hook:
    """A webhook destination: records each POST's Idempotency-Key, answers 200."""

    def __init__(self, port: int) -> None:
        self.keys: list[str] = []
        keys = self.keys

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                keys.append(self.headers.get("Idempotency-Key") or "")
                body = json.dumps({"receipt": f"r{len(keys)}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Node:
    def __init__(self, data_dir: Path, port: int, tenants: Path, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [CHRONOLOG, "dev", "--quiet", "--data-dir", str(data_dir), "--port", str(port),
             "--partitions", "4", "--no-demo", "--tenants", str(tenants)],
            stdout=subprocess.DEVNULL, stderr=open(log, "wb"), cwd=ROOT)

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def trigger(self, key: str) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/schedules/invoice/runs", headers={
            **AUTH, "Idempotency-Key": key}, timeout=10)

    def served(self) -> tuple[list[str], list[str]]:
        """The schedule IDs and the invoice schedule's run IDs the node serves."""
        schedules = httpx.get(f"{self.url}/v1/schedules", headers=AUTH, timeout=5).json()
        runs = httpx.get(f"{self.url}/v1/schedules/invoice/runs", headers=AUTH, timeout=5).json()
        return ([s["scheduleId"] for s in schedules["items"]],
                sorted(r["runId"] for r in runs["items"]))

    def run(self, run_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/v1/runs/{run_id}", headers=AUTH, timeout=5)
        r.raise_for_status()
        return dict(r.json())


@pytest.fixture
def dirs() -> Iterator[dict[str, Path]]:
    # not under pytest's tmp_path: the embedded PostgreSQL runs as another system user
    root = Path(tempfile.mkdtemp(prefix="chronolog-drill-"))
    os.chmod(root, 0o755)
    yield {"old": root / "old", "backup": root / "backup", "new": root / "new", "root": root}
    shutil.rmtree(root, ignore_errors=True)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHRONOLOG, *args], capture_output=True, text=True, timeout=180,
                          cwd=ROOT)


def effect_states(doc: dict[str, Any]) -> list[str]:
    return [e["state"] for e in doc.get("effects", [])]


def test_a_restored_node_keeps_request_keys_and_performs_a_pending_effect_once(
    dirs: dict[str, Path],
) -> None:
    hook_port = free_port()
    tenants = dirs["root"] / "tenants.toml"
    tenants.write_text(f"""
[tenants.acme]
tokens = ["drill-token"]

[tenants.acme.destinations.hook]
kind = "webhook"
url = "http://127.0.0.1:{hook_port}/hook"
allow_private = true
backoff = "50ms"
max_backoff = "200ms"
timeout = "2s"
""")
    old = Node(dirs["old"], free_port(), tenants, dirs["root"] / "old.log")
    try:
        wait_for(old.healthy, 90, what="the first node")
        r = httpx.post(f"{old.url}/v1/schedules", headers=AUTH, timeout=10, json={
            "scheduleId": "invoice", "at": "2099-01-01T00:00:00Z",
            "job": {"type": "echo", "params": {"invoice": 57}},
            "effects": [{"kind": "webhook", "destination": "hook"}]})
        assert r.status_code == 201, r.text
        first = old.trigger("invoice-57")
        assert first.status_code in (200, 201), first.text
        run_id = first.json()["runId"]
        # the run succeeds; its effect stays INTENDED: nothing listens at the destination yet
        done = wait_for(lambda: old.run(run_id)["state"] == "SUCCEEDED" and old.run(run_id),
                        60, what="the run succeeded")
        assert effect_states(done) == ["INTENDED"]

        served = old.served()
        assert served == (["invoice"], [run_id])
        b = cli("backup", str(dirs["backup"]), "--data-dir", str(dirs["old"]))
        assert b.returncode == 0, b.stderr
        assert b.stdout.startswith("backup: ")
        again = cli("backup", str(dirs["backup"]), "--data-dir", str(dirs["old"]))
        assert again.returncode == 2 and "not an empty directory" in again.stderr
    finally:
        old.stop()

    # a non-empty deployment is refused, naming why, and left as it was
    refused = cli("restore", str(dirs["backup"]), "--data-dir", str(dirs["old"]))
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1 and "not empty" in refused.stderr
    incomplete = dirs["root"] / "incomplete"
    incomplete.mkdir()
    bad = cli("restore", str(incomplete), "--data-dir", str(dirs["new"]))
    assert bad.returncode == 2 and "no manifest.json" in bad.stderr
    assert not (dirs["new"] / "log.db").exists()
    # a backup whose log.db was cut short is refused in one line, and nothing is written
    truncated = dirs["root"] / "truncated"
    shutil.copytree(dirs["backup"], truncated)
    data = (truncated / "log.db").read_bytes()
    (truncated / "log.db").write_bytes(data[:len(data) // 2])
    cut = cli("restore", str(truncated), "--data-dir", str(dirs["new"]))
    assert cut.returncode == 2 and len(cut.stderr.strip().splitlines()) == 1, cut.stderr
    assert "log.db is " in cut.stderr and "(truncated or altered)" in cut.stderr
    assert not dirs["new"].exists()

    restored = cli("restore", str(dirs["backup"]), "--data-dir", str(dirs["new"]))
    assert restored.returncode == 0, restored.stderr
    hook = Hook(hook_port)
    new = Node(dirs["new"], free_port(), tenants, dirs["root"] / "new.log")
    try:
        wait_for(new.healthy, 90, what="the restored node")
        # exactly the backed-up schedules and runs
        wait_for(lambda: new.served() == served, 30, what="the restored read model served")
        # the request key survived: the same key answers the original run
        repeat = new.trigger("invoice-57")
        assert repeat.status_code in (200, 201), repeat.text
        assert repeat.json()["runId"] == run_id
        # the outbox survived: the pending effect is performed now, once
        effect_id = f"webhook-{run_id}"
        wait_for(lambda: effect_states(new.run(run_id)) == ["SUCCEEDED"], 60,
                 what="the pending effect performed")
        # a new run's effect goes after it: the runner is past the old intent
        second = new.trigger("invoice-58").json()["runId"]
        assert second != run_id
        wait_for(lambda: effect_states(new.run(second)) == ["SUCCEEDED"], 60,
                 what="the new run's effect")
        assert hook.keys.count(effect_id) == 1
        assert hook.keys.count(f"webhook-{second}") == 1
        audit = cli("audit", "--data-dir", str(dirs["new"]))
        assert audit.returncode == 0, audit.stdout + audit.stderr
    finally:
        new.stop()
        hook.close()
