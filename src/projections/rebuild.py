"""Rebuilding the read model beside the live one, and putting it in place in one transaction.

``chronolog replay`` never empties the tables readers use. It builds the whole read model in
a fresh schema (``fresh_schema_name()``: ``chronolog_replay_<random>``, migrated from empty),
and only when that is complete ``swap_in(conn, fresh, target)`` replaces the read-model
tables of the target schema by the fresh ones in ONE transaction:

1. the target's relations of the same names are locked (``ACCESS EXCLUSIVE``), waited for at
   most ``lock_wait_s`` (a reader's open transaction finishes first);
2. the fresh tables get the owner and the privileges (``GRANT``) of the tables they replace,
   so a reader role granted access to the live tables keeps it;
3. the old tables are dropped (``RESTRICT``: a view of someone else's that depends on one
   makes the swap fail and roll back, rather than being dropped with it; a partitioned
   table's partitions go with it) and the fresh ones are moved into the target schema
   (``ALTER TABLE ... SET SCHEMA``, their indexes with them, each partition of a
   partitioned table too); the emptied fresh schema is dropped.

A reader's query sees either the old tables or the new ones, whole: a query that waited
on the swap's locks looks its table names up again once it gets them (PostgreSQL does when
the catalog changed while it waited), and a prepared statement whose tables were dropped is
planned again on its next use. The swap waits for its locks ``lock_wait_s`` at most in all
(0.4 s: less than PostgreSQL's default ``deadlock_timeout`` of 1 s), so a reader that holds
a lock the swap wants while it waits behind one the swap holds finds, when its deadlock
check runs, that the swap has given up already: the swap rolls back and tries again, up to
``deadline_s`` (``SwapBusy`` then, the live tables untouched), and the reader goes on.

Only the read-model relations move; the target schema itself — often ``public``, owned by the
database, holding its grants and other applications' objects — stays as it is.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import asyncpg

from chronolog.projections.migrate import MigrationError, load_migrations

__all__ = [
    "FRESH_PREFIX",
    "SwapBusy",
    "check_versions",
    "drop_schema",
    "fresh_schema_name",
    "quote",
    "swap_in",
]

FRESH_PREFIX = "chronolog_replay_"
_KINDS = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE"}


class SwapBusy(RuntimeError):
    """The target's tables stayed locked by others for the whole deadline."""


def quote(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def fresh_schema_name() -> str:
    return FRESH_PREFIX + secrets.token_hex(6)


async def check_versions(conn: asyncpg.Connection, schema: str) -> None:
    """``MigrationError`` if the read model in ``schema`` was migrated by a newer chronolog
    (a rebuild by this one would take its newer tables away)."""
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL",
                                 f"{quote(schema)}.schema_migrations")
    if not exists:
        return
    applied = {r[0] for r in await conn.fetch(
        f"SELECT version FROM {quote(schema)}.schema_migrations")}
    unknown = sorted(applied - {m.version for m in load_migrations()})
    if unknown:
        raise MigrationError(f"the read model in schema '{schema}' has migrations {unknown} "
                             "this chronolog does not know (it was migrated by a newer version)")


async def drop_schema(conn: asyncpg.Connection | asyncpg.Pool, schema: str) -> None:
    await conn.execute(f"DROP SCHEMA IF EXISTS {quote(schema)} CASCADE")


async def _relations(conn: asyncpg.Connection, schema: str, *,
                     partitions: bool = True) -> list[tuple[str, str]]:
    """(name, relkind) of the movable relations of ``schema`` (not indexes, not the
    sequences a table owns: those move with their table); ``partitions=False`` leaves out
    the partitions of a partitioned table (they are dropped with it)."""
    rows = await conn.fetch(
        "SELECT c.relname, c.relkind::text AS relkind FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S') "
        "AND ($2 OR NOT c.relispartition) "
        "AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d "
        "  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid "
        "  AND d.deptype IN ('a', 'i'))) "
        "ORDER BY c.relname", schema, partitions)
    return [(r["relname"], r["relkind"]) for r in rows]


async def _copy_access(conn: asyncpg.Connection, fresh: str, target: str, name: str,
                       kind: str) -> None:
    """Give ``fresh.name`` the owner and the grants of ``target.name``."""
    live = await conn.fetchrow(
        "SELECT pg_get_userbyid(c.relowner) AS owner, c.relacl IS NOT NULL AS has_acl "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relname = $2", target, name)
    if live is None:
        return
    new = f"{quote(fresh)}.{quote(name)}"
    owner = await conn.fetchval(
        "SELECT pg_get_userbyid(c.relowner) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
        fresh, name)
    if owner != live["owner"]:
        await conn.execute(f"ALTER {kind} {new} OWNER TO {quote(live['owner'])}")
    if not live["has_acl"]:
        return
    grants = await conn.fetch(
        "SELECT CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END AS grantee, "
        "a.privilege_type, a.is_grantable FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a "
        "WHERE n.nspname = $1 AND c.relname = $2 AND a.grantee <> c.relowner", target, name)
    for g in grants:
        who = "PUBLIC" if g["grantee"] is None else quote(g["grantee"])
        option = " WITH GRANT OPTION" if g["is_grantable"] else ""
        await conn.execute(f"GRANT {g['privilege_type']} ON {new} TO {who}{option}")


async def _swap_once(conn: asyncpg.Connection, fresh: str, target: str,
                     lock_wait_s: float) -> list[str]:
    async with conn.transaction():
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(target)}")
        moving = await _relations(conn, fresh)
        names = {n for n, _ in moving}
        # a partitioned table goes with its partitions, whatever their names (the days
        # of the fresh one need not be the old one's)
        replaced = [(n, k) for n, k in await _relations(conn, target, partitions=False)
                    if n in names]
        tables = [f"{quote(target)}.{quote(n)}" for n, k in replaced if k in ("r", "p")]
        if tables:
            ms = max(1, int(lock_wait_s * 1000))
            await conn.execute(f"SET LOCAL statement_timeout = {ms}")
            await conn.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
            await conn.execute("SET LOCAL statement_timeout = 0")
        for n, k in moving:
            await _copy_access(conn, fresh, target, n, _KINDS[k])
        for n, k in replaced:
            await conn.execute(f"DROP {_KINDS[k]} {quote(target)}.{quote(n)} RESTRICT")
        for n, k in moving:
            await conn.execute(f"ALTER {_KINDS[k]} {quote(fresh)}.{quote(n)} "
                               f"SET SCHEMA {quote(target)}")
        await conn.execute(f"DROP SCHEMA {quote(fresh)} RESTRICT")
        return sorted(names)


async def swap_in(conn: asyncpg.Connection, fresh: str, target: str, *,
                  lock_wait_s: float = 0.4, deadline_s: float = 60.0) -> list[str]:
    """Replace the read-model relations of ``target`` by those of ``fresh`` in one
    transaction (module docstring); returns the names put in place."""
    deadline = time.monotonic() + deadline_s
    pause = 0.05
    while True:
        try:
            return await _swap_once(conn, fresh, target, lock_wait_s)
        except (asyncpg.exceptions.QueryCanceledError, asyncpg.exceptions.LockNotAvailableError,
                asyncpg.exceptions.DeadlockDetectedError) as exc:
            if time.monotonic() + pause > deadline:
                raise SwapBusy(f"the tables of schema '{target}' stayed locked by other "
                               f"sessions for {deadline_s:.0f} s ({exc})") from None
        await asyncio.sleep(pause)
        pause = min(1.0, pause * 2)
