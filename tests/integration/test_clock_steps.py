"""Clock steps on a processor that owns partitions (docs/design.md §24, README "Time and
clocks"), on the embedded SQLite log: an in-process processor whose wall clock the test steps
by +10 and -10 minutes (its clock seam, ``Processor(clock=...)``; the guard compares it with
the host's uptime clock, which nobody steps), with schedules `every 1s` due and runs LEASED to
a real worker across the steps.

What is checked, for each: no instant materialized twice or skipped (misfire ``all``: the
instants of each schedule are consecutive seconds); none *early* — an instant is early when it
is materialized before it came by the true clock (the test's, never stepped): every
materialization's decision time (``at``) is at or after its instant and not later than the
true time the test read the log at; the processor's time never goes back (the ``at`` of a
partition's events, in log order); leases as documented — a held step expires no lease and
moves no ``lease_until`` back, each leased run has one attempt and one result; and the audit
is clean.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from chronolog.audit.auditor import audit
from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.environment import utc_now
from chronolog.log.port import Topics
from chronolog.processors.clock import ClockGuard
from chronolog.processors.config import ProcessorConfig
from chronolog.settings import LogConfig, open_log
from chronolog.workers import FilesystemResultStore
from support.logs import started
from support.polling import wait_until
from support.processors import Running, read_all
from support.workers import manual_spec, serving_test_jobs

from .test_processor_faults import ids_per_partition

STEP = timedelta(minutes=10)
BOUND_S = 5.0
EVERY = {"every": "1s", "job": {"type": "noop"}, "overlap": "allow",
         "misfire": {"policy": "all", "grace": "1h"}}
LEASED = manual_spec("sleep", {"seconds": 3}, lease="6s")


class SteppedClock:
    """The processor's wall clock: the true one plus ``shift``, which the test steps."""

    def __init__(self) -> None:
        self.shift = timedelta(0)

    def __call__(self) -> datetime:
        return utc_now() + self.shift


@pytest.fixture
def sqlite_config(tmp_path: Path) -> LogConfig:
    return LogConfig("sqlite", str(tmp_path / "log.db"), Topics(partitions=4))


@pytest.fixture
async def sqlite_log(sqlite_config: LogConfig) -> AsyncIterator[Any]:
    async with started(open_log(sqlite_config)) as lg:
        yield lg


async def logged(lg: Any) -> list[tuple[int, m.EventEnvelope]]:
    """Every event with its partition, in log order within each partition."""
    return [(r.partition, codec.decode_event(r.value))
            for r in await read_all(lg, lg.topics.events)]


async def instants(lg: Any, sids: list[str]) -> dict[str, list[datetime]]:
    out: dict[str, list[datetime]] = {sid: [] for sid in sids}
    for _, e in await logged(lg):
        if e.type == "OccurrenceMaterialized" and e.schedule_id in out:
            out[e.schedule_id].append(e.payload.scheduled_at)
    return out


async def each_has_after(lg: Any, sids: list[str], after: datetime, n: int) -> bool:
    """Every schedule has ``n`` instants materialized later than ``after``."""
    got = await instants(lg, sids)
    return all(sum(1 for t in got[sid] if t > after) >= n for sid in sids)


async def trigger_leased(r: Running, n: int) -> set[str]:
    runs = {(await r.client.trigger("acme", "leased", f"k-{utc_now().timestamp()}-{i}"))
            ["run_id"] for i in range(n)}

    async def claimed() -> bool:
        return runs <= {e.payload.run_id for _, e in await logged(r.lg)
                        if e.type == "AttemptClaimed"}

    await wait_until(claimed, 30, what="the sleep runs LEASED")
    return runs


async def published(lg: Any, runs: set[str]) -> bool:
    return runs <= {e.payload.run_id for _, e in await logged(lg) if e.type == "ResultPublished"}


def guard_of(r: Running) -> ClockGuard:
    g = r.proc.clock_guard
    assert g is not None
    return g


