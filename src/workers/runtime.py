"""The worker runtime: ready hints -> claim -> handler (with heartbeats) -> result.

A ``Worker`` registers handlers by job type and, for each resource class it serves, joins the
consumer group ``<prefix>workers`` on ``ready.<class>``. Per hint:

1. send ClaimRun (one command ID, re-sent on a lost reply — the processor answers a duplicate
   with the original reply);
2. acknowledge the hint (commit its offset) once the claim is *decided*: won, or refused
   (``conflict``: the run is leased or terminal — duplicate hints are normal; ``not_found``).
   A refused claim never runs the handler. Offsets are committed as a contiguous prefix, so
   an undecided hint is never skipped over;
3. only after an ok claim (the AttemptClaimed reply with its fence) start the handler, with a
   ``JobContext``; heartbeat every ``lease/3``. A ``stale_fence``/``not_found`` heartbeat
   reply means the lease is lost: the handler is cancelled cooperatively and its result is
   discarded (nothing is sent). ``cancel_requested`` in a heartbeat body cancels it too; the
   worker then reports the attempt failed so the processor can settle the cancellation;
4. on return: JSON-encode (orjson), SHA-256 the bytes; at most 8 KiB travels inline, larger
   results are staged in the ``ResultStore`` first; send CompleteRun with fence and checksum.
   A lost reply is re-sent with the SAME command ID, a bounded number of times.
   An exception is a transient failure unless it is ``Permanent`` or ``Ambiguous``; a
   per-job timeout (JobSpec ``timeout``) is transient.

Concurrency: ``concurrency`` slots per resource class; the class's consumer stops pulling
hints while its slots are full (it asks for at most as many hints as it has free slots).

Graceful drain (``stop()``, SIGTERM in the CLI): stop claiming; hints whose claim is in
flight are decided and acknowledged; running handlers may finish for up to ``drain_timeout``
seconds; the rest are cancelled and reported as transient failures ("worker shutting
down"), so their runs are retried elsewhere without waiting for lease expiry.

Fault injection for tests: ``CHRONOLOG_WORKER_FAILPOINT=before_complete:stop`` makes the
worker SIGSTOP itself after staging a result and before sending CompleteRun (the seeds'
"paused stale worker" and "crash before the completion commit" windows).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import os
import random
import signal
import socket
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import orjson
import structlog

from chronolog.commands.client import Client, ReplyTimeout
from chronolog.domain import messages as m
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.port import EventLog, Record
from chronolog.workers.results import INLINE_LIMIT, ResultStore, sha256_hex

log = structlog.get_logger("chronolog.worker")

WORKER_GROUP_SUFFIX = "workers"
FAILPOINT_ENV = "CHRONOLOG_WORKER_FAILPOINT"

Handler = Callable[["JobContext"], Any]


class Permanent(Exception):
    """Raise from a handler: the error will not go away by retrying (no retry budget used)."""


class Ambiguous(Exception):
    """Raise from a handler: the outcome is unknown (e.g. an external call timed out after
    it may have taken effect). The run goes to RECONCILING; it is never blindly retried."""


class Cancelled(Exception):
    """Raised by ``JobContext.check_cancelled()`` once the attempt has been cancelled."""


@dataclass
class JobContext:
    """What a handler receives: the attempt's identity, its parameters and a cancel signal."""

    run_id: str
    attempt: int
    fence: int
    scheduled_at: datetime
    params: dict[str, Any]
    tenant: str
    schedule_id: str
    job_type: str
    worker_id: str
    lease_seconds: float
    timeout: float | None
    log: Any
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: str | None = None
    _flag: threading.Event = field(default_factory=threading.Event, repr=False)

    def check_cancelled(self) -> None:
        """Raise ``Cancelled`` if the attempt was cancelled (safe from a handler thread)."""
        if self._flag.is_set():
            raise Cancelled(self.cancel_reason or "cancelled")

    @property
    def is_cancelled(self) -> bool:
        return self._flag.is_set()

    async def sleep(self, seconds: float) -> None:
        """Sleep, waking early with ``Cancelled`` if the attempt is cancelled."""
        try:
            await asyncio.wait_for(self.cancelled.wait(), max(0.0, seconds))
        except asyncio.TimeoutError:
            return
        self.check_cancelled()

    def sleep_sync(self, seconds: float) -> None:
        """``sleep`` for synchronous handlers (running in a thread)."""
        if self._flag.wait(max(0.0, seconds)):
            self.check_cancelled()

    def _cancel(self, reason: str) -> None:
        if self._flag.is_set():
            return
        self.cancel_reason = reason
        self._flag.set()
        self.cancelled.set()


