"""Dev-node restart benchmark: how soon a whole ``chronolog dev`` node restarted on a data
directory holding ``--schedules`` live schedules serves again, and its resident memory once
every partition is restored.

1. **Build.** In a temporary data directory, the node's SQLite log (``DATA_DIR/log.db``,
   topics under the default prefix ``chronolog.``) is written straight through the log port
   with ``bench/failover.py``'s builder (imported, not copied): ``--schedules`` live
   schedules (``every 1h``, each with its own job params; ``--every`` changes the interval)
   spread evenly over ``--partitions`` partitions, with ``--events`` events of history per
   partition (default 5 per schedule: its create and one run — materialized, fence,
   claimed, result). The schedules are in the tenant a dev node serves without a tenants
   file (``default``, token ``dev``: ``chronolog.tenants.dev_tenants``), so the API finds
   them.
2. **First start** (``prep`` in the output: not a measurement of the restart).
   ``chronolog dev --quiet --no-demo`` folds every partition from offset 0 and writes its
   first complete snapshot round on the compacted ``state`` topic (docs/design.md §14). The
   bench reads ``state`` through its own ``SqliteEventLog`` (WAL: a concurrent reader) until
   every partition holds a round's marker and the schedule records cover every schedule,
   and (unless ``--no-wait-projector``) until ``GET /healthz``'s projection watermark has
   reached the end of ``events`` — a trigger does not need the schedule in the read model
   (the command goes to the processor by key), but its answer waits (at most the API's
   ``visible_timeout``, 2 s) for the projection to show the run, and a projector still
   catching up at the restart would compete with the restore for the CPU — and (unless
   ``--no-wait-effects``) until the effect runner's committed offsets (group
   ``chronolog.effects``) have reached the end of ``events``: a start folds ``events`` from
   them, then reads the same records again, in the node's one event loop, while the
   processor restores. Then SIGTERM.
3. **Restart**, ``--runs`` times. While the node is stopped, ``failover.plan`` commits one
   ``NextRunPlanned`` that makes the canary schedule due now (and appends failover's
   ``TriggerRun`` for a second schedule). Measured from just before the spawn of
   ``chronolog dev`` (``time.monotonic``):

   * ``api``: ``DATA_DIR/node.json`` written (the API serves; ``chronolog.devnode.nodefile``);
   * ``ready``: ``GET /healthz`` answers 200 (the dev node's readiness: the log and the read
     model answer — it does not wait for the processor's restore);
   * ``reply``: ``POST /v1/schedules/{id}/runs`` (an ``Idempotency-Key``, the token from
     ``node.json``) on a third schedule answered 2xx with its run (a 503 — no reply from the
     processor within the API's 10 s — or a refused connection is retried with the same
     key);
   * ``fire``: the canary's due occurrence materialized — an ``OccurrenceMaterialized`` of
     its key caused by ``tick:`` on ``events``, read by the bench (as failover.py's hook);
   * ``assign``: when the processor got its partitions (the earliest ``partition_assigned``
     log line's time minus its ``restore_s``), ``all``: the last partition restored
     (the node's ``partition_assigned`` lines: each says ``from_snapshot``, ``restore_s``,
     ``tail_events``);
   * ``rss_mib``: resident memory of the dev process (and any child) once every partition
     is restored, ``hwm_mib`` its peak so far (``VmHWM``), ``pg_mib`` the embedded
     PostgreSQL's proportional set size (postmaster and backends: not a child of the node);
   * ``stop``: SIGTERM to exit.

   The canary, failover's command target and the API's trigger target are the first three
   schedules of ``--probe-partition`` (default the last one: with two restores at a time in
   partition order, the last restored).

    .venv/bin/python bench/dev_restart.py --schedules 20000 --runs 3
    .venv/bin/python bench/dev_restart.py --schedules 1000000 --runs 3
    .venv/bin/python bench/dev_restart.py --schedules 1000000 --events 83334 --every 21600
    .venv/bin/python bench/dev_restart.py --schedules 1000000 --reuse /tmp/chronolog-devrestart-XXXX

Prints the command, the build, the first start (fold, snapshot, projection), one row per
restart and the medians, and whether every partition of every restart restored from its
snapshot. With ``every 1h`` every schedule falls due at the top of the next hour: a bench
that crosses it measures that burst too (the output warns). The data directory is removed
at the end (``--keep``: not, and its path is printed; the node's logs are ``dev-*.log``
there); ``--reuse DIR`` runs on such a kept directory again (no build; the first start
then only waits for what step 2 waits for).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import orjson
import psutil

from chronolog.domain import codec
from chronolog.log.port import OutRecord, Topics
from chronolog.processors.snapshots import KIND_SCHEDULE, KIND_SEALED, MAGIC, MARKER_KEY


def _failover() -> ModuleType:
    """``bench/failover.py`` (``bench/`` is not a package), for its log builder."""
    spec = importlib.util.spec_from_file_location("failover", Path(__file__).with_name(
        "failover.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["failover"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


fo = _failover()
fo.TENANT = "default"  # the dev node's tenant without a tenants file (dev_tenants)
DEV_TOKEN = "dev"  # its token, until node.json names it
CHRONOLOG = Path(sys.executable).with_name("chronolog")
POLL_S = 0.02
MiB = 2**20


# --------------------------------------------------------------------------- build


@dataclass
class Built:
    ddir: Path
    sids: dict[int, list[str]]
    written: int
    seconds: float
    first_due: datetime | None  # every schedule's next instant (None: not known)


async def build(args: argparse.Namespace) -> Built:
    """The dev node's log with the schedules and their history (failover.py's builder)."""
    ddir = Path(tempfile.mkdtemp(prefix="chronolog-devrestart-"))
    fo.EVERY_S = args.every
    started = time.monotonic()
    now = datetime.now(UTC)
    lg = fo.make_log("sqlite", args.partitions, "OFF", path=str(ddir / "log.db"),
                     prefix=Topics().prefix)  # a throwaway build: no fsync per append
    await lg.start()
    await lg.ensure_topics()
    sids: dict[int, list[str]] = {}
    written = 0
    try:
        for p in range(args.partitions):
            n = args.schedules // args.partitions + (p < args.schedules % args.partitions)
            events = args.events if args.events else 5 * n
            sids[p] = fo.schedule_ids(args.partitions, p, n)
            for chunk in fo.history(sids[p], events, now):
                await lg.append([OutRecord(lg.topics.events, None, v, partition=p)
                                 for v in chunk])
            written += fo.history_size(n, events)
            print(f"  built partition {p}: {n:,} schedules, {fo.history_size(n, events):,} "
                  f"events ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    finally:
        await lg.close()
    first_due = now.replace(minute=0, second=0, microsecond=0) + timedelta(seconds=args.every)
    return Built(ddir, sids, written, time.monotonic() - started, first_due)


def reuse(args: argparse.Namespace) -> Built:
    """A data directory kept (``--keep``) by an earlier run with the same ``--schedules``
    and ``--partitions``: its node has written a complete snapshot round already."""
    ddir = Path(args.reuse).absolute()
    if not (ddir / "log.db").exists():
        raise SystemExit(f"--reuse: no log.db in {ddir}")
    # the first IDs of a partition are the same whatever the count: the probes need three
    sids = {args.probe_partition: fo.schedule_ids(args.partitions, args.probe_partition, 3)}
    return Built(ddir, sids, 0, 0.0, None)


def open_log(ddir: Path, partitions: int) -> Any:
    """The bench's own connection to the node's log (read ``state``/``events``, plan)."""
    return fo.make_log("sqlite", partitions, "FULL", path=str(ddir / "log.db"),
                       prefix=Topics().prefix)


# --------------------------------------------------------------------------- the node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    t0: float  # time.monotonic() just before the spawn
    wall0: float  # time.time() at the same moment
    lines: list[dict[str, Any]] = field(default_factory=list)
    _pos: int = 0
    _rest: bytes = b""

    def read_lines(self) -> list[dict[str, Any]]:
        """The node's log lines (JSON on stderr) written since the last call."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return []
        self._pos += len(data)
        data = self._rest + data
        *whole, self._rest = data.split(b"\n")
        new = []
        for raw in whole:
            if raw.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    new.append(orjson.loads(raw))
        self.lines.extend(new)
        return new

    def at(self, line: dict[str, Any]) -> float | None:
        """A log line's time, in seconds after the spawn."""
        try:
            ts = datetime.fromisoformat(line["timestamp"]).timestamp()
        except (KeyError, ValueError):
            return None
        return ts - self.wall0


