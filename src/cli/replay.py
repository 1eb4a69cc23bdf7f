"""``chronolog replay``: rebuild the PostgreSQL read model from offset 0 of the log, beside
the live one, and put it in place in one transaction.

    chronolog replay [--log URL | --data-dir DIR] [--partitions N]
                     [--database-url DSN] [--schema NAME] [--projection NAME]
                     [--to-offset N | --until TIME] [--batch N]
                     [--tenants FILE] [--retention DURATION] [--archive DIR]

The database is ``--database-url``, else ``$CHRONOLOG_DATABASE_URL``, else the embedded
PostgreSQL of the data directory (``DIR/postgres`` of ``chronolog dev``; it must exist): a
stopped one is started for the command and stopped after it, so ``chronolog replay
--data-dir DIR`` alone rebuilds a stopped dev node's read model. The target is the schema
``--schema NAME`` (created if missing), else the connection's default schema (its
``current_schema()``, usually ``public``).

A replay never empties tables that someone reads or writes:

1. **The lease.** It takes the target schema's projection lease exclusively
   (``chronolog.projections.lease``: a PostgreSQL advisory lock every running projector
   holds, shared, for the schema it writes). If a projector holds it — a running
   ``chronolog dev``, ``chronolog projector`` or ``chronolog api --with-projector`` on that
   database and schema — nothing is touched: exit 1 with one line naming the holder,
   ``error: unavailable: the projection 'main' is held by a running projector (pid N on
   host H); stop it first or replay into --schema NAME``. The running projector goes on as
   if nothing happened. A projector started while the replay runs waits for it, then goes
   on from the rebuilt tables' offsets.
2. **The build.** It migrates a fresh schema ``chronolog_replay_<random>`` from empty and
   folds into it every partition of ``events`` from offset 0 to its end offset taken at the
   start, in move-barrier order (``chronolog.projections.ordered``: a moved key's events on
   its old home first; a partition whose ``KeyMovedIn`` has no handover in the log stops
   before it, where the live projector holds it, and is named on stderr), in batches of
   ``--batch`` events (default 1000) written as
   ``PostgresProjectionStore.apply(project_batch(events), offsets)`` — the row changes and the
   partition's next offset in one transaction, exactly as the live projector writes them —
   and the whole ``workers`` topic (the workers directory: ``workers``,
   ``served_job_types``) and ``dlq`` topic (``dead_letters``), as far as they went at the
   start. ``--to-offset N`` stops every partition of ``events`` before offset N; ``--until
   TIME`` (ISO-8601, naive = UTC) stops each at its first event whose authority time ``at``
   is later than TIME (a prefix of every partition). A record that does not decode is
   skipped, as the live projector skips it (it dead-letters it), and named on stderr; a
   replay writes nothing to the log.
   Retention (``chronolog.projections.retention``) is applied as the live projector applies
   it — after each batch, against the newest event time projected, with the windows of
   ``--tenants`` / ``$CHRONOLOG_TENANTS`` and ``--retention`` / ``$CHRONOLOG_RETENTION``
   (give it the projector's) — so the rebuilt tables hold the rows the live ones do.
   Before its first batch the build makes the day partitions of ``runs`` and ``attempts``
   the live projector keeps (the days of the window back from today and the next days,
   ``chronolog.projections.retention.ensure_partitions``), so the history lands in the
   same days.
3. **The swap.** Only when the build is complete, one transaction replaces the target's
   read-model tables by the fresh ones (``chronolog.projections.rebuild.swap_in``: lock,
   drop the old, move the new in, keeping their owner and grants) and drops the fresh schema.
   A reader sees the old read model or the new one, never a missing or half-built table. A
   replay that fails before the swap drops its fresh schema and leaves the target as it was.

A pruned partition (``start_offset`` above 0, design §20) is never folded from what is
left as if it were whole: that would silently lack the pruned history. Before anything is
touched ``refuse_pruned`` decides how each is read, and a note on stderr names the way:

* with ``--archive DIR`` (env ``CHRONOLOG_ARCHIVE``) holding its pruned part: the whole
  history, from the archive below its archived end, then from the log (``ArchivedHistory``);
* else the *window* (``chronolog.cli.replay_window``, design §9 "Replay of the window"): its
  latest snapshot's states as rows, the retained events, then the tail after the snapshot;
* with neither a usable snapshot nor such an archive, or a stop (``--to-offset``,
  ``--until``) before its snapshot: refused, exit 1 naming the partitions.

A progress bar (rich) is drawn on stderr when it is a terminal. Exit 0 with one summary line
on stdout; 2 with one line on stderr for bad input (log, DSN, schema, --until, --to-offset,
a data directory without an embedded PostgreSQL) or an unreachable database; 1 with one line
for a lease held by others or a failure during the replay (the target untouched).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import asyncpg

from chronolog.archive import ArchiveError
from chronolog.archive.source import ArchivedHistory
from chronolog.cli.errors import UsageError
from chronolog.cli.flags import (
    add_retention_flag,
    checked_database_url,
    existing_database,
    retention_policy_from_args,
)
from chronolog.cli.log_reader import (
    add_log_arguments,
    event_partitions,
    log_config,
    open_existing_log,
)
from chronolog.cli.replay_window import (
    Window,
    WindowUnavailable,
    fold_before,
    load_window,
    seed,
    seed_effects,
)
from chronolog.domain import messages as m
from chronolog.domain.barrier import Barrier, BarrierOrder, record_handovers
from chronolog.domain.codec import DecodeError
from chronolog.log.port import EventLog, LogError, Record
from chronolog.log.reading import Readable
from chronolog.projections.dead_letters import DeadLetterFold
from chronolog.projections.lease import LeaseHeld, ProjectionLease, current_schema
from chronolog.projections.migrate import MigrationError
from chronolog.projections.ordered import read_in_order
from chronolog.projections.project import project_batch
from chronolog.projections.rebuild import (
    FRESH_PREFIX,
    SwapBusy,
    check_versions,
    drop_schema,
    fresh_schema_name,
    quote,
    swap_in,
)
from chronolog.projections.retention import RetentionPolicy, ensure_partitions, prune
from chronolog.projections.store import TABLES, PostgresProjectionStore
from chronolog.projections.window import drop_unknown_finishes
from chronolog.projections.workers import WorkerDirectory

__all__ = [
    "Pruned",
    "ReplayError",
    "ReplayStats",
    "connect_store",
    "fold_dead_letters",
    "fold_workers",
    "rebuild",
    "refuse_pruned",
    "register",
    "replay",
]

DEFAULT_BATCH = 1000
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
COUNTED: tuple[str, ...] = (*TABLES, "workers", "dead_letters")  # counts of the summary line

# progress(events_consumed): called after every batch
Progress = Callable[[int], None]


class ReplayError(RuntimeError):
    """The replay stopped before its swap; the target is untouched."""


@dataclass
class ReplayStats:
    """What a replay read and wrote."""

    events: int = 0
    batches: int = 0
    partitions: int = 0
    offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset stored
    rows: dict[str, int] = field(default_factory=dict)  # row writes per table
    missing: int = 0  # partial changes that found no row
    pruned: int = 0  # finished runs past their retention, pruned
    skipped: list[str] = field(default_factory=list)  # "p<partition>@<offset>: <error>"
    worker_records: int = 0  # records of the workers topic folded
    letter_records: int = 0  # records of the dlq topic folded
    counts: dict[str, int] = field(default_factory=dict)  # rows per table once built
    schema: str = ""  # the schema the rebuilt read model was put in
    # partition -> (old home, routing version): held before a KeyMovedIn whose old home's
    # HandedOver the log does not have (the live projector holds it there too)
    held: dict[int, tuple[int, int]] = field(default_factory=dict)
    # a replay of the window: events folded before the snapshot's states (step 1 of
    # chronolog.cli.replay_window), and (partition, offset, old home, version) of each
    # KeyMovedIn read past without its handover
    window_events: int = 0
    window_missing: int = 0  # ... of which changes to rows of the pruned history (none made)
    read_past: list[tuple[int, int, int, int]] = field(default_factory=list)


def register(subparsers: Any) -> None:
    """Add the ``replay`` sub-command to the ``chronolog`` parser."""
    parser = subparsers.add_parser(
        "replay",
        help="rebuild the PostgreSQL read model from offset 0 of the event log",
        description="Rebuild the read model from offset 0 (optionally up to an offset or a "
                    "time) in a fresh schema, then swap it in for the live tables in one "
                    "transaction. Refused while a projector runs on the same tables.",
    )
    add_log_arguments(parser)
    parser.add_argument("--database-url", metavar="DSN",
                        help="PostgreSQL to rebuild (default: $CHRONOLOG_DATABASE_URL, else "
                             "the embedded PostgreSQL of the data directory, started for the "
                             "command if it is stopped)")
    parser.add_argument("--schema", metavar="NAME",
                        help="put the rebuilt read model in this schema (created if missing) "
                             "instead of the connection's default schema")
    parser.add_argument("--projection", default="main", metavar="NAME",
                        help="projection name in projection_offsets (default: main)")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--to-offset", type=int, metavar="N",
                      help="stop every partition before offset N")
    stop.add_argument("--until", metavar="TIME",
                      help="stop each partition at its first event later than TIME (ISO-8601)")
    parser.add_argument("--archive", metavar="DIR", default=os.environ.get("CHRONOLOG_ARCHIVE"),
                        help="read the history below each partition's archived end from this "
                             "archive, so a pruned log replays whole rather than from its "
                             "snapshots (env CHRONOLOG_ARCHIVE)")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                        help=f"events per transaction (default {DEFAULT_BATCH})")
    parser.add_argument("--tenants", default=None,
                        help="tenants TOML, for their retention (env CHRONOLOG_TENANTS)")
    add_retention_flag(parser)
    parser.set_defaults(func=run)


# ---------------------------------------------------------------------------------------
# the replay itself (used by the CLI and by tests)


async def connect_store(dsn: str, schema: str | None, projection: str = "main"
                        ) -> PostgresProjectionStore:
    """A store whose connections use ``schema`` first in their search_path."""
    settings = {"search_path": quote(schema)} if schema else None
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, server_settings=settings)
    assert pool is not None
    return PostgresProjectionStore(pool, projection)


async def replay(
    log: EventLog,
    store: PostgresProjectionStore,
    *,
    to_offset: int | None = None,
    until: datetime | None = None,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
    stops: dict[int, int] | None = None,
    retention: RetentionPolicy | None = None,
    history: ArchivedHistory | None = None,
    windows: Mapping[int, Window] | None = None,
) -> ReplayStats:
    """Project every partition of ``events`` from offset 0 into an empty store.

    ``stops`` (partition -> end offset) fixes where each partition ends; by default its end
    offset now, capped by ``to_offset``. ``retention`` (default: the default policy, as the
    live projector's) prunes finished runs past their window after every batch.
    ``history`` (the archive + the log) serves the reads of ``events`` below each
    partition's archived end from the archive. ``windows`` (pruned partitions replayed from
    their snapshots, ``chronolog.cli.replay_window``): those partitions are built from their
    states and retained events, then read on from their snapshot's ``fold_from``.
    """
    policy = retention or RetentionPolicy()
    windows = windows or {}
    topic = log.topics.events
    stats = ReplayStats(partitions=await event_partitions(log))
    ends: dict[int, int] = {}
    for p in range(stats.partitions):
        stop = stops[p] if stops is not None else await log.end_offset(topic, p)
        ends[p] = stop if to_offset is None else min(stop, to_offset)
        stats.offsets[p] = 0
    await ensure_partitions(store.pool, policy)  # the days the live projector would have
    if windows:
        await seed(store, topic, windows)
        stats.window_events, stats.window_missing = await fold_before(log, store, windows,
                                                                      ends, batch)
        await seed_effects(store, windows)
        for p, w in windows.items():
            stats.offsets[p] = w.resume
    order = BarrierOrder()
    source: Readable = log if history is None else history
    async for taken in read_in_order(source, topic, ends, until=until, batch=batch,
                                     order=order, on_stuck=_read_past(stats) if windows
                                     else None,
                                     starts={p: w.resume for p, w in windows.items()}):
        p = taken.partition
        for rec, env in taken.items:
            if isinstance(env, DecodeError):  # skipped, as the live projector skips it
                stats.skipped.append(f"p{p}@{rec.offset}: {env}")
        envelopes = taken.envelopes
        window = windows.get(p)
        if window is not None:  # each key's events from the offset its state is as of
            envelopes = [e for r, e in taken.items if isinstance(e, m.EventEnvelope)
                         and r.offset >= window.through(e.key)]
        await _write(store, topic, p, stats.offsets[p], taken.end, envelopes, stats,
                     last_at=taken.envelopes[-1].at if taken.envelopes else None,
                     read=taken.envelopes)
        stats.pruned += (await prune(store.pool, policy, projection=store.projection,
                                     topic=topic)).runs
        if progress is not None:
            progress(len(envelopes))
        stats.offsets[p] = taken.end
    stats.held = {p: (b.partition, b.version) for p, b in order.stuck().items()}
    if windows:
        stats.pruned += await drop_unknown_finishes(store.pool)
    return stats


def _read_past(stats: ReplayStats) -> Callable[[int, Barrier, Record], None]:
    """A replay of the window reads past a ``KeyMovedIn`` whose handover is not in the log:
    its old home's handover may have been pruned (named on stderr)."""
    def stuck(partition: int, barrier: Barrier, record: Record) -> None:
        stats.read_past.append((partition, record.offset, barrier.partition, barrier.version))
    return stuck


