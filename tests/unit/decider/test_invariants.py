"""Stateful property test of the decider against the guarantees of docs/design.md §10.

A hypothesis ``RuleBasedStateMachine`` drives three schedules with random specs (every /
cron / delay / at; every overlap and misfire policy; retries, leases, start deadlines,
jitter, max_count, effects) through random commands — claim, heartbeat, complete and fail
with the current or a stale fence, cancel, pause/resume, revise, manual triggers, redrive,
reconciliation, effect outcomes, delete — and clock advances (Tick). Each decision is folded
into the live state event by event, as a processor does, and checked:

* each occurrence key ``(schedule_id, scheduled_at)`` is accounted for at most once across
  every OccurrenceMaterialized / OccurrenceSkipped (collapsed ranges expanded), and each
  manual request key once;
* every accounted instant is the schedule's ``next_run_at`` and the one after it is the
  recurrence's next instant: no instant is dropped, none repeated; with misfire ``all``
  nothing is skipped except for the catch-up bounds (age, count) or overlap/deadline;
* a schedule completes only with no instant left, and nothing happens to its instants or
  definition after it completed; only misfire ``latest`` coalesces, and an occurrence it
  coalesces after a gap (a backlog, or a Tick after a take-over: ``Tick.resumed``) is a
  scheduled one that never started, under an overlap policy other than ``allow``;
* fences strictly increase per schedule;
* at most one ResultPublished per run, only from the current fence inside the lease
  (judged against the state before the command);
* overlap skip / buffer_one / buffer_all never hold two active runs (so never two LEASED);
* after a Tick nothing due at ``now`` is left undone (within the per-decision budget);
* ``decide`` is pure (the input state is unchanged, a second call gives the same answer)
  and folding all emitted events from scratch gives the live state's ``snapshot()``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from chronolog.commands.aggregate import Decision
from chronolog.commands.decider import (
    MAX_INSTANTS_PER_DECISION,
    decide,
    evolve,
    fold,
    initial_state,
    next_wakeup,
)
from chronolog.commands.state import ScheduleState
from chronolog.domain import messages as m
from chronolog.domain.recurrence import upcoming

T0 = datetime(2026, 3, 7, 23, 0, tzinfo=UTC)  # a DST weekend in New York
TENANT = "acme"
SIDS = ("alpha", "beta", "gamma")
US = timedelta(microseconds=1)
GUARDED = ("skip", "buffer_one", "buffer_all")
BOUNDED_SKIPS = {"misfire_max_age", "misfire_max_catchup", "overlap", "overlap_buffer_full",
                 "start_deadline"}

triggers = st.one_of(
    st.sampled_from([7.0, 60.0, 90.0, 300.0]).map(lambda s: {"every": s}),
    st.sampled_from(["* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *"]).flatmap(
        lambda c: st.sampled_from(["UTC", "America/New_York"]).map(
            lambda z: {"cron": c, "timezone": z})),
    st.sampled_from([45.0, 600.0]).map(lambda s: {"delay": s}),
    st.sampled_from([30, 400, 3000]).map(lambda s: {"at": T0 + timedelta(seconds=s)}),
)
misfires = st.builds(
    lambda policy, grace, catchup, age: {"policy": policy, "grace": grace,
                                         "max_catchup": catchup, "max_age": age},
    st.sampled_from(["skip", "latest", "all"]), st.sampled_from([0.0, 60.0]),
    st.sampled_from([2, 100]), st.sampled_from([300.0, 86_400.0]),
)


@st.composite
def specs(draw: Any, overlap: str | None = None) -> m.ScheduleSpec:
    """A random schedule spec (``overlap`` fixed when given: revisions keep it)."""
    raw: dict[str, Any] = dict(draw(triggers))
    raw.update(
        job={"type": "report", "params": {"v": draw(st.integers(0, 3))}},
        misfire=draw(misfires),
        overlap=overlap or draw(st.sampled_from(["allow", *GUARDED, "cancel_previous"])),
        retry={"max_attempts": draw(st.sampled_from([1, 2, 3])),
               "initial_backoff": draw(st.sampled_from([1.0, 30.0])),
               "max_age": draw(st.sampled_from([120.0, 86_400.0]))},
        lease=draw(st.sampled_from([20.0, 90.0])),
        start_deadline=draw(st.sampled_from([None, 30.0])),
        jitter=draw(st.sampled_from([0.0, 0.0, 10.0])),
        max_count=draw(st.sampled_from([None, None, 3])),
        effects=draw(st.sampled_from([(), ({"kind": "email", "destination": "d-email"},)])),
    )
    return m.ScheduleSpec.model_validate(raw)


class DeciderMachine(RuleBasedStateMachine):
    """Three schedules, one authority clock, every command kind."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.n = 0
        self.states: dict[str, ScheduleState] = {}
        self.history: dict[str, list[Any]] = {sid: [] for sid in SIDS}
        self.keys: dict[str, set[datetime]] = {sid: set() for sid in SIDS}
        self.manual_keys: dict[str, set[str]] = {sid: set() for sid in SIDS}
        self.published: set[tuple[str, str]] = set()
        self.max_fence: dict[str, int] = dict.fromkeys(SIDS, 0)
        self.overlap: dict[str, str] = {}
        # per schedule and revision: the instants materialized / skipped for the catch-up bounds
        self.ran: dict[tuple[str, int], list[datetime]] = {}
        self.bounded_skip: set[tuple[str, int]] = set()
        # a fold of the events seen: each run's state the last time the state held it (a
        # manual trigger skipped before it was held: SKIPPED), and each manual key's params
        self.last_seen: dict[tuple[str, str], str] = {}
        self.manual_params: dict[tuple[str, str], dict[str, int] | None] = {}

    # -- driving ------------------------------------------------------------------------

    def _do(self, sid: str, payload: Any) -> Decision:
        state = self.states[sid]
        self.n += 1
        env = m.CommandEnvelope(command_id=f"c{self.n}", type=payload.type, tenant=TENANT,
                                principal="op", schedule_id=sid, issued_at=self.now,
                                payload=payload)
        before = state.snapshot()
        decision = decide(state, env, self.now)
        assert state.snapshot() == before, "decide mutated its input state"
        again = decide(state, env, self.now)
        assert ((again.status, again.events)
                == (decision.status, decision.events)), "not deterministic"
        for event in decision.events:
            self._check_event(sid, state, event)
            evolve(state, event)
            self.history[sid].append(event)
            run_id = getattr(event, "run_id", None)
            if run_id is not None:  # every change of a run is an event naming it
                run = state.run(run_id)
                if run is not None:
                    self.last_seen[(sid, run_id)] = run.state
                elif isinstance(event, m.OccurrenceSkipped):
                    self.last_seen[(sid, run_id)] = "SKIPPED"  # skipped before it was held
        return decision

    def _pick(self, sid: str, data: st.DataObject, *wanted: str) -> str:
        """A run ID: mostly one in a ``wanted`` state, sometimes any (or an unknown one)."""
        runs = self.states[sid].runs or {}
        good = [k for k, r in runs.items() if r.state in wanted]
        if good and data.draw(st.integers(0, 4), label="prefer") > 0:
            return data.draw(st.sampled_from(good), label="run")
        return data.draw(st.sampled_from([*runs.keys(), "r_unknown"]), label="run")

    # -- per-event checks (against the state just before the event) ---------------------

    def _check_event(self, sid: str, s: ScheduleState, e: Any) -> None:
        self._check_completed(s, e)
        if isinstance(e, m.FenceAdvanced):
            assert e.fence == s.fence + 1 and e.fence > self.max_fence[sid], "fence not increasing"
            self.max_fence[sid] = e.fence
        elif isinstance(e, m.AttemptClaimed):
            run = s.run(e.run_id)
            assert run is not None and run.state == "READY" and e.fence == s.fence
        elif isinstance(e, m.ResultPublished):
            assert (sid, e.run_id) not in self.published, "second result for one run"
            self.published.add((sid, e.run_id))
            run = s.run(e.run_id)
            assert run is not None and run.state == "LEASED", "published without a lease"
            assert e.fence == run.fence, "published with a stale fence"
            assert run.lease_until is not None and self.now <= run.lease_until, "lease expired"
        elif isinstance(e, m.OccurrenceMaterialized):
            if e.trigger == "manual":
                self._manual_key(sid, e.request_key)
            else:
                assert s.run(e.run_id) is None
                self._account(sid, s, e.scheduled_at, None, 1, e.next_run_at, None)
                self.ran.setdefault((sid, s.revision), []).append(e.scheduled_at)
        elif isinstance(e, m.OccurrenceSkipped) and not e.materialized:
            if e.request_key is not None:
                self._manual_key(sid, e.request_key)
            else:
                self._account(sid, s, e.scheduled_at, e.through, e.count, e.next_run_at, e.reason)
        if isinstance(e, m.OccurrenceSkipped) and e.reason in BOUNDED_SKIPS:
            self.bounded_skip.add((sid, s.revision))

    @staticmethod
    def _check_completed(s: ScheduleState, e: Any) -> None:
        """COMPLETED only with no instant left, and final: no instant and no definition
        change after it."""
        if isinstance(e, m.ScheduleCompleted):
            assert s.status == "ACTIVE" and s.next_run_at is None, "completed too early"
        if s.status == "COMPLETED":
            scheduled = (isinstance(e, (m.OccurrenceMaterialized, m.OccurrenceSkipped))
                         and getattr(e, "trigger", "schedule") == "schedule"
                         and not getattr(e, "materialized", False) and e.request_key is None)
            assert not scheduled, f"{type(e).__name__} after COMPLETED"
            assert not isinstance(e, (m.ScheduleRevised, m.SchedulePaused, m.ScheduleResumed,
                                      m.ScheduleCompleted)), f"{type(e).__name__} after COMPLETED"
        if isinstance(e, m.OccurrenceSkipped) and e.reason == "coalesced":
            assert s.policy is not None and s.policy.misfire == "latest", "coalesced, not latest"
            if e.materialized:  # an occurrence from before a gap: one that never started
                run = s.run(e.run_id)
                assert s.policy.overlap != "allow", "coalesced under overlap allow"
                assert run is not None and run.trigger == "schedule", "coalesced a manual run"
                assert run.state in ("READY", "PENDING") and not run.claimed, (
                    f"coalesced a started run ({run.state})")

    def _manual_key(self, sid: str, key: str | None) -> None:
        assert key is not None and key not in self.manual_keys[sid], "manual key reused"
        self.manual_keys[sid].add(key)

    def _account(self, sid: str, s: ScheduleState, first: datetime, through: datetime | None,
                 count: int, nxt: datetime | None, reason: str | None) -> None:
        """One or ``count`` instants of the schedule are accounted for (run or skipped)."""
        pol = s.policy
        assert pol is not None
        assert first == s.next_run_at, f"accounted {first}, next instant was {s.next_run_at}"
        instants = [first]
        if pol.kind in ("every", "cron"):
            instants = upcoming(s.trigger, first - US, count)
            assert len(instants) == count and instants[0] == first
            last = instants[-1]
            assert through is None or through == last
            expected = s.trigger.next_after(last)
            if nxt is not None:
                assert nxt == expected, f"next {nxt} is not the recurrence's {expected}"
            else:
                assert expected is None or pol.max_count is not None, "schedule stopped early"
        else:
            assert count == 1
        for t in instants:
            assert t not in self.keys[sid], f"occurrence key {t} accounted twice"
            self.keys[sid].add(t)
        if pol.misfire == "all" and reason is not None:
            assert reason in BOUNDED_SKIPS, f"misfire all skipped an instant for {reason}"

    # -- rules --------------------------------------------------------------------------

    @initialize(data=st.data())
    def create_schedules(self, data: st.DataObject) -> None:
        for sid in SIDS:
            self.states[sid] = initial_state(TENANT, sid)
            spec = data.draw(specs(), label=f"spec {sid}")
            self.overlap[sid] = spec.overlap
            d = self._do(sid, m.CreateSchedule(spec=spec, request_key=f"k-{sid}"))
            assert d.ok, d.reason

    @rule(seconds=st.sampled_from([0, 1, 5, 10, 21, 31, 61, 95, 400, 1800]),
          resumed=st.booleans())
    def tick(self, seconds: int, resumed: bool) -> None:
        """The clock advances; ``resumed``: the first Tick after a take-over of the
        partition (the processor gives it to every schedule then due)."""
        self.now += timedelta(seconds=seconds)
        for sid in SIDS:
            d = self._do(sid, m.Tick(resumed=resumed))
            accounted = sum(getattr(e, "count", 1) for e in d.events
                            if isinstance(e, (m.OccurrenceMaterialized, m.OccurrenceSkipped)))
            wake = next_wakeup(self.states[sid])
            if accounted < MAX_INSTANTS_PER_DECISION:
                assert wake is None or wake > self.now, f"{sid}: {wake} still due at {self.now}"

    @rule(i=st.integers(0, 2), data=st.data())
    def claim(self, i: int, data: st.DataObject) -> None:
        sid = SIDS[i]
        run_id = self._pick(sid, data, "READY")
        d = self._do(sid, m.ClaimRun(run_id=run_id, attempt=1, worker_id=f"w{self.n}"))
        assert d.ok == any(isinstance(e, m.AttemptClaimed) for e in d.events)

    def _ready(self) -> list[tuple[str, str]]:
        return [(sid, k) for sid, state in self.states.items()
                for k, r in (state.runs or {}).items() if r.state == "READY"]

    @precondition(lambda self: bool(self._ready()))
    @rule(data=st.data())
    def work(self, data: st.DataObject) -> None:
        """A worker's whole attempt: claim, a few heartbeats, then complete or fail."""
        sid, run_id = data.draw(st.sampled_from(self._ready()), label="run")
        d = self._do(sid, m.ClaimRun(run_id=run_id, attempt=1, worker_id=f"w{self.n}"))
        if not d.ok:
            return
        fence = d.body["fence"]
        for _ in range(data.draw(st.integers(0, 2), label="heartbeats")):
            self.now += timedelta(seconds=data.draw(st.sampled_from([3, 15, 25])))
            self._do(sid, m.Heartbeat(run_id=run_id, attempt=1, fence=fence, worker_id="w"))
        self.now += timedelta(seconds=data.draw(st.sampled_from([0, 4, 19, 40])))
        if data.draw(st.integers(0, 3), label="fence stale") == 0:
            fence = self.states[sid].fence + 1
        end = data.draw(st.sampled_from(["complete", "complete", "fail", "walk away"]))
        if end == "complete":
            checksum = data.draw(st.sampled_from(["sha256:a", "sha256:b"]))
            self._do(sid, m.CompleteRun(run_id=run_id, attempt=1, fence=fence, worker_id="w",
                                        checksum=checksum, size=1))
        elif end == "fail":
            error_class = data.draw(st.sampled_from(["transient", "permanent", "ambiguous",
                                                     "ambiguous"]))
            self._do(sid, m.FailRun(run_id=run_id, attempt=1, fence=fence, worker_id="w",
                                    error_class=error_class))

    def _fence(self, sid: str, run_id: str, data: st.DataObject) -> int:
        run = self.states[sid].run(run_id)
        current = run.fence if run is not None and run.fence > 0 else 1
        return data.draw(st.sampled_from([current, current, max(1, current - 1), current + 1]))

    @rule(i=st.integers(0, 2), data=st.data())
    def heartbeat(self, i: int, data: st.DataObject) -> None:
        sid = SIDS[i]
        run_id = self._pick(sid, data, "LEASED")
        fence = self._fence(sid, run_id, data)
        self.now += timedelta(seconds=data.draw(st.sampled_from([0, 5, 25])))
        d = self._do(sid, m.Heartbeat(run_id=run_id, attempt=1, fence=fence, worker_id="w"))
        assert not (d.ok and not any(isinstance(e, m.LeaseExtended) for e in d.events))

    @rule(i=st.integers(0, 2), data=st.data())
    def complete(self, i: int, data: st.DataObject) -> None:
        sid = SIDS[i]
        run_id = self._pick(sid, data, "LEASED", "SUCCEEDED")
        fence = self._fence(sid, run_id, data)
        checksum = data.draw(st.sampled_from(["sha256:a", "sha256:b"]))
        self.now += timedelta(seconds=data.draw(st.sampled_from([0, 5, 25])))
        self._do(sid, m.CompleteRun(run_id=run_id, attempt=1, fence=fence, worker_id="w",
                                    checksum=checksum, size=1))

    @rule(i=st.integers(0, 2), data=st.data())
    def fail(self, i: int, data: st.DataObject) -> None:
        sid = SIDS[i]
        run_id = self._pick(sid, data, "LEASED")
        fence = self._fence(sid, run_id, data)
        error_class = data.draw(st.sampled_from(["transient", "transient", "permanent",
                                                 "ambiguous"]))
        self._do(sid, m.FailRun(run_id=run_id, attempt=1, fence=fence, worker_id="w",
                                error_class=error_class))

    @rule(i=st.integers(0, 2), data=st.data())
    def cancel(self, i: int, data: st.DataObject) -> None:
        sid = SIDS[i]
        run_id = self._pick(sid, data, "PENDING", "READY", "LEASED", "RETRY_WAIT")
        self._do(sid, m.CancelRun(run_id=run_id))

    @rule(i=st.integers(0, 2), pause=st.booleans())
    def pause_or_resume(self, i: int, pause: bool) -> None:
        self._do(SIDS[i], m.PauseSchedule() if pause else m.ResumeSchedule())

    @rule(i=st.integers(0, 2), data=st.data(), stale=st.booleans(), roll=st.integers(0, 2))
    def revise(self, i: int, data: st.DataObject, stale: bool, roll: int) -> None:
        if roll:
            return  # revisions are rarer than runs
        sid = SIDS[i]
        spec = data.draw(specs(overlap=self.overlap[sid]))
        current = self.states[sid].revision
        d = self._do(sid, m.ReviseSchedule(spec=spec, expected_revision=max(1, current - 1)
                                           if stale else max(1, current)))
        if stale and current > 1 and self.states[sid].exists:
            assert d.status == "conflict" and d.body["revision"] == current

    @rule(i=st.integers(0, 2), key=st.sampled_from(["a", "b", "c"]),
          params=st.sampled_from([None, {"v": 1}, {"v": 2}]))
    def trigger(self, i: int, key: str, params: dict[str, int] | None) -> None:
        sid = SIDS[i]
        d = self._do(sid, m.TriggerRun(request_key=key, params=params))
        if d.ok and not d.events and key in self.manual_keys[sid]:
            assert d.body["run_id"].startswith("m_")
        if d.ok and d.events:
            self.manual_params[(sid, key)] = params

    @rule(i=st.integers(0, 2), data=st.data())
    def redrive(self, i: int, data: st.DataObject) -> None:
        sid = SIDS[i]
        self._do(sid, m.RedriveRun(run_id=self._pick(sid, data, "DEAD")))

    @rule(i=st.integers(0, 2), data=st.data())
    def resolve(self, i: int, data: st.DataObject) -> None:
        sid = SIDS[i]
        run_id = self._pick(sid, data, "RECONCILING")
        decision = data.draw(st.sampled_from(["delivered", "retry", "abandon"]))
        run = self.states[sid].run(run_id)
        effect_id = None
        if run is not None and run.reconcile not in (None, "run"):
            effect_id = run.reconcile
        self._do(sid, m.ResolveReconciliation(run_id=run_id, decision=decision,
                                              effect_id=effect_id))

    @rule(i=st.integers(0, 2), data=st.data())
    def effect_outcome(self, i: int, data: st.DataObject) -> None:
        sid = SIDS[i]
        effects = [(r.run_id, eid) for r in (self.states[sid].runs or {}).values()
                   for eid in (r.effects or {})]
        if not effects:
            return
        run_id, effect_id = data.draw(st.sampled_from(effects))
        outcome = data.draw(st.sampled_from(["succeeded", "failed", "uncertain"]))
        self._do(sid, m.RecordEffectOutcome(run_id=run_id, effect_id=effect_id, outcome=outcome))

    @rule(i=st.integers(0, 2), roll=st.integers(0, 9))
    def delete(self, i: int, roll: int) -> None:
        if roll == 0:  # rare: a deleted schedule refuses most commands
            self._do(SIDS[i], m.DeleteSchedule())

    # -- invariants after every step ------------------------------------------------------

    @invariant()
    def fold_from_scratch_equals_live_state(self) -> None:
        for sid, state in self.states.items():
            assert fold(TENANT, sid, self.history[sid]).snapshot() == state.snapshot()

    @invariant()
    def a_repeated_trigger_answers_its_runs_last_state_held_or_not(self) -> None:
        for sid, state in self.states.items():
            if not state.exists:
                continue  # refused before the key is looked at
            for key, entry in (state.manual or {}).items():
                env = m.CommandEnvelope(command_id="again", type="TriggerRun", tenant=TENANT,
                                        principal="op", schedule_id=sid, issued_at=self.now,
                                        payload=m.TriggerRun(
                                            request_key=key,
                                            params=self.manual_params[(sid, key)]))
                again = decide(state, env, self.now)
                assert (again.status, again.events) == ("ok", [])
                assert again.body == {"run_id": entry.run_id,
                                      "state": self.last_seen[(sid, entry.run_id)]}

    @invariant()
    def guarded_overlap_never_has_two_active_runs(self) -> None:
        for sid, state in self.states.items():
            if self.overlap.get(sid) in GUARDED:
                active = state.active_runs()
                assert len(active) <= 1, f"{sid} overlap={self.overlap[sid]}: {len(active)} active"
                leased = [r for r in (state.runs or {}).values() if r.state == "LEASED"]
                assert len(leased) <= 1

    @invariant()
    def misfire_all_runs_every_instant_of_its_window(self) -> None:
        for (sid, revision), ran in self.ran.items():
            state = self.states.get(sid)
            if (state is None or state.revision != revision or state.policy is None
                    or state.policy.misfire != "all" or state.policy.kind not in ("every", "cron")
                    or (sid, revision) in self.bounded_skip or not ran):
                continue
            # nothing skipped for age, count or overlap: every instant of the window ran once
            assert ran == upcoming(state.trigger, ran[0] - US, len(ran))


DeciderMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestDeciderInvariants = DeciderMachine.TestCase
TestDeciderInvariants.pytestmark = [  # type: ignore[attr-defined]
    pytest.mark.long(10), pytest.mark.exhaustive]