def spawn(ddir: Path, args: argparse.Namespace, label: str) -> Node:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("CHRONOLOG_TENANTS", "CHRONOLOG_DATABASE_URL", "CHRONOLOG_PARTITIONS")}
    env["CHRONOLOG_LOG_LEVEL"] = "INFO"
    log_path = ddir / f"dev-{label}.log"
    cmd = [str(CHRONOLOG), "dev", "--data-dir", str(ddir), "--port", str(port), "--quiet",
           "--no-demo", "--partitions", str(args.partitions)]
    for _ in range(600):  # a reinstall of the package rewrites the script: wait for it
        if CHRONOLOG.exists():
            break
        time.sleep(0.1)
    with open(log_path, "wb") as err, open(ddir / f"dev-{label}.out", "wb") as out:
        t0, wall0 = time.monotonic(), time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=env)
    return Node(proc, port, log_path, t0, wall0)


def stop(node: Node, timeout: float = 180.0) -> float:
    """SIGTERM the node (by its PID) and wait for it to exit; seconds it took."""
    started = time.monotonic()
    if node.proc.poll() is None:
        node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"  the node did not stop within {timeout:.0f} s: SIGKILL", file=sys.stderr,
                  flush=True)
            node.proc.kill()
            node.proc.wait(30)
    node.read_lines()
    return time.monotonic() - started


