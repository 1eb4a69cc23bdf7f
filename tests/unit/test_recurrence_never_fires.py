"""A cron rule that can never fire is refused, exactly: for every combination of the day
fields (plain values, steps, ``L``, ``L-n``, ``nW``, ``LW`` by ``nL``, ``n#k``, with the
Vixie AND / OR) and every month set.

The reference is a brute-force walk over one whole Gregorian cycle (400 years: the calendar
repeats after it), with each item's meaning written from docs/tour.md ("The cron dialect")
alone (the items of test_recurrence_dialect_oracle). Minute and hour never decide it: each
field holds at least one value, so a rule fires iff some day matches.
"""

from __future__ import annotations

import calendar
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from chronolog.commands.state import trigger_of
from chronolog.domain import recurrence
from chronolog.domain.recurrence import RecurrenceError, compile_trigger, upcoming
from chronolog.queries.documents import InvalidDefinition, JobIn, ScheduleDefinition, to_spec
from unit.test_recurrence_dialect_oracle import DOM_ITEM, DOW_ITEM, MONTHS, Item, _sunday_zero

DayTest = Callable[[date], bool]
CYCLE = (date(2000, 1, 1), date(2399, 12, 31))


@dataclass(frozen=True)
class DayField:
    text: str
    test: DayTest
    restricted: bool  # starts with neither * nor ?


def _unrestricted(size: int, low: int, value: Callable[[date], int]) -> st.SearchStrategy[DayField]:
    """``*``, ``?`` and ``*/k``: unrestricted, though ``*/k`` holds only some values."""
    every = st.sampled_from([DayField("*", lambda d: True, False),
                             DayField("?", lambda d: True, False)])
    stepped = st.integers(2, size).map(
        lambda k: DayField(f"*/{k}", lambda d: (value(d) - low) % k == 0, False))
    return st.one_of(every, stepped, stepped)


def _restricted(items: st.SearchStrategy[Item]) -> st.SearchStrategy[DayField]:
    def field(its: list[Item]) -> DayField:
        tests = [i.day for i in its if i.day is not None]
        return DayField(",".join(i.text for i in its), lambda d: any(t(d) for t in tests), True)

    return st.lists(items, min_size=1, max_size=2).map(field)


DOM = st.one_of(_unrestricted(31, 1, lambda d: d.day), _restricted(DOM_ITEM))
DOW = st.one_of(_unrestricted(7, 0, _sunday_zero), _restricted(DOW_ITEM))
# months that make a day special rare: February (28 or 29 days) and the 30-day months
FEW_MONTHS = st.sampled_from([("2", frozenset({2})), ("FEB", frozenset({2})),
                              ("4,6", frozenset({4, 6})), ("APR", frozenset({4})),
                              ("2,9-11", frozenset({2, 9, 10, 11}))])


def _brute_force_fires(months: frozenset[int], dom: DayField, dow: DayField) -> bool:
    """Does any day of one 400-year cycle match (the Vixie rule: OR when both fields are
    restricted, else AND)?"""
    for year in range(CYCLE[0].year, CYCLE[1].year + 1):
        for month in sorted(months):
            for day in range(1, calendar.monthrange(year, month)[1] + 1):
                d = date(year, month, day)
                dom_ok, dow_ok = dom.test(d), dow.test(d)
                if (dom_ok or dow_ok) if dom.restricted and dow.restricted else (dom_ok and dow_ok):
                    return True
    return False


def _sparse_step(size: int, low: int, value: Callable[[date], int]) -> st.SearchStrategy[DayField]:
    """``*/k`` with a large k: an unrestricted field that holds a few values (AND)."""
    return st.integers(size // 2, size).map(
        lambda k: DayField(f"*/{k}", lambda d: (value(d) - low) % k == 0, False))


# rules near the edge: a sparse step ANDed with one special of the other field
NEAR_NEVER = st.one_of(
    st.tuples(_sparse_step(31, 1, lambda d: d.day), _restricted(DOW_ITEM)),
    st.tuples(_restricted(DOM_ITEM), _sparse_step(7, 0, _sunday_zero)),
)


@pytest.mark.exhaustive
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(months=st.one_of(MONTHS, FEW_MONTHS),
       days=st.one_of(st.tuples(DOM, DOW), NEAR_NEVER, NEAR_NEVER))
