"""The user CLI: schedules, runs and their history, through a node's HTTP API — or, for
operators, straight on the log.

    chronolog schedule create ID (--cron EXPR [--tz ZONE] | --every DUR [--anchor ISO] | --at ISO
                                  | --delay DUR) [--start ISO] [--end ISO] [--max-count N]
                              --job TYPE [--params JSON] [--job-timeout DUR]
                              [--misfire skip|latest|all] [--misfire-grace DUR]
                              [--misfire-max-catchup N] [--misfire-max-age DUR]
                              [--overlap allow|skip|buffer_one|buffer_all|cancel_previous]
                              [--max-attempts N] [--retry-initial-backoff DUR]
                              [--retry-max-backoff DUR] [--retry-multiplier X]
                              [--retry-max-age DUR] [--lease DUR] [--start-deadline DUR]
                              [--jitter DUR] [--dst-ambiguous first|second|both]
                              [--dst-nonexistent shift_forward|skip] [--resource-class C]
                              [--priority N] [--concurrency-key KEY --concurrency-limit N]
                              [--exclude CALENDAR[,CALENDAR]]... [--label KEY=VALUE]...
                              [--effects JSON] [--idempotency-key K] [--spec FILE.json]
    chronolog schedule revise ID --if-match REV [the same definition flags]
    chronolog schedule revise ID --if-match REV --spec FILE.json [flags]
    chronolog schedule pause|resume|delete ID
    chronolog schedule list [--state S[,S]] [--job-type T] [--resource-class C] [--prefix P]
                            [--limit N] [--after CURSOR]
    chronolog schedule show ID
    chronolog calendar put NAME [--file FILE.json] [--timezone ZONE] [--date DAY]...
                               [--range FROM..TO]... [--window 'DAYS HH:MM-HH:MM [ZONE]']...
                               [--if-match REV]
    chronolog calendar show NAME
    chronolog calendar list [--limit N] [--after NAME]
    chronolog calendar delete NAME [--if-match REV]
    chronolog trigger SCHEDULE_ID [--idempotency-key K] [--params JSON]
    chronolog cancel RUN_ID [--reason TEXT]
    chronolog redrive RUN_ID
    chronolog runs [SCHEDULE_ID] [--state S[,S]] [--job-type T] [--from ISO] [--to ISO]
                   [--limit N] [--after CURSOR]
    chronolog run RUN_ID
    chronolog workers list [--live | --not-live] [--limit N] [--after CURSOR]

Where a command goes (``chronolog.cli.transport``; a flag wins over its variable):

* ``--url URL --token TOKEN`` (env ``CHRONOLOG_URL``, ``CHRONOLOG_TOKEN``): that node's
  HTTP API (``chronolog.cli.http``). The token names the tenant.
* neither: the dev node recorded in the data directory (``--data-dir DIR``, env
  ``CHRONOLOG_DATA_DIR``, default ``./.chronolog``): ``chronolog dev`` writes its URL and
  token to ``DIR/node.json`` while it serves. None there (or a stale one), or one that does
  not answer: exit status 2 with one line saying how to point the CLI at a node.
* ``--log URL`` (env ``CHRONOLOG_LOG`` when no URL is set), for operators: direct access
  (``chronolog.cli.direct``) — commands to the log through ``chronolog.client.Client``,
  waiting (``--timeout``) for the processor's reply, reads from the PostgreSQL read model
  (``--database-url`` / ``CHRONOLOG_DATABASE_URL``, else the data directory's embedded
  PostgreSQL, started for the command when it is not running). With it come
  ``--partitions``, ``--topic-prefix``, ``--tenant`` (default: the only tenant of the
  tenants file, else ``default``) and ``--tenants FILE`` (env ``CHRONOLOG_TENANTS``: the
  tenant must exist in it and its job types are checked locally, as the API does); given
  without ``--log`` they are bad input. Direct access cannot answer ``runs`` across
  schedules or by job type or time, nor ``schedule list`` by job type, resource class,
  prefix or cursor (exit status 2, ``error: ... need(s) the API (--url)``); its ``schedule
  list`` is one query: every state unless ``--state`` (the API: all but DELETED), up to
  ``--limit`` 10,000, no ``nextCursor``.

``schedule revise`` changes only what its flags give: they become a JSON merge patch of the
definition (``definition_patch``; a rule flag nulls the other rules, as they exclude each
other), sent as ``PATCH /v1/schedules/{id}`` — or, with ``--log``, applied to the definition
the read model holds at the ``--if-match`` revision (waiting for it, bounded by
``--timeout``) and sent as the whole revised spec, with the same revision check. ``--spec``
is a whole definition instead, a replacement (``PUT``). A naive time on revise needs
``--tz``: the schedule's zone is not known before the merge.

Both ways answer the HTTP API's bodies (camelCase), so ``--json`` prints the same document:
create ``{scheduleId, revision, nextRunAt[, warnings]}``; revise ``{revision, nextRunAt}``;
pause/resume/delete ``{scheduleId, revision, state, nextRunAt}``; trigger ``{runId, state}``;
cancel and redrive ``{runId, state, outcome, attempt}``; show =
``GET /v1/schedules/{id}``; list = ``GET /v1/schedules``; runs = ``GET
/v1/schedules/{id}/runs`` (with an ID and no job-type or time filter), else ``GET /v1/runs``;
run = ``GET /v1/runs/{id}``; workers list = ``GET /v1/workers``.

Exit status
    0   done.
    1   the command was refused or could not be decided: one line on stderr
        ``error: <status>: <reason>`` where status is the API's (or the processor's) word
        (``invalid``, ``unauthorized``, ``forbidden``, ``not_found``, ``conflict``,
        ``quota``, ``stale_fence``, ...) or ``unavailable`` (no connection, a 503, no answer
        within the bound — a write may still be decided —, the log or the database
        unreachable). A 401 says whether the token was missing or wrong. With ``--json``
        the API's error body ``{"error", "field", "message", ...}`` is also printed on
        stdout.
    2   bad local input or configuration (validated before anything is sent): one line
        naming the field and value, the same messages as ``chronolog preview``; no node to
        talk to.

``schedule create`` also says ``warning: ...`` on stderr (exit 0; ``warnings`` in ``--json``)
when no worker of the schedule's resource class has ever served its job type (the API's
warning; with ``--log``, checked only when a database is given or the data directory's
embedded PostgreSQL is running). ``workers list`` with an operator token (or ``--log``) shows
every job type; ``runs`` and ``run`` show why a READY run waits (``waiting``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chronolog.cli import render
from chronolog.cli.errors import Failure, UsageError
from chronolog.cli.flags import add_api_flags, add_database_flag, add_log_flags
from chronolog.cli.transport import (
    Ctx,
    RunsQuery,
    SchedulesQuery,
    Target,
    Transport,
    WorkersQuery,
    select_target,
    wants_direct,
)
from chronolog.domain import messages as m
from chronolog.domain.calendars import CALENDAR_NAME_PATTERN, WEEKDAYS, CalendarSpec
from chronolog.domain.durations import InvalidDuration, parse_duration
from chronolog.domain.limits import id_problem
from chronolog.domain.merge_patch import merge_patch
from chronolog.domain.recurrence import (
    RecurrenceError,
    compile_trigger,
    parse_instant,
    resolve_zone,
)
from chronolog.queries.documents import (
    InvalidDefinition,
    ScheduleDefinition,
    field_of,
    plain_message,
    to_spec,
)
from chronolog.queries.read_model import (
    MAX_PAGE,
    SCHEDULE_STATES,
    SCHEDULES_LISTED,
    InvalidQuery,
    RunQuery,
    ScheduleQuery,
    decode_run_cursor,
    decode_run_list_cursor,
    decode_schedule_cursor,
    decode_worker_cursor,
    parse_run_states,
    parse_schedule_states,
)
from chronolog.settings import ConfigError, parse_log_url
from chronolog.tenants import load_tenants

__all__ = [
    "DefinitionError",
    "Work",
    "add_common_flags",
    "as_command",
    "build_definition",
    "calendar_body",
    "calendar_name",
    "calendar_spec",
    "definition_patch",
    "definition_spec",
    "print_json",
    "register",
    "revise_patch",
]

DEFAULT_TIMEOUT = 15.0
DIRECT_LIST_LIMIT = 10_000  # schedule list with --log: one query, no cursor
_RULES = ("cron", "every", "at", "delay")
_TRIGGER_KEYS = (*_RULES, "anchor")
_RESOURCE_CLASS = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _usage(message: str) -> Exception:
    return UsageError(message)


# =======================================================================================
# registration


def register(sub: Any) -> None:
    """Add ``schedule``, ``trigger``, ``cancel``, ``redrive``, ``runs``, ``run`` and
    ``workers``."""
    sched = sub.add_parser("schedule", help="create, revise, pause, resume, delete, list, show "
                           "schedules")
    ssub = sched.add_subparsers(dest="action", metavar="ACTION")
    ssub.required = True

    p = ssub.add_parser("create", help="create a schedule")
    p.add_argument("schedule_id", metavar="ID")
    _definition_flags(p)
    p.add_argument("--idempotency-key", default=None, metavar="K",
                   help="the same key and definition replays the first answer")
    add_common_flags(p, write=True)
    p.set_defaults(func=as_command(_create))

    p = ssub.add_parser(
        "revise", help="change a schedule's definition: only the fields whose flags are given",
        description="Change only what is passed: each flag given replaces that field of the "
        "current definition and everything else stays (a JSON merge patch, PATCH "
        "/v1/schedules/ID). --cron, --every, --at and --delay exclude each other: one of them "
        "replaces the rule whole. --params is merged into the current params (a key set to "
        "null is removed). --spec FILE instead REPLACES the whole definition (PUT).")
    p.add_argument("schedule_id", metavar="ID")
    p.add_argument("--if-match", required=True, type=int, metavar="REV",
                   help="the revision being revised (a stale one is a conflict)")
    _definition_flags(p, revise=True)
    add_common_flags(p, write=True)
    p.set_defaults(func=as_command(_revise))

    for action, helptext in (("pause", "pause a schedule"), ("resume", "resume a schedule"),
                             ("delete", "delete a schedule")):
        p = ssub.add_parser(action, help=helptext)
        p.add_argument("schedule_id", metavar="ID")
        if action == "pause":
            p.add_argument("--reason", default="",
                           help="recorded with the pause (with --log only: the HTTP API "
                                "records none)")
        add_common_flags(p, write=True)
        p.set_defaults(func=as_command(_lifecycle), lifecycle=action)

    p = ssub.add_parser("list", help="the tenant's schedules, by ID")
    p.add_argument("--state", default=None, metavar="S[,S]",
                   help=f"only these states ({', '.join(SCHEDULE_STATES)}; default: all but "
                        f"DELETED, with --log: all)")
    p.add_argument("--job-type", default=None, metavar="T", help="only this job type")
    p.add_argument("--resource-class", default=None, metavar="C",
                   help="only this resource class")
    p.add_argument("--prefix", default=None, metavar="P",
                   help="only IDs starting with P (literally)")
    p.add_argument("--limit", type=int, default=None,
                   help=f"page size 1..{MAX_PAGE}, default 100 (with --log: at most N, "
                        f"1..{DIRECT_LIST_LIMIT}, default 500)")
    p.add_argument("--after", default=None, metavar="CURSOR",
                   help="the nextCursor of the previous page")
    add_common_flags(p)
    p.set_defaults(func=as_command(_list))

    p = ssub.add_parser("backfill", help="run the schedule's instants of a past range")
    p.add_argument("schedule_id", metavar="ID")
    p.add_argument("--from", dest="start", required=True, metavar="ISO",
                   help="the first instant that may run (inclusive; a time without an offset "
                        "is UTC)")
    p.add_argument("--to", dest="end", required=True, metavar="ISO",
                   help="the end of the range (exclusive), not after now")
    p.add_argument("--overlap", default="buffer_all", choices=("buffer_all", "allow"),
                   help="buffer_all: one run after another, oldest first (default); allow: "
                        "side by side")
    p.add_argument("--idempotency-key", "--key", default=None, metavar="K",
                   help="the same key and range give the same backfill (default: one made "
                        "of the range, so the same command twice backfills once)")
    add_common_flags(p, write=True)
    p.set_defaults(func=as_command(_backfill))

    p = ssub.add_parser("show", help="a schedule: definition, state, revision, next 5 instants")
    p.add_argument("schedule_id", metavar="ID")
    add_common_flags(p)
    p.set_defaults(func=as_command(_show))

    _register_calendars(sub)

    p = sub.add_parser("trigger", help="run a schedule's job now (manual run)")
    p.add_argument("schedule_id", metavar="SCHEDULE_ID")
    p.add_argument("--idempotency-key", "--key", default=None, metavar="K",
                   help="the same key and params give the same run (default: a new key)")
    p.add_argument("--params", default=None, metavar="JSON", help="params for this run")
    add_common_flags(p, write=True)
    p.set_defaults(func=as_command(_trigger))

    for name, helptext in (("cancel", "cancel a run (or request its cancellation)"),
                           ("redrive", "run a DEAD run again (same run ID)")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("run_id", metavar="RUN_ID")
        p.add_argument("--schedule", default=None, metavar="S",
                       help="the run's schedule, with --log (default: looked up in the read "
                            "model; the HTTP API looks it up itself)")
        if name == "cancel":
            p.add_argument("--reason", default="", help="recorded with the cancellation")
        add_common_flags(p, write=True)
        p.set_defaults(func=as_command(_run_command), run_command=name)

    p = sub.add_parser("runs", help="runs, newest first: a schedule's, or across schedules")
    p.add_argument("schedule_id", metavar="SCHEDULE_ID", nargs="?", default=None,
                   help="only this schedule's runs (without it: every schedule's, through "
                        "the API)")
    p.add_argument("--state", default=None, metavar="S[,S]", help="only these run states")
    p.add_argument("--job-type", default=None, metavar="T", help="only this job type")
    p.add_argument("--from", dest="start", default=None, metavar="ISO",
                   help="only runs scheduled at or after this instant")
    p.add_argument("--to", dest="end", default=None, metavar="ISO",
                   help="only runs scheduled before this instant")
    p.add_argument("--limit", type=int, default=None,
                   help=f"page size 1..{MAX_PAGE} (default: a schedule's own list 50, "
                        f"else 100)")
    p.add_argument("--after", default=None, metavar="CURSOR",
                   help="the nextCursor of the previous page")
    add_common_flags(p)
    p.set_defaults(func=as_command(_runs))

    p = sub.add_parser("run", help="a run with its attempts (fences), result and effects")
    p.add_argument("run_id", metavar="RUN_ID")
    add_common_flags(p)
    p.set_defaults(func=as_command(_run))

    workers = sub.add_parser("workers", help="workers: their classes, job types, liveness")
    wsub = workers.add_subparsers(dest="action", metavar="ACTION")
    wsub.required = True
    p = wsub.add_parser("list", help="workers as they announced themselves, by worker ID")
    live = p.add_mutually_exclusive_group()
    live.add_argument("--live", dest="live", action="store_const", const=True, default=None,
                      help="only live workers")
    live.add_argument("--not-live", dest="live", action="store_const", const=False,
                      help="only workers that are not live (stopped or silent)")
    p.add_argument("--limit", type=int, default=None,
                   help=f"page size 1..{MAX_PAGE} (default 100)")
    p.add_argument("--after", default=None, metavar="CURSOR",
                   help="the nextCursor of the previous page")
    add_common_flags(p)
    p.set_defaults(func=as_command(_workers))


def add_common_flags(p: argparse.ArgumentParser, *, write: bool = False) -> None:
    """The flags every user command has: where it goes (``--url``/``--token``, the dev node of
    ``--data-dir``, or ``--log`` and its flags), ``--json``, and for a write ``--timeout``."""
    add_api_flags(p)
    add_log_flags(p, data_dir_help="the data directory: where a dev node is found (its "
                  "node.json), and with --log the embedded log's and PostgreSQL's (env "
                  "CHRONOLOG_DATA_DIR, default ./.chronolog)")
    p.add_argument("--tenant", default=None,
                   help="with --log: the tenant (default: the only one in the tenants file, "
                        "else 'default')")
    p.add_argument("--tenants", default=None,
                   help="with --log: tenants TOML (env CHRONOLOG_TENANTS)")
    p.add_argument("--json", action="store_true", help="machine output (the API's JSON)")
    if write:
        p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                       help=f"seconds to wait for the answer (default {DEFAULT_TIMEOUT:g})")
    add_database_flag(p)  # with --log: every command accepts it (one set of flags)


def _definition_flags(p: argparse.ArgumentParser, *, revise: bool = False) -> None:
    rule = p.add_mutually_exclusive_group()
    rule.add_argument("--cron", default=None, metavar="EXPR", help="5-field cron or @daily")
    rule.add_argument("--every", default=None, metavar="DUR", help="interval: 90s, 15m, PT1H")
    rule.add_argument("--at", default=None, metavar="ISO", help="one-shot instant")
    rule.add_argument("--delay", default=None, metavar="DUR",
                      help="fixed delay after each run finishes")
    p.add_argument("--tz", default=None, metavar="ZONE",
                   help="IANA zone of --cron and of naive --at/--anchor/--start/--end (default "
                        + ("UTC; on revise a naive time needs --tz)" if revise else "UTC)"))
    p.add_argument("--anchor", default=None, metavar="ISO", help="alignment of --every")
    p.add_argument("--start", default=None, metavar="ISO", help="no instant before this one")
    p.add_argument("--end", default=None, metavar="ISO", help="no instant at or after this one")
    p.add_argument("--max-count", default=None, type=int, metavar="N",
                   help="at most N scheduled runs")
    p.add_argument("--job", default=None, metavar="TYPE", help="job type")
    p.add_argument("--params", default=None, metavar="JSON",
                   help="job params (a JSON object)" + (
                       ", merged into the current ones (a key set to null is removed)"
                       if revise else ""))
    p.add_argument("--job-timeout", default=None, metavar="DUR", help="a run's time limit")
    p.add_argument("--misfire", default=None, choices=("skip", "latest", "all"))
    p.add_argument("--misfire-grace", default=None, metavar="DUR",
                   help="a late instant within this is on time")
    p.add_argument("--misfire-max-catchup", default=None, type=int, metavar="N",
                   help="with --misfire all: at most N instants of a backlog run")
    p.add_argument("--misfire-max-age", default=None, metavar="DUR",
                   help="an instant older than this never runs late")
    p.add_argument("--overlap", default=None,
                   choices=("allow", "skip", "buffer_one", "buffer_all", "cancel_previous"))
    p.add_argument("--max-attempts", default=None, type=int, metavar="N",
                   help="attempts of a run, the first included")
    p.add_argument("--retry-initial-backoff", default=None, metavar="DUR",
                   help="wait before the first retry")
    p.add_argument("--retry-max-backoff", default=None, metavar="DUR",
                   help="longest wait between retries")
    p.add_argument("--retry-multiplier", default=None, type=float, metavar="X",
                   help="backoff growth per retry (1..10)")
    p.add_argument("--retry-max-age", default=None, metavar="DUR",
                   help="no retry this long after the instant")
    p.add_argument("--lease", default=None, metavar="DUR", help="lease of an attempt")
    p.add_argument("--start-deadline", default=None, metavar="DUR",
                   help="a run not started this long after its instant is skipped")
    p.add_argument("--jitter", default=None, metavar="DUR", help="deterministic start jitter")
    p.add_argument("--dst-ambiguous", default=None, choices=("first", "second", "both"))
    p.add_argument("--dst-nonexistent", default=None, choices=("shift_forward", "skip"))
    p.add_argument("--resource-class", default=None, metavar="C",
                   help="the workers that run it (default 'default')")
    p.add_argument("--priority", default=None, type=int, metavar="N",
                   help="-100..100, higher first (default 0)")
    p.add_argument("--concurrency-key", default=None, metavar="KEY",
                   help="at most --concurrency-limit runs with this key LEASED at once, "
                   "across every worker: a constant, or a template over the job's params "
                   "(customer-{customer_id})")
    p.add_argument("--concurrency-limit", default=None, type=int, metavar="N",
                   help="how many runs with the key may be LEASED at once (1..100000)")
    p.add_argument("--exclude", default=None, action="append", metavar="NAME[,NAME]",
                   help="skip the instants these calendars of the tenant exclude (repeatable; "
                   "in this order)" + (": replaces the current list, '' removes them"
                                       if revise else ""))
    p.add_argument("--label", default=None, action="append", metavar="KEY=VALUE",
                   help="a label, kept for the tools that manage the schedule (repeatable)"
                   + ("; merged into the current ones, KEY- removes one" if revise else ""))
    p.add_argument("--effects", default=None, metavar="JSON",
                   help="the effects, a JSON array of {kind, destination, ...}" + (
                       " (replaces the current list; [] removes them)" if revise else ""))
    p.add_argument("--spec", default=None, metavar="FILE.json",
                   help=("the whole definition as a file, the API's PUT body: it REPLACES the "
                         "current one (flags given as well override its fields)") if revise
                   else "the API body as a file (flags given as well override its fields)")


def _register_calendars(sub: Any) -> None:
    """``calendar put|show|list|delete``: the tenant's exclusion calendars."""
    cal = sub.add_parser("calendar", help="put, show, list, delete the tenant's exclusion "
                         "calendars")
    csub = cal.add_subparsers(dest="action", metavar="ACTION")
    csub.required = True
    p = csub.add_parser(
        "put", help="create a calendar, or revise it (--if-match REV)",
        description="The calendar is --file's JSON (the API's PUT body) with the flags' "
        "entries added: --date DAY, --range FROM..TO and --window 'DAYS HH:MM-HH:MM [ZONE]' "
        "may each be given several times. Without --if-match it must not exist yet (or hold "
        "this very definition); with it, that revision is revised.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--file", default=None, metavar="FILE.json",
                   help="the calendar as a file: {timezone, dates, ranges, windows}")
    p.add_argument("--timezone", "--tz", default=None, metavar="ZONE",
                   help="the IANA zone its entries are read in (default UTC)")
    p.add_argument("--date", action="append", default=None, metavar="DAY[,DAY]",
                   help="a whole local day excluded: 2026-12-25")
    p.add_argument("--range", action="append", default=None, metavar="FROM..TO",
                   help="whole local days excluded, both included: 2026-12-24..2026-12-26")
    p.add_argument("--window", action="append", default=None, metavar="'DAYS HH:MM-HH:MM'",
                   help="a recurring local-time window: 'sat,sun 22:00-06:00', "
                   "'mon-fri 12:00-13:00 Europe/Paris', '02:00-03:00' (every day)")
    p.add_argument("--if-match", type=int, default=None, metavar="REV",
                   help="revise this revision (a stale one is a conflict)")
    add_common_flags(p, write=True)
    p.set_defaults(func=as_command(_calendar_put))
    p = csub.add_parser("show", help="a calendar: its entries, revision, the schedules "
                        "naming it")
    p.add_argument("name", metavar="NAME")
    add_common_flags(p)
    p.set_defaults(func=as_command(_calendar_show))
    p = csub.add_parser("list", help="the tenant's calendars, by name")
    p.add_argument("--limit", type=int, default=None, help=f"page size 1..{MAX_PAGE}, "
                   "default 100")
    p.add_argument("--after", default=None, metavar="NAME", help="the nextCursor of the "
                   "previous page")
    add_common_flags(p)
    p.set_defaults(func=as_command(_calendar_list))
    p = csub.add_parser("delete", help="delete a calendar no schedule names")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--if-match", type=int, default=None, metavar="REV",
                   help="delete only at this revision")
    add_common_flags(p, write=True)
    p.set_defaults(func=as_command(_calendar_delete))


