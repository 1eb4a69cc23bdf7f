"""What ``chronolog run RUN_ID`` prints for a run (``chronolog.cli.render.run``)."""

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
