"""The command client: emit commands onto ``commands`` and await their replies.

``Client`` works on any ``EventLog`` (Kafka or the embedded SQLite log). It appends a
``CommandEnvelope`` keyed ``tenant/schedule_id`` and waits — bounded — for the reply with the
same ``command_id`` on ``replies`` (the processor writes it to the same partition number, in
the same transaction as the events it caused). A timed-out command may still be decided:
re-sending it with the same ``command_id`` is safe (the processor answers a duplicate with
the original reply).

Typed helpers (``create_schedule``, ``claim``, ...) return the reply body on ``ok`` and raise
a typed error otherwise: ``Invalid``, ``Forbidden``, ``NotFound``, ``Conflict``,
``QuotaExceeded``, ``StaleFence``.

Group append: commands sent while an append is in flight are appended together by the next
one (one ``log.append`` — on SQLite one transaction and one fsync — instead of one each);
every ``send`` still returns only after its own command is durably appended.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import structlog

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.ids import calendar_id, partition_key
from chronolog.domain.limits import MAX_DOCUMENT_DEPTH, plainly_clean_json
from chronolog.environment import new_id, utc_now
from chronolog.log.dead_letters import DeadLetters
from chronolog.log.partitioner import partition_for
from chronolog.log.port import EventLog, LogError, OutRecord, Record
from chronolog.log.routing_history import read_routing
from chronolog.logging import Throttle
from chronolog.telemetry import tracing
from chronolog.telemetry.tracing import Headers
from chronolog.wakeup import wait_within

log = structlog.get_logger("chronolog.client")

ROUTING_REFRESH_S = 10.0  # how old the known routing version may be before it is read again


class CommandError(Exception):
    """A command was answered with a non-ok status."""

    status = "error"

    def __init__(self, reply: m.Reply) -> None:
        super().__init__(f"{reply.status}: {reply.reason}")
        self.reply = reply
        self.reason = reply.reason
        self.body = reply.body
        self.field: str | None = reply.body.get("field")


class Invalid(CommandError):
    status = "invalid"


class Forbidden(CommandError):
    status = "forbidden"


class NotFound(CommandError):
    status = "not_found"


class Conflict(CommandError):
    status = "conflict"


class QuotaExceeded(CommandError):
    status = "quota"


class StaleFence(CommandError):
    status = "stale_fence"


class ReplyTimeout(Exception):
    """No reply within the bound; the command may still be decided (re-send the same ID)."""


ERRORS: dict[str, type[CommandError]] = {
    c.status: c for c in (Invalid, Forbidden, NotFound, Conflict, QuotaExceeded, StaleFence)
}


def _reply_of(env: m.CommandEnvelope, fut: asyncio.Future[m.Reply]) -> m.Reply | None:
    if not fut.done() or fut.cancelled():
        return None
    exc = fut.exception()
    if exc is not None:  # a reply that does not decode: as if lost (re-sending is safe)
        log.warning("reply_undecodable", command_id=env.command_id, error=repr(exc))
        return None
    return fut.result()


def raise_for(reply: m.Reply) -> dict[str, Any]:
    """The body of an ok reply, or the typed error of any other."""
    if reply.status == "ok":
        return reply.body
    raise ERRORS.get(reply.status, CommandError)(reply)


class Client:
    """Emits commands and correlates replies by command ID."""

    def __init__(
        self,
        log_: EventLog,
        principal: str = "",
        reply_timeout: float = 15.0,
        client_id: str | None = None,
    ) -> None:
        self.log = log_
        self.topics = log_.topics
        self.principal = principal
        self.reply_timeout = reply_timeout
        self.client_id = client_id or f"client-{new_id()[:12]}"
        self._waiters: dict[str, asyncio.Future[m.Reply]] = {}
        self._task: asyncio.Task[None] | None = None
        self._consumer: Any = None
        self._ready = asyncio.Event()
        self._outbox: list[tuple[list[OutRecord], asyncio.Future[None]]] = []
        self._appender: asyncio.Task[None] | None = None
        self._positions: dict[tuple[str, int], int] = {}  # next offset to read of replies
        self._throttle = Throttle()
        self.dead_letters = DeadLetters(log_, f"client:{self.client_id}")
        # the partition count commands are placed by: the deployment's active routing
        # version (docs/design.md §18), read at start and again every ROUTING_REFRESH_S
        # (None until read: the log places them by the topic's count)
        self._route_by: int | None = None
        self._routing_read_at = 0.0
        self._routing_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start following ``replies`` from their current end. A start that fails (the log
        is away) leaves nothing running: it may be called again."""
        self._ready.clear()
        await self._read_routing()
        self._consumer = self.log.group_consumer(
            f"{self.topics.prefix}{self.client_id}", [self.topics.replies], self.client_id,
            on_assigned=self._on_assigned, wake_on=[self.client_id],
        )
        try:
            await self._consumer.start()
            self._task = asyncio.create_task(self._pump(), name=f"{self.client_id}-replies")
            await wait_within(self._ready.wait(), 30)
        except BaseException:
            await self._stop_reading()
            raise

    async def _read_routing(self) -> None:
        """Learn the partition count clients route by now (a log that does not answer
        keeps the one known: a partition forwards what it does not hold)."""
        self._routing_read_at = time.monotonic()
        try:
            self._route_by = (await read_routing(self.log)).current.partitions
        except (LogError, OSError) as exc:
            held = self._throttle.take("routing_read_failed")
            if held is not None:
                log.warning("routing_read_failed", error=str(exc)[:300],
                            **({"held_back": held} if held else {}))

    def _placement(self, key: bytes) -> int | None:
        """The partition of ``commands`` a command keyed ``key`` goes to (None: the log
        places it); starts a read of the routing history when the one known is old."""
        if (time.monotonic() - self._routing_read_at > ROUTING_REFRESH_S
                and (self._routing_task is None or self._routing_task.done())):
            self._routing_task = asyncio.create_task(self._read_routing(),
                                                     name=f"{self.client_id}-routing")
        return None if self._route_by is None else partition_for(key, self._route_by)

    async def _on_assigned(self, tps: set[tuple[str, int]]) -> None:
        """Follow a partition from its end — or, assigned again after the group lost us
        (the broker was away for longer than the session), from where we stopped reading,
        so no reply written meanwhile is passed over."""
        for topic, p in tps:
            offset = self._positions.get((topic, p))
            if offset is None:
                offset = self._positions[(topic, p)] = await self.log.end_offset(topic, p)
            self._consumer.seek(topic, p, offset)
        self._ready.set()

    def following(self) -> bool:
        """Whether replies are being read: started, and the reply reader in its group."""
        return (self._task is not None and not self._task.done()
                and self._consumer is not None and self._consumer.joined())

    async def _stop_reading(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.close()

    async def close(self) -> None:
        if self._routing_task is not None:
            self._routing_task.cancel()
            with contextlib.suppress(BaseException):
                await self._routing_task
        if self._appender is not None and not self._appender.done():
            with contextlib.suppress(Exception):
                await self._appender  # commands already handed over are appended
        await self._stop_reading()
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _pump(self) -> None:
        failures = 0
        while True:
            try:
                records = await self._consumer.getmany(timeout_ms=200, max_records=1000)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep following; waiters time out
                failures += 1
                held = self._throttle.take("reply_read_failed")
                if held is not None:
                    log.warning("reply_read_failed", error=str(exc)[:300],
                                **({"held_back": held} if held else {}))
                await asyncio.sleep(min(0.2 * failures, 2.0))
                continue
            failures = 0
            for rec in records:
                self._positions[(rec.topic, rec.partition)] = rec.offset + 1
                try:
                    cid = rec.key.decode() if rec.key else None
                    if cid is None:
                        raise codec.DecodeError("a reply without a key (the command ID)")
                except (UnicodeDecodeError, codec.DecodeError) as exc:
                    await self._dead_letter(rec, exc)  # answers no command: recorded, passed
                    continue
                fut = self._waiters.get(cid)
                if fut is None or fut.done():
                    continue
                try:
                    fut.set_result(codec.decode_reply(rec.value))
                except Exception as exc:  # noqa: BLE001 - the waiter sees the error
                    fut.set_exception(exc)
                    await self._dead_letter(rec, exc)

    async def _dead_letter(self, rec: Record, exc: BaseException) -> None:
        try:
            await self.dead_letters.put(rec, exc)
        except Exception as err:  # noqa: BLE001 - the reply is passed either way
            log.warning("reply_dead_letter_failed", offset=rec.offset, error=repr(err))

    # ------------------------------------------------------------------ sending

    def envelope(
        self,
        tenant: str,
        schedule_id: str,
        payload: Any,
        command_id: str | None = None,
        issued_at: datetime | None = None,
    ) -> m.CommandEnvelope:
        """A validated command envelope. Its text is checked on its JSON bytes first (a
        look at them, ``plainly_clean_json``); only a doubtful one is walked field by field,
        which raises the ``ValidationError`` naming the field."""
        fields = {"command_id": command_id or new_id(), "type": payload.type, "tenant": tenant,
                  "principal": self.principal, "schedule_id": schedule_id,
                  "issued_at": issued_at or utc_now(), "reply_to": self.client_id,
                  "payload": payload}
        env = m.CommandEnvelope.model_validate(fields, context=m.TEXT_CHECKED)
        if not plainly_clean_json(codec.encode_command(env), MAX_DOCUMENT_DEPTH):
            env = m.CommandEnvelope.model_validate(fields)
        return env

    async def send(
        self, env: m.CommandEnvelope, timeout: float | None = None
    ) -> m.Reply:
        """Append the command and wait for its reply (``ReplyTimeout`` past the bound)."""
        [reply] = await self.send_batch([env], timeout)
        if reply is None:
            raise ReplyTimeout(f"no reply to {env.type} {env.command_id}")
        return reply

    async def send_batch(
        self, envs: Sequence[m.CommandEnvelope], timeout: float | None = None
    ) -> list[m.Reply | None]:
        """Append the commands in one append and wait, one bound for all, for their replies.

        The replies in the order of ``envs``; None where none came within the bound (the
        command may still be decided: re-send the same envelope, it is answered with the
        original reply). An append that fails raises, and none of the commands is known sent.
        """
        futs = await self.submit(envs)
        return await self.collect(envs, futs, timeout)

    async def submit(self, envs: Sequence[m.CommandEnvelope], partition: int | None = None,
                     headers: Sequence[Headers] | None = None,
                     ) -> list[asyncio.Future[m.Reply]]:
        """Append the commands durably (one append); the futures of their replies.
        ``partition``: append them there instead of placing them by their key (a command
        addressed to a partition: a partition's routing view, docs/design.md §18).
        ``headers``: each command's record headers; by default, with tracing on, the current
        span's ``traceparent`` (``chronolog.telemetry.tracing``), else none."""
        if self._task is None:
            raise RuntimeError("Client.start() first")
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[m.Reply]] = []
        for env in envs:
            fut = self._waiters.get(env.command_id)
            if fut is None or fut.done():
                fut = self._waiters[env.command_id] = loop.create_future()
            futs.append(fut)
        if headers is None and tracing.enabled:
            headers = [tracing.record_headers()] * len(envs)
        try:
            records = []
            for i, env in enumerate(envs):
                key = partition_key(env.tenant, env.schedule_id).encode()
                records.append(OutRecord(
                    topic=self.topics.commands, key=key, value=codec.encode_command(env),
                    partition=self._placement(key) if partition is None else partition,
                    headers=headers[i] if headers else ()))
            await self._append(records)
        except BaseException:
            self._forget(envs, futs)
            raise
        return futs

    async def collect(
        self, envs: Sequence[m.CommandEnvelope], futs: list[asyncio.Future[m.Reply]],
        timeout: float | None = None,
    ) -> list[m.Reply | None]:
        """Wait (bounded) for the replies of submitted commands; None where none came."""
        try:
            pending = [f for f in futs if not f.done()]
            if pending:
                await asyncio.wait(pending, timeout=self.reply_timeout if timeout is None
                                   else timeout)
            return [_reply_of(env, f) for env, f in zip(envs, futs, strict=True)]
        finally:
            self._forget(envs, futs)

    def _forget(self, envs: Sequence[m.CommandEnvelope],
                futs: list[asyncio.Future[m.Reply]]) -> None:
        for env, fut in zip(envs, futs, strict=True):
            if fut.done() and self._waiters.get(env.command_id) is fut:
                del self._waiters[env.command_id]

    async def _append(self, recs: list[OutRecord]) -> None:
        """Append ``recs`` durably, together with whatever else is waiting (group append)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.append((recs, done))
        if self._appender is None or self._appender.done():
            self._appender = asyncio.create_task(self._append_loop(),
                                                 name=f"{self.client_id}-append")
        await asyncio.shield(done)

    async def _append_loop(self) -> None:
        while self._outbox:
            batch, self._outbox = self._outbox, []
            try:
                await self.log.append([rec for recs, _ in batch for rec in recs])
            except BaseException as exc:  # every waiter of the batch sees it
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc if isinstance(exc, Exception)
                                           else RuntimeError(f"append interrupted: {exc!r}"))
                        done.exception()  # retrieved here; the sender re-raises its copy
                if not isinstance(exc, Exception):
                    raise
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)

    async def call(
        self, tenant: str, schedule_id: str, payload: Any, command_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send and return the ok body, or raise the typed error."""
        reply = await self.send(self.envelope(tenant, schedule_id, payload, command_id), timeout)
        return raise_for(reply)

    # ------------------------------------------------------------------ typed helpers

    async def create_schedule(
        self, tenant: str, schedule_id: str, spec: m.ScheduleSpec | dict[str, Any],
        request_key: str | None = None,
    ) -> dict[str, Any]:
        spec = spec if isinstance(spec, m.ScheduleSpec) else m.ScheduleSpec.model_validate(spec)
        return await self.call(tenant, schedule_id,
                               m.CreateSchedule(spec=spec, request_key=request_key))

    async def put_calendar(
        self, tenant: str, name: str, spec: CalendarSpec | dict[str, Any],
        expected_revision: int | None = None,
    ) -> dict[str, Any]:
        """Create calendar ``name`` (``expected_revision`` None) or revise it at its current
        revision; the ok body is ``{name, revision, created}``."""
        spec = spec if isinstance(spec, CalendarSpec) else CalendarSpec.model_validate(spec)
        return await self.call(tenant, calendar_id(name), m.PutCalendar(
            name=name, spec=spec, expected_revision=expected_revision))

    async def delete_calendar(self, tenant: str, name: str,
                              expected_revision: int | None = None) -> dict[str, Any]:
        """Delete calendar ``name`` (refused while a schedule names it)."""
        return await self.call(tenant, calendar_id(name), m.DeleteCalendar(
            name=name, expected_revision=expected_revision))

    async def create_schedules(
        self, tenant: str, specs: Sequence[tuple[str, m.ScheduleSpec | dict[str, Any]]],
        timeout: float | None = None,
    ) -> list[dict[str, Any] | CommandError | ReplyTimeout]:
        """Create many schedules with one append (``(schedule_id, spec)`` pairs): for each,
        in order, its ok body or its typed error (``ReplyTimeout`` where no reply came within
        the bound; such a create may still be decided). A spec that does not validate raises
        before anything is sent."""
        envs = [self.envelope(tenant, sid, m.CreateSchedule(
                    spec=spec if isinstance(spec, m.ScheduleSpec)
                    else m.ScheduleSpec.model_validate(spec)))
                for sid, spec in specs]
        out: list[dict[str, Any] | CommandError | ReplyTimeout] = []
        for env, reply in zip(envs, await self.send_batch(envs, timeout), strict=True):
            if reply is None:
                out.append(ReplyTimeout(f"no reply to {env.type} {env.command_id}"))
            elif reply.status == "ok":
                out.append(reply.body)
            else:
                out.append(ERRORS.get(reply.status, CommandError)(reply))
        return out

    async def revise_schedule(
        self, tenant: str, schedule_id: str, spec: m.ScheduleSpec | dict[str, Any],
        expected_revision: int,
    ) -> dict[str, Any]:
        spec = spec if isinstance(spec, m.ScheduleSpec) else m.ScheduleSpec.model_validate(spec)
        return await self.call(tenant, schedule_id,
                               m.ReviseSchedule(spec=spec, expected_revision=expected_revision))

    async def pause(self, tenant: str, schedule_id: str, reason: str = "") -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.PauseSchedule(reason=reason))

    async def resume(self, tenant: str, schedule_id: str) -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.ResumeSchedule())

    async def delete(self, tenant: str, schedule_id: str) -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.DeleteSchedule())

    async def trigger(
        self, tenant: str, schedule_id: str, request_key: str,
        params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return await self.call(tenant, schedule_id,
                               m.TriggerRun(request_key=request_key, params=params))

    async def cancel(self, tenant: str, schedule_id: str, run_id: str,
                     reason: str = "") -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.CancelRun(run_id=run_id, reason=reason))

    async def redrive(self, tenant: str, schedule_id: str, run_id: str) -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.RedriveRun(run_id=run_id))

    async def resolve(
        self, tenant: str, schedule_id: str, run_id: str, decision: str, note: str = "",
        effect_id: str | None = None,
    ) -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.ResolveReconciliation(
            run_id=run_id, decision=decision, note=note, effect_id=effect_id))  # type: ignore[arg-type]

    async def claim(self, tenant: str, schedule_id: str, run_id: str, attempt: int,
                    worker_id: str) -> dict[str, Any]:
        return await self.call(tenant, schedule_id,
                               m.ClaimRun(run_id=run_id, attempt=attempt, worker_id=worker_id))

    async def heartbeat(self, tenant: str, schedule_id: str, run_id: str, attempt: int,
                        fence: int, worker_id: str) -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.Heartbeat(
            run_id=run_id, attempt=attempt, fence=fence, worker_id=worker_id))

    async def complete(self, tenant: str, schedule_id: str, run_id: str, attempt: int,
                       fence: int, worker_id: str, checksum: str, size: int,
                       uri: str | None = None, inline: Any = None,
                       command_id: str | None = None) -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.CompleteRun(
            run_id=run_id, attempt=attempt, fence=fence, worker_id=worker_id,
            checksum=checksum, size=size, uri=uri, inline=inline), command_id=command_id)

    async def fail(self, tenant: str, schedule_id: str, run_id: str, attempt: int, fence: int,
                   worker_id: str, error_class: str = "transient",
                   message: str = "") -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.FailRun(
            run_id=run_id, attempt=attempt, fence=fence, worker_id=worker_id,
            error_class=error_class, message=message))  # type: ignore[arg-type]

    async def record_effect(self, tenant: str, schedule_id: str, run_id: str, effect_id: str,
                            outcome: str, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.call(tenant, schedule_id, m.RecordEffectOutcome(
            run_id=run_id, effect_id=effect_id, outcome=outcome,  # type: ignore[arg-type]
            evidence=evidence or {}))