# =======================================================================================
# the command wrapper: local validation, then the transport, then the exit status


Work = Callable[[Transport], Coroutine[Any, Any, int]]


def as_command(prepare: Callable[[Ctx], Work]) -> Callable[[Any], int]:
    """A command's ``func``: ``prepare`` (synchronous validation returning the work to do on a
    transport; ``UsageError``: exit status 2, nothing sent), then the work on the transport
    the flags select (``Failure``: exit status 1, one line)."""

    def run(args: Any) -> int:
        if not os.environ.get("CHRONOLOG_LOG_LEVEL"):
            # a failure is reported as one line; aiokafka's own connection errors would
            # duplicate it, and httpx logs every request (CHRONOLOG_LOG_LEVEL=DEBUG shows them)
            logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
            for name in ("httpx", "httpcore"):
                logging.getLogger(name).setLevel(logging.WARNING)
        ctx = _context(args)
        work = prepare(ctx)  # UsageError here: exit 2 before anything is sent
        target = select_target(args)  # and here: no node to talk to
        if target.direct:  # the log's client logs through structlog (JSON lines); through
            # the API only httpx could, and the import of structlog is a fifth of a CLI call
            from chronolog.logging import configure_logging

            configure_logging()
        try:
            return asyncio.run(_on_transport(ctx, target, work))
        except Failure as exc:
            if args.json:
                print(json.dumps(exc.document()))
            print(str(exc), file=sys.stderr)
            return 1

    return run


