"""Exponential backoff with a cap, optionally jittered: the one retry schedule of chronolog.

chronolog repeats things in several places — a Kafka request that failed with a retriable
error, a webhook POST that was not processed, an effect whose destination answers "later",
a worker's outcome commands whose append failed — and each one gives up in its own terms
(a deadline, a number of tries, an age) and decides after every try whether to go on. What
they share is the schedule: ``Backoff`` says how long to wait before the n-th repeat.
``retry`` is the loop for the plain case: an awaitable call repeated on some exceptions
until a deadline.

Why not tenacity or stamina: both repeat a call that raises. Only the Kafka requests have
that shape; the webhook classifies responses and may stop on a status URL's answer, the
effect runner honours a destination's retry-after hint and pauses interruptibly, the worker
re-queues reports. A library would carry one of these loops and leave the others as they
were.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "retry"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits of ``first``, then ``factor`` times the previous one, at most ``cap``.

    ``first`` is used as given (the cap bounds the waits after it). With ``jitter`` j each
    wait is scaled by a random factor in [1 - j, 1 + j), after the cap.
    """

    first: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.first < 0 or self.cap < 0 or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"bad backoff {self!r}")

    def delay(self, n: int) -> float:
        """The wait before repeat ``n`` (1: the first repeat)."""
        if n < 1:
            raise ValueError(f"repeat numbers start at 1, got {n}")
        d = self.first
        for _ in range(n - 1):
            d = min(self.cap, d * self.factor)
            if d == self.cap:
                break
        return self._jittered(d)

    def delays(self) -> Iterator[float]:
        """The waits before repeat 1, 2, 3, ... (endless)."""
        d = self.first
        while True:
            yield self._jittered(d)
            d = min(self.cap, d * self.factor)

    def _jittered(self, d: float) -> float:
        if not self.jitter:
            return d
        return d * (1 - self.jitter + 2 * self.jitter * random.random())


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    give_up_after: float,
    retry_on: Callable[[Exception], bool],
    on_retry: Callable[[Exception, float], None] | None = None,
) -> T:
    """Await ``call()`` until it returns, repeating it after ``backoff``'s waits while it
    raises an exception ``retry_on`` accepts.

    Gives up — the exception propagates — on any other exception, and when the next wait
    would end ``give_up_after`` seconds or more after the start. ``on_retry(exc, wait)`` is
    called before each wait. A cancellation propagates at once.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_after
    waits = backoff.delays()
    while True:
        wait = next(waits)
        try:
            return await call()
        except Exception as exc:
            if not retry_on(exc) or loop.time() + wait >= deadline:
                raise
            if on_retry is not None:
                on_retry(exc, wait)
        await asyncio.sleep(wait)
