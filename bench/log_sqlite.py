"""Benchmark: raw ``SqlitePartitionOwner.commit`` throughput of the SQLite log.

For batches of 1, 100 and 1000 records of ~300 bytes each (keyed, spread over the events
partitions, plus one consumed offset per commit — what a processor's batch looks like), run
commits for a fixed time and print commits/s and records/s, for synchronous=FULL (the
default: durable before a reply) and NORMAL (for comparison).

    .venv/bin/python bench/log_sqlite.py [--seconds 3] [--dir DIR] [--modes FULL,NORMAL]

The database lives in a temporary directory under ``--dir`` (default: the current
directory, so the numbers reflect the real disk's fsync, not tmpfs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from chronolog.log.port import OutRecord, Topics
from chronolog.log.sqlite import SqliteEventLog

VALUE = os.urandom(150).hex().encode()[:300]  # 300 bytes


async def bench(db: Path, mode: str, batch: int, seconds: float) -> tuple[float, float, float]:
    topics = Topics(prefix="bench.", partitions=12)
    log = SqliteEventLog(db, topics, synchronous=mode)
    await log.start()
    await log.ensure_topics()
    owner = await log.acquire(0, "bench")
    commits = 0
    n = 0
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        records = [
            OutRecord(topics.events, f"tenant/sched-{n + i}".encode(), VALUE) for i in range(batch)
        ]
        t0 = time.perf_counter()
        await owner.commit(records, {(topics.commands, 0): commits + 1}, "processors")
        latencies.append(time.perf_counter() - t0)
        commits += 1
        n += batch
    elapsed = time.perf_counter() - started
    await log.close()
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    return commits / elapsed, n / elapsed, p50


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dir", default=".")
    ap.add_argument("--modes", default="FULL,NORMAL")
    ap.add_argument("--batches", default="1,100,1000")
    args = ap.parse_args()
    print(f"{'sync':<7}{'batch':>6}{'commits/s':>12}{'records/s':>12}{'p50 ms':>9}")
    for mode in args.modes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-log-") as tmp:
                cps, rps, p50 = await bench(Path(tmp) / "log.db", mode, batch, args.seconds)
            print(f"{mode:<7}{batch:>6}{cps:>12,.0f}{rps:>12,.0f}{p50:>9.2f}")


if __name__ == "__main__":
    asyncio.run(main())
