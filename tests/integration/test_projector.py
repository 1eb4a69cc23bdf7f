"""The live projector on both logs and a real PostgreSQL.

* a projector stopped mid-stream and started again resumes from the offsets stored in
  PostgreSQL: every event is applied exactly once (counted), and the tables equal a rebuild
  from offset 0 row for row (no duplicate, no missing row);
* two projectors racing on one database: offset conflicts are absorbed (re-read, go on),
  every event is still applied once and the tables equal the rebuild; projectors on
  disjoint partition sets never conflict and together equal it too;
* a record that does not decode stops the projector after the batches before it committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from chronolog.log.port import OutRecord
from chronolog.projections.projector import Commit, ProjectionError, Projector
from chronolog.projections.store import PostgresProjectionStore

from .conftest import wait_until
from .pgdb import create_database, drop_database, dump, schema_store
from .test_processor import Running, read_all

pytestmark = pytest.mark.postgres

SPEC = {"every": "1s", "job": {"type": "echo"}, "overlap": "allow"}


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    dsn = asyncio.run(create_database(database_url, "test_projector"))
    yield dsn
    asyncio.run(drop_database(database_url, dsn))


@pytest.fixture
async def stores(module_dsn: str) -> AsyncIterator[list[PostgresProjectionStore]]:
    opened: list[PostgresProjectionStore] = []
    yield opened
    for s in opened:
        await s.close()


async def _store(module_dsn: str, stores: list[PostgresProjectionStore]) -> PostgresProjectionStore:
    s = await schema_store(module_dsn)
    stores.append(s)
    return s


async def _rebuild(lg: Any, module_dsn: str, stores: list[PostgresProjectionStore]
                   ) -> tuple[PostgresProjectionStore, Projector]:
    """A fresh schema projected from offset 0 in small batches."""
    store = await _store(module_dsn, stores)
    pr = Projector(lg, store, batch_max=7)
    await pr.run_until_caught_up(60)
    return store, pr


async def _event_count(lg: Any) -> int:
    return len(await read_all(lg, lg.topics.events))


async def test_restart_resumes_from_the_stored_offsets(
    event_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    live = await _store(module_dsn, stores)
    first_commits: list[Commit] = []
    async with Running(event_log) as r:
        for i in range(12):
            await r.client.create_schedule("acme", f"s{i}", SPEC)
        one = Projector(event_log, live, batch_max=40, idle_ms=20)
        task = asyncio.create_task(one.run())
        await wait_until(lambda: one.stats.events >= 20, 30, what="first projector progress")
        one.stop()
        await asyncio.wait_for(task, 30)
        stored = {p: n for (_, p), n in (await live.offsets()).items()}
        assert stored == {p: n for p, n in one.watermark().partitions.items() if n}

        # more of every kind while no projector runs
        for i in range(3):
            await r.client.trigger("acme", "s0", f"manual-{i}", {"i": i})
        await r.client.pause("acme", "s1")
        await r.client.delete("acme", "s2")
        before = await _event_count(event_log)
        await wait_until(lambda: _more(event_log, before + 10), 30, what="more events")

        two = Projector(event_log, live, batch_max=40, idle_ms=20)
        two.on_commit.append(lambda c: first_commits.append(c) if not first_commits else None)
        task = asyncio.create_task(two.run())
        await wait_until(lambda: first_commits, 30, what="second projector's first commit")
    # the processor has stopped: the log no longer grows
    rebuilt, rb = await _rebuild(event_log, module_dsn, stores)
    await wait_until(lambda: two.watermark() == rb.watermark(), 30, what="live caught up")
    two.stop()
    await asyncio.wait_for(task, 30)

    # the second projector began exactly where the stored offsets said
    for p, (expected, _new) in first_commits[0].offsets.items():
        assert expected == stored.get(p, 0)
    total = await _event_count(event_log)
    assert one.stats.events + two.stats.events == total == rb.stats.events
    assert one.stats.conflicts == two.stats.conflicts == 0
    a, b = await dump(live), await dump(rebuilt)
    assert a["runs"] and a["schedules"]
    assert a == b


async def _more(lg: Any, n: int) -> bool:
    return await _event_count(lg) >= n


async def test_two_projectors_on_one_database_apply_each_event_once(
    event_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    shared = await _store(module_dsn, stores)
    async with Running(event_log) as r:
        for i in range(20):
            await r.client.create_schedule("acme", f"s{i}", SPEC)
        await wait_until(lambda: _more(event_log, 100), 30, what="events")
    a = Projector(event_log, shared, batch_max=9, idle_ms=10)
    b = Projector(event_log, shared, batch_max=13, idle_ms=10)
    # deterministic race first: b loads the offsets, a moves them, b's batch conflicts
    await b.start()
    applied = await a.step()
    assert applied > 0
    assert await b.step() == 0 and b.stats.conflicts == 1 and b.stats.events == 0
    assert b.watermark() == a.watermark()  # b re-read the stored offsets
    # then both run freely
    tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    rebuilt, rb = await _rebuild(event_log, module_dsn, stores)
    total = rb.stats.events
    await wait_until(lambda: a.stats.events + b.stats.events >= total, 60,
                     what="both projectors together caught up")
    a.stop()
    b.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert a.stats.events + b.stats.events == total
    assert await dump(shared) == await dump(rebuilt)

    # scale-out: projectors on disjoint partition sets share a database without conflicts
    split = await _store(module_dsn, stores)
    halves = [Projector(event_log, split, batch_max=11, partitions=ps) for ps in ({0, 1}, {2, 3})]
    await asyncio.gather(*(h.run_until_caught_up(60) for h in halves))
    assert sum(h.stats.events for h in halves) == total
    assert sum(h.stats.conflicts for h in halves) == 0
    assert set(halves[0].watermark().partitions) == {0, 1}
    assert await dump(split) == await dump(rebuilt)


async def test_an_undecodable_record_stops_the_projector_after_what_precedes_it(
    event_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    store = await _store(module_dsn, stores)
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s0", SPEC)
    topic = event_log.topics.events
    ends = [await event_log.end_offset(topic, p) for p in range(event_log.topics.partitions)]
    p = next(p for p, end in enumerate(ends) if end > 0)
    good = await event_log.end_offset(topic, p)
    await event_log.append([OutRecord(topic, b"acme/s0", b"{not json", partition=p)])
    pr = Projector(event_log, store, batch_max=1000)
    with pytest.raises(ProjectionError, match="does not decode"):
        await asyncio.wait_for(pr.run(), 30)
    stored = await store.offsets()
    assert stored[(topic, p)] >= 1
    recs = await read_all(event_log, topic)
    last_good = max(r.offset for r in recs if r.partition == p and r.value != b"{not json")
    assert stored[(topic, p)] == last_good + 1 <= good
    row = await store.pool.fetchrow("SELECT state FROM schedules WHERE schedule_id = 's0'")
    assert row is not None and row["state"] in ("ACTIVE",)
