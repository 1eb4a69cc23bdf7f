"""Failover benchmark: how soon a processor taking a partition over serves it, with and
without snapshots (docs/design.md §14), as the partition's history grows.

Per (N, M) of ``--schedules`` x ``--events``, a fresh log gets ``--fill`` partitions each
holding N live schedules (``every 1h``, each with its own job params) and M events of
history (N creates, then rounds of materialized / fence / claimed / result events, oldest
first), written straight through the log port in big appends — no processor and no decider
round trip per event. Then, ``--runs`` times per mode:

* one event is committed by a bench owner of partition 0 (``NextRunPlanned``: schedule 0's
  next instant is due now) and one command is appended (a ``TriggerRun`` on schedule 1);
* a processor starts in a fresh process and is assigned every partition;
* measured from its assignment (``Processor.takeovers``): ``restore`` (states, timers and
  replies rebuilt), ``reply`` (the command's reply committed), ``fire`` (schedule 0's due
  occurrence materialized and committed), ``all`` (every filled partition restored).

Modes: ``full`` — snapshots off, the takeover folds ``events`` from offset 0 (the cost
before snapshots); ``snapshot`` — the default processor. Before the first ``snapshot`` run a
processor takes the partitions over once (a fold from 0) and writes its first complete
snapshot round (``prep`` in the output: not a takeover measurement).

    .venv/bin/python bench/failover.py --schedules 100000 --events 1000000,10000000 --runs 3
    .venv/bin/python bench/failover.py --log kafka --schedules 100000 --events 10000000
    .venv/bin/python bench/failover.py --fill 12 --schedules 83334 --events 1000000 --modes snapshot

Prints the command, one row per run and the medians per (N, M, mode), and, for several M,
how the median snapshot takeover of the longest history compares with the shortest.
Kafka needs ``KAFKA_BOOTSTRAP_SERVERS``; its topics (prefix ``benchfo...``) are deleted at
the end, and SQLite logs live in a temporary directory removed at the end (``--keep``: not).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psutil
import structlog

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key, run_id_for
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord, Topics
from chronolog.processors.config import ProcessorConfig
from chronolog.processors.runtime import Processor

TENANT = "bench"
EVERY_S = 3600.0
APPEND_CHUNK = 20_000
_OPTS = orjson.OPT_UTC_Z


# --------------------------------------------------------------------------- the log


def make_log(kind: str, partitions: int, sync: str = "FULL", path: str | None = None,
             prefix: str | None = None) -> Any:
    topics = Topics(prefix=prefix or f"benchfo{uuid.uuid4().hex[:8]}.", partitions=partitions)
    if kind == "sqlite":
        from chronolog.log.sqlite import SqliteEventLog

        path = path or os.path.join(tempfile.mkdtemp(prefix="chronolog-failover-"), "log.db")
        return SqliteEventLog(path, topics, synchronous=sync)
    from chronolog.log.kafka import KafkaEventLog

    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    return KafkaEventLog(servers, topics)


async def drop_log(lg: Any, keep: bool) -> None:
    """Delete what a build created: the SQLite file's directory, a Kafka run's topics."""
    if keep:
        return
    path = getattr(lg, "path", None)
    if path is not None and path.parent.name.startswith("chronolog-failover-"):
        shutil.rmtree(path.parent, ignore_errors=True)
    servers = getattr(lg, "bootstrap_servers", None)
    if servers is not None and lg.topics.prefix.startswith("benchfo"):
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=servers)
        await admin.start()
        try:
            names = [t for t in await admin.list_topics() if t.startswith(lg.topics.prefix)]
            if names:
                await admin.delete_topics(names)
        finally:
            await admin.close()


def schedule_ids(partitions: int, partition: int, n: int) -> list[str]:
    """``n`` schedule IDs whose keys fall on ``partition``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        sid = f"p{partition}-s{i}"
        if partition_for(partition_key(TENANT, sid).encode(), partitions) == partition:
            out.append(sid)
        i += 1
    return out


# --------------------------------------------------------------------------- history


def _spec(i: int) -> dict[str, Any]:
    return m.ScheduleSpec.model_validate(
        {"every": EVERY_S, "job": {"type": "noop", "params": {"customer": i}},
         "overlap": "allow"}).model_dump(mode="json")


