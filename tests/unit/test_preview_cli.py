"""``chronolog preview`` run as a real subprocess of the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.docs import sh_commands, text_block

ROOT = Path(__file__).resolve().parents[2]
CHRONOLOG = next(
    (p for p in (ROOT / ".venv" / "bin" / "chronolog", Path(sys.executable).with_name("chronolog"))
     if p.exists()),
    ROOT / ".venv" / "bin" / "chronolog",
)


# the dashboard's words for the marks (chronolog.domain.recurrence.dst_marks)
SHIFTED = "the wall time does not exist that day (clocks go forward): shifted forward"
REPEATED = "this wall time happens twice (clocks go back): policy ambiguous="
LEFT_OUT = "the repetition of this wall time is left out: policy ambiguous="
GAP_SKIPPED = "the wall time does not exist that day (clocks go forward): policy nonexistent=skip"


def preview(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHRONOLOG), "preview", *args], capture_output=True, text=True,
                          timeout=60)


def test_json_output_has_exact_shape_for_new_york_gap() -> None:
    result = preview("--cron", "30 2 * * *", "--tz", "America/New_York", "--from",
                     "2026-03-07T00:00:00Z", "-n", "3", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "instants": [
            {"utc": "2026-03-07T07:30:00Z", "local": "2026-03-07T02:30:00-05:00",
             "dst": None, "note": None},
            {"utc": "2026-03-08T07:00:00Z", "local": "2026-03-08T03:00:00-04:00",
             "dst": "shifted", "note": SHIFTED},
            {"utc": "2026-03-09T06:30:00Z", "local": "2026-03-09T02:30:00-04:00",
             "dst": None, "note": None},
        ],
        "skipped": [],
    }


def test_default_count_is_five_and_default_from_is_now() -> None:
    result = preview("--cron", "*/5 * * * *", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["instants"]
    assert len(rows) == 5 and all(set(row) == {"utc", "local", "dst", "note"} for row in rows)
    assert rows == sorted(rows, key=lambda row: row["utc"])


def test_naive_from_is_wall_time_in_tz() -> None:
    result = preview("--cron", "0 * * * *", "--tz", "Europe/London", "--from", "2026-07-01T09:30",
                     "-n", "1", "--json")
    assert json.loads(result.stdout) == {
        "instants": [{"utc": "2026-07-01T09:00:00Z", "local": "2026-07-01T10:00:00+01:00",
                      "dst": None, "note": None}],
        "skipped": []}


def test_every_without_anchor_is_anchored_at_from() -> None:
    result = preview("--every", "90m", "--from", "2026-01-01T00:00:00Z", "-n", "2", "--json")
    assert ([row["utc"] for row in json.loads(result.stdout)["instants"]]
            == ["2026-01-01T01:30:00Z", "2026-01-01T03:00:00Z"])


def test_every_with_anchor_aligns_to_it() -> None:
    result = preview("--every", "PT15M", "--anchor", "2026-01-01T00:07:00Z", "--from",
                     "2026-01-01T10:00:00Z", "-n", "2", "--json")
    assert ([row["utc"] for row in json.loads(result.stdout)["instants"]]
            == ["2026-01-01T10:07:00Z", "2026-01-01T10:22:00Z"])


def test_at_in_the_past_prints_no_instants() -> None:
    result = preview("--at", "2020-01-01T00:00:00Z", "--from", "2026-01-01T00:00:00Z", "--json")
    assert result.returncode == 0 and json.loads(result.stdout) == {"instants": [],
                                                                     "skipped": []}


def test_human_output_is_a_table_with_utc_and_local_columns() -> None:
    result = preview("--cron", "0 * * * *", "--tz", "America/New_York", "--from",
                     "2026-11-01T04:30:00Z", "-n", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "UTC" in lines[0] and "America/New_York" in lines[0]
    assert "2026-11-01T05:00:00Z" in lines[1] and "2026-11-01T01:00:00-04:00" in lines[1]
    assert "2026-11-01T06:00:00Z" in lines[2] and "2026-11-01T01:00:00-05:00" in lines[2]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--cron", "61 * * * *"], "error: --cron: '61 * * * *': minute 61 out of range 0-59"),
        (["--cron", "* * * * *", "--tz", "Mars/Base"],
         "error: --tz: 'Mars/Base': unknown IANA zone"),
        (["--every", "5x"], "error: --every: '5x': unknown unit 'x' (use ms, s, m, h, d, w)"),
        (["--at", "soon"],
         "error: --at: 'soon': not an ISO-8601 date-time such as 2026-03-08T09:00:00Z"),
        (["--cron", "* * * * *", "--from", "2026-13-01"],
         "error: --from: '2026-13-01': not an ISO-8601 date-time such as 2026-03-08T09:00:00Z"),
        (["--every", "1h", "--anchor", "x"],
         "error: --anchor: 'x': not an ISO-8601 date-time such as 2026-03-08T09:00:00Z"),
        (["--cron", "* * * * *", "-n", "0"], "error: n: '0': must be between 1 and 10000"),
        (["--cron", "² * * * *"],
         "error: --cron: '² * * * *': minute '²' is not a number (ASCII digits)"),
        (["--cron", "0 ¹ * * *"],
         "error: --cron: '0 ¹ * * *': hour '¹' is not a number (ASCII digits)"),
        (["--cron", "*/² * * * *"],
         "error: --cron: '*/² * * * *': minute step '²' must be a positive integer (ASCII digits)"),
        (["--cron", "0 0 * * 5#٣"],
         "error: --cron: '0 0 * * 5#٣': day-of-week '5#٣': n#k needs k from 1 to 5 (ASCII digits)"),
        (["--every", "٣m"],
         "error: --every: '٣m': not ASCII: write digits 0-9 and a unit, e.g. 90s, 15m, PT15M"),
        (["--every", "99999999999999999999w"],
         "error: --every: '99999999999999999999w': must be at most 316224000 seconds (ten years)"),
        (["--every", "9" * 5000 + "w"],
         "error: --every: '" + "9" * 197 + "...': must be at most 316224000 seconds (ten years)"),
        (["--at", "2026-01-0١T00:00:00Z"],
         "error: --at: '2026-01-0١T00:00:00Z': not ASCII: write "
         "an ISO-8601 date-time such as 2026-03-08T09:00:00Z"),
        (["--cron", "* * * * *", "-n", "٣"],
         "error: --count: '٣': expected a whole number (ASCII digits)"),
    ],
)
def test_invalid_input_exits_2_with_one_line_naming_field_and_value(args: list[str],
                                                                     line: str) -> None:
    result = preview(*args)
    assert result.returncode == 2
    assert result.stderr == line + "\n"
    assert result.stdout == ""


@pytest.mark.parametrize("args", [[], ["--cron", "* * * * *", "--every", "5m"],
                                  ["--at", "2030-01-01", "--cron", "@daily"]])
def test_not_exactly_one_kind_exits_2_with_one_line(args: list[str]) -> None:
    result = preview(*args)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "--cron" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_cron_specials_work_through_preview() -> None:
    # given the last weekday, the last Friday and the second Tuesday of the month, in New York
    def local_of(expr: str) -> list[str]:
        result = preview("--cron", expr, "--tz", "America/New_York", "--from",
                         "2026-05-01T00:00:00Z", "-n", "2", "--json")
        assert result.returncode == 0, result.stderr
        return [row["local"] for row in json.loads(result.stdout)["instants"]]

    # then May 2026 ends on a Sunday, so LW is Friday the 29th, which is also the last Friday
    assert local_of("0 9 LW * *") == ["2026-05-29T09:00:00-04:00", "2026-06-30T09:00:00-04:00"]
    assert local_of("0 9 ? * 5L") == ["2026-05-29T09:00:00-04:00", "2026-06-26T09:00:00-04:00"]
    assert local_of("0 9 ? * TUE#2") == ["2026-05-12T09:00:00-04:00", "2026-06-09T09:00:00-04:00"]
    # and a wrapped hour range on a wrapped weekday range: Thursday 22:00 is not in FRI-MON
    assert (local_of("0 22-1 * * FRI-MON")
            == ["2026-05-01T00:00:00-04:00", "2026-05-01T01:00:00-04:00"])


def test_count_is_the_long_name_of_n_as_in_the_api() -> None:
    args = ("--every", "1h", "--from", "2026-01-01T00:00:00Z", "--json")
    with_count, with_n = preview(*args, "--count", "3"), preview(*args, "-n", "3")
    assert with_count.returncode == 0, with_count.stderr
    assert with_count.stdout == with_n.stdout
    assert len(json.loads(with_count.stdout)["instants"]) == 3


# ---------------------------------------------------------------- daylight saving marks
# Berlin in 2026: the last Sunday of March (the 29th) skips 02:00-03:00 local; the last
# Sunday of October (the 25th) has 02:00-03:00 twice (CEST, +02:00, then CET, +01:00).


def berlin(from_: str, n: str, *flags: str) -> list[str]:
    result = preview("--cron", "0 2 * * *", "--tz", "Europe/Berlin", "--from", from_, "-n", n,
                     *flags)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_spring_forward_instant_is_marked_shifted_with_a_legend_line() -> None:
    lines = berlin("2026-03-27T12:00:00Z", "3")
    assert lines[0].split() == ["#", "UTC", "local", "(Europe/Berlin)", "DST"]
    assert [line.split() for line in lines[1:4]] == [
        ["1", "2026-03-28T01:00:00Z", "2026-03-28T02:00:00+01:00"],
        ["2", "2026-03-29T01:00:00Z", "2026-03-29T03:00:00+02:00", "shifted"],
        ["3", "2026-03-30T00:00:00Z", "2026-03-30T02:00:00+02:00"]]
    assert lines[4:] == ["", f"shifted: {SHIFTED}"]


def test_the_fall_back_instant_is_marked_repeated_and_its_second_pass_listed_skipped() -> None:
    lines = berlin("2026-10-24T12:00:00Z", "3")
    assert [line.split() for line in lines[1:5]] == [
        ["1", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00+02:00", "repeated"],
        ["-", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00+01:00", "skipped"],
        ["2", "2026-10-26T01:00:00Z", "2026-10-26T02:00:00+01:00"],
        ["3", "2026-10-27T01:00:00Z", "2026-10-27T02:00:00+01:00"]]
    assert lines[5:] == ["", f"repeated: {REPEATED}first", f"skipped: {LEFT_OUT}first"]


def test_json_carries_each_mark_and_lists_the_left_out_instants_apart() -> None:
    got = json.loads("\n".join(berlin("2026-10-24T12:00:00Z", "2", "--json")))
    assert got == {
        "instants": [
            {"utc": "2026-10-25T00:00:00Z", "local": "2026-10-25T02:00:00+02:00",
             "dst": "repeated", "note": REPEATED + "first"},
            {"utc": "2026-10-26T01:00:00Z", "local": "2026-10-26T02:00:00+01:00",
             "dst": None, "note": None}],
        "skipped": [
            {"utc": "2026-10-25T01:00:00Z", "local": "2026-10-25T02:00:00+01:00",
             "dst": "skipped", "note": LEFT_OUT + "first"}],
    }


def test_the_dst_flags_choose_what_the_transitions_do_as_on_a_schedule() -> None:
    both = json.loads("\n".join(berlin("2026-10-24T12:00:00Z", "3", "--json",
                                       "--dst-ambiguous", "both")))
    assert [(i["utc"], i["dst"]) for i in both["instants"]] == [
        ("2026-10-25T00:00:00Z", "repeated"), ("2026-10-25T01:00:00Z", "repeated"),
        ("2026-10-26T01:00:00Z", None)] and both["skipped"] == []
    skip = json.loads("\n".join(berlin("2026-03-27T12:00:00Z", "2", "--json",
                                       "--dst-nonexistent", "skip")))
    assert [i["utc"] for i in skip["instants"]] == ["2026-03-28T01:00:00Z",
                                                    "2026-03-30T00:00:00Z"]
    assert skip["skipped"] == [{"utc": "2026-03-29T01:00:00Z",
                                "local": "2026-03-29T03:00:00+02:00", "dst": "skipped",
                                "note": GAP_SKIPPED}]


def test_a_preview_away_from_transitions_has_no_dst_column_nor_legend() -> None:
    lines = berlin("2026-06-01T00:00:00Z", "2")
    assert "DST" not in lines[0] and len(lines) == 3


def test_a_bad_dst_choice_exits_2_with_one_line_naming_the_flag() -> None:
    result = preview("--cron", "0 2 * * *", "--dst-ambiguous", "sometimes")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("error: --dst-ambiguous: 'sometimes': choose from first, second, "
                             "both\n")


def test_the_tours_preview_commands_run_and_the_second_prints_what_the_tour_shows() -> None:
    section = "### Daylight saving, stated"
    commands = sh_commands(ROOT / "docs" / "tour.md", section, prefix=".venv/bin/chronolog ")
    assert len(commands) == 3 and all(cmd[:2] == [".venv/bin/chronolog", "preview"]
                                      for cmd in commands)
    spring, autumn, both = (preview(*cmd[2:]) for cmd in commands)
    assert (spring.returncode, autumn.returncode, both.returncode) == (0, 0, 0)
    assert f"shifted: {SHIFTED}" in spring.stdout.splitlines()
    assert autumn.stdout == text_block(ROOT / "docs" / "tour.md", section)
    assert [line.split()[-1] for line in both.stdout.splitlines()[1:3]] == ["repeated"] * 2
    assert "skipped" not in both.stdout
