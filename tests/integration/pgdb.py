"""PostgreSQL helpers for the projector and API tests: a fresh database per module, one
schema per test, and row dumps for comparing read models.

``fresh_database(admin_dsn)`` creates a database and returns its DSN (dropped by
``drop_database``; ``module_database`` for a module's fixture); ``schema_store(dsn, schema)``
opens a ``PostgresProjectionStore`` whose
connections put ``schema`` first on the search_path, creates the schema and migrates it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from chronolog.projections.store import TABLES, PostgresProjectionStore

KEYS = {name: ", ".join(spec.key) for name, spec in TABLES.items()}


def with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + name))


async def create_database(admin_dsn: str, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_database(admin_dsn, name)


async def drop_database(admin_dsn: str, dsn: str) -> None:
    name = urlsplit(dsn).path.lstrip("/")
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def module_database(admin_dsn: str, prefix: str) -> Iterator[str]:
    """A database for one test module (a module-scoped fixture yields from this), dropped
    after it."""
    dsn = asyncio.run(create_database(admin_dsn, prefix))
    yield dsn
    asyncio.run(drop_database(admin_dsn, dsn))


async def schema_store(dsn: str, schema: str | None = None, max_size: int = 4
                       ) -> PostgresProjectionStore:
    """A migrated store in a new schema of ``dsn`` (a fresh name when not given)."""
    schema = schema or f"s_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=max_size,
                                     server_settings={"search_path": f'"{schema}"'})
    assert pool is not None
    store = PostgresProjectionStore(pool)
    await store.migrate()
    return store


async def dump(store: PostgresProjectionStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every read-model row of the events projection, ordered by key, plus its stored
    offsets (not those of the workers and dlq topics, which a running projector folds
    alongside into tables of their own)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for t in TABLES:
        rows = await store.pool.fetch(f'SELECT * FROM "{t}" ORDER BY {KEYS[t]}')
        out[t] = [tuple(r) for r in rows]
    rows = await store.pool.fetch(
        "SELECT topic, partition, next_offset, last_event_at FROM projection_offsets "
        "WHERE projection = $1 AND topic LIKE '%events' ORDER BY topic, partition",
        store.projection)
    out["projection_offsets"] = [tuple(r) for r in rows]
    return out


async def open_store(dsn: str, opened: list[PostgresProjectionStore]) -> PostgresProjectionStore:
    """``schema_store(dsn)``, kept in ``opened`` (the ``stores`` fixture closes them)."""
    store = await schema_store(dsn)
    opened.append(store)
    return store
