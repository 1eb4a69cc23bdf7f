"""Logging set-up: every line — chronolog's own (structlog) and the libraries' (aiokafka,
asyncpg, uvicorn, httpx: stdlib ``logging``) — is one structlog JSON object per line when the
output is not a terminal (``event``, ``level``, ``logger``, ``timestamp``, and the line's own
fields), and structlog's readable console format on a terminal.

``configure_logging()`` routes both through one stdlib handler whose formatter is structlog's
``ProcessorFormatter``: structlog events are handed to it as they are (``wrap_for_formatter``),
a library's ``LogRecord`` gets the same level, logger name and timestamp first.

Client libraries log every failed attempt while a service is down — thousands of lines a
minute. ``Summarized``, a filter on that handler, lets the first record of each kind from a
library logger through and then one summary per ``SUMMARY_S`` seconds with the count it held
back, so an outage reads as a few lines, not a flood.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import structlog

# at most one line per kind of library message in this many seconds
SUMMARY_S = float(os.environ.get("CHRONOLOG_LOG_SUMMARY_S", "30"))
# loggers of the libraries (client libraries, the HTTP server and client)
_SUMMARIZED = ("aiokafka", "kafka", "asyncpg", "uvicorn", "httpx", "httpcore")


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


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The one handler ``configure_logging`` installs on the root logger (and replaces when
    called again)."""


def configure_logging(level: str | None = None, json: bool | None = None,
                      stream: TextIO | None = None, library_level: str | None = None) -> None:
    """Log structlog events and stdlib records at ``level`` (default ``CHRONOLOG_LOG_LEVEL``,
    INFO) to ``stream`` (default stderr), as JSON unless ``stream`` is a terminal (``json``
    forces either). ``library_level``: a higher threshold for loggers outside chronolog."""
    lvl = _level(level or os.environ.get("CHRONOLOG_LOG_LEVEL", "INFO"))
    out: Any = STDERR if stream is None else stream
    as_json = (not out.isatty()) if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    shared: list[structlog.types.Processor] = [
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *shared,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = _Handler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
        foreign_pre_chain=shared,
    ))
    handler.addFilter(Summarized())  # a handler's filter sees every logger's records
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_level(library_level) if library_level else lvl)
    logging.getLogger("chronolog").setLevel(lvl)


def _level(name: str) -> int:
    level = getattr(logging, name.upper(), logging.INFO)
    return level if isinstance(level, int) else logging.INFO
