"""``chronolog replay``: rebuild the read model in PostgreSQL from offset 0 of the event log.

    chronolog replay [--log URL | --data-dir DIR] [--partitions N]
                     --database-url DSN [--schema NAME] [--projection NAME]
                     [--to-offset N | --until TIME] [--batch N]

1. Resets the target: with ``--schema NAME`` the schema is dropped (CASCADE) and created
   again; without it the read-model tables (``schedules``, ``runs``, ``attempts``,
   ``effects``, ``projection_offsets``, ``schema_migrations``) of the connection's default
   schema are dropped. Then the shipped migrations are applied (``store.migrate()``), so
   the rebuild starts from empty tables of the current schema version. Stop the live
   projector that writes the same tables first: a rebuild replaces them.
2. Reads every partition of ``events`` (committed reads, through the EventLog port) from
   offset 0 to its end offset taken at the start, and writes batches of ``--batch`` events
   (default 1000) as ``PostgresProjectionStore.apply(project_batch(events), offsets)``: the
   batch's row changes and the partition's next offset commit in one transaction, exactly
   as the live projector's do, so a rebuild and the live tables agree row for row.
3. ``--to-offset N`` stops every partition before offset N (the stored next offset is then
   at most N, as in ``projection_offsets``); ``--until TIME`` (ISO-8601, naive = UTC) stops
   each partition at its first event whose authority time ``at`` is later than TIME, so the
   projection is always a prefix of every partition.

A progress bar (rich) is drawn on stderr when it is a terminal. Exit 0 with one summary line
on stdout; 2 with one line on stderr for bad input (log, DSN, schema, --until, --to-offset)
or an unreachable database. A record that does not decode is skipped, as the live projector
skips it (it dead-letters it), and named on stderr — so a replay rebuilds the live tables.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from chronolog.cli.errors import UsageError
from chronolog.cli.log_reader import (
    add_log_arguments,
    event_partitions,
    log_config,
    open_existing_log,
    read_partition,
)
from chronolog.domain import messages as m
from chronolog.domain.codec import DecodeError, decode_event
from chronolog.log.port import EventLog
from chronolog.projections.project import project_batch
from chronolog.projections.store import TABLES, PostgresProjectionStore

__all__ = ["ReplayError", "ReplayStats", "connect_store", "register", "replay", "reset"]

DEFAULT_BATCH = 1000
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
READ_MODEL_TABLES: tuple[str, ...] = (*TABLES, "projection_offsets", "schema_migrations")

# progress(events_consumed): called after every batch
Progress = Callable[[int], None]


class ReplayError(RuntimeError):
    """The replay stopped (a record does not decode); committed batches stay."""


@dataclass
class ReplayStats:
    """What a replay read and wrote."""

    events: int = 0
    batches: int = 0
    partitions: int = 0
    offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset stored
    rows: dict[str, int] = field(default_factory=dict)  # row writes per table
    missing: int = 0  # partial changes that found no row
    skipped: list[str] = field(default_factory=list)  # "p<partition>@<offset>: <error>"


def register(subparsers: Any) -> None:
    """Add the ``replay`` sub-command to the ``chronolog`` parser."""
    parser = subparsers.add_parser(
        "replay",
        help="rebuild the PostgreSQL read model from offset 0 of the event log",
        description="Drop and recreate the read-model tables, then project every event "
                    "from offset 0 (optionally up to an offset or a time).",
    )
    add_log_arguments(parser)
    parser.add_argument("--database-url", metavar="DSN",
                        help="PostgreSQL to rebuild (default: $CHRONOLOG_DATABASE_URL)")
    parser.add_argument("--schema", metavar="NAME",
                        help="rebuild in this schema (dropped and created again) instead of "
                             "the connection's default schema")
    parser.add_argument("--projection", default="main", metavar="NAME",
                        help="projection name in projection_offsets (default: main)")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--to-offset", type=int, metavar="N",
                      help="stop every partition before offset N")
    stop.add_argument("--until", metavar="TIME",
                      help="stop each partition at its first event later than TIME (ISO-8601)")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                        help=f"events per transaction (default {DEFAULT_BATCH})")
    parser.set_defaults(func=run)


# ---------------------------------------------------------------------------------------
# the replay itself (used by the CLI and by tests)


async def connect_store(dsn: str, schema: str | None, projection: str = "main"
                        ) -> PostgresProjectionStore:
    """A store whose connections use ``schema`` first in their search_path."""
    settings = {"search_path": f'"{schema}"'} if schema else None
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, server_settings=settings)
    assert pool is not None
    return PostgresProjectionStore(pool, projection)


async def reset(store: PostgresProjectionStore, schema: str | None) -> None:
    """Empty the target (drop the schema, or the read-model tables) and migrate it."""
    async with store.pool.acquire() as conn:
        if schema:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.execute(f'CREATE SCHEMA "{schema}"')
        else:
            names = ", ".join(f'"{t}"' for t in READ_MODEL_TABLES)
            await conn.execute(f"DROP TABLE IF EXISTS {names} CASCADE")
    await store.migrate()


async def replay(
    log: EventLog,
    store: PostgresProjectionStore,
    *,
    to_offset: int | None = None,
    until: datetime | None = None,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
    stops: dict[int, int] | None = None,
) -> ReplayStats:
    """Project every partition of ``events`` from offset 0 into an empty store.

    ``stops`` (partition -> end offset) fixes where each partition ends; by default its end
    offset now, capped by ``to_offset``.
    """
    topic = log.topics.events
    stats = ReplayStats(partitions=await event_partitions(log))
    for p in range(stats.partitions):
        stop = stops[p] if stops is not None else await log.end_offset(topic, p)
        if to_offset is not None:
            stop = min(stop, to_offset)
        next_offset = 0
        stats.offsets[p] = 0
        async for records in read_partition(log, topic, p, 0, stop, batch=batch):
            envelopes: list[m.EventEnvelope] = []
            end = next_offset
            done = False
            for rec in records:
                try:
                    env = decode_event(rec.value)
                except DecodeError as exc:  # skipped, as the live projector skips it
                    stats.skipped.append(f"p{p}@{rec.offset}: {exc}")
                    end = rec.offset + 1
                    continue
                if until is not None and env.at > until:
                    done = True
                    break
                envelopes.append(env)
                end = rec.offset + 1
            await _write(store, topic, p, next_offset, end, envelopes, stats)
            if progress is not None:
                progress(len(envelopes))
            next_offset = end
            if done:
                break
        stats.offsets[p] = next_offset
    return stats


async def _write(store: PostgresProjectionStore, topic: str, p: int, start: int, end: int,
                 envelopes: list[m.EventEnvelope], stats: ReplayStats) -> None:
    if end <= start:
        return
    result = await store.apply(project_batch(envelopes), {(topic, p): (start, end)},
                               last_event_at={(topic, p): envelopes[-1].at} if envelopes else {})
    stats.events += len(envelopes)
    stats.batches += 1
    for table, n in result.rows.items():
        stats.rows[table] = stats.rows.get(table, 0) + n
    stats.missing += sum(len(keys) for keys in result.missing.values())


# ---------------------------------------------------------------------------------------
# the command


def _parse_until(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"invalid until '{text}': expected an ISO-8601 time such as "
                         "2026-03-02T09:00:00Z") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _check(args: argparse.Namespace) -> tuple[str, datetime | None]:
    dsn = args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
    if not dsn:
        raise UsageError("invalid database-url: required (--database-url or "
                         "CHRONOLOG_DATABASE_URL)")
    if not dsn.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"invalid database-url '{dsn}': expected postgresql://...")
    if args.schema is not None and not _SCHEMA.match(args.schema):
        raise UsageError(f"invalid schema '{args.schema}': lower-case letters, digits and _")
    if args.to_offset is not None and args.to_offset < 0:
        raise UsageError(f"invalid to-offset '{args.to_offset}': must be >= 0")
    if args.batch < 1:
        raise UsageError(f"invalid batch '{args.batch}': must be >= 1")
    return dsn, _parse_until(args.until) if args.until is not None else None


async def _run(args: argparse.Namespace) -> tuple[ReplayStats, dict[str, int]]:
    dsn, until = _check(args)
    cfg = log_config(args)
    log = await open_existing_log(cfg)
    try:
        topic = log.topics.events
        partitions = await event_partitions(log)
        stops = {p: await log.end_offset(topic, p) for p in range(partitions)}
        if args.to_offset is not None:
            stops = {p: min(n, args.to_offset) for p, n in stops.items()}
        try:
            store = await connect_store(dsn, args.schema, args.projection)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise UsageError(f"cannot connect to database-url: {exc}") from None
        try:
            await reset(store, args.schema)
            with _progress_bar(sum(stops.values())) as advance:
                stats = await replay(log, store, until=until, batch=args.batch,
                                     progress=advance, stops=stops)
            counts = {}
            for table in TABLES:
                counts[table] = int(await store.pool.fetchval(f'SELECT count(*) FROM "{table}"'))
            return stats, counts
        finally:
            await store.close()
    finally:
        await log.close()


class _progress_bar:
    """A rich progress bar on stderr (a no-op when stderr is not a terminal)."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TextColumn("events"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console,
            disable=not console.is_terminal,
        )
        self._task = self._progress.add_task("replay", total=total)

    def __enter__(self) -> Progress:
        self._progress.start()
        return lambda n: self._progress.advance(self._task, n)

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def run(args: argparse.Namespace) -> int:
    """Execute ``chronolog replay``."""
    try:
        stats, counts = asyncio.run(_run(args))
    except ReplayError as exc:
        print(f"replay stopped: {exc}", file=sys.stderr)
        return 1
    where = f"schema {args.schema}" if args.schema else "the default schema"
    tables = ", ".join(f"{t} {n}" for t, n in counts.items())
    offsets = " ".join(f"p{p}={o}" for p, o in sorted(stats.offsets.items()))
    print(f"replay done: {stats.events} events from {stats.partitions} partitions into "
          f"{where} (projection {args.projection}): {tables}; next offsets {offsets}")
    for skipped in stats.skipped:
        print(f"note: skipped a record that does not decode: {skipped}", file=sys.stderr)
    if stats.missing:
        print(f"note: {stats.missing} row changes found no row to update (events for rows "
              "that were never created)", file=sys.stderr)
    return 0
