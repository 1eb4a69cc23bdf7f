"""Errors of the command line: bad local input (exit status 2) and a refused or undecidable
operation (exit status 1), each printed as one line ``error: <where>: <message>``
(``error_line``): ``where`` is the flag the value came from (``--every``), or the field or
argument when no flag names it (``schedule ID``); the prefix is never doubled."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

__all__ = ["Failure", "UsageError", "argparse_line", "error_line", "set_flags", "where_of"]

# the options of the command being run (``set_flags``, by ``chronolog.cli.main``): a field
# whose flag is among them is named by its flag
_flags: frozenset[str] = frozenset()

# ``invalid <name> '<value>' (--flag): <why>``: how the checks of the command line say it
_INVALID = re.compile(r"invalid (?P<name>[^\s']+)(?: '(?P<value>.*?)')?"
                      r"(?: \((?P<flag>--[\w-]+)\))?: (?P<why>.*)", re.DOTALL)
_FLAGGED = re.compile(r"(?P<flag>--[\w-]+): (?P<why>.*)", re.DOTALL)
_ARGUMENTS = {"scheduleId": "schedule ID", "runId": "run ID"}
# fields whose flag is not their name
_ALIASES = {"timezone": "--tz", "job.type": "--job", "job.timeout": "--job-timeout"}


def set_flags(flags: Collection[str]) -> None:
    """The options (``--every``, ...) of the command being run."""
    global _flags
    _flags = frozenset(flags)


def _kebab(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", name).lower()


def where_of(field: str, flags: Collection[str] | None = None) -> str:
    """How a line names a field: its flag when the command has one (``retry.maxAttempts`` ->
    ``--max-attempts``, ``every`` -> ``--every``), else the field (``schedule ID``)."""
    known = _flags if flags is None else flags
    if field.startswith("--"):
        return field
    if field in _ARGUMENTS:
        return _ARGUMENTS[field]
    parts = field.split(".")
    for candidate in (_ALIASES.get(field, ""), f"--{_kebab('-'.join(parts))}",
                      f"--{_kebab(parts[-1])}", f"--{_kebab(field)}"):
        if candidate in known:
            return candidate
    return field


def error_line(message: str, where: str | None = None,
               flags: Collection[str] | None = None) -> str:
    """``error: <where>: <message>`` on one line. ``where`` defaults to what the message
    names: ``invalid every 'xx': expected ...`` is ``error: --every: 'xx': expected ...``;
    a message that names nothing is ``error: <message>``; ``error:`` is never doubled."""
    text = " ".join(message.replace("\r", " ").replace("\n", " ").split(" "))
    while text.startswith("error: "):
        text = text.removeprefix("error: ")
    if where is None:
        found = _INVALID.fullmatch(text)
        named = _FLAGGED.fullmatch(text)
        if named is not None:  # ``--flag: why``: the caller named the flag
            where, text = named["flag"], named["why"]
        elif found is not None:
            where = found["flag"] or where_of(found["name"], flags)
            value = found["value"]
            text = found["why"] if value is None else f"'{value}': {found['why']}"
    if where is None or text.startswith(f"{where} "):  # it names it already
        return f"error: {text}"
    text = text.removeprefix(f"{where}: ")
    return f"error: {where}: {_named_once(text, where, flags)}"


# ``'<value>': `` at the start of a message (the value, quoted, said before why)
_VALUE = re.compile(r"'(?:[^']|'')*?': ")
# a field a message refers to after one of these words is named by its flag when it has one
_REFERENCE = re.compile(r"\b(after|before|than|with|to) ([a-z][\w.]*)\b")


def _named_once(text: str, where: str, flags: Collection[str] | None) -> str:
    """``text`` with no second name of ``where`` (``end must be after start`` after
    ``--end:`` is ``must be after --start``; ``schedule ID 'a b': ...`` after ``--schedule:``
    is ``'a b': ...``), and the fields it refers to named by their flags."""
    value = _VALUE.match(text)
    head, rest = (text[: value.end()], text[value.end():]) if value else ("", text)
    plain = where.removeprefix("--")
    names = {plain, plain.replace("-", " ")} | {
        name for name in _ARGUMENTS.values() if name.split(" ")[0] == plain}
    for name in sorted(names, key=len, reverse=True):
        if rest.startswith(f"{name} ") and len(rest) > len(name) + 1:
            rest = rest[len(name) + 1:]
            break

    def flag(found: re.Match[str]) -> str:
        named = where_of(found[2], flags)
        return f"{found[1]} {named}" if named.startswith("--") else found[0]

    return head + _REFERENCE.sub(flag, rest)


# argparse's own messages (``_Parser.error``): the argument they are about, and why
_ARGPARSE = (
    (re.compile(r"argument (?P<names>[^:]+): (?P<why>.*)", re.DOTALL), "argument"),
    (re.compile(r"one of the arguments (?P<names>.+) is required"), "group"),
    (re.compile(r"the following arguments are required: (?P<names>.+)"), "required"),
    (re.compile(r"unrecognized arguments: (?P<names>.+)"), "unrecognized"),
)


def argparse_line(message: str) -> str:
    """One of argparse's own errors as ``error: <flag>: <message>``, like every other usage
    error: ``argument --at: not allowed with argument --every`` is ``error: --at: not allowed
    with --every``; a missing, unknown or badly chosen argument is named first."""
    for pattern, kind in _ARGPARSE:
        found = pattern.fullmatch(message)
        if found is None:
            continue
        names = found["names"]
        if kind == "group":
            return f"error: {' | '.join(names.split())}: one of them is required"
        if kind == "required":
            first, *rest = names.split(", ")
            also = f" (as {', '.join(rest)} {'is' if len(rest) == 1 else 'are'})" if rest else ""
            return f"error: {first}: required{also}"
        if kind == "unrecognized":
            first, *rest = names.split(" ")
            flag = first.split("=", 1)[0]
            return (f"error: {flag}: unrecognized argument"
                    + (f" (then: {' '.join(rest)})" if rest else ""))
        where = names.split("/")[-1]  # -n/--count: the long flag
        return error_line(_argparse_why(found["why"]), where)
    return error_line(message)


def _argparse_why(why: str) -> str:
    """argparse's reason, in the words of the other usage errors."""
    why = re.sub(r"not allowed with argument (\S+)", r"not allowed with \1", why)
    choice = re.fullmatch(r"invalid choice: (?P<value>'.*?') \(choose from (?P<of>.*)\)", why)
    if choice is not None:
        return f"{choice['value']}: choose from {choice['of'].replace(chr(39), '')}"
    typed = re.fullmatch(r"invalid (?P<type>int|float) value: (?P<value>'.*')", why)
    if typed is not None:
        expected = "a whole number" if typed["type"] == "int" else "a number"
        return f"{typed['value']}: expected {expected}"
    invalid = _INVALID.fullmatch(why)  # a type's own check: ``invalid n '3x': ...``
    if invalid is not None and invalid["value"] is not None:
        return f"'{invalid['value']}': {invalid['why']}"
    return why


