"""No input makes a recurrence, duration or instant parser raise anything but its own error.

Arbitrary text, cron-shaped and duration-shaped text built from ASCII and non-ASCII digits
(superscripts, Arabic-Indic, fullwidth), numbers far beyond any range, and symbols, go to
every parser; a rule that compiles is then asked for its next instants. The only exception
allowed out is ``RecurrenceError`` (``InvalidDuration`` from ``parse_duration``), both
``ValueError`` subclasses whose text is one line naming the field.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronolog.domain.durations import InvalidDuration, parse_duration
from chronolog.domain.recurrence import (
    RecurrenceError,
    compile_trigger,
    is_wildcard_cron,
    parse_cron,
    parse_instant,
    resolve_zone,
    upcoming,
)

ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)
FIELDS = {"cron", "timezone", "every", "at", "anchor", "delay", "start", "end", "dst.ambiguous",
          "dst.nonexistent", "trigger", "after"}

# digits that str.isdigit() accepts but are not ASCII: superscripts, Arabic-Indic, Devanagari,
# fullwidth, mathematical bold, circled
FOREIGN_DIGITS = "²³¹⁰⁴٠١٣٩۵०३０９𝟎𝟗①"
HUGE = st.one_of(st.integers(10**9, 10**30).map(str),
                 st.tuples(st.integers(1, 9), st.integers(20, 6000))
                 .map(lambda t: str(t[0]) * t[1]))
NUMBER = st.one_of(st.integers(0, 70).map(str), HUGE,
                   st.text(FOREIGN_DIGITS + "0123456789", min_size=1, max_size=4))
TOKEN = st.one_of(NUMBER, st.sampled_from(["*", "?", "L", "W", "LW", "H", "#", "-", "/", ",",
                                           "FRI", "jan", "sun", "L-", "1L", "5#", "\x00", "\n",
                                           " ", "\u200b", "@daily", "@"]))
CRON_FIELD = st.lists(TOKEN, min_size=1, max_size=5).map("".join)
CRON_TEXT = st.one_of(st.text(max_size=40),
                      st.lists(CRON_FIELD, min_size=1, max_size=7).map(" ".join))
DURATION_TEXT = st.one_of(
    st.text(max_size=30),
    st.tuples(NUMBER,
              st.sampled_from(["", "ms", "s", "m", "h", "d", "w", "e", ".", "Ｓ"])).map("".join),
    st.tuples(st.sampled_from(["P", "PT", "p", "P1DT"]), NUMBER,
              st.sampled_from(["W", "D", "H", "M", "S", "Y"])).map("".join),
)
DURATION = st.one_of(DURATION_TEXT,
                     st.one_of(st.integers(),
                               st.sampled_from([10**400, -(10**400), 10**20, 2**63])),
                     st.floats(allow_nan=True, allow_infinity=True))
INSTANT_TEXT = st.one_of(
    st.text(max_size=40),
    st.datetimes(timezones=st.sampled_from([None, UTC])).map(lambda d: d.isoformat()),
    st.tuples(st.datetimes().map(lambda d: d.isoformat()), st.integers(0, 18),
              st.sampled_from(FOREIGN_DIGITS))
    .map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + 1:]),
)
ZONE = st.one_of(
    st.sampled_from(["UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe"]),
    st.text(max_size=20))
AFTER = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                     timezones=st.just(UTC))


def _own_error(error: RecurrenceError) -> None:
    assert error.field in FIELDS
    assert "\n" not in str(error) and str(error).startswith(f"invalid {error.field} '")


def _next_instants(trigger: object, after: datetime) -> None:
    for instant in upcoming(trigger, after, 3):  # type: ignore[arg-type]
        assert instant.tzinfo is not None and instant > after


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=CRON_TEXT, zone=ZONE, after=AFTER)
def test_any_cron_text_is_a_trigger_or_a_recurrence_error(text: str, zone: str,
                                                          after: datetime) -> None:
    try:
        wildcard = is_wildcard_cron(text)
        spec = parse_cron(text)
        trigger = compile_trigger(cron=text, timezone=zone)
    except RecurrenceError as error:
        _own_error(error)
        return
    assert spec.wildcard == wildcard and spec.expr.isascii()
    _next_instants(trigger, after)


@settings(max_examples=400, deadline=None)
@given(value=DURATION)
def test_any_duration_is_seconds_or_an_invalid_duration(value: str | int | float) -> None:
    try:
        seconds = parse_duration(value)
    except InvalidDuration as error:
        assert "\n" not in str(error) and str(error).startswith("invalid duration '")
        return
    assert 0 <= seconds <= 10 * 366 * 86_400
    assert not isinstance(value, str) or value.isascii()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(every=DURATION, kind=st.sampled_from(["every", "delay"]), after=AFTER)
def test_any_interval_is_a_trigger_or_a_recurrence_error(every: str | int | float, kind: str,
                                                         after: datetime) -> None:
    try:
        trigger = compile_trigger(**{kind: every}, anchor=ANCHOR)  # type: ignore[arg-type]
    except RecurrenceError as error:
        _own_error(error)
        assert error.field == kind
        return
    _next_instants(trigger, after)


@settings(max_examples=400, deadline=None)
@given(text=INSTANT_TEXT, zone=ZONE, field=st.sampled_from(["at", "start", "end", "anchor"]),
       after=AFTER)
def test_any_instant_text_is_an_instant_or_a_recurrence_error(text: str, zone: str, field: str,
                                                              after: datetime) -> None:
    try:
        resolve_zone(zone)
        instant = parse_instant(text, zone, field=field)
        trigger = compile_trigger(**{field: text}, cron="0 0 L * *" if field != "at" else None,  # type: ignore[arg-type]
                                  timezone=zone)
    except RecurrenceError as error:
        _own_error(error)
        return
    assert instant.tzinfo is not None and text.isascii()
    _next_instants(trigger, after)
