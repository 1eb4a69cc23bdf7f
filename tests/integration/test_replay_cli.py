"""``chronolog replay`` against a real PostgreSQL (``CHRONOLOG_TEST_DATABASE_URL``) and a real
SQLite log file, the CLI run as a subprocess.

The "live" tables are built the way the projector builds them — every event through
``project`` and ``PostgresProjectionStore.apply`` with its offset, here one event per
transaction — in one schema; ``chronolog replay`` rebuilds another schema from offset 0 with
other batch sizes; the two must be equal row for row (``projection_offsets.updated_at``,
the wall clock of the write, excepted).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from chronolog.archive.store import ArchiveWriter
from chronolog.cli.replay import connect_store
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.ids import calendar_id, partition_key
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord, Topics
from chronolog.log.sqlite import SqliteEventLog
from chronolog.projections.project import project
from chronolog.projections.store import TABLES, PostgresProjectionStore
from support.net import free_port
from support.polling import wait_until, wait_until_sync

from .decider_log import ScheduleLog
from .pgdb import module_database

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TENANT = "acme"
PARTITIONS = 3
CHRONOLOG = Path(sys.executable).parent / "chronolog"
KEYS = {"schedules": "tenant, schedule_id", "runs": "run_id", "attempts": "run_id, attempt",
        "effects": "effect_id", "calendars": "tenant, name"}


def _events(schedule_id: str) -> list[m.EventEnvelope]:
    """One schedule through the real decider: runs, a retry, an effect, a manual run."""
    sl = ScheduleLog(TENANT, schedule_id)

    def claim_and(run_id: str, now: datetime, fail: bool = False) -> None:
        c = sl.claim(run_id, now)
        if fail:
            sl.do(m.FailRun(run_id=run_id, attempt=c.attempt, fence=c.fence, worker_id="w1"),
                  now + timedelta(seconds=1))
        else:
            sl.do(m.CompleteRun(run_id=run_id, attempt=c.attempt, fence=c.fence, worker_id="w1",
                                checksum="sha256:ab", size=2, inline={"ok": 1}),
                  now + timedelta(seconds=1))

    sl.do(m.CreateSchedule(spec=m.ScheduleSpec(every=60.0, job=m.JobSpec(type="report"),
                                               effects=[{"kind": "webhook",
                                                         "destination": "d-webhook"}],
                                               misfire="all")), T0)
    for k in range(4):
        now = T0 + timedelta(minutes=k)
        run_id = sl.materialized(sl.do(m.Tick(), now))
        claim_and(run_id, now + timedelta(seconds=1), fail=(k == 1))
        if k == 1:
            retry_at = sl.state.run(run_id).retry_at  # type: ignore[union-attr]
            assert retry_at is not None
            sl.do(m.Tick(), retry_at)
            claim_and(run_id, retry_at)
    sl.do(m.TriggerRun(request_key="by-hand"), T0 + timedelta(minutes=5))
    sl.do(m.PauseSchedule(reason="maintenance"), T0 + timedelta(minutes=6))
    return sl.envelopes


def _calendar_events() -> list[m.EventEnvelope]:
    """A calendar put, revised, deleted and put again; another only put."""
    out = []
    steps = [("hol", m.CalendarRevised(name="hol", revision=1, spec=CalendarSpec(
                 dates=(date(2026, 12, 25),)))),
             ("hol", m.CalendarRevised(name="hol", revision=2, spec=CalendarSpec(
                 timezone="Europe/Paris", dates=(date(2026, 12, 25), date(2027, 1, 1))))),
             ("ops", m.CalendarRevised(name="ops", revision=1, spec=CalendarSpec())),
             ("hol", m.CalendarDeleted(name="hol", revision=3)),
             ("hol", m.CalendarRevised(name="hol", revision=4, spec=CalendarSpec()))]
    for i, (name, payload) in enumerate(steps):
        sid = calendar_id(name)
        out.append(m.EventEnvelope(event_id=f"cal-{i}.0", type=payload.type,
                                   key=partition_key(TENANT, sid), tenant=TENANT,
                                   schedule_id=sid, at=T0 + timedelta(seconds=30 * i + 7),
                                   causation_id=f"cal-{i}", payload=payload))
    return out


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[m.EventEnvelope]]:
    envs = [e for sid in ("nightly", "hourly", "reports-eu", "billing") for e in _events(sid)]
    envs += _calendar_events()
    # as processors write them: in authority-time order (stable: each schedule keeps its order)
    envs.sort(key=lambda e: e.at)
    assert len({partition_for(e.key.encode(), PARTITIONS) for e in envs}) > 1
    path = tmp_path_factory.mktemp("replay") / "log.db"

    async def write() -> None:
        log = SqliteEventLog(str(path), Topics(partitions=PARTITIONS), synchronous="NORMAL")
        await log.start()
        await log.ensure_topics()
        for e in envs:  # one append per event: offsets follow the decider's order
            await log.append([OutRecord(topic=log.topics.events, key=e.key.encode(),
                                        value=codec.encode_event(e))])
        await log.close()

    asyncio.run(write())
    return path, envs


@pytest.fixture(scope="module")
def database_url(database_url: str) -> Iterator[str]:
    """A database of this module's own: the tests look for the staging schemas a replay
    leaves behind, which a replay of another module running meanwhile would add to."""
    yield from module_database(database_url, "test_replay_cli")


@pytest.fixture
def schemas(database_url: str) -> Iterator[list[str]]:
    """Schema names to use; dropped afterwards."""
    made: list[str] = []
    yield made

    async def drop() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            for s in made:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def _schema(schemas: list[str], what: str) -> str:
    name = f"t_{what}_{uuid.uuid4().hex[:8]}"
    schemas.append(name)
    return name


async def _create_schema(database_url: str, schema: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    finally:
        await conn.close()


async def _live(database_url: str, schema: str, log_path: Path,
                partitions: int = PARTITIONS) -> None:
    """Project the log event by event, one transaction each, as a live projector would."""
    await _create_schema(database_url, schema)
    store = await connect_store(database_url, schema)
    log = SqliteEventLog(str(log_path), Topics(partitions=partitions))
    try:
        await store.migrate()
        for p in range(partitions):
            for rec in await log.read(log.topics.events, p, 0, max_records=100_000):
                env = codec.decode_event(rec.value)
                await store.apply(project(env), {(rec.topic, p): (rec.offset, rec.offset + 1)},
                                  last_event_at={(rec.topic, p): env.at})
    finally:
        await log.close()
        await store.close()


async def _dump(database_url: str, schema: str, topic: str | None = None
                ) -> dict[str, list[tuple[Any, ...]]]:
    """The event tables and the offsets (of ``topic`` only, when given)."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        out = {t: [tuple(r) for r in await conn.fetch(f'SELECT * FROM "{t}" ORDER BY {KEYS[t]}')]
               for t in TABLES}
        out["projection_offsets"] = [tuple(r) for r in await conn.fetch(
            "SELECT projection, topic, partition, next_offset, last_event_at "
            "FROM projection_offsets WHERE $1::text IS NULL OR topic = $1 "
            "ORDER BY topic, partition", topic)]
        return out
    finally:
        await conn.close()


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    return subprocess.run([str(CHRONOLOG), "replay", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("batch", ["1000", "7"])
def test_a_rebuild_equals_the_live_tables_row_for_row(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
    batch: str,
) -> None:
    path, envs = log_file
    live, rebuilt = _schema(schemas, "live"), _schema(schemas, "replay")
    asyncio.run(_live(database_url, live, path))
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", rebuilt, "--batch", batch)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"replay done: {len(envs)} events from {PARTITIONS} partitions "
                                  f"into schema {rebuilt}")
    a, b = asyncio.run(_dump(database_url, live)), asyncio.run(_dump(database_url, rebuilt))
    assert all(a[t] for t in TABLES), "every table has rows"
    for table in a:
        assert a[table] == b[table], table


def test_a_second_replay_starts_again_from_empty_tables(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
) -> None:
    path, _envs = log_file
    target = _schema(schemas, "again")
    first = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                    "--schema", target)
    again = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                    "--schema", target)
    assert first.returncode == again.returncode == 0, again.stderr
    assert first.stdout == again.stdout


