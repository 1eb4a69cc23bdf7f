"""``chronolog schedule create|revise``: the local validation of a definition (no services).

Flags and ``--spec FILE.json`` become the API body and the domain ``ScheduleSpec``; bad input
is exit status 2 with one line naming the field and value — for the rule, the very line
``chronolog preview`` prints for the same value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chronolog.cli.main import build_parser, main
from chronolog.cli.schedules import build_definition


def _definition(*argv: str) -> tuple[dict, object]:
    args = build_parser().parse_args(["schedule", "create", "s1", *argv])
    return build_definition(args, "s1")


def test_flags_become_the_api_body_and_the_spec() -> None:
    body, spec = _definition("--cron", "30 9 * * 1-5", "--tz", "Europe/Paris", "--job", "report",
                             "--params", '{"full": true}', "--misfire", "all", "--overlap",
                             "buffer_one", "--max-attempts", "5", "--lease", "2m",
                             "--start-deadline", "10m", "--jitter", "30s",
                             "--dst-ambiguous", "both")
    assert body == {"cron": "30 9 * * 1-5", "timezone": "Europe/Paris",
                    "job": {"type": "report", "params": {"full": True}}, "misfire": "all",
                    "overlap": "buffer_one", "retry": {"maxAttempts": 5}, "lease": "2m",
                    "startDeadline": "10m", "jitter": "30s", "dst": {"ambiguous": "both"}}
    assert spec.lease == 120 and spec.start_deadline == 600 and spec.retry.max_attempts == 5
    assert spec.misfire.policy == "all" and spec.dst.ambiguous == "both"


def test_naive_at_and_anchor_are_wall_times_in_tz() -> None:
    body, _spec = _definition("--at", "2030-01-15T09:00:00", "--tz", "America/New_York",
                             "--job", "echo")
    assert body["at"] == "2030-01-15T14:00:00Z"
    body, _ = _definition("--every", "1h", "--anchor", "2030-07-01T00:30:00", "--tz",
                          "Europe/Berlin", "--job", "echo")
    assert body["anchor"] == "2030-06-30T22:30:00Z"


def test_a_spec_file_with_flags_overriding_it(tmp_path: Path) -> None:
    f = tmp_path / "s1.json"
    f.write_text(json.dumps({"scheduleId": "s1", "cron": "0 3 * * *", "timezone": "UTC",
                             "job": {"type": "report", "params": {"a": 1}},
                             "retry": {"initialBackoff": "5s"}}))
    body, spec = _definition("--spec", str(f), "--every", "15m", "--max-attempts", "2")
    assert "cron" not in body and body["every"] == "15m"
    assert body["retry"] == {"initialBackoff": "5s", "maxAttempts": 2}
    assert spec.every == 900 and spec.job.params == {"a": 1}


@pytest.mark.parametrize(("argv", "preview", "line"), [
    (["--cron", "0 25 * * *"], ["--cron", "0 25 * * *"], None),
    (["--every", "often"], ["--every", "often"], None),
    (["--cron", "0 9 * * *", "--tz", "Europe/Atlantis"],
     ["--cron", "0 9 * * *", "--tz", "Europe/Atlantis"], None),
    (["--at", "tomorrow"], ["--at", "tomorrow"], None),
    (["--every", "1s", "--anchor", "x"], ["--every", "1s", "--anchor", "x"], None),
    (["--every", "1s", "--jitter=-5s"], None, "invalid jitter '-5s': must not be negative"),
    (["--every", "1s", "--params", "{"], None, "invalid params '{': not JSON"),
    (["--every", "1s", "--max-attempts", "0"], None,
     "invalid retry.maxAttempts '0': must be >= 1"),
    (["--every", "1s", "--job", ""], None, "invalid job.type '': "),
    ([], None, "invalid schedule: one of --cron, --every, --at (or --spec) is required"),
])
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], preview: list[str] | None,
    line: str | None,
) -> None:
    job = [] if "--job" in argv else ["--job", "echo"]
    rc = main(["schedule", "create", "s1", *argv, *job, "--log", "sqlite:///nonexistent/x.db"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    if preview is not None:
        assert main(["preview", *preview]) == 2
        assert err == capsys.readouterr().err  # the same line as chronolog preview
    else:
        assert err.startswith(line), err


def test_spec_naming_another_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"scheduleId": "other", "every": "1m", "job": {"type": "echo"}}))
    assert main(["schedule", "create", "s1", "--spec", str(f)]) == 2
    assert capsys.readouterr().err.startswith("invalid scheduleId 'other': ")
    f.write_text(json.dumps({"every": "1m", "job": {"type": "echo"}, "colour": "red"}))
    assert main(["schedule", "create", "s1", "--spec", str(f)]) == 2
    assert capsys.readouterr().err.strip() == "invalid colour 'red': unknown field"


def test_revise_needs_if_match(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["schedule", "revise", "s1", "--every", "1m", "--job", "echo"])
    assert exc.value.code == 2
    assert "--if-match" in capsys.readouterr().err


@pytest.mark.parametrize("argv,line", [
    (["schedule", "create", "..", "--every", "1h", "--job", "echo"], "invalid scheduleId '..': "),
    (["schedule", "pause", "a\r\nb"], "invalid scheduleId 'a\\r\\nb': "),
    (["cancel", "r_\x7f"], "invalid runId 'r_\\x7f': "),
    (["schedule", "create", "s1", "--every", "1h", "--job", "echo", "--params",
      '{"a": {"b": "\\u0000"}}'], "invalid job.params: a.b: text must not contain NUL"),
    (["trigger", "s1", "--params", '{"k\\u0000": 1}'], "invalid params: "),
    (["schedule", "create", "s1", "--every", "99999999999w", "--job", "echo"],
     "invalid every '99999999999w': must be at most"),
    (["schedule", "create", "s1", "--at", "9999-12-31T23:59:59Z", "--job", "echo"],
     "invalid at '9999-12-31T23:59:59Z': must be between"),
    (["schedule", "create", "s1", "--cron", "0 ¹ * * *", "--job", "echo"],
     "invalid cron '0 ¹ * * *': hour '¹' is not a number (ASCII digits)"),
    (["schedule", "create", "s1", "--cron", "0 9 * * 5#6", "--job", "echo"],
     "invalid cron '0 9 * * 5#6': day-of-week '5#6': n#k needs k from 1 to 5"),
    (["schedule", "create", "s1", "--every", "١h", "--job", "echo"],
     "invalid every '١h': not ASCII"),
])
def test_limits_are_usage_errors_before_anything_is_sent(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str,
) -> None:
    rc = main([*argv, "--log", "sqlite:///nonexistent/x.db"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(line), err


def test_the_cron_specials_pass_through_schedule_create() -> None:
    body, spec = _definition("--cron", "0 18 LW * *", "--tz", "Europe/Paris", "--job",
                             "close-books")
    assert body["cron"] == "0 18 LW * *" and spec.cron == "0 18 LW * *"
    body, spec = _definition("--cron", "0 9 ? * MON#1,5L", "--job", "report")
    assert body["cron"] == spec.cron == "0 9 ? * MON#1,5L"


@pytest.mark.parametrize("argv,line", [
    (["schedule", "list", "--state", "RUNNING"],
     "invalid state 'RUNNING': expected a comma-separated list of ACTIVE, PAUSED, COMPLETED, "
     "DELETED"),
    (["schedule", "list", "--state", ","],
     "invalid state ',': expected a comma-separated list of ACTIVE, PAUSED, COMPLETED, "
     "DELETED"),
    (["schedule", "list", "--limit", "0"], "invalid limit '0': must be 1..500"),
    (["schedule", "list", "--limit", "501"], "invalid limit '501': must be 1..500"),
    (["schedule", "list", "--prefix", "a\x00"], "invalid prefix 'a\\x00': 1 to 200 characters"),
    (["schedule", "list", "--prefix", ""], "invalid prefix '': 1 to 200 characters"),
    (["schedule", "list", "--resource-class", "gpu.x"], "invalid resourceClass 'gpu.x': "),
    (["schedule", "list", "--job-type", ""], "invalid jobType '': 1 to 200 characters"),
    (["schedule", "list", "--after", "a b"], "invalid after 'a b': not a cursor of this API"),
    (["schedule", "list", "--after", "bm90LWEtY3Vyc29y"],
     "invalid after 'bm90LWEtY3Vyc29y': not a cursor of this API"),
    (["runs", "--after", "bm90LWEtY3Vyc29y"],
     "invalid after 'bm90LWEtY3Vyc29y': not a cursor of this API"),
    (["runs", "s1", "--job-type", "echo", "--after", "bm90LWEtY3Vyc29y"],
     "invalid after 'bm90LWEtY3Vyc29y': not a cursor of this API"),
    (["runs", "--state", "LOST"], "invalid state 'LOST': expected "),
    (["runs", "--from", "yesterday"], "invalid from 'yesterday': not an ISO-8601 date-time"),
    (["runs", "--to", "2026-13-01T00:00:00Z"], "invalid to '2026-13-01T00:00:00Z': "),
    (["runs", "--from", "2026-05-02T00:00:00Z", "--to", "2026-05-01T00:00:00Z"],
     "invalid from '2026-05-02T00:00:00Z': after to '2026-05-01T00:00:00Z'"),
    (["runs", "--limit", "0"], "invalid limit '0': must be 1..500"),
    (["runs", "s1", "--after", "bm90LWEtY3Vyc29y"],
     "invalid after 'bm90LWEtY3Vyc29y': not a cursor of this API"),
    (["runs", "..", "--limit", "5"], "invalid scheduleId '..': "),
    (["workers", "list", "--limit", "501"], "invalid limit '501': must be 1..500"),
    (["workers", "list", "--after", "!!"], "invalid after '!!': not a cursor of this API"),
    (["cancel", "r_1", "--schedule", "a b"], "invalid schedule 'a b': not a schedule ID"),
])
def test_list_and_query_flags_are_checked_before_sending(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str,
) -> None:
    # a URL nothing listens on: the input is refused before anything is sent
    rc = main([*argv, "--url", "http://127.0.0.1:9"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(line), err


def test_the_direct_schedule_list_keeps_its_own_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["schedule", "list", "--limit", "10001", "--log",
                 "sqlite:///nonexistent/x.db"]) == 2
    assert capsys.readouterr().err.strip() == "invalid limit '10001': must be 1..10000"



def test_a_runs_cursor_serves_only_the_filters_it_was_made_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from datetime import UTC, datetime

    from chronolog.queries.read_model import RunListCursor, RunQuery

    at = datetime(2026, 5, 1, tzinfo=UTC)
    cursor = RunListCursor((at, "r_2"), (at, "r_1")).encode(RunQuery(job_type="echo"))
    rc = main(["runs", "--job-type", "noop", "--after", cursor, "--url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "invalid after: the cursor belongs to another query", err
    rc = main(["runs", "s1", "--after", cursor, "--url", "http://127.0.0.1:9"])  # another list
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "invalid after: the cursor belongs to another query", err


def test_more_attempts_than_the_ceiling_is_exit_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["schedule", "create", "s1", "--every", "1h", "--job", "echo",
               "--max-attempts", "1000", "--log", "sqlite:///nonexistent/x.db"])
    assert rc == 2
    assert capsys.readouterr().err.startswith("invalid retry.maxAttempts '1000': ")
    f = tmp_path / "s1.json"
    f.write_text(json.dumps({"every": "1h", "job": {"type": "echo"},
                             "retry": {"maxAttempts": 101}}))
    assert main(["schedule", "create", "s1", "--spec", str(f)]) == 2
    assert "retry.maxAttempts" in capsys.readouterr().err
