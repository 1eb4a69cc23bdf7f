"""Errors of the command line: bad local input (exit status 2) and a refused or undecidable
operation (exit status 1), each printed as one line ``error: <where>: <message>``
(``error_line``): ``where`` is the flag the value came from (``--every``), or the field or
argument when no flag names it (``schedule ID``); the prefix is never doubled."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

__all__ = ["Failure", "UsageError", "error_line", "set_flags", "where_of"]

# the options of the command being run (``set_flags``, by ``chronolog.cli.main``): a field
# whose flag is among them is named by its flag
_flags: frozenset[str] = frozenset()

# ``invalid <name> '<value>' (--flag): <why>``: how the checks of the command line say it
_INVALID = re.compile(r"invalid (?P<name>[^\s']+)(?: '(?P<value>.*?)')?"
                      r"(?: \((?P<flag>--[\w-]+)\))?: (?P<why>.*)", re.DOTALL)
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
        if found is not None:
            where = found["flag"] or where_of(found["name"], flags)
            value = found["value"]
            text = found["why"] if value is None else f"'{value}': {found['why']}"
    if where is None or text.startswith(f"{where} "):  # it names it already
        return f"error: {text}"
    text = text.removeprefix(f"{where}: ")
    return f"error: {where}: {text}"


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