def _event(cid: str, i: int, sid: str, at: datetime, payload: dict[str, Any]) -> bytes:
    return orjson.dumps({"event_id": f"{cid}.{i}", "type": payload["type"], "version": 1,
                         "key": f"{TENANT}/{sid}", "tenant": TENANT, "schedule_id": sid,
                         "at": at, "causation_id": cid, "payload": payload}, option=_OPTS)


def history_size(n: int, events: int) -> int:
    """How many events ``history`` writes for ``n`` schedules and about ``events``."""
    return n + 4 * n * max(0, (events - n) // (4 * n))


def _events(sids: list[str], events: int, now: datetime) -> Iterator[bytes]:
    """The encoded events of ``sids`` (``history_size`` in all), in append order: the creates,
    then rounds of one run per schedule (materialized, fence, claimed, result), an hour
    apart, ending before ``now``; each schedule's next instant is after ``now`` (nothing is
    due at a takeover but what the bench plans)."""
    n = len(sids)
    rounds = max(0, (events - n) // (4 * n))
    anchor = (now.replace(minute=0, second=0, microsecond=0)
              - timedelta(seconds=EVERY_S * (rounds - 1)))

    first_run = anchor if rounds else anchor + timedelta(seconds=EVERY_S)
    for i, sid in enumerate(sids):
        yield _event(f"create-{sid}", 0, sid, anchor, {
            "type": "ScheduleCreated", "revision": 1, "spec": _spec(i), "request_key": None,
            "created_at": anchor, "anchor": anchor, "next_run_at": first_run,
            "next_due_at": first_run})
    for k in range(rounds):
        instant = anchor + timedelta(seconds=EVERY_S * k)
        nxt = instant + timedelta(seconds=EVERY_S)
        claimed = instant + timedelta(seconds=1)
        for i, sid in enumerate(sids):
            run_id = run_id_for(TENANT, sid, instant)
            job = {"type": "noop", "params": {"customer": i}, "timeout": None}
            tick = f"tick:{sid}:{k}"
            yield _event(tick, 0, sid, instant, {
                "type": "OccurrenceMaterialized", "run_id": run_id, "scheduled_at": instant,
                "due_at": instant, "revision": 1, "job": job, "trigger": "schedule",
                "request_key": None, "request_digest": None, "state": "READY",
                "start_deadline_at": None, "resource_class": "default", "priority": 0,
                "sequence": k + 1, "next_run_at": nxt, "next_due_at": nxt,
                "advances_schedule": True})
            claim = f"assign:{sid}:{k}"
            yield _event(claim, 0, sid, claimed, {
                "type": "FenceAdvanced", "fence": k + 1, "run_id": run_id, "reason": "claim"})
            yield _event(claim, 1, sid, claimed, {
                "type": "AttemptClaimed", "run_id": run_id, "attempt": 1, "fence": k + 1,
                "worker_id": "bench-worker", "claimed_at": claimed,
                "lease_until": claimed + timedelta(seconds=30)})
            yield _event(f"done:{sid}:{k}", 0, sid, claimed + timedelta(seconds=1), {
                "type": "ResultPublished", "run_id": run_id, "attempt": 1, "fence": k + 1,
                "worker_id": "bench-worker", "checksum": "sha256:00", "size": 2, "uri": None,
                "inline": {"ok": True}, "finished_at": claimed + timedelta(seconds=1)})


def history(sids: list[str], events: int, now: datetime) -> Iterator[list[bytes]]:
    """``_events`` in chunks of ``APPEND_CHUNK``, made as they are appended (10 million
    events do not fit in memory at once)."""
    chunk: list[bytes] = []
    for value in _events(sids, events, now):
        chunk.append(value)
        if len(chunk) >= APPEND_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def build(args: argparse.Namespace, n: int, events: int) -> tuple[Any, dict[int, list[str]],
                                                                          int, float]:
    """A fresh log with ``--fill`` partitions of ``n`` schedules and ``events`` events."""
    now = datetime.now(UTC)
    started = time.monotonic()
    lg = make_log(args.log, args.partitions, "OFF")  # a throwaway build: no fsync per append
    await lg.start()
    await lg.ensure_topics()
    sids: dict[int, list[str]] = {}
    written = 0
    t = lg.topics
    for p in range(args.fill):
        sids[p] = schedule_ids(args.partitions, p, n)
        for chunk in history(sids[p], events, now):
            await lg.append([OutRecord(t.events, None, v, partition=p) for v in chunk])
        written += history_size(n, events)
    await lg.close()
    if args.log == "sqlite":
        lg = make_log("sqlite", args.partitions, "FULL", str(lg.path), t.prefix)
    else:
        lg = make_log("kafka", args.partitions, prefix=t.prefix)
    await lg.start()
    return lg, sids, written, time.monotonic() - started


# --------------------------------------------------------------------------- a takeover


@dataclass
class Run:
    mode: str
    restore: float | None = None
    reply: float | None = None
    fire: float | None = None
    all_restored: float | None = None
    from_snapshot: bool = False
    state_records: int = 0
    tail_events: int = 0
    rejected: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


async def plan(lg: Any, canary: str, target: str, now: datetime) -> str:
    """Schedule 0 due now (one event, committed as its partition's owner would: this fences
    no running processor, none runs); a command for schedule 1 waiting on ``commands``."""
    t = lg.topics
    p = partition_for(partition_key(TENANT, canary).encode(), t.partitions)
    owner = await lg.acquire(p, "bench-planner")
    cid = f"plan-{uuid.uuid4().hex}"
    due = now - timedelta(seconds=1)
    await owner.commit([OutRecord(t.events, partition_key(TENANT, canary).encode(),
                                  _event(cid, 0, canary, now, {"type": "NextRunPlanned",
                                                               "next_run_at": due,
                                                               "next_due_at": due}),
                                  partition=p)], {}, "bench")
    await owner.close()
    env = m.CommandEnvelope(command_id=f"bench-{uuid.uuid4().hex}", type="TriggerRun",
                            tenant=TENANT, principal="bench", schedule_id=target,
                            issued_at=now, payload=m.TriggerRun(request_key=uuid.uuid4().hex))
    await lg.append([OutRecord(t.commands, partition_key(TENANT, target).encode(),
                               codec.encode_command(env))])
    return env.command_id


async def takeover(lg: Any, sids: dict[int, list[str]], mode: str, timeout: float) -> Run:
    """One measured takeover, by a processor in a fresh process (as a takeover is: nothing
    of the partition's specs or states is in its memory yet)."""
    canary = sids[0][0]
    target = sids[0][1] if len(sids[0]) > 1 else canary
    cid = await plan(lg, canary, target, datetime.now(UTC))
    job = {"log": "sqlite" if getattr(lg, "path", None) else "kafka",
           "path": str(getattr(lg, "path", "")), "prefix": lg.topics.prefix,
           "partitions": lg.topics.partitions, "mode": mode, "canary": canary, "cid": cid,
           "filled": sorted(sids), "timeout": timeout}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, os.path.abspath(__file__), "--child", orjson.dumps(job).decode(),
        stdout=asyncio.subprocess.PIPE, env=os.environ)
    out, _ = await proc.communicate()
    text = out.decode().splitlines()
    for x in text:  # the processor's warnings (a snapshot rejected or off, ...)
        if not x.startswith("{"):
            print(f"  child: {x}", file=sys.stderr, flush=True)
    lines = [x for x in text if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        run = Run(mode)
        run.extra["error"] = f"the processor process failed (exit {proc.returncode})"
        return run
    got = orjson.loads(lines[-1])
    extra = got.pop("extra", {})
    run = Run(**got)
    run.extra = extra
    return run


async def child(job: dict[str, Any]) -> None:
    """The processor process of one takeover: prints its Run as JSON."""
    lg = make_log(job["log"], job["partitions"], path=job["path"] or None,
                  prefix=job["prefix"])
    await lg.start()
    config = ProcessorConfig(snapshots=(job["mode"] == "snapshot"))
    proc = Processor(lg, f"bench-{job['mode']}-{uuid.uuid4().hex[:6]}", config=config)
    canary_key = partition_key(TENANT, job["canary"])
    cid = job["cid"]
    fired: list[float] = []

    def hook(partition: int, envelopes: list[m.EventEnvelope]) -> None:
        if not fired and any(e.key == canary_key and e.type == "OccurrenceMaterialized"
                             and e.causation_id and e.causation_id.startswith("tick:")
                             for e in envelopes):
            fired.append(time.monotonic())

    proc.on_commit.append(hook)
    task = asyncio.create_task(proc.run())
    run = Run(job["mode"])
    replied: float | None = None
    deadline = time.monotonic() + job["timeout"]
    try:
        while time.monotonic() < deadline and not task.done():
            ps = proc.partitions.get(0)
            if replied is None and ps is not None and cid in ps.replies:
                replied = time.monotonic()
            if replied is not None and fired:
                break
            await asyncio.sleep(0.002)
        # resident memory once every filled partition is restored (the process's peak is
        # the same or higher: the restore's buffers are freed by then)
        filled_done = lambda: all(any(t.partition == q for t in proc.takeovers)  # noqa: E731
                                  for q in job["filled"])
        while time.monotonic() < deadline and not task.done() and not filled_done():
            await asyncio.sleep(0.05)
        run.extra["rss_mib"] = round(psutil.Process().memory_info().rss / 2**20, 1)
    finally:
        proc.stop()
        await asyncio.wait_for(task, 120)
        await lg.close()
    took = {t.partition: t for t in proc.takeovers}
    t0 = took.get(0)
    if t0 is None:
        run.extra["error"] = "partition 0 never assigned"
    else:
        run.restore = t0.restored_at - t0.assigned_at
        run.reply = None if replied is None else replied - t0.assigned_at
        run.fire = None if not fired else fired[0] - t0.assigned_at
        filled = [took[p] for p in job["filled"] if p in took]
        run.all_restored = max(t.restored_at for t in filled) - t0.assigned_at
        run.from_snapshot = all(t.from_snapshot for t in filled)
        run.state_records = sum(t.snapshot_records for t in filled)
        run.tail_events = sum(t.tail_events for t in filled)
        run.rejected = next((t.rejected for t in filled if t.rejected), None)
        run.extra["states"] = sum(t.states for t in filled)
    print(orjson.dumps(run.__dict__).decode(), flush=True)


async def prepare_snapshot(lg: Any, sids: dict[int, list[str]], timeout: float) -> float:
    """One processor takes the partitions over and writes a complete snapshot round of
    every filled partition; returns how long that took."""
    started = time.monotonic()
    proc = Processor(lg, f"bench-prep-{uuid.uuid4().hex[:6]}")
    task = asyncio.create_task(proc.run())
    deadline = started + timeout
    shown = started
    try:
        while time.monotonic() < deadline and not task.done():
            snaps = [proc.partitions[p].snap for p in sids if p in proc.partitions]
            if time.monotonic() - shown >= 10:  # progress, on stderr
                shown = time.monotonic()
                print(f"  prep {shown - started:.0f} s: " + "; ".join(
                    f"p{s.partition} rounds {s.stats.rounds} states {s.stats.states} "
                    f"left {len(s.round.pending) if s.round else 0}"
                    for s in snaps if s is not None), file=sys.stderr, flush=True)
            if len(snaps) == len(sids) and all(
                    s is not None and s.stats.rounds >= 1 and s.round is None for s in snaps):
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError("no complete snapshot round within the timeout")
    finally:
        proc.stop()
        await asyncio.wait_for(task, 120)
    return time.monotonic() - started


# --------------------------------------------------------------------------- output


COLUMNS = ("schedules", "events", "mode", "restore_s", "reply_s", "fire_s", "all_s",
           "state_recs", "tail_evts", "rss_mib")


def header() -> str:
    return " ".join(f"{c:>11}" for c in COLUMNS)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def row(n: int, events: int, label: str, r: Run) -> str:
    cells = [f"{n:,}", f"{events:,}", label, _f(r.restore), _f(r.reply), _f(r.fire),
             _f(r.all_restored), f"{r.state_records:,}", f"{r.tail_events:,}",
             str(r.extra.get("rss_mib", "-"))]
    note = ""
    if r.mode == "snapshot" and not r.from_snapshot:
        note = f"  (NOT from a snapshot: {r.rejected or 'none found'})"
    if "error" in r.extra:
        note += f"  ERROR {r.extra['error']}"
    return " ".join(f"{c:>11}" for c in cells) + note


def median_run(runs: list[Run]) -> Run:
    def med(vals: list[float | None]) -> float | None:
        got = [v for v in vals if v is not None]
        return statistics.median(got) if got else None

    out = Run(runs[0].mode)
    out.restore = med([r.restore for r in runs])
    out.reply = med([r.reply for r in runs])
    out.fire = med([r.fire for r in runs])
    out.all_restored = med([r.all_restored for r in runs])
    out.from_snapshot = all(r.from_snapshot for r in runs)
    out.state_records = int(statistics.median([r.state_records for r in runs]))
    out.tail_events = int(statistics.median([r.tail_events for r in runs]))
    out.rejected = next((r.rejected for r in runs if r.rejected), None)
    rss = [r.extra["rss_mib"] for r in runs if "rss_mib" in r.extra]
    if rss:
        out.extra["rss_mib"] = round(statistics.median(rss), 1)
    return out


def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x]


async def main_async(args: argparse.Namespace) -> None:
    print("failover: " + " ".join([os.path.basename(sys.executable), *sys.argv]), flush=True)
    print(f"log={args.log} partitions={args.partitions} filled={args.fill} runs={args.runs} "
          f"modes={','.join(args.modes)} cpus={os.cpu_count()}", flush=True)
    medians: dict[tuple[int, int, str], Run] = {}
    for n in _ints(args.schedules):
        for events in _ints(args.events):
            lg, sids, written, build_s = await build(args, n, events)
            print(f"built {args.fill} x ({n:,} schedules, {written:,} events) in "
                  f"{build_s:.1f} s", flush=True)
            print(header(), flush=True)
            try:
                for mode in args.modes:
                    if mode == "snapshot":
                        prep = await prepare_snapshot(lg, sids, args.timeout)
                        print(f"{'':>35} prep: a fold from 0 and a complete snapshot round "
                              f"in {prep:.1f} s", flush=True)
                    runs = []
                    for i in range(args.runs):
                        r = await takeover(lg, sids, mode, args.timeout)
                        runs.append(r)
                        print(row(n, written, f"{mode}#{i + 1}", r), flush=True)
                    medians[(n, written, mode)] = median_run(runs)
                    print(row(n, written, f"{mode} med", medians[(n, written, mode)]),
                          flush=True)
            finally:
                await lg.close()
                await drop_log(lg, args.keep)
    print("medians:")
    print(header())
    for (n, events, _mode), r in medians.items():
        print(row(n, events, r.mode, r))
    for n in _ints(args.schedules):
        snaps = sorted((ev, r) for (nn, ev, mode), r in medians.items()
                       if nn == n and mode == "snapshot" and r.fire is not None)
        if len(snaps) >= 2 and snaps[0][1].fire:
            (lo, a), (hi, b) = snaps[0], snaps[-1]
            assert a.fire is not None and b.fire is not None
            print(f"snapshot takeover, {n:,} schedules: {hi:,} vs {lo:,} events of history: "
                  f"fire {b.fire:.3f} / {a.fire:.3f} s = {b.fire / a.fire:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", choices=("sqlite", "kafka"), default="sqlite")
    ap.add_argument("--schedules", default="100000",
                    help="live schedules per filled partition (comma list: one build each)")
    ap.add_argument("--events", default="1000000",
                    help="events of history per filled partition (comma list)")
    ap.add_argument("--runs", type=int, default=3, help="takeovers per mode (median)")
    ap.add_argument("--modes", default="full,snapshot",
                    help="full (snapshots off: fold from 0) and/or snapshot")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--fill", type=int, default=1, help="partitions that get the schedules")
    ap.add_argument("--timeout", type=float, default=1800.0, help="bound per takeover, s")
    ap.add_argument("--keep", action="store_true", help="keep the logs (SQLite file, topics)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one takeover's process
    args = ap.parse_args()
    args.modes = [x for x in args.modes.split(",") if x]
    if not set(args.modes) <= {"full", "snapshot"} or not args.modes:
        ap.error("--modes: full and/or snapshot")
    if not 1 <= args.fill <= args.partitions:
        ap.error("--fill: between 1 and --partitions")
    # the processor's per-partition log lines would interleave with the table
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.child:
        asyncio.run(child(orjson.loads(args.child)))
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
