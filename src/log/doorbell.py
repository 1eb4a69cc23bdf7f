"""Wake-ups between processes sharing one embedded log file: a doorbell per log instance.

Readers of the SQLite log would otherwise find new records only by polling. Each
``SqliteEventLog`` opens a ``Doorbell``: a Linux abstract-namespace datagram socket, named by
an empty marker file in ``<log file>.bells/``. After every write transaction the writer
``ring()``s every registered bell (one tiny datagram each, never blocking); a reader that found
nothing waits on its own bell with ``wait(seen, timeout)`` instead of sleeping, so it wakes as
soon as any process commits. Polling stays as the fallback with a longer interval: a lost or
unsupported ring (another OS, a full socket buffer, a bell registered a moment ago) only delays
a reader by that interval, it never loses a record.

A ring says which topics the transaction wrote: a 64-bit mask with one bit per topic
(``topic_bit``: a hash of the name, so two topics may share a bit). A reader waits only for
rings that touch the topics it reads (``mark``/``wait`` with its ``interest``), so a worker
following ``ready.<class>`` does not wake for every command appended. A ring without a mask
(an older writer) or with ``ALL`` wakes everybody; a shared bit only wakes a reader early.

A marker whose socket no longer answers (its process died) is removed by the next ring.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
import uuid
import zlib
from pathlib import Path

from chronolog.wakeup import Wakeup

REFRESH_S = 0.5  # how long a ringer trusts its list of bells before listing the folder again
ALL = (1 << 64) - 1  # a ring that wakes every reader (group membership, new topics)
_MASK = struct.Struct("<Q")


def topic_bit(topic: str) -> int:
    """The bit of ``topic`` in a ring's mask."""
    return 1 << (zlib.crc32(topic.encode()) & 63)


def _bits(mask: int) -> list[int]:
    return [b for b in range(64) if mask >> b & 1]


class Doorbell:
    """This process's bell on one log file, and the ringer of everybody's."""

    def __init__(self, log_path: Path) -> None:
        self.folder = Path(str(log_path) + ".bells")
        self.name = f"chronolog-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.rings = 0  # how many rings this bell has heard
        self._heard_by_bit = [0] * 64  # rings heard per topic bit
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
            self.folder.mkdir(mode=0o700, exist_ok=True)
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
        mask = 0
        try:
            while data := self._sock.recv(64):
                mask |= _MASK.unpack(data)[0] if len(data) == _MASK.size else ALL
        except OSError:  # drained (BlockingIOError) or closed
            pass
        self.rings += 1
        counts = self._heard_by_bit
        for b in (range(64) if mask == ALL else _bits(mask)):
            counts[b] += 1
        self._heard.fire()

    def mark(self, interest: int = ALL) -> int:
        """A count of the rings heard that touch ``interest`` (compare with a later one)."""
        if interest == ALL:
            return self.rings
        counts = self._heard_by_bit
        return sum(counts[b] for b in _bits(interest))

    async def wait(self, seen: int, timeout: float, interest: int = ALL) -> None:
        """Until a ring touching ``interest`` after the ones counted in ``seen`` (a ``mark``),
        or ``timeout`` seconds."""
        if self._heard is None:
            await asyncio.sleep(timeout)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.mark(interest) == seen:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await self._heard.wait(remaining)

    def ring(self, mask: int = ALL) -> None:
        """Wake the readers of the log file whose interest meets ``mask`` (the writer calls
        it after a commit, with the bits of the topics written; any thread)."""
        out = self._out
        if out is None or not mask:
            return
        data = _MASK.pack(mask)
        now = time.monotonic()
        if now - self._listed_at > REFRESH_S:
            try:
                self._targets = os.listdir(self.folder)
            except OSError:
                self._targets = []
            self._listed_at = now
        for name in self._targets:
            try:
                out.sendto(data, "\0" + name)
            except (ConnectionRefusedError, FileNotFoundError):
                (self.folder / name).unlink(missing_ok=True)  # its process is gone
            except OSError:
                pass  # a full buffer: that reader has rings waiting already
