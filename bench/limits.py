"""Concurrency limits: what a permit costs. N no-op runs of schedules on every partition,
triggered at once, each set run three ways on a fresh SQLite log: without a concurrency key,
with one key of limit L, and with one key of limit 1 — by a ``chronolog processor`` and two
``chronolog worker`` processes, as a deployment runs them.

    .venv/bin/python bench/limits.py [--n 300] [--limit 4] [--runs 3] [--partitions 12]

Per run it prints: the seconds from the first claim to the last result, runs a second, the
most runs LEASED at once (from the events: never above the limit), and for limit 1 the
*handoff*: from a run's result to the next run's claim, p50/p99 — the round trip a permit
takes (release to the key's aggregate, grant back to the run's schedule, assignment). Then
the medians of ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from chronolog.client import Client
from chronolog.domain import messages as m
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log

sys.path.insert(0, str(Path(__file__).parent))
from e2e import pct, read_events, spawn, stop, url_of


async def one_run(n: int, limit: int | None, partitions: int, workdir: Path) -> dict[str, Any]:
    cfg = LogConfig("sqlite", str(workdir / "log.db"), Topics("b", partitions))
    lg = open_log(cfg)
    await lg.start()
    await lg.ensure_topics()
    common = ["--log", url_of(cfg), "--topic-prefix", cfg.topics.prefix,
              "--partitions", str(partitions)]
    procs = [spawn(["processor", *common, "--member-id", "bench-p"], workdir / "processor.log")]
    procs += [spawn(["worker", *common, "--builtin-jobs", "--worker-id", f"bench-w{i}",
                     "--concurrency", "16", "--results", str(workdir / "results")],
                    workdir / f"worker{i}.log") for i in range(2)]
    client = Client(lg, reply_timeout=60)
    await client.start()
    try:
        spec: dict[str, Any] = {"at": "2031-01-01T00:00:00Z", "job": {"type": "noop"},
                                "overlap": "allow"}
        if limit is not None:
            spec["concurrency"] = {"key": "bench", "limit": limit}
        sids = [f"s{i}" for i in range(partitions * 2)]
        await asyncio.gather(*(client.create_schedule("bench", s, spec) for s in sids))
        await asyncio.gather(*(client.send(client.envelope(
            "bench", sids[i % len(sids)], m.TriggerRun(request_key=f"k{i}")), timeout=60)
            for i in range(n)))
        while True:
            evs = await read_events(lg)
            done = [e for e in evs if e.type == "ResultPublished"]
            if len(done) >= n:
                break
            await asyncio.sleep(0.5)
    finally:
        await client.close()
        stop(procs)
        await lg.close()
    claims = sorted((e.payload.claimed_at, e.payload.run_id) for e in evs
                    if e.type == "AttemptClaimed")
    ends = {e.payload.run_id: e.at for e in evs if e.type == "ResultPublished"}
    moments = sorted([(t, 1) for t, _ in claims] + [(t, -1) for t in ends.values()],
                     key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, step in moments:
        now += step
        most = max(most, now)
    span = (max(ends.values()) - claims[0][0]).total_seconds()
    out: dict[str, Any] = {"limit": limit, "runs": len(ends), "seconds": span,
                           "runs_per_s": len(ends) / span, "most_leased": most}
    if limit == 1:
        order = [r for _, r in claims]
        gaps = [(claims[i + 1][0] - ends[order[i]]).total_seconds() * 1000
                for i in range(len(order) - 1)]
        out["handoff_p50_ms"], out["handoff_p99_ms"] = pct(gaps, 50), pct(gaps, 99)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=12)
    args = ap.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.runs):
        for limit in (None, args.limit, 1):
            with tempfile.TemporaryDirectory(prefix="limits-",
                                             dir=Path(__file__).parent / "results") as d:
                r = asyncio.run(one_run(args.n, limit, args.partitions, Path(d)))
            print(r, flush=True)
            rows.setdefault(str(limit), []).append(r)
    print("\nmedians:")
    for limit, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]
               if k != "limit" and isinstance(rs[0][k], (int, float))}
        print(f"  limit {limit}: " + ", ".join(f"{k} {v:.3g}" for k, v in med.items()))


if __name__ == "__main__":
    main()
