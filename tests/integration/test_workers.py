"""Workers as real processes on both logs, and two failure windows of dispatch and leases
(docs/design.md §5): (b) a stale worker paused past its lease, (c) a crash before the
completion commit; a worker draining on SIGTERM; a completion whose reply is lost (its wait
shorter than the log's round trip) re-sent with the same command ID. The windows (a) a
duplicated assignment and (d) the acknowledgement lost after the completion are unit-tested on
the in-memory log (``tests/unit/processor/test_workers.py``), with the workers' end-to-end
runs.

An in-process processor (``Running``) decides and dispatches; workers run as real
``chronolog worker`` subprocesses, which a test pauses (SIGSTOP) or kills (SIGKILL) by PID.
The windows are opened deterministically by the worker's failpoint ``before_complete:stop``
— the worker SIGSTOPs itself after its handler ran and its result was staged, before
CompleteRun is sent — so no test sleeps to synchronise.

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
from pathlib import Path
from typing import Any, ClassVar

import orjson

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain.offers import is_offer
from chronolog.settings import LogConfig
from chronolog.workers import FilesystemResultStore, Worker
from chronolog.workers.gc import collect
from support.polling import wait_until
from support.processors import Running, read_all
from support.workers import (
    invocations,
    manual_spec,
    of_type,
    published,
    serving_test_jobs,
)

from .conftest import CHRONOLOG, ROOT, log_url

JOBS_FILE = str(Path(__file__).parents[1] / "support" / "worker_jobs.py")


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
            async with serving_test_jobs(event_log, store, "worker-b",
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
            async with serving_test_jobs(event_log, store, "worker-b",
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
# a completion whose reply is lost is re-sent with the same command ID


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