async def check_the_log(lg: Any, sids: list[str], leased: set[str]) -> None:
    seen = utc_now()  # the true time: nothing in the log was decided later than this
    events = await logged(lg)
    # no instant twice, none skipped: each schedule's instants are consecutive seconds
    got = await instants(lg, sids)
    for sid, ts in got.items():
        assert len(ts) >= 8, (sid, ts)
        assert [k for k, n in Counter(ts).items() if n > 1] == [], f"{sid}: an instant twice"
        ts = sorted(ts)
        gaps = [(a, b) for a, b in pairwise(ts) if b - a != timedelta(seconds=1)]
        assert gaps == [], f"{sid}: instants missing between {gaps}"
    # none early: decided at or after its instant, and never ahead of the true clock
    for _, e in events:
        if e.type == "OccurrenceMaterialized" and e.payload.trigger == "schedule":
            assert e.payload.scheduled_at <= e.at <= seen, (e.payload.scheduled_at, e.at, seen)
        assert e.at <= seen, f"{e.type} decided at {e.at}, after the true time {seen}"
    # the processor's time never went back: a partition's events in log order
    by_partition: dict[int, list[datetime]] = defaultdict(list)
    for p, e in events:
        by_partition[p].append(e.at)
    for p, ats in by_partition.items():
        back = [(a, b) for a, b in pairwise(ats) if b < a]
        assert back == [], f"partition {p}: the processor's time went back: {back[:3]}"
    # leases: none expired, none moved back; one attempt and one result for each leased run
    until: dict[str, list[datetime]] = defaultdict(list)
    claims: Counter[str] = Counter()
    results: Counter[str] = Counter()
    for _, e in events:
        p = e.payload
        if isinstance(p, m.AttemptClaimed):
            claims[p.run_id] += 1
            until[p.run_id].append(p.lease_until)
        elif isinstance(p, m.LeaseExtended):
            until[p.run_id].append(p.lease_until)
        elif isinstance(p, m.ResultPublished):
            results[p.run_id] += 1
    assert [e.payload.run_id for _, e in events if e.type == "LeaseExpired"] == []
    for run_id in leased:
        assert claims[run_id] == 1 and results[run_id] == 1, (run_id, claims[run_id])
        assert len(until[run_id]) >= 2, f"{run_id}: no heartbeat extended its lease"
    for run_id, us in until.items():
        assert us == sorted(us), f"{run_id}: its lease_until went back: {us}"
    report = audit([e for _, e in events])
    assert report.ok, report.violations


async def schedules_running(client: Any, lg: Any, sids: list[str],
                            within: float = 30) -> None:
    """Given: ``sids`` every second (one per partition) and the leased runs' schedule, each
    schedule with instants decided."""
    for sid in sids:
        await client.create_schedule("acme", sid, EVERY)
    await client.create_schedule("acme", "leased", LEASED)
    await wait_until(lambda: each_has_after(lg, sids, utc_now() - STEP, 2), within,
                     what="every schedule running")


async def test_a_forward_step_is_held_nothing_runs_early_and_no_lease_expires(
    sqlite_log: Any, tmp_path: Path,
) -> None:
    """+10 minutes while the processor owns every partition, with instants due every second
    and runs LEASED: the step is held (the hold is longer than the test), so none of the next
    10 minutes' instants is materialized and no lease is judged expired; the wall clock set
    right again clears it."""
    clock = SteppedClock()
    config = ProcessorConfig(clock_step_s=BOUND_S, clock_step_hold_s=3600.0)
    sids = ids_per_partition(4)
    store = FilesystemResultStore(tmp_path / "results")
    async with Running(sqlite_log, config=config, clock=clock) as r, \
            serving_test_jobs(sqlite_log, store, "w1", concurrency=8):
        guard = guard_of(r)
        await schedules_running(r.client, sqlite_log, sids)
        leased = await trigger_leased(r, 3)

        clock.shift = STEP
        stepped_at = utc_now()
        await wait_until(lambda: guard.steps.forward == 1, 10, what="the step detected")
        assert guard.held and guard.steps.held_s == pytest.approx(600, abs=1)
        # the processor goes on: instants fall due second by second, not 10 minutes at once
        await wait_until(lambda: each_has_after(sqlite_log, sids, stepped_at, 3), 30,
                         what="instants after the step")
        await wait_until(lambda: published(sqlite_log, leased), 30,
                         what="the leased runs' results, accepted across the step")
        more = await trigger_leased(r, 2)  # claimed while the step is held
        await wait_until(lambda: published(sqlite_log, more), 30, what="their results")
        assert guard.held and guard.steps.accepted == 0

        clock.shift = timedelta(0)  # the clock is set right: the step held is cleared
        righted_at = utc_now()
        await wait_until(lambda: guard.steps.cleared == 1, 10, what="the step cleared")
        assert not guard.held
        await wait_until(lambda: each_has_after(sqlite_log, sids, righted_at, 2), 30,
                         what="instants after the clock was set right")
    await check_the_log(sqlite_log, sids, leased | more)


