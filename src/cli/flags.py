"""Flags shared by the sub-commands: where the HTTP API is, where the log is, where the
database is, which partitions."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chronolog.cli.errors import UsageError
from chronolog.settings import ConfigError, data_dir, open_log, parse_log_url


def add_log_flags(p: argparse.ArgumentParser, *, data_dir_help: str | None = None) -> None:
    """``--log URL``, ``--data-dir DIR``, ``--partitions N``, ``--topic-prefix P``."""
    p.add_argument("--log", help="sqlite:///path or kafka://host:port (env CHRONOLOG_LOG)")
    p.add_argument("--data-dir", help=data_dir_help or
                   "data directory for the embedded log (default ./.chronolog)")
    p.add_argument("--partitions", type=int, default=None,
                   help="partition count P (env CHRONOLOG_PARTITIONS, default 12)")
    p.add_argument("--topic-prefix", default=None, help="topic prefix (default chronolog.)")


def add_api_flags(p: argparse.ArgumentParser) -> None:
    """``--url URL`` and ``--token TOKEN``: a node's HTTP API (env ``CHRONOLOG_URL``,
    ``CHRONOLOG_TOKEN``; the flags win)."""
    p.add_argument("--url", default=None, metavar="URL",
                   help="a chronolog node's HTTP API, e.g. http://127.0.0.1:8080 (env "
                        "CHRONOLOG_URL; default: the dev node recorded in --data-dir)")
    p.add_argument("--token", default=None, metavar="TOKEN",
                   help="bearer token for --url (env CHRONOLOG_TOKEN)")


def log_from_args(args: Any) -> Any:
    """The log the flags name, not started. A ``sqlite:///path`` whose directory does not
    exist is a mistyped path, refused (exit status 2), not a new empty log in new
    directories; only a data directory's own log (``--data-dir``) is created with it."""
    try:
        cfg = parse_log_url(args.log, args.data_dir, args.partitions, args.topic_prefix)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    url = args.log or os.environ.get("CHRONOLOG_LOG")
    if cfg.kind == "sqlite" and url and not Path(cfg.target).parent.is_dir():
        raise UsageError(f"invalid --log '{url}': no directory {Path(cfg.target).parent} "
                         "(a SQLite log is a file in an existing directory)")
    return open_log(cfg)


def add_database_flag(p: argparse.ArgumentParser) -> None:
    """``--database-url DSN``."""
    p.add_argument("--database-url", default=None, metavar="DSN",
                   help="PostgreSQL DSN (env CHRONOLOG_DATABASE_URL; default: an embedded "
                        "PostgreSQL in DATA_DIR/postgres)")


def add_ready_flag(p: argparse.ArgumentParser) -> None:
    """``--ready-file PATH``: where a long-running process writes its readiness."""
    p.add_argument("--ready-file", default=None, metavar="PATH",
                   help="write this process's readiness as JSON {ready, reason, since} to PATH "
                        "whenever it changes (env CHRONOLOG_READY_FILE)")


def add_retention_flag(p: argparse.ArgumentParser) -> None:
    """``--retention DURATION``: how long finished runs keep their read-model rows, for the
    tenants that do not set their own ``retention`` (docs/design.md §9, "Retention")."""
    p.add_argument("--retention", default=None, metavar="DURATION",
                   help="how long a finished run's rows are kept, e.g. 30d (env "
                        "CHRONOLOG_RETENTION; default 30d; a tenant's own retention wins)")


def add_archive_flag(p: argparse.ArgumentParser) -> None:
    """``--archive DIR``: where events go before the log's pruning removes them
    (docs/design.md §19, §20)."""
    p.add_argument("--archive", default=None, metavar="DIR",
                   help="archive events here before they are pruned from the log (env "
                        "CHRONOLOG_ARCHIVE; default: none — then pruning waits for the "
                        "audit's checkpoint)")


def archive_from_args(args: Any) -> str | None:
    """``--archive``, else ``$CHRONOLOG_ARCHIVE``, else None; ``UsageError`` naming the
    flag for a path that exists and is not a directory."""
    value = getattr(args, "archive", None) or os.environ.get("CHRONOLOG_ARCHIVE") or None
    if value is not None and os.path.exists(value) and not os.path.isdir(value):
        raise _usage(f"--archive: {value!r} is not a directory")
    return value


def retention_from_args(args: Any, tenants: Any) -> float:
    """The deployment's retention in seconds (``--retention``, else ``$CHRONOLOG_RETENTION``,
    else 30 days), checked with the tenants' own windows (a ``result_retention`` longer than
    its tenant's retention is refused); ``UsageError`` naming the flag or field."""
    from chronolog.domain.durations import InvalidDuration, parse_duration
    from chronolog.tenants import DEFAULT_RETENTION_S

    flag = getattr(args, "retention", None)
    raw = flag if flag is not None else os.environ.get("CHRONOLOG_RETENTION")
    name = "--retention" if flag is not None else "CHRONOLOG_RETENTION"
    seconds = DEFAULT_RETENTION_S
    if raw is not None:
        try:
            seconds = parse_duration(raw)
        except InvalidDuration as exc:
            raise _usage(f"invalid {name} '{exc.value}': {exc.reason}") from None
        if seconds <= 0:
            raise _usage(f"invalid {name} '{raw}': must be positive")
    try:
        tenants.check_retention(seconds)
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    return seconds