async def _on_transport(ctx: Ctx, target: Target, work: Work) -> int:
    transport: Any
    if target.direct:
        from chronolog.cli.direct import DirectTransport

        transport = DirectTransport(ctx)
    else:
        from chronolog.cli.http import HttpTransport

        transport = HttpTransport(target, getattr(ctx.args, "timeout", DEFAULT_TIMEOUT))
    async with transport:
        return await work(transport)


def _check_ids(args: Any) -> None:
    """A schedule or run ID argument is one (exactly as the API's routes check it)."""
    for attr, kind in (("schedule_id", "schedule ID"), ("run_id", "run ID")):
        value = getattr(args, attr, None)
        problem = None if value is None else id_problem(kind, value)
        if problem is not None:
            raise _usage(problem)


def _context(args: Any) -> Ctx:
    _check_ids(args)
    if not wants_direct(args):
        return Ctx(args, direct=False)
    try:
        cfg = parse_log_url(args.log, args.data_dir, args.partitions, args.topic_prefix)
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    path = args.tenants or os.environ.get("CHRONOLOG_TENANTS")
    if not path:
        return Ctx(args, direct=True, tenant=args.tenant or "default", log_cfg=cfg)
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
    return Ctx(args, direct=True, tenant=name, allowed_jobs=tenants.tenants[name].allowed_jobs,
               log_cfg=cfg)


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