async def test_a_backward_step_never_moves_time_back_and_nothing_runs_twice(
    sqlite_log: Any, tmp_path: Path,
) -> None:
    """-10 minutes, held for 2 s then accepted: the processor's time stands still (nothing
    materialized before is due again, no lease is judged expired or moved back); a run
    claimed meanwhile finishes; then the clock is set right (+10 minutes, a forward step,
    held 2 s and accepted): the instants of the standstill are materialized late, once each."""
    clock = SteppedClock()
    config = ProcessorConfig(clock_step_s=BOUND_S, clock_step_hold_s=2.0)
    sids = ids_per_partition(4)
    store = FilesystemResultStore(tmp_path / "results")
    async with Running(sqlite_log, config=config, clock=clock) as r, \
            serving_test_jobs(sqlite_log, store, "w1", concurrency=8):
        guard = guard_of(r)
        await schedules_running(r.client, sqlite_log, sids)
        leased = await trigger_leased(r, 3)

        clock.shift = -STEP
        await wait_until(lambda: guard.steps.backward == 1, 10, what="the step detected")
        await wait_until(lambda: guard.steps.accepted == 1, 10, what="the step accepted")
        frozen = r.proc.clock()  # the time standing still, until the wall clock passes it
        during = await trigger_leased(r, 2)  # claimed while the time stands still
        await wait_until(lambda: published(sqlite_log, leased | during), 30,
                         what="the leased runs' results")
        assert r.proc.clock() == frozen
        materialized = await instants(sqlite_log, sids)
        assert all(t <= frozen for ts in materialized.values() for t in ts)

        clock.shift = timedelta(0)  # set right: a forward step, held, then followed
        await wait_until(lambda: guard.steps.forward == 1, 10, what="the step back detected")
        await wait_until(lambda: guard.steps.accepted == 2, 10, what="the step back accepted")
        assert not guard.held
        followed_at = utc_now()
        # the standstill's instants were late; they run now, once each (misfire all)
        await wait_until(lambda: each_has_after(sqlite_log, sids, followed_at, 2), 30,
                         what="instants after the clock was followed again")
    await check_the_log(sqlite_log, sids, leased | during)


LIBFAKETIME = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
               "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
               "/usr/lib/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1")


def libfaketime() -> str:
    found = next((p for p in LIBFAKETIME if Path(p).exists()), None)
    assert found, ("libfaketime is needed to step a real process's clock: "
                   "apt-get install faketime libfaketime (Debian)")
    return found


async def test_a_real_processor_stepped_by_libfaketime_holds_both_steps(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, processes: Any,
) -> None:
    """``chronolog processor`` as a process of its own, its wall clock stepped by libfaketime
    (the offset file rewritten while it runs; its monotonic and boot-time clocks left alone):
    +10 minutes, set right, -10 minutes, set right — each step detected, held and cleared
    (the hold, 1 h, is longer than the test), with the same checks on the log. On Kafka, as
    a deployment whose processors have hosts and clocks of their own."""
    cfg = LogConfig("kafka", kafka_bootstrap, Topics(prefix=topic_prefix, partitions=4))
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    env = {"LD_PRELOAD": libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(offset),
           "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
           "CHRONOLOG_CLOCK_STEP": f"{BOUND_S:g}s", "CHRONOLOG_CLOCK_STEP_HOLD": "1h"}
    proc = processes(cfg, "stepped", env)
    sids = ids_per_partition(4)
    store = FilesystemResultStore(tmp_path / "results")
    async with started(open_log(cfg)) as lg:
        await stepped_run(lg, proc, offset, sids, store)


async def stepped_run(lg: Any, proc: Any, offset: Path, sids: list[str],
                      store: Any) -> None:

    def said(event: str) -> int:
        return proc.log_text().count(event)

    async with Client(lg, reply_timeout=60) as client, \
            serving_test_jobs(lg, store, "w1", concurrency=8):
        await schedules_running(client, lg, sids, within=60)  # a process of its own
        leased: set[str] = set()
        for n, (step, event) in enumerate([("+600", "clock_step_detected"),
                                           ("+0", "clock_step_cleared"),
                                           ("-600", "clock_step_detected"),
                                           ("+0", "clock_step_cleared")]):
            runs = {(await client.trigger("acme", "leased", f"k{n}-{i}"))["run_id"]
                    for i in range(2)}
            leased |= runs
            offset.write_text(step + "\n")
            stepped_at = utc_now()
            await wait_until(lambda e=event, k=n // 2 + 1: said(e) >= k, 20,  # type: ignore[misc]
                             what=f"{event} after {step}")
            await wait_until(lambda t=stepped_at: each_has_after(lg, sids, t, 3), 30,
                             what=f"instants after {step}")
            await wait_until(lambda r=runs: published(lg, r), 30,
                             what=f"the leased runs' results across {step}")
        assert said("clock_step_accepted") == 0
    assert proc.stop() == 0
    await check_the_log(lg, sids, leased)
