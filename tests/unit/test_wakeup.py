"""``Wakeup``: woken by fire or by its bound, and a cancelled waiter is always cancelled."""

from __future__ import annotations

import asyncio

import pytest

from chronolog.wakeup import Wakeup


async def test_fire_wakes_every_waiter_and_a_bound_wakes_one_alone() -> None:
    w = Wakeup()
    waiters = [asyncio.create_task(w.wait(30)) for _ in range(3)]
    await asyncio.sleep(0)
    w.fire()
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await w.wait(0.05)  # nobody fires: the bound ends it
    assert loop.time() - t0 >= 0.04


async def test_a_waiter_cancelled_as_it_is_woken_is_cancelled_not_resumed() -> None:
    w = Wakeup()
    task = asyncio.create_task(w.wait(30))
    await asyncio.sleep(0)
    w.fire()
    task.cancel()  # the wake-up and the cancellation arrive together
    with pytest.raises(asyncio.CancelledError):
        await task
