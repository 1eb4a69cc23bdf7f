"""``chronolog processor`` + ``chronolog projector`` + ``chronolog api`` as real processes.

The API is served by uvicorn on 127.0.0.1 and spoken to over TCP; a write's consistency
token makes the following read see it although the projector is another process (the API
polls the offsets stored in PostgreSQL). SIGTERM stops every service with status 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chronolog.log.port import OutRecord, Topics
from chronolog.settings import LogConfig, open_log
from support.net import free_port
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT
from .pgdb import create_database, drop_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn(database_url: str) -> Iterator[str]:
    d = asyncio.run(create_database(database_url, "test_api_server"))
    yield d
    asyncio.run(drop_database(database_url, d))


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


async def _healthy(http: httpx.AsyncClient, started: list[subprocess.Popen[bytes]],
                   api_log: Path) -> None:
    """Wait until the API answers /healthz (every service still running meanwhile)."""
    async def up() -> bool:
        for p in started:
            # a service that stopped: show every service's log (which one failed is not known)
            assert p.poll() is None, "\n".join(
                f"--- {f.name}\n{f.read_text()}" for f in sorted(api_log.parent.glob("*.log")))
        try:
            return (await http.get("/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_until(up, 60, what="the API to answer /healthz")


async def test_the_three_services_over_real_http(tmp_path: Path, dsn: str) -> None:
    cfg = LogConfig("sqlite", str(tmp_path / "log.db"), Topics(prefix="chronolog.", partitions=4))
    log_args = ["--log", f"sqlite://{cfg.target}", "--partitions", "4"]
    port = free_port()
    started = [
        _service(["processor", *log_args], tmp_path / "processor.log"),
        _service(["projector", *log_args, "--database-url", dsn], tmp_path / "projector.log"),
        _service(["api", *log_args, "--database-url", dsn, "--port", str(port)],
                 tmp_path / "api.log"),
    ]
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            await _healthy(http, started, tmp_path / "api.log")
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
            await _preview_marks_berlin_transitions(http, auth)
            metrics = await http.get("/metrics")
            assert "chronolog_projection_lag_events" in metrics.text
            # `chronolog api` serves the web dashboard on the same port
            home = await http.get("/")
            assert home.status_code == 303 and home.headers["location"] == "/ui/"
            login = await http.get("/ui/login")
            assert login.status_code == 200 and "Tenant token" in login.text
    finally:
        codes = [_stop(p) for p in reversed(started)]
    assert codes == [0, 0, 0], [(tmp_path / f).read_text()[-2000:]
                                for f in ("api.log", "projector.log", "processor.log")]


# the marks' notes, as the dashboard and `chronolog preview` word them
SHIFTED = "the wall time does not exist that day (clocks go forward): shifted forward"
REPEATED = "this wall time happens twice (clocks go back): policy ambiguous=first"
LEFT_OUT = "the repetition of this wall time is left out: policy ambiguous=first"


async def _preview_marks_berlin_transitions(http: httpx.AsyncClient,
                                            auth: dict[str, str]) -> None:
    """``GET /v1/preview`` of a fixed-time cron across Berlin's spring-forward (02:30 does
    not exist on 2026-03-29) and fall-back (02:30 happens twice on 2026-10-25): each
    instant carries its ``dst`` mark and ``note``, the left-out repetition is ``skipped``."""
    def row(utc: str, local: str, dst: str | None = None,
            note: str | None = None) -> dict[str, str | None]:
        return {"utc": utc, "local": local, "dst": dst, "note": note}

    async def preview(after: str) -> Any:
        r = await http.get("/v1/preview", headers=auth, params={
            "cron": "30 2 * * *", "timezone": "Europe/Berlin", "from": after, "count": 3})
        assert r.status_code == 200, r.text
        return r.json()

    assert await preview("2026-03-28T00:00:00Z") == {"instants": [
        row("2026-03-28T01:30:00Z", "2026-03-28T02:30:00+01:00"),
        row("2026-03-29T01:00:00Z", "2026-03-29T03:00:00+02:00", "shifted", SHIFTED),
        row("2026-03-30T00:30:00Z", "2026-03-30T02:30:00+02:00"),
    ], "skipped": []}
    assert await preview("2026-10-24T00:00:00Z") == {"instants": [
        row("2026-10-24T00:30:00Z", "2026-10-24T02:30:00+02:00"),
        row("2026-10-25T00:30:00Z", "2026-10-25T02:30:00+02:00", "repeated", REPEATED),
        row("2026-10-26T01:30:00Z", "2026-10-26T02:30:00+01:00"),
    ], "skipped": [
        row("2026-10-25T01:30:00Z", "2026-10-25T02:30:00+01:00", "skipped", LEFT_OUT),
    ]}


TENANTS_TOML = """
[operators]
tokens = ["ops-token"]

