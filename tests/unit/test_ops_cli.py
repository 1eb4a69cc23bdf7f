"""``chronolog schedule create|revise``: the local validation of a definition (no services).

Flags and ``--spec FILE.json`` become the API body and the domain ``ScheduleSpec``; bad input
is exit status 2 with one line naming the field and value — for the rule, the very line
``chronolog preview`` prints for the same value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chronolog.cli import render
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
                    "job": {"type": "report", "params": {"full": True}},
                    "misfire": {"policy": "all"},
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
    (["--every", "1s", "--jitter=-5s"], None, "error: --jitter: '-5s': must not be negative"),
    (["--every", "1s", "--params", "{"], None, "error: --params: '{': not JSON"),
    (["--every", "1s", "--max-attempts", "0"], None,
     "error: --max-attempts: '0': must be at least 1"),
    (["--every", "1s", "--job", ""], None, "error: --job: '': "),
    ([], None, "error: schedule: one of --cron, --every, --at, --delay (or --spec) is "
     "required"),
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
    assert capsys.readouterr().err.startswith(
        "error: schedule ID: 'other': the spec names another schedule")
    f.write_text(json.dumps({"every": "1m", "job": {"type": "echo"}, "colour": "red"}))
    assert main(["schedule", "create", "s1", "--spec", str(f)]) == 2
    assert capsys.readouterr().err.strip() == "error: colour: 'red': unknown field"


def test_revise_needs_if_match(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["schedule", "revise", "s1", "--every", "1m", "--job", "echo"])
    assert exc.value.code == 2
    assert "--if-match" in capsys.readouterr().err


@pytest.mark.parametrize("argv,line", [
    (["schedule", "create", "..", "--every", "1h", "--job", "echo"],
     "error: schedule ID '..': letters, digits and _ . : @ - only, not only dots, "
     "1-200 characters"),
    (["schedule", "pause", "a\r\nb"], "error: schedule ID 'a\\r\\nb': "),
    (["cancel", "r_\x7f"], "error: run ID 'r_\\x7f': letters, digits and _ - only"),
    (["schedule", "create", "s1", "--every", "1h", "--job", "echo", "--params",
      '{"a": {"b": "\\u0000"}}'], "error: --params: a.b: text must not contain NUL"),
    (["trigger", "s1", "--params", '{"k\\u0000": 1}'], "error: --params: "),
    (["schedule", "create", "s1", "--every", "99999999999w", "--job", "echo"],
     "error: --every: '99999999999w': must be at most"),
    (["schedule", "create", "s1", "--at", "9999-12-31T23:59:59Z", "--job", "echo"],
     "error: --at: '9999-12-31T23:59:59Z': must be between"),
    (["schedule", "create", "s1", "--cron", "0 ¹ * * *", "--job", "echo"],
     "error: --cron: '0 ¹ * * *': hour '¹' is not a number (ASCII digits)"),
    (["schedule", "create", "s1", "--cron", "0 9 * * 5#6", "--job", "echo"],
     "error: --cron: '0 9 * * 5#6': day-of-week '5#6': n#k needs k from 1 to 5"),
    (["schedule", "create", "s1", "--every", "١h", "--job", "echo"],
     "error: --every: '١h': not ASCII"),
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
     "error: --state: 'RUNNING': expected a comma-separated list of ACTIVE, PAUSED, COMPLETED, "
     "DELETED"),
    (["schedule", "list", "--state", ","],
     "error: --state: ',': expected a comma-separated list of ACTIVE, PAUSED, COMPLETED, "
     "DELETED"),
    (["schedule", "list", "--limit", "0"], "error: --limit: '0': must be 1..500"),
    (["schedule", "list", "--limit", "501"], "error: --limit: '501': must be 1..500"),
    (["schedule", "list", "--prefix", "a\x00"], "error: --prefix: 'a\\x00': 1 to 200 characters"),
    (["schedule", "list", "--prefix", ""], "error: --prefix: '': 1 to 200 characters"),
    (["schedule", "list", "--resource-class", "gpu.x"], "error: --resource-class: 'gpu.x': "),
    (["schedule", "list", "--job-type", ""], "error: --job-type: '': 1 to 200 characters"),
    (["schedule", "list", "--after", "a b"], "error: --after: 'a b': not a cursor of this API"),
    (["schedule", "list", "--after", "bm90LWEtY3Vyc29y"],
     "error: --after: 'bm90LWEtY3Vyc29y': not a cursor of this API"),
    (["runs", "--after", "bm90LWEtY3Vyc29y"],
     "error: --after: 'bm90LWEtY3Vyc29y': not a cursor of this API"),
    (["runs", "s1", "--job-type", "echo", "--after", "bm90LWEtY3Vyc29y"],
     "error: --after: 'bm90LWEtY3Vyc29y': not a cursor of this API"),
    (["runs", "--state", "LOST"], "error: --state: 'LOST': expected "),
    (["runs", "--from", "yesterday"], "error: --from: 'yesterday': not an ISO-8601 date-time"),
    (["runs", "--to", "2026-13-01T00:00:00Z"], "error: --to: '2026-13-01T00:00:00Z': "),
    (["runs", "--from", "2026-05-02T00:00:00Z", "--to", "2026-05-01T00:00:00Z"],
     "error: --from: '2026-05-02T00:00:00Z': after --to '2026-05-01T00:00:00Z'"),
    (["runs", "--limit", "0"], "error: --limit: '0': must be 1..500"),
    (["runs", "s1", "--after", "bm90LWEtY3Vyc29y"],
     "error: --after: 'bm90LWEtY3Vyc29y': not a cursor of this API"),
    (["runs", "..", "--limit", "5"], "error: schedule ID '..': letters, digits and "
     "_ . : @ - only, not only dots, 1-200 characters"),
    (["workers", "list", "--limit", "501"], "error: --limit: '501': must be 1..500"),
    (["workers", "list", "--after", "!!"], "error: --after: '!!': not a cursor of this API"),
    (["cancel", "r_1", "--schedule", "a b"], "error: --schedule: 'a b': letters, digits"),
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
    assert capsys.readouterr().err.strip() == "error: --limit: '10001': must be 1..10000"



def test_a_runs_cursor_serves_only_the_filters_it_was_made_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from datetime import UTC, datetime

    from chronolog.queries.read_model import RunListCursor, RunQuery

    at = datetime(2026, 5, 1, tzinfo=UTC)
    cursor = RunListCursor((at, "r_2"), (at, "r_1")).encode(RunQuery(job_type="echo"))
    rc = main(["runs", "--job-type", "noop", "--after", cursor, "--url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "error: --after: the cursor belongs to another query", err
    rc = main(["runs", "s1", "--after", cursor, "--url", "http://127.0.0.1:9"])  # another list
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "error: --after: the cursor belongs to another query", err


def test_more_attempts_than_the_ceiling_is_exit_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["schedule", "create", "s1", "--every", "1h", "--job", "echo",
               "--max-attempts", "1000", "--log", "sqlite:///nonexistent/x.db"])
    assert rc == 2
    assert capsys.readouterr().err.startswith("error: --max-attempts: '1000': ")
    f = tmp_path / "s1.json"
    f.write_text(json.dumps({"every": "1h", "job": {"type": "echo"},
                             "retry": {"maxAttempts": 101}}))
    assert main(["schedule", "create", "s1", "--spec", str(f)]) == 2
    assert "--max-attempts" in capsys.readouterr().err


# ------------------------------------------------------------------ every field a flag


def test_every_field_of_the_api_body_has_a_create_flag() -> None:
    body, spec = _definition(
        "--delay", "10m", "--start", "2030-01-01T09:00:00", "--end", "2031-01-01T00:00:00Z",
        "--tz", "Europe/Paris", "--max-count", "12", "--job", "report", "--job-timeout", "5m",
        "--misfire", "all", "--misfire-grace", "2m", "--misfire-max-catchup", "7",
        "--misfire-max-age", "1d", "--max-attempts", "4", "--retry-initial-backoff", "2s",
        "--retry-max-backoff", "1m", "--retry-multiplier", "3", "--retry-max-age", "2h",
        "--resource-class", "gpu", "--priority", "-7",
        "--effects", '[{"kind": "webhook", "destination": "hook"}]')
    assert body == {
        "delay": "10m", "timezone": "Europe/Paris", "start": "2030-01-01T08:00:00Z",
        "end": "2031-01-01T00:00:00Z", "maxCount": 12,
        "job": {"type": "report", "timeout": "5m"},
        "misfire": {"policy": "all", "grace": "2m", "maxCatchup": 7, "maxAge": "1d"},
        "retry": {"maxAttempts": 4, "initialBackoff": "2s", "maxBackoff": "1m",
                  "multiplier": 3.0, "maxAge": "2h"},
        "resourceClass": "gpu", "priority": -7,
        "effects": [{"kind": "webhook", "destination": "hook"}]}
    assert (spec.delay, spec.max_count, spec.job.timeout) == (600, 12, 300)
    assert (spec.misfire.grace, spec.misfire.max_catchup, spec.retry.multiplier) == (120, 7, 3)
    assert (spec.resource_class, spec.priority, spec.effects[0].destination) == ("gpu", -7,
                                                                                 "hook")


def test_the_create_flags_cover_every_field_of_the_api_body() -> None:
    """A field added to the API's definition without a flag fails here."""
    from chronolog.cli.schedules import _FIELD_FLAGS
    from chronolog.queries.documents import (
        ConcurrencyIn,
        DstIn,
        JobIn,
        MisfireIn,
        RetryIn,
        ScheduleDefinition,
    )

    nested = {"job": JobIn, "misfire": MisfireIn, "retry": RetryIn, "dst": DstIn,
              "concurrency": ConcurrencyIn}
    fields = set()
    for name, info in ScheduleDefinition.model_fields.items():
        alias = info.alias or name
        sub = nested.get(alias)
        fields |= ({f"{alias}.{i.alias or n}" for n, i in sub.model_fields.items()} if sub
                   else {alias})
    flagged = {".".join(path) for _attr, _flag, path, _kind in _FIELD_FLAGS}
    # the rule flags (--cron --every --at --delay --anchor --tz) and --job, --params
    by_hand = {"cron", "every", "at", "delay", "anchor", "timezone", "job.type", "job.params"}
    assert fields == flagged | by_hand
    parser = build_parser()
    for argv in (["schedule", "create", "s1"], ["schedule", "revise", "s1", "--if-match", "1"]):
        args = parser.parse_args(argv)
        assert all(hasattr(args, attr) for attr, *_ in _FIELD_FLAGS)


