"""keep_running: a run that fails because its service is away is run again; others end it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from chronolog.lifecycle import keep_running, serve_log, unavailable
from chronolog.log.port import LogUnavailable


def test_unavailable_means_a_service_away_not_a_bad_request() -> None:
    assert unavailable(ConnectionRefusedError(111, "refused"))
    assert unavailable(LogUnavailable("locked"))
    assert unavailable(asyncpg.exceptions.CannotConnectNowError("starting up"))
    assert not unavailable(asyncpg.exceptions.UndefinedTableError("no table"))
    assert not unavailable(ValueError("a bug"))


async def test_a_run_failing_while_its_service_is_away_is_run_again_until_it_returns() -> None:
    calls: list[int] = []

    async def run() -> None:
        calls.append(len(calls))
        if len(calls) < 3:
            raise ConnectionRefusedError(111, "refused")

    await keep_running(run, asyncio.Event(), "test", first_delay=0.01)
    assert calls == [0, 1, 2]


async def test_any_other_failure_ends_it_and_a_stop_ends_the_waiting() -> None:
    async def broken() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        await keep_running(broken, asyncio.Event(), "test", first_delay=0.01)

    stopped = asyncio.Event()

    async def away() -> None:
        stopped.set()  # a SIGTERM arrives while the service is away
        raise ConnectionRefusedError(111, "refused")

    await asyncio.wait_for(keep_running(away, stopped, "test", first_delay=30), 10)


class _Log:
    """A log that is away for its first two starts."""

    def __init__(self) -> None:
        self.starts = self.closes = 0

    async def start(self) -> None:
        self.starts += 1
        if self.starts <= 2:
            raise LogUnavailable("no broker")

    async def ensure_topics(self) -> None:
        pass

    async def close(self) -> None:
        self.closes += 1


async def test_a_service_of_the_log_waits_for_it_at_start_and_after_a_failed_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import chronolog.lifecycle as lifecycle

    monkeypatch.setattr(lifecycle, "SERVE_RETRY_MAX_S", 0.01)
    lg = _Log()
    runs: list[int] = []

    async def run() -> None:
        runs.append(lg.starts)
        if len(runs) == 1:
            raise LogUnavailable("the broker went away")

    status = await asyncio.wait_for(serve_log(lg, run, lambda: None), 30)
    assert status == 0
    assert lg.starts == 3 and runs == [3, 3]  # started once it answered, run again after
    assert lg.closes == 1  # one log for the whole life of the process
    assert unavailable(asyncpg.InternalClientError("cannot switch to state 15"))
