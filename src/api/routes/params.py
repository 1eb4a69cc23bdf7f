"""Path parameters and documented answers the routers share."""

# no `from __future__ import annotations`: FastAPI resolves the aliases

from typing import Annotated, Any

from fastapi import Path

from chronolog.api.cursors import CONSISTENCY_HEADER, VISIBLE_HEADER
from chronolog.api.errors import ApiError
from chronolog.api.models import MAX_SCHEDULE_ID
from chronolog.domain import limits as lim
from chronolog.domain import messages as m
from chronolog.queries.documents import spec_limits

__all__ = ["IDEMPOTENCY_KEY", "WRITE_HEADERS", "RunIdPath", "ScheduleIdPath",
           "if_match_revision"]

ScheduleIdPath = Annotated[str, Path(max_length=MAX_SCHEDULE_ID, pattern=lim.SCHEDULE_ID_PATTERN,
                                     description="a schedule ID")]
RunIdPath = Annotated[str, Path(max_length=64, pattern=lim.RUN_ID_PATTERN,
                                description="a run ID")]

WRITE_HEADERS: dict[str, Any] = {
    CONSISTENCY_HEADER: {
        "description": "opaque read-your-writes token: send it back on reads (for clients "
        "whose reads may go to another API process, or that write through the log)",
        "schema": {"type": "string"}},
    VISIBLE_HEADER: {
        "description": "true: the read model showed the write's events before this answer "
        "(a read without any header sees it); false: the bound (visible_timeout, default "
        "2 s) passed first — the write was still accepted",
        "schema": {"type": "string", "enum": ["true", "false"]}},
}

# an Idempotency-Key becomes a command's request_key
IDEMPOTENCY_KEY: dict[str, Any] = spec_limits(m.TriggerRun, "request_key")


def if_match_revision(if_match: str) -> int:
    """The revision an ``If-Match`` names: ``"3"``, ``W/"3"`` or ``3`` (400 otherwise)."""
    text = if_match.strip().removeprefix("W/").strip('"')
    # ASCII digits only (isdigit also takes '²'), and a revision fits a bigint
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or \
            not 1 <= int(text) <= lim.MAX_INT:
        raise ApiError(400, f"invalid If-Match '{if_match}': expected a revision", "If-Match")
    return int(text)
