"""Wake-ups between processes sharing one embedded log file: a doorbell per log instance.

Readers of the SQLite log would otherwise find new records only by polling. Each
``SqliteEventLog`` opens a ``Doorbell``: a Linux abstract-namespace datagram socket, named by
an empty marker file in ``<log file>.bells/``. After every write transaction the writer
``ring()``s every registered bell (one tiny datagram each, never blocking); a reader that found
nothing waits on its own bell with ``wait(seen, timeout)`` instead of sleeping, so it wakes as
soon as any process commits. Polling stays as the fallback with a longer interval: a lost or
unsupported ring (another OS, a full socket buffer, a bell registered a moment ago) only delays
a reader by that interval, it never loses a record.

A marker whose socket no longer answers (its process died) is removed by the next ring.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from pathlib import Path

from chronolog.wakeup import Wakeup

REFRESH_S = 0.5  # how long a ringer trusts its list of bells before listing the folder again


class Doorbell:
    """This process's bell on one log file, and the ringer of everybody's."""

    def __init__(self, log_path: Path) -> None:
        self.folder = Path(str(log_path) + ".bells")
        self.name = f"chronolog-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.rings = 0  # how many rings this bell has heard
        self._sock: socket.socket | None = None
        self._out: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heard: Wakeup | None = None
        self._targets: list[str] = []
        self._listed_at = 0.0

    @property
    def active(self) -> bool:
        return self._sock is not None

    def open(self) -> None:
        """Start listening (on the running loop); without abstract sockets, stay inactive."""
        try:
            self.folder.mkdir(exist_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind("\0" + self.name)
        except OSError:
            return
        sock.setblocking(False)
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._heard = Wakeup()
        self._loop.add_reader(sock.fileno(), self._on_readable)
        self._sock = sock
        (self.folder / self.name).touch()

    def close(self) -> None:
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._out is not None:
            self._out.close()
            self._out = None
        (self.folder / self.name).unlink(missing_ok=True)

    def _on_readable(self) -> None:
        assert self._sock is not None and self._heard is not None
        try:
            while self._sock.recv(64):
                pass
        except OSError:  # drained (BlockingIOError) or closed
            pass
        self.rings += 1
        self._heard.fire()

    async def wait(self, seen: int, timeout: float) -> None:
        """Until a ring after the one counted as ``seen``, or ``timeout`` seconds."""
        if self._heard is None:
            await asyncio.sleep(timeout)
            return
        if self.rings == seen:
            await self._heard.wait(timeout)

    def ring(self) -> None:
        """Wake every reader of the log file (called by the writer after a commit; any thread)."""
        out = self._out
        if out is None:
            return
        now = time.monotonic()
        if now - self._listed_at > REFRESH_S:
            try:
                self._targets = os.listdir(self.folder)
            except OSError:
                self._targets = []
            self._listed_at = now
        for name in self._targets:
            try:
                out.sendto(b"\x01", "\0" + name)
            except (ConnectionRefusedError, FileNotFoundError):
                (self.folder / name).unlink(missing_ok=True)  # its process is gone
            except OSError:
                pass  # a full buffer: that reader has rings waiting already
