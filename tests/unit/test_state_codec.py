"""The state codec (``chronolog.commands.state_codec``): an exact, versioned round trip.

The random states come from the decider's stateful property (random specs, every command
kind, clock advances): after every step each live state is encoded, decoded, and the
decoded copy *replaces* the live one — so besides "equal in every field" the decider's own
invariants (fold from scratch == live, fences, occurrence keys, ...) keep checking that a
decoded state behaves exactly like the original.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from chronolog.commands import state as st
from chronolog.commands import state_codec as sc
from chronolog.commands.aggregate import TenantContext
from chronolog.commands.decider import decide, evolve
from chronolog.commands.quota import QuotaState, decide_quota, evolve_quota
from chronolog.commands.state import QuotaWait, Run, ScheduleState, initial_state
from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.ids import calendar_id, limit_id
from support.decider import T0, Story, complete, envelope, spec
from support.states import every_field
from unit.decider.test_invariants import DeciderMachine


def shapes_of(*states: ScheduleState) -> dict[str, m.ScheduleSpec]:
    out = {}
    for s in states:
        if s.policy is not None:
            h, shape = sc.decode_shape(sc.shape_of(s.policy)[1])
            out[h] = shape
    return out


def round_trip(s: ScheduleState, fresh: bool = False) -> ScheduleState:
    data = sc.encode_schedule(s)
    if fresh:  # as in another process: no policy interned yet
        st._POLICIES.clear()
        st._BY_IDENTITY.clear()
    decoded = sc.decode_schedule(data, shapes_of(s))
    assert every_field(decoded) == every_field(s)
    assert sc.encode_schedule(decoded) == data  # nothing lost that the encoding holds
    return decoded


class RoundTripMachine(DeciderMachine):
    """The decider's machine, with every live state replaced by its decoded copy."""

    @invariant()
    def a_decoded_state_replaces_the_live_one(self) -> None:
        for sid, state in list(self.states.items()):
            self.states[sid] = round_trip(state)


RoundTripMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestRoundTripOfRandomStates = RoundTripMachine.TestCase
TestRoundTripOfRandomStates.pytestmark = [pytest.mark.exhaustive]  # type: ignore[attr-defined]


def test_a_state_with_every_optional_part_round_trips() -> None:
    s = Story().create(effects=({"kind": "email", "destination": "d-email"},), max_count=9,
                       start_deadline=30.0)
    occ = s.materialize(T0 + timedelta(seconds=60))
    c = s.claim(occ[0].run_id, T0 + timedelta(seconds=61))
    s.given(complete(c), T0 + timedelta(seconds=62))
    s.given(m.TriggerRun(request_key="manual-1", params={"p": [1, 2.5, None, "x"]}),
            T0 + timedelta(seconds=63))
    s.given(m.PauseSchedule(), T0 + timedelta(seconds=64))
    st = s.state
    assert st.manual and st.runs and st.paused_at is not None
    assert any(r.effects for r in st.runs.values())
    decoded = round_trip(st)
    assert decoded.runs is not None
    manual = next(r for r in decoded.runs.values() if r.trigger == "manual")
    assert manual.job.params["p"] == [1, 2.5, None, "x"]
    assert manual.job != decoded.policy.job  # type: ignore[union-attr]  # its own job, kept


def test_a_create_waiting_for_its_quota_slot_round_trips() -> None:
    st = initial_state("acme", "s1")
    quota = TenantContext(max_schedules=3)
    dec = decide(st, envelope(m.CreateSchedule(spec=spec(), request_key="k")), T0, quota)
    assert any(isinstance(e, m.ScheduleCreationHeld) for e in dec.events)
    for e in dec.events:
        evolve(st, e)
    assert isinstance(st.quota, QuotaWait)
    round_trip(st)


def test_a_quota_aggregate_round_trips_in_order() -> None:
    q = QuotaState("acme")
    for i, sid in enumerate(["b", "a", "c"]):
        env = m.CommandEnvelope(
            command_id=f"r{i}", type="ReserveQuotaSlot", tenant="acme", principal="processor",
            schedule_id="@quota", issued_at=T0,
            payload=m.ReserveQuotaSlot(schedule_id=sid, create_command_id=f"c-{sid}"))
        for e in decide_quota(q, env, T0, 10).events:
            evolve_quota(q, e)
    confirm = m.CommandEnvelope(
        command_id="x", type="ConfirmQuotaSlot", tenant="acme", principal="processor",
        schedule_id="@quota", issued_at=T0,
        payload=m.ConfirmQuotaSlot(schedule_id="a", create_command_id="c-a"))
    for e in decide_quota(q, confirm, T0, 10).events:
        evolve_quota(q, e)
    back = sc.decode_quota(sc.encode_quota(q))
    assert back.tenant == "acme"
    assert list(back.slots.items()) == list(q.slots.items())
    assert back.slots["a"][1] is None and back.slots["b"][1] is not None


