"""``DATA_DIR/node.json``: where a running dev node serves its API, for the CLI to find it.

``chronolog dev`` writes ``{"url", "token", "pid"}`` once its API serves — mode 0600 (it
holds a token), atomically (a temporary file renamed over the old one) — and removes it on a
clean stop. A file left by a node that did not stop cleanly names a process that is gone:
``read_node_file`` ignores it. The token is the first token of the node's first tenant
(``dev`` without a tenants file), ``null`` when that tenant has none.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NODE_FILE", "NodeInfo", "api_url", "read_node_file", "remove_node_file",
           "write_node_file"]

NODE_FILE = "node.json"


@dataclass(frozen=True)
class NodeInfo:
    url: str
    token: str | None
    pid: int


def api_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches a server bound to ``host:port`` at (a
    wildcard address is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def write_node_file(data_dir: Path, info: NodeInfo) -> Path:
    """Write ``data_dir/node.json`` (0600) by renaming a complete temporary file over it."""
    final = data_dir / NODE_FILE
    tmp = data_dir / f".{NODE_FILE}.{info.pid}.tmp"
    data = json.dumps({"url": info.url, "token": info.token, "pid": info.pid}).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask, and an older temporary file's mode
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    return final


def remove_node_file(data_dir: Path, pid: int) -> None:
    """Remove ``node.json`` if it is this process's (another node may have written it)."""
    final = data_dir / NODE_FILE
    info = _load(final)
    if info is not None and info.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            final.unlink()


def read_node_file(data_dir: Path) -> NodeInfo | None:
    """The node recorded in ``data_dir`` if its process is alive; None when there is no
    file, it is not one of ours, or its process is gone."""
    info = _load(data_dir / NODE_FILE)
    if info is None or not _alive(info.pid):
        return None
    return info


def _load(path: Path) -> NodeInfo | None:
    try:
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    url, token, pid = raw.get("url"), raw.get("token"), raw.get("pid")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None
    if type(pid) is not int or pid <= 0 or not (token is None or isinstance(token, str)):
        return None
    return NodeInfo(url, token, pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except OverflowError:
        return False
    return True
