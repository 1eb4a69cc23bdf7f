"""The data directory's files are its owner's alone.

A data directory holds every tenant's data: the log (``log.db``, its ``-wal``/``-shm``,
``-writers``, where its writers take turns, and ``-group``, its consumer groups' membership),
staged results, the node file with a token, the
embedded PostgreSQL with its password.
Another local user must read none of it, so chronolog creates them private from the first
byte: the process umask is 077 (``private_umask``, set where a node or the command line
starts), directories are made 0700 and files 0600 with explicit modes.

A directory or log file found wider at start (made by an older chronolog, or by hand) is
tightened, with a warning that names the path and both modes (``tighten``). One exception:
a directory that the embedded PostgreSQL's own user must traverse when chronolog runs as
root keeps its "others may traverse" bit (x without r: nobody else can list it, and what is
inside is private anyway).
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

__all__ = ["PRIVATE_DIR", "PRIVATE_FILE", "private_dir", "private_umask", "tighten"]

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600

log = logging.getLogger(__name__)


def private_umask() -> None:
    """Every file and directory this process creates from now on is its owner's only."""
    os.umask(0o077)


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) 0700, or tighten it if it exists wider."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    tighten(path)
    return path


def tighten(path: Path) -> bool:
    """Remove the group and others' bits of ``path`` if it has any (a warning on stderr and
    in the log names the path and both modes); True when it was too wide. A missing path is
    left alone. Run as root, a directory keeps others' traverse bit (see the module)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    mode = stat.S_IMODE(st.st_mode)
    allowed = 0o001 if stat.S_ISDIR(st.st_mode) and os.geteuid() == 0 else 0
    wide = mode & 0o077 & ~allowed
    if not wide:
        return False
    new = mode & ~wide
    os.chmod(path, new)
    message = (f"{path} had mode {mode:04o}: other local users could read or change it; "
               f"tightened to {new:04o}")
    print(f"warning: {message}", file=sys.stderr, flush=True)
    log.warning("data_file_mode_tightened path=%s mode=%04o new_mode=%04o", path, mode, new)
    return True
