"""Where the user CLI sends a command, without a node: flags and variables, the dev node's
``node.json`` (written 0600, ignored when stale, unreadable or not one of ours), what is
bad input (exit 2, one line, nothing sent) and what is ``unavailable`` (exit 1); then
``chronolog --version`` and shell completion.

Connections go to a real loopback socket that is bound but not listening (refused).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from chronolog.cli.main import main
from chronolog.devnode.nodefile import (
    NodeInfo,
    api_url,
    read_node_file,
    remove_node_file,
    write_node_file,
)

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
REGISTER = str(Path(sys.executable).parent / "register-python-argcomplete")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CHRONOLOG_* of the developer's shell; the working directory has no node."""
    for name in list(os.environ):
        if name.startswith("CHRONOLOG_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def refused() -> Iterator[int]:
    """A loopback port that refuses connections while the test runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _no_node(where: str) -> str:
    return (f"error: no chronolog node found at {where}; pass --url URL --token TOKEN (or set "
            f"CHRONOLOG_URL, CHRONOLOG_TOKEN), or start one with 'chronolog dev'")


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)  # reaped by run(): the PID names no process now


# =======================================================================================
# node.json


def test_the_node_file_is_written_0600_and_removed_only_by_its_node(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = write_node_file(tmp_path, NodeInfo("http://127.0.0.1:8080", "dev", os.getpid()))
    finally:
        os.umask(old)
    assert path == tmp_path / "node.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": "http://127.0.0.1:8080", "token": "dev",
                                            "pid": os.getpid()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.json"]  # no temporary left
    assert read_node_file(tmp_path) == NodeInfo("http://127.0.0.1:8080", "dev", os.getpid())
    remove_node_file(tmp_path, os.getpid() + 1)  # not that process's file
    assert path.exists()
    remove_node_file(tmp_path, os.getpid())
    assert not path.exists()
    remove_node_file(tmp_path, os.getpid())  # nothing to remove: no error


@pytest.mark.parametrize("content", [
    None, "", "not json", "[]", '{"url": "ftp://x", "token": "t", "pid": 1}',
    '{"url": "http://127.0.0.1:1", "token": 7, "pid": 1}',
    '{"url": "http://127.0.0.1:1", "token": "t", "pid": "1"}',
    '{"url": "http://127.0.0.1:1", "token": "t", "pid": true}',
])
def test_a_node_file_that_is_not_one_of_ours_is_ignored(tmp_path: Path,
                                                        content: str | None) -> None:
    if content is not None:
        (tmp_path / "node.json").write_text(content)
    assert read_node_file(tmp_path) is None


def test_a_stale_node_file_is_ignored(tmp_path: Path) -> None:
    write_node_file(tmp_path, NodeInfo("http://127.0.0.1:8080", "dev", _dead_pid()))
    assert read_node_file(tmp_path) is None


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:9"), ("0.0.0.0", "http://127.0.0.1:9"),
    ("::", "http://[::1]:9"), ("::1", "http://[::1]:9"), ("localhost", "http://localhost:9"),
])
def test_the_recorded_url_is_reachable_from_this_machine(host: str, url: str) -> None:
    assert api_url(host, 9) == url


# =======================================================================================
# finding a node


def test_no_node_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    rc, out, err = _run(capsys, "schedule", "list")
    assert rc == 2 and out == "" and _one_line(err) == _no_node("./.chronolog")
    rc, out, err = _run(capsys, "runs", "s1", "--json", "--data-dir", str(tmp_path / "d"))
    assert rc == 2 and out == "" and _one_line(err) == _no_node(str(tmp_path / "d"))


def test_the_data_dir_from_the_environment(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONOLOG_DATA_DIR", "nodes/here")
    rc, _, err = _run(capsys, "workers", "list")
    assert rc == 2 and _one_line(err) == _no_node("./nodes/here")


def test_a_stale_node_is_no_node(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ddir = tmp_path / ".chronolog"
    ddir.mkdir()
    write_node_file(ddir, NodeInfo("http://127.0.0.1:8080", "dev", _dead_pid()))
    rc, out, err = _run(capsys, "schedule", "show", "s1")
    assert rc == 2 and out == "" and _one_line(err) == _no_node("./.chronolog")


def test_a_recorded_node_that_does_not_answer_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, refused: int,
) -> None:
    ddir = tmp_path / ".chronolog"
    ddir.mkdir()
    url = f"http://127.0.0.1:{refused}"
    write_node_file(ddir, NodeInfo(url, "dev", os.getpid()))  # a live process
    for argv in (["schedule", "show", "s1"],
                 ["schedule", "create", "s1", "--every", "1m", "--job", "echo", "--json"]):
        rc, out, err = _run(capsys, *argv)
        assert rc == 2 and out == "", argv
        assert _one_line(err) == (
            f"error: the chronolog node recorded in ./.chronolog ({url}, pid {os.getpid()}) "
            f"does not answer; pass --url URL --token TOKEN (or set CHRONOLOG_URL, "
            f"CHRONOLOG_TOKEN), or start one with 'chronolog dev'")


def test_a_given_url_that_refuses_is_unavailable(
    capsys: pytest.CaptureFixture[str], refused: int,
) -> None:
    url = f"http://127.0.0.1:{refused}"
    rc, out, err = _run(capsys, "run", "r_1", "--url", url, "--token", "t", "--json")
    assert rc == 1
    line = _one_line(err)
    assert line.startswith(f"error: unavailable: cannot reach {url}: "), line
    assert json.loads(out) == {"error": "unavailable", "field": None,
                               "message": line.removeprefix("error: unavailable: ")}


def test_the_url_flag_wins_over_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, refused: int,
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        env_url = f"http://127.0.0.1:{other.getsockname()[1]}"
        monkeypatch.setenv("CHRONOLOG_URL", env_url)
        monkeypatch.setenv("CHRONOLOG_LOG", "sqlite:///nonexistent/x.db")  # the URL wins
        rc, _, err = _run(capsys, "workers", "list")
        assert rc == 1 and f"cannot reach {env_url}: " in err
        flag_url = f"http://127.0.0.1:{refused}"
        rc, _, err = _run(capsys, "workers", "list", "--url", flag_url)
        assert rc == 1 and f"cannot reach {flag_url}: " in err and env_url not in err


def test_the_log_from_the_environment_is_direct_access(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHRONOLOG_LOG", "sqlite:///nonexistent/x.db")
    rc, out, err = _run(capsys, "runs")
    assert rc == 2 and out == ""
    assert _one_line(err) == "error: runs across schedules need the API (--url)"


@pytest.mark.parametrize(("argv", "line"), [
    (["runs", "s1", "--url", "http://127.0.0.1:9", "--log", "sqlite:///x.db"],
     "error: --url (a node's HTTP API) and --log (direct access to the log) exclude "
     "each other"),
    (["runs", "s1", "--log", "sqlite:///x.db", "--token", "t"],
     "error: --token applies to the HTTP API (--url); --log accesses the log directly"),
    (["runs", "s1", "--url", "http://127.0.0.1:9", "--database-url", "postgresql://x/y"],
     "error: --database-url applies to direct access to the log (--log); over "
     "the HTTP API the node reads its own read model"),
    (["run", "r1", "--url", "http://127.0.0.1:9", "--tenant", "acme"],
     "error: --tenant applies to direct access to the log (--log); over the HTTP API "
     "the token names the tenant"),
    (["workers", "list", "--partitions", "4"],
     "error: --partitions applies to direct access to the log (--log); over the "
     "HTTP API the node knows its log"),
    (["run", "r1", "--url", "localhost:8080"],
     "error: --url: 'localhost:8080': expected http://host:port (or https://)"),
    (["run", "r1", "--url", "http://127.0.0.1:99999"],
     "error: --url: 'http://127.0.0.1:99999': expected http://host:port (or https://)"),
    (["run", "r1", "--url", "http://127.0.0.1:9", "--token", "a b"],
     "error: --token: a token is printable ASCII without spaces"),
    (["run", "r1", "--url", "http://127.0.0.1:9", "--token", ""], "error: --token: empty"),
    (["runs", "--log", "sqlite:///nonexistent/x.db"],
     "error: runs across schedules need the API (--url)"),
    (["runs", "s1", "--job-type", "echo", "--log", "sqlite:///nonexistent/x.db"],
     "error: runs by job type or time need the API (--url)"),
    (["schedule", "list", "--prefix", "a", "--log", "sqlite:///nonexistent/x.db"],
     "error: schedule list --prefix needs the API (--url)"),
    (["schedule", "list", "--after", "abc", "--log", "sqlite:///nonexistent/x.db"],
     "error: schedule list --after needs the API (--url)"),
])
def test_where_to_send_is_checked_before_sending(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str,
) -> None:
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == "" and _one_line(err) == line


def test_the_url_variable_is_checked(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHRONOLOG_URL", "127.0.0.1:8080")
    rc, _, err = _run(capsys, "workers", "list")
    assert rc == 2 and _one_line(err) == ("error: CHRONOLOG_URL: '127.0.0.1:8080': expected "
                                          "http://host:port (or https://)")


# =======================================================================================
# --version, completion


def test_version_prints_the_installed_version() -> None:
    r = subprocess.run([CHRONOLOG, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == f"chronolog {version('chronolog')}\n"
    assert r.stderr == ""


def _complete(line: str, tmp_path: Path) -> list[str]:
    out = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line,
           "COMP_POINT": str(len(line)), "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}
    r = subprocess.run([CHRONOLOG], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return out.read_text().split("\v")


def test_completion_of_commands_and_flags(tmp_path: Path) -> None:
    assert [c.strip() for c in _complete("chronolog sch", tmp_path)] == ["schedule"]
    assert {c.strip() for c in _complete("chronolog schedule ", tmp_path)} >= {
        "create", "revise", "pause", "resume", "delete", "list", "show"}
    flags = {c.strip() for c in _complete("chronolog runs --", tmp_path)}
    assert {"--url", "--token", "--log", "--job-type", "--from", "--to", "--after"} <= flags
    script = subprocess.run([REGISTER, "chronolog"], capture_output=True, text=True,
                            timeout=60)
    assert script.returncode == 0 and "complete" in script.stdout
    assert "chronolog" in script.stdout