@pytest.mark.parametrize(("argv", "line"), [
    (["--max-count", "0"], "error: --max-count: '0': must be at least 1"),
    (["--priority", "101"], "error: --priority: '101': must be at most 100"),
    (["--resource-class", "a b"], "error: --resource-class: 'a b': letters, "
     "digits and _ - only, 1-64 characters"),
    (["--resource-class", "pool-x"], "error: --resource-class: 'pool-x': a "
     "resource class may not start with 'pool-'"),
    (["--start", "soon"], "error: --start: 'soon': not an ISO-8601 date-time"),
    (["--end", "2030-13-01"], "error: --end: '2030-13-01': not an ISO-8601 date-time"),
    (["--job-timeout", "forever"], "error: --job-timeout: 'forever': "),
    (["--misfire-grace=-1s"], "error: --misfire-grace: '-1s': must not be "
     "negative"),
    (["--misfire-max-catchup", "0"], "error: --misfire-max-catchup: '0': "),
    (["--retry-multiplier", "11"], "error: --retry-multiplier: '11.0': "
     "must be at most 10"),
    (["--retry-max-backoff", "x"], "error: --retry-max-backoff: 'x': "),
    (["--effects", "{}"], "error: --effects: '{}': must be a JSON array"),
    (["--effects", "[{"], "error: --effects: '[{': not JSON"),
    (["--effects", '[{"kind": "fax", "destination": "d"}]'],
     "error: --effects: '[{\"kind\": \"fax\", \"destination\": \"d\"}]': effects.kind: must "
     "be one of webhook, email, postgres or kafka"),
    (["--delay", "0s"], "error: --delay: '0s': "),
])
def test_each_new_flag_refuses_a_bad_value_naming_its_field_and_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str,
) -> None:
    rc = main(["schedule", "create", "s1", *(["--every", "1h"] if "--delay" not in argv else []),
               "--job", "echo", *argv, "--log", "sqlite:///nonexistent/x.db"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(line), err
    # revise refuses the same value with the same line
    rc = main(["schedule", "revise", "s1", "--if-match", "1", *argv,
               "--log", "sqlite:///nonexistent/x.db"])
    err_revise = capsys.readouterr().err
    assert rc == 2 and err_revise == err.replace("schedule create", "schedule revise")


def _patch(*argv: str) -> dict:
    from chronolog.cli.schedules import revise_patch

    return revise_patch(build_parser().parse_args(["schedule", "revise", "s1", "--if-match",
                                                    "3", *argv]))


def test_revise_sends_only_the_fields_of_the_flags_given() -> None:
    assert _patch("--every", "30s") == {"every": "30s", "cron": None, "at": None,
                                        "delay": None, "anchor": None}
    assert _patch("--params", '{"n": 2, "gone": null}') == {"job": {"params": {"n": 2,
                                                                              "gone": None}}}
    assert _patch("--max-attempts", "5", "--retry-max-age", "1h") == {
        "retry": {"maxAttempts": 5, "maxAge": "1h"}}
    assert _patch("--misfire", "skip", "--priority", "3") == {"misfire": {"policy": "skip"},
                                                              "priority": 3}
    assert _patch("--job", "other") == {"job": {"type": "other"}}
    assert _patch("--effects", "[]") == {"effects": []}
    assert _patch("--end", "2031-01-01T00:00:00+01:00") == {"end": "2030-12-31T23:00:00Z"}
    assert _patch("--at", "2031-01-01T09:00:00", "--tz", "Asia/Tokyo") == {
        "at": "2031-01-01T00:00:00Z", "timezone": "Asia/Tokyo", "cron": None, "every": None,
        "delay": None, "anchor": None}


@pytest.mark.parametrize(("argv", "line"), [
    ([], "error: revise: nothing to change: pass the flags of the fields to change (or --spec "
     "FILE for the whole definition)"),
    (["--end", "2031-01-01T00:00:00"], "error: --end: '2031-01-01T00:00:00': a time without an "
     "offset needs --tz on revise"),
    (["--cron", "0 9 * * *", "--anchor", "2031-01-01T00:00:00Z"],
     "error: --anchor: '2031-01-01T00:00:00Z': --anchor only applies to --every"),
    (["--params", "[1]"], "error: --params: '[1]': must be a JSON object"),
    (["--cron", "0 25 * * *"], "error: --cron: '0 25 * * *': "),
])
def test_revise_refuses_bad_flags_before_anything_is_sent(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str,
) -> None:
    rc = main(["schedule", "revise", "s1", "--if-match", "1", *argv,
               "--log", "sqlite:///nonexistent/x.db"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(line), err


def test_revise_help_says_it_changes_only_what_is_passed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["schedule", "revise", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Change only what is passed" in text
    assert "--spec FILE instead REPLACES the whole definition" in text
    assert "it REPLACES the current one" in text


def test_a_trigger_whose_runs_final_state_is_not_held_says_where_to_look(
        capsys: pytest.CaptureFixture[str]) -> None:
    render.triggered("nightly", {"runId": "m_1", "state": None})
    render.triggered("nightly", {"runId": "m_2", "state": "SUCCEEDED"})
    assert capsys.readouterr().out.splitlines() == [
        "triggered run m_1 of nightly: finished (chronolog run m_1 tells how)",
        "triggered run m_2 of nightly: SUCCEEDED"]
