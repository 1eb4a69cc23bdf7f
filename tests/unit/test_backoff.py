"""chronolog.backoff: the schedules of its users stay what their loops computed by hand."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from chronolog.backoff import Backoff, retry
from chronolog.effects.runner import RunnerConfig
from chronolog.workers.runtime import SEND_BACKOFF


def doubling(first: float, cap: float, n: int) -> list[float]:
    """The hand-written loop: wait ``delay``, then ``delay = min(cap, delay * 2)``."""
    out, delay = [], first
    for _ in range(n):
        out.append(delay)
        delay = min(cap, delay * 2)
    return out


@pytest.mark.parametrize("first,cap", [(0.02, 0.5), (0.002, 0.05), (0.5, 10.0), (1.0, 60.0),
                                       (0.05, 0.2), (20.0, 10.0), (0.0, 1.0), (3.0, 3.0)])
def test_delays_double_from_first_up_to_the_cap(first: float, cap: float) -> None:
    backoff = Backoff(first=first, cap=cap)
    expected = doubling(first, cap, 40)
    assert list(itertools.islice(backoff.delays(), 40)) == expected
    assert [backoff.delay(n) for n in range(1, 41)] == expected


def test_the_effect_runners_default_schedule() -> None:
    config = RunnerConfig()
    waits = Backoff(first=config.retry_initial, cap=config.retry_max).delays()
    assert list(itertools.islice(waits, 8)) == [1, 2, 4, 8, 16, 32, 60, 60]


def test_a_late_repeat_number_is_capped_without_overflow() -> None:
    assert Backoff(first=1.0, cap=60.0).delay(100_000) == 60.0
    waits = Backoff(first=1.0, cap=60.0).delays()
    assert list(itertools.islice(waits, 5000))[-1] == 60.0


def test_worker_send_backoff_is_the_jittered_schedule_it_replaced() -> None:
    for tries in range(1, 12):
        random.seed(tries)
        old = min(2.0, 0.1 * 2 ** tries) * (0.5 + random.random())
        random.seed(tries)
        assert SEND_BACKOFF.delay(tries) == pytest.approx(old, rel=1e-12)


def test_jitter_stays_within_its_spread() -> None:
    backoff = Backoff(first=1.0, cap=4.0, jitter=0.5)
    for n in range(1, 10):
        base = min(4.0, 2.0 ** (n - 1))
        for _ in range(200):
            assert 0.5 * base <= backoff.delay(n) < 1.5 * base


def test_bad_parameters_are_refused() -> None:
    for kwargs in ({"first": -1.0, "cap": 1.0}, {"first": 1.0, "cap": 1.0, "factor": 0.5},
                   {"first": 1.0, "cap": 1.0, "jitter": 2.0}):
        with pytest.raises(ValueError):
            Backoff(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Backoff(first=1.0, cap=1.0).delay(0)


class Flaky(Exception):
    pass


async def test_retry_repeats_an_accepted_exception_after_the_backoffs_waits() -> None:
    calls: list[float] = []
    waits: list[float] = []
    loop = asyncio.get_running_loop()

    async def call() -> str:
        calls.append(loop.time())
        if len(calls) < 4:
            raise Flaky()
        return "done"

    result = await retry(call, backoff=Backoff(first=0.01, cap=0.02), give_up_after=10,
                         retry_on=lambda exc: isinstance(exc, Flaky),
                         on_retry=lambda exc, wait: waits.append(wait))
    assert result == "done"
    assert waits == [0.01, 0.02, 0.02]
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(gap >= wait * 0.9 for gap, wait in zip(gaps, waits, strict=True))


async def test_retry_raises_an_exception_it_does_not_accept_at_once() -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad request")

    with pytest.raises(ValueError):
        await retry(call, backoff=Backoff(first=0.01, cap=0.01), give_up_after=10,
                    retry_on=lambda exc: isinstance(exc, Flaky))
    assert calls == 1


async def test_retry_gives_up_when_the_next_wait_would_end_past_the_bound() -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise Flaky()

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Flaky):
        await retry(call, backoff=Backoff(first=0.05, cap=0.05), give_up_after=0.12,
                    retry_on=lambda exc: isinstance(exc, Flaky))
    # tries at 0, 0.05 and 0.10 (later on a busy machine); a wait from 0.10 would end at
    # 0.15 >= 0.12: no wait ends past the bound, so it never sleeps beyond it
    assert 2 <= calls <= 3
    assert loop.time() - started < 0.12 + 1.0


async def test_retry_is_cancelled_while_it_waits() -> None:
    async def call() -> None:
        raise Flaky()

    task = asyncio.ensure_future(retry(call, backoff=Backoff(first=30, cap=30),
                                       give_up_after=300,
                                       retry_on=lambda exc: isinstance(exc, Flaky)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
