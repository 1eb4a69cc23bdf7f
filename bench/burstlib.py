"""The burst protocol shared by chronolog's and the peers' sides of ``bench/burst.py``.

A job handler records its start with ``record(job_id, start)``: one fixed-width line
``b"%08d %.6f %.6f\\n"`` (job id, start, end; 45 bytes) appended with one ``os.write`` to a
file per process in ``$BENCH_RUN_DIR``, so counting executed jobs is summing file sizes.
``analyse`` turns the files into first/last start, lateness percentiles and the
lost/duplicated/early counts; ``cpu_seconds`` sums user+system CPU of process trees.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

REC_LEN = 45
_fd: int | None = None


def record(job_id: int, start: float) -> None:
    global _fd
    if _fd is None:
        _fd = os.open(os.path.join(os.environ["BENCH_RUN_DIR"], f"starts.{os.getpid()}.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_fd, b"%08d %.6f %.6f\n" % (job_id, start, time.time()))


def count_records(run_dir: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(f"{run_dir}/starts.*.log")) // REC_LEN


def pct(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def _records(run_dir: str, kind: str) -> Iterator[list[bytes]]:
    """The three fields of every complete record in the ``<kind>.<pid>.log`` files."""
    for path in glob.glob(f"{run_dir}/{kind}.*.log"):
        with open(path, "rb") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    yield parts


def analyse(run_dir: str, n: int, instant: float) -> dict[str, Any]:
    """Starts relative to ``instant`` (seconds); jobs are ``0..n-1``."""
    starts: dict[int, float] = {}
    total = 0
    for parts in _records(run_dir, "starts"):
        jid, start = int(parts[0]), float(parts[1])
        total += 1
        if jid not in starts or start < starts[jid]:
            starts[jid] = start
    late = sorted(s - instant for s in starts.values())
    outside = sum(1 for j in starts if not 0 <= j < n)
    return {
        "n": n, "records": total,
        "lost": n - len(starts) + outside, "duplicated": total - len(starts),
        "early": sum(1 for x in late if x < 0),
        "first_start": late[0] if late else None, "last_start": late[-1] if late else None,
        "p50": pct(late, 50), "p99": pct(late, 99), "max": late[-1] if late else None,
        "runs_per_s": (len(late) / late[-1]) if late and late[-1] > 0 else None,
    }


def cpu_seconds(pids: list[int]) -> float:
    """user+system CPU of the processes, their live children and the children they reaped."""
    total, seen = 0.0, set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total


def broker_pids(servers: str) -> list[int]:
    """The PIDs listening on the bootstrap servers' ports (every broker of a cluster)."""
    pids = []
    for server in servers.split(","):
        port = server.rsplit(":", 1)[1]
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True,
                             text=True, check=False).stdout
        found = re.search(r"pid=(\d+)", out)
        if found and int(found.group(1)) not in pids:
            pids.append(int(found.group(1)))
    return pids


def wait_until(instant: float) -> None:
    while (left := instant - time.time()) > 0:
        time.sleep(min(left, 0.2))


def wait_records(run_dir: str, n: int, deadline: float, interval: float = 0.02) -> int:
    """Bounded wait until ``n`` records exist; returns the count seen last."""
    count = count_records(run_dir)
    while count < n and time.time() < deadline:
        time.sleep(interval)
        count = count_records(run_dir)
    return count


def median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


# --------------------------------------------------------------------------- sustained load
# ``late`` records ``b"%08d %06d %12.6f\n"`` (schedule, occurrence, start - scheduled_at)

LATE_LEN = 29
_late_fd: int | None = None


def record_lateness(job_id: int, occurrence: int, lateness: float) -> None:
    global _late_fd
    if _late_fd is None:
        _late_fd = os.open(os.path.join(os.environ["BENCH_RUN_DIR"], f"late.{os.getpid()}.log"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_late_fd, b"%08d %06d %12.6f\n" % (job_id, occurrence, lateness))


def wait_lateness(run_dir: str, n: int, deadline: float, interval: float = 0.2) -> int:
    count = 0
    while time.time() < deadline:
        count = sum(os.path.getsize(p) for p in glob.glob(f"{run_dir}/late.*.log")) // LATE_LEN
        if count >= n:
            break
        time.sleep(interval)
    return count


def analyse_lateness(run_dir: str, schedules: int, seconds: int) -> dict[str, Any]:
    """Every schedule's occurrences 0..seconds-1 once each, none early; start lateness."""
    late: dict[tuple[int, int], float] = {}
    total = 0
    for parts in _records(run_dir, "late"):
        key, value = (int(parts[0]), int(parts[1])), float(parts[2])
        total += 1
        late[key] = min(value, late.get(key, value))
    values = sorted(late.values())
    expected = schedules * seconds
    return {"n": expected, "records": total, "lost": expected - len(late),
            "duplicated": total - len(late), "early": sum(1 for v in values if v < 0),
            "first_start": None, "last_start": None, "runs_per_s": len(values) / seconds,
            "p50": pct(values, 50), "p99": pct(values, 99), "max": values[-1] if values else None}


def spy_on(pids: Mapping[str, int], out: str | Path, prefix: str,
           rate: int = 200) -> list[subprocess.Popen[bytes]]:
    """py-spy sampling each process of ``pids`` (name -> pid) until ``stop_spies``:
    collapsed stacks in ``out``/<prefix>-<name>.txt (``BENCH_PROFILE_GIL=1``: only the
    threads holding the GIL, which is where Python spends CPU; ``BENCH_PROFILE_RATE``:
    samples per second instead of ``rate``)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    Path(out).mkdir(parents=True, exist_ok=True)
    gil = ["--gil"] if os.environ.get("BENCH_PROFILE_GIL") else []
    rate = int(os.environ.get("BENCH_PROFILE_RATE", rate))
    return [subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw",
                              "--rate", str(rate), *gil, "--nonblocking",
                              "--output", str(Path(out) / f"{prefix}-{name}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, pid in pids.items()]


def stop_spies(spies: list[subprocess.Popen[bytes]]) -> None:
    """Stop the samplers of ``spy_on``: py-spy writes its profile on SIGINT."""
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        spy.wait(60)
