"""Calendars: what an exclusion costs. Two measures.

* **The check** — ``calendars.exclusion`` of one instant against a schedule's copies, as the
  decider runs it for every instant it decides: a typical calendar (a year of holidays, a
  range, two windows) and one of the largest a tenant may put (1,000 dates, 200 ranges, 50
  windows), microseconds per instant (median of ``--runs`` timings of 20,000 checks each).
* **A revision's fan-out** — N schedules on every partition name one calendar; a revision
  is put and copied to each of them (one ``CopyCalendar`` per schedule, written in the
  revision's transaction, each folded by its schedule's partition): seconds from the
  revision's event to the last schedule's ``CalendarCopied``, on a fresh SQLite log, by a
  ``chronolog processor`` as a deployment runs it.

    .venv/bin/python bench/calendars.py [--schedules 2000] [--runs 3] [--partitions 12]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import timeit
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from chronolog.client import Client
from chronolog.commands import calendars
from chronolog.commands.state import CalendarCopy
from chronolog.domain.calendars import CalendarSpec
from chronolog.log.port import Topics
from chronolog.settings import LogConfig, open_log

sys.path.insert(0, str(Path(__file__).parent))
from e2e import read_events, spawn, stop, url_of

TYPICAL = CalendarSpec.model_validate({
    "timezone": "America/New_York",
    "dates": ["2026-01-01", "2026-01-19", "2026-02-16", "2026-05-25", "2026-06-19",
              "2026-07-03", "2026-09-07", "2026-10-12", "2026-11-11", "2026-11-26",
              "2026-12-25"],
    "ranges": [{"from": "2026-12-24", "to": "2026-12-31"}],
    "windows": [{"days": ["sat", "sun"], "start": "22:00", "end": "06:00"},
                {"start": "02:00", "end": "02:30", "timezone": "UTC"}]})
LARGEST = CalendarSpec.model_validate({
    "timezone": "Europe/Paris",
    "dates": [(date(2020, 1, 1) + timedelta(days=3 * i)).isoformat() for i in range(1000)],
    "ranges": [{"from": (date(2030, 1, 1) + timedelta(days=10 * i)).isoformat(),
                "to": (date(2030, 1, 3) + timedelta(days=10 * i)).isoformat()}
               for i in range(200)],
    "windows": [{"days": ["mon"], "start": f"{h:02d}:00", "end": f"{h:02d}:10",
                 "timezone": "Asia/Tokyo"} for h in range(24)]
    + [{"days": ["tue"], "start": f"{h:02d}:00", "end": f"{h:02d}:10"} for h in range(24)]
    + [{"start": "23:50", "end": "00:10"}, {"days": ["sun"], "start": "12:00", "end": "13:00"}]})


def check_us(spec: CalendarSpec, runs: int, n: int = 20_000) -> float:
    """Median microseconds of one ``exclusion`` of an instant not excluded (every entry is
    compared: the slowest case)."""
    copies = (CalendarCopy("c", 1, spec, True),)
    t = datetime(2026, 3, 4, 15, 17, tzinfo=UTC)  # a Wednesday afternoon: excluded by none
    assert calendars.exclusion(copies, t) is None
    times = [timeit.timeit(lambda: calendars.exclusion(copies, t), number=n)
             for _ in range(runs)]
    return statistics.median(times) / n * 1e6


async def fan_out(schedules: int, partitions: int, workdir: Path) -> dict[str, Any]:
    cfg = LogConfig("sqlite", str(workdir / "log.db"), Topics("b", partitions))
    lg = open_log(cfg)
    await lg.start()
    await lg.ensure_topics()
    common = ["--log", url_of(cfg), "--topic-prefix", cfg.topics.prefix,
              "--partitions", str(partitions)]
    procs = [spawn(["processor", *common, "--member-id", "bench-p"], workdir / "processor.log")]
    client = Client(lg, reply_timeout=120)
    await client.start()
    try:
        await client.put_calendar("bench", "hol", TYPICAL)
        spec = {"cron": "0 3 1 1 *", "job": {"type": "noop"}, "exclude": ["hol"]}
        for i in range(0, schedules, 500):
            await client.create_schedules(
                "bench", [(f"s{j}", spec) for j in range(i, min(i + 500, schedules))])
        await _copies(lg, 1, schedules)
        revised = await client.put_calendar("bench", "hol", {"dates": ["2027-01-01"]},
                                            expected_revision=1)
        evs = await _copies(lg, revised["revision"], schedules)
    finally:
        await client.close()
        stop(procs)
        await lg.close()
    start = next(e.at for e in evs if e.type == "CalendarRevised" and e.payload.revision == 2)
    copied = [e.at for e in evs if e.type == "CalendarCopied" and e.payload.revision == 2]
    span = (max(copied) - start).total_seconds()
    return {"schedules": schedules, "copies": len(copied), "seconds": span,
            "copies_per_s": len(copied) / span if span > 0 else float("inf")}


async def _copies(lg: Any, revision: int, n: int) -> list[Any]:
    """The events once ``n`` schedules hold ``revision`` (bounded wait)."""
    for _ in range(1200):
        evs = await read_events(lg)
        if sum(1 for e in evs if e.type == "CalendarCopied"
               and e.payload.revision == revision) >= n:
            return evs
        await asyncio.sleep(0.25)
    raise SystemExit(f"the copies of revision {revision} did not all arrive in 300 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=12)
    args = ap.parse_args()
    print(f"check, typical calendar: {check_us(TYPICAL, args.runs):.2f} us per instant")
    print(f"check, largest calendar: {check_us(LARGEST, args.runs):.2f} us per instant")
    rows = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="calendars-",
                                         dir=Path(__file__).parent / "results") as d:
            r = asyncio.run(fan_out(args.schedules, args.partitions, Path(d)))
        print(r, flush=True)
        rows.append(r)
    print(f"\nmedian fan-out of a revision to {args.schedules} schedules: "
          f"{statistics.median(r['seconds'] for r in rows):.2f} s "
          f"({statistics.median(r['copies_per_s'] for r in rows):.0f} copies/s)")


if __name__ == "__main__":
    main()