# (attribute, flag, path in the definition, kind): the definition flags other than the rule
# (--cron/--every/--at/--delay, --anchor, --tz) and the job (--job, --params)
_FIELD_FLAGS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("start", "--start", ("start",), "instant"),
    ("end", "--end", ("end",), "instant"),
    ("max_count", "--max-count", ("maxCount",), "value"),
    ("job_timeout", "--job-timeout", ("job", "timeout"), "duration"),
    ("misfire", "--misfire", ("misfire", "policy"), "value"),
    ("misfire_grace", "--misfire-grace", ("misfire", "grace"), "duration"),
    ("misfire_max_catchup", "--misfire-max-catchup", ("misfire", "maxCatchup"), "value"),
    ("misfire_max_age", "--misfire-max-age", ("misfire", "maxAge"), "duration"),
    ("overlap", "--overlap", ("overlap",), "value"),
    ("max_attempts", "--max-attempts", ("retry", "maxAttempts"), "value"),
    ("retry_initial_backoff", "--retry-initial-backoff", ("retry", "initialBackoff"),
     "duration"),
    ("retry_max_backoff", "--retry-max-backoff", ("retry", "maxBackoff"), "duration"),
    ("retry_multiplier", "--retry-multiplier", ("retry", "multiplier"), "value"),
    ("retry_max_age", "--retry-max-age", ("retry", "maxAge"), "duration"),
    ("lease", "--lease", ("lease",), "duration"),
    ("start_deadline", "--start-deadline", ("startDeadline",), "duration"),
    ("jitter", "--jitter", ("jitter",), "duration"),
    ("dst_ambiguous", "--dst-ambiguous", ("dst", "ambiguous"), "value"),
    ("dst_nonexistent", "--dst-nonexistent", ("dst", "nonexistent"), "value"),
    ("resource_class", "--resource-class", ("resourceClass",), "value"),
    ("priority", "--priority", ("priority",), "value"),
    ("concurrency_key", "--concurrency-key", ("concurrency", "key"), "value"),
    ("concurrency_limit", "--concurrency-limit", ("concurrency", "limit"), "value"),
    ("exclude", "--exclude", ("exclude",), "names"),
    ("label", "--label", ("labels",), "labels"),
    ("effects", "--effects", ("effects",), "array"),
)
# a definition every single field flag is checked in (as a merge patch of it)
_PROBE: dict[str, Any] = {"every": 3600, "job": {"type": "probe"}}


