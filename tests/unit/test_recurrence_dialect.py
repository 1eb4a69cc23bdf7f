"""The cron specials L, L-n, nW, LW (day-of-month) and nL, n#k (day-of-week), reversed ranges
that wrap, and how they combine with the Vixie day rule and the daylight-saving rule.

Calendar facts used below (2026 unless stated): February 2026 has 28 days and four of each
weekday (it starts on a Sunday); February 2028 has 29; May 2026 and February 2027 end on a
Sunday; August 2026 and November 2025 start on a Saturday; January and May 2026 have five
Fridays, February to April 2026 four.
"""

from __future__ import annotations

from datetime import datetime

from croniter import croniter

from chronolog.domain.recurrence import compile_trigger, parse_cron, upcoming


def fires(expr: str, after: str, count: int, zone: str = "UTC", **dst: str) -> list[str]:
    """The next ``count`` instants as local ``YYYY-MM-DD Day HH:MM`` (UTC offset when not UTC)."""
    trigger = compile_trigger(cron=expr, timezone=zone, **dst)
    start = datetime.fromisoformat(after.replace("Z", "+00:00"))
    fmt = "%Y-%m-%d %a %H:%M" if zone == "UTC" else "%Y-%m-%d %a %H:%M%z"
    return [i.astimezone(trigger.zone).strftime(fmt) for i in upcoming(trigger, start, count)]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- L and L-n


def test_last_day_of_february_is_the_28th_in_a_common_year_and_the_29th_in_a_leap_year() -> None:
    # given a job on the last day of the month, in February only
    expr = "0 12 L 2 *"
    # when we ask for its next three instants from 2026
    got = fires(expr, "2026-01-01T00:00:00Z", 3)
    # then 2026 and 2027 fire on the 28th, the leap year 2028 on the 29th
    assert got == ["2026-02-28 Sat 12:00", "2027-02-28 Sun 12:00", "2028-02-29 Tue 12:00"]


def test_last_day_follows_every_month_length() -> None:
    assert [d[:10] for d in fires("0 0 L * *", "2026-01-15T00:00:00Z", 4)] == [
        "2026-01-31", "2026-02-28", "2026-03-31", "2026-04-30"]


def test_l_minus_n_counts_back_from_the_last_day() -> None:
    # given three days before the last day of the month
    # when it runs through February of a common and of a leap year
    got = fires("0 0 L-3 2 *", "2026-01-01T00:00:00Z", 3)
    # then the 25th, the 25th and the 26th
    assert [d[:10] for d in got] == ["2026-02-25", "2027-02-25", "2028-02-26"]


def test_l_minus_n_skips_a_month_too_short_for_it() -> None:
    # L-29 is the 2nd of a 31-day month, the 1st of a 30-day month, nothing in February
    assert [d[:10] for d in fires("0 0 L-29 * *", "2026-01-15T00:00:00Z", 3)] == [
        "2026-03-02", "2026-04-01", "2026-05-02"]


# ---------------------------------------------------------------- W and LW


def test_lw_on_a_month_ending_on_a_sunday_is_the_friday_before() -> None:
    # given the last weekday of the month
    # when the month ends on a Sunday (May 2026, February 2027)
    may = fires("0 9 LW 5 *", "2026-01-01T00:00:00Z", 1)
    february = fires("0 9 LW 2 *", "2027-01-01T00:00:00Z", 1)
    # then it fires on the Friday two days earlier
    assert may == ["2026-05-29 Fri 09:00"] and february == ["2027-02-26 Fri 09:00"]


def test_1w_when_the_1st_is_a_saturday_is_monday_the_3rd() -> None:
    # given the weekday nearest the 1st, which never leaves the month
    # when the 1st is a Saturday (August 2026, November 2025)
    got = (fires("0 9 1W 8 *", "2026-01-01T00:00:00Z", 1)
           + fires("0 9 1W 11 *", "2025-01-01T00:00:00Z", 1))
    # then Monday the 3rd, not Friday the last day of the month before
    assert got == ["2026-08-03 Mon 09:00", "2025-11-03 Mon 09:00"]


def test_1w_when_the_1st_is_a_sunday_is_monday_the_2nd() -> None:
    assert fires("0 9 1W 2 *", "2026-01-01T00:00:00Z", 1) == ["2026-02-02 Mon 09:00"]


