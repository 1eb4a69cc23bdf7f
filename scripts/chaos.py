"""Chaos: the infrastructure fails under steady load, and every guarantee is checked after.

    make chaos [ARGS="--short --scenario NAME ..."]
    python scripts/chaos.py [--short] [--log kafka|sqlite] [--brokers 1|3]
                            [--scenario NAME]... [--schedules N] [--json PATH] [--keep]

On loopback only, with services of its own that it starts and stops by PID — a Kafka broker
(``scripts/kafka.sh`` with a private ``KAFKA_STATE_DIR``, on 127.0.0.2: see ``Broker``) and
an embedded PostgreSQL, on ports in 39000-39999 — it deploys chronolog as separate
processes: 2 processors, 2 workers (built-in jobs), a projector, an effect runner and the
HTTP API on Kafka + PostgreSQL, each with a readiness file (``--ready-file``). A small
supervisor restarts a process that exits by itself, as Kubernetes would, and counts it as a
crash. Each scenario creates its own
schedules through the API (``every 1s``, misfire ``all``, overlap ``allow``, a 5 s lease,
a bounded window ``start``..``end``) and injects its faults while they run:

* ``broker-restart``: the broker killed (kill -9), down for the outage, started again on its
  data;
* ``postgres-restart``: PostgreSQL stopped (fast shutdown) for the outage, started again;
* ``kill-processes``: kill -9 of each chronolog process in turn, each started again at once
  (the next one once everything is ready again);
* ``combined``: the broker and PostgreSQL down together, and a processor and a worker
  killed and started again while they are away;
* ``disk-full``: a second deployment of the same processes on the embedded SQLite log, on a
  tmpfs of its own; the tmpfs is filled to the last byte for the outage, then the filler is
  deleted (the Kafka deployment is stopped meanwhile: one deployment at a time shares the
  CPU).

``--brokers 3``: the Kafka deployment runs on a private cluster of three brokers
(``Cluster``: ``kafka.sh up --brokers 3``, replication 3, min ISR 2), and the scenarios are
those of a cluster:

* ``leader-kill``: kill -9 of the broker leading ``events`` partition 0 (the others carry
  on; it is started again after the outage);
* ``coordinator-kill``: kill -9 of the broker coordinating the transactions of partition 0's
  processor (``FindCoordinator`` for its transactional id), started again after the outage;
* ``broker-stop-long``: the leader of ``events`` partition 1 stopped (SIGTERM) for longer
  than the consumer groups' session timeout, then started;
* ``two-brokers-down``: two brokers killed for the outage — writes must stop, ``/healthz``
  saying ``not enough in-sync replicas`` — then one started (service resumes), then the
  other.

In every scenario a ``Prober`` triggers runs through the API while the faults happen; each
trigger the API acknowledged must be in the log with one result afterwards.

``--log sqlite`` runs ``postgres-restart`` and ``kill-processes`` on that SQLite deployment
too, and leaves out the scenarios that need a broker: no JVM to start, which is what lets the
short variant run inside ``make test``.

After each scenario, once its window has passed and its runs have settled:

* ``chronolog audit`` on the whole log exits 0;
* misfire ``all``: every instant of every schedule's window has exactly one occurrence (a
  missing or skipped instant is *lost*, a second one *doubled*);
* every run has exactly one result (none: *lost*; two: *doubled*);
* the projection, once caught up, equals a replay: ``chronolog replay --schema fresh`` into
  another schema of the same database, then every read-model table compared row for row
  both ways (``EXCEPT ALL``);
* no process exited by itself (*crashes*), and each fault was recovered from: every process
  ready again, ``/healthz`` 200, and a run scheduled after the fault cleared has its result
  (*recover*, seconds from the fault's end; for ``kill-processes`` the longest of the kills).

It prints a table (scenario, faults injected, runs, lost, doubled, audit, replay, crashes,
recover) and exits 0 when every row is clean, 1 otherwise. ``--json PATH`` also writes the
rows with details. ``--short``: a few seconds per outage and 20 schedules, the kills 1 s
apart (``make test`` runs ``--short --log sqlite`` through ``tests/system/test_chaos.py``);
the default is 200 schedules, outages of 30 s, and the next kill once everything is ready
again. ``--scenario NAME`` (repeatable) runs only those; ``--keep`` keeps the work
directory (every process's log and readiness file).

The full-disk scenario mounts a tmpfs (``mount -t tmpfs -o size=...``), which needs root
(CAP_SYS_ADMIN); without it the scenario fails saying so. No shared service is touched: the
script never stops a broker or a database it did not start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from hosts import Hosts
from hosts import available as hosts_unavailable

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.embedded_postgres import EmbeddedPostgres
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log

ROOT = Path(__file__).resolve().parent.parent

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
KAFKA_SH = ROOT / "scripts" / "kafka.sh"
SCENARIOS = ("broker-restart", "postgres-restart", "kill-processes", "combined", "disk-full",
             "leader-kill", "coordinator-kill", "broker-stop-long", "two-brokers-down",
             "processor-cut", "worker-cut", "broker-isolated", "receive-only-cut", "clock-step")
KAFKA_ONLY = ("broker-restart", "combined")
# on a three-broker cluster only (--brokers 3, where they are the default, or the cluster of
# --hosts 3, named with --scenario)
CLUSTER_ONLY = ("leader-kill", "coordinator-kill", "broker-stop-long", "two-brokers-down")
# with --hosts 3 only (the cluster's brokers, processors and workers on three hosts), where
# they are the default
HOSTS_ONLY = ("processor-cut", "worker-cut", "broker-isolated", "receive-only-cut",
              "clock-step")
PORTS = range(39000, 40000)
PARTITIONS = 4
AUTH = {"Authorization": "Bearer dev"}
TABLES = ("schedules", "runs", "attempts", "effects")


@dataclass(frozen=True)
class Plan:
    """How long things take: the full variant, or ``--short``."""

    schedules: int = 200
    warmup: float = 10.0  # steady load before the fault
    down: float = 30.0  # how long a service stays away
    after: float = 15.0  # steady load after the fault cleared, inside the window
    kill_gap: float = 5.0  # between one process ready again and the next kill
    kill_waits: bool = True  # the next kill once all are ready again (else: kill_gap only)
    settle: float = 180.0  # after the window's end: every run has its result by then
    ready: float = 120.0  # a process (or all of them) ready again within this
    # a deployment's first start (every process from nothing, beside whatever else loads the
    # machine: the short run goes inside the parallel test suite)
    start: float = 180.0
    tmpfs_mb: int = 512


# broker-stop-long: at least this long, past the group session timeout (10 s)
STOP_LONG_S = 15.0
# a network cut lasts at least this long: past the session timeout and a 5 s lease
CUT_S = 15.0
# processor-cut: every partition of the cut processor served by another within this
MOVE_WITHIN_S = 90.0
# the worker-cut scenario's handlers sleep this long: past a lease (5 s), long enough to be
# caught running on a loaded machine, and ending while their worker is cut off
SLOW_S = 12.0
# clock-step: processor-1's wall clock is stepped by this much, forward then back
CLOCK_STEP = "600"
# libfaketime (Debian: faketime), which steps processor-1's wall clock (clock-step)
LIBFAKETIME = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
               "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1")

SHORT = Plan(schedules=20, warmup=3.0, down=5.0, after=3.0, kill_gap=1.0, kill_waits=False,
             settle=90.0, ready=90.0, tmpfs_mb=64)


def say(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def free_port(taken: set[int], host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (loopback) in 39000-39999 (none of ``taken``)."""
    for port in random.sample(PORTS, len(PORTS)):
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError("no free port in 39000-39999")


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


