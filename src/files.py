"""Files written whole or not at all: the content goes to a temporary file next to the target,
which is flushed to disk and renamed over the target, and the directory's entry is flushed
too — a crash leaves the old file or the new one, never a part (the archive's segments and
manifests, a backup's manifest and a restore's journal)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """Flush ``directory``'s entries (a rename in it) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (module docstring)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
