"""``chronolog effects`` (the effect runner service) and ``chronolog reconcile`` (operators).

``chronolog effects [--log URL | --data-dir DIR] [--partitions N] [--topic-prefix P]
[--tenants FILE] [--database-url DSN] [--results DIR] [--member-id ID]`` runs an effect
runner until SIGTERM/SIGINT (it finishes the intents at hand, or leaves waiting ones
unrecorded). Effect destinations come from the tenants file (``--tenants``, env
``CHRONOLOG_TENANTS``); without one every effect is refused (recorded as failed).
``--ready-file PATH`` (env ``CHRONOLOG_READY_FILE``) receives its readiness: ready while
its consumer is in the effects group with every assigned partition folded and the log
answers. It waits through a log outage (``chronolog.lifecycle.serve_log``).
``--database-url`` (env ``CHRONOLOG_DATABASE_URL``) is the node's read-model database: a
``postgres`` destination naming it is refused at start (exit 2), as is a ``kafka``
destination on one of chronolog's own topics. ``--results`` is the result store directory
(default ``<data dir>/results``).

``chronolog reconcile list [--json]`` prints the runs in RECONCILING with their evidence
(one line each, or a JSON array); exit 0 even when there are none.

``chronolog reconcile resolve RUN_ID --schedule S --tenant T --decision
delivered|retry|abandon --note TEXT [--effect EFFECT_ID] [--by NAME]`` sends
ResolveReconciliation (principal = ``--by``, else ``$USER``) and prints the reply body as
JSON. A processor must be running to answer. Exit status: 0 ok; 1 when the processor
refuses (not_found, conflict — e.g. the run is not reconciling) or does not answer in
``--timeout`` seconds; 2 on bad input.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import socket
import sys
from typing import Any

import orjson

from chronolog.cli.flags import add_log_flags, add_ready_flag, log_from_args, start_tracing


def register(sub: Any) -> None:
    p = sub.add_parser("effects", help="run the effect runner (performs effect intents)")
    add_log_flags(p)
    p.add_argument("--tenants", default=None,
                   help="tenants TOML with the effect destinations (env CHRONOLOG_TENANTS)")
    p.add_argument("--database-url", default=None,
                   help="the node's read-model database, never a destination "
                   "(env CHRONOLOG_DATABASE_URL)")
    p.add_argument("--results", default=None, help="result store directory")
    p.add_argument("--member-id", default=None, help="group member id (default host-pid)")
    add_ready_flag(p)
    p.set_defaults(func=_run_effects)

    r = sub.add_parser("reconcile", help="list and resolve runs waiting for an operator")
    rsub = r.add_subparsers(dest="reconcile_command", metavar="ACTION")
    rsub.required = True
    lp = rsub.add_parser("list", help="runs in RECONCILING with their evidence")
    add_log_flags(lp)
    lp.add_argument("--json", action="store_true", help="print a JSON array")
    lp.set_defaults(func=_run_list)
    rp = rsub.add_parser("resolve", help="record an operator's decision for a run")
    add_log_flags(rp)
    rp.add_argument("run_id", metavar="RUN_ID")
    rp.add_argument("--schedule", required=True, help="schedule ID of the run")
    rp.add_argument("--tenant", required=True)
    rp.add_argument("--decision", required=True, choices=["delivered", "retry", "abandon"])
    rp.add_argument("--note", required=True, help="why (kept in the event)")
    rp.add_argument("--effect", default=None, help="the effect ID being reconciled")
    rp.add_argument("--by", default=None, help="who decides (default $USER)")
    rp.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply")
    rp.set_defaults(func=_run_resolve)


# ---------------------------------------------------------------------- effects


def _run_effects(args: Any) -> int:
    from chronolog.logging import configure_logging
    from chronolog.settings import data_dir

    configure_logging()
    start_tracing("effects")
    log_ = log_from_args(args)
    member = args.member_id or f"{socket.gethostname()}-{os.getpid()}"
    results = args.results or str(data_dir(args.data_dir) / "results")
    db = args.database_url or os.environ.get("CHRONOLOG_DATABASE_URL")
    tenants = effect_tenants(args.tenants or os.environ.get("CHRONOLOG_TENANTS"),
                             log_.topics, db)
    from chronolog.effects.service import run_effects
    from chronolog.readiness import ready_file
    from chronolog.workers.results import FilesystemResultStore

    store = FilesystemResultStore(results) if results else None
    return asyncio.run(run_effects(log_, member, db, store, tenants,
                                   ready_file(args.ready_file)))


def effect_tenants(path: str | None, topics: Any, database_url: str | None) -> Any:
    """The tenants registry with its destinations, checked for this node (exit 2 if not)."""
    from chronolog.cli.errors import UsageError
    from chronolog.destinations import check_destinations
    from chronolog.settings import ConfigError
    from chronolog.tenants import Tenants, load_tenants

    try:
        tenants = load_tenants(path) if path else Tenants()
        check_destinations(tenants, topics, database_url)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return tenants


# ---------------------------------------------------------------------- reconcile


def _run_list(args: Any) -> int:
    return asyncio.run(_list(log_from_args(args), args.json))


async def _list(log_: Any, as_json: bool) -> int:
    from chronolog.effects.reconcile import open_reconciliations

    await log_.start()
    try:
        await log_.ensure_topics()
        items = await open_reconciliations(log_)
    finally:
        await log_.close()
    if as_json:
        sys.stdout.write(orjson.dumps(items, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    if not items:
        print("no runs are reconciling")
        return 0
    for it in items:
        ev = orjson.dumps(it.get("evidence", {})).decode()
        print(f"{it['run_id']}  tenant={it['tenant']} schedule={it['schedule_id']} "
              f"effect={it.get('effect_id') or '-'} kind={it.get('kind', '-')} "
              f"since={it['since']}\n    reason: {it['reason']}\n    evidence: {ev}")
    return 0


def _run_resolve(args: Any) -> int:
    by = args.by or os.environ.get("USER") or getpass.getuser()
    return asyncio.run(_resolve(log_from_args(args), args, by))


async def _resolve(log_: Any, args: Any, by: str) -> int:
    from chronolog.client import Client, CommandError, ReplyTimeout

    await log_.start()
    try:
        await log_.ensure_topics()
        async with Client(log_, principal=by, reply_timeout=args.timeout) as client:
            try:
                body = await client.resolve(args.tenant, args.schedule, args.run_id,
                                            args.decision, args.note, args.effect)
            except CommandError as exc:
                print(f"reconcile resolve: {exc.reply.status}: {exc.reason}", file=sys.stderr)
                return 1
            except ReplyTimeout as exc:
                print(f"reconcile resolve: {exc} (is a processor running?)", file=sys.stderr)
                return 1
    finally:
        await log_.close()
    print(orjson.dumps({**body, "decision": args.decision, "by": by}).decode())
    return 0