@dataclass
class _Job:
    name: str
    fn: Handler
    is_async: bool
    timeout: float | None = None


@dataclass
class WorkerStats:
    hints: int = 0
    claims_won: int = 0
    claims_refused: int = 0
    invocations: int = 0
    completed: int = 0
    failed: int = 0
    discarded: int = 0  # results thrown away: the lease was lost or the completion refused
    bad_hints: int = 0


@dataclass
class _Attempt:
    ctx: JobContext
    lost: bool = False  # stale fence / not found: never send anything for it again
    cancel_requested: bool = False
    drained: bool = False  # cancelled by shutdown
    timed_out: bool = False
    task: asyncio.Future[Any] | None = None


class _Slots:
    """A counting semaphore whose free count the pulling loop can read."""

    def __init__(self, n: int) -> None:
        self.free = n
        self._changed = asyncio.Event()

    def take(self) -> None:
        assert self.free > 0
        self.free -= 1

    def give(self) -> None:
        self.free += 1
        self._changed.set()

    async def wait_free(self, timeout: float) -> None:
        if self.free > 0:
            return
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass


class _Decided(asyncio.Event):
    """Set once a hint's claim is decided (or abandoned); leaves its tracking set then."""

    def __init__(self, pending: set["_Decided"]) -> None:
        super().__init__()
        self._pending = pending
        pending.add(self)

    def set(self) -> None:
        super().set()
        self._pending.discard(self)

    def on_done(self, _task: Any) -> None:
        self.set()

    __hash__ = object.__hash__


