"""Scale benchmark: millions of live schedules held, restored and served by the processes a
deployment runs, and a top-of-the-hour wave measured on top of them.

1. **Build.** A fresh SQLite log (``--dir``, default under ``bench/results/``) gets
   ``--schedules`` live schedules of tenant ``bench`` in ``--partitions`` partitions, written
   straight through the log port (one ``ScheduleCreated`` each, as a processor writes it; no
   decider round trip): ``--wave`` of them ``every 1h`` with their instant at T, the rest
   ``every 1h`` (a ``--hourly`` share) or ``every 24h``, their first instants spread evenly
   at random over one period starting at T. T is ``--quiet`` seconds after the build's start:
   nothing is due before it, so the processors' restores do not race a catch-up, and at T
   the wave falls due on top of the steady background (``--hourly 0.1`` of 10,000,000: about
   380 runs a second). Every job is ``late`` of ``bench/burst_jobs.py``: the handler records
   its start lateness (start minus the occurrence's instant).
2. **First start.** ``--processors`` ``chronolog processor`` processes (one consumer group)
   and ``--workers`` ``chronolog worker`` processes (``--concurrency`` slots each) start
   together. Measured: when every partition is restored (``partition_assigned`` lines; the
   restore folds every event from offset 0) and each processor's resident memory. Then the
   bench waits for the processors' first complete snapshot round on ``state``.
3. **Restart**, ``--restarts`` times: SIGTERM to every processor, then start them again.
   Measured: the stop, when every partition is restored again (from its snapshot) and
   ready (``--ready-file``), and each processor's resident memory (``rss``) and peak
   (``hwm``). Per schedule: the processors' resident memory summed, divided by the schedules.
4. **The wave.** At T the wave and the background's first runs fall due. Until T +
   ``--after`` the bench samples the processors' and workers' CPU (and, with ``--profile
   DIR``, their stacks with py-spy); then it waits (at most ``--drain`` s) for every run due
   in [T, T + after] to have started once, and reports for the wave and for the background:
   runs started, lost, duplicated, early, start lateness (p50, p99, max) and the share
   started within 10 s of its instant.
5. ``chronolog audit`` on the log: none lost, doubled or early.

    .venv/bin/python bench/scale.py --schedules 1000000 --quiet 600
    .venv/bin/python bench/scale.py --schedules 10000000 --quiet 2400

If the processors are not restored before T the bench says so (the wave is then measured
as a catch-up); raise ``--quiet``. The directory is removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import psutil

import burstlib as B
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord, Topics
from chronolog.log.sqlite import SqliteEventLog
from chronolog.processors.snapshots import MARKER_KEY

HERE = Path(__file__).resolve().parent
CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
TENANT = "bench"
PREFIX = "chronolog."
HOUR, DAY = 3600.0, 86400.0
CHUNK = 20_000
MiB = 2**20
_OPTS = orjson.OPT_UTC_Z


# --------------------------------------------------------------------------- build


@dataclass
class Plan:
    """What the build wrote and what the wave window must hold."""

    instant: float  # T, epoch seconds
    schedules: int
    wave: int
    hourly: int = 0
    daily: int = 0
    # background schedules whose first instant is in [T, T + after]: jid -> instant
    background: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    bytes: int = 0


def spec_template(every: float) -> dict[str, Any]:
    return m.ScheduleSpec.model_validate({"every": every, "job": {"type": "late", "params": {}},
                                          "overlap": "allow"}).model_dump(mode="json")


def created(sid: str, jid: int, every: float, first: datetime, now: datetime,
            template: dict[str, Any]) -> bytes:
    """The ``ScheduleCreated`` a processor writes for a create of this schedule at a whole
    number of periods before ``first`` (no later than ``now``): a spec without an anchor
    is anchored at its creation, so the schedules' phases come from when they were created,
    as in a deployment whose schedules were created over time."""
    periods = math.ceil((first - now).total_seconds() / every)
    at = first - timedelta(seconds=every * periods)
    spec = dict(template, job=dict(template["job"], params={"jid": jid}))
    return orjson.dumps({
        "event_id": f"create-{sid}.0", "type": "ScheduleCreated", "version": 1,
        "key": f"{TENANT}/{sid}", "tenant": TENANT, "schedule_id": sid, "at": at,
        "causation_id": f"create-{sid}",
        "payload": {"type": "ScheduleCreated", "revision": 1, "spec": spec,
                    "request_key": None, "created_at": at, "anchor": at,
                    "next_run_at": first, "next_due_at": first}}, option=_OPTS)


async def build(args: argparse.Namespace, path: Path) -> Plan:
    started = time.time()
    instant = float(int(started + args.quiet))
    plan = Plan(instant, args.schedules, args.wave)
    t_at = datetime.fromtimestamp(instant, UTC)
    now = datetime.fromtimestamp(started, UTC)
    rng = random.Random(args.seed)
    templates = {HOUR: spec_template(HOUR), DAY: spec_template(DAY)}
    topics = Topics(prefix=PREFIX, partitions=args.partitions)
    lg = SqliteEventLog(str(path), topics, synchronous="OFF")  # a throwaway build
    await lg.start()
    await lg.ensure_topics()
    buffers: dict[int, list[OutRecord]] = {p: [] for p in range(args.partitions)}
    try:
        for jid in range(args.schedules):
            sid = f"s{jid:08d}"
            key = partition_key(TENANT, sid).encode()
            p = partition_for(key, args.partitions)
            if jid < args.wave:
                every, offset = HOUR, 0.0
            else:
                every = HOUR if rng.random() < args.hourly else DAY
                offset = rng.random() * every
                if offset <= args.after:
                    plan.background[jid] = instant + offset
            if every == HOUR:
                plan.hourly += 1
            else:
                plan.daily += 1
            first = t_at + timedelta(seconds=offset)
            buf = buffers[p]
            buf.append(OutRecord(topics.events, key,
                                 created(sid, jid, every, first, now, templates[every]),
                                 partition=p))
            if len(buf) >= CHUNK:
                await lg.append(buf)
                buffers[p] = []
            if jid and jid % 1_000_000 == 0:
                print(f"  built {jid:,} in {time.time() - started:.0f} s", flush=True)
        for buf in buffers.values():
            if buf:
                await lg.append(buf)
    finally:
        await lg.close()
    plan.seconds = time.time() - started
    plan.bytes = sum(os.path.getsize(f) for f in glob.glob(f"{path}*"))
    return plan


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log_path: Path
    ready_path: Path
    _pos: int = 0
    _rest: bytes = b""

    def lines(self) -> list[dict[str, Any]]:
        """The process's JSON log lines written since the last call."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return []
        self._pos += len(data)
        *whole, self._rest = (self._rest + data).split(b"\n")
        out = []
        for raw in whole:
            if raw.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    out.append(orjson.loads(raw))
        return out

    def ready(self) -> bool:
        try:
            return bool(orjson.loads(self.ready_path.read_bytes()).get("ready"))
        except (OSError, ValueError):
            return False


