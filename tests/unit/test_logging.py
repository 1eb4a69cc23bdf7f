"""Logging: library records are summarized (an outage reads as a few lines, not a flood), and
every line — chronolog's and the libraries' — is one JSON object when stderr is not a
terminal."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta

from chronolog.logging import Summarized, Throttle


def _record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_repeated_library_errors_pass_once_then_once_per_window_with_the_count() -> None:
    now = [100.0]
    f = Summarized(prefixes=("aiokafka",), every=30.0, clock=lambda: now[0])
    first = _record("aiokafka.conn", "Unable connect to node %s", 1)
    assert f.filter(first)
    for _ in range(500):
        now[0] += 0.01
        assert not f.filter(_record("aiokafka.conn", "Unable connect to node %s", 1))
    now[0] = 131.0
    later = _record("aiokafka.conn", "Unable connect to node %s", 1)
    assert f.filter(later)
    assert "[500 more like this in the last 31 s]" in later.getMessage()


def test_other_messages_and_other_loggers_are_not_held_back() -> None:
    f = Summarized(prefixes=("aiokafka",), every=30.0, clock=lambda: 0.0)
    assert f.filter(_record("aiokafka.conn", "Unable connect to node %s", 1))
    assert f.filter(_record("aiokafka.fetcher", "Failed fetch messages from %s", 1))
    for _ in range(3):
        assert f.filter(_record("chronolog.processor", "partition_assigned"))


def test_a_process_own_repeated_warning_is_shown_once_per_window_with_the_count() -> None:
    now = [0.0]
    t = Throttle(every=30.0, clock=lambda: now[0])
    assert t.take("offer_failed") == 0  # the first one is shown
    for _ in range(29):
        now[0] += 1.0
        assert t.take("offer_failed") is None  # held back
    assert t.take("announce_failed") == 0  # another kind is its own
    now[0] += 1.0
    assert t.take("offer_failed") == 29  # shown, with how many were held back


# ---- every line is JSON off a terminal, the libraries' included (a real process, stderr a pipe)

def _log_lines(code: str) -> list[dict[str, object]]:
    """Run ``code`` after ``configure_logging()`` in a fresh interpreter; its stderr lines,
    each parsed as JSON (a line that is not JSON fails the test)."""
    prelude = "import logging, structlog\nfrom chronolog.logging import configure_logging\n" \
              "configure_logging()\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_LOG")}
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return parsed


def test_a_library_warning_is_one_json_line_with_event_level_logger_and_timestamp() -> None:
    [line] = _log_lines('logging.getLogger("aiokafka").warning("Unable connect to node %s", 3)')
    assert line["event"] == "Unable connect to node 3"
    assert line["level"] == "warning"
    assert line["logger"] == "aiokafka"
    assert datetime.fromisoformat(str(line["timestamp"])).utcoffset() == timedelta(0)


def test_own_and_library_lines_share_the_format_and_repeats_are_summarized() -> None:
    lines = _log_lines("""
        for _ in range(50):
            logging.getLogger("asyncpg.pool").error("connection lost to %s", "db")
        structlog.get_logger("chronolog.projector").info("projector_started", partitions=4)
        structlog.get_logger("chronolog.projector").debug("below_the_level")
        logging.getLogger("httpx").info("HTTP Request: %s %s", "POST", "http://x")
        try:
            raise ValueError("bad")
        except ValueError:
            logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    """)
    assert [(x["logger"], x["level"], x["event"]) for x in lines] == [
        ("asyncpg.pool", "error", "connection lost to db"),  # the other 49 held back
        ("chronolog.projector", "info", "projector_started"),
        ("httpx", "info", "HTTP Request: POST http://x"),
        ("uvicorn.error", "error", "Exception in ASGI application"),
    ]
    assert lines[1]["partitions"] == 4
    assert "ValueError: bad" in str(lines[3]["exception"])
    assert all("timestamp" in x for x in lines)


def test_the_api_server_logs_through_the_same_setup() -> None:
    # uvicorn's own default config would install its handlers (plain text, no propagation)
    lines = _log_lines("""
        from chronolog.api.server import server_config
        server_config(object(), "127.0.0.1", 0, log_level="info")
        logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
        logging.getLogger("uvicorn.access").info("%s %s", "GET", "/healthz")
    """)
    assert [(x["logger"], x["event"]) for x in lines] == [
        ("uvicorn.error", "Invalid HTTP request received."), ("uvicorn.access", "GET /healthz")]
