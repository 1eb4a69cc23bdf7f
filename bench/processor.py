"""Benchmark: commands per second through one processor, and command-to-reply latency.

Throughput: N commands drained by one in-process processor with one transaction per
partition per batch. ``--feed process`` (default): a separate feeder process (as real
clients are) appends the N commands in chunks of 5,000 once the processor owns every
partition; the clock runs from that moment until the last command is decided and committed.
``--feed backlog``: the N commands are appended first, the
processor joins and restores (not timed), and the clock runs from the moment it owns every
partition until the last command is decided and committed (commands it decided before that
moment are left out of the count: ``timed``). ``--feed live``: the processor joins first and
this same process appends the N commands (chunks of 5,000) while it drains them — the
appends then compete with the processor for this process's CPU and, on SQLite, for the
log's single writer thread. ``append_s`` shows how long the append itself took.

Workloads (``--workload``; ``mixed`` by default — a scheduler's command stream is mostly the
run lifecycle, each schedule being created once and run many times):

* ``create`` — N ``CreateSchedule`` commands on new schedules. Each one also triggers the
  schedule's first materialization in the same batch (``every`` schedules start at their
  anchor), so a command costs two decisions, two events, a ready hint and a reply.
* ``mixed`` — the run lifecycle on existing schedules: N/4 schedules are created and drained
  by a setup processor first (not timed); then, per schedule, ``ClaimRun``, ``Heartbeat``,
  ``CompleteRun`` (of its first run) and ``TriggerRun`` (a new manual run) are appended and a
  fresh processor (restore not timed) drains them. ``ok_fraction`` checks the mix really
  exercised the happy path (every reply should be ``ok``).

Latency: after ``--warmup`` unmeasured runs (default 1), a client sends commands paced at
--rate per second (send -> reply, p50/p99) with the same workload (``mixed``:
Claim/Heartbeat/Complete/Trigger on pre-created schedules). The
client runs in the processor's process (``--client inline``, default) or in a separate one
(``--client process``; on this 2-core machine with a co-located broker its p50 was higher).

    .venv/bin/python bench/processor.py --log sqlite --n 20000 --batch 500 --runs 3
    .venv/bin/python bench/processor.py --log sqlite --workload create --runs 3
    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 .venv/bin/python bench/processor.py --log kafka

Its figures on the development machine are in docs/run-path.md ("Processor throughput").

``--sync NORMAL`` runs the SQLite log with ``synchronous=NORMAL`` (not the product default:
it may lose the last commits on power loss). Prints one JSON line per run; with --runs K > 1
it also prints the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import structlog

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.log.port import OutRecord, Topics
from chronolog.processors.config import ProcessorConfig
from chronolog.processors.runtime import Processor

SPEC = m.ScheduleSpec.model_validate({"every": "1h", "job": {"type": "noop"}})
TENANT = "bench"


def make_log(kind: str, partitions: int, sync: str) -> Any:
    topics = Topics(prefix=f"bench{uuid.uuid4().hex[:8]}.", partitions=partitions)
    if kind == "sqlite":
        from chronolog.log.sqlite import SqliteEventLog

        path = os.path.join(tempfile.mkdtemp(prefix="chronolog-bench-"), "log.db")
        return SqliteEventLog(path, topics, synchronous=sync)
    from chronolog.log.kafka import KafkaEventLog

    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    return KafkaEventLog(servers, topics)


async def close_log(lg: Any) -> None:
    """Close the log and delete what the run created: a SQLite log's temporary directory
    (runs add up to GBs), a Kafka run's topics (hundreds of partitions left behind fill the
    broker's 512 MiB heap: its young collections then took ~16 ms each, a visible step
    in the latency runs' p99)."""
    await lg.close()
    path = getattr(lg, "path", None)
    if path is not None and path.parent.name.startswith("chronolog-bench-"):
        shutil.rmtree(path.parent, ignore_errors=True)
    servers = getattr(lg, "bootstrap_servers", None)
    if servers is not None and lg.topics.prefix.startswith("bench"):
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=servers)
        await admin.start()
        try:
            names = [t for t in await admin.list_topics() if t.startswith(lg.topics.prefix)]
            if names:
                await admin.delete_topics(names)
        finally:
            await admin.close()


def envelope(schedule_id: str, payload: Any, reply_to: str | None = None) -> m.CommandEnvelope:
    return m.CommandEnvelope(
        command_id=uuid.uuid4().hex, type=payload.type, tenant=TENANT,
        schedule_id=schedule_id, issued_at="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
        reply_to=reply_to, payload=payload,
    )


def create_commands(n: int, prefix: str = "s") -> list[m.CommandEnvelope]:
    return [envelope(f"{prefix}{i}", m.CreateSchedule(spec=SPEC)) for i in range(n)]


