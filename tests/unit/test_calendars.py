"""The exclusion rule of a calendar (``chronolog.domain.calendars.excluded_by``): whole local
days, day ranges and recurring local-time windows, each in its own zone, across midnight and
daylight-saving changes; bad calendars are refused naming the field."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chronolog.domain.calendars import WEEKDAYS, CalendarSpec, excluded_by

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def cal(**fields: object) -> CalendarSpec:
    return CalendarSpec.model_validate(fields)


def test_a_date_excludes_its_whole_local_day_in_the_calendars_zone() -> None:
    c = cal(timezone="America/New_York", dates=["2026-12-25"])
    assert excluded_by(c, datetime(2026, 12, 25, 0, 0, tzinfo=NEW_YORK)) == "2026-12-25"
    assert excluded_by(c, datetime(2026, 12, 25, 23, 59, 59, tzinfo=NEW_YORK)) == "2026-12-25"
    # 03:00 UTC on the 25th is still the 24th in New York
    assert excluded_by(c, datetime(2026, 12, 25, 3, 0, tzinfo=UTC)) is None
    assert excluded_by(c, datetime(2026, 12, 26, 0, 0, tzinfo=NEW_YORK)) is None


def test_a_day_of_a_daylight_saving_change_is_excluded_whole() -> None:
    c = cal(timezone="Europe/Paris", dates=["2026-03-29"])  # 23 hours long in Paris
    start = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)  # 00:00 Paris, +01:00
    hours = [start + timedelta(hours=h) for h in range(25)]
    excluded = [h for h in hours if excluded_by(c, h)]
    assert len(excluded) == 23 and excluded[0] == start


def test_a_range_includes_both_ends_and_may_have_its_own_zone() -> None:
    c = cal(ranges=[{"from": "2026-12-24", "to": "2026-12-26", "timezone": "Asia/Tokyo"}])
    assert excluded_by(c, datetime(2026, 12, 23, 15, 0, tzinfo=UTC)) == (
        "2026-12-24..2026-12-26 Asia/Tokyo")  # 00:00 on the 24th in Tokyo
    assert excluded_by(c, datetime(2026, 12, 26, 14, 59, tzinfo=UTC))
    assert excluded_by(c, datetime(2026, 12, 26, 15, 0, tzinfo=UTC)) is None


def test_a_window_within_a_day_includes_its_start_and_not_its_end() -> None:
    c = cal(windows=[{"days": ["mon", "tue"], "start": "09:00", "end": "10:30",
                      "timezone": "Europe/Paris"}])
    monday = datetime(2026, 3, 2, tzinfo=PARIS)  # a Monday
    assert excluded_by(c, monday.replace(hour=9)) == "mon,tue 09:00-10:30 Europe/Paris"
    assert excluded_by(c, monday.replace(hour=10, minute=29, second=59))
    assert excluded_by(c, monday.replace(hour=10, minute=30)) is None
    assert excluded_by(c, monday.replace(hour=8, minute=59, second=59)) is None
    assert excluded_by(c, (monday + timedelta(days=2)).replace(hour=9)) is None  # Wednesday


def test_a_window_past_midnight_belongs_to_the_day_it_starts() -> None:
    c = cal(windows=[{"days": ["fri"], "start": "22:00", "end": "06:00"}])
    friday = datetime(2026, 3, 6, tzinfo=UTC)
    assert excluded_by(c, friday.replace(hour=22))
    assert excluded_by(c, (friday + timedelta(days=1)).replace(hour=5, minute=59))  # Saturday
    assert excluded_by(c, (friday + timedelta(days=1)).replace(hour=6)) is None
    assert excluded_by(c, friday.replace(hour=5)) is None  # Thursday's night is not listed
    assert excluded_by(c, (friday + timedelta(days=1)).replace(hour=22)) is None


def test_an_every_day_window_is_named_without_its_days() -> None:
    c = CalendarSpec.model_validate({"windows": [{"start": "02:00", "end": "05:00"}]})
    assert excluded_by(c, datetime(2026, 12, 9, 3, 0, tzinfo=UTC)) == "02:00-05:00 UTC"
    listed = CalendarSpec.model_validate({"windows": [{"days": list(WEEKDAYS[:6]),
                                                       "start": "02:00", "end": "05:00"}]})
    assert excluded_by(listed, datetime(2026, 12, 9, 3, 0, tzinfo=UTC)) == (
        "mon,tue,wed,thu,fri,sat 02:00-05:00 UTC")


def test_a_whole_day_window_ends_at_24_00() -> None:
    c = cal(windows=[{"days": ["sat", "sun"], "start": "00:00", "end": "24:00"}])
    saturday = datetime(2026, 3, 7, tzinfo=UTC)
    assert all(excluded_by(c, saturday + timedelta(minutes=30 * k)) for k in range(96))
    assert excluded_by(c, saturday + timedelta(days=2)) is None  # Monday 00:00


def test_a_window_reads_the_wall_clock_across_a_daylight_saving_change() -> None:
    """02:00-03:00 in Paris does not exist on 2026-03-29 and 02:00-03:00 is lived twice on
    2026-10-25: an instant is excluded when the wall clock reads a time inside."""
    c = cal(windows=[{"start": "02:00", "end": "03:00", "timezone": "Europe/Paris"}])
    spring = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # 01:30 -> 03:30 local over the hour
    assert not any(excluded_by(c, spring + timedelta(minutes=m)) for m in range(0, 60, 5))
    autumn = datetime(2026, 10, 25, 0, 0, tzinfo=UTC)  # 02:00+02:00, then 02:00+01:00
    lived = [m for m in range(0, 120, 10) if excluded_by(c, autumn + timedelta(minutes=m))]
    assert lived == list(range(0, 120, 10))  # both hours read 02:xx


@pytest.mark.parametrize(("fields", "field", "text"), [
    ({"timezone": "Mars/Olympus"}, "timezone", "unknown IANA zone"),
    ({"dates": ["2026-02-30"]}, "dates", "date"),
    ({"ranges": [{"from": "2026-12-26", "to": "2026-12-24"}]}, "ranges", "before"),
    ({"windows": [{"start": "25:00", "end": "26:00"}]}, "windows", "HH:MM"),
    ({"windows": [{"start": "09:00", "end": "09:00"}]}, "windows", "same wall time"),
    ({"windows": [{"start": "24:00", "end": "01:00"}]}, "windows", "00:00"),
    ({"windows": [{"days": [], "start": "09:00", "end": "10:00"}]}, "windows", "one day"),
    ({"windows": [{"days": ["monday"], "start": "09:00", "end": "10:00"}]}, "windows", "mon"),
    ({"holidays": []}, "holidays", "Extra inputs"),
])
def test_a_bad_calendar_is_refused_naming_the_field(fields: dict[str, object], field: str,
                                                    text: str) -> None:
    with pytest.raises(ValidationError) as refused:
        cal(**fields)
    err = refused.value.errors()[0]
    assert err["loc"][0] == field and text in str(refused.value), refused.value


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31),
                    timezones=st.just(UTC)),
       st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe"]),
       st.integers(0, 23 * 60 + 58), st.integers(1, 24 * 60 - 1),
       st.sets(st.sampled_from(WEEKDAYS), min_size=1))
def test_a_window_excludes_exactly_the_wall_times_inside_it(
        instant: datetime, zone: str, start: int, length: int, days: set[str]) -> None:
    """Against a brute rule: the local wall time since the window's start on a listed day
    (today's start, or yesterday's) is less than its length."""
    end = (start + length) % (24 * 60) or 24 * 60
    hhmm = [f"{x // 60:02d}:{x % 60:02d}" for x in (start, end)]
    if hhmm[0] == hhmm[1]:
        return
    c = cal(windows=[{"days": sorted(days), "start": hhmm[0], "end": hhmm[1],
                      "timezone": zone}])
    local = instant.astimezone(ZoneInfo(zone))
    minute = local.hour * 60 + local.minute + (local.second + local.microsecond / 1e6) / 60
    today, yesterday = WEEKDAYS[local.weekday()], WEEKDAYS[(local.weekday() - 1) % 7]
    inside = ((today in days and 0 <= minute - start < length)
              or (yesterday in days and 0 <= minute + 24 * 60 - start < length))
    assert (excluded_by(c, instant) is not None) == inside


@settings(max_examples=200, deadline=None)
@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31),
                    timezones=st.just(UTC)),
       st.sampled_from(["UTC", "Europe/Paris", "Pacific/Kiritimati", "America/St_Johns"]))
def test_a_date_excludes_an_instant_iff_its_local_date_is_that_day(instant: datetime,
                                                                    zone: str) -> None:
    day: date = instant.astimezone(ZoneInfo(zone)).date()
    c = cal(timezone=zone, dates=[day.isoformat()])
    assert excluded_by(c, instant) == day.isoformat()
    other = cal(timezone=zone, dates=[(day + timedelta(days=1)).isoformat()])
    assert excluded_by(other, instant) is None
