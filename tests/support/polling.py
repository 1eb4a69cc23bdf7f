"""The one way a test waits: poll a condition until it holds or a deadline passes.

A test never sleeps in place of synchronisation; it names what it waits for, and the failure
says what was last seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["SPAWN_POLL", "finish", "finish_each", "wait_until", "wait_until_sync"]

# the interval of a poll whose every check starts a process (a `chronolog` command): each
# check costs a Python start-up, and on a loaded machine a faster poll mostly takes CPU from
# the processes whose progress it waits for
SPAWN_POLL = 0.5


async def wait_until(
    cond: Callable[[], Awaitable[Any]] | Callable[[], Any], timeout: float = 20.0,
    what: str = "condition", *, interval: float = 0.1,
    errors: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``cond`` (sync or async) until it returns a truthy value, which is returned;
    fail after ``timeout`` seconds naming ``what`` and the last value seen. Exceptions of
    ``errors`` count as not yet (and are shown as the last value)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = cond()
            if inspect.isawaitable(last):
                last = await last
        except errors as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, last)
        await asyncio.sleep(interval)


def wait_until_sync(
    cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition", *,
    interval: float = 0.1, errors: tuple[type[BaseException], ...] = (),
) -> Any:
    """``wait_until`` for code outside an event loop (tests that drive processes)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = cond()
        except errors as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, last)
        time.sleep(interval)


def _timed_out(timeout: float, what: str, last: Any) -> AssertionError:
    return AssertionError(f"timed out after {timeout}s waiting for {what} (last={last!r})")


async def finish(tasks: list[asyncio.Task[Any]], timeout: float, what: str) -> list[Any]:
    """Wait for ``tasks`` to end (their results; the first exception is raised); fail after
    ``timeout`` seconds with the stack of each task still running, then cancel them."""
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    if pending:
        stacks = [f"{task.get_name()}: {_awaiting(task.get_coro())}" for task in pending]
        others = [t for t in asyncio.all_tasks() if t not in pending
                  and t is not asyncio.current_task() and not t.done()]
        stacks += ["the loop's other tasks:"] + [
            f"  {t.get_name()}: {_awaiting(t.get_coro())}" for t in others[:40]]
        for task in pending:
            task.cancel()
        # a task that ignores its cancellation is not waited for beyond a few seconds
        await asyncio.wait(pending, timeout=5)
        raise AssertionError(f"{what}: not done after {timeout} s; still running:\n"
                             + "\n".join(stacks))
    return [task.result() for task in tasks]


async def finish_each(steps: list[tuple[str, Callable[[], Awaitable[Any]]]],
                      timeout: float) -> None:
    """A teardown: each ``(what, step)`` in turn, each bounded by ``finish`` (a step that
    hangs fails the test with every task's stack instead of holding it until the suite's
    timeout); every step runs even when one before it failed, and the first failure is
    raised at the end."""
    failure: BaseException | None = None
    for what, step in steps:
        try:
            await finish([asyncio.ensure_future(step())], timeout, what)
        except Exception as exc:  # noqa: BLE001 - the next steps run; raised below
            failure = failure or exc
    if failure is not None:
        raise failure


def _awaiting(coro: Any) -> str:
    """Where a suspended coroutine waits: its chain of awaits, outermost first."""
    where: list[str] = []
    while coro is not None and len(where) < 50:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            where.append(repr(coro)[:200])  # a future or task it waits for
            break
        where.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " -> ".join(where) or "(no frame)"
