"""Decider rules of a backfill (``decider._backfill``): every instant of the rule in
[from, to) before the schedule existed runs once as its own run (``trigger: backfill``);
the schedule's own instants and those an earlier backfill ran are reported, not run; the
request is idempotent by its key, bounded, and its runs never hold the overlap guard.

Given (history) / when (command) / then (events, status, body).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from chronolog.domain import messages as m
from chronolog.domain.ids import BACKFILL_RUN, limit_id
from chronolog.domain.limits import MAX_BACKFILL_INSTANTS
from support.decider import GivenWhenThen

HOUR = timedelta(hours=1)


def _backfill(gwt: GivenWhenThen, hours_back: int, hours_to: int = 0, key: str = "bf-1",
              overlap: str = "buffer_all") -> m.BackfillSchedule:
    """A backfill of the hours [T0 - hours_back, T0 - hours_to)."""
    return m.BackfillSchedule(request_key=key, start=gwt.T0 - hours_back * HOUR,
                              end=gwt.T0 - hours_to * HOUR, overlap=overlap)  # type: ignore[arg-type]


def _hourly(gwt: GivenWhenThen, **spec: Any) -> Any:
    """An hourly schedule created at T0."""
    return gwt.story().create(every=3600.0, **spec)


def test_every_instant_before_the_schedule_existed_runs_once(gwt: GivenWhenThen) -> None:
    s = _hourly(gwt)
    d = s.when(_backfill(gwt, 3), gwt.T0 + gwt.sec(5))
    assert d.ok and gwt.names(d)[0] == "BackfillRequested"
    runs = gwt.all(d, m.OccurrenceMaterialized)
    assert [r.scheduled_at for r in runs] == [gwt.T0 - 3 * HOUR, gwt.T0 - 2 * HOUR,
                                              gwt.T0 - HOUR]
    assert all(r.trigger == "backfill" and r.run_id.startswith(BACKFILL_RUN)
               and r.due_at == gwt.T0 + gwt.sec(5) and not r.advances_schedule for r in runs)
    assert d.body["instants"] == 3 and d.body["runs"] == 3
    assert [i["run_id"] for i in d.body["items"]] == [r.run_id for r in runs]
    assert s.state.count == 0  # a backfill's runs do not count toward maxCount


def test_the_schedules_own_instants_are_reported_not_run(gwt: GivenWhenThen) -> None:
    s = _hourly(gwt)
    later = gwt.T0 + 3 * HOUR + gwt.sec(1)
    d = s.when(m.BackfillSchedule(request_key="k", start=gwt.T0 - HOUR,
                                  end=gwt.T0 + 2 * HOUR), later)
    assert [i.get("reason") for i in d.body["items"]] == [None, "accounted", "accounted"]
    assert gwt.one(d, m.BackfillRequested).accounted == 2


def test_an_instant_an_earlier_backfill_ran_is_not_run_again(gwt: GivenWhenThen) -> None:
    s = _hourly(gwt)
    s.given(_backfill(gwt, 2), gwt.T0 + gwt.sec(5))
    d = s.when(_backfill(gwt, 4, key="bf-2"), gwt.T0 + gwt.sec(6))
    assert [(i.get("reason"), "run_id" in i) for i in d.body["items"]] == [
        (None, True), (None, True), ("backfilled", False), ("backfilled", False)]
    assert len(gwt.all(d, m.OccurrenceMaterialized)) == 2


def test_the_same_request_key_answers_again_and_another_range_under_it_conflicts(
        gwt: GivenWhenThen) -> None:
    s = _hourly(gwt)
    s.given(_backfill(gwt, 2), gwt.T0 + gwt.sec(5))
    again = s.when(_backfill(gwt, 2), gwt.T0 + gwt.sec(6))
    assert again.ok and again.events == []
    assert (again.body["repeated"], again.body["runs"], again.body["instants"]) == (True, 2, 2)
    other = s.when(_backfill(gwt, 3), gwt.T0 + gwt.sec(7))
    assert other.status == "conflict" and other.field == "Idempotency-Key"


def test_a_range_too_long_a_future_end_or_a_reversed_range_is_refused(
        gwt: GivenWhenThen) -> None:
    s = _hourly(gwt)
    now = gwt.T0 + gwt.sec(5)
    too_many = s.when(_backfill(gwt, MAX_BACKFILL_INSTANTS + 1), now)
    assert too_many.status == "invalid" and too_many.field == "to"
    assert str(MAX_BACKFILL_INSTANTS) in too_many.reason and too_many.events == []
    assert s.when(_backfill(gwt, MAX_BACKFILL_INSTANTS), now).ok  # the bound itself is fine
    future = s.when(m.BackfillSchedule(request_key="f", start=gwt.T0 - HOUR,
                                       end=gwt.T0 + HOUR), now)
    assert future.status == "invalid" and future.field == "to" and "future" in future.reason
    backwards = s.when(m.BackfillSchedule(request_key="b", start=gwt.T0 - HOUR,
                                          end=gwt.T0 - 2 * HOUR), now)
    assert backwards.status == "invalid" and backwards.field == "to"


def test_a_backfill_of_a_schedule_that_does_not_exist_is_not_found(gwt: GivenWhenThen) -> None:
    d = gwt.story().when(_backfill(gwt, 2), gwt.T0)
    assert d.status == "not_found"


def test_buffer_all_runs_one_at_a_time_through_a_permit(gwt: GivenWhenThen) -> None:
    s = _hourly(gwt)
    d = s.when(_backfill(gwt, 3), gwt.T0 + gwt.sec(5))
    asks = [x.payload for x in d.sends if isinstance(x.payload, m.AcquirePermit)]
    assert len(asks) == 3 and {a.key for a in asks} == {"backfill:s1"}
    assert {a.limit for a in asks} == {1}
    assert {x.schedule_id for x in d.sends} == {limit_id("backfill:s1")}


def test_allow_makes_every_run_ready_at_once_without_a_permit(gwt: GivenWhenThen) -> None:
    s = _hourly(gwt)
    d = s.when(_backfill(gwt, 3, overlap="allow"), gwt.T0 + gwt.sec(5))
    assert d.sends == [] and "RunAwaitsPermit" not in gwt.names(d)
    assert {r.state for r in gwt.all(d, m.OccurrenceMaterialized)} == {"READY"}


def test_a_backfills_runs_never_make_an_on_time_instant_skip(gwt: GivenWhenThen) -> None:
    """overlap skip: an on-time instant while a backfill's run is LEASED still runs."""
    s = _hourly(gwt, overlap="skip")
    d = s.given(_backfill(gwt, 1, overlap="allow"), gwt.T0 + gwt.sec(5))
    run_id = gwt.one(d, m.OccurrenceMaterialized).run_id
    s.claim(run_id, gwt.T0 + gwt.sec(6))
    tick = s.given(m.Tick(), gwt.T0 + gwt.sec(10))  # the first instant, T0, due
    assert [r.trigger for r in gwt.all(tick, m.OccurrenceMaterialized)] == ["schedule"]
    assert "OccurrenceSkipped" not in gwt.names(tick)
    assert s.run(run_id).state == "LEASED"