async def _write(store: PostgresProjectionStore, topic: str, p: int, start: int, end: int,
                 envelopes: list[m.EventEnvelope], stats: ReplayStats,
                 last_at: datetime | None = None,
                 read: list[m.EventEnvelope] | None = None) -> None:
    if end <= start:
        return
    handed: dict[int, int] = {}
    record_handovers(handed, p, envelopes if read is None else read)
    last_at = last_at or (envelopes[-1].at if envelopes else None)
    result = await store.apply(project_batch(envelopes), {(topic, p): (start, end)},
                               last_event_at={(topic, p): last_at} if last_at else {},
                               handed_over={(topic, p): v for p, v in handed.items()})
    stats.events += len(envelopes)
    stats.batches += 1
    for table, n in result.rows.items():
        stats.rows[table] = stats.rows.get(table, 0) + n
    stats.missing += sum(len(keys) for keys in result.missing.values())


class _Fold(Protocol):
    """A fold of a side topic into the read model (workers, dlq): one pass per ``step``."""

    topic: str
    records: int
    skipped: list[str]

    async def step(self, wait_ms: int = 0) -> int: ...


async def _fold(log: EventLog, store: PostgresProjectionStore, fold: _Fold,
                skipped: list[str] | None) -> int:
    """Run ``fold`` up to its topic's end offsets now; the records read."""
    try:
        n = await log.partitions_for(fold.topic)
    except LogError:
        return 0  # a log from before that topic
    ends = {p: await log.end_offset(fold.topic, p) for p in range(n)}
    while True:
        stored = {r["partition"]: r["next_offset"] for r in await store.pool.fetch(
            "SELECT partition, next_offset FROM projection_offsets "
            "WHERE projection = $1 AND topic = $2", store.projection, fold.topic)}
        if all(stored.get(p, 0) >= end for p, end in ends.items()):
            break
        if await fold.step(0) == 0:
            break  # nothing readable below the ends (commit markers, compacted records)
    if skipped is not None:
        skipped.extend(fold.skipped)
    return fold.records


