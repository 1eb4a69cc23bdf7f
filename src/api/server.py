"""The API's HTTP server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn


class Server(uvicorn.Server):
    """uvicorn without its own signal capture: uvicorn re-raises a captured SIGTERM after
    shutting down, which would kill the process before the log, client and projector
    close. Here SIGTERM/SIGINT only ask the server to exit; ``serve`` then cleans up."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def request_exit(self) -> None:
        self.should_exit = True
