"""``chronolog dev``: a whole chronolog node in one process, on one machine.

Processors, the projector, a worker with the built-in jobs (unless ``--no-builtin``), the
effect runner and the HTTP API, on the embedded SQLite log and an embedded PostgreSQL, all
under ``./.chronolog/`` (or ``--data-dir``). No Java, no Kafka, no Docker, no separately
installed database.

A part that fails is restarted with bounded exponential backoff (``chronolog.devnode.supervisor``),
and the node says so on stderr, in its log and in the live view; the other parts go on.
Once the API serves, the node records its address and token in ``DATA_DIR/node.json``
(``chronolog.devnode.nodefile``) for the CLI to find; a clean stop removes it.
SIGTERM / Ctrl-C stops it in order — API (open requests get ``API_GRACE_S``, then are
cancelled), workers (drain), effects, processor (finishing its open transaction), projector —
then closes the log and stops the embedded PostgreSQL. A restart on the same data directory
restores every schedule from the log and applies each schedule's misfire policy to the
downtime.

The caller holds the data directory (``chronolog.devnode.lock``: one node per directory)
before ``run_dev`` touches it, and hands the open lock file down to the embedded
PostgreSQL's watchdog (``chronolog.devnode.watchdog``), started before the server: a node
killed with ``-9`` leaves no server running for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("chronolog.devnode.node")

API_GRACE_S = 2.0
"""After Ctrl-C, requests still open get this long before the API cancels them."""
WATCHDOG_EXIT_S = 10.0
"""A clean stop waits at most this long for the watchdog (``chronolog.devnode.watchdog``)."""

DEMO_SCHEDULES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("demo-echo", {"every": "5s", "job": {"type": "echo", "params": {"hello": "chronolog"}},
                   "overlap": "skip"}),
    ("demo-weekday-report", {"cron": "0 9 * * 1-5", "timezone": "America/New_York",
                             "job": {"type": "echo", "params": {"report": "sales"}},
                             "misfire": "latest"}),
)


@dataclass
class DevNode:
    """The running parts of a dev node (for the live view and the shutdown order)."""

    data_dir: Path
    port: int
    host: str
    started: float = field(default_factory=time.monotonic)
    parts: dict[str, Any] = field(default_factory=dict)
    log_path: Path | None = None  # where the node logs while the live view owns the terminal


async def run_dev(
    ddir: Path, host: str, port: int, tenants: Any, partitions: int, *, quiet: bool,
    database_url: str | None = None, demo: bool = True, tenants_path: str | None = None,
    builtin: bool = True, log_path: Path | None = None, retention: float | None = None,
    archive: str | None = None, prune_every: float = 30.0, audit_every: float | None = None,
    lock_fd: int | None = None,
) -> int:
    """Start every part, serve until SIGTERM/SIGINT, stop every part in order. ``lock_fd``:
    the open ``node.lock`` the caller holds (``chronolog.devnode.lock``), handed down to the
    embedded PostgreSQL's watchdog."""
    from chronolog.destinations import check_destinations
    from chronolog.devnode.nodefile import NodeInfo, api_url, remove_node_file, write_node_file
    from chronolog.devnode.watchdog import start_watchdog
    from chronolog.embedded_postgres import EmbeddedPostgres
    from chronolog.log.datadir import private_dir, private_umask
    from chronolog.log.port import Topics
    from chronolog.log.sqlite import SqliteEventLog
    from chronolog.projections.store import PostgresProjectionStore
    from chronolog.settings import visible_timeout

    visible_timeout()  # a bad CHRONOLOG_VISIBLE_TIMEOUT is a ConfigError before anything starts
    private_umask()  # every file the node creates is its owner's alone
    private_dir(ddir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    pg = watchdog = None
    if database_url is None:
        pg = EmbeddedPostgres(ddir / "postgres")
        # first the watchdog, so that the server is stopped however this process ends
        watchdog = start_watchdog(pg.data_dir, lock_fd)
        try:
            database_url = await asyncio.to_thread(pg.start)
        except BaseException:
            await _end_watchdog(watchdog)
            raise
    lg = SqliteEventLog(ddir / "log.db", Topics(partitions=partitions))
    store = None
    try:
        await lg.start()
        first_run = await _is_empty(lg)
        await lg.ensure_topics()
        # the embedded database's address is known only now (ConfigError for the caller)
        check_destinations(tenants, Topics(partitions=partitions), database_url)
        store = await PostgresProjectionStore.connect(database_url)
        await store.migrate()
        node = DevNode(ddir, port, host, log_path=log_path)

        async def started(node: DevNode) -> None:
            tenant = next(iter(tenants.tenants.values()), None)
            token = tenant.tokens[0] if tenant is not None and tenant.tokens else None
            write_node_file(ddir, NodeInfo(api_url(host, port), token, os.getpid()))
            if first_run and demo:
                await _seed_demo(node.parts["client"], tenants)
            _banner(node, tenants, tenants_path, first_run and demo)

        await run_node(node, lg, store, tenants, stop, database_url=database_url,
                       on_started=started, view=not quiet, builtin=builtin,
                       retention=retention, archive=archive, prune_every=prune_every,
                       audit_every=audit_every)
        return 0
    finally:
        began = time.monotonic()
        with contextlib.suppress(OSError):
            remove_node_file(ddir, os.getpid())
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        with contextlib.suppress(Exception):
            await lg.close()
        log.info("node_closed", store_and_log_s=round(time.monotonic() - began, 3))
        if pg is not None:
            began = time.monotonic()
            await asyncio.to_thread(pg.stop)
            log.info("embedded_postgres_stopped", after_s=round(time.monotonic() - began, 3))
        if watchdog is not None:
            await _end_watchdog(watchdog)
        print("chronolog dev: stopped", file=sys.stderr, flush=True)


async def run_node(
    node: DevNode, lg: Any, store: Any, tenants: Any, stop: asyncio.Event, *,
    database_url: str | None = None, on_started: Any = None, view: bool = False,
    supervisor: Any = None, builtin: bool = True, retention: float | None = None,
    archive: str | None = None, audit_every: float | None = None, prune_every: float = 30.0,
) -> None:
    """Run every part of a node on ``lg`` (either log) and ``store`` until ``stop`` is set.

    ``builtin``: run the node's own worker with the built-in jobs (class ``default``). The
    API knows those job types (and any a worker announced): creating a schedule with another
    one is a 400 naming them. The API's writes wait for the read model at most
    ``CHRONOLOG_VISIBLE_TIMEOUT`` seconds (default 2; ``chronolog.settings.visible_timeout``).

    Each part — processor, projector, workers, effect runner, API — is kept running by a
    ``Supervisor``: one that fails is restarted with bounded backoff (and the node says so
    on stderr, in its log and in the live view) while the others go on. Then the parts stop
    in order: API, workers (drain), effects, processor (finishing its open transaction),
    projector.
    """

    from chronolog.api.app import create_app
    from chronolog.api.server import Server, server_config
    from chronolog.client import Client
    from chronolog.devnode.supervisor import Supervisor
    from chronolog.devnode.view import Recent
    from chronolog.effects.runner import EffectRunner
    from chronolog.processors.runtime import Processor
    from chronolog.projections.projector import Projector
    from chronolog.settings import max_body_bytes, visible_timeout
    from chronolog.workers.results import FilesystemResultStore
    from chronolog.workers.runtime import Worker

    results = FilesystemResultStore(node.data_dir / "results")
    sup = supervisor or Supervisor()
    recent = Recent()
    from chronolog.devnode.audits import NodeAudits
    from chronolog.processors.clock import CLOCK_STEP_HOLD_S, CLOCK_STEP_S
    from chronolog.processors.config import ProcessorConfig
    from chronolog.projections.retention import RetentionPolicy
    from chronolog.settings import clock_step_from_env
    from chronolog.tenants import DEFAULT_RETENTION_S

    # the API waits on the projector: one object, run again on failure; it prunes finished
    # runs past their tenant's retention (``retention``: the node's --retention)
    policy = RetentionPolicy.of(tenants, DEFAULT_RETENTION_S if retention is None
                                else retention)
    projector = Projector(lg, store, retention=policy)
    # the processor prunes the log behind the audit, which the node runs for itself
    # (chronolog.devnode.audits), and keeps the longest window of any tenant
    # its clock watched for steps as ``chronolog processor``'s (``chronolog.processors.clock``)
    step_s, hold_s = clock_step_from_env(CLOCK_STEP_S, CLOCK_STEP_HOLD_S)
    config = ProcessorConfig(retention_s=policy.longest(), archive=archive,
                             prune_every_s=prune_every, clock_step_s=step_s,
                             clock_step_hold_s=hold_s)
    # (``chronolog dev``: its embedded log; a node built on another log is audited by its
    # own timer — ``audit_every`` None: no audits here)
    audits = None if audit_every is None else NodeAudits(node.data_dir, audit_every, archive)
    client = Client(lg, principal="api", client_id=f"dev-api-{os.getpid()}")
    node.parts.update(projector=projector, client=client, store=store, log=lg, recent=recent,
                      supervisor=sup)

    def processor() -> Any:
        p = node.parts["processor"] = Processor(lg, f"dev-{os.getpid()}", tenants=tenants,
                                                config=config)
        p.on_commit.append(recent)
        return p

    def worker() -> Any:
        w = node.parts["worker"] = Worker(lg, worker_id=f"dev-worker-{os.getpid()}",
                                          concurrency=8, result_store=results)
        w.builtin_jobs()
        return w

    def effects() -> Any:
        e = node.parts["effects"] = EffectRunner(lg, f"dev-effects-{os.getpid()}",
                                                 database_url=database_url, result_store=results,
                                                 tenants=tenants)
        return e

    from chronolog.workers.builtin import BUILTIN_JOB_TYPES

    def not_ready() -> list[str]:
        """The node's processor is its command path: /healthz is 503 while it restores."""
        proc = node.parts.get("processor")
        if proc is None:
            return ["processor: starting"]
        ready, why = proc.readiness()
        return [] if ready else [f"processor: {why}"]

    app = create_app(client, store, tenants, projector=projector,
                     max_body_bytes=max_body_bytes(), visible_timeout=visible_timeout(),
                     known_job_types={"default": BUILTIN_JOB_TYPES} if builtin else {},
                     alongside=not_ready, retention=retention)

    def api() -> Any:
        # an open request (a browser's, a slow client's) is cancelled API_GRACE_S after
        # the stop rather than holding the whole node up to the part's bound
        config = server_config(app, node.host, node.port, log_level="warning",
                               lifespan="on", access_log=False,
                               timeout_graceful_shutdown=API_GRACE_S)
        return Server(config)  # our handlers stop the node; uvicorn captures none

    def exit_server(server: Any) -> None:
        server.should_exit = True

    view_task = None
    try:
        sup.add("processor", processor, lambda p: p.run(), lambda p: p.stop())
        sup.add("projector", lambda: projector, lambda p: p.run(), lambda p: p.stop())
        await client.start()
        if builtin:
            sup.add("worker", worker, lambda w: w.run(), lambda w: w.stop())
        sup.add("effects", effects, lambda e: e.run(), lambda e: e.stop())
        sup.add("api", api, lambda s: s.serve(), exit_server)
        if audits is not None:
            sup.add("audits", lambda: audits, lambda a: a.run(), lambda a: a.stop())
            node.parts["audits"] = audits
        await _wait_serving(sup, stop)
        if on_started is not None:
            await on_started(node)
        if view:
            view_task = asyncio.create_task(_live_view(node, stop), name="view")
            view_task.add_done_callback(_view_ended)
        await stop.wait()
    finally:
        if view_task is not None:
            view_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await view_task
        print("chronolog dev: stopping ...", file=sys.stderr, flush=True)
        await sup.stop([("api", 10), ("worker", 15), ("effects", 10), ("processor", 15),
                        ("projector", 10)])
        await client.close()


async def _end_watchdog(watchdog: Any) -> None:
    """Let the watchdog go (the server is stopped already) and wait for it, bounded."""
    with contextlib.suppress(OSError):
        watchdog.stdin.close()
    try:
        await asyncio.to_thread(watchdog.wait, WATCHDOG_EXIT_S)
    except subprocess.TimeoutExpired:
        log.warning("watchdog_lingering", pid=watchdog.pid, after_s=WATCHDOG_EXIT_S)


async def _is_empty(lg: Any) -> bool:
    try:
        n = await lg.partitions_for(lg.topics.events)
    except Exception:  # noqa: BLE001 - no events topic yet: a new data directory
        return True
    for p in range(n):
        if await lg.end_offset(lg.topics.events, p) > 0:
            return False
    return True


async def _wait_serving(sup: Any, stop: asyncio.Event, timeout: float = 30) -> None:
    """Until the API serves (it is restarted meanwhile if it fails to start)."""
    deadline = time.monotonic() + timeout
    while not sup.current("api").started:
        if stop.is_set():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server did not start within {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def _seed_demo(client: Any, tenants: Any) -> None:
    tenant = next(iter(tenants.tenants)) if tenants.tenants else "default"
    for sid, spec in DEMO_SCHEDULES:
        try:
            await client.create_schedule(tenant, sid, spec, request_key=f"demo:{sid}")
        except Exception as exc:  # noqa: BLE001 - a demo that cannot be created is not fatal
            log.warning("demo_schedule_failed", schedule=sid, error=str(exc))


def _banner(node: DevNode, tenants: Any, tenants_path: str | None, seeded: bool) -> None:
    from chronolog.devnode.nodefile import api_url
    from chronolog.settings import DEFAULT_DATA_DIR

    url = api_url(node.host, node.port)
    tenant = next(iter(tenants.tenants.values()))
    # the token itself only on a terminal: redirected output (a CI log, a file) keeps it out
    shown = sys.stdout.isatty() and bool(tenant.tokens)
    token = tenant.tokens[0] if shown else "<token>"
    lines = [
        f"chronolog dev is running: API {url}  (OpenAPI {url}/docs)",
        f"web dashboard: {url}/  (log in with the tenant's token)",
        f"data directory: {node.data_dir.resolve()}",
        *([f"log file: {node.log_path.resolve()}"] if node.log_path is not None else []),
        f"tenant '{tenant.name}', token: {token}"
        + (f"  (from {tenants_path})" if tenants_path else "  (dev default)")
        + ("" if shown else "  (shown only on a terminal)"),
        "",
        "create a schedule with curl:",
        f"  curl -s -X POST {url}/v1/schedules -H 'Authorization: Bearer {token}' "
        "-H 'Content-Type: application/json' \\",
        "    -d '{\"scheduleId\": \"hello\", \"every\": \"10s\", "
        "\"job\": {\"type\": \"echo\", \"params\": {\"hi\": 1}}}'",
        "or with the CLI (it finds this node through its data directory):",
        "  .venv/bin/chronolog schedule create hello --every 10s --job echo"
        + ("" if node.data_dir == Path(DEFAULT_DATA_DIR) else f" --data-dir {node.data_dir}"),
        "watch its runs:",
        f"  curl -s {url}/v1/schedules/hello/runs -H 'Authorization: Bearer {token}'",
    ]
    if seeded:
        lines += ["", "seeded demo schedules: demo-echo (every 5 s), demo-weekday-report "
                  "(09:00 America/New_York, Mon-Fri) - delete them when you like"]
    lines += ["", "Ctrl-C stops it cleanly."]
    print("\n".join(lines), flush=True)


def _view_ended(task: asyncio.Task[None]) -> None:
    """Say so if the live view itself ended with an error (its frames never raise)."""
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        log.error("live_view_stopped", error=f"{type(exc).__name__}: {exc}"[:500])
        print(f"chronolog dev: the live view stopped ({type(exc).__name__}: {exc}); the node "
              "goes on", file=sys.stderr, flush=True)


async def _live_view(node: DevNode, stop: asyncio.Event) -> None:
    """Redraw the live view every second until ``stop``. It never dies silently: a frame
    that fails is drawn as a panel with the exception line and logged once per distinct
    error (``chronolog.devnode.view.LiveView``); rich draws only when told (no refresh
    thread), so a failure while drawing is caught here too."""
    from rich.console import Console
    from rich.live import Live

    from chronolog.devnode.view import LiveView, error_panel

    view = LiveView(node)
    console = Console()
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while not stop.is_set():
            try:
                live.update(await view.frame(console.width, console.height), refresh=True)
            except Exception as exc:  # noqa: BLE001 - the view must never stop the node
                view.report(exc, "drawing")
                with contextlib.suppress(Exception):
                    live.update(error_panel(exc, "drawing"), refresh=True)
            waiter = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({waiter}, timeout=1.0)
            finally:
                waiter.cancel()


__all__ = ["DEMO_SCHEDULES", "DevNode", "run_dev", "run_node"]
