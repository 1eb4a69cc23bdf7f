"""Decider rules of exclusion calendars (``chronolog.commands.calendars``): a calendar is an
aggregate of its own, revised under revision rules; a schedule that names it subscribes, holds
a copy of each revision and records every instant the copy excludes as SKIPPED ``excluded``.

Given (history) / when (command) / then (events, commands sent, status).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from chronolog.commands import calendars
from chronolog.commands.aggregate import Decision
from chronolog.commands.decider import next_wakeup
from chronolog.commands.quota import decide_quota, evolve_quota
from chronolog.commands.state import QuotaState
from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.ids import calendar_id
from support.decider import GivenWhenThen

# T0 is Monday 2026-03-02 09:00 UTC; the schedule runs every minute from 09:00
HOLIDAY = CalendarSpec.model_validate({"dates": ["2026-03-02"]})
MONDAY_0902 = CalendarSpec.model_validate({"windows": [{"days": ["mon"], "start": "09:02",
                                                        "end": "09:03"}]})


def _processor(gwt: GivenWhenThen, payload: object, schedule_id: str = "s1",
               command_id: str = "cal:p") -> m.CommandEnvelope:
    return gwt.envelope(payload, schedule_id=schedule_id, principal="processor",
                        command_id=command_id)


def _copy(gwt: GivenWhenThen, name: str, revision: int, spec: CalendarSpec | None,
          command_id: str = "cal:copy") -> m.CommandEnvelope:
    return _processor(gwt, m.CopyCalendar(name=name, revision=revision, spec=spec),
                      command_id=command_id)


def _sends(d: Decision, kind: type) -> list[Any]:
    return [x for x in d.sends if isinstance(x.payload, kind)]


# --------------------------------------------------------------------- the schedule's side


def test_a_schedule_that_names_calendars_subscribes_to_each(gwt: GivenWhenThen) -> None:
    s = gwt.story()
    d = s.given(m.CreateSchedule(spec=gwt.spec(exclude=["hol", "maint"]), request_key="k"),
                gwt.T0)
    subs = _sends(d, m.SubscribeCalendar)
    assert [(x.schedule_id, x.payload.name, x.payload.schedule_id) for x in subs] == [
        (calendar_id("hol"), "hol", "s1"), (calendar_id("maint"), "maint", "s1")]


def test_nothing_is_materialized_before_every_copy_arrived(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["hol"])
    assert next_wakeup(s.state) is None  # no timer spins on an instant it cannot decide
    assert s.when(m.Tick(), gwt.T0 + gwt.sec(30)).events == []
    d = s.when(_copy(gwt, "hol", 1, MONDAY_0902), gwt.T0 + gwt.sec(30))
    assert gwt.names(d) == ["CalendarCopied", "OccurrenceMaterialized"]
    assert next_wakeup(s.state) is not None


def test_an_excluded_instant_is_skipped_naming_calendar_revision_and_entry(
        gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["maint"])
    s.given(_copy(gwt, "maint", 3, MONDAY_0902), gwt.T0)
    s.given(m.Tick(), gwt.T0)  # 09:00 runs
    s.given(m.Tick(), gwt.T0 + gwt.sec(60))  # 09:01 runs
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(120))  # 09:02 is inside the window
    skip = gwt.one(d, m.OccurrenceSkipped)
    assert (skip.reason, skip.calendar, skip.calendar_revision) == ("excluded", "maint", 3)
    assert skip.excluded_by == "mon 09:02-09:03 UTC"
    assert skip.scheduled_at == gwt.T0 + gwt.sec(120) and not gwt.all(d, m.OccurrenceMaterialized)
    assert skip.next_run_at == gwt.T0 + gwt.sec(180)
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(180))  # 09:03: the window ended
    assert gwt.names(d) == ["OccurrenceMaterialized"]


def test_the_first_calendar_named_that_excludes_is_the_one_recorded(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["a", "b"])
    s.given(_copy(gwt, "a", 1, MONDAY_0902, "c1"), gwt.T0)
    d = s.when(_copy(gwt, "b", 1, HOLIDAY, "c2"), gwt.T0)  # the last copy decides 09:00
    assert gwt.one(d, m.OccurrenceSkipped).calendar == "b"  # a holiday, all day
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(60))
    assert gwt.one(d, m.OccurrenceSkipped).calendar == "b"
    d = s.when(m.Tick(), gwt.T0 + gwt.sec(120))
    assert gwt.one(d, m.OccurrenceSkipped).calendar == "a"


def test_a_long_run_of_excluded_instants_is_one_range(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["hol"], misfire="all")
    d = s.when(_copy(gwt, "hol", 1, HOLIDAY), gwt.T0 + gwt.sec(60 * 30))
    [skip] = gwt.all(d, m.OccurrenceSkipped)
    assert (skip.count, skip.reason, skip.excluded_by) == (31, "excluded", "2026-03-02")
    assert skip.through == gwt.T0 + gwt.sec(60 * 30)


def test_a_calendar_that_does_not_exist_excludes_every_instant(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["typo"])
    d = s.when(_copy(gwt, "typo", 0, None), gwt.T0)
    skip = gwt.one(d, m.OccurrenceSkipped)
    assert (skip.reason, skip.calendar, skip.excluded_by) == ("excluded", "typo",
                                                              calendars.MISSING)


def test_a_newer_revision_replaces_the_copy_and_an_older_one_changes_nothing(
        gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["hol"])
    s.given(_copy(gwt, "hol", 2, HOLIDAY, "c2"), gwt.T0 - gwt.sec(1))
    assert s.when(_copy(gwt, "hol", 1, None, "c1"), gwt.T0 - gwt.sec(1)).events == []
    d = s.when(_copy(gwt, "hol", 3, MONDAY_0902, "c3"), gwt.T0 - gwt.sec(1))
    assert gwt.names(d) == ["CalendarCopied"]
    d = s.when(m.Tick(), gwt.T0)  # the holiday is gone in revision 3
    assert gwt.names(d) == ["OccurrenceMaterialized"]


def test_a_copy_of_a_calendar_the_schedule_does_not_name_changes_nothing(
        gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["hol"])
    assert s.when(_copy(gwt, "other", 1, HOLIDAY), gwt.T0).events == []


def test_only_the_processor_copies_a_calendar(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["hol"])
    d = s.when(m.CopyCalendar(name="hol", revision=1, spec=HOLIDAY), gwt.T0)
    assert d.status == "forbidden" and d.events == []


def test_a_manual_trigger_is_not_excluded(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["hol"])
    s.given(_copy(gwt, "hol", 1, HOLIDAY), gwt.T0)
    d = s.when(m.TriggerRun(request_key="now"), gwt.T0 + gwt.sec(5))
    assert gwt.one(d, m.OccurrenceMaterialized).trigger == "manual"


def test_a_revision_that_drops_a_calendar_unsubscribes_and_one_that_adds_subscribes(
        gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["a"])
    s.given(_copy(gwt, "a", 1, HOLIDAY), gwt.T0)
    d = s.when(m.ReviseSchedule(spec=gwt.spec(exclude=["b"]), expected_revision=1),
               gwt.T0 + gwt.sec(1))
    assert [x.payload.name for x in _sends(d, m.UnsubscribeCalendar)] == ["a"]
    assert [x.payload.name for x in _sends(d, m.SubscribeCalendar)] == ["b"]
    assert [c.name for c in s.state.calendars or ()] == ["b"]
    assert calendars.awaiting(s.state)


def test_a_deleted_schedule_unsubscribes(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["a"])
    d = s.when(m.DeleteSchedule(), gwt.T0 + gwt.sec(1))
    assert [x.payload.name for x in _sends(d, m.UnsubscribeCalendar)] == ["a"]


def test_a_revision_waits_while_an_instant_is_due_and_a_copy_is_on_its_way(
        gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["a"])
    d = s.when(m.ReviseSchedule(spec=gwt.spec(), expected_revision=1), gwt.T0 + gwt.sec(61))
    assert d.status == "conflict" and d.field == "exclude" and "'a'" in d.reason


def test_a_backfill_reports_excluded_instants_and_does_not_run_them(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(now=gwt.T0 + gwt.sec(3600), exclude=["maint"])
    s.given(_copy(gwt, "maint", 1, MONDAY_0902), gwt.T0 + gwt.sec(3600))
    d = s.when(m.BackfillSchedule(request_key="b", start=gwt.T0 + gwt.sec(60),
                                  end=gwt.T0 + gwt.sec(240)), gwt.T0 + gwt.sec(3601))
    assert d.ok
    reasons = {i["scheduled_at"]: i.get("reason") for i in d.body["items"]}
    assert reasons[gwt.T0 + gwt.sec(120)] == "excluded"
    assert [reasons[gwt.T0 + gwt.sec(n)] for n in (60, 180)] == [None, None]
    assert len(gwt.all(d, m.OccurrenceMaterialized)) == 2
    assert gwt.one(d, m.BackfillRequested).excluded == 1


def test_a_replayed_schedule_holds_the_same_copies(gwt: GivenWhenThen) -> None:
    s = gwt.story().create(exclude=["hol"])
    s.given(_copy(gwt, "hol", 4, HOLIDAY), gwt.T0)
    assert s.replayed().snapshot() == s.state.snapshot()


# --------------------------------------------------------------------- the calendar's side

NAME = "hol"


def _calendar(gwt: GivenWhenThen, payload: Any, state: QuotaState,
              principal: str = "alice", command_id: str = "c-1") -> Decision:
    env = gwt.envelope(payload, schedule_id=calendar_id(NAME), principal=principal,
                       command_id=command_id)
    d = decide_quota(state, env, datetime(2026, 3, 2, tzinfo=UTC), None)
    for ev in d.events:
        evolve_quota(state, ev)
    return d


def _home() -> QuotaState:
    return QuotaState("acme", calendar_id(NAME))


def test_a_calendar_is_created_once_and_put_again_answers_the_same(gwt: GivenWhenThen) -> None:
    q = _home()
    d = _calendar(gwt, m.PutCalendar(name=NAME, spec=HOLIDAY), q)
    assert gwt.names(d) == ["CalendarRevised"] and d.body["revision"] == 1
    assert d.body["created"] is True
    again = _calendar(gwt, m.PutCalendar(name=NAME, spec=HOLIDAY), q)
    assert again.ok and again.events == [] and again.body["revision"] == 1
    other = _calendar(gwt, m.PutCalendar(name=NAME, spec=MONDAY_0902), q)
    assert other.status == "conflict" and other.field == "If-Match"


def test_a_calendar_is_revised_at_its_current_revision_only(gwt: GivenWhenThen) -> None:
    q = _home()
    _calendar(gwt, m.PutCalendar(name=NAME, spec=HOLIDAY), q)
    stale = _calendar(gwt, m.PutCalendar(name=NAME, spec=MONDAY_0902, expected_revision=2), q)
    assert stale.status == "conflict" and stale.body["revision"] == 1
    d = _calendar(gwt, m.PutCalendar(name=NAME, spec=MONDAY_0902, expected_revision=1), q)
    assert d.ok and gwt.one(d, m.CalendarRevised).revision == 2


def test_revising_a_calendar_that_does_not_exist_is_not_found(gwt: GivenWhenThen) -> None:
    d = _calendar(gwt, m.PutCalendar(name=NAME, spec=HOLIDAY, expected_revision=1), _home())
    assert d.status == "not_found" and d.events == []


def test_each_revision_is_copied_to_every_subscriber(gwt: GivenWhenThen) -> None:
    q = _home()
    _calendar(gwt, m.PutCalendar(name=NAME, spec=HOLIDAY), q)
    for sid in ("s1", "s2"):
        d = _calendar(gwt, m.SubscribeCalendar(name=NAME, schedule_id=sid), q,
                      principal="processor", command_id=f"sub-{sid}")
        [copy] = _sends(d, m.CopyCalendar)  # the current revision, to the new subscriber
        assert (copy.schedule_id, copy.payload.revision, copy.payload.spec) == (sid, 1, HOLIDAY)
    d = _calendar(gwt, m.PutCalendar(name=NAME, spec=MONDAY_0902, expected_revision=1), q)
    assert sorted((x.schedule_id, x.payload.revision) for x in _sends(d, m.CopyCalendar)) == [
        ("s1", 2), ("s2", 2)]


def test_a_subscriber_of_a_calendar_never_put_is_told_it_does_not_exist(
        gwt: GivenWhenThen) -> None:
    d = _calendar(gwt, m.SubscribeCalendar(name=NAME, schedule_id="s1"), _home(),
                  principal="processor")
    [copy] = _sends(d, m.CopyCalendar)
    assert (copy.payload.revision, copy.payload.spec) == (0, None)


def test_only_the_processor_subscribes_a_schedule(gwt: GivenWhenThen) -> None:
    d = _calendar(gwt, m.SubscribeCalendar(name=NAME, schedule_id="s1"), _home())
    assert d.status == "forbidden"


def test_a_calendar_named_by_a_schedule_cannot_be_deleted(gwt: GivenWhenThen) -> None:
    q = _home()
    _calendar(gwt, m.PutCalendar(name=NAME, spec=HOLIDAY), q)
    _calendar(gwt, m.SubscribeCalendar(name=NAME, schedule_id="s1"), q, principal="processor")
    d = _calendar(gwt, m.DeleteCalendar(name=NAME), q)
    assert d.status == "conflict" and "s1" in d.reason and d.events == []
    _calendar(gwt, m.UnsubscribeCalendar(name=NAME, schedule_id="s1"), q, principal="processor")
    d = _calendar(gwt, m.DeleteCalendar(name=NAME, expected_revision=1), q)
    assert gwt.one(d, m.CalendarDeleted).revision == 2


def test_revisions_count_on_across_a_deletion(gwt: GivenWhenThen) -> None:
    q = _home()
    _calendar(gwt, m.PutCalendar(name=NAME, spec=HOLIDAY), q)
    _calendar(gwt, m.DeleteCalendar(name=NAME), q)
    assert _calendar(gwt, m.DeleteCalendar(name=NAME), q).status == "not_found"
    d = _calendar(gwt, m.PutCalendar(name=NAME, spec=HOLIDAY), q)
    assert d.body == {"name": NAME, "revision": 3, "created": True}


def test_a_calendar_command_for_another_calendars_id_is_refused(gwt: GivenWhenThen) -> None:
    d = _calendar(gwt, m.PutCalendar(name="other", spec=HOLIDAY), _home())
    assert d.status == "invalid" and d.field == "name"
