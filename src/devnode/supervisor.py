"""Keep a node's parts running: a part that fails is restarted, with bounded backoff.

``Supervisor.add(name, make, run, stop)`` registers a part: ``make()`` builds it (a fresh
object, or the same one when others hold a reference to it), ``run(part)`` runs it until it
is stopped or fails, ``stop(part)`` asks it to finish. When ``run`` raises — or returns
while the node is not stopping — the part is restarted after a delay that starts at
``initial_backoff`` and doubles up to ``max_backoff``; a part that then ran for
``stable_after`` seconds starts again from ``initial_backoff`` on its next failure. Every
restart is logged (``part_restarting``; the first failure of a part with a given error type
and message also with its traceback, ``part_failed``), printed on stderr, counted
(``restarts``) and kept in ``notices`` for a live view. ``stop(order)`` stops the parts
one after the other, each bounded, without restarting them, and logs how long each took
(``part_stopped``; ``part_stop_forced`` when one had to be cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from chronolog.wakeup import wait_within

log = structlog.get_logger("chronolog.devnode.supervisor")

__all__ = ["CANCEL_WAIT_S", "Notice", "Supervisor"]

CANCEL_WAIT_S = 5.0  # stop(): the longest wait for a part after its cancellation


@dataclass(frozen=True)
class Notice:
    """One restart, for a live view."""

    at: float  # time.time()
    part: str
    error: str
    delay_s: float
    restarts: int


@dataclass
class _Part:
    name: str
    make: Callable[[], Any]
    run: Callable[[Any], Awaitable[Any]]
    stop: Callable[[Any], Any]
    current: Any = None
    task: asyncio.Task[None] | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    failures_seen: set[str] = field(default_factory=set)  # type: message, traceback logged


class Supervisor:
    """Runs parts and restarts the ones that fail (module docstring)."""

    def __init__(self, initial_backoff: float = 0.5, max_backoff: float = 30.0,
                 stable_after: float = 60.0, say: Callable[[str], None] | None = None) -> None:
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.stable_after = stable_after
        self.parts: dict[str, _Part] = {}
        self.restarts: dict[str, int] = {}
        self.notices: deque[Notice] = deque(maxlen=20)
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))

    def add(self, name: str, make: Callable[[], Any], run: Callable[[Any], Awaitable[Any]],
            stop: Callable[[Any], Any]) -> Any:
        """Build the part and start keeping it running; returns the part built."""
        part = _Part(name, make, run, stop)
        part.current = make()
        self.parts[name] = part
        self.restarts[name] = 0
        part.task = asyncio.create_task(self._keep(part), name=name)
        return part.current

    def current(self, name: str) -> Any:
        """The part's running object (a restart may have built a new one)."""
        return self.parts[name].current

    async def _keep(self, part: _Part) -> None:
        delay = self.initial_backoff
        while True:
            started = time.monotonic()
            try:
                await part.run(part.current)
                error = "it stopped by itself"
            except asyncio.CancelledError:
                raise
            except (Exception, SystemExit) as exc:  # uvicorn exits on a bind error
                error = f"{type(exc).__name__}: {exc}"[:500]
                if error not in part.failures_seen:  # once per distinct error: where it was
                    part.failures_seen.add(error)
                    log.error("part_failed", part=part.name, error=error, exc_info=exc)
            if part.stopping.is_set():
                return
            if time.monotonic() - started >= self.stable_after:
                delay = self.initial_backoff
            self.restarts[part.name] += 1
            n = self.restarts[part.name]
            self.notices.append(Notice(time.time(), part.name, error, delay, n))
            log.error("part_restarting", part=part.name, error=error, restart_in_s=delay,
                      restarts=n)
            self._say(f"chronolog: {part.name} failed ({error}); restarting it in "
                      f"{delay:.1f} s (restart {n})")
            with contextlib.suppress(asyncio.TimeoutError):
                await wait_within(part.stopping.wait(), delay)
            if part.stopping.is_set():
                return
            delay = min(self.max_backoff, delay * 2)
            try:
                part.current = part.make()
            except Exception as exc:  # noqa: BLE001 - building failed: try again later
                log.error("part_rebuild_failed", part=part.name, error=repr(exc))

    def failed(self) -> bool:
        """Whether a keeper itself ended unexpectedly (a bug: parts are restarted)."""
        return any(p.task is not None and p.task.done() and not p.stopping.is_set()
                   for p in self.parts.values())

    async def stop(self, order: list[tuple[str, float]]) -> None:
        """Stop the named parts in order, each waited at most its timeout (then cancelled),
        then any part not named (``CANCEL_WAIT_S`` each). A part that ignores its
        cancellation is left after ``CANCEL_WAIT_S`` (logged ``part_abandoned``): the stop
        is bounded whatever a part does. Cancelled itself, the stop cancels every part still
        running before it ends, so none outlives the node (a projector holding a database
        connection would hold its pool's close)."""
        named = [name for name, _ in order]
        rest = [(name, CANCEL_WAIT_S) for name in self.parts if name not in named]
        try:
            for name, timeout in [*order, *rest]:
                await self._stop_part(name, timeout)
        except asyncio.CancelledError:
            for part in self.parts.values():
                part.stopping.set()
                if part.task is not None:
                    part.task.cancel()
            raise

    async def _stop_part(self, name: str, timeout: float) -> None:
        part = self.parts.get(name)
        if part is None or part.task is None or part.task.done():
            return
        part.stopping.set()
        began = time.monotonic()
        try:
            result = part.stop(part.current)
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:  # noqa: BLE001 - stopping goes on
            log.warning("part_stop_failed", part=name, error=repr(exc))
        done, _ = await asyncio.wait({part.task}, timeout=timeout)
        if done:
            if not part.task.cancelled():
                part.task.exception()  # retrieved: a keeper logs its parts' failures itself
            log.info("part_stopped", part=name, after_s=round(time.monotonic() - began, 3))
            return
        part.task.cancel()  # forced
        log.warning("part_stop_forced", part=name, after_s=timeout)
        done, _ = await asyncio.wait({part.task}, timeout=CANCEL_WAIT_S)
        if not done:
            log.error("part_abandoned", part=name, after_s=timeout + CANCEL_WAIT_S)