[tenants.acme]
tokens = ["acme-token"]
rate_limit = 100000
"""
# examples per operation and pass: ~15 operations x 2-3 passes x 12 = ~450 requests
EXAMPLES = 12
DEFINITION = {"every": "1h", "job": {"type": "report", "params": {"n": 1}}}
PATCH = {"job": {"params": {"n": 2}}}


def _schemathesis_run(base: str, seeded: dict[str, str]
                      ) -> tuple[Counter[int], list[str], Counter[str]]:
    """Every operation of the served OpenAPI document (a fixed seed: derandomized), in
    passes: positive data, negative data, and positive data aimed at what exists (the
    ``seeded`` schedules and run, a valid definition as the body of a create or revise, a
    merge patch of the seeded schedule's first revision). Each answer is checked: no 5xx;
    status, content type, headers and body as documented.
    Returns the statuses answered, the failures and the 2xx answers per operation."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_headers_conformance, response_schema_conformance]
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    answered: Counter[str] = Counter()
    positive, negative = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
    for result in schema.get_all_operations():
        operation = result.ok()
        token = "ops-token" if operation.path == "/metrics" else "acme-token"
        auth = {"Authorization": f"Bearer {token}"}
        aimed: dict[str, Any] = {}
        if "{schedule_id}" in operation.path:
            doomed = operation.method.upper() == "DELETE"
            aimed["path_parameters"] = {"schedule_id": seeded["doomed" if doomed else "schedule"]}
        if "{run_id}" in operation.path:
            aimed["path_parameters"] = {"run_id": seeded["run"]}
        if operation.path == "/v1/schedules" and operation.method.upper() == "POST":
            aimed["body"] = {"scheduleId": "made-by-schemathesis", **DEFINITION}
        if operation.method.upper() == "PUT":
            aimed["body"] = DEFINITION
        if operation.method.upper() == "PATCH":  # the seeded schedule's first revision
            aimed.update(body=PATCH, media_type="application/merge-patch+json",
                         headers={"If-Match": "1"})
        passes = [(positive, {}), (negative, {})] + ([(positive, aimed)] if aimed else [])
        for mode, fixed in passes:
            # run() reads this iteration's loop variables (noqa: B023): it is called at once
            @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode, **fixed))
            def run(case: schemathesis.Case) -> None:
                response = case.call(base_url=base, headers=auth, timeout=30)  # noqa: B023
                statuses[response.status_code] += 1
                if response.status_code < 300:
                    answered[operation.label] += 1  # noqa: B023 - run() runs right here
                try:
                    case.validate_response(response, checks=checks, headers=auth)  # noqa: B023
                except Exception as exc:  # noqa: BLE001 - collected, asserted below
                    failures.append(f"{operation.label} [{mode.value}]: {exc}"[:2000])  # noqa: B023

            try:
                run()
            except Unsatisfiable:  # no invalid input exists (an operation without input)
                assert mode is negative, operation.label
    return statuses, failures, answered