async def fold_workers(log: EventLog, store: PostgresProjectionStore,
                       skipped: list[str] | None = None) -> int:
    """Fold the ``workers`` topic, up to its end offsets now, into the store's workers tables
    (as the live projector's directory does, without dead-lettering); the records read."""
    directory = WorkerDirectory(log, store.pool, store.projection, dead_letter=False)
    return await _fold(log, store, directory, skipped)


async def fold_dead_letters(log: EventLog, store: PostgresProjectionStore,
                            skipped: list[str] | None = None) -> int:
    """Fold the ``dlq`` topic, up to its end offsets now, into ``dead_letters`` (as the live
    projector's fold does, without dead-lettering); the records read."""
    letters = DeadLetterFold(log, store.pool, store.projection, dead_letter=False)
    return await _fold(log, store, letters, skipped)


async def rebuild(
    log: EventLog,
    dsn: str,
    *,
    schema: str | None = None,
    projection: str = "main",
    until: datetime | None = None,
    batch: int = DEFAULT_BATCH,
    stops: dict[int, int] | None = None,
    progress: Progress | None = None,
    retention: RetentionPolicy | None = None,
    history: ArchivedHistory | None = None,
    windows: Mapping[int, Window] | None = None,
) -> ReplayStats:
    """The whole replay (module docstring): lease, build in a fresh schema, swap in.

    Raises ``LeaseHeld`` (nothing touched) when a projector holds the target's lease."""
    settings = {"search_path": quote(schema)} if schema else None
    try:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, server_settings=settings)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise UsageError(f"cannot connect to database-url: {exc}") from None
    assert pool is not None
    try:
        target = schema or await current_schema(pool)
        lease = await ProjectionLease.exclusive(pool, target, projection)
        try:
            async with pool.acquire() as conn:
                await check_versions(conn, target)
            fresh = fresh_schema_name()
            await pool.execute(f"CREATE SCHEMA {quote(fresh)}")
            try:
                store = await connect_store(dsn, fresh, projection)
                try:
                    await store.migrate()
                    stats = await replay(log, store, until=until, batch=batch,
                                         progress=progress, stops=stops,
                                         retention=retention, history=history,
                                         windows=windows)
                    stats.worker_records = await fold_workers(log, store, stats.skipped)
                    stats.letter_records = await fold_dead_letters(log, store, stats.skipped)
                    for table in COUNTED:
                        stats.counts[table] = int(await store.pool.fetchval(
                            f"SELECT count(*) FROM {quote(table)}"))
                finally:
                    await store.close()
                async with pool.acquire() as conn:
                    await swap_in(conn, fresh, target)
                stats.schema = target
                return stats
            finally:
                await drop_schema(pool, fresh)  # left only by a failure before the swap
        finally:
            await lease.release()
    finally:
        await pool.close()


