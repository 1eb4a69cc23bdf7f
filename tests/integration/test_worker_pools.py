"""Worker pools on the embedded log, with real ``chronolog worker`` processes: a tenant bound
to pool ``a`` has its runs run only by the worker that proves membership of ``a``; a worker
offering 256 slots under pool ``a`` with a wrong credential, and one offering 256 slots with
no pool, get none of them, and a result sent for one of them by a worker it is not assigned
to is refused."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chronolog.domain import messages as m
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log
from chronolog.tenants import load_tenants
from support.polling import wait_until
from support.processors import Running, events

from .conftest import CHRONOLOG, ROOT, log_url, started

CRED_A = "pool-a-credential-0123456789"


@pytest.fixture
def sqlite_config(tmp_path: Path, topic_prefix: str) -> LogConfig:
    return LogConfig("sqlite", str(tmp_path / "log.db"), Topics(prefix=topic_prefix, partitions=4))


class Worker:
    """A ``chronolog worker`` subprocess (built-in jobs), stopped by its PID."""

    def __init__(self, cfg: LogConfig, tmp: Path, worker_id: str, concurrency: int,
                 pool: str | None = None, credential: str | None = None,
                 group: str | None = None) -> None:
        self.log_path = tmp / f"{worker_id}.log"
        env = dict(os.environ, CHRONOLOG_LOG_LEVEL="INFO")
        env.pop("CHRONOLOG_WORKER_CREDENTIAL", None)
        extra: list[str] = [] if group is None else ["--group", group]
        if pool is not None:
            extra += ["--pool", pool]
            env["CHRONOLOG_WORKER_CREDENTIAL"] = credential or ""
        self.proc = subprocess.Popen(
            [CHRONOLOG, "worker", "--log", log_url(cfg), "--topic-prefix", cfg.topics.prefix,
             "--partitions", str(cfg.topics.partitions), "--worker-id", worker_id,
             "--results", str(tmp / "results"), "--builtin-jobs",
             "--concurrency", str(concurrency), "--reply-timeout", "5", "--drain-timeout", "5",
             *extra],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"), env=env, cwd=ROOT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def test_a_pool_bound_tenants_runs_go_only_to_its_pools_verified_worker(
    sqlite_config: LogConfig, tmp_path: Path
) -> None:
    tfile = tmp_path / "tenants.toml"
    tfile.write_text(f'[pools.a]\ncredentials = ["{CRED_A}"]\n'
                     '[tenants.acme]\ntokens = ["t-a"]\npools = ["a"]\n')
    tenants = load_tenants(tfile)
    # the rogues read in consumer groups of their own: one in the pool's group would share
    # out the pool's ready partitions (it still gets no run: those partitions' runs wait); on
    # Kafka the group's ACL keeps it out (docs/security.md, Worker pools)
    workers = [
        Worker(sqlite_config, tmp_path, "legit", 4, pool="a", credential=CRED_A),
        Worker(sqlite_config, tmp_path, "rogue", 256, pool="a",
               credential="not-the-credential-of-a", group="rogue"),
        Worker(sqlite_config, tmp_path, "rogue-nopool", 256, group="rogue-nopool"),
    ]
    try:
        async with started(open_log(sqlite_config)) as lg, \
                Running(lg, tenants=tenants) as r:
            parts = range(sqlite_config.topics.partitions)

            def seats() -> dict[str, Any]:
                return {w: s for p in parts if p in r.proc.partitions
                        for w, s in r.proc.partitions[p].dispatch.seats.get("default", {}).items()}

            def offered() -> bool:  # every worker has offered on every partition by now
                live = seats()
                return ("legit" in live and "rogue-nopool" in live
                        and r.proc.stats.offers_unverified >= len(parts))

            await wait_until(offered, 60, what="all three workers offering")
            assert "rogue" not in seats(), "a wrong credential must seat nobody"
            assert seats()["legit"].pool == "a" and seats()["rogue-nopool"].pool is None

            at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
            for i in range(10):
                await r.client.create_schedule("acme", f"s{i}", {
                    "at": at, "job": {"type": "echo", "params": {"secret": f"p{i}"}}})

            async def ten_results() -> Any:
                evs = await events(lg)
                done = [e for e in evs if e.type == "ResultPublished"]
                return evs if len(done) >= 10 else None

            evs = await wait_until(ten_results, 60, what="10 results of acme's runs")
            claims = [e.payload for e in evs if e.type == "AttemptClaimed"]
            results = [e.payload for e in evs if e.type == "ResultPublished"]
            assert len({c.run_id for c in claims}) == 10
            assert {c.worker_id for c in claims} == {"legit"}
            assert {p.worker_id for p in results} == {"legit"}

            # a run leased to the legitimate worker: a result from anyone else is refused,
            # though it names the run, its attempt and its fence
            await r.client.create_schedule("acme", "long", {
                "at": at, "job": {"type": "sleep", "params": {"seconds": 60}}})

            async def long_claimed() -> Any:
                evs = await events(lg)
                sid = {e.payload.run_id for e in evs
                       if e.type == "OccurrenceMaterialized" and e.schedule_id == "long"}
                got = [e.payload for e in evs if e.type == "AttemptClaimed"
                       and e.payload.run_id in sid]
                return got[0] if got else None

            claim = await wait_until(long_claimed, 60, what="the long run claimed")
            assert claim.worker_id == "legit"
            for rogue in ("rogue", "rogue-nopool"):
                reply = await r.client.send(r.client.envelope("acme", "long", m.CompleteRun(
                    run_id=claim.run_id, attempt=claim.attempt, fence=claim.fence,
                    worker_id=rogue, checksum="0" * 64, size=2, inline={})))
                assert reply.status == "forbidden", reply
                assert "assignee" in (reply.reason or "")
            published = [e.payload for e in await events(lg) if e.type == "ResultPublished"
                         and e.payload.run_id == claim.run_id]
            assert published == []

            # a run no pool worker takes (no handler for its job type) waits READY: a rogue
            # claiming it directly, with no offer and so no proof, is refused
            await r.client.create_schedule("acme", "orphan", {
                "at": at, "job": {"type": "no-handler", "params": {"secret": "p-orphan"}}})

            async def orphan_ready() -> Any:
                for e in await events(lg):
                    if e.type == "OccurrenceMaterialized" and e.schedule_id == "orphan":
                        return e.payload.run_id
                return None

            orphan = await wait_until(orphan_ready, 60, what="the orphan run ready")
            for rogue in ("rogue", "rogue-nopool"):
                reply = await r.client.send(r.client.envelope("acme", "orphan", m.ClaimRun(
                    run_id=orphan, attempt=1, worker_id=rogue)))
                assert reply.status == "forbidden" and reply.body.get("field") == "worker_id", reply
            assert not [e for e in await events(lg) if e.type == "AttemptClaimed"
                        and e.payload.run_id == orphan]
    finally:
        for w in workers:
            w.stop()
    assert "offer_unverified" not in (tmp_path / "legit.log").read_text()
