"""The read model's backup and restore: every table of the projection's schema as a binary
``COPY`` file, taken in one REPEATABLE READ transaction (one consistent snapshot, while the
projector writes), and copied back into an empty, freshly migrated read model.

``dump(pool, folder)`` -> ``{"tables": {name: rows}, "migrations": [versions]}``;
``emptiness(pool)`` -> the first table with rows (None: empty); ``load(pool, folder,
manifest)`` migrates the target, checks it is at the backup's migrations, and copies every
table in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

from chronolog.projections.store import PostgresProjectionStore

__all__ = ["BackupMismatch", "dump", "emptiness", "load", "renumber_offsets"]

_TABLES = ("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
           "ORDER BY tablename")


class BackupMismatch(Exception):
    """The backup does not fit this read model (the message says why)."""


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def dump(pool: asyncpg.Pool, folder: Path) -> dict[str, Any]:
    """Every table of the current schema to ``folder/<table>.copy`` (binary COPY)."""
    folder.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - one local mkdir
    tables: dict[str, int] = {}
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read",
                                                        readonly=True):
        names = [r[0] for r in await conn.fetch(_TABLES)]
        if "schema_migrations" not in names:
            raise BackupMismatch("the database holds no chronolog read model "
                                 "(no schema_migrations table)")
        versions = [r[0] for r in await conn.fetch(
            "SELECT version FROM schema_migrations ORDER BY version")]
        for name in names:
            tables[name] = int(await conn.fetchval(f"SELECT count(*) FROM {_ident(name)}"))
            await conn.copy_from_table(name, output=str(folder / f"{name}.copy"),
                                       format="binary")
    return {"tables": tables, "migrations": versions}


async def emptiness(pool: asyncpg.Pool) -> str | None:
    """Why the read model is not empty (a table with rows, its name and count), or None."""
    async with pool.acquire() as conn:
        for name in [r[0] for r in await conn.fetch(_TABLES)]:
            if name == "schema_migrations":
                continue
            n = await conn.fetchval(f"SELECT count(*) FROM {_ident(name)}")
            if n:
                return f"table {name} has {n} rows"
    return None


async def load(pool: asyncpg.Pool, folder: Path, manifest: dict[str, Any]) -> dict[str, int]:
    """Migrate the (empty) target and copy the backup's tables into it, in one transaction."""
    store = PostgresProjectionStore(pool)
    await store.migrate()
    async with pool.acquire() as conn:
        versions = [r[0] for r in await conn.fetch(
            "SELECT version FROM schema_migrations ORDER BY version")]
        if versions != list(manifest["migrations"]):
            raise BackupMismatch(f"the backup's read model is at migrations "
                                 f"{manifest['migrations']}, this chronolog's at {versions}; "
                                 "restore with the chronolog version that made the backup")
        present = {r[0] for r in await conn.fetch(_TABLES)}
        loaded: dict[str, int] = {}
        async with conn.transaction():
            for name, rows in manifest["tables"].items():
                if name == "schema_migrations" or name not in present:
                    continue
                await conn.execute(f"TRUNCATE {_ident(name)}")  # a migration's backfill rows
                await conn.copy_to_table(name, source=str(folder / f"{name}.copy"),
                                         format="binary")
                loaded[name] = int(rows)
    return loaded


async def renumber_offsets(
    pool: asyncpg.Pool, renumber: Callable[[str, int, int], tuple[str, int] | None]
) -> int:
    """Rewrite the stored projection offsets of a restored read model whose log was
    renumbered: ``renumber(topic, partition, next_offset)`` -> ``(topic, next_offset)`` (None:
    keep the row). Returns the rows rewritten."""
    n = 0
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch("SELECT projection, topic, partition, next_offset "
                                "FROM projection_offsets")
        for row in rows:
            moved = renumber(row["topic"], row["partition"], row["next_offset"])
            if moved is None:
                continue
            await conn.execute(
                "UPDATE projection_offsets SET topic = $5, next_offset = $6 "
                "WHERE projection = $1 AND topic = $2 AND partition = $3 AND next_offset = $4",
                row["projection"], row["topic"], row["partition"], row["next_offset"], *moved)
            n += 1
    return n
