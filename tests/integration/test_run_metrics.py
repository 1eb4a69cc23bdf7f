"""The run metrics on /metrics are counters the projector keeps as it projects the events.

A real processor, projector, worker (the built-in jobs) and PostgreSQL on both logs: runs
succeed, die, are redriven, cancelled and skipped (an overlap, a resumed backlog collapsed
into a range); then ``chronolog_runs_finished_total``, ``chronolog_runs_skipped_total`` and
``chronolog_run_start_lateness_seconds`` are checked value by value — against what the test
did, and against the read model's rows. A scrape still answers, with the same values, while
the ``runs`` table is renamed away (it reads only the counters); a replay of the log with
other batch boundaries rebuilds the same counters; migration 0005's backfill of an existing
read model counts what its rows show.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chronolog.cli.replay import replay
from chronolog.projections.migrate import load_migrations
from chronolog.projections.store import LATENESS_BUCKETS, bucket_label
from chronolog.tenants import Tenant, Tenants
from chronolog.workers import Worker
from support.polling import wait_until
from support.workers import serving

from .api_stack import ApiStack
from .pgdb import schema_store

pytestmark = pytest.mark.postgres

TENANTS = Tenants({
    "acme": Tenant("acme", ("acme-token",)),
    "globex": Tenant("globex", ("globex-token",), min_interval=0.05),
}, operator_tokens=("ops-token",))
OPS = {"Authorization": "Bearer ops-token"}
FAR = "2099-01-01T00:00:00Z"  # a one-shot never due: only manual triggers run
TERMINAL = ("SUCCEEDED", "DEAD", "CANCELLED", "SKIPPED")
SAMPLE = re.compile(r"^(chronolog_[a-z_]+)\{([^}]*)\} (\S+)$")


def samples(text: str, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``{sorted labels: value}`` of the samples named ``family`` in an exposition."""
    out = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1) == family:
            labels = tuple(sorted(tuple(kv.split("=", 1)) for kv in
                                  re.findall(r'[a-z_]+="[^"]*"', match.group(2))))
            out[tuple((k, v.strip('"')) for k, v in labels)] = float(match.group(3))
    return out