def test_to_offset_and_until_rebuild_a_prefix_of_every_partition(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
) -> None:
    path, envs = log_file
    by_partition: dict[int, list[m.EventEnvelope]] = {}
    for e in envs:
        by_partition.setdefault(partition_for(e.key.encode(), PARTITIONS), []).append(e)

    target = _schema(schemas, "prefix")
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", target, "--to-offset", "5")
    assert proc.returncode == 0, proc.stderr
    offsets = {r[2]: r[3] for r in asyncio.run(_dump(database_url, target))["projection_offsets"]}
    assert offsets == {p: min(5, len(evs)) for p, evs in by_partition.items()}

    until = T0 + timedelta(minutes=2)
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", target, "--until", until.isoformat().replace("+00:00", "Z"))
    assert proc.returncode == 0, proc.stderr
    dump = asyncio.run(_dump(database_url, target))
    offsets = {r[2]: r[3] for r in dump["projection_offsets"]}
    assert offsets == {p: sum(1 for e in evs if e.at <= until)
                       for p, evs in by_partition.items()}
    assert max(r[-1] for r in dump["projection_offsets"]) <= until  # last_event_at


@pytest.mark.parametrize("args, fragment", [
    (["--database-url", "mysql://x"], "error: --database-url: 'mysql://x'"),
    (["--database-url", "postgresql://a@a..b/db"], "host 'a..b' is not a host name"),
    (["--database-url", "postgresql://u:p@[bad/x"], "error: --database-url: 'postgresql://u:p@["),
    (["--database-url", "postgresql://u@127.0.0.1:1/db"], "cannot connect to database-url"),
    (["--schema", "Bad-Name"], "error: --schema: 'Bad-Name'"),
    (["--until", "yesterday"], "error: --until: 'yesterday'"),
    (["--to-offset", "-1"], "error: --to-offset: '-1'"),
    (["--archive", "/nonexistent-archive"], "error: --archive: '/nonexistent-archive'"),
])
def test_bad_input_exits_2_with_one_line(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], args: list[str],
    fragment: str,
) -> None:
    path, _ = log_file
    base = ["--log", f"sqlite:///{path}"]
    if "--database-url" not in args:
        base += ["--database-url", database_url]
    proc = _replay(*base, *args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr


def test_an_undecodable_record_is_skipped_and_named_as_the_live_projector_skips_it(
    database_url: str, tmp_path: Path, schemas: list[str],
) -> None:
    envs = _events("nightly")
    path = tmp_path / "log.db"

    async def write() -> None:
        log = SqliteEventLog(str(path), Topics(partitions=1), synchronous="NORMAL")
        await log.start()
        await log.ensure_topics()
        await log.append([OutRecord(topic=log.topics.events, key=e.key.encode(),
                                    value=codec.encode_event(e)) for e in envs[:3]])
        await log.append([OutRecord(topic=log.topics.events, key=b"acme/nightly",
                                    value=b"{not json")])
        await log.close()

    asyncio.run(write())
    target = _schema(schemas, "junk")
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", target)
    assert proc.returncode == 0, proc.stderr
    assert "note: skipped a record that does not decode: p0@3: event is not JSON" in proc.stderr
    offsets = asyncio.run(_dump(database_url, target))["projection_offsets"]
    assert [(r[2], r[3]) for r in offsets] == [(0, 4)]  # the events before it, and past it


def test_the_dlq_topic_is_folded_into_dead_letters_and_a_replay_writes_nothing_to_the_log(
    database_url: str, tmp_path: Path, schemas: list[str],
) -> None:
    from chronolog.log.dead_letters import DeadLetters

    envs = _events("nightly")
    path = tmp_path / "log.db"

    async def write() -> dict[str, int]:
        log = SqliteEventLog(str(path), Topics(partitions=1), synchronous="NORMAL")
        await log.start()
        await log.ensure_topics()
        t = log.topics
        await log.append([OutRecord(topic=t.events, key=e.key.encode(),
                                    value=codec.encode_event(e)) for e in envs[:3]])
        await log.append([OutRecord(topic=t.events, key=b"acme/nightly", value=b"{not json")])
        junk = (await log.read(t.events, 0, 3, max_records=1))[0]
        await DeadLetters(log, "projector").put(junk, "event is not JSON")  # as the live one
        await log.append([OutRecord(topic=t.dlq, key=b"x", value=b"not a letter")])
        ends = {f"{topic}[{p}]": await log.end_offset(topic, p)
                for topic in (t.events, t.dlq, t.workers, t.commands, t.replies)
                for p in range(await log.partitions_for(topic))}
        await log.close()
        return ends

    async def after() -> tuple[list[tuple[Any, ...]], dict[str, int]]:
        conn = await asyncpg.connect(database_url, server_settings={"search_path": target})
        log = SqliteEventLog(str(path), Topics(partitions=1))
        await log.start()
        try:
            rows = [tuple(r) for r in await conn.fetch(
                "SELECT consumer, source_topic, source_partition, source_offset, tenant, "
                "schedule_id FROM dead_letters")]
            t = log.topics
            ends = {f"{topic}[{p}]": await log.end_offset(topic, p)
                    for topic in (t.events, t.dlq, t.workers, t.commands, t.replies)
                    for p in range(await log.partitions_for(topic))}
            return rows, ends
        finally:
            await conn.close()
            await log.close()

    before = asyncio.run(write())
    target = _schema(schemas, "letters")
    proc = _replay("--log", f"sqlite:///{path}", "--database-url", database_url,
                   "--schema", target)
    assert proc.returncode == 0, proc.stderr
    assert "dead_letters 1;" in proc.stdout
    assert "chronolog.dlq[0]@1: not a dead letter" in proc.stderr
    rows, ends = asyncio.run(after())
    assert rows == [("projector", "chronolog.events", 0, 3, "acme", "nightly")]
    assert ends == before, "a replay appends nothing (no dead letter of its own)"


# ---------------------------------------------------------------------------------------
# a replay next to a running projector, and next to readers


async def _replay_async(*args: str) -> tuple[int, str, str]:
    """The CLI as a subprocess, awaited without blocking this event loop (a projector or a
    reader in this process goes on meanwhile)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    proc = await asyncio.create_subprocess_exec(
        str(CHRONOLOG), "replay", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _append(path: Path, envs: list[m.EventEnvelope]) -> None:
    log = SqliteEventLog(str(path), Topics(partitions=PARTITIONS))
    await log.start()
    try:
        for e in envs:
            await log.append([OutRecord(topic=log.topics.events, key=e.key.encode(),
                                        value=codec.encode_event(e))])
    finally:
        await log.close()


async def _oid(database_url: str, schema: str, table: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT to_regclass($1)::oid", f'"{schema}"."{table}"'))
    finally:
        await conn.close()


async def _leftover_fresh_schemas(database_url: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        return [r[0] for r in await conn.fetch(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'chronolog\\_replay\\_%'")]
    finally:
        await conn.close()


async def test_a_replay_is_refused_while_a_projector_runs_and_the_projector_goes_on(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
    tmp_path: Path,
) -> None:
    from chronolog.projections.projector import Projector

    path = tmp_path / "log.db"
    shutil.copy(log_file[0], path)
    live = _schema(schemas, "held")
    await _create_schema(database_url, live)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4,
                                     server_settings={"search_path": live})
    assert pool is not None
    store = PostgresProjectionStore(pool)
    await store.migrate()
    log = SqliteEventLog(str(path), Topics(partitions=PARTITIONS))
    await log.start()
    projector = Projector(log, store, idle_ms=20)
    task = asyncio.create_task(projector.run())
    try:
        total = len(log_file[1])
        await wait_until(lambda: sum(projector.watermark().partitions.values()) == total,
                         what="the projector caught up")
        before = await _dump(database_url, live)
        oid = await _oid(database_url, live, "runs")

        rc, out, err = await _replay_async("--log", f"sqlite:///{path}",
                                           "--database-url", database_url, "--schema", live)
        assert rc == 1, err
        assert out == ""
        assert err.splitlines() == [
            f"error: unavailable: the projection 'main' is held by a running projector (pid "
            f"{os.getpid()} on host {socket.gethostname()}); stop it first or replay into "
            "--schema NAME"]
        assert await _oid(database_url, live, "runs") == oid, "the live tables were untouched"
        assert await _dump(database_url, live) == before
        assert await _leftover_fresh_schemas(database_url) == []

        # the projector goes on: a later event is projected
        await _append(path, _events("after-refusal")[:3])
        await wait_until(lambda: pool.fetchval(
            "SELECT count(*) FROM schedules WHERE schedule_id = 'after-refusal'"),
            what="the later event projected")
        assert not task.done()
    finally:
        projector.stop()
        await asyncio.wait_for(task, 30)
        await log.close()
        await store.close()


async def _read_forever(database_url: str, schema: str, seen: list[int], errors: list[str],
                        done: asyncio.Event, reverse: bool) -> int:
    """Query the read model in a loop, as the API does: prepared statements that join the
    tables, and transactions of several statements (in two lock orders). Counts queries;
    every failure is kept in ``errors``."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    tables = ["schedules", "runs", "attempts", "effects", "projection_offsets"]
    if reverse:
        tables.reverse()
    n = 0
    try:
        while not done.is_set():
            try:
                seen.append(int(await conn.fetchval("SELECT 'runs'::regclass::oid")))
                await conn.fetchval(
                    "SELECT count(*) FROM schedules s JOIN runs r USING (tenant, schedule_id) "
                    "LEFT JOIN attempts a USING (run_id) WHERE s.tenant = $1", TENANT)
                async with conn.transaction(isolation="repeatable_read"):
                    for t in tables:
                        await conn.fetchval(f'SELECT count(*) FROM "{t}"')
                n += 1
            except Exception as exc:  # noqa: BLE001 - every failure is what the test looks for
                errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0)
    finally:
        await conn.close()
    return n


