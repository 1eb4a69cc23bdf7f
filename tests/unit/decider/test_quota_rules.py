"""Decider rules of the tenant quota: a create of a tenant with ``max_schedules`` is held
until the tenant's quota aggregate reserves a slot for it (reserve -> create -> confirm), a
slot is given back when the create is refused after all, when the schedule stops being live,
or when its reservation ends unconfirmed; at most ``max_schedules`` slots are ever held.

Given (history) / when (command) / then (events, commands sent, status).
"""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

from chronolog.commands.aggregate import Decision
from chronolog.commands.decider import QUOTA_EXPIRY_MARGIN
from chronolog.commands.quota import (
    RESERVATION_TTL,
    QuotaState,
    decide_quota,
    evolve_quota,
    quota_wakeup,
)
from chronolog.commands.state import QuotaWait
from chronolog.domain import messages as m
from chronolog.domain.ids import QUOTA_ID
from support.decider import GivenWhenThen

QUOTA = 10


def _quota(gwt: GivenWhenThen, max_schedules: int | None = QUOTA) -> object:
    return gwt.TenantContext(max_schedules=max_schedules)


def _processor(gwt: GivenWhenThen, payload: object, schedule_id: str = "s1",
               command_id: str = "quota:x") -> m.CommandEnvelope:
    return gwt.envelope(payload, schedule_id=schedule_id, principal="processor",
                        command_id=command_id)


def _held(gwt: GivenWhenThen, command_id: str = "c-1", **spec: Any) -> Any:
    """A story whose create is held for a slot (the create's command ID ``command_id``)."""
    s = gwt.story()
    env = gwt.envelope(m.CreateSchedule(spec=gwt.spec(**spec), request_key="k"),
                       command_id=command_id).model_copy(update={"reply_to": "client-7"})
    d = s.when(env, gwt.T0, _quota(gwt))
    assert d.deferred and gwt.names(d) == ["ScheduleCreationHeld"]
    return s


def _answer(gwt: GivenWhenThen, granted: bool, until: datetime | None = None,
            reason: str = "", command_id: str = "c-1") -> m.CommandEnvelope:
    return _processor(gwt, m.AnswerQuotaSlot(create_command_id=command_id, granted=granted,
                                             expires_at=until, reason=reason))


# --------------------------------------------------------------------- the schedule's side


def test_create_of_a_tenant_with_a_quota_is_held_and_asks_for_a_slot(gwt: GivenWhenThen) -> None:
    d = gwt.when(gwt.given(), gwt.envelope(m.CreateSchedule(spec=gwt.spec())), gwt.T0,
                 _quota(gwt))
    assert (d.status, d.deferred, gwt.names(d)) == ("ok", True, ["ScheduleCreationHeld"])
    [send] = d.sends
    assert send.schedule_id == QUOTA_ID
    assert send.payload == m.ReserveQuotaSlot(schedule_id="s1", create_command_id="c-1")


def test_create_of_a_tenant_without_a_quota_is_created_at_once_with_no_saga(
    gwt: GivenWhenThen,
) -> None:
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec()), gwt.T0, _quota(gwt, None))
    assert (d.status, d.deferred, d.sends, gwt.names(d)) == ("ok", False, [],
                                                            ["ScheduleCreated"])


def test_a_create_failing_its_other_checks_is_refused_at_once_and_asks_for_no_slot(
    gwt: GivenWhenThen,
) -> None:
    tenant = gwt.TenantContext(max_schedules=QUOTA, allowed_jobs=frozenset({"etl"}))
    d = gwt.when(gwt.given(), m.CreateSchedule(spec=gwt.spec()), gwt.T0, tenant)
    assert (d.status, d.events, d.sends, d.deferred) == ("forbidden", [], [], False)


def test_a_granted_slot_creates_the_schedule_confirms_it_and_answers_the_held_create(
    gwt: GivenWhenThen,
) -> None:
    s = _held(gwt)
    d = s.when(_answer(gwt, True, gwt.T0 + RESERVATION_TTL), gwt.T0 + gwt.sec(1), _quota(gwt))
    assert (d.status, d.answers, gwt.names(d)) == ("ok", "c-1", ["ScheduleCreated"])
    assert d.answers_client == "client-7"  # the client that sent the held create
    assert d.body["revision"] == 1
    [send] = d.sends
    assert (send.schedule_id, send.payload) == (QUOTA_ID, m.ConfirmQuotaSlot(
        schedule_id="s1", create_command_id="c-1"))
    assert s.state.quota == "c-1"  # the schedule holds the slot reserved for that create


