"""The embedded PostgreSQL's watchdog: it stops the server when its dev node dies.

``pg_ctl`` detaches the postmaster from the process that started it, so a node killed with
``-9`` would leave its PostgreSQL running, holding its port and memory, until someone stops
it. ``chronolog dev`` therefore starts, before the server, a small process of its own
(``start_watchdog``): ``python -m chronolog.devnode.watchdog PGDATA``. It reads its standard
input, a pipe whose only writer is the node, until end of file — which comes when the node
exits, however it exits (the kernel closes the dead node's end). Then it stops the server
(``EmbeddedPostgres.stop``: a fast shutdown, escalated by PID; a no-op when the node already
stopped it) and exits.

The watchdog inherits the node's ``node.lock`` (``chronolog.devnode.lock``), so the data
directory stays locked until the server is stopped: a node started meanwhile waits for it
rather than adopting a server about to be stopped. It runs in a session of its own and
ignores SIGINT and SIGTERM: a Ctrl-C in the node's terminal (sent to the whole foreground
process group) stops the node, which stops the server; the watchdog merely follows.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["main", "start_watchdog"]


def start_watchdog(pgdata: Path, lock_fd: int | None) -> subprocess.Popen[bytes]:
    """Start the watchdog of the server in ``pgdata``; the node keeps the returned process's
    ``stdin`` open for its whole life (closing it lets the watchdog stop the server)."""
    return subprocess.Popen(
        [sys.executable, "-m", "chronolog.devnode.watchdog", str(pgdata)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
        pass_fds=() if lock_fd is None else (lock_fd,))


def main(argv: list[str] | None = None) -> int:
    """Wait for the end of standard input, then stop the server in ``argv[0]``."""
    args = sys.argv[1:] if argv is None else argv
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass  # the node writes nothing: this returns at its exit
    from chronolog.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError

    try:
        EmbeddedPostgres(Path(args[0])).stop()
    except EmbeddedPostgresError as exc:
        print(f"chronolog dev watchdog: could not stop the embedded PostgreSQL in {args[0]}: "
              f"{exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