def stop_leftover_postgres(ddir: Path) -> None:
    """A node killed hard leaves its embedded PostgreSQL running: stop it (ours)."""
    if (ddir / "postgres" / "postmaster.pid").exists():
        subprocess.run([sys.executable, "-m", "chronolog.embedded_postgres", "stop",
                        str(ddir / "postgres")], check=False, timeout=120)


def node_token(ddir: Path) -> str | None:
    try:
        return json.loads((ddir / "node.json").read_bytes()).get("token") or None
    except (OSError, ValueError):
        return None


def rss_mib(pid: int) -> tuple[float, float]:
    """(resident MiB of the process and its children, the process's peak resident MiB)."""
    proc = psutil.Process(pid)
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    hwm = 0.0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return round(total / MiB, 1), round(hwm, 1)


def postgres_mib(ddir: Path) -> float | None:
    """The embedded PostgreSQL's proportional set size (postmaster and its backends)."""
    try:
        pid = int((ddir / "postgres" / "postmaster.pid").read_text().split()[0])
        root = psutil.Process(pid)
        total = 0
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_full_info().pss
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    return round(total / MiB, 1)


# --------------------------------------------------------------------------- first start


@dataclass
class StateScan:
    """What the bench has read of ``state``: per partition, its next offset, the schedule
    keys seen and whether a round's marker was."""

    partitions: int
    offsets: dict[int, int] = field(default_factory=dict)
    keys: dict[int, set[bytes]] = field(default_factory=dict)
    marker: dict[int, bool] = field(default_factory=dict)

    async def advance(self, lg: Any) -> None:
        topic = lg.topics.state
        for p in range(self.partitions):
            off = self.offsets.get(p, 0)
            keys = self.keys.setdefault(p, set())
            # one read a partition a call: the caller's other checks go on meanwhile
            recs = await lg.read(topic, p, off, 5_000, 0)
            for r in recs:
                if r.key == MARKER_KEY:
                    self.marker[p] = True
                elif r.value[:2] == MAGIC and r.value[2] in (KIND_SCHEDULE, KIND_SEALED) and r.key:
                    keys.add(r.key)
            if recs:
                self.offsets[p] = recs[-1].offset + 1

    def states(self) -> int:
        return sum(len(k) for k in self.keys.values())

    def complete(self, schedules: int) -> bool:
        return (all(self.marker.get(p) for p in range(self.partitions))
                and self.states() >= schedules)