class _Acks:
    """Commits hint offsets as a contiguous prefix of decided hints, per partition."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, int], dict[int, bool]] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.lock = asyncio.Lock()

    def add(self, rec: Record) -> None:
        self.pending.setdefault((rec.topic, rec.partition), {})[rec.offset] = False

    def decide(self, rec: Record) -> tuple[tuple[str, int], int] | None:
        tp = (rec.topic, rec.partition)
        offsets = self.pending.get(tp)
        if offsets is None or rec.offset not in offsets:
            return None  # revoked meanwhile
        offsets[rec.offset] = True
        nxt: int | None = None
        for off in sorted(offsets):
            if not offsets[off]:
                break
            del offsets[off]
            nxt = off + 1
        if nxt is None or nxt <= self.committed.get(tp, -1):
            return None
        self.committed[tp] = nxt
        return tp, nxt

    def revoke(self, tps: set[tuple[str, int]]) -> None:
        for tp in tps:
            self.pending.pop(tp, None)
            self.committed.pop(tp, None)

    @property
    def undecided(self) -> int:
        return sum(1 for offs in self.pending.values() for done in offs.values() if not done)


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
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not resource_classes:
            raise ValueError("at least one resource class is required")
        self.log = log_
        self.topics = log_.topics
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.resource_classes = tuple(dict.fromkeys(resource_classes))
        self.concurrency = concurrency
        self._store = result_store
        self._own_client = client is None
        self.client = client or Client(log_, reply_timeout=reply_timeout,
                                       client_id=f"worker-{self.worker_id}")
        self.group = group or f"{self.topics.prefix}{WORKER_GROUP_SUFFIX}"
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
        self._tasks: set[asyncio.Task[Any]] = set()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._started = asyncio.Event()
        self._log = log.bind(worker_id=self.worker_id)
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
        from chronolog.workers.builtin import register_builtin_jobs

        register_builtin_jobs(self)

    @property
    def job_types(self) -> list[str]:
        return sorted(self._jobs)

    @property
    def result_store(self) -> ResultStore:
        if self._store is None:
            from chronolog.settings import data_dir
            from chronolog.workers.results import FilesystemResultStore

            self._store = FilesystemResultStore(data_dir() / "results")
        return self._store

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Begin a graceful drain; a second call cancels running handlers at once."""
        if self._stopping.is_set():
            self._forced = True
            for att in list(self._attempts.values()):
                att.drained = True
                att.ctx._cancel("worker shutting down")
        self._stopping.set()

    async def wait_started(self, timeout: float = 60.0) -> None:
        await asyncio.wait_for(self._started.wait(), timeout)

    async def run(self) -> None:
        """Serve until ``stop()``; then drain and leave."""
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency * len(self.resource_classes),
            thread_name_prefix="chronolog-job",
        )
        try:
            await self.log.ensure_topics(ready_classes=self.resource_classes)
            if self._own_client:
                await self.client.start()
            pullers = [asyncio.create_task(self._pull(c), name=f"pull-{c}")
                       for c in self.resource_classes]
            self._log.info("worker_started", classes=list(self.resource_classes),
                           concurrency=self.concurrency, jobs=self.job_types, group=self.group)
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
            if self._own_client:
                await self.client.close()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._log.info("worker_stopped", **self.stats.__dict__)

    async def _drain(self) -> None:
        running = [t for t in self._tasks if not t.done()]
        if running:
            self._log.info("worker_draining", running=len(running), bound_s=self.drain_timeout)
            _, pending = await asyncio.wait(running, timeout=0 if self._forced else self.drain_timeout)
            if pending:
                for att in list(self._attempts.values()):
                    att.drained = True
                    att.ctx._cancel("worker shutting down")
                _, pending = await asyncio.wait(pending, timeout=self.cancel_grace + self.reply_timeout
                                                * self.send_attempts)
                for t in pending:
                    t.cancel()

    # ------------------------------------------------------------------ hints

    async def _pull(self, cls: str) -> None:
        topic = self.topics.ready(cls)
        acks = _Acks()

        async def revoked(tps: set[tuple[str, int]]) -> None:
            acks.revoke(tps)

        consumer = self.log.group_consumer(self.group, [topic], f"{self.worker_id}-{cls}",
                                           on_revoked=revoked)
        await consumer.start()
        slots = _Slots(self.concurrency)
        undecided: set[_Decided] = set()  # hints whose claim is still in flight
        try:
            while not self._stopping.is_set():
                if slots.free == 0:
                    await slots.wait_free(0.2)
                    continue
                recs = await consumer.getmany(timeout_ms=200, max_records=slots.free)
                for rec in recs:
                    if self._stopping.is_set():
                        break  # not acknowledged: redelivered to another member
                    slots.take()
                    acks.add(rec)
                    self.stats.hints += 1
                    decided = _Decided(undecided)
                    t = asyncio.create_task(self._hint(rec, slots, acks, consumer, decided))
                    t.add_done_callback(decided.on_done)
                    self._tasks.add(t)
                    t.add_done_callback(self._tasks.discard)
            # drain: let claims in flight be decided (and acknowledged) before leaving
            waits = [asyncio.create_task(d.wait()) for d in list(undecided)]
            if waits:
                _, pending = await asyncio.wait(waits, timeout=self.reply_timeout * (
                    self.send_attempts + 1))
                for w in pending:
                    w.cancel()
        finally:
            await consumer.close()

    async def _ack(self, rec: Record, acks: _Acks, consumer: Any) -> None:
        async with acks.lock:
            c = acks.decide(rec)
            if c is None:
                return
            try:
                await consumer.commit({c[0]: c[1]})
            except Exception as exc:  # noqa: BLE001 - a lost ack only means a duplicate hint
                self._log.warning("hint_ack_failed", topic=c[0][0], partition=c[0][1],
                                  offset=c[1], error=repr(exc))

    async def _hint(self, rec: Record, slots: _Slots, acks: _Acks, consumer: Any,
                    decided: "_Decided") -> None:
        try:
            try:
                hint = orjson.loads(rec.value)
                tenant, schedule_id = str(hint["tenant"]), str(hint["schedule_id"])
                run_id, attempt = str(hint["run_id"]), int(hint["attempt"])
            except Exception as exc:  # noqa: BLE001 - not a hint: recorded, then passed
                self.stats.bad_hints += 1
                try:
                    await self.dead_letters.put(rec, exc)
                except Exception as err:  # noqa: BLE001 - unacknowledged: read again later
                    self._log.warning("bad_hint_not_recorded", offset=rec.offset, error=repr(err))
                    return
                await self._ack(rec, acks, consumer)
                return
            claim = m.ClaimRun(run_id=run_id, attempt=attempt, worker_id=self.worker_id)
            reply = await self._send(tenant, schedule_id, claim, until_decided=True)
            if reply is None:  # shutting down before the claim was decided: not acknowledged
                return
            await self._ack(rec, acks, consumer)
            decided.set()
            if reply.status != "ok":
                self.stats.claims_refused += 1
                self._log.debug("claim_refused", run_id=run_id, attempt=attempt,
                                status=reply.status, reason=reply.reason)
                return
            self.stats.claims_won += 1
            await self._execute(tenant, schedule_id, reply.body)
        finally:
            slots.give()

    # ------------------------------------------------------------------ sending

    async def _send(self, tenant: str, schedule_id: str, payload: Any,
                    until_decided: bool = False, attempts: int | None = None) -> m.Reply | None:
        """Send with one command ID, re-sending it after a lost reply.

        Bounded by ``attempts`` (default ``send_attempts``); ``until_decided`` keeps trying
        until a reply or shutdown. None when no reply came.
        """
        env = self.client.envelope(tenant, schedule_id, payload)
        n = 0
        while True:
            n += 1
            try:
                return await self.client.send(env, timeout=self.reply_timeout)
            except ReplyTimeout:
                self._log.warning("reply_lost", type=payload.type, command_id=env.command_id,
                                  tries=n, run_id=getattr(payload, "run_id", None))
            except Exception as exc:  # noqa: BLE001 - the log is unavailable: retry, bounded
                self._log.warning("send_failed", type=payload.type, error=repr(exc), tries=n)
                await asyncio.sleep(min(2.0, 0.1 * 2 ** n) * (0.5 + random.random()))
            if until_decided:
                if self._stopping.is_set() and n >= (attempts or self.send_attempts):
                    return None
            elif n >= (attempts or self.send_attempts):
                return None

    # ------------------------------------------------------------------ attempts

    async def _execute(self, tenant: str, schedule_id: str, body: dict[str, Any]) -> None:
        run_id = str(body["run_id"])
        attempt = int(body["attempt"])
        fence = int(body["fence"])
        job_type = str(body.get("job_type", ""))
        job = self._jobs.get(job_type)
        timeout = body.get("timeout")
        if timeout is None and job is not None:
            timeout = job.timeout
        scheduled = body.get("scheduled_at")
        ctx = JobContext(
            run_id=run_id, attempt=attempt, fence=fence,
            scheduled_at=_parse_time(scheduled),
            params=dict(body.get("params") or {}), tenant=tenant, schedule_id=schedule_id,
            job_type=job_type, worker_id=self.worker_id,
            lease_seconds=float(body.get("lease_seconds") or 30.0),
            timeout=float(timeout) if timeout else None,
            log=self._log.bind(run_id=run_id, attempt=attempt, fence=fence, job_type=job_type),
        )
        att = _Attempt(ctx)
        self._attempts[(run_id, fence)] = att
        beats = asyncio.create_task(self._heartbeats(att))
        try:
            if job is None:
                ctx.log.error("no_handler", registered=self.job_types)
                await self._fail(att, "transient",
                                 f"no handler for job type {job_type!r} on worker {self.worker_id}")
                return
            if self._forced or (self._stopping.is_set() and self.drain_timeout <= 0):
                await self._fail(att, "transient", "worker shutting down")
                return
            await self._attempt(att, job)
        finally:
            beats.cancel()
            self._attempts.pop((run_id, fence), None)

    async def _attempt(self, att: _Attempt, job: _Job) -> None:
        ctx = att.ctx
        self.stats.invocations += 1
        ctx.log.info("handler_started")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any]
        if job.is_async:
            fut = asyncio.ensure_future(job.fn(ctx))
        else:
            cv = contextvars.copy_context()
            fut = loop.run_in_executor(self._executor, functools.partial(cv.run, job.fn, ctx))
        att.task = fut
        cancel_wait = asyncio.create_task(ctx.cancelled.wait())
        try:
            done, _ = await asyncio.wait({fut, cancel_wait}, timeout=ctx.timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if fut not in done:
                if cancel_wait not in done:  # the per-job timeout
                    att.timed_out = True
                    ctx._cancel(f"timeout after {ctx.timeout}s")
                    ctx.log.warning("handler_timeout", timeout=ctx.timeout)
                    await self._fail(att, "transient", f"timeout after {ctx.timeout}s")
                await self._settle(fut, job)
        finally:
            cancel_wait.cancel()
        await self._finish(att, fut)

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
            return
        if att.timed_out:
            return  # already reported
        if error is None:
            await self._complete(att, value)
            return
        if att.cancel_requested or att.drained:
            await self._fail(att, "transient", ctx.cancel_reason or "cancelled")
            return
        kind = ("permanent" if isinstance(error, Permanent)
                else "ambiguous" if isinstance(error, Ambiguous) else "transient")
        ctx.log.warning("handler_failed", error_class=kind, error=repr(error))
        await self._fail(att, kind, f"{type(error).__name__}: {error}"[:2000])

    async def _heartbeats(self, att: _Attempt) -> None:
        ctx = att.ctx
        interval = max(0.05, ctx.lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            beat = m.Heartbeat(run_id=ctx.run_id, attempt=ctx.attempt, fence=ctx.fence,
                               worker_id=self.worker_id)
            try:
                reply = await self.client.send(
                    self.client.envelope(ctx.tenant, ctx.schedule_id, beat), timeout=interval)
            except ReplyTimeout:
                ctx.log.warning("heartbeat_reply_lost")
                continue
            except Exception as exc:  # noqa: BLE001
                ctx.log.warning("heartbeat_failed", error=repr(exc))
                continue
            if reply.status in ("stale_fence", "not_found"):
                att.lost = True
                ctx.log.warning("lease_lost", status=reply.status, reason=reply.reason)
                ctx._cancel(f"lease lost: {reply.reason}")
                return
            if reply.status == "ok" and reply.body.get("cancel_requested"):
                if not att.cancel_requested:
                    att.cancel_requested = True
                    ctx.log.info("cancel_requested")
                    ctx._cancel("cancellation requested")

    async def _fail(self, att: _Attempt, error_class: str, message: str) -> None:
        ctx = att.ctx
        if att.lost:
            return
        cmd = m.FailRun(run_id=ctx.run_id, attempt=ctx.attempt, fence=ctx.fence,
                        worker_id=self.worker_id, error_class=error_class,  # type: ignore[arg-type]
                        message=message)
        reply = await self._send(ctx.tenant, ctx.schedule_id, cmd)
        self.stats.failed += 1
        if reply is None:
            ctx.log.error("failure_undecided", error_class=error_class)
        elif reply.status != "ok":
            ctx.log.warning("failure_refused", status=reply.status, reason=reply.reason)
        else:
            ctx.log.info("attempt_failed", error_class=error_class, state=reply.body.get("state"))

    async def _complete(self, att: _Attempt, value: Any) -> None:
        ctx = att.ctx
        try:
            data = orjson.dumps(value, option=orjson.OPT_UTC_Z)
        except TypeError as exc:
            await self._fail(att, "permanent", f"result is not JSON-serializable: {exc}")
            return
        checksum = sha256_hex(data)
        uri: str | None = None
        inline: Any = None
        if len(data) <= self.inline_limit:
            inline = orjson.loads(data)
        else:
            try:
                uri = await self.result_store.put(ctx.run_id, ctx.attempt, ctx.fence, data)
            except Exception as exc:  # noqa: BLE001
                ctx.log.error("staging_failed", error=repr(exc))
                await self._fail(att, "transient", f"staging the result failed: {exc}")
                return
        _failpoint("before_complete")
        if att.lost:  # the lease was lost while staging: do not try to publish
            self.stats.discarded += 1
            ctx.log.warning("result_discarded", reason=ctx.cancel_reason, uri=uri)
            return
        cmd = m.CompleteRun(run_id=ctx.run_id, attempt=ctx.attempt, fence=ctx.fence,
                            worker_id=self.worker_id, checksum=checksum, size=len(data),
                            uri=uri, inline=inline)
        reply = await self._send(ctx.tenant, ctx.schedule_id, cmd)
        if reply is None:
            ctx.log.error("completion_undecided", checksum=checksum, uri=uri)
            return
        if reply.status == "ok":
            self.stats.completed += 1
            ctx.log.info("result_published", size=len(data), uri=uri, checksum=checksum)
        else:
            self.stats.discarded += 1
            ctx.log.warning("completion_refused", status=reply.status, reason=reply.reason,
                            uri=uri)


def _parse_time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    if value:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return datetime.now(timezone.utc)


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


async def run_until_signalled(worker: Worker, signals: Sequence[int] = (signal.SIGTERM,
                                                                       signal.SIGINT)) -> None:
    """Run a worker; SIGTERM/SIGINT begin a graceful drain (a second one forces it)."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


__all__ = ["Worker", "JobContext", "Permanent", "Ambiguous", "Cancelled", "WorkerStats",
           "run_until_signalled"]