async def poll(cond: Any, timeout: float, interval: float = 0.25) -> Any:
    """``cond()`` (sync or async) until truthy (returned) or ``timeout`` (None)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
            if asyncio.iscoroutine(value):
                value = await value
        except Exception:  # noqa: BLE001 - not yet (a service is still away)
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(interval)


# ------------------------------------------------------------------------- services


class Broker:
    """A Kafka broker of this run alone: kafka.sh with its own state directory and ports.

    It listens on 127.0.0.2, its clients connect from 127.0.0.1: while it is down they retry
    their connections by the thousand, and on one address a client can get the broker's
    port (inside the kernel's ephemeral range, as 39000-39999 is on Linux) as its own source
    port and connect to itself, holding the port so that the broker cannot start again."""

    HOST = "127.0.0.2"

    def __init__(self, state: Path, ports: set[int]) -> None:
        self.state = state
        self.env = dict(os.environ, KAFKA_STATE_DIR=str(state), KAFKA_HOST=self.HOST,
                        KAFKA_PORT=str(free_port(ports, self.HOST)),
                        KAFKA_CONTROLLER_PORT=str(free_port(ports, self.HOST)))
        self.bootstrap = f"{self.HOST}:{self.env['KAFKA_PORT']}"

    def _run(self, *command: str) -> None:
        subprocess.run(["bash", str(KAFKA_SH), *command], env=self.env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)

    def up(self) -> None:
        self._run("up")

    def start(self) -> None:
        """Again, on its data."""
        self._run("start")

    def kill(self) -> None:
        """kill -9 by PID, and wait until it is gone."""
        pid_file = self.state / "broker.pid"
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid_file.unlink(missing_ok=True)

    def down(self) -> None:
        with contextlib.suppress(Exception):
            self._run("down")


class Cluster(Broker):
    """Three KRaft nodes of this run alone (``kafka.sh up --brokers 3``: replication 3, min
    ISR 2, unclean election off), on 127.0.0.2 like ``Broker``; node ids 1..3. ``kill`` and
    ``start`` take the whole cluster down and up again; the ``*_node`` methods one node."""

    NODES = (1, 2, 3)

    def __init__(self, state: Path, ports: set[int]) -> None:
        self.state = state
        brokers = [free_port(ports, self.HOST) for _ in self.NODES]
        controllers = [free_port(ports, self.HOST) for _ in self.NODES]
        self.env = dict(os.environ, KAFKA_STATE_DIR=str(state), KAFKA_HOST=self.HOST,
                        KAFKA_PORTS=",".join(map(str, brokers)),
                        KAFKA_CONTROLLER_PORTS=",".join(map(str, controllers)))
        self.bootstrap = ",".join(f"{self.HOST}:{port}" for port in brokers)

    def up(self) -> None:
        self._run("up", "--brokers", "3")

    def kill(self) -> None:
        for node in self.NODES:
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run("kill", str(node))

    def kill_node(self, node: int) -> None:
        self._run("kill", str(node))

    def stop_node(self, node: int) -> None:
        self._run("stop", str(node))

    def start_node(self, node: int) -> None:
        self._run("start", str(node))


class HostCluster(Cluster):
    """Three KRaft nodes like ``Cluster``, node i on host i of ``hosts`` (its namespace, its
    address, the broker role's group: ``scripts/hosts.py``)."""

    def __init__(self, state: Path, ports: set[int], hosts: Hosts) -> None:
        self.state = state
        brokers = [free_port(ports, hosts.machine_address) for _ in self.NODES]
        controllers = [free_port(ports, hosts.machine_address) for _ in self.NODES]
        addresses = [hosts.host(n).address for n in self.NODES]
        self.env = dict(os.environ, KAFKA_STATE_DIR=str(state),
                        KAFKA_HOSTS=",".join(addresses),
                        KAFKA_EXEC=",".join(" ".join(hosts.prefix(n, "broker"))
                                            for n in self.NODES),
                        KAFKA_PORTS=",".join(map(str, brokers)),
                        KAFKA_CONTROLLER_PORTS=",".join(map(str, controllers)))
        self.bootstrap = ",".join(f"{a}:{port}" for a, port in zip(addresses, brokers,
                                                                   strict=True))


async def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    """The node id leading ``topic``/``partition`` now."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await asyncio.wait_for(admin.start(), 15)
    try:
        [described] = await asyncio.wait_for(admin.describe_topics([topic]), 15)
        return next(int(p["leader"]) for p in described["partitions"]
                    if p["partition"] == partition)
    finally:
        await admin.close()


async def transaction_coordinator(bootstrap: str, transactional_id: str) -> int:
    """The node id coordinating the transactions of ``transactional_id`` now."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await asyncio.wait_for(admin.start(), 15)
    try:
        return int(await asyncio.wait_for(admin.find_coordinator(transactional_id, 1), 15))
    finally:
        await admin.close()


class Postgres:
    """An embedded PostgreSQL of this run alone (outside any shared directory)."""

    def __init__(self, path: Path, ports: set[int]) -> None:
        self.server = EmbeddedPostgres(path, port=free_port(ports), fast=True)
        self.admin_dsn = ""

    def start(self) -> str:
        self.admin_dsn = self.server.start()
        return self.admin_dsn

    def stop(self) -> None:
        self.server.stop()

    async def database(self, name: str) -> str:
        """A fresh database ``name`` on this server; its DSN."""
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.admin_dsn.rsplit("/", 1)[0] + f"/{name}"


# ------------------------------------------------------------------------- processes


class Proc:
    """One chronolog process, started and killed by PID; its stderr and readiness files."""

    def __init__(self, name: str, argv: list[str], workdir: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.env = env or {}  # secrets (the DSN's password) go here, not on the command line
        self.log_path = workdir / f"{name}.log"
        self.ready_path = workdir / f"{name}.ready"
        self.popen: subprocess.Popen[bytes] | None = None
        self.expected_down = False  # killed or stopped on purpose: not a crash
        self.crashes: list[str] = []
        self.starts = 0

    def start(self) -> None:
        self.ready_path.unlink(missing_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as err:
            self.popen = subprocess.Popen(
                [*self.argv, "--ready-file", str(self.ready_path)],
                stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
                env=dict(os.environ, CHRONOLOG_LOG_LEVEL="INFO", **self.env))
        self.expected_down = False

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """kill -9 by PID."""
        self.expected_down = True
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(30)

    def stop(self, timeout: float = 15.0) -> float | None:
        """SIGTERM, then SIGKILL after ``timeout``: the seconds it took (None: killed)."""
        self.expected_down = True
        if self.popen is None or self.popen.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(30)
            return None
        return time.monotonic() - started

    def readiness(self) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads(self.ready_path.read_text())
        except (OSError, ValueError):
            return {"ready": False, "reason": "no readiness file yet"}
        if not self.alive() or doc.get("pid") != self.popen.pid:  # type: ignore[union-attr]
            return {"ready": False, "reason": "not running"}
        return doc

    def lines(self) -> int:
        try:
            with open(self.log_path, "rb") as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    def tail(self, n: int) -> list[str]:
        """The last ``n`` lines of the process's log (each cut to 300 characters)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line[:300] for line in text.splitlines()[-n:]]


@dataclass
class Deployment:
    """chronolog's processes on one log and one read-model database."""

    name: str
    log: LogConfig
    dsn: str
    workdir: Path
    api_port: int
    processors: int = 2
    workers: int = 2
    hosts: Hosts | None = None  # processor-i and worker-i on host i (and as many of each)
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def log_url(self) -> str:
        return (f"kafka://{self.log.target}" if self.log.kind == "kafka"
                else f"sqlite://{self.log.target}")

    @property
    def log_flags(self) -> list[str]:
        return ["--log", self.log_url, "--topic-prefix", self.log.topics.prefix,
                "--partitions", str(self.log.topics.partitions)]

    @property
    def offline_flags(self) -> list[str]:
        """``chronolog audit`` and ``replay`` take the prefix from the environment."""
        return ["--log", self.log_url, "--partitions", str(self.log.topics.partitions)]

    @property
    def offline_env(self) -> dict[str, str]:
        return dict(os.environ, CHRONOLOG_TOPIC_PREFIX=self.log.topics.prefix)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        results = self.workdir / "results"
        flags = self.log_flags
        hosts = self.hosts
        if hosts is not None:
            self.processors = self.workers = len(hosts.hosts)
        for i in range(1, self.processors + 1):
            self._add(f"processor-{i}", ["processor", *flags, "--member-id", f"processor-{i}"],
                      self.faked_clock() if hosts and i == 1 else None,
                      on=hosts.prefix(i, "processor") if hosts else [])
        for i in range(1, self.workers + 1):
            self._add(f"worker-{i}", ["worker", *flags, "--builtin-jobs", "--concurrency", "8",
                                      "--worker-id", f"worker-{i}", "--results", str(results),
                                      "--drain-timeout", "2"],
                      on=hosts.prefix(i, "worker") if hosts else [])
        database = {"CHRONOLOG_DATABASE_URL": self.dsn}
        self._add("projector", ["projector", *flags], database)
        self._add("effects", ["effects", *flags, "--member-id", "effects-1",
                              "--results", str(results)])
        self._add("api", ["api", *flags, "--port", str(self.api_port)], database)

    @property
    def clock_file(self) -> Path:
        """The offset libfaketime gives processor-1's wall clock on hosts (``+0``: none)."""
        return self.workdir / "host-1.faketime"

    def faked_clock(self) -> dict[str, str]:
        """processor-1's environment on hosts: its wall clock read through libfaketime, at
        the offset in ``clock_file`` (re-read at every reading; its monotonic and boot-time
        clocks left alone), so clock-step can step it while it runs."""
        lib = next((p for p in LIBFAKETIME if Path(p).exists()), None)
        if lib is None:
            raise RuntimeError("--hosts needs libfaketime to step a processor's clock "
                               "(Debian: apt-get install faketime)")
        self.clock_file.write_text("+0\n")
        return {"LD_PRELOAD": lib, "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
                "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def _add(self, name: str, args: list[str], env: dict[str, str] | None = None,
             on: list[str] | None = None) -> None:
        """``on``: the command prefix that starts it on its host (none: this machine)."""
        self.procs[name] = Proc(name, [*(on or []), CHRONOLOG, *args], self.workdir, env)

    def start(self) -> None:
        for proc in self.procs.values():
            proc.start()

    def not_ready(self) -> dict[str, str]:
        out = {}
        for name, proc in self.procs.items():
            doc = proc.readiness()
            if not doc.get("ready"):
                out[name] = str(doc.get("reason"))
        return out

    async def healthy(self, http: httpx.AsyncClient) -> bool:
        try:
            return (await http.get(f"{self.api}/healthz", timeout=5)).status_code == 200
        except httpx.HTTPError:
            return False

    async def all_ready(self, http: httpx.AsyncClient) -> bool:
        return not self.not_ready() and await self.healthy(http)

    async def supervise(self) -> None:
        """Start again a process that exited by itself (a crash, counted)."""
        while True:
            for proc in self.procs.values():
                if proc.popen is not None and not proc.alive() and not proc.expected_down:
                    code = proc.popen.returncode
                    proc.crashes.append(f"exit {code} at {time.strftime('%H:%M:%S')}")
                    say(f"{self.name}/{proc.name} exited by itself (status {code}): "
                        f"started again")
                    proc.start()
            await asyncio.sleep(0.5)

    def crashes(self) -> dict[str, list[str]]:
        return {n: p.crashes for n, p in self.procs.items() if p.crashes}

    def stop(self) -> dict[str, float | None]:
        """SIGTERM every process (the API first), in parallel; seconds each took."""
        order = ["api", *[n for n in self.procs if n != "api"]]
        for name in order:
            proc = self.procs[name]
            proc.expected_down = True
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        return {name: self.procs[name].stop() for name in order}


# ------------------------------------------------------------------------- the load and the checks


@dataclass
class Window:
    """One scenario's schedules: IDs, the instants each must have."""

    tenant: str
    ids: list[str]
    start: datetime
    end: datetime  # the last instant (inclusive)

    def instants(self) -> list[datetime]:
        n = int((self.end - self.start).total_seconds()) + 1
        return [self.start + timedelta(seconds=k) for k in range(n)]


async def create_schedules(http: httpx.AsyncClient, api: str, window: Window) -> None:
    """Every schedule of the window through the API (bounded concurrency, retried)."""
    body = {"every": "1s", "start": iso(window.start), "anchor": iso(window.start),
            "end": iso(window.end), "job": {"type": "noop", "params": {}},
            "misfire": "all", "overlap": "allow", "lease": "5s",
            "retry": {"maxAttempts": 50, "initialBackoff": "1s", "maxBackoff": "2s"}}
    sem = asyncio.Semaphore(16)

    async def one(sid: str) -> None:
        async with sem:
            for _ in range(20):
                try:
                    r = await http.post(f"{api}/v1/schedules", json={"scheduleId": sid, **body},
                                        headers={**AUTH, "Idempotency-Key": sid}, timeout=30)
                except httpx.HTTPError:
                    await asyncio.sleep(1)
                    continue
                if r.status_code in (200, 201):
                    return
                if r.status_code == 409:  # created by an earlier try whose answer was lost
                    return
                await asyncio.sleep(1)
            raise RuntimeError(f"could not create schedule {sid}")

    await asyncio.gather(*(one(sid) for sid in window.ids))


class Fold:
    """What the log says about some schedules, read incrementally from ``events``."""

    def __init__(self, log: Any, tenant: str, ids: set[str]) -> None:
        self.log = log
        self.tenant = tenant
        self.ids = ids
        self.offsets = [0] * log.topics.partitions
        self.materialized: dict[tuple[str, datetime], list[str]] = {}  # instant -> run IDs
        self.run_instant: dict[str, tuple[str, datetime]] = {}
        self.claimed: dict[str, int] = {}
        self.claimed_by: dict[str, list[str]] = {}  # run ID -> the workers of its attempts
        self.partition_of: dict[str, int] = {}  # run ID -> its partition
        self.results: dict[str, int] = {}
        self.skipped: list[str] = []
        self.dead: list[str] = []
        # instants seen materialized more than a second before they came, by this process's
        # clock (seen only when the fold is read in time: clock-step reads it all along)
        self.early: list[str] = []
        self.created: dict[str, datetime] = {}  # schedule -> its processor's now at creation

    async def update(self) -> None:
        topic = self.log.topics.events
        for p in range(len(self.offsets)):
            while True:
                recs = await self.log.read(topic, p, self.offsets[p], 5000, 0)
                if not recs:
                    break
                for rec in recs:
                    self._apply(rec.value, p)
                self.offsets[p] = recs[-1].offset + 1

    def _apply(self, value: bytes, partition: int) -> None:
        env = codec.decode_event(value)
        if env.tenant != self.tenant or env.schedule_id not in self.ids:
            return
        ev = env.payload
        sid = env.schedule_id
        if isinstance(ev, m.ScheduleCreated):
            self.created[sid] = ev.created_at
        elif isinstance(ev, m.OccurrenceMaterialized):
            key = (sid, ev.scheduled_at)
            self.materialized.setdefault(key, []).append(ev.run_id)
            self.run_instant[ev.run_id] = key
            self.partition_of[ev.run_id] = partition
            if ev.trigger == "schedule" and ev.scheduled_at > datetime.now(UTC) + timedelta(
                    seconds=1):
                self.early.append(f"{sid}@{iso(ev.scheduled_at)}")
        elif isinstance(ev, m.AttemptClaimed):
            self.claimed[ev.run_id] = self.claimed.get(ev.run_id, 0) + 1
            self.claimed_by.setdefault(ev.run_id, []).append(ev.worker_id)
        elif isinstance(ev, m.ResultPublished):
            self.results[ev.run_id] = self.results.get(ev.run_id, 0) + 1
        elif isinstance(ev, m.OccurrenceSkipped):
            self.skipped.append(f"{sid}@{iso(ev.scheduled_at)}: {ev.reason}")
        elif isinstance(ev, m.OccurrenceDeadLettered):
            self.dead.append(f"{ev.run_id}: {ev.reason}")

    def expected(self, window: Window) -> list[tuple[str, datetime]]:
        """Every instant of each schedule's window from its creation on (a schedule's
        first instant is the first at or after its start and its creation)."""
        instants = window.instants()
        out = []
        for s in window.ids:
            created = self.created.get(s)
            out.extend((s, t) for t in instants if created is None or t >= created)
        return out

    def account(self, window: Window) -> dict[str, Any]:
        expected = self.expected(window)
        missing = [(s, t) for s, t in expected if (s, t) not in self.materialized]
        extra_instants = sum(len(r) - 1 for r in self.materialized.values() if len(r) > 1)
        outside = [k for k in self.materialized if not window.start <= k[1] <= window.end]
        runs = [r for rs in self.materialized.values() for r in rs]
        no_result = [r for r in runs if self.results.get(r, 0) == 0]
        extra_results = sum(n - 1 for n in self.results.values() if n > 1)
        return {
            "runs": len(runs), "expected": len(expected),
            "created_late": sum(1 for s in window.ids
                                if self.created.get(s, window.start) > window.start),
            "missing_instants": len(missing), "runs_without_result": len(no_result),
            "extra_occurrences": extra_instants, "extra_results": extra_results,
            "outside_window": len(outside), "skipped": self.skipped[:10],
            "dead": self.dead[:10], "early": self.early[:10],
            "lost": len(missing) + len(no_result),
            "doubled": extra_instants + extra_results + len(outside),
            "examples_missing": [f"{s}@{iso(t)}" for s, t in missing[:5]],
            "examples_no_result": no_result[:5],
        }

    def settled(self, window: Window) -> bool:
        a = self.account(window)
        return a["missing_instants"] == 0 and a["runs_without_result"] == 0

    def fresh_result(self, after: datetime) -> bool:
        """A run scheduled at or after ``after`` has its result."""
        return any(self.results.get(r) and t >= after
                   for r, (_, t) in self.run_instant.items())

    def served_everywhere(self, after: datetime) -> bool:
        """On every partition that has runs, a run scheduled at or after ``after`` has its
        result: whoever owned each partition before, someone decides it now."""
        fresh = {self.partition_of[r] for r, (_, t) in self.run_instant.items()
                 if t >= after and self.results.get(r)}
        return bool(self.partition_of) and set(self.partition_of.values()) <= fresh


class Prober:
    """Manual triggers through the API while the faults happen, twice a second, each with
    its own Idempotency-Key, on a schedule of their own (hourly from a day after the window:
    none of its own instants comes in the run). A trigger the API answered 201 is
    *acknowledged*: its run must be in the log and have exactly one result in the end
    (missing: lost; a second run for one key, or a second result: doubled). The others (the
    API refused or could not answer: 503 while the log is away) are only counted."""

    def __init__(self, http: httpx.AsyncClient, api: str, schedule_id: str) -> None:
        self.http, self.api, self.schedule_id = http, api, schedule_id
        self.acknowledged: dict[str, str] = {}  # Idempotency-Key -> run ID
        self.refused: dict[str, int] = {}  # status (or error class) -> count
        # status -> each different refusal message, with how often it came (a command sent
        # just before a fault is answered "no reply", those after it "cannot accept writes")
        self.said: dict[str, dict[str, int]] = {}
        self._stop = asyncio.Event()

    async def create(self, window: Window) -> None:
        start = iso(window.end + timedelta(days=1))
        body = {"scheduleId": self.schedule_id, "every": "1h", "start": start,
                "job": {"type": "noop", "params": {}}, "overlap": "allow", "lease": "5s",
                "retry": {"maxAttempts": 50, "initialBackoff": "1s", "maxBackoff": "2s"}}
        for _ in range(20):
            with contextlib.suppress(httpx.HTTPError):
                r = await self.http.post(f"{self.api}/v1/schedules", json=body, timeout=30,
                                         headers={**AUTH, "Idempotency-Key": self.schedule_id})
                if r.status_code in (200, 201, 409):
                    return
            await asyncio.sleep(1)
        raise RuntimeError(f"could not create the probe schedule {self.schedule_id}")

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        n = 0
        url = f"{self.api}/v1/schedules/{self.schedule_id}/runs"
        while not self._stop.is_set():
            n += 1
            key = f"{self.schedule_id}-{n}"
            try:
                r = await self.http.post(url, headers={**AUTH, "Idempotency-Key": key},
                                         timeout=10)
                if r.status_code == 201:
                    self.acknowledged[key] = str(r.json()["runId"])
                else:
                    status = str(r.status_code)
                    self.refused[status] = self.refused.get(status, 0) + 1
                    with contextlib.suppress(ValueError, AttributeError):
                        said = self.said.setdefault(status, {})
                        message = str(r.json().get("message"))
                        said[message] = said.get(message, 0) + 1
            except httpx.HTTPError as exc:
                name = type(exc).__name__
                self.refused[name] = self.refused.get(name, 0) + 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.5)

    def settled(self, fold: Fold) -> bool:
        return all(fold.results.get(run) for run in self.acknowledged.values())

    def account(self, fold: Fold) -> dict[str, Any]:
        runs = set(self.acknowledged.values())
        missing = [r for r in runs if r not in fold.run_instant]
        no_result = [r for r in runs if r in fold.run_instant and not fold.results.get(r)]
        doubled = (len(self.acknowledged) - len(runs)
                   + sum(n - 1 for r, n in fold.results.items() if r in runs and n > 1))
        return {"acknowledged": len(self.acknowledged), "refused": self.refused,
                "said": self.said,
                "runs": len(runs), "lost": len(missing) + len(no_result), "doubled": doubled,
                "examples_missing": missing[:5], "examples_no_result": no_result[:5]}


async def audit(dep: Deployment) -> tuple[bool, str]:
    proc = await asyncio.create_subprocess_exec(
        CHRONOLOG, "audit", *dep.offline_flags, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT, env=dep.offline_env)
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    text = (out + err).decode(errors="replace").strip().splitlines()
    return proc.returncode == 0, " | ".join(text[-3:])


async def projection_equals_replay(dep: Deployment, timeout: float) -> tuple[bool, str]:
    """Replay into schema ``fresh``; wait until the live projection reached the replay's
    offsets; compare every table both ways. Again (bounded) if the live one moved past."""
    deadline = time.monotonic() + timeout
    detail = ""
    while time.monotonic() < deadline:
        proc = await asyncio.create_subprocess_exec(
            CHRONOLOG, "replay", *dep.offline_flags, "--schema", "fresh",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
            env=dict(dep.offline_env, CHRONOLOG_DATABASE_URL=dep.dsn))
        _, err = await asyncio.wait_for(proc.communicate(), 900)
        if proc.returncode != 0:
            detail = f"replay exit {proc.returncode}: {err.decode(errors='replace')[-300:]}"
            await asyncio.sleep(2)
            continue
        conn = await asyncpg.connect(dep.dsn)
        try:
            fresh = await _offsets(conn, "fresh")

            async def caught_up(conn: asyncpg.Connection = conn,
                                fresh: dict[int, int] = fresh) -> bool:
                live = await _offsets(conn, "public")
                return all(live.get(k, 0) >= n for k, n in fresh.items())

            if not await poll(caught_up, max(5.0, deadline - time.monotonic())):
                return False, f"the live projection did not reach the replay's offsets {fresh}"
            if await _offsets(conn, "public") != fresh:
                detail = "the live projection moved past the replay: replayed again"
                continue
            diffs = {}
            for table in TABLES:
                a = await conn.fetchval(f'SELECT count(*) FROM (SELECT * FROM public."{table}" '
                                        f'EXCEPT ALL SELECT * FROM fresh."{table}") d')
                b = await conn.fetchval(f'SELECT count(*) FROM (SELECT * FROM fresh."{table}" '
                                        f'EXCEPT ALL SELECT * FROM public."{table}") d')
                if a or b:
                    diffs[table] = (int(a), int(b))
            rows = {t: int(await conn.fetchval(f'SELECT count(*) FROM public."{t}"'))
                    for t in TABLES}
        finally:
            await conn.close()
        if diffs:
            return False, f"rows only live / only replayed: {diffs}"
        return True, f"equal ({', '.join(f'{t} {n}' for t, n in rows.items())})"
    return False, detail or "no replay finished in time"


async def _offsets(conn: asyncpg.Connection, schema: str) -> dict[int, int]:
    rows = await conn.fetch(f'SELECT partition, next_offset FROM "{schema}".projection_offsets '
                            "WHERE topic LIKE '%events'")
    return {int(r["partition"]): int(r["next_offset"]) for r in rows}


# ------------------------------------------------------------------------- scenarios


@dataclass
class Row:
    scenario: str
    faults: str = ""
    runs: int = 0
    lost: int | None = None
    doubled: int | None = None
    audit: str = "-"
    replay: str = "-"
    crashes: int = 0
    recover_s: float | None = None
    error: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return (not self.error and self.lost == 0 and self.doubled == 0
                and self.audit == "pass" and self.replay == "equal" and self.crashes == 0
                and self.recover_s is not None)


class Chaos:
    def __init__(self, plan: Plan, work: Path, log_kind: str = "kafka",
                 brokers: int = 1, hosts: Hosts | None = None) -> None:
        self.plan = plan
        self.work = work
        self.log_kind = log_kind  # where postgres-restart and kill-processes run
        self.brokers = brokers  # 1: one broker; 3: a cluster (Cluster)
        self.hosts = hosts  # the cluster and the processors and workers on hosts (HostCluster)
        self.ports: set[int] = set()
        self.broker: Broker | None = None
        self.pg: Postgres | None = None
        self.deployments: dict[str, Deployment] = {}
        self.active: Deployment | None = None
        self.http = httpx.AsyncClient()
        self.supervisors: dict[str, asyncio.Task[None]] = {}
        self.sequence = 0
        self.mount = work / "tmpfs"
        self.mounted = False

    # ---- set-up and tear-down

    async def postgres(self) -> Postgres:
        if self.pg is None:
            say("starting a private PostgreSQL")
            self.pg = Postgres(self.work / "pg", self.ports)
            await asyncio.to_thread(self.pg.start)
        return self.pg

    async def deployment(self, kind: str) -> Deployment:
        """The deployment on the ``kind`` log, started (the other one stopped: one at a
        time shares the machine's CPU)."""
        dep = self.deployments.get(kind)
        if dep is not None and dep is self.active:
            return dep
        if self.active is not None:
            say(f"stopping the {self.active.name} deployment")
            await asyncio.to_thread(self.active.stop)
            self.active = None
        await self.postgres()
        if dep is None:
            dep = self.deployments[kind] = await self.build(kind)
        say(f"starting the {kind} deployment: {', '.join(dep.procs)}")
        dep.start()
        self.active = dep
        task = self.supervisors.pop(kind, None)
        if task is not None:
            task.cancel()
        self.supervisors[kind] = asyncio.create_task(dep.supervise())
        if not await poll(lambda: dep.all_ready(self.http), self.plan.start):
            late = dep.not_ready()
            tails = {name: dep.procs[name].tail(5) for name in late}
            raise RuntimeError(f"the {kind} deployment did not become ready within "
                               f"{self.plan.start:.0f} s: {late}; their last lines: {tails}")
        return dep

    async def build(self, kind: str) -> Deployment:
        topics = Topics(prefix="chaos.", partitions=PARTITIONS)
        if kind == "kafka":
            if self.broker is None:
                if self.hosts is not None:
                    say("starting a private Kafka cluster of three brokers, one per host")
                    self.broker = HostCluster(self.work / "kafka", self.ports, self.hosts)
                elif self.brokers == 3:
                    say("starting a private Kafka cluster of three brokers")
                    self.broker = Cluster(self.work / "kafka", self.ports)
                else:
                    say("starting a private Kafka broker")
                    self.broker = Broker(self.work / "kafka", self.ports)
                await asyncio.to_thread(self.broker.up)
            cfg = LogConfig("kafka", self.broker.bootstrap, topics)
        else:  # the embedded log, on a tmpfs of its own (the full-disk scenario fills it)
            await self.mount_tmpfs()
            cfg = LogConfig("sqlite", str(self.mount / "log.db"), topics)
        assert self.pg is not None
        dsn = await self.pg.database(f"chaos_{kind}")
        lg = open_log(cfg)
        await lg.start()
        try:
            await lg.ensure_topics()
        finally:
            await lg.close()
        dep = Deployment(kind, cfg, dsn, self.work / kind, free_port(self.ports),
                         hosts=self.hosts if kind == "kafka" else None)
        dep.build()
        return dep

    async def mount_tmpfs(self) -> None:
        self.mount.mkdir(parents=True, exist_ok=True)
        size = self.plan.tmpfs_mb * (3 if self.log_kind == "sqlite" else 1)
        done = await asyncio.to_thread(
            subprocess.run, ["mount", "-t", "tmpfs", "-o", f"size={size}m", "tmpfs",
                             str(self.mount)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError("mounting a tmpfs for the embedded log failed (it needs root / "
                               f"CAP_SYS_ADMIN): {done.stderr.strip()}")
        self.mounted = True

    async def close(self) -> None:
        for task in self.supervisors.values():
            task.cancel()
        if self.active is not None:
            await asyncio.to_thread(self.active.stop)
        await self.http.aclose()
        if self.broker is not None:
            await asyncio.to_thread(self.broker.down)
        if self.hosts is not None:
            await asyncio.to_thread(self.hosts.close)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.pg.stop)
        if self.mounted:
            await asyncio.to_thread(subprocess.run, ["umount", "-l", str(self.mount)],
                                    check=False, capture_output=True)

    # ---- one scenario

    def window(self, scenario: str, seconds: float) -> Window:
        self.sequence += 1
        # time to create them through the API before the first instant (about 12 a second
        # on a loaded 2-core machine; one created later starts at its creation, see Fold)
        lead = 3 + self.plan.schedules / 10
        start = datetime.fromtimestamp(int(time.time() + lead) + 1, UTC)
        end = start + timedelta(seconds=int(seconds))
        ids = [f"{scenario}-{self.sequence}-{i:03d}" for i in range(self.plan.schedules)]
        return Window("default", ids, start, end)

    async def run(self, scenario: str) -> Row:
        row = Row(scenario)
        say(f"scenario {scenario}")
        try:
            kind = ("sqlite" if scenario == "disk-full"
                    else "kafka" if scenario in KAFKA_ONLY + CLUSTER_ONLY + HOSTS_ONLY
                    else self.log_kind)
            dep = await self.deployment(kind)
            row.details["log"] = kind
            p = self.plan
            kills = len(dep.procs) if scenario == "kill-processes" else 0
            span = p.warmup + p.down + p.after + kills * (p.kill_gap
                                                          + (30 if p.kill_waits else 0))
            if scenario in CLUSTER_ONLY:  # a node restarted after the fault, waited for
                span += 10 + (max(p.down, STOP_LONG_S) - p.down
                              if scenario == "broker-stop-long" else 0)
            if scenario in HOSTS_ONLY:  # a cut lasts CUT_S at least, then the link heals
                span += 10 + max(p.down, CUT_S) - p.down
            if scenario == "clock-step":  # two steps, each held for the outage
                span += p.down
            window = self.window(scenario, span)
            await self.load_and_check(dep, window, row,
                                      lambda: self.faults(scenario, dep, row, window))
            if kind == "sqlite":
                integrity = await asyncio.to_thread(sqlite_integrity, self.mount / "log.db")
                row.details["integrity"] = integrity
                if integrity != "ok":
                    row.error = f"integrity_check: {integrity}"
        except Exception as exc:  # noqa: BLE001 - a scenario that breaks is a dirty row
            row.error = f"{type(exc).__name__}: {exc}"[:500]
            say(f"scenario {scenario} failed: {row.error}")
        return row

    async def load_and_check(self, dep: Deployment, window: Window, row: Row,
                             inject: Any) -> None:
        p = self.plan
        crashes_before = sum(len(c) for c in dep.crashes().values())
        lines_before = {n: pr.lines() for n, pr in dep.procs.items()}
        await create_schedules(self.http, dep.api, window)
        prober = Prober(self.http, dep.api, f"{window.ids[0]}-probe")
        await prober.create(window)
        say(f"{len(window.ids)} schedules every 1s from {iso(window.start)} to "
            f"{iso(window.end)}")
        lg = open_log(dep.log)
        await lg.start()
        fold = Fold(lg, window.tenant, set(window.ids))
        probed = Fold(lg, window.tenant, {prober.schedule_id})
        try:
            await asyncio.sleep(max(0.0, (window.start - datetime.now(UTC)).total_seconds()
                                    + p.warmup))
            probing = asyncio.create_task(prober.run())
            try:
                await inject()
            finally:
                prober.stop()
                await probing
            # the window's end, then every run settled
            await asyncio.sleep(max(0.0, (window.end - datetime.now(UTC)).total_seconds()))

            async def settled() -> bool:
                await fold.update()
                await probed.update()
                return fold.settled(window) and prober.settled(probed)

            t = time.monotonic()
            await poll(settled, p.settle, interval=1.0)
            with contextlib.suppress(Exception):
                await fold.update()
                await probed.update()
            account = fold.account(window)
            acknowledged = prober.account(probed)
            row.details["settle_s"] = round(time.monotonic() - t, 1)
        finally:
            await lg.close()
        row.runs = account["runs"] + acknowledged["runs"]
        row.lost = account["lost"] + acknowledged["lost"]
        row.doubled = account["doubled"] + acknowledged["doubled"]
        row.details["account"] = account
        if account["early"] and not row.error:
            row.error = f"runs materialized early: {account['early']}"
        row.details["acknowledged"] = acknowledged
        row.details["log_lines"] = {n: pr.lines() - lines_before[n]
                                    for n, pr in dep.procs.items()}
        t = time.monotonic()
        (audited, audit_text), (equal, text) = await asyncio.gather(
            audit(dep), projection_equals_replay(dep, p.settle))
        row.audit = "pass" if audited else "FAIL"
        row.details["audit"] = audit_text
        row.replay = "equal" if equal else "DIFFERS"
        row.details["replay"] = text
        row.details["checks_s"] = round(time.monotonic() - t, 1)
        row.crashes = sum(len(c) for c in dep.crashes().values()) - crashes_before
        row.details["crashes"] = dep.crashes()
        say(f"{row.scenario}: runs {row.runs}, lost {row.lost}, doubled {row.doubled}, "
            f"audit {row.audit}, replay {row.replay} ({text}), crashes {row.crashes}, "
            f"recover {row.recover_s}")

    async def recovered(self, dep: Deployment, cleared: datetime, fold_log: Any,
                        window: Window) -> float | None:
        """Seconds from ``cleared`` until everything is ready and a run scheduled after it
        has its result (None: not within ``plan.ready``)."""
        fold = Fold(fold_log, window.tenant, set(window.ids))

        async def back() -> bool:
            if not await dep.all_ready(self.http):
                return False
            if cleared >= window.end - timedelta(seconds=2):
                return True  # no instant left after it: ready is all there is to wait for
            await fold.update()
            return fold.fresh_result(cleared)

        if await poll(back, self.plan.ready, interval=0.5) is None:
            say(f"not recovered within {self.plan.ready:.0f}s: {dep.not_ready()}")
            return None
        return round((datetime.now(UTC) - cleared).total_seconds(), 1)

    async def faults(self, scenario: str, dep: Deployment, row: Row, window: Window) -> None:
        p = self.plan
        pg = await self.postgres()
        lg = open_log(dep.log)
        await lg.start()
        try:
            if scenario == "broker-restart":
                assert self.broker is not None
                row.faults = f"broker kill -9, down {p.down:g}s, restarted"
                await self.broker_down(dep, row)
                await asyncio.sleep(p.down)
                await asyncio.to_thread(self.broker.start)
                cleared = datetime.now(UTC)
                row.recover_s = await self.recovered(dep, cleared, lg, window)
            elif scenario == "postgres-restart":
                row.faults = f"PostgreSQL stopped, down {p.down:g}s, restarted"
                await asyncio.to_thread(pg.stop)
                await self.observe_not_ready(dep, row, "read model unreachable")
                await asyncio.sleep(p.down)
                await asyncio.to_thread(pg.start)
                cleared = datetime.now(UTC)
                row.recover_s = await self.recovered(dep, cleared, lg, window)
            elif scenario == "kill-processes":
                worst = 0.0
                names = list(dep.procs)
                row.faults = (f"kill -9 of each of {len(names)} processes in turn"
                              + ("" if p.kill_waits else f", {p.kill_gap:g}s apart"))
                for name in names:
                    proc = dep.procs[name]
                    proc.kill()
                    proc.start()
                    cleared = datetime.now(UTC)
                    if p.kill_waits:
                        took = await self.recovered(dep, cleared, lg, window)
                        row.details.setdefault("recover_per_kill", {})[name] = took
                        if took is None:
                            row.recover_s = None
                            return
                        worst = max(worst, took)
                    await asyncio.sleep(p.kill_gap)
                if not p.kill_waits:
                    worst = await self.recovered(dep, cleared, lg, window) or -1.0
                row.recover_s = worst if worst >= 0 else None
            elif scenario == "combined":
                assert self.broker is not None
                row.faults = (f"broker kill -9 + PostgreSQL stopped, down {p.down:g}s; "
                              "processor-1 and worker-1 kill -9 and restarted meanwhile")
                await self.broker_down(dep, row)
                await asyncio.to_thread(pg.stop)
                for name in ("processor-1", "worker-1"):
                    dep.procs[name].kill()
                    dep.procs[name].start()
                await asyncio.sleep(p.down)
                await asyncio.to_thread(pg.start)
                await asyncio.to_thread(self.broker.start)
                cleared = datetime.now(UTC)
                row.recover_s = await self.recovered(dep, cleared, lg, window)
            elif scenario == "disk-full":
                row.faults = f"the SQLite log's tmpfs full for {p.down:g}s, then freed"
                filler = self.mount / "filler"
                row.details["filled_bytes"] = await asyncio.to_thread(fill, filler)
                noticed = await poll(lambda: disk_full_logged(dep), 30)
                row.details["disk_full_logged_by"] = noticed
                if not noticed:
                    raise RuntimeError("no process logged a disk-full error while the disk "
                                       "was full")
                await asyncio.sleep(p.down)
                filler.unlink()
                cleared = datetime.now(UTC)
                row.recover_s = await self.recovered(dep, cleared, lg, window)
            elif scenario in CLUSTER_ONLY:
                await self.cluster_faults(scenario, dep, row, window, lg)
            elif scenario in HOSTS_ONLY:
                await self.host_faults(scenario, dep, row, window, lg)
        finally:
            with contextlib.suppress(Exception):
                await lg.close()

    async def cluster_faults(self, scenario: str, dep: Deployment, row: Row, window: Window,
                             lg: Any) -> None:
        """The faults of a three-broker cluster; *recover* is from the fault (a node lost:
        the others carry on) or, for two nodes lost, from the first one's return."""
        p = self.plan
        cluster = self.broker
        if not isinstance(cluster, Cluster):
            raise RuntimeError(f"{scenario} needs a three-broker cluster (--brokers 3)")
        topics = dep.log.topics
        if scenario in ("leader-kill", "coordinator-kill"):
            if scenario == "leader-kill":
                node = await leader_of(cluster.bootstrap, topics.events, 0)
                what = "the leader of events partition 0"
            else:
                node = await transaction_coordinator(cluster.bootstrap,
                                                     f"{topics.prefix}processor-p0")
                what = "the coordinator of partition 0's processor transactions"
            row.faults = f"kill -9 of broker {node}, {what}; restarted after {p.down:g}s"
            await asyncio.to_thread(cluster.kill_node, node)
            cleared = datetime.now(UTC)
            row.recover_s = await self.recovered(dep, cleared, lg, window)
            await asyncio.sleep(max(0.0, p.down - (datetime.now(UTC) - cleared).total_seconds()))
            await asyncio.to_thread(cluster.start_node, node)
        elif scenario == "broker-stop-long":
            node = await leader_of(cluster.bootstrap, topics.events, 1)
            down = max(p.down, STOP_LONG_S)
            row.faults = (f"broker {node} (leader of events partition 1) stopped for {down:g}s "
                          "(longer than the group session timeout), then started")
            await asyncio.to_thread(cluster.stop_node, node)
            await asyncio.sleep(down)
            await asyncio.to_thread(cluster.start_node, node)
            cleared = datetime.now(UTC)
            row.recover_s = await self.recovered(dep, cleared, lg, window)
        elif scenario == "two-brokers-down":
            first = await leader_of(cluster.bootstrap, topics.events, 0)
            second = next(n for n in Cluster.NODES if n != first)
            row.faults = (f"kill -9 of brokers {first} and {second}, {p.down:g}s; broker "
                          f"{second} started again, then {first}")
            await asyncio.to_thread(cluster.kill_node, first)
            await asyncio.to_thread(cluster.kill_node, second)
            await self.observe_not_ready(dep, row, "not enough in-sync replicas")
            await asyncio.sleep(p.down)
            await asyncio.to_thread(cluster.start_node, second)
            cleared = datetime.now(UTC)
            row.recover_s = await self.recovered(dep, cleared, lg, window)
            await asyncio.to_thread(cluster.start_node, first)
        if not await poll(lambda: dep.all_ready(self.http), p.ready):
            raise RuntimeError(f"not every process ready after the cluster came back: "
                               f"{dep.not_ready()}")

    async def host_faults(self, scenario: str, dep: Deployment, row: Row, window: Window,
                          lg: Any) -> None:
        """The faults of a network between hosts (``--hosts 3``): a cut lasts ``CUT_S`` at
        least (past the group session timeout and a lease), then the link heals; *recover*
        is from the heal."""
        hosts = self.hosts
        if hosts is None:
            raise RuntimeError(f"{scenario} needs hosts (--hosts 3)")
        cut = max(self.plan.down, CUT_S)
        started = time.monotonic()
        fold = Fold(lg, window.tenant, set(window.ids))
        if scenario == "processor-cut":
            row.faults = (f"processor-1's connections to every broker cut both ways for "
                          f"{cut:g}s at least (past the session timeout; until its partitions "
                          "had moved), then healed")
            lines = dep.procs["processor-1"].lines()
            since = datetime.now(UTC)
            hosts.cut(1, "processor")

            async def moved() -> bool:
                await fold.update()
                return fold.served_everywhere(since + timedelta(seconds=1))

            # the cut lasts until every partition is served again (a loaded machine takes
            # longer than the session timeout to move them), and ``cut`` at least
            served = await poll(moved, MOVE_WITHIN_S, interval=0.5)
            if not served:
                raise RuntimeError(f"in the {MOVE_WITHIN_S:g}s processor-1 was cut off, some "
                                   "partition had no run decided: its partitions did not move")
            row.details["every_partition_served_after_s"] = round(
                (datetime.now(UTC) - since).total_seconds(), 1)
            await asyncio.sleep(max(0.0, cut - (time.monotonic() - started)))
            hosts.heal()
            row.details["cut_s"] = round(time.monotonic() - started, 1)
            cleared = datetime.now(UTC)
            row.recover_s = await self.recovered(dep, cleared, lg, window)
            fenced = await poll(lambda: said(dep.procs["processor-1"], lines, ("fenced",)),
                                self.plan.ready, interval=0.5)
            row.details["processor_1_said"] = fenced
            if not fenced:
                raise RuntimeError("processor-1 never said it was fenced after the heal")
        elif scenario == "worker-cut":
            await self.worker_cut(dep, row, window, lg, cut)
        elif scenario == "broker-isolated":
            node = await leader_of(dep.log.target, dep.log.topics.events, 0)
            row.faults = (f"broker {node} (leader of events partition 0) cut from the other "
                          f"two brokers, both ways, for {cut:g}s; clients reach all three")
            row.details["leader_before"] = node
            hosts.isolate_broker(node)

            async def new_leader() -> int | None:
                with contextlib.suppress(Exception):
                    leader = await leader_of(dep.log.target, dep.log.topics.events, 0)
                    return leader if leader != node else None
                return None

            leader = await poll(new_leader, cut, interval=0.5)
            row.details["leader_during_cut"] = leader
            if leader is None:
                raise RuntimeError(f"events partition 0 kept its leader {node} while it was "
                                   "cut from the other brokers")
            await asyncio.sleep(max(0.0, cut - (time.monotonic() - started)))
            hosts.heal()
            cleared = datetime.now(UTC)
            row.recover_s = await self.recovered(dep, cleared, lg, window)
        elif scenario == "clock-step":
            await self.clock_step(dep, row, window, lg)
            return
        elif scenario == "receive-only-cut":
            row.faults = (f"host 1's processor and worker can send but not receive for "
                          f"{cut:g}s, then healed")
            hosts.cut(1, "processor", receive_only=True)
            hosts.cut(1, "worker", receive_only=True)
            await asyncio.sleep(cut)
            hosts.heal()
            cleared = datetime.now(UTC)
            row.recover_s = await self.recovered(dep, cleared, lg, window)
        if not await poll(lambda: dep.all_ready(self.http), self.plan.ready):
            raise RuntimeError(f"not every process ready after the link healed: "
                               f"{dep.not_ready()}")

    async def clock_step(self, dep: Deployment, row: Row, window: Window, lg: Any) -> None:
        """processor-1's wall clock (host 1) stepped +10 minutes while it owns partitions,
        set right, then -10 minutes, set right — each step held for the outage. Its guard
        must notice and hold each one (``clock_step_detected``, then ``clock_step_cleared``):
        no instant early (the fold is read all along: an instant seen materialized before it
        came is *early*), none missing or twice, no lease cut short."""
        proc = dep.procs["processor-1"]
        lines = proc.lines()
        fold = Fold(lg, window.tenant, set(window.ids))
        row.faults = (f"processor-1's clock stepped +{int(CLOCK_STEP) // 60} min for "
                      f"{self.plan.down:g}s, set right, then -{int(CLOCK_STEP) // 60} min "
                      f"for {self.plan.down:g}s, set right (libfaketime)")
        said_lines: list[str] = []
        unnoticed: list[str] = []
        for step in (f"+{CLOCK_STEP}", f"-{CLOCK_STEP}"):
            for offset, event in ((step, "clock_step_detected"), ("+0", "clock_step_cleared")):
                dep.clock_file.write_text(offset + "\n")
                seen = len(said(proc, lines, (event,), most=100))

                async def noticed(e: str = event, n: int = seen) -> bool:
                    await fold.update()  # read along: an early instant is seen in time
                    return len(said(proc, lines, (e,), most=100)) > n

                if await poll(noticed, 30, interval=0.5):
                    said_lines += said(proc, lines, (event,), most=100)[seen:seen + 1]
                else:  # the steps go on: what a missed step did is checked below
                    unnoticed.append(f"no {event} after the clock was set to {offset} s")
                if offset != "+0":
                    end = time.monotonic() + self.plan.down
                    while time.monotonic() < end:
                        await fold.update()
                        await asyncio.sleep(0.5)
        cleared = datetime.now(UTC)
        row.details["processor_1_said"] = said_lines
        row.details["early_while_stepped"] = fold.early[:10]
        if fold.early or unnoticed:
            raise RuntimeError(f"instants materialized early: {fold.early[:5]}; processor-1 "
                               f"said: {unnoticed or 'each step noticed'}")
        row.recover_s = await self.recovered(dep, cleared, lg, window)

    async def worker_cut(self, dep: Deployment, row: Row, window: Window, lg: Any,
                         cut: float) -> None:
        """A worker cut off while it runs handlers that outlast the lease (the worker that
        took the slow runs): each attempt it held is taken over at lease expiry (another
        worker runs it), and the late word of its own — a heartbeat or the result, sent when
        the link heals — is answered ``stale_fence``; every run has one result."""
        hosts = self.hosts
        assert hosts is not None
        sid = f"{window.ids[0]}-slow"
        await create_slow_schedule(self.http, dep.api, sid, window)
        slow = Fold(lg, window.tenant, {sid})
        runs = await trigger_runs(self.http, dep.api, sid, sid, 6)

        async def running() -> list[tuple[str, str]] | None:
            """(run, worker) of the slow runs claimed and not finished, once every one of
            them has been claimed (they run on one worker: their partition's)."""
            await slow.update()
            if not all(slow.claimed_by.get(r) for r in runs):
                return None
            return [(r, slow.claimed_by[r][-1]) for r in runs if not slow.results.get(r)]

        claims = await poll(running, 60, interval=0.2)
        if not claims:
            raise RuntimeError(
                f"of the {len(runs)} slow runs, {sum(bool(slow.claimed_by.get(r)) for r in runs)}"
                f" were claimed within 60 s and {sum(bool(slow.results.get(r)) for r in runs)}"
                " had finished: none left to cut off")
        worker = max({w for _, w in claims}, key=lambda w: sum(x == w for _, x in claims))
        held = [r for r, w in claims if w == worker]
        # each held run's claims so far: its attempt on the cut worker is the last of them
        at_cut = {r: len(slow.claimed_by[r]) for r in held}
        number = int(worker.rsplit("-", 1)[1])
        row.faults = (f"{worker}'s connections cut both ways for {cut:g}s while its "
                      f"handlers (sleep {SLOW_S:g}s, lease 5s) run, then healed")
        lines = dep.procs[worker].lines()
        hosts.cut(number, "worker")
        await asyncio.sleep(cut)
        hosts.heal()
        cleared = datetime.now(UTC)
        row.recover_s = await self.recovered(dep, cleared, lg, window)

        async def settled() -> bool:
            await slow.update()
            return all(slow.results.get(r) for r in runs)

        await poll(settled, self.plan.settle, interval=1.0)
        refused = await poll(lambda: said(dep.procs[worker], lines, ("stale_fence",))
                             or None, self.plan.ready, interval=0.5)
        lost = [r for r in runs if not slow.results.get(r)]
        doubled = [r for r in runs if slow.results.get(r, 0) > 1]
        # a run whose result the worker sent just before the cut (read later) is not taken
        # over: it finished; the others must be — by another worker, after the cut (on a
        # loaded machine a run may also have changed hands before the cut, or come back to
        # the healed worker afterwards, so only the claims after the cut are judged)
        taken_over = [r for r in held
                      if any(w != worker for w in slow.claimed_by[r][at_cut[r]:])]
        row.details["slow_runs"] = {
            "runs": len(runs), "worker": worker, "held_at_the_cut": len(held),
            "lost": len(lost), "doubled": len(doubled), "taken_over": len(taken_over),
            # each held run's workers, claim by claim, and how many claims it had at the cut
            "claims_of_held": {r: {"at_cut": at_cut[r], "claims": slow.claimed_by[r]}
                               for r in held},
            "worker_said": refused}
        if lost or doubled or not taken_over or not refused:
            raise RuntimeError(f"slow runs: {row.details['slow_runs']}")

    async def broker_down(self, dep: Deployment, row: Row) -> None:
        assert self.broker is not None
        await asyncio.to_thread(self.broker.kill)
        await self.observe_not_ready(dep, row, "log unreachable")

    async def observe_not_ready(self, dep: Deployment, row: Row, expected: str) -> None:
        """The processes notice: the API's /healthz is 503 naming the service (bounded;
        recorded)."""
        api = f"{dep.api}/healthz"

        async def api_says() -> str | None:
            r = await self.http.get(api, timeout=5)
            if r.status_code != 503:
                return None
            message = str(r.json().get("message", ""))
            return message if expected in message else None

        message = await poll(api_says, 30)
        row.details.setdefault("healthz_during_fault", []).append(message)
        if message is None:
            raise RuntimeError(f"/healthz did not report '{expected}' during the fault")


async def create_slow_schedule(http: httpx.AsyncClient, api: str, schedule_id: str,
                               window: Window) -> None:
    """A schedule whose runs sleep ``SLOW_S`` (run by manual triggers: its own instants
    are a day after the window)."""
    body = {"scheduleId": schedule_id, "every": "1h",
            "start": iso(window.end + timedelta(days=1)),
            "job": {"type": "sleep", "params": {"seconds": SLOW_S}}, "overlap": "allow",
            "lease": "5s", "retry": {"maxAttempts": 50, "initialBackoff": "1s",
                                     "maxBackoff": "2s"}}
    for _ in range(20):
        with contextlib.suppress(httpx.HTTPError):
            r = await http.post(f"{api}/v1/schedules", json=body, timeout=30,
                                headers={**AUTH, "Idempotency-Key": schedule_id})
            if r.status_code in (200, 201, 409):
                return
        await asyncio.sleep(1)
    raise RuntimeError(f"could not create the schedule {schedule_id}")


async def trigger_runs(http: httpx.AsyncClient, api: str, schedule_id: str, stem: str,
                       count: int) -> list[str]:
    """``count`` manual runs of ``schedule_id`` (each retried with its key); their run IDs."""
    out = []
    for i in range(count):
        for _ in range(20):
            with contextlib.suppress(httpx.HTTPError):
                r = await http.post(f"{api}/v1/schedules/{schedule_id}/runs", timeout=10,
                                    headers={**AUTH, "Idempotency-Key": f"{stem}-{i}"})
                if r.status_code in (200, 201):
                    out.append(str(r.json()["runId"]))
                    break
            await asyncio.sleep(1)
        else:
            raise RuntimeError(f"could not trigger a run of {schedule_id}")
    return out


def said(proc: Proc, after_line: int, words: tuple[str, ...], most: int = 5) -> list[str]:
    """The lines of ``proc``'s log after line ``after_line`` that hold one of ``words``
    (at most ``most``, each cut to 300 characters)."""
    try:
        text = proc.log_path.read_text(errors="replace")
    except OSError:
        return []
    hits = [line[:300] for line in text.splitlines()[after_line:]
            if any(w in line for w in words)]
    return hits[:most]


def fill(path: Path) -> int:
    """Write zeros to ``path`` until its file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            part = chunk[:size]
            while True:
                try:
                    written += f.write(part) or 0
                except OSError:
                    break
    return written


def disk_full_logged(dep: Deployment) -> list[str]:
    """The processes whose log says the disk is full."""
    out = []
    for name, proc in dep.procs.items():
        try:
            text = proc.log_path.read_text(errors="replace")
        except OSError:
            continue
        if "disk full" in text:
            out.append(name)
    return out


def sqlite_integrity(path: Path) -> str:
    import sqlite3

    conn = sqlite3.connect(str(path), timeout=30)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


# ------------------------------------------------------------------------- the table


def table(rows: list[Row]) -> str:
    head = ["scenario", "faults injected", "runs", "lost", "doubled", "audit", "replay",
            "crashes", "recover (s)"]
    body = [[r.scenario, r.faults or r.error or "-", str(r.runs),
             "-" if r.lost is None else str(r.lost),
             "-" if r.doubled is None else str(r.doubled), r.audit, r.replay,
             str(r.crashes), "-" if r.recover_s is None else f"{r.recover_s:.1f}"]
            for r in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    plan = SHORT if args.short else Plan()
    if args.schedules:
        plan = Plan(**{**plan.__dict__, "schedules": args.schedules})
    if args.hosts:
        chosen = args.scenario or list(HOSTS_ONLY)
        if "disk-full" in chosen:
            print("chaos.py: disk-full runs on the embedded log, not on hosts", file=sys.stderr)
            return 2
    elif args.brokers == 3:
        chosen = args.scenario or list(CLUSTER_ONLY)
    else:
        chosen = args.scenario or [s for s in SCENARIOS if s not in CLUSTER_ONLY + HOSTS_ONLY
                                   and (args.log == "kafka" or s not in KAFKA_ONLY)]
        if set(chosen) & set(CLUSTER_ONLY):
            print(f"chaos.py: {', '.join(sorted(set(chosen) & set(CLUSTER_ONLY)))} need a "
                  "three-broker cluster (--brokers 3)", file=sys.stderr)
            return 2
    if not args.hosts and set(chosen) & set(HOSTS_ONLY):
        print(f"chaos.py: {', '.join(sorted(set(chosen) & set(HOSTS_ONLY)))} need hosts "
              "(--hosts 3)", file=sys.stderr)
        return 2
    if args.log == "sqlite" and set(chosen) & set(KAFKA_ONLY):
        print(f"chaos.py: {', '.join(sorted(set(chosen) & set(KAFKA_ONLY)))} need a broker "
              "(--log kafka)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="chronolog-chaos-"))
    os.chmod(work, 0o755)  # the embedded PostgreSQL runs as another user when we are root
    say(f"work directory {work}; scenarios {', '.join(chosen)}; "
        f"{plan.schedules} schedules, outages of {plan.down:g}s")
    hosts = None
    if args.hosts:
        why = hosts_unavailable()
        if why is not None:
            print(f"chaos.py: --hosts: {why}", file=sys.stderr)
            return 2
        hosts = Hosts(args.hosts)
        say(f"hosts {', '.join(h.address for h in hosts.hosts)} (namespaces "
            f"{hosts.hosts[0].namespace}...), this machine {hosts.machine_address}")
        hosts.up()
    chaos = Chaos(plan, work, "kafka" if hosts else args.log, 3 if hosts else args.brokers,
                  hosts)
    rows: list[Row] = []
    started = time.monotonic()
    try:
        for name in chosen:
            rows.append(await chaos.run(name))
    finally:
        await chaos.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    print(f"\n{sum(r.clean for r in rows)} of {len(rows)} scenarios clean in "
          f"{time.monotonic() - started:.0f}s")
    if args.json:
        text = json.dumps([r.__dict__ for r in rows], indent=2, default=str)
        await asyncio.to_thread(Path(args.json).write_text, text)
    return 0 if rows and all(r.clean for r in rows) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true",
                        help="a few seconds per outage, 20 schedules (make test)")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS,
                        help="run only this scenario (repeatable)")
    parser.add_argument("--log", choices=("kafka", "sqlite"), default="kafka",
                        help="the log of postgres-restart and kill-processes (default kafka; "
                             "sqlite: the embedded log, no broker, without the broker "
                             "scenarios)")
    parser.add_argument("--brokers", type=int, choices=(1, 3), default=1,
                        help="Kafka brokers: 1, or a cluster of 3 (replication 3, min ISR 2) "
                             "whose scenarios are then the default: " + ", ".join(CLUSTER_ONLY))
    parser.add_argument("--hosts", type=int, choices=(3,), default=None,
                        help="three hosts (network namespaces), each with a broker of the "
                             "cluster, a processor and a worker; the API, projector, effect "
                             "runner and PostgreSQL on this machine; their scenarios are then "
                             "the default: " + ", ".join(HOSTS_ONLY) + " (the cluster's, "
                             "named with --scenario, run on the hosts' cluster)")
    parser.add_argument("--schedules", type=int, default=None,
                        help="schedules per scenario (default 200, --short 20)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the rows with their details as JSON")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, readiness files)")
    args = parser.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