async def healthz(http: httpx.AsyncClient, port: int) -> dict[str, Any] | None:
    try:
        r = await http.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


async def projection_behind(lg: Any, body: dict[str, Any] | None) -> int | None:
    """Events not yet projected (by /healthz's watermark); None when not known."""
    if body is None or "watermark" not in body:
        return None
    marks = body["watermark"]["partitions"]
    behind = 0
    for p in range(lg.topics.partitions):
        end = await lg.end_offset(lg.topics.events, p)
        behind += max(0, end - int(marks.get(str(p), 0)))
    return behind


async def effects_behind(lg: Any) -> int:
    """Events of ``events`` past the effect runner's committed offsets (what its next start
    folds and reads again: ``chronolog.effects.runner``)."""
    group = lg.topics.effects_group
    behind = 0
    for p in range(lg.topics.partitions):
        end = await lg.end_offset(lg.topics.events, p)
        behind += end - (await lg.committed(group, lg.topics.events, p) or 0)
    return behind


@dataclass
class Prep:
    api: float | None = None
    snapshot: float | None = None
    projected: float | None = None
    effects: float | None = None
    states: int = 0
    from_zero: int = 0
    rss: float | None = None
    hwm: float | None = None
    stop: float = 0.0
    effects_behind: int = 0


async def first_start(built: Built, args: argparse.Namespace) -> Prep:
    """The first start: every partition folded from 0, a complete snapshot round written,
    the projection caught up; then SIGTERM."""
    lg = open_log(built.ddir, args.partitions)
    await lg.start()
    prep = Prep()
    scan = StateScan(args.partitions)
    node = spawn(built.ddir, args, "prep")
    deadline = node.t0 + args.timeout
    shown = node.t0
    behind: int | None = None
    try:
        async with httpx.AsyncClient() as http:
            while True:
                now = time.monotonic()
                if node.proc.poll() is not None:
                    raise RuntimeError(f"the node exited ({node.proc.returncode}) during the "
                                       f"first start: see {node.log_path}")
                if now > deadline:
                    raise RuntimeError("the first start did not complete its snapshot round "
                                       f"(and projection) within {args.timeout:.0f} s")
                node.read_lines()
                if prep.api is None and node_token(built.ddir) is not None:
                    prep.api = now - node.t0
                if prep.snapshot is None:
                    await scan.advance(lg)
                    if scan.complete(args.schedules):
                        prep.snapshot = time.monotonic() - node.t0
                        prep.states = scan.states()
                        prep.rss, prep.hwm = rss_mib(node.proc.pid)
                if prep.projected is None and prep.api is not None:
                    behind = await projection_behind(lg, await healthz(http, node.port))
                    if behind == 0 or not args.wait_projector:
                        prep.projected = time.monotonic() - node.t0
                if prep.effects is None and prep.api is not None:
                    eff = await effects_behind(lg)
                    if eff == 0 or not args.wait_effects:
                        prep.effects = time.monotonic() - node.t0
                if None not in (prep.snapshot, prep.projected, prep.effects):
                    break
                if now - shown >= 10:
                    shown = now
                    print(f"  prep {now - node.t0:.0f} s: state records {scan.states():,} of "
                          f"{args.schedules:,}, markers {sum(scan.marker.values())}/"
                          f"{args.partitions}, projection behind "
                          f"{'-' if behind is None else f'{behind:,}'}, effect runner "
                          f"behind {await effects_behind(lg):,}, rss "
                          f"{rss_mib(node.proc.pid)[0]} MiB", file=sys.stderr, flush=True)
                await asyncio.sleep(0.5)
    finally:
        prep.stop = stop(node)
        prep.effects_behind = await effects_behind(lg)
        await lg.close()
    prep.from_zero = sum(1 for x in node.lines if x.get("event") == "partition_assigned"
                         and not x.get("from_snapshot"))
    return prep


