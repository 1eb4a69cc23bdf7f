"""Benchmark: what ``chronolog audit`` costs — the whole history, and what is new after a
checkpoint — as the history grows.

Per ``--events`` M: a fresh embedded log gets ``--schedules`` schedules on one partition and
M events of history (creates, then rounds of materialized / fence / claimed / result, the
generator of bench/failover.py, written straight through the log port). Then, as
subprocesses of the real command:

* ``full``: ``chronolog audit --full`` over the M events (it saves a checkpoint): seconds
  and events/s;
* ``next``: ``--next`` more events appended, then ``chronolog audit`` (from the
  checkpoint): seconds — what an audit of what is new costs after M events;
* the checkpoint's size (the compressed document on the topic ``audit``);
* the peak resident memory of each audit (``os.wait4``'s ``ru_maxrss``).

    .venv/bin/python bench/audit.py [--schedules 1000] [--events 100000,300000]
        [--next 6668] [--runs 3]

``--next 6668``: the events of 1,667 runs (four a run). Each run's rows are printed, then
the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from chronolog.log.port import OutRecord
from failover import _events, make_log, schedule_ids

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
CHUNK = 20_000
MIB = 1024 * 1024


async def build(n: int, events: int, more: int) -> tuple[Path, list[bytes], str]:
    """A log with ``events`` events of ``n`` schedules on partition 0; the next ``more``."""
    lg = make_log("sqlite", 1, "OFF")
    await lg.start()
    await lg.ensure_topics()
    sids = schedule_ids(1, 0, n)
    stream = _events(sids, events + more + 4 * n, datetime.now(UTC))
    chunk: list[bytes] = []
    for value in (v for _, v in zip(range(events), stream, strict=False)):
        chunk.append(value)
        if len(chunk) >= CHUNK:
            await lg.append([OutRecord(lg.topics.events, None, v, partition=0) for v in chunk])
            chunk = []
    if chunk:
        await lg.append([OutRecord(lg.topics.events, None, v, partition=0) for v in chunk])
    rest = [value for _, value in zip(range(more), stream, strict=False)]
    path, prefix = lg.path, lg.topics.prefix
    await lg.close()
    return Path(path), rest, prefix


async def append(path: Path, prefix: str, values: list[bytes]) -> None:
    lg = make_log("sqlite", 1, "OFF", str(path), prefix)
    await lg.start()
    await lg.append([OutRecord(lg.topics.events, None, v, partition=0) for v in values])
    await lg.close()


def audit(path: Path, prefix: str, *extra: str) -> tuple[float, str, int]:
    """Seconds, the report's last line and the peak resident memory (bytes) of one
    ``chronolog audit``."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([CHRONOLOG, "audit", "--log", f"sqlite://{path}", *extra],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={"PATH": "/usr/bin:/bin", "CHRONOLOG_TOPIC_PREFIX": prefix})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        took = time.monotonic() - started
        out.seek(0)
        text = out.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"audit failed ({proc.returncode}): {text}")
    return took, text.strip().splitlines()[-1], usage.ru_maxrss * 1024


def checkpoint_bytes(path: Path, prefix: str) -> int:
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT value FROM compacted WHERE topic = ?",
                            (f"{prefix}audit",)).fetchall()
    finally:
        conn.close()
    return sum(len(r[0]) for r in rows)


async def one(n: int, events: int, more: int) -> dict[str, Any]:
    path, rest, prefix = await build(n, events, more)
    full_s, full_line, full_rss = audit(path, prefix, "--full")
    size = checkpoint_bytes(path, prefix)
    await append(path, prefix, rest)
    next_s, next_line, next_rss = audit(path, prefix)
    return {"events": events, "full_s": full_s, "full_events_per_s": events / full_s,
            "next_events": len(rest), "next_s": next_s, "checkpoint_bytes": size,
            "full": full_line, "next": next_line, "full_rss": full_rss, "next_rss": next_rss}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=1000)
    ap.add_argument("--events", default="100000,300000")
    ap.add_argument("--next", type=int, default=6668)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(" ".join(sys.argv))
    for events in (int(e) for e in args.events.split(",")):
        results = [await one(args.schedules, events, args.next) for _ in range(args.runs)]
        for r in results:
            print(f"  M={events}: full {r['full_s']:.2f} s ({r['full_events_per_s']:,.0f} "
                  f"events/s, peak {r['full_rss'] / MIB:.0f} MiB), next {r['next_events']} "
                  f"events {r['next_s']:.2f} s (peak {r['next_rss'] / MIB:.0f} MiB), "
                  f"checkpoint {r['checkpoint_bytes']:,} B")
        print(f"M={events} median: full {statistics.median(r['full_s'] for r in results):.2f} s, "
              f"peak {statistics.median(r['full_rss'] for r in results) / MIB:.0f} MiB; "
              f"next {statistics.median(r['next_s'] for r in results):.2f} s, "
              f"peak {statistics.median(r['next_rss'] for r in results) / MIB:.0f} MiB; "
              f"{results[0]['next']}")


if __name__ == "__main__":
    asyncio.run(main())