def spawn(run: Path, kind: str, label: str, args: argparse.Namespace) -> Proc:
    flags = ["--log", f"sqlite://{run / 'log.db'}", "--partitions", str(args.partitions),
             "--topic-prefix", PREFIX]
    ready = run / f"{label}.ready"
    ready.unlink(missing_ok=True)
    if kind == "processor":
        extra = ["--member-id", label]
    else:
        extra = ["--jobs", "burst_jobs", "--worker-id", label, "--concurrency",
                 str(args.concurrency), "--results", str(run / "results")]
    env = {k: v for k, v in os.environ.items()
           if k not in ("CHRONOLOG_LOG", "CHRONOLOG_TOPIC_PREFIX", "CHRONOLOG_PARTITIONS",
                        "CHRONOLOG_TENANTS")}
    env.update(BENCH_RUN_DIR=str(run),
               CHRONOLOG_LOG_LEVEL="INFO" if kind == "processor" else "WARNING",
               PYTHONPATH=str(HERE) + os.pathsep + env.get("PYTHONPATH", ""))
    log_path = run / f"{label}.log"
    with open(log_path, "ab") as out:
        popen = subprocess.Popen([CHRONOLOG, kind, *flags, *extra, "--ready-file", str(ready)],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env)
    proc = Proc(popen, log_path, ready)
    proc._pos = log_path.stat().st_size  # only what this start writes
    return proc