def test_a_concurrency_keys_permits_and_a_waiting_runs_request_round_trip() -> None:
    key = limit_id("shared")
    q = QuotaState("acme", key)
    for i in range(3):  # limit 2: two held, one in line
        env = m.CommandEnvelope(
            command_id=f"r{i}", type="AcquirePermit", tenant="acme", principal="processor",
            schedule_id=key, issued_at=T0,
            payload=m.AcquirePermit(key="shared", run_id=f"run{i}", schedule_id=f"s{i}",
                                    ask=f"a{i}", limit=2))
        for e in decide_quota(q, env, T0, None).events:
            evolve_quota(q, e)
    back = sc.decode_quota(sc.encode_quota(q))
    assert (back.schedule_id, back.key, back.holders, back.waiting) == (
        key, "shared", q.holders, q.waiting)
    assert list(back.holders) == ["run0", "run1"] and back.waiting[0][0] == "run2"
    s = Story().create(concurrency={"key": "k-{n}", "limit": 1})
    s.given(m.Tick(), T0 + timedelta(seconds=60))
    decoded = sc.decode_schedule(sc.encode_schedule(s.state), shapes_of(s.state))
    assert decoded.snapshot() == s.state.snapshot()
    (run,) = (decoded.runs or {}).values()
    assert (run.concurrency, run.permitted) == (("k-1", 1), False) and run.permit is not None


def test_a_schedules_calendar_copies_and_a_calendars_own_state_round_trip() -> None:
    holidays = CalendarSpec.model_validate({
        "timezone": "America/New_York", "dates": ["2026-12-25"],
        "ranges": [{"from": "2026-12-24", "to": "2026-12-26", "timezone": "UTC"}],
        "windows": [{"days": ["sat", "sun"], "start": "22:00", "end": "06:00"}]})
    s = Story().create(exclude=["hol", "maint"])
    s.given(envelope(m.CopyCalendar(name="hol", revision=3, spec=holidays),
                     principal="processor", command_id="copy-1"), T0)
    decoded = sc.decode_schedule(sc.encode_schedule(s.state), shapes_of(s.state))
    assert decoded.calendars == s.state.calendars and decoded.snapshot() == s.state.snapshot()
    assert [(c.name, c.received) for c in decoded.calendars or ()] == [("hol", True),
                                                                        ("maint", False)]
    home = QuotaState("acme", calendar_id("hol"))
    for i, payload in enumerate((m.PutCalendar(name="hol", spec=holidays),
                                 m.SubscribeCalendar(name="hol", schedule_id="s1"))):
        env = m.CommandEnvelope(command_id=f"c{i}", type=payload.type, tenant="acme",
                                principal="processor", schedule_id=home.schedule_id,
                                issued_at=T0, payload=payload)
        for e in decide_quota(home, env, T0, None).events:
            evolve_quota(home, e)
    back = sc.decode_quota(sc.encode_quota(home))
    assert back.calendar == home.calendar and back.schedule_id == home.schedule_id
    assert back.calendar is not None and back.calendar.subscribers == {"s1"}


def test_a_backfilled_schedules_requests_and_ranges_round_trip() -> None:
    s = Story().create(every=3600.0)
    for key, back in (("bf-1", 3), ("bf-2", 6)):
        s.given(m.BackfillSchedule(request_key=key, start=T0 - timedelta(hours=back),
                                   end=T0 - timedelta(hours=back - 2), overlap="allow"),
                T0 + timedelta(seconds=5))
    decoded = sc.decode_schedule(sc.encode_schedule(s.state), shapes_of(s.state))
    assert decoded.backfills == s.state.backfills and decoded.snapshot() == s.state.snapshot()
    assert s.state.backfills is not None and len(s.state.backfills.ranges) == 2
    plain = Story().create()
    assert len(orjson.loads(sc.encode_schedule(plain.state))) == 20  # no backfill: no element


def test_the_trigger_of_a_decoded_state_is_compiled_when_first_used() -> None:
    s = Story().create()
    decoded = round_trip(s.state)
    assert decoded.trigger == s.state.trigger
    assert decoded.trigger.next_after(T0) == s.state.trigger.next_after(T0)


