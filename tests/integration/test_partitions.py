"""The day partitions of runs and attempts (migration 0009, chronolog.projections.partitions)
and retention by whole days (chronolog.projections.retention, docs/design.md §9), on a real
PostgreSQL.

* migration 0009 converts a populated read model: every row kept, each run in its day's
  partition, each attempt in its run's;
* the projector (on start and on its timer) and a replay's build make the days ahead; a day
  whose rows are in the default partition is left to it;
* a run ID stays one row whatever the writes; an attempt is in its run's day; a lookup by run
  ID is an index scan in every partition;
* a backup records the days and a restore loads each row into its day; the replay's swap
  puts a partitioned table in place with its own days;
* a day past the deployment's window with every run expired is dropped (gone from pg_class
  and pg_inherits), with its final effects; its stragglers (a live run, a tenant with a
  longer window) move to the default partition, or, past the limit, keep the day and its
  expired rows go one by one; a day whose tables stay locked waits for the next pass; a
  day not yet past the window keeps its expired rows;
* property (hypothesis over runs, days with or without a partition, and now): the runs left
  are exactly those the rule keeps, and no day past the window is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronolog.cli.replay import replay
from chronolog.domain import messages as m
from chronolog.projections import backup
from chronolog.projections.migrate import load_migrations, migrate
from chronolog.projections.partitions import day_partitions, make_days
from chronolog.projections.project import FIRST_ATTEMPT, project_batch
from chronolog.projections.projector import Projector
from chronolog.projections.rebuild import swap_in
from chronolog.projections.retention import RetentionPolicy, prune
from chronolog.projections.store import PostgresProjectionStore
from support.histories import FINISHED, LIVE, run_history, schedule, tick
from support.polling import wait_until

from .pgdb import module_database, open_store, schema_store

pytestmark = pytest.mark.postgres

D0 = date(2026, 3, 1)
TOPIC = "chronolog.events"
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


D0_END = midnight(D0) + DAY


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    yield from module_database(database_url, "test_partitions")


async def _apply(store: PostgresProjectionStore, envs: list[m.EventEnvelope],
                 start: int = 0) -> int:
    envs = sorted(envs, key=lambda e: e.at)
    await store.apply(project_batch(envs), {(TOPIC, 0): (start, start + len(envs))},
                      last_event_at={(TOPIC, 0): envs[-1].at})
    return start + len(envs)


async def _homes(store: PostgresProjectionStore, table: str) -> dict[tuple[Any, ...], str]:
    """Each row's key -> the partition it is in."""
    key = "run_id" if table == "runs" else "run_id, attempt"
    rows = await store.pool.fetch(f"SELECT {key}, tableoid::regclass::text FROM {table}")
    return {tuple(r)[:-1]: r[-1].strip('"').split(".")[-1] for r in rows}


