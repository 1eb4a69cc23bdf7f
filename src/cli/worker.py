"""``chronolog worker`` and ``chronolog gc``.

``chronolog worker [--log URL|--data-dir DIR] [--partitions N] [--classes a,b]
[--concurrency N] [--worker-id ID] [--builtin-jobs] [--jobs MODULE_OR_FILE ...]``
runs a worker until SIGTERM/SIGINT (graceful drain; a second signal forces it); started
while the log is away, it waits for it. ``--ready-file PATH`` (env ``CHRONOLOG_READY_FILE``)
receives its readiness: ready while the consumer of every resource class is in its group
and the log answers. ``--jobs``
imports a module (``pkg.mod``) or a file (``path/jobs.py``) and calls its
``register(worker)``. Staged results go to ``--results DIR`` (default ``<data dir>/results``).
``--pool NAME`` joins a worker pool of the tenants file: the pool's credential comes from the
environment variable ``CHRONOLOG_WORKER_CREDENTIAL`` or from ``--credential-file PATH`` (a file
only its owner may read, mode 0600), never from the command line, where ``ps`` would show it.

``chronolog gc [--data-dir DIR | --results DIR] [--log URL] --grace 1h [--dry-run] [--json]
[--tenants FILE] [--retention DURATION]``
deletes staged result objects that no ResultPublished references and whose attempt can never
publish, once older than the grace period, and published ones of runs finished longer ago
than their tenant's ``result_retention`` (see ``chronolog.workers.gc``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from chronolog.cli.flags import (
    add_log_flags,
    add_ready_flag,
    add_retention_flag,
    log_from_args,
    start_tracing,
    tenants_from_args,
)


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run job handlers for ready runs")
    add_log_flags(p)
    p.add_argument("--classes", default="default",
                   help="comma-separated resource classes to serve (default: default)")
    p.add_argument("--concurrency", type=int, default=4, help="slots per resource class")
    p.add_argument("--prefetch", type=int, default=None,
                   help="claimed runs that may wait for a slot, per class (default: concurrency)")
    p.add_argument("--worker-id", default=None, help="worker identity (default host-pid-rand)")
    p.add_argument("--builtin-jobs", action="store_true",
                   help="register the built-in jobs noop, echo, sleep, fail")
    p.add_argument("--jobs", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="import a module or .py file and call its register(worker); repeatable")
    p.add_argument("--results", default=None, help="result store directory "
                   "(default <data dir>/results)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds running handlers may finish after SIGTERM (default 30)")
    p.add_argument("--reply-timeout", type=float, default=10.0,
                   help="seconds to wait for a command's reply before re-sending it")
    p.add_argument("--pool", default=None, help="join this worker pool (tenants file "
                   "[pools.NAME]); credential from $CHRONOLOG_WORKER_CREDENTIAL or "
                   "--credential-file")
    p.add_argument("--credential-file", default=None, metavar="PATH",
                   help="file holding the pool's credential (mode 0600)")
    p.add_argument("--group", default=None, help=argparse.SUPPRESS)
    add_ready_flag(p)
    p.set_defaults(func=_run_worker)

    g = sub.add_parser("gc", help="remove unreferenced staged result objects")
    add_log_flags(g)
    g.add_argument("--results", default=None, help="result store directory "
                   "(default <data dir>/results)")
    g.add_argument("--grace", default="1h", help="minimum age of a removed object (default 1h)")
    g.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    g.add_argument("--tenants", default=None,
                   help="tenants TOML, for their result_retention (env CHRONOLOG_TENANTS)")
    add_retention_flag(g)
    g.set_defaults(func=_run_gc)


def results_dir(args: Any) -> Path:
    from chronolog.settings import data_dir

    return Path(args.results) if args.results else data_dir(args.data_dir) / "results"


def _load_jobs(spec: str, worker: Any) -> None:
    from chronolog.cli.errors import UsageError

    try:
        if spec.endswith(".py") or "/" in spec:
            path = Path(spec)
            mod_spec = importlib.util.spec_from_file_location(f"chronolog_jobs_{path.stem}", path)
            if mod_spec is None or mod_spec.loader is None:
                raise UsageError(f"--jobs: cannot load '{spec}'")
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
    except (ImportError, OSError) as exc:
        raise UsageError(f"--jobs: cannot import '{spec}': {exc}") from None
    reg = getattr(module, "register", None)
    if not callable(reg):
        raise UsageError(f"--jobs: '{spec}' has no register(worker) function")
    reg(worker)


def _run_worker(args: Any) -> int:
    from chronolog.cli.errors import UsageError
    from chronolog.logging import configure_logging
    from chronolog.readiness import ready_file
    from chronolog.workers.results import FilesystemResultStore
    from chronolog.workers.runtime import Worker

    configure_logging()
    start_tracing("worker")
    classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    if not classes:
        raise UsageError("--classes: at least one resource class is required")
    if args.concurrency < 1:
        raise UsageError(f"--concurrency: must be at least 1, got {args.concurrency}")
    if args.prefetch is not None and args.prefetch < 0:
        raise UsageError(f"--prefetch: must not be negative, got {args.prefetch}")
    bad = [c for c in classes if c.lower().startswith("pool-")]
    if bad:
        raise UsageError(f"--classes: a resource class may not start with 'pool-': '{bad[0]}'")
    credential = pool_credential(args.pool, args.credential_file)
    _warn_if_no_log(args)
    log_ = log_from_args(args)
    worker = Worker(log_, worker_id=args.worker_id, resource_classes=classes,
                    pool=args.pool, credential=credential,
                    concurrency=args.concurrency,
                    result_store=FilesystemResultStore(results_dir(args)),
                    group=args.group, drain_timeout=args.drain_timeout,
                    reply_timeout=args.reply_timeout, prefetch=args.prefetch)
    if args.builtin_jobs:
        worker.builtin_jobs()
    for spec in args.jobs:
        _load_jobs(spec, worker)
    if not worker.job_types:
        raise UsageError("no jobs registered: pass --builtin-jobs or --jobs MODULE_OR_FILE")

    return asyncio.run(_serve_worker(log_, worker, ready_file(args.ready_file)))


def _warn_if_no_log(args: Any) -> None:
    """A SQLite log file that is not there yet: no error (its node may start after this
    worker), but said on stderr, so a mistyped path is not a silent new, empty log."""
    from chronolog.settings import ConfigError, parse_log_url

    try:
        cfg = parse_log_url(args.log, args.data_dir, args.partitions, args.topic_prefix)
    except ConfigError:
        return  # log_from_args says what is wrong
    if cfg.kind == "sqlite" and Path(cfg.target).parent.is_dir() and \
            not Path(cfg.target).exists():
        print(f"warning: no log at {cfg.target} yet: this worker starts a new, empty log "
              "there and waits for runs; is it the log its node or processor writes?",
              file=sys.stderr, flush=True)


CREDENTIAL_ENV = "CHRONOLOG_WORKER_CREDENTIAL"


def pool_credential(pool: str | None, path: str | None) -> str | None:
    """The credential of ``--pool``: from ``--credential-file`` (owner-only) or
    ``$CHRONOLOG_WORKER_CREDENTIAL``; UsageError names the flag."""
    import os
    import re
    import stat

    from chronolog.cli.errors import UsageError

    if pool is None:
        if path is not None:
            raise UsageError("--credential-file: only with --pool")
        return None
    if not re.fullmatch(r"[a-z0-9-]{1,64}", pool):
        raise UsageError(f"--pool: '{pool}' is not a pool name (1 to 64 of a-z, 0-9 and -)")
    if path is not None:
        try:
            mode = os.stat(path).st_mode
            secret = Path(path).read_text().strip()
        except OSError as exc:
            raise UsageError(f"--credential-file: cannot read '{path}': {exc.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(f"--credential-file: '{path}' is readable by others than its "
                             f"owner (mode {stat.S_IMODE(mode):04o}; use 0600)")
    else:
        secret = os.environ.get(CREDENTIAL_ENV, "").strip()
    if not secret:
        raise UsageError(f"--pool: no credential: set {CREDENTIAL_ENV} or pass --credential-file")
    return secret


async def _serve_worker(log_: Any, worker: Any, ready_path: str | None) -> int:
    """Start the log — waiting for it while it is away — and run the worker until
    signalled, its readiness probed (``chronolog.readiness``)."""
    from chronolog import lifecycle
    from chronolog.readiness import Readiness, log_reachable, probing
    from chronolog.workers.runtime import run_until_signalled

    async def probe() -> tuple[bool, str]:
        ready, reason = worker.readiness()
        away = await log_reachable(log_) if ready else None
        return (False, away) if away else (ready, reason)

    stopped = asyncio.Event()

    async def start() -> None:
        try:
            await log_.start()
        except BaseException:
            await log_.close()
            raise

    async def wait_for_log() -> None:
        await lifecycle.keep_running(start, stopped, "worker",
                                     max_delay=lifecycle.SERVE_RETRY_MAX_S)

    try:
        async with probing(Readiness("worker", ready_path), probe):
            status = await lifecycle.run_until_signalled(wait_for_log(), stopped.set)
            if stopped.is_set():
                return status
            return await run_until_signalled(worker)
    finally:
        await log_.close()


def _run_gc(args: Any) -> int:
    import orjson

    from chronolog.cli.errors import UsageError
    from chronolog.domain.durations import parse_duration
    from chronolog.workers.gc import collect
    from chronolog.workers.results import FilesystemResultStore

    try:
        grace = parse_duration(args.grace)
    except ValueError as exc:
        raise UsageError(f"--grace: invalid duration '{args.grace}': {exc}") from None
    tenants, retention = tenants_from_args(args)
    log_ = log_from_args(args)
    store = FilesystemResultStore(results_dir(args))

    async def main() -> Any:
        await log_.start()
        try:
            await log_.ensure_topics()  # idempotent; a brand-new log simply references nothing
            return await collect(log_, store, grace, dry_run=args.dry_run,
                                 result_retention=lambda t: tenants.result_retention(
                                     t, retention))
        finally:
            await log_.close()

    report = asyncio.run(main())
    if args.json:
        sys.stdout.write(orjson.dumps(report.as_dict()).decode() + "\n")
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(f"scanned {report.scanned} staged objects: {verb} {len(report.deleted)} "
              f"({report.expired} past their run's result_retention, {report.pruned} of "
              f"runs pruned from the log), kept "
              f"{report.kept_referenced} referenced, {report.kept_open} still publishable or "
              f"unknown to the log, {report.kept_young} younger than the grace")
    return 0
