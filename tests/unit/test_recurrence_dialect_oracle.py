"""The cron specials (L, L-n, nW, LW, nL, n#k) and reversed ranges against a brute-force oracle.

Expressions are drawn as structured items: each item is rendered to cron text AND carries
its meaning, written here from the documented rule alone (no parsing, no calendar helpers
of the implementation). The oracle walks real UTC minutes and applies the daylight-saving
rule and the Vixie day rule as docs/tour.md ("The cron dialect") states them:

* a wildcard job (minute or hour field starts with ``*``) fires at every real minute whose
  local wall time matches;
* a fixed-time job fires a matching repeated wall time per ``dst.ambiguous`` and, under
  ``shift_forward``, fires at the instant a gap ends when a matching wall time was skipped;
* when both day fields are restricted (neither starts with ``*`` or ``?``) a day matches if
  either matches, otherwise both must.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from chronolog.domain.recurrence import RecurrenceError, compile_trigger

MINUTE = timedelta(minutes=1)
DayTest = Callable[[date], bool]

# 2026 transitions (UTC instants); their local days are Sundays picked out by 0#1, 0#2 and
# 0L, and by L-n / nW for suitable n.
TRANSITIONS = [
    ("America/New_York", datetime(2026, 3, 8, 7, 0, tzinfo=UTC)),  # 2nd Sunday, gap 02:00-03:00
    # 1st Sunday and the 1st, 01:00-02:00 twice
    ("America/New_York", datetime(2026, 11, 1, 6, 0, tzinfo=UTC)),
    ("Europe/London", datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),  # last Sunday, gap 01:00-02:00
    ("Europe/London", datetime(2026, 10, 25, 1, 0, tzinfo=UTC)),  # last Sunday, 01:00-02:00 twice
    ("Australia/Sydney", datetime(2026, 4, 4, 16, 0, tzinfo=UTC)),  # 1st Sunday, 02:00-03:00 twice
    ("Australia/Sydney", datetime(2026, 10, 3, 16, 0, tzinfo=UTC)),  # 1st Sunday, gap 02:00-03:00
    ("Australia/Lord_Howe", datetime(2026, 4, 4, 15, 0, tzinfo=UTC)),  # 30-minute shift
    ("Australia/Lord_Howe", datetime(2026, 10, 3, 15, 30, tzinfo=UTC)),
]
# (dst.ambiguous, dst.nonexistent)
DST_POLICIES = st.tuples(st.sampled_from(["first", "second", "both"]),
                         st.sampled_from(["shift_forward", "skip"]))
# months whose edges the specials care about: the 1st a Saturday (2026-08, 2025-11), the
# 1st a Sunday (2026-02, 2026-03), the last day a Sunday (2026-05, 2027-02, 2025-11), a leap
# February (2028-02), a February with four of every weekday (2026-02)
EDGE_MONTHS = [(2026, 8), (2025, 11), (2026, 2), (2026, 3), (2026, 5), (2027, 2), (2028, 2)]
ZONES = ["UTC", "America/New_York", "Europe/London", "Australia/Sydney", "Asia/Kolkata",
         "Pacific/Chatham"]


# ---------------------------------------------------------------- the rule, brute force


def _month_days(d: date) -> list[date]:
    return _days_of(d.year, d.month)


@functools.cache
def _days_of(year: int, month: int) -> list[date]:
    first = date(year, month, 1)
    return [first + timedelta(days=i) for i in range(31)
            if (first + timedelta(days=i)).month == month]


def _weekdays_of_month(d: date) -> list[date]:
    return _weekdays_of(d.year, d.month)


@functools.cache
def _weekdays_of(year: int, month: int) -> list[date]:
    return [x for x in _days_of(year, month) if x.isoweekday() <= 5]


def _sunday_zero(d: date) -> int:
    return d.isoweekday() % 7


def _in_cycle(value: int, low: int, high: int, step: int, size: int) -> bool:
    """Is ``value`` in ``low-high/step`` on a cycle of ``size`` values starting at ``start``,
    walking up from ``low`` (past the end of the cycle back to its start when low > high)?"""
    distance = (value - low) % size
    return distance <= (high - low) % size and distance % step == 0


# ---------------------------------------------------------------- items: (text, meaning)


@dataclass(frozen=True)
class Item:
    text: str
    values: frozenset[int] | None = None  # minute / hour / month items
    day: DayTest | None = None  # day-of-month / day-of-week items


def _range_items(low: int, high: int, size: int) -> st.SearchStrategy[Item]:
    """Single values, ascending and reversed ranges, with or without a step."""

    def build(a: int, b: int, step: int | None) -> Item:
        text = f"{a}-{b}" + (f"/{step}" if step else "")
        s = step or 1
        return Item(text, frozenset(v for v in range(low, high + 1) if _in_cycle(v, a, b, s, size)))

    value = st.integers(low, high)
    single = value.map(lambda v: Item(str(v), frozenset({v})))
    ranged = st.builds(build, value, value, st.one_of(st.none(), st.integers(1, 5)))
    return st.one_of(single, ranged)


def _listed(items: st.SearchStrategy[Item]) -> st.SearchStrategy[list[Item]]:
    return st.lists(items, min_size=1, max_size=3)


def _set_field(low: int, high: int,
               wildcard_ok: bool) -> st.SearchStrategy[tuple[str, frozenset[int]]]:
    size = high - low + 1
    listed = _listed(_range_items(low, high, size)).map(
        lambda items: (",".join(i.text for i in items),
                       frozenset().union(*(i.values or () for i in items))))
    if not wildcard_ok:
        return listed
    star = st.integers(1, 30).map(lambda k: (f"*/{k}", frozenset(range(low, high + 1, k))))
    return st.one_of(listed, star)


def _last_minus(n: int) -> Item:
    return Item("L" if n == 0 else f"L-{n}", day=lambda d: (d + timedelta(days=n)).month == d.month
                and (d + timedelta(days=n + 1)).month != d.month)


def _nearest_weekday(n: int) -> Item:
    def test(d: date) -> bool:
        days = _month_days(d)
        if n > len(days):
            return False
        return d == min(_weekdays_of_month(d), key=lambda x: abs(x.day - n))

    return Item(f"{n}W", day=test)


LAST_WEEKDAY = Item("LW", day=lambda d: d == max(_weekdays_of_month(d)))


def _dom_plain(a: int, b: int, step: int | None) -> Item:
    s = step or 1
    text = (f"{a}" if a == b and not step else f"{a}-{b}") + (f"/{step}" if step else "")
    return Item(text, day=lambda d: _in_cycle(d.day, a, b, s, 31))


DOM_ITEM = st.one_of(
    st.integers(0, 30).map(_last_minus),
    st.sampled_from([0, 1, 2, 6, 27, 30]).map(_last_minus),
    st.integers(1, 31).map(_nearest_weekday),
    st.sampled_from([1, 1, 8, 15, 28, 29, 30, 31]).map(_nearest_weekday),
    st.just(LAST_WEEKDAY),
    st.builds(_dom_plain, st.integers(1, 31), st.integers(1, 31),
              st.one_of(st.none(), st.integers(2, 4))),
)

DOW_NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
# 7 is Sunday too; Sundays are transition days
WEEKDAY = st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5, 6, 7])


def _weekday_text(w: int, named: bool) -> str:
    return DOW_NAMES[w % 7] if named else str(w)


def _last_of_month(w: int, named: bool) -> Item:
    return Item(f"{_weekday_text(w, named)}L",
                day=lambda d: _sunday_zero(d) == w % 7 and (d + timedelta(days=7)).month != d.month)


def _nth(w: int, k: int, named: bool) -> Item:
    def test(d: date) -> bool:
        same = [x for x in _month_days(d) if x <= d and _sunday_zero(x) == w % 7]
        return _sunday_zero(d) == w % 7 and len(same) == k

    return Item(f"{_weekday_text(w, named)}#{k}", day=test)


def _dow_range(a: int, b: int, named: bool) -> Item:
    text = (f"{_weekday_text(a, named)}-{_weekday_text(b, named)}" if a != b
            else _weekday_text(a, named))
    return Item(text, day=lambda d: _in_cycle(_sunday_zero(d), a % 7, b % 7, 1, 7))


DOW_ITEM = st.one_of(
    st.builds(_last_of_month, WEEKDAY, st.booleans()),
    st.builds(_nth, WEEKDAY, st.integers(1, 5), st.booleans()),
    st.builds(_dow_range, st.integers(0, 6), st.integers(0, 6), st.booleans()),
)


def _day_field(items: st.SearchStrategy[Item]) -> st.SearchStrategy[tuple[str, DayTest | None]]:
    """``*`` / ``?`` (unrestricted: None) or a list of items (restricted)."""
    listed = _listed(items).map(lambda its: (",".join(i.text for i in its),
                                             lambda d, its=its: any(i.day(d) for i in its)))  # type: ignore[misc]
    return st.one_of(st.sampled_from([("*", None), ("?", None)]), listed, listed)


@dataclass
class Expression:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    dom: DayTest | None
    dow: DayTest | None
    wildcard: bool

    def day(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom_ok = self.dom is None or self.dom(d)
        dow_ok = self.dow is None or self.dow(d)
        if self.dom is not None and self.dow is not None:  # both restricted: either
            return dom_ok or dow_ok
        return dom_ok and dow_ok

    def wall(self, w: datetime, cache: dict[date, bool]) -> bool:
        if w.minute not in self.minutes or w.hour not in self.hours:
            return False
        if w.date() not in cache:
            cache[w.date()] = self.day(w.date())
        return cache[w.date()]

    def reference(self, zone: ZoneInfo, start: datetime, stop: datetime, ambiguous: str,
                  nonexistent: str) -> list[datetime]:
        """Every firing instant in (start, stop], one real minute at a time."""
        cache: dict[date, bool] = {}
        out = []
        u = start.replace(second=0, microsecond=0) + MINUTE
        before = (u - MINUTE).astimezone(zone).utcoffset()
        while u <= stop:
            local = u.astimezone(zone)
            offset, wall = local.utcoffset(), local.replace(tzinfo=None)
            assert offset is not None and before is not None
            fires = False
            if self.wall(wall, cache):
                twice = wall.replace(tzinfo=zone, fold=1 - local.fold).utcoffset() != offset
                fires = (self.wildcard or not twice or ambiguous == "both"
                         or (ambiguous == "first") == (local.fold == 0))
            if (not fires and offset > before and not self.wildcard
                    and nonexistent == "shift_forward"):
                skipped = int((offset - before) / MINUTE)  # wall minutes that never happened
                fires = any(self.wall(wall - k * MINUTE, cache) for k in range(1, skipped + 1))
            if fires:
                out.append(u)
            before = offset
            u += MINUTE
        return out


MONTHS = st.one_of(
    st.just(("*", frozenset(range(1, 13)))),
    st.sampled_from([("NOV-FEB", frozenset({11, 12, 1, 2})),
                     ("10-4", frozenset({10, 11, 12, 1, 2, 3, 4}))]),
    _set_field(1, 12, wildcard_ok=False),
)


@st.composite
def expressions(draw: st.DrawFn,
                hours: st.SearchStrategy[tuple[str, frozenset[int]]]) -> Expression:
    minute_text, minutes = draw(st.one_of(
        st.sampled_from([("0", frozenset({0})), ("30", frozenset({30})),
                         ("0,30", frozenset({0, 30})),
                         ("50-10/20", frozenset({50, 10}))]),
        _set_field(0, 59, wildcard_ok=True)))
    hour_text, hour_set = draw(hours)
    month_text, months = draw(MONTHS)
    dom_text, dom = draw(_day_field(DOM_ITEM))
    dow_text, dow = draw(_day_field(DOW_ITEM))
    text = f"{minute_text} {hour_text} {dom_text} {month_text} {dow_text}"
    return Expression(text, minutes, hour_set, months, dom, dow,
                      wildcard=minute_text.startswith("*") or hour_text.startswith("*"))


NEAR_TRANSITION_HOURS = st.one_of(
    st.sampled_from([("1", frozenset({1})), ("2", frozenset({2})), ("1,2", frozenset({1, 2})),
                     ("0-3", frozenset(range(4))), ("23-2", frozenset({23, 0, 1, 2})),
                     ("*", frozenset(range(24)))]),
    _set_field(0, 23, wildcard_ok=True),
)


def _fired(expr: Expression, zone: str, start: datetime, stop: datetime, ambiguous: str = "first",
           nonexistent: str = "shift_forward") -> list[datetime] | None:
    """The implementation's instants in (start, stop], or None if it rejects the text."""
    try:
        trigger = compile_trigger(cron=expr.text, timezone=zone, dst_ambiguous=ambiguous,
                                  dst_nonexistent=nonexistent)
    except RecurrenceError:
        return None
    got = []
    current = trigger.next_after(start)
    while current is not None and current <= stop:
        got.append(current)
        current = trigger.next_after(current)
    return got


