"""Waiting with a bound, cancellable without surprises: ``wait_within`` and ``Wakeup``.

``wait_within(aw, timeout)`` is the obvious way, but in Python 3.11 a cancellation that
arrives just as the inner awaitable finishes is swallowed (``wait_for`` returns the inner
result instead of raising), so a task cancelled in a polling loop can go on forever — a
projector's stop once waited on a read that had lost its cancellation this way. So chronolog
never calls it (ruff's banned-api rule TID251 refuses it in ``src/``):

* ``wait_within(aw, seconds)`` awaits ``aw`` in the calling task under ``asyncio.timeout``,
  which raises ``TimeoutError`` after ``seconds`` and always delivers a cancellation;
* a ``Wakeup`` waiter is one future settled by ``fire()`` or by a timer: ``await`` on it
  raises ``CancelledError`` whenever the task is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_within(aw: Awaitable[T], seconds: float | None) -> T:
    """``await aw``, for at most ``seconds`` (``None``: no bound): ``TimeoutError`` after them,
    ``aw`` cancelled. A task awaited is cancelled with it; shield one that must go on."""
    async with asyncio.timeout(seconds):
        return await aw


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Wakeup:
    """Wake every current waiter (``fire``); a waiter also wakes after its ``timeout``."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def fire(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            _settle(fut)

    async def wait(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.add(fut)
        timer = loop.call_later(max(0.0, timeout), _settle, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiters.discard(fut)
