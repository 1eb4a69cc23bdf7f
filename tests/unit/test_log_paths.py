"""A mistyped SQLite log path is said, not made: a ``sqlite:///path`` whose directory does
not exist is refused in one line with exit status 2 (nothing created), and a worker given a
log file that is not there yet says so on stderr before it waits on the new, empty log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.polling import wait_until_sync

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CHRONOLOG_")}


@pytest.mark.parametrize("command", [["worker", "--builtin-jobs"], ["processor"],
                                     ["dlq", "list"]])
def test_a_log_in_a_directory_that_does_not_exist_is_refused(tmp_path: Path,
                                                             command: list[str]) -> None:
    url = f"sqlite://{tmp_path / 'nonexistent' / 'dir' / 'log.db'}"
    r = subprocess.run([CHRONOLOG, *command, "--log", url], env=_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (2, (
        f"error: --log: '{url}': no directory {tmp_path / 'nonexistent' / 'dir'} "
        "(a SQLite log is a file in an existing directory)\n")), r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_a_worker_on_a_log_not_there_yet_says_so(tmp_path: Path) -> None:
    log = tmp_path / "typo.db"
    err = tmp_path / "worker.err"
    ready = tmp_path / "ready.json"
    with err.open("wb") as out:
        proc = subprocess.Popen([CHRONOLOG, "worker", "--builtin-jobs", "--log",
                                 f"sqlite://{log}", "--ready-file", str(ready)], env=_env(),
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=out)
    try:
        first = wait_until_sync(lambda: err.read_text().split("\n", 1)[0]
                                if "\n" in err.read_text() else None, 30,
                                what="the worker's first line")
        assert first == (f"warning: no log at {log} yet: this worker starts a new, empty log "
                         "there and waits for runs; is it the log its node or processor "
                         "writes?"), err.read_text()
        # stopped once it serves (a SIGTERM before its handlers exist is the default action)
        wait_until_sync(lambda: ready.exists() and '"ready": true' in ready.read_text(), 30,
                        what="the worker ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.read_text()[-2000:]
