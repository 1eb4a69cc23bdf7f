"""structlog configuration: JSON lines when not on a terminal, readable on a terminal."""

from __future__ import annotations

import logging
import os
import sys

import structlog


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
