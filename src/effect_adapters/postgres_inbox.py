"""PostgreSQL inbox effects (asyncpg): contract ``transactional`` — exactly once.

The business write and an inbox row keyed by the effect ID commit in ONE PostgreSQL
transaction::

    BEGIN;
      INSERT INTO chronolog_inbox (effect_id, run_id, checksum) VALUES (...)
        ON CONFLICT (effect_id) DO NOTHING RETURNING applied_at;
      -- inserted: run the business SQL   ($1 = the result as JSON text, $2 = effect_id)
      -- not inserted: already applied — compare the stored checksum:
      --   equal → succeeded (duplicate=True), nothing written again;
      --   different → failed (the same effect ID carried another result: a conflict)
    COMMIT;

A concurrent duplicate blocks on the uncommitted inbox row and then sees it, so two runners
cannot both apply it. A lost COMMIT reply is harmless: the transaction either committed (the
retry finds the inbox row) or did not (the retry applies it), hence every connection-level
error is ``retry_later``. Serialization failures and deadlocks (SQLSTATE class 40) are
retried too; any other SQL error is a permanent failure with its SQLSTATE as evidence.

The guarantee holds inside that database only: the business SQL must write to the same
database as the inbox, and must not call out to other systems.

Config (the operator's postgres destination in the tenants file): ``dsn`` and ``sql``
(both required), ``inbox_table`` (default ``chronolog_inbox``; created if missing). There is
no default database: the node's own read-model database server (``database_url`` given to
the adapter), any database on it and in any spelling of its address, is refused even when a
destination names it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import asyncpg
import orjson

from chronolog.destinations import database_refusal
from chronolog.domain import messages as m
from chronolog.effect_adapters.base import Contract, EffectContext, Outcome, Stopwatch

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")
DEFAULT_INBOX = "chronolog_inbox"


def inbox_ddl(table: str) -> str:
    return (f"CREATE TABLE IF NOT EXISTS {table} ("
            "effect_id text PRIMARY KEY, run_id text NOT NULL, checksum text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())")


class PostgresInboxEffectAdapter:
    """Business SQL + inbox row in one transaction; contract ``transactional``."""

    kind = "postgres"

    def __init__(self, database_url: str | None = None) -> None:
        self.database_url = database_url  # the node's own database: never a destination
        self._pools: dict[str, asyncpg.Pool] = {}
        self._ready: set[tuple[str, str]] = set()

    @property
    def contract(self) -> Contract:
        return "transactional"

    async def close(self) -> None:
        for pool in self._pools.values():
            await pool.close()
        self._pools.clear()

    async def _pool(self, dsn: str) -> asyncpg.Pool:
        pool = self._pools.get(dsn)
        if pool is None:
            pool = await asyncpg.create_pool(dsn, min_size=0, max_size=4, timeout=10)
            self._pools[dsn] = pool
        return pool

    async def _ensure_inbox(self, pool: asyncpg.Pool, dsn: str, table: str) -> None:
        if (dsn, table) in self._ready:
            return
        async with pool.acquire() as conn, conn.transaction():
            # concurrent CREATE TABLE IF NOT EXISTS can still collide on the catalog
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"inbox:{table}")
            await conn.execute(inbox_ddl(table))
        self._ready.add((dsn, table))

    async def perform(
        self, intent: m.EffectIntended, payload: Any, ctx: EffectContext | None = None
    ) -> Outcome:
        cfg = intent.config
        dsn = cfg.get("dsn")
        sql = cfg.get("sql")
        table = cfg.get("inbox_table", DEFAULT_INBOX)
        if not dsn:
            return Outcome.failed(reason="config: dsn is required")
        # names resolved off the event loop, just before connecting
        why = await asyncio.to_thread(database_refusal, dsn, self.database_url)
        if why is not None:
            return Outcome.failed(reason=f"config: {why}; refused")
        if not sql:
            return Outcome.failed(reason="config: sql is required")
        if not _IDENT.match(table):
            return Outcome.failed(reason=f"config: invalid inbox_table {table!r}")
        sw = Stopwatch()
        base = {"contract": "transactional", "inbox_table": table}
        try:
            pool = await self._pool(dsn)
            await self._ensure_inbox(pool, dsn, table)
            async with pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow(
                    f"INSERT INTO {table} (effect_id, run_id, checksum) VALUES ($1, $2, $3) "
                    "ON CONFLICT (effect_id) DO NOTHING RETURNING applied_at",
                    intent.effect_id, intent.run_id, intent.checksum)
                if row is None:
                    prior = await conn.fetchrow(
                        f"SELECT run_id, checksum, applied_at FROM {table} WHERE effect_id = $1",
                        intent.effect_id)
                    assert prior is not None  # the conflicting row is committed and visible
                    if prior["checksum"] != intent.checksum:
                        return Outcome.failed(
                            **base, reason="inbox conflict: effect already applied with "
                            "another checksum", stored_checksum=prior["checksum"],
                            checksum=intent.checksum, elapsed_ms=sw.ms())
                    return Outcome.succeeded(**base, duplicate=True,
                                             applied_at=prior["applied_at"].isoformat(),
                                             elapsed_ms=sw.ms())
                tag = await conn.execute(sql, orjson.dumps(payload).decode(),
                                         intent.effect_id)
            return Outcome.succeeded(**base, duplicate=False, command_tag=tag,
                                     applied_at=row["applied_at"].isoformat(), elapsed_ms=sw.ms())
        except asyncpg.PostgresError as exc:
            state = getattr(exc, "sqlstate", "") or ""
            ev = {**base, "sqlstate": state, "error": str(exc)[:500], "elapsed_ms": sw.ms()}
            if state.startswith(("40", "08", "53", "57")):  # serialization, connection, resources
                return Outcome.retry_later(**ev)
            return Outcome.failed(**ev)
        except (OSError, asyncpg.InterfaceError, TimeoutError) as exc:
            # possibly a lost COMMIT reply: safe to repeat, the inbox row decides
            return Outcome.retry_later(**base, error=f"{type(exc).__name__}: {exc}",
                                       elapsed_ms=sw.ms())