def mixed_commands(runs: dict[str, str], n: int) -> list[m.CommandEnvelope]:
    """Per schedule, in this order: claim, heartbeat, complete its first run, trigger a run.

    Rounds are appended one after another, so each schedule's four commands reach its
    partition in lifecycle order (a fresh schedule's first claim gets fence 1).
    """
    sids = sorted(runs)
    rounds: list[list[m.CommandEnvelope]] = [[], [], [], []]
    for sid in sids:
        rid = runs[sid]
        rounds[0].append(envelope(sid, m.ClaimRun(run_id=rid, attempt=1, worker_id="w")))
        rounds[1].append(envelope(sid, m.Heartbeat(run_id=rid, attempt=1, fence=1, worker_id="w")))
        rounds[2].append(envelope(sid, m.CompleteRun(run_id=rid, attempt=1, fence=1,
                                                     worker_id="w", checksum="sha256:00",
                                                     size=0)))
        rounds[3].append(envelope(sid, m.TriggerRun(request_key=f"t-{uuid.uuid4().hex[:8]}")))
    return [c for r in rounds for c in r][:n]


def processor_config(args: argparse.Namespace) -> ProcessorConfig:
    config = ProcessorConfig(batch_max=args.batch)
    for flag in ("pipeline", "gc_tuning"):  # present in runtimes that have them
        if hasattr(config, flag) and getattr(args, f"no_{flag}"):
            setattr(config, flag, False)
    return config


def records_of(lg: Any, cmds: list[m.CommandEnvelope]) -> list[OutRecord]:
    return [OutRecord(lg.topics.commands, partition_key(c.tenant, c.schedule_id).encode(),
                      codec.encode_command(c)) for c in cmds]


async def append_all(lg: Any, recs: list[OutRecord]) -> None:
    for i in range(0, len(recs), 5000):
        await lg.append(recs[i:i + 5000])


CHILD = "--child"


def log_target(lg: Any) -> tuple[str, str]:
    """(kind, target) to open ``lg`` again from another process."""
    return ("sqlite", str(lg.path)) if hasattr(lg, "path") else ("kafka", lg.bootstrap_servers)


async def spawn(lg: Any, role: str, payload: list[Any], *extra: str) -> asyncio.subprocess.Process:
    """A child process (``role``: feeder or client) on ``lg``, started and ready; it begins
    its work when ``go`` is called. ``payload`` reaches it through a pickle file."""
    fd, path = tempfile.mkstemp(prefix=f"chronolog-bench-{role}-")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(payload, f)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, CHILD, role, *log_target(lg), lg.topics.prefix,
            str(lg.topics.partitions), path, *extra,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 24)
        assert proc.stdout is not None
        line = await proc.stdout.readline()
    finally:
        os.unlink(path)
    if line.strip() != b"ready":
        raise RuntimeError(f"{role} process did not start: {line!r}")
    return proc