def key(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


async def states(stack: ApiStack, tenant: str, sid: str) -> list[str]:
    assert stack.store is not None
    return [r[0] for r in await stack.store.pool.fetch(
        "SELECT state FROM runs WHERE tenant = $1 AND schedule_id = $2", tenant, sid)]


async def run_state(stack: ApiStack, run_id: str) -> str | None:
    assert stack.store is not None
    state: str | None = await stack.store.pool.fetchval(
        "SELECT state FROM runs WHERE run_id = $1", run_id)
    return state


async def settled(stack: ApiStack, tenant: str, sid: str, n: int) -> bool:
    got = await states(stack, tenant, sid)
    return len(got) >= n and all(s in TERMINAL for s in got)


async def scrape(stack: ApiStack) -> str:
    assert stack.http is not None
    r = await stack.http.get("/metrics", headers=OPS)
    assert r.status_code == 200, r.text
    return r.text


async def counters(pool: Any) -> dict[tuple[str, str, str, str, str], int]:
    return {tuple(r[:5]): int(r[5]) for r in await pool.fetch(
        "SELECT metric, tenant, resource_class, job_type, label, sum(value) FROM run_counters "
        "GROUP BY 1, 2, 3, 4, 5 HAVING sum(value) <> 0")}


async def test_run_counters_follow_the_events_and_a_scrape_never_reads_runs(
    event_log: Any, database_url: str, tmp_path: Path
) -> None:
    async with ApiStack(event_log, database_url, TENANTS) as stack, \
            serving(event_log, tmp_path, "w-metrics", Worker.builtin_jobs):
        c = stack.client
        assert stack.store is not None and stack.projector is not None
        pool = stack.store.pool
        await c.create_schedule("acme", "ok", {"at": FAR, "overlap": "allow",
                                               "job": {"type": "echo"}})
        # fails its first attempt only (permanent: DEAD at once); a redrive then succeeds
        await c.create_schedule("acme", "bad", {
            "at": FAR, "overlap": "allow", "retry": {"max_attempts": 1},
            "job": {"type": "fail", "params": {"times": 1, "kind": "permanent"}}})
        await c.create_schedule("acme", "held", {
            "at": FAR, "overlap": "skip", "lease": 3,
            "job": {"type": "sleep", "params": {"seconds": 60}}})
        for i in range(3):
            await c.trigger("acme", "ok", f"k{i}")
        bad = [(await c.trigger("acme", "bad", f"k{i}"))["run_id"] for i in range(2)]
        held = (await c.trigger("acme", "held", "h1"))["run_id"]
        await wait_until(lambda: _is(stack, held, "LEASED"), 30, what="the sleep run started")
        skipped = (await c.trigger("acme", "held", "h2"))["run_id"]  # overlap: skipped
        await wait_until(lambda: settled(stack, "acme", "bad", 2), 30, what="bad runs DEAD")
        await c.redrive("acme", "bad", bad[0])
        await c.cancel("acme", "held", held)

        # globex: every 100 ms, paused before its start, resumed 2.5 s later: the backlog's
        # newest instant runs, the older ones are skipped as one collapsed range
        start = datetime.now(UTC) + timedelta(seconds=1)
        await c.create_schedule("globex", "tick", {
            "every": 0.1, "start": start.isoformat(), "job": {"type": "echo"},
            "resource_class": "default"})
        await c.pause("globex", "tick")
        await wait_until(lambda: datetime.now(UTC) > start + timedelta(seconds=2.5), 10,
                         what="the paused span")
        await c.resume("globex", "tick")
        await wait_until(lambda: _has(stack, "globex", "tick", "SUCCEEDED"), 30,
                         what="a globex run")
        await c.pause("globex", "tick")

        for tenant, sid, n in (("acme", "ok", 3), ("acme", "bad", 2), ("acme", "held", 2),
                               ("globex", "tick", 2)):
            await wait_until(lambda t=tenant, s=sid, k=n: settled(stack, t, s, k), 60,
                             what=f"{tenant}/{sid} settled")
        assert await run_state(stack, bad[0]) == "SUCCEEDED"
        assert await run_state(stack, skipped) == "SKIPPED"
        assert sorted(await states(stack, "acme", "ok")) == ["SUCCEEDED"] * 3
        # from here on the read model stands still: rows and counters are of the same batches
        await stack.pause_projector()
        text = await scrape(stack)

        # ---- exact values: what this test did (acme) ...
        finished = samples(text, "chronolog_runs_finished_total")
        acme = {k: v for k, v in finished.items() if ("tenant", "acme") in k}
        assert acme == {
            key(tenant="acme", resource_class="default", job_type="echo",
                outcome="succeeded"): 3,
            key(tenant="acme", resource_class="default", job_type="fail", outcome="dead"): 2,
            key(tenant="acme", resource_class="default", job_type="fail",
                outcome="succeeded"): 1,
            key(tenant="acme", resource_class="default", job_type="sleep",
                outcome="cancelled"): 1,
            key(tenant="acme", resource_class="default", job_type="sleep",
                outcome="skipped"): 1,
        }
        skips = samples(text, "chronolog_runs_skipped_total")
        assert skips[key(tenant="acme", resource_class="default", job_type="sleep",
                         reason="overlap")] == 1
        counts = samples(text, "chronolog_run_start_lateness_seconds_count")
        assert counts[key(tenant="acme", resource_class="default")] == 6  # first claims

        # ... and what the read model's rows say (globex's numbers depend on timing)
        rows = await pool.fetch(
            "SELECT state, skipped_reason, skipped_count, job_type FROM runs "
            "WHERE tenant = 'globex'")
        want_skips: dict[str, int] = {}
        for r in rows:
            if r["state"] == "SKIPPED":
                want_skips[r["skipped_reason"]] = want_skips.get(r["skipped_reason"], 0) + \
                    r["skipped_count"]
        assert max(r["skipped_count"] for r in rows) > 20  # a collapsed range among them
        assert {k: v for k, v in skips.items() if ("tenant", "globex") in k} == {
            key(tenant="globex", resource_class="default", job_type="echo", reason=reason): n
            for reason, n in want_skips.items()}
        succeeded = sum(1 for r in rows if r["state"] == "SUCCEEDED")
        assert {k: v for k, v in finished.items() if ("tenant", "globex") in k} == {
            key(tenant="globex", resource_class="default", job_type="echo",
                outcome="succeeded"): succeeded,
            key(tenant="globex", resource_class="default", job_type="echo",
                outcome="skipped"): sum(want_skips.values())}
        await _check_histogram(pool, text)

        # ---- the scrape reads counters, not runs: the same values with runs renamed away
        before = _stable(await scrape(stack))
        await pool.execute("ALTER TABLE runs RENAME TO runs_hidden")
        try:
            during = _stable(await scrape(stack))
        finally:
            await pool.execute("ALTER TABLE runs_hidden RENAME TO runs")
        assert during == before, (set(before) ^ set(during))
        assert any(line.startswith("chronolog_runs_finished_total") for line in during)

        # ---- a replay (other batch boundaries) rebuilds the same counters and READY runs
        topic = event_log.topics.events
        stops = dict(stack.projector.watermark().partitions)
        for p, n in stops.items():
            assert await event_log.end_offset(topic, p) >= n
        live = await counters(pool)
        rebuilt = await schema_store(database_url)
        try:
            await replay(event_log, rebuilt, batch=7, stops=stops)
            assert await counters(rebuilt.pool) == live
            ready = "SELECT run_id, resource_class, job_type, ready_at FROM ready_runs ORDER BY 1"
            assert await rebuilt.pool.fetch(ready) == await pool.fetch(ready)

            # ---- migration 0005 on a read model projected without it: counted from rows
            await rebuilt.pool.execute("DROP TABLE run_counters, ready_runs")
            [m5] = [m for m in load_migrations() if m.version == 5]
            async with rebuilt.pool.acquire() as conn, conn.transaction():
                await conn.execute(m5.sql)
            backfilled = await counters(rebuilt.pool)
        finally:
            await rebuilt.close()
        # by each run's state now: the redriven run is counted as succeeded only
        dead = ("finished", "acme", "default", "fail", "dead")
        assert backfilled[dead] == live[dead] - 1
        assert {k: v for k, v in backfilled.items() if k != dead} == \
            {k: v for k, v in live.items() if k != dead}


async def _is(stack: ApiStack, run_id: str, state: str) -> bool:
    return await run_state(stack, run_id) == state


async def _has(stack: ApiStack, tenant: str, sid: str, state: str) -> bool:
    return state in await states(stack, tenant, sid)


async def _check_histogram(pool: Any, text: str) -> None:
    """Every bucket, count and sum of the lateness histogram, against the runs' first claims."""
    rows = await pool.fetch(
        "SELECT tenant, COALESCE(resource_class, 'default') AS rc, "
        "(EXTRACT(EPOCH FROM (started_at - COALESCE(due_at, scheduled_at))) * 1000000)::bigint "
        "AS us FROM runs WHERE started_at IS NOT NULL")
    buckets = samples(text, "chronolog_run_start_lateness_seconds_bucket")
    sums = samples(text, "chronolog_run_start_lateness_seconds_sum")
    for tenant, rc in {(r["tenant"], r["rc"]) for r in rows}:
        mine = [r["us"] for r in rows if (r["tenant"], r["rc"]) == (tenant, rc)]
        for bound in LATENESS_BUCKETS:
            le = key(tenant=tenant, resource_class=rc, le=bucket_label(bound))
            assert buckets[le] == sum(1 for us in mine if us <= round(bound * 1e6)), le
        assert buckets[key(tenant=tenant, resource_class=rc, le="+Inf")] == len(mine)
        assert sums[key(tenant=tenant, resource_class=rc)] == pytest.approx(sum(mine) / 1e6)


def _stable(text: str) -> list[str]:
    """The exposition without the values that move between two scrapes by themselves: the
    clock's, and the commands topic's size (workers renew their offers there every second)."""
    moving = ("_per_second", "chronolog_projection_lag_seconds",
              "chronolog_oldest_due_age_seconds", "chronolog_commands_total")
    return [line for line in text.splitlines()
            if not line.startswith("#") and not any(m in line for m in moving)]
