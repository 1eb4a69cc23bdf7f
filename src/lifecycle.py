"""A long-running process through outages of its services, and its stop within a bound.

``keep_running(run, stopped, what)`` calls ``run()`` again, after a growing pause (0.5 s
doubling to 30 s, one log line each), whenever it fails because a service is unavailable
(``unavailable``: refused or lost connections, a database shutting down or starting, the
log's ``LogUnavailable`` — a full disk's ``LogFull`` too); any other failure ends it. The
process resumes by itself when the service returns. ``serve_log(log, run, stop)`` (the
processor, the effect runner) starts the log and runs the service that way, pauses up to
``SERVE_RETRY_MAX_S``: a process started while its log is away waits for it.
``connect_when_up(connect, what)`` does the same for a connection made once at start (the
projector's and the API's read model): a process started while PostgreSQL is away waits for
it, and a signal meanwhile stops it (None).

Stopping on SIGTERM or SIGINT within a bound, whatever its services do:

``run_until_signalled(main, stop)`` runs the coroutine ``main``. A SIGTERM or SIGINT calls
``stop()`` (each one: a worker's second forces its drain): the clean way (finish the open
batch, commit, leave the group). A broker or a database that does not answer can hold a
commit or a close for minutes, so if ``main`` has not returned ``STOP_GRACE_S`` after the
signal it is cancelled, and ``HARD_STOP_S`` after the signal the process exits with status 1
whatever is still running. A process with a drain of its own (a worker) adds its drain bound
and passes ``settled``: the bounds then count from the end of the drain when that is sooner.
``hard_stop_after(seconds)`` is the exit alone, for a process that runs its own shutdown
(the API's server). Abandoning is safe: an open transaction of a processor is aborted by the
partition's next owner (which fences this producer), commands it did not consume are read
again, and a worker's attempt that did not report is retried once its lease expires.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog

from chronolog.log.port import LogUnavailable

STOP_GRACE_S = 6.0  # after the signal: cancel what has not finished
HARD_STOP_S = 8.0  # after the signal: exit, whatever is still running
SERVE_RETRY_MAX_S = 5.0  # serve_log: the longest pause between tries while the log is away

log = structlog.get_logger("chronolog.lifecycle")

T = TypeVar("T")


def hard_stop_after(seconds: float) -> None:
    """Exit the process with status 1 in ``seconds``, whatever is still running (a process
    that runs its own shutdown, the API's server, bounds it this way)."""
    asyncio.get_running_loop().call_later(seconds, _hard_exit)


def _hard_exit() -> None:
    log.error("stop_forced")
    sys.stderr.flush()
    os._exit(1)


async def run_until_signalled(main: Coroutine[Any, Any, Any], stop: Callable[[], None],
                              grace_s: float = STOP_GRACE_S,
                              hard_s: float = HARD_STOP_S,
                              settled: asyncio.Event | None = None) -> int:
    """Run ``main`` until it returns (status 0) or a signal's bounds run out (status 1).
    A process with its own drain bound (a worker's ``drain_timeout``) adds it to both, and
    may pass ``settled``: once that is set after the signal (its drain is over), the bounds
    count ``STOP_GRACE_S`` and ``HARD_STOP_S`` from then, if that is sooner."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main)
    signalled = False
    watcher: asyncio.Task[None] | None = None

    async def after_settled(event: asyncio.Event) -> None:
        await event.wait()
        loop.call_later(STOP_GRACE_S, _cancel, task)
        loop.call_later(HARD_STOP_S, _hard_exit)

    def on_signal() -> None:
        nonlocal signalled, watcher
        stop()
        if not signalled:
            signalled = True
            loop.call_later(grace_s, _cancel, task)
            loop.call_later(hard_s, _hard_exit)
            if settled is not None and grace_s > STOP_GRACE_S:
                watcher = loop.create_task(after_settled(settled))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await task
        return 0
    except asyncio.CancelledError:
        if not signalled:
            raise
        log.warning("stop_cancelled", after_s=grace_s)
        return 1
    finally:
        if watcher is not None:
            watcher.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def serve_log(log_: Any, run: Callable[[], Coroutine[Any, Any, Any]],
                    stop: Callable[[], None], what: str = "process") -> int:
    """A service of the log: start it (topics ensured), ``run()`` until signalled (the bounds
    above), close it. While the log is away — at start, or when ``run()`` fails on it — each
    is tried again (``keep_running``, pauses up to ``SERVE_RETRY_MAX_S``): a process started
    during a broker outage, or whose run fails in one, waits for the broker instead of
    exiting. The log's clients reconnect by themselves; it is closed once, at the end."""
    stopped = asyncio.Event()

    async def start() -> None:
        await log_.start()
        await log_.ensure_topics()

    async def main() -> None:
        try:
            await keep_running(start, stopped, what, max_delay=SERVE_RETRY_MAX_S)
            if not stopped.is_set():
                await keep_running(run, stopped, what, max_delay=SERVE_RETRY_MAX_S)
        finally:
            await log_.close()

    def on_signal() -> None:
        stopped.set()
        stop()

    return await run_until_signalled(main(), on_signal)


async def connect_when_up(connect: Callable[[], Coroutine[Any, Any, T]], what: str,
                          on_unavailable: Callable[[BaseException], object] | None = None,
                          ) -> T | None:
    """``connect()``'s result once the service answers: tried again (pauses from 0.5 s up to
    ``SERVE_RETRY_MAX_S``, ``on_unavailable(exc)`` each time) while it fails as unavailable;
    any other failure (a wrong password, no such database) is raised. None when SIGTERM or
    SIGINT comes first (the caller exits cleanly)."""
    stopped = asyncio.Event()
    got: list[T] = []

    async def attempt() -> None:
        got.append(await connect())

    await run_until_signalled(keep_running(attempt, stopped, what, max_delay=SERVE_RETRY_MAX_S,
                                           on_unavailable=on_unavailable), stopped.set)
    return got[0] if got else None


def _cancel(task: asyncio.Future[Any]) -> None:
    if not task.done():
        log.warning("stop_overdue", grace_s=STOP_GRACE_S)
        task.cancel()


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says a service is (for now) unreachable, not that a request was wrong."""
    import asyncpg

    # InternalClientError: what asyncpg raises for the next step of a transaction whose
    # connection broke under it ("cannot switch to state ...; another operation is in
    # progress"), seen when PostgreSQL stops during a commit
    return isinstance(exc, (OSError, asyncio.TimeoutError, LogUnavailable,
                            asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                            asyncpg.InternalClientError,
                            asyncpg.exceptions.OperatorInterventionError,
                            asyncpg.exceptions.TooManyConnectionsError))


async def keep_running(run: Callable[[], Coroutine[Any, Any, Any]], stopped: asyncio.Event,
                       what: str, first_delay: float = 0.5, max_delay: float = 30.0,
                       on_unavailable: Callable[[BaseException], object] | None = None) -> None:
    """``run()`` until it returns or ``stopped`` is set; again after a pause whenever it
    fails with a service unavailable (see the module docstring), after calling
    ``on_unavailable(exc)`` (readiness)."""
    delay = first_delay
    while not stopped.is_set():
        try:
            await run()
            return
        except Exception as exc:  # sorted by unavailable()
            if not unavailable(exc):
                raise
            if on_unavailable is not None:
                on_unavailable(exc)
            log.warning(f"{what}_waiting_for_service", error=f"{type(exc).__name__}: {exc}"[:300],
                        retry_in_s=delay)
        # not asyncio.wait_for: under Python 3.11 it can swallow a cancellation (chronolog.wakeup)
        waiter = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait({waiter}, timeout=delay)
        finally:
            waiter.cancel()
        delay = min(delay * 2, max_delay)
