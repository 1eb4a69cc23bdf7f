"""Benchmark: runs per second end to end, and start lateness, on each log.

One ``chronolog processor`` subprocess and two ``chronolog worker --builtin-jobs``
subprocesses per log; this process only creates schedules and reads the log. Every run goes
the whole way: materialized by the processor's timer, hinted on ``ready.default``, claimed
by a worker (ClaimRun round trip), a ``noop`` handler, published (CompleteRun round trip).

Two phases per log:

* **steady**: ``--steady`` schedules ``every 1s`` for ``--steady-seconds`` (a load well under
  capacity): p50/p99 start lateness = AttemptClaimed.claimed_at − scheduled_at;
* **burst**: ``--burst`` one-shot schedules all due at the same instant: runs/s =
  burst / (last ResultPublished.finished_at − the instant), and the lateness distribution
  of the burst (which is mostly queueing).

    .venv/bin/python bench/e2e.py [--logs sqlite,kafka] [--burst 2000] [--steady 20]
        [--steady-seconds 15] [--partitions 4] [--concurrency 16]

Kafka needs ``KAFKA_BOOTSTRAP_SERVERS``. The SQLite log lives under ``--dir`` (default a
temporary directory in the current one, so fsync costs are the real disk's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")


def url_of(cfg: LogConfig) -> str:
    return f"sqlite://{cfg.target}" if cfg.kind == "sqlite" else f"kafka://{cfg.target}"


def spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, CHRONOLOG_LOG_LEVEL="WARNING")
    return subprocess.Popen([CHRONOLOG, *args], stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "wb"), env=env)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


async def read_events(lg: Any) -> list[Any]:
    out = []
    for p in range(lg.topics.partitions):
        end = await lg.end_offset(lg.topics.events, p)
        off = 0
        while off < end:
            recs = await lg.read(lg.topics.events, p, off, 5000)
            if not recs:
                break
            out.extend(codec.decode_event(r.value) for r in recs)
            off = recs[-1].offset + 1
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def runs_of(evs: list[Any], schedules: set[str]) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for e in evs:
        if e.schedule_id not in schedules:
            continue
        p = e.payload
        if e.type == "OccurrenceMaterialized":
            runs.setdefault(p.run_id, {})["scheduled_at"] = p.scheduled_at
        elif e.type == "AttemptClaimed":
            runs.setdefault(p.run_id, {}).setdefault("claimed_at", p.claimed_at)
        elif e.type == "ResultPublished":
            runs.setdefault(p.run_id, {})["finished_at"] = p.finished_at
    return runs


async def create_many(
    client: Client, specs: list[tuple[str, dict[str, Any]]], width: int = 200
) -> float:
    started = time.perf_counter()
    sem = asyncio.Semaphore(width)

    async def one(sid: str, spec: dict[str, Any]) -> None:
        async with sem:
            await client.create_schedule("bench", sid, spec)

    await asyncio.gather(*(one(s, sp) for s, sp in specs))
    return time.perf_counter() - started


async def bench_log(cfg: LogConfig, args: Any, workdir: Path) -> dict[str, Any]:
    lg = open_log(cfg)
    await lg.start()
    await lg.ensure_topics()
    common = ["--log", url_of(cfg), "--topic-prefix", cfg.topics.prefix,
              "--partitions", str(cfg.topics.partitions)]
    procs = [spawn(["processor", *common, "--member-id", "bench-p"], workdir / "processor.log")]
    for i in range(2):
        procs.append(spawn(["worker", *common, "--builtin-jobs", "--worker-id", f"bench-w{i}",
                            "--concurrency", str(args.concurrency),
                            "--results", str(workdir / "results")],
                           workdir / f"worker{i}.log"))
    client = Client(lg, reply_timeout=60)
    await client.start()
    out: dict[str, Any] = {"log": cfg.kind}
    try:
        # steady
        steady_ids = {f"steady-{i}" for i in range(args.steady)}
        elapsed = await create_many(client, [(s, {"every": "1s", "job": {"type": "noop"},
                                                  "misfire": "all"}) for s in steady_ids])
        create_rate = max(1.0, args.steady / elapsed)
        t_start = datetime.now(UTC)
        await asyncio.sleep(args.steady_seconds)
        for s in steady_ids:
            await client.pause("bench", s)
        await asyncio.sleep(2)  # let the last runs finish
        runs = runs_of(await read_events(lg), steady_ids)
        late = [(r["claimed_at"] - r["scheduled_at"]).total_seconds() for r in runs.values()
                if "claimed_at" in r and r["scheduled_at"] >= t_start]
        done = sum(1 for r in runs.values() if "finished_at" in r)
        out["steady"] = {"schedules": args.steady, "runs": done,
                         "lateness_p50_ms": pct(late, 50) * 1000,
                         "lateness_p99_ms": pct(late, 99) * 1000}
        # burst
        lead = args.burst / create_rate * 1.5 + 3
        instant = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
        burst_ids = {f"burst-{i}" for i in range(args.burst)}
        await create_many(client, [(s, {"at": instant.isoformat(), "job": {"type": "noop"}})
                                   for s in burst_ids])
        created_by = datetime.now(UTC)
        deadline = time.monotonic() + lead + 600
        while time.monotonic() < deadline:
            await asyncio.sleep(1)
            runs = runs_of(await read_events(lg), burst_ids)
            if sum(1 for r in runs.values() if "finished_at" in r) >= args.burst:
                break
        finished = [r["finished_at"] for r in runs.values() if "finished_at" in r]
        late = [(r["claimed_at"] - r["scheduled_at"]).total_seconds() for r in runs.values()
                if "claimed_at" in r]
        span = (max(finished) - instant).total_seconds() if finished else float("nan")
        out["burst"] = {"runs": len(finished), "created_before_instant": created_by < instant,
                        "seconds": span, "runs_per_s": len(finished) / span if span else 0.0,
                        "lateness_p50_ms": pct(late, 50) * 1000,
                        "lateness_p99_ms": pct(late, 99) * 1000}
    finally:
        await client.close()
        stop(procs)
        await lg.close()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", default="sqlite,kafka")
    ap.add_argument("--burst", type=int, default=2000)
    ap.add_argument("--steady", type=int, default=20)
    ap.add_argument("--steady-seconds", type=float, default=15.0)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--dir", default=".")
    args = ap.parse_args()
    print(f"cpus={os.cpu_count()} burst={args.burst} steady={args.steady}x every 1s for "
          f"{args.steady_seconds}s, 1 processor + 2 workers x {args.concurrency} slots, "
          f"{args.partitions} partitions")
    for kind in args.logs.split(","):
        prefix = f"bench{uuid.uuid4().hex[:8]}."
        topics = Topics(prefix=prefix, partitions=args.partitions)
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-e2e-") as tmp:
            if kind == "sqlite":
                cfg = LogConfig("sqlite", str(Path(tmp) / "log.db"), topics)
            else:
                servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
                if not servers:
                    print("kafka: skipped (KAFKA_BOOTSTRAP_SERVERS not set)")
                    continue
                cfg = LogConfig("kafka", servers, topics)
            r = await bench_log(cfg, args, Path(tmp))
        s, b = r["steady"], r["burst"]
        print(f"{kind:6} steady: {s['runs']} runs, start lateness p50 {s['lateness_p50_ms']:.0f} ms"
              f" p99 {s['lateness_p99_ms']:.0f} ms")
        print(f"{kind:6} burst:  {b['runs']} runs in {b['seconds']:.1f} s = "
              f"{b['runs_per_s']:.0f} runs/s; lateness p50 {b['lateness_p50_ms']:.0f} ms "
              f"p99 {b['lateness_p99_ms']:.0f} ms (all created before the instant: "
              f"{b['created_before_instant']})")


if __name__ == "__main__":
    asyncio.run(main())
