"""The read model's backup and restore: every table of the projection's schema as a binary
``COPY`` file, taken in one REPEATABLE READ transaction (one consistent snapshot, while the
projector writes), and copied back into an empty, freshly migrated read model.

``dump(pool, folder)`` -> ``{"tables": {name: rows}, "migrations": [versions], "days":
[the day partitions of runs and attempts]}`` (a partitioned table is one file, written by
``COPY (SELECT ...)``; a restore makes the backup's days before it loads the rows);
``emptiness(pool)`` -> the first table with rows (None: empty); ``copy_rows(path)`` -> the
rows of one binary COPY file, parsed without a database (a cut or damaged file is a
``BackupMismatch``: ``chronolog restore`` checks every file before it writes anything).

A restore never loads into the live tables: ``stage(dsn, folder, manifest)`` migrates a
fresh schema ``chronolog_restore_<random>`` from empty, checks it is at the backup's
migrations and copies every table into it in one transaction; the caller then puts it in
place with ``chronolog.projections.rebuild.swap_in`` — the swap ``chronolog replay`` uses —
so the target's read model is the old one or the whole restored one, never a part.
``drop_stages(pool)`` drops the staging schemas a killed restore left.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import asyncpg

from chronolog.projections.partitions import day_partitions, insertable_columns, make_days
from chronolog.projections.rebuild import drop_schema, quote
from chronolog.projections.store import PostgresProjectionStore

__all__ = ["STAGE_PREFIX", "BackupMismatch", "copy_rows", "drop_stages", "dump", "emptiness",
           "renumber_offsets", "stage"]

STAGE_PREFIX = "chronolog_restore_"
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"

# the tables of the read model, a partitioned one as one table (its partitions are where
# its rows are kept, not tables of their own)
_TABLES = ("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
           "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') "
           "AND NOT c.relispartition ORDER BY c.relname")


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
            # COPY (SELECT ...): COPY TO of a partitioned table itself is refused; the
            # columns are the ones a COPY of the table writes (not the generated ones)
            cols = ", ".join(_ident(c) for c in await insertable_columns(conn, name))
            await conn.copy_from_query(f"SELECT {cols} FROM {_ident(name)}",
                                       output=str(folder / f"{name}.copy"), format="binary")
        days = [p.day.isoformat() for p in await day_partitions(conn)]
    return {"tables": tables, "migrations": versions, "days": days}


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


def copy_rows(path: Path) -> int:
    """The rows of a binary COPY file (PostgreSQL's documented format: signature, flags,
    header extension, tuples of length-prefixed fields, the -1 trailer, nothing after it);
    ``BackupMismatch`` saying where it breaks off."""
    data = path.read_bytes()
    if not data.startswith(_SIGNATURE) or len(data) < 19:
        raise BackupMismatch("is not a binary COPY file (no PGCOPY header)")
    (extension,) = struct.unpack_from("!i", data, 15)
    at, rows = 19 + extension, 0
    try:
        while True:
            (fields,) = struct.unpack_from("!h", data, at)
            at += 2
            if fields == -1:
                break
            for _ in range(fields):
                (size,) = struct.unpack_from("!i", data, at)
                at += 4 + max(size, 0)
            if at > len(data):
                raise struct.error("field past the end")
            rows += 1
    except struct.error:
        raise BackupMismatch(f"is cut off after {rows} rows (no COPY trailer)") from None
    if at != len(data):
        raise BackupMismatch(f"has {len(data) - at} bytes after its COPY trailer")
    return rows


async def drop_stages(pool: asyncpg.Pool) -> list[str]:
    """Drop the staging schemas of restores that did not finish (killed); their names."""
    names = [r[0] for r in await pool.fetch(
        "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)", STAGE_PREFIX)]
    for name in names:
        await drop_schema(pool, name)
    return names


async def stage(dsn: str, folder: Path, manifest: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """Load the backup's read model into a fresh, migrated staging schema (module
    docstring); its name and the rows loaded per table. The caller swaps it in (or drops it)."""
    schema = STAGE_PREFIX + secrets.token_hex(6)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {quote(schema)}")
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1,
                                     server_settings={"search_path": quote(schema)})
    assert pool is not None
    try:
        await PostgresProjectionStore(pool).migrate()
        await make_days(pool, [date.fromisoformat(d) for d in manifest.get("days", [])])
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
                    await conn.execute(f"TRUNCATE {_ident(name)}")  # a migration's backfill
                    await conn.copy_to_table(name, source=str(folder / f"{name}.copy"),
                                             schema_name=schema, format="binary")
                    loaded[name] = int(rows)
    finally:
        await pool.close()
    return schema, loaded


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
