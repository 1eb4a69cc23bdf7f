"""Writers of one embedded log take turns at its write lock (``chronolog.log.write_turns``):
a writer that waits says so, and one that is not waiting lets it in first — between
processes and between logs opened in one process (a lock per open file)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chronolog.log import write_turns
from chronolog.log.write_turns import YIELD_MAX_S, WriteTurns


def test_nobody_waits_until_a_writer_says_it_does(tmp_path: Path) -> None:
    mine, theirs = WriteTurns(tmp_path / "log.db"), WriteTurns(tmp_path / "log.db")
    try:
        assert not mine.others_waiting()
        with theirs.waiting():
            assert mine.others_waiting()
        assert not mine.others_waiting()
    finally:
        mine.close()
        theirs.close()


def test_a_writer_that_is_not_waiting_lets_a_waiting_one_in_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the bound made long, so the waiter's thread gets in within it however loaded the
    # machine (its real length is the next test's)
    monkeypatch.setattr(write_turns, "YIELD_MAX_S", 5.0)
    mine, theirs = WriteTurns(tmp_path / "log.db"), WriteTurns(tmp_path / "log.db")
    waiting, leave = threading.Event(), threading.Event()

    def wait_then_take_the_lock() -> None:
        with theirs.waiting():
            waiting.set()
            leave.wait(5)

    t = threading.Thread(target=wait_then_take_the_lock)
    t.start()
    try:
        assert waiting.wait(5)
        timer = threading.Timer(YIELD_MAX_S / 4, leave.set)  # it gets the lock meanwhile
        timer.start()
        started = time.monotonic()
        mine.let_others_in()
        waited = time.monotonic() - started
        assert leave.is_set()  # it did not go first: it waited while the other one waited
        assert waited < 4.0  # until the other one was in, not until the bound
    finally:
        leave.set()
        t.join(5)
        mine.close()
        theirs.close()


def test_a_writer_does_not_wait_long_for_a_waiter_that_never_gets_in(tmp_path: Path) -> None:
    mine, theirs = WriteTurns(tmp_path / "log.db"), WriteTurns(tmp_path / "log.db")
    try:
        with theirs.waiting():
            started = time.monotonic()
            mine.let_others_in()
            assert time.monotonic() - started >= YIELD_MAX_S
            assert time.monotonic() - started < 1.0
    finally:
        mine.close()
        theirs.close()


def test_the_turns_file_is_private_to_the_logs_user(tmp_path: Path) -> None:
    turns = WriteTurns(tmp_path / "log.db")
    try:
        turns.others_waiting()
        assert (turns.path.stat().st_mode & 0o777) == 0o600
    finally:
        turns.close()