def tenants_from_args(args: Any) -> tuple[Any, float]:
    """The tenants (``--tenants`` / ``$CHRONOLOG_TENANTS``, else the dev registry) and the
    deployment's retention (``retention_from_args``), checked together."""
    from chronolog.tenants import dev_tenants, load_tenants

    path = getattr(args, "tenants", None) or os.environ.get("CHRONOLOG_TENANTS")
    try:
        tenants = load_tenants(path) if path else dev_tenants()
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    return tenants, retention_from_args(args, tenants)


def retention_policy_from_args(args: Any) -> Any:
    """The read model's ``RetentionPolicy`` for a command without tenants of its own to
    serve (``chronolog projector``, ``chronolog replay``): ``--tenants`` /
    ``$CHRONOLOG_TENANTS`` (the tenants' own windows, if any) and ``--retention``."""
    from chronolog.projections.retention import RetentionPolicy

    return RetentionPolicy.of(*tenants_from_args(args))


def _usage(message: str) -> Exception:
    from chronolog.cli.errors import UsageError

    return UsageError(message)


def checked_database_url(url: str) -> str:
    """``url`` if it is a PostgreSQL URL a connection can be made from; else the usage error
    naming the flag (a bad port, an unclosed ``[`` of an IPv6 host, a host name no resolver
    accepts), before anything connects — a driver would fail with a traceback instead."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise _usage(f"invalid database-url '{url}' (--database-url): expected postgresql://...")
    try:
        netloc = urlsplit(url).netloc  # an unclosed "[" is a ValueError
        for host_port in netloc.rpartition("@")[2].split(","):  # host1:port1,host2:port2
            if host_port.startswith("["):  # an IPv6 address: no name to resolve
                host, port = "", host_port.partition("]")[2].removeprefix(":")
            else:
                host, _, port = host_port.partition(":")
            if port and not (port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"port {port!r} is not a number in 1-65535")
            try:
                host.encode("idna")
            except UnicodeError:
                raise ValueError(f"host {host!r} is not a host name (a label is empty or "
                                 "longer than 63 characters)") from None
    except ValueError as exc:
        raise _usage(f"invalid database-url '{url}' (--database-url): {exc}") from None
    return url


@asynccontextmanager
async def database(args: Any) -> AsyncIterator[str]:
    """The DSN the arguments name; an embedded server is started (and stopped) if needed."""
    url = args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
    if url:
        yield checked_database_url(url)
        return
    from chronolog.embedded_postgres import EmbeddedPostgres

    pg = EmbeddedPostgres(Path(data_dir(getattr(args, "data_dir", None))) / "postgres")
    was_running = await asyncio.to_thread(pg.is_running)
    dsn = await asyncio.to_thread(pg.start)
    try:
        yield dsn
    finally:
        if not was_running:
            await asyncio.to_thread(pg.stop)


@asynccontextmanager
async def existing_database(args: Any, command: str) -> AsyncIterator[str]:
    """The read model's DSN for an offline command (``chronolog replay``): ``--database-url``,
    else ``$CHRONOLOG_DATABASE_URL``, else the embedded PostgreSQL of the data directory —
    which must exist (a usage error otherwise: nothing is created). A stopped embedded server
    is started for the command (a note on stderr) and stopped after it, unless another
    client is connected to it by then (a dev node started meanwhile keeps its database)."""
    url = args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
    if url:
        yield checked_database_url(url)
        return
    from chronolog.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError

    ddir = data_dir(getattr(args, "data_dir", None))
    clusters = [ddir / "postgres", ddir / "pg"]  # chronolog dev, projector / older layouts
    cluster = next((c for c in clusters if (c / "PG_VERSION").exists()), None)
    if cluster is None:
        raise _usage(f"invalid database-url: none given and no embedded PostgreSQL in "
                     f"{ddir}/postgres (pass --database-url or set CHRONOLOG_DATABASE_URL)")
    pg = EmbeddedPostgres(cluster)
    try:
        if await asyncio.to_thread(pg.is_running):
            yield await asyncio.to_thread(pg.dsn)
            return
        print(f"note: starting the embedded PostgreSQL in {cluster} for {command} (stopped "
              "again when it ends)", file=sys.stderr, flush=True)
        dsn = await asyncio.to_thread(pg.start)
    except EmbeddedPostgresError as exc:
        raise _usage(f"invalid data-dir '{ddir}': its embedded PostgreSQL: "
                     f"{str(exc).splitlines()[0]}") from None
    try:
        yield dsn
    finally:
        if await _other_clients(dsn):
            print(f"note: left the embedded PostgreSQL in {cluster} running: another client "
                  "connected to it meanwhile", file=sys.stderr, flush=True)
        else:
            await asyncio.to_thread(pg.stop)


async def _other_clients(dsn: str) -> bool:
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except Exception:  # noqa: BLE001 - unreachable: nobody else can be using it either
        return False
    try:
        n = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                                "'client backend' AND pid <> pg_backend_pid()")
        return bool(n)
    finally:
        await conn.close()


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




def start_tracing(process: str) -> None:
    """Tracing on when the standard ``OTEL_*`` environment asks for it (docs/tracing.md),
    with ``chronolog-<process>`` as the default service name; an exporter or protocol this
    build does not have is a usage error."""
    from chronolog.telemetry.tracing import configure_tracing

    try:
        configure_tracing(f"chronolog-{process}")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
