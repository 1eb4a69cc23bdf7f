"""Failed authentication: logged, and slowed per source address.

Every request that presents a token the API does not know (a Bearer token on the JSON
API, the token typed into the dashboard's login form) counts as a failure of its source
(the client's IP address as the server saw it). ``AuthFailures``:

* logs ``api_auth_failed`` (structlog, warning) with the source, the path and how many
  failures the source had in the window — at most one line per source per ``log_every``
  seconds, so a flood is a few lines, not thousands; never the token nor any part of it;
* once a source has ``max_failures`` failures within ``window`` seconds, answers its
  requests with 429 ``Retry-After`` (the time left in its window) before looking at any
  token — a guess then costs the guesser a wait; other sources are not affected.

The table is bounded (``max_sources``, the least recently failing source dropped first) and
nothing ever sleeps: a refused source gets its answer at once.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from chronolog.api.errors import ApiError

__all__ = ["AuthFailures", "source_of"]

log = structlog.get_logger("chronolog.api")


@dataclass
class _Source:
    start: float  # when its window began
    failures: int
    logged_at: float | None = None
    unlogged: int = 0  # failures since its last log line


def source_of(request: Any) -> str:
    client = request.scope.get("client")
    return str(client[0]) if client else "unknown"


class AuthFailures:
    def __init__(self, max_failures: int = 10, window: float = 60.0, log_every: float = 10.0,
                 max_sources: int = 10_000, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.max_failures = max_failures
        self.window = window
        self.log_every = log_every
        self.max_sources = max_sources
        self.clock = clock
        self._sources: OrderedDict[str, _Source] = OrderedDict()

    def retry_after(self, source: str) -> int | None:
        """Seconds the source must wait (None: it may try)."""
        s = self._sources.get(source)
        if s is None:
            return None
        left = s.start + self.window - self.clock()
        if left <= 0:
            del self._sources[source]
            return None
        return max(1, math.ceil(left)) if s.failures >= self.max_failures else None

    def refusal(self, request: Any) -> Any:
        """The 429 answer for a source over its limit (None: go on)."""
        wait = self.retry_after(source_of(request))
        if wait is None:
            return None
        return ApiError(429, f"too many failed authentications from this address; retry in "
                        f"{wait}s", "Authorization",
                        headers={"Retry-After": str(wait)}).response()

    def failed(self, request: Any) -> None:
        """Count (and maybe log) one failure of the request's source."""
        source = source_of(request)
        now = self.clock()
        s = self._sources.get(source)
        if s is None or now - s.start > self.window:
            s = _Source(now, 0)
        s.failures += 1
        s.unlogged += 1
        self._sources[source] = s
        self._sources.move_to_end(source)
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)
        if s.logged_at is None or now - s.logged_at >= self.log_every:
            log.warning("api_auth_failed", source=source, path=request.scope.get("path"),
                        failures=s.unlogged, failures_in_window=s.failures,
                        throttled=s.failures >= self.max_failures)
            s.logged_at = now
            s.unlogged = 0
