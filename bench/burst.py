"""Burst benchmark: N one-shot schedules due at one instant T, run by separate processes.

The protocol (shared with the peers in ``bench/peers/``): N one-shot jobs all due at T, placed
after the enqueue with a margin; the handler is a no-op that records its start
(``bench/burstlib.py``); 1 ``chronolog processor`` + ``--workers`` ``chronolog worker``
processes with ``--concurrency`` slots each, started as a deployment would start them.

    .venv/bin/python bench/burst.py [--log sqlite|kafka] [--n 10000] [--runs 3]
        [--workers 2] [--concurrency 8] [--partitions 12] [--window 200] [--awaited 200]
        [--compare celery] [--other N] [--sustained RATE --seconds S] [--profile DIR]
        [--warmup N] [--chunk K]

The schedules are created one command each (``--chunk 1``, the default; ``--chunk K`` puts
K creates in one append), ``--window`` of them in flight, and the workers keep results in a
filesystem store (``--results`` under the run directory), as a deployment's would. On Kafka,
``--warmup N`` first runs an unreported burst of N: the first burst on a fresh broker is
slower.

Per run it prints: first/last start after T, p50/p99/max lateness, runs/s over the burst,
lost/duplicated/early, the enqueue rate (pipelined, ``--window`` in flight) and the reply
latency of creates sent one at a time (``--awaited`` of them), CPU seconds of the processor,
the workers and the broker during the burst (and their sum per run: the CPU per run), and
whether ``chronolog audit`` passed. Then the
medians. ``--compare celery`` interleaves a Celery 5 + Redis run (``bench/peers/``) after
each chronolog run and prints both side by side; its environment (a venv under
``bench/.peers/`` and Debian's ``redis-server``) is set up on first use.

Fairness: ``--other 5`` adds five ``every 1s`` schedules of another tenant, running from 3 s
before T to 12 s after it, and prints their start lateness (p50/p99/max) next to the burst:
with fair dispatch the other tenant's runs do not wait for the burst.

Kafka needs ``KAFKA_BOOTSTRAP_SERVERS`` (``scripts/kafka.sh up``). Run dirs and the SQLite
logs live under ``bench/results/`` (git-ignored), one per run, removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

import burstlib as B
from burst_jobs import JOB_TYPES
from chronolog.client import Client, NotFound
from chronolog.domain import messages as m
from chronolog.environment import uptime
from chronolog.log.port import Topics
from chronolog.log.reading import read_partition
from chronolog.log.sqlite import group_path
from chronolog.settings import LogConfig, open_log
from chronolog.workers.runtime import worker_group

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
PEERS = HERE / ".peers"
TENANT = "bench"
OTHER = "other"  # the tenant of --other: every-1s schedules that run through the burst
OTHER_JID = 90_000_000  # job ids of --other schedules (apart from the burst's)
OTHER_SECONDS = 15  # occurrences of each --other schedule: from T-3 s to T+12 s


# --------------------------------------------------------------------------- processes

def spawn(args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([CHRONOLOG, *args], env=env, stdout=open(log_path, "wb"),
                            stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen[bytes]], processors: int = 1) -> None:
    """SIGTERM by PID, workers first (they drain through the processors: the first
    ``processors`` of ``procs``), bounded, then kill."""
    for group in (procs[processors:], procs[:processors]):
        for p in group:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in group:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


async def live_members(cfg: LogConfig, group: str) -> int:
    if cfg.kind == "sqlite":
        with sqlite3.connect(f"file:{group_path(cfg.target)}?mode=ro", uri=True) as db:
            return db.execute("SELECT count(*) FROM members WHERE grp = ? AND heartbeat_until > ?",
                              (group, uptime())).fetchone()[0]  # the groups' clock
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=cfg.target)
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([group])
        groups = described[0].groups if hasattr(described[0], "groups") else described
        # a group is (error, group, state, type, protocol, members)
        return sum(len(g[5]) for g in groups if g[2] == "Stable")
    finally:
        await admin.close()


async def delete_topics(cfg: LogConfig) -> None:
    if cfg.kind != "kafka":
        return
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=cfg.target)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(cfg.topics.prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


# --------------------------------------------------------------------------- one run

def profile(args: Any, procs: list[subprocess.Popen[bytes]], run_dir: Path,
            phase: str) -> list[subprocess.Popen[bytes]]:
    """``--profile DIR``: py-spy samples every chronolog process and this one (the client)
    through one phase (``enqueue`` or ``burst``); collapsed stacks in DIR/<phase>-<process>.txt."""
    if not args.profile:
        return []
    pids = {"client": os.getpid()}
    pids.update({f"processor{i}" if i else "processor": p.pid
                 for i, p in enumerate(procs[:args.processors])})
    pids.update({f"worker{i}": p.pid for i, p in enumerate(procs[args.processors:])})
    return B.spy_on(pids, args.profile, phase)


async def wait_processor(client: Client, deadline: float) -> None:
    """The processor owns and has restored every partition: a probe on each gets not_found."""
    for p in range(client.topics.partitions):
        while True:
            try:
                await client.pause(TENANT, f"probe-{p}-{uuid.uuid4().hex[:6]}")
            except NotFound:
                break
            except Exception:  # not ready yet
                if time.time() > deadline:
                    raise
                await asyncio.sleep(0.2)


async def count_results(lg: Any, topic: str, partitions: int, offsets: list[int],
                        seen: int) -> int:
    for p in range(partitions):
        async for batch in read_partition(lg, topic, p, start=offsets[p]):
            offsets[p] = batch[-1].offset + 1
            seen += sum(1 for rec in batch if b'"ResultPublished"' in rec.value)
    return seen


async def chronolog_run(args: Any, run_dir: Path) -> dict[str, Any]:
    prefix = f"burst{uuid.uuid4().hex[:8]}."
    topics = Topics(prefix=prefix, partitions=args.partitions)
    if args.log == "sqlite":
        cfg = LogConfig("sqlite", str(run_dir / "log.db"), topics)
        url = f"sqlite://{cfg.target}"
    else:
        servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not servers:
            raise SystemExit("--log kafka needs KAFKA_BOOTSTRAP_SERVERS (scripts/kafka.sh up)")
        cfg = LogConfig("kafka", servers, topics)
        url = f"kafka://{servers}"
    flags = ["--log", url, "--partitions", str(args.partitions), "--topic-prefix", prefix]
    env = {k: v for k, v in os.environ.items()
           if k not in ("CHRONOLOG_LOG", "CHRONOLOG_TOPIC_PREFIX", "CHRONOLOG_PARTITIONS")}
    env.update(BENCH_RUN_DIR=str(run_dir), CHRONOLOG_LOG_LEVEL="WARNING",
               PYTHONPATH=str(HERE) + os.pathsep + env.get("PYTHONPATH", ""))
    lg = open_log(cfg)
    await lg.start()
    await lg.ensure_topics()
    procs = [spawn(["processor", *flags, "--member-id", f"burst-p{i}"],
                   run_dir / f"processor{i}.log", env) for i in range(args.processors)]
    for i in range(args.workers):
        procs.append(spawn(["worker", *flags, "--jobs", "burst_jobs", "--worker-id", f"burst-w{i}",
                            "--concurrency", str(args.concurrency),
                            *(["--prefetch", str(args.prefetch)]
                              if args.prefetch is not None else []),
                            "--results", str(run_dir / "results")],
                           run_dir / f"worker{i}.log", env))
    kpids = B.broker_pids(cfg.target) if cfg.kind == "kafka" else []
    client = Client(lg, reply_timeout=120)
    await client.start()
    res: dict[str, Any] = {"system": f"chronolog-{args.log}"}
    try:
        deadline = time.time() + 120
        await wait_processor(client, deadline)
        while await live_members(cfg, worker_group(prefix, JOB_TYPES)) < args.workers:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"workers did not join within 120 s (see {run_dir})")
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)  # settle after the last rebalance, as the peers' protocol does

        def cpu() -> dict[str, float]:
            own = psutil.Process().cpu_times()  # this process only, not its children
            out = {"client": own.user + own.system,
                   "processor": B.cpu_seconds([p.pid for p in procs[:args.processors]]),
                   "workers": B.cpu_seconds([p.pid for p in procs[args.processors:]])}
            if kpids:
                out["broker"] = B.cpu_seconds(kpids)  # every broker of the cluster
            return out

        await (sustained if args.sustained else burst)(args, run_dir, client, lg, cpu, procs, res)
    finally:
        await client.close()
        stop(procs, args.processors)
    audit = subprocess.run([CHRONOLOG, "audit", "--log", url, "--partitions", str(args.partitions),
                            "--json"], env=dict(env, CHRONOLOG_TOPIC_PREFIX=prefix),
                           capture_output=True, text=True, check=False)
    res["audit_ok"] = audit.returncode == 0
    if audit.returncode != 0:
        res["audit_output"] = (audit.stdout + audit.stderr)[-2000:]
    await delete_topics(cfg)
    await lg.close()
    return res


async def burst(args: Any, run_dir: Path, client: Client, lg: Any, cpu: Any,
                procs: list[Any], res: dict[str, Any]) -> None:
    """N one-shots due at one instant T, placed after the enqueue."""
    cpu0, t0 = cpu(), time.time()
    instant = float(int(t0 + args.n / args.est_rate * 1.2 + args.margin) + 1)
    at = datetime.fromtimestamp(instant, tz=UTC).isoformat()

    def spec(i: int) -> m.ScheduleSpec:
        return m.ScheduleSpec.model_validate({"at": at, "job": {"type": "bench",
                                                               "params": {"jid": i}}})

    for i in range(args.other):  # another tenant's every-1s schedules through the burst
        await client.create_schedule(OTHER, f"o{i}", m.ScheduleSpec.model_validate({
            "every": "1s", "max_count": OTHER_SECONDS, "misfire": "all", "overlap": "allow",
            "start": datetime.fromtimestamp(instant - 3, tz=UTC).isoformat(),
            "job": {"type": "late", "params": {"jid": OTHER_JID + i}}}))
    awaited = min(args.awaited, args.n)
    latencies = []
    for i in range(awaited):  # one at a time, each awaited: the reply latency a caller sees
        s = time.perf_counter()
        await client.create_schedule(TENANT, f"j{i}", spec(i))
        latencies.append(time.perf_counter() - s)
    t1 = time.time()
    window = asyncio.Semaphore(max(1, args.window // args.chunk))

    async def create(first: int) -> None:
        """``--chunk`` creates in one append (Client.create_schedules); failures raise."""
        async with window:
            ids = range(first, min(first + args.chunk, args.n))
            for result in await client.create_schedules(TENANT, [(f"j{i}", spec(i))
                                                                 for i in ids]):
                if isinstance(result, Exception):
                    raise result

    spies = profile(args, procs, run_dir, "enqueue")
    await asyncio.gather(*(create(i) for i in range(awaited, args.n, args.chunk)))
    t2 = time.time()
    cpu1 = cpu()
    B.stop_spies(spies)
    latencies.sort()
    res.update(
        enqueue_rate=(args.n - awaited) / (t2 - t1) if args.n > awaited else None,
        create_p50_ms=B.pct(latencies, 50) * 1000, create_p99_ms=B.pct(latencies, 99) * 1000,
        gap_after_enqueue=instant - t2,
        cpu_enqueue={k: cpu1[k] - cpu0[k] for k in cpu0},
    )
    await asyncio.to_thread(B.wait_until, instant - 2)
    cpu2 = cpu()
    spies = profile(args, procs, run_dir, "burst")
    await asyncio.to_thread(B.wait_records, str(run_dir), args.n, instant + args.timeout)
    cpu3 = cpu()
    B.stop_spies(spies)
    res.update(B.analyse(str(run_dir), args.n, instant))
    res["cpu_burst"] = {k: cpu3[k] - cpu2[k] for k in cpu2}
    # completion: every run's result is published (chronolog's own record of it)
    offsets, seen = [0] * args.partitions, 0
    deadline = time.time() + 120
    while seen < args.n and time.time() < deadline:
        seen = await count_results(lg, lg.topics.events, args.partitions, offsets, seen)
        if seen < args.n:
            await asyncio.sleep(0.2)
    res["results_published"] = seen
    res["all_published_after_T"] = time.time() - instant
    if args.other:
        await asyncio.to_thread(B.wait_lateness, str(run_dir), args.other * OTHER_SECONDS,
                                instant + OTHER_SECONDS + 30)
        res["other"] = B.analyse_lateness(str(run_dir), args.other, OTHER_SECONDS)


async def sustained(args: Any, run_dir: Path, client: Client, lg: Any, cpu: Any,
                    procs: list[Any], res: dict[str, Any]) -> None:
    """``--sustained R`` schedules ``every 1s`` from one instant for ``--seconds``: R runs/s."""
    n, seconds = args.sustained, args.seconds
    first = float(int(time.time() + n / args.est_rate * 1.2 + args.margin) + 1)
    start = datetime.fromtimestamp(first, tz=UTC).isoformat()
    window = asyncio.Semaphore(args.window)

    async def create(i: int) -> None:
        async with window:
            await client.create_schedule(TENANT, f"j{i}", m.ScheduleSpec.model_validate({
                "every": "1s", "start": start, "max_count": seconds, "misfire": "all",
                "overlap": "allow", "job": {"type": "late", "params": {"jid": i}}}))

    t0 = time.time()
    await asyncio.gather(*(create(i) for i in range(n)))
    res.update(enqueue_rate=n / (time.time() - t0), gap_after_enqueue=first - time.time())
    await asyncio.to_thread(B.wait_until, first - 1)
    cpu0 = cpu()
    await asyncio.to_thread(B.wait_lateness, str(run_dir), n * seconds,
                            first + seconds + args.timeout)
    cpu1 = cpu()
    res.update(B.analyse_lateness(str(run_dir), n, seconds))
    res["cpu_burst"] = {k: cpu1[k] - cpu0[k] for k in cpu0}


# --------------------------------------------------------------------------- peers

def peer_python() -> str:
    """The Celery venv under bench/.peers (created on first use)."""
    py = PEERS / "venv" / "bin" / "python"
    if not (PEERS / "venv" / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS / "venv")], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "celery[redis]>=5.4,<6", "psutil"],
                       check=True)
        (PEERS / "venv" / ".installed").touch()
    if shutil.which("redis-server") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], check=False)
        if shutil.which("redis-server") is None:
            raise SystemExit("redis-server is needed for --compare celery: "
                             "apt-get install redis-server")
    return str(py)


def celery_run(args: Any, run_dir: Path) -> dict[str, Any]:
    out = subprocess.run([peer_python(), str(HERE / "peers" / "celery_burst.py"),
                          "--n", str(args.n),
                          "--run-dir", str(run_dir), "--workers", str(args.workers),
                          "--concurrency", str(args.concurrency), "--margin", str(args.margin)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"celery run failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- report

COLUMNS = [("first_start", "first s", "{:.3f}"), ("last_start", "last s", "{:.2f}"),
           ("runs_per_s", "runs/s", "{:.0f}"), ("p50", "p50 s", "{:.2f}"),
           ("p99", "p99 s", "{:.2f}"), ("max", "max s", "{:.2f}"),
           ("enqueue_rate", "enq/s", "{:.0f}"), ("create_p50_ms", "create p50 ms", "{:.1f}"),
           ("create_p99_ms", "create p99 ms", "{:.1f}")]


def row(name: str, r: dict[str, Any]) -> str:
    cells = [("-" if r.get(k) is None else fmt.format(r[k])) for k, _, fmt in COLUMNS]
    cpu = r.get("cpu_burst", {})
    checks = (f"lost {r.get('lost')} dup {r.get('duplicated')} early {r.get('early')}"
              + (f" audit {'ok' if r.get('audit_ok') else 'FAILED'}" if "audit_ok" in r else ""))
    other = r.get("other")
    # CPU per run: every chronolog process and the broker (not the benchmark's own client)
    per_run = (sum(v for k, v in cpu.items() if k != "client") / r["n"] * 1000
               if cpu and r.get("n") else None)
    return (f"{name:18} " + " ".join(f"{c:>9}" for c in cells)
            + "  cpu " + ",".join(f"{k}={v:.1f}" for k, v in cpu.items())
            + ("" if per_run is None else f" ({per_run:.2f} ms/run)") + "  " + checks
            + ("" if not other else
               f"  other tenant: p50 {other['p50']:.3f} p99 {other['p99']:.3f} max "
               f"{other['max']:.3f} s lost {other['lost']} dup {other['duplicated']}"))


def header() -> str:
    return f"{'system':18} " + " ".join(f"{h:>9}" for _, h, _ in COLUMNS)


def medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: B.median([r.get(k) for r in results]) for k, _, _ in COLUMNS}
    out["n"] = results[0].get("n")
    out["cpu_burst"] = {k: B.median([r["cpu_burst"].get(k) for r in results])
                        for k in results[0].get("cpu_burst", {})}
    for k in ("lost", "duplicated", "early"):
        out[k] = max(r.get(k) or 0 for r in results)
    if any("audit_ok" in r for r in results):
        out["audit_ok"] = all(r.get("audit_ok") for r in results)
    if all(r.get("other") for r in results):
        out["other"] = {k: (B.median([r["other"][k] for r in results])
                            if k in ("p50", "p99", "max") else max(r["other"][k] for r in results))
                        for k in ("p50", "p99", "max", "lost", "duplicated")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", choices=("sqlite", "kafka"), default="sqlite")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--processors", type=int, default=1,
                    help="chronolog processor processes sharing the partitions")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--prefetch", type=int, default=None,
                    help="worker --prefetch (default: the worker's own default)")
    ap.add_argument("--window", type=int, default=200, help="pipelined creates in flight")
    ap.add_argument("--chunk", type=int, default=1,
                    help="pipelined creates per append (Client.create_schedules); "
                         "1: one create_schedule call each")
    ap.add_argument("--awaited", type=int, default=200,
                    help="creates sent one at a time first, for the reply latency")
    ap.add_argument("--est-rate", type=float, default=None,
                    help="enqueue rate guess that places T (default 1500 sqlite, 600 kafka)")
    ap.add_argument("--margin", type=float, default=10.0, help="seconds from enqueue end to T")
    ap.add_argument("--timeout", type=float, default=600.0, help="bound on the burst, seconds")
    ap.add_argument("--compare", choices=("celery",), default=None)
    ap.add_argument("--sustained", type=int, default=None, metavar="RATE",
                    help="instead of a burst: RATE schedules every 1s for --seconds "
                         "(runs/s, start lateness percentiles)")
    ap.add_argument("--seconds", type=int, default=60, help="length of a --sustained run")
    ap.add_argument("--other", type=int, default=0, metavar="N",
                    help="fairness: N every-1s schedules of another tenant run through the "
                         "burst (their start lateness is reported)")
    ap.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="first run a burst of N, not reported (a fresh broker is slower)")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="sample each chronolog process with py-spy during the burst "
                         "(collapsed stacks in DIR; needs py-spy)")
    ap.add_argument("--json", default=None, help="also write every result to this file")
    args = ap.parse_args()
    if args.est_rate is None:
        args.est_rate = 1500.0 if args.log == "sqlite" else 600.0
    base = HERE / "results" / f"burst-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    print(f"burst: n={args.n} log={args.log} {args.workers} workers x {args.concurrency} slots, "
          f"{args.partitions} partitions, cpus={os.cpu_count()}", flush=True)
    print(header(), flush=True)
    results: dict[str, list[dict[str, Any]]] = {}
    if args.warmup:  # a first burst on a fresh broker is slower: run one, report none of it
        run_dir = base / "warmup"
        run_dir.mkdir(parents=True)
        warm = asyncio.run(chronolog_run(argparse.Namespace(**{**vars(args), "n": args.warmup}),
                                         run_dir))
        print(row(f"(warm-up, n={args.warmup})", warm), flush=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    for i in range(args.runs):
        systems = [f"chronolog-{args.log}"] + (["celery"] if args.compare else [])
        for system in systems:
            run_dir = base / f"{system}-{i + 1}"
            run_dir.mkdir(parents=True)
            r = (asyncio.run(chronolog_run(args, run_dir)) if system.startswith("chronolog")
                 else celery_run(args, run_dir))
            if r.get("gap_after_enqueue", 0) < 2:
                r["warning"] = f"T came {r.get('gap_after_enqueue', 0):.1f} s after the enqueue"
            results.setdefault(system, []).append(r)
            print(row(f"{system} #{i + 1}", r)
                  + (f"  WARNING {r['warning']}" if "warning" in r else ""), flush=True)
            if not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
    print(f"medians of {args.runs}:")
    for system, rs in results.items():
        print(row(system, medians(rs)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
