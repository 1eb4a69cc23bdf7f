"""Workers end to end on both logs, and four failure windows of dispatch and leases
(docs/design.md §5), labelled below: (a) a duplicated assignment, (b) a stale worker paused
past its lease, (c) a crash before the completion commit, (d) the acknowledgement lost after it.

An in-process processor (``Running``) decides and dispatches; workers run in process where
nothing is killed and as real ``chronolog worker`` subprocesses where a test pauses (SIGSTOP) or
kills them (SIGKILL) by PID. The subprocess windows are opened deterministically by the
worker's failpoint ``before_complete:stop`` — the worker SIGSTOPs itself after its handler ran
and its result was staged, before CompleteRun is sent — so no test sleeps to synchronise.

Workers that must pick up a run another (paused or killed) worker holds are started in their
own consumer group: they read every assignment from offset 0 and offer themselves on every
partition at once, without waiting for the stuck member's group session to time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import orjson

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.offers import is_offer
from chronolog.log.port import OutRecord
from chronolog.settings import LogConfig
from chronolog.workers import FilesystemResultStore, Worker
from chronolog.workers.gc import collect
from chronolog.workers.results import parse_uri
from support.polling import wait_until
from support.processors import Running, events, read_all

from .conftest import CHRONOLOG, ROOT, log_url

JOBS_FILE = str(Path(__file__).with_name("worker_jobs.py"))
FAR = (datetime.now(UTC) + timedelta(days=365)).isoformat()


def manual_spec(
    job: str, params: dict[str, Any], lease: str = "30s", **extra: Any
) -> dict[str, Any]:
    """A schedule that only runs when triggered (its one instant is a year away)."""
    return {"at": FAR, "job": {"type": job, "params": params}, "overlap": "allow",
            "lease": lease, **extra}


async def published(lg: Any, run_id: str | None = None) -> list[m.ResultPublished]:
    return [e.payload for e in await events(lg) if e.type == "ResultPublished"
            and (run_id is None or e.payload.run_id == run_id)]


async def of_type(lg: Any, type_: str, run_id: str) -> list[Any]:
    return [e.payload for e in await events(lg)
            if e.type == type_ and getattr(e.payload, "run_id", None) == run_id]


def invocations(path: Path, run_id: str) -> list[list[str]]:
    if not path.exists():
        return []
    return [ln.split() for ln in path.read_text().splitlines() if ln.startswith(run_id + " ")]


async def assignments_for(lg: Any, run_id: str) -> list[Any]:
    return [r for r in await read_all(lg, lg.topics.ready("default"))
            if orjson.loads(r.value)["run_id"] == run_id]


async def all_acknowledged(lg: Any, group: str) -> bool:
    """Every assignment record is below the group's committed offset (Kafka's end offset
    also counts transaction markers, so compare with the last record, not with the end)."""
    topic = lg.topics.ready("default")
    last: dict[int, int] = {}
    for rec in await read_all(lg, topic):
        last[rec.partition] = max(last.get(rec.partition, -1), rec.offset)
    for p, off in last.items():
        if (await lg.committed(group, topic, p) or 0) <= off:
            return False
    return True


@contextlib.asynccontextmanager
async def serving(lg: Any, store: Any, worker_id: str, group: str | None = None,
                  **kw: Any) -> AsyncIterator[Worker]:
    w = Worker(lg, worker_id=worker_id, result_store=store, group=group, reply_timeout=5, **kw)
    w.builtin_jobs()
    from .worker_jobs import register

    register(w)
    task = asyncio.create_task(w.run())
    await w.wait_started()
    try:
        yield w
    finally:
        w.stop()
        await asyncio.wait_for(task, 60)


class WorkerProcess:
    """A ``chronolog worker`` subprocess, signalled and stopped by its PID."""

    def __init__(self, cfg: LogConfig, worker_id: str, tmp: Path, results: Path,
                 failpoint: str | None = None) -> None:
        self.log_path = tmp / f"{worker_id}.log"
        env = dict(os.environ, CHRONOLOG_LOG_LEVEL="INFO")
        if failpoint:
            env["CHRONOLOG_WORKER_FAILPOINT"] = failpoint
        self.proc = subprocess.Popen(
            [CHRONOLOG, "worker", "--log", log_url(cfg), "--topic-prefix", cfg.topics.prefix,
             "--partitions", str(cfg.topics.partitions), "--worker-id", worker_id,
             "--results", str(results), "--builtin-jobs", "--jobs", JOBS_FILE,
             "--reply-timeout", "5", "--drain-timeout", "5"],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"), env=env, cwd=ROOT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stopped(self) -> bool:
        """True while the process is stopped by a signal (state T in /proc)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> int | None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode


@contextlib.contextmanager
def worker_processes() -> Any:
    started: list[WorkerProcess] = []

    def start(*args: Any, **kw: Any) -> WorkerProcess:
        wp = WorkerProcess(*args, **kw)
        started.append(wp)
        return wp

    try:
        yield start
    finally:
        for wp in started:
            wp.terminate()


# ---------------------------------------------------------------------------------------
# end to end


async def test_every_second_echo_publishes_inline_and_staged_results(
    event_log: Any, tmp_path: Path
) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    small = {"x": 1, "name": "sales"}
    large = {"blob": "y" * 10_000}
    async with Running(event_log) as r, serving(event_log, store, "w1"):
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
    async with Running(event_log) as r, serving(event_log, store, "w1"):
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
    async with Running(event_log) as r, serving(event_log, store, "w1") as w:
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
        async with serving(event_log, store, "wa") as wa, \
                serving(event_log, store, "wb", group=group_b) as wb:
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
    async with Running(event_log) as r, serving(event_log, store, "w1") as w:
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
        async with serving(event_log, store, "w2",
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
        async with serving(event_log, store, "w1") as w:
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
        async with serving(event_log, store, "w1",
                           group=f"{event_log.topics.prefix}fresh") as again:
            await wait_until(lambda: again.stats.expired == 1, 20,
                             what="the old assignment skipped")
    assert again.stats.invocations == 0 and again.stats.assignments == 0
    assert len(invocations(calls, run_id)) == 1


# ---------------------------------------------------------------------------------------
# (b): a stale worker paused past its lease


async def test_stale_worker_paused_past_its_lease_gets_stale_fence(
    event_log: Any, log_config: LogConfig, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    store = FilesystemResultStore(results)
    calls = tmp_path / "calls.txt"
    params = {"file": str(calls), "pad": 20_000}  # > 8 KiB: staged, not inline
    with worker_processes() as start:
        async with Running(event_log) as r:
            await r.client.create_schedule("acme", "s", manual_spec("record", params, lease="2s"))
            a = start(log_config, "worker-a", tmp_path, results, failpoint="before_complete:stop")
            run_id = (await r.client.trigger("acme", "s", "k1"))["run_id"]
            # A claimed, ran the handler, staged its result, and is now paused (SIGSTOP)
            await wait_until(a.stopped, 40, what="worker A paused before CompleteRun")
            [claim_a] = await of_type(event_log, "AttemptClaimed", run_id)
            assert claim_a.worker_id == "worker-a"
            [obj_a] = await store.list()
            assert (obj_a.run_id, obj_a.fence) == (run_id, claim_a.fence)
            # the processor expires A's lease by its own clock: fence advanced
            await wait_until(lambda: of_type(event_log, "LeaseExpired", run_id), 20,
                             what="A's lease expired")
            async with serving(event_log, store, "worker-b",
                               group=f"{event_log.topics.prefix}pool-b"):
                [res] = await wait_until(lambda: published(event_log, run_id), 30,
                                         what="B's result")
                assert res.worker_id == "worker-b" and res.fence > claim_a.fence
                # A resumes and completes with its old fence
                os.kill(a.pid, signal.SIGCONT)
                [rej] = await wait_until(lambda: of_type(event_log, "CompletionRejected", run_id),
                                         20, what="A's completion rejected")
            await wait_until(lambda: "completion_refused" in a.log_text(), 10,
                             what="A told stale_fence")
    assert (rej.worker_id, rej.fence, rej.reason) == ("worker-a", claim_a.fence, "stale_fence")
    assert '"status": "stale_fence"' in a.log_text() or "stale_fence" in a.log_text()
    # the canonical result is B's; A's staged object exists, unreferenced
    [res] = await published(event_log, run_id)
    assert orjson.loads(await store.get(res.uri, res.checksum))["worker"] == "worker-b"
    assert {o.uri for o in await store.list()} == {obj_a.uri, res.uri}
    assert [ln[3] for ln in invocations(calls, run_id)] == ["worker-a", "worker-b"]
    # gc: nothing before the grace, then A's object only — never B's
    young = await collect(event_log, store, grace_s=3600)
    assert young.deleted == [] and young.kept_young == 1 and young.kept_referenced == 1
    report = await collect(event_log, store, grace_s=0)
    assert report.deleted == [obj_a.uri]
    assert [o.uri for o in await store.list()] == [res.uri]


# ---------------------------------------------------------------------------------------
# (c): crash before the completion commit


async def test_crash_before_completion_reruns_the_same_run_once(
    event_log: Any, log_config: LogConfig, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    store = FilesystemResultStore(results)
    calls = tmp_path / "calls.txt"
    with worker_processes() as start:
        async with Running(event_log) as r:
            await r.client.create_schedule("acme", "s", manual_spec(
                "record", {"file": str(calls)}, lease="2s"))
            a = start(log_config, "worker-a", tmp_path, results, failpoint="before_complete:stop")
            run_id = (await r.client.trigger("acme", "s", "k1"))["run_id"]
            await wait_until(a.stopped, 40, what="worker A after its handler, before CompleteRun")
            assert len(invocations(calls, run_id)) == 1
            os.kill(a.pid, signal.SIGKILL)
            a.proc.wait(10)
            await wait_until(lambda: of_type(event_log, "LeaseExpired", run_id), 20,
                             what="A's lease expired")
            async with serving(event_log, store, "worker-b",
                               group=f"{event_log.topics.prefix}pool-b") as b:
                await wait_until(lambda: published(event_log, run_id), 30, what="the re-run")
                await wait_until(lambda: b.stats.assignments == 1 and b.stats.foreign >= 1, 20,
                                 what="B ran its own assignment and skipped A's")
    [res] = await published(event_log, run_id)
    assert (res.run_id, res.attempt, res.worker_id) == (run_id, 2, "worker-b")
    assert [(ln[0], ln[1], ln[3]) for ln in invocations(calls, run_id)] == [
        (run_id, "1", "worker-a"), (run_id, "2", "worker-b")]
    claims = await of_type(event_log, "AttemptClaimed", run_id)
    assert [c.attempt for c in claims] == [1, 2]


# ---------------------------------------------------------------------------------------
# graceful drain of a worker process


async def test_sigterm_drains_a_running_handler_then_exits(
    event_log: Any, log_config: LogConfig, tmp_path: Path
) -> None:
    with worker_processes() as start:
        async with Running(event_log) as r:
            await r.client.create_schedule("acme", "s", manual_spec("sleep", {"seconds": 1.5}))
            a = start(log_config, "worker-a", tmp_path, tmp_path / "results")
            run_id = (await r.client.trigger("acme", "s", "k1"))["run_id"]
            await wait_until(lambda: of_type(event_log, "AttemptClaimed", run_id), 40,
                             what="claimed")
            os.kill(a.pid, signal.SIGTERM)
            rc = await asyncio.to_thread(a.proc.wait, 30)
            assert rc == 0, a.log_text()
            [res] = await wait_until(lambda: published(event_log, run_id), 10,
                                     what="the drained handler's result")
    assert res.inline == {"slept": 1.5}
    assert "worker_draining" in a.log_text()


# ---------------------------------------------------------------------------------------
# a completion whose reply is lost is re-sent with the same command ID; per-job timeout


class LosingClient(Client):
    """Appends the first CompleteRun but reports its reply lost (no reply within the bound)."""

    lost: ClassVar[list[str]] = []

    async def collect(self, envs: Any, futs: Any, timeout: float | None = None) -> Any:
        first = [env.command_id for env in envs if env.type == "CompleteRun"]
        if first and not self.lost:
            self.lost.append(first[0])
            return await super().collect(envs, futs, timeout=0.0001)  # appended; times out
        return await super().collect(envs, futs, timeout)


async def test_lost_completion_reply_is_resent_with_the_same_command_id(
    event_log: Any, tmp_path: Path
) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    async with Running(event_log) as r:
        await r.client.create_schedule("acme", "s", manual_spec("echo", {"v": 1}))
        client = LosingClient(event_log, reply_timeout=5)
        client.lost = []
        await client.start()
        w = Worker(event_log, worker_id="w1", result_store=store, client=client, reply_timeout=5)
        w.builtin_jobs()
        task = asyncio.create_task(w.run())
        try:
            run_id = (await r.client.trigger("acme", "s", "k"))["run_id"]
            await wait_until(lambda: w.stats.completed == 1, 20, what="completion confirmed")
        finally:
            w.stop()
            await asyncio.wait_for(task, 30)
            await client.close()
    sent = [codec.decode_command(rec.value) for rec in
            await read_all(event_log, event_log.topics.commands) if not is_offer(rec.headers)]
    completes = [c.command_id for c in sent if c.type == "CompleteRun"]
    assert completes == client.lost * 2  # the same command ID, twice
    assert len(await published(event_log, run_id)) == 1
    assert not await of_type(event_log, "CompletionRejected", run_id)
    assert r.proc.stats.duplicates >= 1


async def test_per_job_timeout_is_a_transient_failure(event_log: Any, tmp_path: Path) -> None:
    store = FilesystemResultStore(tmp_path / "results")
    async with Running(event_log) as r, serving(event_log, store, "w1"):
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