def stop(procs: list[Proc], timeout: float = 300.0) -> float:
    t0 = time.monotonic()
    for p in procs:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait()
    return time.monotonic() - t0


def memory_mib(pid: int) -> tuple[float, float]:
    """Resident memory and its peak (``VmHWM``) of one process."""
    rss = psutil.Process(pid).memory_info().rss / MiB
    hwm = rss
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return round(rss, 1), round(hwm, 1)


@dataclass
class Start:
    label: str
    restored: float | None = None  # every partition restored, s after the spawn
    ready: float | None = None  # every processor's ready file says ready
    from_snapshot: int = 0
    restore_s: list[float] = field(default_factory=list)
    cold: int = 0
    schedules: int = 0
    rss: list[float] = field(default_factory=list)
    hwm: list[float] = field(default_factory=list)
    stop_s: float | None = None


async def start_processors(run: Path, args: argparse.Namespace, label: str,
                           timeout: float) -> tuple[list[Proc], Start]:
    t0 = time.monotonic()
    procs = [spawn(run, "processor", f"processor{i}", args) for i in range(args.processors)]
    try:
        return await _restored(procs, t0, args, label, timeout)
    except BaseException:
        stop(procs)  # not restored in time (or interrupted): none is left running
        raise


async def _restored(procs: list[Proc], t0: float, args: argparse.Namespace, label: str,
                    timeout: float) -> tuple[list[Proc], Start]:
    res = Start(label)
    held: list[dict[int, dict[str, Any]]] = [{} for _ in procs]  # per process
    assigned: dict[int, dict[str, Any]] = {}
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        for p, mine in zip(procs, held, strict=True):
            for line in p.lines():
                if line.get("event") == "partition_assigned":
                    mine[line["partition"]] = line
                elif line.get("event") == "partition_dropped":
                    mine.pop(line["partition"], None)
            if p.popen.poll() is not None:
                raise SystemExit(f"{p.log_path.name}: the processor exited "
                                 f"({p.popen.returncode}); see {p.log_path}")
        assigned = {q: line for mine in held for q, line in mine.items()}
        if res.restored is None and len(assigned) == args.partitions:
            res.restored = time.monotonic() - t0
        if res.restored is not None and all(p.ready() for p in procs):
            res.ready = time.monotonic() - t0
            break
        await asyncio.sleep(0.05)
    else:
        raise SystemExit(f"{label}: not restored within {timeout:.0f} s ({len(assigned)} of "
                         f"{args.partitions} partitions)")
    res.from_snapshot = sum(1 for a in assigned.values() if a.get("from_snapshot"))
    res.restore_s = sorted(a.get("restore_s", 0.0) for a in assigned.values())
    res.cold = sum(a.get("cold", 0) for a in assigned.values())
    res.schedules = sum(a.get("schedules", 0) for a in assigned.values())
    for p in procs:
        rss, hwm = memory_mib(p.popen.pid)
        res.rss.append(rss)
        res.hwm.append(hwm)
    return procs, res


async def snapshot_round(run: Path, args: argparse.Namespace, timeout: float) -> float:
    """Seconds until every partition of ``state`` holds a complete round's marker."""
    t0 = time.monotonic()
    lg = SqliteEventLog(str(run / "log.db"), Topics(prefix=PREFIX, partitions=args.partitions))
    await lg.start()
    offsets = dict.fromkeys(range(args.partitions), 0)
    marked: set[int] = set()
    try:
        while len(marked) < args.partitions:
            if time.monotonic() - t0 > timeout:
                raise SystemExit(f"no complete snapshot round within {timeout:.0f} s")
            progressed = False
            for p in range(args.partitions):
                if p in marked:
                    continue
                recs = await lg.read(lg.topics.state, p, offsets[p], 20_000, 0)
                if recs:
                    progressed = True
                    offsets[p] = recs[-1].offset + 1
                    if any(r.key == MARKER_KEY for r in recs):
                        marked.add(p)
            if not progressed:
                await asyncio.sleep(0.5)
    finally:
        await lg.close()
    return time.monotonic() - t0


