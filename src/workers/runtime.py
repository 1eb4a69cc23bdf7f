"""The worker runtime: offers -> assignments -> handler (with heartbeats) -> result.

A ``Worker`` registers handlers by job type and, for each resource class it serves, joins the
consumer group of the workers with the same job types (``worker_group``) on ``ready.<class>``:
workers with the same job types share the partitions, and every partition is consumed — and
so offered on — by one worker of each set of job types, so a run always reaches a worker that
has its handler. Every few seconds it announces itself on the ``workers`` topic (its classes,
job types and slots; ``chronolog.domain.membership``), and says so when it stops. The
processors dispatch runs to it (``chronolog.processors.dispatch``); no slot ever waits for a
command's round trip:

1. **offer**: for every partition p of ``ready.<class>`` it consumes, the worker offers
   itself to the processor of partition p (an offer record on ``commands``): its job types
   and a *window* — twice its slots and prefetch, spread over the partitions it consumes.
   Offers are renewed every ``offer_interval`` seconds and withdrawn when a partition is
   revoked or the worker stops;
2. **assignment**: the processor claims a READY run on the worker's behalf (fence, lease)
   and writes an assignment record to partition p of ``ready.<class>``. The worker admits
   the records addressed to it — a record for another worker (left over from a rebalance) or
   for an attempt it already has or recently finished is skipped — and commits the offsets;
3. **run**: an assigned attempt starts at once if a slot is free, else waits for one in
   arrival order. From the assignment on, one heartbeat loop beats for every attempt every
   ``lease/3`` (batched). A ``stale_fence``/``not_found`` reply means the lease is lost: the
   handler is cancelled cooperatively and its result is discarded (nothing is sent).
   ``cancel_requested`` in a heartbeat body cancels it too; the worker then reports the
   attempt failed so the processor can settle the cancellation;
4. **report**: on return, JSON-encode (orjson) and SHA-256 the bytes; at most 8 KiB travels
   inline, larger results are staged in the ``ResultStore`` first. The slot is free as soon
   as the handler returns: CompleteRun (or FailRun) is queued, outcomes queued together go
   out in one append, and each is re-sent with the SAME command ID after a lost reply, a
   bounded number of times. Heartbeats go on until the outcome is decided. If the worker
   dies before that, the lease expires and the run is retried: a result is never lost, a
   handler may run again (at least once). An exception is a transient failure unless it is
   ``Permanent`` or ``Ambiguous``; the attempt's execution timeout (the assignment's: the
   tenant's, or the job's own if shorter; or the handler's, if shorter still) cancels the
   handler and is a transient failure with reason ``timeout``.

Graceful drain (``stop()``, SIGTERM in the CLI): withdraw the offers; assigned runs still
waiting for a slot are handed back at once (reported as transient failures, "worker shutting
down"); running handlers may finish for up to ``drain_timeout`` seconds; the rest are
cancelled and reported the same way, so their runs are retried elsewhere without waiting for
lease expiry; outcomes already queued are decided (bounded) before the worker leaves.

Fault injection for tests: ``CHRONOLOG_WORKER_FAILPOINT=before_complete:stop`` makes the
worker SIGSTOP itself after staging a result and before sending CompleteRun (the
"paused stale worker" and "crash before the completion commit" windows).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import hashlib
import inspect
import logging
import os
import signal
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog

from chronolog import lifecycle
from chronolog.backoff import Backoff
from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.membership import ANNOUNCE_INTERVAL_S, announcement
from chronolog.domain.offers import OFFER_HEADER, Offer, offer_proof
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import (
    WORKER_GROUP_SUFFIX,
    EventLog,
    LogError,
    OutRecord,
    Record,
    pool_class,
)
from chronolog.logging import Throttle
from chronolog.settings import data_dir
from chronolog.telemetry import tracing
from chronolog.wakeup import Wakeup, wait_within
from chronolog.workers.builtin import register_builtin_jobs
from chronolog.workers.job import Ambiguous, Cancelled, Handler, JobContext, Permanent
from chronolog.workers.results import (
    INLINE_LIMIT,
    FilesystemResultStore,
    ResultStore,
    sha256_hex,
)

log = structlog.get_logger("chronolog.worker")

WINDOW_S = 0.25  # an offer's window covers about this much work at the current rate
MAX_WINDOW = 1000  # runs one partition may assign to one worker at once
ACK_EVERY_S = 1.0  # read positions of ready.<class> are acknowledged at most this often
FINISHED_KEPT = 10_000  # finished attempts remembered, so a re-read assignment is not re-run
FAILPOINT_ENV = "CHRONOLOG_WORKER_FAILPOINT"
# before re-sending outcome commands whose append failed (by the batch's tries so far)
SEND_BACKOFF = Backoff(first=0.2, cap=2.0, jitter=0.5)
# between tries to read ready.<class> again while the log is away
PULL_BACKOFF = Backoff(first=0.5, cap=5.0)
# at stop, how long outcomes already reported may take to be decided, and the leaving steps
# (withdrawing offers, the last acknowledgement and announcement) each: a broker that is away
# must not hold the stop (an undecided attempt is retried once its lease expires)
DRAIN_OUTCOMES_S = 4.0
LEAVE_STEP_S = 1.5


def worker_group(prefix: str, job_types: Iterable[str], pool: str | None = None) -> str:
    """The consumer group of the workers with exactly these job types (and pool: a pool's
    groups share the prefix ``<prefix>workers.pool-<pool>.``, for a per-pool group ACL)."""
    digest = hashlib.sha256("\n".join(sorted(job_types)).encode()).hexdigest()[:12]
    pool_part = "" if pool is None else f"pool-{pool}."
    return f"{prefix}{WORKER_GROUP_SUFFIX}.{pool_part}{digest}"


@dataclass
class _Job:
    name: str
    fn: Handler
    is_async: bool
    timeout: float | None = None


@dataclass
class WorkerStats:
    assignments: int = 0  # assignment records addressed to this worker, admitted
    foreign: int = 0  # records for another worker, or an attempt already known here
    offers: int = 0
    invocations: int = 0
    completed: int = 0
    failed: int = 0
    discarded: int = 0  # results thrown away: the lease was lost or the completion refused
    bad_records: int = 0
    expired: int = 0  # assignments read after their lease had passed: not run


@dataclass(eq=False)
class _Attempt:
    ctx: JobContext
    lane: _Lane
    lost: bool = False  # stale fence / not found: never send anything for it again
    cancel_requested: bool = False
    drained: bool = False  # cancelled by shutdown
    timed_out: bool = False
    task: asyncio.Task[Any] | None = None  # the attempt's run (handler and outcome)
    beat_every: float = 10.0
    next_beat: float = 0.0
    trace: tracing.AttemptTrace | None = None  # its span, with tracing on


@dataclass(eq=False)
class _Report:
    """An outcome command (CompleteRun or FailRun) of an attempt, until it is decided."""

    att: _Attempt
    env: m.CommandEnvelope
    tries: int = 0
    headers: tracing.Headers = ()  # its record's: the attempt span's traceparent


class _Lane:
    """One resource class: its slots, and the assigned runs waiting for one."""

    def __init__(self, cls: str, slots: int) -> None:
        self.cls = cls
        self.slots = slots
        self.running = 0
        self.queue: deque[_Attempt] = deque()
        self.owned: set[int] = set()  # partitions of ready.<cls> this worker consumes
        self.finished: deque[float] = deque(maxlen=100_000)  # loop times handlers returned
        self.offered = 0  # the window last offered
        self.reoffer: asyncio.Task[None] | None = None

    def rate(self, now: float, span: float = 1.0) -> float:
        """Handlers finished per second over the last ``span`` seconds."""
        while self.finished and self.finished[0] < now - span:
            self.finished.popleft()
        return len(self.finished) / span


class Worker:
    """Runs registered job handlers for ready runs of some resource classes."""

    def __init__(
        self,
        log_: EventLog,
        worker_id: str | None = None,
        resource_classes: Sequence[str] = ("default",),
        concurrency: int = 4,
        result_store: ResultStore | None = None,
        client: Client | None = None,
        *,
        group: str | None = None,
        inline_limit: int = INLINE_LIMIT,
        reply_timeout: float = 10.0,
        send_attempts: int = 5,
        drain_timeout: float = 30.0,
        cancel_grace: float = 5.0,
        prefetch: int | None = None,
        offer_interval: float = 1.0,
        announce_interval: float = ANNOUNCE_INTERVAL_S,
        pool: str | None = None,
        credential: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch is not None and prefetch < 0:
            raise ValueError("prefetch must not be negative")
        if not resource_classes:
            raise ValueError("at least one resource class is required")
        if (pool is None) != (credential is None):
            raise ValueError("a pool worker needs its pool's credential (and only it)")
        # a pool worker reads ready.pool-<pool>.<class> and proves membership in its offers
        self.pool = pool
        self._credential = credential
        self.log = log_
        self.topics = log_.topics
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.resource_classes = tuple(dict.fromkeys(resource_classes))
        self.concurrency = concurrency
        self.prefetch = concurrency if prefetch is None else prefetch
        self.offer_interval = offer_interval
        self.announce_interval = announce_interval
        self.started_at = datetime.now(UTC)
        self._store = result_store
        self._own_client = client is None
        self.client = client or Client(log_, reply_timeout=reply_timeout,
                                       client_id=f"worker-{self.worker_id}")
        self._group_given = group
        self.group = group or f"{self.topics.prefix}{WORKER_GROUP_SUFFIX}"  # set by run()
        self.inline_limit = inline_limit
        self.reply_timeout = reply_timeout
        self.send_attempts = send_attempts
        self.drain_timeout = drain_timeout
        self.cancel_grace = cancel_grace
        self.stats = WorkerStats()
        self._jobs: dict[str, _Job] = {}
        self._stopping = asyncio.Event()
        self._forced = False
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._finished: dict[tuple[str, int], None] = {}  # recently finished, oldest first
        self._lanes: dict[str, _Lane] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # attempts' runs
        self._outgoing: list[_Report] = []
        self._unsettled: set[_Report] = set()
        self._reporter: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._beat_wake = Wakeup()
        self._beat_at = float("inf")
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._started = asyncio.Event()
        self.drained = asyncio.Event()  # set at stop once no handler runs any more
        self._consumers: dict[str, Any] = {}  # resource class -> its group consumer now
        self._log = log.bind(worker_id=self.worker_id)
        # an INFO line per run is built only when INFO is on (the default level is WARNING)
        enabled = getattr(self._log, "is_enabled_for", None)
        self._info = True if enabled is None else bool(enabled(logging.INFO))
        self._throttle = Throttle()
        self.dead_letters = DeadLetters(log_, "worker")

    # ------------------------------------------------------------------ registration

    def job(self, name: str, *, timeout: float | None = None) -> Callable[[Handler], Handler]:
        """Decorator: ``@worker.job("sales-report")`` on an async or a sync handler."""

        def register(fn: Handler) -> Handler:
            self.register(name, fn, timeout=timeout)
            return fn

        return register

    def register(self, name: str, fn: Handler, *, timeout: float | None = None) -> None:
        if name in self._jobs:
            raise ValueError(f"job type {name!r} is already registered")
        self._jobs[name] = _Job(name, fn, inspect.iscoroutinefunction(fn), timeout)

    def builtin_jobs(self) -> None:
        """Register ``noop``, ``echo``, ``sleep`` and ``fail`` (demos and tests)."""
        register_builtin_jobs(self)

    @property
    def job_types(self) -> list[str]:
        return sorted(self._jobs)

    @property
    def result_store(self) -> ResultStore:
        if self._store is None:
            self._store = FilesystemResultStore(data_dir() / "results")
        return self._store

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Begin a graceful drain; a second call cancels running handlers at once."""
        if self._stopping.is_set():
            self._forced = True
            for att in list(self._attempts.values()):
                att.drained = True
                att.ctx.cancel("worker shutting down")
        self._stopping.set()

    async def wait_started(self, timeout: float = 60.0) -> None:
        await wait_within(self._started.wait(), timeout)

    def readiness(self) -> tuple[bool, str]:
        """Ready: the consumer of every resource class is in its group
        (``chronolog.readiness``); else what it waits for."""
        if self._stopping.is_set():
            return False, "stopping"
        if not self._started.is_set():
            return False, "starting"
        owned = []
        for cls in self.resource_classes:
            consumer = self._consumers.get(cls)
            if consumer is None or not consumer.joined():
                topic = self.topics.ready_for(cls, self.pool)
                return False, (f"the consumer of {topic} is not in its group "
                               f"(joining, or the log is away)")
            owned.append(f"{cls} {sorted(self.partitions(cls))}")
        return True, f"consumes ready partitions: {', '.join(owned)}"

    def _warn(self, event: str, **kw: Any) -> None:
        """A warning that repeats while a service is away: the first, then one per
        ``chronolog.logging.SUMMARY_S`` with the count held back."""
        held = self._throttle.take(event)
        if held is not None:
            self._log.warning(event, **kw, **({"held_back": held} if held else {}))

    async def run(self) -> None:
        """Serve until ``stop()``; then drain and leave."""
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency * len(self.resource_classes),
            thread_name_prefix="chronolog-job",
        )
        beats: asyncio.Task[None] | None = None
        announcer: asyncio.Task[None] | None = None
        self.group = self._group_given or worker_group(self.topics.prefix, self._jobs, self.pool)
        try:
            if not await self._start_services():
                return  # stopped while waiting for the log
            beats = asyncio.create_task(self._heartbeat_loop(), name="heartbeats")
            self.started_at = datetime.now(UTC)
            announcer = asyncio.create_task(self._announce_loop(), name="announce")
            pullers = [asyncio.create_task(self._pull(c), name=f"pull-{c}")
                       for c in self.resource_classes]
            self._log.info("worker_started", classes=list(self.resource_classes),
                           concurrency=self.concurrency, prefetch=self.prefetch,
                           jobs=self.job_types, group=self.group)
            self._started.set()
            stop_wait = asyncio.create_task(self._stopping.wait())
            done, _ = await asyncio.wait([stop_wait, *pullers],
                                         return_when=asyncio.FIRST_COMPLETED)
            for t in done:  # a puller crashed: surface it after draining
                if t is not stop_wait and t.exception() is not None:
                    self._log.error("puller_failed", error=repr(t.exception()))
            self._stopping.set()
            await asyncio.gather(*pullers, return_exceptions=True)
            stop_wait.cancel()
            await self._drain()
        finally:
            if beats is not None:
                beats.cancel()
            if announcer is not None:
                announcer.cancel()
                with contextlib.suppress(asyncio.TimeoutError):
                    await wait_within(self._announce(stopping=True), LEAVE_STEP_S)
            for t in list(self._background):
                t.cancel()
            if self._own_client:
                await self.client.close()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._log.info("worker_stopped", **self.stats.__dict__)

    async def _start_services(self) -> bool:
        """Ensure the topics and start the client, waiting (``PULL_BACKOFF``) while the log
        is away; False when stopped meanwhile."""
        tries = 0
        while not self._stopping.is_set():
            try:
                await self.log.ensure_topics(ready_classes=[
                    c if self.pool is None else pool_class(self.pool, c)
                    for c in self.resource_classes])
                if self._own_client:
                    await self.client.start()
                return True
            except Exception as exc:
                if not (lifecycle.unavailable(exc) or isinstance(exc, LogError)):
                    raise
                tries += 1
                wait = PULL_BACKOFF.delay(tries)
                self._warn("start_waiting_for_log", retry_in_s=wait,
                           error=f"{type(exc).__name__}: {exc}"[:300])
            waiter = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait({waiter}, timeout=wait)
            finally:
                waiter.cancel()
        return False

    async def _drain(self) -> None:
        for lane in self._lanes.values():  # claimed, never started: hand them back now
            while lane.queue:
                att = lane.queue.popleft()
                att.drained = True
                self._report_failure(att, "transient", "worker shutting down")
        running = [t for t in self._tasks if not t.done()]
        if running:
            self._log.info("worker_draining", running=len(running), bound_s=self.drain_timeout)
            _, pending = await asyncio.wait(running, timeout=0 if self._forced
                                            else self.drain_timeout)
            if pending:
                for att in list(self._attempts.values()):
                    att.drained = True
                    att.ctx.cancel("worker shutting down")
                _, pending = await asyncio.wait(pending, timeout=self.cancel_grace)
                for t in pending:
                    t.cancel()
        self.drained.set()
        # every outcome already reported is decided (bounded) before the worker leaves
        deadline = asyncio.get_running_loop().time() + min(
            self.reply_timeout * self.send_attempts, DRAIN_OUTCOMES_S)
        while (self._outgoing or self._unsettled) and asyncio.get_running_loop().time() < deadline:
            waits = [t for t in (self._reporter, *self._background)
                     if t is not None and not t.done()]
            if not waits:
                break
            await asyncio.wait(waits, timeout=deadline - asyncio.get_running_loop().time(),
                               return_when=asyncio.FIRST_COMPLETED)

    def _spawn(self, coro: Any, name: str | None = None) -> asyncio.Task[Any]:
        t = asyncio.create_task(coro, name=name)
        self._background.add(t)
        t.add_done_callback(self._background.discard)
        return t

    # ------------------------------------------------------------------ membership

    async def _announce(self, *, stopping: bool = False) -> None:
        """Write this worker's membership record (its classes, job types and slots) to the
        ``workers`` topic; the last one says it is stopping. A failure only logs: the next
        announcement tries again."""
        rec = announcement(self.worker_id, self.resource_classes, self._jobs, self.concurrency,
                           self.started_at, datetime.now(UTC), stopping=stopping)
        try:
            await self.log.append([OutRecord(self.topics.workers, self.worker_id.encode(),
                                             rec.encode())])
        except Exception as exc:  # noqa: BLE001 - membership is advisory; retried next time
            self._warn("announce_failed", error=repr(exc)[:300])

    async def _announce_loop(self) -> None:
        while True:
            await self._announce()
            await asyncio.sleep(self.announce_interval)

    # ------------------------------------------------------------------ offers and assignments

    def partitions(self, cls: str = "default") -> frozenset[int]:
        """The partitions of ``ready.<cls>`` this worker consumes now; a partition it lost
        leaves the set only once its withdrawal is in the log."""
        lane = self._lanes.get(cls)
        return frozenset(lane.owned) if lane is not None else frozenset()

    def window(self, lane: _Lane) -> int:
        """Runs one partition may assign at once: enough to keep the slots busy for
        ``WINDOW_S`` at the rate handlers are finishing (at least twice the slots and
        prefetch), spread over the partitions this worker consumes; at least 2."""
        total = max(2 * (self.concurrency + self.prefetch),
                    int(lane.rate(asyncio.get_running_loop().time()) * WINDOW_S))
        return min(MAX_WINDOW, max(2, -(-total // max(1, len(lane.owned)))))

    def _grown(self, lane: _Lane) -> None:
        """After a handler returned: offer again at once when the window should double."""
        lane.finished.append(asyncio.get_running_loop().time())
        if ((lane.reoffer is None or lane.reoffer.done())
                and self.window(lane) >= 2 * lane.offered and lane.owned):
            lane.reoffer = asyncio.create_task(self._offer(lane, lane.owned))

    async def _offer(self, lane: _Lane, partitions: Iterable[int], withdraw: bool = False) -> None:
        """Offer this worker to the processors of ``partitions`` (window 0 withdraws)."""
        window = 0 if withdraw else self.window(lane)
        if not withdraw:
            lane.offered = window
        recs = [OutRecord(self.topics.commands, None, self._offer_for(lane.cls, window, p),
                          partition=p, headers=(OFFER_HEADER,))
                for p in sorted(partitions)]
        if not recs:
            return
        try:
            await self.log.append(recs)
            self.stats.offers += len(recs)
        except Exception as exc:  # noqa: BLE001 - the next offer (a second later) tries again
            self._warn("offer_failed", error=repr(exc)[:300])

    def _offer_for(self, cls: str, window: int, partition: int) -> bytes:
        """The offer record for ``partition``; a pool worker's carries its proof."""
        jobs = frozenset(self._jobs)
        if self.pool is None or self._credential is None:
            return Offer(self.worker_id, cls, window, jobs).encode()
        issued = round(time.time(), 3)
        proof = offer_proof(self._credential, self.worker_id, self.pool, partition, cls, issued)
        return Offer(self.worker_id, cls, window, jobs, self.pool, issued, proof).encode()

    async def _offers(self, lane: _Lane) -> None:
        """Renew this worker's offers every ``offer_interval`` seconds."""
        while True:
            await asyncio.sleep(self.offer_interval)
            await self._offer(lane, lane.owned)

    async def _pull(self, cls: str) -> None:
        """Read assignments of one resource class until the worker stops. When the log is
        away (the consumer cannot start, or a read fails) the consumer is closed and a new
        one joins after a pause (``PULL_BACKOFF``): a broker outage does not end the
        worker; the attempts it runs go on meanwhile."""
        lane = self._lanes[cls] = _Lane(cls, self.concurrency)
        tries = 0
        while not self._stopping.is_set():
            try:
                await self._pull_once(lane)
                return
            except Exception as exc:
                if not (lifecycle.unavailable(exc) or isinstance(exc, LogError)):
                    raise
                tries += 1
                wait = PULL_BACKOFF.delay(tries)
                self._warn("pull_waiting_for_log", resource_class=cls, retry_in_s=wait,
                           error=f"{type(exc).__name__}: {exc}"[:300])
            waiter = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait({waiter}, timeout=wait)
            finally:
                waiter.cancel()

    async def _pull_once(self, lane: _Lane) -> None:
        """One consumer of ``ready.<class>``, until the worker stops (or the log fails it).
        Read positions are acknowledged (the group's offsets) at most every ``ACK_EVERY_S``,
        when a partition is revoked and when the worker stops: a record read again after a
        crash is skipped (assigned to another worker or already run here) or runs as the
        lease allows, so an acknowledgement per batch — a write transaction or a broker
        round trip each — would buy nothing."""
        cls = lane.cls
        topic = self.topics.ready_for(cls, self.pool)
        unacked: dict[tuple[str, int], int] = {}  # read positions not acknowledged yet
        acked_at = time.monotonic()

        async def ack(only: set[tuple[str, int]] | None = None) -> None:
            nonlocal acked_at
            offsets = {tp: o for tp, o in unacked.items() if only is None or tp in only}
            if not offsets:
                return
            try:
                await consumer.commit(offsets)
                for tp in offsets:
                    unacked.pop(tp, None)
                acked_at = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - a lost ack means a re-read: harmless
                self._warn("ack_failed", error=repr(exc)[:300])

        async def assigned(tps: set[tuple[str, int]]) -> None:
            gained = {p for t, p in tps if t == topic}
            lane.owned |= gained
            await self._offer(lane, lane.owned)  # the window depends on how many are owned

        async def revoked(tps: set[tuple[str, int]]) -> None:
            lost = {p for t, p in tps if t == topic}
            await ack({(topic, p) for p in lost})  # the next reader starts where we stopped
            await self._offer(lane, lost, withdraw=True)
            lane.owned -= lost  # after the withdrawal is in the log (see ``partitions``)

        consumer = self.log.group_consumer(self.group, [topic], f"{self.worker_id}-{cls}",
                                           on_assigned=assigned, on_revoked=revoked)
        renew: asyncio.Task[None] | None = None
        try:
            await consumer.start()
            self._consumers[cls] = consumer
            renew = asyncio.create_task(self._offers(lane), name=f"offers-{cls}")
            while not self._stopping.is_set():
                recs = await consumer.getmany(timeout_ms=200, max_records=1000)
                if unacked and time.monotonic() - acked_at >= ACK_EVERY_S:
                    await ack()
                if not recs:
                    continue
                offsets: dict[tuple[str, int], int] = {}
                held: set[tuple[str, int]] = set()  # a bad record not recorded: read again
                for rec in recs:
                    tp = (rec.topic, rec.partition)
                    if tp not in held and await self._assignment(lane, rec):
                        offsets[tp] = rec.offset + 1
                    else:
                        held.add(tp)
                unacked.update(offsets)
        finally:
            if self._consumers.get(cls) is consumer:
                del self._consumers[cls]
            if renew is not None:
                renew.cancel()
            # leaving steps, each bounded: a broker that is away must not hold the stop
            for step in (ack(), self._offer(lane, lane.owned, withdraw=True)):
                with contextlib.suppress(asyncio.TimeoutError):
                    await wait_within(step, LEAVE_STEP_S)
            lane.owned.clear()
            with contextlib.suppress(Exception):
                await wait_within(consumer.close(), 2 * LEAVE_STEP_S)

    async def _assignment(self, lane: _Lane, rec: Record) -> bool:
        """Admit an assignment addressed to this worker; skip anything else (re-reads,
        another worker's assignments after a rebalance); dead-letter a record that is not an
        assignment. False: that record could not be recorded, so it must be read again."""
        try:
            body = codec.decode_assignment(rec.value, rec.key)
            worker, run_id, fence = body["assignee"], str(body["run_id"]), int(body["fence"])
            tenant, schedule_id = str(body["tenant"]), str(body["schedule_id"])
            if not isinstance(body.get("params", {}), dict):
                raise TypeError("params is not an object")
        except Exception as exc:  # noqa: BLE001 - not an assignment: recorded, then passed
            self.stats.bad_records += 1
            try:
                await self.dead_letters.put(rec, exc)
            except Exception as err:  # noqa: BLE001 - unacknowledged: read again later
                self._log.warning("bad_assignment_not_recorded", offset=rec.offset,
                                  error=repr(err))
                return False
            return True
        if worker != self.worker_id or (run_id, fence) in self._attempts \
                or (run_id, fence) in self._finished:
            self.stats.foreign += 1
            return True
        if _lease_passed(body.get("lease_until")):
            # read again long after (a restart with the same worker ID, a new consumer group):
            # the lease is over, the run is another attempt's by now — running the handler
            # would only repeat its effects
            self.stats.expired += 1
            return True
        self.stats.assignments += 1
        self._admit(lane, tenant, schedule_id, body)
        return True

    # ------------------------------------------------------------------ attempts

    def _admit(self, lane: _Lane, tenant: str, schedule_id: str, body: dict[str, Any]) -> None:
        run_id = str(body["run_id"])
        attempt = int(body["attempt"])
        fence = int(body["fence"])
        job_type = str(body.get("job_type", ""))
        job = self._jobs.get(job_type)
        # the assignment's timeout (the tenant's, or the job's own if shorter) and the one
        # registered with the handler: the shorter wins
        given = [float(t) for t in (body.get("timeout"), job.timeout if job else None) if t]
        timeout = min(given) if given else None
        ctx = JobContext(
            run_id=run_id, attempt=attempt, fence=fence,
            scheduled_at=_parse_time(body.get("scheduled_at")),
            params=dict(body.get("params") or {}), tenant=tenant, schedule_id=schedule_id,
            job_type=job_type, worker_id=self.worker_id,
            lease_seconds=float(body.get("lease_seconds") or 30.0),
            timeout=float(timeout) if timeout else None,
            log=_RunLog(self._log, run_id=run_id, attempt=attempt, fence=fence,
                        job_type=job_type),
        )
        att = _Attempt(ctx, lane, beat_every=max(0.05, ctx.lease_seconds / 3))
        att.next_beat = asyncio.get_running_loop().time() + att.beat_every
        self._attempts[(run_id, fence)] = att
        if att.next_beat < self._beat_at:
            self._beat_wake.fire()
        if lane.running < lane.slots:
            self._start(att)
        else:
            lane.queue.append(att)

    def _start(self, att: _Attempt) -> None:
        att.lane.running += 1
        t = att.task = asyncio.create_task(self._run(att))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _run(self, att: _Attempt) -> None:
        """The attempt's handler and its outcome; its slot is free as soon as the handler is."""
        lane = att.lane
        if tracing.enabled:
            c = att.ctx
            att.trace = tracing.AttemptTrace(
                tenant=c.tenant, schedule_id=c.schedule_id, run_id=c.run_id, attempt=c.attempt,
                fence=c.fence, job_type=c.job_type, worker_id=self.worker_id)
        try:
            job = self._jobs.get(att.ctx.job_type)
            if att.lost:  # the lease was lost while it waited for a slot
                self.stats.discarded += 1
                self._forget(att)
            elif att.ctx.is_cancelled:  # cancelled while it waited for a slot
                self._report_failure(att, "transient", att.ctx.cancel_reason or "cancelled")
            elif job is None:
                att.ctx.log.error("no_handler", registered=self.job_types)
                self._report_failure(att, "transient", f"no handler for job type "
                                     f"{att.ctx.job_type!r} on worker {self.worker_id}")
            elif self._forced or (self._stopping.is_set() and self.drain_timeout <= 0):
                self._report_failure(att, "transient", "worker shutting down")
            else:
                await self._invoke(att, job)
        finally:
            lane.running -= 1
            self._grown(lane)
            if lane.queue and not self._stopping.is_set():
                self._start(lane.queue.popleft())

    async def _invoke(self, att: _Attempt, job: _Job) -> None:
        ctx = att.ctx
        self.stats.invocations += 1
        if self._info:
            ctx.log.info("handler_started")
        fut: asyncio.Future[Any]
        if att.trace is not None:  # the handler runs in its span (a child of the attempt's)
            fut = att.trace.handler(ctx.job_type, lambda: self._call(job, ctx))
        else:
            fut = self._call(job, ctx)
        await _first_of(fut, ctx, ctx.timeout)
        if not fut.done():
            if not ctx.is_cancelled:  # the per-job timeout
                att.timed_out = True
                ctx.cancel(f"timeout after {ctx.timeout}s")
                ctx.log.warning("handler_timeout", timeout=ctx.timeout)
                self._report_failure(att, "transient", f"timeout after {ctx.timeout}s",
                                     reason="timeout")
            await self._settle(fut, job)
        await self._finish(att, fut)

    def _call(self, job: _Job, ctx: JobContext) -> asyncio.Future[Any]:
        """Start the handler: a task, or a thread of the executor (in a copy of this context)."""
        if job.is_async:
            return asyncio.ensure_future(job.fn(ctx))
        cv = contextvars.copy_context()
        return asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(cv.run, job.fn, ctx))

    async def _settle(self, fut: asyncio.Future[Any], job: _Job) -> None:
        """Give a cancelled handler ``cancel_grace`` to return; then cancel an async one."""
        done, _ = await asyncio.wait({fut}, timeout=self.cancel_grace)
        if fut in done:
            return
        if job.is_async:
            fut.cancel()
        await asyncio.wait({fut})  # a thread cannot be interrupted: its slot stays taken

    async def _finish(self, att: _Attempt, fut: asyncio.Future[Any]) -> None:
        ctx = att.ctx
        error: BaseException | None = None
        value: Any = None
        if fut.cancelled():
            error = Cancelled(ctx.cancel_reason or "cancelled")
        else:
            error = fut.exception()
            if error is None:
                value = fut.result()
        if att.lost:
            self.stats.discarded += 1
            ctx.log.warning("result_discarded", reason=ctx.cancel_reason,
                            error=repr(error) if error else None)
            self._forget(att)
            return
        if att.timed_out:
            return  # already reported
        if error is None:
            await self._complete(att, value)
            return
        if att.cancel_requested or att.drained:
            self._report_failure(att, "transient", ctx.cancel_reason or "cancelled")
            return
        kind = ("permanent" if isinstance(error, Permanent)
                else "ambiguous" if isinstance(error, Ambiguous) else "transient")
        ctx.log.warning("handler_failed", error_class=kind, error=repr(error))
        self._report_failure(att, kind, f"{type(error).__name__}: {error}"[:2000])

    async def _complete(self, att: _Attempt, value: Any) -> None:
        ctx = att.ctx
        try:
            data = orjson.dumps(value, option=orjson.OPT_UTC_Z)
        except TypeError as exc:
            self._report_failure(att, "permanent", f"result is not JSON-serializable: {exc}")
            return
        checksum = sha256_hex(data)
        uri: str | None = None
        inline: Any = None
        if len(data) <= self.inline_limit:
            inline = value if value is None else orjson.loads(data)
        else:
            try:
                uri = await self.result_store.put(ctx.run_id, ctx.attempt, ctx.fence, data)
            except Exception as exc:  # noqa: BLE001
                ctx.log.error("staging_failed", error=repr(exc))
                self._report_failure(att, "transient", f"staging the result failed: {exc}")
                return
        _failpoint("before_complete")
        if att.lost:  # the lease was lost while staging: do not try to publish
            self.stats.discarded += 1
            ctx.log.warning("result_discarded", reason=ctx.cancel_reason, uri=uri)
            self._forget(att)
            return
        self._report(att, m.CompleteRun(run_id=ctx.run_id, attempt=ctx.attempt, fence=ctx.fence,
                                        worker_id=self.worker_id, checksum=checksum,
                                        size=len(data), uri=uri, inline=inline))

    def _forget(self, att: _Attempt) -> None:
        """The attempt needs nothing more: no heartbeats, no outcome to send."""
        key = (att.ctx.run_id, att.ctx.fence)
        if att.trace is not None:  # no outcome was reported for it
            att.trace.finish("discarded")
        if self._attempts.pop(key, None) is not None:
            self._finished[key] = None  # a re-read of its assignment is not run again
            if len(self._finished) > FINISHED_KEPT:
                del self._finished[next(iter(self._finished))]

    # ------------------------------------------------------------------ outcomes

    def _report_failure(self, att: _Attempt, error_class: str, message: str,
                        reason: str | None = None) -> None:
        ctx = att.ctx
        if att.lost:
            self._forget(att)
            return
        self._report(att, m.FailRun(run_id=ctx.run_id, attempt=ctx.attempt, fence=ctx.fence,
                                    worker_id=self.worker_id,
                                    error_class=error_class,  # type: ignore[arg-type]
                                    message=message, reason=reason))  # type: ignore[arg-type]

    def _report(self, att: _Attempt, payload: Any) -> None:
        """Queue an outcome; outcomes go out together, each re-sent with its command ID
        until decided (bounded by ``send_attempts``). The attempt keeps its heartbeats until
        then, so its lease holds while the outcome travels."""
        headers: tracing.Headers = ()
        if att.trace is not None:  # the attempt ends with its outcome, which it names
            error = payload.message if isinstance(payload, m.FailRun) else None
            headers = att.trace.finish(payload.type, error)
        elif tracing.enabled:
            headers = tracing.run_headers(att.ctx.run_id)
        self._outgoing.append(_Report(att, self.client.envelope(att.ctx.tenant,
                                                                att.ctx.schedule_id, payload),
                                      headers=headers))
        if self._reporter is None or self._reporter.done():
            self._reporter = asyncio.create_task(self._send_reports(), name="reports")

    async def _send_reports(self) -> None:
        """Append queued outcomes, one append at a time (whatever queued meanwhile goes in
        the next one); their replies are awaited apart, so a lost reply delays nobody."""
        while self._outgoing:
            batch, self._outgoing = self._outgoing, []
            for r in batch:
                r.tries += 1
            try:
                futs = await self.client.submit(
                    [r.env for r in batch],
                    headers=[r.headers for r in batch] if tracing.enabled else None)
            except Exception as exc:  # noqa: BLE001 - the log is unavailable: retry, bounded
                self._warn("send_failed", commands=len(batch), error=repr(exc)[:300],
                           tries=batch[0].tries)
                self._retry_or_give_up(batch)
                await asyncio.sleep(SEND_BACKOFF.delay(batch[0].tries))
                continue
            self._unsettled.update(batch)
            self._spawn(self._settle_reports(batch, futs))

    async def _settle_reports(self, batch: list[_Report],
                              futs: list[asyncio.Future[m.Reply]]) -> None:
        try:
            replies = await self.client.collect([r.env for r in batch], futs,
                                                timeout=self.reply_timeout)
        finally:
            self._unsettled.difference_update(batch)
        lost = [r for r, reply in zip(batch, replies, strict=True) if reply is None]
        if lost:
            self._log.warning("reply_lost", commands=len(lost), tries=lost[0].tries)
            self._retry_or_give_up(lost)
            if self._outgoing and (self._reporter is None or self._reporter.done()):
                self._reporter = asyncio.create_task(self._send_reports(), name="reports")
        for r, reply in zip(batch, replies, strict=True):
            if reply is not None:
                self._decided(r, reply)

    def _retry_or_give_up(self, reports: list[_Report]) -> None:
        for r in reports:
            if r.tries < self.send_attempts:
                self._outgoing.append(r)
                continue
            r.att.ctx.log.error("completion_undecided" if r.env.type == "CompleteRun"
                                else "failure_undecided")
            self._forget(r.att)

    def _decided(self, r: _Report, reply: m.Reply) -> None:
        ctx = r.att.ctx
        self._forget(r.att)
        if r.env.type == "CompleteRun":
            if reply.status == "ok":
                self.stats.completed += 1
                ctx.log.info("result_published", uri=r.env.payload.uri)  # type: ignore[union-attr]
            else:
                self.stats.discarded += 1
                ctx.log.warning("completion_refused", status=reply.status, reason=reply.reason)
            return
        self.stats.failed += 1
        if reply.status != "ok":
            ctx.log.warning("failure_refused", status=reply.status, reason=reply.reason)
        else:
            ctx.log.info("attempt_failed", state=reply.body.get("state"))

    # ------------------------------------------------------------------ heartbeats

    async def _heartbeat_loop(self) -> None:
        """One loop beats for every attempt whose heartbeat is due, in one batch."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            due = [a for a in self._attempts.values() if a.next_beat <= now and not a.lost]
            for att in due:
                att.next_beat = now + att.beat_every
            if due:
                self._spawn(self._beat(due, min(a.beat_every for a in due)))
            self._beat_at = min((a.next_beat for a in self._attempts.values()),
                                default=now + 1.0)
            await self._beat_wake.wait(max(0.01, self._beat_at - now))

    async def _beat(self, atts: list[_Attempt], timeout: float) -> None:
        envs = [self.client.envelope(a.ctx.tenant, a.ctx.schedule_id, m.Heartbeat(
            run_id=a.ctx.run_id, attempt=a.ctx.attempt, fence=a.ctx.fence,
            worker_id=self.worker_id)) for a in atts]
        try:
            replies = await self.client.send_batch(envs, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - the next beat tries again
            self._warn("heartbeat_failed", attempts=len(atts), error=repr(exc)[:300])
            return
        for att, reply in zip(atts, replies, strict=True):
            ctx = att.ctx
            if att.lost:  # an earlier beat's reply said so (beats held up by a dead link)
                continue
            if reply is None:
                ctx.log.warning("heartbeat_reply_lost")
            elif reply.status in ("stale_fence", "not_found"):
                att.lost = True
                ctx.log.warning("lease_lost", status=reply.status, reason=reply.reason)
                ctx.cancel(f"lease lost: {reply.reason}")
            elif (reply.status == "ok" and reply.body.get("cancel_requested")
                  and not att.cancel_requested):
                att.cancel_requested = True
                ctx.log.info("cancel_requested")
                ctx.cancel("cancellation requested")


class _RunLog:
    """The worker's logger bound with a run's fields when the run first logs: most runs log
    nothing at the default level, and a bind per run was a measurable part of its CPU."""

    __slots__ = ("_base", "_bound", "_fields")

    def __init__(self, base: Any, **fields: Any) -> None:
        self._base = base
        self._fields = fields
        self._bound: Any = None

    def __getattr__(self, name: str) -> Any:
        bound = self._bound
        if bound is None:
            bound = self._bound = self._base.bind(**self._fields)
        return getattr(bound, name)


async def _first_of(fut: asyncio.Future[Any], ctx: JobContext, timeout: float | None) -> None:
    """Return when the handler's future is done, the attempt is cancelled, or ``timeout``
    seconds have passed, whichever comes first (callbacks on one future: no task per run)."""
    loop = asyncio.get_running_loop()
    gate = loop.create_future()

    def open_gate(_: object = None) -> None:
        if not gate.done():
            gate.set_result(None)

    fut.add_done_callback(open_gate)
    ctx.on_cancel(open_gate)
    timer = None if timeout is None else loop.call_later(timeout, open_gate)
    try:
        await gate
    finally:
        if timer is not None:
            timer.cancel()
        fut.remove_done_callback(open_gate)


def _lease_passed(value: Any) -> bool:
    try:
        return bool(value) and _parse_time(value) <= datetime.now(UTC)
    except ValueError:
        return False  # not a time: the processor's fence and lease checks still apply


def _parse_time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    if value:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return datetime.now(UTC)


def _failpoint(name: str) -> None:
    spec = os.environ.get(FAILPOINT_ENV, "")
    for item in spec.split(","):
        point, _, action = item.partition(":")
        if point.strip() != name:
            continue
        log.warning("failpoint", point=name, action=action)
        if action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # resumes on SIGCONT
        elif action == "exit":
            os._exit(70)


async def run_until_signalled(worker: Worker) -> int:
    """Run a worker; SIGTERM/SIGINT begin a graceful drain (a second one forces it). The
    process stop bounds of ``chronolog.lifecycle`` count from the end of the drain of the
    running handlers (``Worker.drained``: at once when none runs), at the latest from the
    end of ``drain_timeout``."""
    return await lifecycle.run_until_signalled(
        worker.run(), worker.stop, grace_s=worker.drain_timeout + lifecycle.STOP_GRACE_S,
        hard_s=worker.drain_timeout + lifecycle.HARD_STOP_S, settled=worker.drained)


# JobContext and the failures are defined in chronolog.workers.job, re-exported here
__all__ = [
    "Ambiguous",
    "Cancelled",
    "JobContext",
    "Permanent",
    "Worker",
    "WorkerStats",
    "run_until_signalled",
]
