"""Versioned SQL migrations for the read model, applied at start.

Migrations are the files ``migrations/NNNN_name.sql`` shipped in this package (package data).
``migrate(conn)``:

* takes a session advisory lock (``pg_advisory_lock``) so concurrent starters never race:
  the second waits, then finds nothing left to do;
* creates ``schema_migrations(version, name, checksum, applied_at)`` if missing;
* applies every file whose version is not recorded, in version order, each in its own
  transaction together with its ``schema_migrations`` row;
* refuses to run if an applied migration's file changed since (checksum mismatch) or if the
  database records a version this code does not know (a newer chronolog migrated it).

Objects are created unqualified, i.e. in the first schema of the connection's search_path.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

__all__ = ["ADVISORY_LOCK_KEY", "Migration", "MigrationError", "load_migrations", "migrate"]

ADVISORY_LOCK_KEY = 0x63686C6D6967  # "chlmig": chronolog's migration lock
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    """The database's migration history does not match the migrations shipped here."""


# Checksums of earlier texts of a migration whose statements did not change (only a comment
# was reworded). A database that recorded one is accepted and its record brought up to date.
REWORDED: dict[int, frozenset[str]] = {
    1: frozenset({"2e9a4a990bffbae9fb59e6a98f174fc3924ce10f0bc13ce42174125771ec7dd4"}),
}


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """The shipped migrations, in version order (versions must be unique)."""
    found: dict[int, Migration] = {}
    folder = resources.files("chronolog.projections") / "migrations"
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if version in found:
            raise MigrationError(f"two migrations with version {version}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


async def migrate(conn: asyncpg.Connection) -> list[int]:
    """Apply the pending migrations on ``conn``; return the versions applied now."""
    migrations = load_migrations()
    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    try:
        await conn.execute(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version    integer     PRIMARY KEY,
                name       text        NOT NULL,
                checksum   text        NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """
        )
        rows = await conn.fetch("SELECT version, name, checksum FROM schema_migrations")
        applied = {r["version"]: r for r in rows}
        known = {m.version: m for m in migrations}
        unknown = sorted(set(applied) - set(known))
        if unknown:
            raise MigrationError(
                f"the database has migrations {unknown} this chronolog does not know "
                "(it was migrated by a newer version)"
            )
        for version, row in applied.items():
            if row["checksum"] in REWORDED.get(version, frozenset()):
                await conn.execute("UPDATE schema_migrations SET checksum = $1 WHERE version = $2",
                                   known[version].checksum, version)
            elif row["checksum"] != known[version].checksum:
                raise MigrationError(
                    f"migration {version:04d}_{row['name']} was changed after it was applied; "
                    "add a new migration instead of editing an applied one"
                )
        done: list[int] = []
        for m in migrations:
            if m.version in applied:
                continue
            async with conn.transaction():
                await conn.execute(m.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    m.version, m.name, m.checksum,
                )
            done.append(m.version)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)