# --------------------------------------------------------------------------- the wave


def lateness(run: Path) -> dict[tuple[int, int], list[float]]:
    """Every recorded start: (jid, occurrence) -> the start latenesses recorded for it."""
    got: dict[tuple[int, int], list[float]] = {}
    for path in glob.glob(f"{run}/late.*.log"):
        with open(path, "rb") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    got.setdefault((int(parts[0]), int(parts[1])), []).append(float(parts[2]))
    return got


def summary(expected: dict[int, float], got: dict[tuple[int, int], list[float]]
            ) -> dict[str, Any]:
    firsts: list[float] = []
    lost = duplicated = early = 0
    for jid, instant in expected.items():
        seen = got.get((jid, round(instant) % 1_000_000))
        if not seen:
            lost += 1
            continue
        duplicated += len(seen) - 1
        early += sum(1 for v in seen if v < 0)
        firsts.append(min(seen))
    firsts.sort()
    within = sum(1 for v in firsts if v <= 10.0)
    return {"expected": len(expected), "started": len(firsts), "lost": lost,
            "duplicated": duplicated, "early": early,
            "p50": B.pct(firsts, 50), "p99": B.pct(firsts, 99),
            "max": firsts[-1] if firsts else float("nan"),
            "within_10s": within / len(expected) if expected else float("nan")}


def fmt(s: dict[str, Any]) -> str:
    return (f"{s['started']:,}/{s['expected']:,} started, lost {s['lost']}, duplicated "
            f"{s['duplicated']}, early {s['early']}; lateness p50 {s['p50']:.2f} s, p99 "
            f"{s['p99']:.2f} s, max {s['max']:.2f} s; within 10 s: {s['within_10s']:.2%}")


def profile(args: argparse.Namespace, procs: list[Proc]) -> list[subprocess.Popen[bytes]]:
    """``--profile DIR``: py-spy samples every processor and worker through [T, T + after];
    collapsed stacks in DIR/wave-<process>.txt (``burstlib.spy_on``)."""
    if not args.profile:
        return []
    return B.spy_on({p.log_path.stem: p.popen.pid for p in procs}, args.profile, "wave",
                    rate=100)


# --------------------------------------------------------------------------- main


def row(s: Start, schedules: int) -> str:
    total = sum(s.rss)
    per = total * MiB / schedules if schedules else 0
    return (f"  {s.label}: restored {s.restored:.1f} s, ready {s.ready:.1f} s; "
            f"{s.from_snapshot} of {len(s.restore_s)} partitions from a snapshot, restore "
            f"{min(s.restore_s):.1f}-{max(s.restore_s):.1f} s; {s.schedules:,} schedules "
            f"({s.cold:,} cold); rss {' + '.join(f'{x:.0f}' for x in s.rss)} = {total:,.0f} "
            f"MiB ({per:.0f} B per schedule), peak {' / '.join(f'{x:.0f}' for x in s.hwm)} MiB"
            + (f"; stop before it {s.stop_s:.1f} s" if s.stop_s is not None else ""))