def test_nw_on_a_saturday_is_the_friday_before_and_on_a_sunday_the_monday_after() -> None:
    # 2026-08-15 is a Saturday, 2026-03-15 a Sunday, 2026-01-15 a Thursday
    assert fires("0 9 15W 8 *", "2026-01-01T00:00:00Z", 1) == ["2026-08-14 Fri 09:00"]
    assert fires("0 9 15W 3 *", "2026-01-01T00:00:00Z", 1) == ["2026-03-16 Mon 09:00"]
    assert fires("0 9 15W 1 *", "2026-01-01T00:00:00Z", 1) == ["2026-01-15 Thu 09:00"]


def test_31w_on_a_sunday_31st_is_friday_the_29th_and_nothing_in_shorter_months() -> None:
    # given the weekday nearest the 31st; May 2026 ends on Sunday the 31st
    got = fires("0 9 31W * *", "2026-04-01T00:00:00Z", 3)
    # then May fires on Friday the 29th; June (30 days) has no instant; July 31st is a Friday
    assert got == ["2026-05-29 Fri 09:00", "2026-07-31 Fri 09:00", "2026-08-31 Mon 09:00"]


# ---------------------------------------------------------------- nL and n#k


def test_5l_is_the_last_friday_of_the_month() -> None:
    assert [d[:10] for d in fires("0 17 ? * 5L", "2026-01-01T00:00:00Z", 3)] == [
        "2026-01-30", "2026-02-27", "2026-03-27"]


def test_5_hash_5_has_no_instant_in_a_month_with_four_fridays() -> None:
    # given the fifth Friday of the month
    # when February, March and April 2026 have four Fridays each
    got = fires("0 9 ? * 5#5", "2026-01-31T00:00:00Z", 1)
    # then the next instant after January 30 is in May
    assert got == ["2026-05-29 Fri 09:00"]


def test_hash_accepts_weekday_names_and_7_for_sunday() -> None:
    # the second Tuesday; the first Sunday, spelled three ways
    assert fires("0 9 ? * TUE#2", "2026-01-01T00:00:00Z", 1) == ["2026-01-13 Tue 09:00"]
    assert fires("0 9 ? * 0#1", "2026-01-01T00:00:00Z", 1) \
        == fires("0 9 ? * 7#1", "2026-01-01T00:00:00Z", 1) \
        == fires("0 9 ? * sun#1", "2026-01-01T00:00:00Z", 1) == ["2026-01-04 Sun 09:00"]


def test_specials_combine_in_a_list() -> None:
    # the first and the last Monday of the month
    assert [d[:10] for d in fires("0 9 ? * 1#1,1L", "2026-01-01T00:00:00Z", 4)] == [
        "2026-01-05", "2026-01-26", "2026-02-02", "2026-02-23"]
    # the 15th and the last day
    assert [d[:10] for d in fires("0 9 15,L * *", "2026-01-01T00:00:00Z", 3)] == [
        "2026-01-15", "2026-01-31", "2026-02-15"]


# ---------------------------------------------------------------- the Vixie day rule


def test_a_special_restricts_its_field_so_both_restricted_fields_are_ored() -> None:
    # given the last day of the month and every Monday, both fields restricted
    got = fires("0 0 L * 1", "2026-01-25T00:00:00Z", 3)
    # then a day matching either fires
    assert got == ["2026-01-26 Mon 00:00", "2026-01-31 Sat 00:00", "2026-02-02 Mon 00:00"]


def test_a_star_step_day_of_month_is_unrestricted_so_a_special_day_of_week_is_anded() -> None:
    # given */2 (starts with *: unrestricted under the Vixie rule) and the last Friday
    got = fires("0 0 */2 * 5L", "2026-01-01T00:00:00Z", 2)
    # then only last Fridays that fall on an odd day: Jan 30 (even) and Feb 27 (odd), Mar 27 (odd)
    assert got == ["2026-02-27 Fri 00:00", "2026-03-27 Fri 00:00"]


# ---------------------------------------------------------------- reversed ranges wrap


def test_reversed_hour_range_wraps_past_midnight() -> None:
    assert [d[15:] for d in fires("0 22-2 * * *", "2026-01-01T12:00:00Z", 5)] == [
        "22:00", "23:00", "00:00", "01:00", "02:00"]


