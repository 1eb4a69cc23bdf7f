"""The API's HTTP server: uvicorn, with bounds on what a client can hold.

* ``header_timeout``: a connection must send a complete request head (request line and
  headers) within this many seconds of connecting, or of its previous answer; otherwise it
  is closed. uvicorn has no such bound of its own (its keep-alive timeout runs only between
  requests, and stops at the first byte of the next), so ``GuardedH11Protocol`` adds it.
* ``body_timeout``: a request body must arrive within this many seconds of its head
  (``chronolog.api.limits.RequestGuard``: 408 otherwise).
* ``max_connections``: connections past this many are closed as soon as they open, before
  they can hold anything; uvicorn's ``limit_concurrency`` (the same number) answers 503 to a
  request arriving while the server is at it.

Each has a default and an environment variable (``server_limits``): a wrong value is a
usage error naming the variable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["GuardedH11Protocol", "Server", "ServerLimits", "server_config", "server_limits"]


@dataclass(frozen=True)
class ServerLimits:
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 1000
    session_max_age: float = 12 * 3600.0
    session_idle: float = 30 * 60.0
    secure_cookies: bool = False


_VARIABLES = {
    "header_timeout": "CHRONOLOG_HEADER_TIMEOUT",
    "body_timeout": "CHRONOLOG_BODY_TIMEOUT",
    "max_connections": "CHRONOLOG_MAX_CONNECTIONS",
    "session_max_age": "CHRONOLOG_SESSION_MAX_AGE",
    "session_idle": "CHRONOLOG_SESSION_IDLE",
    "secure_cookies": "CHRONOLOG_SECURE_COOKIES",
}


def server_limits(env: dict[str, str] | None = None) -> ServerLimits:
    """The limits from the environment (``CHRONOLOG_HEADER_TIMEOUT``,
    ``CHRONOLOG_BODY_TIMEOUT``, ``CHRONOLOG_MAX_CONNECTIONS``, ``CHRONOLOG_SESSION_MAX_AGE``,
    ``CHRONOLOG_SESSION_IDLE``: seconds; ``CHRONOLOG_SECURE_COOKIES``: 0 or 1), else the
    defaults; ValueError naming the variable when one is wrong."""
    source = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name, variable in _VARIABLES.items():
        raw = source.get(variable)
        if raw is None or not raw.strip():
            continue
        text = raw.strip()
        if name == "secure_cookies":
            if text not in ("0", "1"):
                raise ValueError(f"{variable}: expected 0 or 1, got {text[:40]!r}")
            values[name] = text == "1"
            continue
        try:
            value = int(text) if name == "max_connections" else float(text)
        except ValueError:
            raise ValueError(f"{variable}: expected a number, got {text[:40]!r}") from None
        if not 0 < value < 10**7:
            raise ValueError(f"{variable}: must be positive, got {text[:40]!r}")
        values[name] = value
    return ServerLimits(**values)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a connection cap (set on a subclass
    by ``server_config``)."""

    header_timeout: float = 10.0
    max_connections: int = 1000
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.abort()  # over the cap: closed before it can hold anything
            return
        self._await_head()

    def _await_head(self) -> None:
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a complete request head arrived
            self._stop_head_timer()

    def on_response_complete(self) -> None:
        self._await_head()  # the next request's head is bounded as the first one's
        cycle = self.cycle
        super().on_response_complete()
        if self.cycle is not cycle:  # a pipelined request was already here
            self._stop_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)


def server_config(app: Any, host: str, port: int, limits: ServerLimits | None = None,
                  **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for the API. ``log_config=None``: uvicorn installs no handlers
    of its own, so its records go through the process's logging set-up
    (``chronolog.logging``: JSON lines when not on a terminal) like every other library's.
    ``limits`` (default ``server_limits()``) bound the connections (module docstring)."""
    limits = limits or server_limits()
    protocol = type("Protocol", (GuardedH11Protocol,), {
        "header_timeout": limits.header_timeout, "max_connections": limits.max_connections})
    # uvicorn counts the connection asking too: at the cap, its request still passes
    options.setdefault("limit_concurrency", limits.max_connections + 1)
    return uvicorn.Config(app, host=host, port=port, log_config=None, http=protocol,
                          **options)


class Server(uvicorn.Server):
    """uvicorn without its own signal capture: uvicorn re-raises a captured SIGTERM after
    shutting down, which would kill the process before the log, client and projector
    close. Here SIGTERM/SIGINT only ask the server to exit; ``serve`` then cleans up."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def request_exit(self) -> None:
        self.should_exit = True
