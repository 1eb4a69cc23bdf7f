"""Benchmark: the pure decider — commands decided per second, and bytes of state per schedule.

1. Throughput. A simulated partition of ``--schedules`` schedules (every 60 s, staggered,
   a handful of distinct specs as in a real tenant) runs for ``--minutes`` minutes of
   authority time. Each occurrence goes through the mixed workload a processor sees:
   Tick (materialize), ClaimRun, Heartbeat, CompleteRun; a steady trickle of CreateSchedule
   adds new schedules. Commands are built outside the timed region (the envelope is the
   wire's job); timed is what the processor does per command: ``decide`` plus ``evolve`` of
   its events into the live state. Reported: commands/s (decide + evolve) and decide-only.
2. Memory. ``--idle`` schedules (default 100,000) are created, and their state measured with
   tracemalloc (everything allocated and still alive: states, their runs, datetimes, strings,
   compiled triggers — the shared interned policy is counted once in the total):
   * ``fresh``: created, never run;
   * ``after runs``: each has run and completed 6 occurrences (so it keeps its bounded
     window of recent terminal runs) and is now idle.

Throughput and the fresh measurement run ``--repeat`` times (default 5); the
``after runs`` one (eighteen decided commands per schedule under tracemalloc: minutes at
100,000) runs ``--history-repeat`` times (default 1 — tracemalloc byte counts of the same
inputs are deterministic to within a few bytes). Medians are printed:

    .venv/bin/python bench/decider.py [--repeat 5] [--history-repeat 1] [--schedules 2000]
                                      [--minutes 30] [--idle 100000] [--profile]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import statistics
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from typing import Any

from chronolog.commands.decider import decide, evolve
from chronolog.commands.state import ScheduleState, initial_state
from chronolog.domain import messages as m

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TENANT = "acme"
SPECS = [
    m.ScheduleSpec.model_validate({"every": 60, "job": {"type": f"job{k}", "params": {"k": k}},
                                   "overlap": "skip", "lease": 30})
    for k in range(8)
]
_seq = 0


def envelope(sid: str, payload: Any, now: datetime) -> m.CommandEnvelope:
    """A command envelope (built without validation: the payload is already a model)."""
    global _seq
    _seq += 1
    return m.CommandEnvelope.model_construct(
        command_id=f"c{_seq}", type=payload.type, tenant=TENANT, principal="bench",
        schedule_id=sid, issued_at=now, reply_to=None, payload=payload)


class Timed:
    """Decide + evolve one command, accumulating the time spent in each."""

    def __init__(self) -> None:
        self.commands = 0
        self.decide_s = 0.0
        self.total_s = 0.0
        self.kinds: dict[str, int] = {}

    def run(self, state: ScheduleState, env: m.CommandEnvelope, now: datetime) -> Any:
        t0 = time.perf_counter()
        decision = decide(state, env, now)
        t1 = time.perf_counter()
        for e in decision.events:
            evolve(state, e)
        t2 = time.perf_counter()
        self.commands += 1
        self.decide_s += t1 - t0
        self.total_s += t2 - t0
        self.kinds[env.type] = self.kinds.get(env.type, 0) + 1
        return decision


def throughput(n_schedules: int, minutes: int) -> tuple[float, float, dict[str, int]]:
    """Run the mixed workload; return (commands/s decide+evolve, decide-only, mix)."""
    timed = Timed()
    states: dict[str, ScheduleState] = {}
    agenda: list[tuple[datetime, int, str, str, Any]] = []
    seq = 0

    def at(when: datetime, sid: str, kind: str, arg: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(agenda, (when, seq, sid, kind, arg))

    def create(sid: str, now: datetime, k: int) -> None:
        states[sid] = initial_state(TENANT, sid)
        d = timed.run(states[sid], envelope(sid, m.CreateSchedule(spec=SPECS[k % len(SPECS)],
                                                                  request_key=sid), now), now)
        assert d.ok, d.reason
        at(states[sid].next_due_at, sid, "tick")  # type: ignore[arg-type]

    for i in range(n_schedules):  # staggered over the first minute
        create(f"s{i}", T0 + timedelta(milliseconds=i * 60_000 // n_schedules), i)
    end = T0 + timedelta(minutes=minutes)
    creates = 0
    next_create = T0
    while agenda:
        now, _, sid, kind, arg = heapq.heappop(agenda)
        if now > end:
            break
        while next_create <= now:  # a trickle of new schedules: one every 2 s
            creates += 1
            create(f"n{creates}", next_create, creates)
            next_create += timedelta(seconds=2)
        s = states[sid]
        if kind == "tick":
            d = timed.run(s, envelope(sid, m.Tick(), now), now)
            for e in d.events:
                if isinstance(e, m.OccurrenceMaterialized) and e.state == "READY":
                    at(now + timedelta(seconds=1), sid, "claim", e.run_id)
            if s.next_due_at is not None:
                at(s.next_due_at, sid, "tick")
        elif kind == "claim":
            d = timed.run(s, envelope(sid, m.ClaimRun(run_id=arg, attempt=1, worker_id="w"),
                                      now), now)
            if d.ok:
                at(now + timedelta(seconds=10), sid, "heartbeat", (arg, d.body["fence"]))
        elif kind == "heartbeat":
            run_id, fence = arg
            timed.run(s, envelope(sid, m.Heartbeat(run_id=run_id, attempt=1, fence=fence,
                                                   worker_id="w"), now), now)
            at(now + timedelta(seconds=10), sid, "complete", arg)
        else:
            run_id, fence = arg
            timed.run(s, envelope(sid, m.CompleteRun(run_id=run_id, attempt=1, fence=fence,
                                                     worker_id="w", checksum="sha256:x",
                                                     size=2, inline=None), now), now)
    return timed.commands / timed.total_s, timed.commands / timed.decide_s, timed.kinds


def idle_bytes(n: int, runs_each: int) -> float:
    """Bytes of live state per idle schedule (tracemalloc), after ``runs_each`` runs each."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    states: list[ScheduleState] = []
    for i in range(n):
        sid = f"idle-{i:06d}"
        s = initial_state(TENANT, sid)
        now = T0 + timedelta(microseconds=i * 997)
        for e in decide(s, envelope(sid, m.CreateSchedule(spec=SPECS[i % len(SPECS)]), now),
                        now).events:
            evolve(s, e)
        for _ in range(runs_each):
            now = s.next_due_at  # type: ignore[assignment]
            for cmd in (m.Tick(),):
                for e in decide(s, envelope(sid, cmd, now), now).events:
                    evolve(s, e)
            run_id = next(r.run_id for r in (s.runs or {}).values() if r.state == "READY")
            d = decide(s, envelope(sid, m.ClaimRun(run_id=run_id, attempt=1, worker_id="w"),
                                   now), now)
            for e in d.events:
                evolve(s, e)
            fence = d.body["fence"]
            done = now + timedelta(seconds=5)
            for e in decide(s, envelope(sid, m.CompleteRun(run_id=run_id, attempt=1, fence=fence,
                                                           worker_id="w", checksum="sha256:x",
                                                           size=2), done), done).events:
                evolve(s, e)
        states.append(s)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per = (after - before) / n
    del states
    return per


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--history-repeat", type=int, default=1)
    ap.add_argument("--schedules", type=int, default=2000)
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--idle", type=int, default=100_000)
    ap.add_argument("--profile", action="store_true", help="cProfile one throughput run")
    args = ap.parse_args(argv)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        throughput(args.schedules, max(1, args.minutes // 3))
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    rows: dict[str, list[float]] = {"commands/s (decide+evolve)": [], "commands/s (decide)": [],
                                    "bytes/idle schedule (fresh)": [],
                                    "bytes/idle schedule (after runs)": []}
    mix: dict[str, int] = {}
    for i in range(args.repeat):
        total, decide_only, mix = throughput(args.schedules, args.minutes)
        rows["commands/s (decide+evolve)"].append(total)
        rows["commands/s (decide)"].append(decide_only)
        rows["bytes/idle schedule (fresh)"].append(idle_bytes(args.idle, 0))
        if i < args.history_repeat:
            rows["bytes/idle schedule (after runs)"].append(idle_bytes(args.idle, 6))
        print(f"run {i + 1}/{args.repeat}: "
              + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rows.items() if len(v) == i + 1),
              file=sys.stderr)
    n = sum(mix.values())
    print(f"python {sys.version.split()[0]}; {args.schedules} schedules x {args.minutes} min; "
          "mix: " + ", ".join(f"{k} {v / n:.0%}" for k, v in sorted(mix.items())))
    print(f"{'measure':36} {'median':>12} {'min':>12} {'max':>12}  target")
    targets = {"commands/s (decide+evolve)": ">= 50,000", "commands/s (decide)": ">= 50,000",
               "bytes/idle schedule (fresh)": "<= 1,024",
               "bytes/idle schedule (after runs)": "<= 1,024"}
    for k, v in rows.items():
        print(f"{k:36} {statistics.median(v):12,.0f} {min(v):12,.0f} {max(v):12,.0f}  {targets[k]}"
              f"  (n={len(v)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