def test_a_spec_is_decoded_to_the_policy_a_fold_gives() -> None:
    for overrides in ({}, {"cron": "0 9 * * 1-5", "timezone": "America/New_York"},
                      {"at": T0 + timedelta(hours=1)}, {"delay": 30.0},
                      {"job": {"type": "report", "params": {"deep": {"a": [1, {"b": 2}]}}}},
                      {"job": {"type": "report", "params": {}}}):
        state = Story().create(**overrides).state
        assert state.policy is not None
        decoded = round_trip(state, fresh=True)  # built from its shape and its params
        assert decoded.policy is not None
        assert decoded.policy.spec == state.policy.spec
        assert decoded.policy.spec_hash == st.spec_hash(decoded.policy.spec)
        assert decoded.policy.job == state.policy.job


def test_schedules_that_differ_in_their_params_share_one_shape() -> None:
    a = Story(schedule_id="a").create(job={"type": "report", "params": {"customer": 1}}).state
    b = Story(schedule_id="b").create(job={"type": "report", "params": {"customer": 2}}).state
    assert a.policy is not None and b.policy is not None
    assert sc.shape_of(a.policy) == sc.shape_of(b.policy)
    assert a.policy.spec_hash != b.policy.spec_hash
    c = Story(schedule_id="c").create(lease=45.0).state
    assert c.policy is not None and sc.shape_of(c.policy)[0] != sc.shape_of(a.policy)[0]


def test_schedules_that_differ_in_their_own_anchor_start_and_end_share_one_shape() -> None:
    # given schedules whose specs differ only in the instants each set for itself
    states = [Story(schedule_id=f"s{i}").create(
        anchor=T0 + timedelta(minutes=i), start=T0 + timedelta(hours=i),
        end=T0 + timedelta(days=30 + i)).state for i in range(3)]
    plain = Story(schedule_id="plain").create().state
    pols = [s.policy for s in states]
    assert all(p is not None for p in pols) and plain.policy is not None
    # then they share one shape, the one of a spec without them
    assert len({sc.shape_of(p) for p in pols if p is not None}) == 1
    assert sc.shape_of(pols[0])[0] == sc.shape_of(plain.policy)[0]  # type: ignore[arg-type]
    # and each decodes, in a fresh process, to its own exact spec
    for s in states:
        decoded = round_trip(s, fresh=True)
        assert decoded.policy is not None and s.policy is not None
        assert decoded.policy.spec == s.policy.spec
        assert decoded.policy.spec_hash == st.spec_hash(decoded.policy.spec)


def test_a_state_whose_own_fields_are_not_instants_or_not_its_own_is_refused() -> None:
    state = Story().create(start=T0 + timedelta(hours=1)).state
    assert state.policy is not None
    body = orjson.loads(sc.encode_schedule(state))
    shapes = shapes_of(state)
    for own, why in (({"start": "soon"}, "no instants"), ({"lease": 3}, "own fields"),
                     ({}, "own fields"), ("x", "own fields")):
        st._POLICIES.clear()
        body[4] = [*body[4][:3], own]
        with pytest.raises(sc.StateDecodeError, match=why):
            sc.decode_schedule(body, shapes)


def test_a_shape_whose_stored_hash_is_not_its_own_is_refused() -> None:
    state = Story().create().state
    assert state.policy is not None
    h, raw = orjson.loads(sc.shape_of(state.policy)[1])
    raw["lease"] = 31.0
    with pytest.raises(sc.StateDecodeError, match="hash"):
        sc.decode_shape(orjson.dumps([h, raw]))


def test_a_state_naming_a_shape_that_is_not_stored_is_refused() -> None:
    state = Story().create(lease=44.0).state
    data = sc.encode_schedule(state)
    st._POLICIES.clear()
    with pytest.raises(sc.StateDecodeError, match="not stored"):
        sc.decode_schedule(data, {})


def test_bytes_that_are_no_state_are_refused() -> None:
    for data in (b"not json", b"[1, 2]", b"{}", orjson.dumps(["a"] * 20)):
        with pytest.raises(sc.StateDecodeError):
            sc.decode_schedule(data, {})


def test_a_draft_is_not_encoded() -> None:
    st = Story().create().state
    with pytest.raises(ValueError, match="draft"):
        sc.encode_schedule(st.draft())


def test_an_older_version_is_refused_unless_an_upcaster_is_registered() -> None:
    st = Story().create().state
    body = orjson.loads(sc.encode_schedule(st))
    with pytest.raises(sc.StateDecodeError, match="no upcaster"):
        sc.upcast_state("schedule", body, 0)
    with pytest.raises(sc.StateDecodeError, match="newer"):
        sc.upcast_state("schedule", body, sc.STATE_VERSION + 1)
    seen: list[int] = []

    def step(b: list[Any], v: int) -> list[Any]:
        seen.append(v)
        return b

    registered = dict(sc._UPCASTERS)
    try:
        for v in range(sc.STATE_VERSION):
            sc.register_state_upcaster("schedule", v)(lambda b, v=v: step(b, v))
        assert sc.upcast_state("schedule", body, 0) == body
        assert seen == list(range(sc.STATE_VERSION))
    finally:
        sc._UPCASTERS.clear()
        sc._UPCASTERS.update(registered)


