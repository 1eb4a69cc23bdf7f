"""Decider rules of moving a key to another partition (docs/design.md §18): the handover's
move-out of one schedule or tenant quota, the adopt command that installs it on its new home,
and a partition's routing view (``chronolog.commands.routing``).

Given (history) / when (command) / then (events, commands sent, status). The property test
at the end moves schedules at random points of random command streams.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from chronolog.commands.aggregate import Decision
from chronolog.commands.decider import decide, evolve, fold, held, move_out
from chronolog.commands.quota import QuotaState, decide_quota, evolve_quota, move_out_quota
from chronolog.commands.routing import (
    RoutingView,
    decide_routing,
    decode_view,
    encode_view,
    evolve_routing,
)
from chronolog.commands.state import ScheduleState, initial_state
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.ids import QUOTA_ID, ROUTING_ID, ROUTING_TENANT, limit_id
from chronolog.domain.routing import RoutingTable
from support.decider import GivenWhenThen
from unit.decider.test_invariants import TENANT, DeciderMachine

# ------------------------------------------------------------------------- helpers


def _adopt_envelope(gwt: GivenWhenThen, dec: Decision, principal: str = "processor",
                    ) -> m.CommandEnvelope:
    """The adopt command a move-out sends, as the new home reads it off the log."""
    (send,) = dec.sends
    env = gwt.envelope(send.payload, schedule_id=send.schedule_id, principal=principal,
                       command_id=send.command_id)
    return codec.decode_command(codec.encode_command(env))


def _running(gwt: GivenWhenThen) -> Any:
    """A schedule with a manual run claimed (fence 1) and a request key remembered."""
    s = gwt.story().create()
    trig = s.given(m.TriggerRun(request_key="rk-1"), gwt.T0 + gwt.sec(1))
    run_id = trig.body["run_id"]
    s.claim(run_id, gwt.T0 + gwt.sec(2))
    return s, run_id


def _move(gwt: GivenWhenThen, state: ScheduleState) -> tuple[Decision, ScheduleState]:
    """Move ``state`` out (it is reset) and adopt it on a fresh partition: the decision of
    the move-out and the new home's state."""
    out = move_out(state, 3, 2, 1)
    assert out.ok, out.reason
    for e in out.events:
        evolve(state, e)
    new = initial_state(gwt.TENANT, state.schedule_id)
    adopted = gwt.when(new, _adopt_envelope(gwt, out), gwt.T0 + gwt.sec(3))
    assert adopted.ok, adopted.reason
    for e in adopted.events:
        evolve(new, e)
    return out, new


# ------------------------------------------------------------------ the schedule's move


def test_a_held_schedule_moves_out_with_an_adopt_command_carrying_its_whole_state(
    gwt: GivenWhenThen,
) -> None:
    s, _ = _running(gwt)
    before = s.state.snapshot()
    dec = move_out(s.state, 3, 2, 1)
    assert dec.ok and gwt.names(dec) == ["KeyMovedOut"]
    assert gwt.one(dec, m.KeyMovedOut) == m.KeyMovedOut(to_partition=3, version=2)
    assert s.state.snapshot() == before, "move_out changed its input state"
    (send,) = dec.sends
    assert send.partition == 3 and send.schedule_id == "s1"
    adopt = send.payload
    assert isinstance(adopt, m.AdoptKey)
    assert (adopt.kind, adopt.from_partition, adopt.version) == ("schedule", 1, 2)
    assert adopt.shape is not None and adopt.state


def test_a_schedule_never_held_here_does_not_move(gwt: GivenWhenThen) -> None:
    dec = move_out(initial_state(gwt.TENANT, "s1"), 3, 2, 1)
    assert dec.status == "not_found" and not dec.events and not dec.sends


def test_a_moved_out_schedule_holds_nothing_and_a_replay_agrees(gwt: GivenWhenThen) -> None:
    s, _ = _running(gwt)
    dec = move_out(s.state, 3, 2, 1)
    assert gwt.names(dec) == ["KeyMovedOut"]
    s.given_events(*dec.events)
    assert not held(s.state)
    assert s.state.snapshot() == initial_state(gwt.TENANT, "s1").snapshot()
    assert s.replayed().snapshot() == s.state.snapshot()


def test_an_adopted_schedule_is_installed_exactly_as_it_left(gwt: GivenWhenThen) -> None:
    s, _ = _running(gwt)
    before = s.state.snapshot()
    out, new = _move(gwt, s.state)
    assert new.snapshot() == before
    adopt = out.sends[0].payload
    moved_in = m.KeyMovedIn(kind=adopt.kind, state=adopt.state, shape=adopt.shape,
                            state_version=adopt.state_version,
                            from_partition=adopt.from_partition, version=adopt.version)
    # a fold of the new home from offset 0 installs it (the event read back off the log)
    stored = codec.decode_event(codec.encode_event_fields(
        "e-1", m.CURRENT_VERSION, "acme/s1", gwt.TENANT, "s1", gwt.T0, "c-1", moved_in))
    assert fold(gwt.TENANT, "s1", [stored.payload]).snapshot() == before


