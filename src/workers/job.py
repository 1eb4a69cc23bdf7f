"""What a job handler sees: its ``JobContext``, the failures it may raise, the registry.

A handler is an async or a sync callable taking a ``JobContext``; it returns a JSON-encodable
result or raises. An exception is a transient failure unless it is ``Permanent`` or
``Ambiguous``. Handlers are registered by job type on a ``JobRegistry`` (a ``Worker``).
This module imports nothing of the worker runtime, so job modules (``builtin``) and the
runtime can both depend on it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from chronolog.wakeup import wait_within

__all__ = ["Ambiguous", "Cancelled", "Handler", "JobContext", "JobRegistry", "Permanent"]

# orders ``cancel`` (the event loop) against a handler thread's first ``sleep_sync``, which
# makes the thread's wait flag: one lock for every context (both sides hold it a moment)
_FLAGS = threading.Lock()


class Permanent(Exception):
    """Raise from a handler: the error will not go away by retrying (no retry budget used)."""


class Ambiguous(Exception):
    """Raise from a handler: the outcome is unknown (e.g. an external call timed out after
    it may have taken effect). The run goes to RECONCILING; it is never blindly retried."""


class Cancelled(Exception):
    """Raised by ``JobContext.check_cancelled()`` once the attempt has been cancelled."""


@dataclass
class JobContext:
    """What a handler receives: the attempt's identity, its parameters and a cancel signal."""

    run_id: str
    attempt: int
    fence: int
    scheduled_at: datetime
    params: dict[str, Any]
    tenant: str
    schedule_id: str
    job_type: str
    worker_id: str
    lease_seconds: float
    timeout: float | None
    log: Any
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: str | None = None
    # set once, by ``cancel``; a thread blocked in ``sleep_sync`` waits on ``_flag``, made
    # only then (a threading.Event per run was a measurable part of a run's CPU)
    _is_cancelled: bool = field(default=False, repr=False)
    _flag: threading.Event | None = field(default=None, repr=False)
    _on_cancel: list[Callable[[], None]] | None = field(default=None, repr=False)

    def check_cancelled(self) -> None:
        """Raise ``Cancelled`` if the attempt was cancelled (safe from a handler thread)."""
        if self._is_cancelled:
            raise Cancelled(self.cancel_reason or "cancelled")

    @property
    def is_cancelled(self) -> bool:
        return self._is_cancelled

    async def sleep(self, seconds: float) -> None:
        """Sleep, waking early with ``Cancelled`` if the attempt is cancelled."""
        try:
            await wait_within(self.cancelled.wait(), max(0.0, seconds))
        except TimeoutError:
            return
        self.check_cancelled()

    def sleep_sync(self, seconds: float) -> None:
        """``sleep`` for synchronous handlers (running in a thread)."""
        with _FLAGS:
            if self._flag is None:
                self._flag = threading.Event()
                if self._is_cancelled:
                    self._flag.set()
            flag = self._flag
        if flag.wait(max(0.0, seconds)):
            self.check_cancelled()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the event loop) when the attempt is cancelled; at once if
        it already is. For the worker runtime, which waits for a handler or its cancel."""
        if self._is_cancelled:
            callback()
            return
        if self._on_cancel is None:
            self._on_cancel = []
        self._on_cancel.append(callback)

    def cancel(self, reason: str) -> None:
        """Cancel the attempt (the worker does, on the event loop: a lost lease, a cancel
        request, a timeout, a shutdown). The first reason stays; ``cancelled`` is set."""
        with _FLAGS:
            if self._is_cancelled:
                return
            self.cancel_reason = reason
            self._is_cancelled = True
            if self._flag is not None:
                self._flag.set()
        self.cancelled.set()
        callbacks, self._on_cancel = self._on_cancel, None
        for callback in callbacks or ():
            callback()


Handler = Callable[[JobContext], Any]


class JobRegistry(Protocol):
    """Where handlers are registered by job type (a ``Worker``)."""

    def register(self, name: str, fn: Handler, *, timeout: float | None = None) -> None: ...
