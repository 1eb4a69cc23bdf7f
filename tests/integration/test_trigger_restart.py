"""A repeated manual trigger across a processor restart answers its run's true state.

Real ``chronolog`` processes on the embedded SQLite log and a fresh PostgreSQL database:
``processor``, ``projector``, ``worker --builtin-jobs`` and ``api``. A manual trigger runs
to SUCCEEDED, a later one succeeds too (the schedule's state then keeps only the newest
finished run: the first has left it), the processor is stopped by its PID and a new one
started on the same log (it restores its states from its snapshot and the log). The first
trigger sent again with the same key answers the same run and SUCCEEDED — through the HTTP
API and through the CLI, over HTTP and straight to the log — as the run's document says.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from chronolog.telemetry.ids import run_trace_id
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


async def _trigger(http: httpx.AsyncClient, services: Services, key: str) -> dict[str, Any]:
    """POST a manual trigger with ``key`` until it is answered (the processor may not own
    its partitions yet: the same key is safe to send again)."""
    async def answered() -> Any:
        services.check_alive()
        try:
            r = await http.post("/v1/schedules/nightly/runs", headers={**AUTH,
                                                                      "Idempotency-Key": key})
        except httpx.ConnectError:  # the API (alive: checked above) does not listen yet
            return None
        return r.json() if r.status_code == 201 else None

    doc: dict[str, Any] = await wait_until(answered, 90, interval=SPAWN_POLL,
                                           what=f"the trigger {key} answered")
    return doc


async def _succeeded(http: httpx.AsyncClient, services: Services, run_id: str) -> None:
    async def done() -> bool:
        services.check_alive()
        r = await http.get(f"/v1/runs/{run_id}", headers=AUTH)
        return r.status_code == 200 and r.json()["state"] == "SUCCEEDED"

    await wait_until(done, 60, interval=SPAWN_POLL, what=f"run {run_id} SUCCEEDED")


async def test_a_repeated_trigger_answers_succeeded_after_a_restart_forgot_the_run(
    tmp_path: Path, dsn: str,  # noqa: F811
) -> None:
    log_args = ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", PARTITIONS,
                "--topic-prefix", f"t{uuid.uuid4().hex[:8]}."]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env()
    services = Services(tmp_path, env)
    start_stack(services, log_args, dsn, tmp_path, api_port=port)
    try:
        direct = Cli([*log_args, "--database-url", dsn], env, services)
        over_http = Cli(["--url", url, "--token", "dev"], env, services)
        await wait_until(lambda: (tmp_path / "log.db").exists(), 30, what="the log file")
        created = await wait_until(
            lambda: _answered(direct("schedule", "create", "nightly", "--every", "24h",
                                     "--job", "echo", "--idempotency-key", "c-1",
                                     "--timeout", "5", "--json")),
            90, interval=SPAWN_POLL, what="the create answered")
        assert created["scheduleId"] == "nightly"
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            paid = await _trigger(http, services, "pay-run")
            await _succeeded(http, services, paid["runId"])
            later = await _trigger(http, services, "later-run")
            await _succeeded(http, services, later["runId"])  # "pay-run" left the state

            # a new processor on the same log: restored, it never held the first run
            old = services.procs.pop("processor")
            old.send_signal(signal.SIGTERM)
            assert old.wait(30) == 0, services.tail("processor")
            services.start("processor-2", ["processor", *log_args])

            again = await _trigger(http, services, "pay-run")
            assert again == {"runId": paid["runId"], "state": "SUCCEEDED",
                             "traceId": run_trace_id(paid["runId"])}
            doc = (await http.get(f"/v1/runs/{paid['runId']}", headers=AUTH)).json()
            assert doc["state"] == "SUCCEEDED"
        for cli in (direct, over_http):
            answer = await cli.ok("trigger", "nightly", "--idempotency-key", "pay-run")
            assert answer == {"runId": paid["runId"], "state": "SUCCEEDED",
                              "traceId": run_trace_id(paid["runId"])}
        human = await direct("trigger", "nightly", "--idempotency-key", "pay-run")
        assert human.rc == 0
        assert human.out.strip() == f"triggered run {paid['runId']} of nightly: SUCCEEDED"
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


async def _answered(pending: Any) -> Any:
    r = await pending
    return r.json() if r.rc == 0 else None
