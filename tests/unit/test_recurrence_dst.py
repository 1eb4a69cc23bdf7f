"""Daylight-saving rules of cron triggers (docs/design.md §4), in four zones with real 2026
transitions.

2026 transitions used below (local wall clock):
- America/New_York: spring 03-08 02:00 -> 03:00 (07:00Z); fall 11-01 02:00 -> 01:00 (06:00Z)
- Europe/London: spring 03-29 01:00 -> 02:00 (01:00Z); fall 10-25 02:00 -> 01:00 (01:00Z)
- Australia/Sydney: fall 04-05 03:00 -> 02:00 (04-04 16:00Z);
  spring 10-04 02:00 -> 03:00 (10-03 16:00Z)
- Australia/Lord_Howe (30-minute shift): fall 04-05 02:00 -> 01:30 (04-04 15:00Z);
  spring 10-04 02:00 -> 02:30 (10-03 15:30Z)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from chronolog.domain.recurrence import compile_trigger, upcoming


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def instants(expr: str, zone: str, after: str, count: int, **options: str) -> list[str]:
    trigger = compile_trigger(cron=expr, timezone=zone, **options)
    return [i.strftime("%Y-%m-%dT%H:%M:%SZ") for i in upcoming(trigger, utc(after), count)]


def local_walls(expr: str, zone: str, after: str, count: int, **options: str) -> list[str]:
    trigger = compile_trigger(cron=expr, timezone=zone, **options)
    return [i.astimezone(trigger.zone).isoformat() for i in upcoming(trigger, utc(after), count)]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- fixed-time, spring forward


def test_fixed_time_job_in_new_york_gap_shifts_forward_to_gap_end() -> None:
    assert instants("30 2 * * *", "America/New_York", "2026-03-07T00:00:00Z", 3) == [
        "2026-03-07T07:30:00Z",
        "2026-03-08T07:00:00Z",  # 02:30 does not exist: fires at 03:00 EDT, where the gap ends
        "2026-03-09T06:30:00Z",
    ]


def test_fixed_time_job_in_new_york_gap_is_skipped_with_skip_option() -> None:
    assert instants("30 2 * * *", "America/New_York", "2026-03-07T00:00:00Z", 2,
                    dst_nonexistent="skip") == [
        "2026-03-07T07:30:00Z",
        "2026-03-09T06:30:00Z",
    ]


def test_fixed_time_jobs_shifted_onto_the_same_instant_fire_once() -> None:
    # 02:00 and 02:30 both shift to 03:00 EDT, which also matches itself: one firing.
    assert instants("0,30 2,3 * * *", "America/New_York", "2026-03-08T06:00:00Z", 3) == [
        "2026-03-08T07:00:00Z",
        "2026-03-08T07:30:00Z",
        "2026-03-09T06:00:00Z",
    ]


def test_fixed_time_job_in_london_gap_shifts_forward() -> None:
    assert local_walls("30 1 * * *", "Europe/London", "2026-03-28T12:00:00Z", 2) == [
        "2026-03-29T02:00:00+01:00",
        "2026-03-30T01:30:00+01:00",
    ]


def test_fixed_time_job_in_sydney_gap_shifts_forward() -> None:
    assert instants("15 2 * * *", "Australia/Sydney", "2026-10-03T00:00:00Z", 2) == [
        "2026-10-03T16:00:00Z",  # 02:15 AEST does not exist -> 03:00 AEDT
        "2026-10-04T15:15:00Z",
    ]


def test_fixed_time_job_in_lord_howe_half_hour_gap_shifts_to_0230() -> None:
    assert local_walls("0 2 * * *", "Australia/Lord_Howe", "2026-10-03T00:00:00Z", 2) == [
        "2026-10-04T02:30:00+11:00",
        "2026-10-05T02:00:00+11:00",
    ]


def test_fixed_time_job_in_lord_howe_half_hour_gap_is_skipped_with_skip_option() -> None:
    assert local_walls("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T00:00:00Z", 2,
                       dst_nonexistent="skip") == [
        "2026-10-05T02:15:00+11:00",
        "2026-10-06T02:15:00+11:00",
    ]


def test_fixed_time_job_just_outside_the_gap_is_untouched() -> None:
    assert (local_walls("0 3 * * *", "America/New_York", "2026-03-07T12:00:00Z", 1)
            == ["2026-03-08T03:00:00-04:00"])
    assert (local_walls("59 1 * * *", "America/New_York", "2026-03-07T12:00:00Z", 1)
            == ["2026-03-08T01:59:00-05:00"])


# ---------------------------------------------------------------- fixed-time, fall back


def test_fixed_time_job_fires_once_on_fall_back_day_at_first_pass_by_default() -> None:
    assert instants("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2) == [
        "2026-11-01T05:30:00Z",  # 01:30 EDT
        "2026-11-02T06:30:00Z",
    ]


def test_fixed_time_job_fires_at_second_pass_with_second_option() -> None:
    assert instants("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2,
                    dst_ambiguous="second") == [
        "2026-11-01T06:30:00Z",  # 01:30 EST
        "2026-11-02T06:30:00Z",
    ]


def test_fixed_time_job_fires_on_both_passes_with_both_option() -> None:
    assert instants("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 3,
                    dst_ambiguous="both") == [
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-02T06:30:00Z",
    ]


def test_fixed_time_job_started_between_passes_does_not_fire_the_second_pass_by_default() -> None:
    assert (instants("30 1 * * *", "America/New_York", "2026-11-01T05:45:00Z", 1)
            == ["2026-11-02T06:30:00Z"])


def test_fixed_time_job_in_london_repeated_hour_fires_once() -> None:
    assert local_walls("30 1 * * *", "Europe/London", "2026-10-24T12:00:00Z", 2) == [
        "2026-10-25T01:30:00+01:00",
        "2026-10-26T01:30:00+00:00",
    ]


def test_fixed_time_job_in_sydney_repeated_hour_honours_each_option() -> None:
    after = "2026-04-04T00:00:00Z"
    assert instants("30 2 5 4 *", "Australia/Sydney", after, 1) == ["2026-04-04T15:30:00Z"]
    assert (instants("30 2 5 4 *", "Australia/Sydney", after, 1, dst_ambiguous="second")
            == ["2026-04-04T16:30:00Z"])
    assert instants("30 2 5 4 *", "Australia/Sydney", after, 2, dst_ambiguous="both") == [
        "2026-04-04T15:30:00Z",
        "2026-04-04T16:30:00Z",
    ]


def test_fixed_time_job_in_lord_howe_half_hour_repeat_honours_each_option() -> None:
    after = "2026-04-04T00:00:00Z"
    assert (local_walls("45 1 5 4 *", "Australia/Lord_Howe", after, 1)
            == ["2026-04-05T01:45:00+11:00"])
    assert local_walls("45 1 5 4 *", "Australia/Lord_Howe", after, 1, dst_ambiguous="second") == [
        "2026-04-05T01:45:00+10:30"
    ]
    assert local_walls("45 1 5 4 *", "Australia/Lord_Howe", after, 2, dst_ambiguous="both") == [
        "2026-04-05T01:45:00+11:00",
        "2026-04-05T01:45:00+10:30",
    ]


def test_fixed_time_job_outside_lord_howe_repeat_fires_once_even_with_both() -> None:
    assert local_walls("15 1 5 4 *", "Australia/Lord_Howe", "2026-04-04T00:00:00Z", 1,
                       dst_ambiguous="both") == [
        "2026-04-05T01:15:00+11:00"
    ]
    assert compile_trigger(
        cron="15 1 5 4 *", timezone="Australia/Lord_Howe", dst_ambiguous="both"
    ).next_after(
        utc("2026-04-04T14:15:00Z")
    ) == utc("2027-04-05T01:15:00+10:30")  # 2027 fall-back was 04-04


# ---------------------------------------------------------------- wildcard jobs


def test_wildcard_hourly_job_fires_every_real_hour_on_spring_forward_day() -> None:
    walls = local_walls("0 * * * *", "America/New_York", "2026-03-08T05:30:00Z", 3)
    assert walls == ["2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00",
                     "2026-03-08T04:00:00-04:00"]


def test_wildcard_hourly_job_fires_on_both_passes_on_fall_back_day() -> None:
    walls = local_walls("0 * * * *", "America/New_York", "2026-11-01T04:30:00Z", 4)
    assert walls == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T02:00:00-05:00",
        "2026-11-01T03:00:00-05:00",
    ]


@pytest.mark.parametrize(
    ("day_after", "expected_hours"),
    [("2026-03-07T12:00:00Z", 23), ("2026-10-31T12:00:00Z", 25), ("2026-01-10T12:00:00Z", 24)],
)
def test_wildcard_hourly_job_fires_once_per_real_hour_of_the_day(day_after: str,
                                                                 expected_hours: int) -> None:
    trigger = compile_trigger(cron="@hourly", timezone="America/New_York")
    start = utc(day_after)  # local 07:00/08:00 the day before the transition day
    day = (start + timedelta(days=1)).astimezone(trigger.zone).date()  # type: ignore[attr-defined]
    fired = [i for i in upcoming(trigger, start, 60) if i.astimezone(trigger.zone).date() == day]  # type: ignore[attr-defined]
    assert len(fired) == expected_hours


def test_wildcard_hour_with_fixed_minute_ignores_dst_options() -> None:
    # '30 * * * *' is wildcard (hour starts with '*'): both passes, regardless of dst_ambiguous.
    for option in ("first", "second", "both"):
        assert instants("30 * * * *", "America/New_York", "2026-11-01T05:00:00Z", 2,
                        dst_ambiguous=option) == [
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:30:00Z",
        ]


def test_wildcard_job_invents_nothing_in_the_gap_even_with_shift_forward() -> None:
    assert instants("*/30 * * * *", "America/New_York", "2026-03-08T06:10:00Z", 3) == [
        "2026-03-08T06:30:00Z",  # 01:30 EST
        "2026-03-08T07:00:00Z",  # 03:00 EDT (02:00 and 02:30 never happen)
        "2026-03-08T07:30:00Z",
    ]


def test_wildcard_minute_with_fixed_hour_fires_both_passes_of_repeated_hour() -> None:
    trigger = compile_trigger(cron="*/15 1 * * *", timezone="America/New_York")
    fired = upcoming(trigger, utc("2026-11-01T04:00:00Z"), 9)
    assert len(fired) == 9 and fired[-1] == utc("2026-11-02T06:00:00Z")
    assert fired[:8] == [utc("2026-11-01T05:00:00Z") + timedelta(minutes=15 * k) for k in range(8)]


def test_step_across_lord_howe_half_hour_gap() -> None:
    assert local_walls("*/20 * * * *", "Australia/Lord_Howe", "2026-10-03T15:00:00Z", 3) == [
        "2026-10-04T01:40:00+10:30",
        "2026-10-04T02:40:00+11:00",
        "2026-10-04T03:00:00+11:00",
    ]


def test_step_across_sydney_fall_back_repeats_the_hour() -> None:
    assert local_walls("*/30 * * * *", "Australia/Sydney", "2026-04-04T15:10:00Z", 5) == [
        "2026-04-05T02:30:00+11:00",
        "2026-04-05T02:00:00+10:00",
        "2026-04-05T02:30:00+10:00",
        "2026-04-05T03:00:00+10:00",
        "2026-04-05T03:30:00+10:00",
    ]


def test_daily_macro_at_midnight_unaffected_by_transitions_at_two() -> None:
    assert local_walls("@daily", "America/New_York", "2026-03-07T12:00:00Z", 3) == [
        "2026-03-08T00:00:00-05:00",
        "2026-03-09T00:00:00-04:00",
        "2026-03-10T00:00:00-04:00",
    ]


def test_instants_are_utc_with_zero_microseconds() -> None:
    trigger = compile_trigger(cron="*/5 * * * *", timezone="Europe/London")
    result = trigger.next_after(datetime(2026, 6, 1, 12, 0, 0, 123456, tzinfo=UTC))
    assert result == utc("2026-06-01T12:05:00Z")
    assert result is not None and result.tzinfo is UTC and result.microsecond == 0


def test_after_in_another_zone_is_the_same_instant() -> None:
    trigger = compile_trigger(cron="0 9 * * 1-5", timezone="America/New_York")
    tokyo = utc("2026-06-01T12:00:00Z").astimezone(
        compile_trigger(cron="* * * * *", timezone="Asia/Tokyo").zone)  # type: ignore[attr-defined]
    assert (trigger.next_after(tokyo) == trigger.next_after(utc("2026-06-01T12:00:00Z"))
            == utc("2026-06-01T13:00:00Z"))