async def test_readers_see_the_old_or_the_new_read_model_never_a_missing_table(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
) -> None:
    path, envs = log_file
    live = _schema(schemas, "swap")
    await _live(database_url, live, path)  # the fold, one event per transaction
    folded = await _dump(database_url, live)
    old_oid = await _oid(database_url, live, "runs")

    done = asyncio.Event()
    seen: list[int] = []
    errors: list[str] = []
    readers = [asyncio.create_task(_read_forever(database_url, live, seen, errors, done, rev))
               for rev in (False, True)]
    try:
        await wait_until(lambda: len(seen) >= 10, what="readers reading")
        rc, out, err = await _replay_async("--log", f"sqlite:///{path}", "--database-url",
                                           database_url, "--schema", live, "--batch", "7")
        mark = len(seen)
        await wait_until(lambda: len(seen) >= mark + 10, what="readers after the swap")
    finally:
        done.set()
        counts = await asyncio.gather(*readers)
    assert rc == 0, err
    assert out.startswith(f"replay done: {len(envs)} events from {PARTITIONS} partitions into "
                          f"schema {live}")
    assert errors == []
    assert min(counts) > 10
    new_oid = await _oid(database_url, live, "runs")
    assert new_oid != old_oid, "the tables were replaced"
    assert seen[0] == old_oid and seen[-1] == new_oid, "the swap happened while they read"
    assert set(seen) == {old_oid, new_oid}
    assert await _dump(database_url, live) == folded, "the rebuild equals the fold"
    assert await _leftover_fresh_schemas(database_url) == []


