"""Jobs find their worker, on the in-memory log: two real workers with different job modules on one
processor each get only the runs they have a handler for, and workers announce themselves
(the membership records the read side folds into the ``workers`` table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chronolog.domain.membership import Announcement
from chronolog.workers import Worker
from support import greet_jobs
from support.polling import wait_until
from support.processors import Running, events, read_all
from support.workers import serving


def every_second(job: str) -> dict[str, Any]:
    return {"every": "1s", "job": {"type": job, "params": {"name": "ada"}}, "overlap": "allow"}


async def test_two_workers_each_run_goes_only_to_the_worker_with_its_handler(
    event_log: Any, tmp_path: Path
) -> None:
    async with Running(event_log) as r, \
            serving(event_log, tmp_path, "w-echo", Worker.builtin_jobs), \
            serving(event_log, tmp_path, "w-greet", greet_jobs.register):
        for i in range(3):
            await r.client.create_schedule("acme", f"echo-{i}", every_second("echo"))
            await r.client.create_schedule("acme", f"greet-{i}", every_second("greet"))

        async def both_served() -> Any:
            evs = await events(event_log)
            sids = {e.payload.run_id: e.schedule_id for e in evs
                    if e.type == "OccurrenceMaterialized"}
            done = [sids.get(e.payload.run_id, "") for e in evs if e.type == "ResultPublished"]
            return evs if (sum(s.startswith("echo") for s in done) >= 6
                           and sum(s.startswith("greet") for s in done) >= 6) else None

        evs = await wait_until(both_served, 60, what="six results of each job type")
    job = {e.payload.run_id: e.payload.job.type for e in evs
           if e.type == "OccurrenceMaterialized"}
    claims = [e.payload for e in evs if e.type == "AttemptClaimed"]
    assert claims and {(job[c.run_id], c.worker_id) for c in claims} == {
        ("echo", "w-echo"), ("greet", "w-greet")}
    failures = [e.payload for e in evs if e.type == "AttemptFailed"]
    assert failures == [], f"no run may fail (e.g. 'no handler'): {failures}"


async def test_a_worker_announces_its_classes_job_types_and_slots_and_says_when_it_stops(
    event_log: Any, tmp_path: Path
) -> None:
    async with serving(event_log, tmp_path, "w-greet", greet_jobs.register) as w:
        async def two_announcements() -> Any:
            recs = await read_all(event_log, event_log.topics.workers)
            return recs if len(recs) >= 2 else None

        recs = await wait_until(two_announcements, 20, what="announcements")
        first = Announcement.decode(recs[0].value)
        assert recs[0].key == b"w-greet" and first.worker_id == "w-greet"
        assert {c: (s.job_types, s.slots) for c, s in first.classes.items()} == {
            "default": (("greet",), w.concurrency)}
        assert not first.stopping
    last = Announcement.decode((await read_all(event_log, event_log.topics.workers))[-1].value)
    assert last.stopping and last.sent_at >= first.sent_at
