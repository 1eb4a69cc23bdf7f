"""``chronolog processor``: run a partition-owning processor until SIGTERM/SIGINT.

On SIGTERM the processor finishes its open transaction and leaves the group.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from typing import Any

from chronolog.settings import ConfigError, open_log, parse_log_url


def add_log_flags(p: argparse.ArgumentParser) -> None:
    """``--log URL``, ``--data-dir DIR``, ``--partitions N``, ``--topic-prefix P``."""
    p.add_argument("--log", help="sqlite:///path or kafka://host:port (env CHRONOLOG_LOG)")
    p.add_argument("--data-dir", help="data directory for the embedded log (default ./.chronolog)")
    p.add_argument("--partitions", type=int, default=None,
                   help="partition count P (env CHRONOLOG_PARTITIONS, default 12)")
    p.add_argument("--topic-prefix", default=None, help="topic prefix (default chronolog.)")


def log_from_args(args: Any) -> Any:
    from chronolog.cli import UsageError

    try:
        cfg = parse_log_url(args.log, args.data_dir, args.partitions, args.topic_prefix)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return open_log(cfg)


def register(sub: Any) -> None:
    p = sub.add_parser("processor", help="run a partition-owning processor")
    add_log_flags(p)
    p.add_argument("--member-id", default=None, help="group member id (default host-pid)")
    p.add_argument("--tenants", default=None, help="tenants TOML (env CHRONOLOG_TENANTS)")
    p.add_argument("--batch", type=int, default=500, help="max commands per transaction")
    p.set_defaults(func=_run)


def _run(args: Any) -> int:
    from chronolog.logging import configure_logging

    configure_logging()
    log_ = log_from_args(args)
    member = args.member_id or f"{socket.gethostname()}-{os.getpid()}"
    return asyncio.run(run_processor(log_, member, args.batch, args.tenants))


async def run_processor(log_: Any, member: str, batch: int = 500, tenants_path: str | None = None) -> int:
    from chronolog.lifecycle import serve_log
    from chronolog.processors.runtime import Processor, ProcessorConfig

    tenants = None
    path = tenants_path or os.environ.get("CHRONOLOG_TENANTS")
    if path:
        from chronolog.tenants import load_tenants

        tenants = load_tenants(path)
    proc = Processor(log_, member, tenants=tenants, config=ProcessorConfig(batch_max=batch))
    return await serve_log(log_, proc.run, proc.stop)
