"""Projector benchmark: events per second into PostgreSQL, and projection lag under load.

    .venv/bin/python bench/projector.py --database-url DSN [--log sqlite|kafka]
        [--runs 50000] [--schedules 1000] [--rate 1000] [--seconds 20] [--batch 5000]

1. **Throughput**: ``--runs`` run lifecycles are appended to a fresh log (the events a
   processor writes for a run that is materialized, claimed and completes:
   OccurrenceMaterialized, FenceAdvanced, AttemptClaimed, ResultPublished — 4 events per
   run, after one ScheduleCreated per schedule), then one ``Projector`` projects the whole
   topic from offset 0 into an empty schema; events/s = events / wall time until caught up.
2. **Lag under load**: a writer appends run lifecycles at ``--rate`` runs/s (4 events each)
   for ``--seconds`` while a live projector follows; for every event the lag is the time
   from its append (the record's timestamp) to the commit of the PostgreSQL transaction
   that applied it. Reports p50/p99/max and whether the writer kept its rate.

Events are synthesized (valid v1 envelopes, encoded with the real codec, keyed and
partitioned as the processor does) rather than decided by a processor, so the figure is the
projector's alone. 12 partitions by default (the product default).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key, run_id_for
from chronolog.log.port import EventLog, OutRecord, Topics
from chronolog.projections.projector import Commit, Projector
from chronolog.projections.store import PostgresProjectionStore
from chronolog.settings import LogConfig, open_log

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SPEC = m.ScheduleSpec(every=60.0, job=m.JobSpec(type="report", params={"region": "eu"}))


def _env(tenant: str, sid: str, at: datetime, payload: Any, n: int) -> m.EventEnvelope:
    return m.EventEnvelope(event_id=f"bench-{sid}-{n}", type=payload.type,
                           key=partition_key(tenant, sid), tenant=tenant, schedule_id=sid,
                           at=at, causation_id=f"c-{sid}-{n}", payload=payload)


def _record(topics: Topics, env: m.EventEnvelope) -> OutRecord:
    return OutRecord(topics.events, env.key.encode(), codec.encode_event(env))


def schedule_created(topics: Topics, tenant: str, sid: str) -> OutRecord:
    return _record(topics, _env(tenant, sid, T0, m.ScheduleCreated(
        revision=1, spec=SPEC, created_at=T0, anchor=T0, next_run_at=T0, next_due_at=T0), 0))


def run_lifecycle(topics: Topics, tenant: str, sid: str, k: int) -> list[OutRecord]:
    """The 4 events of run ``k`` of a schedule (materialized, fence, claim, result)."""
    at = T0 + timedelta(minutes=k)
    rid = run_id_for(tenant, sid, at)
    fence = k + 1
    events = [
        m.OccurrenceMaterialized(run_id=rid, scheduled_at=at, due_at=at, revision=1,
                                 job=SPEC.job, state="READY", sequence=k,
                                 next_run_at=at + timedelta(minutes=1),
                                 next_due_at=at + timedelta(minutes=1)),
        m.FenceAdvanced(fence=fence, run_id=rid, reason="claim"),
        m.AttemptClaimed(run_id=rid, attempt=1, fence=fence, worker_id="w-1",
                         claimed_at=at + timedelta(seconds=1),
                         lease_until=at + timedelta(seconds=31)),
        m.ResultPublished(run_id=rid, attempt=1, fence=fence, worker_id="w-1",
                          checksum="sha256:" + rid, size=17, inline={"rows": k},
                          finished_at=at + timedelta(seconds=3)),
    ]
    return [_record(topics, _env(tenant, sid, at, e, 4 * k + i + 1)) for i, e in enumerate(events)]


async def fresh_store(dsn: str) -> PostgresProjectionStore:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.close()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4,
                                     server_settings={"search_path": schema})
    assert pool is not None
    store = PostgresProjectionStore(pool)
    await store.migrate()
    return store


def workload(topics: Topics, runs: int, schedules: int) -> list[OutRecord]:
    """``schedules`` ScheduleCreated events, then about ``runs`` run lifecycles over them."""
    records = [schedule_created(topics, "bench", f"s{i}") for i in range(schedules)]
    for k in range(max(1, runs // schedules)):
        for i in range(schedules):
            records.extend(run_lifecycle(topics, "bench", f"s{i}", k))
    return records


async def append_all(lg: EventLog, records: list[OutRecord], chunk: int = 5000) -> None:
    for i in range(0, len(records), chunk):
        await lg.append(records[i:i + chunk])


async def throughput(lg: EventLog, dsn: str, runs: int, schedules: int, batch: int) -> float:
    topics = lg.topics
    records = workload(topics, runs, schedules)
    t = time.perf_counter()
    await append_all(lg, records)
    print(f"appended {len(records)} events in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    store = await fresh_store(dsn)
    pr = Projector(lg, store, batch_max=batch, idle_ms=10)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    task = asyncio.create_task(pr.run())
    while pr.stats.events < len(records):
        await asyncio.sleep(0.02)
        if task.done():
            task.result()
    elapsed = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    pr.stop()
    await task
    rows = await store.pool.fetchval("SELECT count(*) FROM runs")
    await store.close()
    rate = len(records) / elapsed
    print(f"throughput: {len(records)} events in {elapsed:.2f}s = {rate:,.0f} events/s "
          f"({pr.stats.batches} batches of <= {batch}; {rows} run rows; projector process "
          f"CPU {cpu:.2f}s = {len(records) / cpu:,.0f} events per CPU-second; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return rate


async def throughput_processes(lg: EventLog, log_url: str, dsn: str, runs: int,
                               schedules: int, batch: int, processes: int) -> float:
    """The throughput phase with ``processes`` ``chronolog projector`` processes, each on a
    disjoint set of partitions, into one schema (timed from the first committed batch)."""
    import subprocess

    topics = lg.topics
    records = workload(topics, runs, schedules)
    await append_all(lg, records)
    ends = {p: await lg.end_offset(topics.events, p) for p in range(topics.partitions)}
    store = await fresh_store(dsn)
    schema = await store.pool.fetchval("SELECT current_schema()")
    exe = str(Path(sys.executable).parent / "chronolog")
    shards = [list(range(topics.partitions))[i::processes] for i in range(processes)]
    procs = [subprocess.Popen(
        [exe, "projector", "--log", log_url, "--topic-prefix", topics.prefix,
         "--partitions", str(topics.partitions), "--batch", str(batch),
         "--database-url", f"{dsn}?search_path={schema}",
         "--only-partitions", ",".join(map(str, shard))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for shard in shards]
    first: float | None = None
    try:
        while True:
            rows = await store.pool.fetch(
                "SELECT partition, next_offset FROM projection_offsets WHERE topic = $1",
                topics.events)
            if rows and first is None:
                first = time.perf_counter()
            done = {r["partition"]: r["next_offset"] for r in rows}
            if all(done.get(p, 0) >= e for p, e in ends.items()):
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a projector process exited")
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - (first or time.perf_counter())
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        await store.close()
    rate = len(records) / elapsed
    print(f"throughput with {processes} projector processes: {len(records)} events in "
          f"{elapsed:.2f}s = {rate:,.0f} events/s (from the first commit; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return rate


async def lag_under_load(lg: EventLog, dsn: str, rate: int, seconds: float, schedules: int,
                         batch: int) -> None:
    topics = lg.topics
    tenant = f"load{uuid.uuid4().hex[:4]}"
    await append_all(lg, [schedule_created(topics, tenant, f"s{i}") for i in range(schedules)])
    store = await fresh_store(dsn)
    pr = Projector(lg, store, batch_max=batch, idle_ms=5)
    lags: list[float] = []
    pr.on_commit.append(lambda c: lags.extend(c.committed_ms - a for a in c.append_ms))
    task = asyncio.create_task(pr.run())
    while pr.stats.events < schedules:
        await asyncio.sleep(0.01)
    lags.clear()
    tick = 0.05  # append every 50 ms: rate/20 runs at a time
    per_tick = max(1, int(rate * tick))
    k = 0
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        recs: list[OutRecord] = []
        for _ in range(per_tick):
            i = k % schedules
            recs.extend(run_lifecycle(topics, tenant, f"s{i}", k // schedules))
            k += 1
        await lg.append(recs)
        sent += per_tick
        next_at = start + (sent / rate)
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    wall = time.perf_counter() - start
    total = schedules + sent * 4
    deadline = time.monotonic() + 60
    while pr.stats.events < total and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    pr.stop()
    await task
    await store.close()
    lags.sort()
    q = statistics.quantiles(lags, n=100) if len(lags) > 100 else [0.0] * 99
    print(f"lag under load: {sent / wall:,.0f} runs/s ({sent * 4 / wall:,.0f} events/s) for "
          f"{wall:.1f}s; projection lag p50 {q[49]:.0f} ms, p99 {q[98]:.0f} ms, "
          f"max {lags[-1] if lags else 0:.0f} ms over {len(lags)} events")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", default=os.environ.get("CHRONOLOG_DATABASE_URL"))
    ap.add_argument("--log", choices=("sqlite", "kafka"), default="sqlite")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--runs", type=int, default=50_000)
    ap.add_argument("--schedules", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=1000, help="runs per second under load")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--processes", type=int, default=0,
                    help="also measure throughput with N projector processes on disjoint "
                         "partition sets (sqlite only)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-lag", action="store_true")
    args = ap.parse_args()
    if not args.database_url:
        ap.error("--database-url (or CHRONOLOG_DATABASE_URL) is required")
    paths: list[Path] = []

    urls: list[str] = []

    async def fresh_log() -> EventLog:
        """A new, empty log for one phase (a new file or a new topic prefix)."""
        topics = Topics(prefix=f"bench{uuid.uuid4().hex[:6]}.", partitions=args.partitions)
        if args.log == "sqlite":
            path = Path(f"/tmp/chronolog-bench-{uuid.uuid4().hex[:6]}.db")
            paths.append(path)
            cfg = LogConfig("sqlite", str(path), topics)
            urls.append(f"sqlite://{path}")
        else:
            cfg = LogConfig("kafka", os.environ["KAFKA_BOOTSTRAP_SERVERS"], topics)
        lg = open_log(cfg)
        await lg.start()
        await lg.ensure_topics()
        return lg

    try:
        if not args.skip_throughput:
            lg = await fresh_log()
            try:
                await throughput(lg, args.database_url, args.runs, args.schedules, args.batch)
            finally:
                await lg.close()
        if args.processes > 0 and args.log == "sqlite":
            lg = await fresh_log()
            try:
                await throughput_processes(lg, urls[-1], args.database_url, args.runs,
                                           args.schedules, args.batch, args.processes)
            finally:
                await lg.close()
        if not args.skip_lag:
            lg = await fresh_log()
            try:
                await lag_under_load(lg, args.database_url, args.rate, args.seconds,
                                     args.schedules, args.batch)
            finally:
                await lg.close()
    finally:
        for path in paths:
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)

if __name__ == "__main__":
    asyncio.run(main())


__all__ = ["Commit", "main"]
