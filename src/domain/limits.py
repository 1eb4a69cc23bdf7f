"""The limits every entry point enforces (API, CLI, client, processor), in one place.

The message models (``chronolog.domain.messages``) apply them, so a command is checked the
same way wherever it comes from: the API answers 400 naming the field before sending, the
CLI exits 2, the client raises before appending, and the processor — the authority for
commands written to the log by anything else — rejects the command as ``invalid``.
docs/deployment.md ("Limits") lists them with their defaults and how to configure the ones that can
be configured. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "DEFAULT_EXECUTION_TIMEOUT_SECONDS",
    "EARLIEST_INSTANT",
    "LABEL_KEY_PATTERN",
    "LATEST_INSTANT",
    "MAX_BACKFILL_INSTANTS",
    "MAX_BODY_BYTES",
    "MAX_COUNT",
    "MAX_DEPTH",
    "MAX_DOCUMENT_DEPTH",
    "MAX_DURATION_SECONDS",
    "MAX_INT",
    "MAX_LABELS",
    "MAX_LABEL_VALUE",
    "MAX_PARAMS_BYTES",
    "MAX_RETRY_ATTEMPTS",
    "MAX_RUN_ID",
    "MAX_SCHEDULE_ID",
    "MIN_INTERVAL_SECONDS",
    "MIN_RETRY_BACKOFF_SECONDS",
    "NAME_PATTERN",
    "PATTERN_WORDS",
    "RESOURCE_CLASS_PATTERN",
    "RUN_ID_PATTERN",
    "SCHEDULE_ID_PATTERN",
    "check_instant",
    "id_problem",
    "json_depth",
    "plainly_clean_json",
    "text_violation",
]

# request body of the HTTP API (configurable: ``chronolog api/dev --max-body-bytes``)
MAX_BODY_BYTES = 256 * 1024
# a job's params (and a manual trigger's), as JSON
MAX_PARAMS_BYTES = 64 * 1024
# nesting of a job's params (objects and arrays)
MAX_DEPTH = 32
# nesting of a whole command or request body: the params plus the structure around them
MAX_DOCUMENT_DEPTH = MAX_DEPTH + 8
# every duration (every, delay, jitter, lease, timeout, grace, backoffs, ages): ten years
MAX_DURATION_SECONDS = 10 * 366 * 86_400
# every instant of a definition (at, start, end, anchor, preview's from)
EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(3000, 1, 1, tzinfo=UTC)  # exclusive
# maxCount, and any other count a tenant gives
MAX_COUNT = 1_000_000_000
MAX_BACKFILL_INSTANTS = 1000  # instants one backfill request may run
# revisions, attempts, fences, sizes: what a PostgreSQL bigint holds
MAX_INT = 2**63 - 1
# the shortest interval of a recurring schedule, unless the tenants file says otherwise
MIN_INTERVAL_SECONDS = 1.0
# a schedule's retry.maxAttempts at most (a tenants file may lower it for a tenant): a
# failing run may not turn into a retry storm
MAX_RETRY_ATTEMPTS = 100
# the shortest wait before a retry: a smaller retry.initialBackoff is raised to it when the
# retry is scheduled (a tenants file may raise it for a tenant)
MIN_RETRY_BACKOFF_SECONDS = 1.0
# how long one attempt's handler may run, unless the tenants file says otherwise for the
# tenant (execution_timeout) or its job type (job_timeouts); a job's own timeout may only
# shorten it. The worker cancels the handler when it elapses.
DEFAULT_EXECUTION_TIMEOUT_SECONDS = 3600.0

# a schedule ID: these characters, at least one of them not a dot (so never "." or "..")
SCHEDULE_ID_PATTERN = r"^[A-Za-z0-9_.:@-]*[A-Za-z0-9_:@-][A-Za-z0-9_.:@-]*$"
RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
MAX_SCHEDULE_ID = 200
MAX_RUN_ID = 64
NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"  # a tenant's or a destination's name
RESOURCE_CLASS_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
# a schedule's labels (``ScheduleSpec.labels``): how many, their keys (lower-case, 1-63
# characters, a prefix such as ``chronolog.dev/`` allowed) and the length of their values
MAX_LABELS = 32
LABEL_KEY_PATTERN = r"^[a-z0-9]([a-z0-9.\-/]{0,61}[a-z0-9])?$"
MAX_LABEL_VALUE = 200
# the rule of each pattern in words, as an error message says it
PATTERN_WORDS = {
    SCHEDULE_ID_PATTERN: "letters, digits and _ . : @ - only, not only dots",
    RUN_ID_PATTERN: "letters, digits and _ - only, 1-64 characters",
    NAME_PATTERN: "letters, digits and _ . - only",
    RESOURCE_CLASS_PATTERN: "letters, digits and _ - only, 1-64 characters",
    LABEL_KEY_PATTERN: "lower-case letters, digits and . - / only, starting and ending with a "
                       "letter or digit, 1-63 characters",
}


def id_problem(kind: str, value: str) -> str | None:
    """What is wrong with ``value`` as a ``kind`` ("schedule ID", "run ID") in words, or
    None when it is one: ``schedule ID 'a b': letters, digits and _ . : @ - only, not only
    dots, 1-200 characters``."""
    if kind == "run ID":
        pattern, longest, rule = RUN_ID_PATTERN, MAX_RUN_ID, PATTERN_WORDS[RUN_ID_PATTERN]
    else:
        pattern, longest = SCHEDULE_ID_PATTERN, MAX_SCHEDULE_ID
        rule = f"{PATTERN_WORDS[SCHEDULE_ID_PATTERN]}, 1-{longest} characters"
    if len(value) <= longest and re.fullmatch(pattern, value):
        return None
    shown = value if len(value) <= 60 else value[:57] + "..."
    return f"{kind} '{shown.encode('unicode_escape').decode()}': {rule}"


def check_instant(value: datetime) -> datetime:
    """``value`` when it lies in [EARLIEST_INSTANT, LATEST_INSTANT); ``ValueError`` else."""
    if value.tzinfo is not None and not EARLIEST_INSTANT <= value < LATEST_INSTANT:
        raise ValueError(f"must be between {EARLIEST_INSTANT:%Y-%m-%d} and "
                         f"{LATEST_INSTANT.year - 1}-12-31")
    return value


def text_violation(value: Any, path: str = "", max_depth: int = MAX_DEPTH
                   ) -> tuple[str, str] | None:
    """The first ``(path, problem)`` of a JSON-like value, or None when it is clean.

    Problems: text (a string or an object key) containing NUL, nesting deeper than
    ``max_depth``, an integer outside the signed 64-bit range. Iterative: a hostile depth
    cannot exhaust the stack. Paths are dotted (``job.params.a.b``; list items by index).
    """
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where, "text must not contain NUL (\\u0000)"
        elif isinstance(item, dict):
            if depth >= max_depth:
                return where, f"nested deeper than {max_depth} levels"
            for key, sub in item.items():
                sub_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and "\x00" in key:
                    return where, "keys must not contain NUL (\\u0000)"
                stack.append((sub, sub_path, depth + 1))
        elif isinstance(item, (list, tuple)):
            if depth >= max_depth:
                return where, f"nested deeper than {max_depth} levels"
            for i, sub in enumerate(item):
                stack.append((sub, f"{where}.{i}" if where else str(i), depth + 1))
        elif hasattr(type(item), "model_fields"):  # a pydantic model: its fields
            if depth >= max_depth:
                return where, f"nested deeper than {max_depth} levels"
            for key, sub in vars(item).items():
                stack.append((sub, f"{where}.{key}" if where else key, depth + 1))
        elif (isinstance(item, int) and not isinstance(item, bool)
              and not -MAX_INT - 1 <= item <= MAX_INT):
            return where, "integers must fit in 64 bits"
    return None


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 19  # after _DIGITS_AS_ZERO: a run of 19 digits


def plainly_clean_json(raw: bytes, max_depth: int) -> bool:
    """Whether JSON text certainly passes ``text_violation``: a look at the bytes, no parse.

    JSON can carry NUL only as the escape ``\\u0000``, an integer past 64 bits needs 19
    digits or more, and nesting needs an opening bracket per level. False means only that
    the text must be walked (``text_violation``) — the answer is then the walk's.
    """
    return (b"\\u0000" not in raw and b"\x00" not in raw
            and raw.count(b"{") + raw.count(b"[") <= max_depth
            and _LONG_DIGITS not in raw.translate(_DIGITS_AS_ZERO))


def json_depth(raw: bytes, limit: int) -> int:
    """The nesting depth of JSON text, counting only until it exceeds ``limit``.

    A scan of the brackets outside strings, without parsing: it bounds what a parser will
    be asked to recurse into. Returns ``limit + 1`` as soon as the limit is passed.
    """
    depth = deepest = 0
    for bracket in _BRACKET.finditer(_STRING.sub(b"", raw)):
        if bracket.group() in (b"{", b"["):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return limit + 1
        else:
            depth -= 1
    return deepest


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")