# ---------------------------------------------------------------------------------------
# chronolog replay --data-dir on a dev node's directory


def _succeeded(url: str) -> int:
    r = httpx.get(f"{url}/v1/schedules/tick/runs", params={"limit": 500, "state": "SUCCEEDED"},
                  headers={"Authorization": "Bearer dev"}, timeout=5)
    return len(r.json()["items"]) if r.status_code == 200 else 0


def _poll(fn: Any, timeout: float, what: str) -> Any:
    return wait_until_sync(fn, timeout, what, errors=(httpx.HTTPError, OSError))


@pytest.fixture
def dev_dir() -> Iterator[Path]:
    # not under pytest's tmp_path: the embedded PostgreSQL may run as another system user,
    # and pytest keeps its temporary root private (mode 0700)
    d = Path(tempfile.mkdtemp(prefix="chronolog-replay-dev-"))
    yield d
    from chronolog.embedded_postgres import EmbeddedPostgres

    EmbeddedPostgres(d / "postgres").stop()
    shutil.rmtree(d, ignore_errors=True)


def test_replay_data_dir_alone_is_refused_by_a_running_dev_node_and_rebuilds_a_stopped_one(
    dev_dir: Path, tmp_path: Path, database_url: str, schemas: list[str],
) -> None:
    from chronolog.embedded_postgres import EmbeddedPostgres
    from chronolog.projections.migrate import migrate

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stderr = tmp_path / "dev.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}
    node = subprocess.Popen(
        [str(CHRONOLOG), "dev", "--quiet", "--data-dir", str(dev_dir), "--port", str(port),
         "--partitions", "2", "--no-demo"],
        stdout=subprocess.DEVNULL, stderr=open(stderr, "wb"), env=env)
    try:
        _poll(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, 90,
              "a healthy dev node")
        r = httpx.post(f"{url}/v1/schedules", headers={"Authorization": "Bearer dev"},
                       timeout=10, json={"scheduleId": "tick", "every": "1s",
                                         "job": {"type": "echo"}, "overlap": "allow"})
        assert r.status_code == 201, r.text
        _poll(lambda: _succeeded(url) >= 2, 60, "two SUCCEEDED runs")

        refused = _replay("--data-dir", str(dev_dir))
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.splitlines() == [
            f"error: unavailable: the projection 'main' is held by a running projector (pid "
            f"{node.pid} on host {socket.gethostname()}); stop it first or replay into "
            "--schema NAME"]
        seen = _succeeded(url)
        _poll(lambda: _succeeded(url) > seen, 60, "runs still projected after the refusal")
        assert node.poll() is None, "the dev node stopped"
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            assert node.wait(30) == 0, stderr.read_text()[-2000:]
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(5)
            raise
    pg = EmbeddedPostgres(dev_dir / "postgres")
    assert not pg.is_running()

    done = _replay("--data-dir", str(dev_dir))
    assert done.returncode == 0, done.stderr
    assert "starting the embedded PostgreSQL" in done.stderr
    assert done.stdout.startswith("replay done: ") and "into schema public" in done.stdout
    assert not pg.is_running(), "stopped again after the replay"

    # the rebuilt tables equal the fold of the node's log, and a next start migrates them
    fold = _schema(schemas, "devfold")
    asyncio.run(_live(database_url, fold, dev_dir / "log.db", partitions=2))
    dsn = pg.start()
    try:
        rebuilt = asyncio.run(_dump(dsn, "public", topic="chronolog.events"))
        assert rebuilt == asyncio.run(_dump(database_url, fold))
        assert len(rebuilt["runs"]) >= 3

        async def after() -> tuple[int, list[int]]:
            conn = await asyncpg.connect(dsn)
            try:
                return int(await conn.fetchval("SELECT count(*) FROM workers")), \
                    await migrate(conn)
            finally:
                await conn.close()

        workers, applied = asyncio.run(after())
        assert workers >= 1, "the workers topic is folded too"
        assert applied == [], "the rebuilt read model is at the current migration"
    finally:
        pg.stop()


