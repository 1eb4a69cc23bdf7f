"""Exclusion calendars end to end, on both logs: a schedule that names a calendar records each
instant the calendar excludes SKIPPED ``excluded`` with the calendar's name, revision and
entry; a revision of the calendar put while instants keep coming due takes effect at one
point of the schedule's history, and no instant is lost or decided against a revision the
schedule did not hold; a calendar named by a schedule cannot be deleted; the audit is clean.
Through the HTTP API: the contract of ``/v1/calendars``, the 4xx of bad input, the run
documents of excluded instants.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronolog.client import CommandError
from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec, excluded_by
from support.polling import wait_until
from support.processors import Running, events

from .api_stack import ACME, ApiStack
from .test_concurrency_limits import audited_clean

SECOND = timedelta(seconds=1)


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


def _every_second(*calendars: str) -> dict[str, Any]:
    return {"every": 1, "job": {"type": "noop"}, "overlap": "allow",
            "exclude": list(calendars)}


def _instants(envs: list[m.EventEnvelope], sid: str) -> list[tuple[datetime, Any]]:
    """The schedule's recorded instants in log order: (instant, the event recording it) — a
    collapsed range of skips counts each of its instants."""
    out: list[tuple[datetime, Any]] = []
    for e in envs:
        p = e.payload
        if e.schedule_id != sid:
            continue
        if isinstance(p, m.OccurrenceMaterialized) and p.trigger == "schedule":
            out.append((p.scheduled_at, p))
        elif isinstance(p, m.OccurrenceSkipped) and not p.materialized:
            out += [(p.scheduled_at + k * SECOND, p) for k in range(p.count)]
    return out


def decided_against_held_copies(envs: list[m.EventEnvelope], sid: str) -> list[int]:
    """Walk the schedule's events in log order holding its calendar copies: every instant it
    materialized no copy excludes, every ``excluded`` skip names a copy it held, at the
    revision held, whose entry does exclude the instant. The revisions held, in order."""
    held: dict[str, tuple[int, CalendarSpec | None]] = {}
    revisions: list[int] = []
    for e in envs:
        p = e.payload
        if e.schedule_id != sid:
            continue
        if isinstance(p, m.CalendarCopied):
            held[p.name] = (p.revision, p.spec)
            revisions.append(p.revision)
        elif isinstance(p, m.OccurrenceMaterialized) and p.trigger == "schedule":
            for name, (rev, spec) in held.items():
                assert spec is not None and excluded_by(spec, p.scheduled_at) is None, (
                    f"{p.scheduled_at} ran though {name} r{rev} excludes it")
        elif isinstance(p, m.OccurrenceSkipped) and p.reason == "excluded":
            assert p.calendar in held and held[p.calendar][0] == p.calendar_revision, p
            spec = held[p.calendar][1]
            assert spec is not None and excluded_by(spec, p.scheduled_at) == p.excluded_by
    return revisions


async def test_a_calendar_revision_racing_due_instants_takes_effect_at_one_point(
    event_log: Any,
) -> None:
    async with Running(event_log) as r:
        c = r.client
        first = await c.put_calendar("acme", "ops", {"dates": [_today()]})
        assert first == {"name": "ops", "revision": 1, "created": True}
        await c.create_schedule("acme", "tick", _every_second("ops"))

        async def excluded() -> list[Any]:
            skips = [e.payload for e in await events(event_log)
                     if e.schedule_id == "tick" and isinstance(e.payload, m.OccurrenceSkipped)
                     and e.payload.reason == "excluded"]
            return skips if sum(s.count for s in skips) >= 3 else []

        skips = await wait_until(excluded, 30, what="three instants excluded")
        assert {(s.calendar, s.calendar_revision, s.excluded_by) for s in skips} == {
            ("ops", 1, _today())}
        with pytest.raises(CommandError) as refused:  # the schedule names it
            await c.delete_calendar("acme", "ops")
        assert refused.value.status == "conflict" and "tick" in str(refused.value)

        # the revision lands while an instant comes due every second
        second = await c.put_calendar("acme", "ops", {"dates": ["2001-01-01"]},
                                      expected_revision=1)
        assert second["revision"] == 2
        with pytest.raises(CommandError) as stale:
            await c.put_calendar("acme", "ops", {"dates": []}, expected_revision=1)
        assert stale.value.status == "conflict"

        async def ran_after() -> bool:
            envs = await events(event_log)
            copied = next((i for i, e in enumerate(envs) if e.schedule_id == "tick" and
                           isinstance(e.payload, m.CalendarCopied)
                           and e.payload.revision == 2), None)
            return copied is not None and sum(
                1 for e in envs[copied:] if e.schedule_id == "tick"
                and isinstance(e.payload, m.OccurrenceMaterialized)) >= 2

        await wait_until(ran_after, 30, what="two instants run under revision 2")
        await c.call("acme", "tick", m.DeleteSchedule())

        async def deleted() -> bool:  # the unsubscription is on its way to the calendar
            try:
                await c.delete_calendar("acme", "ops")
            except CommandError as exc:
                assert exc.status == "conflict", exc
                return False
            return True

        await wait_until(deleted, 30, what="the calendar deleted once no schedule names it")
    envs = await events(event_log)
    assert decided_against_held_copies(envs, "tick") == [1, 2]
    recorded = _instants(envs, "tick")
    times = sorted(t for t, _ in recorded)
    assert len(times) == len(set(times)), "an instant recorded twice"
    assert times == [times[0] + k * SECOND for k in range(len(times))], "an instant lost"
    kinds = [isinstance(p, m.OccurrenceMaterialized) for _, p in recorded]
    flip = kinds.index(True)
    assert not any(kinds[:flip]) and all(kinds[flip:]), "revision 2 took effect at one point"
    audited_clean(envs)


async def test_a_calendar_never_put_excludes_every_instant_and_says_so(event_log: Any) -> None:
    async with Running(event_log) as r:  # a command straight on the log: no API check
        await r.client.create_schedule("acme", "typo", _every_second("holidayz"))

        async def skipped() -> Any:
            return next((e.payload for e in await events(event_log)
                         if e.schedule_id == "typo"
                         and isinstance(e.payload, m.OccurrenceSkipped)), None)

        skip = await wait_until(skipped, 30, what="the first instant skipped")
    assert (skip.reason, skip.calendar, skip.excluded_by) == (
        "excluded", "holidayz", "the calendar does not exist")
    envs = await events(event_log)
    assert not any(isinstance(e.payload, m.OccurrenceMaterialized) for e in envs
                   if e.schedule_id == "typo")
    audited_clean(envs)


@pytest.mark.postgres
async def test_the_api_puts_reads_lists_and_deletes_calendars(
    event_log: Any, database_url: str,
) -> None:
    async with ApiStack(event_log, database_url) as stack:
        http = stack.http
        assert http is not None
        body = {"timezone": "America/New_York", "dates": [_today()],
                "windows": [{"days": ["sat", "sun"], "start": "22:00", "end": "06:00"}]}
        made = await http.put("/v1/calendars/us-ops", json=body, headers=ACME)
        assert made.status_code == 201, made.text
        assert made.json() == {"name": "us-ops", "revision": 1} and made.headers["ETag"] == '"1"'
        again = await http.put("/v1/calendars/us-ops", json=body, headers=ACME)
        assert again.status_code == 200 and again.json()["revision"] == 1  # repeatable
        other = await http.put("/v1/calendars/us-ops", json={"dates": []}, headers=ACME)
        assert other.status_code == 409 and other.json()["revision"] == 1, other.text
        stale = await http.put("/v1/calendars/us-ops", json={"dates": []},
                               headers={**ACME, "If-Match": '"7"'})
        assert stale.status_code == 409 and stale.json()["field"] == "If-Match", stale.text
        absent = await http.put("/v1/calendars/none", json={"dates": []},
                                headers={**ACME, "If-Match": '"1"'})
        assert absent.status_code == 404, absent.text

        doc = (await http.get("/v1/calendars/us-ops", headers=ACME)).json()
        assert (doc["revision"], doc["definition"]["timezone"], doc["usedBy"]) == (
            1, "America/New_York", [])
        assert doc["definition"]["windows"][0]["days"] == ["sat", "sun"]

        for bad, where in (({"windows": [{"start": "25:00", "end": "06:00"}]}, "start"),
                           ({"timezone": "Mars/Olympus"}, "timezone"),
                           ({"ranges": [{"from": "2026-12-26", "to": "2026-12-24"}]}, "ranges"),
                           ({"holidays": []}, "holidays")):
            answer = await http.put("/v1/calendars/bad", json=bad, headers=ACME)
            assert answer.status_code == 400, answer.text
            assert where in answer.json()["field"], answer.json()
        named = await http.put("/v1/calendars/not a name", json={}, headers=ACME)
        assert named.status_code in (400, 404, 422) and named.status_code != 500
        assert (await http.get("/v1/calendars/bad", headers=ACME)).status_code == 404

        unknown = await http.post("/v1/schedules", headers=ACME, json={
            "scheduleId": "s0", **_every_second("us-ops", "nope")})
        assert unknown.status_code == 400 and unknown.json()["field"] == "exclude[1]", \
            unknown.text
        created = await http.post("/v1/schedules", headers=ACME, json={
            "scheduleId": "s1", **_every_second("us-ops")})
        assert created.status_code == 201, created.text

        async def skipped_run() -> Any:
            page = (await http.get("/v1/schedules/s1/runs?state=SKIPPED",
                                   headers=ACME)).json()
            return page["items"][0] if page.get("items") else None

        item = await wait_until(skipped_run, 30, what="an excluded instant listed")
        run = (await http.get(f"/v1/runs/{item['runId']}", headers=ACME)).json()
        assert run["skippedReason"] == "excluded", run
        assert run["exclusion"] == {"calendar": "us-ops", "revision": 1, "entry": _today()}

        doc = (await http.get("/v1/calendars/us-ops", headers=ACME)).json()
        assert doc["usedBy"] == ["s1"]
        listed = (await http.get("/v1/calendars?limit=1", headers=ACME)).json()
        assert [c["name"] for c in listed["items"]] == ["us-ops"]
        refused = await http.delete("/v1/calendars/us-ops", headers=ACME)
        assert refused.status_code == 409 and "s1" in refused.json()["message"], refused.text

        revised = await http.put("/v1/calendars/us-ops", json={"dates": ["2001-01-01"]},
                                 headers={**ACME, "If-Match": '"1"'})
        assert revised.status_code == 200 and revised.json()["revision"] == 2, revised.text
        assert (await http.delete("/v1/schedules/s1", headers=ACME)).status_code == 200

        async def gone() -> bool:
            answer = await http.delete("/v1/calendars/us-ops",
                                       headers={**ACME, "If-Match": '"2"'})
            assert answer.status_code in (200, 409), answer.text
            return answer.status_code == 200

        await wait_until(gone, 30, what="the calendar deleted once s1 let go of it")
        assert (await http.get("/v1/calendars/us-ops", headers=ACME)).status_code == 404
        put_back = await http.put("/v1/calendars/us-ops", json={"dates": []}, headers=ACME)
        assert put_back.status_code == 201 and put_back.json()["revision"] == 4