# --------------------------------------------------------------------------- a restart


@dataclass
class Run:
    api: float | None = None
    ready: float | None = None
    reply: float | None = None
    fire: float | None = None
    assign: float | None = None
    all_restored: float | None = None
    restore_max: float | None = None
    from_snapshot: int = 0
    restored: int = 0
    tail_events: int = 0
    effects_folded: int = 0
    effects_behind: int = 0
    rss: float | None = None
    hwm: float | None = None
    pg: float | None = None
    stop: float | None = None
    status: str = ""
    errors: list[str] = field(default_factory=list)


async def restart(built: Built, args: argparse.Namespace, i: int) -> Run:
    """One measured restart of the node (module docstring)."""
    pp = args.probe_partition
    probe = built.sids[pp]
    canary = probe[0]
    target = probe[1] if len(probe) > 1 else canary
    trigger = probe[2] if len(probe) > 2 else target
    lg = open_log(built.ddir, args.partitions)
    await lg.start()
    run = Run()
    try:
        await fo.plan(lg, canary, target, datetime.now(UTC))
        from_offset = await lg.end_offset(lg.topics.events, pp)
        run.effects_behind = await effects_behind(lg)
        node = spawn(built.ddir, args, f"run{i}")
        deadline = node.t0 + args.timeout
        canary_key = f"{fo.TENANT}/{canary}"
        key = f"bench-{uuid.uuid4().hex}"

        def elapsed() -> float:
            return time.monotonic() - node.t0

        async def watch_ready(http: httpx.AsyncClient) -> None:
            while run.ready is None:
                if await healthz(http, node.port) is not None:
                    run.ready = elapsed()
                    return
                await asyncio.sleep(POLL_S)

        async def send_trigger(http: httpx.AsyncClient) -> None:
            url = f"http://127.0.0.1:{node.port}/v1/schedules/{trigger}/runs"
            while True:
                token = node_token(built.ddir)
                if token is None:  # the API has not said it serves yet
                    await asyncio.sleep(POLL_S)
                    continue
                if run.api is None:
                    run.api = elapsed()
                try:
                    r = await http.post(url, headers={"Authorization": f"Bearer {token}",
                                                      "Idempotency-Key": key}, timeout=60)
                except httpx.HTTPError:
                    await asyncio.sleep(POLL_S)
                    continue
                if 200 <= r.status_code < 300:
                    run.reply = elapsed()
                    body = r.json()
                    run.status = f"{r.status_code} {body.get('state', '?')}"
                    return
                if r.status_code != 503:
                    run.errors.append(f"trigger answered {r.status_code}: {r.text[:200]}")
                    return
                await asyncio.sleep(POLL_S)

        async def watch_fire() -> None:
            offset = from_offset
            while True:
                recs = await lg.read(lg.topics.events, pp, offset, 1000, 200)
                for rec in recs:
                    ev = codec.decode_event(rec.value)  # compact records, not JSON
                    if (ev.key == canary_key and ev.type == "OccurrenceMaterialized"
                            and (ev.causation_id or "").startswith("tick:")):
                        run.fire = elapsed()
                        return
                if recs:
                    offset = recs[-1].offset + 1

        async def watch_log() -> None:
            while True:
                node.read_lines()
                took = [x for x in node.lines if x.get("event") == "partition_assigned"]
                if len({x.get("partition") for x in took}) >= args.partitions:
                    run.all_restored = elapsed()
                    run.rss, run.hwm = rss_mib(node.proc.pid)
                    run.pg = postgres_mib(built.ddir)
                    return
                await asyncio.sleep(POLL_S)

        async def until_exit() -> None:
            while node.proc.poll() is None:
                await asyncio.sleep(0.1)
            run.errors.append(f"the node exited ({node.proc.returncode}): see {node.log_path}")

        try:
            async with httpx.AsyncClient() as http:
                tasks = [asyncio.create_task(c) for c in (
                    watch_ready(http), send_trigger(http), watch_fire(), watch_log())]
                exited = asyncio.create_task(until_exit())
                waiting = asyncio.gather(*tasks)
                try:
                    finished, _ = await asyncio.wait(
                        {waiting, exited}, timeout=max(1.0, deadline - time.monotonic()),
                        return_when=asyncio.FIRST_COMPLETED)
                    if not finished:
                        run.errors.append(f"not all measured within {args.timeout:.0f} s")
                finally:
                    for t in [*tasks, exited]:
                        t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await waiting
                    with contextlib.suppress(asyncio.CancelledError):
                        await exited
        finally:
            run.stop = stop(node)
        took = {x.get("partition"): x for x in node.lines if x.get("event") == "partition_assigned"}
        run.restored = len(took)
        run.from_snapshot = sum(1 for x in took.values() if x.get("from_snapshot"))
        run.tail_events = sum(int(x.get("tail_events") or 0) for x in took.values())
        restores = [float(x.get("restore_s") or 0) for x in took.values()]
        run.restore_max = max(restores) if restores else None
        assigned = [t - float(x.get("restore_s") or 0) for x in took.values()
                    if (t := node.at(x)) is not None]
        run.assign = min(assigned) if assigned else None
        run.effects_folded = sum(int(x.get("folded_to") or 0) - int(x.get("from_offset") or 0)
                                 for x in node.lines
                                 if x.get("event") == "effects_partition_assigned")
        for x in node.lines:
            if x.get("event") == "snapshot_rejected":
                run.errors.append(f"snapshot rejected on p{x.get('partition')}: "
                                  f"{x.get('reason')}")
    finally:
        await lg.close()
    return run


