"""Errors of the command line: bad local input (exit status 2) and a refused or undecidable
operation (exit status 1)."""

from __future__ import annotations

from typing import Any

__all__ = ["Failure", "UsageError"]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class Failure(Exception):
    """A refused or undecidable operation: exit status 1, ``error: <status>: <message>``.

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
        return f"error: {self.status}: {self.message}"
