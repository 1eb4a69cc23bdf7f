"""The indexes of runs as migrations 0010 and 0011 leave them (docs/design.md §9 "The read
model"), on a real PostgreSQL.

* migrations 0010 and 0011 on a populated read model: every row stays with every value of
  the columns it keeps, the open attempts are copied to open_attempts, no index of runs or
  attempts holds a column the publish sets, and the queries answer the same after them as
  before — a schedule's runs and the tenant's runs
  page by page through their cursors, with and without filters, each run's document (its
  start lateness computed as it is read, where it was a stored column), the READY runs no
  worker serves;
* on a realistic table (tens of thousands of runs, analyzed), the lists' queries — a
  schedule's runs, the tenant's runs, the newest keys — read an index of runs
  (runs_history, runs_by_tenant: an index scan backwards, or a bitmap scan of a few rows),
  never a sequential scan.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from chronolog.projections.migrate import load_migrations, migrate
from chronolog.projections.partitions import make_days
from chronolog.projections.project import FIRST_ATTEMPT, project_batch
from chronolog.queries import workers as wk
from chronolog.queries.read_model import ReadModel, RunQuery, run_document
from support.histories import run_history, schedule

from .pgdb import module_database, schema_store

pytestmark = pytest.mark.postgres

TOPIC = "chronolog.events"
D0 = date(2026, 3, 1)
T0 = datetime(2026, 3, 1, 6, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    yield from module_database(database_url, "test_rm_indexes")


async def _schema_before_0010(dsn: str) -> asyncpg.Pool:
    """A pool on a new schema migrated up to 0009 (the read model as it was before)."""
    schema = f"m_{uuid.uuid4().hex[:10]}"
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2,
                                     server_settings={"search_path": f'"{schema}"'})
    assert pool is not None
    async with pool.acquire() as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY, "
                           "name text NOT NULL, checksum text NOT NULL, "
                           "applied_at timestamptz NOT NULL DEFAULT now())")
        for mig in load_migrations():
            if mig.version <= 9:
                await conn.execute(mig.sql)
                await conn.execute("INSERT INTO schema_migrations VALUES ($1, $2, $3)",
                                   mig.version, mig.name, mig.checksum)
    return pool


def _history() -> list[Any]:
    """Two schedules of tenant t (and one of tenant u), runs in every state over two days:
    the first day in a day partition, the second in the default one; two runs of t share
    an instant (the cursor's run ID tie-break); the claimed runs of the first day were
    retried, those of the second were not."""
    envs: list[Any] = [schedule("t", "a", T0), schedule("t", "b", T0), schedule("u", "a", T0)]
    outcomes = ("succeeded", "ready", "dead", "leased", "cancelled", "skipped", "succeeded")
    n = 0
    for day in (0, 1):
        for i, outcome in enumerate(outcomes):
            start = T0 + timedelta(days=day, minutes=10 * i)
            for sid in ("a", "b"):
                n += 1
                envs += run_history("t", sid, f"r{n:03d}", outcome, start, start + MINUTE,
                                    retried=day == 0)
            n += 1
            envs += run_history("u", "a", f"r{n:03d}", outcome, start, start + MINUTE,
                                retried=day == 0)
    return sorted(envs, key=lambda e: e.at)


async def _project_as_before(dsn: str, pool: asyncpg.Pool, envs: list[Any]) -> dict[str, Any]:
    """The rows the projector of before 0010 wrote for ``envs``, in ``pool``'s schema: the
    projection of today in a schema of its own, copied with the columns it no longer writes
    as that projector filled them (a run's materialized_at: its first write; an attempt's
    tenant and schedule ID: its run's; its updated_at: its last event's time; an attempt 1:
    a row of attempts). Returns what the queries answer on the projection of today."""
    store = await schema_store(dsn)
    try:
        await store.apply(project_batch(envs), {(TOPIC, 0): (0, len(envs))},
                          last_event_at={(TOPIC, 0): envs[-1].at})
        new = await store.pool.fetchval("SELECT current_schema()")
        answers = await _answers(ReadModel(store.pool, TOPIC))
    finally:
        await store.close()

    async def columns(table: str) -> str:
        """The columns of ``table`` both schemas have."""
        return ", ".join(r[0] for r in await pool.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 "
            "AND table_name = $2 AND is_generated = 'NEVER' AND column_name IN ("
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = $2) "
            "ORDER BY ordinal_position", new, table))

    for table in ("schedules", "effects", "projection_offsets", "ready_runs", "run_counters"):
        await pool.execute(f'INSERT INTO {table} SELECT * FROM "{new}".{table}')
    cols = await columns("runs")
    await pool.execute(f"INSERT INTO runs ({cols}, materialized_at) "
                       f'SELECT {cols}, updated_at FROM "{new}".runs')
    cols = await columns("attempts")
    await pool.execute(
        f"INSERT INTO attempts ({cols}, tenant, schedule_id, updated_at) "
        f"SELECT {', '.join('a.' + c for c in cols.split(', '))}, r.tenant, r.schedule_id, "
        f"COALESCE(a.finished_at, a.claimed_at) "
        f'FROM "{new}".attempts AS a JOIN "{new}".runs AS r ON r.run_id = a.run_id')
    # an attempt 1 was a row of attempts too (today: columns of its run's row, 0012)
    await pool.execute(
        "INSERT INTO attempts (run_id, attempt, scheduled_at, fence, worker_id, claimed_at, "
        "lease_until, outcome, error_class, error, finished_at, tenant, schedule_id, "
        "updated_at) SELECT run_id, 1, scheduled_at, first_fence, first_worker_id, started_at, "
        "first_lease_until, first_outcome, first_error_class, first_error, first_finished_at, "
        "tenant, schedule_id, COALESCE(first_finished_at, started_at) "
        f'FROM "{new}".runs WHERE first_fence IS NOT NULL')
    return answers


async def _answers(rm: ReadModel) -> dict[str, Any]:
    """What the queries answer, every list read two rows a page through its cursor."""
    out: dict[str, Any] = {}

    async def pages(fetch: Any, newest: Any) -> list[tuple[datetime, str, str]]:
        bound = await newest()
        got: list[tuple[datetime, str, str]] = []
        last = None
        while bound is not None:
            rows = await fetch(bound, last)
            got += [(r["scheduled_at"], r["run_id"], r["state"]) for r in rows]
            if len(rows) < 2:
                break
            last = (rows[-1]["scheduled_at"], rows[-1]["run_id"])
        return got

    for sid in ("a", "b"):
        for states in (None, ["SUCCEEDED", "DEAD"]):
            out[f"history {sid} {states}"] = await pages(
                lambda b, last, sid=sid, states=states: rm.runs_page(
                    "t", sid, b, last, states, 2),
                lambda sid=sid: rm.newest_run_key("t", sid))
    for q in (RunQuery(), RunQuery(states=("READY", "LEASED")), RunQuery(schedule_id="b"),
              RunQuery(job_type="echo", since=T0 + 30 * MINUTE,
                       until=T0 + timedelta(days=1, minutes=30))):
        out[f"tenant {q}"] = await pages(
            lambda b, last, q=q: rm.run_list("t", q, b, last, 2),
            lambda: rm.newest_tenant_run_key("t"))
    ids = [r["run_id"] for r in await rm.pool.fetch("SELECT run_id FROM runs ORDER BY run_id")]
    out["documents"] = [await run_document(rm, tenant, rid) for rid in ids for tenant in "tu"]
    out["waiting"] = await wk.waiting_runs(rm.pool, limit=50)
    out["waiting counts"] = await wk.waiting_counts(rm.pool)
    return out


async def test_migrations_0010_to_0012_keep_every_row_and_the_queries_answer_the_same(
    module_dsn: str,
) -> None:
    pool = await _schema_before_0010(module_dsn)
    try:
        await make_days(pool, [D0])  # the second day is left to the default partition
        # the queries of today cannot read the read model of before 0012: what they answer
        # after the migrations is compared with their answers on a fresh projection
        before = await _project_as_before(module_dsn, pool, _history())
        rm = ReadModel(pool, TOPIC)
        runs = [dict(r) for r in await pool.fetch("SELECT * FROM runs ORDER BY run_id")]
        attempts = [dict(r) for r in await pool.fetch(
            "SELECT * FROM attempts ORDER BY run_id, attempt")]
        assert len(before["history a None"]) == 14 and before["waiting"]  # a real read model

        async with pool.acquire() as conn:
            assert await migrate(conn) == [10, 11, 12, 13, 14, 15]

        # every value of the columns kept; the dropped ones nothing read (and 0013's
        # permit_wait and 0015's exclusion, added empty: no run of before them waits for a
        # permit or was excluded by a calendar)
        first = frozenset(FIRST_ATTEMPT.values()) | {"permit_wait", "exclusion"}
        assert all(r["permit_wait"] is None and r["exclusion"] is None for r in await
                   pool.fetch("SELECT permit_wait, exclusion FROM runs"))
        migrated = [dict(r) for r in await pool.fetch("SELECT * FROM runs ORDER BY run_id")]
        assert [{k: v for k, v in r.items() if k not in first} for r in migrated] == [
            {k: v for k, v in r.items() if k not in ("lateness_ms", "materialized_at")}
            for r in runs]
        # 0012: the attempts 1 still open are columns of their runs' rows now
        moved = {a["run_id"] for a in attempts if a["attempt"] == 1 and a["outcome"] is None}
        assert moved and {r["run_id"] for r in migrated if r["first_fence"]} == moved
        assert [dict(r) for r in await pool.fetch(
            "SELECT * FROM attempts ORDER BY run_id, attempt")] == [
            {k: v for k, v in r.items() if k not in ("tenant", "schedule_id", "updated_at")}
            for r in attempts if not (r["attempt"] == 1 and r["run_id"] in moved)]
        assert await _answers(rm) == before  # the run documents' attempts included
        assert {d["latenessMs"] for d in before["documents"] if d} > {None}  # computed alike
        indexes = {r[0] for r in await pool.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'runs'")}
        # 0011: no index of runs or attempts holds a column the publish sets
        assert indexes == {"runs_pkey", "runs_history", "runs_by_tenant"}
        assert {r[0] for r in await pool.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'attempts'")} == {"attempts_pkey"}
        # the open attempts (the leased runs') converted into open_attempts, with their leases
        open_attempts = {(a["run_id"], a["attempt"], a["lease_until"]) for a in attempts
                         if a["outcome"] is None}
        # the leased, dead and cancelled runs of each schedule on both days: no event ended
        # their attempt (as attempts_open held them)
        assert len(open_attempts) == 18
        assert {tuple(r) for r in await pool.fetch(
            "SELECT run_id, attempt, lease_until FROM open_attempts")} == open_attempts
    finally:
        await pool.close()


class _Explaining:
    """A pool whose fetches answer the plan of their statement (a ReadModel's queries are
    explained exactly as they are sent)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.plans: list[str] = []

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        self.plans.append("\n".join(r[0] for r in await self.pool.fetch("EXPLAIN " + sql, *args)))
        return []

    async def fetchrow(self, sql: str, *args: Any) -> None:
        await self.fetch(sql, *args)


async def test_the_run_lists_read_an_index_of_runs(module_dsn: str) -> None:
    store = await schema_store(module_dsn)
    try:
        pool = store.pool
        await make_days(pool, [D0, D0 + timedelta(days=1)])
        # 40,000 runs of 400 schedules of 4 tenants over two days, analyzed
        await pool.execute(
            "INSERT INTO runs (run_id, tenant, schedule_id, scheduled_at, revision, trigger, "
            "state, attempt, job_type, updated_at, finished_at) "
            "SELECT 'r' || lpad(i::text, 8, '0'), 't' || (i % 4), 's' || (i % 400), "
            "$1::timestamptz + (i / 400) * interval '25 minutes', 1, 'schedule', "
            "CASE WHEN i % 10 = 0 THEN 'DEAD' ELSE 'SUCCEEDED' END, 1, 'echo', "
            "$1::timestamptz, $1::timestamptz FROM generate_series(1, 40000) AS i", T0)
        await pool.execute("ANALYZE runs")
        rm = ReadModel(_Explaining(pool), TOPIC)  # type: ignore[arg-type]
        bound = (T0 + timedelta(days=1), "r99999999")
        last = (T0 + timedelta(hours=20), "r00001234")
        await rm.runs_page("t1", "s1", bound, None, None, 50)
        await rm.runs_page("t1", "s1", bound, last, ["SUCCEEDED"], 50)
        await rm.run_list("t1", RunQuery(), bound, None, 100)
        await rm.run_list("t1", RunQuery(states=("DEAD",)), bound, last, 100)
        await rm.newest_run_key("t1", "s1")
        await rm.newest_tenant_run_key("t1")
        assert len(rm.pool.plans) == 6  # type: ignore[attr-defined]
        expected = ["runs_history"] * 2 + ["runs_by_tenant"] * 2 + [
            "runs_history", "runs_by_tenant"]
        for plan, index in zip(rm.pool.plans, expected, strict=True):  # type: ignore[attr-defined]
            assert "Seq Scan on runs_p" not in plan, plan  # (the empty default: no pages)
            # every partition's index is named <partition>_<columns>_idx: the parent's
            # columns say which it is
            name = {"runs_history": "tenant_schedule_id_scheduled_at_idx",
                    "runs_by_tenant": "tenant_scheduled_at_run_id_idx"}[index]
            assert name in plan, plan
    finally:
        await store.close()
