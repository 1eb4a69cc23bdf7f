"""Schedules held cold by the processor (``ProcessorConfig.hot_horizon_s``): a quiet
schedule whose wake-up is beyond the horizon is held as its sealed bytes with no timer
armed, warmed ahead of its instant, and starts on time; a take-over from a snapshot keeps
such schedules cold without decoding them, and they start on time after it too; a take-over
that folds the whole history holds no more than its bound of states hot."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from chronolog.domain.ids import partition_key
from chronolog.environment import utc_now
from chronolog.processors.config import ProcessorConfig
from chronolog.processors.partition_task import PartitionTask
from support.polling import wait_until
from support.processors import Running, events
from support.states import every_field


def hourly() -> dict[str, Any]:
    """Every hour from an hour from now: nothing to run before that."""
    return {"every": "1h", "start": (utc_now() + timedelta(hours=1)).isoformat(),
            "job": {"type": "echo"}}


class Clock:
    """The wall clock, moved ahead by the test (``at``)."""

    def __init__(self) -> None:
        self.shift = timedelta(0)

    def __call__(self) -> datetime:
        return utc_now() + self.shift

    def at(self, when: datetime) -> None:
        self.shift = when - utc_now()


def config(**kw: Any) -> ProcessorConfig:
    return ProcessorConfig(hot_horizon_s=60.0, cool_every_s=0.05, snapshot_interval_s=0.1,
                           **kw)


def holder(r: Running, key: str) -> PartitionTask:
    return next(ps for ps in r.proc.partitions.values() if key in ps.states)


async def materialized(lg: Any, sids: set[str]) -> dict[str, list[datetime]]:
    out: dict[str, list[datetime]] = {}
    for e in await events(lg):
        if e.type == "OccurrenceMaterialized" and e.schedule_id in sids:
            out.setdefault(e.schedule_id, []).append(e.payload.scheduled_at)
    return out


async def test_a_schedule_beyond_the_horizon_is_held_cold_and_starts_at_its_instant(
    event_log: Any,
) -> None:
    clock = Clock()
    key = partition_key("acme", "hourly")
    async with Running(event_log, config=config(), clock=clock) as r:
        # given an hourly schedule: its first instant is an hour away, past the horizon
        await r.client.create_schedule("acme", "hourly", hourly())
        ps = holder(r, key)
        # then it goes cold, with no timer armed
        await wait_until(lambda: ps.states.is_cold(key), 10, what="the schedule cold")
        assert key not in ps.timers and r.proc.stats.cooled >= 1
        st = ps.states.peek(key)
        assert st is not None and st.next_due_at is not None
        instant = st.next_due_at
        # when its instant comes within the horizon, it is warmed and its timer armed
        clock.at(instant - timedelta(seconds=30))
        await wait_until(lambda: key in ps.timers, 10, what="the schedule warmed")
        assert not ps.states.is_cold(key) and r.proc.stats.warmed >= 1
        assert ps.timers.armed[key] <= instant
        # and when the instant comes, its occurrence is materialized once, for that instant
        clock.at(instant + timedelta(milliseconds=200))
        runs = await wait_until(lambda: materialized(event_log, {"hourly"}), 10,
                                what="the occurrence")
        assert runs == {"hourly": [instant]}


async def test_a_take_over_from_a_snapshot_keeps_idle_schedules_cold_and_they_start_on_time(
    event_log: Any,
) -> None:
    clock = Clock()
    sids = {f"s{i}" for i in range(20)}
    async with Running(event_log, "p1", config(), clock=clock) as r:
        for sid in sorted(sids):
            await r.client.create_schedule("acme", sid, hourly())
        await wait_until(lambda: all(
            ps.snap is not None and not ps.snap.dirty and ps.snap.round is None
            and ps.snap.marked for ps in r.proc.partitions.values()), 30,
            what="a snapshot of every partition")
        instants = {sid: holder(r, partition_key("acme", sid)).states.peek(
            partition_key("acme", sid)).next_due_at for sid in sids}  # type: ignore[union-attr]
    # given a new owner restoring from the snapshots: the idle schedules stay cold
    async with Running(event_log, "p2", config(), clock=clock) as r2:
        assert r2.proc.stats.restored_from_snapshot == event_log.topics.partitions
        assert sum(t.cold for t in r2.proc.takeovers) == len(sids)
        assert not any(partition_key("acme", sid) in ps.timers
                       for ps in r2.proc.partitions.values() for sid in sids)
        # when their instants come within the horizon, then come: each starts once, on time
        clock.at(min(instants.values()) - timedelta(seconds=30))  # type: ignore[type-var]
        await wait_until(lambda: sum(ps.states.cold for ps in r2.proc.partitions.values()) == 0,
                         10, what="the schedules warmed")
        clock.at(max(instants.values()) + timedelta(milliseconds=200))  # type: ignore[type-var]

        async def every_one() -> dict[str, list[datetime]] | None:
            runs = await materialized(event_log, sids)
            return runs if len(runs) == len(sids) else None

        runs = await wait_until(every_one, 10, what="every occurrence")
        assert runs == {sid: [instants[sid]] for sid in sids}


async def test_a_take_over_folding_the_whole_history_keeps_at_most_the_bound_hot(
    event_log: Any,
) -> None:
    clock = Clock()
    sids = {f"s{i:02d}" for i in range(40)}
    # given 40 idle hourly schedules, each revised once, and no snapshot to restore from
    async with Running(event_log, "p1", config(snapshots=False), clock=clock) as r:
        for sid in sorted(sids):
            await r.client.create_schedule("acme", sid, hourly())
        for sid in sorted(sids):
            await r.client.revise_schedule("acme", sid, {**hourly(), "job": {"type": "noop"}},
                                            expected_revision=1)
        first = {sid: every_field(holder(r, partition_key("acme", sid)).states.peek(
            partition_key("acme", sid))) for sid in sids}
    # when a new owner folds each partition from offset 0, reading 4 events at a time, with
    # at most 3 states hot
    cfg = config(snapshots=False, restore_chunk=4, restore_hot_max=3)
    async with Running(event_log, "p2", cfg, clock=clock) as r2:
        takeovers = r2.proc.takeovers
        assert r2.proc.stats.restored_from_zero == event_log.topics.partitions
        # then no read left more than the bound plus that read's states hot
        assert max(t.hot_peak for t in takeovers) <= 3 + 4
        assert sum(t.cooled for t in takeovers) > 0
        # and every schedule was restored as the first owner held it, cold
        assert sum(t.cold for t in takeovers) == len(sids)
        again = {sid: holder(r2, partition_key("acme", sid)).states.peek(
            partition_key("acme", sid)) for sid in sids}
        assert {sid: every_field(st) for sid, st in again.items()} == first
        assert {st.policy.job.type for st in again.values()} == {"noop"}  # type: ignore[union-attr]


class Frozen:
    """A clock that stands still until the test moves it."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def script(horizon: float | None) -> list[tuple[str, str, dict[str, Any]]]:
    """One script of commands and clock moves on a fresh one-partition log, every READY
    run claimed and completed at each step; the events it wrote, without their IDs."""
    from chronolog.log.memory import MemoryEventLog
    from chronolog.log.port import Topics
    from support.logs import started

    t0 = datetime(2026, 3, 1, 8, 0, 7, tzinfo=utc_now().tzinfo)
    clock = Frozen(t0)
    cfg = ProcessorConfig(hot_horizon_s=horizon, cool_every_s=0.0, warm_per_step=1,
                          cool_per_step=2)
    async with started(MemoryEventLog(Topics(partitions=1))) as lg, \
            Running(lg, config=cfg, clock=clock) as r:
        c = r.client
        hour = (t0 + timedelta(hours=1)).isoformat()
        await c.create_schedule("acme", "hourly", {"every": "1h", "start": hour,
                                                   "job": {"type": "echo"}})
        await c.create_schedule("acme", "tenmin", {"every": "10m", "start": hour,
                                                   "job": {"type": "echo"}})
        await c.create_schedule("acme", "cron", {"cron": "30 * * * *", "job": {"type": "echo"}})
        await c.create_schedule("acme", "once", {"at": (t0 + timedelta(minutes=95)).isoformat(),
                                                 "job": {"type": "echo"}})
        await c.create_schedule("acme", "paused", {"every": "20m", "start": hour,
                                                   "job": {"type": "echo"}})
        ps = r.proc.partitions[0]
        for step in range(26):  # 7 minutes a step: about three hours
            clock.now = t0 + timedelta(minutes=7 * (step + 1))
            await wait_until(lambda: (w := ps.next_wake()) is None or w > clock.now, 10,
                             what="the due timers decided, the due cold states warmed")
            if step == 5:
                await c.pause("acme", "paused")
            if step == 17:
                await c.resume("acme", "paused")
            if step == 9:
                await c.trigger("acme", "hourly", "by-hand")
            for sid in ("hourly", "tenmin", "cron", "once", "paused"):
                st = ps.states.peek(partition_key("acme", sid))
                for run in [] if st is None else list((st.runs or {}).values()):
                    if run.state == "READY":
                        got = await c.claim("acme", sid, run.run_id, run.attempt, "w1")
                        await c.complete("acme", sid, run.run_id, run.attempt, got["fence"],
                                         "w1", "sha256:00", 0)
        await c.create_schedule("acme", "last", {"every": "1h", "start": hour,
                                                 "job": {"type": "echo"}})
        cooled = r.proc.stats.cooled
    assert (cooled > 0) == (horizon is not None)
    return [(e.schedule_id, e.type, {k: v for k, v in e.payload.model_dump().items()
                                     if not k.endswith("_id") and k != "request_key"})
            for e in await events(lg)]


async def test_holding_schedules_cold_changes_no_event() -> None:
    # given one script of commands and clock steps, run with nothing ever cold and with
    # every quiet schedule cold as soon as its wake-up is not now (a horizon of 0), warmed
    # one at a time
    hot = await script(None)
    cold = await script(0.0)
    # then both wrote the same events, in the same order
    assert len(hot) > 100
    assert {t for _, t, _ in hot} >= {"OccurrenceMaterialized", "AttemptClaimed",
                                      "ResultPublished", "SchedulePaused", "ScheduleResumed",
                                      "ScheduleCompleted"}
    assert cold == hot
