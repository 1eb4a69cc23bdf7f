"""The CLI with direct access to the log and the read model (``--log``, for operators).

Each answer has the shape, key order included, of the HTTP API's body for the same
operation (``chronolog.api.models`` for writes).

Writes go to the log through ``chronolog.client.Client`` and wait, bounded (``--timeout``),
for the processor's reply. Reads come from the PostgreSQL read model through the queries and
documents the API uses too (``chronolog.queries.read_model``), so each answer is the
body the API would give: ``--database-url`` / ``CHRONOLOG_DATABASE_URL``, else the embedded
PostgreSQL of ``--data-dir`` (``DIR/pg`` or ``DIR/postgres`` as ``chronolog dev`` or
``chronolog projector`` makes it); a cluster that is not running is started for the command,
with a note on stderr, and stopped again on exit.

A revise by flags (``patch_schedule``) merges them into the definition the read model holds
at the ``--if-match`` revision — waiting, bounded by ``--timeout``, while the read model is
behind it — validates the result as the API validates a PUT body, and sends the whole spec
with the same expected revision, so the processor still refuses a concurrent revise.

What only the API answers: schedule filters other than the state and paging cursors of
``schedule list``, and runs across schedules — ``UsageError`` naming ``--url``.
"""

from __future__ import annotations

import asyncio
import getpass
import heapq
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import asyncpg
from pydantic import ValidationError

from chronolog.cli.errors import Failure, UsageError
from chronolog.cli.flags import checked_database_url
from chronolog.cli.transport import Ctx, RunsQuery, SchedulesQuery, WorkersQuery
from chronolog.client import Client, CommandError, ReplyTimeout, raise_for
from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.ids import calendar_id
from chronolog.domain.storage_budget import SETTING as STORAGE_SETTING
from chronolog.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from chronolog.log.port import LogError
from chronolog.queries.calendars import (
    CALENDARS_PAGE,
    calendar_document,
    calendar_page,
    missing_calendars,
)
from chronolog.queries.documents import (
    InvalidDefinition,
    backfill_out,
    body_error,
    camel_path,
    jsonable,
    patched_definition,
    to_spec,
)
from chronolog.queries.read_model import (
    ReadModel,
    ScheduleQuery,
    decode_run_cursor,
    decode_worker_cursor,
    run_document,
    runs_page,
    schedule_document,
    schedule_summary,
    watermark,
    workers_page,
)
from chronolog.queries.workers import ever_served
from chronolog.settings import LogConfig, data_dir, open_log
from chronolog.telemetry.ids import run_trace_id

__all__ = ["DirectTransport", "api_only"]

_BEHIND_POLL = 0.1  # seconds between reads of a read model behind a revise's revision
_ALL_PAGE = 1000  # schedules all_schedules reads at a time


def api_only(what: str) -> UsageError:
    """What direct access cannot answer (``error: <what> need(s) the API (--url)``)."""
    return UsageError(f"error: {what} the API (--url)")


def _iso(t: Any) -> str | None:
    if t is None:
        return None
    if isinstance(t, str):
        t = datetime.fromisoformat(t.replace("Z", "+00:00"))
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


