"""The dashboard's pure views: a rule in words, and the next instants with the marks of
daylight saving time (``read_model.instants_with_dst``) on real zone transitions."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from chronolog.api.dashboard.words import duration_words, rule_words
from chronolog.queries.documents import DstIn, JobIn, ScheduleDefinition, to_spec
from chronolog.queries.read_model import instants_with_dst


def row(next_run_at: datetime, **definition: Any) -> dict[str, Any]:
    """A schedules row as the read model stores it (the columns the preview reads)."""
    spec = to_spec(ScheduleDefinition(job=JobIn(type="report"), **definition))
    return {"schedule_id": "s", "state": "ACTIVE", "next_run_at": next_run_at,
            "anchor": None, "spec": spec.model_dump_json()}


def marks(items: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(i["local"], i["dst"]) for i in items]


NY = "America/New_York"


def test_a_wall_time_that_does_not_exist_is_marked_shifted_or_listed_as_skipped() -> None:
    # 2026-03-08: New York's clocks go from 02:00 to 03:00
    first = datetime(2026, 3, 6, 7, 30, tzinfo=UTC)  # 02:30 EST on the 6th
    shifted = instants_with_dst(row(first, cron="30 2 * * *", timezone=NY), 4)
    assert marks(shifted) == [
        ("2026-03-06T02:30:00-05:00", None), ("2026-03-07T02:30:00-05:00", None),
        ("2026-03-08T03:00:00-04:00", "shifted"), ("2026-03-09T02:30:00-04:00", None)]
    assert "does not exist" in shifted[2]["note"]

    skipped = instants_with_dst(row(first, cron="30 2 * * *", timezone=NY,
                                    dst=DstIn(nonexistent="skip")), 4)
    assert [(i["scheduledAt"], i["dst"]) for i in skipped] == [
        ("2026-03-06T07:30:00Z", None), ("2026-03-07T07:30:00Z", None),
        ("2026-03-08T07:00:00Z", "skipped"), ("2026-03-09T06:30:00Z", None),
        ("2026-03-10T06:30:00Z", None)]
    assert skipped[2]["dueAt"] is None and "nonexistent=skip" in skipped[2]["note"]


def test_a_next_instant_that_is_itself_shifted_is_marked_shifted() -> None:
    # the schedule's next run is the shifted 03:00 EDT of 2026-03-08 itself
    first = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    items = instants_with_dst(row(first, cron="30 2 * * *", timezone=NY), 2)
    assert marks(items) == [("2026-03-08T03:00:00-04:00", "shifted"),
                            ("2026-03-09T02:30:00-04:00", None)]


@pytest.mark.parametrize("policy", ["first", "second", "both"])
def test_a_wall_time_that_happens_twice_is_marked_repeated(policy: str) -> None:
    # 2026-11-01: New York's clocks go from 02:00 back to 01:00: 01:30 happens twice
    first = datetime(2026, 10, 31, 5, 30, tzinfo=UTC)  # 01:30 EDT on the 31st
    items = instants_with_dst(row(first, cron="30 1 * * *", timezone=NY,
                                  dst=DstIn(ambiguous=policy)), 3)
    got = [(i["scheduledAt"], i["dst"]) for i in items]
    edt, est = ("2026-11-01T05:30:00Z", "repeated"), ("2026-11-01T06:30:00Z", "repeated")
    if policy == "first":
        assert got == [("2026-10-31T05:30:00Z", None), edt,
                       ("2026-11-01T06:30:00Z", "skipped"), ("2026-11-02T06:30:00Z", None)]
    elif policy == "second":
        assert got == [("2026-10-31T05:30:00Z", None), ("2026-11-01T05:30:00Z", "skipped"),
                       est, ("2026-11-02T06:30:00Z", None)]
    else:
        assert got == [("2026-10-31T05:30:00Z", None), edt, est]


def test_instants_away_from_transitions_and_intervals_carry_no_mark() -> None:
    first = datetime(2026, 6, 1, 13, 0, tzinfo=UTC)
    assert {i["dst"] for i in instants_with_dst(row(first, cron="0 9 * * *", timezone=NY),
                                                10)} == {None}
    every = instants_with_dst(row(first, every=3600.0), 10)
    assert len(every) == 10 and {i["dst"] for i in every} == {None}
    paused = {**row(first, every=3600.0), "state": "PAUSED"}
    assert instants_with_dst(paused, 10) == []


@pytest.mark.parametrize(("definition", "words"), [
    ({"cron": "0 9 * * 1-5", "timezone": NY}, "at 09:00 on Monday to Friday (America/New_York)"),
    ({"cron": "*/15 * * * *"}, "every 15 minutes (UTC)"),
    ({"cron": "* * * * *"}, "every minute (UTC)"),
    ({"cron": "@daily"}, "at 00:00 (UTC)"),
    ({"cron": "30 6,18 * * SAT,SUN"}, "at 06:30, 18:30 on Saturday and Sunday (UTC)"),
    ({"cron": "0 0 L * *"}, "at 00:00 on the last day of the month (UTC)"),
    ({"cron": "0 12 1 1 *"}, "at 12:00 on day 1 of the month in January (UTC)"),
    ({"cron": "5 */2 * * *"}, "every 2 hours at minute 5 (UTC)"),
    ({"cron": "0-10 9 * * *"}, "minute 0-10, hour 9 (UTC)"),
    ({"cron": "30 2 * * SUN#2", "timezone": NY},
     "at 02:30 on the second Sunday of the month (America/New_York)"),
    ({"cron": "0 18 * * 5L"}, "at 18:00 on the last Friday of the month (UTC)"),
    ({"every": 90.0}, "every 1 min 30 s"),
    ({"at": "2026-12-24T18:00:00Z"}, "once at 2026-12-24T18:00:00Z"),
    ({"delay": 3600.0}, "1 h after each run ends"),
])
def test_a_rule_in_words(definition: dict[str, Any], words: str) -> None:
    assert rule_words(definition) == words


def test_durations_in_words() -> None:
    assert [duration_words(s) for s in (0, 5, 60, 3600, 86400 + 61, 1.5)] == [
        "0 s", "5 s", "1 min", "1 h", "1 d 1 min 1 s", "1.5 s"]


# ---------------------------------------------------------------------- exclusion calendars


def test_an_exclusion_in_words() -> None:
    from chronolog.api.dashboard.words import exclusion_words

    assert exclusion_words({"calendar": "us-holidays", "entry": "2026-12-25"}) == (
        "excluded by us-holidays (2026-12-25)")
    assert exclusion_words({"calendar": "us-holidays", "revision": 3,
                            "entry": "2026-12-25"}) == "excluded by us-holidays r3 (2026-12-25)"
    assert exclusion_words(None) == ""


def _render(template: str, **values: Any) -> str:
    from types import SimpleNamespace

    from chronolog.api.dashboard.routes import templates

    request = SimpleNamespace(url=SimpleNamespace(path="/ui/schedules/s"), query_params={})
    base = {"request": request, "tenant": SimpleNamespace(name="acme"), "csrf": "t",
            "flash": None, "here": "/ui/schedules/s", "watermark": "", "title": "x"}
    return templates.env.get_template(template).render(**base, **values)


def _schedule_doc(exclude: list[str] | None) -> dict[str, Any]:
    definition: dict[str, Any] = {"cron": "0 9 * * *", "timezone": NY, "job": {"type": "r"}}
    if exclude is not None:
        definition["exclude"] = exclude
    return {"scheduleId": "s", "state": "ACTIVE", "revision": 2, "definition": definition,
            "nextRunAt": "2026-12-24T14:00:00Z", "updatedAt": "2026-01-01T00:00:00Z",
            "resume": None}


def test_the_schedule_page_strikes_and_labels_an_excluded_instant() -> None:
    from chronolog.domain.calendars import CalendarSpec

    us = CalendarSpec.model_validate({"timezone": NY, "dates": ["2026-12-25"]})
    r = row(datetime(2026, 12, 24, 14, 0, tzinfo=UTC), cron="0 9 * * *", timezone=NY,
            exclude=["us-holidays"])
    instants = instants_with_dst(r, 3, {"us-holidays": us})
    skipped = {"runId": "r_1", "scheduledAt": "2026-12-25T14:00:00Z", "state": "SKIPPED",
               "attempt": 0, "trigger": "schedule", "finishedAt": "2026-12-25T14:00:00Z",
               "skippedReason": "excluded", "skippedThrough": None, "skippedCount": 1,
               "exclusion": {"calendar": "us-holidays", "revision": 3, "entry": "2026-12-25"}}
    html = _render("schedule.html", s=_schedule_doc(["us-holidays", "<b>x</b>"]),
                   words="at 09:00", instants=instants, occurrences=[skipped],
                   runs={"items": [{**skipped, "scheduleId": "s", "startedAt": None}],
                         "nextCursor": None},
                   problem=None, revisions=[], lifecycle=[], history_complete=True,
                   idempotency="k")
    rows = re.findall(r"<tr[^>]*>.*?</tr>", html.split('id="h-next"')[1].split("</table>")[0],
                      re.S)[1:]
    assert len(rows) == 3
    assert 'class="excluded"' in rows[1] and "<s>2026-12-25 09:00:00 -05:00</s>" in rows[1]
    assert "excluded by us-holidays (2026-12-25)" in rows[1]
    assert "excluded" not in rows[0] and "excluded" not in rows[2]
    # the facts name the calendars (escaped: the page's text is the API's); the skipped run
    # names the calendar
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert "by calendar <code>us-holidays</code> r3 (2026-12-25)" in html
    assert html.count("excluded by us-holidays r3 (2026-12-25)") >= 2  # timeline, runs table


def test_a_schedule_naming_no_calendar_has_no_calendars_column() -> None:
    r = row(datetime(2026, 12, 24, 14, 0, tzinfo=UTC), cron="0 9 * * *", timezone=NY)
    html = _render("schedule.html", s=_schedule_doc(None), words="at 09:00",
                   instants=instants_with_dst(r, 2, {}), occurrences=[],
                   runs={"items": [], "nextCursor": None}, problem=None, revisions=[],
                   lifecycle=[], history_complete=True, idempotency="k")
    assert "Calendars</th>" not in html and "excluded" not in html


def test_the_run_page_names_the_calendar_that_excluded_it() -> None:
    run = {"runId": "r_1", "scheduleId": "s", "revision": 2, "trigger": "schedule",
           "requestKey": None, "state": "SKIPPED", "jobType": None, "resourceClass": None,
           "scheduledAt": "2026-12-25T14:00:00Z", "dueAt": None, "startedAt": None,
           "finishedAt": "2026-12-25T14:00:00Z", "latenessMs": None, "retryAt": None,
           "skippedReason": "excluded", "skippedThrough": None, "skippedCount": 1,
           "attempts": [], "effects": [], "result": None, "params": None,
           "exclusion": {"calendar": "us-holidays", "revision": 3, "entry": "2026-12-25"}}
    html = _render("run.html", r=run, events=[], history_complete=True, heartbeats={})
    assert ("<dt>Excluded by</dt><dd>calendar <code>us-holidays</code> (revision 3): "
            "2026-12-25</dd>") in html
    del run["exclusion"]
    assert "Excluded by" not in _render("run.html", r=run, events=[], history_complete=True,
                                        heartbeats={})