async def go(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()


async def finish(proc: asyncio.subprocess.Process) -> Any:
    """The child's result (its last line, JSON), once it exited."""
    assert proc.stdout is not None
    result = json.loads(await proc.stdout.readline())
    await proc.wait()
    return result


async def child(role: str, kind: str, target: str, prefix: str, partitions: str, path: str,
                *extra: str) -> None:
    """The child side of ``spawn``: a feeder appends records, a client sends paced commands."""
    from chronolog.log.port import Topics
    from chronolog.settings import LogConfig, open_log

    with open(path, "rb") as f:
        payload = pickle.load(f)
    lg = open_log(LogConfig(kind, target, Topics(prefix=prefix, partitions=int(partitions))))
    await lg.start()
    client = None
    if role == "client":
        client = Client(lg, reply_timeout=30)
        await client.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if client is not None:
        cmds = [codec.decode_command(v) for v in payload]
        lat, statuses = await paced(client, cmds, int(extra[0]))
        await client.close()
        result: dict[str, Any] = {"lat": lat, "statuses": statuses}
    else:
        t = time.perf_counter()
        await append_all(lg, [OutRecord(tp, k, v) for tp, k, v in payload])
        result = {"append_s": time.perf_counter() - t}
    await lg.close()
    print(json.dumps(result), flush=True)


async def drain(lg: Any, n: int, config: ProcessorConfig, recs: list[OutRecord] | None = None,
                backlog: bool = False, feed: asyncio.subprocess.Process | None = None,
                ) -> tuple[Processor, float, float, float, int]:
    """Run a processor until it decided ``n`` commands (setup: ``recs`` is None).

    ``backlog``: ``recs`` are appended first, then the processor joins and restores, and
    the clock starts once every partition is owned; commands it decided before that
    (Kafka assigns partitions one by one) are left out of the timed count. Otherwise
    (``live``) the processor joins and restores first, then ``recs`` are appended by this
    same process while it drains them, and the clock runs from the start of the append.
    Returns (processor, restore_s, drain_s, append_s, commands timed).
    """
    append_s = 0.0
    if recs is not None and backlog:
        t = time.perf_counter()
        await append_all(lg, recs)
        append_s = time.perf_counter() - t
    proc = Processor(lg, f"bench-{uuid.uuid4().hex[:6]}", config=config)
    t0 = time.perf_counter()
    task = asyncio.create_task(proc.run())
    while len(proc.partitions) < lg.topics.partitions:
        if task.done():
            await task
        await asyncio.sleep(0.001)
    t1 = time.perf_counter()
    base = proc.stats.commands  # decided before the clock started
    if feed is not None:
        await go(feed)
    elif recs is not None and not backlog:
        await append_all(lg, recs)
        append_s = time.perf_counter() - t1
    while proc.stats.commands < n:
        if task.done():
            await task
        await asyncio.sleep(0.002)
    t2 = time.perf_counter()
    proc.stop()
    await task
    if feed is not None:
        append_s = (await finish(feed))["append_s"]
    return proc, t1 - t0, t2 - t1, append_s, n - base


async def first_runs(lg: Any) -> dict[str, str]:
    """schedule_id -> run_id of its first materialized run, from the events topic (a run is
    announced to workers only when one of them has a seat for it, and none runs here)."""
    out: dict[str, str] = {}
    topic = lg.topics.events
    for p in range(await lg.partitions_for(topic)):
        offset, end = 0, await lg.end_offset(topic, p)
        while offset < end:
            recs = await lg.read(topic, p, offset, 5000)
            if not recs:
                break
            for rec in recs:
                if b'"OccurrenceMaterialized"' in rec.value:
                    env = codec.decode_event(rec.value)
                    out.setdefault(env.schedule_id, env.payload.run_id)
            offset = recs[-1].offset + 1
    return out


async def reply_statuses(lg: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in range(lg.topics.partitions):
        offset, end = 0, await lg.end_offset(lg.topics.replies, p)
        while offset < end:
            recs = await lg.read(lg.topics.replies, p, offset, 5000)
            if not recs:
                break
            for rec in recs:
                status = codec.decode_reply(rec.value).status
                counts[status] = counts.get(status, 0) + 1
            offset = recs[-1].offset + 1
    return counts


async def setup_schedules(lg: Any, schedules: int, config: ProcessorConfig) -> dict[str, str]:
    """Create ``schedules`` schedules and run a processor until each has materialized its
    first run (the creates are decided before their first Tick is)."""
    await append_all(lg, records_of(lg, create_commands(schedules)))
    proc = Processor(lg, f"setup-{uuid.uuid4().hex[:6]}", config=config)
    task = asyncio.create_task(proc.run())
    deadline = time.monotonic() + 600
    runs: dict[str, str] = {}
    while len(runs) < schedules and time.monotonic() < deadline:
        if task.done():
            await task
        await asyncio.sleep(0.5)
        runs = await first_runs(lg)
    proc.stop()
    await task
    assert len(runs) == schedules, (len(runs), schedules)
    return runs


async def throughput(args: argparse.Namespace) -> dict[str, Any]:
    lg = make_log(args.log, args.partitions, args.sync)
    await lg.start()
    await lg.ensure_topics()
    config = processor_config(args)
    n = args.n
    before: dict[str, int] = {}
    if args.workload == "create":
        cmds = create_commands(n)
    else:
        runs = await setup_schedules(lg, n // 4, config)
        before = await reply_statuses(lg)
        cmds = mixed_commands(runs, n)
    recs = records_of(lg, cmds)
    del cmds
    feed = (await spawn(lg, "feeder", [(r.topic, r.key, r.value) for r in recs])
            if args.feed == "process" else None)
    proc, restore_s, elapsed, append_s, timed = await drain(
        lg, n, config, recs, backlog=args.feed == "backlog", feed=feed)
    del recs
    stats = proc.stats
    ok = None
    if args.workload == "mixed":
        after = await reply_statuses(lg)
        ok = round((after.get("ok", 0) - before.get("ok", 0)) / n, 4)
    await close_log(lg)
    return {"log": args.log, "sync": args.sync if args.log == "sqlite" else None,
            "workload": args.workload, "n": n, "batch": args.batch,
            "partitions": args.partitions, "restore_s": round(restore_s, 3),
            "feed": args.feed, "append_s": round(append_s, 3), "timed": timed,
            "seconds": round(elapsed, 3), "commands_per_s": round(timed / elapsed),
            "transactions": stats.transactions,
            "commands_per_txn": round(stats.commands / max(stats.transactions, 1), 1),
            "events": stats.events, "ok_fraction": ok}


async def paced(client: Client, cmds: list[m.CommandEnvelope], rate: int
                ) -> tuple[list[float], dict[str, int]]:
    """Send ``cmds`` at ``rate`` per second; each one's send -> reply time (ms), sorted."""
    lat: list[float] = []
    statuses: dict[str, int] = {}

    async def one(env: m.CommandEnvelope) -> None:
        t = time.perf_counter()
        env = env.model_copy(update={"reply_to": client.client_id})
        reply = await client.send(env)
        lat.append((time.perf_counter() - t) * 1000)
        statuses[reply.status] = statuses.get(reply.status, 0) + 1

    pending = []
    start = time.perf_counter()
    for i, env in enumerate(cmds):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(one(env)))
    await asyncio.gather(*pending)
    lat.sort()
    return lat, statuses


async def latency(args: argparse.Namespace) -> dict[str, Any]:
    lg = make_log(args.log, args.partitions, args.sync)
    await lg.start()
    await lg.ensure_topics()
    n = int(args.rate * args.seconds)
    config = processor_config(args)
    if args.workload == "create":
        cmds = [envelope(f"s{i}", m.CreateSchedule(spec=SPEC)) for i in range(n)]
    else:
        runs = await setup_schedules(lg, (n + 3) // 4, config)
        cmds = mixed_commands(runs, n)
    proc = Processor(lg, "bench", config=config)
    task = asyncio.create_task(proc.run())
    while len(proc.partitions) < args.partitions:
        await asyncio.sleep(0.05)
    if args.client == "process":
        sender = await spawn(lg, "client", [codec.encode_command(c) for c in cmds],
                             str(args.rate))
        await go(sender)
        result = await finish(sender)
        lat, statuses = result["lat"], result["statuses"]
    else:
        client = Client(lg, reply_timeout=30)
        await client.start()
        lat, statuses = await paced(client, cmds, args.rate)
        await client.close()
    proc.stop()
    await task
    await close_log(lg)
    return {"log": args.log, "sync": args.sync if args.log == "sqlite" else None,
            "workload": args.workload, "client": args.client, "rate": args.rate, "n": n,
            "p50_ms": round(lat[len(lat) // 2], 2),
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 2), "max_ms": round(lat[-1], 2),
            "ok_fraction": round(statuses.get("ok", 0) / n, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", choices=["sqlite", "kafka"], default="sqlite")
    ap.add_argument("--workload", choices=["create", "mixed"], default="mixed")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=500,
                    help="the processor's batch_max (= its getmany max_records)")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--feed", choices=["process", "backlog", "live"], default="process",
                    help="process: appended by a separate process once the clock starts; "
                         "backlog: appended before the clock starts; live: appended by the "
                         "bench process itself while the processor drains them")
    ap.add_argument("--sync", default="FULL", help="SQLite synchronous mode (FULL: product)")
    ap.add_argument("--no-pipeline", action="store_true",
                    help="commit each batch before polling the next (ProcessorConfig.pipeline)")
    ap.add_argument("--no-gc-tuning", action="store_true", help="ProcessorConfig.gc_tuning off")
    ap.add_argument("--client", choices=["inline", "process"], default="inline",
                    help="latency: the client runs in this process (inline, with the "
                         "processor) or in a separate process, as real clients do")
    ap.add_argument("--warmup", type=int, default=1,
                    help="latency: unmeasured runs first (a freshly started broker's JIT "
                         "warm-up doubled the first runs' p99); printed, left out of medians")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="keep the processor's info logs")
    args = ap.parse_args()
    if not args.verbose:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if not args.skip_throughput:
        tps = []
        for _ in range(args.runs):
            r = asyncio.run(throughput(args))
            print(json.dumps(r), flush=True)
            tps.append(r["commands_per_s"])
        if args.runs > 1:
            print(json.dumps({"log": args.log, "workload": args.workload, "batch": args.batch,
                              "median_commands_per_s": statistics.median(tps)}), flush=True)
    if not args.skip_latency:
        p50s, p99s = [], []
        for i in range(args.warmup + args.runs):
            r = asyncio.run(latency(args))
            if i < args.warmup:
                print(json.dumps({"warmup": True, **r}), flush=True)
                continue
            print(json.dumps(r), flush=True)
            p50s.append(r["p50_ms"])
            p99s.append(r["p99_ms"])
        if args.runs > 1:
            print(json.dumps({"log": args.log, "workload": args.workload, "rate": args.rate,
                              "median_p50_ms": statistics.median(p50s),
                              "median_p99_ms": statistics.median(p99s)}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        asyncio.run(child(*sys.argv[2:]))
    else:
        main()