# ---------------------------------------------------------------- properties


@pytest.mark.exhaustive
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=expressions(NEAR_TRANSITION_HOURS), transition=st.sampled_from(TRANSITIONS),
       policy=DST_POLICIES)
def test_specials_across_a_dst_transition_equal_the_minute_oracle(
    expr: Expression, transition: tuple[str, datetime], policy: tuple[str, str]
) -> None:
    zone, pivot = transition
    start, stop = pivot - timedelta(days=2), pivot + timedelta(days=2)
    got = _fired(expr, zone, start, stop, *policy)
    expected = expr.reference(ZoneInfo(zone), start, stop, *policy)
    event("refused" if got is None else "fires in the window" if expected
          else "no instant in the window")
    if got is None:  # refused only when no month can ever hold a matching day
        assert not expected, expr.text
        return
    assert got == expected, expr.text


@st.composite
def one_special(draw: st.DrawFn) -> Expression:
    """``0 H <item> * *`` or ``0 H * * <item>``: one day item alone restricts the day."""
    hour_text, hours = draw(st.sampled_from([("9", frozenset({9})), ("0,23", frozenset({0, 23})),
                                             ("22-1", frozenset({22, 23, 0, 1}))]))
    on_dom = draw(st.booleans())
    item = draw(DOM_ITEM if on_dom else DOW_ITEM)
    dom, dow = (item.text, "*") if on_dom else ("?", item.text)
    return Expression(f"0 {hour_text} {dom} * {dow}", frozenset({0}), hours,
                      frozenset(range(1, 13)), item.day if on_dom else None,
                      None if on_dom else item.day, wildcard=False)


