"""``DATA_DIR/node.lock``: one ``chronolog dev`` node per data directory.

A node shares nothing with another node on the same directory safely: the SQLite log, the
embedded PostgreSQL, ``node.json`` and the results are one node's. So the first thing
``chronolog dev`` does with its directory, once its whole configuration is checked (a start
refused for it leaves no lock file behind) — before it tightens its mode, opens its log file,
writes ``node.json`` or looks at the embedded PostgreSQL — is take an exclusive
``fcntl.flock`` on ``DATA_DIR/node.lock`` (``acquire_node_lock``), held for the node's life.
The holder then writes ``{"pid", "url"}`` into the file so that a node refused can name it.

* The lock belongs to an open file, not to the file name: the kernel releases it when the
  last process holding that open file exits, however it exits (``kill -9`` included). No
  stale lock is ever broken by guessing from a PID.
* Only the node and its PostgreSQL watchdog (``chronolog.devnode.watchdog``, which inherits
  the open file) hold it. A node killed with ``-9`` leaves its watchdog holding the lock
  while it stops the orphaned PostgreSQL; a start meanwhile sees a lock whose recorded node
  is gone and waits for it (``cleanup_wait_s``) instead of refusing.
* A lock whose recorded node is alive refuses at once: ``DataDirInUse`` names its PID and
  URL. A refused start writes nothing (the file exists already; it is opened without
  truncation and only read).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from chronolog.embedded_postgres import pid_alive

__all__ = ["LOCK_FILE", "DataDirInUse", "LockHolder", "NodeLock", "acquire_node_lock",
           "read_holder"]

LOCK_FILE = "node.lock"
_UNWRITTEN_WAIT_S = 2.0  # a holder writes its PID right after taking the lock


@dataclass(frozen=True)
class LockHolder:
    pid: int
    url: str


class DataDirInUse(Exception):
    """Another node holds the data directory."""

    def __init__(self, data_dir: Path, holder: LockHolder | None) -> None:
        self.data_dir = data_dir
        self.holder = holder
        who = ("another node (its PID is not recorded yet)" if holder is None
               else f"the node with PID {holder.pid} at {holder.url}")
        super().__init__(f"the data directory {data_dir} is in use by {who} (stop it first, "
                         f"or use --data-dir elsewhere)")


@dataclass
class NodeLock:
    """The held lock: ``fd`` is the open lock file (inherited by the watchdog)."""

    path: Path
    fd: int

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def read_holder(fd: int) -> LockHolder | None:
    """The node recorded in an open lock file; None when it holds no complete record."""
    try:
        raw = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    pid, url = raw.get("pid"), raw.get("url")
    if type(pid) is not int or pid <= 0 or not isinstance(url, str):
        return None
    return LockHolder(pid, url)


def acquire_node_lock(data_dir: Path, url: str, *, cleanup_wait_s: float = 60.0,
                      poll_s: float = 0.1) -> NodeLock:
    """Take ``data_dir/node.lock`` for this process (which serves at ``url``) or raise
    ``DataDirInUse``. A lock still held for a node that is gone (its watchdog is stopping its
    PostgreSQL) is waited for, at most ``cleanup_wait_s``."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _wait_for_lock(fd, data_dir, cleanup_wait_s, poll_s)
        record = json.dumps({"pid": os.getpid(), "url": url}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
    except BaseException:
        os.close(fd)
        raise
    return NodeLock(path, fd)


def _wait_for_lock(fd: int, data_dir: Path, cleanup_wait_s: float, poll_s: float) -> None:
    began = time.monotonic()
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        holder = read_holder(fd)
        waited = time.monotonic() - began
        if holder is None:
            if waited > _UNWRITTEN_WAIT_S:
                raise DataDirInUse(data_dir, None)
        elif pid_alive(holder.pid) or waited > cleanup_wait_s:
            raise DataDirInUse(data_dir, holder)
        elif not said:
            said = True
            print(f"note: the node with PID {holder.pid} on {data_dir} is gone; waiting for "
                  "its embedded PostgreSQL to be stopped", file=sys.stderr, flush=True)
        time.sleep(poll_s)
