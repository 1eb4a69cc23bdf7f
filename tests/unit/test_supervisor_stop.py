"""A node's stop is bounded whatever its parts do (``chronolog.devnode.supervisor``)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import structlog

from chronolog.devnode import supervisor as supervision
from chronolog.devnode.supervisor import Supervisor
from support.polling import wait_until


class Obedient:
    """Runs until asked to stop."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.ended = False

    async def run(self) -> None:
        await self.stopping.wait()
        self.ended = True


class Stubborn:
    """Ignores its stop and swallows every cancellation (a part stuck in a close)."""

    def __init__(self) -> None:
        self.cancels = 0
        self.running = True

    async def run(self) -> None:
        while self.running:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancels += 1


def keep(sup: Supervisor, name: str, part: object) -> None:
    sup.add(name, lambda: part, lambda p: p.run(), lambda p: getattr(p, "stopping", None)
            and p.stopping.set())


async def test_a_part_that_ignores_its_cancellation_is_abandoned_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(supervision, "CANCEL_WAIT_S", 0.2)
    sup = Supervisor(say=lambda _: None)
    stubborn, after = Stubborn(), Obedient()
    keep(sup, "stubborn", stubborn)
    keep(sup, "after", after)
    started = time.monotonic()
    await sup.stop([("stubborn", 0.2), ("after", 5)])
    assert time.monotonic() - started < 3  # bounded: 0.2 s of stop, 0.2 s after the cancel
    assert stubborn.cancels == 1  # it was cancelled, and left
    assert after.ended  # the parts after it were still stopped
    stubborn.running = False
    sup.parts["stubborn"].task.cancel()  # type: ignore[union-attr]
    with contextlib.suppress(asyncio.CancelledError):
        await sup.parts["stubborn"].task  # type: ignore[union-attr]


async def test_a_part_the_order_does_not_name_is_stopped_too() -> None:
    sup = Supervisor(say=lambda _: None)
    named, unnamed = Obedient(), Obedient()
    keep(sup, "named", named)
    keep(sup, "unnamed", unnamed)
    await sup.stop([("named", 5)])
    assert named.ended and unnamed.ended
    assert all(p.task is not None and p.task.done() for p in sup.parts.values())


async def test_a_stop_that_is_cancelled_cancels_every_part_still_running() -> None:
    sup = Supervisor(say=lambda _: None)
    first, second = Stubborn(), Obedient()
    keep(sup, "first", first)
    keep(sup, "second", second)
    stopping = asyncio.create_task(sup.stop([("first", 30), ("second", 30)]))
    await wait_until(lambda: sup.parts["first"].stopping.is_set(), 5,
                     what="the stop waiting for the first part")
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    second_task = sup.parts["second"].task
    assert second_task is not None
    await asyncio.wait({second_task}, timeout=5)
    assert second_task.cancelled()  # not left running beyond the node
    assert first.cancels >= 1
    first.running = False
    first_task = sup.parts["first"].task
    assert first_task is not None
    first_task.cancel()
    await asyncio.wait({first_task}, timeout=5)


class Failing:
    """Fails with the errors given, one per run, then runs until stopped."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        if self.errors:
            raise self.errors.pop(0)
        await self.stopping.wait()


async def test_a_failed_parts_traceback_is_logged_once_per_distinct_error() -> None:
    part = Failing([KeyError("chronolog.events"), KeyError("chronolog.events"),
                    RuntimeError("other"), KeyError("chronolog.events")])
    sup = Supervisor(initial_backoff=0.0, max_backoff=0.0, say=lambda line: None)
    with structlog.testing.capture_logs() as logs:
        sup.add("effects", lambda: part, lambda p: p.run(), lambda p: p.stopping.set())
        await wait_until(lambda: sup.restarts["effects"] == 4, 10.0, "four restarts")
        await sup.stop([("effects", 5.0)])
    failed = [e for e in logs if e["event"] == "part_failed"]
    assert [e["error"] for e in failed] == ["KeyError: 'chronolog.events'",
                                           "RuntimeError: other"]
    assert all(e["part"] == "effects" and isinstance(e["exc_info"], BaseException)
               for e in failed)
    assert failed[0]["exc_info"].__traceback__ is not None  # where it was raised
    assert len([e for e in logs if e["event"] == "part_restarting"]) == 4
