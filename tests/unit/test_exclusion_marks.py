"""Exclusion calendars on the read side (``chronolog.queries.exclusions`` and the documents
that show them): an upcoming instant a calendar the schedule names excludes is listed,
marked ``excluded {calendar, entry}``; a skipped run shows ``exclusion {calendar, revision,
entry}``; ``GET /v1/preview?exclude=`` marks a rule's instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from chronolog.api.routes.preview import preview as preview_route
from chronolog.commands.calendars import MISSING
from chronolog.domain.calendars import CalendarSpec
from chronolog.queries.documents import (
    ExclusionOut,
    JobIn,
    RunItem,
    ScheduleDefinition,
    definition_document,
    definition_of,
    jsonable,
    to_spec,
)
from chronolog.queries.exclusions import (
    calendar_specs,
    excluded,
    exclusion_out,
    mark_excluded,
    parse_exclude,
)
from chronolog.queries.read_model import (
    instants_with_dst,
    preview,
    resume_plan,
    schedule_calendars,
)

NY = "America/New_York"
US = CalendarSpec.model_validate({"timezone": NY, "dates": ["2026-12-25", "2027-01-01"]})
NIGHTS = CalendarSpec.model_validate({"timezone": "Europe/Paris",
                                      "windows": [{"days": ["sat", "sun"], "start": "22:00",
                                                   "end": "06:00"}]})
XMAS_9AM_NY = datetime(2026, 12, 25, 14, 0, tzinfo=UTC)  # 09:00 EST on the 25th


def row(next_run_at: datetime, state: str = "ACTIVE", **definition: Any) -> dict[str, Any]:
    """A schedules row as the read model stores it (the columns the preview reads)."""
    spec = to_spec(ScheduleDefinition(job=JobIn(type="report"), **definition))
    return {"tenant": "acme", "schedule_id": "s", "state": state, "next_run_at": next_run_at,
            "anchor": None, "spec": spec.model_dump_json()}


# ---------------------------------------------------------------------- the marking rule


def test_an_instant_a_calendar_excludes_is_marked_with_the_calendar_and_its_entry() -> None:
    mark = excluded(("us-holidays",), {"us-holidays": US}, XMAS_9AM_NY)
    assert mark is not None
    assert (mark.calendar, mark.entry) == ("us-holidays", "2026-12-25")
    assert jsonable(mark) == {"calendar": "us-holidays", "entry": "2026-12-25"}


def test_an_instant_outside_every_calendar_is_not_marked() -> None:
    assert excluded(("us-holidays",), {"us-holidays": US},
                    XMAS_9AM_NY + timedelta(days=1)) is None
    # 03:00 UTC on the 25th is still the 24th in the calendar's zone
    assert excluded(("us-holidays",), {"us-holidays": US},
                    datetime(2026, 12, 25, 3, 0, tzinfo=UTC)) is None


def test_the_first_calendar_in_the_schedules_order_that_excludes_names_the_instant() -> None:
    closed = CalendarSpec.model_validate({"timezone": NY, "ranges": [
        {"from": "2026-12-24", "to": "2026-12-26"}]})
    cals = {"us-holidays": US, "nights": NIGHTS, "closed": closed}
    # both exclude the 25th: the one named first names it
    first = excluded(("closed", "us-holidays"), cals, XMAS_9AM_NY)
    assert first is not None and (first.calendar, first.entry) == (
        "closed", "2026-12-24..2026-12-26")
    first = excluded(("us-holidays", "closed"), cals, XMAS_9AM_NY)
    assert first is not None and (first.calendar, first.entry) == ("us-holidays", "2026-12-25")
    # Saturday 2026-12-26 23:00 in Paris (17:00 in New York): only the nights exclude it
    sat_night = datetime(2026, 12, 26, 22, 0, tzinfo=UTC)
    got = excluded(("us-holidays", "nights"), cals, sat_night)
    assert got is not None
    assert (got.calendar, got.entry) == ("nights", "sat,sun 22:00-06:00 Europe/Paris")


def test_a_missing_or_deleted_calendar_excludes_every_instant() -> None:
    for calendars in ({}, {"gone": None}):
        marks = mark_excluded(("gone",), calendars,
                              [XMAS_9AM_NY + timedelta(days=n) for n in range(5)])
        assert [(m.calendar, m.entry) for m in marks if m is not None] == [("gone", MISSING)] * 5
    # a calendar named before the missing one still names what it excludes
    mark = excluded(("us-holidays", "gone"), {"us-holidays": US}, XMAS_9AM_NY)
    assert mark is not None and mark.calendar == "us-holidays"
    later = excluded(("us-holidays", "gone"), {"us-holidays": US},
                     XMAS_9AM_NY + timedelta(days=2))
    assert later is not None and (later.calendar, later.entry) == ("gone", MISSING)


def test_no_calendar_named_marks_nothing() -> None:
    assert mark_excluded((), {"us-holidays": US}, [XMAS_9AM_NY, XMAS_9AM_NY]) == [None, None]


def test_the_read_models_rows_become_specs_and_a_deleted_one_none() -> None:
    stored = US.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    rows = [{"name": "us-holidays", "spec": orjson.dumps(stored).decode()},
            {"name": "nights", "spec": NIGHTS.model_dump(mode="json", by_alias=True,
                                                          exclude_defaults=True)},
            {"name": "old", "spec": None}]
    assert calendar_specs(rows) == {"us-holidays": US, "nights": NIGHTS, "old": None}


@pytest.mark.parametrize(("text", "names"), [
    (None, ()), ("", ()), ("us-holidays", ("us-holidays",)),
    (" us-holidays , fr.holidays_2 ", ("us-holidays", "fr.holidays_2")),
])
def test_the_exclude_parameter_names_calendars_in_order(text: str | None,
                                                        names: tuple[str, ...]) -> None:
    assert parse_exclude(text) == names


@pytest.mark.parametrize(("text", "why"), [
    ("us holidays", "calendar name"), ("a,,b", "calendar name"), ("-x", "calendar name"),
    ("a,b,a", "named twice"), (",".join(f"c{n}" for n in range(11)), "at most 10"),
])
def test_a_bad_exclude_parameter_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_exclude(text)


# ---------------------------------------------------------------------- a schedule's preview


def test_a_schedules_preview_lists_an_excluded_instant_marked() -> None:
    r = row(XMAS_9AM_NY - timedelta(days=1), cron="0 9 * * *", timezone=NY,
            exclude=["us-holidays"])
    items = preview(r, 3, {"us-holidays": US})
    assert [i.local for i in items] == ["2026-12-24T09:00:00-05:00",
                                        "2026-12-25T09:00:00-05:00",
                                        "2026-12-26T09:00:00-05:00"]
    docs = [jsonable(i) for i in items]
    assert "excluded" not in docs[0] and "excluded" not in docs[2]  # absent: it runs
    assert docs[1]["excluded"] == {"calendar": "us-holidays", "entry": "2026-12-25"}
    # without the calendars read (or naming none), nothing is marked
    assert all(i.excluded is None for i in preview(r, 3))
    plain = row(XMAS_9AM_NY, cron="0 9 * * *", timezone=NY)
    assert all(i.excluded is None for i in preview(plain, 3, {"us-holidays": US}))


def test_a_schedule_naming_a_calendar_that_does_not_exist_marks_every_instant() -> None:
    r = row(XMAS_9AM_NY, every=3600.0, exclude=["nope"])
    docs = [jsonable(i) for i in preview(r, 5, {})]
    assert len(docs) == 5
    assert [d["excluded"] for d in docs] == [{"calendar": "nope", "entry": MISSING}] * 5


def test_the_dashboards_next_instants_carry_the_mark() -> None:
    r = row(XMAS_9AM_NY - timedelta(days=1), cron="0 9 * * *", timezone=NY,
            exclude=["us-holidays"])
    items = instants_with_dst(r, 3, {"us-holidays": US})
    assert [i["excluded"] for i in items] == [
        None, {"calendar": "us-holidays", "entry": "2026-12-25"}, None]
    assert [i["dueAt"] for i in items] == ["2026-12-24T14:00:00Z", "2026-12-25T14:00:00Z",
                                           "2026-12-26T14:00:00Z"]


async def test_the_calendars_of_schedules_are_read_in_one_query_only_when_named() -> None:
    asked: list[tuple[str, list[str]]] = []

    class Read:
        async def calendars(self, tenant: str, names: list[str]) -> dict[str, Any]:
            asked.append((tenant, list(names)))
            return {"us-holidays": US}

    a = row(XMAS_9AM_NY, every=3600.0, exclude=["us-holidays", "nope"])
    b = row(XMAS_9AM_NY, every=3600.0, exclude=["nope", "fr"])
    paused = row(XMAS_9AM_NY, "PAUSED", every=3600.0, exclude=["x"])  # its resume plan
    deleted = row(XMAS_9AM_NY, "DELETED", every=3600.0, exclude=["y"])
    plain = row(XMAS_9AM_NY, every=3600.0)
    assert await schedule_calendars(Read(), a, b, paused, deleted,  # type: ignore[arg-type]
                                    plain) == {"us-holidays": US}
    assert asked == [("acme", ["us-holidays", "nope", "fr", "x"])]
    assert await schedule_calendars(Read(), plain, deleted) == {}  # type: ignore[arg-type]
    assert len(asked) == 1


def test_a_definition_keeps_its_calendars_and_one_without_shows_none() -> None:
    spec = to_spec(ScheduleDefinition.model_validate(
        {"every": 60, "job": {"type": "a"}, "exclude": ["us-holidays", "nights"]}))
    assert spec.exclude == ("us-holidays", "nights")
    stored = spec.model_dump(mode="json")
    assert definition_of(stored).exclude == ["us-holidays", "nights"]
    assert definition_document(stored)["exclude"] == ["us-holidays", "nights"]
    bare = to_spec(ScheduleDefinition.model_validate({"every": 60, "job": {"type": "a"}}))
    assert "exclude" not in definition_document(bare.model_dump(mode="json"))


# ---------------------------------------------------------------------- a skipped run


def test_a_run_skipped_by_a_calendar_shows_the_exclusion_and_no_other_run_does() -> None:
    raw = {"calendar": "us-holidays", "revision": 3, "entry": "2026-12-25"}
    got = exclusion_out("SKIPPED", "excluded", orjson.dumps(raw).decode())
    assert got == ExclusionOut(calendar="us-holidays", revision=3, entry="2026-12-25")
    assert exclusion_out("SKIPPED", "excluded", raw) == got
    assert exclusion_out("SKIPPED", "overlap", raw) is None
    assert exclusion_out("SUCCEEDED", None, None) is None
    assert exclusion_out("SKIPPED", "excluded", None) is None

    base = {"run_id": "r_1", "trace_id": "1" * 32, "schedule_id": "s", "scheduled_at": XMAS_9AM_NY,
            "state": "SKIPPED", "attempt": 0, "started_at": None,
            "finished_at": XMAS_9AM_NY}
    assert jsonable(RunItem(**base, exclusion=got))["exclusion"] == raw
    assert "exclusion" not in jsonable(RunItem(**base))  # absent, not null


# ---------------------------------------------------------------------- GET /v1/preview


class _Read:
    def __init__(self, calendars: dict[str, Any]) -> None:
        self.got = calendars
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    async def calendars(self, tenant: str, names: tuple[str, ...]) -> dict[str, Any]:
        self.asked.append((tenant, tuple(names)))
        return {n: self.got[n] for n in names if n in self.got}


async def _preview(read: _Read, **params: Any) -> Any:
    ctx = SimpleNamespace(read=lambda: read)
    args: dict[str, Any] = {"cron": None, "timezone_": "UTC", "every": None, "at": None,
                            "anchor": None, "count": 5, "from_": None, "exclude": None}
    args.update(params)
    response = await preview_route(SimpleNamespace(name="acme"), ctx, **args)  # type: ignore[arg-type]
    return orjson.loads(response.body)


async def test_the_preview_endpoint_marks_the_instants_the_named_calendars_exclude() -> None:
    read = _Read({"us-holidays": US})
    doc = await _preview(read, cron="0 9 * * *", timezone_=NY, count=3,
                         from_="2026-12-24T00:00:00Z", exclude="us-holidays, nope")
    assert read.asked == [("acme", ("us-holidays", "nope"))]
    assert [i["utc"] for i in doc["instants"]] == [
        "2026-12-24T14:00:00Z", "2026-12-25T14:00:00Z", "2026-12-26T14:00:00Z"]
    # the holidays name the 25th; the missing calendar names every other instant
    assert [i["excluded"] for i in doc["instants"]] == [
        {"calendar": "nope", "entry": MISSING},
        {"calendar": "us-holidays", "entry": "2026-12-25"},
        {"calendar": "nope", "entry": MISSING}]


async def test_the_preview_endpoint_without_exclude_keeps_its_shape_and_reads_nothing() -> None:
    read = _Read({"us-holidays": US})
    doc = await _preview(read, cron="0 9 * * *", timezone_=NY, count=2,
                         from_="2026-12-24T00:00:00Z")
    assert read.asked == []
    assert doc == {"instants": [
        {"utc": "2026-12-24T14:00:00Z", "local": "2026-12-24T09:00:00-05:00", "dst": None,
         "note": None},
        {"utc": "2026-12-25T14:00:00Z", "local": "2026-12-25T09:00:00-05:00", "dst": None,
         "note": None}], "skipped": []}


async def test_the_preview_endpoint_refuses_a_bad_exclude_naming_it() -> None:
    from chronolog.api.errors import ApiError

    with pytest.raises(ApiError) as err:
        await _preview(_Read({}), cron="0 9 * * *", exclude="a b")
    assert err.value.field == "exclude" and err.value.status == 400


def test_a_paused_schedules_resume_plan_skips_what_its_calendars_exclude() -> None:
    r = row(XMAS_9AM_NY - timedelta(days=1), state="PAUSED", cron="0 9 * * *", timezone=NY,
            misfire={"policy": "all", "maxAge": "30d"}, exclude=["us-holidays"])
    plan = resume_plan(r, 0, XMAS_9AM_NY + timedelta(days=1, hours=1),
                       {"us-holidays": US})
    assert [(i.action, i.reason) for i in plan.instants] == [
        ("run", None), ("skip", "excluded"), ("run", None)]
    assert jsonable(plan.instants[1])["excluded"] == {"calendar": "us-holidays",
                                                      "entry": "2026-12-25"}
    assert "excluded" not in jsonable(plan.instants[0])
    unread = resume_plan(r, 0, XMAS_9AM_NY + timedelta(days=1, hours=1), {})
    assert [i.reason for i in unread.instants] == ["excluded"]  # missing: every instant
    assert unread.instants[0].count == 3