def test_reversed_weekday_range_wraps_past_saturday() -> None:
    assert [d[11:14] for d in fires("0 9 * * FRI-MON", "2026-01-01T12:00:00Z", 5)] == [
        "Fri", "Sat", "Sun", "Mon", "Fri"]


def test_a_step_runs_on_across_the_wrap() -> None:
    assert parse_cron("0 22-3/2 * * *").hours == frozenset({22, 0, 2})
    assert parse_cron("50-10/7 * * * *").minutes == frozenset({50, 57, 4})
    assert parse_cron("0 0 * NOV-FEB *").months == frozenset({11, 12, 1, 2})
    assert parse_cron("0 0 * * 6-1").dows == frozenset({6, 0, 1})


def test_a_stepped_wrap_past_midnight_keeps_stepping_after_it() -> None:
    # 23-1 is 23, 0, 1; every second of those is 23 and 1 (croniter would give 23 alone)
    assert parse_cron("0 23-1/2 * * *").hours == frozenset({23, 1})
    assert [d[11:] for d in fires("0 23-1/2 * * *", "2026-01-01T12:00:00Z", 3)] == [
        "Thu 23:00", "Fri 01:00", "Fri 23:00"]


def test_weekday_7_to_0_is_sunday_alone() -> None:
    assert parse_cron("0 9 * * 7-0").dows == frozenset({0})
    assert [d[11:14] for d in fires("0 9 * * 7-0", "2026-01-01T12:00:00Z", 2)] == ["Sun", "Sun"]


def test_weekday_0_to_7_is_every_day() -> None:
    assert parse_cron("0 9 * * 0-7").dows == frozenset(range(7))
    assert [d[11:14] for d in fires("0 9 * * 0-7", "2026-01-01T12:00:00Z", 7)] == [
        "Fri", "Sat", "Sun", "Mon", "Tue", "Wed", "Thu"]


# ---------------------------------------------------------------- with daylight saving


def test_second_sunday_of_march_in_new_york_is_the_gap_day_and_shifts_forward() -> None:
    # given 02:30 on the second Sunday of March, the day New York skips 02:00-03:00
    expr, zone = "30 2 ? 3 0#2", "America/New_York"
    # when it fires under the default (shift_forward) and under skip
    shifted = fires(expr, "2026-01-01T00:00:00Z", 2, zone)
    skipped = fires(expr, "2026-01-01T00:00:00Z", 1, zone, dst_nonexistent="skip")
    # then 03:00 EDT that day; under skip never: the second Sunday of March is always the
    # day New York springs forward, so the rule runs out
    assert shifted == ["2026-03-08 Sun 03:00-0400", "2027-03-14 Sun 03:00-0400"]
    assert skipped == []


def test_first_sunday_of_november_in_new_york_repeats_per_dst_ambiguous() -> None:
    expr, zone, after = "30 1 ? 11 SUN#1", "America/New_York", "2026-10-01T00:00:00Z"
    assert fires(expr, after, 1, zone) == ["2026-11-01 Sun 01:30-0400"]
    assert fires(expr, after, 1, zone, dst_ambiguous="second") == ["2026-11-01 Sun 01:30-0500"]
    assert fires(expr, after, 3, zone, dst_ambiguous="both") == [
        "2026-11-01 Sun 01:30-0400", "2026-11-01 Sun 01:30-0500", "2027-11-07 Sun 01:30-0400"]


def test_last_sunday_of_march_in_london_is_the_gap_day() -> None:
    assert (fires("30 1 ? 3 0L", "2026-01-01T00:00:00Z", 1, "Europe/London")
            == ["2026-03-29 Sun 02:00+0100"])


def test_a_wildcard_job_on_the_last_sunday_of_october_in_london_runs_both_passes() -> None:
    got = fires("*/30 1 ? 10 0L", "2026-10-01T00:00:00Z", 5, "Europe/London")
    assert got == ["2026-10-25 Sun 01:00+0100", "2026-10-25 Sun 01:30+0100",
                   "2026-10-25 Sun 01:00+0000", "2026-10-25 Sun 01:30+0000",
                   "2027-10-31 Sun 01:00+0100"]


def test_croniter_reads_23_1_step_2_and_7_0_otherwise_as_the_tour_says() -> None:
    # docs/tour.md names the two places where chronolog parts from croniter
    assert croniter.expand("0 23-1/2 * * *")[0][1] == [23]
    assert croniter.expand("0 0 * * 7-0")[0][4] == ["*"]