async def test_the_swap_keeps_the_owner_and_the_grants_of_the_tables_it_replaces(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
) -> None:
    path, _ = log_file
    live = _schema(schemas, "grants")
    await _live(database_url, live, path)
    reader = f"chronolog_test_reader_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'CREATE ROLE "{reader}" NOLOGIN')
        await conn.execute(f'GRANT USAGE ON SCHEMA "{live}" TO "{reader}"')
        await conn.execute(f'GRANT SELECT ON "{live}".runs, "{live}".schedules TO "{reader}"')

        async def can(table: str, privilege: str) -> bool:
            return bool(await conn.fetchval("SELECT has_table_privilege($1, $2, $3)", reader,
                                            f'"{live}"."{table}"', privilege))

        old = await _oid(database_url, live, "runs")
        rc, _, err = await _replay_async("--log", f"sqlite:///{path}", "--database-url",
                                         database_url, "--schema", live)
        assert rc == 0, err
        assert await _oid(database_url, live, "runs") != old, "the tables were replaced"
        assert await can("runs", "SELECT") and await can("schedules", "SELECT")
        assert not await can("attempts", "SELECT") and not await can("runs", "UPDATE")
    finally:
        await conn.execute(f'DROP OWNED BY "{reader}"')
        await conn.execute(f'DROP ROLE IF EXISTS "{reader}"')
        await conn.close()