async def _seed(http: httpx.AsyncClient, cfg: LogConfig) -> dict[str, str]:
    """Two schedules (one for DELETE to remove), a manual run and a dead letter (a poison
    command of the tenant), visible in the read model."""
    auth = {"Authorization": "Bearer acme-token"}
    lg = open_log(cfg)
    await lg.start()
    try:
        await lg.append([OutRecord(cfg.topics.commands, b"acme/poisoned", b"\xff not JSON")])
    finally:
        await lg.close()
    for sid in ("seeded", "seeded-doomed"):
        r = await http.post("/v1/schedules", json={"scheduleId": sid, **DEFINITION},
                            headers={**auth, "Idempotency-Key": sid})
        assert r.status_code == 201, r.text
    r = await http.post("/v1/schedules/seeded/runs", headers={**auth, "Idempotency-Key": "k"})
    assert r.status_code == 201, r.text
    run = r.json()["runId"]
    g = await http.get(f"/v1/runs/{run}", headers=auth)  # visible: no token needed
    assert g.status_code == 200, g.text
    assert r.headers["x-chronolog-visible"] == "true"

    async def lettered() -> bool:
        d = await http.get("/v1/dlq", headers=auth)
        return d.status_code == 200 and any(i["scheduleId"] == "poisoned"
                                            for i in d.json()["items"])

    await wait_until(lettered, 30, what="the poison command listed in /v1/dlq")
    return {"schedule": "seeded", "doomed": "seeded-doomed", "run": run}


@pytest.mark.long(30)
async def test_schemathesis_finds_no_server_error_and_no_schema_mismatch(
    tmp_path: Path, dsn: str,
) -> None:
    cfg = LogConfig("sqlite", str(tmp_path / "log.db"), Topics(prefix="chronolog.", partitions=2))
    log_args = ["--log", f"sqlite://{cfg.target}", "--partitions", "2"]
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS_TOML)
    port = free_port()
    started = [
        _service(["processor", *log_args, "--tenants", str(tenants)],
                 tmp_path / "processor.log"),
        _service(["api", *log_args, "--database-url", dsn, "--port", str(port),
                  "--with-projector", "--tenants", str(tenants), "--reply-timeout", "5",
                  "--visible-timeout", "5"],
                 tmp_path / "api.log"),
    ]
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            await _healthy(http, started, tmp_path / "api.log")
            seeded = await _seed(http, cfg)
        statuses, failures, answered = await asyncio.to_thread(_schemathesis_run, base, seeded)
    finally:
        codes = [_stop(p) for p in reversed(started)]
    assert sum(statuses.values()) >= 200, statuses
    # not only refusals: schedules were created, read and triggered too
    assert statuses[200] + statuses[201] >= 20, statuses
    for listed in ("GET /v1/schedules", "GET /v1/runs", "GET /v1/dlq"):  # with their items
        assert answered[listed] > 0, answered
    assert answered["PATCH /v1/schedules/{schedule_id}"] > 0, answered  # a merge applied
    assert failures == [], "\n\n".join(failures[:10])
    assert codes == [0, 0], [(tmp_path / f).read_text()[-2000:]
                             for f in ("api.log", "processor.log")]


def test_a_bad_visible_timeout_is_a_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    r = subprocess.run([CHRONOLOG, "api", "--log", f"sqlite://{tmp_path / 'log.db'}",
                        "--visible-timeout", "soon"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 2, r.stderr
    assert "--visible-timeout: 'soon'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([CHRONOLOG, "dev", "--data-dir", str(tmp_path / "dev"), "--port",
                        str(free_port()), "--quiet"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env={**env, "CHRONOLOG_VISIBLE_TIMEOUT": "-1"})
    assert r.returncode == 2, r.stderr
    # dev has no flag for it: the line names the variable (checked before anything is made)
    assert r.stderr == "error: CHRONOLOG_VISIBLE_TIMEOUT: '-1': must be 0..60 seconds\n"
    assert not (tmp_path / "dev").exists()
