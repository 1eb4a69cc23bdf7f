"""One dev node per data directory (``chronolog.devnode.lock``): a directory whose lock is
held by a live node is refused, naming that node and changing nothing; a lock whose holder
was killed with ``-9`` is released by the kernel and taken over; a lock still held for a
node that is gone (its watchdog stopping the PostgreSQL) is waited for, within a bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronolog.devnode.lock import LOCK_FILE, DataDirInUse, acquire_node_lock, read_holder
from support.polling import wait_until_sync

URL = "http://127.0.0.1:9090"

# a process that takes the lock the way a node does, records ``pid``, and holds it
HOLDER = """
import fcntl, json, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.pwrite(fd, json.dumps({"pid": int(sys.argv[2]) or os.getpid(), "url": sys.argv[3]}).encode(), 0)
print("held", flush=True)
sys.stdin.read()
"""


def hold(path: Path, pid: int = 0, url: str = URL) -> subprocess.Popen[str]:
    """A real process holding ``path`` (recording ``pid``, its own when 0) until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(pid), url],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_node_that_takes_a_data_directory_records_its_pid_and_url(tmp_path: Path) -> None:
    lock = acquire_node_lock(tmp_path / "new", URL)
    try:
        record = json.loads((tmp_path / "new" / LOCK_FILE).read_text())
        assert record == {"pid": os.getpid(), "url": URL}
    finally:
        lock.release()


def test_a_data_directory_held_by_a_live_node_is_refused_naming_it_and_unchanged(
    tmp_path: Path,
) -> None:
    holder = hold(tmp_path / LOCK_FILE)
    try:
        before = (tmp_path / LOCK_FILE).read_bytes()
        with pytest.raises(DataDirInUse) as refused:
            acquire_node_lock(tmp_path, "http://127.0.0.1:9091")
        assert str(refused.value) == (
            f"the data directory {tmp_path} is in use by the node with PID {holder.pid} at "
            f"{URL} (stop it first, or use --data-dir elsewhere)")
        assert (tmp_path / LOCK_FILE).read_bytes() == before
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_of_a_node_killed_with_sigkill_is_taken_over(tmp_path: Path) -> None:
    holder = hold(tmp_path / LOCK_FILE)
    holder.kill()  # SIGKILL: the kernel releases its flock
    holder.wait()
    lock = acquire_node_lock(tmp_path, "http://127.0.0.1:9091")
    try:
        assert read_holder(lock.fd) is not None
        assert read_holder(lock.fd).pid == os.getpid()  # type: ignore[union-attr]
    finally:
        lock.release()


def test_a_lock_held_for_a_node_that_is_gone_is_waited_for_then_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    gone = dead_pid()
    cleanup = hold(tmp_path / LOCK_FILE, pid=gone)  # the dead node's watchdog, say
    taken: list[object] = []
    waiter = threading.Thread(target=lambda: taken.append(
        acquire_node_lock(tmp_path, URL, cleanup_wait_s=60, poll_s=0.02)))
    waiter.start()
    seen: list[str] = []
    try:
        wait_until_sync(lambda: seen.append(capsys.readouterr().err) or "is gone" in "".join(seen),
                        20, "the note that it waits for the gone node")
        assert not taken  # still waiting while the lock is held
    finally:
        cleanup.kill()
        cleanup.wait()
        waiter.join(20)
    assert f"the node with PID {gone} on {tmp_path} is gone" in "".join(seen)
    assert len(taken) == 1
    taken[0].release()  # type: ignore[attr-defined]


def test_a_lock_held_too_long_for_a_gone_node_is_refused_naming_it(tmp_path: Path) -> None:
    gone = dead_pid()
    cleanup = hold(tmp_path / LOCK_FILE, pid=gone)
    try:
        with pytest.raises(DataDirInUse) as refused:
            acquire_node_lock(tmp_path, URL, cleanup_wait_s=0.2, poll_s=0.02)
        assert f"PID {gone} at {URL}" in str(refused.value)
    finally:
        cleanup.kill()
        cleanup.wait()


@given(st.binary(max_size=200))
def test_any_lock_file_content_reads_as_a_holder_or_none(content: bytes) -> None:
    with tempfile.TemporaryFile() as fh:
        fh.write(content)
        fh.flush()
        holder = read_holder(fh.fileno())
    assert holder is None or (holder.pid > 0 and isinstance(holder.url, str))


def test_a_data_dir_that_cannot_be_a_directory_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from chronolog.cli.main import main

    taken = tmp_path / "a-file"
    taken.write_text("not a directory\n")
    status = main(["dev", "--quiet", "--data-dir", str(taken), "--port", "9"])
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --data-dir: '{taken}': File exists"]
    assert taken.read_text() == "not a directory\n"


@pytest.mark.parametrize(("argv", "env", "line"), [
    ([], {"CHRONOLOG_VISIBLE_TIMEOUT": "soon"},
     "error: CHRONOLOG_VISIBLE_TIMEOUT: 'soon': not a number of seconds"),
    ([], {"CHRONOLOG_EFFECT_MAX_RESPONSE_BYTES": "0"},
     "error: CHRONOLOG_EFFECT_MAX_RESPONSE_BYTES: '0': must be 1..1073741824"),
    ([], {"CHRONOLOG_HEADER_TIMEOUT": "soon"},
     "error: CHRONOLOG_HEADER_TIMEOUT: expected a number, got 'soon'"),
    ([], {"CHRONOLOG_MAX_BODY_BYTES": "lots"}, "error: CHRONOLOG_MAX_BODY_BYTES: "),
    ([], {"CHRONOLOG_PRUNE_EVERY": "0s"}, "error: CHRONOLOG_PRUNE_EVERY: '0s': "),
    (["--partitions", "0"], {}, "error: --partitions: '0': must be 1..1024"),
    (["--retention", "forever"], {}, "error: --retention: 'forever': "),
])
def test_a_start_refused_for_its_configuration_leaves_no_data_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    argv: list[str], env: dict[str, str], line: str,
) -> None:
    from chronolog.cli.main import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fresh = tmp_path / "node"
    status = main(["dev", "--quiet", "--data-dir", str(fresh), "--port", "1", *argv])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and err.startswith(line), err
    assert not fresh.exists()  # no node.lock, no directory: nothing to clean up


def test_a_start_refused_for_a_port_in_use_leaves_no_data_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    import socket

    from chronolog.cli.main import main

    fresh = tmp_path / "node"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["dev", "--quiet", "--data-dir", str(fresh), "--host", "127.0.0.1",
                       "--port", str(port)])
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --port: '{port}': 127.0.0.1:{port} is in use"]
    assert not fresh.exists()
