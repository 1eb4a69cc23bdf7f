"""Retention of finished runs in the read model (chronolog.projections.retention,
docs/design.md §9 "Retention"), on an embedded SQLite log and a real PostgreSQL.

Windows are seconds long and every time is an event time written into the log: nothing
here waits for a clock.

* the live projector prunes exactly the finished runs whose finish is older than their
  tenant's window before the newest event it projected — two tenants, two windows — with
  their attempts and final effects; live runs, schedules and counters stay;
* the read model's now is the newest event projected, not the wall clock: a history years
  old loses nothing while its events are within the window;
* batches are bounded (``batch`` runs per transaction, ``max_batches`` per pass);
* a replay gives the live projector's tables row for row, counters included — also when
  whole days are dropped and their stragglers moved (partitions by day, migration 0009);
* property (hypothesis over run histories): after pruning, every live run, every schedule
  and every counter is still there, and the finished runs left are exactly those inside
  their window.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronolog.cli.replay import ReplayStats, replay
from chronolog.domain import messages as m
from chronolog.projections.partitions import DEFAULT_PARTITION
from chronolog.projections.project import project_batch
from chronolog.projections.projector import Projector
from chronolog.projections.retention import (
    FINAL_EFFECT_STATES,
    ONE_TENANT_SQL,
    RetentionPolicy,
    delete_sql,
    prune,
)
from chronolog.projections.store import PostgresProjectionStore
from support.histories import FINISHED, LIVE, records, run_history, schedule, tick
from support.polling import wait_until

from .pgdb import dump, module_database, open_store, schema_store

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = RetentionPolicy(default=60.0, tenants={"short": 10.0})  # "long" takes the default


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    yield from module_database(database_url, "test_retention")



# (tenant, run, outcome, finished at T0 + s); the log's newest event is at T0 + 100 s, so
# "short" (10 s) keeps what finished after T0 + 90 s and "long" (60 s) after T0 + 40 s
RUNS = [
    ("short", "r-s-old-ok", "succeeded", 20), ("short", "r-s-old-dead", "dead", 50),
    ("short", "r-s-old-cancel", "cancelled", 85), ("short", "r-s-old-skip", "skipped", 89),
    ("short", "r-s-new-ok", "succeeded", 95), ("short", "r-s-live", "leased", 10),
    ("long", "r-l-old-ok", "succeeded", 20), ("long", "r-l-old-skip", "skipped", 39),
    ("long", "r-l-new-dead", "dead", 50), ("long", "r-l-new-ok", "succeeded", 85),
    ("long", "r-l-live", "ready", 1),
]
EXPECTED_LEFT = {"r-s-new-ok", "r-s-live", "r-l-new-dead", "r-l-new-ok", "r-l-live"}


async def _write_history(lg: Any) -> None:
    topic = lg.topics.events
    for p, tenant in enumerate(("short", "long")):  # one tenant per partition
        envs = [schedule(tenant, "s", at(0))]
        for t, run_id, outcome, finish in RUNS:
            if t == tenant:
                envs += run_history(tenant, "s", run_id, outcome, at(0), at(finish))
        envs.sort(key=lambda e: e.at)
        await lg.append(records(topic, envs, p))
    await lg.append(records(topic, [tick("long", "s", at(100))], 1))  # the newest event


async def _runs(store: PostgresProjectionStore) -> set[str]:
    return {r[0] for r in await store.pool.fetch("SELECT run_id FROM runs")}


async def _counters(store: PostgresProjectionStore) -> dict[tuple[str, ...], int]:
    rows = await store.pool.fetch(
        "SELECT metric, tenant, resource_class, job_type, label, sum(value)::bigint "
        "FROM run_counters GROUP BY 1, 2, 3, 4, 5")
    return {tuple(r[:5]): r[5] for r in rows if r[5]}


async def test_pruning_removes_exactly_the_finished_runs_past_each_tenants_window(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    await _write_history(sqlite_log)
    store = await open_store(module_dsn, stores)
    before = Projector(sqlite_log, store, retention=POLICY)
    await before.run_until_caught_up(30)  # step() projects only: nothing pruned yet
    assert await _runs(store) == {r for _, r, _, _ in RUNS}
    counters = await _counters(store)
    schedules = await store.pool.fetch("SELECT * FROM schedules ORDER BY tenant")

    live = Projector(sqlite_log, store, retention=POLICY, prune_every_s=0.05)
    task = asyncio.create_task(live.run())
    try:
        await wait_until(lambda: live.pruned.runs >= 6, 30, what="the projector's pruning")
    finally:
        live.stop()
        await asyncio.wait_for(task, 30)

    assert await _runs(store) == EXPECTED_LEFT
    assert live.pruned.now == at(100)
    left_attempts = {r[0] for r in await store.pool.fetch("SELECT run_id FROM attempts")}
    assert left_attempts == {"r-s-new-ok", "r-s-live", "r-l-new-dead", "r-l-new-ok"}
    effects = {r[0] for r in await store.pool.fetch("SELECT run_id FROM effects")}
    assert effects == {"r-s-new-ok", "r-l-new-ok"}
    assert await _counters(store) == counters  # counters are never pruned
    assert await store.pool.fetch("SELECT * FROM schedules ORDER BY tenant") == schedules


async def test_a_partition_behind_the_log_holds_the_pruning_back_to_its_own_time(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """The live projector prunes by the newest event projected; while a partition is
    behind the log (more than a record: a commit marker's offset), by that partition's
    last event time — a run goes only once its own partition is past its window."""
    await _write_history(sqlite_log)
    store = await open_store(module_dsn, stores)
    pr = Projector(sqlite_log, store, retention=POLICY)
    await pr.run_until_caught_up(30)
    assert await pr.pruning_now() == at(100)  # the newest: partition 1's tick
    topic = sqlite_log.topics.events
    await sqlite_log.append(records(topic, [tick("short", "s", at(96))], 0))
    assert await pr.pruning_now() == at(100)  # one record behind: as caught up
    await sqlite_log.append(records(topic, [tick("short", "s", at(97))], 0))
    # two behind: partition 0's newest projected event (r-s-new-ok's finish at 95 s)
    assert await pr.pruning_now() == at(95)
    report = await pr.prune()
    assert report.now == at(95)
    # by partition 0's time "short" keeps what finished from 85 s on, "long" from 35 s on
    # (by the newest: 90 s and 40 s)
    assert await _runs(store) == EXPECTED_LEFT | {"r-s-old-skip", "r-s-old-cancel",
                                                  "r-l-old-skip"}
    await pr.run_until_caught_up(30)
    assert await pr.pruning_now() == at(100)
    await pr.prune()
    assert await _runs(store) == EXPECTED_LEFT


async def test_the_read_models_now_is_the_newest_event_not_the_wall_clock(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """Years-old history within its window keeps every row (a stopped deployment started
    again, or a replay of old history); one newer event moves the read model's now."""
    await _write_history(sqlite_log)
    store = await open_store(module_dsn, stores)
    wide = RetentionPolicy(default=3600.0)  # an hour: nothing of T0 + 0..100 s is past it
    pr = Projector(sqlite_log, store, retention=wide)
    await pr.run_until_caught_up(30)
    report = await pr.prune()
    assert report.now == at(100) and report.runs == 0
    assert await _runs(store) == {r for _, r, _, _ in RUNS}
    await sqlite_log.append(records(sqlite_log.topics.events,
                                    [tick("long", "s", at(100 + 3600 + 41))], 1))
    await pr.run_until_caught_up(30)
    report = await pr.prune()
    # finished before T0 + 141 s: every finished run; the live ones stay
    assert await _runs(store) == {"r-s-live", "r-l-live"}
    assert report.runs == 9


async def test_pruning_batches_are_bounded(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    topic = sqlite_log.topics.events
    envs = [schedule("short", "s", at(0))]
    for i in range(10):
        envs += run_history("short", "s", f"r{i:02}", "dead", at(0), at(1))
    envs.append(tick("short", "s", at(100)))
    await sqlite_log.append(records(topic, envs, 0))
    store = await open_store(module_dsn, stores)
    await Projector(sqlite_log, store).run_until_caught_up(30)

    one = await prune(store.pool, POLICY, projection=store.projection, topic=topic, batch=3,
                      max_batches=1)
    assert (one.runs, one.attempts, one.batches) == (3, 3, 1)
    assert len(await _runs(store)) == 7
    rest = await prune(store.pool, POLICY, projection=store.projection, topic=topic, batch=3)
    # 7 left in batches of 3 (3, 3, 1); the deployment's window goes tenant by tenant over
    # the tenants that have runs, and the only one has its own window: no other batch
    assert (rest.runs, rest.batches) == (7, 3)
    assert await _runs(store) == set()


async def test_pruning_finds_its_runs_through_the_tenants_runs_index(
    module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """No index holds finished_at (migration 0011): with sequential scans priced out (a
    small table would not need an index), a tenant's deletions, in every partition or in
    one, choose their runs through runs_by_tenant (tenant, scheduled_at, run_id), the range
    of the runs scheduled before the cut-off (by an index scan or a bitmap scan)."""
    store = await open_store(module_dsn, stores)
    async with store.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        for sql in (ONE_TENANT_SQL, delete_sql("tenant = $1", DEFAULT_PARTITION)):
            plan = "\n".join(r[0] for r in await conn.fetch(
                "EXPLAIN " + sql, "short", at(0), 10, list(FINAL_EFFECT_STATES)))
            assert re.search(r"(Index Scan using|Bitmap Index Scan on) "
                             r"(runs_by_tenant|runs_\w+_tenant_scheduled_at_run_id_idx)",
                             plan), plan
            assert re.search(r"Index Cond: \(\(tenant = .+\) AND \(scheduled_at < .+\)\)",
                             plan), plan
            assert "Seq Scan on runs" not in plan, plan


async def test_a_finished_run_goes_when_its_finish_is_past_the_window_not_its_instant(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """Retention chooses through the instant (a finished run's finished_at is never before
    its scheduled_at) but compares finished_at: a run scheduled long before the cut-off
    that finished after it stays; one that finished before it goes."""
    topic = sqlite_log.topics.events
    envs = [schedule("long", "s", at(0))]
    envs += run_history("long", "s", "early", "succeeded", at(1), at(2))
    envs += run_history("long", "s", "late", "succeeded", at(1), at(90))
    envs.append(tick("long", "s", at(100)))
    await sqlite_log.append(records(topic, sorted(envs, key=lambda e: e.at), 0))
    store = await open_store(module_dsn, stores)
    await Projector(sqlite_log, store).run_until_caught_up(30)
    # now is 100 s, the window 60 s: the cut-off is 40 s
    report = await prune(store.pool, POLICY, projection=store.projection, topic=topic)
    assert report.runs == 1
    assert await _runs(store) == {"late"}


async def _live_then_replay(
    lg: Any, dsn: str, stores: list[PostgresProjectionStore], policy: RetentionPolicy,
    done: Callable[[Projector], bool],
) -> tuple[Projector, PostgresProjectionStore, PostgresProjectionStore, ReplayStats]:
    """A live projector (small batches, pruning every 50 ms) run until ``done``, then a
    replay of the same log into another store."""
    live_store = await open_store(dsn, stores)
    live = Projector(lg, live_store, retention=policy, prune_every_s=0.05, batch_max=5)
    task = asyncio.create_task(live.run())
    try:
        await wait_until(lambda: done(live), 30, what="the projector's pruning")
    finally:
        live.stop()
        await asyncio.wait_for(task, 30)
    rebuilt = await open_store(dsn, stores)
    stats = await replay(lg, rebuilt, batch=4, retention=policy)
    return live, live_store, rebuilt, stats


async def test_a_replay_gives_the_live_projectors_tables_after_pruning(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    await _write_history(sqlite_log)
    _live, live_store, rebuilt, stats = await _live_then_replay(
        sqlite_log, module_dsn, stores, POLICY, lambda p: p.pruned.runs >= 6)
    assert stats.pruned == 6
    a, b = await dump(live_store), await dump(rebuilt)
    assert {r[0] for r in a["runs"]} == EXPECTED_LEFT
    assert a == b
    assert await _counters(live_store) == await _counters(rebuilt)


async def test_a_replay_drops_and_keeps_the_days_the_live_projector_does(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """Both make the days of a two-day window back from today's wall clock and three ahead;
    the log's time runs four days past today, so the days up to tomorrow are past the
    window: both drop them, move the same stragglers to the default partition (a live run, a
    run of a tenant with a longer window) and keep the same rows."""
    today = datetime.now(UTC).date()
    base = datetime(today.year, today.month, today.day, tzinfo=UTC)
    policy = RetentionPolicy(default=2 * 86400.0, tenants={"short": 3600.0,
                                                           "long": 10 * 86400.0})
    day = timedelta(days=1)
    envs = [schedule(t, "s", base - 3 * day) for t in ("t", "short", "long")]
    for run_id, tenant, outcome, n in (
        ("a", "t", "succeeded", -2), ("b", "t", "dead", -2), ("c", "t", "cancelled", -1),
        ("live", "t", "leased", -1), ("d", "t", "skipped", 0), ("kept", "long", "succeeded", 0),
        ("e", "short", "succeeded", 1),
    ):
        start = base + n * day + timedelta(hours=6)
        envs += run_history(tenant, "s", run_id, outcome, start, start + timedelta(hours=1))
    envs.sort(key=lambda e: e.at)
    # one partition: the log's time rises with the history, so a run is past its window
    # only once its effects are projected, whatever the batches
    envs.append(tick("t", "s", base + 4 * day + timedelta(hours=1)))
    await sqlite_log.append(records(sqlite_log.topics.events, envs, 0))
    gone = [today + n * day for n in (-2, -1, 0, 1)]

    live, live_store, rebuilt, stats = await _live_then_replay(
        sqlite_log, module_dsn, stores, policy,
        lambda p: sorted(p.pruned.days) == gone and p.pruned.runs == 5)
    assert stats.pruned == 5
    assert live.pruned.moved == 2
    a, b = await dump(live_store), await dump(rebuilt)
    assert {r[0] for r in a["runs"]} == {"live", "kept"}
    assert a == b
    for store in (live_store, rebuilt):
        rows = await store.pool.fetch("SELECT c.relname FROM pg_inherits i "
                                      "JOIN pg_class c ON c.oid = i.inhrelid "
                                      "WHERE i.inhparent = 'runs'::regclass")
        assert {r[0] for r in rows} == {f"runs_p{today + n * day:%Y%m%d}" for n in (2, 3)} \
            | {"runs_default"}
        homes = await store.pool.fetch("SELECT DISTINCT tableoid::regclass::text FROM runs")
        assert [r[0] for r in homes] == ["runs_default"]
    assert await _counters(live_store) == await _counters(rebuilt)


# ------------------------------------------------------------------ the property

_history = st.lists(
    st.tuples(st.sampled_from(["short", "long"]), st.sampled_from(FINISHED + LIVE),
              st.integers(min_value=1, max_value=99)),
    min_size=1, max_size=12)


async def _check_history(store: PostgresProjectionStore,
                         history: list[tuple[str, str, int]]) -> None:
    await store.pool.execute("TRUNCATE schedules, runs, attempts, effects, run_counters, "
                             "ready_runs, open_attempts, projection_offsets")
    envs: list[m.EventEnvelope] = [schedule("short", "s", at(0)), schedule("long", "s", at(0))]
    for i, (tenant, outcome, finish) in enumerate(history):
        envs += run_history(tenant, "s", f"r{i}", outcome, at(0), at(finish))
    envs.sort(key=lambda e: e.at)
    envs.append(tick("long", "s", at(100)))
    topic = "chronolog.events"
    await store.apply(project_batch(envs), {(topic, 0): (0, len(envs))},
                      last_event_at={(topic, 0): at(100)})
    counters = await _counters(store)
    schedules = await store.pool.fetch("SELECT * FROM schedules ORDER BY tenant")
    await prune(store.pool, POLICY, projection=store.projection, topic=topic, batch=2)
    left = await _runs(store)
    for i, (tenant, outcome, finish) in enumerate(history):
        past = finish < 100 - POLICY.window(tenant)
        assert (f"r{i}" in left) == (outcome in LIVE or not past), (tenant, outcome, finish)
    assert await _counters(store) == counters
    assert await store.pool.fetch("SELECT * FROM schedules ORDER BY tenant") == schedules


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=_history)
def test_pruning_never_removes_a_live_run_a_schedule_or_a_counter(
    history: list[tuple[str, str, int]], module_dsn: str
) -> None:
    async def check() -> None:
        store = await schema_store(module_dsn, "retention_property")
        try:
            await _check_history(store, history)
        finally:
            await store.close()

    asyncio.run(check())


# ------------------------------------------------------------------ the API across pruning


async def test_lists_and_cursors_go_on_across_pruning_and_a_pruned_run_is_a_404(
    sqlite_log: Any, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """A page's cursor whose last run was pruned since goes on with the next run; a GET of
    a pruned run is the usual 404 (a run ID does not say whether it ever existed)."""
    import httpx

    from chronolog.api.app import create_app
    from chronolog.tenants import Tenant, Tenants

    topic = sqlite_log.topics.events
    envs = [schedule("short", "s", at(0))]
    for i in range(6):  # r3 is live; the others finish a second after they are due
        envs += run_history("short", "s", f"r{i}", "leased" if i == 3 else "dead",
                            at(10 * i), at(10 * i + 1))
    envs.sort(key=lambda e: e.at)
    await sqlite_log.append(records(topic, envs, 0))
    store = await open_store(module_dsn, stores)
    pr = Projector(sqlite_log, store, retention=POLICY)
    await pr.run_until_caught_up(30)
    await pr.prune()  # now T0 + 51 s, window 10 s: r0, r1 and r2 go
    assert await _runs(store) == {"r3", "r4", "r5"}

    tenants = Tenants({"short": Tenant("short", ("short-token",))})
    app = create_app(None, store, tenants)
    auth = {"Authorization": "Bearer short-token"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://chronolog.test") as http:
        first = {path: (await http.get(path, params={"limit": 2}, headers=auth)).json()
                 for path in ("/v1/schedules/s/runs", "/v1/runs")}
        for page in first.values():
            assert [r["runId"] for r in page["items"]] == ["r5", "r4"]

        await sqlite_log.append(records(topic, [tick("short", "s", at(55))], 0))
        await pr.run_until_caught_up(30)
        await pr.prune()  # now T0 + 55 s: r4 (finished at T0 + 41 s) goes
        assert await _runs(store) == {"r3", "r5"}

        for path, page in first.items():
            second = await http.get(path, params={"limit": 2, "after": page["nextCursor"]},
                                    headers=auth)
            assert second.status_code == 200, second.text
            assert [r["runId"] for r in second.json()["items"]] == ["r3"]
            assert second.json()["nextCursor"] is None
        gone = await http.get("/v1/runs/r4", headers=auth)
        assert gone.status_code == 404 and gone.json()["field"] == "runId"
        assert (await http.get("/v1/runs/r3", headers=auth)).status_code == 200


# ------------------------------------------------------------------ result objects


async def test_gc_removes_results_past_their_retention_and_the_api_answers_410(
    sqlite_log: Any, tmp_path: Path, module_dsn: str, stores: list[PostgresProjectionStore]
) -> None:
    """``chronolog gc`` (a real process) removes the object of a run finished longer ago
    than its tenant's result_retention before the log's newest event, keeps the one inside
    its window whatever its age on disk, and a GET of the expired run's result is 410 Gone
    naming result_retention; the kept one is served."""
    import subprocess

    import httpx
    import orjson

    from chronolog.api.app import create_app
    from chronolog.tenants import load_tenants
    from chronolog.workers.results import FilesystemResultStore

    from .conftest import CHRONOLOG

    results = FilesystemResultStore(tmp_path / "results")
    old_uri = await results.put("r-old", 1, 1, b"o" * 9000)
    new_uri = await results.put("r-new", 1, 1, b"n" * 9000)
    topic = sqlite_log.topics.events
    envs = [schedule("short", "s", at(0))]
    envs += run_history("short", "s", "r-old", "succeeded", at(0), at(80), old_uri)
    envs += run_history("short", "s", "r-new", "succeeded", at(0), at(95), new_uri)
    envs.sort(key=lambda e: e.at)
    envs.append(tick("short", "s", at(100)))  # the newest event: r-old finished 20 s before
    await sqlite_log.append(records(topic, envs, 0))
    tenants_file = tmp_path / "tenants.toml"
    tenants_file.write_text('[tenants.short]\ntokens = ["short-token"]\nretention = "60s"\n'
                            'result_retention = "10s"\n')

    gc = [CHRONOLOG, "gc", "--log", f"sqlite://{tmp_path / 'log.db'}", "--partitions", "2",
          "--results", str(tmp_path / "results"), "--grace", "1h", "--tenants", str(tenants_file)]
    dry = subprocess.run([*gc, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("scanned 2 staged objects: would delete 1 (1 past their "
                                 "run's result_retention, 0 of runs pruned from the log), "
                                 "kept 1 referenced"), dry.stdout
    assert len(await results.list()) == 2
    done = subprocess.run([*gc, "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)
    assert (report["expired"], report["deleted_uris"]) == (1, [old_uri])
    assert report["kept_referenced"] == 1
    assert {o.uri for o in await results.list()} == {new_uri}

    store = await open_store(module_dsn, stores)
    await Projector(sqlite_log, store).run_until_caught_up(30)
    app = create_app(None, store, load_tenants(tenants_file), retention=60.0)
    auth = {"Authorization": "Bearer short-token"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://chronolog.test") as http:
        gone = await http.get("/v1/runs/r-old/result", headers=auth)
        assert gone.status_code == 410, gone.text
        body = gone.json()
        assert (body["error"], body["field"]) == ("gone", "result_retention")
        assert "result_retention (10s after the run finished)" in body["message"]
        kept = await http.get("/v1/runs/r-new/result", headers=auth)
        assert kept.status_code == 200, kept.text
        assert kept.json()["uri"] == new_uri
        assert (await http.get("/v1/runs/r-nope/result", headers=auth)).status_code == 404