def test_a_refused_slot_answers_the_held_create_with_quota_and_gives_nothing_back(
    gwt: GivenWhenThen,
) -> None:
    s = _held(gwt)
    d = s.when(_answer(gwt, False, reason="tenant has 10 active schedules (max 10)"),
               gwt.T0 + gwt.sec(1), _quota(gwt))
    assert (d.status, d.answers, d.answers_client, d.sends) == ("quota", "c-1", "client-7", [])
    assert d.reason == "tenant has 10 active schedules (max 10)"
    assert gwt.one(d, m.ScheduleCreationRefused).release is False
    assert (s.state.status, s.state.quota) == ("NEW", None)  # the ID is free again


def test_a_granted_slot_the_create_can_no_longer_use_is_released(gwt: GivenWhenThen) -> None:
    s = _held(gwt, at=gwt.T0 + gwt.sec(2), every=None, misfire={"grace": 5.0})
    # the slot comes after the one-shot's instant has passed
    d = s.when(_answer(gwt, True, gwt.T0 + RESERVATION_TTL), gwt.T0 + gwt.sec(50), _quota(gwt))
    assert (d.status, d.field, d.answers) == ("invalid", "at", "c-1")
    assert gwt.one(d, m.ScheduleCreationRefused).release is True
    [send] = d.sends
    assert send.payload == m.ReleaseQuotaSlot(schedule_id="s1", create_command_id="c-1",
                                              reason="rejected")


def test_a_slot_granted_too_close_to_its_reservation_end_is_released(
    gwt: GivenWhenThen,
) -> None:
    s = _held(gwt)
    until = gwt.T0 + RESERVATION_TTL
    d = s.when(_answer(gwt, True, until), until - QUOTA_EXPIRY_MARGIN, _quota(gwt))
    assert (d.status, d.answers) == ("quota", "c-1")
    assert [type(x.payload).__name__ for x in d.sends] == ["ReleaseQuotaSlot"]
    assert s.state.status == "NEW"


def test_a_resent_held_create_is_answered_once_and_asks_for_no_second_slot(
    gwt: GivenWhenThen,
) -> None:
    s = _held(gwt)
    again = s.when(gwt.envelope(m.CreateSchedule(spec=gwt.spec(), request_key="k")),
                   gwt.T0 + gwt.sec(1), _quota(gwt))
    assert (again.deferred, again.events, again.sends) == (True, [], [])
    other = s.when(gwt.envelope(m.CreateSchedule(spec=gwt.spec(), request_key="k"),
                                command_id="c-2"), gwt.T0 + gwt.sec(1), _quota(gwt))
    assert (other.status, other.field, other.sends) == ("conflict", "scheduleId", [])


def test_an_answer_for_another_create_is_given_back_unused(gwt: GivenWhenThen) -> None:
    s = _held(gwt)
    d = s.when(_answer(gwt, True, gwt.T0 + RESERVATION_TTL, command_id="c-old"),
               gwt.T0 + gwt.sec(1), _quota(gwt))
    assert (d.events, d.answers) == ([], None)
    assert [x.payload.create_command_id for x in d.sends] == ["c-old"]
    assert isinstance(s.state.quota, QuotaWait)  # still waiting for its own answer


def test_a_grant_for_the_slot_a_schedule_holds_or_held_is_kept_or_given_back(
    gwt: GivenWhenThen,
) -> None:
    s = _held(gwt)
    grant = _answer(gwt, True, gwt.T0 + RESERVATION_TTL)
    s.when(grant, gwt.T0 + gwt.sec(1), _quota(gwt))
    assert s.when(grant, gwt.T0 + gwt.sec(2), _quota(gwt)).sends == []  # it holds that slot
    s.when(m.DeleteSchedule(), gwt.T0 + gwt.sec(3))
    late = s.when(grant, gwt.T0 + gwt.sec(4), _quota(gwt))  # deleted: the slot is not used
    assert [x.payload.type for x in late.sends] == ["ReleaseQuotaSlot"]


def test_a_create_of_an_existing_schedule_takes_no_slot(gwt: GivenWhenThen) -> None:
    s = _held(gwt)
    s.when(_answer(gwt, True, gwt.T0 + RESERVATION_TTL), gwt.T0 + gwt.sec(1), _quota(gwt))
    retried = s.when(gwt.envelope(m.CreateSchedule(spec=gwt.spec(), request_key="k"),
                                  command_id="c-9"), gwt.T0 + gwt.sec(2), _quota(gwt))
    assert (retried.status, retried.events, retried.sends) == ("ok", [], [])
    taken = s.when(gwt.envelope(m.CreateSchedule(spec=gwt.spec()), command_id="c-10"),
                   gwt.T0 + gwt.sec(2), _quota(gwt))
    assert (taken.status, taken.sends) == ("conflict", [])


