"""Tracing across real processes: docs/tracing.md's worked example, run as written.

``chronolog processor``, ``worker`` (the doc's ``traced_jobs.py``), ``effects`` and ``api
--with-projector`` run as separate processes on one embedded log, configured only by the
doc's environment, with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at an OTLP/HTTP receiver
in this test (``otlp_collector.Collector``) and the tenant's webhook destination at a
server in this test too. The doc's ``curl`` lines create a schedule and trigger a run from
a request that carries a ``traceparent``. Checked: the spans every process exported for
that run are one trace — the run's trace ID, derived from its run ID — with the parent of
each as docs/tracing.md's table says (the handler's own span under the handler span); the
API request and its decision are in the caller's trace, linked both ways to the run's; the
webhook carried a ``traceparent`` of the effect span; and the API's and the CLI's
``traceId`` are that trace's. With no ``OTEL_*`` variable, or with ``OTEL_SDK_DISABLED=true``
beside an endpoint, nothing is exported and no ``traceparent`` reaches the log or a webhook.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chronolog.log.port import Topics
from chronolog.log.reading import read_partition
from chronolog.settings import LogConfig, open_log
from chronolog.telemetry.ids import run_trace_ids
from support.docs import fenced_blocks, sh_block, sh_commands
from support.logs import started
from support.net import free_port
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT
from .otlp_collector import Collector, Hooks, Span
from .pgdb import create_database, drop_database

pytestmark = pytest.mark.postgres

DOC = ROOT / "docs" / "tracing.md"
SECTION = "## Worked example"
DOC_PORT = "8080"
DOC_HOOK = "http://127.0.0.1:9000/hooks"
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
AUTH = {"Authorization": "Bearer s3cret"}


@pytest.fixture
def dsn(database_url: str) -> Iterator[str]:
    d = asyncio.run(create_database(database_url, "test_tracing"))
    yield d
    asyncio.run(drop_database(database_url, d))


def doc_env() -> dict[str, str]:
    """The variables the example's ``export`` lines set."""
    env: dict[str, str] = {}
    for line in sh_block(DOC, SECTION).splitlines():
        if line.startswith("export "):
            for word in shlex.split(line[len("export "):], comments=True):
                name, _, value = word.partition("=")
                env[name] = value
    return env


class Node:
    """The example's four processes, started in ``cwd`` with ``env``."""

    def __init__(self, cwd: Path, env: dict[str, str], dsn: str, hook_url: str) -> None:
        self.cwd = cwd
        self.port = free_port()
        (cwd / "traced_jobs.py").write_text(fenced_blocks(DOC, "## Your own spans", "python")[0])
        (cwd / "tenants.toml").write_text(
            fenced_blocks(DOC, SECTION, "toml")[0].replace(DOC_HOOK, hook_url))
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("CHRONOLOG_", "OTEL_"))}
        self.env = {**base, **env}
        self.procs: list[subprocess.Popen[bytes]] = []
        for words in sh_commands(DOC, SECTION, prefix=".venv/bin/chronolog "):
            args = [CHRONOLOG, *words[1:]]
            if words[1] == "api":
                args[args.index("--port") + 1] = str(self.port)
                args += ["--database-url", dsn]
            self.procs.append(subprocess.Popen(
                args, cwd=cwd, env=self.env, stdout=subprocess.DEVNULL,
                stderr=open(cwd / f"{words[1]}.log", "wb")))

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}"
                         for f in sorted(self.cwd.glob("*.log")))

    async def ready(self, http: httpx.AsyncClient) -> None:
        """The API answers and the processor decides: a probe schedule is created."""
        async def probe() -> bool:
            for p in self.procs:
                assert p.poll() is None, self.logs()
            try:
                r = await http.post("/v1/schedules", headers={**AUTH, "Idempotency-Key": "p"},
                                    json={"scheduleId": "probe", "cron": "0 3 1 1 *",
                                          "job": {"type": "invoice"}})
            except httpx.TransportError:
                return False
            return r.status_code == 201

        await wait_until(probe, 90, interval=0.3, what="the example's node to decide")

    def run_block(self) -> list[dict[str, Any]]:
        """The example's curl lines, against this node: the JSON documents they print."""
        script = sh_block(DOC, SECTION, after=1).replace(f"127.0.0.1:{DOC_PORT}",
                                                          f"127.0.0.1:{self.port}")
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=self.cwd,
                             env=self.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        docs, text, dec = [], out.stdout.strip(), json.JSONDecoder()
        while text:
            doc, end = dec.raw_decode(text)
            docs.append(doc)
            text = text[end:].strip()
        return docs

    def stop(self) -> list[int | None]:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            codes.append(p.returncode)
        return codes