def test_fences_continue_and_request_keys_dedupe_after_a_move(gwt: GivenWhenThen) -> None:
    s, run_id = _running(gwt)
    fence = s.state.fence
    _, new = _move(gwt, s.state)
    again = gwt.when(new, m.TriggerRun(request_key="rk-1"), gwt.T0 + gwt.sec(4))
    assert again.ok and again.body["run_id"] == run_id and not again.events
    later = gwt.story()
    later.state = new
    expired = later.when(m.Tick(), gwt.T0 + timedelta(hours=1))  # the lease expires
    fences = [e.fence for e in gwt.all(expired, m.FenceAdvanced)]
    assert fences and min(fences) == fence + 1


def test_an_adopt_for_a_schedule_held_here_is_refused_as_data(gwt: GivenWhenThen) -> None:
    s, _ = _running(gwt)
    out = move_out(s.state, 3, 2, 1)
    other = gwt.story().create()
    dec = gwt.when(other.state, _adopt_envelope(gwt, out), gwt.T0)
    assert dec.status == "conflict" and not dec.events and not dec.sends


def test_only_the_processor_moves_a_schedule(gwt: GivenWhenThen) -> None:
    s, _ = _running(gwt)
    out = move_out(s.state, 3, 2, 1)
    dec = gwt.when(initial_state(gwt.TENANT, "s1"), _adopt_envelope(gwt, out, "mallory"),
                   gwt.T0)
    assert dec.status == "forbidden" and not dec.events


def test_an_adopted_state_of_another_schedule_or_that_does_not_decode_is_refused(
    gwt: GivenWhenThen,
) -> None:
    s, _ = _running(gwt)
    env = _adopt_envelope(gwt, move_out(s.state, 3, 2, 1))
    elsewhere = gwt.when(initial_state(gwt.TENANT, "s2"),
                         env.model_copy(update={"schedule_id": "s2"}), gwt.T0)
    assert elsewhere.status == "invalid" and not elsewhere.events
    broken = env.model_copy(update={"payload": env.payload.model_copy(
        update={"state": "[1, 2"})})
    dec = gwt.when(initial_state(gwt.TENANT, "s1"), broken, gwt.T0)
    assert dec.status == "invalid" and dec.field == "state" and not dec.events


def test_a_create_waiting_for_a_quota_slot_moves_with_its_wait(gwt: GivenWhenThen) -> None:
    s = gwt.story()
    env = gwt.envelope(m.CreateSchedule(spec=gwt.spec(), request_key="k"), command_id="c-9")
    held_create = s.when(env, gwt.T0, gwt.TenantContext(max_schedules=3))
    assert held_create.deferred and held(s.state)
    before = s.state.snapshot()
    wait = s.state.quota
    _, new = _move(gwt, s.state)
    assert new.snapshot() == before and new.quota == wait


# ---------------------------------------------------------------- the tenant quota's move


def _quota_with_slots(gwt: GivenWhenThen) -> QuotaState:
    qs = QuotaState(gwt.TENANT)
    for i, cid in enumerate(("c-1", "c-2")):
        env = gwt.envelope(m.ReserveQuotaSlot(schedule_id=f"s{i}", create_command_id=cid),
                           schedule_id=QUOTA_ID, principal="processor", command_id=f"q{i}")
        for e in decide_quota(qs, env, gwt.T0, 5).events:
            evolve_quota(qs, e)
    return qs


def test_a_tenant_quota_moves_with_its_slots(gwt: GivenWhenThen) -> None:
    qs = _quota_with_slots(gwt)
    slots = dict(qs.slots)
    out = move_out_quota(qs, 2, 2, 0)
    assert gwt.names(out) == ["KeyMovedOut"] and out.sends[0].partition == 2
    for e in out.events:
        evolve_quota(qs, e)
    assert qs.slots == {}
    new = QuotaState(gwt.TENANT)
    dec = decide_quota(new, _adopt_envelope(gwt, out), gwt.T0, 5)
    assert dec.ok and gwt.names(dec) == ["KeyMovedIn"]
    for e in dec.events:
        evolve_quota(new, e)
    assert new.slots == slots


