"""Bounded execution end to end: a failing run's retries wait at least the node's floor
(a zero ``initialBackoff`` is raised to it) and a schedule asking for more attempts than the
ceiling is refused naming ``retry.maxAttempts``. A processor in process, a worker serving
the run, on both logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chronolog.client import Invalid
from chronolog.domain.limits import MIN_RETRY_BACKOFF_SECONDS
from chronolog.workers import FilesystemResultStore
from support.polling import wait_until

from .test_processor import Running, events
from .test_workers import manual_spec, published, serving


async def test_a_zero_initial_backoff_is_raised_to_the_floor(event_log: Any,
                                                             tmp_path: Path) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    retry = {"max_attempts": 3, "initial_backoff": 0, "max_backoff": 0}
    async with Running(event_log) as r, serving(event_log, store, "w1"):
        await r.client.create_schedule("acme", "storm", manual_spec(
            "fail", {"times": 2, "kind": "transient"}, retry=retry))
        run_id = (await r.client.trigger("acme", "storm", "k1"))["run_id"]
        await wait_until(lambda: published(event_log, run_id), 30,
                         what="retried twice, then succeeded")
    evs = [e for e in await events(event_log) if getattr(e.payload, "run_id", None) == run_id]
    failed = [e for e in evs if e.type == "AttemptFailed"]
    retries = [e.payload for e in evs if e.type == "RetryScheduled"]
    claims = [e for e in evs if e.type == "AttemptClaimed"]
    assert len(failed) == 2 and len(retries) == 2 and len(claims) == 3
    for fail, retry_ev, next_claim in zip(failed, retries, claims[1:], strict=True):
        wait = (retry_ev.retry_at - fail.at).total_seconds()
        assert wait >= MIN_RETRY_BACKOFF_SECONDS, wait
        assert next_claim.at >= retry_ev.retry_at


async def test_more_attempts_than_the_ceiling_are_refused(event_log: Any) -> None:
    async with Running(event_log) as r:
        with pytest.raises(Invalid) as refused:
            await r.client.create_schedule("acme", "many", manual_spec(
                "fail", {"times": 1}, retry={"max_attempts": 1000}))
    assert refused.value.field == "retry.maxAttempts"
    assert not [e for e in await events(event_log) if e.schedule_id == "many"]
