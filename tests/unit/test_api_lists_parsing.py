"""What the tenant-wide lists and read-your-writes parse before any I/O: the states and
instants of the filters, the cursors (pinned to their filters, checked before the
database), the tenant a dead letter names, and the ``visible_timeout`` setting."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import orjson
import pytest

from chronolog.log.dead_letters import named_by
from chronolog.log.port import Topics
from chronolog.queries.read_model import (
    InvalidQuery,
    LetterQuery,
    RunListCursor,
    RunQuery,
    ScheduleQuery,
    decode_letter_cursor,
    decode_run_cursor,
    decode_run_list_cursor,
    decode_schedule_cursor,
    parse_list_instant,
    parse_schedule_states,
)
from chronolog.settings import ConfigError, visible_timeout

TOPICS = Topics(prefix="t.", partitions=4)
T0 = datetime(2026, 3, 8, 9, 0, tzinfo=UTC)


def _b64(data: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")


def _field(exc: pytest.ExceptionInfo[InvalidQuery]) -> str:
    return exc.value.field


def test_schedule_states_default_leaves_deleted_out_and_any_case_is_read() -> None:
    assert parse_schedule_states(None) == ("ACTIVE", "COMPLETED", "PAUSED")
    assert parse_schedule_states("") == ("ACTIVE", "COMPLETED", "PAUSED")
    assert parse_schedule_states(" deleted,Paused ,deleted") == ("DELETED", "PAUSED")
    for bad in ("BOGUS", "active,,x", ",", "ＡCTIVE"):
        with pytest.raises(InvalidQuery) as exc:
            parse_schedule_states(bad)
        assert _field(exc) == "state"


def test_list_instants_need_an_offset_and_stay_within_the_limits() -> None:
    assert parse_list_instant("2026-03-08T09:00:00Z", "from") == T0
    assert parse_list_instant("2026-03-08T14:30:00+05:30", "to") == T0
    for bad in ("2026-03-08T09:00:00", "2026-03-08", "now", "", "3000-01-01T00:00:00Z",
                "1969-12-31T23:59:59Z", "２０２６-03-08T09:00:00Z", "2026-03-08T09:00:00 05:00"):
        with pytest.raises(InvalidQuery) as exc:
            parse_list_instant(bad, "to")
        assert _field(exc) == "to", bad


def test_from_after_to_is_refused_naming_from() -> None:
    with pytest.raises(InvalidQuery) as exc:
        RunQuery(since=T0.replace(hour=10), until=T0)
    assert _field(exc) == "from"
    assert RunQuery(since=T0, until=T0).pinned()["a"] == "2026-03-08T09:00:00Z"


def test_a_schedule_cursor_pins_its_filters_and_is_checked() -> None:
    q = ScheduleQuery(prefix="nightly")
    good = _b64({"k": "schedules", "f": q.pinned(), "l": "nightly-2"})
    assert decode_schedule_cursor(good, q) == "nightly-2"
    for other in (ScheduleQuery(), ScheduleQuery(prefix="n"), ScheduleQuery(
            states=("PAUSED",), prefix="nightly"), ScheduleQuery(job_type="x", prefix="nightly")):
        with pytest.raises(InvalidQuery, match="another query") as exc:
            decode_schedule_cursor(good, other)
        assert _field(exc) == "after"
    for bad in ("garbage", "", "e30", _b64([1]), _b64({"k": "schedules", "f": q.pinned()}),
                _b64({"k": "schedules", "f": q.pinned(), "l": "a b"}),
                _b64({"k": "schedules", "f": q.pinned(), "l": "x" * 201}),
                _b64({"k": "schedules", "f": q.pinned(), "l": "..\u0000"}),
                _b64({"k": "schedules", "f": {"p": "nightly\u0000"}, "l": "a"})):
        with pytest.raises(InvalidQuery, match="not a cursor") as exc:
            decode_schedule_cursor(bad, q)
        assert _field(exc) == "after"


def test_a_run_list_cursor_pins_its_filters_and_is_not_a_schedules_runs_cursor() -> None:
    q = RunQuery(states=("READY",), job_type="report")
    cursor = RunListCursor((T0, "r_b"), (T0, "r_a")).encode(q)
    assert decode_run_list_cursor(cursor, q) == RunListCursor((T0, "r_b"), (T0, "r_a"))
    with pytest.raises(InvalidQuery, match="another query"):
        decode_run_list_cursor(cursor, RunQuery(states=("READY",)))
    with pytest.raises(InvalidQuery, match="another query"):
        decode_run_cursor(cursor, "s", ["READY"])
    iso = T0.isoformat()
    for bad in (_b64({"k": "runs", "f": q.pinned(), "b": [iso, "r_b"], "l": [iso, "r a"]}),
                _b64({"k": "runs", "f": q.pinned(), "b": ["2026-03-08T09:00:00", "r_b"],
                      "l": [iso, "r_a"]}),
                _b64({"k": "runs", "f": q.pinned(), "b": [iso, "r_b"]}),
                _b64({"k": "runs", "f": q.pinned(), "b": [iso, 7], "l": [iso, "r_a"]})):
        with pytest.raises(InvalidQuery, match="not a cursor"):
            decode_run_list_cursor(bad, q)


def test_a_dead_letter_cursor_pins_the_view_and_the_consumer() -> None:
    ops, mine = LetterQuery(), LetterQuery(tenant="acme", consumer="proc*")
    at = T0.isoformat()
    cursor = _b64({"k": "dlq", "f": mine.pinned(), "l": [at, 0, 12]})
    assert decode_letter_cursor(cursor, mine).offset == 12
    with pytest.raises(InvalidQuery, match="another query"):
        decode_letter_cursor(cursor, ops)
    for pos in ([at, 0], [at, -1, 3], [at, 0, True], [at, 2**31, 1], ["2026-03-08", 0, 1],
                [at, 0, 2**63]):
        with pytest.raises(InvalidQuery, match="not a cursor"):
            decode_letter_cursor(_b64({"k": "dlq", "f": mine.pinned(), "l": pos}), mine)


def test_a_dead_letter_names_the_tenant_and_schedule_of_its_record() -> None:
    command = json.dumps({"tenant": "acme", "schedule_id": "nightly", "type": "x"}).encode()
    assert named_by(TOPICS, TOPICS.commands, b"other/key", command) == ("acme", "nightly")
    assert named_by(TOPICS, TOPICS.ready("default"), None, command) == ("acme", "nightly")
    # bytes that are not JSON: the key of commands and events
    assert named_by(TOPICS, TOPICS.commands, b"acme/x:1", b"\xff") == ("acme", "x:1")
    assert named_by(TOPICS, TOPICS.events, b"acme/@quota", b"{") == ("acme", "@quota")
    assert named_by(TOPICS, TOPICS.replies, b"acme/x", b"\xff") == (None, None)
    assert named_by(TOPICS, TOPICS.commands, None, b"\xff") == (None, None)
    assert named_by(TOPICS, TOPICS.commands, b"\xff/x", b"\xff") == (None, None)
    # only values of the shape of a tenant name and a schedule ID
    assert named_by(TOPICS, TOPICS.commands, b"ac me/x", b"[]") == (None, None)
    assert named_by(TOPICS, TOPICS.commands, b"acme/a b", b"1") == ("acme", None)
    weird = json.dumps({"tenant": "x\u0000", "schedule_id": "s"}).encode()
    assert named_by(TOPICS, TOPICS.commands, b"acme/s", weird) == ("acme", "s")
    assert named_by(TOPICS, TOPICS.events, None, json.dumps(
        {"tenant": "acme", "schedule_id": 5}).encode()) == ("acme", None)


def test_visible_timeout_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CHRONOLOG_VISIBLE_TIMEOUT", raising=False)
    assert visible_timeout() == 2.0
    assert visible_timeout(0.5) == 0.5 and visible_timeout("0") == 0.0
    monkeypatch.setenv("CHRONOLOG_VISIBLE_TIMEOUT", "7.5")
    assert visible_timeout() == 7.5 and visible_timeout(1) == 1.0
    for bad in ("abc", "-1", "61", "nan", "inf", "１"):
        monkeypatch.setenv("CHRONOLOG_VISIBLE_TIMEOUT", bad)
        with pytest.raises(ConfigError, match="visible-timeout"):
            visible_timeout()
