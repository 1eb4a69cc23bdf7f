"""Parsing and formatting durations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronolog.domain.durations import InvalidDuration, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("2h", 7200),
        ("1d", 86400),
        ("1w", 604800),
        ("500ms", 0.5),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("2H", 7200),
        (" 1h 30m ", 5400),
        ("90", 90),
        ("1.5", 1.5),
        (90, 90),
        (0.25, 0.25),
        ("0", 0),
        ("PT15M", 900),
        ("PT0.5S", 0.5),
        ("P1D", 86400),
        ("P1DT2H30M", 95400),
        ("P2W", 1209600),
        ("pt1h", 3600),
    ],
)
def test_accepted_spellings_give_seconds(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("5x", "invalid duration '5x': unknown unit 'x' (use ms, s, m, h, d, w)"),
        ("", "invalid duration '': empty"),
        ("-1s", "invalid duration '-1s': must not be negative"),
        (-3, "invalid duration '-3': must not be negative"),
        ("abc",
         "invalid duration 'abc': expected a number with "
         "a unit (ms, s, m, h, d, w), e.g. 90s, 15m, 1h30m"),
        ("1h1h", "invalid duration '1h1h': unit 'h' appears twice"),
        ("P1M",
         "invalid duration 'P1M': ISO-8601 years and "
         "months have no fixed length; use days or weeks"),
        ("P1Y",
         "invalid duration 'P1Y': ISO-8601 years and "
         "months have no fixed length; use days or weeks"),
        ("PT", "invalid duration 'PT': not an ISO-8601 duration such as PT15M or P1DT2H"),
        ("PT1M2H", "invalid duration 'PT1M2H': not an ISO-8601 duration such as PT15M or P1DT2H"),
        (float("inf"), "invalid duration 'inf': must be a finite number of seconds"),
        (True, "invalid duration 'True': expected a duration, not a boolean"),
    ],
)
def test_invalid_durations_name_the_value_and_reason(value: object, message: str) -> None:
    with pytest.raises(InvalidDuration) as caught:
        parse_duration(value)  # type: ignore[arg-type]
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(90, "1m30s"), (3600, "1h"), (0, "0s"), (0.5, "500ms"), (90061, "1d1h1m1s"), (1.5, "1s500ms"),
     (-60, "-1m")],
)
def test_format_duration_is_compact(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**10))
def test_formatted_duration_parses_back_to_the_same_milliseconds(millis: int) -> None:
    assert round(parse_duration(format_duration(millis / 1000)) * 1000) == millis
