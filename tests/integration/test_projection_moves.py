"""The read side across a change of the partition count, on both logs and a real PostgreSQL
(docs/design.md §9, §10, §18).

A real processor runs schedules on the first routing version (2 of the log's 4 partitions):
each is triggered and claimed there; then every partition hands over to version 2 (4
partitions) and the runs of the moved keys are completed on their new homes. So a new home
has, after its ``KeyMovedIn``, a ``ResultPublished`` for a run its old home materialized and
claimed: applied before the old home's events, the run row would come back LEASED.

* two projectors on disjoint partitions share one database: the new homes' projector starts
  first, reads the moved keys' events and holds them (its offsets stop at the
  ``KeyMovedIn``), is restarted while held, and goes on only after the old homes' projector
  applied their ``HandedOver``; the tables equal one projector's from offset 0 and a replay's;
* the audit is clean after the move, and reports a forged log: an event of a moved key on
  its old home after the move (``single_home``) and a ``KeyMovedIn`` without its
  ``KeyMovedOut`` (``move_matched``);
* a projector over every partition of ``events`` reads partitions added while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from chronolog.cli.audit import audit_log
from chronolog.cli.replay import replay
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.log.port import OutRecord
from chronolog.projections.projector import Commit, Projector
from chronolog.projections.store import PostgresProjectionStore
from chronolog.settings import open_log
from support.polling import wait_until
from support.processors import read_all
from support.repartition import NEW, OLD, SPEC, Running, begin, config, home, reply_of, to_partition

from .pgdb import dump, module_database, open_store

pytestmark = pytest.mark.postgres

SCHEDULES = [f"s{i}" for i in range(8)]
OLD_HOMES, NEW_HOMES = frozenset({0, 1}), frozenset({2, 3})
NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    yield from module_database(database_url, "test_moves")



async def moved_log(lg: Any) -> dict[str, str]:
    """Run the scenario of the module docstring; schedule -> the run completed after its
    move (only the schedules whose key moved)."""
    moved: dict[str, str] = {}
    async with Running(lg, "p1", config()) as r:
        c = r.client
        claims: dict[str, tuple[str, int]] = {}
        for s in SCHEDULES:
            await c.create_schedule("acme", s, SPEC)
            run = await c.trigger("acme", s, f"rk-{s}")
            claimed = await c.claim("acme", s, run["run_id"], 1, "w1")
            claims[s] = (run["run_id"], claimed["fence"])
        for p in range(NEW):
            env = begin(c, p)
            await to_partition(lg, env, p)
            assert (await reply_of(lg, env.command_id)).status == "ok"
        await wait_until(lambda: all(v.routing is not None and v.routing.serves.version == 2
                                     for v in r.views().values()), 30, what="handed over")
        for s, (run_id, fence) in claims.items():
            key = partition_key("acme", s)
            await wait_until(lambda k=key: r.holders(k) == [home(k, NEW)], 30, what=s)
            await c.complete("acme", s, run_id, 1, fence, "w1", "sha256:00", 0)
            if home(key, OLD) != home(key, NEW):
                moved[s] = run_id
    assert moved, "no key moved"
    return moved


async def _offsets_of(lg: Any, kind: type) -> dict[int, int]:
    """partition -> offset of the first event of ``kind`` there."""
    out: dict[int, int] = {}
    for rec in await read_all(lg, lg.topics.events):
        env = codec.decode_event(rec.value)
        if isinstance(env.payload, kind) and rec.partition not in out:
            out[rec.partition] = rec.offset
    return out


async def _run_states(store: PostgresProjectionStore, run_ids: list[str]) -> dict[str, str]:
    rows = await store.pool.fetch("SELECT run_id, state FROM runs WHERE run_id = ANY($1)",
                                  run_ids)
    return {r["run_id"]: r["state"] for r in rows}


async def test_new_homes_are_applied_only_after_their_old_homes_handover(
    event_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    moved = await moved_log(event_log)
    moved_in = await _offsets_of(event_log, m.KeyMovedIn)
    handed = await _offsets_of(event_log, m.HandedOver)
    assert set(moved_in) == NEW_HOMES and set(handed) >= OLD_HOMES
    live = await open_store(module_dsn, stores)
    commits: list[tuple[str, Commit]] = []

    def projector(name: str, partitions: frozenset[int]) -> Projector:
        pr = Projector(event_log, live, batch_max=50, idle_ms=20, partitions=partitions)
        pr.on_commit.append(lambda c: commits.append((name, c)))
        return pr

    # the new homes' projector first: it reads the moved keys' events, and holds them
    new1 = projector("new", NEW_HOMES)
    task = asyncio.create_task(new1.run())
    await wait_until(lambda: {q: o for q, (o, _) in new1.held().items()} == moved_in, 30,
                     what="the new homes held at their KeyMovedIn")
    assert all(new1.watermark().partitions[q] <= moved_in[q] for q in NEW_HOMES)
    assert await _run_states(live, list(moved.values())) == {}
    new1.stop()  # restarted while held
    await asyncio.wait_for(task, 30)

    old = projector("old", OLD_HOMES)
    new2 = projector("new", NEW_HOMES)
    tasks = [asyncio.create_task(new2.run()), asyncio.create_task(old.run())]
    rebuilt = await open_store(module_dsn, stores)
    whole = Projector(event_log, rebuilt, batch_max=7)
    await whole.run_until_caught_up(60)
    await wait_until(lambda: {**old.watermark().partitions, **new2.watermark().partitions}
                     == whole.watermark().partitions, 30, what="both caught up")
    for pr in (old, new2):
        pr.stop()
    await asyncio.gather(*tasks)

    # the new homes went past their KeyMovedIn only in a commit after the old homes'
    # HandedOver was committed
    def first(name: str, partition: int, past: int) -> int:
        return next(i for i, (n, c) in enumerate(commits)
                    if n == name and partition in c.offsets and c.offsets[partition][1] > past)
    for q in NEW_HOMES:
        p = q - OLD  # version 1 -> 2 (2 -> 4 partitions) moves keys from q - 2 to q
        assert first("new", q, moved_in[q]) > first("old", p, handed[p])
    assert set((await _run_states(live, list(moved.values()))).values()) == {"SUCCEEDED"}
    assert new1.stats.conflicts == new2.stats.conflicts == old.stats.conflicts == 0
    a = await dump(live)
    assert a == await dump(rebuilt)

    replayed = await open_store(module_dsn, stores)
    stats = await replay(event_log, replayed, batch=5)
    assert stats.held == {}
    assert await dump(replayed) == a
    handovers = await live.handovers(event_log.topics.events)
    assert handovers == await replayed.handovers(event_log.topics.events)
    assert handovers == dict.fromkeys(OLD_HOMES, 2)


async def test_audit_is_clean_after_a_move_and_reports_a_forged_one(event_log: Any) -> None:
    moved = await moved_log(event_log)
    first = await audit_log(event_log)
    report = first.report
    assert report.ok, [str(v) for v in report.violations]
    assert first.resumed is None and first.saved
    assert report.results == len(SCHEDULES)

    # an event of a moved key on its old home after the move: held by two partitions
    s = sorted(moved)[0]
    key = partition_key("acme", s)
    forged = m.EventEnvelope(event_id="forged-1", type="SchedulePaused", key=key,
                             tenant="acme", schedule_id=s, at=NOW,
                             payload=m.SchedulePaused(reason="forged", paused_at=NOW))
    # a KeyMovedIn for a key that never moved out
    stray = m.EventEnvelope(
        event_id="forged-2", type="KeyMovedIn", key=partition_key("acme", "never"),
        tenant="acme", schedule_id="never", at=NOW,
        payload=m.KeyMovedIn(state="{}", state_version=1, from_partition=home(key, OLD),
                             version=2))
    await event_log.append([
        OutRecord(event_log.topics.events, key.encode(), codec.encode_event(forged),
                  home(key, OLD)),
        OutRecord(event_log.topics.events, b"acme/never", codec.encode_event(stray),
                  home(key, NEW))])
    # the next audit goes on from the first one's checkpoint: it reads the two new events
    dirty = await audit_log(event_log)
    assert dirty.resumed is not None and dirty.read == 2
    assert sorted(v.check for v in dirty.report.violations) == ["move_matched", "single_home"]
    # and folding the whole log again gives the same report
    full = await audit_log(event_log, full=True, save=False)
    assert full.resumed is None and full.read == report.events + 2
    # the same verdict on the same keys (how a forged event on the old home is worded
    # depends on how far the new home had been read: the partitions interleave differently)
    assert full.report.ok == dirty.report.ok
    assert (sorted((v.check, v.schedule_id) for v in full.report.violations)
            == sorted((v.check, v.schedule_id) for v in dirty.report.violations))


async def test_the_projector_reads_partitions_added_while_it_runs(
    event_log: Any, log_config: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    live = await open_store(module_dsn, stores)
    pr = Projector(event_log, live, idle_ms=20, discover_s=0.2)
    task = asyncio.create_task(pr.run())
    try:
        await wait_until(lambda: sorted(pr.watermark().partitions) == [0, 1, 2, 3], 30,
                         what="the projector started on 4 partitions")
        other = open_log(log_config)  # another process grows the topic
        await other.start()
        try:
            assert await other.add_partitions(event_log.topics.events, 6) == 6
            created = m.EventEnvelope(
                event_id="added-1", type="ScheduleCreated", key="acme/added", tenant="acme",
                schedule_id="added", at=NOW,
                payload=m.ScheduleCreated(spec=m.ScheduleSpec.model_validate(SPEC),
                                          revision=1, created_at=NOW, anchor=NOW,
                                          next_run_at=None, next_due_at=None))
            await other.append([OutRecord(other.topics.events, b"acme/added",
                                          codec.encode_event(created), 5)])
        finally:
            await other.close()
        await wait_until(lambda: pr.watermark().partitions.get(5) == 1, 30,
                         what="the added partition projected")
        assert await live.pool.fetchval(
            "SELECT count(*) FROM schedules WHERE schedule_id = 'added'") == 1
        assert set(await pr.lag()) == set(range(6))
    finally:
        pr.stop()
        await asyncio.wait_for(task, 30)
