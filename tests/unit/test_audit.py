"""The pure audit (chronolog.audit.auditor): each check fails on a log that breaks it.

Two kinds of logs:

* clean logs produced by the real decider (``decide``/``evolve``) through scenarios with
  claims, heartbeats, completions, failures and retries, lease expiry, misfire ``all`` with
  overlap skips and collapsed skip ranges, buffered overlap, concurrent runs under ``allow``,
  manual triggers and an effect retried through reconciliation: zero violations;
* small hand-built logs that break exactly one rule each: that check (and only that check)
  reports it, naming the offending events.
"""

from __future__ import annotations

import itertools
import tracemalloc
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronolog.audit.auditor import (
    CHECKS,
    FINISHED_KEPT,
    MISFIRE_KEPT,
    SPANS_KEPT,
    Auditor,
    AuditReport,
    audit,
)
from chronolog.audit.folds import (
    CHECKPOINT_VERSION,
    DEFAULT_HOT_MAX,
    CheckpointError,
    FoldStore,
    ScheduleFold,
    decode_schedule,
)
from chronolog.commands.aggregate import PROCESSOR, Decision
from chronolog.commands.decider import decide, evolve
from chronolog.commands.state import DEAD_KEPT, MANUAL_KEYS_KEPT, initial_state
from chronolog.domain import messages as m
from chronolog.domain.barrier import in_barrier_order
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.ids import (
    QUOTA_ID,
    backfill_run_id,
    calendar_id,
    limit_id,
    manual_run_id,
    run_id_for,
)

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TENANT = "acme"


def sec(n: float) -> timedelta:
    return timedelta(seconds=n)


def spec(**overrides: Any) -> m.ScheduleSpec:
    base: dict[str, Any] = {"every": 60.0, "job": {"type": "report"}, "overlap": "skip"}
    base.update(overrides)
    return m.ScheduleSpec.model_validate(base)


# ---------------------------------------------------------------------------------------
# driving the real decider


class Driver:
    """One schedule driven through ``decide``; every event lands in ``log`` as an envelope."""

    def __init__(self, schedule_id: str) -> None:
        self.sid = schedule_id
        self.state = initial_state(TENANT, schedule_id)
        self.log: list[m.EventEnvelope] = []
        self.n = 0

    def do(self, payload: Any, now: datetime, expect_ok: bool = True,
           principal: str = "ops") -> Decision:
        self.n += 1
        cid = f"{self.sid}-c{self.n}"
        cmd = m.CommandEnvelope(command_id=cid, type=payload.type, tenant=TENANT,
                                principal=principal, schedule_id=self.sid, issued_at=now,
                                payload=payload)
        dec = decide(self.state, cmd, now)
        assert dec.ok or not expect_ok, f"{payload.type} refused: {dec.status} {dec.reason}"
        for i, ev in enumerate(dec.events):
            evolve(self.state, ev)
            self.log.append(m.EventEnvelope(
                event_id=f"{cid}.{i}", type=ev.type, key=f"{TENANT}/{self.sid}", tenant=TENANT,
                schedule_id=self.sid, at=now, causation_id=cid, payload=ev))
        return dec

    def create(self, now: datetime, **overrides: Any) -> None:
        self.do(m.CreateSchedule(spec=spec(**overrides)), now)

    def tick(self, now: datetime) -> Decision:
        return self.do(m.Tick(), now)

    def claim(self, run_id: str, now: datetime, worker: str = "w1") -> m.AttemptClaimed:
        run = self.state.run(run_id)
        assert run is not None
        dec = self.do(m.ClaimRun(run_id=run_id, attempt=run.attempt, worker_id=worker), now)
        (claimed,) = [e for e in dec.events if isinstance(e, m.AttemptClaimed)]
        return claimed

    def heartbeat(self, c: m.AttemptClaimed, now: datetime) -> Decision:
        return self.do(m.Heartbeat(run_id=c.run_id, attempt=c.attempt, fence=c.fence,
                                   worker_id=c.worker_id), now)

    def complete(self, c: m.AttemptClaimed, now: datetime, expect_ok: bool = True) -> Decision:
        return self.do(m.CompleteRun(run_id=c.run_id, attempt=c.attempt, fence=c.fence,
                                     worker_id=c.worker_id, checksum=f"sha256:{c.fence}",
                                     size=2, inline={"n": c.fence}), now, expect_ok)

    def fail(self, c: m.AttemptClaimed, now: datetime, error_class: str = "transient") -> Decision:
        return self.do(m.FailRun(run_id=c.run_id, attempt=c.attempt, fence=c.fence,
                                 worker_id=c.worker_id, error_class=error_class,
                                 message="boom"), now)

    def runs_in(self, *states: str) -> list[str]:
        return sorted((r.run_id for r in (self.state.runs or {}).values() if r.state in states),
                      key=lambda rid: self.state.runs[rid].scheduled_at)  # type: ignore[index]

    def types(self) -> list[str]:
        return [e.type for e in self.log]


def _scenario_retries_effects_misfire_all() -> Driver:
    """misfire all + overlap skip + a webhook effect: retries, lease expiry, reconciliation."""
    d = Driver("nightly")
    d.create(T0, misfire="all", effects=[{"kind": "webhook", "destination": "d-webhook"}],
             lease=30.0, retry={"max_attempts": 5, "initial_backoff": 5, "max_backoff": 5})
    d.tick(T0)
    (r1,) = d.runs_in("READY")
    c = d.claim(r1, T0 + sec(1))
    d.heartbeat(c, T0 + sec(20))
    d.complete(c, T0 + sec(40))  # inside the extended lease (T0+50)
    (eff,) = (e for e in d.log if e.type == "EffectIntended")
    effect_id = eff.payload.effect_id  # type: ignore[union-attr]
    d.do(m.RecordEffectOutcome(run_id=r1, effect_id=effect_id, outcome="uncertain"), T0 + sec(41))
    d.do(m.ResolveReconciliation(run_id=r1, decision="retry", effect_id=effect_id), T0 + sec(42))
    d.do(m.RecordEffectOutcome(run_id=r1, effect_id=effect_id, outcome="succeeded"), T0 + sec(43))
    # run 2: a transient failure, a retry, then success
    d.tick(T0 + sec(60))
    (r2,) = d.runs_in("READY")
    c = d.claim(r2, T0 + sec(61))
    d.fail(c, T0 + sec(62))
    retry_at = d.state.run(r2).retry_at  # type: ignore[union-attr]
    assert retry_at is not None
    d.tick(retry_at)
    c = d.claim(r2, retry_at + sec(1))
    d.complete(c, retry_at + sec(2))
    # downtime: instants 120 .. 600 are late; misfire all catches every one of them up,
    # one after another (queued); the overlap guard skips the on-time instants that come
    # while one is active
    d.tick(T0 + sec(605))
    ready = d.runs_in("READY")
    assert len(ready) == 1
    c = d.claim(ready[0], T0 + sec(606))
    d.tick(T0 + sec(606 + 31))  # the lease expires: fence advances, the run is ready again
    c = d.claim(ready[0], T0 + sec(640))
    d.complete(c, T0 + sec(641))
    d.tick(T0 + sec(660))
    (r_last,) = d.runs_in("READY")
    d.claim(r_last, T0 + sec(661))
    d.tick(T0 + sec(720))  # its lease expires; 720 and 780 come while it is active
    d.tick(T0 + sec(780))
    return d


def _scenario_buffer_all_ranges() -> Driver:
    """misfire all bounded by max_catchup (a collapsed skip range) + overlap buffer_all."""
    d = Driver("hourly-catchup")
    d.create(T0, misfire={"policy": "all", "max_catchup": 5}, overlap="buffer_all")
    d.tick(T0 + sec(3600 + 10))  # 61 instants due: 56 skipped as one range, 5 run in order
    assert any(e.type == "OccurrenceSkipped" and e.payload.count > 1  # type: ignore[union-attr]
               for e in d.log)
    now = T0 + sec(3620)
    for _ in range(5):
        (rid,) = d.runs_in("READY")
        c = d.claim(rid, now)
        d.complete(c, now + sec(1))
        now += sec(2)
    assert not d.runs_in("READY", "PENDING")
    return d


def _scenario_allow_and_buffer_one_and_manual() -> tuple[Driver, Driver]:
    """overlap allow: two runs leased at once, each heartbeats with its own fence."""
    a = Driver("allow")
    a.create(T0, overlap="allow", lease=60.0)
    a.tick(T0)
    (r1,) = a.runs_in("READY")
    c1 = a.claim(r1, T0 + sec(1))
    a.tick(T0 + sec(60))
    (r2,) = a.runs_in("READY")
    c2 = a.claim(r2, T0 + sec(61))
    assert c2.fence > c1.fence
    a.heartbeat(c1, T0 + sec(50 + 10))  # fence 1 while the schedule's fence is 2
    a.complete(c1, T0 + sec(70))
    a.complete(c2, T0 + sec(71))
    a.do(m.TriggerRun(request_key="by-hand-1", params={"x": 1}), T0 + sec(72))
    a.do(m.TriggerRun(request_key="by-hand-1", params={"x": 1}), T0 + sec(73))  # idempotent
    (rm,) = a.runs_in("READY")
    assert rm.startswith("m_")  # one manual run for the two triggers of one key
    a.complete(a.claim(rm, T0 + sec(74)), T0 + sec(75))

    b = Driver("buffer-one")
    b.create(T0, overlap="buffer_one", lease=600.0)
    b.tick(T0)
    (r1,) = b.runs_in("READY")
    c1 = b.claim(r1, T0 + sec(1))
    b.tick(T0 + sec(60))  # buffered (PENDING)
    b.tick(T0 + sec(120))  # buffer full: skipped
    b.tick(T0 + sec(180))
    assert len(b.runs_in("PENDING")) == 1
    b.complete(c1, T0 + sec(181))  # the pending one is promoted
    (r2,) = b.runs_in("READY")
    b.complete(b.claim(r2, T0 + sec(182)), T0 + sec(183))
    b.do(m.PauseSchedule(), T0 + sec(184))
    b.do(m.DeleteSchedule(), T0 + sec(185))
    return a, b


STEADY_OUTCOMES = ("done", "open_effect", "transient", "dead", "redriven", "cancelled",
                   "expired")


