"""Taking turns at the embedded log's write lock.

SQLite has one write lock per database file and no queue for it: a writer that finds it
taken tries again (``chronolog.log.sqlite``'s ``_begin``, every 0.1-0.5 ms). A processor
committing one transaction after another takes the lock again within microseconds of
releasing it, so another process's small append — a worker's completions, a client's
commands, a worker's offers — could wait hundreds of milliseconds for a gap. In a burst of
10,000 runs the workers' appends waited up to 0.33 s, dozens of times over 50 ms, and with
them the completions that give the processor's dispatch its credit back: the first
assigned runs finished at once, and no run started for the next 0.8 s.

So a writer that has to wait says so: while it tries again it holds a shared ``flock`` on
``<log>-writers``. Before taking the write lock, a writer that is not waiting itself checks
for such a lock (an exclusive ``flock`` without blocking, which fails while anyone holds a
shared one) and lets the waiting writers in first: it sleeps in short steps while someone
still waits, for at most ``YIELD_MAX_S``. The check is two system calls when nobody waits.

``flock`` locks belong to an open file, not a process, so this holds between processes and
between logs opened in one process; a waiter that dies releases its lock with its file.
Nothing here decides correctness — SQLite's lock does; a file that cannot be opened only
turns the turns off (logged once).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from chronolog.log.datadir import PRIVATE_FILE

__all__ = ["SUFFIX", "YIELD_MAX_S", "WriteTurns"]

log = structlog.get_logger("chronolog.log.write_turns")

SUFFIX = "-writers"  # beside the database file, as SQLite's ``-wal`` and ``-shm``
YIELD_MAX_S = 0.002  # a waiter tries again every 0.5 ms at most: it gets several tries
YIELD_STEP_S = 0.0001


class WriteTurns:
    """One writer's view of who waits for the write lock of one database file."""

    def __init__(self, database: str | Path) -> None:
        self.path = Path(f"{database}{SUFFIX}")
        self._fd: int | None = None
        self._off = False

    def _file(self) -> int | None:
        if self._fd is None and not self._off:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                   PRIVATE_FILE)
            except OSError as exc:
                self._off = True
                log.warning("write_turns_off", path=str(self.path), error=str(exc))
        return self._fd

    def others_waiting(self) -> bool:
        """Whether another writer is waiting for the write lock now."""
        fd = self._file()
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    def let_others_in(self) -> None:
        """Before taking the write lock: wait (bounded) while another writer waits for it."""
        if not self.others_waiting():
            return
        deadline = time.monotonic() + YIELD_MAX_S
        while time.monotonic() < deadline:
            time.sleep(YIELD_STEP_S)
            if not self.others_waiting():
                return

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Held while this writer tries again for the write lock."""
        fd = self._file()
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)  # blocks at most for another writer's check
        try:
            yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
