"""``chronolog processor`` + ``chronolog projector`` + ``chronolog api`` as real processes.

The API is served by uvicorn on 127.0.0.1 and spoken to over TCP; a write's consistency
token makes the following read see it although the projector is another process (the API
polls the offsets stored in PostgreSQL). SIGTERM stops every service with status 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chronolog.log.port import Topics
from chronolog.settings import LogConfig

from .conftest import CHRONOLOG, ROOT, wait_until
from .pgdb import create_database, drop_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn(database_url: str) -> Iterator[str]:
    d = asyncio.run(create_database(database_url, "test_api_server"))
    yield d
    asyncio.run(drop_database(database_url, d))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CHRONOLOG_") or k == "CHRONOLOG_TEST_DATABASE_URL"}
    return subprocess.Popen([CHRONOLOG, *args], stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "wb"), env=env, cwd=ROOT)


def _stop(p: subprocess.Popen[bytes]) -> int | None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    return p.returncode


async def test_the_three_services_over_real_http(tmp_path: Path, dsn: str) -> None:
    cfg = LogConfig("sqlite", str(tmp_path / "log.db"), Topics(prefix="chronolog.", partitions=4))
    log_args = ["--log", f"sqlite://{cfg.target}", "--partitions", "4"]
    port = _free_port()
    started = [
        _service(["processor", *log_args], tmp_path / "processor.log"),
        _service(["projector", *log_args, "--database-url", dsn], tmp_path / "projector.log"),
        _service(["api", *log_args, "--database-url", dsn, "--port", str(port)],
                 tmp_path / "api.log"),
    ]
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            async def up() -> bool:
                for p in started:
                    assert p.poll() is None, (tmp_path / "api.log").read_text()
                try:
                    return (await http.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(up, 60, what="the API to answer /healthz")
            auth = {"Authorization": "Bearer dev"}
            body = {"scheduleId": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris",
                    "job": {"type": "report", "params": {"full": True}}}

            async def created() -> httpx.Response | None:
                r = await http.post("/v1/schedules", json=body, headers={
                    **auth, "Idempotency-Key": "create-nightly"})
                # 503 until the processor owns its partitions: retry with the same key
                return r if r.status_code == 201 else None

            r = await wait_until(created, 60, interval=0.2, what="create answered 201")
            token = r.headers["x-chronolog-consistency"]
            g = await http.get("/v1/schedules/nightly",
                               headers={**auth, "X-Chronolog-Consistency": token})
            assert g.status_code == 200, g.text
            assert g.json()["definition"]["job"]["params"] == {"full": True}
            assert g.json()["preview"][0]["local"].endswith("T03:00:00+01:00") or \
                g.json()["preview"][0]["local"].endswith("T03:00:00+02:00")
            assert (await http.get("/v1/schedules/nightly")).status_code == 401
            metrics = await http.get("/metrics")
            assert "chronolog_projection_lag_events" in metrics.text
    finally:
        codes = [_stop(p) for p in reversed(started)]
    assert codes == [0, 0, 0], [(tmp_path / f).read_text()[-2000:]
                                for f in ("api.log", "projector.log", "processor.log")]