async def run_to_the_end(node: Node, http: httpx.AsyncClient, hooks: Hooks
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the example's requests; the trigger's answer and the run's document once its
    handler succeeded and its webhook was delivered."""
    await node.ready(http)
    created, triggered = node.run_block()
    assert created["scheduleId"] == "invoices", created
    run_id = triggered["runId"]

    seen: list[Any] = [None]

    async def finished() -> dict[str, Any] | None:
        r = await http.get(f"/v1/runs/{run_id}", headers=AUTH)
        doc = seen[0] = r.json()
        done = (r.status_code == 200 and doc["state"] == "SUCCEEDED" and doc["effects"]
                and doc["effects"][0]["state"] == "SUCCEEDED")
        return doc if done else None

    try:
        doc = await wait_until(finished, 90, interval=0.3, what="the run and its webhook done")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {seen[0]}\n{node.logs()}") from None
    return triggered, doc


def delivered(hooks: Hooks, run_id: str) -> dict[str, str]:
    """The headers of the one webhook delivery of the run's effect."""
    [delivery] = [d for d in hooks.snapshot() if d["webhook-id"] == f"webhook-{run_id}"]
    return delivery


def by_name(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


async def test_the_spans_of_one_run_join_into_one_trace_across_processes(
        tmp_path: Path, dsn: str) -> None:
    with Collector() as collector, Hooks() as hooks:
        env = {**doc_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint}
        assert set(doc_env()) >= {"OTEL_EXPORTER_OTLP_ENDPOINT", "CHRONOLOG_DATA_DIR"}
        node = Node(tmp_path, env, dsn, hooks.url)
        try:
            async with httpx.AsyncClient(base_url=node.api, timeout=30) as http:
                triggered, doc = await run_to_the_end(node, http, hooks)
                run_id = doc["runId"]
                page = (await http.get("/v1/runs", headers=AUTH)).json()
            cli = subprocess.run([CHRONOLOG, "run", run_id, "--url", node.api, "--token",
                                  "s3cret"], capture_output=True, text=True, env=node.env,
                                 timeout=60)
        finally:
            codes = node.stop()  # each flushes its spans as it stops
        assert codes == [0, 0, 0, 0], node.logs()

        trace_int, root_int = run_trace_ids(run_id)
        trace_id, root_id = f"{trace_int:032x}", f"{root_int:016x}"
        # the run's trace ID, as the API, its lists and the CLI show it
        assert doc["traceId"] == triggered["traceId"] == trace_id
        assert [i["traceId"] for i in page["items"] if i["runId"] == run_id] == [trace_id]
        assert cli.returncode == 0 and trace_id in cli.stdout, cli.stdout + cli.stderr

        def exported() -> list[Span] | None:
            spans = collector.snapshot()
            names = {s.name for s in spans if s.trace_id == trace_id}
            return spans if {"chronolog.decide RecordEffectOutcome",
                             "render-invoice"} <= names else None

        spans = await wait_until(exported, 30, what="the run's spans at the collector")

    run = [s for s in spans if s.trace_id == trace_id]
    occurrence = by_name(run, "chronolog.occurrence")
    claim = by_name(run, "chronolog.claim")
    attempt = by_name(run, "chronolog.attempt")
    handler = by_name(run, "chronolog.handler invoice")
    own = by_name(run, "render-invoice")
    completed = by_name(run, "chronolog.decide CompleteRun")
    effect = by_name(run, "chronolog.effect webhook")
    recorded = by_name(run, "chronolog.decide RecordEffectOutcome")
    # one tree, rooted at the span the run ID names, made by four processes
    assert (occurrence.span_id, occurrence.parent) == (root_id, "")
    assert claim.parent == attempt.parent == effect.parent == root_id
    assert handler.parent == attempt.span_id and own.parent == handler.span_id
    assert completed.parent == attempt.span_id and recorded.parent == effect.span_id
    assert {s.service for s in (occurrence, attempt, own, effect)} == {
        "chronolog-processor", "chronolog-worker", "chronolog-effects"}
    assert attempt.attributes["chronolog.outcome"] == "CompleteRun" and not attempt.error
    assert own.attributes["billing.customer"] == "c-42"
    assert effect.attributes["chronolog.outcome"] == "succeeded"
    assert all(s.attributes.get("chronolog.run_id") == run_id
               for s in (occurrence, claim, attempt, effect))

    # the request and its decision: the caller's trace, linked both ways to the run's
    request = by_name([s for s in spans if s.trace_id == CALLER_TRACE],
                      "POST /v1/schedules/{schedule_id}/runs")
    decision = by_name([s for s in spans if s.trace_id == CALLER_TRACE],
                       "chronolog.decide TriggerRun")
    assert request.parent == CALLER_SPAN and request.service == "chronolog-api"
    assert request.attributes["http.response.status_code"] == 201
    assert decision.parent == request.span_id and decision.service == "chronolog-processor"
    assert (trace_id, root_id) in decision.links
    assert occurrence.links == ((CALLER_TRACE, decision.span_id),)

    # the webhook reached its destination inside the run's trace, under the effect span
    delivery = delivered(hooks, run_id)
    assert delivery["traceparent"] == f"00-{trace_id}-{effect.span_id}-01"
    assert delivery["webhook-id"] == delivery["idempotency-key"]


@pytest.mark.parametrize("otel", [{}, {"OTEL_SDK_DISABLED": "true"}],
                         ids=["no-otel-variables", "sdk-disabled"])
async def test_with_tracing_off_nothing_is_exported_and_no_traceparent_is_sent(
        tmp_path: Path, dsn: str, otel: dict[str, str]) -> None:
    with Collector() as collector, Hooks() as hooks:
        env = {k: v for k, v in doc_env().items() if not k.startswith("OTEL_")}
        if otel:  # an endpoint that would be used, were the SDK not disabled
            env.update(otel, OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint)
        node = Node(tmp_path, env, dsn, hooks.url)
        try:
            async with httpx.AsyncClient(base_url=node.api, timeout=30) as http:
                triggered, doc = await run_to_the_end(node, http, hooks)
        finally:
            codes = node.stop()
        assert codes == [0, 0, 0, 0], node.logs()
        assert doc["traceId"] == triggered["traceId"]  # shown whether tracing is on or not
        delivery = delivered(hooks, doc["runId"])
        assert "traceparent" not in delivery and "tracestate" not in delivery
        assert collector.requests == 0 and collector.snapshot() == []

    # the commands on the log: the API's, the worker's and the effect runner's
    topics = Topics(partitions=int(env["CHRONOLOG_PARTITIONS"]))
    cfg = LogConfig("sqlite", str(tmp_path / env["CHRONOLOG_DATA_DIR"] / "log.db"), topics)
    headers: list[str] = []
    count = 0
    async with started(open_log(cfg)) as lg:
        for p in range(topics.partitions):
            async for batch in read_partition(lg, topics.commands, p):
                count += len(batch)
                headers += [name for rec in batch for name, _ in rec.headers]
    assert count >= 4  # create, trigger, complete, the effect's outcome (and offers)
    assert "traceparent" not in headers and "tracestate" not in headers
