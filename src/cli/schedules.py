"""The operator CLI: schedules, runs and their history, on either log.

    chronolog schedule create ID (--cron EXPR [--tz ZONE] | --every DUR [--anchor ISO] | --at ISO)
                              --job TYPE [--params JSON] [--misfire skip|latest|all]
                              [--overlap allow|skip|buffer_one|buffer_all|cancel_previous]
                              [--max-attempts N] [--lease DUR] [--start-deadline DUR]
                              [--jitter DUR] [--dst-ambiguous first|second|both]
                              [--dst-nonexistent shift_forward|skip] [--idempotency-key K]
                              [--spec FILE.json]
    chronolog schedule revise ID --if-match REV (the same definition flags, or --spec)
    chronolog schedule pause|resume|delete ID
    chronolog schedule list [--state ACTIVE|PAUSED|COMPLETED|DELETED] [--limit N]
    chronolog schedule show ID
    chronolog trigger SCHEDULE_ID [--idempotency-key K] [--params JSON]
    chronolog cancel RUN_ID [--schedule S] [--reason TEXT]
    chronolog redrive RUN_ID [--schedule S]
    chronolog runs SCHEDULE_ID [--limit N] [--state S[,S]] [--after CURSOR]
    chronolog run RUN_ID
    chronolog workers list [--live | --not-live] [--limit N] [--after CURSOR]

Every command takes the log flags (``--log``/``--data-dir``/``--partitions``/
``--topic-prefix``, env ``CHRONOLOG_LOG`` ...), ``--tenant`` (default: the only tenant of the
tenants file, else ``default``), ``--tenants FILE`` (env ``CHRONOLOG_TENANTS``; when given,
the tenant must exist in it and its job types are checked locally, as the API does) and
``--json`` (machine output: the HTTP API's camelCase bodies; see below).

Writes go to the log through ``chronolog.client.Client`` and wait, bounded
(``--timeout``, default 15 s), for the processor's reply. Reads come from the PostgreSQL
read model through the queries and documents the API uses too
(``chronolog.projections.read_model``, so ``--json`` prints exactly what the API would):
``--database-url`` / ``CHRONOLOG_DATABASE_URL``, else the embedded PostgreSQL of
``--data-dir`` (``DIR/pg`` as ``chronolog dev`` makes it, or ``DIR/postgres`` as ``chronolog
projector`` makes it); a cluster that is not running is started for the command, with a note
on stderr, and stopped again on exit.

Exit status
    0   done.
    1   the command was refused or could not be decided: one line on stderr
        ``error: <status>: <reason>`` where status is the reply / API word (``invalid``,
        ``forbidden``, ``not_found``, ``conflict``, ``quota``, ``stale_fence``) or
        ``unavailable`` (no reply within the bound — the command may still be decided —, the
        log or the database unreachable). With ``--json`` the API's error body
        ``{"error", "field", "message", ...}`` is also printed on stdout.
    2   bad local input or configuration (validated before anything is sent): one line
        naming the field and value, the same messages as ``chronolog preview``.

``schedule create`` also says ``warning: ...`` on stderr (exit 0; ``warnings`` in ``--json``)
when no worker of the schedule's resource class has ever served its job type, as far as the
read model tells (checked only when a database is given or the data directory's embedded
PostgreSQL is running). ``workers list`` reads every worker (an operator's view: all job
types); ``runs`` and ``run`` show why a READY run waits (``waiting``).

``--json`` shapes (as the API): create ``{scheduleId, revision, nextRunAt}``; revise
``{revision, nextRunAt}``; pause/resume/delete ``{scheduleId, revision, state, nextRunAt}``;
trigger ``{runId, state}``; cancel ``{runId, state, outcome}``; redrive ``{runId, state,
attempt}``; show = ``GET /v1/schedules/{id}``; runs = ``GET /v1/schedules/{id}/runs``;
run = ``GET /v1/runs/{id}``; workers list = ``GET /v1/workers``; list (no API counterpart)
``{items: [{scheduleId, state, revision, nextRunAt, nextDueAt, createdAt, updatedAt,
definition}], watermark}``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from chronolog.cli.errors import UsageError
from chronolog.cli.flags import add_database_flag, add_log_flags
from chronolog.client import Client, CommandError, ReplyTimeout, raise_for
from chronolog.devnode.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from chronolog.domain import messages as m
from chronolog.domain.durations import InvalidDuration, parse_duration
from chronolog.domain.limits import RUN_ID_PATTERN, SCHEDULE_ID_PATTERN
from chronolog.domain.recurrence import (
    RecurrenceError,
    compile_trigger,
    parse_instant,
    resolve_zone,
)
from chronolog.log.port import LogError
from chronolog.logging import configure_logging
from chronolog.projections.documents import (
    InvalidDefinition,
    ScheduleDefinition,
    camel_path,
    field_of,
    jsonable,
    to_spec,
)
from chronolog.projections.read_model import (
    MAX_PAGE,
    InvalidQuery,
    ReadModel,
    RunCursor,
    decode_run_cursor,
    decode_worker_cursor,
    parse_run_states,
    run_document,
    runs_page,
    schedule_document,
    schedule_summary,
    watermark,
    workers_page,
)
from chronolog.projections.workers import ever_served
from chronolog.settings import ConfigError, LogConfig, data_dir, open_log, parse_log_url
from chronolog.tenants import load_tenants

__all__ = ["build_definition", "register"]

DEFAULT_TIMEOUT = 15.0
_DURATION_FLAGS = (("lease", "lease"), ("start_deadline", "startDeadline"), ("jitter", "jitter"))
_TRIGGER_KEYS = ("cron", "every", "at", "delay", "anchor")


# =======================================================================================
# errors


def _usage(message: str) -> Exception:
    return UsageError(message)


class Failure(Exception):
    """A refused or undecidable operation: exit status 1, ``error: <status>: <message>``."""

    def __init__(self, status: str, message: str, field: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.extra = extra or {}

    def __str__(self) -> str:
        return f"error: {self.status}: {self.message}"


# =======================================================================================
# registration


def register(sub: Any) -> None:
    """Add ``schedule``, ``trigger``, ``cancel``, ``redrive``, ``runs`` and ``run``."""
    sched = sub.add_parser("schedule", help="create, revise, pause, resume, delete, list, show "
                           "schedules")
    ssub = sched.add_subparsers(dest="action", metavar="ACTION")
    ssub.required = True

    p = ssub.add_parser("create", help="create a schedule")
    p.add_argument("schedule_id", metavar="ID")
    _definition_flags(p)
    p.add_argument("--idempotency-key", default=None, metavar="K",
                   help="the same key and definition replays the first answer")
    _common(p, write=True)
    p.set_defaults(func=_command(_create))

    p = ssub.add_parser("revise", help="replace a schedule's definition (like PUT)")
    p.add_argument("schedule_id", metavar="ID")
    p.add_argument("--if-match", required=True, type=int, metavar="REV",
                   help="the revision being revised (a stale one is a conflict)")
    _definition_flags(p)
    _common(p, write=True)
    p.set_defaults(func=_command(_revise))

    for action, helptext in (("pause", "pause a schedule"), ("resume", "resume a schedule"),
                             ("delete", "delete a schedule")):
        p = ssub.add_parser(action, help=helptext)
        p.add_argument("schedule_id", metavar="ID")
        if action == "pause":
            p.add_argument("--reason", default="", help="recorded with the pause")
        _common(p, write=True)
        p.set_defaults(func=_command(_lifecycle), lifecycle=action)

    p = ssub.add_parser("list", help="list the tenant's schedules")
    p.add_argument("--state", default=None, type=str.upper,
                   choices=("ACTIVE", "PAUSED", "COMPLETED", "DELETED"), help="only this state")
    p.add_argument("--limit", type=int, default=500, help="at most N (default 500)")
    _common(p)
    p.set_defaults(func=_command(_list))

    p = ssub.add_parser("show", help="a schedule: definition, state, revision, next 5 instants")
    p.add_argument("schedule_id", metavar="ID")
    _common(p)
    p.set_defaults(func=_command(_show))

    p = sub.add_parser("trigger", help="run a schedule's job now (manual run)")
    p.add_argument("schedule_id", metavar="SCHEDULE_ID")
    p.add_argument("--idempotency-key", "--key", default=None, metavar="K",
                   help="the same key and params give the same run (default: a new key)")
    p.add_argument("--params", default=None, metavar="JSON", help="params for this run")
    _common(p, write=True)
    p.set_defaults(func=_command(_trigger))

    for name, helptext in (("cancel", "cancel a run (or request its cancellation)"),
                           ("redrive", "run a DEAD run again (same run ID)")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("run_id", metavar="RUN_ID")
        p.add_argument("--schedule", default=None, metavar="S",
                       help="the run's schedule (default: looked up in the read model)")
        if name == "cancel":
            p.add_argument("--reason", default="", help="recorded with the cancellation")
        _common(p, write=True)
        p.set_defaults(func=_command(_run_command), run_command=name)

    p = sub.add_parser("runs", help="a schedule's runs, newest first")
    p.add_argument("schedule_id", metavar="SCHEDULE_ID")
    p.add_argument("--limit", type=int, default=50, help="page size 1..500 (default 50)")
    p.add_argument("--state", default=None, metavar="S[,S]", help="only these run states")
    p.add_argument("--after", default=None, metavar="CURSOR",
                   help="the nextCursor of the previous page")
    _common(p)
    p.set_defaults(func=_command(_runs))

    p = sub.add_parser("run", help="a run with its attempts (fences), result and effects")
    p.add_argument("run_id", metavar="RUN_ID")
    _common(p)
    p.set_defaults(func=_command(_run))

    workers = sub.add_parser("workers", help="workers: their classes, job types, liveness")
    wsub = workers.add_subparsers(dest="action", metavar="ACTION")
    wsub.required = True
    p = wsub.add_parser("list", help="workers as they announced themselves, by worker ID")
    live = p.add_mutually_exclusive_group()
    live.add_argument("--live", dest="live", action="store_const", const=True, default=None,
                      help="only live workers")
    live.add_argument("--not-live", dest="live", action="store_const", const=False,
                      help="only workers that are not live (stopped or silent)")
    p.add_argument("--limit", type=int, default=100, help="page size 1..500 (default 100)")
    p.add_argument("--after", default=None, metavar="CURSOR",
                   help="the nextCursor of the previous page")
    _common(p)
    p.set_defaults(func=_command(_workers))


def _common(p: argparse.ArgumentParser, *, write: bool = False) -> None:
    add_log_flags(p)
    p.add_argument("--tenant", default=None,
                   help="tenant (default: the only one in the tenants file, else 'default')")
    p.add_argument("--tenants", default=None, help="tenants TOML (env CHRONOLOG_TENANTS)")
    p.add_argument("--json", action="store_true", help="machine output (the API's JSON)")
    if write:
        p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                       help=f"seconds to wait for the processor's reply (default "
                            f"{DEFAULT_TIMEOUT:g})")
    add_database_flag(p)  # every command accepts it (one set of flags); writes ignore it


def _definition_flags(p: argparse.ArgumentParser) -> None:
    rule = p.add_mutually_exclusive_group()
    rule.add_argument("--cron", default=None, metavar="EXPR", help="5-field cron or @daily")
    rule.add_argument("--every", default=None, metavar="DUR", help="interval: 90s, 15m, PT1H")
    rule.add_argument("--at", default=None, metavar="ISO", help="one-shot instant")
    p.add_argument("--tz", default=None, metavar="ZONE",
                   help="IANA zone of --cron and of naive --at/--anchor (default UTC)")
    p.add_argument("--anchor", default=None, metavar="ISO", help="alignment of --every")
    p.add_argument("--job", default=None, metavar="TYPE", help="job type")
    p.add_argument("--params", default=None, metavar="JSON", help="job params (a JSON object)")
    p.add_argument("--misfire", default=None, choices=("skip", "latest", "all"))
    p.add_argument("--overlap", default=None,
                   choices=("allow", "skip", "buffer_one", "buffer_all", "cancel_previous"))
    p.add_argument("--max-attempts", default=None, type=int, metavar="N")
    p.add_argument("--lease", default=None, metavar="DUR", help="lease of an attempt")
    p.add_argument("--start-deadline", default=None, metavar="DUR",
                   help="a run not started this long after its instant is skipped")
    p.add_argument("--jitter", default=None, metavar="DUR", help="deterministic start jitter")
    p.add_argument("--dst-ambiguous", default=None, choices=("first", "second", "both"))
    p.add_argument("--dst-nonexistent", default=None, choices=("shift_forward", "skip"))
    p.add_argument("--spec", default=None, metavar="FILE.json",
                   help="the API body as a file (flags given as well override its fields)")


# =======================================================================================
# the command wrapper: local validation, then the async work, then the exit status


@dataclass
class Ctx:
    """What every command resolves before it touches the log or the database."""

    args: Any
    log_cfg: LogConfig
    tenant: str
    allowed_jobs: frozenset[str] | None = None


Handler = Callable[[Ctx], Coroutine[Any, Any, int]]


def _command(prepare_and_run: Callable[[Ctx], Handler]) -> Callable[[Any], int]:
    """Wrap ``prepare_and_run`` (synchronous validation returning the async work)."""

    def run(args: Any) -> int:
        configure_logging()
        if not os.environ.get("CHRONOLOG_LOG_LEVEL"):
            # a failure is reported as one line; aiokafka's own connection errors would
            # duplicate it (CHRONOLOG_LOG_LEVEL=DEBUG shows them)
            logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        ctx = _context(args)
        work = prepare_and_run(ctx)  # UsageError here: exit 2 before anything is sent
        try:
            return asyncio.run(work(ctx))
        except Failure as exc:
            if args.json:
                body = {"error": exc.status, "field": exc.field, "message": exc.message,
                        **exc.extra}
                print(json.dumps(body))
            print(str(exc), file=sys.stderr)
            return 1

    return run


def _check_ids(args: Any) -> None:
    """A schedule or run ID argument matches the ID pattern (exactly as the API's routes)."""
    for attr, name, pattern, longest in (("schedule_id", "scheduleId", SCHEDULE_ID_PATTERN, 200),
                                          ("run_id", "runId", RUN_ID_PATTERN, 64)):
        value = getattr(args, attr, None)
        if value is not None and (len(value) > longest or not re.fullmatch(pattern, value)):
            shown = _short(value.encode("unicode_escape").decode())
            raise _usage(f"invalid {name} '{shown}': at most {longest} of A-Z a-z 0-9 "
                         + ("_ . : @ -, not only dots" if attr == "schedule_id" else "_ -"))


def _context(args: Any) -> Ctx:
    _check_ids(args)
    try:
        cfg = parse_log_url(args.log, args.data_dir, args.partitions, args.topic_prefix)
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    path = args.tenants or os.environ.get("CHRONOLOG_TENANTS")
    if not path:
        return Ctx(args, cfg, args.tenant or "default")
    try:
        tenants = load_tenants(path)
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    if args.tenant is None:
        if len(tenants.tenants) != 1:
            raise _usage(f"invalid tenant: --tenant is required ({path} has "
                         f"{', '.join(sorted(tenants.tenants))})")
        name = next(iter(tenants.tenants))
    elif args.tenant not in tenants.tenants:
        raise _usage(f"invalid tenant '{args.tenant}': not in {path}")
    else:
        name = args.tenant
    return Ctx(args, cfg, name, tenants.tenants[name].allowed_jobs)


# =======================================================================================
# definitions: flags (and --spec) -> API body -> ScheduleSpec, validated locally


def _json_object(text: str, name: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _usage(f"invalid {name} '{_short(text)}': not JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise _usage(f"invalid {name} '{_short(text)}': must be a JSON object")
    return value


def _short(text: str, n: int = 60) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= n else text[: n - 3] + "..."


def build_definition(args: Any, schedule_id: str) -> tuple[dict[str, Any], Any]:
    """The API body (camelCase, without ``scheduleId``) and its ``ScheduleSpec``.

    Raises ``UsageError`` with one line naming the field and value; the trigger is checked
    exactly as ``chronolog preview`` checks it (same messages)."""
    body: dict[str, Any] = {}
    if args.spec:
        try:
            text = Path(args.spec).read_text()
        except OSError as exc:
            raise _usage(f"invalid spec '{args.spec}': {exc.strerror or exc}") from None
        body = _json_object(text, "spec")
        sid = body.pop("scheduleId", None)
        if sid is not None and sid != schedule_id:
            raise _usage(f"invalid scheduleId '{sid}': the spec names another schedule than "
                         f"'{schedule_id}'")

    given = [n for n in ("cron", "every", "at") if getattr(args, n) is not None]
    if given:
        for key in _TRIGGER_KEYS:
            body.pop(key, None)
    elif not args.spec:
        raise _usage("invalid schedule: one of --cron, --every, --at (or --spec) is required")
    if args.anchor is not None and args.every is None and "every" not in body:
        raise _usage(f"invalid anchor '{args.anchor}': --anchor only applies to --every")

    tz = args.tz if args.tz is not None else body.get("timezone") or "UTC"
    try:
        resolve_zone(tz)
        if args.every is not None:
            now = datetime.now(UTC).replace(microsecond=0)
            anchor = parse_instant(args.anchor, tz, field="anchor") if args.anchor else None
            compile_trigger(every=args.every, anchor=anchor or now, timezone=tz)
            body["every"] = args.every
            if anchor is not None:
                body["anchor"] = _iso(anchor)
        elif args.anchor is not None:
            body["anchor"] = _iso(parse_instant(args.anchor, tz, field="anchor"))
        if args.cron is not None:
            compile_trigger(cron=args.cron, timezone=tz,
                            dst_ambiguous=args.dst_ambiguous or "first",
                            dst_nonexistent=args.dst_nonexistent or "shift_forward")
            body["cron"] = args.cron
        if args.at is not None:
            body["at"] = _iso(parse_instant(args.at, tz, field="at"))
    except RecurrenceError as exc:
        raise _usage(str(exc)) from None
    if args.tz is not None:
        body["timezone"] = args.tz

    if args.job is not None:
        job = dict(body.get("job") or {})
        job["type"] = args.job
        body["job"] = job
    if args.params is not None:
        job = dict(body.get("job") or {})
        job["params"] = _json_object(args.params, "params")
        body["job"] = job
    if "job" not in body:
        raise _usage("invalid job: --job TYPE is required")
    if args.misfire is not None:
        mis = body.get("misfire")
        body["misfire"] = ({**mis, "policy": args.misfire} if isinstance(mis, dict)
                           else args.misfire)
    if args.overlap is not None:
        body["overlap"] = args.overlap
    if args.max_attempts is not None:
        if args.max_attempts < 1:
            raise _usage(f"invalid retry.maxAttempts '{args.max_attempts}': must be >= 1")
        body["retry"] = {**(body.get("retry") or {}), "maxAttempts": args.max_attempts}
    for attr, key in _DURATION_FLAGS:
        value = getattr(args, attr)
        if value is None:
            continue
        try:
            parse_duration(value)
        except InvalidDuration as exc:
            raise _usage(f"invalid {key} '{value}': {exc.reason}") from None
        body[key] = value
    if args.dst_ambiguous is not None or args.dst_nonexistent is not None:
        dst = dict(body.get("dst") or {})
        if args.dst_ambiguous is not None:
            dst["ambiguous"] = args.dst_ambiguous
        if args.dst_nonexistent is not None:
            dst["nonexistent"] = args.dst_nonexistent
        body["dst"] = dst
    return body, _spec_of(body)


def _spec_of(body: dict[str, Any]) -> m.ScheduleSpec:
    """The API's own validation of a definition body (``to_spec``), as a usage error."""
    try:
        return to_spec(ScheduleDefinition.model_validate(body))
    except ValidationError as exc:
        err = exc.errors()[0]
        name = field_of(tuple(err.get("loc", ()))) or "spec"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        value = err.get("input")
        shown = "" if isinstance(value, (dict, list)) or value is None else f" '{value}'"
        raise _usage(f"invalid {name}{shown}: {msg}") from None
    except InvalidDefinition as exc:
        if exc.message.startswith("invalid "):
            raise _usage(exc.message) from None
        raise _usage(f"invalid {exc.field or 'spec'}: {exc.message}") from None


def _check_job(ctx: Ctx, spec: Any) -> None:
    if ctx.allowed_jobs is not None and spec.job.type not in ctx.allowed_jobs:
        raise Failure("forbidden", f"job type '{spec.job.type}' not allowed", "job.type")


# =======================================================================================
# the log and the database


@asynccontextmanager
async def _client(ctx: Ctx) -> AsyncIterator[Any]:
    """A started ``Client`` on the configured log (closed on exit)."""
    if (ctx.log_cfg.kind == "sqlite"
            and not Path(ctx.log_cfg.target).exists()):  # noqa: ASYNC240 - one local stat()
        raise _usage(f"invalid log 'sqlite://{ctx.log_cfg.target}': no such file (start "
                     f"`chronolog dev --data-dir DIR` or a processor first, or pass --log / "
                     f"--data-dir)")
    lg = open_log(ctx.log_cfg)
    try:
        try:
            await lg.start()
            client = Client(lg, principal=f"cli:{_user()}", reply_timeout=ctx.args.timeout)
            await client.start()
        except (TimeoutError, LogError, OSError) as exc:
            raise Failure("unavailable", _log_problem(ctx, exc)) from None
        try:
            yield client
        finally:
            await client.close()
    finally:
        await lg.close()


def _log_problem(ctx: Ctx, exc: BaseException) -> str:
    where = (f"sqlite://{ctx.log_cfg.target}" if ctx.log_cfg.kind == "sqlite"
             else f"kafka://{ctx.log_cfg.target}")
    text = str(exc) or type(exc).__name__
    hint = ""
    if "unknown topic" in text:
        hint = (f" (no chronolog topics with prefix '{ctx.log_cfg.topics.prefix}' there: is a "
                f"processor running on this log?)")
    return f"the log {where} is unavailable: {text}{hint}"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in a container
        return str(os.getuid())


async def _send(ctx: Ctx, schedule_id: str, payload: Any) -> dict[str, Any]:
    """Send one command; the ok body, or ``Failure`` (refused / timed out / no log)."""
    async with _client(ctx) as client:
        env = client.envelope(ctx.tenant, schedule_id, payload)
        try:
            reply = await client.send(env, ctx.args.timeout)
        except ReplyTimeout:
            again = ("read the resource, or retry with the same --idempotency-key"
                     if getattr(ctx.args, "idempotency_key", None) else "read the resource")
            raise Failure("unavailable", f"no reply from the processor within "
                          f"{ctx.args.timeout:g}s; the command may still be decided: {again} "
                          f"before retrying") from None
        except LogError as exc:
            raise Failure("unavailable", _log_problem(ctx, exc)) from None
    try:
        return raise_for(reply)
    except CommandError as exc:
        body = dict(exc.body)
        fld = body.pop("field", None)
        extra = {k: body[k] for k in ("revision", "state") if body.get(k) is not None}
        raise Failure(exc.reply.status, exc.reason or exc.reply.status,
                      camel_path(fld) if isinstance(fld, str) else None, extra) from None


@asynccontextmanager
async def _database(args: Any) -> AsyncIterator[str]:
    """The read model's DSN: the flag, the environment, or the data dir's embedded server."""
    url = args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
    if url:
        if not url.startswith(("postgresql://", "postgres://")):
            raise _usage(f"invalid database-url '{url}': expected postgresql://...")
        yield url
        return
    ddir = data_dir(args.data_dir)
    clusters = [ddir / "pg", ddir / "postgres"]  # chronolog dev / chronolog projector
    cluster = next((c for c in clusters if (c / "PG_VERSION").exists()), None)
    if cluster is None:
        raise _usage(f"invalid database-url: none given and no embedded PostgreSQL in "
                     f"{ddir}/pg or {ddir}/postgres (pass --database-url or set "
                     f"CHRONOLOG_DATABASE_URL)")
    pg = EmbeddedPostgres(cluster)
    try:
        if await asyncio.to_thread(pg.is_running):
            yield await asyncio.to_thread(pg.dsn)
            return
        print(f"note: starting the embedded PostgreSQL in {cluster} for this command (it is "
              f"stopped again on exit; without a running projector its data may be stale)",
              file=sys.stderr, flush=True)
        dsn = await asyncio.to_thread(pg.start)
    except EmbeddedPostgresError as exc:
        raise Failure("unavailable", f"the embedded PostgreSQL in {cluster}: {exc}") from None
    try:
        yield dsn
    finally:
        await asyncio.to_thread(pg.stop)


async def _job_warnings(ctx: Ctx, spec: Any) -> list[str]:
    """The API's warning when no worker of the schedule's class has ever served its job
    type; nothing when no read model is at hand without starting one."""
    url = ctx.args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
    if not url:
        ddir = data_dir(ctx.args.data_dir)
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
    return [f"no worker of resource class '{spec.resource_class}' has ever served job type "
            f"'{spec.job.type}': its runs will wait READY until one does"]


@asynccontextmanager
async def _read_model(ctx: Ctx) -> AsyncIterator[ReadModel]:
    """The read model on the configured database."""
    async with _database(ctx.args) as dsn:
        try:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, timeout=10)
        except Exception as exc:  # noqa: BLE001 - any connect failure is a configuration error
            raise _usage(f"invalid database-url: cannot connect ({exc})") from None
        assert pool is not None
        try:
            yield ReadModel(pool, ctx.log_cfg.topics.events)
        except asyncpg.UndefinedTableError:
            raise Failure("unavailable", "the database holds no chronolog read model (run "
                          "`chronolog projector` against it)") from None
        except (asyncpg.PostgresError, OSError) as exc:
            raise Failure("unavailable", f"the database: {exc}") from None
        finally:
            await pool.close()


async def _schedule_of_run(ctx: Ctx, run_id: str) -> str:
    if ctx.args.schedule:
        return str(ctx.args.schedule)
    async with _read_model(ctx) as rm:
        row = await rm.run(ctx.tenant, run_id)
    if row is None:
        raise Failure("not_found", f"no run '{run_id}' (in the read model; pass --schedule if "
                      f"it is not projected yet)", "runId")
    return str(row["schedule_id"])


# =======================================================================================
# output


def _iso(t: Any) -> str | None:
    if t is None:
        return None
    if isinstance(t, str):
        t = datetime.fromisoformat(t.replace("Z", "+00:00"))
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _print_json(data: Any) -> None:
    print(json.dumps(data))


def _console() -> Console:
    # a pipe gets wide lines rather than rich's 80-column default
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _t(value: str | None) -> str:
    """A UTC time for people: whole seconds (``2026-11-29T10:37:28Z``)."""
    if not value:
        return "-"
    return value.split(".", 1)[0].removesuffix("Z") + "Z"


def _table(title: str | None, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*["" if v is None else str(v) for v in r])
    return table


def _kv(pairs: list[tuple[str, Any]]) -> Table:
    table = Table(show_header=False, show_edge=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in pairs:
        table.add_row(k, "-" if v is None or v == "" else str(v))
    return table


# =======================================================================================
# commands


def _create(ctx: Ctx) -> Handler:
    _body, spec = build_definition(ctx.args, ctx.args.schedule_id)

    async def work(ctx: Ctx) -> int:
        _check_job(ctx, spec)
        out = await _send(ctx, ctx.args.schedule_id,
                          m.CreateSchedule(spec=spec, request_key=ctx.args.idempotency_key))
        result: dict[str, Any] = {"scheduleId": ctx.args.schedule_id,
                                  "revision": out["revision"],
                                  "nextRunAt": _iso(out.get("next_run_at"))}
        warnings = await _job_warnings(ctx, spec)
        if warnings:
            result["warnings"] = warnings
        if ctx.args.json:
            _print_json(result)
        else:
            print(f"created schedule {result['scheduleId']} (revision {result['revision']}); "
                  f"next run {result['nextRunAt'] or '-'}")
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        return 0

    return work


def _revise(ctx: Ctx) -> Handler:
    if ctx.args.if_match < 1:
        raise _usage(f"invalid If-Match '{ctx.args.if_match}': expected a revision >= 1")
    _body, spec = build_definition(ctx.args, ctx.args.schedule_id)

    async def work(ctx: Ctx) -> int:
        _check_job(ctx, spec)
        out = await _send(ctx, ctx.args.schedule_id,
                          m.ReviseSchedule(spec=spec, expected_revision=ctx.args.if_match))
        result = {"revision": out["revision"], "nextRunAt": _iso(out.get("next_run_at"))}
        if ctx.args.json:
            _print_json(result)
        else:
            print(f"revised schedule {ctx.args.schedule_id} (revision {result['revision']}); "
                  f"next run {result['nextRunAt'] or '-'}")
        return 0

    return work


def _lifecycle(ctx: Ctx) -> Handler:
    action = ctx.args.lifecycle
    commands: dict[str, Callable[[], Any]] = {
        "pause": lambda: m.PauseSchedule(reason=ctx.args.reason),
        "resume": m.ResumeSchedule, "delete": m.DeleteSchedule}
    payload = commands[action]()

    async def work(ctx: Ctx) -> int:
        out = await _send(ctx, ctx.args.schedule_id, payload)
        result = {"scheduleId": ctx.args.schedule_id, "revision": out["revision"],
                  "state": out["state"], "nextRunAt": _iso(out.get("next_run_at"))}
        if ctx.args.json:
            _print_json(result)
        else:
            done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}[action]
            nxt = f"; next run {result['nextRunAt']}" if result["state"] == "ACTIVE" and \
                result["nextRunAt"] else ""
            print(f"{done} schedule {result['scheduleId']}: {result['state']} (revision "
                  f"{result['revision']}){nxt}")
        return 0

    return work


def _trigger(ctx: Ctx) -> Handler:
    params = _json_object(ctx.args.params, "params") if ctx.args.params is not None else None
    key = ctx.args.idempotency_key or f"cli-{uuid.uuid4().hex}"
    if len(key) > 200:
        raise _usage(f"invalid Idempotency-Key '{_short(key)}': at most 200 characters")
    try:
        m.TriggerRun(request_key=key, params=params)  # the limits on params, before sending
    except ValidationError as exc:
        msg = str(exc.errors()[0].get("msg", "invalid")).removeprefix("Value error, ")
        raise _usage(f"invalid params: {msg}") from None

    async def work(ctx: Ctx) -> int:
        try:
            out = await _send(ctx, ctx.args.schedule_id, m.TriggerRun(request_key=key,
                                                                       params=params))
        except Failure as exc:
            if exc.status == "unavailable" and ctx.args.idempotency_key is None:
                exc.message += f" (this trigger's key: --idempotency-key {key})"
            raise
        result = {"runId": out["run_id"], "state": out["state"]}
        if ctx.args.json:
            _print_json(result)
        else:
            print(f"triggered run {result['runId']} of {ctx.args.schedule_id}: "
                  f"{result['state']}")
        return 0

    return work


def _run_command(ctx: Ctx) -> Handler:
    name = ctx.args.run_command
    run_id = ctx.args.run_id

    async def work(ctx: Ctx) -> int:
        schedule_id = await _schedule_of_run(ctx, run_id)
        if name == "cancel":
            out = await _send(ctx, schedule_id, m.CancelRun(run_id=run_id,
                                                            reason=ctx.args.reason))
            result: dict[str, Any] = {"runId": run_id, "state": out.get("state", ""),
                                      "outcome": out.get("outcome")}
            text = ("cancellation requested (the run is executing)"
                    if result["outcome"] == "requested" else "cancelled")
        else:
            out = await _send(ctx, schedule_id, m.RedriveRun(run_id=run_id))
            result = {"runId": run_id, "state": out.get("state", "READY"),
                      "attempt": out.get("attempt")}
            text = f"redriven: {result['state']} (attempt {result['attempt']})"
        if ctx.args.json:
            _print_json(result)
        else:
            print(f"run {run_id}: {text}")
        return 0

    return work


def _show(ctx: Ctx) -> Handler:
    async def work(ctx: Ctx) -> int:
        sid = ctx.args.schedule_id
        async with _read_model(ctx) as rm:
            row = await rm.schedule(ctx.tenant, sid)
            if row is None:
                raise Failure("not_found", f"no schedule '{sid}'", "scheduleId")
            doc = await schedule_document(rm, row, datetime.now(UTC))
        if ctx.args.json:
            _print_json(doc)
            return 0
        d = doc["definition"]
        con = _console()
        con.print(_kv([
            ("schedule", doc["scheduleId"]), ("state", doc["state"]),
            ("revision", doc["revision"]), ("rule", _rule_text(d)),
            ("job", f"{d['job']['type']} {json.dumps(d['job'].get('params') or {})}"),
            ("misfire", _policy_text(d.get("misfire"))), ("overlap", d.get("overlap")),
            ("retry", json.dumps(d.get("retry")) if d.get("retry") else None),
            ("lease", d.get("lease")), ("startDeadline", d.get("startDeadline")),
            ("jitter", d.get("jitter")), ("nextRunAt", _t(doc["nextRunAt"])),
            ("created / updated", f"{_t(doc['createdAt'])} / {_t(doc['updatedAt'])}"),
        ] + ([("paused", f"{_t(doc['pausedAt'])} {doc['pauseReason'] or ''}".strip())]
             if doc["pausedAt"] else [])
          + ([("completed", f"{_t(doc['completedAt'])} ({doc['completedReason']})")]
             if doc["completedAt"] else [])))
        if doc["resume"] is not None and doc["resume"]["instants"]:
            con.print(_table("a resume now would", ["scheduledAt", "through", "count", "action"],
                             [[_t(i["scheduledAt"]), _t(i["through"]) if i["through"] else "",
                               i["count"], i["action"] + (f" ({i['reason']})" if i["reason"]
                                                          else "")]
                              for i in doc["resume"]["instants"]]))
        if doc["preview"]:
            con.print(_table("next instants", ["#", "scheduledAt", "dueAt", "local"],
                             [[i, _t(p["scheduledAt"]), _t(p["dueAt"]), p["local"]]
                              for i, p in enumerate(doc["preview"], 1)]))
        else:
            con.print(f"no upcoming instants ({doc['state']})")
        return 0

    return work


def _rule_text(d: dict[str, Any]) -> str:
    if "cron" in d:
        return f"cron '{d['cron']}' {d.get('timezone', 'UTC')}"
    if "every" in d:
        return f"every {d['every']:g}s" + (f" anchor {d['anchor']}" if d.get("anchor") else "")
    if "at" in d:
        return f"at {d['at']}"
    if "delay" in d:
        return f"delay {d['delay']:g}s"
    return "-"


def _policy_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("policy"))
    return None if value is None else str(value)


def _list(ctx: Ctx) -> Handler:
    if not 1 <= ctx.args.limit <= 10_000:
        raise _usage(f"invalid limit '{ctx.args.limit}': must be 1..10000")

    async def work(ctx: Ctx) -> int:
        async with _read_model(ctx) as rm:
            offsets, wm_time = await rm.offsets()
            rows = await rm.schedules(ctx.tenant, ctx.args.state, ctx.args.limit)
        items = [schedule_summary(r) for r in rows]
        doc = {"items": items, "watermark": jsonable(
            watermark(offsets, wm_time, ctx.log_cfg.topics.partitions))}
        if ctx.args.json:
            _print_json(doc)
            return 0
        if not items:
            print("no schedules" + (f" in state {ctx.args.state}" if ctx.args.state else ""))
            return 0
        _console().print(_table(None, ["schedule", "state", "rev", "rule", "job", "nextRunAt"],
                                [[i["scheduleId"], i["state"], i["revision"],
                                  _rule_text(i["definition"]), i["definition"]["job"]["type"],
                                  _t(i["nextRunAt"])] for i in items]))
        return 0

    return work


def _runs(ctx: Ctx) -> Handler:
    args = ctx.args
    if not 1 <= args.limit <= MAX_PAGE:
        raise _usage(f"invalid limit '{args.limit}': must be 1..{MAX_PAGE}")
    cursor: RunCursor | None = None
    try:
        states = parse_run_states(args.state)
        if args.after:
            cursor = decode_run_cursor(args.after, args.schedule_id, states)
    except InvalidQuery as exc:
        raise _usage(exc.message) from None

    async def work(ctx: Ctx) -> int:
        sid = args.schedule_id
        async with _read_model(ctx) as rm:
            if await rm.schedule(ctx.tenant, sid) is None:
                raise Failure("not_found", f"no schedule '{sid}'", "scheduleId")
            page = await runs_page(rm, ctx.tenant, sid, states=states, after=cursor,
                                   limit=args.limit, partitions=ctx.log_cfg.topics.partitions)
        doc: dict[str, Any] = jsonable(page)
        dumped: list[dict[str, Any]] = doc["items"]
        next_cursor = doc["nextCursor"]
        if args.json:
            _print_json(doc)
            return 0
        con = _console()
        if not dumped:
            con.print(f"no runs of {sid}" + (f" in state {args.state}" if states else ""))
        else:
            waits = any(i["waiting"] for i in dumped)
            con.print(_table(None, ["runId", "scheduledAt", "state", "attempt", "startedAt",
                                    "finishedAt", *(["waiting"] if waits else [])],
                             [[i["runId"], _t(i["scheduledAt"]), i["state"], i["attempt"],
                               _t(i["startedAt"]), _t(i["finishedAt"]),
                               *([i["waiting"] or ""] if waits else [])]
                              for i in dumped]))
        if next_cursor:
            con.print(f"more: --after {next_cursor}", soft_wrap=True)
        return 0

    return work


def _run(ctx: Ctx) -> Handler:
    async def work(ctx: Ctx) -> int:
        run_id = ctx.args.run_id
        async with _read_model(ctx) as rm:
            doc = await run_document(rm, ctx.tenant, run_id)
        if doc is None:
            raise Failure("not_found", f"no run '{run_id}'", "runId")
        if ctx.args.json:
            _print_json(doc)
            return 0
        con = _console()
        pairs: list[tuple[str, Any]] = [
            ("run", doc["runId"]), ("schedule", f"{doc['scheduleId']} (revision "
                                                f"{doc['revision']})"),
            ("trigger", doc["trigger"] + (f" key {doc['requestKey']}" if doc["requestKey"]
                                          else "")),
            ("state", doc["state"]), ("job", f"{doc['jobType']} {json.dumps(doc['params'])}"),
            ("scheduledAt", doc["scheduledAt"]), ("dueAt", doc["dueAt"]),
            ("startedAt", doc["startedAt"]), ("finishedAt", doc["finishedAt"]),
            ("lateness", None if doc["latenessMs"] is None else f"{doc['latenessMs']} ms"),
        ]
        for key in ("waiting", "skippedReason", "cancelReason", "deadReason", "deadMessage",
                    "lastError"):
            if doc.get(key):
                pairs.append((key, doc[key]))
        if doc["cancellationRequested"]:
            pairs.append(("cancellation", "requested"))
        res = doc["result"]
        if res is not None:
            where = res.get("uri") or _short(json.dumps(res.get("inline")), 100)
            pairs.append(("result", f"{where} ({res['size']} bytes, checksum "
                                    f"{res['checksum']}, attempt {res.get('attempt')})"))
        con.print(_kv(pairs))
        if doc["attempts"]:
            con.print(_table("attempts", ["#", "fence", "worker", "claimedAt", "leaseUntil",
                                          "outcome", "error"],
                             [[a["attempt"], a["fence"], a["workerId"], _t(a["claimedAt"]),
                               _t(a["leaseUntil"]), a["outcome"] or "(running)",
                               a["error"] or ""] for a in doc["attempts"]]))
        if doc["effects"]:
            con.print(_table("effects", ["effectId", "kind", "state", "attempts"],
                             [[e["effectId"], e["kind"], e["state"], e["attempts"]]
                              for e in doc["effects"]]))
        return 0

    return work


def _workers(ctx: Ctx) -> Handler:
    args = ctx.args
    if not 1 <= args.limit <= MAX_PAGE:
        raise _usage(f"invalid limit '{args.limit}': must be 1..{MAX_PAGE}")
    last: str | None = None
    if args.after:
        try:
            last = decode_worker_cursor(args.after, args.live)
        except InvalidQuery as exc:
            raise _usage(exc.message) from None

    async def work(ctx: Ctx) -> int:
        async with _read_model(ctx) as rm:
            page = await workers_page(rm.pool, after=last, limit=args.limit, live=args.live,
                                      allowed=None)
        doc: dict[str, Any] = jsonable(page)
        if args.json:
            _print_json(doc)
            return 0
        con = _console()
        if not doc["items"]:
            con.print("no workers" + ("" if args.live is None else
                                      " live" if args.live else " that are not live"))
        else:
            con.print(_table(None, ["workerId", "live", "class", "jobTypes", "slots",
                                    "lastSeen", "startedAt"],
                             [[w["workerId"], "yes" if w["live"] else
                               ("stopped" if w["stopped"] else "no"), c["resourceClass"],
                               ",".join(c["jobTypes"]) or "-", c["slots"], _t(w["lastSeen"]),
                               _t(w["startedAt"])]
                              for w in doc["items"] for c in w["classes"]]))
        if doc["nextCursor"]:
            con.print(f"more: --after {doc['nextCursor']}", soft_wrap=True)
        return 0

    return work
