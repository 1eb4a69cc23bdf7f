"""What ``chronolog run RUN_ID`` prints for a run (``chronolog.cli.render.run``), and how
``runs`` and ``schedule show`` mark what an exclusion calendar excluded."""

from __future__ import annotations

from typing import Any

import pytest

from chronolog.cli import render


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "runId": "r_0123456789abcdef0123", "scheduleId": "nightly", "revision": 1,
        "trigger": "schedule", "requestKey": None, "state": "SUCCEEDED", "jobType": "echo",
        "params": {"region": "eu"}, "scheduledAt": "2026-03-02T09:00:00Z",
        "dueAt": "2026-03-02T09:00:00Z", "startedAt": "2026-03-02T09:00:01Z",
        "finishedAt": "2026-03-02T09:00:02Z", "latenessMs": 12, "attempts": [],
        "effects": [], "result": None}
    doc.update(changes)
    return doc


def _printed(capsys: pytest.CaptureFixture[str], doc: dict[str, Any]) -> list[str]:
    render.run(doc)
    return [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]


def test_a_run_shows_its_job_and_params(capsys: pytest.CaptureFixture[str]) -> None:
    assert 'job echo {"region": "eu"}' in _printed(capsys, _doc())
    assert "job echo -" in _printed(capsys, _doc(params=None))


def test_a_skipped_run_that_never_started_shows_no_job_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _printed(capsys, _doc(state="SKIPPED", jobType=None, params=None, startedAt=None,
                                  finishedAt="2026-03-02T09:00:00Z", latenessMs=None,
                                  skippedReason="overlap"))
    assert "state SKIPPED" in lines and "skippedReason overlap" in lines
    assert not [line for line in lines if line.startswith("job") or "None" in line
                or "null" in line], lines


EXCLUSION = {"calendar": "us-holidays", "revision": 3, "entry": "2026-12-25"}


def test_a_run_a_calendar_excluded_says_which_on_its_state_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _printed(capsys, _doc(state="SKIPPED", jobType=None, params=None, startedAt=None,
                                  latenessMs=None, skippedReason="excluded",
                                  exclusion=EXCLUSION))
    assert "state SKIPPED (excluded by calendar 'us-holidays' r3: 2026-12-25)" in lines
    assert not [line for line in lines if line.startswith("skippedReason")], lines


def test_a_run_skipped_for_another_reason_has_no_calendar(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _printed(capsys, _doc(state="SKIPPED", skippedReason="overlap"))
    assert "state SKIPPED" in lines and not [line for line in lines if "calendar" in line]


def test_a_list_of_runs_shows_the_calendar_beside_the_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    item = {"runId": "r_1", "scheduleId": "nightly", "scheduledAt": "2026-12-25T14:00:00Z",
            "state": "SKIPPED", "attempt": 0, "startedAt": None,
            "finishedAt": "2026-12-25T14:00:00Z", "waiting": None, "exclusion": EXCLUSION}
    plain = {**item, "runId": "r_2", "state": "SUCCEEDED"}
    del plain["exclusion"]
    render.runs({"items": [item, plain], "nextCursor": None}, "nightly", None)
    out = capsys.readouterr().out
    row_1 = next(line for line in out.splitlines() if "r_1" in line)
    row_2 = next(line for line in out.splitlines() if "r_2" in line)
    assert "SKIPPED (excluded by calendar 'us-holidays' r3: 2026-12-25)" in " ".join(
        row_1.split())
    assert "calendar" not in row_2


def test_a_schedules_next_instants_mark_the_excluded_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = {"scheduleId": "nightly", "state": "ACTIVE", "revision": 1,
           "definition": {"cron": "0 9 * * *", "timezone": "America/New_York",
                          "job": {"type": "echo"}, "exclude": ["us-holidays"]},
           "nextRunAt": "2026-12-24T14:00:00Z", "createdAt": "2026-01-01T00:00:00Z",
           "updatedAt": "2026-01-01T00:00:00Z", "resume": None, "preview": [
               {"scheduledAt": "2026-12-24T14:00:00Z", "dueAt": "2026-12-24T14:00:00Z",
                "local": "2026-12-24T09:00:00-05:00"},
               {"scheduledAt": "2026-12-25T14:00:00Z", "dueAt": "2026-12-25T14:00:00Z",
                "local": "2026-12-25T09:00:00-05:00",
                "excluded": {"calendar": "us-holidays", "entry": "2026-12-25"}}]}
    render.schedule(doc)
    lines = [" ".join(line.replace("│", " ").split())
             for line in capsys.readouterr().out.splitlines()]
    assert any(line.startswith("2 2026-12-25T14:00:00Z") and line.endswith(
        "by calendar 'us-holidays': 2026-12-25") for line in lines), lines
    first = next(line for line in lines if line.startswith("1 2026-12-24T14:00:00Z"))
    assert "calendar" not in first
