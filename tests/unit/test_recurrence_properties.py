"""Property tests for cron triggers against an independent oracle.

The oracle takes field sets from ``croniter.expand`` (not from our parser) and applies the
Vixie DOM/DOW rule and the DST rules of docs/design.md §4 by walking real UTC minutes.
croniter 7 expands any single-value range ``a-a`` (and ``a-a/k``) to ``*`` (so
``5-5 * * * *`` fires every minute there); the oracle rewrites those to ``a`` first.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronolog.domain.recurrence import compile_trigger, upcoming

ZONES = ["UTC", "America/New_York", "Europe/London", "Australia/Sydney", "Australia/Lord_Howe",
         "Asia/Kolkata"]

# 2026 transitions (UTC instants) for the zones with DST.
TRANSITIONS = [
    ("America/New_York", "2026-03-08T07:00:00"),
    ("America/New_York", "2026-11-01T06:00:00"),
    ("Europe/London", "2026-03-29T01:00:00"),
    ("Europe/London", "2026-10-25T01:00:00"),
    ("Australia/Sydney", "2026-04-04T16:00:00"),
    ("Australia/Sydney", "2026-10-03T16:00:00"),
    ("Australia/Lord_Howe", "2026-04-04T15:00:00"),
    ("Australia/Lord_Howe", "2026-10-03T15:30:00"),
]


# ---------------------------------------------------------------- expression strategy


def _item(low: int, high: int, bias: list[int]) -> st.SearchStrategy[str]:
    value = st.one_of(st.sampled_from(bias), st.integers(low, high))
    ranged = st.tuples(value, value).map(lambda p: f"{min(p)}-{max(p)}")
    stepped = st.tuples(ranged, st.integers(1, 7)).map(lambda p: f"{p[0]}/{p[1]}")
    return st.one_of(value.map(str), ranged, stepped)


def _field(low: int, high: int, bias: list[int]) -> st.SearchStrategy[str]:
    star = st.one_of(st.just("*"), st.integers(2, 20).map(lambda k: f"*/{k}"))
    listed = st.lists(_item(low, high, bias), min_size=1, max_size=3).map(",".join)
    return st.one_of(star, listed)


def _dow_field() -> st.SearchStrategy[str]:
    # croniter.expand turns '7-7' into '*', so the oracle avoids ranges ending at 7.
    return st.one_of(st.just("*"), st.integers(0, 7).map(str), _item(0, 6, [1, 5]))


CRON = st.tuples(
    _field(0, 59, [0, 15, 30, 45]),
    _field(0, 23, [1, 2, 3]),
    st.one_of(st.just("*"), st.just("*"), _field(1, 31, [1, 29, 31])),
    st.one_of(st.just("*"), st.just("*"), _field(1, 12, [2, 3, 4, 10, 11])),
    _dow_field(),
).map(" ".join)

# Fixed-time jobs whose hours sit on the 2026 transitions (0-4 local), every day.
NEAR_TRANSITION_CRON = st.tuples(
    st.lists(_item(0, 59, [0, 15, 29, 30, 45, 59]), min_size=1, max_size=3).map(",".join),
    st.lists(st.integers(0, 4).map(str), min_size=1, max_size=3).map(",".join),
).map(lambda p: f"{p[0]} {p[1]} * * *")


# ---------------------------------------------------------------- oracle


_SINGLE_RANGE = re.compile(r"(?<![\d/])(\d+)-\1(?:/\d+)?(?=,|$)")


class Oracle:
    """Matches wall times using croniter's expansion and the Vixie DOM/DOW rule."""

    def __init__(self, expr: str) -> None:
        parts = expr.split()
        expanded, _ = croniter.expand(" ".join(_SINGLE_RANGE.sub(r"\1", part) for part in parts))
        full = [range(60), range(24), range(1, 32), range(1, 13), range(7)]
        self.sets = [set(everything) if got == ["*"] else set(got)
                     for got, everything in zip(expanded, full, strict=True)]
        self.sets[4] = {0 if d == 7 else d for d in self.sets[4]}
        self.dom_star, self.dow_star = parts[2].startswith("*"), parts[4].startswith("*")
        self.wildcard = parts[0].startswith("*") or parts[1].startswith("*")

    def day(self, d: date) -> bool:
        _minute, _hour, dom, month, dow = self.sets
        dom_ok, dow_ok = d.day in dom, (d.weekday() + 1) % 7 in dow
        day_ok = (dom_ok and dow_ok) if (self.dom_star or self.dow_star) else (dom_ok or dow_ok)
        return d.month in month and day_ok

    def wall(self, w: datetime) -> bool:
        return w.minute in self.sets[0] and w.hour in self.sets[1] and self.day(w.date())

    def reference(self, zone: ZoneInfo, start: datetime, stop: datetime, ambiguous: str,
                  nonexistent: str) -> list[datetime]:
        """Every firing instant in (start, stop], by walking real UTC minutes."""
        out = []
        u = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
        while u <= stop:
            local = u.astimezone(zone)
            wall = local.replace(tzinfo=None)
            repeated = (wall.replace(tzinfo=zone, fold=1 - local.fold).utcoffset()
                        != local.utcoffset())
            if ((self.wall(wall) and (self.wildcard or not repeated or ambiguous == "both"
                                      or (ambiguous == "first") == (local.fold == 0)))
                    or (not self.wildcard and nonexistent == "shift_forward"
                        and self._gap_ends_here(zone, u))):
                out.append(u)
            u += timedelta(minutes=1)
        return out

    def _gap_ends_here(self, zone: ZoneInfo, u: datetime) -> bool:
        """Is ``u`` the end of a gap that swallowed a matching wall time?"""
        jump = (u.astimezone(zone).utcoffset()  # type: ignore[operator]
                - (u - timedelta(seconds=1)).astimezone(zone).utcoffset())
        if jump <= timedelta(0):
            return False
        end_wall = u.astimezone(zone).replace(tzinfo=None)
        skipped = int(jump.total_seconds() // 60)
        return any(self.wall(end_wall - timedelta(minutes=k)) for k in range(1, skipped + 1))


def _is_valid_for_oracle(expr: str) -> bool:
    try:
        compile_trigger(cron=expr)
        croniter.expand(expr)
    except ValueError:
        return False
    except Exception:  # noqa: BLE001 - any other error: not an expression the oracle takes
        return False
    return True


# ---------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(
    expr=CRON.filter(_is_valid_for_oracle),
    zone_name=st.sampled_from(ZONES),
    start=st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1)),
)
def test_instants_increase_and_each_matches_its_local_wall_time(expr: str, zone_name: str,
                                                                start: datetime) -> None:
    trigger = compile_trigger(cron=expr, timezone=zone_name)
    zone, oracle = ZoneInfo(zone_name), Oracle(expr)
    fired = upcoming(trigger, start.replace(tzinfo=UTC), 12)
    assert fired, expr
    previous = start.replace(tzinfo=UTC)
    for instant in fired:
        assert instant > previous and instant.tzinfo is UTC and instant.microsecond == 0
        local = instant.astimezone(zone)
        if oracle.wall(local.replace(tzinfo=None)):
            repeated = local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset()
            # default: first
            assert oracle.wildcard or not repeated or local.fold == 0, (expr, zone_name, instant)
        else:
            assert not oracle.wildcard and oracle._gap_ends_here(zone, instant), (
                expr, zone_name, instant)
        previous = instant


@pytest.mark.exhaustive
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(
    expr=st.one_of(CRON, NEAR_TRANSITION_CRON).filter(_is_valid_for_oracle),
    transition=st.sampled_from(TRANSITIONS),
    ambiguous=st.sampled_from(["first", "second", "both"]),
    nonexistent=st.sampled_from(["shift_forward", "skip"]),
)
def test_instants_around_a_transition_equal_the_brute_force_oracle(
    expr: str, transition: tuple[str, str], ambiguous: str, nonexistent: str
) -> None:
    zone_name, at = transition
    pivot = datetime.fromisoformat(at).replace(tzinfo=UTC)
    start, stop = pivot - timedelta(hours=14), pivot + timedelta(hours=14)
    trigger = compile_trigger(cron=expr, timezone=zone_name, dst_ambiguous=ambiguous,
                              dst_nonexistent=nonexistent)
    got = []
    current = trigger.next_after(start)
    while current is not None and current <= stop:
        got.append(current)
        current = trigger.next_after(current)
    assert got == Oracle(expr).reference(ZoneInfo(zone_name), start, stop, ambiguous, nonexistent)
