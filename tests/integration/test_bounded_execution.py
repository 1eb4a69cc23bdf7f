"""Bounded execution end to end: a failing run's retries wait at least the node's floor
(a zero ``initialBackoff`` is raised to it), a schedule asking for more attempts than the
ceiling is refused naming ``retry.maxAttempts``, and a tenant holding its ``max_running``
share leaves the other slots to other tenants. A processor in process, a worker serving the
runs (a ``chronolog worker`` process where it matters), on both logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chronolog.client import Conflict, Invalid
from chronolog.domain import messages as m
from chronolog.domain.limits import MIN_RETRY_BACKOFF_SECONDS
from chronolog.settings import LogConfig
from chronolog.tenants import Tenant, Tenants
from chronolog.workers import FilesystemResultStore
from chronolog.workers.results import sha256_hex
from support.polling import wait_until
from support.processors import Running, events
from support.workers import manual_spec, of_type, published, serving_test_jobs

from .test_workers import worker_processes


async def test_a_zero_initial_backoff_is_raised_to_the_floor(event_log: Any,
                                                             tmp_path: Path) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    retry = {"max_attempts": 3, "initial_backoff": 0, "max_backoff": 0}
    async with Running(event_log) as r, serving_test_jobs(event_log, store, "w1"):
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


async def test_a_tenant_over_its_running_share_leaves_slots_to_another(
    event_log: Any, log_config: LogConfig, tmp_path: Path
) -> None:
    """Tenant ``hog`` (max_running 2) triggers 20 runs that sleep for ten minutes; a run of
    tenant ``meek`` still starts and finishes at once on the same 4-slot worker process, and
    ``hog`` never holds more than 2 runs: the other 18 wait READY."""
    tenants = Tenants({"hog": Tenant("hog", max_running=2), "meek": Tenant("meek")})
    with worker_processes() as start:
        async with Running(event_log, tenants=tenants) as r:
            start(log_config, "w1", tmp_path, tmp_path / "results")
            await r.client.create_schedule("hog", "long", manual_spec("sleep", {"seconds": 600}))
            hog = [(await r.client.trigger("hog", "long", f"k{i}"))["run_id"] for i in range(20)]

            async def hog_claims() -> list[Any]:
                return [e for e in await events(event_log)
                        if e.type == "AttemptClaimed" and e.payload.run_id in hog]

            await wait_until(lambda: _at_least(hog_claims, 2), 30, what="hog's first two runs")
            await r.client.create_schedule("meek", "quick", manual_spec("echo", {"x": 1}))
            meek = (await r.client.trigger("meek", "quick", "k"))["run_id"]
            await wait_until(lambda: published(event_log, meek), 15,
                             what="meek's run finished beside hog's sleepers")
            assert len(await hog_claims()) == 2
            states = [run.state for ps in r.proc.partitions.values()
                      for st in ps.states.values() for run in (st.runs or {}).values()
                      if run.run_id in hog]
            assert sorted(states) == ["LEASED"] * 2 + ["READY"] * 18, states
    assert not await of_type(event_log, "AttemptFailed", meek)


async def _at_least(read: Any, n: int) -> bool:
    return len(await read()) >= n


async def test_a_handler_past_its_execution_timeout_is_cancelled_and_retried(
    event_log: Any, log_config: LogConfig, tmp_path: Path
) -> None:
    """The tenant's execution timeout for the job type (2 s) travels in AttemptClaimed and
    the assignment record; the worker process cancels the sleeping handler when it elapses,
    the attempt fails and the run follows its retry policy (2 attempts, then dead)."""
    tenants = Tenants({"acme": Tenant("acme", job_timeouts={"sleep": 2.0})})
    with worker_processes() as start:
        async with Running(event_log, tenants=tenants) as r:
            start(log_config, "w1", tmp_path, tmp_path / "results")
            await r.client.create_schedule("acme", "stuck", manual_spec(
                "sleep", {"seconds": 1e8}, retry={"max_attempts": 2}))
            run_id = (await r.client.trigger("acme", "stuck", "k"))["run_id"]
            await wait_until(lambda: of_type(event_log, "OccurrenceDeadLettered", run_id), 40,
                             what="both attempts timed out, then dead")
    claims = await of_type(event_log, "AttemptClaimed", run_id)
    failures = await of_type(event_log, "AttemptFailed", run_id)
    assert [c.timeout for c in claims] == [2.0, 2.0]
    assert [f.error_class for f in failures] == ["transient", "transient"]
    assert [f.reason for f in failures] == ["timeout", "timeout"]
    assert all(f.message.startswith("timeout after 2.0s") for f in failures), failures
    [dead] = await of_type(event_log, "OccurrenceDeadLettered", run_id)
    assert dead.reason == "max_attempts"
    assert not await published(event_log, run_id)


async def test_retries_over_the_tenants_budget_a_minute_are_delayed(
    event_log: Any, tmp_path: Path
) -> None:
    """``max_attempts_per_minute = 3``: six runs fail at once; three retries are scheduled
    after the usual backoff, the other three wait for the budget (a token every 20 s) —
    delayed, each with its RetryScheduled, none dropped."""
    store = FilesystemResultStore(tmp_path / "results")
    tenants = Tenants({"acme": Tenant("acme", max_attempts_per_minute=3)})
    async with Running(event_log, tenants=tenants) as r, serving_test_jobs(event_log, store, "w1"):
        await r.client.create_schedule("acme", "flaky", manual_spec(
            "fail", {"times": 1, "kind": "transient"}))
        runs = [(await r.client.trigger("acme", "flaky", f"k{i}"))["run_id"] for i in range(6)]

        async def retries() -> list[Any]:
            return [e for e in await events(event_log)
                    if e.type == "RetryScheduled" and e.payload.run_id in runs]

        await wait_until(lambda: _at_least(retries, 6), 30, what="six retries scheduled")
        fails = {e.payload.run_id: e.at for e in await events(event_log)
                 if e.type == "AttemptFailed"}
        waits = sorted((e.payload.retry_at - fails[e.payload.run_id]).total_seconds()
                       for e in await retries())
        assert all(w < 2 for w in waits[:3]) and all(w >= 15 for w in waits[3:]), waits
        assert sorted(e.payload.run_id for e in await retries()) == sorted(runs)


async def test_a_workers_own_claim_is_held_to_the_tenants_share(event_log: Any) -> None:
    """A ClaimRun sent by a worker (not an assignment) counts against ``max_running`` and
    is refused past it; the run stays READY, and is claimable once the share frees up."""
    tenants = Tenants({"hog": Tenant("hog", max_running=1)})
    async with Running(event_log, tenants=tenants) as r:
        await r.client.create_schedule("hog", "s", manual_spec("sleep", {"seconds": 600}))
        first, second = [(await r.client.trigger("hog", "s", k))["run_id"] for k in "ab"]
        held = await r.client.claim("hog", "s", first, 1, "puller")
        with pytest.raises(Conflict, match="max_running 1"):
            await r.client.claim("hog", "s", second, 1, "puller")
        assert not await of_type(event_log, "AttemptClaimed", second)
        await r.client.call("hog", "s", m.CompleteRun(
            run_id=first, attempt=1, fence=held["fence"], worker_id="puller",
            checksum=sha256_hex(b"null"), inline=None, size=4))
        assert (await r.client.claim("hog", "s", second, 1, "puller"))["run_id"] == second
