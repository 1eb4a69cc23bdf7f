"""PostgresProjectionStore against a real PostgreSQL (``CHRONOLOG_TEST_DATABASE_URL``).

The module gets its own fresh database (created here, dropped at the end), so it never sees
other modules' rows; inside the module each test uses its own projection name and row keys.
Migration tests that need an empty database create one more for themselves.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from chronolog.projections.migrate import REWORDED, MigrationError, load_migrations, migrate
from chronolog.projections.store import (
    TABLES,
    First,
    OffsetConflict,
    PostgresProjectionStore,
    RowChanges,
)
from chronolog.queries.read_model import LATENESS_MS

pytestmark = pytest.mark.postgres

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
EV = "chronolog.events"


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


async def _create_db(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_db(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def module_dsn(database_url: str) -> Iterator[str]:
    """A fresh database for this module, migrated once."""
    name = f"test_store_{uuid.uuid4().hex[:10]}"
    asyncio.run(_create_db(database_url, name))
    dsn = _with_database(database_url, name)
    try:
        yield dsn
    finally:
        asyncio.run(_drop_db(database_url, name))


@asynccontextmanager
async def _fresh_db(database_url: str) -> AsyncIterator[str]:
    name = f"test_mig_{uuid.uuid4().hex[:10]}"
    await _create_db(database_url, name)
    try:
        yield _with_database(database_url, name)
    finally:
        await _drop_db(database_url, name)


@pytest.fixture
async def store(module_dsn: str) -> AsyncIterator[PostgresProjectionStore]:
    s = await PostgresProjectionStore.connect(module_dsn, projection=f"p-{uuid.uuid4().hex[:8]}")
    await s.migrate()
    try:
        yield s
    finally:
        await s.close()


def _uid(prefix: str = "r") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def _new_run(changes: RowChanges, run_id: str, **extra: Any) -> RowChanges:
    cols: dict[str, Any] = dict(
        tenant="acme", schedule_id="nightly", scheduled_at=T0, due_at=T0 + timedelta(seconds=2),
        revision=1, trigger="schedule", state="READY", job_type="report", params={"a": 1},
        ready_at=T0, updated_at=T0,
    )
    cols.update(extra)
    return changes.set("runs", (run_id,), **cols)


async def _run_row(store: PostgresProjectionStore, run_id: str) -> asyncpg.Record | None:
    return await store.pool.fetchrow(
        f"SELECT *, {LATENESS_MS} AS lateness_ms FROM runs WHERE run_id = $1", run_id)


# ------------------------------------------------------------------ migrations


async def test_migrations_apply_once_and_are_idempotent(database_url: str) -> None:
    async with _fresh_db(database_url) as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            versions = [m.version for m in load_migrations()]
            assert versions and versions[0] == 1
            assert await migrate(conn) == versions
            assert await migrate(conn) == []
            recorded = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
            assert [r["version"] for r in recorded] == versions
        finally:
            await conn.close()


async def test_concurrent_starters_do_not_race(database_url: str) -> None:
    async with _fresh_db(database_url) as dsn:
        conns = [await asyncpg.connect(dsn) for _ in range(4)]
        try:
            results = await asyncio.gather(*(migrate(c) for c in conns))
        finally:
            for c in conns:
                await c.close()
        applied = [r for r in results if r]
        assert len(applied) == 1, results  # one applied everything, the others found it done
        assert applied[0] == [m.version for m in load_migrations()]


async def test_a_migration_whose_comment_was_reworded_is_accepted_and_recorded_anew(
    database_url: str
) -> None:
    async with _fresh_db(database_url) as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await migrate(conn)
            [old] = REWORDED[1]
            await conn.execute("UPDATE schema_migrations SET checksum = $1 WHERE version = 1", old)
            assert await migrate(conn) == []  # nothing applied again, nothing refused
            now = await conn.fetchval("SELECT checksum FROM schema_migrations WHERE version = 1")
        finally:
            await conn.close()
    assert now == load_migrations()[0].checksum != old


async def test_an_edited_applied_migration_is_refused(database_url: str) -> None:
    async with _fresh_db(database_url) as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await migrate(conn)
            await conn.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = 1")
            with pytest.raises(MigrationError, match="changed after it was applied"):
                await migrate(conn)
            await conn.execute("INSERT INTO schema_migrations VALUES (9999, 'future', 'y')")
            with pytest.raises(MigrationError, match="does not know"):
                await migrate(conn)
        finally:
            await conn.close()


async def test_table_specs_match_the_migrated_schema(store: PostgresProjectionStore) -> None:
    """The store's idea of each table (columns, types, required) is the database's."""
    for spec in TABLES.values():
        rows = await store.pool.fetch(
            """
            SELECT column_name, udt_name, is_nullable, column_default, is_generated
              FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1
            """,
            spec.name,
        )
        assert rows, spec.name
        writable = {r["column_name"]: r for r in rows if r["is_generated"] == "NEVER"}
        assert set(writable) == set(spec.types) | set(spec.derived), spec.name
        udt = {"timestamptz": "timestamptz", "text": "text", "bigint": "int8",
               "integer": "int4", "boolean": "bool", "jsonb": "jsonb"}
        for col, pg_type in spec.types.items():  # (a derived column is the store's SQL)
            assert writable[col]["udt_name"] == udt[pg_type], (spec.name, col)
        required = {
            c for c, r in writable.items()
            if r["is_nullable"] == "NO" and r["column_default"] is None and c not in spec.key
        }
        assert required == set(spec.required) | set(spec.derived), spec.name
        pk = await store.pool.fetch(
            """
            SELECT a.attname FROM pg_index i
              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
             WHERE i.indrelid = $1::regclass AND i.indisprimary
             ORDER BY array_position(i.indkey, a.attnum)
            """,
            spec.name,
        )
        # a partitioned table's primary key holds its partition column after the key
        partition = (spec.partition,) if spec.partition else ()
        assert tuple(r["attname"] for r in pk) == spec.key + partition, spec.name


# ------------------------------------------------------------------ apply and offsets


async def test_apply_writes_rows_and_offsets(store: PostgresProjectionStore) -> None:
    run_id = _uid()
    changes = _new_run(RowChanges(), run_id)
    changes.set("attempts", (run_id, 1), fence=7, worker_id="w1", claimed_at=T0,
                lease_until=T0 + timedelta(seconds=30))
    result = await store.apply(
        changes, {(EV, 0): (0, 10), (EV, 3): (0, 4)}, last_event_at={(EV, 0): T0}
    )
    assert result.rows == {"runs": 1, "attempts": 1} and not result.missing
    assert await store.offsets() == {(EV, 0): 10, (EV, 3): 4}
    row = await _run_row(store, run_id)
    assert row is not None and row["state"] == "READY" and row["attempt"] == 0
    assert row["cancellation_requested"] is False  # column defaults apply on insert
    stored = await store.pool.fetchval(
        "SELECT last_event_at FROM projection_offsets WHERE projection = $1 AND partition = 0",
        store.projection,
    )
    assert stored == T0


async def test_offset_conflict_rolls_back_everything(store: PostgresProjectionStore) -> None:
    first, second = _uid(), _uid()
    await store.apply(_new_run(RowChanges(), first), {(EV, 0): (0, 5), (EV, 1): (0, 2)})

    # partition 0 is right, partition 1 is stale: nothing of the batch may land
    batch = _new_run(RowChanges(), second)
    batch.set("runs", (first,), state="SUCCEEDED", updated_at=T0 + timedelta(minutes=1))
    with pytest.raises(OffsetConflict) as info:
        await store.apply(batch, {(EV, 0): (5, 9), (EV, 1): (1, 3)})
    assert info.value.expected == {(EV, 0): 5, (EV, 1): 1}
    assert info.value.actual[(EV, 1)] == 2
    assert await _run_row(store, second) is None
    row = await _run_row(store, first)
    assert row is not None and row["state"] == "READY"
    assert await store.offsets() == {(EV, 0): 5, (EV, 1): 2}

    # a partition never stored counts as 0
    with pytest.raises(OffsetConflict):
        await store.apply(batch, {(EV, 7): (3, 4)})
    assert await store.offsets() == {(EV, 0): 5, (EV, 1): 2}

    # with the right expectations the same batch applies
    await store.apply(batch, {(EV, 0): (5, 9), (EV, 1): (2, 3)})
    assert await store.offsets() == {(EV, 0): 9, (EV, 1): 3}
    assert (await _run_row(store, second)) is not None


async def test_offsets_must_move_forward(store: PostgresProjectionStore) -> None:
    with pytest.raises(ValueError):
        await store.apply(RowChanges(), {(EV, 0): (5, 4)})


async def test_two_projectors_racing_one_wins(module_dsn: str) -> None:
    name = f"p-{uuid.uuid4().hex[:8]}"
    a = await PostgresProjectionStore.connect(module_dsn, projection=name)
    b = await PostgresProjectionStore.connect(module_dsn, projection=name)
    try:
        await a.migrate()
        ra, rb = _uid(), _uid()
        results = await asyncio.gather(
            a.apply(_new_run(RowChanges(), ra), {(EV, 0): (0, 10)}),
            b.apply(_new_run(RowChanges(), rb), {(EV, 0): (0, 10)}),
            return_exceptions=True,
        )
        conflicts = [r for r in results if isinstance(r, OffsetConflict)]
        assert len(conflicts) == 1, results
        assert not [r for r in results if isinstance(r, BaseException) and r not in conflicts]
        present = [await a.pool.fetchval("SELECT count(*) FROM runs WHERE run_id = $1", r)
                   for r in (ra, rb)]
        assert sorted(present) == [0, 1]  # exactly the winner's row
        assert await a.offsets() == {(EV, 0): 10}
    finally:
        await a.close()
        await b.close()


# ------------------------------------------------------------------ merge semantics


async def test_partial_change_keeps_the_other_columns(store: PostgresProjectionStore) -> None:
    run_id = _uid()
    await store.apply(_new_run(RowChanges(), run_id, started_at=First(T0)), {})
    before = await _run_row(store, run_id)
    assert before is not None

    # like ResultPublished: a few columns of an existing row
    later = T0 + timedelta(minutes=5)
    publish = RowChanges().set(
        "runs", (run_id,), state="SUCCEEDED", attempt=1, result_checksum="sha256:ab",
        result_size=12, result_inline={"ok": True}, finished_at=later, updated_at=later,
    )
    result = await store.apply(publish, {})
    assert result.rows == {"runs": 1} and not result.missing
    after = await _run_row(store, run_id)
    assert after is not None
    for col in ("tenant", "schedule_id", "scheduled_at", "due_at", "revision", "trigger",
                "job_type", "params", "ready_at", "started_at"):
        assert after[col] == before[col], col
    assert after["state"] == "SUCCEEDED" and after["result_size"] == 12
    assert after["result_inline"] == '{"ok": true}'


async def test_open_attempts_follow_the_attempts_and_the_publish_touches_no_index(
    store: PostgresProjectionStore,
) -> None:
    """An attempt is in open_attempts (migration 0011) with its lease end from its claim
    until it has an outcome, kept in the batch's transaction; the publish, which sets the
    run's finished_at and the attempt's outcome, changes no indexed column of runs or
    attempts: both are HOT updates when the row's page has room."""
    run_id = _uid()
    lease = T0 + timedelta(minutes=1)
    await store.apply(_new_run(RowChanges(), run_id, state="LEASED", attempt=1).set(
        "attempts", (run_id, 1), fence=1, worker_id="w", claimed_at=T0, lease_until=lease,
        outcome=None), {})
    opened = "SELECT attempt, lease_until FROM open_attempts WHERE run_id = $1"
    assert [tuple(r) for r in await store.pool.fetch(opened, run_id)] == [(1, lease)]
    later = lease + timedelta(minutes=1)  # a heartbeat moves the lease
    await store.apply(RowChanges().set("attempts", (run_id, 1), lease_until=later), {})
    assert [tuple(r) for r in await store.pool.fetch(opened, run_id)] == [(1, later)]

    publish = RowChanges().set(
        "runs", (run_id,), state="SUCCEEDED", attempt=1, result_checksum="sha256:ab",
        result_size=1, result_attempt=1, finished_at=later, updated_at=later).set(
        "attempts", (run_id, 1), outcome="succeeded", finished_at=later)
    await store.apply(publish, {})
    assert await store.pool.fetch(opened, run_id) == []
    # what an index of runs or attempts (or of any of their partitions) holds or names in
    # its predicate: none of the columns the publish writes
    for table, key in (("runs", (run_id,)), ("attempts", (run_id, 1))):
        indexed = await store.pool.fetch(
            "SELECT i.indexrelid::regclass::text AS index, a.attname, "
            "pg_get_expr(i.indpred, i.indrelid) AS predicate "
            "FROM pg_partition_tree($1::regclass) t JOIN pg_index i ON i.indrelid = t.relid "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)",
            table)
        written = set(publish.table(table)[key])
        assert indexed and "finished_at" in written
        for r in indexed:
            assert r["attname"] not in written and r["predicate"] is None, r


