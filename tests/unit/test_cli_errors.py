"""The one line of a command-line error: ``error: <flag or field>: <message>``, once.

The line builders (``chronolog.cli.errors``), the words of the ID rules
(``chronolog.domain.limits.id_problem``) and of pydantic's errors
(``chronolog.queries.documents.plain_message``), and a few invocations of the command line.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from chronolog.cli.errors import Failure, UsageError, error_line, set_flags, where_of
from chronolog.cli.main import main
from chronolog.domain import messages as m
from chronolog.domain.limits import id_problem
from chronolog.queries.documents import ScheduleDefinition, plain_message

FLAGS = {"--every", "--max-attempts", "--tz", "--job", "--at", "--url"}


def test_an_invalid_value_is_named_by_its_flag() -> None:
    assert error_line("invalid every 'xx': expected a number with a unit", flags=FLAGS) == (
        "error: --every: 'xx': expected a number with a unit")
    assert error_line("invalid retry.maxAttempts '0' (--max-attempts): must be at least 1",
                      flags=FLAGS) == "error: --max-attempts: '0': must be at least 1"
    assert where_of("retry.maxAttempts", FLAGS) == "--max-attempts"
    assert where_of("timezone", FLAGS) == "--tz"
    assert where_of("job.type", FLAGS) == "--job"
    assert where_of("scheduleId", FLAGS) == "schedule ID"
    assert where_of("colour", FLAGS) == "colour"  # no such flag: the field


def test_error_is_said_once() -> None:
    assert error_line("error: error: --url: bad") == "error: --url: bad"
    assert str(UsageError("error: need the API (--url)")) == "error: need the API (--url)"
    assert error_line("invalid url: --url (the API) and --log exclude each other",
                      flags=FLAGS) == "error: --url (the API) and --log exclude each other"


def test_an_error_is_one_line() -> None:
    line = error_line("invalid every 'a\nb': bad\r\nvalue", flags=FLAGS)
    assert "\n" not in line and "\r" not in line and line.startswith("error: --every: ")


def test_a_value_the_api_refused_names_the_flag_once() -> None:
    set_flags(FLAGS)
    try:
        refused = Failure("invalid", "invalid at '1999-01-01T00:00:00Z': in the past", "at")
        assert str(refused) == "error: --at: '1999-01-01T00:00:00Z': in the past"
        by_model = Failure("invalid", "retry.maxAttempts: must be at most 100",
                           "retry.maxAttempts")
        assert str(by_model) == "error: --max-attempts: must be at most 100"
        assert str(Failure("not_found", "no schedule 'x'")) == "error: not_found: no schedule 'x'"
    finally:
        set_flags(())


def test_an_id_problem_says_in_words_what_an_id_may_contain() -> None:
    assert id_problem("schedule ID", "a b") == (
        "schedule ID 'a b': letters, digits and _ . : @ - only, not only dots, "
        "1-200 characters")
    assert id_problem("schedule ID", "..") is not None
    assert id_problem("schedule ID", "x" * 201) is not None
    assert id_problem("schedule ID", "nightly.report:eu@v2") is None
    assert id_problem("run ID", "r_\x7f") == (
        "run ID 'r_\\x7f': letters, digits and _ - only, 1-64 characters")
    assert id_problem("run ID", "r_0123abcd") is None


def _first_error(body: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(ValidationError) as exc:
        ScheduleDefinition.model_validate(body)
    return dict(exc.value.errors()[0])


@pytest.mark.parametrize(("body", "words"), [
    ({"every": "1m", "job": 5}, "must be a JSON object"),
    ({"every": "1m", "job": {"type": "x"}, "effects": {}}, "must be a JSON array"),
    ({"every": "1m", "job": {"type": "x"}, "priority": 1000}, "must be at most 100"),
    ({"every": "1m", "job": {"type": "x"}, "retry": {"maxAttempts": 0}}, "must be at least 1"),
    ({"every": "1m", "job": {"type": "x"}, "resourceClass": "a b"},
     "letters, digits and _ - only, 1-64 characters"),
    ({"every": "1m", "job": {"type": "x"}, "overlap": "sometimes"}, "must be one of "),
    ({"every": "1m", "job": {"type": "x"}, "maxCount": "many"}, "must be an integer"),
])
def test_pydantic_errors_read_as_plain_words(body: dict[str, Any], words: str) -> None:
    message = plain_message(_first_error(body))
    assert message.startswith(words), message
    assert "Input should" not in message and "String should" not in message


def test_a_rule_of_chronolog_is_said_as_it_says_it() -> None:
    with pytest.raises(ValidationError) as exc:
        m.JobSpec.model_validate({"type": "x", "timeout": -1})
    assert plain_message(exc.value.errors()[0]).startswith("must not be negative")


@pytest.mark.parametrize(("argv", "line"), [
    (["schedule", "create", "a b", "--every", "1m", "--job", "echo"],
     "error: schedule ID 'a b': letters, digits and _ . : @ - only, not only dots, "
     "1-200 characters"),
    (["schedule", "create", "s1", "--every", "1m", "--job", "echo", "--max-attempts", "0"],
     "error: --max-attempts: '0': must be at least 1"),
    (["schedule", "create", "s1", "--every", "1m", "--job", "echo", "--effects", "[5]"],
     "error: --effects: '[5]': must be a JSON object"),
    (["schedule", "create", "s1", "--cron", "0 9 * * *", "--tz", "Mars/Base", "--job", "echo"],
     "error: --tz: 'Mars/Base': "),
])
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str,
) -> None:
    rc = main([*argv, "--log", "sqlite:///nonexistent/x.db"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(line), err
    assert err.count("error:") == 1


@pytest.mark.parametrize(("argv", "line"), [
    # a mutually exclusive group
    (["schedule", "create", "s1", "--every", "30s", "--at", "2030-01-01T00:00:00Z"],
     "error: --at: not allowed with --every"),
    (["preview", "--every", "1m", "--cron", "* * * * *"],
     "error: --cron: not allowed with --every"),
    # a required group, a required argument, a required sub-command
    (["preview"], "error: --cron | --every | --at: one of them is required"),
    (["schedule", "create", "--every", "1m"], "error: ID: required"),
    (["schedule"], "error: ACTION: required"),
    # an invalid choice, of an option and of a sub-command
    (["preview", "--cron", "0 2 * * *", "--dst-ambiguous", "sometimes"],
     "error: --dst-ambiguous: 'sometimes': choose from first, second, both"),
    (["schedule", "frobnicate"], "error: ACTION: 'frobnicate': choose from "),
    # an unrecognized argument, with and without a value
    (["preview", "--cron", "* * * * *", "--colour", "red"],
     "error: --colour: unrecognized argument (then: red)"),
    (["preview", "--cron", "* * * * *", "--colour=red"], "error: --colour: unrecognized argument"),
    # a value argparse's type refused, named by the long flag
    (["preview", "--cron", "* * * * *", "-n", "x"],
     "error: --count: 'x': expected a whole number (ASCII digits)"),
    (["repartition", "--to", "x"], "error: --to: 'x': expected a whole number"),
])
def test_argparse_errors_are_one_line_naming_the_flag_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str,
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "", err
    assert len(err.splitlines()) == 1 and err.startswith(line), err


def _leaf_commands() -> list[list[str]]:
    """Every (sub-)command path of ``chronolog``: ``["schedule", "create"]``, ``["preview"]``."""
    paths: list[list[str]] = []

    def walk(parser: Any, path: list[str]) -> None:
        subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            paths.append(path)
        for action in subs:
            for name, child in action.choices.items():
                walk(child, [*path, name])

    from chronolog.cli.main import build_parser

    walk(build_parser(), [])
    return paths


@pytest.mark.parametrize("path", _leaf_commands(), ids=" ".join)
def test_every_command_refuses_an_unknown_flag_in_one_line(
    capsys: pytest.CaptureFixture[str], path: list[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*path, "--no-such-flag"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "", err
    assert len(err.splitlines()) == 1, err
    # the unknown flag, or first what the command misses (a required argument or group)
    assert re.fullmatch(r"error: (--no-such-flag: unrecognized argument|[\w-]+: required"
                        r"( \(as .+\))?|--[\w-]+( \| --[\w-]+)+: one of them is required)\n",
                        err), err


@pytest.mark.parametrize(("message", "where", "line"), [
    # the field is named once, by its flag; a field it refers to is named by its flag too
    ("end must be after start", "end", "error: --end: must be after --start"),
    ("invalid lease '0': lease must be positive, got 0.0", None,
     "error: --lease: '0': must be positive, got 0.0"),
    ("--schedule: schedule ID 'a b': letters", None, "error: --schedule: 'a b': letters"),
    ("invalid from 'x': after to 'y'", None, "error: --from: 'x': after --to 'y'"),
    ("anchor only applies to every", "anchor", "error: --anchor: only applies to --every"),
    # a word that is no flag of the command stays a word
    ("the cursor belongs to another query", "--after",
     "error: --after: the cursor belongs to another query"),
])
def test_a_field_is_named_once_and_by_its_flag(message: str, where: str | None,
                                                line: str) -> None:
    flags = {"--end", "--start", "--lease", "--schedule", "--from", "--to", "--anchor",
             "--every", "--after"}
    named = None if where is None else where_of(where, flags)
    assert error_line(message, named, flags) == line