# --------------------------------------------------------------------------- output


COLUMNS = ("run", "api_s", "ready_s", "reply_s", "fire_s", "assign_s", "all_s", "restore_max",
           "snapshot", "tail_evts", "eff_behind", "eff_folded", "rss_mib", "hwm_mib", "pg_mib",
           "stop_s")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def header() -> str:
    return " ".join(f"{c:>12}" for c in COLUMNS)


def row(label: str, r: Run, partitions: int) -> str:
    cells = [label, _f(r.api), _f(r.ready), _f(r.reply), _f(r.fire), _f(r.assign),
             _f(r.all_restored), _f(r.restore_max), f"{r.from_snapshot}/{partitions}",
             f"{r.tail_events:,}", f"{r.effects_behind:,}", f"{r.effects_folded:,}", _f(r.rss),
             _f(r.hwm), _f(r.pg), _f(r.stop)]
    line = " ".join(f"{c:>12}" for c in cells)
    if r.status:
        line += f"  trigger {r.status}"
    if r.errors:
        line += "  ERROR " + "; ".join(r.errors)
    return line


def median_run(runs: list[Run]) -> Run:
    def med(name: str) -> float | None:
        got = [getattr(r, name) for r in runs if getattr(r, name) is not None]
        return statistics.median(got) if got else None

    out = Run()
    for name in ("api", "ready", "reply", "fire", "assign", "all_restored", "restore_max",
                 "rss", "hwm", "pg", "stop"):
        setattr(out, name, med(name))
    out.from_snapshot = min(r.from_snapshot for r in runs)
    out.tail_events = int(statistics.median(r.tail_events for r in runs))
    out.effects_folded = int(statistics.median(r.effects_folded for r in runs))
    out.effects_behind = int(statistics.median(r.effects_behind for r in runs))
    return out