def build_definition(args: Any, schedule_id: str) -> tuple[dict[str, Any], Any]:
    """The whole definition, the API body (camelCase, without ``scheduleId``), and its
    ``ScheduleSpec``: ``--spec`` (or nothing) with the flags' fields over it. For ``schedule
    create`` and ``schedule revise --spec``.

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
        if isinstance(body.get("misfire"), str):  # its policy alone: other flags add to it
            body["misfire"] = {"policy": body["misfire"]}
    if not any(getattr(args, n) is not None for n in _RULES) and not args.spec:
        raise _usage("invalid schedule: one of --cron, --every, --at, --delay (or --spec) is "
                     "required")
    if args.anchor is not None and args.every is None and "every" not in body:
        raise _usage(f"invalid anchor '{args.anchor}': --anchor only applies to --every")
    tz = args.tz if args.tz is not None else body.get("timezone") or "UTC"
    patch = definition_patch(args, tz)
    params = patch.get("job", {}).pop("params", None)
    body = merge_patch(body, patch)
    if params is not None:  # the flag's object whole (nulls in it are values)
        body["job"] = {**body.get("job", {}), "params": params}
    if "job" not in body or "type" not in body["job"]:
        raise _usage("invalid job: --job TYPE is required")
    return body, _spec_of(body)


def definition_patch(args: Any, tz: str | None) -> dict[str, Any]:
    """The definition fields the flags give, as a JSON merge patch (camelCase): what
    ``schedule revise`` sends (``PATCH``). A rule flag nulls the other rules and ``anchor``
    (they exclude each other); naive instants are wall times in ``tz`` (None: refused).

    Each flag is checked alone (``UsageError`` naming its field and flag); whether the
    merged definition holds together is the merge's to say."""
    patch: dict[str, Any] = {}
    rules = [n for n in _RULES if getattr(args, n) is not None]
    if rules:
        patch.update(dict.fromkeys(_TRIGGER_KEYS))
        if args.anchor is not None and args.every is None:
            raise _usage(f"invalid anchor '{args.anchor}': --anchor only applies to --every")
    zone = tz or "UTC"
    try:
        resolve_zone(zone)
        if args.every is not None:
            now = datetime.now(UTC).replace(microsecond=0)
            anchor = _instant_flag(args.anchor, "anchor", tz) if args.anchor else None
            compile_trigger(every=args.every, anchor=anchor or now, timezone=zone)
            patch["every"] = args.every
        if args.anchor is not None:
            patch["anchor"] = _iso(_instant_flag(args.anchor, "anchor", tz))
        if args.cron is not None:
            compile_trigger(cron=args.cron, timezone=zone,
                            dst_ambiguous=args.dst_ambiguous or "first",
                            dst_nonexistent=args.dst_nonexistent or "shift_forward")
            patch["cron"] = args.cron
        if args.at is not None:
            patch["at"] = _iso(_instant_flag(args.at, "at", tz))
        if args.delay is not None:
            compile_trigger(delay=args.delay, timezone=zone)
            patch["delay"] = args.delay
    except RecurrenceError as exc:
        raise _usage(str(exc)) from None
    if args.tz is not None:
        patch["timezone"] = args.tz
    if args.job is not None:
        patch["job"] = {"type": args.job}
    if args.params is not None:
        patch.setdefault("job", {})["params"] = _json_object(args.params, "params")
    for attr, flag, path, kind in _FIELD_FLAGS:
        raw = getattr(args, attr)
        if raw is None:
            continue
        value = _field_value(raw, flag, path, kind, tz)
        fragment: dict[str, Any] = {path[-1]: value}
        for part in reversed(path[:-1]):
            fragment = {part: fragment}
        _check_field(fragment, flag, path, raw)
        patch = merge_patch(patch, fragment)
        if kind == "labels":  # its nulls (labels removed) are the patch's, not merged away
            patch["labels"] = value
    return patch


def _invalid(path: tuple[str, ...], flag: str, raw: Any, reason: str) -> Exception:
    """``invalid retry.maxAttempts '0' (--max-attempts): <reason>`` (no flag when it says
    the same as the field: ``invalid lease '-1s': ...``)."""
    field = ".".join(path)
    named = "" if flag == f"--{field}" else f" ({flag})"
    return _usage(f"invalid {field} '{_short(str(raw))}'{named}: {reason}")


