"""``chronolog api``: serve the HTTP API (uvicorn) until SIGTERM/SIGINT.

    chronolog api [--log URL] [--data-dir DIR] [--partitions N] [--topic-prefix P]
                  [--database-url DSN] [--tenants FILE] [--host 127.0.0.1] [--port 8080]
                  [--with-projector] [--reply-timeout S] [--visible-timeout S]

Commands go to the log through a ``Client`` (replies read back from ``replies``); queries
read PostgreSQL (``--database-url`` / ``$CHRONOLOG_DATABASE_URL`` / an embedded server in
``DATA_DIR/postgres``, migrated at start). Tenants come from ``--tenants`` /
``$CHRONOLOG_TENANTS``; without a file the dev registry applies (tenant ``default``, token
``dev``). ``--with-projector`` also runs a projector in this process (single-node setups;
read-your-writes then waits on it directly and ``/metrics`` includes fence rejections).

The same port serves the web dashboard at ``/`` (``chronolog.api.dashboard``: log in with
a tenant's token).

``/healthz`` is its readiness (503 naming the log or the read model while either is away);
``--ready-file PATH`` (env ``CHRONOLOG_READY_FILE``) writes the same to a file
(``chronolog.readiness``). SIGTERM stops it within ``chronolog.lifecycle.HARD_STOP_S``
whatever its services do: open requests get ``SHUTDOWN_S``, then the log, client and
database close, and the process exits with status 1 if that has not happened in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from chronolog.api.server import Server, server_config
from chronolog.cli.flags import (
    add_database_flag,
    add_log_flags,
    add_ready_flag,
    add_retention_flag,
    database,
    log_from_args,
    retention_from_args,
    start_tracing,
)
from chronolog.wakeup import wait_within

__all__ = ["register", "serve"]

SHUTDOWN_S = 4  # after SIGTERM: requests still open are cancelled after this long


def register(sub: Any) -> None:
    p = sub.add_parser("api", help="serve the HTTP API")
    add_log_flags(p)
    add_database_flag(p)
    p.add_argument("--tenants", default=None, help="tenants TOML (env CHRONOLOG_TENANTS)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--with-projector", action="store_true",
                   help="also run the projector in this process")
    p.add_argument("--reply-timeout", type=float, default=10.0,
                   help="seconds to wait for a command's reply before answering 503")
    p.add_argument("--max-body-bytes", type=int, default=None, metavar="N",
                   help="largest request body (env CHRONOLOG_MAX_BODY_BYTES; default 256 KiB)")
    p.add_argument("--visible-timeout", default=None, metavar="SECONDS",
                   help="how long a write waits for the read model to show it (env "
                   "CHRONOLOG_VISIBLE_TIMEOUT; default 2)")
    add_retention_flag(p)
    add_ready_flag(p)
    p.set_defaults(func=_run)


def _run(args: Any) -> int:
    from chronolog.cli.errors import UsageError
    from chronolog.logging import configure_logging
    from chronolog.settings import ConfigError, max_body_bytes, visible_timeout
    from chronolog.tenants import dev_tenants, load_tenants

    configure_logging()
    start_tracing("api")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"invalid port '{args.port}': must be 0..65535")
    path = args.tenants or os.environ.get("CHRONOLOG_TENANTS")
    try:
        args.max_body_bytes = max_body_bytes(args.max_body_bytes)
        args.visible_timeout = visible_timeout(args.visible_timeout)
        tenants = load_tenants(path) if path else dev_tenants()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    args.retention = retention_from_args(args, tenants)
    from chronolog.api.server import server_limits
    try:
        args.limits = server_limits()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return asyncio.run(serve(args, tenants))


async def serve(args: Any, tenants: Any) -> int:
    from chronolog.api.app import create_app
    from chronolog.api.routes.ops import unavailable_services
    from chronolog.cli.errors import UsageError
    from chronolog.client import Client
    from chronolog.lifecycle import HARD_STOP_S, connect_when_up, hard_stop_after
    from chronolog.projections.projector import Projector
    from chronolog.projections.store import PostgresProjectionStore
    from chronolog.readiness import Readiness, probing, ready_file

    log_ = log_from_args(args)
    readiness = Readiness("api", ready_file(args.ready_file))
    async with database(args) as dsn:
        try:  # started while PostgreSQL is away: wait for it
            store = await connect_when_up(
                lambda: PostgresProjectionStore.connect(dsn, max_size=10), "api",
                lambda exc: readiness.set(False, f"read model unreachable: {exc}"[:300]))
        except Exception as exc:  # noqa: BLE001 - refused for good: a usage error
            raise UsageError(f"cannot connect to database-url: {exc}") from None
        if store is None:  # stopped while waiting
            readiness.set(False, "stopped")
            return 0
        client: Client | None = None
        projector: Projector | None = None
        task: asyncio.Task[None] | None = None
        try:
            await store.migrate()
            await log_.start()
            await log_.ensure_topics()
            client = Client(log_, principal="api", reply_timeout=args.reply_timeout)
            await client.start()
            if args.with_projector:
                from chronolog.projections.retention import RetentionPolicy

                projector = Projector(log_, store,
                                      retention=RetentionPolicy.of(tenants, args.retention))
                task = asyncio.create_task(projector.run(), name="projector")
            app = create_app(client, store, tenants, projector=projector,
                             reply_timeout=args.reply_timeout,
                             max_body_bytes=args.max_body_bytes,
                             visible_timeout=args.visible_timeout, limits=args.limits,
                             retention=args.retention)
            # open requests get a few seconds after a signal; the whole process is bounded
            config = server_config(app, args.host, args.port, args.limits, log_level="warning",
                                   lifespan="off", timeout_graceful_shutdown=SHUTDOWN_S)
            server = Server(config)
            loop = asyncio.get_running_loop()

            def on_signal() -> None:
                if not server.should_exit:
                    hard_stop_after(HARD_STOP_S)
                server.request_exit()

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)

            async def probe() -> tuple[bool, str]:
                away = await unavailable_services(app.state.chronolog)
                return (False, "; ".join(away)) if away else (True, "serving")

            async with probing(readiness, probe):
                await server.serve()
        finally:
            if projector is not None and task is not None:
                projector.stop()
                with contextlib.suppress(Exception):
                    await wait_within(task, 30)
            if client is not None:
                await client.close()
            await log_.close()
            await store.close()
    return 0