def test_a_concurrency_keys_permits_move_with_their_holders_and_line(
        gwt: GivenWhenThen) -> None:
    """A key's aggregate (the quota's kind) moves as a quota does: the permits held and the
    requests waiting, in order, arrive whole, and a release there grants the next in line."""
    key = limit_id("shared")
    qs = QuotaState(gwt.TENANT, key)
    for run in ("r1", "r2", "r3"):
        env = gwt.envelope(m.AcquirePermit(key="shared", run_id=run, schedule_id=f"s-{run}",
                                           ask=f"a-{run}", limit=1),
                           schedule_id=key, principal="processor", command_id=f"q-{run}")
        for e in decide_quota(qs, env, gwt.T0, None).events:
            evolve_quota(qs, e)
    out = move_out_quota(qs, 2, 2, 0)
    assert out.sends[0].schedule_id == key
    new = QuotaState(gwt.TENANT, key)
    dec = decide_quota(new, _adopt_envelope(gwt, out), gwt.T0, None)
    assert dec.ok and gwt.names(dec) == ["KeyMovedIn"]
    for e in dec.events:
        evolve_quota(new, e)
    assert (new.key, new.holders, new.waiting) == ("shared", qs.holders, qs.waiting)
    release = gwt.envelope(m.ReleasePermit(key="shared", run_id="r1", schedule_id="s-r1",
                                           ask="a-r1"),
                           schedule_id=key, principal="processor", command_id="rel")
    granted = decide_quota(new, release, gwt.T0, None)
    assert gwt.names(granted) == ["PermitReleased", "PermitGranted"]
    assert gwt.one(granted, m.PermitGranted).run_id == "r2"


def test_an_adopt_for_a_quota_held_here_is_refused_as_data(gwt: GivenWhenThen) -> None:
    out = move_out_quota(_quota_with_slots(gwt), 2, 2, 0)
    dec = decide_quota(_quota_with_slots(gwt), _adopt_envelope(gwt, out), gwt.T0, 5)
    assert dec.status == "conflict" and not dec.events


# -------------------------------------------------------------- a partition's routing view


def _routing(gwt: GivenWhenThen, payload: Any, principal: str = "processor",
             ) -> m.CommandEnvelope:
    return m.CommandEnvelope(command_id="r-1", type=payload.type, tenant=ROUTING_TENANT,
                             principal=principal, schedule_id=ROUTING_ID, issued_at=gwt.T0,
                             payload=payload)


def _fold(view: RoutingView, dec: Decision) -> RoutingView:
    for e in dec.events:
        view = evolve_routing(view, e)
    return view


BEGIN = m.BeginHandover(partitions=(2, 4), to_version=2)


def test_begin_handover_on_a_partition_of_the_old_version_hands_over_and_tells_the_new_one(
    gwt: GivenWhenThen,
) -> None:
    view = RoutingView.initial(1, RoutingTable.initial(2))
    dec = decide_routing(view, _routing(gwt, BEGIN))
    assert gwt.names(dec) == ["RoutingVersionAdded", "HandedOver"]
    assert [(s.partition, s.payload) for s in dec.sends] == [
        (q, m.HandoverDone(version=2, sender=1, partitions=(2, 4))) for q in (0, 2, 3)]
    after = _fold(view, dec)
    assert after.routing is not None and after.routing.serves.version == 2
    assert after.routing.has_received(1)


def test_begin_handover_on_a_partition_the_new_version_adds_only_learns_it(
    gwt: GivenWhenThen,
) -> None:
    view = RoutingView.initial(3, RoutingTable.initial(2))
    assert view.routing is None
    dec = decide_routing(view, _routing(gwt, BEGIN))
    assert gwt.names(dec) == ["RoutingVersionAdded"] and not dec.sends
    after = _fold(view, dec)
    assert after.routing is not None and after.routing.serves.version == 2


def test_a_repeated_begin_handover_changes_nothing(gwt: GivenWhenThen) -> None:
    view = RoutingView.initial(0, RoutingTable.initial(2))
    view = _fold(view, decide_routing(view, _routing(gwt, BEGIN)))
    dec = decide_routing(view, _routing(gwt, BEGIN))
    assert dec.ok and not dec.events and not dec.sends


def test_a_begin_handover_with_another_table_is_refused(gwt: GivenWhenThen) -> None:
    view = RoutingView.initial(0, RoutingTable.initial(2))
    dec = decide_routing(view, _routing(gwt, m.BeginHandover(partitions=(3, 6),
                                                             to_version=2)))
    assert dec.status == "conflict" and not dec.events
    skip = decide_routing(view, _routing(gwt, m.BeginHandover(partitions=(2, 4, 8),
                                                              to_version=3)))
    assert skip.status == "conflict" and not skip.events  # version 2 first


