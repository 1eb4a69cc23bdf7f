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
    _flag: threading.Event = field(default_factory=threading.Event, repr=False)

    def check_cancelled(self) -> None:
        """Raise ``Cancelled`` if the attempt was cancelled (safe from a handler thread)."""
        if self._flag.is_set():
            raise Cancelled(self.cancel_reason or "cancelled")

    @property
    def is_cancelled(self) -> bool:
        return self._flag.is_set()

    async def sleep(self, seconds: float) -> None:
        """Sleep, waking early with ``Cancelled`` if the attempt is cancelled."""
        try:
            await wait_within(self.cancelled.wait(), max(0.0, seconds))
        except TimeoutError:
            return
        self.check_cancelled()

    def sleep_sync(self, seconds: float) -> None:
        """``sleep`` for synchronous handlers (running in a thread)."""
        if self._flag.wait(max(0.0, seconds)):
            self.check_cancelled()

    def cancel(self, reason: str) -> None:
        """Cancel the attempt (the worker does, on the event loop: a lost lease, a cancel
        request, a timeout, a shutdown). The first reason stays; ``cancelled`` is set."""
        if self._flag.is_set():
            return
        self.cancel_reason = reason
        self._flag.set()
        self.cancelled.set()


Handler = Callable[[JobContext], Any]


class JobRegistry(Protocol):
    """Where handlers are registered by job type (a ``Worker``)."""

    def register(self, name: str, fn: Handler, *, timeout: float | None = None) -> None: ...
