"""Cron calendar rules (leap days, short months, Vixie DOM/DOW, macros) and cron validation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from croniter import croniter

from chronolog.domain.recurrence import (
    RecurrenceError,
    compile_trigger,
    is_wildcard_cron,
    parse_cron,
    upcoming,
)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def dates(expr: str, after: str, count: int, zone: str = "UTC") -> list[str]:
    trigger = compile_trigger(cron=expr, timezone=zone)
    return [i.astimezone(trigger.zone).strftime("%Y-%m-%d %a %H:%M")  # type: ignore[attr-defined]
            for i in upcoming(trigger, utc(after), count)]


# ---------------------------------------------------------------- calendar


def test_leap_day_job_fires_only_on_february_29th() -> None:
    assert dates("0 0 29 2 *", "2026-01-01T00:00:00Z", 3) == [
        "2028-02-29 Tue 00:00",
        "2032-02-29 Sun 00:00",
        "2036-02-29 Fri 00:00",
    ]


def test_leap_day_job_skips_the_non_leap_century_year_2100() -> None:
    assert dates("0 0 29 2 *", "2097-01-01T00:00:00Z", 1) == ["2104-02-29 Fri 00:00"]


def test_thirty_first_job_skips_short_months() -> None:
    assert [d[:10] for d in dates("0 0 31 * *", "2026-01-01T00:00:00Z", 7)] == [
        "2026-01-31",
        "2026-03-31",
        "2026-05-31",
        "2026-07-31",
        "2026-08-31",
        "2026-10-31",
        "2026-12-31",
    ]


def test_dom_and_dow_both_restricted_match_either() -> None:
    assert dates("0 0 1 * 1", "2026-01-25T00:00:00Z", 4) == [
        "2026-01-26 Mon 00:00",
        "2026-02-01 Sun 00:00",
        "2026-02-02 Mon 00:00",
        "2026-02-09 Mon 00:00",
    ]


def test_dom_step_starting_with_star_counts_as_unrestricted_so_both_must_match() -> None:
    # Vixie: '*/2' sets DOM_STAR -> AND: Mondays that fall on an odd day of the month.
    got = dates("0 0 */2 * 1", "2026-01-01T00:00:00Z", 4)
    assert got == ["2026-01-05 Mon 00:00", "2026-01-19 Mon 00:00", "2026-02-09 Mon 00:00",
                   "2026-02-23 Mon 00:00"]


def test_question_mark_means_unrestricted_day() -> None:
    assert (dates("0 0 ? * 1", "2026-01-01T00:00:00Z", 2)
            == ["2026-01-05 Mon 00:00", "2026-01-12 Mon 00:00"])


def test_day_of_week_7_is_sunday() -> None:
    assert (dates("0 0 * * 7", "2026-01-01T00:00:00Z", 2)
            == dates("0 0 * * 0", "2026-01-01T00:00:00Z", 2))
    assert dates("0 0 * * 7", "2026-01-01T00:00:00Z", 1) == ["2026-01-04 Sun 00:00"]


def test_day_of_week_range_ending_at_7_includes_sunday() -> None:
    assert ([d[11:14] for d in dates("0 0 * * 5-7", "2026-01-01T00:00:00Z", 3)]
            == ["Fri", "Sat", "Sun"])


def test_names_for_months_and_weekdays() -> None:
    assert (dates("0 12 * feb mon-fri", "2026-01-30T00:00:00Z", 2)
            == ["2026-02-02 Mon 12:00", "2026-02-03 Tue 12:00"])


def test_weekday_job_skips_weekend() -> None:
    assert dates("0 9 * * 1-5", "2026-01-02T15:00:00Z", 2, "America/New_York") == [
        "2026-01-05 Mon 09:00",
        "2026-01-06 Tue 09:00",
    ]


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@hourly", "2026-05-17 Sun 13:00"),
        ("@daily", "2026-05-18 Mon 00:00"),
        ("@midnight", "2026-05-18 Mon 00:00"),
        ("@weekly", "2026-05-24 Sun 00:00"),
        ("@monthly", "2026-06-01 Mon 00:00"),
        ("@yearly", "2027-01-01 Fri 00:00"),
        ("@annually", "2027-01-01 Fri 00:00"),
    ],
)
def test_macros_expand_to_their_five_fields(macro: str, expected: str) -> None:
    assert dates(macro, "2026-05-17T12:30:00Z", 1) == [expected]


def test_exact_match_is_excluded_because_next_after_is_strict() -> None:
    trigger = compile_trigger(cron="0 9 * * *")
    assert trigger.next_after(utc("2026-01-01T09:00:00Z")) == utc("2026-01-02T09:00:00Z")
    assert trigger.next_after(utc("2026-01-01T08:59:59.999999Z")) == utc("2026-01-01T09:00:00Z")


def test_single_value_with_step_runs_to_field_end() -> None:
    assert sorted(parse_cron("5/15 * * * *").minutes) == [5, 20, 35, 50]


# ---------------------------------------------------------------- wildcard classification


@pytest.mark.parametrize(
    ("expr", "wildcard"),
    [
        ("*/30 * * * *", True),
        ("0 * * * *", True),
        ("* 3 * * *", True),
        ("@hourly", True),
        ("30 2 * * *", False),
        ("0 9 * * 1-5", False),
        ("0 0-23 * * *", False),
        ("@daily", False),
    ],
)
def test_wildcard_means_minute_or_hour_field_starts_with_star(expr: str, wildcard: bool) -> None:
    assert is_wildcard_cron(expr) is wildcard


# ---------------------------------------------------------------- croniter agreement


@pytest.mark.parametrize(
    "expr",
    ["*/7 1-5,20 */3 jan-mar,10 mon-fri", "0 0 1,15 * 0", "5/15 0-23/6 * * 2-4", "0 12 * * 0-7",
     "@weekly"],
)
def test_field_sets_agree_with_croniter_expand(expr: str) -> None:
    spec = parse_cron(expr)
    expanded, _ = croniter.expand(expr)
    ours = [spec.minutes, spec.hours, spec.doms, spec.months, spec.dows]
    full = [range(60), range(24), range(1, 32), range(1, 13), range(7)]
    for mine, theirs, everything in zip(ours, expanded, full, strict=True):
        assert mine == (frozenset(everything) if theirs == ["*"] else frozenset(theirs))


# ---------------------------------------------------------------- invalid expressions


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "invalid cron '61 * * * *': minute 61 out of range 0-59"),
        ("* 24 * * *", "invalid cron '* 24 * * *': hour 24 out of range 0-23"),
        ("* * 0 * *", "invalid cron '* * 0 * *': day-of-month 0 out of range 1-31"),
        ("* * * 13 *", "invalid cron '* * * 13 *': month 13 out of range 1-12"),
        ("* * * * 8", "invalid cron '* * * * 8': day-of-week 8 out of range 0-7"),
        ("* * *",
         "invalid cron '* * *': expected 5 fields (minute "
         "hour day-of-month month day-of-week), got 3"),
        ("",
         "invalid cron '': expected 5 fields (minute hour day-of-month month day-of-week), got 0"),
        ("0 0 * * * 2026",
         "invalid cron '0 0 * * * 2026': expected 5 fields "
         "(minute hour day-of-month month day-of-week), got 6"),
        ("*/0 * * * *",
         "invalid cron '*/0 * * * *': minute step '0' must be a positive integer (ASCII digits)"),
        ("0 0 * * L",
         "invalid cron '0 0 * * L': day-of-week 'L' "
         "needs a weekday before it (5L = the last Friday)"),
        ("0 0 * foo *",
         "invalid cron '0 0 * foo *': month 'foo' is not a number (ASCII digits) or a name"),
        ("0 0 L/2 * *",
         "invalid cron '0 0 L/2 * *': day-of-month 'L' is not a number "
         "(ASCII digits) (L, W and # are whole list items: no range or step)"),
        ("0 0 1,,2 * *", "invalid cron '0 0 1,,2 * *': day-of-month '1,,2' has an empty list item"),
        ("0 0 30 2 *",
         "invalid cron '0 0 30 2 *': day-of-month never occurs in the selected month(s)"),
        ("0 0 * * L",
         "invalid cron '0 0 * * L': day-of-week 'L' "
         "needs a weekday before it (5L = the last Friday)"),
        ("0 0 * * 5#0",
         "invalid cron '0 0 * * 5#0': day-of-week '5#0': n#k needs k from 1 to 5 (ASCII digits)"),
        ("0 0 * * 5#6",
         "invalid cron '0 0 * * 5#6': day-of-week '5#6': n#k needs k from 1 to 5 (ASCII digits)"),
        ("0 0 * * 8L", "invalid cron '0 0 * * 8L': day-of-week 8 out of range 0-7"),
        ("0 0 L-31 * *",
         "invalid cron '0 0 L-31 * *': day-of-month "
         "'L-31': L-n needs n from 0 to 30 (ASCII digits)"),
        ("0 0 32W * *", "invalid cron '0 0 32W * *': day-of-month 32 out of range 1-31"),
        ("0 0 L-30 2 *",
         "invalid cron '0 0 L-30 2 *': day-of-month never occurs in the selected month(s)"),
        ("0 0 30W 2 *",
         "invalid cron '0 0 30W 2 *': day-of-month never occurs in the selected month(s)"),
        ("0 0 1-LW * *",
         "invalid cron '0 0 1-LW * *': day-of-month 'LW' is not a number "
         "(ASCII digits) (L, W and # are whole list items: no range or step)"),
        ("0 0 H * *",
         "invalid cron '0 0 H * *': day-of-month 'H' is "
         "not a number (ASCII digits) (H is not supported)"),
        ("0 0 L * 5#²",
         "invalid cron '0 0 L * 5#²': day-of-week '5#²': n#k needs k from 1 to 5 (ASCII digits)"),
        ("0 0 L-٣ * *",
         "invalid cron '0 0 L-٣ * *': day-of-month 'L-٣': L-n needs n from 0 to 30 (ASCII digits)"),
        ("0 0 W * *",
         "invalid cron '0 0 W * *': day-of-month 'W' needs a day number before it, as in 15W"),
        ("0 0 * * #3",
         "invalid cron '0 0 * * #3': day-of-week '#3' needs a weekday before the #, "
         "as in 5#3 (the third Friday)"),
        ("0 -5 * * *",
         "invalid cron '0 -5 * * *': hour '-5' needs a value on each side of '-', as in 1-5"),
        ("0 0 1- * *",
         "invalid cron '0 0 1- * *': day-of-month '1-' needs a value on each side of '-', "
         "as in 1-5"),
        ("/5 * * * *",
         "invalid cron '/5 * * * *': minute '/5' needs a value before the step, "
         "as in */5 or 10/5"),
        ("0 0 */31 * 1#5",
         "invalid cron '0 0 */31 * 1#5': day-of-month and day-of-week never fall on the "
         "same day in the selected month(s)"),
        ("* 2 */3 APR 4#5",
         "invalid cron '* 2 */3 APR 4#5': day-of-month and day-of-week never fall on the "
         "same day in the selected month(s)"),
        ("@reboot",
         "invalid cron '@reboot': unknown macro @reboot (use @yearly, "
         "@annually, @monthly, @weekly, @daily, @midnight, @hourly)"),
    ],
)
def test_invalid_cron_raises_one_line_naming_field_and_value(expr: str, message: str) -> None:
    with pytest.raises(RecurrenceError) as caught:
        compile_trigger(cron=expr)
    assert str(caught.value) == message
    assert caught.value.field == "cron" and caught.value.value == expr
    assert "\n" not in str(caught.value)


def test_february_30th_is_fine_when_day_of_week_is_also_restricted() -> None:
    # OR rule: '30 2 ... 1' still fires on February Mondays.
    assert dates("0 0 30 2 1", "2026-01-01T00:00:00Z", 1) == ["2026-02-02 Mon 00:00"]
