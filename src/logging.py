"""structlog configuration: JSON lines when not on a terminal, readable on a terminal.

Client libraries (aiokafka, asyncpg) log every failed attempt while a service is down —
thousands of lines a minute. ``Summarized`` lets the first record of each kind through and then
one summary per ``SUMMARY_S`` seconds with the count it held back, so an outage reads as a few
lines, not a flood.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

import structlog

# at most one line per kind of library message in this many seconds
SUMMARY_S = float(os.environ.get("CHRONOLOG_LOG_SUMMARY_S", "30"))
_SUMMARIZED = ("aiokafka", "kafka", "asyncpg")  # loggers of the client libraries


class _Stderr:
    """Whatever ``sys.stderr`` is at write time (not the object seen at configure time:
    pytest and daemons swap it, and a captured stream may be closed later)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


STDERR = _Stderr()


class Summarized(logging.Filter):
    """Records of the loggers under ``prefixes``, per (logger, level, message template): the
    first passes, later ones within ``every`` seconds are counted, and the first one after
    that passes with the count. Other records pass untouched."""

    def __init__(self, prefixes: tuple[str, ...] = _SUMMARIZED, every: float = SUMMARY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.every = every
        self._clock = clock
        self._kinds: dict[tuple[str, int, str], tuple[float, int]] = {}  # -> (shown at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        shown = self._kinds.get(key)
        if shown is not None and now - shown[0] < self.every:
            self._kinds[key] = (shown[0], shown[1] + 1)
            return False
        if shown is not None and shown[1]:
            record.msg = (f"{record.msg} [{shown[1]} more like this in the last "
                          f"{now - shown[0]:.0f} s]")
        self._kinds[key] = (now, 0)
        if len(self._kinds) > 10_000:  # kinds are templates: this only bounds a pathological case
            self._kinds.clear()
        return True



class Throttle:
    """The same ``Summarized`` rule for a process's own repeated warnings (an offer, an
    announcement, a heartbeat that fails every second while the broker is away): per key,
    ``take(key)`` is the number of occurrences held back since the last one shown (0 for the
    first) when this one should be logged, else None (counted)."""

    def __init__(self, every: float = SUMMARY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._kinds: dict[str, tuple[float, int]] = {}  # key -> (shown at, held back since)

    def take(self, key: str) -> int | None:
        now = self._clock()
        shown = self._kinds.get(key)
        if shown is not None and now - shown[0] < self.every:
            self._kinds[key] = (shown[0], shown[1] + 1)
            return None
        self._kinds[key] = (now, 0)
        return shown[1] if shown is not None else 0


def configure_logging(level: str | None = None, json: bool | None = None) -> None:
    lvl = getattr(logging, (level or os.environ.get("CHRONOLOG_LOG_LEVEL", "INFO")).upper(),
                  logging.INFO)
    as_json = (not sys.stderr.isatty()) if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=STDERR),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=lvl, stream=STDERR,  # type: ignore[arg-type]
                        format="%(levelname)s %(name)s %(message)s")
    for handler in logging.getLogger().handlers:  # a handler's filter sees child loggers too
        if not any(isinstance(f, Summarized) for f in handler.filters):
            handler.addFilter(Summarized())