async def test_open_attempts_follow_a_first_attempt_in_its_run_row(
    store: PostgresProjectionStore,
) -> None:
    """An attempt 1 is columns of its run's row (migration 0012): it is in open_attempts
    from its claim until its outcome as a row of attempts is, and its publish changes no
    indexed column of runs either."""
    run_id = _uid()
    lease = T0 + timedelta(minutes=1)
    await store.apply(_new_run(RowChanges(), run_id, state="LEASED", attempt=1).set(
        "runs", (run_id,), first_fence=1, first_worker_id="w", first_lease_until=lease,
        first_outcome=None), {})
    opened = "SELECT attempt, lease_until FROM open_attempts WHERE run_id = $1"
    assert [tuple(r) for r in await store.pool.fetch(opened, run_id)] == [(1, lease)]
    later = lease + timedelta(minutes=1)
    await store.apply(RowChanges().set("runs", (run_id,), first_lease_until=later), {})
    assert [tuple(r) for r in await store.pool.fetch(opened, run_id)] == [(1, later)]
    publish = RowChanges().set(
        "runs", (run_id,), state="SUCCEEDED", first_outcome="succeeded",
        first_finished_at=later, finished_at=later, updated_at=later)
    await store.apply(publish, {})
    assert await store.pool.fetch(opened, run_id) == []
    indexed = {r[0] for r in await store.pool.fetch(
        "SELECT a.attname FROM pg_partition_tree('runs'::regclass) t "
        "JOIN pg_index i ON i.indrelid = t.relid "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)")}
    assert indexed and not indexed & set(publish.runs[(run_id,)])
    assert await store.pool.fetchval("SELECT count(*) FROM attempts WHERE run_id = $1",
                                     run_id) == 0


async def test_none_clears_and_first_only_fills(store: PostgresProjectionStore) -> None:
    run_id = _uid()
    await store.apply(_new_run(RowChanges(), run_id, started_at=First(T0),
                               dead_reason="max_attempts"), {})
    later = T0 + timedelta(hours=1)
    await store.apply(
        RowChanges().set("runs", (run_id,), dead_reason=None, started_at=First(later),
                         finished_at=First(later), updated_at=later),
        {},
    )
    row = await _run_row(store, run_id)
    assert row is not None
    assert row["dead_reason"] is None  # an explicit None sets NULL
    assert row["started_at"] == T0  # First does not overwrite a value
    assert row["finished_at"] == later  # First fills a NULL
    assert row["lateness_ms"] == -2000  # as the run is read: first start minus due_at


async def test_a_partial_change_to_a_missing_row_is_reported_not_invented(
    store: PostgresProjectionStore,
) -> None:
    ghost = _uid()
    result = await store.apply(
        RowChanges().set("runs", (ghost,), state="SUCCEEDED", updated_at=T0), {(EV, 0): (0, 1)}
    )
    assert result.missing == {"runs": [(ghost,)]}
    assert await _run_row(store, ghost) is None
    assert await store.offsets() == {(EV, 0): 1}  # the batch still commits


async def test_a_batch_touching_one_run_many_times_is_one_row_write(
    store: PostgresProjectionStore,
) -> None:
    run_id = _uid()
    batch = RowChanges.fold(
        [_new_run(RowChanges(), run_id, state="PENDING", attempt=0)]
        + [
            RowChanges().set("runs", (run_id,), attempt=i, state="LEASED" if i % 2 else "READY",
                             started_at=First(T0 + timedelta(seconds=i)),
                             updated_at=T0 + timedelta(seconds=i))
            for i in range(1, 1000)
        ]
    )
    assert batch.row_count() == 1
    result = await store.apply(batch, {(EV, 0): (0, 1000)})
    assert result.statements == 1 and result.rows == {"runs": 1}
    row = await _run_row(store, run_id)
    assert row is not None
    assert row["attempt"] == 999 and row["state"] == "LEASED"
    assert row["started_at"] == T0 + timedelta(seconds=1)  # the first start in the batch
    assert row["job_type"] == "report"  # from the creating change, kept through the merge


async def test_many_rows_are_one_statement_per_column_set(store: PostgresProjectionStore) -> None:
    ids = [_uid() for _ in range(500)]
    create = RowChanges.fold(_new_run(RowChanges(), r) for r in ids)
    result = await store.apply(create, {})
    assert result.statements == 1 and result.rows == {"runs": 500}

    # two kinds of partial change (two column sets) plus a new row: three statements
    mixed = RowChanges()
    for i, r in enumerate(ids):
        if i % 2:
            mixed.set("runs", (r,), state="CANCELLED", finished_at=T0, updated_at=T0)
        else:
            mixed.set("runs", (r,), cancellation_requested=True, updated_at=T0)
    _new_run(mixed, _uid())
    result = await store.apply(mixed, {})
    assert result.statements == 3 and result.rows == {"runs": 501}
    counts = await store.pool.fetchrow(
        """
        SELECT count(*) FILTER (WHERE state = 'CANCELLED') AS cancelled,
               count(*) FILTER (WHERE cancellation_requested) AS requested,
               count(*) FILTER (WHERE state = 'READY' AND NOT cancellation_requested) AS other
          FROM runs WHERE run_id = ANY($1::text[])
        """,
        ids,
    )
    assert dict(counts) == {"cancelled": 250, "requested": 250, "other": 0}


async def test_all_tables_round_trip(store: PostgresProjectionStore) -> None:
    tenant, sid = "acme", _uid("s")
    run_id, effect_id = _uid(), _uid("send")
    c = RowChanges()
    c.set("schedules", (tenant, sid), revision=1, state="ACTIVE", spec={"cron": "0 * * * *"},
          next_run_at=T0, next_due_at=T0, created_at=T0, updated_at=T0, last_event_at=T0)
    c.set("effects", (effect_id,), tenant=tenant, schedule_id=sid, run_id=run_id, kind="webhook",
          state="INTENDED", attempts=1, checksum="c", config={"url": "http://x"},
          created_at=First(T0), updated_at=T0)
    await store.apply(c, {})
    later = T0 + timedelta(hours=1)
    c2 = RowChanges()
    c2.set("schedules", (tenant, sid), state="PAUSED", paused_at=later, updated_at=later,
           last_event_at=later)
    c2.set("effects", (effect_id,), state="SUCCEEDED", evidence={"status": 200}, updated_at=later)
    await store.apply(c2, {})
    sched = await store.pool.fetchrow(
        "SELECT * FROM schedules WHERE tenant = $1 AND schedule_id = $2", tenant, sid
    )
    assert sched is not None
    assert (sched["state"], sched["revision"], sched["next_run_at"]) == ("PAUSED", 1, T0)
    assert sched["created_at"] == T0 and sched["last_event_at"] == later
    eff = await store.pool.fetchrow("SELECT * FROM effects WHERE effect_id = $1", effect_id)
    assert eff is not None
    assert (eff["state"], eff["kind"], eff["attempts"]) == ("SUCCEEDED", "webhook", 1)
    assert eff["evidence"] == '{"status": 200}'


# ------------------------------------------------------------------ projecting real events


def _lifecycle_events() -> list[Any]:
    """A schedule's log: create, three runs (success, retry then dead then redriven and
    succeeded with an effect, skipped range), pause, revise, delete."""
    from chronolog.domain import messages as m

    spec = m.ScheduleSpec(every=60, job=m.JobSpec(type="report", params={"x": 1}))
    t, sid = "acme", "every-minute"
    out: list[m.EventEnvelope] = []

    def emit(payload: Any, seconds: float) -> None:
        n = len(out)
        out.append(m.EventEnvelope(event_id=f"c{n}.0", type=payload.type, key=f"{t}/{sid}",
                                   tenant=t, schedule_id=sid, at=T0 + timedelta(seconds=seconds),
                                   causation_id=f"c{n}", payload=payload))

    def at(s: float) -> datetime:
        return T0 + timedelta(seconds=s)

    emit(m.ScheduleCreated(revision=1, spec=spec, created_at=T0, anchor=T0,
                           next_run_at=at(60), next_due_at=at(60)), 0)
    for i, rid in enumerate(("r_a", "r_b")):
        s = 60 * (i + 1)
        emit(m.OccurrenceMaterialized(run_id=rid, scheduled_at=at(s), due_at=at(s), revision=1,
                                      job=spec.job, state="READY", sequence=i + 1,
                                      next_run_at=at(s + 60), next_due_at=at(s + 60)), s)
        emit(m.FenceAdvanced(fence=i * 10 + 1, run_id=rid, reason="claim"), s + 1)
        emit(m.AttemptClaimed(run_id=rid, attempt=1, fence=i * 10 + 1, worker_id="w1",
                              claimed_at=at(s + 1.5), lease_until=at(s + 31)), s + 1.5)
    emit(m.LeaseExtended(run_id="r_a", attempt=1, fence=1, lease_until=at(101)), 70)
    emit(m.ResultPublished(run_id="r_a", attempt=1, fence=1, worker_id="w1", checksum="c-a",
                           size=3, inline=[1, 2, 3], finished_at=at(75)), 75)
    emit(m.AttemptFailed(run_id="r_b", attempt=1, fence=11, worker_id="w1",
                         error_class="transient", message="boom"), 130)
    emit(m.RetryScheduled(run_id="r_b", attempt=2, retry_at=at(140)), 130)
    emit(m.OccurrenceReady(run_id="r_b", attempt=2), 140)
    emit(m.AttemptClaimed(run_id="r_b", attempt=2, fence=12, worker_id="w2",
                          claimed_at=at(141), lease_until=at(171)), 141)
    emit(m.LeaseExpired(run_id="r_b", attempt=2, fence=12, lease_until=at(171)), 172)
    emit(m.OccurrenceDeadLettered(run_id="r_b", reason="max_attempts", message="2 used"), 172)
    emit(m.OccurrenceRedriven(run_id="r_b", attempt=3, by="ops"), 200)
    emit(m.AttemptClaimed(run_id="r_b", attempt=3, fence=13, worker_id="w1",
                          claimed_at=at(201), lease_until=at(231)), 201)
    emit(m.CompletionRejected(run_id="r_b", attempt=2, fence=12, current_fence=13,
                              worker_id="w2", checksum="old", reason="stale_fence"), 202)
    emit(m.ResultPublished(run_id="r_b", attempt=3, fence=13, worker_id="w1", checksum="c-b",
                           size=9, uri="file:///r_b/3", finished_at=at(210)), 210)
    emit(m.EffectIntended(effect_id="send-r_b", run_id="r_b", kind="webhook",
                          config={"url": "http://x"}, checksum="c-b"), 210)
    emit(m.EffectUncertain(effect_id="send-r_b", run_id="r_b", evidence={"err": "reset"}), 215)
    emit(m.ReconciliationRequired(run_id="r_b", reason="uncertain", effect_id="send-r_b"), 215)
    emit(m.ReconciliationResolved(run_id="r_b", decision="delivered", by="ops",
                                  effect_id="send-r_b"), 300)
    emit(m.SchedulePaused(reason="holiday", paused_at=at(310)), 310)
    emit(m.OccurrenceSkipped(run_id="r_c", scheduled_at=at(360), reason="paused",
                             through=at(600), count=5, revision=1, next_run_at=at(660),
                             next_due_at=at(660)), 610)
    emit(m.ScheduleResumed(resumed_at=at(610), next_run_at=at(660), next_due_at=at(660)), 610)
    emit(m.ScheduleRevised(revision=2, spec=spec, anchor=T0, next_run_at=at(660),
                           next_due_at=at(661)), 620)
    emit(m.ScheduleDeleted(), 700)
    return out


async def _dump(store: PostgresProjectionStore) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for spec in TABLES.values():
        order = ", ".join(spec.key)
        rows = await store.pool.fetch(f"SELECT * FROM {spec.name} ORDER BY {order}")
        out[spec.name] = [dict(r) for r in rows]
    return out


async def _project_in_batches(dsn: str, events: list[Any], size: int) -> dict[str, Any]:
    from chronolog.projections.project import project_batch

    async with await PostgresProjectionStore.connect(dsn) as store:
        await store.migrate()
        for start in range(0, len(events), size):
            chunk = events[start:start + size]
            result = await store.apply(
                project_batch(chunk), {(EV, 0): (start, start + len(chunk))},
                last_event_at={(EV, 0): chunk[-1].at},
            )
            assert not result.missing
        assert await store.offsets() == {(EV, 0): len(events)}
        return await _dump(store)


async def test_any_batching_of_the_log_gives_the_same_tables(database_url: str) -> None:
    """Per-event, chunked and whole-log batches agree row for row (the fold is right)."""
    events = _lifecycle_events()
    dumps = []
    for size in (1, 4, len(events)):
        async with _fresh_db(database_url) as dsn:
            dumps.append(await _project_in_batches(dsn, events, size))
    assert dumps[0] == dumps[1] == dumps[2]

    tables = dumps[0]
    (sched,) = tables["schedules"]
    assert (sched["state"], sched["revision"], sched["fence"]) == ("DELETED", 2, 11)
    assert sched["next_run_at"] is None and sched["pause_reason"] is None  # resumed
    runs = {r["run_id"]: r for r in tables["runs"]}
    a, b, c = runs["r_a"], runs["r_b"], runs["r_c"]
    assert (a["state"], a["attempt"], a["result_checksum"], a["started_at"] - a["due_at"]) == (
        "SUCCEEDED", 1, "c-a", timedelta(milliseconds=1500))
    assert a["result_inline"] == "[1, 2, 3]" and a["job_type"] == "report"
    assert (b["state"], b["attempt"], b["result_attempt"], b["result_uri"]) == (
        "SUCCEEDED", 3, 3, "file:///r_b/3")
    assert b["started_at"] == T0 + timedelta(seconds=121.5)  # the first claim, kept
    assert b["dead_reason"] is None and b["last_error"] == "boom"
    assert b["finished_at"] == T0 + timedelta(seconds=210)
    assert (c["state"], c["skipped_reason"], c["skipped_count"]) == ("SKIPPED", "paused", 5)
    # attempt 1 in its run's row, the later ones rows of attempts (migration 0012)
    attempts = {(r["run_id"], r["attempt"]): r["outcome"] for r in tables["attempts"]}
    assert attempts == {("r_b", 2): "lease_expired", ("r_b", 3): "succeeded"}
    assert (a["first_outcome"], b["first_outcome"], c["first_outcome"]) == (
        "succeeded", "failed", None)
    assert b["first_error"] == "boom" and b["first_finished_at"] is not None
    (effect,) = tables["effects"]
    assert (effect["state"], effect["kind"], effect["evidence"]) == (
        "SUCCEEDED", "webhook", '{"err": "reset"}')
