"""Idle benchmark: what a deployment with nothing to do costs, per process, in CPU.

Starts a ``chronolog processor``, ``projector``, ``worker`` (the built-in jobs) and ``api`` on
a fresh log (``--log sqlite``: a log file in a temporary directory; ``--log kafka``: new
topics on ``KAFKA_BOOTSTRAP_SERVERS``) and a PostgreSQL database for the read model
(``--database-url``, default ``CHRONOLOG_DATABASE_URL``, else ``CHRONOLOG_TEST_DATABASE_URL``,
which ``scripts/with_services.py`` sets), with no schedule at all. After
``--warm`` seconds (every partition assigned, the worker announcing itself every 2 s, which
the processor and projector consume) it measures each process's user+system CPU, and the
broker's on Kafka, over ``--seconds``, ``--runs`` times on the same processes, and prints
each as a share of one core, the medians last. Nothing runs meanwhile: what it measures is
the cost of waiting — polls, heartbeats, fetches, announcements.

The commands (docs/performance.md, "An idle deployment") run it inside
``scripts/with_services.py``, which starts PostgreSQL (and Kafka) for it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import burstlib as B

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
ROLES = ("processor", "projector", "worker", "api")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", choices=("sqlite", "kafka"), default="sqlite")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--database-url", default=os.environ.get("CHRONOLOG_DATABASE_URL")
                        or os.environ.get("CHRONOLOG_TEST_DATABASE_URL"))
    parser.add_argument("--warm", type=float, default=20.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of a measurement")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url (or CHRONOLOG_TEST_DATABASE_URL) is required")
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    if args.log == "kafka" and not servers:
        parser.error("--log kafka needs KAFKA_BOOTSTRAP_SERVERS")
    with tempfile.TemporaryDirectory(prefix="chronolog-idle-") as tmp:
        run = Path(tmp)
        log = f"kafka://{servers}" if args.log == "kafka" else f"sqlite://{run / 'log.db'}"
        common = ["--log", log, "--partitions", str(args.partitions),
                  "--topic-prefix", f"idle{uuid.uuid4().hex[:8]}."]
        extra = {"processor": [],
                 "projector": ["--database-url", args.database_url],
                 "worker": ["--builtin-jobs", "--results", str(run / "results")],
                 "api": ["--database-url", args.database_url, "--port", "0"]}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for role in ROLES:
                procs[role] = subprocess.Popen(
                    [CHRONOLOG, role, *common, *extra[role]],
                    stdout=subprocess.DEVNULL, stderr=open(run / f"{role}.log", "wb"))
            pids = {role: p.pid for role, p in procs.items()}
            if args.log == "kafka":
                pids.update(("broker" if i == 0 else f"broker{i + 1}", pid)
                            for i, pid in enumerate(B.broker_pids(servers)))
            print(f"idle: log={args.log} {args.partitions} partitions, warm {args.warm:.0f} s, "
                  f"{args.runs} x {args.seconds:.0f} s; share of one core per process")
            print(" ".join(f"{k:>10}" for k in [*pids, "total"]))
            time.sleep(args.warm)
            shares: list[dict[str, float]] = []
            for _ in range(args.runs):
                for role, p in procs.items():
                    if p.poll() is not None:
                        sys.exit(f"{role} exited with {p.returncode}: see {run}/{role}.log")
                before = {k: B.cpu_seconds([pid]) for k, pid in pids.items()}
                t0 = time.monotonic()
                time.sleep(args.seconds)
                elapsed = time.monotonic() - t0
                share = {k: (B.cpu_seconds([pid]) - before[k]) / elapsed
                         for k, pid in pids.items()}
                share["total"] = sum(share.values())
                shares.append(share)
                print(" ".join(f"{v:>9.1%}" for v in share.values()), flush=True)
            print(" ".join(f"{statistics.median(s[k] for s in shares):>9.1%}" for k in shares[0]),
                  "median")
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)


if __name__ == "__main__":
    main()