def test_a_rule_is_refused_iff_no_day_of_a_400_year_cycle_matches(
    months: tuple[str, frozenset[int]], days: tuple[DayField, DayField]
) -> None:
    month_text, month_set = months
    dom, dow = days
    text = f"0 9 {dom.text} {month_text} {dow.text}"
    expected = _brute_force_fires(month_set, dom, dow)
    try:
        compile_trigger(cron=text)
        refused = None
    except RecurrenceError as exc:
        refused = str(exc)
    event("fires" if expected else "never fires")
    if expected:
        assert refused is None, text
    else:
        assert refused is not None and "never" in refused, text


@pytest.mark.parametrize("expr", [
    "0 0 */31 * 1#5",  # the 1st is never a fifth Monday
    "* 2 */3 APR 4#5",  # a fifth Thursday of April is the 29th or 30th, never 1, 4, ... 28
    "0 0 */10 4,6,9,11 0L",  # a last Sunday of a 30-day month is the 24th to 30th
    "0 0 LW * */7",  # the last weekday (Monday to Friday) is never a Sunday
    "0 0 15W * */6",  # nor the weekday nearest the 15th a Saturday or a Sunday
    "0 0 31 4,6 *",
])
def test_a_day_special_that_never_meets_the_other_day_field_is_refused(expr: str) -> None:
    with pytest.raises(RecurrenceError, match="never"):
        compile_trigger(cron=expr)


def test_the_fifth_sunday_of_february_is_a_leap_day_forty_years_apart_at_worst() -> None:
    # February 1st is a Sunday in the leap years 2060, 2088, then (2100 not being leap) 2128
    trigger = compile_trigger(cron="0 0 ? 2 0#5")
    got = upcoming(trigger, datetime(2061, 1, 1, tzinfo=UTC), 3)
    assert [t.date() for t in got] == [date(2088, 2, 29), date(2128, 2, 29), date(2156, 2, 29)]


def test_every_month_shape_occurs_in_a_cycle_and_comes_back_within_forty_years() -> None:
    # the argument of _can_fire: the shapes it tries are exactly those of the calendar, and
    # none waits longer than the search bound
    seen: dict[tuple[int, int, int], list[int]] = {}
    for year in range(2000, 2800):  # two cycles, so every wait within one is seen
        for month in range(1, 13):
            seen.setdefault((month, *calendar.monthrange(year, month)), []).append(year)
    tried = {(month, *shape) for month in range(1, 13)
             for shape in recurrence._month_shapes(month)}
    assert tried == set(seen)
    longest = max(b - a for years in seen.values() for a, b in itertools.pairwise(years))
    assert longest == 40 and longest < recurrence._SEARCH_YEARS


def test_a_recorded_rule_that_never_fires_folds_to_no_instant_but_a_new_one_is_refused() -> None:
    # an earlier version accepted such a rule: the log holding it must still fold
    spec = to_spec(ScheduleDefinition(job=JobIn(type="report"), cron="0 0 1 * 2#1"))
    never = spec.model_copy(update={"cron": "0 0 */31 * 1#5"})
    anchor = datetime(2026, 1, 1, tzinfo=UTC)
    assert trigger_of(never, anchor).next_after(anchor) is None
    with pytest.raises(RecurrenceError, match="never fall on the same day"):
        trigger_of(never, anchor, recorded=False)
    with pytest.raises(InvalidDefinition, match="never fall on the same day") as api:
        to_spec(ScheduleDefinition(job=JobIn(type="report"), cron="0 0 */31 * 1#5"))
    assert api.value.field == "cron"  # the API's 400 names it


def test_every_refusal_is_one_line_naming_the_day_fields() -> None:
    for expr in ("0 0 */31 * 1#5", "0 0 30 2 *"):
        with pytest.raises(RecurrenceError) as caught:
            compile_trigger(cron=expr)
        assert "\n" not in str(caught.value) and "day-of-month" in str(caught.value)


def test_one_cycle_is_400_years_of_whole_weeks() -> None:
    assert (CYCLE[1] - CYCLE[0] + timedelta(days=1)).days == 146_097 == 7 * 20_871
    assert CYCLE[0].weekday() == date(2400, 1, 1).weekday()
