"""The loop shared by the read model's side folds of a topic (``dead_letters``: the ``dlq``
topic; ``workers``: the workers' announcements): step until stopped, a failure logged and
tried again a second later — these lists are views, so a failing one never stops the
projector. While a service is away the failure repeats every second: it is logged the
``Throttle`` way (the first, then one line per summary period with the count held back)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from chronolog.logging import Throttle
from chronolog.wakeup import wait_within

# While nothing comes, a side fold reads every partition of its topic again each IDLE_MS (a
# query of its stored offsets and one read per partition; on Kafka each read asks the end
# offset too): 1 s keeps an idle projector's share of a core low, and the view at most ~1 s
# behind its topic.
IDLE_MS = 1000


async def fold_until_stopped(step: Callable[[int], Awaitable[int]], stopping: asyncio.Event,
                             idle_ms: int, log: Any, failed: str) -> None:
    """``step(idle_ms)`` until ``stopping`` is set; ``log.warning(failed, error=...)``
    (throttled) and a pause of 1 s (cut short by ``stopping``) after a failure."""
    throttle = Throttle()
    while not stopping.is_set():
        try:
            if not await step(idle_ms):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a view: keep going
            held = throttle.take(failed)
            if held is not None:
                log.warning(failed, error=repr(exc)[:500], **({"held_back": held} if held else {}))
            try:
                await wait_within(stopping.wait(), 1.0)
            except TimeoutError:
                pass
