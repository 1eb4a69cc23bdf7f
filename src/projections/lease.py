"""The projection lease: who may write the read-model tables of a schema right now.

Every running projector (``Projector.run``) holds a *shared* PostgreSQL advisory lock on the
schema its tables are in, for as long as it runs; ``chronolog replay`` takes the same lock
*exclusively* before it reads anything and keeps it until its rebuilt tables are swapped in
(``chronolog.projections.rebuild``). So:

* a replay learns from the database itself, not from a pid file, whether a projector is
  writing the tables it would replace — ``pg_try_advisory_lock`` fails — and who it is
  (``holders``: the backend holding the lock and the ``application_name`` the holder set on
  that connection, ``chronolog:<role>:<projection>:<pid>@<host>``);
* a projector that starts while a replay runs waits for it (polling, so ``stop()`` still
  works), then loads the offsets of the tables swapped in: it never writes into a table a
  replay is about to drop;
* several projectors on one schema (disjoint partition sets, or a second one racing the
  first) share the lock.

A session advisory lock lives as long as its connection: a projector that dies (kill -9, a
lost connection, a database restart) releases it with its backend — nothing to clean up, no
stale holder. A projector whose lease connection is gone stops writing (``LeaseLost``, an
outage its caller retries) instead of going on unprotected.

The key is the two-int form (``LEASE_CLASS``, a 31-bit hash of the schema name), within the
connection's database; the migration lock (``migrate.ADVISORY_LOCK_KEY``) is a one-key lock
and lives in another key space.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from dataclasses import dataclass

import asyncpg
import structlog

__all__ = [
    "LEASE_CLASS",
    "Holder",
    "LeaseHeld",
    "LeaseLost",
    "ProjectionLease",
    "current_schema",
    "holders",
    "lease_key",
]

log = structlog.get_logger("chronolog.projections.lease")

LEASE_CLASS = 0x63686C70  # "chlp": chronolog's projection leases (fits a signed int4)
_APP_NAME_MAX = 63  # PostgreSQL keeps NAMEDATALEN - 1 bytes of application_name


def lease_key(schema: str) -> tuple[int, int]:
    """The advisory-lock key (two int4) of the read model in ``schema``."""
    digest = hashlib.blake2b(schema.encode(), digest_size=4).digest()
    return LEASE_CLASS, int.from_bytes(digest, "big") & 0x7FFFFFFF


async def current_schema(conn: asyncpg.Connection | asyncpg.Pool) -> str:
    """The schema unqualified tables resolve to on this connection (its search_path)."""
    name = await conn.fetchval("SELECT current_schema()")
    if name is None:
        raise LookupError("no schema of the connection's search_path exists")
    return str(name)


def _application_name(role: str, projection: str) -> str:
    text = f"chronolog:{role}:{projection}:{os.getpid()}@{socket.gethostname()}"
    return text.encode()[:_APP_NAME_MAX].decode(errors="ignore")


@dataclass(frozen=True)
class Holder:
    """A session holding a schema's lease."""

    backend_pid: int  # the PostgreSQL backend
    exclusive: bool
    role: str | None = None  # "projector" | "replay" (from its application_name)
    projection: str | None = None
    pid: int | None = None  # the holder's process, on its host
    host: str | None = None

    @classmethod
    def parse(cls, backend_pid: int, exclusive: bool, app: str | None) -> Holder:
        parts = (app or "").split(":", 3)
        if len(parts) == 4 and parts[0] == "chronolog":
            _, role, projection, rest = parts
            pid, _, host = rest.rpartition(":")[2].partition("@")
            if pid.isdigit():
                return cls(backend_pid, exclusive, role, projection, int(pid), host or None)
        return cls(backend_pid, exclusive)

    def describe(self) -> str:
        """``a running projector (pid N on host H)``."""
        what = f"a running {self.role}" if self.role else "another session"
        if self.pid is None:
            return f"{what} (PostgreSQL backend {self.backend_pid})"
        return f"{what} (pid {self.pid} on host {self.host or '?'})"


class LeaseHeld(RuntimeError):
    """The schema's lease is held by others (a running projector or another replay)."""

    def __init__(self, schema: str, projection: str, holders: list[Holder]) -> None:
        self.schema = schema
        self.holders = holders
        first = holders[0] if holders else None
        self.projection = (first.projection if first and first.projection else projection)
        who = first.describe() if first else "another session"
        more = f" and {len(holders) - 1} more" if len(holders) > 1 else ""
        super().__init__(f"the projection '{self.projection}' is held by {who}{more}")


