"""A running node fed poison records keeps serving, on both logs.

The node is ``chronolog dev``'s (``run_node``: processor, projector, workers, effect runner,
HTTP API on loopback, each under the supervisor) on a real log and a real PostgreSQL, with
two tenants. Poison is written into the log directly, as a careless client or a
misconfigured effect would:

* commands: bytes that are not JSON; a CreateSchedule whose ``jitter`` is 1e300 (the decider
  cannot add it to a date); a CreateSchedule whose params hold "\\u0000" (PostgreSQL's jsonb
  refuses the character);
* events: bytes that are not JSON, and the record a ``kafka`` effect pointed at the events
  topic would write (JSON, not an event);
* ready hints and replies: bytes that are not JSON (the reply with a key that is not UTF-8).

Each one is dead-lettered by the consumer that met it and listed by ``chronolog dlq list``
(and counted in the metrics) while the other tenant's schedule keeps being created, fired and
projected, and no part of the node had to be restarted.

A part that really fails (its database table is gone) is restarted with bounded backoff, and
goes on once the table is back, while the other parts keep running.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from chronolog.devnode.node import DevNode, run_node
from chronolog.devnode.supervisor import Supervisor
from chronolog.domain import codec
from chronolog.log.dead_letters import read_dead_letters
from chronolog.log.port import OutRecord
from chronolog.projections.store import PostgresProjectionStore
from chronolog.queries.metrics import MetricsSource, render
from chronolog.settings import LogConfig
from chronolog.tenants import Tenant, Tenants
from support.net import free_port
from support.polling import wait_until

from .conftest import CHRONOLOG, ROOT, log_url
from .pgdb import schema_store

pytestmark = pytest.mark.postgres

TENANTS = Tenants({
    "careless": Tenant("careless", ("careless-token",), None, 100),
    "steady": Tenant("steady", ("steady-token",), None, 100),
})
CARELESS = {"Authorization": "Bearer careless-token"}
STEADY = {"Authorization": "Bearer steady-token"}
EVERY_SECOND = {"every": "1s", "job": {"type": "echo", "params": {"n": 1}}, "overlap": "allow"}


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[PostgresProjectionStore]:
    s = await schema_store(database_url, max_size=8)
    yield s
    await s.close()


class Node:
    """``run_node`` in a task, with its supervisor and an HTTP client on its API."""

    def __init__(self, lg: Any, store: PostgresProjectionStore, data_dir: Path,
                 **options: Any) -> None:
        self.options = options  # more of run_node's options
        self.port = free_port()
        self.node = DevNode(data_dir, self.port, "127.0.0.1")
        self.said: list[str] = []
        self.sup = Supervisor(initial_backoff=0.2, max_backoff=1.0, say=self.said.append)
        self.stop = asyncio.Event()
        self.lg, self.store = lg, store
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Node:
        self.task = asyncio.create_task(run_node(self.node, self.lg, self.store, TENANTS,
                                                 self.stop, supervisor=self.sup,
                                                 **self.options))

        async def healthy() -> bool:
            if self.task is not None and self.task.done():
                self.task.result()
            try:
                return (await self.http.get("/healthz")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(healthy, 60, what="a healthy API")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 90)

    async def create(self, headers: dict[str, str], schedule_id: str,
                     spec: dict[str, Any]) -> httpx.Response:
        return await self.http.post("/v1/schedules", headers=headers,
                                    json={"scheduleId": schedule_id, **spec})

    async def succeeded(self, schedule_id: str) -> int:
        r = await self.http.get(f"/v1/schedules/{schedule_id}/runs", headers=STEADY,
                                params={"state": "SUCCEEDED", "limit": 100})
        return len(r.json()["items"]) if r.status_code == 200 else -1


def _raw_create(command_id: str, tenant: str, schedule_id: str, spec: dict[str, Any]) -> bytes:
    """A CreateSchedule as a client that bypasses the API would write it."""
    return json.dumps({"command_id": command_id, "type": "CreateSchedule", "tenant": tenant,
                       "principal": "careless", "schedule_id": schedule_id,
                       "issued_at": "2026-01-01T00:00:00Z",
                       "payload": {"type": "CreateSchedule", "spec": spec}}).encode()


async def _reply(lg: Any, command_id: str) -> Any:
    for p in range(lg.topics.partitions):
        end = await lg.end_offset(lg.topics.replies, p)
        for rec in await lg.read(lg.topics.replies, p, 0, max(1, end)):
            if rec.key == command_id.encode():
                return codec.decode_reply(rec.value)
    return None


async def test_every_poison_record_is_dead_lettered_and_the_other_tenant_keeps_being_served(
    event_log: Any, log_config: LogConfig, store: PostgresProjectionStore, tmp_path: Path,
) -> None:
    t = event_log.topics
    async with Node(event_log, store, tmp_path) as node:
        r = await node.create(STEADY, "steady", EVERY_SECOND)
        assert r.status_code == 201, r.text
        await wait_until(lambda: _at_least(node.succeeded("steady"), 2), 60,
                         what="the steady tenant's first runs")

        # ---- the poison, written into the log directly
        cmd = await event_log.append([
            OutRecord(t.commands, b"careless/garbage", b"\xff\x00 not a command"),
            OutRecord(t.commands, b"careless/jitter", _raw_create(
                "c-jitter", "careless", "jitter", {**EVERY_SECOND, "jitter": 1e300})),
            OutRecord(t.commands, b"careless/nul", _raw_create(
                "c-nul", "careless", "nul", {**EVERY_SECOND, "job": {
                    "type": "echo", "params": {"text": "a\u0000b"}}})),
        ])
        ev = await event_log.append([
            OutRecord(t.events, b"careless/x", b"\x00\x01 not an event", partition=0),
            OutRecord(t.events, b"effect-1", orjson.dumps({  # a kafka effect aimed at events
                "effect_id": "effect-1", "run_id": "r-1", "attempt": 1, "checksum": "00",
                "result": {"n": 1}}), partition=0),
        ])
        ready = await event_log.append([OutRecord(t.ready("default"), b"r-x", b"{not a hint")])
        reply = await event_log.append([OutRecord(t.replies, b"\xff\xfe", b"\xfe not a reply",
                                                  partition=0)])

        # ---- each is dead-lettered by the consumer that met it
        expected = {
            ("processor", t.commands, cmd[0].partition, cmd[0].offset),
            ("processor", t.commands, cmd[1].partition, cmd[1].offset),
            ("projector", t.events, 0, ev[0].offset), ("projector", t.events, 0, ev[1].offset),
            ("effects", t.events, 0, ev[0].offset), ("effects", t.events, 0, ev[1].offset),
            ("worker", t.ready("default"), ready[0].partition, ready[0].offset),
        }

        async def lettered() -> set[tuple[str, str, int, int]] | None:
            got = {(d.consumer, d.source_topic, d.source_partition, d.source_offset)
                   for d in await read_dead_letters(event_log)}
            replies = {x for x in got if x[0].startswith("client:") and x[1] == t.replies
                       and x[2:] == (0, reply[0].offset)}
            return got if expected <= got and replies else None

        await wait_until(lettered, 60, what="every poison record dead-lettered")

        # the commands were answered: the jitter one rejected, naming the problem
        jitter = await wait_until(lambda: _reply(event_log, "c-jitter"), 30, what="a reply")
        assert jitter.status == "invalid"
        assert "jitter" in jitter.reason or "OverflowError" in jitter.reason
        nul = await wait_until(lambda: _reply(event_log, "c-nul"), 30, what="a reply")
        if nul.status == "ok":  # accepted: projected, the NUL kept as U+FFFD
            async def shown() -> str | None:
                r = await node.http.get("/v1/schedules/nul", headers=CARELESS)
                return r.text if r.status_code == 200 else None
            text = await wait_until(shown, 30, what="the schedule with a NUL projected")
            assert "\ufffd" in json.dumps(json.loads(text), ensure_ascii=False)
        else:  # refused up front by input limits
            assert nul.status == "invalid" and "params" in nul.reason

        # ---- the other tenant is still served: created, fired, projected
        before = await node.succeeded("steady")
        r = await node.create(STEADY, "after", EVERY_SECOND)
        assert r.status_code == 201, r.text
        await wait_until(lambda: _at_least(node.succeeded("steady"), before + 3), 60,
                         what="the steady schedule firing after the poison")
        r = await node.http.get("/v1/schedules/after", headers=STEADY)
        assert r.status_code == 200, r.text

        # nothing had to be restarted; the metrics count the letters
        assert node.sup.restarts == dict.fromkeys(node.sup.restarts, 0), node.said
        snap = await MetricsSource(store.pool, event_log).snapshot()
        assert snap.dead_letters[("projector", t.events)] == 2
        assert snap.dead_letters[("processor", t.commands)] >= 2
        text = render(snap).decode()
        assert f'chronolog_dead_letters_total{{consumer="effects",topic="{t.events}"}} 2.0' in text
        assert f'chronolog_dead_letters_total{{consumer="client",topic="{t.replies}"}}' in text

    # ---- chronolog dlq list shows them (JSON and table), on this log
    flags = ["--log", log_url(log_config), "--topic-prefix", t.prefix, "--partitions",
             str(t.partitions)]
    env = {**os.environ, "CHRONOLOG_LOG": ""}
    listed = subprocess.run([CHRONOLOG, "dlq", "list", "--json", *flags], capture_output=True,
                            text=True, timeout=120, cwd=ROOT, env=env)
    assert listed.returncode == 0, listed.stderr
    items = json.loads(listed.stdout)
    got = {(i["consumer"], i["source_topic"], i["source_partition"], i["source_offset"])
           for i in items}
    assert expected <= got
    jitter_letter = next(i for i in items if i["command_id"] == "c-jitter")
    assert jitter_letter["error_class"] in ("OverflowError", "DecodeError")
    table = subprocess.run([CHRONOLOG, "dlq", "list", "--consumer", "projector", *flags],
                           capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert table.returncode == 0, table.stderr
    assert f"projector  {t.events}[0]@{ev[1].offset}" in table.stdout
    assert "processor" not in table.stdout
    bad = subprocess.run([CHRONOLOG, "dlq", "list", "--limit", "x", *flags],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert bad.returncode == 2 and "--limit" in bad.stderr


async def _at_least(count: Any, n: int) -> bool:
    return (await count) >= n


async def test_a_failing_part_is_restarted_with_bounded_backoff_and_goes_on(
    event_log: Any, store: PostgresProjectionStore, tmp_path: Path,
) -> None:
    async with Node(event_log, store, tmp_path) as node:
        r = await node.create(STEADY, "steady", EVERY_SECOND)
        assert r.status_code == 201, r.text
        await wait_until(lambda: _at_least(node.succeeded("steady"), 1), 60, what="a run")
        # the projector's table disappears: every write of the projector fails, for real
        await store.pool.execute("ALTER TABLE projection_offsets RENAME TO offsets_away")
        await wait_until(lambda: node.sup.restarts["projector"] >= 4, 60,
                         what="the projector restarted again and again")
        await store.pool.execute("ALTER TABLE offsets_away RENAME TO projection_offsets")
        before = await node.succeeded("steady")
        await wait_until(lambda: _at_least(node.succeeded("steady"), before + 2), 60,
                         what="the projector going on after its restarts")
        delays = [n.delay_s for n in node.sup.notices if n.part == "projector"]
        assert delays[:4] == [0.2, 0.4, 0.8, 1.0]  # doubling, bounded by max_backoff
        assert all(d <= 1.0 for d in delays)
        assert any("projector failed" in line and "restarting it in" in line
                   for line in node.said)
        others = {p: n for p, n in node.sup.restarts.items() if p != "projector"}
        assert others == dict.fromkeys(others, 0), node.said
