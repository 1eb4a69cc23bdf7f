"""Real processor processes record their recurrence engine and tz database in the ``rules``
header of every event they write; two processors of one deployment reading different tz
databases (one with ``PYTHONTZPATH`` on a zone database compiled with ``zic``) are reported
by ``chronolog audit`` (a note) and by the projector's metrics
(``chronolog_processor_rules_mismatch``), on both logs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from chronolog.client import Client
from chronolog.projections.metrics import ProjectorCollector
from chronolog.projections.projector import Projector
from chronolog.settings import LogConfig, RulesVersion, installed_rules
from support.processors import read_all
from support.tzdb import VERSION, compile_no_dst_new_york

from .conftest import log_url
from .pgdb import create_database, drop_database, schema_store
from .test_processor_faults import ids_per_partition

pytestmark = pytest.mark.postgres

CHRONOLOG = Path(sys.executable).parent / "chronolog"
RULE = {"cron": "0 0 1 1 *", "timezone": "America/New_York", "job": {"type": "noop"}}


async def _create(event_log: Any, sids: list[str]) -> None:
    async with Client(event_log, reply_timeout=60) as client:
        for sid in sids:
            body = await client.create_schedule("acme", sid, RULE)  # raises unless ok
            assert body["revision"] == 1


async def test_processors_on_different_tz_databases_are_reported(
    log_config: LogConfig, event_log: Any, processes: Any, tmp_path: Path, database_url: str
) -> None:
    n = log_config.topics.partitions
    sids = ids_per_partition(n)  # sids[p] lands on partition p
    old = processes(log_config, "proc-old")
    await _create(event_log, sids[: n // 2])
    assert old.stop() == 0
    tz = compile_no_dst_new_york(tmp_path)
    new = processes(log_config, "proc-new", {"PYTHONTZPATH": str(tz)})
    await _create(event_log, sids[n // 2:])
    assert new.stop() == 0

    installed = installed_rules()
    upgraded = RulesVersion(installed.engine, VERSION)
    headers = {}
    for rec in await read_all(event_log, event_log.topics.events):
        h = dict(rec.headers)
        headers[rec.partition] = (h["processor"].decode(), RulesVersion.parse(h["rules"]))
    assert headers == {p: ("proc-old", installed) if p < n // 2 else ("proc-new", upgraded)
                       for p in range(n)}

    # chronolog audit: clean, with a note naming both
    r = await asyncio.to_thread(
        subprocess.run, [str(CHRONOLOG), "audit", "--log", log_url(log_config), "--json"],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, CHRONOLOG_TOPIC_PREFIX=log_config.topics.prefix))
    assert r.returncode == 0, r.stdout + r.stderr
    notes = [x for x in json.loads(r.stdout)["notes"] if "processors disagree" in x]
    assert len(notes) == 1
    low = ",".join(str(p) for p in range(n // 2))
    high = ",".join(str(p) for p in range(n // 2, n))
    assert f"{installed.label} on partitions {low} (processor proc-old)" in notes[0]
    assert f"{upgraded.label} on partitions {high} (processor proc-new)" in notes[0]

    # the projector's metrics
    dsn = await create_database(database_url, "rules_versions")
    try:
        store = await schema_store(dsn, "public")
        try:
            projector = Projector(event_log, store)
            await projector.run_until_caught_up(60)
            registry = CollectorRegistry()
            registry.register(ProjectorCollector(projector))
            text = generate_latest(registry).decode()
        finally:
            await store.close()
    finally:
        await drop_database(database_url, dsn)
    assert "chronolog_processor_rules_mismatch 1.0" in text
    assert (f'chronolog_processor_rules{{engine="{installed.engine}",tzdata="{VERSION}"}} '
            f"{float(n - n // 2)}") in text
    assert (f'chronolog_processor_rules{{engine="{installed.engine}",'
            f'tzdata="{installed.tzdata}"}} {float(n // 2)}') in text
