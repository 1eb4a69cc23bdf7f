"""Library log records are summarized: an outage reads as a few lines, not a flood."""

from __future__ import annotations

import logging

from chronolog.logging import Summarized, Throttle


def _record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_repeated_library_errors_pass_once_then_once_per_window_with_the_count() -> None:
    now = [100.0]
    f = Summarized(prefixes=("aiokafka",), every=30.0, clock=lambda: now[0])
    first = _record("aiokafka.conn", "Unable connect to node %s", 1)
    assert f.filter(first)
    for _ in range(500):
        now[0] += 0.01
        assert not f.filter(_record("aiokafka.conn", "Unable connect to node %s", 1))
    now[0] = 131.0
    later = _record("aiokafka.conn", "Unable connect to node %s", 1)
    assert f.filter(later)
    assert "[500 more like this in the last 31 s]" in later.getMessage()


def test_other_messages_and_other_loggers_are_not_held_back() -> None:
    f = Summarized(prefixes=("aiokafka",), every=30.0, clock=lambda: 0.0)
    assert f.filter(_record("aiokafka.conn", "Unable connect to node %s", 1))
    assert f.filter(_record("aiokafka.fetcher", "Failed fetch messages from %s", 1))
    for _ in range(3):
        assert f.filter(_record("chronolog.processor", "partition_assigned"))


def test_a_process_own_repeated_warning_is_shown_once_per_window_with_the_count() -> None:
    now = [0.0]
    t = Throttle(every=30.0, clock=lambda: now[0])
    assert t.take("offer_failed") == 0  # the first one is shown
    for _ in range(29):
        now[0] += 1.0
        assert t.take("offer_failed") is None  # held back
    assert t.take("announce_failed") == 0  # another kind is its own
    now[0] += 1.0
    assert t.take("offer_failed") == 29  # shown, with how many were held back