# The slots each state version encodes. A change to ScheduleState, Run or QuotaState must
# come with a new STATE_VERSION (and the codec's layout for it): old snapshots are then
# ignored, never misread. Add the new version's line here.
LAYOUTS = {
    1: {
        "ScheduleState": ("_trigger", "anchor", "count", "created_at", "created_hash", "done",
                          "fence", "last_scheduled_at", "manual", "next_due_at",
                          "next_run_at", "owned", "paused_at", "pending", "policy", "quota",
                          "request_key", "revision", "runs", "schedule_id", "status",
                          "tenant"),
        "Run": ("age_base", "attempt", "attempt_base", "cancel_requested", "checksum",
                "claimed", "due_at", "effects", "fence", "job", "lease_until", "priority",
                "reconcile", "resource_class", "result", "result_fence", "retry_at",
                "revision", "run_id", "scheduled_at", "start_deadline_at", "state", "trigger",
                "worker_id"),
        "QuotaState": ("slots", "tenant"),
    },
}
# version 2: the same slots; a manual key's entry (``state.Manual``) gained its run's final
# state
LAYOUTS[2] = LAYOUTS[1]
# version 3: a run's concurrency key and permit; a concurrency key's permits (QuotaState)
LAYOUTS[3] = {**LAYOUTS[2],
              "Run": (*LAYOUTS[2]["Run"], "concurrency", "permit", "permitted"),
              "QuotaState": (*LAYOUTS[2]["QuotaState"], "holders", "key", "schedule_id",
                             "waiting")}
# version 4: a schedule's backfills
LAYOUTS[4] = {**LAYOUTS[3], "ScheduleState": (*LAYOUTS[3]["ScheduleState"], "backfills")}
# version 5: the copies of the calendars a schedule names; a calendar's own state
LAYOUTS[5] = {**LAYOUTS[4], "ScheduleState": (*LAYOUTS[4]["ScheduleState"], "calendars"),
              "QuotaState": (*LAYOUTS[4]["QuotaState"], "calendar")}


def test_the_state_layout_is_the_one_of_its_version() -> None:
    now = {
        "ScheduleState": tuple(sorted(ScheduleState.__slots__)),
        "Run": tuple(sorted(Run.__slots__)),
        "QuotaState": tuple(sorted(QuotaState.__slots__)),
    }
    expected = {k: tuple(sorted(v)) for k, v in LAYOUTS[sc.STATE_VERSION].items()}
    assert now == expected, "the states changed: bump STATE_VERSION (state_codec.py)"


def test_a_version_1_state_is_upcast_and_a_forgotten_manual_runs_state_is_unknown() -> None:
    s = Story().create()

    def run(key: str, n: int, finish: bool = True) -> str:
        run_id: str = s.given(m.TriggerRun(request_key=key), T0 + timedelta(seconds=n)
                              ).body["run_id"]
        if finish:
            c = s.claim(run_id, T0 + timedelta(seconds=n))
            s.given(complete(c), T0 + timedelta(seconds=n))
        return run_id

    paid, later, held = run("pay-run", 1), run("later-run", 2), run("held-run", 3, False)
    body = orjson.loads(sc.encode_schedule(s.state))
    body[18] = [entry[:3] for entry in body[18]]  # version 1: no final states
    upcast = sc.decode_schedule(sc.upcast_state("schedule", body, 1), shapes_of(s.state))
    assert [v.final for v in (upcast.manual or {}).values()] == [None, None, None]

    def answer(key: str) -> Any:
        return decide(upcast, envelope(m.TriggerRun(request_key=key)), T0).body

    # forgotten before version 2 recorded it: unknown, never guessed; held ones answer
    assert answer("pay-run") == {"run_id": paid, "state": None}
    assert answer("later-run") == {"run_id": later, "state": "SUCCEEDED"}
    assert answer("held-run") == {"run_id": held, "state": "READY"}
    s.state = upcast
    c = s.claim(held, T0 + timedelta(seconds=4))
    s.given(complete(c), T0 + timedelta(seconds=4))  # "later-run" leaves: recorded now
    assert (s.state.manual or {})["later-run"].final == "SUCCEEDED"
    assert answer("later-run") == {"run_id": later, "state": "SUCCEEDED"}
