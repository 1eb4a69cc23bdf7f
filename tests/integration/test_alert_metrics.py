"""The counters behind the alerts of docs/alerts.md move when their fact happens, on both
logs: a real processor, effect runner and projector (in-process) with real destinations on
loopback — a webhook answering 400 (the publication fails for good) and an SMTP server that
drops its reply after DATA (the delivery is uncertain) — and a real PostgreSQL read model,
scraped as ``/metrics`` renders it.

A worker's lease expires (``chronolog_leases_expired_total``), its late completion is
rejected (``chronolog_completions_rejected_total{reason="stale_fence"}``), then the run's
effects end failed and uncertain (``chronolog_effects_finished_total``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chronolog.projections.projector import Projector
from chronolog.queries.metrics import MetricsSource, render
from support.polling import wait_until

from .effect_servers import HookServer, SmtpServer
from .pgdb import create_database, drop_database, schema_store
from .test_effect_scenarios import FAR, SCHEDULE, TENANT, Stack, crash_and_redelivery, granted
from .test_run_metrics import key, samples

pytestmark = pytest.mark.postgres

LABELS = {"tenant": TENANT, "resource_class": "default", "job_type": "invoice"}


@pytest.fixture
async def read_model(database_url: str) -> AsyncIterator[str]:
    dsn = await create_database(database_url, "alert_metrics")
    yield dsn
    await drop_database(database_url, dsn)


async def test_lease_rejection_and_effect_counters_move_with_their_events(
    event_log: Any, read_model: str
) -> None:
    hook = await HookServer().start()
    hook.plan = ["400"]
    smtp = SmtpServer().start()
    smtp.handler.drop_after_data = 1
    tenants = granted(
        hook={"kind": "webhook", "url": hook.url, "backoff": "20ms", "timeout": "3s",
              "allow_private": True},
        mail={"kind": "email", "host": "127.0.0.1", "port": smtp.port,
              "from": "billing@example.com", "to": ["customer@example.com"], "timeout": "3s"})
    spec = {"at": FAR, "job": {"type": "invoice"}, "lease": "1s", "overlap": "allow",
            "effects": [{"kind": "webhook", "destination": "hook"},
                        {"kind": "email", "destination": "mail"}]}
    store = await schema_store(read_model, "public")
    projector = Projector(event_log, store, idle_ms=20)
    projecting = asyncio.create_task(projector.run())
    source = MetricsSource(store.pool, event_log)

    async def scrape(family: str) -> dict[Any, float]:
        return samples(render(await source.snapshot()).decode(), family)

    try:
        async with Stack(event_log) as s:
            await s.client.create_schedule(TENANT, SCHEDULE, spec)
            await wait_until(lambda: _projected(store, "schedules", 1), 30, what="projected")
            assert await scrape("chronolog_leases_expired_total") == {}
            assert await scrape("chronolog_completions_rejected_total") == {}
            assert await scrape("chronolog_effects_finished_total") == {}

            await crash_and_redelivery(s, event_log)  # A's lease expires, its late result too

            async def lease_and_rejection() -> bool:
                leases = await scrape("chronolog_leases_expired_total")
                rejected = await scrape("chronolog_completions_rejected_total")
                return (leases == {key(**LABELS): 1.0}
                        and rejected == {key(**LABELS, reason="stale_fence"): 1.0})

            await wait_until(lease_and_rejection, 30, what="lease and rejection counted")
            assert await scrape("chronolog_effects_finished_total") == {}

            fx, task = await s.runner("fx1", tenants=tenants)

            async def effects() -> dict[Any, float]:
                return await scrape("chronolog_effects_finished_total")

            await wait_until(lambda: _has_two(effects()), 30, what="both effects counted")
            await s.stop(fx, task)
            assert await effects() == {key(**LABELS, outcome="failed"): 1.0,
                                       key(**LABELS, outcome="uncertain"): 1.0}
            # the other counters did not move again
            assert await scrape("chronolog_leases_expired_total") == {key(**LABELS): 1.0}
    finally:
        projector.stop()
        await asyncio.wait_for(projecting, 30)
        await store.close()
        await hook.close()
        smtp.stop()


async def _has_two(got: Any) -> bool:
    return len(await got) == 2


async def _projected(store: Any, table: str, n: int) -> bool:
    return bool(await store.pool.fetchval(f"SELECT count(*) >= $1 FROM {table}", n))
