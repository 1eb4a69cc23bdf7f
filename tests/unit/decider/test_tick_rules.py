"""Decider rules for time (Tick): materialization, misfire, overlap, start deadline, bounds.

One test per rule (docs/design.md §3, §5), named after the rule.
"""

from __future__ import annotations

from typing import Any

from chronolog.commands.state import MANUAL_KEYS_KEPT
from chronolog.domain.ids import run_id_for
from chronolog.domain.recurrence import compile_trigger, jitter_offset, upcoming
from support.decider import GivenWhenThen


def test_tick_materializes_a_due_occurrence_once_with_its_unique_key(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    d = s.when(m.Tick(), gwt.T0)
    occ = gwt.one(d, m.OccurrenceMaterialized)
    assert occ.scheduled_at == gwt.T0
    assert occ.run_id == run_id_for(gwt.TENANT, "s1", gwt.T0)
    assert (occ.state, occ.revision, occ.sequence) == ("READY", 1, 1)
    assert occ.next_run_at == gwt.T0 + gwt.sec(60)
    # a second Tick at the same instant materializes nothing again
    assert s.when(m.Tick(), gwt.T0).events == []


def test_tick_before_due_does_nothing(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, cron="0 10 * * *")
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(3599)).events == []


def test_misfire_skip_records_every_late_instant_with_its_reason(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire="skip")
    s.materialize(gwt.T0)
    # at 09:05:00 the instants 09:01..09:05 are due at once: only the newest (on time) runs
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(300))
    skipped = gwt.all(d, m.OccurrenceSkipped)
    assert [e.scheduled_at for e in skipped] == [gwt.T0 + gwt.sec(60 * k) for k in (1, 2, 3, 4)]
    assert {e.reason for e in skipped} == {"misfire"}
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == [
        gwt.T0 + gwt.sec(300)]


def test_misfire_latest_runs_only_the_newest_late_instant(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire="latest")
    s.materialize(gwt.T0)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(270))  # 09:01..09:04 due, all late (grace 60 s)
    [ran] = gwt.all(d, m.OccurrenceMaterialized)
    assert ran.scheduled_at == gwt.T0 + gwt.sec(240)
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceSkipped)] == [
        gwt.T0 + gwt.sec(60 * k) for k in (1, 2, 3)]


def test_misfire_all_catch_up_is_bounded_by_count_and_age_and_never_stops_the_schedule(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire={"policy": "all", "max_catchup": 5, "max_age": 600})
    s.materialize(gwt.T0)
    now = gwt.T0 + gwt.sec(3600 * 3 + 30)  # three hours of missed minutes
    d = s.when(m.Tick(), now)
    ran = [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)]
    assert len(ran) == 5  # bounded by count: the newest five
    assert ran == [now - gwt.sec(30 + 60 * k) for k in (4, 3, 2, 1, 0)]
    reasons = {e.reason for e in gwt.all(d, m.OccurrenceSkipped)}
    assert reasons <= {"misfire_max_age", "misfire_max_catchup"} and "misfire_max_age" in reasons
    # every missed instant is accounted for exactly once (ranges carry a count)
    accounted = len(ran) + sum(e.count for e in gwt.all(d, m.OccurrenceSkipped))
    assert accounted == 3 * 60
    # no cliff: the schedule continues
    assert s.state.next_run_at == now - gwt.sec(30) + gwt.sec(60)
    assert len(s.materialize(now + gwt.sec(30))) == 1


def test_misfire_all_within_bounds_materializes_every_instant_exactly_once(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire="all")
    s.materialize(gwt.T0)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(600))
    trigger = compile_trigger(every=60.0, anchor=gwt.T0)
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == upcoming(
        trigger, gwt.T0, 10)


def test_long_skip_ranges_collapse_into_one_event_with_a_count(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire="skip")
    s.materialize(gwt.T0)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60 * 100))  # 100 due at once: only the newest runs
    [rng] = gwt.all(d, m.OccurrenceSkipped)
    assert (rng.count, rng.scheduled_at, rng.through) == (
        99, gwt.T0 + gwt.sec(60), gwt.T0 + gwt.sec(60 * 99))
    assert len(gwt.all(d, m.OccurrenceMaterialized)) == 1


def test_overlap_allow_runs_occurrences_side_by_side(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(gwt.T0, overlap="allow", lease=600)
    [a] = s.materialize(gwt.T0)
    s.claim(a.run_id, gwt.T0)
    [b] = s.materialize(gwt.T0 + gwt.sec(60))
    assert b.state == "READY"
    s.claim(b.run_id, gwt.T0 + gwt.sec(60))
    assert [r.state for r in s.state.runs.values()] == ["LEASED", "LEASED"]


def test_overlap_skip_skips_an_instant_while_a_run_is_active(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="skip")
    [a] = s.materialize(gwt.T0)
    s.claim(a.run_id, gwt.T0)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60))
    skipped = gwt.one(d, m.OccurrenceSkipped)
    assert (skipped.reason, skipped.scheduled_at) == ("overlap", gwt.T0 + gwt.sec(60))
    assert s.state.next_run_at == gwt.T0 + gwt.sec(120)