def test_a_backfills_run_retries_within_its_max_age_from_when_it_became_due(
        gwt: GivenWhenThen) -> None:
    """retry.maxAge counts from the backfill, not from the (old) instant."""
    s = _hourly(gwt)
    d = s.given(_backfill(gwt, 48, 47, overlap="allow"), gwt.T0 + gwt.sec(5))
    run_id = gwt.one(d, m.OccurrenceMaterialized).run_id
    failed = s.fail(s.claim(run_id, gwt.T0 + gwt.sec(6)), gwt.T0 + gwt.sec(7))
    assert "RetryScheduled" in gwt.names(failed), gwt.names(failed)


def test_the_backfill_replays_to_the_same_state(gwt: GivenWhenThen) -> None:
    s = _hourly(gwt)
    s.given(_backfill(gwt, 3), gwt.T0 + gwt.sec(5))
    s.given(_backfill(gwt, 5, 3, key="bf-2"), gwt.T0 + gwt.sec(6))
    assert s.state.backfills is not None
    assert s.state.backfills.ranges == ((gwt.T0 - 5 * HOUR, gwt.T0),)  # merged
    assert s.replayed().snapshot() == s.state.snapshot()


def test_a_backfills_runs_go_after_the_tenants_other_ready_runs(gwt: GivenWhenThen) -> None:
    s = _hourly(gwt, priority=50)
    d = s.when(_backfill(gwt, 2, overlap="allow"), gwt.T0 + gwt.sec(5))
    assert {r.priority for r in gwt.all(d, m.OccurrenceMaterialized)} == {-100}