def test_deleting_a_schedule_that_holds_a_slot_gives_it_back(gwt: GivenWhenThen) -> None:
    s = _held(gwt)
    s.when(_answer(gwt, True, gwt.T0 + RESERVATION_TTL), gwt.T0 + gwt.sec(1), _quota(gwt))
    d = s.when(m.DeleteSchedule(), gwt.T0 + gwt.sec(3))
    [send] = d.sends
    assert send.payload == m.ReleaseQuotaSlot(schedule_id="s1", create_command_id="c-1",
                                              reason="ScheduleDeleted")
    assert s.when(m.DeleteSchedule(), gwt.T0 + gwt.sec(4)).sends == []  # once


def test_deleting_a_schedule_created_without_a_quota_gives_nothing_back(
    gwt: GivenWhenThen,
) -> None:
    s = gwt.story().create(gwt.T0)
    assert s.when(m.DeleteSchedule(), gwt.T0 + gwt.sec(1)).sends == []


def test_only_the_processor_answers_a_quota_reservation(gwt: GivenWhenThen) -> None:
    s = _held(gwt)
    forged = gwt.envelope(m.AnswerQuotaSlot(create_command_id="c-1", granted=True,
                                            expires_at=gwt.T0 + RESERVATION_TTL))
    d = s.when(forged, gwt.T0 + gwt.sec(1), _quota(gwt))
    assert (d.status, d.events, d.sends) == ("forbidden", [], [])


def test_a_held_create_and_its_slot_are_rebuilt_by_replay(gwt: GivenWhenThen) -> None:
    s = _held(gwt)
    assert s.replayed().quota == QuotaWait("c-1", "k", gwt.spec(), "client-7")
    s.when(_answer(gwt, True, gwt.T0 + RESERVATION_TTL), gwt.T0 + gwt.sec(1), _quota(gwt))
    assert (s.replayed().status, s.replayed().quota) == ("ACTIVE", "c-1")


# ------------------------------------------------------------------ the quota aggregate


def _q(gwt: GivenWhenThen, payload: object, principal: str = "processor") -> m.CommandEnvelope:
    return gwt.envelope(payload, schedule_id=QUOTA_ID, principal=principal,
                        command_id="quota:step")


def _reserve(sid: str, cid: str | None = None) -> m.ReserveQuotaSlot:
    return m.ReserveQuotaSlot(schedule_id=sid, create_command_id=cid or f"c-{sid}")


def _step(gwt: GivenWhenThen, qs: QuotaState, payload: Any, now: datetime | None = None,
          max_schedules: int | None = QUOTA) -> Decision:
    d = decide_quota(qs, _q(gwt, payload), now or gwt.T0, max_schedules)
    for e in d.events:
        evolve_quota(qs, e)
    return d


def test_reserve_holds_a_free_slot_until_the_reservation_ends_and_grants_it(
    gwt: GivenWhenThen,
) -> None:
    qs = QuotaState(gwt.TENANT)
    d = _step(gwt, qs, _reserve("s1"))
    ev = gwt.one(d, m.QuotaSlotReserved)
    assert (ev.schedule_id, ev.max_schedules, ev.expires_at) == ("s1", QUOTA,
                                                                gwt.T0 + RESERVATION_TTL)
    [answer] = d.sends
    assert answer.schedule_id == "s1"
    assert answer.payload == m.AnswerQuotaSlot(create_command_id="c-s1", granted=True,
                                               expires_at=gwt.T0 + RESERVATION_TTL)
    assert quota_wakeup(qs) == gwt.T0 + RESERVATION_TTL


def test_reserve_over_the_quota_is_refused_counting_taken_and_reserved_slots(
    gwt: GivenWhenThen,
) -> None:
    qs = QuotaState(gwt.TENANT)
    for i in range(3):
        _step(gwt, qs, _reserve(f"s{i}"), max_schedules=3)
    _step(gwt, qs, m.ConfirmQuotaSlot(schedule_id="s0", create_command_id="c-s0"))
    d = _step(gwt, qs, _reserve("s9"), max_schedules=3)
    refused = gwt.one(d, m.QuotaSlotRefused)
    assert (refused.taken, refused.reserved, refused.max_schedules) == (1, 2, 3)
    [answer] = d.sends
    assert (answer.payload.granted, answer.payload.reason) == (
        False, "tenant has 1 active schedules and 2 being created (max 3)")


def test_reserve_asked_again_answers_again_without_a_second_slot(gwt: GivenWhenThen) -> None:
    qs = QuotaState(gwt.TENANT)
    _step(gwt, qs, _reserve("s1"))
    d = _step(gwt, qs, _reserve("s1"), gwt.T0 + gwt.sec(3))
    assert d.events == []
    assert d.sends[0].payload.expires_at == gwt.T0 + RESERVATION_TTL  # the same reservation
    assert qs.reserved() == 1