def test_overlap_buffer_one_holds_one_and_skips_the_rest(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="buffer_one", lease=600)
    [a] = s.materialize(gwt.T0)
    claimed = s.claim(a.run_id, gwt.T0)
    [b] = s.materialize(gwt.T0 + gwt.sec(60))
    assert b.state == "PENDING"
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(120))
    assert gwt.one(d, m.OccurrenceSkipped).reason == "overlap_buffer_full"
    # when the active run ends the buffered one becomes READY
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(130))
    ready = gwt.one(d, m.OccurrenceReady)
    assert ready.run_id == b.run_id


def test_overlap_buffer_all_queues_every_instant_and_releases_them_in_order(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="buffer_all", lease=600)
    [a] = s.materialize(gwt.T0)
    claimed = s.claim(a.run_id, gwt.T0)
    [b] = s.materialize(gwt.T0 + gwt.sec(60))
    [c] = s.materialize(gwt.T0 + gwt.sec(120))
    assert (b.state, c.state) == ("PENDING", "PENDING")
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(130))
    assert gwt.one(d, m.OccurrenceReady).run_id == b.run_id
    assert s.run(c.run_id).state == "PENDING"


def test_overlap_cancel_previous_cancels_the_active_run_and_advances_its_fence(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="cancel_previous", lease=600)
    [a] = s.materialize(gwt.T0)
    claimed = s.claim(a.run_id, gwt.T0)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60))
    assert gwt.names(d) == ["FenceAdvanced", "OccurrenceCancelled", "OccurrenceMaterialized"]
    assert gwt.one(d, m.FenceAdvanced).fence == claimed.fence + 1
    late = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(61))
    assert late.status == "stale_fence"
    assert gwt.names(late) == ["CompletionRejected"]


def test_overlap_cancel_previous_never_cancels_a_run_under_reconciliation(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="cancel_previous", lease=600)
    [a] = s.materialize(gwt.T0)
    claimed = s.claim(a.run_id, gwt.T0)
    s.fail(claimed, gwt.T0 + gwt.sec(10), error_class="ambiguous")
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60))
    assert "OccurrenceCancelled" not in gwt.names(d)
    assert s.run(a.run_id).state == "RECONCILING"


def test_start_deadline_skips_an_unclaimed_run(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, start_deadline=30)
    [a] = s.materialize(gwt.T0)
    assert a.start_deadline_at == gwt.T0 + gwt.sec(30)
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(30)).events == []  # at the deadline: still fine
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(31))
    skipped = gwt.one(d, m.OccurrenceSkipped)
    assert ((skipped.run_id, skipped.reason, skipped.materialized)
            == (a.run_id, "start_deadline", True))


def test_claim_after_the_start_deadline_is_refused(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, start_deadline=30)
    [a] = s.materialize(gwt.T0)
    d = s.when(m.ClaimRun(run_id=a.run_id, attempt=1, worker_id="w1"), gwt.T0 + gwt.sec(45))
    assert d.status == "conflict"
    assert "AttemptClaimed" not in gwt.names(d)
    assert s.run(a.run_id).state == "SKIPPED"


def test_max_count_stops_the_schedule_after_that_many_runs(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, max_count=2)
    assert len(s.materialize(gwt.T0)) == 1
    last = s.materialize(gwt.T0 + gwt.sec(60))
    assert [e.next_run_at for e in last] == [None]
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(3600)).events == []


def test_max_count_is_not_consumed_by_an_overlap_skip(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, max_count=2, overlap="skip", lease=3600)
    [a] = s.materialize(gwt.T0)
    claimed = s.claim(a.run_id, gwt.T0)
    assert gwt.one(s.when(m.Tick(), gwt.T0 + gwt.sec(60)), m.OccurrenceSkipped).reason == "overlap"
    s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(70))
    assert len(s.materialize(gwt.T0 + gwt.sec(120))) == 1  # the second run still happens
    assert s.state.count == 2


def test_one_shot_at_runs_once(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, at=gwt.T0 + gwt.sec(600))
    [a] = s.materialize(gwt.T0 + gwt.sec(600))
    assert a.next_run_at is None
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(6000)).events == []


def test_delay_trigger_runs_at_creation_then_a_fixed_delay_after_each_finish(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, delay=300)
    assert s.state.next_run_at == gwt.T0
    [a] = s.materialize(gwt.T0)
    assert a.next_run_at is None  # planned when the run finishes
    claimed = s.claim(a.run_id, gwt.T0 + gwt.sec(1))
    d = s.when(gwt.complete(claimed), gwt.T0 + gwt.sec(20))
    planned = gwt.one(d, m.NextRunPlanned)
    assert planned.next_run_at == gwt.T0 + gwt.sec(320)
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(319)).events == []
    assert len(s.materialize(gwt.T0 + gwt.sec(320))) == 1


