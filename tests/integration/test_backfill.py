"""Backfill end to end, on both logs: a schedule's instants of a past range run once each
as runs of their own (``trigger: backfill``), one after another by default; the same request
again changes nothing, an overlapping one runs only what is new; the audit is clean. Through
the HTTP API: the answer, the run documents, and the 4xx of a bad request.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chronolog.domain import messages as m
from chronolog.domain.ids import BACKFILL_RUN
from chronolog.workers import FilesystemResultStore, Worker
from support.polling import wait_until
from support.processors import Running, events
from support.workers import published, serving, serving_test_jobs

from .api_stack import ACME, ApiStack
from .test_concurrency_limits import audited_clean, most_leased_at_once

HOUR = timedelta(hours=1)


def _top_of_hour() -> datetime:
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0)


def _hourly(seconds: float) -> dict[str, Any]:
    return {"cron": "0 * * * *", "job": {"type": "sleep", "params": {"seconds": seconds}},
            "overlap": "skip"}


async def test_a_past_range_runs_once_one_after_another_and_again_changes_nothing(
    event_log: Any, tmp_path: Path
) -> None:
    top = _top_of_hour()
    store = FilesystemResultStore(tmp_path / "results")
    async with Running(event_log) as r, serving_test_jobs(event_log, store, "w1",
                                                          concurrency=4):
        await r.client.create_schedule("acme", "hourly", _hourly(0.2))
        first = await r.client.send(r.client.envelope("acme", "hourly", m.BackfillSchedule(
            request_key="bf-1", start=top - 3 * HOUR, end=top)), timeout=30)
        assert first.status == "ok", first
        runs = {i["run_id"] for i in first.body["items"]}
        assert len(runs) == 3 and all(x.startswith(BACKFILL_RUN) for x in runs)

        async def done() -> bool:
            return {p.run_id for p in await published(event_log)} >= runs

        await wait_until(done, 60, what="the three backfilled runs finished")
        again = await r.client.send(r.client.envelope("acme", "hourly", m.BackfillSchedule(
            request_key="bf-1", start=top - 3 * HOUR, end=top)), timeout=30)
        assert again.status == "ok" and again.body["repeated"] is True
        wider = await r.client.send(r.client.envelope("acme", "hourly", m.BackfillSchedule(
            request_key="bf-2", start=top - 4 * HOUR, end=top)), timeout=30)
        reasons = [i.get("reason") for i in wider.body["items"]]
        assert reasons == [None, "backfilled", "backfilled", "backfilled"], wider.body
        new = {wider.body["items"][0]["run_id"]}

        async def new_done() -> bool:
            return {p.run_id for p in await published(event_log)} >= new

        await wait_until(new_done, 60, what="the fourth hour's run finished")
    envs = await events(event_log)
    made = [e.payload for e in envs if isinstance(e.payload, m.OccurrenceMaterialized)
            and e.payload.trigger == "backfill"]
    assert sorted(p.scheduled_at for p in made) == [top - k * HOUR for k in (4, 3, 2, 1)]
    assert most_leased_at_once(envs, runs | new) == 1  # buffer_all: one after another
    assert sum(1 for e in envs if e.type == "BackfillRequested") == 2
    audited_clean(envs)


@pytest.mark.postgres
async def test_the_api_backfills_and_refuses_a_bad_range(
    event_log: Any, database_url: str, tmp_path: Path
) -> None:
    top = _top_of_hour()
    async with ApiStack(event_log, database_url) as stack, serving(
            event_log, tmp_path, "w1", Worker.builtin_jobs):
        http = stack.http
        assert http is not None
        made = await http.post("/v1/schedules", headers=ACME,
                               json={"scheduleId": "hourly", **_hourly(0)})
        assert made.status_code == 201, made.text

        async def backfill(body: dict[str, Any], key: str = "k1",
                           sid: str = "hourly") -> Any:
            return await http.post(f"/v1/schedules/{sid}:backfill", json=body,
                                   headers={**ACME, "Idempotency-Key": key})

        ok = await backfill({"from": (top - 2 * HOUR).isoformat(), "to": top.isoformat(),
                             "overlap": "allow"})
        assert ok.status_code == 200, ok.text
        doc = ok.json()
        assert (doc["backfillId"], doc["instants"], doc["runs"], doc["repeated"]) == (
            "k1", 2, 2, False)
        run_id = doc["items"][0]["runId"]

        async def succeeded() -> Any:
            got = await http.get(f"/v1/runs/{run_id}", headers=ACME)
            return got.json() if got.status_code == 200 and got.json()[
                "state"] == "SUCCEEDED" else None

        run = await wait_until(succeeded, 30, what="a backfilled run succeeded")
        assert run["trigger"] == "backfill" and run["scheduledAt"].startswith(
            (top - 2 * HOUR).strftime("%Y-%m-%dT%H:%M:%S"))

        future = await backfill({"from": top.isoformat(),
                                 "to": (top + 2 * HOUR).isoformat()}, "k2")
        assert future.status_code == 400 and future.json()["field"] == "to", future.text
        many = await backfill({"from": (top - 60 * 24 * HOUR).isoformat(),
                               "to": top.isoformat()}, "k3")
        assert many.status_code == 400 and "at most 1000" in many.json()["message"]
        clash = await backfill({"from": (top - 3 * HOUR).isoformat(), "to": top.isoformat()})
        assert clash.status_code == 409 and clash.json()["field"] == "Idempotency-Key"
        missing = await backfill({"from": (top - HOUR).isoformat(), "to": top.isoformat()},
                                 "k4", sid="nope")
        assert missing.status_code == 404
        bad = await backfill({"from": "yesterday", "to": top.isoformat()}, "k5")
        assert bad.status_code == 400 and bad.json()["field"] == "from", bad.text
        no_key = await http.post("/v1/schedules/hourly:backfill", headers=ACME, json={
            "from": (top - HOUR).isoformat(), "to": top.isoformat()})
        assert no_key.status_code == 400 and no_key.json()["field"] == "Idempotency-Key"