def _steady(outcomes: list[str]) -> tuple[Driver, list[tuple[int, int]]]:
    """A steady workload through the real decider: one run a minute (overlap ``allow``, a
    webhook effect), each ending as ``outcomes`` says — done (its effect succeeds), done with
    its effect uncertain and resolved five runs later, a transient failure then success, dead
    (kept by the decider up to DEAD_KEPT), dead then redriven and done, cancelled, its lease
    expired then done. Also returns, after each run, (events so far, runs the decider holds)."""
    d = Driver("steady")
    d.create(T0, overlap="allow", lease=30.0, effects=[{"kind": "webhook",
                                                        "destination": "d-webhook"}],
             retry={"max_attempts": 3, "initial_backoff": 5, "max_backoff": 5})
    to_resolve: dict[int, tuple[str, str]] = {}
    marks: list[tuple[int, int]] = []

    def finish(c: m.AttemptClaimed, now: datetime, outcome: str = "succeeded") -> str:
        dec = d.complete(c, now)
        (eff,) = [e for e in dec.events if isinstance(e, m.EffectIntended)]
        d.do(m.RecordEffectOutcome(run_id=c.run_id, effect_id=eff.effect_id,
                                   outcome=outcome), now)  # type: ignore[arg-type]
        return eff.effect_id

    for k, outcome in enumerate(outcomes):
        now = T0 + sec(60 * k)
        d.tick(now)
        (rid,) = d.runs_in("READY")
        if outcome == "cancelled":
            d.do(m.CancelRun(run_id=rid), now)
        else:
            c = d.claim(rid, now + sec(1))
            if outcome in ("done", "open_effect"):
                eid = finish(c, now + sec(2), "uncertain" if outcome == "open_effect"
                             else "succeeded")
                if outcome == "open_effect":
                    to_resolve[k + 5] = (rid, eid)
            elif outcome == "transient":
                d.fail(c, now + sec(2))
                retry_at = d.state.run(rid).retry_at  # type: ignore[union-attr]
                assert retry_at is not None
                d.tick(retry_at)
                finish(d.claim(rid, retry_at + sec(1)), retry_at + sec(2), "failed")
            elif outcome in ("dead", "redriven"):
                d.fail(c, now + sec(2), "permanent")
                if outcome == "redriven":
                    d.do(m.RedriveRun(run_id=rid), now + sec(3))
                    finish(d.claim(rid, now + sec(4)), now + sec(5))
            else:
                assert outcome == "expired"
                d.tick(now + sec(35))  # the lease expired: the fence advances, READY again
                finish(d.claim(rid, now + sec(36)), now + sec(37))
        if k in to_resolve:
            rid, eid = to_resolve.pop(k)
            d.do(m.ResolveReconciliation(run_id=rid, decision="delivered", effect_id=eid),
                 now + sec(50))
        marks.append((len(d.log), len(d.state.runs or {})))
    return d, marks


def _steady_log(rounds: int) -> list[m.EventEnvelope]:
    d, _ = _steady([STEADY_OUTCOMES[k % len(STEADY_OUTCOMES)] for k in range(rounds)])
    return d.log


def _positioned(*drivers: Driver) -> list[tuple[int, int, m.EventEnvelope]]:
    """Each driver's events on its own partition, offsets from 0."""
    out = []
    for p, d in enumerate(drivers):
        out.extend((p, off, env) for off, env in enumerate(d.log))
    return out


def _assert_clean(report: AuditReport) -> None:
    assert report.violations == [], "\n".join(
        f"{v.check}: {v.message} {[str(e) for e in v.events]}" for v in report.violations)


def test_a_log_produced_by_the_real_decider_has_no_violations() -> None:
    d1 = _scenario_retries_effects_misfire_all()
    d2 = _scenario_buffer_all_ranges()
    d3, d4 = _scenario_allow_and_buffer_one_and_manual()
    types = {t for d in (d1, d2, d3, d4) for t in d.types()}
    # the scenarios really cover what the checks look at
    assert {"FenceAdvanced", "AttemptClaimed", "LeaseExtended", "LeaseExpired",
            "AttemptFailed", "RetryScheduled", "ResultPublished", "EffectIntended",
            "EffectSucceeded", "EffectUncertain", "ReconciliationResolved",
            "OccurrenceSkipped", "OccurrenceMaterialized", "OccurrenceReady",
            "ScheduleDeleted"} <= types
    log = _positioned(d1, d2, d3, d4)
    report = audit(log)
    _assert_clean(report)
    assert report.ok
    assert report.events == len(log)
    assert report.schedules == 4
    assert report.results == sum(t == "ResultPublished" for d in (d1, d2, d3, d4)
                                 for t in d.types())
    assert report.runs == sum(t == "OccurrenceMaterialized" for d in (d1, d2, d3, d4)
                              for t in d.types())
    assert report.effects == len({e.payload.effect_id for d in (d1, d2, d3, d4)  # type: ignore[union-attr]
                                  for e in d.log if e.type == "EffectIntended"})
    assert report.violation_counts == dict.fromkeys(CHECKS, 0)
    assert report.notes == []