def _field_value(raw: Any, flag: str, path: tuple[str, ...], kind: str, tz: str | None) -> Any:
    """A field flag's value as the definition holds it."""
    if kind == "duration":
        try:
            parse_duration(raw)
        except InvalidDuration as exc:
            raise _invalid(path, flag, raw, exc.reason) from None
        return raw
    if kind == "instant":
        try:
            return _iso(_instant_flag(raw, path[-1], tz))
        except RecurrenceError as exc:
            raise _usage(str(exc)) from None
    if kind == "names":  # repeated flags, each one or more comma-separated names
        return [n.strip() for text in raw for n in text.split(",") if n.strip()]
    if kind == "labels":  # repeated KEY=VALUE (KEY- removes the label, on revise)
        labels: dict[str, str | None] = {}
        for text in raw:
            key, sep, value = text.partition("=")
            if sep:
                labels[key] = value
            elif text.endswith("-") and len(text) > 1:
                labels[text[:-1]] = None
            else:
                raise _invalid(path, flag, text, "expected KEY=VALUE (or KEY- to remove it)")
        return labels
    if kind == "array":
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _invalid(path, flag, raw, f"not JSON ({exc.msg})") from None
        if not isinstance(value, list):
            raise _invalid(path, flag, raw, "must be a JSON array")
        return value
    return raw


def _check_field(fragment: dict[str, Any], flag: str, path: tuple[str, ...], raw: Any) -> None:
    """One field flag's value, validated in a definition of its own (the API's rules)."""
    if path[0] == "concurrency":  # one half of a pair: the other half at a valid value, and
        # the key's template with every param it names (the whole definition checks both)
        half = fragment["concurrency"]
        names = m.KEY_PLACEHOLDER.findall(half["key"]) if isinstance(half.get("key"),
                                                                      str) else []
        fragment = {"concurrency": {"key": "probe", "limit": 1, **half},
                    "job": {"params": dict.fromkeys(names, "")}}
    try:
        to_spec(ScheduleDefinition.model_validate(merge_patch(_PROBE, fragment)))
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = plain_message(err)
        where = field_of(tuple(err.get("loc", ())))
        if where and where != ".".join(path):  # inside the value (an effect's member)
            msg = f"{where}: {msg}"
        raise _invalid(path, flag, raw, msg) from None
    except InvalidDefinition as exc:
        raise _invalid(path, flag, raw, exc.message) from None


def _instant_flag(value: str, field: str, tz: str | None) -> datetime:
    """An instant flag as UTC; a naive one is a wall time in ``tz`` (None: refused, as on
    revise, where the schedule's zone is not known here)."""
    if tz is None:
        parsed = parse_instant(value, "UTC", field=field)  # its own errors first
        if _naive(value):
            raise _usage(f"invalid {field} '{value}': a time without an offset needs --tz "
                         f"on revise (or write it with Z or +HH:MM)")
        return parsed
    return parse_instant(value, tz, field=field)


def _naive(value: str) -> bool:
    try:
        return datetime.fromisoformat(value.strip()).tzinfo is None
    except ValueError:
        return False


def revise_patch(args: Any) -> dict[str, Any]:
    """What ``schedule revise`` without ``--spec`` changes: the merge patch of its flags
    (``UsageError`` when none is given)."""
    patch = definition_patch(args, args.tz)
    if not patch:
        raise _usage("invalid revise: nothing to change: pass the flags of the fields to "
                     "change (or --spec FILE for the whole definition)")
    return patch


class DefinitionError(ValueError):
    """A definition (a schedule's or a calendar's) refused locally: ``field`` is the
    camelCase path it is about (``retry.maxAttempts``, ``windows[0].start``; ``spec`` or
    ``calendar`` for the whole) and ``reason`` why, led by the value when it is a scalar
    (``'0': must be at least 1``)."""

    def __init__(self, field: str, reason: str, value: str | None = None) -> None:
        shown = "" if value is None else f" '{value}'"
        super().__init__(f"invalid {field}{shown}: {reason}")
        self.field = field
        self.reason = reason if value is None else f"'{value}': {reason}"


# ``invalid cron '61 * * * *': why``: a trigger's own message (``RecurrenceError``)
_NAMED_VALUE = re.compile(r"invalid \S+ '(.*?)': (.*)", re.DOTALL)


def definition_spec(body: dict[str, Any]) -> m.ScheduleSpec:
    """The ``ScheduleSpec`` of a definition body (camelCase, without ``scheduleId``),
    validated exactly as the API validates it (``to_spec``); ``DefinitionError`` naming the
    field otherwise."""
    try:
        return to_spec(ScheduleDefinition.model_validate(body))
    except ValidationError as exc:
        err = exc.errors()[0]
        name = field_of(tuple(err.get("loc", ()))) or "spec"
        msg = plain_message(err)
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        value = err.get("input")
        shown = None if isinstance(value, (dict, list)) or value is None else str(value)
        raise DefinitionError(name, msg, shown) from None
    except InvalidDefinition as exc:
        named = _NAMED_VALUE.fullmatch(exc.message)  # a trigger's: its value, then why
        if named is not None:
            raise DefinitionError(exc.field or "spec", named[2], named[1]) from None
        raise DefinitionError(exc.field or "spec", exc.message) from None


def _spec_of(body: dict[str, Any]) -> m.ScheduleSpec:
    """``definition_spec`` with its refusal as a usage error."""
    try:
        return definition_spec(body)
    except DefinitionError as exc:
        raise _usage(str(exc)) from None


# =======================================================================================
# commands: validate, then the work on a transport


def print_json(data: Any) -> None:
    """``data`` as one line of JSON on stdout (``--json``)."""
    print(json.dumps(data))


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _limit(value: int | None, top: int = MAX_PAGE) -> int | None:
    if value is not None and not 1 <= value <= top:
        raise _usage(f"invalid limit '{value}': must be 1..{top}")
    return value


def _after(value: str | None) -> str | None:
    if value is not None and (not value or len(value) > 2000 or not value.isascii()
                              or not value.isprintable() or " " in value):
        raise _usage(f"invalid after '{_short(value.encode('unicode_escape').decode(), 40)}': "
                     f"not a cursor of this API")
    return value


def _job_type(value: str | None) -> str | None:
    if value is not None and (not 1 <= len(value) <= 200 or "\x00" in value):
        shown = _short(value.encode("unicode_escape").decode())
        raise _usage(f"invalid jobType '{shown}': 1 to 200 characters, no NUL")
    return value


def _needs_api(ctx: Ctx, what: str) -> None:
    if ctx.direct:
        raise _usage(f"error: {what} the API (--url)")


def _create(ctx: Ctx) -> Work:
    sid = ctx.args.schedule_id
    body, spec = build_definition(ctx.args, sid)

    async def work(t: Transport) -> int:
        result = await t.create_schedule(sid, body, spec, ctx.args.idempotency_key)
        if ctx.args.json:
            print_json(result)
        else:
            render.created(result)
        for w in result.get("warnings") or ():
            print(f"warning: {w}", file=sys.stderr)
        return 0

    return work


