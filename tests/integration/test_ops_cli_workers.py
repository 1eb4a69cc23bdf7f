"""Jobs find their worker, through the user CLI with real services (``chronolog
processor``, ``projector``, ``worker`` processes) on both logs: ``schedule create`` warns on
stderr (exit 0) about a job type no worker of its class has served, ``runs`` and ``run`` say
why a READY run waits, and ``workers list`` shows the workers, live or not, in text and JSON.
On the embedded log the CLI has direct access (``--log``); on Kafka it goes through a
``chronolog api`` process (``--url``, ``--token``), whose warnings and documents it prints.
"""

from __future__ import annotations

import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from support.net import free_port
from support.polling import SPAWN_POLL, wait_until

from .test_ops_cli import (  # noqa: F401 - dsn: a fixture
    PARTITIONS,
    Cli,
    Services,
    _env,
    dsn,
)

pytestmark = pytest.mark.postgres

GREET_JOBS = str(Path(__file__).parents[1] / "support" / "greet_jobs.py")
WAITING = "no worker serves job type 'greet' in class 'default'"
WARNING = ("warning: no worker of resource class 'default' has ever served job type 'greet': "
           "its runs will wait READY until one does")


async def _waiting_then_served(cli: Cli, services: Services, worker_args: list[str]) -> None:
    # the warning is read from the read model's workers table: wait until the projector has
    # made it and folded the built-in worker (a create answered before that says nothing,
    # which is the CLI's best effort, not what this test is about)
    await cli.poll("the built-in worker listed", "workers", "list", timeout=90,
                   until=lambda d: [w["workerId"] for w in d["items"]] == ["w-builtin"])
    now = datetime.now(UTC).isoformat()

    async def created() -> Any:
        services.check_alive()
        r = await cli("schedule", "create", "greeter", "--at", now, "--job", "greet",
                      "--idempotency-key", "g-1", "--timeout", "5")
        return r if r.rc == 0 else None

    r = await wait_until(created, 90, interval=SPAWN_POLL, what="create answered")
    assert r.err.strip().splitlines()[-1] == WARNING
    assert r.out.startswith("created schedule greeter (revision 1)")

    page = await cli.poll("a READY run that waits", "runs", "greeter",
                          until=lambda d: d["items"] and d["items"][0]["waiting"])
    item = page["items"][0]
    assert item["state"] == "READY" and item["waiting"] == WAITING
    text = await cli("runs", "greeter")
    assert text.rc == 0 and "waiting" in text.out and WAITING in text.out
    run = await cli.ok("run", item["runId"])
    assert run["waiting"] == WAITING
    assert WAITING in (await cli("run", item["runId"])).out

    listed = await cli.poll("the built-in worker listed", "workers", "list",
                            until=lambda d: [w["workerId"] for w in d["items"]] == ["w-builtin"])
    (builtin,) = listed["items"]
    assert builtin["live"] and builtin["classes"] == [
        {"resourceClass": "default", "jobTypes": ["echo", "fail", "noop", "sleep"], "slots": 4}]
    text = await cli("workers", "list")
    assert text.rc == 0 and "w-builtin" in text.out and "echo,fail,noop,sleep" in text.out

    services.start("w-greet", ["worker", *worker_args, "--worker-id", "w-greet",
                               "--jobs", GREET_JOBS])
    done = await cli.poll("the waiting run served", "run", item["runId"],
                          until=lambda d: d["state"] == "SUCCEEDED", timeout=60)
    assert done["waiting"] is None and done["attempts"][0]["workerId"] == "w-greet"
    assert done["result"]["inline"]["greeting"] == "hello you"
    now = datetime.now(UTC).isoformat()  # a one-shot more than its grace in the past is refused
    again = await cli("schedule", "create", "greeter-2", "--at", now, "--job", "greet", "--json")
    assert again.rc == 0 and "warning:" not in again.err and "warnings" not in again.json()

    greeter = services.procs.pop("w-greet")  # stopped here, by its PID
    greeter.send_signal(signal.SIGTERM)
    assert greeter.wait(30) == 0
    gone = await cli.poll("w-greet not live", "workers", "list", "--not-live",
                          until=lambda d: [w["workerId"] for w in d["items"]] == ["w-greet"])
    assert gone["items"][0]["stopped"] is True
    live = await cli.ok("workers", "list", "--live")
    assert [w["workerId"] for w in live["items"]] == ["w-builtin"]


async def _run(tmp_path: Path, dsn: str, log_args: list[str],  # noqa: F811
               http: bool = False) -> None:
    env = _env()
    services = Services(tmp_path, env)
    results = ["--results", str(tmp_path / "results")]
    services.start("processor", ["processor", *log_args])
    services.start("projector", ["projector", *log_args, "--database-url", dsn])
    services.start("worker", ["worker", *log_args, "--builtin-jobs", "--worker-id",
                              "w-builtin", *results])
    if http:
        port = free_port()
        services.start("api", ["api", *log_args, "--database-url", dsn, "--port", str(port)])
    try:
        cli = Cli(["--url", f"http://127.0.0.1:{port}", "--token", "dev"] if http else
                  [*log_args, "--database-url", dsn], env, services)
        await _waiting_then_served(cli, services, [*log_args, *results])
    finally:
        codes = services.stop_all()
    assert set(codes.values()) == {0}, services.failed(codes)


async def test_the_cli_warns_says_why_a_run_waits_and_lists_workers_on_the_embedded_log(
    tmp_path: Path, dsn: str  # noqa: F811
) -> None:
    await _run(tmp_path, dsn, ["--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions",
                               PARTITIONS, "--topic-prefix", f"t{uuid.uuid4().hex[:8]}."])


@pytest.mark.long(30)
@pytest.mark.kafka
async def test_the_cli_warns_says_why_a_run_waits_and_lists_workers_through_the_api_on_kafka(
    tmp_path: Path, dsn: str, kafka_bootstrap: str  # noqa: F811
) -> None:
    await _run(tmp_path, dsn, ["--log", f"kafka://{kafka_bootstrap}", "--partitions",
                               PARTITIONS, "--topic-prefix", f"t{uuid.uuid4().hex[:10]}."],
               http=True)