def test_dropping_one_skip_from_a_clean_misfire_all_log_is_found() -> None:
    d = _scenario_retries_effects_misfire_all()
    skips = [i for i, e in enumerate(d.log) if e.type == "OccurrenceSkipped"]
    assert skips, "the scenario must record overlap skips under misfire all"
    dropped = d.log[skips[len(skips) // 2]]
    broken = [e for e in d.log if e is not dropped]
    report = audit(broken)
    assert [v.check for v in report.violations] == ["misfire_all_complete"]
    assert "1 instant(s)" in report.violations[0].message
    assert dropped.payload.scheduled_at.isoformat()[:19] in report.violations[0].message  # type: ignore[union-attr]


def test_a_collapsed_range_with_a_wrong_count_in_a_clean_log_is_found() -> None:
    d = _scenario_buffer_all_ranges()
    rng = next(e for e in d.log if e.type == "OccurrenceSkipped"
               and e.payload.count > 1)  # type: ignore[union-attr]
    wrong = rng.model_copy(update={"payload": rng.payload.model_copy(
        update={"count": rng.payload.count - 1})})  # type: ignore[union-attr]
    report = audit([wrong if e is rng else e for e in d.log])
    (v,) = only(report, "misfire_all_complete")
    assert "says 55 instants, the trigger has 56" in v.message


def test_known_limit_a_dropped_leading_range_is_invisible() -> None:
    """The window is bounded by what was recorded: losing its very first record (here the
    leading skip range) moves the window's start and cannot be seen by this check."""
    d = _scenario_buffer_all_ranges()
    broken = [e for e in d.log if not (e.type == "OccurrenceSkipped"
                                       and e.payload.count > 1)]  # type: ignore[union-attr]
    _assert_clean(audit(broken))


# ---------------------------------------------------------------------------------------
# hand-built logs, one broken rule each


class Log:
    """A hand-built log of one schedule (or several), partition 0, offsets in order."""

    def __init__(self, sid: str = "s1") -> None:
        self.sid = sid
        self.events: list[m.EventEnvelope] = []

    def add(self, payload: Any, at: datetime = T0, sid: str | None = None) -> Log:
        sid = sid or self.sid
        n = len(self.events)
        self.events.append(m.EventEnvelope(
            event_id=f"e{n}", type=payload.type, key=f"{TENANT}/{sid}", tenant=TENANT,
            schedule_id=sid, at=at, causation_id=f"c{n}", payload=payload))
        return self

    def created(self, **overrides: Any) -> Log:
        return self.add(m.ScheduleCreated(revision=1, spec=spec(**overrides), created_at=T0,
                                          anchor=T0, next_run_at=T0, next_due_at=T0))

    def revised(self, revision: int, **overrides: Any) -> Log:
        return self.add(m.ScheduleRevised(revision=revision, spec=spec(**overrides), anchor=T0,
                                          next_run_at=None, next_due_at=None))

    def mat(self, minute: int, state: str = "READY", revision: int = 1) -> Log:
        t = T0 + timedelta(minutes=minute)
        return self.add(m.OccurrenceMaterialized(
            run_id=rid(minute, self.sid), scheduled_at=t, due_at=t, revision=revision,
            job=m.JobSpec(type="report"), state=state, sequence=minute + 1))  # type: ignore[arg-type]

    def skipped(self, minute: int, through: int | None = None, count: int = 1,
                reason: str = "overlap") -> Log:
        return self.add(m.OccurrenceSkipped(
            run_id=rid(minute, self.sid), scheduled_at=T0 + timedelta(minutes=minute),
            through=None if through is None else T0 + timedelta(minutes=through), count=count,
            reason=reason))  # type: ignore[arg-type]

    def fence(self, fence: int, minute: int, reason: str = "claim") -> Log:
        return self.add(m.FenceAdvanced(fence=fence, run_id=rid(minute, self.sid),
                                        reason=reason))  # type: ignore[arg-type]

    def claim(self, minute: int, fence: int, at: datetime = T0, lease: float = 30,
              attempt: int = 1) -> Log:
        return self.add(m.AttemptClaimed(run_id=rid(minute, self.sid), attempt=attempt,
                                         fence=fence, worker_id="w1", claimed_at=at,
                                         lease_until=at + sec(lease)), at)

    def extend(self, minute: int, fence: int, at: datetime, lease: float = 30) -> Log:
        return self.add(m.LeaseExtended(run_id=rid(minute, self.sid), attempt=1, fence=fence,
                                        lease_until=at + sec(lease)), at)

    def result(self, minute: int, fence: int, at: datetime, attempt: int = 1) -> Log:
        return self.add(m.ResultPublished(run_id=rid(minute, self.sid), attempt=attempt,
                                          fence=fence, worker_id="w1", checksum="sha256:x",
                                          size=1, finished_at=at), at)

    def claimed_and_done(self, minute: int, fence: int) -> Log:
        at = T0 + timedelta(minutes=minute)
        return self.fence(fence, minute).claim(minute, fence, at).result(minute, fence, at + sec(5))

    def audit(self) -> AuditReport:
        return audit(self.events)


def rid(minute: int, sid: str = "s1") -> str:
    return run_id_for(TENANT, sid, T0 + timedelta(minutes=minute))


def only(report: AuditReport, check: str, count: int = 1) -> list[Any]:
    """Exactly ``count`` violations, all of ``check``; each names at least one event."""
    assert report.violation_counts[check] == count, report.violations
    others = {k: v for k, v in report.violation_counts.items() if k != check and v}
    assert not others, report.violations
    for v in report.violations:
        assert v.events and all(e.event_id and e.type for e in v.events)
    return report.violations


def test_the_hand_built_baseline_is_clean() -> None:
    log = Log().created().mat(0).claimed_and_done(0, 1).mat(1).claimed_and_done(1, 2)
    _assert_clean(log.audit())


# -- occurrence_unique


def test_an_instant_materialized_twice_is_a_duplicate_occurrence() -> None:
    log = Log().created().mat(0).claimed_and_done(0, 1).mat(0)
    (v,) = only(log.audit(), "occurrence_unique")
    assert [e.offset for e in v.events] == [1, 5]
    assert [e.type for e in v.events] == ["OccurrenceMaterialized"] * 2


def test_an_instant_materialized_and_also_skipped_is_a_duplicate_occurrence() -> None:
    log = Log().created().skipped(0, reason="misfire").mat(0)
    (v,) = only(log.audit(), "occurrence_unique")
    assert [e.type for e in v.events] == ["OccurrenceSkipped", "OccurrenceMaterialized"]


def test_an_instant_inside_an_earlier_skip_range_is_a_duplicate_occurrence() -> None:
    # the range [0, 30] claims every instant in it, not only its first one
    log = Log().created().skipped(0, through=30, count=31, reason="misfire").mat(12)
    (v,) = only(log.audit(), "occurrence_unique")
    assert "overlaps" in v.message


def test_a_skip_range_swallowing_an_earlier_instant_is_a_duplicate_occurrence() -> None:
    log = Log().created().mat(5).skipped(0, through=30, count=31, reason="misfire")
    only(log.audit(), "occurrence_unique")


def test_a_manual_request_key_used_twice_is_a_duplicate_occurrence() -> None:
    log = Log().created()
    for n in range(2):
        log.add(m.OccurrenceMaterialized(
            run_id=manual_run_id(TENANT, "s1", "k1") + str(n), scheduled_at=T0 + sec(n),
            due_at=T0, revision=1, job=m.JobSpec(type="report"), trigger="manual",
            request_key="k1", state="READY", sequence=0, advances_schedule=False))
    only(log.audit(), "occurrence_unique")


def test_the_same_instant_on_two_schedules_and_a_manual_run_at_an_instant_are_fine() -> None:
    log = Log().created().mat(0)
    log.add(m.ScheduleCreated(revision=1, spec=spec(), created_at=T0, anchor=T0,
                              next_run_at=T0, next_due_at=T0), sid="s2")
    log.add(m.OccurrenceMaterialized(run_id=rid(0, "s2"), scheduled_at=T0, due_at=T0,
                                     revision=1, job=m.JobSpec(type="r"), state="READY",
                                     sequence=1), sid="s2")
    log.add(m.OccurrenceMaterialized(run_id=manual_run_id(TENANT, "s1", "k"), scheduled_at=T0,
                                     due_at=T0, revision=1, job=m.JobSpec(type="r"),
                                     trigger="manual", request_key="k", state="READY",
                                     sequence=0, advances_schedule=False))
    _assert_clean(log.audit())


# -- fence_monotonic


@pytest.mark.parametrize("second", [2, 1])
def test_a_fence_that_does_not_grow_is_reported(second: int) -> None:
    log = (Log().created().mat(0).fence(2, 0, reason="lease_expired")
           .fence(second, 0, reason="lease_expired"))
    (v,) = only(log.audit(), "fence_monotonic")
    assert [e.offset for e in v.events] == [2, 3]
    assert f"advanced to {second}, not above 2" in v.message


# -- fence_current


def test_a_claim_with_a_fence_that_is_not_the_current_one_is_reported() -> None:
    log = Log().created().mat(0).fence(1, 0).claim(0, fence=7)
    (v,) = only(log.audit(), "fence_current")
    assert [e.type for e in v.events] == ["FenceAdvanced", "AttemptClaimed"]


def test_a_claim_reusing_the_fence_advanced_for_another_run_is_reported() -> None:
    log = Log().created(overlap="allow").mat(0).mat(1).fence(1, 0).claim(1, fence=1)
    (v,) = only(log.audit(), "fence_current")
    assert "advanced for run" in v.message


def test_a_heartbeat_with_a_stale_fence_after_lease_expiry_is_reported() -> None:
    log = (Log().created().mat(0).fence(1, 0).claim(0, 1)
           .add(m.LeaseExpired(run_id=rid(0), attempt=1, fence=1, lease_until=T0 + sec(30)),
                T0 + sec(31))
           .fence(2, 0, reason="lease_expired")
           .extend(0, fence=1, at=T0 + sec(32)))
    (v,) = only(log.audit(), "fence_current")
    assert "has advanced to 2" in v.message
    assert v.events[-1].type == "LeaseExtended"


def test_a_publication_with_another_fence_than_the_claim_is_reported() -> None:
    log = Log().created().mat(0).fence(1, 0).claim(0, 1).result(0, fence=3, at=T0 + sec(5))
    (v,) = only(log.audit(), "fence_current")
    assert "claimed with 1" in v.message


# -- result_once


def test_two_results_for_one_run_are_reported() -> None:
    log = (Log().created().mat(0).fence(1, 0).claim(0, 1)
           .result(0, 1, T0 + sec(5)).result(0, 1, T0 + sec(6)))
    (v,) = only(log.audit(), "result_once")
    assert [e.type for e in v.events] == ["ResultPublished", "ResultPublished"]


# -- result_within_lease


def test_a_result_after_the_lease_deadline_is_reported() -> None:
    log = Log().created().mat(0).fence(1, 0).claim(0, 1, lease=30).result(0, 1, T0 + sec(31))
    (v,) = only(log.audit(), "result_within_lease")
    assert [e.type for e in v.events] == ["AttemptClaimed", "ResultPublished"]


def test_a_result_exactly_at_the_lease_deadline_is_fine() -> None:
    log = Log().created().mat(0).fence(1, 0).claim(0, 1, lease=30).result(0, 1, T0 + sec(30))
    _assert_clean(log.audit())


def test_a_heartbeat_moves_the_lease_deadline() -> None:
    log = (Log().created().mat(0).fence(1, 0).claim(0, 1, lease=30)
           .extend(0, 1, T0 + sec(20), lease=30).result(0, 1, T0 + sec(45)))
    _assert_clean(log.audit())
    late = (Log().created().mat(0).fence(1, 0).claim(0, 1, lease=30)
            .extend(0, 1, T0 + sec(20), lease=30).result(0, 1, T0 + sec(51)))
    (v,) = only(late.audit(), "result_within_lease")
    assert v.events[0].type == "LeaseExtended"


def test_a_result_after_the_lease_expired_is_reported_even_before_its_deadline() -> None:
    log = (Log().created().mat(0).fence(1, 0).claim(0, 1, lease=30)
           .add(m.LeaseExpired(run_id=rid(0), attempt=1, fence=1, lease_until=T0 + sec(30)),
                T0 + sec(10))
           .result(0, 1, T0 + sec(11)))
    (v,) = only(log.audit(), "result_within_lease")
    assert "without a lease" in v.message


def test_a_result_for_a_run_never_claimed_is_reported() -> None:
    report = Log().created().mat(0).result(0, 1, T0).audit()
    assert report.violation_counts["result_within_lease"] == 1
    assert report.violation_counts["fence_current"] == 1  # no claim, so no fence either


# -- overlap


@pytest.mark.parametrize("policy", ["skip", "buffer_one", "buffer_all"])
def test_two_leased_runs_under_a_guarded_overlap_policy_are_reported(policy: str) -> None:
    log = (Log().created(overlap=policy).mat(0).mat(1)
           .fence(1, 0).claim(0, 1).fence(2, 1).claim(1, 2))
    (v,) = only(log.audit(), "overlap")
    assert [e.type for e in v.events] == ["AttemptClaimed", "AttemptClaimed"]


@pytest.mark.parametrize("policy", ["allow", "cancel_previous"])
def test_two_leased_runs_under_allow_are_fine(policy: str) -> None:
    log = (Log().created(overlap=policy).mat(0).mat(1)
           .fence(1, 0).claim(0, 1).fence(2, 1).claim(1, 2))
    _assert_clean(log.audit())


def test_a_claim_after_the_first_run_finished_is_fine() -> None:
    log = Log().created(overlap="skip").mat(0).mat(1).claimed_and_done(0, 1).claimed_and_done(1, 2)
    _assert_clean(log.audit())


def test_runs_admitted_under_allow_are_not_judged_after_a_revision_to_skip() -> None:
    log = (Log().created(overlap="allow").mat(0).mat(1).revised(2, overlap="skip")
           .fence(1, 0).claim(0, 1).fence(2, 1).claim(1, 2))
    _assert_clean(log.audit())


def test_a_second_pending_run_under_buffer_one_is_reported() -> None:
    log = Log().created(overlap="buffer_one").mat(0).mat(1, "PENDING").mat(2, "PENDING")
    (v,) = only(log.audit(), "overlap")
    assert "PENDING" in v.message
    ok = Log().created(overlap="buffer_all").mat(0).mat(1, "PENDING").mat(2, "PENDING")
    _assert_clean(ok.audit())


# -- misfire_all_complete


def test_a_missing_instant_under_misfire_all_is_reported() -> None:
    log = Log().created(misfire="all").mat(0).skipped(1).mat(3)  # minute 2 never recorded
    (v,) = only(log.audit(), "misfire_all_complete")
    assert "1 instant(s) 2026-03-02T09:02:00Z" in v.message
    assert [e.offset for e in v.events] == [2, 3]  # the records around the gap


def test_a_gap_between_skip_ranges_under_misfire_all_is_reported_once() -> None:
    log = (Log().created(misfire="all").skipped(0, through=29, count=30, reason="misfire_max_age")
           .skipped(40, through=69, count=30, reason="misfire_max_age").mat(70))
    (v,) = only(log.audit(), "misfire_all_complete")
    assert "10 instant(s) 2026-03-02T09:30:00Z .. 2026-03-02T09:39:00Z" in v.message


def test_the_same_gap_under_misfire_latest_is_not_a_violation() -> None:
    _assert_clean(Log().created(misfire="latest").mat(0).skipped(1).mat(3).audit())


def test_a_complete_misfire_all_window_with_ranges_is_fine() -> None:
    log = (Log().created(misfire="all").skipped(0, through=29, count=30, reason="misfire_max_age")
           .mat(30).skipped(31).mat(32))
    _assert_clean(log.audit())


def test_the_misfire_walk_is_bounded_and_says_so() -> None:
    log = Log().created(misfire="all").mat(0).mat(1000)
    report = Auditor(misfire_walk_limit=50)
    for n, e in enumerate(log.events):
        report.feed(e, 0, n)
    result = report.finish()
    assert result.violations == []  # the walk stopped before it found the gap
    assert len(result.notes) == 1 and "limit" in result.notes[0]


# -- effect_unique


def _effect(run_minute: int, attempt: int = 1) -> m.EffectIntended:
    return m.EffectIntended(effect_id=f"webhook-{rid(run_minute)}", run_id=rid(run_minute),
                            kind="webhook", checksum="sha256:x", attempt=attempt)


def test_an_effect_intended_twice_is_reported() -> None:
    log = Log().created().mat(0).claimed_and_done(0, 1).add(_effect(0)).add(_effect(0))
    (v,) = only(log.audit(), "effect_unique")
    assert "without a reconciliation retry" in v.message


def test_an_effect_intended_again_after_a_reconciliation_retry_is_fine() -> None:
    eid = f"webhook-{rid(0)}"
    log = (Log().created().mat(0).claimed_and_done(0, 1).add(_effect(0))
           .add(m.EffectUncertain(effect_id=eid, run_id=rid(0)))
           .add(m.ReconciliationRequired(run_id=rid(0), reason="?", effect_id=eid))
           .add(m.ReconciliationResolved(run_id=rid(0), decision="retry", effect_id=eid))
           .add(_effect(0, attempt=2))
           .add(m.EffectSucceeded(effect_id=eid, run_id=rid(0))))
    _assert_clean(log.audit())
    log.add(_effect(0, attempt=3))  # the retry allowed one new intent, not two
    only(log.audit(), "effect_unique")


def test_an_effect_that_succeeds_twice_is_reported() -> None:
    eid = f"webhook-{rid(0)}"
    log = (Log().created().mat(0).claimed_and_done(0, 1).add(_effect(0))
           .add(m.EffectSucceeded(effect_id=eid, run_id=rid(0)))
           .add(m.EffectSucceeded(effect_id=eid, run_id=rid(0))))
    (v,) = only(log.audit(), "effect_unique")
    assert "succeeded twice" in v.message


def test_an_effect_id_shared_by_two_schedules_is_reported() -> None:
    log = Log().created().mat(0).claimed_and_done(0, 1).add(_effect(0))
    log.add(m.ScheduleCreated(revision=1, spec=spec(), created_at=T0, anchor=T0,
                              next_run_at=T0, next_due_at=T0), sid="s2")
    log.add(_effect(0), sid="s2")
    (v,) = only(log.audit(), "effect_unique")
    assert "also intended by schedule acme/s1" in v.message


# -- decodable and the report


def test_an_undecodable_record_is_a_violation() -> None:
    auditor = Auditor()
    auditor.undecodable(3, 17, "payload.type: bad")
    report = auditor.finish()
    (v,) = only(report, "decodable")
    assert (v.events[0].partition, v.events[0].offset) == (3, 17)


def test_the_report_as_a_dict_lists_every_check() -> None:
    report = Log().created().mat(0).mat(0).audit()
    d = report.to_dict()
    assert d["ok"] is False and set(d["violation_counts"]) == set(CHECKS)
    assert d["violations"][0]["events"][0] == {"partition": 0, "offset": 1, "event_id": "e1",
                                               "type": "OccurrenceMaterialized"}


# -- completed_final


def _completed_one_shot() -> Driver:
    """A one-shot that fires, completes, and whose run then finishes."""
    d = Driver("once")
    d.create(T0, at=T0 + sec(60), every=None)
    d.tick(T0 + sec(60))
    (r,) = d.runs_in("READY")
    c = d.claim(r, T0 + sec(61))
    d.complete(c, T0 + sec(62))
    return d


def _completed_by_max_count() -> Driver:
    d = Driver("thrice")
    d.create(T0, max_count=3, overlap="allow")
    for k in range(3):
        d.tick(T0 + sec(60 * k))
    return d


def test_completed_schedules_from_the_real_decider_are_clean() -> None:
    d1, d2 = _completed_one_shot(), _completed_by_max_count()
    assert "ScheduleCompleted" in d1.types() and "ScheduleCompleted" in d2.types()
    d1.do(m.DeleteSchedule(), T0 + sec(100))  # deleting a completed schedule is fine
    _assert_clean(audit(_positioned(d1, d2)))


def test_an_occurrence_after_completed_is_found() -> None:
    d = _completed_by_max_count()
    t = T0 + sec(180)
    late = m.OccurrenceMaterialized(run_id=run_id_for(TENANT, d.sid, t), scheduled_at=t,
                                    due_at=t, revision=1, job=m.JobSpec(type="report"),
                                    state="READY", sequence=4)
    log = d.log + [m.EventEnvelope(event_id="x.0", type=late.type, key=f"{TENANT}/{d.sid}",
                                   tenant=TENANT, schedule_id=d.sid, at=t, payload=late)]
    [v] = only(audit(log), "completed_final")
    assert "materialized" in v.message


def test_a_completion_while_an_instant_was_still_to_come_is_found() -> None:
    d = Driver("early")
    d.create(T0, end=T0 + sec(600))
    d.tick(T0)
    early = m.ScheduleCompleted(reason="end", completed_at=T0 + sec(1), last_scheduled_at=T0,
                                count=1)
    log = d.log + [m.EventEnvelope(event_id="x.0", type=early.type, key=f"{TENANT}/{d.sid}",
                                   tenant=TENANT, schedule_id=d.sid, at=T0 + sec(1),
                                   payload=early)]
    [v] = only(audit(log), "completed_final")
    assert "still to come" in v.message


def test_a_completion_for_max_count_short_of_it_is_found() -> None:
    d = _completed_by_max_count()
    completed = next(e for e in d.log if e.type == "ScheduleCompleted")
    first_run = next(e for e in d.log if e.type == "OccurrenceMaterialized")
    broken = [e for e in d.log if e is not first_run]  # two runs, yet completed for max_count
    assert completed in broken
    report = audit(broken)
    assert report.violation_counts["completed_final"] == 2  # its count and its reason


def test_a_misfire_all_catch_up_queued_under_buffer_one_is_clean() -> None:
    d = Driver("catch-up")
    d.create(T0, misfire="all", overlap="buffer_one", lease=600.0)
    d.tick(T0)
    (first,) = d.runs_in("READY")
    c = d.claim(first, T0 + sec(1))
    d.tick(T0 + sec(60 * 5 + 30))  # five instants due at once: queued behind the running one
    assert len(d.runs_in("PENDING")) == 5
    d.complete(c, T0 + sec(60 * 5 + 31))
    _assert_clean(audit(d.log))
# -- quota_exact and quota_balance


def _through_quota(log: Log, sid: str, max_schedules: int = 2, confirm: bool = True) -> Log:
    """``sid`` created the way the quota saga does it: held, reserved, created, confirmed."""
    cid = f"create-{sid}"
    log.add(m.ScheduleCreationHeld(command_id=cid, spec=spec()), sid=sid)
    log.add(m.QuotaSlotReserved(schedule_id=sid, create_command_id=cid,
                                max_schedules=max_schedules, expires_at=T0 + sec(60)),
            sid=QUOTA_ID)
    log.add(m.ScheduleCreated(revision=1, spec=spec(), created_at=T0, anchor=T0,
                              next_run_at=T0, next_due_at=T0), sid=sid)
    if confirm:
        log.add(m.QuotaSlotConfirmed(schedule_id=sid, create_command_id=cid), sid=QUOTA_ID)
    return log


def _released(log: Log, sid: str, reason: str = "ScheduleDeleted") -> Log:
    return log.add(m.QuotaSlotReleased(schedule_id=sid, create_command_id=f"create-{sid}",
                                       reason=reason, released_at=T0), sid=QUOTA_ID)


def test_a_quota_kept_through_creates_refusals_and_deletes_is_clean() -> None:
    log = _through_quota(_through_quota(Log(), "s1"), "s2")
    log.add(m.ScheduleCreationHeld(command_id="create-s3", spec=spec()), sid="s3")
    log.add(m.QuotaSlotRefused(schedule_id="s3", create_command_id="create-s3", max_schedules=2,
                               taken=2, reserved=0, reason="full"), sid=QUOTA_ID)
    log.add(m.ScheduleCreationRefused(command_id="create-s3", status="quota", reason="full",
                                      release=False), sid="s3")
    log.add(m.ScheduleDeleted(), sid="s1")
    _released(log, "s1")
    _through_quota(log, "s3")  # the freed slot, taken again
    report = log.audit()
    _assert_clean(report)
    assert report.notes == []


def test_more_slots_held_than_the_quota_is_reported() -> None:
    log = _through_quota(_through_quota(Log(), "s1"), "s2")
    log.add(m.QuotaSlotReserved(schedule_id="s3", create_command_id="create-s3", max_schedules=2,
                                expires_at=T0 + sec(60)), sid=QUOTA_ID)
    (v,) = only(log.audit(), "quota_exact")
    assert v.message == "3 slots held, quota 2" and v.schedule_id == "s3"


def test_live_schedules_over_the_quota_at_the_end_are_reported() -> None:
    log = _through_quota(Log(), "s1", max_schedules=1)
    log.add(m.ScheduleCreationHeld(command_id="create-s2", spec=spec()), sid="s2")
    log.add(m.ScheduleCreated(revision=1, spec=spec(), created_at=T0, anchor=T0,
                              next_run_at=T0, next_due_at=T0), sid="s2")
    log.add(m.QuotaSlotConfirmed(schedule_id="s2", create_command_id="create-s2", late=True),
            sid=QUOTA_ID)
    report = log.audit()
    messages = sorted(v.message for v in report.by_check("quota_exact"))
    assert messages == ["2 live schedules hold a slot, quota 1", "2 slots held, quota 1",
                        "created under the quota without a slot reserved for its create"]
    assert report.violation_counts["quota_balance"] == 0


def test_a_slot_released_twice_is_unbalanced() -> None:
    log = _through_quota(Log(), "s1")
    log.add(m.ScheduleDeleted(), sid="s1")
    _released(_released(log, "s1"), "s1")
    (v,) = only(log.audit(), "quota_balance")
    assert v.message == "a slot released that is not held for this create"


def test_a_deleted_schedule_whose_slot_stays_taken_is_unbalanced() -> None:
    log = _through_quota(Log(), "s1")
    log.add(m.ScheduleDeleted(), sid="s1")
    (v,) = only(log.audit(), "quota_balance")
    assert v.message == "a slot still taken by a schedule that is no longer live"


def test_a_live_schedule_whose_slot_was_released_is_unbalanced() -> None:
    log = _released(_through_quota(Log(), "s1"), "s1", reason="expired")
    (v,) = only(log.audit(), "quota_balance")
    assert v.message == "a live schedule whose slot the quota does not hold"


def test_a_reservation_still_open_at_the_end_is_a_note() -> None:
    report = _through_quota(Log(), "s1", confirm=False).audit()
    _assert_clean(report)
    assert report.notes == ["tenant acme: 1 quota reservation(s) still open (creates in flight)"]


def test_a_manual_request_key_reused_after_its_window_is_a_new_request() -> None:
    log = Log().created()

    def manual(key: str, n: int) -> None:
        log.add(m.OccurrenceMaterialized(
            run_id=manual_run_id(TENANT, "s1", key, f"c{n}"), scheduled_at=T0 + sec(n),
            due_at=T0, revision=1, job=m.JobSpec(type="report"), trigger="manual",
            request_key=key, state="READY", sequence=0, advances_schedule=False))

    manual("k1", 0)
    for n in range(1, MANUAL_KEYS_KEPT + 1):
        manual(f"other-{n}", n)
    manual("k1", MANUAL_KEYS_KEPT + 1)  # "k1" left the window: a new request
    _assert_clean(log.audit())


def test_a_run_materialized_twice_is_a_duplicate_occurrence() -> None:
    log = Log().created()
    for n in range(2):
        log.add(m.OccurrenceMaterialized(
            run_id=manual_run_id(TENANT, "s1", "k1"), scheduled_at=T0 + sec(n), due_at=T0,
            revision=1, job=m.JobSpec(type="report"), trigger="manual",
            request_key=f"k{n}", state="READY", sequence=0, advances_schedule=False))
    only(log.audit(), "occurrence_unique")


# ---------------------------------------------------------------------------------------
# checkpoints: an audit resumed from its checkpoint reports what one pass reports


def _resumed(events: list[tuple[int, int, m.EventEnvelope]], cuts: set[int],
             hot_max: int = DEFAULT_HOT_MAX) -> AuditReport:
    """The audit of ``events`` (in move-barrier order, as ``audit`` feeds them) with a
    checkpoint taken, written as JSON lines, read back and resumed from before each index
    of ``cuts``; ``hot_max`` folds held as objects."""
    partitions: dict[int, list[tuple[int, m.EventEnvelope]]] = {}
    for p, off, env in events:
        partitions.setdefault(p, []).append((off, env))
    auditor = Auditor(hot_max=hot_max)
    for n, (p, off, env) in enumerate(in_barrier_order(partitions, lambda *_: None)):
        if n in cuts:
            auditor = Auditor.resume_document(b"".join(auditor.checkpoint_lines()),
                                              hot_max=hot_max)
        auditor.feed(env, p, off)
    return auditor.finish()


def _numbered(events: list[m.EventEnvelope]) -> list[tuple[int, int, m.EventEnvelope]]:
    return [(0, n, e) for n, e in enumerate(events)]


def _real_logs() -> list[list[tuple[int, int, m.EventEnvelope]]]:
    d1 = _scenario_retries_effects_misfire_all()
    d2 = _scenario_buffer_all_ranges()
    d3, d4 = _scenario_allow_and_buffer_one_and_manual()
    skips = [e for e in d1.log if e.type == "OccurrenceSkipped"]
    no_skip = [e for e in d1.log if e is not skips[len(skips) // 2]]
    rng = next(e for e in d2.log if e.type == "OccurrenceSkipped"
               and e.payload.count > 1)  # type: ignore[union-attr]
    wrong = rng.model_copy(update={"payload": rng.payload.model_copy(
        update={"count": rng.payload.count - 1})})  # type: ignore[union-attr]
    return [_positioned(d1, d2, d3, d4), _numbered(no_skip),
            _numbered([wrong if e is rng else e for e in d2.log]),
            _numbered(_completed_one_shot().log), _numbered(_completed_by_max_count().log),
            *(_numbered(log) for log in LONG_LOGS.values())]


def _again(env: m.EventEnvelope, **payload: Any) -> m.EventEnvelope:
    """``env`` written once more, long after (a new event ID; payload fields replaced)."""
    return env.model_copy(update={"event_id": f"again-{env.event_id}",
                                  "payload": env.payload.model_copy(update=payload)})


def _long_logs() -> dict[str, list[m.EventEnvelope]]:
    """A long steady log of the real decider, clean and with one event of its first run
    written again at its end (what the audit has forgotten by then)."""
    log = _steady_log(3 * (FINISHED_KEPT + SPANS_KEPT))

    def first(kind: type) -> m.EventEnvelope:
        return next(e for e in log if isinstance(e.payload, kind))

    fence = max(e.payload.fence for e in log if isinstance(e.payload, m.FenceAdvanced)) + 1
    claim = first(m.AttemptClaimed)
    return {
        "clean": log,
        "late-result": [*log, _again(first(m.ResultPublished))],
        "late-claim": [*log, _again(first(m.FenceAdvanced), fence=fence),
                       _again(claim, fence=fence)],
        "duplicate-occurrence": [*log, _again(first(m.OccurrenceMaterialized))],
        "duplicate-effect": [*log, _again(first(m.EffectIntended))],
    }


LONG_LOGS = _long_logs()
REAL_LOGS = _real_logs()


@pytest.mark.parametrize("name, checks", [
    ("clean", {}),
    ("late-result", {"fence_current": 1, "result_within_lease": 1}),
    ("late-claim", {"fence_current": 2}),
    ("duplicate-occurrence", {"occurrence_unique": 1}),
    ("duplicate-effect", {"effect_unique": 1}),
])
def test_a_late_event_in_a_long_real_log_is_reported(name: str, checks: dict[str, int]) -> None:
    report = audit(LONG_LOGS[name])
    assert {k: v for k, v in report.violation_counts.items() if v} == checks
    assert all(v.events[-1].event_id.startswith("again-") for v in report.violations)


@settings(deadline=None, max_examples=60)  # a whole audit per example: slow under load
@given(which=st.integers(0, len(REAL_LOGS) - 1), data=st.data())
def test_an_audit_resumed_from_checkpoints_anywhere_reports_what_one_pass_reports(
    which: int, data: st.DataObject,
) -> None:
    events = REAL_LOGS[which]
    cuts = data.draw(st.sets(st.integers(0, len(events)), max_size=6))
    whole = audit(events)
    assert _resumed(events, cuts).to_dict() == whole.to_dict()


@pytest.mark.parametrize("log", [
    Log().created(misfire="all").mat(0).skipped(1).mat(3),
    Log().created(misfire="all").skipped(0, through=29, count=30, reason="misfire_max_age")
    .skipped(40, through=69, count=30, reason="misfire_max_age").mat(70),
    Log().created().mat(0).fence(1, 0).claim(0, 1).mat(1).fence(2, 1).claim(1, 2),
    Log().created().mat(0).fence(2, 0).fence(1, 0),
], ids=["missing-instant", "gap-between-ranges", "overlap", "fence"])
def test_a_violation_is_reported_the_same_whatever_the_checkpoints(log: Log) -> None:
    events = _numbered(log.events)
    whole = audit(events)
    assert not whole.ok
    for cut in range(len(events) + 1):
        assert _resumed(events, {cut}).to_dict() == whole.to_dict(), cut


def _interleaved(*logs: list[m.EventEnvelope]) -> list[tuple[int, int, m.EventEnvelope]]:
    """The events of several schedules' logs taken in turn, on partition 0."""
    mixed = [e for batch in itertools.zip_longest(*logs) for e in batch if e is not None]
    return _numbered(mixed)


def test_holding_folds_sealed_changes_nothing_the_audit_finds() -> None:
    # given the events of three schedules (one with a skip dropped, one with a late result,
    # one with a wrong count) taken in turn, and the four schedules of the real scenarios
    # across partitions
    mixed = _interleaved([e for _, _, e in REAL_LOGS[1]], LONG_LOGS["late-result"],
                         [e for _, _, e in REAL_LOGS[2]])
    assert len({e.schedule_id for _, _, e in mixed}) == 3
    whole = audit(mixed)
    assert {k for k, v in whole.violation_counts.items() if v} >= {
        "misfire_all_complete", "result_within_lease"}
    # when the audit holds one fold as an object, the others sealed, then its report is
    # the same, with or without checkpoints between
    assert audit(mixed, hot_max=1).to_dict() == whole.to_dict()
    cuts = set(range(0, len(mixed), 7))
    resumed = _resumed(mixed, cuts, hot_max=1).to_dict()
    assert resumed == _resumed(mixed, cuts).to_dict()
    # (a checkpoint judges misfire records where it is taken: the same violations, found
    # in another order)
    assert sorted(map(repr, resumed.pop("violations"))) == sorted(
        map(repr, whole.to_dict()["violations"]))
    assert audit(REAL_LOGS[0], hot_max=1).to_dict() == audit(REAL_LOGS[0]).to_dict()


def test_the_fold_store_holds_the_most_recent_folds_hot_and_writes_back_visits() -> None:
    # given three folds in a store that holds two as objects
    store = FoldStore(hot_max=2)
    for sid in ("a", "b", "c"):
        store.put((TENANT, sid), ScheduleFold(TENANT, sid))
    # then the least recently used is sealed, and read back (now the most recent) it is
    # the same fold
    assert (store.hot, store.cold, len(store)) == (2, 1, 3)
    a = store.get((TENANT, "a"))
    assert a is not None and a.schedule_id == "a" and (store.hot, store.cold) == (2, 1)
    assert store.get((TENANT, "nobody")) is None and (TENANT, "b") in store
    # and a change made while visiting a sealed fold is kept when written back, and only then
    for s in store.folds():
        s.scheduled_runs = 99
    assert [s.scheduled_runs for s in store.folds()] == [99, 0, 99]  # b sealed: not kept
    for s in store.folds(write_back=True):
        s.scheduled_runs = len(s.schedule_id) * 7
    assert [store.get((TENANT, sid)).scheduled_runs for sid in "abc"] == [7, 7, 7]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="hot_max"):
        FoldStore(hot_max=0)


def test_a_sealed_fold_takes_at_most_a_fifth_of_its_objects() -> None:
    # given the fold of a long steady schedule (its recent runs and spans held) as 200
    # schedules of their own
    auditor = Auditor()
    for n, e in enumerate(LONG_LOGS["clean"]):
        auditor.feed(e, 0, n)
    [doc] = auditor.checkpoint()["schedules"]

    def held(hot_max: int) -> float:
        """Bytes per fold in a store holding ``hot_max`` of them as objects."""
        store = FoldStore(hot_max)
        store.put((TENANT, "first"), ScheduleFold(TENANT, "first"))  # the compressor warm
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(200):
                store.put((TENANT, f"s{i}"), decode_schedule({**doc, "id": f"s{i}"}))
            return (tracemalloc.get_traced_memory()[0] - before) / 200
        finally:
            tracemalloc.stop()

    # when they are held sealed, then each takes at most a fifth of what it takes hot
    hot, cold = held(1000), held(1)
    assert cold <= hot / 5, (hot, cold)



def test_a_checkpoint_of_the_earlier_single_document_form_is_resumed_the_same() -> None:
    # given an audit stopped half-way through the real scenarios' log
    events = REAL_LOGS[0]
    half = len(events) // 2
    first = Auditor()
    partitions: dict[int, list[tuple[int, m.EventEnvelope]]] = {}
    for p, off, env in events:
        partitions.setdefault(p, []).append((off, env))
    ordered = list(in_barrier_order(partitions, lambda *_: None))
    for p, off, env in ordered[:half]:
        first.feed(env, p, off)
    # when its state is written as one JSON document (version 2) and as JSON lines
    single = orjson.dumps(first.checkpoint())
    lines = b"".join(first.checkpoint_lines())
    assert single.count(b"\n") == 0 and lines.count(b"\n") == 1 + len(
        {(e.tenant, e.schedule_id) for _, _, e in ordered[:half]})
    # then an audit resumed from either reports, once fed the rest, what one pass reports
    whole = audit(events).to_dict()
    for data in (single, lines):
        resumed = Auditor.resume_document(data, hot_max=1)
        for p, off, env in ordered[half:]:
            resumed.feed(env, p, off)
        assert resumed.finish().to_dict() == whole


@pytest.mark.parametrize("data, said", [
    (b'{"version": 9}\n', "version 9"),
    (b"[1, 2]", "version None"),
    (b"{not json", "damaged"),
    (b'{"version": 3, "report": {"counts": [0, 0, 0, 0, 0], "violations": [], "notes": []},'
     b' "effects": [], "holders": [], "quotas": [], "homes": []}\n{"tenant": "acme"}\n',
     "damaged: KeyError"),
])
def test_a_checkpoint_document_that_is_none_this_code_wrote_is_refused(
    data: bytes, said: str,
) -> None:
    with pytest.raises(CheckpointError, match=said):
        Auditor.resume_document(data)


def test_a_second_result_after_a_checkpoint_is_still_a_second_result() -> None:
    log = Log().created().mat(0).fence(1, 0).claim(0, 1).result(0, 1, T0 + sec(5))
    auditor = Auditor()
    for n, e in enumerate(log.events):
        auditor.feed(e, 0, n)
    resumed = Auditor.resume(orjson.loads(orjson.dumps(auditor.checkpoint())))
    resumed.feed(Log().result(0, 1, T0 + sec(6)).events[0], 0, len(log.events))
    (v,) = only(resumed.finish(), "result_once")
    assert [e.offset for e in v.events] == [4, 5]


def test_a_checkpoint_drops_the_misfire_all_instants_it_has_judged() -> None:
    log = Log().created(misfire="all").mat(0).skipped(1).mat(3)  # minute 2 missing
    auditor = Auditor()
    for n, e in enumerate(log.events):
        auditor.feed(e, 0, n)
    doc = auditor.checkpoint()
    [rev] = doc["schedules"][0]["revisions"]
    assert rev[5] == [] and rev[6] == []  # instants and ranges: judged and dropped
    assert rev[7] == (T0 + timedelta(minutes=3)).isoformat()  # settled through minute 3
    # the gap was reported at the checkpoint, once, and stays reported
    resumed = Auditor.resume(doc)
    resumed.feed(Log().mat(4).events[0], 0, len(log.events))
    (v,) = only(resumed.finish(), "misfire_all_complete")
    assert "2026-03-02T09:02:00Z" in v.message


def test_a_checkpoint_encodes_the_same_state_to_the_same_document() -> None:
    events = REAL_LOGS[0]
    auditor = Auditor()
    for p, off, env in events[: len(events) // 2]:
        auditor.feed(env, p, off)
    doc = auditor.checkpoint()
    assert Auditor.resume(orjson.loads(orjson.dumps(doc))).checkpoint() == doc


@pytest.mark.parametrize("doc, says", [
    ({"version": 99}, "version 99"),
    ("not a document", "version None"),
    ({"version": CHECKPOINT_VERSION, "report": {"counts": [0]}}, "damaged"),
])
def test_a_checkpoint_of_another_version_or_damaged_is_refused(doc: Any, says: str) -> None:
    with pytest.raises(CheckpointError, match=says):
        Auditor.resume(doc)


# ---------------------------------------------------------------------------------------
# what the audit forgets (docs/design.md §10): its state stays bounded, the checks sound

LONG = FINISHED_KEPT + SPANS_KEPT + 2  # runs after which both windows have moved on


def _long_history(effect: bool = False) -> Log:
    """Run 0 (its effect settled, with ``effect``), then ``LONG`` more runs, all done."""
    log = Log().created().mat(0).claimed_and_done(0, 1)
    if effect:
        log.add(_effect(0)).add(m.EffectSucceeded(effect_id=f"webhook-{rid(0)}",
                                                  run_id=rid(0)))
    for k in range(1, LONG + 1):
        log.mat(k).claimed_and_done(k, k + 1)
    return log


def _same_whatever_the_checkpoints(log: Log) -> AuditReport:
    events = _numbered(log.events)
    whole = audit(events)
    for cuts in ({1}, {len(events) // 2}, {len(events) - 1}, {5, 40, len(events) - 2}):
        assert _resumed(events, cuts).to_dict() == whole.to_dict(), cuts
    return whole


def _held(log: Log) -> dict[str, int]:
    auditor = Auditor()
    for n, e in enumerate(log.events):
        auditor.feed(e, 0, n)
    return auditor.held()


def test_a_long_history_leaves_only_the_recent_runs_and_spans_held() -> None:
    held = _held(_long_history(effect=True))
    assert held["runs"] == held["finished"] == FINISHED_KEPT
    assert held["spans"] == SPANS_KEPT
    assert held["effects"] == 0  # run 0's settled effect went with run 0


def test_a_late_result_for_a_long_finished_run_is_still_reported() -> None:
    log = _long_history().result(0, fence=1, at=T0 + sec(7))
    report = _same_whatever_the_checkpoints(log)
    assert report.violation_counts["fence_current"] == 1
    assert report.violation_counts["result_within_lease"] == 1
    assert sum(report.violation_counts.values()) == 2
    for v in report.violations:
        assert v.run_id == rid(0) and "finished and was forgotten" in v.message
        assert v.events[-1].type == "ResultPublished"


def test_a_late_claim_for_a_long_finished_run_is_still_reported() -> None:
    fence = LONG + 2
    log = _long_history().fence(fence, 0).claim(0, fence, T0 + sec(7))
    report = _same_whatever_the_checkpoints(log)
    advanced, claimed = only(report, "fence_current", 2)
    assert [advanced.events[-1].type, claimed.events[-1].type] == [
        "FenceAdvanced", "AttemptClaimed"]
    assert all("does not hold" in v.message and v.run_id == rid(0) for v in (advanced, claimed))


def test_a_late_fence_for_a_long_finished_run_is_still_reported() -> None:
    log = _long_history().fence(LONG + 2, 0, reason="lease_expired")
    (v,) = only(_same_whatever_the_checkpoints(log), "fence_current")
    assert "fence advanced to" in v.message and "does not hold" in v.message


def test_a_claim_of_a_run_that_has_just_finished_is_reported() -> None:
    log = Log().created().mat(0).claimed_and_done(0, 1).fence(2, 0).claim(0, 2, T0 + sec(9))
    violations = only(_same_whatever_the_checkpoints(log), "fence_current", 2)
    assert all("which is SUCCEEDED" in v.message for v in violations)


@pytest.mark.parametrize("again", [
    lambda log: log.mat(0),
    lambda log: log.skipped(1, reason="misfire"),
    lambda log: log.skipped(LONG - 3, through=LONG + 5, count=9, reason="misfire"),
], ids=["materialized", "skipped", "range-over-forgotten-and-held"])
def test_an_occurrence_recorded_again_long_after_is_still_a_duplicate(again: Any) -> None:
    log = again(_long_history())
    (v,) = only(_same_whatever_the_checkpoints(log), "occurrence_unique")
    assert "repeats" in v.message or "overlaps" in v.message


def test_an_instant_older_than_the_forgotten_ones_is_a_duplicate_or_out_of_order() -> None:
    log = _long_history()
    log.mat(LONG + 1)
    log.add(m.OccurrenceMaterialized(  # a new instant, but before ones already claimed
        run_id="r-between", scheduled_at=T0 + sec(30), due_at=T0 + sec(30), revision=1,
        job=m.JobSpec(type="report"), state="READY", sequence=99))
    (v,) = only(_same_whatever_the_checkpoints(log), "occurrence_unique")
    assert "is not after" in v.message and "in increasing order" in v.message


def test_an_effect_recorded_again_long_after_is_still_reported() -> None:
    eid = f"webhook-{rid(0)}"
    log = _long_history(effect=True).add(_effect(0))
    (v,) = only(_same_whatever_the_checkpoints(log), "effect_unique")
    assert f"EffectIntended for effect {eid}" in v.message and "does not hold" in v.message
    log = _long_history(effect=True).add(m.EffectSucceeded(effect_id=eid, run_id=rid(0)))
    (v,) = only(_same_whatever_the_checkpoints(log), "effect_unique")
    assert f"EffectSucceeded for effect {eid}" in v.message


def test_a_run_with_an_open_effect_is_kept_until_its_effect_is_settled() -> None:
    eid = f"webhook-{rid(0)}"
    log = Log().created().mat(0).claimed_and_done(0, 1).add(_effect(0))
    for k in range(1, LONG + 1):
        log.mat(k).claimed_and_done(k, k + 1)
    assert _held(log)["runs"] == FINISHED_KEPT + 1  # run 0 waits for its effect
    log.add(m.EffectUncertain(effect_id=eid, run_id=rid(0)))
    log.add(m.ReconciliationRequired(run_id=rid(0), reason="?", effect_id=eid))
    log.add(m.ReconciliationResolved(run_id=rid(0), decision="retry", effect_id=eid))
    log.add(_effect(0, attempt=2)).add(m.EffectSucceeded(effect_id=eid, run_id=rid(0)))
    _assert_clean(_same_whatever_the_checkpoints(log))
    assert _held(log)["runs"] == FINISHED_KEPT  # settled: run 0 and its effect are gone
    assert _held(log)["effects"] == 0


def test_misfire_all_records_are_judged_as_they_come_and_a_gap_is_reported_once() -> None:
    log = Log().created(misfire="all").mat(0)  # minute 1 missing
    for k in range(2, MISFIRE_KEPT * 3):
        log.mat(k)
    (v,) = only(_same_whatever_the_checkpoints(log), "misfire_all_complete")
    assert "2026-03-02T09:01:00Z" in v.message
    assert _held(log)["misfire"] <= MISFIRE_KEPT


def test_the_decider_s_long_steady_log_is_clean_and_its_state_the_same_at_any_length() -> None:
    short, long_ = _steady_log(500), _steady_log(1000)  # DEAD runs: DEAD_KEPT at most
    _assert_clean(audit(short))
    _assert_clean(audit(long_))
    held, sizes = [], []
    for log in (short, long_):
        auditor = Auditor()
        for n, e in enumerate(log):
            auditor.feed(e, 0, n)
        held.append(auditor.held())
        sizes.append(len(orjson.dumps(auditor.checkpoint())))
    assert held[0] == held[1]
    assert abs(sizes[1] - sizes[0]) < sizes[0] // 20  # offsets and counts have more digits
    assert held[1]["dead"] <= DEAD_KEPT and held[1]["runs"] <= DEAD_KEPT + 2 * FINISHED_KEPT


@settings(deadline=None, max_examples=25)
@given(outcomes=st.lists(st.sampled_from(STEADY_OUTCOMES), min_size=1, max_size=160))
def test_the_audit_holds_no_more_than_the_decider_plus_a_constant_window(
    outcomes: list[str],
) -> None:
    d, marks = _steady(outcomes)
    auditor = Auditor()
    fed = 0
    for upto, decider_runs in marks:
        for n in range(fed, upto):
            auditor.feed(d.log[n], 0, n)
        fed = upto
        held = auditor.held()
        # the decider's live, DEAD and effect-waiting runs (its newest finished one aside)
        assert held["runs"] <= decider_runs + FINISHED_KEPT
        assert held["finished"] <= FINISHED_KEPT + held["effects"]
        assert held["dead"] <= DEAD_KEPT
        assert held["spans"] <= SPANS_KEPT
        assert held["effects"] <= held["runs"]  # one effect a run, held with its run
    assert audit(d.log).ok


# -- concurrency_limit

LIMIT = limit_id("shared")


def _granted(log: Log, minute: int, limit: int = 1, sid: str = "s1") -> Log:
    run = rid(minute, sid)
    return log.add(m.PermitGranted(key="shared", run_id=run, schedule_id=sid, ask=f"a{minute}",
                                   limit=limit, holders=1), sid=LIMIT)


def _returned(log: Log, minute: int, sid: str = "s1") -> Log:
    run = rid(minute, sid)
    log.add(m.RunPermitReturned(run_id=run, ask=f"a{minute}"), sid=sid)
    return log.add(m.PermitReleased(key="shared", run_id=run, schedule_id=sid, ask=f"a{minute}",
                                    held=True, holders=0), sid=LIMIT)


def _permitted_run(log: Log, minute: int, fence: int) -> Log:
    """A run that asks, is granted, runs and gives its permit back."""
    log.mat(minute).add(m.RunAwaitsPermit(run_id=rid(minute), key="shared", limit=1,
                                          ask=f"a{minute}"))
    _granted(log, minute).add(m.RunPermitted(run_id=rid(minute), ask=f"a{minute}"))
    return _returned(log.claimed_and_done(minute, fence), minute)


def test_runs_taking_turns_with_one_permit_are_clean() -> None:
    log = _permitted_run(_permitted_run(Log().created(), 0, 1), 1, 2)
    _assert_clean(log.audit())


def test_more_permits_granted_than_the_limit_is_reported() -> None:
    log = _granted(_granted(Log().created(), 0), 1)
    (v,) = only(log.audit(), "concurrency_limit")
    assert v.message == "2 permits of key 'shared' held, limit 1" and v.schedule_id == LIMIT


def test_a_run_claimed_while_it_waits_for_its_permit_is_reported() -> None:
    log = Log().created().mat(0).add(m.RunAwaitsPermit(run_id=rid(0), key="shared", limit=1,
                                                       ask="a0"))
    (v,) = only(log.claimed_and_done(0, 1).audit(), "concurrency_limit")
    assert v.run_id == rid(0) and "waits for a permit" in v.message


def test_a_permit_released_that_was_never_granted_is_reported() -> None:
    log = Log().created().add(m.PermitReleased(key="shared", run_id=rid(0), schedule_id="s1",
                                               ask="a0", held=True, holders=0), sid=LIMIT)
    (v,) = only(log.audit(), "concurrency_limit")
    assert "does not hold" in v.message


def test_the_permits_held_survive_a_checkpoint() -> None:
    from chronolog.audit.auditor import Auditor
    first = _granted(Log().created(), 0)
    a = Auditor()
    for i, e in enumerate(first.events):
        a.feed(e, 0, i)
    resumed = Auditor.resume(a.checkpoint())
    later = _granted(Log(), 1)
    for i, e in enumerate(later.events):
        resumed.feed(e, 0, 100 + i)
    (v,) = only(resumed.finish(), "concurrency_limit")
    assert v.message == "2 permits of key 'shared' held, limit 1"


# -- backfill


def _backfilled(log: Log, minute: int, sid: str = "s1") -> Log:
    t = T0 - timedelta(hours=1) + timedelta(minutes=minute)
    return log.add(m.OccurrenceMaterialized(
        run_id=backfill_run_id(TENANT, sid, t), scheduled_at=t, due_at=T0, revision=1,
        job=m.JobSpec(type="report"), trigger="backfill", state="READY", sequence=0,
        advances_schedule=False), T0)


def test_a_backfills_run_beside_a_scheduled_one_under_skip_is_clean() -> None:
    log = _backfilled(Log().created(overlap="skip"), 0).mat(0)
    bf = backfill_run_id(TENANT, "s1", T0 - timedelta(hours=1))
    log.fence(1, 0).claim(0, 1, T0)
    log.add(m.FenceAdvanced(fence=2, run_id=bf, reason="claim"), T0)
    log.add(m.AttemptClaimed(run_id=bf, attempt=1, fence=2, worker_id="w2", claimed_at=T0,
                             lease_until=T0 + sec(30)), T0)
    _assert_clean(log.audit())


def test_an_instant_backfilled_twice_is_a_duplicate_occurrence() -> None:
    log = _backfilled(_backfilled(Log().created(), 0), 0)
    only(log.audit(), "occurrence_unique")


# -- calendar_exclusion

CAL = calendar_id("holidays")
# 09:02 and 09:03 (UTC) every day: T0 + 2 and T0 + 3 minutes
WINDOW = CalendarSpec.model_validate({"windows": [{"start": "09:02", "end": "09:04"}]})
WINDOW_ENTRY = "09:02-09:04 UTC"
# 09:05 only (revision 2)
LATER = CalendarSpec.model_validate({"windows": [{"start": "09:05", "end": "09:06"}]})


def _copied(log: Log, revision: int = 1, spec: CalendarSpec | None = WINDOW) -> Log:
    return log.add(m.CalendarCopied(name="holidays", revision=revision, spec=spec))


def _revised(log: Log, revision: int = 1, spec: CalendarSpec = WINDOW) -> Log:
    return log.add(m.CalendarRevised(name="holidays", revision=revision, spec=spec), sid=CAL)


def _excluded(log: Log, minute: int, revision: int = 1, through: int | None = None,
              count: int = 1, entry: str = WINDOW_ENTRY) -> Log:
    return log.add(m.OccurrenceSkipped(
        run_id=rid(minute), scheduled_at=T0 + timedelta(minutes=minute),
        through=None if through is None else T0 + timedelta(minutes=through), count=count,
        reason="excluded", calendar="holidays", calendar_revision=revision,
        excluded_by=entry))


def _calendar_scenario() -> tuple[Driver, Log]:
    """A schedule naming calendar ``holidays``, driven by the real decider through two
    revisions of the calendar (each run done before the next instant), and the calendar's
    own events (a hand-built log: the decider of the calendar's aggregate sends the copies
    the driver is given)."""
    d = Driver("cal")
    d.create(T0, exclude=["holidays"])
    home = Log(CAL)
    home.add(m.CalendarSubscribed(name="holidays", schedule_id="cal"), sid=CAL)
    _revised(home, 1, WINDOW)

    def copy(revision: int, spec: CalendarSpec, now: datetime) -> None:
        d.do(m.CopyCalendar(name="holidays", revision=revision, spec=spec), now,
             principal=PROCESSOR)

    def run_ready(now: datetime) -> None:
        for run_id in d.runs_in("READY"):
            c = d.claim(run_id, now + sec(1))
            d.complete(c, now + sec(2))

    copy(1, WINDOW, T0)  # the copy decides what waited for it: T0 runs
    run_ready(T0)
    for minute in range(1, 7):
        now = T0 + timedelta(minutes=minute)
        if minute == 4:
            _revised(home, 2, LATER)
            copy(2, LATER, now - sec(30))
        d.tick(now)
        run_ready(now)
    return d, home


def test_a_schedule_skipping_what_its_calendar_excludes_is_clean() -> None:
    d, home = _calendar_scenario()
    skips = [e.payload for e in d.log if isinstance(e.payload, m.OccurrenceSkipped)]
    assert [(s.scheduled_at, s.calendar_revision) for s in skips] == [
        (T0 + timedelta(minutes=2), 1), (T0 + timedelta(minutes=3), 1),
        (T0 + timedelta(minutes=5), 2)]
    assert {s.reason for s in skips} == {"excluded"}
    mats = [e.payload.scheduled_at for e in d.log
            if isinstance(e.payload, m.OccurrenceMaterialized)]
    assert mats == [T0 + timedelta(minutes=k) for k in (0, 1, 4, 6)]
    # the calendar's aggregate on another partition, read before or after the schedule's
    for sched_p, home_p in ((0, 1), (1, 0)):
        events = ([(sched_p, n, e) for n, e in enumerate(d.log)]
                  + [(home_p, n, e) for n, e in enumerate(home.events)])
        whole = audit(events)
        _assert_clean(whole)
        for cuts in ({3}, {len(events) // 2}, set(range(len(events)))):
            assert _resumed(events, cuts, hot_max=1).to_dict() == whole.to_dict()


def test_an_excluded_instant_materialized_is_reported() -> None:
    log = _copied(Log().created(exclude=["holidays"])).mat(0).claimed_and_done(0, 1).mat(2)
    (v,) = only(log.audit(), "calendar_exclusion")
    assert v.message == ("schedule occurrence 2026-03-02T09:02:00Z materialized, yet calendar "
                         f"'holidays' (revision 1) excludes it: {WINDOW_ENTRY}")
    assert v.run_id == rid(2) and v.events[0].offset == len(log.events) - 1


def test_a_backfill_run_of_an_excluded_instant_is_reported_and_a_manual_one_is_not() -> None:
    log = _copied(Log().created(exclude=["holidays"]))
    t = T0 + timedelta(minutes=2)
    log.add(m.OccurrenceMaterialized(
        run_id=manual_run_id(TENANT, "s1", "k1"), scheduled_at=t, due_at=t, revision=1,
        job=m.JobSpec(type="report"), trigger="manual", request_key="k1", state="READY",
        sequence=0, advances_schedule=False))
    _assert_clean(log.audit())
    log.add(m.OccurrenceMaterialized(
        run_id=backfill_run_id(TENANT, "s1", t - timedelta(days=1)),
        scheduled_at=t - timedelta(days=1), due_at=T0, revision=1, job=m.JobSpec(type="report"),
        trigger="backfill", state="READY", sequence=0, advances_schedule=False))
    (v,) = only(log.audit(), "calendar_exclusion")
    assert v.message.startswith("backfill occurrence 2026-03-01T09:02:00Z materialized")


def test_a_run_materialized_before_the_calendar_s_copy_came_is_reported() -> None:
    (v,) = only(Log().created(exclude=["holidays"]).mat(0).audit(), "calendar_exclusion")
    assert "waited for the copy of calendar 'holidays'" in v.message


def test_a_calendar_that_does_not_exist_excludes_every_instant() -> None:
    base = Log().created(exclude=["holidays"])
    _assert_clean(_excluded(_copied(base, 0, None), 0, revision=0,
                            entry="the calendar does not exist").audit())
    (v,) = only(_copied(Log().created(exclude=["holidays"]), 0, None).mat(0).audit(),
                "calendar_exclusion")
    assert "excludes it: the calendar does not exist" in v.message


def test_a_skip_of_an_instant_the_calendar_does_not_exclude_is_reported() -> None:
    log = _excluded(_copied(Log().created(exclude=["holidays"])), 1)
    (v,) = only(log.audit(), "calendar_exclusion")
    assert v.message == ("occurrence 2026-03-02T09:01:00Z skipped as excluded by calendar "
                         f"'holidays' (revision 1, {WINDOW_ENTRY}), which does not exclude it:"
                         " a run lost")


def test_a_skip_naming_a_calendar_or_revision_the_schedule_did_not_hold_is_reported() -> None:
    held = _copied(Log().created(exclude=["holidays"]))
    (v,) = only(_excluded(held, 2, revision=2).audit(), "calendar_exclusion")
    assert "names calendar 'holidays' revision 2, and the schedule holds its revision 1" \
        in v.message
    (v,) = only(_excluded(Log().created(exclude=["holidays"]), 2).audit(), "calendar_exclusion")
    assert "waits for its first copy" in v.message
    (v,) = only(_excluded(Log().created(), 2).audit(), "calendar_exclusion")
    assert "the schedule does not name it" in v.message


def test_a_collapsed_excluded_range_is_checked_instant_by_instant() -> None:
    two = CalendarSpec.model_validate({"windows": [{"start": "09:02", "end": "09:03"},
                                                   {"start": "09:04", "end": "09:06"}]})
    base = _copied(Log().created(exclude=["holidays"]), 1, two)
    _assert_clean(_excluded(_copied(Log().created(exclude=["holidays"])), 2, through=3,
                            count=2).audit())
    # both ends excluded, 09:03 in between not
    (v,) = only(_excluded(base, 2, through=5, count=4).audit(), "calendar_exclusion")
    assert v.message.startswith("occurrence 2026-03-02T09:03:00Z skipped as excluded")


def test_the_copies_are_judged_by_the_revision_that_held_them() -> None:
    log = _copied(Log().created(exclude=["holidays"])).mat(0).claimed_and_done(0, 1)
    _copied(log, 2, LATER).mat(2).claimed_and_done(2, 2)  # revision 2 no longer excludes 09:02
    _assert_clean(log.audit())
    # a revision no longer naming the calendar drops its copy
    log = _copied(Log().created(exclude=["holidays"])).revised(2).mat(2)
    _assert_clean(log.audit())


@pytest.mark.parametrize("home_first", [True, False])
def test_a_copy_that_differs_from_the_calendar_s_revision_is_reported(home_first: bool) -> None:
    sched = _copied(Log().created(exclude=["holidays"]), 1, LATER)
    home = _revised(Log(CAL), 1, WINDOW)
    first, second = (home, sched) if home_first else (sched, home)
    events = ([(0, n, e) for n, e in enumerate(first.events)]
              + [(1, n, e) for n, e in enumerate(second.events)])
    whole = audit(events)
    (v,) = only(whole, "calendar_exclusion")
    assert v.message == ("a copy of calendar 'holidays' at revision 1 carries another spec than "
                         "the calendar revised at that revision")
    assert v.schedule_id == "s1" and len(v.events) == 2
    for cut in range(len(events)):
        assert _resumed(events, {cut}).to_dict() == whole.to_dict(), cut


def test_a_copy_of_a_deleted_calendar_must_carry_no_spec() -> None:
    home = _revised(Log(CAL), 1, WINDOW).add(m.CalendarDeleted(name="holidays", revision=2),
                                              sid=CAL)
    sched = _copied(_copied(Log().created(exclude=["holidays"])), 2, None)
    _assert_clean(audit(_numbered(home.events) + [(1, n, e) for n, e in
                                                  enumerate(sched.events)]))
    forged = _copied(Log().created(exclude=["holidays"]), 2, WINDOW)
    (v,) = only(audit(_numbered(home.events) + [(1, n, e) for n, e in
                                                enumerate(forged.events)]),
                "calendar_exclusion")
    assert "than the calendar deleted at that revision" in v.message


def test_copies_of_a_revision_the_log_does_not_hold_must_agree() -> None:
    log = _copied(Log().created(exclude=["holidays"]), 3, WINDOW)
    log.add(m.ScheduleCreated(revision=1, spec=spec(exclude=["holidays"]), created_at=T0,
                              anchor=T0, next_run_at=T0, next_due_at=T0), sid="s2")
    _assert_clean(log.audit())
    log.add(m.CalendarCopied(name="holidays", revision=3, spec=LATER), sid="s2")
    events = _numbered(log.events)
    whole = audit(events)
    (v,) = only(whole, "calendar_exclusion")
    assert "carry 2 different specs" in v.message and v.schedule_id == CAL
    for cut in range(len(events)):
        assert _resumed(events, {cut}).to_dict() == whole.to_dict(), cut


def test_a_calendar_s_revisions_count_on() -> None:
    home = _revised(_revised(Log(CAL), 1), 1, LATER)
    (v,) = only(home.audit(), "calendar_exclusion")
    assert "at revision 1, not above its revision 1" in v.message
    # an event that is not a calendar's, or of another calendar, on its aggregate
    for payload in (m.PermitQueued(key="k", run_id="r", schedule_id="s1", ask="a", limit=1,
                                   position=1, holders=1),
                    m.CalendarRevised(name="other", revision=1, spec=WINDOW)):
        (v,) = only(Log(CAL).add(payload, sid=CAL).audit(), "calendar_exclusion")
        assert v.message == f"{payload.type} on calendar aggregate {CAL}"


def test_the_calendar_copies_survive_a_checkpoint() -> None:
    first = _copied(Log().created(exclude=["holidays"]))
    a = Auditor()
    for i, e in enumerate(first.events):
        a.feed(e, 0, i)
    doc = a.checkpoint()
    assert Auditor.resume(orjson.loads(orjson.dumps(doc))).checkpoint() == doc
    (sched,) = doc["schedules"]
    assert sched["calendars"] == [["holidays", 1, WINDOW.model_dump(mode="json", by_alias=True),
                                   True]]
    resumed = Auditor.resume(doc)
    later = Log().mat(2)
    for i, e in enumerate(later.events):
        resumed.feed(e, 0, 100 + i)
    (v,) = only(resumed.finish(), "calendar_exclusion")
    assert "excludes it" in v.message


def test_a_pending_copy_survives_a_checkpoint() -> None:
    a = Auditor()
    for i, e in enumerate(_copied(Log().created(exclude=["holidays"]), 1, LATER).events):
        a.feed(e, 0, i)
    doc = a.checkpoint()
    assert doc["copies"] and Auditor.resume(doc).checkpoint() == doc
    resumed = Auditor.resume_document(b"".join(Auditor.resume(doc).checkpoint_lines()))
    for i, e in enumerate(_revised(Log(CAL)).events):
        resumed.feed(e, 1, i)
    (v,) = only(resumed.finish(), "calendar_exclusion")
    assert v.schedule_id == "s1"