class LeaseLost(ConnectionError):
    """The connection holding a projector's lease is gone: stop writing (and retry)."""


async def holders(conn: asyncpg.Connection | asyncpg.Pool, schema: str) -> list[Holder]:
    """The sessions holding ``schema``'s lease now (exclusive first, then by backend)."""
    k1, k2 = lease_key(schema)
    rows = await conn.fetch(
        "SELECT l.pid, l.mode, a.application_name FROM pg_locks l "
        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
        "AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "ORDER BY l.mode <> 'ExclusiveLock', l.pid", k1, k2)
    return [Holder.parse(r["pid"], r["mode"] == "ExclusiveLock", r["application_name"])
            for r in rows]


class ProjectionLease:
    """A held lease: one connection of the pool kept for as long as it is held."""

    def __init__(self, pool: asyncpg.Pool, conn: asyncpg.Connection, schema: str,
                 exclusive: bool) -> None:
        self.pool = pool
        self.conn = conn
        self.schema = schema
        self.is_exclusive = exclusive
        self._released = False

    @classmethod
    async def shared(cls, pool: asyncpg.Pool, projection: str,
                     stopping: asyncio.Event | None = None, poll_s: float = 0.5
                     ) -> ProjectionLease | None:
        """A projector's lease on the schema of ``pool``; waits while a replay holds it
        exclusively. None if ``stopping`` was set while waiting."""
        conn = await pool.acquire()
        try:
            schema = await current_schema(conn)
            k1, k2 = lease_key(schema)
            await conn.execute("SELECT set_config('application_name', $1, false)",
                               _application_name("projector", projection))
            said = False
            while not await conn.fetchval("SELECT pg_try_advisory_lock_shared($1, $2)", k1, k2):
                if not said:
                    said = True
                    log.warning("projector_waiting_for_lease", schema=schema,
                                held_by=[h.describe() for h in await holders(conn, schema)])
                if await _stopped_within(stopping, poll_s):
                    await pool.release(conn)
                    return None
            if said:
                log.info("projector_lease_taken", schema=schema)
        except BaseException:
            await _give_back(pool, conn)
            raise
        return cls(pool, conn, schema, exclusive=False)

    @classmethod
    async def exclusive(cls, pool: asyncpg.Pool, schema: str, projection: str,
                        role: str = "replay") -> ProjectionLease:
        """The whole schema's lease for a replay, now; ``LeaseHeld`` naming the holders if
        any projector (or another replay) holds it."""
        k1, k2 = lease_key(schema)
        conn = await pool.acquire()
        try:
            await conn.execute("SELECT set_config('application_name', $1, false)",
                               _application_name(role, projection))
            for _ in range(5):
                if await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", k1, k2):
                    return cls(pool, conn, schema, exclusive=True)
                found = await holders(conn, schema)
                if found:
                    raise LeaseHeld(schema, projection, found)
                await asyncio.sleep(0.05)  # released between the two queries: try again
            raise LeaseHeld(schema, projection, [])
        except BaseException:
            await _give_back(pool, conn)
            raise

    def check(self) -> None:
        """Raise ``LeaseLost`` if the connection holding the lease is gone."""
        if self.conn.is_closed():
            raise LeaseLost(f"the connection holding the lease on schema '{self.schema}' "
                            "was lost")

    async def release(self) -> None:
        """Give the lease (and its connection) back; idempotent."""
        if self._released:
            return
        self._released = True
        k1, k2 = lease_key(self.schema)
        unlock = "pg_advisory_unlock" if self.is_exclusive else "pg_advisory_unlock_shared"
        try:
            if not self.conn.is_closed():
                await self.conn.fetchval(f"SELECT {unlock}($1, $2)", k1, k2)
        except Exception:  # noqa: BLE001 - a broken connection: closing it frees the lock
            self.conn.terminate()
        await _give_back(self.pool, self.conn)


async def _stopped_within(stopping: asyncio.Event | None, seconds: float) -> bool:
    """Wait ``seconds`` or until ``stopping`` is set; whether it is."""
    if stopping is None:
        await asyncio.sleep(seconds)
        return False
    # not asyncio.wait_for: under Python 3.11 it can swallow a cancellation
    waiter = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()
    return stopping.is_set()


async def _give_back(pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    try:
        await pool.release(conn)  # resets the session: application_name, any lock left
    except Exception:  # noqa: BLE001 - a connection that cannot be reset is closed instead
        conn.terminate()
