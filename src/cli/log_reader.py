"""Reading the whole ``events`` topic for the offline tools (``chronolog audit``, ``replay``).

``add_log_arguments(parser)`` adds ``--log URL | --data-dir DIR`` and ``--partitions N``;
``log_config(args)`` turns them into a ``LogConfig`` (``ConfigError`` -> ``UsageError``, so
the CLI prints one line and exits 2); ``open_existing_log(cfg)`` opens the log without
creating anything (a missing SQLite file or a missing ``events`` topic is a usage error, not
an empty log); ``read_partition`` yields one partition's committed records from an offset up
to the end offset taken when it starts, oldest first, through the EventLog port;
``read_in_order`` yields every partition of ``events`` in move-barrier order (a moved key's
events on its old home before those on its new home: ``chronolog.projections.ordered``), as
the audit and the replay fold them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from chronolog.cli.errors import UsageError
from chronolog.log.port import EventLog, LogError
from chronolog.log.reading import read_partition
from chronolog.projections.ordered import Taken, read_in_order
from chronolog.settings import ConfigError, LogConfig, open_log, parse_log_url

__all__ = [
    "Taken",
    "add_log_arguments",
    "event_partitions",
    "log_config",
    "open_existing_log",
    "read_in_order",
    "read_partition",
]


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log URL | --data-dir DIR`` and ``--partitions N``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--log", metavar="URL",
                       help="sqlite:///path/log.db or kafka://host:port[,host:port] "
                            "(default: $CHRONOLOG_LOG, else DATA_DIR/log.db)")
    where.add_argument("--data-dir", metavar="DIR",
                       help="read the embedded log DIR/log.db (default: $CHRONOLOG_DATA_DIR "
                            "or ./.chronolog)")
    parser.add_argument("--partitions", type=int, metavar="N",
                        help="expected partition count (default: $CHRONOLOG_PARTITIONS); "
                             "every partition the log has is read either way")


def log_config(args: argparse.Namespace) -> LogConfig:
    """The log the arguments name; an explicit ``--data-dir`` wins over ``$CHRONOLOG_LOG``."""
    url: str | None = args.log
    if args.data_dir is not None:
        url = f"sqlite://{Path(args.data_dir) / 'log.db'}"
    n: int | None = args.partitions
    if n is not None and not 1 <= n <= 1024:
        raise UsageError(f"invalid partitions '{n}': must be 1..1024")
    try:
        return parse_log_url(url, partitions=n)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


async def open_existing_log(cfg: LogConfig) -> EventLog:
    """Open and start the log, refusing to create a new SQLite file."""
    if cfg.kind == "sqlite" and not Path(cfg.target).is_file():  # noqa: ASYNC240 - one local stat()
        raise UsageError(f"invalid log '{cfg.target}': no such file")
    log = open_log(cfg)
    try:
        await log.start()
    except (LogError, OSError) as exc:
        await _close_quietly(log)
        raise UsageError(f"cannot open log {cfg.kind}:{cfg.target}: {exc}") from None
    return log


async def event_partitions(log: EventLog) -> int:
    """How many partitions ``events`` has (a missing topic is a usage error)."""
    topic = log.topics.events
    try:
        return await log.partitions_for(topic)
    except LogError as exc:
        raise UsageError(f"no topic '{topic}' in the log ({exc}); wrong --log or "
                         "CHRONOLOG_TOPIC_PREFIX?") from None


async def _close_quietly(log: Any) -> None:
    try:
        await log.close()
    except Exception:  # noqa: BLE001 - closing a log that failed to start
        pass