async def _tables(store: PostgresProjectionStore) -> set[str]:
    return {r[0] for r in await store.pool.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')")}


async def _children(store: PostgresProjectionStore, parent: str) -> set[str]:
    return {r[0] for r in await store.pool.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = $1::regclass", parent)}


# ------------------------------------------------------------------ the migration

# the columns migration 0010 drops from runs and from attempts
RUNS_DROPPED = frozenset({"lateness_ms", "materialized_at"})
ATTEMPTS_DROPPED = frozenset({"tenant", "schedule_id", "updated_at"})
# the columns of a run's attempt 1 that migration 0012 adds to runs
FIRST_COLUMNS = frozenset(FIRST_ATTEMPT.values()) | {"permit_wait", "exclusion"}  # 0013, 0015
_RUN_COLS = ("run_id, tenant, schedule_id, scheduled_at, revision, trigger, state, attempt, "
             "started_at, due_at, finished_at, params, updated_at")


async def test_migration_0009_converts_a_populated_read_model_without_losing_a_row(
    module_dsn: str,
) -> None:
    conn = await asyncpg.connect(module_dsn)
    try:
        await conn.execute("CREATE SCHEMA m0009")
        await conn.execute("SET search_path = m0009")
        await conn.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY, "
                           "name text NOT NULL, checksum text NOT NULL, "
                           "applied_at timestamptz NOT NULL DEFAULT now())")
        for mig in load_migrations():
            if mig.version <= 8:  # the read model as it was before
                await conn.execute(mig.sql)
                await conn.execute("INSERT INTO schema_migrations VALUES ($1, $2, $3)",
                                   mig.version, mig.name, mig.checksum)
        days = [midnight(D0) + timedelta(days=n, hours=5) for n in (0, 1, 7)]
        for i, at in enumerate(days * 3):
            done = at + HOUR if i % 2 else None
            await conn.execute(
                f"INSERT INTO runs ({_RUN_COLS}) VALUES ($1, 't', 's', $2, 1, 'schedule', "
                "$3, 1, $2::timestamptz + interval '1 minute', $2, $4, '{\"n\": 1}', $2)",
                f"r{i}", at + timedelta(minutes=i), "SUCCEEDED" if done else "LEASED", done)
            await conn.execute(
                "INSERT INTO attempts (run_id, attempt, tenant, schedule_id, fence, worker_id, "
                "claimed_at, lease_until, updated_at) "
                "VALUES ($1, 1, 't', 's', 1, 'w', $2, $2::timestamptz + interval '1 hour', $2)",
                f"r{i}", at + timedelta(minutes=i + 1))
        # an attempt whose run is gone (pruned): it takes its claim's day
        await conn.execute(
            "INSERT INTO attempts (run_id, attempt, tenant, schedule_id, fence, worker_id, "
            "claimed_at, lease_until, updated_at) "
            "VALUES ('gone', 2, 't', 's', 1, 'w', $1, $1, $1)", days[1])
        runs = await conn.fetch("SELECT * FROM runs ORDER BY run_id")
        attempts = await conn.fetch("SELECT * FROM attempts ORDER BY run_id, attempt")

        # 0009 and the migrations after it
        assert await migrate(conn) == [g.version for g in load_migrations() if g.version >= 9]

        # every value of the columns kept (0010 drops some nothing reads)
        migrated = await conn.fetch("SELECT * FROM runs ORDER BY run_id")
        assert [{k: v for k, v in dict(r).items() if k not in FIRST_COLUMNS}
                for r in migrated] \
            == [{k: v for k, v in dict(r).items() if k not in RUNS_DROPPED} for r in runs]
        # 0012: an attempt 1 still open moved into its run's row; the others stay rows
        moved = {a["run_id"]: a for a in attempts if a["attempt"] == 1 and a["outcome"] is None}
        assert moved
        for r in migrated:
            a = moved.get(r["run_id"])
            assert (r["first_fence"], r["first_worker_id"], r["first_lease_until"]) == (
                (a["fence"], a["worker_id"], a["lease_until"]) if a else (None, None, None))
        after = await conn.fetch("SELECT * FROM attempts ORDER BY run_id, attempt")
        assert [{k: v for k, v in dict(r).items() if k != "scheduled_at"} for r in after] \
            == [{k: v for k, v in dict(r).items() if k not in ATTEMPTS_DROPPED}
                for r in attempts if not (r["attempt"] == 1 and r["run_id"] in moved)]
        scheduled = {r["run_id"]: r["scheduled_at"] for r in runs}
        for a in after:
            assert a["scheduled_at"] == scheduled.get(a["run_id"], days[1])
        homes = {r[0]: r[1] for r in await conn.fetch(
            "SELECT run_id, tableoid::regclass::text FROM runs")}
        for r in runs:
            assert homes[r["run_id"]] == "runs_p" + r["scheduled_at"].strftime("%Y%m%d")
        parts = {r[0] for r in await conn.fetch(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'attempts'::regclass")}
        assert parts == {"attempts_default", "attempts_p20260301", "attempts_p20260302",
                         "attempts_p20260308"}
        assert await conn.fetchval("SELECT to_regclass('runs_unpartitioned')") is None
    finally:
        await conn.close()


# ------------------------------------------------------------------ days made ahead

async def test_the_projector_and_a_replays_build_make_the_days_ahead(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    policy = RetentionPolicy(default=2.5 * 86400)  # two whole days back
    today = datetime.now(UTC).date()
    expected = {f"runs_p{(today + timedelta(days=n)):%Y%m%d}" for n in range(-2, 4)}

    store = await open_store(module_dsn, stores)
    live = Projector(sqlite_log, store, retention=policy, prune_every_s=0.05)
    task = asyncio.create_task(live.run())
    try:
        await wait_until(lambda: bool(live.partitions_made), 30, what="the days made")
    finally:
        live.stop()
        await asyncio.wait_for(task, 30)
    assert set(live.partitions_made) == expected
    assert await _children(store, "runs") == expected | {"runs_default"}
    assert await _children(store, "attempts") == \
        {n.replace("runs", "attempts") for n in expected} | {"attempts_default"}

    rebuilt = await open_store(module_dsn, stores)
    await replay(sqlite_log, rebuilt, retention=policy)
    assert await _children(rebuilt, "runs") == expected | {"runs_default"}


async def test_a_day_whose_rows_are_in_the_default_partition_is_left_to_it(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    store = await open_store(module_dsn, stores)
    await _apply(store, [schedule("t", "s", midnight(D0)),
                         *run_history("t", "s", "r1", "ready", midnight(D0) + HOUR, D0_END)])
    assert await make_days(store.pool, [D0, D0 + DAY]) == ["runs_p20260302"]
    assert await _homes(store, "runs") == {("r1",): "runs_default"}
    assert [p.day for p in await day_partitions(store.pool)] == [D0 + DAY]


# ------------------------------------------------------------------ writes and lookups

async def test_a_run_id_is_one_row_and_its_attempts_are_in_its_day(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """A second creating write of a run ID (here a skipped instant naming another day)
    updates the run's row in its day; it never makes a second row in another day."""
    store = await open_store(module_dsn, stores)
    await make_days(store.pool, [D0, D0 + DAY])
    at = midnight(D0) + 5 * HOUR
    n = await _apply(store, [schedule("t", "s", midnight(D0)),
                             *run_history("t", "s", "r1", "leased", at, at + HOUR)])
    assert await _homes(store, "attempts") == {("r1", 2): "attempts_p20260301"}
    skipped = run_history("t", "s", "r1", "skipped", at + DAY, at + DAY + HOUR)
    await _apply(store, skipped, n)
    rows = await store.pool.fetch("SELECT scheduled_at, state FROM runs WHERE run_id = 'r1'")
    assert [tuple(r) for r in rows] == [(at, "SKIPPED")]
    assert await _homes(store, "runs") == {("r1",): "runs_p20260301"}


async def test_lookups_by_run_id_are_index_scans_in_every_partition(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    store = await open_store(module_dsn, stores)
    await make_days(store.pool, [D0, D0 + DAY, D0 + 2 * DAY])
    async with store.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        for sql, args in (
            ("SELECT * FROM runs WHERE run_id = $1 AND tenant = $2", ("r", "t")),
            ("SELECT * FROM attempts WHERE run_id = $1 ORDER BY attempt", ("r",)),
            ("UPDATE runs SET state = 'READY' WHERE run_id = $1", ("r",)),
        ):
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *args))
            assert "Seq Scan" not in plan, plan
            scans = [line for line in plan.splitlines() if "Index Scan" in line]
            assert len(scans) >= 4, plan  # three days and the default


# ------------------------------------------------------------------ backups and the swap

async def _two_days(store: PostgresProjectionStore) -> None:
    await make_days(store.pool, [D0, D0 + DAY])
    envs = [schedule("t", "s", midnight(D0))]
    for n, outcome in enumerate(("succeeded", "leased")):
        start = midnight(D0) + timedelta(days=n, hours=5)
        envs += run_history("t", "s", f"r{n}", outcome, start, start + HOUR)
    await _apply(store, envs)


async def test_a_backup_restores_the_rows_into_their_days(
    module_dsn: str, stores: list[PostgresProjectionStore], tmp_path: Path
) -> None:
    store = await open_store(module_dsn, stores)
    await _two_days(store)
    manifest = await backup.dump(store.pool, tmp_path)
    assert manifest["days"] == ["2026-03-01", "2026-03-02"]
    assert manifest["tables"]["runs"] == 2 and manifest["tables"]["attempts"] == 2
    assert not any(name.startswith(("runs_", "attempts_")) for name in manifest["tables"])

    schema, loaded = await backup.stage(module_dsn, tmp_path, manifest)
    restored = await schema_store(module_dsn, schema)
    try:
        assert loaded["runs"] == 2
        for table in ("runs", "attempts"):
            assert await _homes(restored, table) == await _homes(store, table)
        assert await restored.pool.fetch("SELECT * FROM runs ORDER BY run_id") \
            == await store.pool.fetch("SELECT * FROM runs ORDER BY run_id")
    finally:
        await restored.close()


async def test_the_swap_puts_a_partitioned_table_in_place_with_its_days(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """The target's partitions go with their table, whatever the fresh one's days."""
    target = await open_store(module_dsn, stores)
    await make_days(target.pool, [D0 - DAY])
    fresh = await open_store(module_dsn, stores)
    await _two_days(fresh)
    fresh_schema = await fresh.pool.fetchval("SELECT current_schema()")
    target_schema = await target.pool.fetchval("SELECT current_schema()")
    async with target.pool.acquire() as conn:
        await swap_in(conn, fresh_schema, target_schema)
    assert await _children(target, "runs") == {"runs_default", "runs_p20260301",
                                               "runs_p20260302"}
    assert await _homes(target, "runs") == {("r0",): "runs_p20260301",
                                            ("r1",): "runs_p20260302"}


# ------------------------------------------------------------------ retention by days

WINDOWS = RetentionPolicy(default=86400.0, tenants={"short": 3600.0, "long": 30 * 86400.0})


async def test_a_day_past_the_window_with_every_run_expired_is_dropped_whole(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    store = await open_store(module_dsn, stores)
    await make_days(store.pool, [D0, D0 + DAY])
    at = midnight(D0) + 5 * HOUR
    envs = [schedule("t", "s", midnight(D0))]
    for i, outcome in enumerate(FINISHED):
        envs += run_history("t", "s", f"r{i}", outcome, at, at + HOUR)
    envs += run_history("t", "s", "next-day", "leased", at + DAY, at + DAY + HOUR)
    # an effect still to be delivered outlives its run's day
    envs.append(m.EventEnvelope(
        event_id="e-open", type="EffectIntended", key="t/s", tenant="t", schedule_id="s",
        at=at + HOUR, payload=m.EffectIntended(effect_id="fx-open", run_id="r1",
                                               kind="webhook", checksum="sha256:0")))
    envs.append(tick("t", "s", D0_END + DAY))  # day 1 is past the one-day window now
    await _apply(store, envs)

    report = await prune(store.pool, WINDOWS, projection=store.projection, topic=TOPIC)
    assert report.days == [D0] and report.moved == 0
    assert (report.runs, report.attempts, report.effects) == (4, 3, 1)
    assert {"runs_p20260301", "attempts_p20260301"}.isdisjoint(await _tables(store))
    assert await _children(store, "runs") == {"runs_default", "runs_p20260302"}
    assert await _homes(store, "runs") == {("next-day",): "runs_p20260302"}
    assert [r[0] for r in await store.pool.fetch("SELECT effect_id FROM effects")] \
        == ["fx-open"]


async def _straggling_day(store: PostgresProjectionStore) -> None:
    """Day D0 past the window: expired runs, a live run, a long tenant's finished run."""
    await make_days(store.pool, [D0])
    at = midnight(D0) + 5 * HOUR
    envs = [schedule(t, "s", midnight(D0)) for t in ("t", "long")]
    for i, outcome in enumerate(FINISHED):
        envs += run_history("t", "s", f"r{i}", outcome, at, at + HOUR)
    envs += run_history("t", "s", "live", "leased", at, at + HOUR)
    envs += run_history("long", "s", "kept", "succeeded", at, at + HOUR)
    envs.append(tick("t", "s", D0_END + 2 * DAY))
    await _apply(store, envs)


async def test_a_closed_days_stragglers_move_to_the_default_partition_and_the_day_goes(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    store = await open_store(module_dsn, stores)
    await _straggling_day(store)
    before = {r["run_id"]: r for r in await store.pool.fetch("SELECT * FROM runs")}

    report = await prune(store.pool, WINDOWS, projection=store.projection, topic=TOPIC)
    assert report.days == [D0] and report.moved == 2 and report.runs == 4
    assert "runs_p20260301" not in await _tables(store)
    assert await _homes(store, "runs") == {("live",): "runs_default",
                                           ("kept",): "runs_default"}
    assert await _homes(store, "attempts") == {("live", 2): "attempts_default",
                                               ("kept", 2): "attempts_default"}
    for row in await store.pool.fetch("SELECT * FROM runs"):
        assert dict(row) == dict(before[row["run_id"]])  # moved as they were
    assert {r[0] for r in await store.pool.fetch("SELECT run_id FROM effects")} == {"kept"}


async def test_a_day_with_more_stragglers_than_the_limit_stays_and_loses_its_expired_rows(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    store = await open_store(module_dsn, stores)
    await _straggling_day(store)
    report = await prune(store.pool, WINDOWS, projection=store.projection, topic=TOPIC,
                         straggler_limit=1)
    assert report.days == [] and report.runs == 4
    assert await _homes(store, "runs") == {("live",): "runs_p20260301",
                                           ("kept",): "runs_p20260301"}


async def test_a_day_whose_tables_stay_locked_is_left_whole_for_the_next_pass(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """A reader holding runs past the lock wait: the day is neither dropped nor deleted
    from row by row; once the reader is gone, the next pass drops it."""
    store = await open_store(module_dsn, stores)
    await _straggling_day(store)
    before = await _homes(store, "runs")
    schema = await store.pool.fetchval("SELECT current_schema()")
    reader = await asyncpg.connect(module_dsn)
    try:
        async with reader.transaction():
            await reader.execute(f'LOCK TABLE "{schema}".runs IN ACCESS SHARE MODE')
            report = await prune(store.pool, WINDOWS, projection=store.projection,
                                 topic=TOPIC)
            assert report.days == [] and report.runs == 0
            assert await _homes(store, "runs") == before
    finally:
        await reader.close()
    report = await prune(store.pool, WINDOWS, projection=store.projection, topic=TOPIC)
    assert report.days == [D0] and report.moved == 2


async def test_a_day_not_past_the_window_keeps_its_expired_rows_until_it_goes_whole(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """Within a day partition a run of the deployment's window waits for its day (at most a
    day more); a tenant with a shorter window, and any run in the default partition, go
    as soon as they are past it."""
    store = await open_store(module_dsn, stores)
    await make_days(store.pool, [D0])
    at = midnight(D0) + 5 * HOUR
    envs = [schedule(t, "s", midnight(D0)) for t in ("t", "short")]
    envs += run_history("t", "s", "waits", "succeeded", at, at + HOUR)
    envs += run_history("short", "s", "short", "succeeded", at, at + HOUR)
    envs += run_history("t", "s", "default", "dead", at - DAY, at - DAY + HOUR)  # no day
    envs.append(tick("t", "s", D0_END + DAY / 2))  # every run past its window; day 1 not
    await _apply(store, envs)

    report = await prune(store.pool, WINDOWS, projection=store.projection, topic=TOPIC)
    assert report.days == [] and report.runs == 2
    assert await _homes(store, "runs") == {("waits",): "runs_p20260301"}
    await _apply(store, [tick("t", "s", D0_END + DAY)], len(envs))
    report = await prune(store.pool, WINDOWS, projection=store.projection, topic=TOPIC)
    assert report.days == [D0] and await _homes(store, "runs") == {}


async def test_a_window_shorter_than_a_day_does_not_wait_for_its_day(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """A two-minute window keeps two minutes of rows, not a day: its expired rows go one by
    one inside an open day partition, for the deployment's window as for a tenant's."""
    store = await open_store(module_dsn, stores)
    await make_days(store.pool, [D0])
    at = midnight(D0) + 5 * HOUR
    envs = [schedule(t, "s", midnight(D0)) for t in ("t", "short")]
    envs += run_history("t", "s", "old", "succeeded", at, at + timedelta(seconds=10))
    envs += run_history("short", "s", "old2", "succeeded", at, at + timedelta(seconds=10))
    envs += run_history("t", "s", "young", "succeeded", at + HOUR, at + HOUR)
    envs.append(tick("t", "s", at + HOUR + timedelta(seconds=60)))
    await _apply(store, envs)
    short = RetentionPolicy(default=120.0, tenants={"short": 120.0})
    report = await prune(store.pool, short, projection=store.projection, topic=TOPIC)
    assert report.days == [] and report.runs == 2
    assert await _homes(store, "runs") == {("young",): "runs_p20260301"}


# ------------------------------------------------------------------ the property

_runs = st.lists(
    st.tuples(st.sampled_from(["short", "t", "long"]), st.integers(0, 4),
              st.sampled_from(FINISHED + LIVE), st.integers(1, 60)),
    min_size=1, max_size=10)
PROPERTY_WINDOWS = RetentionPolicy(default=86400.0, tenants={"short": 6 * 3600.0,
                                                             "long": 3 * 86400.0})


async def _check(store: PostgresProjectionStore, runs: list[tuple[str, int, str, int]],
                 days: set[int], now_h: int) -> None:
    for p in await day_partitions(store.pool):
        await store.pool.execute(f'DROP TABLE "{p.runs}", "{p.attempts}"')
    await store.pool.execute("TRUNCATE schedules, runs, attempts, effects, run_counters, "
                             "ready_runs, open_attempts, projection_offsets")
    await make_days(store.pool, [D0 + timedelta(days=d) for d in days])
    envs = [schedule(t, "s", midnight(D0)) for t in ("short", "t", "long")]
    for i, (tenant, day, outcome, finish_h) in enumerate(runs):
        start = midnight(D0) + timedelta(days=day, hours=6)
        envs += run_history(tenant, "s", f"r{i}", outcome, start,
                            start + timedelta(hours=finish_h))
    now = midnight(D0) + timedelta(days=5, hours=now_h)
    envs.append(tick("t", "s", max(now, max(e.at for e in envs))))
    now = envs[-1].at
    await _apply(store, envs)

    await prune(store.pool, PROPERTY_WINDOWS, projection=store.projection, topic=TOPIC,
                batch=3)
    w = PROPERTY_WINDOWS
    left = {k[0] for k in await _homes(store, "runs")}
    for i, (tenant, day, outcome, finish_h) in enumerate(runs):
        finish = midnight(D0) + timedelta(days=day, hours=6 + finish_h)
        expired = outcome in FINISHED and finish < now - timedelta(seconds=w.window(tenant))
        waiting = (w.window(tenant) >= w.default and day in days
                   and midnight(D0) + timedelta(days=day + 1) > now - timedelta(seconds=w.default))
        assert (f"r{i}" in left) == (not expired or waiting), (runs[i], days, now)
    for p in await day_partitions(store.pool):  # no day past the window is left
        assert p.upper > now - timedelta(seconds=w.default), (p, now)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=_runs, days=st.sets(st.integers(0, 5)), now_h=st.integers(0, 72))
def test_the_runs_left_are_those_the_day_rule_keeps(
    runs: list[tuple[str, int, str, int]], days: set[int], now_h: int, module_dsn: str
) -> None:
    async def check() -> None:
        store = await schema_store(module_dsn, "partition_property")
        try:
            await _check(store, runs, days, now_h)
        finally:
            await store.close()

    asyncio.run(check())
