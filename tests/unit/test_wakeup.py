"""``Wakeup`` and ``wait_within``: woken by fire or by a bound, and a cancelled waiter is always
cancelled."""

from __future__ import annotations

import asyncio

import pytest

from chronolog.wakeup import Wakeup, wait_within


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


async def test_wait_within_delivers_a_cancellation_that_arrives_as_the_awaited_finishes() -> None:
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(wait_within(done, 30))
    await asyncio.sleep(0)  # the task waits on the future
    done.set_result(1)
    task.cancel()  # the result and the cancellation arrive together
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_wait_within_gives_the_result_or_times_out_and_cancels_what_it_awaited() -> None:
    assert await wait_within(asyncio.sleep(0, result="done"), 5) == "done"
    slow = asyncio.create_task(asyncio.sleep(30))
    with pytest.raises(TimeoutError):
        await wait_within(slow, 0.01)
    assert slow.cancelled()
    assert await wait_within(asyncio.sleep(0, result=7), None) == 7  # no bound
