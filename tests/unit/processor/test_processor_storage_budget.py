"""The storage budget in the processor, on the in-memory log with an injected clock: params
(a create, a manual trigger) and results (a CompleteRun) of every entry point — here the
client, which writes straight to ``commands`` like any producer — count in the tenant's
hour; past it a write is refused ``quota`` naming ``storage_budget``, and a refused result
fails its attempt (retried or dead-lettered by the policy), never a run that vanishes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from chronolog.client import QuotaExceeded
from chronolog.domain import messages as m
from chronolog.tenants import Tenant, Tenants
from chronolog.workers import FilesystemResultStore
from support.polling import wait_until
from support.processors import Running, events
from support.workers import manual_spec, of_type, published, serving_test_jobs

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BUDGET = 100_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def tenants(budget: int = BUDGET) -> Tenants:
    return Tenants({"acme": Tenant("acme", ("t",), storage_budget=budget),
                    "globex": Tenant("globex", ("g",))})


def params_of(size: int) -> dict[str, Any]:
    """Params whose JSON is exactly ``size`` bytes (at least 8)."""
    params = {"p": "x" * (size - 8)}
    assert len(orjson.dumps(params)) == size
    return params


def spec(params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"every": "24h", "overlap": "allow", "job": {"type": "echo", "params": params or {}}}


async def test_params_over_the_budget_are_refused_until_the_hour_frees_them(
        event_log: Any) -> None:
    clock = Clock()
    async with Running(event_log, tenants=tenants(), clock=clock) as r:
        c = r.client
        await c.create_schedule("acme", "s1", spec(params_of(60_000)))
        clock.now = T0 + timedelta(seconds=10)
        # 60,000 + 40,000: the budget exactly — accepted
        await c.trigger("acme", "s1", "k1", params_of(40_000))
        with pytest.raises(QuotaExceeded) as refused:  # one byte more: refused
            await c.trigger("acme", "s1", "k2", params_of(8))
        reply = refused.value.reply
        assert reply.body == {"field": "storage_budget", "retry_after": 3590}
        assert reply.reason.startswith("over the storage budget of tenant 'acme' "
                                       "(storage_budget = 100000 bytes an hour): the params of "
                                       "TriggerRun, 8 bytes, does not fit this hour")
        # a repeated trigger writes nothing: it is answered as before, not refused
        again = await c.trigger("acme", "s1", "k1", params_of(40_000))
        assert again["run_id"]
        assert [e.payload.request_key for e in await events(event_log)
                if isinstance(e.payload, m.OccurrenceMaterialized)
                and e.payload.trigger == "manual"] == ["k1"]
        # another tenant is not held back (and globex has no budget at all)
        await c.create_schedule("globex", "s1", spec(params_of(60_000)))
        clock.now = T0 + timedelta(seconds=3599)
        with pytest.raises(QuotaExceeded):
            await c.trigger("acme", "s1", "k2", params_of(8))
        clock.now = T0 + timedelta(seconds=3600)  # the create left the window
        assert (await c.trigger("acme", "s1", "k2", params_of(8)))["run_id"]


async def _claimed(r: Running, schedule_id: str, key: str) -> tuple[str, int]:
    body = await r.client.trigger("acme", schedule_id, key)
    claimed = await r.client.claim("acme", schedule_id, body["run_id"], 1, "w1")
    return body["run_id"], claimed["fence"]


async def test_a_result_over_the_budget_fails_its_attempt_naming_the_budget(
        event_log: Any) -> None:
    clock = Clock()
    async with Running(event_log, tenants=tenants(), clock=clock) as r:
        c = r.client
        await c.create_schedule("acme", "s1", {**spec(), "retry": {"max_attempts": 3}})
        run1, fence1 = await _claimed(r, "s1", "k1")
        run2, fence2 = await _claimed(r, "s1", "k2")
        uri = "results:{}/a1-f{}-0123456789abcdef"
        done = await c.complete("acme", "s1", run1, 1, fence1, "w1", "sha256:" + "a" * 64,
                                60_000, uri=uri.format(run1, fence1))
        assert done["state"] == "SUCCEEDED"
        with pytest.raises(QuotaExceeded) as refused:  # 60,000 + 40,001: over
            await c.complete("acme", "s1", run2, 1, fence2, "w1", "sha256:" + "b" * 64,
                             40_001, uri=uri.format(run2, fence2))
        reply = refused.value.reply
        assert reply.body["field"] == "storage_budget"
        assert reply.body["state"] == "RETRY_WAIT"  # retried by the policy, once it fits
        assert datetime.fromisoformat(reply.body["retry_at"]) >= T0 + timedelta(seconds=3600)
        failed = [e.payload for e in await events(event_log)
                  if isinstance(e.payload, m.AttemptFailed)]
        assert [(f.run_id, f.error_class) for f in failed] == [(run2, "transient")]
        assert "storage_budget = 100000 bytes an hour" in failed[0].message
        assert not any(isinstance(e.payload, m.ResultPublished) and e.payload.run_id == run2
                       for e in await events(event_log))


async def test_a_result_larger_than_the_whole_budget_dead_letters_its_run(
        event_log: Any) -> None:
    async with Running(event_log, tenants=tenants(65_536)) as r:
        await r.client.create_schedule("acme", "s1", {**spec(), "retry": {"max_attempts": 3}})
        run, fence = await _claimed(r, "s1", "k1")
        with pytest.raises(QuotaExceeded) as refused:
            await r.client.complete("acme", "s1", run, 1, fence, "w1", "sha256:" + "c" * 64,
                                    65_537, uri=f"results:{run}/a1-f{fence}-0123456789abcdef")
        assert refused.value.reply.body["state"] == "DEAD"
        assert "larger than the whole budget" in refused.value.reply.reason


async def test_a_worker_whose_result_is_over_the_budget_sees_its_attempt_fail(
        event_log: Any, tmp_path: Path) -> None:
    """A real worker (built-in and test jobs, a filesystem result store): its first result
    fits, the second would pass the budget — the attempt fails naming it, the run waits to
    be retried, nothing of it is published."""
    store = FilesystemResultStore(tmp_path / "results")
    record = {"file": str(tmp_path / "calls"), "pad": 50_000}  # results of about 50 KB
    async with Running(event_log, tenants=tenants()) as r, \
            serving_test_jobs(event_log, store, "w1"):
        await r.client.create_schedule("acme", "s1", manual_spec(
            "record", record, retry={"max_attempts": 3}))
        first = (await r.client.trigger("acme", "s1", "k1"))["run_id"]
        [fits] = await wait_until(lambda: published(event_log, first), 20, what="a result")
        assert fits.size > 50_000 and fits.uri is not None  # staged, and counted
        second = (await r.client.trigger("acme", "s1", "k2"))["run_id"]
        [failed] = await wait_until(lambda: of_type(event_log, "AttemptFailed", second), 20,
                                    what="the second attempt failed")
        assert failed.error_class == "transient"
        assert failed.message.startswith("over the storage budget of tenant 'acme'")
        [retry] = await of_type(event_log, "RetryScheduled", second)
        assert retry.attempt == 2
        assert not await published(event_log, second)
