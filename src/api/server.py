"""The API's HTTP server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import uvicorn

__all__ = ["Server", "server_config"]


def server_config(app: Any, host: str, port: int, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for the API. ``log_config=None``: uvicorn installs no handlers
    of its own, so its records go through the process's logging set-up
    (``chronolog.logging``: JSON lines when not on a terminal) like every other library's."""
    return uvicorn.Config(app, host=host, port=port, log_config=None, **options)


class Server(uvicorn.Server):
    """uvicorn without its own signal capture: uvicorn re-raises a captured SIGTERM after
    shutting down, which would kill the process before the log, client and projector
    close. Here SIGTERM/SIGINT only ask the server to exit; ``serve`` then cleans up."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def request_exit(self) -> None:
        self.should_exit = True