async def main_async(args: argparse.Namespace) -> int:
    print("$ " + " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    base = Path(args.dir) if args.dir else HERE / "results"
    base.mkdir(parents=True, exist_ok=True)
    run = base / f"scale-{int(time.time())}"
    run.mkdir()
    procs: list[Proc] = []
    workers: list[Proc] = []
    try:
        plan = await build(args, run / "log.db")
        print(f"build: {plan.schedules:,} schedules ({plan.wave:,} in the wave; "
              f"{plan.hourly:,} every 1h, {plan.daily:,} every 24h) in {args.partitions} "
              f"partitions, {plan.seconds:.0f} s, {plan.bytes / 2**30:.2f} GiB on disk; "
              f"T in {plan.instant - time.time():.0f} s", flush=True)
        workers = [spawn(run, "worker", f"worker{i}", args) for i in range(args.workers)]
        procs, first = await start_processors(run, args, "first start (fold from 0)",
                                              args.timeout)
        print(row(first, plan.schedules), flush=True)
        took = await snapshot_round(run, args, args.timeout)
        print(f"  first snapshot round complete {took:.1f} s later", flush=True)
        starts = [first]
        for i in range(args.restarts):
            stopped = stop(procs)
            procs, again = await start_processors(run, args, f"restart {i + 1}", args.timeout)
            again.stop_s = stopped
            starts.append(again)
            print(row(again, plan.schedules), flush=True)
        if not all(w.ready() for w in workers):
            print("  warning: not every worker is ready", flush=True)
        left = plan.instant - time.time()
        if left < 0:
            print(f"  warning: restored {-left:.0f} s after T: the wave is a catch-up "
                  "(raise --quiet)", flush=True)
        else:
            print(f"  waiting {left:.0f} s for T", flush=True)
            await asyncio.sleep(left)

        def cpu() -> tuple[float, float]:
            return (B.cpu_seconds([p.popen.pid for p in procs]),
                    B.cpu_seconds([w.popen.pid for w in workers]))

        cpu0 = cpu()
        spies = profile(args, procs + workers)
        await asyncio.sleep(max(0.0, plan.instant + args.after - time.time()))
        cpu1 = cpu()
        B.stop_spies(spies)
        wave = dict.fromkeys(range(plan.wave), plan.instant)
        expected = len(wave) + len(plan.background)
        deadline = time.time() + args.drain
        got = lateness(run)
        while len(got) < expected and time.time() < deadline:
            await asyncio.sleep(1.0)
            got = lateness(run)
        w, b = summary(wave, got), summary(plan.background, got)
        print(f"wave at T ({plan.wave:,} runs): {fmt(w)}")
        print(f"background in [T, T+{args.after:.0f} s] ({len(plan.background):,} runs): "
              f"{fmt(b)}")
        runs = w["started"] + b["started"]
        print(f"CPU during [T, T+{args.after:.0f} s]: processors {cpu1[0] - cpu0[0]:.1f} s, "
              f"workers {cpu1[1] - cpu0[1]:.1f} s"
              + (f" ({((cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1])) / runs * 1000:.2f} ms per "
                 "run started)" if runs else ""), flush=True)
        stop(procs + workers)
        procs, workers = [], []
        t0 = time.monotonic()
        audit = subprocess.run([CHRONOLOG, "audit", "--log", f"sqlite://{run / 'log.db'}",
                                "--partitions", str(args.partitions)],
                               env=dict(os.environ, CHRONOLOG_TOPIC_PREFIX=PREFIX),
                               capture_output=True, text=True, check=False)
        print(f"audit: {'clean' if audit.returncode == 0 else 'FAILED'} "
              f"({time.monotonic() - t0:.0f} s)")
        if audit.returncode != 0:
            print((audit.stdout + audit.stderr)[-3000:])
        return 0 if audit.returncode == 0 and w["lost"] == b["lost"] == 0 else 1
    finally:
        stop(procs + workers)
        if args.keep:
            print(f"kept: {run}")
        else:
            shutil.rmtree(run, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=10_000_000)
    ap.add_argument("--wave", type=int, default=20_000,
                    help="schedules due at T (every 1h), the top of the hour")
    ap.add_argument("--hourly", type=float, default=0.1,
                    help="share of the other schedules every 1h (the rest every 24h)")
    ap.add_argument("--quiet", type=float, default=2400.0,
                    help="seconds from the build's start to T (nothing due before)")
    ap.add_argument("--after", type=float, default=60.0,
                    help="the measured window after T, seconds")
    ap.add_argument("--drain", type=float, default=300.0,
                    help="at most this long after the window for its runs to start")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--processors", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--restarts", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="at most this long for a start or a snapshot round")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", default=None, help="where the run directory goes")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--profile", metavar="DIR", default=None,
                    help="sample each processor and worker with py-spy through [T, T + after] "
                         "(collapsed stacks in DIR; needs py-spy)")
    args = ap.parse_args()
    if not 0 <= args.wave <= args.schedules:
        ap.error("--wave must be between 0 and --schedules")
    if not 0.0 <= args.hourly <= 1.0:
        ap.error("--hourly must be between 0 and 1")
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
