"""Concurrency limits end to end, on both logs: runs of schedules on different partitions
that share a concurrency key are never LEASED more than ``limit`` at once — with a processor
in process and a worker of several slots, and across a ``chronolog processor`` killed with
SIGKILL and replaced — and ``chronolog audit``'s checks find the log clean.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from chronolog.audit.auditor import audit
from chronolog.client import Client
from chronolog.domain import messages as m
from chronolog.settings import LogConfig
from chronolog.workers import FilesystemResultStore, Worker
from support.polling import wait_until
from support.processors import Running, events
from support.workers import manual_spec, published, serving, serving_test_jobs

from .api_stack import ACME, ApiStack
from .test_processor_faults import ids_per_partition


def _spec(key: str, limit: int, seconds: float) -> dict[str, Any]:
    return manual_spec("sleep", {"seconds": seconds},
                       concurrency={"key": key, "limit": limit})


def most_leased_at_once(envs: list[m.EventEnvelope], runs: set[str]) -> int:
    """The most attempts of ``runs`` LEASED at one instant, from each claim (its
    ``claimed_at``) to the event that ended the attempt (its ``at``)."""
    moments: list[tuple[datetime, int]] = []
    open_: dict[str, datetime] = {}
    for e in envs:
        p = e.payload
        run_id = getattr(p, "run_id", None)
        if run_id not in runs:
            continue
        if isinstance(p, m.AttemptClaimed):
            open_[run_id] = p.claimed_at
        elif isinstance(p, (m.ResultPublished, m.AttemptFailed, m.LeaseExpired,
                            m.OccurrenceCancelled)) and run_id in open_:
            moments += [(open_.pop(run_id), 1), (e.at, -1)]
    assert not open_, f"attempts never ended: {sorted(open_)}"
    most = now = 0
    for _, step in sorted(moments, key=lambda x: (x[0], x[1])):  # an end before a start
        now += step
        most = max(most, now)
    return most


def audited_clean(envs: list[m.EventEnvelope]) -> None:
    """``chronolog audit``'s checks over the events: no violation."""
    report = audit(envs)
    assert report.ok, report.violations


def _every_claim_was_permitted(envs: list[m.EventEnvelope], runs: set[str]) -> None:
    permitted: dict[str, bool] = defaultdict(bool)
    for e in envs:
        p = e.payload
        if isinstance(p, m.RunPermitted) and p.run_id in runs:
            permitted[p.run_id] = True
        elif isinstance(p, m.RunPermitReturned) and p.run_id in runs:
            permitted[p.run_id] = False
        elif isinstance(p, m.AttemptClaimed) and p.run_id in runs:
            assert permitted[p.run_id], f"run {p.run_id} claimed without its permit"


async def test_runs_sharing_a_key_across_partitions_never_exceed_its_limit(
    event_log: Any, tmp_path: Path
) -> None:
    """Three schedules on three partitions, one key with limit 2, nine runs of 0.3 s and a
    worker of 4 slots: at most 2 LEASED at once, and 2 at once reached (the limit binds,
    the worker does not); every run finishes; the audit is clean."""
    sids = ids_per_partition(event_log.topics.partitions)[:3]
    store = FilesystemResultStore(tmp_path / "results")
    async with Running(event_log) as r, serving_test_jobs(event_log, store, "w1",
                                                          concurrency=4):
        for sid in sids:
            await r.client.create_schedule("acme", sid, _spec("shared", 2, 0.3))
        runs = {(await r.client.trigger("acme", sid, f"k{i}"))["run_id"]
                for sid in sids for i in range(3)}

        async def all_done() -> bool:
            return len(await published(event_log)) >= len(runs)

        await wait_until(all_done, 60, what="nine runs finished two at a time")
    envs = await events(event_log)
    assert most_leased_at_once(envs, runs) == 2
    _every_claim_was_permitted(envs, runs)
    queued = [e for e in envs if e.type == "PermitQueued"]
    assert queued, "no run ever waited for a permit: the limit was not exercised"
    audited_clean(envs)


