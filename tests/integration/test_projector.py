"""The live projector on both logs and a real PostgreSQL.

* a projector stopped mid-stream and started again resumes from the offsets stored in
  PostgreSQL: every event is applied exactly once (counted), and the tables equal a rebuild
  from offset 0 row for row (no duplicate, no missing row);
* two projectors racing on one database: offset conflicts are absorbed (re-read, go on),
  every event is still applied once and the tables equal the rebuild; projectors on
  disjoint partition sets never conflict and together equal it too;
* a record that does not decode, or that the database refuses, is dead-lettered and skipped:
  the rest of its batch is projected, and a second projector rebuilds the same tables.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.port import OutRecord
from chronolog.projections.metrics import ProjectorCollector
from chronolog.projections.projector import Commit, Projector
from chronolog.projections.store import PostgresProjectionStore
from support.polling import finish, wait_until
from support.processors import Running, read_all

from .pgdb import dump, module_database, open_store

pytestmark = pytest.mark.postgres

SPEC = {"every": "1s", "job": {"type": "echo"}, "overlap": "allow"}


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    yield from module_database(database_url, "test_projector")



async def _rebuild(lg: Any, module_dsn: str, stores: list[PostgresProjectionStore]
                   ) -> tuple[PostgresProjectionStore, Projector]:
    """A fresh schema projected from offset 0 in small batches."""
    store = await open_store(module_dsn, stores)
    pr = Projector(lg, store, batch_max=7)
    # a record per partition a batch: a few hundred batches, slow on a loaded machine
    await pr.run_until_caught_up(180)
    return store, pr


async def _event_count(lg: Any) -> int:
    return len(await read_all(lg, lg.topics.events))


async def test_restart_resumes_from_the_stored_offsets(
    event_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    live = await open_store(module_dsn, stores)
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
    try:  # the processor has stopped: the log no longer grows
        rebuilt, rb = await _rebuild(event_log, module_dsn, stores)
        await wait_until(lambda: two.watermark() == rb.watermark(), 30, what="live caught up")
    finally:
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


async def test_an_idle_projector_projects_a_partitions_events_while_the_other_reads_wait(
    event_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """Reads that wait up to a minute for records: a schedule's events are projected as they
    come, not once every other partition's read has run out (a pass per ``idle_ms``), and a
    stop does not wait for those reads either."""
    store = await open_store(module_dsn, stores)
    pr = Projector(event_log, store, batch_max=40, idle_ms=60_000)
    task = asyncio.create_task(pr.run())
    try:
        async with Running(event_log) as r:
            await r.client.create_schedule("acme", "one", SPEC)
            await wait_until(lambda: pr.stats.events >= 1, 30, what="the create projected")
            assert await store.pool.fetchval(
                "SELECT count(*) FROM schedules WHERE schedule_id = 'one'") == 1
    finally:
        pr.stop()
        await asyncio.wait_for(task, 30)


async def _more(lg: Any, n: int) -> bool:
    return await _event_count(lg) >= n


async def test_two_projectors_on_one_database_apply_each_event_once(
    event_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    shared = await open_store(module_dsn, stores)
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
    await finish(tasks, 30, "both projectors stopped")
    assert a.stats.events + b.stats.events == total
    assert await dump(shared) == await dump(rebuilt)

    # scale-out: projectors on disjoint partition sets share a database without conflicts
    split = await open_store(module_dsn, stores)
    halves = [Projector(event_log, split, batch_max=11, partitions=ps) for ps in ({0, 1}, {2, 3})]
    await asyncio.gather(*(h.run_until_caught_up(60) for h in halves))
    assert sum(h.stats.events for h in halves) == total
    assert sum(h.stats.conflicts for h in halves) == 0
    assert set(halves[0].watermark().partitions) == {0, 1}
    assert await dump(split) == await dump(rebuilt)


def _materialized(run_id: str, at: datetime, params: dict[str, Any] | None = None,
                  priority: int = 0) -> bytes:
    return codec.encode_event(m.EventEnvelope(
        event_id=f"e-{run_id}", type="OccurrenceMaterialized", key="acme/s0", tenant="acme",
        schedule_id="s0", at=at, payload=m.OccurrenceMaterialized(
            run_id=run_id, scheduled_at=at, due_at=at, revision=1, state="READY", sequence=9,
            # model_construct: the model would refuse NUL; an event already in the log has it
            job=m.JobSpec.model_construct(type="echo", params=params or {}, timeout=None),
            priority=priority,
            advances_schedule=False)))


async def test_poison_records_are_dead_lettered_and_skipped_and_the_rest_is_projected(
    event_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    store = await open_store(module_dsn, stores)
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s0", SPEC)
    topic = event_log.topics.events
    ends = [await event_log.end_offset(topic, p) for p in range(event_log.topics.partitions)]
    p = next(p for p, end in enumerate(ends) if end > 0)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    poison = [
        b"{not json",  # not JSON
        b'{"topic": "chronolog.events", "hello": 1}',  # JSON, not an event
        _materialized("r_nul", at, {"text": "a\u0000b", "k\u0000": ["\u0000"]}),  # NUL
        _materialized("r_big", at, priority=2**40),  # overflows the integer column
        _materialized("r_ok", at),
    ]
    positions = await event_log.append([OutRecord(topic, b"acme/s0", v, partition=p)
                                        for v in poison])
    offsets = [pos.offset for pos in positions]
    pr = Projector(event_log, store, batch_max=1000)
    task = asyncio.create_task(pr.run())
    await wait_until(lambda: pr.watermark().partitions.get(p, 0) > offsets[-1], 30,
                     what="the projector past the poison records")
    pr.stop()
    await asyncio.wait_for(task, 30)

    # every good record is projected, the NUL kept as U+FFFD; the refused one is not
    rows = {r["run_id"]: r for r in await store.pool.fetch(
        "SELECT run_id, params FROM runs WHERE run_id IN ('r_nul', 'r_big', 'r_ok')")}
    assert set(rows) == {"r_nul", "r_ok"}
    assert orjson.loads(rows["r_nul"]["params"]) == {"text": "a\ufffdb", "k\ufffd": ["\ufffd"]}
    assert (await store.offsets())[(topic, p)] == offsets[-1] + 1
    assert pr.stats.refused_batches == 1
    letters = [codec.decode_dead_letter(x.value)
               for x in await read_all(event_log, event_log.topics.dlq)]
    assert sorted((d.consumer, d.source_topic, d.source_partition, d.source_offset, d.error_class)
                  for d in letters) == [
        ("projector", topic, p, offsets[0], "DecodeError"),
        ("projector", topic, p, offsets[1], "DecodeError"),
        ("projector", topic, p, offsets[3], "DataError"),
    ]
    first = next(d for d in letters if d.source_offset == offsets[0])
    assert base64.b64decode(first.original) == b"{not json" and first.original_size == 9
    assert "int32" in next(d.reason for d in letters if d.source_offset == offsets[3])
    assert pr.dead_letters.counts[topic] == 3
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProjectorCollector(pr))
    assert (f'chronolog_projector_dead_letters_total{{topic="{topic}"}} 3.0'
            in generate_latest(registry).decode())

    # a second projector from offset 0 skips the same records: the same tables
    again = await open_store(module_dsn, stores)
    rebuilt = Projector(event_log, again, batch_max=2)
    await rebuilt.run_until_caught_up(30)
    assert await dump(again) == await dump(store)