# ---------------------------------------------------------------------------------------
# the command


def _parse_until(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"invalid until '{text}': expected an ISO-8601 time such as "
                         "2026-03-02T09:00:00Z") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _check(args: argparse.Namespace) -> datetime | None:
    dsn = args.database_url
    if dsn is not None:
        checked_database_url(dsn)
    if args.schema is not None:
        if not _SCHEMA.match(args.schema):
            raise UsageError(f"invalid schema '{args.schema}': lower-case letters, digits "
                             "and _, at most 63")
        if args.schema.startswith(("pg_", FRESH_PREFIX)):
            raise UsageError(f"invalid schema '{args.schema}': names starting with pg_ or "
                             f"{FRESH_PREFIX} are reserved")
    if args.to_offset is not None and args.to_offset < 0:
        raise UsageError(f"invalid to-offset '{args.to_offset}': must be >= 0")
    if args.batch < 1:
        raise UsageError(f"invalid batch '{args.batch}': must be >= 1")
    args.retention_policy = retention_policy_from_args(args)
    return _parse_until(args.until) if args.until is not None else None


@dataclass
class Pruned:
    """How a replay reads the pruned partitions of ``events`` (``refuse_pruned``):
    partition -> its log's start, for those read whole from the archive; partition -> its
    snapshot, for those replayed from it (the replay of the window)."""

    archived: dict[int, int] = field(default_factory=dict)
    windows: dict[int, Window] = field(default_factory=dict)