async def main_async(args: argparse.Namespace) -> int:
    print("dev_restart: " + " ".join([os.path.basename(sys.executable), *sys.argv]), flush=True)
    print(f"schedules={args.schedules:,} partitions={args.partitions} runs={args.runs} "
          f"every={args.every:g}s probe_partition={args.probe_partition} "
          f"cpus={os.cpu_count()}", flush=True)
    built = reuse(args) if args.reuse else await build(args)
    failed = False
    try:
        if args.reuse:
            print(f"reusing {built.ddir} (no build)", flush=True)
        else:
            assert built.first_due is not None
            print(f"build: {args.schedules:,} schedules, {built.written:,} events on "
                  f"{args.partitions} partitions in {built.seconds:.1f} s ({built.ddir}); "
                  f"first due at {built.first_due:%H:%M:%S} UTC", flush=True)
        prep = await first_start(built, args)
        print(f"prep (first start, not measured as a restart): node.json {_f(prep.api)} "
              f"s, a complete snapshot round ({prep.states:,} schedule records, "
              f"{prep.from_zero} partitions folded from 0) at {_f(prep.snapshot)} s, "
              f"projection caught up at {_f(prep.projected)} s, the effect runner at "
              f"{_f(prep.effects)} s, rss {_f(prep.rss)} MiB (peak {_f(prep.hwm)}), stop "
              f"{prep.stop:.1f} s; the effect runner {prep.effects_behind:,} events behind "
              f"at the stop", flush=True)
        print(header(), flush=True)
        runs = []
        for i in range(args.runs):
            r = await restart(built, args, i + 1)
            runs.append(r)
            failed = failed or bool(r.errors)
            print(row(f"#{i + 1}", r, args.partitions), flush=True)
        med = median_run(runs)
        print(row("median", med, args.partitions), flush=True)
        every = all(r.from_snapshot == args.partitions for r in runs)
        print(f"every partition of every restart restored from its snapshot: "
              f"{'yes' if every else 'NO'}", flush=True)
        serving = max(v for v in (med.reply, med.fire, 0.0) if v is not None)
        print(f"serving (median of max(reply, fire)): {serving:.2f} s "
              f"({'within' if serving <= args.target else 'OVER'} the {args.target:g} s "
              f"target)", flush=True)
        if built.first_due is not None and datetime.now(UTC) >= built.first_due:
            print(f"WARNING: every schedule fell due at {built.first_due:%H:%M:%S} UTC during "
                  "the bench: later figures include that burst (--every)", flush=True)
    finally:
        stop_leftover_postgres(built.ddir)
        if args.keep or args.reuse:
            print(f"kept {built.ddir}", flush=True)
        else:
            shutil.rmtree(built.ddir, ignore_errors=True)
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=lambda s: int(s.replace("_", "")), default=1_000_000,
                    help="live schedules in all")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=0,
                    help="events of history per partition (default 5 per schedule: the "
                         "create and one run)")
    ap.add_argument("--every", type=float, default=fo.EVERY_S,
                    help="the schedules' interval, seconds (failover.py's 1 h)")
    ap.add_argument("--runs", type=int, default=3, help="measured restarts (median)")
    ap.add_argument("--probe-partition", type=int, default=None,
                    help="partition of the canary and the trigger (default the last)")
    ap.add_argument("--no-wait-projector", dest="wait_projector", action="store_false",
                    help="do not wait for the projection to catch up before the restarts")
    ap.add_argument("--no-wait-effects", dest="wait_effects", action="store_false",
                    help="do not wait for the effect runner's committed offsets to reach "
                         "the end of events before the restarts")
    ap.add_argument("--target", type=float, default=30.0, help="serving target, s")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="bound of the first start and of each restart, s")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--reuse", default=None, metavar="DIR",
                    help="restart the node on a directory kept by an earlier --keep run "
                         "(same --schedules, --partitions): no build")
    args = ap.parse_args()
    if args.probe_partition is None:
        args.probe_partition = args.partitions - 1
    if not 0 <= args.probe_partition < args.partitions:
        ap.error("--probe-partition: between 0 and --partitions - 1")
    if args.schedules < args.partitions * 3:
        ap.error("--schedules: at least 3 per partition")
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
