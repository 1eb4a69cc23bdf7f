"""Workers end to end on the in-memory log, and two failure windows of dispatch and leases
(docs/design.md §5), labelled below: (a) a duplicated assignment, (d) the acknowledgement lost
after the completion commit.

An in-process processor (``Running``) decides and dispatches; the workers run in process
(nothing is killed here). The windows that need a real worker process paused or killed — (b)
a stale worker paused past its lease, (c) a crash before the completion commit — and a reply
lost in transit (a reply wait shorter than a real log's round trip) are in
``tests/integration/test_workers.py``, on both real logs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from chronolog.domain import messages as m
from chronolog.log.port import OutRecord
from chronolog.workers import FilesystemResultStore
from chronolog.workers.results import parse_uri
from support.polling import wait_until
from support.processors import Running, events
from support.workers import (
    FAR,
    all_acknowledged,
    assignments_for,
    invocations,
    manual_spec,
    of_type,
    published,
    serving_test_jobs,
)

# ---------------------------------------------------------------------------------------
# end to end


async def test_every_second_echo_publishes_inline_and_staged_results(
    event_log: Any, tmp_path: Path
) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    small = {"x": 1, "name": "sales"}
    large = {"blob": "y" * 10_000}
    async with Running(event_log) as r, serving_test_jobs(event_log, store, "w1"):
        await r.client.create_schedule("acme", "small", {
            "every": "1s", "job": {"type": "echo", "params": small}})
        await r.client.create_schedule("acme", "large", {
            "every": "1s", "job": {"type": "echo", "params": large}})

        async def enough() -> list[m.ResultPublished] | None:
            res = await published(event_log)
            keys = {p.run_id for p in res}
            return res if len(keys) >= 4 else None

        await wait_until(enough, 30, what="results of both schedules")
    evs = await events(event_log)
    runs = {e.payload.run_id: e.schedule_id for e in evs if e.type == "OccurrenceMaterialized"}
    by_schedule: dict[str, list[m.ResultPublished]] = {"small": [], "large": []}
    for e in evs:
        if e.type == "ResultPublished":
            by_schedule[runs[e.payload.run_id]].append(e.payload)
    assert by_schedule["small"] and by_schedule["large"]
    for p in by_schedule["small"]:
        assert p.inline == small and p.uri is None
        assert p.checksum == __import__("hashlib").sha256(orjson.dumps(small)).hexdigest()
    for p in by_schedule["large"]:
        assert p.inline is None and p.uri is not None and p.size > 8 * 1024
        assert orjson.loads(await store.get(p.uri, p.checksum)) == large
        assert parse_uri(p.uri)[2] == p.fence
    # one result per run, and every published run went through a claim first
    ids = [p.run_id for ps in by_schedule.values() for p in ps]
    assert len(ids) == len(set(ids))
    claimed = {e.payload.run_id for e in evs if e.type == "AttemptClaimed"}
    assert set(ids) <= claimed


async def test_failures_are_classified_and_retried(event_log: Any, tmp_path: Path) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    retry = {"max_attempts": 3, "initial_backoff": 0.05, "max_backoff": 0.1}
    async with Running(event_log) as r, serving_test_jobs(event_log, store, "w1"):
        for kind in ("transient", "permanent", "ambiguous"):
            await r.client.create_schedule("acme", kind, manual_spec(
                "fail", {"times": 1, "kind": kind}, retry=retry))
        runs = {kind: (await r.client.trigger("acme", kind, "k1"))["run_id"]
                for kind in ("transient", "permanent", "ambiguous")}
        await wait_until(lambda: published(event_log, runs["transient"]), 20,
                         what="transient failure retried then succeeded")
        await wait_until(lambda: of_type(event_log, "OccurrenceDeadLettered", runs["permanent"]),
                         20, what="permanent failure dead-lettered")
        await wait_until(lambda: of_type(event_log, "ReconciliationRequired",
                                         runs["ambiguous"]), 20, what="ambiguous -> reconciling")
    [res] = await published(event_log, runs["transient"])
    assert res.attempt == 2 and res.inline == {"attempt": 2}
    [failed] = await of_type(event_log, "AttemptFailed", runs["permanent"])
    assert failed.error_class == "permanent"
    assert not await published(event_log, runs["permanent"])
    assert not await published(event_log, runs["ambiguous"])


async def test_cancel_request_reaches_a_sleeping_handler_through_heartbeats(
    event_log: Any, tmp_path: Path
) -> None:
    """A cancel request reaches the handler through the heartbeat; the run ends CANCELLED."""
    store = FilesystemResultStore(tmp_path / "results")
    async with Running(event_log) as r, serving_test_jobs(event_log, store, "w1") as w:
        await r.client.create_schedule("acme", "s", manual_spec(
            "sleep", {"seconds": 60}, lease="1s"))
        run_id = (await r.client.trigger("acme", "s", "k"))["run_id"]
        await wait_until(lambda: of_type(event_log, "AttemptClaimed", run_id), 20,
                         what="claimed")
        await r.client.cancel("acme", "s", run_id)
        await wait_until(lambda: of_type(event_log, "OccurrenceCancelled", run_id), 20,
                         what="cancelled")
        await wait_until(lambda: w.stats.failed >= 1, 10, what="worker reported the attempt")
    assert not await published(event_log, run_id)


# ---------------------------------------------------------------------------------------
# (a): duplicate delivery — the handler runs once


async def test_a_duplicated_assignment_runs_its_handler_once(
    event_log: Any, tmp_path: Path
) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    calls = tmp_path / "calls.txt"
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s", manual_spec("record", {"file": str(calls)}))
        group_b = f"{event_log.topics.prefix}workers-b"
        async with serving_test_jobs(event_log, store, "wa") as wa, \
                serving_test_jobs(event_log, store, "wb", group=group_b) as wb:
            run_id = (await r.client.trigger("acme", "s", "k1"))["run_id"]
            await wait_until(lambda: published(event_log, run_id), 30, what="the result")
            [assignment] = await assignments_for(event_log, run_id)
            # the processor died after its assignment was in the log and "sent it again"
            for _ in range(2):
                await event_log.append([OutRecord(assignment.topic, assignment.key,
                                                  assignment.value,
                                                  partition=assignment.partition)])
            assert len(await assignments_for(event_log, run_id)) == 3
            await wait_until(lambda: all(w.stats.assignments + w.stats.foreign >= 3
                                         for w in (wa, wb)), 20,
                             what="every copy delivered to both workers")
            await wait_until(lambda: all_acknowledged(event_log, wa.group), 20,
                             what="group a acknowledged every record")
            await wait_until(lambda: all_acknowledged(event_log, group_b), 20,
                             what="group b acknowledged every record")
            admitted = wa.stats.assignments + wb.stats.assignments
            skipped = wa.stats.foreign + wb.stats.foreign
    assignee = orjson.loads(assignment.value)["assignee"]
    assert assignee in ("wa", "wb")
    assert (admitted, skipped) == (1, 5)
    assert [ln[3] for ln in invocations(calls, run_id)] == [assignee]
    [claim] = await of_type(event_log, "AttemptClaimed", run_id)
    assert claim.worker_id == assignee
    assert len(await published(event_log, run_id)) == 1


# ---------------------------------------------------------------------------------------
# (d): acknowledgement lost after the completion commit


async def test_a_reread_assignment_after_completion_is_not_run_again(
    event_log: Any, tmp_path: Path
) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    calls = tmp_path / "calls.txt"
    async with Running(event_log) as r, serving_test_jobs(event_log, store, "w1") as w:
        await r.client.create_schedule("acme", "s", manual_spec("record", {"file": str(calls)}))
        run_id = (await r.client.trigger("acme", "s", "k1"))["run_id"]
        await wait_until(lambda: published(event_log, run_id), 20, what="the result")
        await wait_until(lambda: all_acknowledged(event_log, w.group), 20,
                         what="assignment acked")
        assert w.stats.assignments == 1
        # the acknowledgement was lost: the broker delivers the assignment again
        [assignment] = await assignments_for(event_log, run_id)
        await event_log.append([OutRecord(assignment.topic, assignment.key, assignment.value,
                                          partition=assignment.partition)])
        await wait_until(lambda: w.stats.foreign == 1, 20, what="the re-read skipped")
        await wait_until(lambda: all_acknowledged(event_log, w.group), 20,
                         what="the re-read record acknowledged")
        # and a worker whose group lost every acknowledgement (reads from offset 0)
        async with serving_test_jobs(event_log, store, "w2",
                           group=f"{event_log.topics.prefix}fresh") as w2:
            await wait_until(lambda: w2.stats.foreign == 2, 20,
                             what="both copies skipped by a fresh group")
    assert w2.stats.assignments == 0 and w2.stats.invocations == 0
    assert w.stats.invocations == 1
    assert len(invocations(calls, run_id)) == 1
    assert len(await published(event_log, run_id)) == 1


async def test_an_assignment_read_again_after_its_lease_passed_is_not_run(
    event_log: Any, tmp_path: Path
) -> None:
    """The same worker ID restarted in a new consumer group reads ready.<class> from the
    start: an assignment whose lease is over is skipped, its handler does not run again."""
    store = FilesystemResultStore(tmp_path / "results")
    calls = tmp_path / "calls.txt"
    async with Running(event_log) as r:
        async with serving_test_jobs(event_log, store, "w1") as w:
            await r.client.create_schedule(
                "acme", "s", manual_spec("record", {"file": str(calls)}, lease="1s"))
            run_id = (await r.client.trigger("acme", "s", "k1"))["run_id"]
            await wait_until(lambda: published(event_log, run_id), 20, what="the result")
        assert w.stats.invocations == 1
        [assignment] = await assignments_for(event_log, run_id)
        lease_until = datetime.fromisoformat(
            orjson.loads(assignment.value)["lease_until"].replace("Z", "+00:00"))
        await wait_until(lambda: datetime.now(UTC) > lease_until, 10,
                         what="the lease over")
        async with serving_test_jobs(event_log, store, "w1",
                           group=f"{event_log.topics.prefix}fresh") as again:
            await wait_until(lambda: again.stats.expired == 1, 20,
                             what="the old assignment skipped")
    assert again.stats.invocations == 0 and again.stats.assignments == 0
    assert len(invocations(calls, run_id)) == 1


# ---------------------------------------------------------------------------------------
# per-job timeout


async def test_per_job_timeout_is_a_transient_failure(event_log: Any, tmp_path: Path) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    async with Running(event_log) as r, serving_test_jobs(event_log, store, "w1"):
        await r.client.create_schedule("acme", "s", {
            "at": FAR, "overlap": "allow", "retry": {"max_attempts": 2, "initial_backoff": 0.05},
            "job": {"type": "sleep", "params": {"seconds": 30}, "timeout": 0.3}})
        run_id = (await r.client.trigger("acme", "s", "k"))["run_id"]
        await wait_until(lambda: of_type(event_log, "OccurrenceDeadLettered", run_id), 30,
                         what="two timed-out attempts, then dead")
    failures = await of_type(event_log, "AttemptFailed", run_id)
    assert [(f.attempt, f.error_class) for f in failures] == [(1, "transient"), (2, "transient")]
    assert all("timeout" in f.message for f in failures)
    [dead] = await of_type(event_log, "OccurrenceDeadLettered", run_id)
    assert dead.reason == "max_attempts"