async def refuse_pruned(log: EventLog, stops: dict[int, int],
                        history: ArchivedHistory | None = None, *,
                        until: datetime | None = None) -> Pruned:
    """How each partition of ``events`` pruned below the part the replay would fold
    (``start_offset > 0`` and below its stop) is read (design §20, "Replay after pruning"):
    from the archive, when ``history``'s archive holds everything below its start (the
    whole history, as before pruning); else from its latest snapshot and the retained events
    (``chronolog.cli.replay_window``). ``ReplayError`` before the database is touched, naming
    every partition that can be neither: no archive holding its pruned part and no usable
    snapshot, or a stop (``--to-offset``, ``--until``) before its snapshot."""
    topic = log.topics.events
    refused = []
    out = Pruned()
    for p, stop in sorted(stops.items()):
        start = await log.start_offset(topic, p)
        if start == 0 or stop == 0:
            continue
        if history is not None and _archive_holds(history, p, start):
            out.archived[p] = start
            continue
        try:
            window = await load_window(log, p, start)
        except WindowUnavailable as exc:
            refused.append(f"p{p} starts at offset {start} and {exc}")
            continue
        if until is not None or stop < window.last_through:
            refused.append(f"p{p} starts at offset {start} and its snapshot is as of offset "
                           f"{window.last_through}: a replay of it cannot stop before that")
            continue
        out.windows[p] = window
    if refused:
        raise ReplayError(f"the event log was pruned ({'; '.join(refused)}); a replay from "
                          "offset 0 would lack the history before those offsets"
                          + ("" if history is None else ", which the archive does not hold"))
    return out