# 40 whole months, a brute-force minute each (about 0.1 s an example): the days each special
# names are checked over twelve years below
@pytest.mark.long(6)
@pytest.mark.exhaustive
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    expr=st.one_of(one_special(), expressions(st.sampled_from(
        [("9", frozenset({9})), ("22-1", frozenset({22, 23, 0, 1}))]))),
    zone=st.sampled_from(ZONES),
    year_month=st.one_of(st.sampled_from(EDGE_MONTHS),
                         st.tuples(st.integers(2024, 2030), st.integers(1, 12))),
)
def test_specials_over_a_whole_month_equal_the_minute_oracle(
    expr: Expression, zone: str, year_month: tuple[int, int]
) -> None:
    start = datetime(*year_month, 1, tzinfo=UTC) - timedelta(days=1)
    stop = start + timedelta(days=33)
    got = _fired(expr, zone, start, stop)
    expected = expr.reference(ZoneInfo(zone), start, stop, "first", "shift_forward")
    event("refused" if got is None else "fires in the window" if expected
          else "no instant in the window")
    if got is None:
        assert not expected, expr.text
        return
    assert got == expected, expr.text


EVERY_DAY_ITEM = [
    *(_last_minus(n) for n in range(31)),
    *(_nearest_weekday(n) for n in range(1, 32)),
    LAST_WEEKDAY,
]
EVERY_WEEKDAY_ITEM = [
    *(_last_of_month(w, named) for w in range(8) for named in (False, True)),
    *(_nth(w, k, False) for w in range(8) for k in range(1, 6)),
]


@pytest.mark.exhaustive
def test_every_special_names_the_oracles_days_for_twelve_years() -> None:
    first, last = date(2024, 1, 1), date(2035, 12, 31)
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    start = datetime(2023, 12, 31, 12, tzinfo=UTC)
    stop = datetime(2035, 12, 31, 23, 59, tzinfo=UTC)
    for item, text in [*((i, f"0 0 {i.text} * *") for i in EVERY_DAY_ITEM),
                       *((i, f"0 0 ? * {i.text}") for i in EVERY_WEEKDAY_ITEM)]:
        assert item.day is not None
        expected = [d for d in days if item.day(d)]
        fired = _fired(Expression(text, frozenset({0}), frozenset({0}), frozenset(range(1, 13)),
                                  None, None, wildcard=False), "UTC", start, stop)
        assert fired is not None, text
        assert [instant.date() for instant in fired] == expected, text