async def test_a_projector_started_during_a_replay_waits_for_it_then_projects(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
) -> None:
    import structlog

    from chronolog.projections.lease import LeaseHeld, ProjectionLease
    from chronolog.projections.projector import Projector

    path, envs = log_file
    live = _schema(schemas, "wait")
    await _create_schema(database_url, live)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4,
                                     server_settings={"search_path": live})
    assert pool is not None
    store = PostgresProjectionStore(pool)
    await store.migrate()
    log = SqliteEventLog(str(path), Topics(partitions=PARTITIONS))
    await log.start()
    replay_lease = await ProjectionLease.exclusive(pool, live, "main")  # as a replay holds it
    projectors = [Projector(log, store, idle_ms=20) for _ in range(2)]
    tasks: list[asyncio.Task[None]] = []
    try:
        with structlog.testing.capture_logs() as logs:
            tasks += [asyncio.create_task(p.run()) for p in projectors]
            await wait_until(lambda: sum(e["event"] == "projector_waiting_for_lease"
                                         for e in logs) == 2, what="both projectors waiting")
        assert await pool.fetchval("SELECT count(*) FROM projection_offsets") == 0
        with pytest.raises(LeaseHeld, match="held by a running replay"):
            await ProjectionLease.exclusive(pool, live, "main")

        projectors[1].stop()  # one stopped while it waits ends at once
        await asyncio.wait_for(tasks[1], 10)

        await replay_lease.release()
        await wait_until(lambda: sum(projectors[0].watermark().partitions.values())
                         == len(envs), what="the waiting projector projected the log")
    finally:
        await replay_lease.release()
        for p in projectors:
            p.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await log.close()
        await store.close()


