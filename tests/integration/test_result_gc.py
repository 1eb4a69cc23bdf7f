"""``chronolog gc`` racing completing workers: a referenced object is never removed.

Two workers complete runs whose results are staged (> 8 KiB) while gc runs back to back with
a zero grace period. Each run's first attempt also stages a decoy (a stale upload) and fails,
so gc has real garbage to remove at the same time. Every published uri must exist and verify
at the end; every decoy must be gone after a final pass.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import orjson

from chronolog.settings import LogConfig
from chronolog.workers import FilesystemResultStore, JobContext, Worker
from chronolog.workers.gc import collect
from support.polling import wait_until
from support.processors import Running, events
from support.workers import FAR

from .conftest import CHRONOLOG, log_url

RUNS = 30


async def _settled(a: frozenset[int], b: frozenset[int], every: frozenset[int]) -> bool:
    return bool(a) and bool(b) and not a & b and a | b == every


async def test_gc_racing_completions_never_removes_a_referenced_object(
    event_log: Any, tmp_path: Path
) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    decoys: list[str] = []

    async def staged_twice(ctx: JobContext) -> dict[str, Any]:
        if ctx.attempt == 1:  # a stale upload, then a transient failure
            decoys.append(await store.put(ctx.run_id, ctx.attempt, ctx.fence, b"d" * 9000))
            raise RuntimeError("first attempt fails after staging")
        return {"run_id": ctx.run_id, "pad": "p" * 9000}

    def worker(wid: str) -> Worker:
        w = Worker(event_log, worker_id=wid, result_store=store, reply_timeout=5)
        w.register("staged", staged_twice)
        return w

    passes = 0
    deleted: set[str] = set()
    done = asyncio.Event()

    async def gc_loop() -> None:
        nonlocal passes
        while not done.is_set():
            report = await collect(event_log, store, grace_s=0)
            deleted.update(report.deleted)
            passes += 1
            await asyncio.sleep(0)

    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s", {
            "at": FAR, "job": {"type": "staged"}, "overlap": "allow",
            "retry": {"max_attempts": 3, "initial_backoff": 0.01, "max_backoff": 0.02}})
        w1, w2 = worker("w1"), worker("w2")
        tasks = [asyncio.create_task(w.run()) for w in (w1, w2)]
        await w1.wait_started()
        await w2.wait_started()
        # the group has settled: each partition is consumed by one worker, and the one that
        # lost it has withdrawn its offer there (an assignment made to a worker in the middle
        # of a rebalance waits for its lease to expire: docs/design.md §5)
        every = frozenset(range(event_log.topics.partitions))
        await wait_until(lambda: _settled(w1.partitions(), w2.partitions(), every), 30,
                         what="the worker group settled")
        gc = asyncio.create_task(gc_loop())
        await asyncio.gather(*(r.client.trigger("acme", "s", f"k{i}") for i in range(RUNS)))

        async def all_published() -> list[Any] | None:
            pubs = [e.payload for e in await events(event_log) if e.type == "ResultPublished"]
            return pubs if len(pubs) == RUNS else None

        pubs = await wait_until(all_published, 60, what=f"{RUNS} results")
        done.set()
        await gc
        for w in (w1, w2):
            w.stop()
        await asyncio.gather(*tasks)
    assert passes >= 5, passes
    for p in pubs:
        assert p.uri is not None and p.uri not in deleted
        assert orjson.loads(await store.get(p.uri, p.checksum))["run_id"] == p.run_id
    final = await collect(event_log, store, grace_s=0)
    deleted.update(final.deleted)
    assert set(decoys) == deleted and len(decoys) == RUNS
    assert {o.uri for o in await store.list()} == {p.uri for p in pubs}


def test_gc_cli_reports_and_respects_the_grace(log_config: LogConfig, tmp_path: Path) -> None:
    results = tmp_path / "results"
    store = FilesystemResultStore(results)
    asyncio.run(store.put("r_unknown", 1, 1, b"u" * 9000))  # the log has never heard of it
    args = [CHRONOLOG, "gc", "--log", log_url(log_config), "--topic-prefix",
            log_config.topics.prefix, "--partitions", str(log_config.topics.partitions),
            "--results", str(results), "--json"]
    if log_config.kind == "sqlite":
        subprocess.run([CHRONOLOG, "gc", "--log", log_url(log_config), "--results",
                        str(results), "--grace", "0s", "--dry-run"], check=False)
    out = subprocess.run(args + ["--grace", "0s"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = orjson.loads(out.stdout)
    assert report["scanned"] == 1 and report["deleted"] == 0 and report["kept_open"] == 1
    bad = subprocess.run(args + ["--grace", "soon"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--grace" in bad.stderr and "Traceback" not in bad.stderr