def _revise(ctx: Ctx) -> Work:
    if ctx.args.if_match < 1:
        raise _usage(f"invalid If-Match '{ctx.args.if_match}': expected a revision >= 1")
    sid, revision = ctx.args.schedule_id, ctx.args.if_match
    if ctx.args.spec:  # the whole definition
        body, spec = build_definition(ctx.args, sid)
    else:  # only the fields given
        patch = revise_patch(ctx.args)

    async def work(t: Transport) -> int:
        if ctx.args.spec:
            result = await t.revise_schedule(sid, body, spec, revision)
        else:
            result = await t.patch_schedule(sid, patch, revision)
        if ctx.args.json:
            print_json(result)
        else:
            render.revised(sid, result)
        return 0

    return work


def _lifecycle(ctx: Ctx) -> Work:
    action = ctx.args.lifecycle
    reason = getattr(ctx.args, "reason", "")
    if action == "pause":
        try:
            m.PauseSchedule(reason=reason)  # its limits, before sending
        except ValidationError as exc:
            msg = plain_message(exc.errors()[0])
            raise _usage(f"invalid reason: {msg}") from None

    async def work(t: Transport) -> int:
        result = await t.change_state(ctx.args.schedule_id, action, reason)
        if ctx.args.json:
            print_json(result)
        else:
            render.state_changed(action, result)
        return 0

    return work


def _trigger(ctx: Ctx) -> Work:
    params = _json_object(ctx.args.params, "params") if ctx.args.params is not None else None
    key = ctx.args.idempotency_key or f"cli-{uuid.uuid4().hex}"
    if len(key) > 200:
        raise _usage(f"invalid Idempotency-Key '{_short(key)}': at most 200 characters")
    try:
        m.TriggerRun(request_key=key, params=params)  # the limits on params, before sending
    except ValidationError as exc:
        msg = plain_message(exc.errors()[0])
        raise _usage(f"invalid params: {msg}") from None
    sid = ctx.args.schedule_id

    async def work(t: Transport) -> int:
        try:
            result = await t.trigger(sid, key, params)
        except Failure as exc:
            if exc.status == "unavailable" and ctx.args.idempotency_key is None:
                exc.message += f" (this trigger's key: --idempotency-key {key})"
            raise
        if ctx.args.json:
            print_json(result)
        else:
            render.triggered(sid, result)
        return 0

    return work


def _run_command(ctx: Ctx) -> Work:
    name, run_id = ctx.args.run_command, ctx.args.run_id
    schedule = ctx.args.schedule
    problem = None if schedule is None else id_problem("schedule ID", schedule)
    if problem is not None:
        raise _usage(f"--schedule: {problem}")
    reason = getattr(ctx.args, "reason", "")
    if len(reason) > 1000:
        raise _usage(f"invalid reason '{_short(reason)}': at most 1000 characters")

    async def work(t: Transport) -> int:
        if name == "cancel":
            result = await t.cancel(run_id, schedule, reason)
        else:
            result = await t.redrive(run_id, schedule)
        if ctx.args.json:
            print_json(result)
        else:
            render.run_written(name, run_id, result)
        return 0

    return work


def _backfill(ctx: Ctx) -> Work:
    args = ctx.args
    try:
        start = _instant_flag(args.start, "from", "UTC")
        end = _instant_flag(args.end, "to", "UTC")
    except RecurrenceError as exc:
        raise _usage(str(exc)) from None
    if end <= start:
        raise _usage(f"invalid to '{args.end}': must be after from '{args.start}'")
    key = args.idempotency_key or (
        f"cli-backfill-{_iso(start)}-{_iso(end)}-{args.overlap}")
    if len(key) > 200:
        raise _usage(f"invalid Idempotency-Key '{_short(key)}': at most 200 characters")
    sid = args.schedule_id

    async def work(t: Transport) -> int:
        result = await t.backfill(sid, key, start, end, args.overlap)
        if args.json:
            print_json(result)
        else:
            render.backfilled(sid, result)
        return 0

    return work


def _show(ctx: Ctx) -> Work:
    async def work(t: Transport) -> int:
        doc = await t.schedule(ctx.args.schedule_id)
        if ctx.args.json:
            print_json(doc)
        else:
            render.schedule(doc)
        return 0

    return work


def _list(ctx: Ctx) -> Work:
    args = ctx.args
    states: tuple[str, ...] | None = None
    try:
        if args.state is not None:
            states = parse_schedule_states(args.state) if args.state.strip(" ,") else ()
            if not states:
                raise InvalidQuery(f"invalid state '{args.state}': expected a comma-separated "
                                   f"list of {', '.join(SCHEDULE_STATES)}", "state")
    except InvalidQuery as exc:
        raise _usage(exc.message) from None
    if args.resource_class is not None and not _RESOURCE_CLASS.fullmatch(args.resource_class):
        raise _usage(f"invalid resourceClass '{_short(args.resource_class)}': 1 to 64 of "
                     f"A-Z a-z 0-9 _ -")
    if args.prefix is not None and (not 1 <= len(args.prefix) <= 200 or "\x00" in args.prefix):
        shown = _short(args.prefix.encode("unicode_escape").decode())
        raise _usage(f"invalid prefix '{shown}': 1 to 200 characters, no NUL")
    query = SchedulesQuery(states=states, job_type=_job_type(args.job_type),
                           resource_class=args.resource_class, prefix=args.prefix,
                           limit=_limit(args.limit, DIRECT_LIST_LIMIT if ctx.direct
                                        else MAX_PAGE),
                           after=_after(args.after))
    for flag, value in (("--job-type", args.job_type), ("--resource-class", args.resource_class),
                        ("--prefix", args.prefix), ("--after", args.after)):
        if value is not None:
            _needs_api(ctx, f"schedule list {flag} needs")
    if args.after is not None:
        try:  # the cursor of the same filters, as the API checks it
            decode_schedule_cursor(args.after, ScheduleQuery(
                states=states or SCHEDULES_LISTED, job_type=args.job_type,
                resource_class=args.resource_class, prefix=args.prefix))
        except InvalidQuery as exc:
            raise _usage(exc.message) from None

    async def work(t: Transport) -> int:
        doc = await t.schedules(query)
        if args.json:
            print_json(doc)
        else:
            render.schedules(doc, ",".join(states) if states else None)
        return 0

    return work


