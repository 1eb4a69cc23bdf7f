"""The aggregate protocol (``chronolog.commands.aggregate``): the schedule, a tenant's quota
and a partition's routing view each decide their own commands and fold their own events;
every command and event of the log belongs to one of them; a command's schedule ID names the
aggregate that decides it; a decision's draft folds each event as it is emitted.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import BaseModel

from chronolog.commands.aggregate import OPEN_TENANT, Aggregate, Draft, TenantContext
from chronolog.commands.registry import PartitionAggregates
from chronolog.commands.routing import table_of
from chronolog.commands.state_codec import STATE_VERSION, StateDecodeError
from chronolog.domain import messages as m
from chronolog.domain.ids import QUOTA_ID, ROUTING_ID
from support.decider import GivenWhenThen

AGGREGATES = PartitionAggregates.of_partition(1, table_of([2]))
ALL: list[Aggregate[Any, Any, Any]] = [AGGREGATES.schedule, AGGREGATES.quota,
                                       AGGREGATES.routing]


def _union(alias: Any) -> set[type]:
    return set(get_args(alias))


def _messages(kind: str) -> set[type]:
    """Every message model ``domain.messages`` defines whose ``type`` is its own name (the
    payloads of commands and events), of ``kind``: events (the models built on the base of
    the events) or commands (the others) — found in the module, not in the unions."""
    event_base = m.ScheduleCreated.__base__
    found = {c for name, c in vars(m).items()
             if isinstance(c, type) and issubclass(c, BaseModel) and "type" in c.model_fields
             and c.model_fields["type"].default == name}
    events = {c for c in found if issubclass(c, event_base)}
    return events if kind == "event" else found - events


def test_every_event_of_the_log_belongs_to_an_aggregate_and_only_moves_are_shared() -> None:
    every = _messages("event")
    assert every == set(m.EVENT_TYPES)  # the log's union has every event the module defines
    schedule, quota, routing = (_union(m.ScheduleEvent), _union(m.QuotaEvent),
                                _union(m.RoutingEvent))
    assert schedule | quota | routing == every
    assert schedule & quota == {m.KeyMovedOut, m.KeyMovedIn}
    assert not routing & (schedule | quota)
    for event_type in every:
        owners = [a.kind for a in ALL if a.owns(event_type.model_construct())]
        assert owners, event_type
        assert len(owners) == 1 or event_type in (m.KeyMovedOut, m.KeyMovedIn), owners


def test_every_command_is_accepted_by_the_aggregate_it_is_addressed_to() -> None:
    every = _messages("command")
    assert every == set(m.COMMAND_TYPES)
    schedule, quota, routing = (_union(m.ScheduleCommand), _union(m.QuotaCommand),
                                _union(m.RoutingCommand))
    assert schedule | quota | routing == every
    for command_type in every:
        payload = command_type.model_construct()
        accepted = {a.kind for a in ALL if a.accepts(payload)}
        assert accepted == {kind for kind, union in
                            (("schedule", schedule), ("quota", quota), ("routing", routing))
                            if command_type in union}


@pytest.mark.parametrize(("schedule_id", "kind"), [
    ("nightly-report", "schedule"), (QUOTA_ID, "quota"), (ROUTING_ID, "routing"),
    ("@quota-not-quite", "schedule"),
])
def test_a_command_is_decided_by_the_aggregate_its_schedule_id_names(
        schedule_id: str, kind: str) -> None:
    assert AGGREGATES.kind_of(schedule_id) == kind


def test_a_command_of_another_aggregate_is_refused_as_data(gwt: GivenWhenThen) -> None:
    """Given each aggregate's initial state, when it is sent a command of another kind,
    then it answers with a refusal naming the field, emits nothing and raises nothing."""
    foreign = {
        "schedule": m.ReserveQuotaSlot(schedule_id="s1", create_command_id="c1"),
        "quota": m.CreateSchedule(spec=gwt.spec()),
        "routing": m.PauseSchedule(),
    }
    for agg in ALL:
        state = agg.initial("acme", "s1")
        env = gwt.envelope(foreign[agg.kind], principal="processor")
        dec = agg.decide(state, env, gwt.T0, OPEN_TENANT)
        assert not dec.ok and dec.events == [] and dec.field, (agg.kind, dec)


def test_an_initial_state_has_no_timer() -> None:
    for agg in ALL:
        assert agg.wakeup(agg.initial("acme", "s1")) is None, agg.kind


def test_a_routing_view_and_a_schedule_not_held_here_never_move() -> None:
    for agg in (AGGREGATES.schedule, AGGREGATES.routing):
        dec = agg.move_out(agg.initial("acme", "s1"), 0, 2, 1)
        assert not dec.ok and dec.events == [] and dec.sends == [], agg.kind


def test_a_moved_state_decodes_to_what_was_encoded(gwt: GivenWhenThen) -> None:
    """Given a schedule created, a quota with a reserved slot and a routing view that learned
    a second version, when each is encoded as a move carries it, then it decodes equal."""
    schedule = AGGREGATES.schedule
    st = schedule.initial("acme", "s1")
    for ev in schedule.decide(st, gwt.envelope(m.CreateSchedule(spec=gwt.spec())), gwt.T0,
                              OPEN_TENANT).events:
        schedule.evolve(st, ev)
    quota = AGGREGATES.quota
    qs = quota.initial("acme", QUOTA_ID)
    reserve = gwt.envelope(m.ReserveQuotaSlot(schedule_id="s1", create_command_id="c1"),
                           schedule_id=QUOTA_ID, principal="processor")
    for ev in quota.decide(qs, reserve, gwt.T0, TenantContext(max_schedules=3)).events:
        quota.evolve(qs, ev)
    routing = AGGREGATES.routing
    view = routing.evolve(routing.initial("", ROUTING_ID), m.RoutingVersionAdded(
        partitions=(2, 4)))
    for agg, state in ((schedule, st), (quota, qs), (routing, view)):
        text, shape = agg.encode(state)
        again = agg.decode(text, shape, STATE_VERSION)
        assert agg.encode(again) == (text, shape), agg.kind
    assert quota.wakeup(qs) is not None  # the reservation's end is its timer
    with pytest.raises(StateDecodeError):
        routing.decode("not a view", None, STATE_VERSION)


def test_a_draft_folds_each_event_as_it_is_emitted() -> None:
    """Given a draft over the routing view (immutable states) and one over a tenant's quota
    (states changed in place), when events are emitted, then the draft's state is the fold
    of the events so far, and the original state is untouched."""
    routing = AGGREGATES.routing
    view = routing.initial("", ROUTING_ID)
    d: Draft[Any, Any] = Draft(view, routing.evolve)
    d.emit(m.RoutingVersionAdded(partitions=(2, 3)))
    assert [v.partitions for v in d.state.table.versions] == [2, 3]
    assert [v.partitions for v in view.table.versions] == [2]
    d.emit(m.HandedOver(version=2))
    assert d.state.routing.serves.version == 2
    dec = d.decision(body={"moved": 0})
    assert dec.ok and [e.type for e in dec.events] == ["RoutingVersionAdded", "HandedOver"]
    assert dec.body == {"moved": 0}