def test_a_handover_done_is_recorded_once_even_before_the_version_is_known(
    gwt: GivenWhenThen,
) -> None:
    view = RoutingView.initial(3, RoutingTable.initial(2))
    done = _routing(gwt, m.HandoverDone(version=2, sender=1))
    view = _fold(view, decide_routing(view, done))
    assert view.early == {(2, 1)}
    assert not decide_routing(view, done).events
    view = _fold(view, decide_routing(view, _routing(gwt, BEGIN)))
    assert view.routing is not None and view.routing.has_received(1) and not view.early
    assert not decide_routing(view, done).events


def test_a_partition_a_version_adds_learns_it_from_the_first_handover_done(
    gwt: GivenWhenThen,
) -> None:
    view = RoutingView.initial(2, RoutingTable.initial(2))
    done = _routing(gwt, m.HandoverDone(version=2, sender=0, partitions=(2, 4)))
    dec = decide_routing(view, done)
    assert gwt.names(dec) == ["RoutingVersionAdded", "HandoverReceived"]
    view = _fold(view, dec)
    assert view.routing is not None and view.routing.serves.version == 2
    assert view.routing.has_received(0)
    assert not decide_routing(view, done).events
    other = _routing(gwt, m.HandoverDone(version=2, sender=1, partitions=(3, 6)))
    assert decide_routing(view, other).status == "conflict"


def test_only_the_processor_changes_the_routing(gwt: GivenWhenThen) -> None:
    view = RoutingView.initial(0, RoutingTable.initial(2))
    dec = decide_routing(view, _routing(gwt, BEGIN, principal="mallory"))
    assert dec.status == "forbidden" and not dec.events


def test_a_routing_view_survives_its_encoding(gwt: GivenWhenThen) -> None:
    for p in range(4):
        view = RoutingView.initial(p, RoutingTable.initial(2))
        assert decode_view(encode_view(view)) == view
        view = _fold(view, decide_routing(view, _routing(gwt, m.HandoverDone(version=2,
                                                                             sender=0))))
        view = _fold(view, decide_routing(view, _routing(gwt, BEGIN)))
        assert decode_view(encode_view(view)) == view


# --------------------------------------------------------------------- the property


class MovingMachine(DeciderMachine):
    """The decider's stateful machine with schedules moved to another partition at random
    points: the moved state decides exactly as a copy that never moved (same events, same
    state), fences keep increasing and no occurrence is accounted twice across the move
    (the machine's own checks), and a fold of the new home from offset 0 is the live state."""

    def __init__(self) -> None:
        super().__init__()
        self.unmoved: dict[str, ScheduleState] = {}
        self.version = 1

    def _do(self, sid: str, payload: Any) -> Decision:
        twin = self.unmoved.setdefault(sid, initial_state(TENANT, sid))
        env = m.CommandEnvelope(command_id=f"c{self.n + 1}", type=payload.type, tenant=TENANT,
                                principal="op", schedule_id=sid, issued_at=self.now,
                                payload=payload)
        expected = decide(twin, env, self.now)
        for e in expected.events:
            evolve(twin, e)
        decision = super()._do(sid, payload)
        assert (decision.status, decision.events) == (expected.status, expected.events)
        return decision

    @rule(i=st.integers(0, 2))
    def move(self, i: int) -> None:
        sid = ("alpha", "beta", "gamma")[i]
        state = self.states[sid]
        self.version += 1
        out = move_out(state, 1, self.version, 0)
        if not held(state):
            assert out.status == "not_found"
            return
        for e in out.events:
            evolve(state, e)
        left = fold(TENANT, sid, [*self.history[sid], *out.events])
        assert left.snapshot() == initial_state(TENANT, sid).snapshot()
        (send,) = out.sends
        env = codec.decode_command(codec.encode_command(m.CommandEnvelope(
            command_id=send.command_id, type="AdoptKey", tenant=TENANT, principal="processor",
            schedule_id=sid, issued_at=self.now, payload=send.payload)))
        new = initial_state(TENANT, sid)
        dec = decide(new, env, self.now)
        assert dec.ok and [type(e) for e in dec.events] == [m.KeyMovedIn], dec.reason
        for e in dec.events:
            evolve(new, e)
        assert decide(new, env, self.now).status == "conflict"  # never adopted twice
        self.states[sid] = new
        self.history[sid] = list(dec.events)  # the new home's log of the key

    @invariant()
    def a_moved_state_is_the_one_never_moved(self) -> None:
        for sid, state in self.states.items():
            assert state.snapshot() == self.unmoved[sid].snapshot()


MovingMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TestMovingASchedule = MovingMachine.TestCase
TestMovingASchedule.pytestmark = [pytest.mark.exhaustive]  # type: ignore[attr-defined]