class UsageError(Exception):
    """Bad input from the user: printed as one line (``error_line``), exit status 2."""

    def __str__(self) -> str:
        return error_line(str(self.args[0]) if self.args else "invalid input")


class Failure(Exception):
    """A refused or undecidable operation: exit status 1, one line: ``error: <where>:
    <message>`` when the API named the field it refused (``where_of``), else ``error:
    <status>: <message>``.

    ``body`` is the HTTP API's error body as it answered (``--json`` prints it as is); without
    one the document is ``{"error", "field", "message", **extra}``, as the API would answer.
    """

    def __init__(self, status: str, message: str, field: str | None = None,
                 extra: dict[str, Any] | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.extra = extra or {}
        self.body = body

    def document(self) -> Any:
        if self.body is not None:
            return self.body
        return {"error": self.status, "field": self.field, "message": self.message,
                **self.extra}

    def __str__(self) -> str:
        if self.status == "invalid" and self.field:
            message = self.message
            # the API says the field too: ``invalid at '...': in the past``, ``at: ...``
            found = _INVALID.fullmatch(message)
            if found is not None and found["name"] == self.field:
                value = found["value"]
                message = found["why"] if value is None else f"'{value}': {found['why']}"
            message = message.removeprefix(f"{self.field}: ")
            return error_line(message, where_of(self.field))
        return error_line(f"{self.status}: {self.message}")
