"""``chronolog dev``: a whole node on one machine (see ``chronolog.devnode.node``)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

from chronolog.cli.errors import UsageError
from chronolog.cli.flags import (
    add_archive_flag,
    add_retention_flag,
    archive_from_args,
    retention_from_args,
    start_tracing,
)
from chronolog.devnode.audits import AUDIT_EVERY_S
from chronolog.devnode.node import run_dev


def register(sub: Any) -> None:
    p = sub.add_parser("dev", help="run a whole node on the embedded log and PostgreSQL")
    p.add_argument("--data-dir", default=None, help="data directory (default ./.chronolog)")
    p.add_argument("--port", type=int, default=8080, help="HTTP API port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP API address (default 127.0.0.1)")
    p.add_argument("--tenants", default=None, help="tenants TOML (env CHRONOLOG_TENANTS)")
    p.add_argument("--quiet", action="store_true", help="no live view; logs only")
    p.add_argument("--partitions", type=int, default=None,
                   help="partition count (env CHRONOLOG_PARTITIONS, default 12)")
    p.add_argument("--database-url", default=None,
                   help="use this PostgreSQL instead of the embedded one")
    p.add_argument("--no-demo", action="store_true", help="do not seed the demo schedules")
    p.add_argument("--no-builtin", action="store_true",
                   help="no built-in worker: only workers you attach (`chronolog worker "
                        "--data-dir DIR --jobs ...`) serve runs")
    add_retention_flag(p)
    add_archive_flag(p)
    p.set_defaults(func=_run)


def _run(args: Any) -> int:
    from chronolog.settings import (
        ConfigError,
        clock_step_from_env,
        data_dir,
        effect_response_cap,
        interval_from_env,
        max_body_bytes,
        partitions_from_env,
        visible_timeout,
    )

    try:
        ddir = data_dir(args.data_dir)
        partitions = args.partitions if args.partitions is not None else partitions_from_env()
        if not 1 <= partitions <= 1024:
            raise ConfigError(f"invalid --partitions '{partitions}': must be 1..1024")
        if not 0 < args.port < 65536:
            raise ConfigError(f"invalid --port '{args.port}': must be 1..65535")
        tenants_path = args.tenants or os.environ.get("CHRONOLOG_TENANTS")
        tenants = _tenants(tenants_path)
        retention = retention_from_args(args, tenants)
        archive = archive_from_args(args)
        prune_every = interval_from_env("CHRONOLOG_PRUNE_EVERY", 30.0)
        audit_every = interval_from_env("CHRONOLOG_AUDIT_EVERY", AUDIT_EVERY_S)
        clock_step_from_env(0, 0)  # the processor's (read again by the node): checked here
        _check_destinations(tenants, partitions, args.database_url
                            or os.environ.get("CHRONOLOG_DATABASE_URL"))
        effect_response_cap()  # a bad CHRONOLOG_EFFECT_MAX_RESPONSE_BYTES (webhook effects)
        # what the node's API reads again: refused here, before the lock, named as the
        # variable (the api command's flags for them are not the dev node's)
        for check, flag, variable in ((max_body_bytes, "max-body-bytes",
                                       "CHRONOLOG_MAX_BODY_BYTES"),
                                      (visible_timeout, "visible-timeout",
                                       "CHRONOLOG_VISIBLE_TIMEOUT")):
            try:
                check()
            except ConfigError as exc:
                raise ConfigError(str(exc).replace(f"invalid {flag} ", f"invalid {variable} ",
                                                   1)) from None
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    from chronolog.api.server import server_limits
    try:
        server_limits()  # so is a bad server or session bound (CHRONOLOG_HEADER_TIMEOUT...)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from chronolog.devnode.lock import LOCK_FILE, DataDirInUse, acquire_node_lock
    from chronolog.devnode.nodefile import api_url

    # a port in use refuses a start in a new directory before the lock would create it
    # (on a directory another node holds, the lock's refusal names that node instead)
    if not (ddir / LOCK_FILE).exists() and (ddir.is_dir() or not ddir.exists()):
        _check_port(args.host, args.port)
    # before anything else touches the directory: a node already on it is left alone
    try:
        lock = acquire_node_lock(ddir, api_url(args.host, args.port))
    except DataDirInUse as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # not a directory, not ours to write in
        raise UsageError(f"invalid --data-dir '{ddir}': {exc.strerror or exc}") from None
    try:
        return _run_locked(args, ddir, partitions, tenants, tenants_path, retention, archive,
                           prune_every, audit_every, lock.fd)
    finally:
        lock.release()


def _run_locked(args: Any, ddir: Path, partitions: int, tenants: Any, tenants_path: str | None,
                retention: float | None, archive: str | None, prune_every: float,
                audit_every: float | None, lock_fd: int) -> int:
    """The node, once this process holds the data directory (``chronolog.devnode.lock``)."""
    from chronolog.log.datadir import private_dir
    from chronolog.logging import configure_logging
    from chronolog.settings import ConfigError

    private_dir(ddir)  # 0700; a wider one is tightened with a warning
    log_path = None
    if args.quiet or not sys.stdout.isatty():
        configure_logging()
    else:  # the live view owns the terminal: logs go to a file (the banner says where)
        log_path = ddir / "dev.log"
        _log_to_file(log_path)
    start_tracing("dev")
    _check_port(args.host, args.port)
    try:
        return asyncio.run(run_dev(ddir, args.host, args.port, tenants, partitions,
                                   quiet=args.quiet or not sys.stdout.isatty(),
                                   database_url=args.database_url or
                                   os.environ.get("CHRONOLOG_DATABASE_URL"),
                                   demo=not args.no_demo and not args.no_builtin,
                                   tenants_path=tenants_path, builtin=not args.no_builtin,
                                   log_path=log_path, retention=retention,
                                   archive=archive, prune_every=prune_every,
                                   audit_every=audit_every, lock_fd=lock_fd))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _check_destinations(tenants: Any, partitions: int, database_url: str | None) -> None:
    """``ConfigError`` for a destination this node must refuse (its database, its topics)."""
    from chronolog.destinations import check_destinations
    from chronolog.log.port import Topics

    check_destinations(tenants, Topics(partitions=partitions), database_url)


def _tenants(path: str | None) -> Any:
    from chronolog.tenants import dev_tenants, load_tenants

    return load_tenants(path) if path else dev_tenants()


def _log_to_file(path: Path) -> None:
    """Every log line as JSON into ``path`` (the libraries' from WARNING up)."""
    from chronolog.logging import configure_logging

    stream = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    configure_logging(json=True, stream=stream, library_level="WARNING")


def _check_port(host: str, port: int) -> None:
    if not _port_free(host, port):
        raise UsageError(f"invalid --port '{port}': {host}:{port} is in use")


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
