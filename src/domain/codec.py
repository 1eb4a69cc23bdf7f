"""orjson codec for envelopes and replies, with an upcasting hook keyed by (type, version).

Events are stored forever, so their shape may evolve: an upcaster registered for
``(type, version)`` turns a stored dict of that version into the next version's dict before
validation, repeatedly, until the current version is reached.

Events are written in the compact format 2 (``chronolog.domain.wire``); a stored event of
either format is first brought to the first format's members (``wire.expand_event``), then
upcast and validated, so every reader gets the same values from both. Commands and replies
leave out members at their default (``dumps_compact``, ``encode_reply_fields``); ready
assignments their empty members (``encode_assignment``); their decoders fill them back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import orjson
from pydantic import BaseModel

from chronolog.domain import wire
from chronolog.domain.limits import MAX_DOCUMENT_DEPTH, plainly_clean_json
from chronolog.domain.messages import (
    CURRENT_VERSION,
    STORED,
    TEXT_CHECKED,
    CommandEnvelope,
    DeadLetter,
    EventEnvelope,
    Reply,
)

_OPTS = orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC


def dumps_kept(obj: Any, option: int = _OPTS) -> bytes:
    """``orjson.dumps`` for bytes that are kept (a batch's records): a copy of its result.

    orjson builds its output in a 1 KiB buffer and shrinks it in place; when thousands of
    those results are kept, glibc's allocator then serves every new 1 KiB buffer from
    the top of a heap full of shrunken-block remainders, many times slower than a result
    that is discarded (docs/run-path.md); Python's small-object allocator takes the copy and
    the orjson buffer is freed at once and reused.
    """
    return kept(orjson.dumps(obj, option=option))


def kept(data: bytes) -> bytes:
    """A copy of ``data`` of its own size, for bytes that are kept: the bytes ``orjson.dumps``
    returns hold on to the whole buffer it wrote into (about 4 KB for a 257-byte result,
    measured under ``tracemalloc``), and only a copy lets it go (``dumps_kept``)."""
    return bytes(memoryview(data))

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class DecodeError(ValueError):
    """Bytes that are not a valid message; the reason names the field."""


def register_upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn(dict) -> dict`` turning ``event_type`` v``from_version`` into v+1."""

    def deco(fn: Upcaster) -> Upcaster:
        _UPCASTERS[(event_type, from_version)] = fn
        return fn

    return deco


def upcast(raw: dict[str, Any]) -> dict[str, Any]:
    """Apply registered upcasters until the event reaches the current version."""
    version = int(raw.get("version", 1))
    etype = str(raw.get("type", ""))
    while version < CURRENT_VERSION or (etype, version) in _UPCASTERS:
        fn = _UPCASTERS.get((etype, version))
        if fn is None:
            raise DecodeError(f"no upcaster for {etype} v{version}")
        raw = fn(raw)
        version += 1
        raw["version"] = version
    return raw


def dumps(model: BaseModel) -> bytes:
    """Serialize any message model (None fields kept: schemas stay explicit)."""
    return orjson.dumps(model.model_dump(mode="python"), option=_OPTS)


def dumps_compact(model: BaseModel) -> bytes:
    """Serialize a message model without the members at their default, at any depth of
    nested models (a payload's ``type`` too: an envelope's ``type`` names it)."""
    return orjson.dumps(model.model_dump(mode="python", exclude_defaults=True), option=_OPTS)


def encode_event(env: EventEnvelope) -> bytes:
    """The envelope in the compact format 2 (``chronolog.domain.wire``)."""
    return encode_event_fields(env.event_id, env.version, env.key, env.tenant, env.schedule_id,
                               env.at, env.causation_id, env.payload)


def encode_event_fields(event_id: str, version: int, key: str, tenant: str, schedule_id: str,
                        at: datetime, causation_id: str | None, payload: BaseModel) -> bytes:
    """``encode_event`` straight from the fields, without building the envelope model (the
    processor's hot path: the payload is a validated event, ``at`` an aware datetime)."""
    return dumps_kept(wire.compact_event(event_id, version, key, tenant, schedule_id, at,
                                         causation_id, payload.model_dump(mode="python")))


def encode_event_v1(env: EventEnvelope) -> bytes:
    """The envelope in the first format (every member, as written before format 2): what
    older logs, archives and backups hold; for tests and tools that need such records."""
    return dumps(env)


def expand_event(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored event's JSON object in the first format's members, whichever format it has
    (for readers of raw records); ``DecodeError`` names a missing member."""
    try:
        return wire.expand_event(raw)
    except ValueError as exc:
        raise DecodeError(str(exc)) from exc


def decode_event(data: bytes) -> EventEnvelope:
    try:
        raw = orjson.loads(data)
        if not isinstance(raw, dict):
            raise DecodeError("event is not a JSON object")
        return EventEnvelope.model_validate(upcast(expand_event(raw)), context=STORED)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"event is not JSON: {exc}") from exc
    except (ValueError, TypeError, OverflowError) as exc:  # a version that is no integer, ...
        if isinstance(exc, DecodeError):
            raise
        raise DecodeError(_first_error(exc)) from exc


def encode_command(env: CommandEnvelope) -> bytes:
    """A command without the members at their default (``CommandEnvelope`` puts the
    payload's ``type`` back from its own when reading)."""
    return dumps_compact(env)


def decode_command(data: bytes) -> CommandEnvelope:
    """Parse and validate a command; ``DecodeError`` names the first bad field."""
    checked = TEXT_CHECKED if plainly_clean_json(data, MAX_DOCUMENT_DEPTH) else None
    try:  # pydantic's own JSON parser: fast
        return CommandEnvelope.model_validate_json(data, context=checked)
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        if callable(errors) and errors() and errors()[0].get("type") == "json_invalid":
            raise DecodeError(f"command is not JSON: {errors()[0].get('msg')}") from exc
        raise DecodeError(_first_error(exc)) from exc


def encode_reply(reply: Reply) -> bytes:
    """The same bytes as ``encode_reply_fields`` of the reply's fields."""
    return encode_reply_fields(
        reply.command_id, reply.status, reply.reason, reply.body,
        [(p.topic, p.partition, p.offset) for p in reply.positions], reply.tenant,
        reply.schedule_id)


def encode_body(body: dict[str, Any]) -> bytes:
    """A reply body as JSON (datetimes as ISO strings with Z), for ``encode_reply_fields``."""
    return dumps_kept(body)


def encode_reply_fields(
    command_id: str,
    status: str,
    reason: str,
    body: dict[str, Any] | bytes,
    positions: Sequence[tuple[str, int, int]],
    tenant: str,
    schedule_id: str,
) -> bytes:
    """A reply's bytes straight from its fields, without building a ``Reply`` model.

    The same bytes as ``encode_reply(Reply(...))`` for a body of JSON values, datetimes
    included (the processor's hot path; tests/unit/test_codec.py checks the equality).
    ``positions`` are (topic, partition, offset) triples; ``body`` may be given already
    encoded (``encode_body``: a snapshot taken when the decision was made).
    """
    out: dict[str, Any] = {"command_id": command_id, "status": status}
    if reason:
        out["reason"] = reason
    if body and body != b"{}":
        out["body"] = orjson.Fragment(body) if isinstance(body, bytes) else body
    if positions:  # [topic, partition, offset] each (``Reply`` reads both shapes)
        out["positions"] = [[t, p, o] for t, p, o in positions]
    if tenant:
        out["tenant"] = tenant
    if schedule_id:
        out["schedule_id"] = schedule_id
    return dumps_kept(out)


def decode_reply(data: bytes) -> Reply:
    return Reply.model_validate(orjson.loads(data))


# a ready assignment's members left out when empty (the worker reads them as these)
_ASSIGNMENT_EMPTY: dict[str, Any] = {"params": {}, "timeout": None}


def encode_assignment(assignee: str, tenant: str, schedule_id: str,
                      body: dict[str, Any]) -> bytes:
    """A ready assignment: the worker it is for, the run's tenant and schedule, and the
    claim's reply body, without ``run_id`` (the record key) and empty members."""
    out: dict[str, Any] = {"assignee": assignee, "tenant": tenant, "schedule_id": schedule_id}
    for k, v in body.items():
        if k == "run_id" or (k in _ASSIGNMENT_EMPTY and v == _ASSIGNMENT_EMPTY[k]):
            continue
        out[k] = v
    return dumps_kept(out, orjson.OPT_UTC_Z)


def decode_assignment(data: bytes, key: bytes | None) -> dict[str, Any]:
    """A ready assignment's members, every one (those left out at their empty value, the
    run ID from the record key when the value does not hold it)."""
    body = orjson.loads(data)
    if not isinstance(body, dict):
        raise DecodeError("assignment is not a JSON object")
    if "run_id" not in body:
        if not key:
            raise DecodeError("run_id: the assignment names no run (no record key)")
        body["run_id"] = key.decode()
    for k, v in _ASSIGNMENT_EMPTY.items():
        body.setdefault(k, dict(v) if isinstance(v, dict) else v)
    return body


def encode_dead_letter(dl: DeadLetter) -> bytes:
    return dumps(dl)


def decode_dead_letter(data: bytes) -> DeadLetter:
    return DeadLetter.model_validate(orjson.loads(data))


def _first_error(exc: Exception) -> str:
    """One line naming the field and the problem, from a pydantic ValidationError."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        errs = errors()
        if errs:
            e = errs[0]
            loc = ".".join(str(p) for p in e.get("loc", ()) if not isinstance(p, int) or True)
            msg = str(e.get("msg", str(exc)))
            if not loc:  # a whole-message rule: its text starts with the path it is about
                return msg.removeprefix("Value error, ")
            return f"{loc}: {msg}"
    return str(exc).splitlines()[0]
