"""Benchmark: commands per second through one processor, and command-to-reply latency.

Throughput: N CreateSchedule commands are appended up front, then one in-process processor
drains them with one transaction per partition per batch; the figure is N / (time until
the last reply is committed). Latency: a client sends commands paced at --rate per second
and measures send -> reply (p50/p99).

    .venv/bin/python bench/processor.py --log sqlite --n 20000 --batch 500
    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 .venv/bin/python bench/processor.py --log kafka

Prints one JSON line per run; --runs K repeats and reports the median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

from chronolog.commands.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.log.port import OutRecord, Topics
from chronolog.processors.runtime import Processor, ProcessorConfig
from chronolog.settings import LogConfig, open_log

SPEC = m.ScheduleSpec.model_validate({"every": "1h", "job": {"type": "noop"}})


def make_log(kind: str, partitions: int) -> Any:
    topics = Topics(prefix=f"bench{uuid.uuid4().hex[:8]}.", partitions=partitions)
    if kind == "sqlite":
        path = os.path.join(tempfile.mkdtemp(prefix="chronolog-bench-"), "log.db")
        return open_log(LogConfig("sqlite", path, topics))
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    return open_log(LogConfig("kafka", servers, topics))


def command(i: int) -> m.CommandEnvelope:
    return m.CommandEnvelope(
        command_id=uuid.uuid4().hex, type="CreateSchedule", tenant="bench",
        schedule_id=f"s{i}", issued_at="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
        payload=m.CreateSchedule(spec=SPEC),
    )


async def count_replies(lg: Any) -> int:
    total = 0
    for p in range(lg.topics.partitions):
        total += await lg.end_offset(lg.topics.replies, p)
    return total


async def throughput(kind: str, n: int, batch: int, partitions: int) -> dict[str, Any]:
    lg = make_log(kind, partitions)
    await lg.start()
    await lg.ensure_topics()
    recs = [OutRecord(lg.topics.commands, partition_key("bench", f"s{i}").encode(),
                      codec.encode_command(command(i))) for i in range(n)]
    for i in range(0, n, 5000):
        await lg.append(recs[i:i + 5000])
    proc = Processor(lg, "bench", config=ProcessorConfig(batch_max=batch))
    t0 = time.perf_counter()
    task = asyncio.create_task(proc.run())
    replies_at_end = n
    while True:
        # replies are committed with their commands; on Kafka each transaction also adds
        # a control record per partition, so count decided commands from the stats
        if proc.stats.commands >= replies_at_end:
            break
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    stats = proc.stats
    proc.stop()
    await task
    await lg.close()
    return {"log": kind, "n": n, "batch": batch, "partitions": partitions,
            "seconds": round(elapsed, 3), "commands_per_s": round(n / elapsed),
            "transactions": stats.transactions,
            "commands_per_txn": round(stats.commands / max(stats.transactions, 1), 1)}


async def latency(kind: str, rate: int, seconds: float, partitions: int) -> dict[str, Any]:
    lg = make_log(kind, partitions)
    await lg.start()
    await lg.ensure_topics()
    proc = Processor(lg, "bench")
    task = asyncio.create_task(proc.run())
    client = Client(lg, reply_timeout=30)
    await client.start()
    while len(proc.partitions) < partitions:
        await asyncio.sleep(0.05)
    lat: list[float] = []

    async def one(i: int) -> None:
        t = time.perf_counter()
        await client.send(client.envelope("bench", f"s{i}", m.CreateSchedule(spec=SPEC)))
        lat.append((time.perf_counter() - t) * 1000)

    n = int(rate * seconds)
    pending = []
    start = time.perf_counter()
    for i in range(n):
        target = start + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(one(i)))
    await asyncio.gather(*pending)
    await client.close()
    proc.stop()
    await task
    await lg.close()
    lat.sort()
    return {"log": kind, "rate": rate, "n": n, "p50_ms": round(lat[len(lat) // 2], 2),
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 2), "max_ms": round(lat[-1], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", choices=["sqlite", "kafka"], default="sqlite")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--skip-latency", action="store_true")
    args = ap.parse_args()
    tps = []
    for _ in range(args.runs):
        r = asyncio.run(throughput(args.log, args.n, args.batch, args.partitions))
        print(json.dumps(r), flush=True)
        tps.append(r["commands_per_s"])
    if args.runs > 1:
        print(json.dumps({"log": args.log, "median_commands_per_s": statistics.median(tps)}))
    if not args.skip_latency:
        p99s = []
        for _ in range(args.runs):
            r = asyncio.run(latency(args.log, args.rate, args.seconds, args.partitions))
            print(json.dumps(r), flush=True)
            p99s.append(r["p99_ms"])
        if args.runs > 1:
            print(json.dumps({"log": args.log, "median_p99_ms": statistics.median(p99s)}))


if __name__ == "__main__":
    main()