def test_jitter_is_deterministic_and_inside_the_window(gwt: GivenWhenThen) -> None:
    m = gwt.m
    dues = []
    for _ in range(2):
        s = gwt.story().create(gwt.T0, cron="0 10 * * *", jitter=120)
        dues.append(s.state.next_due_at)
    at10 = gwt.T0.replace(hour=10)
    assert dues[0] == dues[1] == at10 + gwt.sec(jitter_offset("s1", at10, 120))
    assert at10 <= dues[0] < at10 + gwt.sec(120)
    s = gwt.story().create(gwt.T0, cron="0 10 * * *", jitter=120)
    assert s.when(m.Tick(), dues[0] - gwt.sec(0.001)).events == []
    [occ] = gwt.all(s.when(m.Tick(), dues[0]), m.OccurrenceMaterialized)
    assert (occ.scheduled_at, occ.due_at) == (at10, dues[0])


def test_jitter_larger_than_the_grace_is_not_a_misfire(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, cron="* * * * *", jitter=50,
                           misfire={"policy": "skip", "grace": 5})
    s.materialize(gwt.T0 + gwt.sec(50))
    for k in range(1, 30):
        due = s.state.next_due_at
        d = s.when(m.Tick(), due)  # every Tick exactly when the instant is due
        assert gwt.names(d) == ["OccurrenceMaterialized"], (k, gwt.names(d))


def test_manual_trigger_same_key_same_params_returns_same_run(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    first = s.when(m.TriggerRun(request_key="rk-1", params={"n": 9}), gwt.T0 + gwt.sec(5))
    occ = gwt.one(first, m.OccurrenceMaterialized)
    assert (occ.trigger, occ.job.params, occ.advances_schedule) == ("manual", {"n": 9}, False)
    again = s.when(m.TriggerRun(request_key="rk-1", params={"n": 9}), gwt.T0 + gwt.sec(50))
    assert (again.status, again.events, again.body["run_id"]) == ("ok", [], occ.run_id)


def test_manual_trigger_same_key_other_params_is_conflict(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    s.given(m.TriggerRun(request_key="rk-1", params={"n": 9}), gwt.T0)
    d = s.when(m.TriggerRun(request_key="rk-1", params={"n": 10}), gwt.T0)
    assert (d.status, d.events) == ("conflict", [])


def test_manual_triggers_with_distinct_keys_are_never_dropped(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)
    ids = {gwt.one(s.when(m.TriggerRun(request_key=f"k{i}"), gwt.T0),
                   m.OccurrenceMaterialized).run_id
           for i in range(10)}
    assert len(ids) == 10  # ten in the same second: ten runs (Temporal drops them)


def test_fold_of_the_history_equals_the_live_state(gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, overlap="buffer_all", lease=60)
    [a] = s.materialize(gwt.T0)
    claimed = s.claim(a.run_id, gwt.T0)
    s.materialize(gwt.T0 + gwt.sec(60))
    s.when(m.Tick(), gwt.T0 + gwt.sec(200))
    s.when(gwt.heartbeat(claimed), gwt.T0 + gwt.sec(201))
    assert s.replayed().snapshot() == s.state.snapshot()


def test_max_count_with_misfire_latest_runs_only_the_newest_late_instant(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, misfire="latest", max_count=3)
    s.materialize(gwt.T0)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60 * 10 + 30))  # 09:01..09:10 due, all late
    assert [e.scheduled_at for e in gwt.all(d, m.OccurrenceMaterialized)] == [
        gwt.T0 + gwt.sec(600)]
    # everything due was handled by this Tick: nothing is left due before now
    assert s.state.next_due_at == gwt.T0 + gwt.sec(660)


def test_an_occurrence_materialized_past_its_start_deadline_is_skipped_by_the_same_tick(
    gwt: GivenWhenThen,
) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0, start_deadline=30)  # misfire latest, grace 60 s
    [first] = s.materialize(gwt.T0)
    s.claim(first.run_id, gwt.T0)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60 + 45))  # 09:01 is 45 s late: within the grace
    assert gwt.names(d)[-2:] == ["OccurrenceMaterialized", "OccurrenceSkipped"]
    late = gwt.one(d, m.OccurrenceMaterialized)
    skipped = gwt.one(d, m.OccurrenceSkipped)
    assert (skipped.run_id, skipped.reason) == (late.run_id, "start_deadline")


def test_a_manual_key_is_idempotent_within_its_window_and_a_new_run_after_it(
        gwt: GivenWhenThen) -> None:
    m = gwt.m
    s = gwt.story().create(gwt.T0)

    def trigger(key: str, n: int) -> Any:
        env = gwt.envelope(m.TriggerRun(request_key=key), command_id=f"c-{key}-{n}")
        return s.when(env, gwt.T0 + gwt.sec(n))

    first = gwt.one(trigger("pay-run", 0), m.OccurrenceMaterialized).run_id
    for i in range(MANUAL_KEYS_KEPT - 1):  # the window still holds "pay-run"
        trigger(f"other-{i}", 1)
    within = trigger("pay-run", 2)
    assert (within.events, within.body["run_id"]) == ([], first)
    trigger("one-more", 3)  # "pay-run" is now the oldest key past the window
    after = gwt.one(trigger("pay-run", 4), m.OccurrenceMaterialized)
    assert after.run_id != first  # a new request, never a second run under the old ID
    assert s.state.run(first) is not None and s.state.run(after.run_id) is not None