def test_confirm_turns_the_reservation_into_a_taken_slot(gwt: GivenWhenThen) -> None:
    qs = QuotaState(gwt.TENANT)
    _step(gwt, qs, _reserve("s1"))
    d = _step(gwt, qs, m.ConfirmQuotaSlot(schedule_id="s1", create_command_id="c-s1"))
    assert gwt.names(d) == ["QuotaSlotConfirmed"]
    assert (qs.taken(), qs.reserved(), quota_wakeup(qs)) == (1, 0, None)
    again = _step(gwt, qs, m.ConfirmQuotaSlot(schedule_id="s1", create_command_id="c-s1"))
    assert again.events == []


def test_release_frees_only_the_slot_held_for_that_create(gwt: GivenWhenThen) -> None:
    qs = QuotaState(gwt.TENANT)
    _step(gwt, qs, _reserve("s1"))
    _step(gwt, qs, m.ConfirmQuotaSlot(schedule_id="s1", create_command_id="c-s1"))
    stale = _step(gwt, qs, m.ReleaseQuotaSlot(schedule_id="s1", create_command_id="c-other",
                                              reason="rejected"))
    assert (stale.events, qs.taken()) == ([], 1)
    d = _step(gwt, qs, m.ReleaseQuotaSlot(schedule_id="s1", create_command_id="c-s1",
                                          reason="ScheduleDeleted"), gwt.T0 + gwt.sec(9))
    ev = gwt.one(d, m.QuotaSlotReleased)
    assert (ev.reason, ev.released_at, qs.taken()) == ("ScheduleDeleted", gwt.T0 + gwt.sec(9), 0)


def test_a_reservation_never_confirmed_is_released_by_a_tick_at_its_end(
    gwt: GivenWhenThen,
) -> None:
    qs = QuotaState(gwt.TENANT)
    _step(gwt, qs, _reserve("s1"))
    _step(gwt, qs, _reserve("s2"), gwt.T0 + gwt.sec(10))
    early = _step(gwt, qs, m.Tick(), gwt.T0 + RESERVATION_TTL - gwt.sec(1))
    assert early.events == []
    end = gwt.T0 + RESERVATION_TTL
    d = _step(gwt, qs, m.Tick(), end)
    ev = gwt.one(d, m.QuotaSlotReleased)
    assert (ev.schedule_id, ev.reason, ev.released_at) == ("s1", "expired", end)
    [told] = d.sends  # the held create is answered: no slot
    assert (told.schedule_id, told.payload.granted) == ("s1", False)
    assert quota_wakeup(qs) == gwt.T0 + gwt.sec(10) + RESERVATION_TTL


def test_a_confirmation_after_its_reservation_ended_is_taken_late(gwt: GivenWhenThen) -> None:
    qs = QuotaState(gwt.TENANT)
    _step(gwt, qs, _reserve("s1"))
    _step(gwt, qs, m.Tick(), gwt.T0 + RESERVATION_TTL)
    d = _step(gwt, qs, m.ConfirmQuotaSlot(schedule_id="s1", create_command_id="c-s1"))
    assert gwt.one(d, m.QuotaSlotConfirmed).late is True
    assert qs.taken() == 1  # the schedule is live: counted (the audit judges the quota)


def test_at_most_max_schedules_slots_are_held_whatever_the_order_of_steps(
    gwt: GivenWhenThen,
) -> None:
    rnd = random.Random(7)
    qs = QuotaState(gwt.TENANT)
    granted: set[str] = set()
    for step in range(2000):
        sid = f"s{rnd.randrange(40)}"
        kind = rnd.random()
        if kind < 0.5:
            d = _step(gwt, qs, _reserve(sid), max_schedules=QUOTA)
            if d.sends[0].payload.granted:
                granted.add(sid)
        elif kind < 0.8 and sid in granted:
            _step(gwt, qs, m.ConfirmQuotaSlot(schedule_id=sid, create_command_id=f"c-{sid}"))
        elif sid in granted:
            _step(gwt, qs, m.ReleaseQuotaSlot(schedule_id=sid, create_command_id=f"c-{sid}",
                                              reason="ScheduleDeleted"))
            granted.discard(sid)
        assert qs.taken() + qs.reserved() <= QUOTA, f"step {step}"
    assert qs.taken() + qs.reserved() == len(granted) == QUOTA  # saturated, never over


def test_only_the_processor_moves_quota_slots(gwt: GivenWhenThen) -> None:
    qs = QuotaState(gwt.TENANT)
    forged = decide_quota(qs, _q(gwt, _reserve("s1"), principal="alice"), gwt.T0, QUOTA)
    assert (forged.status, forged.events, forged.sends) == ("forbidden", [], [])
    schedule = decide_quota(qs, _q(gwt, m.CreateSchedule(spec=gwt.spec())), gwt.T0, QUOTA)
    assert (schedule.status, schedule.field) == ("invalid", "scheduleId")
