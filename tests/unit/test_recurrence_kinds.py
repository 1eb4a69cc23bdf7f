"""Interval, one-shot and delay triggers; start/end bounds; jitter; compile_trigger's contract."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from chronolog.domain.recurrence import (
    DelayTrigger,
    RecurrenceError,
    Trigger,
    compile_trigger,
    jitter_offset,
    parse_instant,
    upcoming,
)

ROOT = Path(__file__).resolve().parents[2]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


# ---------------------------------------------------------------- every


def test_every_is_aligned_to_anchor() -> None:
    trigger = compile_trigger(every="15m", anchor=utc("2026-01-01T00:07:00Z"))
    assert upcoming(trigger, utc("2026-01-01T10:00:00Z"), 3) == [
        utc("2026-01-01T10:07:00Z"),
        utc("2026-01-01T10:22:00Z"),
        utc("2026-01-01T10:37:00Z"),
    ]


def test_every_is_strictly_after_so_anchor_itself_is_skipped_when_after_equals_it() -> None:
    trigger = compile_trigger(every=90, anchor=utc("2026-01-01T00:00:00Z"))
    assert trigger.next_after(utc("2026-01-01T00:00:00Z")) == utc("2026-01-01T00:01:30Z")


def test_every_before_anchor_still_aligns_backwards() -> None:
    trigger = compile_trigger(every="1h", anchor=utc("2026-01-01T00:30:00Z"))
    assert trigger.next_after(utc("2025-12-31T22:00:00Z")) == utc("2025-12-31T22:30:00Z")


def test_every_counts_real_elapsed_time_across_dst() -> None:
    trigger = compile_trigger(every="1h", anchor=utc("2026-03-08T05:00:00Z"),
                              timezone="America/New_York")
    walls = [i.astimezone(trigger.zone).strftime("%H:%M%z")  # type: ignore[attr-defined]
             for i in upcoming(trigger, utc("2026-03-08T05:00:00Z"), 3)]
    assert walls == ["01:00-0500", "03:00-0400", "04:00-0400"]


def test_every_keeps_microseconds_exact() -> None:
    trigger = compile_trigger(every="500ms", anchor=utc("2026-01-01T00:00:00.250000Z"))
    assert trigger.next_after(utc("2026-01-01T00:00:01Z")) == utc("2026-01-01T00:00:01.250000Z")


def test_every_without_anchor_is_rejected() -> None:
    with pytest.raises(RecurrenceError) as caught:
        compile_trigger(every="5m")
    assert caught.value.field == "anchor"


@pytest.mark.parametrize(
    ("every", "message"),
    [
        ("5x", "invalid every '5x': unknown unit 'x' (use ms, s, m, h, d, w)"),
        ("0s", "invalid every '0s': must be greater than zero"),
        ("-5m", "invalid every '-5m': must not be negative"),
        ("P1M",
         "invalid every 'P1M': ISO-8601 years and months have no fixed length; use days or weeks"),
    ],
)
def test_invalid_every_names_field_and_value(every: str, message: str) -> None:
    with pytest.raises(RecurrenceError) as caught:
        compile_trigger(every=every, anchor=utc("2026-01-01T00:00:00Z"))
    assert str(caught.value) == message and caught.value.field == "every"


# ---------------------------------------------------------------- at


def test_at_fires_once_then_is_exhausted() -> None:
    trigger = compile_trigger(at="2026-06-01T09:00:00Z")
    assert trigger.next_after(utc("2026-01-01T00:00:00Z")) == utc("2026-06-01T09:00:00Z")
    assert trigger.next_after(utc("2026-06-01T09:00:00Z")) is None


def test_at_naive_text_is_wall_time_in_the_zone() -> None:
    trigger = compile_trigger(at="2026-07-01T09:00:00", timezone="Europe/London")
    assert trigger.next_after(utc("2026-01-01T00:00:00Z")) == utc("2026-07-01T08:00:00Z")


def test_at_naive_in_gap_shifts_forward_and_ambiguous_takes_first_pass() -> None:
    assert (compile_trigger(at="2026-03-08T02:30", timezone="America/New_York").at  # type: ignore[attr-defined]
            == utc("2026-03-08T07:00:00Z"))
    assert (compile_trigger(at="2026-11-01T01:30", timezone="America/New_York").at  # type: ignore[attr-defined]
            == utc("2026-11-01T05:30:00Z"))


def test_at_accepts_aware_datetime() -> None:
    at = datetime(2026, 6, 1, 9, tzinfo=timezone(timedelta(hours=2)))
    assert (compile_trigger(at=at).next_after(utc("2026-01-01T00:00:00Z"))
            == utc("2026-06-01T07:00:00Z"))


def test_invalid_at_names_field_and_value() -> None:
    with pytest.raises(RecurrenceError) as caught:
        compile_trigger(at="tomorrow")
    assert str(caught.value) == ("invalid at 'tomorrow': not an ISO-8601 date-time such as "
                                 "2026-03-08T09:00:00Z")


# ---------------------------------------------------------------- delay


def test_delay_fires_fixed_delay_after_previous_finish() -> None:
    trigger = compile_trigger(delay="10m")
    assert trigger.kind == "delay"
    assert trigger.next_after(utc("2026-01-01T12:03:17Z")) == utc("2026-01-01T12:13:17Z")


def test_delay_first_run_is_the_anchor_itself() -> None:
    trigger = compile_trigger(delay="10m")
    assert isinstance(trigger, DelayTrigger)
    assert trigger.first_instant(utc("2026-01-01T12:00:00Z")) == utc("2026-01-01T12:00:00Z")


def test_delay_must_be_positive() -> None:
    with pytest.raises(RecurrenceError) as caught:
        compile_trigger(delay=0)
    assert str(caught.value) == "invalid delay '0': must be greater than zero"


# ---------------------------------------------------------------- bounds


def test_cron_never_fires_before_start() -> None:
    trigger = compile_trigger(cron="0 * * * *", start=utc("2026-01-01T05:00:00Z"))
    assert trigger.next_after(utc("2026-01-01T00:00:00Z")) == utc("2026-01-01T05:00:00Z")


def test_cron_start_with_fraction_rounds_up_to_next_match() -> None:
    trigger = compile_trigger(cron="* * * * *", start=utc("2026-01-01T05:00:00.5Z"))
    assert trigger.next_after(utc("2026-01-01T00:00:00Z")) == utc("2026-01-01T05:01:00Z")


def test_cron_is_exhausted_after_end() -> None:
    trigger = compile_trigger(cron="0 * * * *", end=utc("2026-01-01T02:00:00Z"))
    assert (upcoming(trigger, utc("2026-01-01T00:30:00Z"), 5)
            == [utc("2026-01-01T01:00:00Z"), utc("2026-01-01T02:00:00Z")])
    assert trigger.next_after(utc("2026-01-01T02:00:00Z")) is None


def test_every_respects_start_and_end() -> None:
    trigger = compile_trigger(
        every="1h", anchor=utc("2026-01-01T00:00:00Z"), start=utc("2026-01-01T03:00:00Z"),
        end=utc("2026-01-01T04:00:00Z")
    )
    assert (upcoming(trigger, utc("2026-01-01T00:00:00Z"), 5)
            == [utc("2026-01-01T03:00:00Z"), utc("2026-01-01T04:00:00Z")])


def test_at_outside_bounds_never_fires() -> None:
    trigger = compile_trigger(at="2026-06-01T00:00:00Z", end=utc("2026-05-01T00:00:00Z"))
    assert trigger.next_after(utc("2026-01-01T00:00:00Z")) is None


def test_delay_respects_start_and_end() -> None:
    trigger = compile_trigger(delay="1h", start=utc("2026-01-01T05:00:00Z"),
                              end=utc("2026-01-01T06:00:00Z"))
    assert trigger.next_after(utc("2026-01-01T00:00:00Z")) == utc("2026-01-01T05:00:00Z")
    assert trigger.next_after(utc("2026-01-01T05:30:00Z")) is None


def test_end_before_start_is_rejected() -> None:
    with pytest.raises(RecurrenceError) as caught:
        compile_trigger(cron="* * * * *", start=utc("2026-02-01T00:00:00Z"),
                        end=utc("2026-01-01T00:00:00Z"))
    assert caught.value.field == "end"


def test_naive_bound_is_wall_time_in_the_zone() -> None:
    trigger = compile_trigger(cron="0 * * * *", timezone="Asia/Tokyo",
                              start=datetime(2026, 1, 1, 9, 0))
    assert trigger.next_after(utc("2025-12-01T00:00:00Z")) == utc("2026-01-01T00:00:00Z")


# ---------------------------------------------------------------- compile contract


def test_exactly_one_kind_is_required() -> None:
    with pytest.raises(RecurrenceError) as none_given:
        compile_trigger()
    assert str(none_given.value) == ("invalid trigger 'none': give exactly one of cron, every, "
                                     "at, delay")
    with pytest.raises(RecurrenceError) as two_given:
        compile_trigger(cron="* * * * *", delay="5m")
    assert str(two_given.value) == ("invalid trigger 'cron, delay': give exactly one of cron, "
                                    "every, at, delay")


def test_unknown_timezone_names_field_and_value() -> None:
    with pytest.raises(RecurrenceError) as caught:
        compile_trigger(cron="* * * * *", timezone="Mars/Base")
    assert str(caught.value) == "invalid timezone 'Mars/Base': unknown IANA zone"
    assert (caught.value.field, caught.value.value) == ("timezone", "Mars/Base")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("dst_ambiguous", "middle",
         "invalid dst.ambiguous 'middle': expected first, second or both"),
        ("dst_nonexistent", "back",
         "invalid dst.nonexistent 'back': expected shift_forward or skip"),
    ],
)
def test_invalid_dst_option_names_field_and_value(option: str, value: str, message: str) -> None:
    with pytest.raises(RecurrenceError) as caught:
        compile_trigger(cron="30 2 * * *", **{option: value})  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_compiled_triggers_are_cached_and_satisfy_the_protocol() -> None:
    first = compile_trigger(cron="0 9 * * 1-5", timezone="America/New_York")
    assert compile_trigger(cron="0 9 * * 1-5", timezone="America/New_York") is first
    assert isinstance(first, Trigger) and first.kind == "cron"


def test_naive_after_is_rejected() -> None:
    with pytest.raises(RecurrenceError):
        compile_trigger(cron="* * * * *").next_after(datetime(2026, 1, 1))


def test_parse_instant_accepts_z_and_offsets() -> None:
    assert parse_instant("2026-03-08T07:00:00Z") == utc("2026-03-08T07:00:00Z")
    assert (parse_instant("2026-03-08T03:00:00-04:00", "Europe/London")
            == utc("2026-03-08T07:00:00Z"))


# ---------------------------------------------------------------- jitter


def test_jitter_is_deterministic_per_schedule_and_instant() -> None:
    instant = utc("2026-01-01T09:00:00Z")
    assert jitter_offset("s-1", instant, 60) == jitter_offset("s-1", instant, 60)
    assert (jitter_offset("s-1", instant, 60)
            == jitter_offset("s-1", instant.astimezone(timezone(timedelta(hours=5))), 60))
    assert jitter_offset("s-1", instant, 60) != jitter_offset("s-2", instant, 60)


def test_jitter_is_within_window_and_spread_out() -> None:
    base = utc("2026-01-01T00:00:00Z")
    values = [jitter_offset("sched", base + timedelta(minutes=k), 30.0) for k in range(2000)]
    assert all(0.0 <= v < 30.0 for v in values)
    assert min(values) < 1.0 and max(values) > 29.0


@pytest.mark.parametrize("window", [0, -5, 0.0])
def test_jitter_is_zero_without_a_positive_window(window: float) -> None:
    assert jitter_offset("sched", utc("2026-01-01T00:00:00Z"), window) == 0.0


# ---------------------------------------------------------------- purity


@pytest.mark.parametrize("module", ["recurrence.py", "durations.py"])
def test_domain_modules_read_no_clock_and_no_randomness(module: str) -> None:
    source = (ROOT / "src" / "domain" / module).read_text()
    forbidden = re.compile(r"datetime\.now|\.utcnow|time\.time|time\.monotonic|import random"
                           r"|uuid4|open\(")
    assert forbidden.findall(source) == []