def test_a_pruned_log_is_refused_without_an_archive_and_replayed_whole_with_one(
    database_url: str, log_file: tuple[Path, list[m.EventEnvelope]], schemas: list[str],
    tmp_path: Path,
) -> None:
    path, envs = log_file
    counts = [sum(1 for e in envs if partition_for(e.key.encode(), PARTITIONS) == p)
              for p in range(PARTITIONS)]
    part = counts.index(max(counts))
    assert counts[part] > 3
    pruned = tmp_path / "pruned.db"
    shutil.copy(path, pruned)
    target = _schema(schemas, "pruned")
    first = _replay("--log", f"sqlite:///{pruned}", "--database-url", database_url,
                    "--schema", target)
    assert first.returncode == 0, first.stderr
    before = asyncio.run(_dump(database_url, target))

    async def prune_first(n: int) -> int:
        log = SqliteEventLog(str(pruned), Topics(partitions=PARTITIONS))
        try:
            return await log.delete_before(log.topics.events, part, n)
        finally:
            await log.close()

    async def archive_first(n: int) -> None:
        log = SqliteEventLog(str(pruned), Topics(partitions=PARTITIONS))
        try:
            records = await log.read(log.topics.events, part, 0, max_records=n)
        finally:
            await log.close()
        ArchiveWriter(archive, topic=records[0].topic).append(part, records)

    archive = tmp_path / "archive"
    asyncio.run(archive_first(3))
    assert asyncio.run(prune_first(3)) == 3
    proc = _replay("--log", f"sqlite:///{pruned}", "--database-url", database_url,
                   "--schema", target)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: replay stopped, the read model is untouched: the event log was pruned "
        f"(p{part} starts at offset 3 and it has no snapshot); a replay from offset 0 would "
        "lack the history before those offsets")
    assert asyncio.run(_dump(database_url, target)) == before
    # with the archive holding what went, the whole history is replayed: the same rows
    whole = _replay("--log", f"sqlite:///{pruned}", "--database-url", database_url,
                    "--schema", target, "--archive", str(archive))
    assert whole.returncode == 0, whole.stderr
    assert whole.stderr.strip() == (
        f"note: partition {part} was pruned below offset 3: its history was read from the "
        "archive, then the log")
    assert whole.stdout == first.stdout
    assert asyncio.run(_dump(database_url, target)) == before
    # --to-offset 0 folds nothing, so nothing pruned is missing from it
    assert _replay("--log", f"sqlite:///{pruned}", "--database-url", database_url,
                   "--schema", target, "--to-offset", "0").returncode == 0