class DirectTransport:
    """``Transport`` on the log of ``ctx.log_cfg`` and the read model (``async with`` it)."""

    def __init__(self, ctx: Ctx) -> None:
        assert ctx.log_cfg is not None
        self.ctx = ctx
        self.args = ctx.args
        self.cfg: LogConfig = ctx.log_cfg
        self.tenant = ctx.tenant

    async def __aenter__(self) -> DirectTransport:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        return None

    # ------------------------------------------------------------------ writes

    async def create_schedule(self, schedule_id: str, body: dict[str, Any], spec: Any,
                              key: str | None) -> dict[str, Any]:
        self._check_job(spec)
        await self._check_calendars(spec)
        out = await self._send(schedule_id, m.CreateSchedule(spec=spec, request_key=key))
        result: dict[str, Any] = {"scheduleId": schedule_id, "revision": out["revision"],
                                  "nextRunAt": _iso(out.get("next_run_at"))}
        warnings = await self._job_warnings(spec)
        if warnings:
            result["warnings"] = warnings
        return result

    async def revise_schedule(self, schedule_id: str, body: dict[str, Any], spec: Any,
                              revision: int) -> dict[str, Any]:
        self._check_job(spec)
        await self._check_calendars(spec)
        out = await self._send(schedule_id,
                               m.ReviseSchedule(spec=spec, expected_revision=revision))
        return {"revision": out["revision"], "nextRunAt": _iso(out.get("next_run_at"))}

    async def patch_schedule(self, schedule_id: str, patch: dict[str, Any],
                             revision: int) -> dict[str, Any]:
        row = await self._schedule_at(schedule_id, revision)
        try:
            spec = to_spec(patched_definition(row["spec"], patch))
        except ValidationError as exc:  # the API's 400 for the same merged body
            message, field = body_error(exc.errors()[0])
            raise Failure("invalid", message, field) from None
        except InvalidDefinition as exc:
            raise Failure("invalid", exc.message, exc.field) from None
        return await self.revise_schedule(schedule_id, {}, spec, revision)

    async def change_state(self, schedule_id: str, action: str,
                           reason: str) -> dict[str, Any]:
        payload: Any = (m.PauseSchedule(reason=reason) if action == "pause" else
                        m.ResumeSchedule() if action == "resume" else m.DeleteSchedule())
        out = await self._send(schedule_id, payload)
        return {"scheduleId": schedule_id, "revision": out["revision"],
                "nextRunAt": _iso(out.get("next_run_at")), "state": out["state"]}

    async def trigger(self, schedule_id: str, key: str,
                      params: dict[str, Any] | None) -> dict[str, Any]:
        out = await self._send(schedule_id, m.TriggerRun(request_key=key, params=params))
        return {"runId": out["run_id"], "state": out["state"],
                "traceId": run_trace_id(out["run_id"])}  # as the API's 201 says

    async def backfill(self, schedule_id: str, key: str, start: datetime, end: datetime,
                       overlap: str) -> dict[str, Any]:
        out = await self._send(schedule_id, m.BackfillSchedule(
            request_key=key, start=start, end=end, overlap=overlap))  # type: ignore[arg-type]
        return dict(jsonable(backfill_out(out)))

    async def cancel(self, run_id: str, schedule_id: str | None,
                     reason: str) -> dict[str, Any]:
        sid, at = await self._run_place(run_id, schedule_id)
        out = await self._send(sid, m.CancelRun(run_id=run_id, reason=reason, scheduled_at=at))
        return {"runId": run_id, "state": out.get("state", ""), "outcome": out.get("outcome"),
                "attempt": None}

    async def redrive(self, run_id: str, schedule_id: str | None) -> dict[str, Any]:
        sid, at = await self._run_place(run_id, schedule_id)
        out = await self._send(sid, m.RedriveRun(run_id=run_id, scheduled_at=at))
        return {"runId": run_id, "state": out.get("state", "READY"), "outcome": None,
                "attempt": out.get("attempt")}

    async def put_calendar(self, name: str, body: dict[str, Any],
                           if_match: int | None) -> dict[str, Any]:
        out = await self._send(calendar_id(name), m.PutCalendar(
            name=name, spec=CalendarSpec.model_validate(body), expected_revision=if_match))
        return {"name": name, "revision": out["revision"]}

    async def delete_calendar(self, name: str, if_match: int | None) -> dict[str, Any]:
        out = await self._send(calendar_id(name), m.DeleteCalendar(
            name=name, expected_revision=if_match))
        return {"name": name, "revision": out["revision"], "deleted": True}

    # ------------------------------------------------------------------ reads

    async def calendar(self, name: str) -> dict[str, Any]:
        async with self._read_model() as rm:
            doc = await calendar_document(rm.pool, self.tenant, name)
        if doc is None:
            raise Failure("not_found", f"no calendar '{name}'", "name")
        return dict(doc.model_dump(mode="json", by_alias=True))

    async def calendars(self, limit: int | None, after: str | None) -> dict[str, Any]:
        async with self._read_model() as rm:
            page = await calendar_page(rm.pool, self.tenant, after, limit or CALENDARS_PAGE)
        return dict(page.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def schedule(self, schedule_id: str) -> dict[str, Any]:
        async with self._read_model() as rm:
            row = await rm.schedule(self.tenant, schedule_id)
            if row is None:
                raise Failure("not_found", f"no schedule '{schedule_id}'", "scheduleId")
            return await schedule_document(rm, row, datetime.now(UTC))

    async def schedules(self, query: SchedulesQuery) -> dict[str, Any]:
        limit = query.limit if query.limit is not None else 500
        async with self._read_model() as rm:
            offsets, wm_time = await rm.offsets()
            if query.states and len(query.states) > 1:  # one query per state, merged by ID
                lists = [await rm.schedules(self.tenant, s, limit) for s in query.states]
                rows = list(heapq.merge(*lists, key=lambda r: r["schedule_id"]))[:limit]
            else:
                rows = await rm.schedules(self.tenant, query.states[0] if query.states
                                          else None, limit)
        return {"items": [schedule_summary(r) for r in rows], "watermark": jsonable(
            watermark(offsets, wm_time, self.cfg.topics.partitions))}

    async def all_schedules(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        after: str | None = None
        async with self._read_model() as rm:
            while True:
                rows = await rm.schedule_list(self.tenant, ScheduleQuery(), after, _ALL_PAGE)
                items.extend(schedule_summary(r) for r in rows)
                if len(rows) < _ALL_PAGE:
                    return items
                after = rows[-1]["schedule_id"]

    async def runs(self, query: RunsQuery) -> dict[str, Any]:
        if not query.of_one_schedule:
            raise api_only("runs across schedules need" if query.schedule_id is None else
                           "runs filtered by job type or time need")
        sid = query.schedule_id
        assert sid is not None
        states = list(query.states) if query.states else None
        cursor = decode_run_cursor(query.after, sid, states) if query.after else None
        async with self._read_model() as rm:
            if await rm.schedule(self.tenant, sid) is None:
                raise Failure("not_found", f"no schedule '{sid}'", "scheduleId")
            page = await runs_page(rm, self.tenant, sid, states=states, after=cursor,
                                   limit=query.limit or 50,
                                   partitions=self.cfg.topics.partitions)
        doc: dict[str, Any] = jsonable(page)
        return doc

    async def run(self, run_id: str) -> dict[str, Any]:
        async with self._read_model() as rm:
            doc = await run_document(rm, self.tenant, run_id)
        if doc is None:
            raise Failure("not_found", f"no run '{run_id}'", "runId")
        return doc

    async def workers(self, query: WorkersQuery) -> dict[str, Any]:
        last = decode_worker_cursor(query.after, query.live) if query.after else None
        async with self._read_model() as rm:
            page = await workers_page(rm.pool, after=last, limit=query.limit or 100,
                                      live=query.live, allowed=None)
        doc: dict[str, Any] = jsonable(page)
        return doc

    # ------------------------------------------------------------------ the log

    def _check_job(self, spec: Any) -> None:
        allowed = self.ctx.allowed_jobs
        if allowed is not None and spec.job.type not in allowed:
            raise Failure("forbidden", f"job type '{spec.job.type}' not allowed", "job.type")

    async def _check_calendars(self, spec: Any) -> None:
        """As the API: a calendar the definition names exists (``exclude[i]`` otherwise)."""
        if not spec.exclude:
            return
        async with self._read_model() as rm:
            missing = await missing_calendars(rm.pool, self.tenant, spec.exclude)
        if missing:
            raise Failure("invalid", f"no calendar '{missing[0]}': put it first (chronolog "
                          f"calendar put {missing[0]})",
                          f"exclude[{spec.exclude.index(missing[0])}]")

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[Client]:
        """A started ``Client`` on the configured log (closed on exit)."""
        cfg = self.cfg
        if cfg.kind == "sqlite" and not await asyncio.to_thread(os.path.exists, cfg.target):
            raise UsageError(f"invalid log 'sqlite://{cfg.target}': no such file (start "
                             f"`chronolog dev --data-dir DIR` or a processor first, or pass "
                             f"another --log)")
        lg = open_log(cfg)
        try:
            try:
                await lg.start()
                client = Client(lg, principal=f"cli:{_user()}",
                                reply_timeout=self.args.timeout)
                await client.start()
            except (TimeoutError, LogError, OSError) as exc:
                raise Failure("unavailable", self._log_problem(exc)) from None
            try:
                yield client
            finally:
                await client.close()
        finally:
            await lg.close()

    def _log_problem(self, exc: BaseException) -> str:
        cfg = self.cfg
        where = f"sqlite://{cfg.target}" if cfg.kind == "sqlite" else f"kafka://{cfg.target}"
        text = str(exc) or type(exc).__name__
        hint = ""
        if "unknown topic" in text:
            hint = (f" (no chronolog topics with prefix '{cfg.topics.prefix}' there: is a "
                    f"processor running on this log?)")
        return f"the log {where} is unavailable: {text}{hint}"

    async def _send(self, schedule_id: str, payload: Any) -> dict[str, Any]:
        """Send one command; the ok body, or ``Failure`` (refused / timed out / no log)."""
        timeout = self.args.timeout
        async with self._client() as client:
            env = client.envelope(self.tenant, schedule_id, payload)
            try:
                reply = await client.send(env, timeout)
            except ReplyTimeout:
                again = ("read the resource, or retry with the same --idempotency-key"
                         if getattr(self.args, "idempotency_key", None) else
                         "read the resource")
                raise Failure("unavailable", f"no reply from the processor within "
                              f"{timeout:g}s; the command may still be decided: {again} "
                              f"before retrying") from None
            except LogError as exc:
                raise Failure("unavailable", self._log_problem(exc)) from None
        try:
            return raise_for(reply)
        except CommandError as exc:
            body = dict(exc.body)
            fld = body.pop("field", None)
            extra = {k: body[k] for k in ("revision", "state") if body.get(k) is not None}
            if isinstance(fld, str) and fld != STORAGE_SETTING:  # a tenants-file setting
                fld = camel_path(fld)  # stays as the file spells it; a body field is camelCase
            raise Failure(exc.reply.status, exc.reason or exc.reply.status,
                          fld if isinstance(fld, str) else None, extra) from None

    # ------------------------------------------------------------------ the read model

    @asynccontextmanager
    async def _database(self) -> AsyncIterator[str]:
        """The read model's DSN: the flag, the environment, or the data dir's embedded
        server."""
        args = self.args
        url = args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
        if url:
            yield checked_database_url(url)
            return
        ddir = data_dir(args.data_dir)
        clusters = [ddir / "pg", ddir / "postgres"]  # chronolog dev / chronolog projector
        cluster = next((c for c in clusters if (c / "PG_VERSION").exists()), None)
        if cluster is None:
            raise UsageError(f"invalid database-url: none given and no embedded PostgreSQL "
                             f"in {ddir}/pg or {ddir}/postgres (pass --database-url or set "
                             f"CHRONOLOG_DATABASE_URL)")
        pg = EmbeddedPostgres(cluster)
        try:
            if await asyncio.to_thread(pg.is_running):
                yield await asyncio.to_thread(pg.dsn)
                return
            print(f"note: starting the embedded PostgreSQL in {cluster} for this command (it "
                  f"is stopped again on exit; without a running projector its data may be "
                  f"stale)", file=sys.stderr, flush=True)
            dsn = await asyncio.to_thread(pg.start)
        except EmbeddedPostgresError as exc:
            raise Failure("unavailable", f"the embedded PostgreSQL in {cluster}: "
                          f"{exc}") from None
        try:
            yield dsn
        finally:
            await asyncio.to_thread(pg.stop)

    async def _job_warnings(self, spec: Any) -> list[str]:
        """The API's warning when no worker of the schedule's class has ever served its job
        type; nothing when no read model is at hand without starting one."""
        url = self.args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
        if not url:
            ddir = data_dir(self.args.data_dir)
            for cluster in (ddir / "pg", ddir / "postgres"):
                pg = EmbeddedPostgres(cluster)
                if (cluster / "PG_VERSION").exists() and await asyncio.to_thread(pg.is_running):
                    url = await asyncio.to_thread(pg.dsn)
                    break
        if not url:
            return []
        try:
            conn = await asyncpg.connect(url, timeout=5)
        except Exception:  # noqa: BLE001 - a warning is best effort
            return []
        try:
            if await ever_served(conn, spec.resource_class, spec.job.type):
                return []
        except asyncpg.PostgresError:
            return []
        finally:
            await conn.close()
        return [f"no worker of resource class '{spec.resource_class}' has ever served job "
                f"type '{spec.job.type}': its runs will wait READY until one does"]

    @asynccontextmanager
    async def _read_model(self) -> AsyncIterator[ReadModel]:
        """The read model on the configured database."""
        async with self._database() as dsn:
            try:
                pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, timeout=10)
            except Exception as exc:  # noqa: BLE001 - any connect failure is configuration
                raise UsageError(f"invalid database-url: cannot connect ({exc})") from None
            assert pool is not None
            try:
                yield ReadModel(pool, self.cfg.topics.events)
            except asyncpg.UndefinedTableError:
                raise Failure("unavailable", "the database holds no chronolog read model "
                              "(run `chronolog projector` against it)") from None
            except (asyncpg.PostgresError, OSError) as exc:
                raise Failure("unavailable", f"the database: {exc}") from None
            finally:
                await pool.close()

    async def _schedule_at(self, schedule_id: str, revision: int) -> Any:
        """The schedule's row at ``revision``, the base of a patch: a read model behind it
        is read again until it has it (bounded by ``--timeout``: it lags the log); a newer
        revision is the processor's conflict."""
        deadline = time.monotonic() + self.args.timeout
        async with self._read_model() as rm:
            while True:
                row = await rm.schedule(self.tenant, schedule_id)
                if row is None:
                    raise Failure("not_found", f"no schedule '{schedule_id}'", "scheduleId")
                if row["revision"] >= revision or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(_BEHIND_POLL)
        if row["revision"] != revision:
            raise Failure("conflict", f"expected revision {revision}, current is "
                          f"{row['revision']}", "If-Match", {"revision": row["revision"]})
        return row

    async def _run_place(self, run_id: str, schedule_id: str | None
                         ) -> tuple[str, datetime | None]:
        """The run's schedule (``--schedule``, else the read model's) and, when read from
        the read model, its instant (the decider tells a finished run it no longer holds
        from an unknown run ID by it)."""
        if schedule_id is not None:
            return schedule_id, None
        async with self._read_model() as rm:
            row = await rm.run(self.tenant, run_id)
        if row is None:
            raise Failure("not_found", f"no run '{run_id}' (in the read model; pass --schedule "
                          f"if it is not projected yet)", "runId")
        return str(row["schedule_id"]), row["scheduled_at"]


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in a container
        return str(os.getuid())