async def test_the_limit_holds_across_a_processor_killed_with_sigkill(
    log_config: LogConfig, event_log: Any, processes: Any, tmp_path: Path
) -> None:
    """Limit 1 over schedules on every partition; the processor holding the permits is
    killed with SIGKILL while runs are LEASED and waiting; another takes over from the log:
    every run finishes, never two LEASED at once, the audit is clean."""
    a = processes(log_config, "proc-a")
    sids = ids_per_partition(log_config.topics.partitions)
    store = FilesystemResultStore(tmp_path / "results")
    async with Client(event_log, reply_timeout=60) as client, serving_test_jobs(
            event_log, store, "w1", concurrency=4):
        for sid in sids:
            await client.create_schedule("acme", sid, _spec("one-at-a-time", 1, 0.2))
        runs = {(await client.trigger("acme", sid, f"k{i}"))["run_id"]
                for i in range(4) for sid in sids}

        async def finished() -> int:
            return len(await published(event_log))

        async def some_finished() -> bool:
            return await finished() >= 2

        await wait_until(some_finished, 60, what="two runs finished under proc-a")
        a.signal(signal.SIGKILL)
        processes(log_config, "proc-b")

        async def all_done() -> bool:
            return await finished() >= len(runs)

        await wait_until(all_done, 120, what="every run finished under proc-b")
    envs = await events(event_log)
    assert most_leased_at_once(envs, runs) == 1
    _every_claim_was_permitted(envs, runs)
    audited_clean(envs)


@pytest.mark.postgres
async def test_the_api_shows_what_a_run_waits_for_and_refuses_a_bad_key(
    event_log: Any, database_url: str, tmp_path: Path
) -> None:
    """Limit 1, two runs of a long sleep: one LEASED, the other READY whose ``waiting``
    names the key (the run, the schedule's runs, the tenant's runs) until the first is
    cancelled; a key naming a param the job lacks is a 400 naming ``concurrency.key``."""
    async with ApiStack(event_log, database_url) as stack, serving(
            event_log, tmp_path, "w1", Worker.builtin_jobs):
        http = stack.http
        assert http is not None
        bad = await http.post("/v1/schedules", headers=ACME, json={
            "scheduleId": "bad", **_spec("r-{region}", 1, 1)})
        assert bad.status_code == 400 and bad.json()["field"] == "concurrency.key", bad.text
        over = await http.post("/v1/schedules", headers=ACME, json={
            "scheduleId": "bad", **_spec("r", 0, 1)})
        assert over.status_code == 400 and over.json()["field"] == "concurrency.limit"
        made = await http.post("/v1/schedules", headers=ACME, json={
            "scheduleId": "report", **_spec("tenant-{region}", 1, 600),
            "job": {"type": "sleep", "params": {"seconds": 600, "region": "eu"}}})
        assert made.status_code == 201, made.text
        ids = []
        for key in ("first", "second"):
            r = await http.post("/v1/schedules/report/runs", headers={
                **ACME, "Idempotency-Key": key})
            assert r.status_code in (200, 201, 202), r.text
            ids.append(r.json()["runId"])

        async def states() -> Any:
            got = [(await http.get(f"/v1/runs/{i}", headers=ACME)).json() for i in ids]
            return got if sorted(g.get("state") for g in got) == ["LEASED", "READY"] else None

        first, second = sorted(await wait_until(states, 30, what="one leased, one waiting"),
                               key=lambda g: g["state"])
        waiting = "waiting for a permit of concurrency key 'tenant-eu' (limit 1)"
        assert first["waiting"] is None and second["waiting"] == waiting
        listed = (await http.get("/v1/schedules/report/runs", headers=ACME)).json()["items"]
        assert {i["runId"]: i["waiting"] for i in listed}[second["runId"]] == waiting
        tenant = (await http.get("/v1/runs", headers=ACME)).json()["items"]
        assert {i["runId"]: i["waiting"] for i in tenant}[second["runId"]] == waiting
        r = await http.post(f"/v1/runs/{first['runId']}:cancel", headers=ACME, json={})
        assert r.status_code in (200, 202), r.text

        async def second_leased() -> Any:
            got = (await http.get(f"/v1/runs/{second['runId']}", headers=ACME)).json()
            return got if got["state"] == "LEASED" else None

        assert (await wait_until(second_leased, 30, what="the second run leased"))[
            "waiting"] is None