def _archive_holds(history: ArchivedHistory, p: int, start: int) -> bool:
    entries = history.entries(p)
    return bool(entries) and entries[0].start == 0 and history.archived_end(p) >= start


async def _run(args: argparse.Namespace) -> ReplayStats:
    until = _check(args)
    cfg = log_config(args)
    log = await open_existing_log(cfg)
    try:
        topic = log.topics.events
        partitions = await event_partitions(log)
        stops = {p: await log.end_offset(topic, p) for p in range(partitions)}
        if args.to_offset is not None:
            stops = {p: min(n, args.to_offset) for p, n in stops.items()}
        history = None
        if args.archive is not None:
            try:
                history = ArchivedHistory(args.archive, log)
            except (ArchiveError, OSError) as exc:
                raise UsageError(f"invalid archive '{args.archive}': {exc}") from None
        args.pruned = await refuse_pruned(log, stops, history, until=until)
        async with existing_database(args, "this replay") as dsn:
            with _progress_bar(sum(stops.values())) as advance:
                return await rebuild(log, dsn, schema=args.schema, projection=args.projection,
                                     until=until, batch=args.batch, stops=stops,
                                     progress=advance, retention=args.retention_policy,
                                     history=history, windows=args.pruned.windows)
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
        self._started = False

    def __enter__(self) -> Progress:
        def advance(n: int) -> None:  # drawn from the first batch on (not for a refusal)
            if not self._started:
                self._started = True
                self._progress.start()
            self._progress.advance(self._task, n)

        return advance

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._progress.stop()


def run(args: argparse.Namespace) -> int:
    """Execute ``chronolog replay``."""
    try:
        stats = asyncio.run(_run(args))
    except LeaseHeld as exc:
        print(f"error: unavailable: {exc}; stop it first or replay into --schema NAME",
              file=sys.stderr)
        return 1
    except (ReplayError, MigrationError, SwapBusy) as exc:
        print(f"error: replay stopped, the read model is untouched: {exc}", file=sys.stderr)
        return 1
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        text = str(exc).replace("\n", " ")
        print(f"error: replay stopped, the read model is untouched: {type(exc).__name__}: "
              f"{text}", file=sys.stderr)
        return 1
    tables = ", ".join(f"{t} {n}" for t, n in stats.counts.items())
    offsets = " ".join(f"p{p}={o}" for p, o in sorted(stats.offsets.items()))
    print(f"replay done: {stats.events + stats.window_events} events from "
          f"{stats.partitions} partitions into "
          f"schema {stats.schema} (projection {args.projection}): {tables}; next offsets "
          f"{offsets}")
    for p, start in sorted(args.pruned.archived.items()):
        print(f"note: partition {p} was pruned below offset {start}: its history was read "
              "from the archive, then the log", file=sys.stderr)
    for p, w in sorted(args.pruned.windows.items()):
        print(f"note: partition {p} was pruned below offset {w.start}: replayed from its "
              f"snapshot ({len(w.loaded.states)} schedule states, events from offset "
              f"{w.fold_from}) and the retained events from offset {w.start}; the columns a "
              "state does not carry are the projection's only where an event of the window "
              "gives them", file=sys.stderr)
    for p, offset, old, version in stats.read_past:
        print(f"note: partition {p} read past a key moved in from partition {old} (routing "
              f"version {version}, offset {offset}) whose handover is not in the log",
              file=sys.stderr)
    for skipped in stats.skipped:
        print(f"note: skipped a record that does not decode: {skipped}", file=sys.stderr)
    for p, (old, version) in sorted(stats.held.items()):
        print(f"note: partition {p} stops at a key moved in from partition {old} (routing "
              f"version {version}) whose handover is not in the log; 'chronolog audit' "
              "reports it", file=sys.stderr)
    if stats.missing:
        print(f"note: {stats.missing} row changes found no row to update (events for rows "
              "that were never created)", file=sys.stderr)
    return 0
