"""The backup and restore drill on Kafka: a real broker, a real PostgreSQL read model, an
in-process processor, projector and effect runner, the CLI as subprocesses.

A manual run finishes while its webhook destination is down, so its effect intent waits in
the outbox. ``chronolog backup`` copies the topics (records, headers, offsets, the groups'
committed offsets) and the read model; everything stops; ``chronolog restore`` writes them
under a new topic prefix and into a new database, renumbering the offsets the read model
and the consumer groups stored. Started there, the processor answers the same key with the
original run, the effect runner performs the pending effect once, and the projector goes on
from the translated offsets: it projects nothing twice (the run counters, which a repeated
event would double, are unchanged)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from chronolog.log.port import Topics
from chronolog.projections.projector import Projector
from chronolog.settings import LogConfig, open_log
from support.net import free_port
from support.polling import wait_until

from .conftest import started
from .effect_servers import HookServer
from .pgdb import create_database, drop_database, schema_store
from .test_effect_scenarios import SCHEDULE, TENANT, Stack, granted

pytestmark = pytest.mark.postgres

CHRONOLOG = Path(sys.executable).parent / "chronolog"
FAR = "2099-01-01T00:00:00Z"


@pytest.fixture
async def databases(database_url: str) -> AsyncIterator[tuple[str, str]]:
    src = await create_database(database_url, "kbackup_src")
    dst = await create_database(database_url, "kbackup_dst")
    yield src, dst
    await drop_database(database_url, src)
    await drop_database(database_url, dst)


async def _cli(prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CHRONOLOG_TOPIC_PREFIX=prefix)
    return await asyncio.to_thread(subprocess.run, [str(CHRONOLOG), *args],
                                   capture_output=True, text=True, timeout=180, env=env)


async def _effect_state(pool: Any, run_id: str) -> str | None:
    return await pool.fetchval("SELECT state FROM effects WHERE run_id = $1", run_id)


async def _counters(pool: Any) -> list[tuple[Any, ...]]:
    rows = await pool.fetch("SELECT metric, tenant, label, sum(value) FROM run_counters "
                            "WHERE metric <> 'ready' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
    return [tuple(r) for r in rows]


async def test_kafka_backup_restore_keeps_request_keys_outbox_and_offsets(
    kafka_bootstrap: str, databases: tuple[str, str], tmp_path: Path,
) -> None:
    src_db, dst_db = databases
    old = LogConfig("kafka", kafka_bootstrap, Topics(prefix=f"bk{uuid.uuid4().hex[:8]}.",
                                                     partitions=4))
    new_prefix = f"rs{uuid.uuid4().hex[:8]}."
    hook = await HookServer(dedup=False).start()
    down_port = free_port()  # nothing listens there: the old destination is down
    spec = {"at": FAR, "job": {"type": "invoice"}, "overlap": "allow",
            "effects": [{"kind": "webhook", "destination": "hook"}]}

    def tenants(port: int) -> Any:
        return granted(hook={"kind": "webhook", "url": f"http://127.0.0.1:{port}/hook",
                             "backoff": "20ms", "timeout": "2s", "allow_private": True})

    try:
        # ---- the old deployment: its destination is down
        async with started(open_log(old)) as lg:
            store = await schema_store(src_db, "public")
            projector = Projector(lg, store, idle_ms=20)
            projecting = asyncio.create_task(projector.run())
            try:
                async with Stack(lg) as s:
                    await s.client.create_schedule(TENANT, SCHEDULE, spec)
                    run_id = await s.new_run("invoice-57")
                    claim = await s.client.claim(TENANT, SCHEDULE, run_id, 1, "worker-A")
                    await s.complete(run_id, 1, claim["fence"], "worker-A", {"invoice": 57})
                    fx, task = await s.runner("fx1", tenants=tenants(down_port))
                    await wait_until(lambda: _effect_state(store.pool, run_id), 30,
                                     what="the effect intent projected")
                    assert await _effect_state(store.pool, run_id) == "INTENDED"
                    b = await _cli(old.topics.prefix, "backup", str(tmp_path / "bk"),
                                   "--log", f"kafka://{kafka_bootstrap}", "--partitions", "4",
                                   "--database-url", src_db,
                                   "--results", str(tmp_path / "none"))
                    assert b.returncode == 0, b.stderr
                    await s.stop(fx, task)
                counters_before = await _counters(store.pool)
            finally:
                projector.stop()
                await asyncio.wait_for(projecting, 30)
                await store.close()

        # ---- restore: refused into the old (non-empty) topics, done into new ones
        refused = await _cli(old.topics.prefix, "restore", str(tmp_path / "bk"), "--log",
                             f"kafka://{kafka_bootstrap}", "--database-url", dst_db)
        assert refused.returncode == 2 and "not empty (topic " in refused.stderr, refused.stderr
        # what to do after an interrupted Kafka restore, whose appended records stay
        assert "restore into a fresh CHRONOLOG_TOPIC_PREFIX" in refused.stderr
        r = await _cli(new_prefix, "restore", str(tmp_path / "bk"), "--log",
                       f"kafka://{kafka_bootstrap}", "--database-url", dst_db)
        assert r.returncode == 0, r.stderr

        # ---- the restored deployment, its destination up
        new = LogConfig("kafka", kafka_bootstrap, Topics(prefix=new_prefix, partitions=4))
        async with started(open_log(new)) as lg:
            # the groups' offsets came along, renumbered: the processors had consumed every
            # command, the effect runner stopped before the pending intent
            manifest = orjson.loads((tmp_path / "bk" / "manifest.json").read_bytes())
            assert {f"{old.topics.prefix}processors", f"{old.topics.prefix}effects"} <= set(
                manifest["log"]["groups"])
            ends = [await lg.end_offset(lg.topics.commands, p) for p in range(4)]
            assert sum(ends) >= 3  # create, trigger, claim, complete (and the outcome)
            for p, end in enumerate(ends):
                done = await lg.committed(f"{new_prefix}processors", lg.topics.commands, p)
                assert (done or 0) == end, (p, done, end)
            store = await schema_store(dst_db, "public")
            projector = Projector(lg, store, idle_ms=20)
            projecting = asyncio.create_task(projector.run())
            try:
                async with Stack(lg) as s:
                    again = await s.new_run("invoice-57")
                    assert again == run_id  # the request key survived
                    fx, task = await s.runner("fx2", tenants=tenants(hook.port))

                    async def performed() -> bool:
                        return await _effect_state(store.pool, run_id) == "SUCCEEDED"

                    await wait_until(performed, 30, what="the pending effect performed")
                    await s.stop(fx, task)
                # nothing projected twice: the counters are those of the old read model plus
                # the effect's success
                expected = sorted([*counters_before,
                                   ("effect", TENANT, "succeeded", 1)])
                await wait_until(lambda: _same(store.pool, expected), 30,
                                 what="counters")
            finally:
                projector.stop()
                await asyncio.wait_for(projecting, 30)
                await store.close()
        assert hook.keys_seen.count(f"webhook-{run_id}") == 1
    finally:
        await hook.close()


async def _same(pool: Any, expected: list[tuple[Any, ...]]) -> bool:
    return await _counters(pool) == expected