def _instant(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_instant(value, "UTC", field=name)
    except RecurrenceError as exc:
        raise _usage(str(exc)) from None


def _runs(ctx: Ctx) -> Work:
    args = ctx.args
    sid = args.schedule_id
    start, end = _instant(args.start, "from"), _instant(args.end, "to")
    try:
        states = parse_run_states(args.state)
        filters = RunQuery(states=tuple(states) if states else None, job_type=args.job_type,
                           schedule_id=sid, since=start, until=end)  # from after to: refused
    except InvalidQuery as exc:
        raise _usage(exc.message) from None
    query = RunsQuery(schedule_id=sid, states=filters.states,
                      job_type=_job_type(args.job_type),
                      start=_iso(start) if start else None, end=_iso(end) if end else None,
                      limit=_limit(args.limit), after=_after(args.after))
    if sid is None:
        _needs_api(ctx, "runs across schedules need")
    elif not query.of_one_schedule:
        _needs_api(ctx, "runs by job type or time need")
    if args.after is not None:
        try:  # the cursor of the same list and filters, as the API checks it
            if query.of_one_schedule:
                decode_run_cursor(args.after, sid, states)
            else:
                decode_run_list_cursor(args.after, filters)
        except InvalidQuery as exc:
            raise _usage(exc.message) from None

    async def work(t: Transport) -> int:
        doc = await t.runs(query)
        if args.json:
            print_json(doc)
        else:
            render.runs(doc, sid, args.state if states else None)
        return 0

    return work


def _run(ctx: Ctx) -> Work:
    async def work(t: Transport) -> int:
        doc = await t.run(ctx.args.run_id)
        if ctx.args.json:
            print_json(doc)
        else:
            render.run(doc)
        return 0

    return work


def _workers(ctx: Ctx) -> Work:
    args = ctx.args
    if args.after:
        try:
            decode_worker_cursor(args.after, args.live)
        except InvalidQuery as exc:
            raise _usage(exc.message) from None
    query = WorkersQuery(live=args.live, limit=_limit(args.limit), after=_after(args.after))

    async def work(t: Transport) -> int:
        doc = await t.workers(query)
        if args.json:
            print_json(doc)
        else:
            render.workers(doc, args.live)
        return 0

    return work


# =======================================================================================
# calendars

_WINDOW = re.compile(r"^\s*(?:(?P<days>[A-Za-z,-]+)\s+)?(?P<start>\d{1,2}:\d{2})\s*-\s*"
                     r"(?P<end>\d{1,2}:\d{2})(?:\s+(?P<zone>\S+))?\s*$")


def _days(text: str) -> list[str]:
    """``sat,sun`` or ``mon-fri`` as the days a window lists."""
    out: list[str] = []
    for part in text.lower().split(","):
        if "-" in part:
            a, _, b = part.partition("-")
            if a not in WEEKDAYS or b not in WEEKDAYS:
                raise _usage(f"invalid window days '{text}': days are mon..sun")
            i, j = WEEKDAYS.index(a), WEEKDAYS.index(b)  # type: ignore[arg-type]
            out += [WEEKDAYS[(i + k) % 7] for k in range((j - i) % 7 + 1)]
        elif part in WEEKDAYS:
            out.append(part)
        else:
            raise _usage(f"invalid window days '{text}': days are mon..sun")
    return list(dict.fromkeys(out))


def calendar_body(args: Any) -> dict[str, Any]:
    """The calendar a ``calendar put`` sends (the API's PUT body): ``--file`` with the
    flags' entries added, validated (``UsageError`` naming the field)."""
    body: dict[str, Any] = {}
    if args.file:
        try:
            body = _json_object(Path(args.file).read_text(), "file")
        except OSError as exc:
            raise _usage(f"invalid file '{args.file}': {exc.strerror or exc}") from None
    if args.timezone is not None:
        body["timezone"] = args.timezone
    for text in args.date or ():
        body.setdefault("dates", []).extend(d.strip() for d in text.split(",") if d.strip())
    for text in args.range or ():
        start, sep, end = text.partition("..")
        if not sep:
            raise _usage(f"invalid range '{text}': FROM..TO, e.g. 2026-12-24..2026-12-26")
        body.setdefault("ranges", []).append({"from": start.strip(), "to": end.strip()})
    for text in args.window or ():
        match = _WINDOW.match(text)
        if match is None:
            raise _usage(f"invalid window '{text}': 'DAYS HH:MM-HH:MM [ZONE]', e.g. "
                         f"'sat,sun 22:00-06:00'")
        window: dict[str, Any] = {"start": match["start"].zfill(5), "end": match["end"].zfill(5)}
        if match["days"]:
            window["days"] = _days(match["days"])
        if match["zone"]:
            window["timezone"] = match["zone"]
        body.setdefault("windows", []).append(window)
    try:
        calendar_spec(body)
    except DefinitionError as exc:
        raise _usage(str(exc)) from None
    return body


def calendar_spec(body: dict[str, Any]) -> CalendarSpec:
    """The ``CalendarSpec`` of a calendar body (the API's PUT body), validated as the API
    validates it; ``DefinitionError`` naming the field (``windows[0].start``) otherwise."""
    try:
        return CalendarSpec.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"])
        where = where.replace(".[", "[")
        raise DefinitionError(where or "calendar",
                              str(err["msg"]).removeprefix("Value error, ")) from None


def calendar_name(name: str) -> str:
    """``name`` when it is a calendar's name, else ``UsageError``."""
    if not re.fullmatch(CALENDAR_NAME_PATTERN, name):
        raise _usage(f"invalid calendar name '{_short(name)}': letters, digits and _ . - (not "
                     f"first), 1-100 characters")
    return name


def _printed(args: Any, doc: dict[str, Any], show: Callable[[dict[str, Any]], None]) -> int:
    """Print an answer: its JSON with ``--json``, else ``show``'s lines; exit status 0."""
    if args.json:
        print_json(doc)
    else:
        show(doc)
    return 0


def _calendar_put(ctx: Ctx) -> Work:
    args = ctx.args
    name = calendar_name(args.name)
    body = calendar_body(args)

    async def work(t: Transport) -> int:
        return _printed(args, await t.put_calendar(name, body, args.if_match),
                        render.calendar_written)

    return work


def _calendar_show(ctx: Ctx) -> Work:
    name = calendar_name(ctx.args.name)

    async def work(t: Transport) -> int:
        return _printed(ctx.args, await t.calendar(name), render.calendar)

    return work


def _calendar_list(ctx: Ctx) -> Work:
    args = ctx.args
    if args.limit is not None and not 1 <= args.limit <= MAX_PAGE:
        raise _usage(f"invalid limit '{args.limit}': 1..{MAX_PAGE}")
    if args.after is not None:
        calendar_name(args.after)

    async def work(t: Transport) -> int:
        return _printed(args, await t.calendars(args.limit, args.after), render.calendars)

    return work


def _calendar_delete(ctx: Ctx) -> Work:
    args = ctx.args
    name = calendar_name(args.name)

    async def work(t: Transport) -> int:
        return _printed(args, await t.delete_calendar(name, args.if_match),
                        render.calendar_written)

    return work
