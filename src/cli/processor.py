"""``chronolog processor``: run a partition-owning processor until SIGTERM/SIGINT.

On SIGTERM the processor finishes its open transaction and leaves the group. With
``--ready-file PATH`` (env ``CHRONOLOG_READY_FILE``) it writes its readiness there
(``chronolog.readiness``): ready once in the group with every assigned partition restored
and the last commit of each partition successful, and the log answering.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from chronolog.cli.errors import UsageError
from chronolog.cli.flags import (
    add_archive_flag,
    add_log_flags,
    add_ready_flag,
    add_retention_flag,
    archive_from_args,
    log_from_args,
    retention_policy_from_args,
    start_tracing,
)
from chronolog.processors.clock import CLOCK_STEP_HOLD_S, CLOCK_STEP_S
from chronolog.processors.service import run_processor
from chronolog.settings import ConfigError, clock_step_from_env, interval_from_env


def register(sub: Any) -> None:
    p = sub.add_parser("processor", help="run a partition-owning processor")
    add_log_flags(p)
    p.add_argument("--member-id", default=None, help="group member id (default host-pid)")
    p.add_argument("--tenants", default=None, help="tenants TOML (env CHRONOLOG_TENANTS)")
    p.add_argument("--batch", type=int, default=500, help="max commands per transaction")
    add_retention_flag(p)
    add_archive_flag(p)
    add_ready_flag(p)
    p.set_defaults(func=_run)


def _run(args: Any) -> int:
    from chronolog.logging import configure_logging

    configure_logging()
    start_tracing("processor")
    # the deployment's retention, checked with the tenants' own: the log keeps the longest
    args.retention_policy = retention_policy_from_args(args)
    archive = archive_from_args(args)
    try:
        prune_every = interval_from_env("CHRONOLOG_PRUNE_EVERY", 30.0)
        clock_step = clock_step_from_env(CLOCK_STEP_S, CLOCK_STEP_HOLD_S)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    log_ = log_from_args(args)
    member = args.member_id or f"{socket.gethostname()}-{os.getpid()}"
    from chronolog.readiness import ready_file

    return asyncio.run(run_processor(log_, member, args.batch, args.tenants,
                                     ready_file(args.ready_file),
                                     args.retention_policy.longest(), archive,
                                     prune_every, clock_step))


