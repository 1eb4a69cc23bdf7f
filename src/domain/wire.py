"""The compact wire format of events (format 2): each value once, defaults left out.

An event of the first format repeats what its record already says: the envelope's ``type``
is the payload's, ``tenant`` and ``schedule_id`` are the record key ``tenant/schedule_id``
(which the envelope's ``key`` repeats too), the event ID is ``<causation_id>.<index>``, and
every payload member is written even when it holds its default. Format 2 writes each once:

    {"f": 2, "k": "acme/s1", "c": "<command id>", "n": 0, "at": "...Z",
     "p": {"type": "FenceAdvanced", ...members that differ from their wire default}}

* ``f``: the format (absent: the first format, read as it always was);
* ``k``: the aggregate's key; ``tenant`` and ``schedule_id`` are its two halves (a tenant
  never holds ``/``). An envelope whose key is not ``tenant/schedule_id`` writes them as
  ``tenant`` and ``schedule_id`` members;
* ``c``: the causation ID, ``n`` the event's index in its decision: the event ID is
  ``<c>.<n>``; an event ID of another shape is written as ``id``;
* ``v``: the event's schema version (the upcasters' key), left out when it is 1;
* ``p``: the payload, with ``type``; a member whose value is its wire default
  (``EVENT_DEFAULTS``, and ``JOB_DEFAULTS`` inside an ``OccurrenceMaterialized`` job) is
  left out, and an instant (``EVENT_INSTANTS``) is written as the whole microseconds after
  ``at`` (``0``: at ``at``; ``30000000``: 30 s later) — exact, and a tenth of the text.

The wire defaults are frozen here, not read from the models: a model default that changes
later does not change what a stored record means (every value the decider computed stays in
the event, docs/design.md §2). A member added to an event is written in full until it gets
a wire default — and a new wire default needs a new format, since older records of this one
did write that member.

``compact_event`` turns the first format's members into format 2's, ``expand_event`` turns
either back into the first format's (the upcast step every reader goes through, in
``chronolog.domain.codec.decode_event``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

FORMAT = 2

# each event type's members left out when they hold this value (frozen: see the module doc)
EVENT_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "ScheduleCreated": {"request_key": None},
    "SchedulePaused": {"reason": ""},
    "ScheduleCompleted": {"last_scheduled_at": None, "count": 0},
    "OccurrenceMaterialized": {
        "trigger": "schedule", "request_key": None, "request_digest": None,
        "start_deadline_at": None, "resource_class": "default", "priority": 0,
        "next_run_at": None, "next_due_at": None, "advances_schedule": True},
    "OccurrenceSkipped": {
        "through": None, "count": 1, "materialized": False, "revision": 0,
        "request_key": None, "request_digest": None, "next_run_at": None,
        "next_due_at": None, "advances_schedule": True},
    "OccurrenceReady": {"resource_class": "default", "priority": 0},
    "AttemptClaimed": {"timeout": None},
    "AttemptFailed": {"message": "", "reason": None},
    "OccurrenceDeadLettered": {"message": ""},
    "OccurrenceRedriven": {"by": "", "redriven_at": None},
    "ResultPublished": {"uri": None, "inline": None},
    "CancellationRequested": {"by": "", "reason": ""},
    "OccurrenceCancelled": {"by": "", "reason": ""},
    "ReconciliationRequired": {"effect_id": None, "evidence": {}},
    "ReconciliationResolved": {"by": "", "note": "", "effect_id": None},
    "EffectIntended": {"destination": "", "config": {}, "uri": None, "inline": None,
                       "attempt": 1},
    "EffectSucceeded": {"evidence": {}},
    "EffectUncertain": {"evidence": {}},
    "EffectFailed": {"evidence": {}},
    "ScheduleCreationHeld": {"request_key": None, "reply_to": None},
    "KeyMovedIn": {"kind": "schedule", "shape": None},
    "QuotaSlotConfirmed": {"late": False},
    "HandedOver": {"moved": 0},
}
# members of an OccurrenceMaterialized's ``job`` left out when they hold this value
JOB_DEFAULTS: Mapping[str, Any] = {"params": {}, "timeout": None}
_NONE: Mapping[str, Any] = {}

# each event type's instants, written as whole microseconds after the envelope's ``at``
# (negative: before it); frozen like the defaults: a new instant member is written as ISO
# 8601 text until a new format lists it
EVENT_INSTANTS: Mapping[str, frozenset[str]] = {
    "ScheduleCreated": frozenset(("created_at", "anchor", "next_run_at", "next_due_at")),
    "ScheduleRevised": frozenset(("anchor", "next_run_at", "next_due_at")),
    "SchedulePaused": frozenset(("paused_at",)),
    "ScheduleResumed": frozenset(("resumed_at", "next_run_at", "next_due_at")),
    "ScheduleCompleted": frozenset(("completed_at", "last_scheduled_at")),
    "NextRunPlanned": frozenset(("next_run_at", "next_due_at")),
    "OccurrenceMaterialized": frozenset(("scheduled_at", "due_at", "start_deadline_at",
                                         "next_run_at", "next_due_at")),
    "OccurrenceSkipped": frozenset(("scheduled_at", "through", "next_run_at", "next_due_at")),
    "AttemptClaimed": frozenset(("claimed_at", "lease_until")),
    "LeaseExtended": frozenset(("lease_until",)),
    "LeaseExpired": frozenset(("lease_until",)),
    "RetryScheduled": frozenset(("retry_at",)),
    "OccurrenceRedriven": frozenset(("redriven_at",)),
    "ResultPublished": frozenset(("finished_at",)),
    "QuotaSlotReserved": frozenset(("expires_at",)),
    "QuotaSlotReleased": frozenset(("released_at",)),
}
_NO_INSTANTS: frozenset[str] = frozenset()
_MICRO = timedelta(microseconds=1)


class CompactEventEnvelope(BaseModel):
    """An event as format 2 stores it (the documented contract, schemas/envelopes): what
    ``compact_event`` writes validates against this model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    f: Literal[2] = Field(description="the wire format")
    k: str = Field(description="the aggregate's key, tenant/schedule_id")
    tenant: str | None = Field(None, description="only when the key is not tenant/schedule_id")
    schedule_id: str | None = Field(
        None, description="only when the key is not tenant/schedule_id")
    c: str | None = Field(None, description="the causation ID: the command's ID")
    n: int | None = Field(None, ge=0, description="the event ID is <c>.<n>")
    id: str | None = Field(None, description="an event ID that is not <c>.<n>")
    v: int = Field(1, description="the event's schema version (left out: 1)")
    at: datetime = Field(description="authority time, ISO 8601 UTC")
    p: dict[str, Any] = Field(description=(
        "the payload: an event of schemas/events with its type; members at their wire "
        "default (chronolog.domain.wire.EVENT_DEFAULTS) left out, its instants "
        "(EVENT_INSTANTS) as whole microseconds after at"))


def _is(value: Any, default: Any) -> bool:
    """``value`` is ``default`` for the wire: equal and of the same type (``0`` is no
    ``False``, ``1`` no ``1.0``)."""
    return type(value) is type(default) and value == default


def _without_defaults(members: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in members.items() if k not in defaults or not _is(v, defaults[k])}


def _with_defaults(members: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    missing = {k: _copy(v) for k, v in defaults.items() if k not in members}
    return {**members, **missing} if missing else members


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value


def _micros_after(value: datetime, at: datetime) -> int:
    delta = value - at
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def compact_payload(payload: dict[str, Any], at: Any = None) -> dict[str, Any]:
    """A payload's members (``type`` included, as ``model_dump`` gives them) without those
    at their wire default, its instants as microseconds after ``at`` (an aware datetime;
    none given: instants stay as they are)."""
    found = payload.get("type")
    etype = found if isinstance(found, str) else ""
    out = _without_defaults(payload, EVENT_DEFAULTS.get(etype, _NONE))
    if isinstance(at, datetime) and at.tzinfo is not None:
        for name in EVENT_INSTANTS.get(etype, _NO_INSTANTS):
            value = out.get(name)
            if isinstance(value, datetime) and value.tzinfo is not None:
                out[name] = _micros_after(value, at)
    job = out.get("job")
    if etype == "OccurrenceMaterialized" and isinstance(job, dict):
        out["job"] = _without_defaults(job, JOB_DEFAULTS)
    return out


def expand_payload(payload: dict[str, Any], at: Any = None) -> dict[str, Any]:
    """``compact_payload`` undone: every member left out is back at its wire default, every
    instant written as microseconds after ``at`` (ISO 8601 text) ISO 8601 text again, as the
    first format wrote it (``Z``, microseconds only when there are some)."""
    found = payload.get("type")
    etype = found if isinstance(found, str) else ""
    out = dict(_with_defaults(payload, EVENT_DEFAULTS.get(etype, _NONE)))
    base: datetime | None = None
    for name in EVENT_INSTANTS.get(etype, _NO_INSTANTS):
        value = out.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            if base is None:
                base = _instant(at)
            try:  # ISO 8601 text as the first format wrote it, for readers of raw records
                out[name] = orjson.dumps(base + value * _MICRO,
                                         option=orjson.OPT_UTC_Z).decode()[1:-1]
            except OverflowError as exc:
                raise ValueError(f"p.{name}: {value} microseconds after at is out of range"
                                 ) from exc
    job = out.get("job")
    if etype == "OccurrenceMaterialized" and isinstance(job, dict):
        out["job"] = _with_defaults(job, JOB_DEFAULTS)
    return out


def _instant(at: Any) -> datetime:
    """The envelope's ``at`` (ISO 8601 text with an offset) that instants count from."""
    try:
        parsed = datetime.fromisoformat(at) if isinstance(at, str) else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise ValueError("at: the event's time is missing or not an ISO 8601 instant")
    return parsed


def compact_event(event_id: str, version: int, key: str, tenant: str, schedule_id: str,
                  at: Any, causation_id: str | None, payload: dict[str, Any]) -> dict[str, Any]:
    """An envelope's members in format 2 (``at`` as given: the codec serializes it)."""
    out: dict[str, Any] = {"f": FORMAT, "k": key}
    if key.partition("/") != (tenant, "/", schedule_id):
        out["tenant"] = tenant
        out["schedule_id"] = schedule_id
    if causation_id is not None:
        out["c"] = causation_id
        stem, dot, index = event_id.rpartition(".")
        if dot and stem == causation_id and index.isdigit() and str(int(index)) == index:
            out["n"] = int(index)
        else:
            out["id"] = event_id
    else:
        out["id"] = event_id
    if version != 1:
        out["v"] = version
    out["at"] = at
    out["p"] = compact_payload(payload, at)
    return out


def expand_event(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored event's members in the first format's shape, whichever format it has (a
    first-format event is returned as it is). Raises ``ValueError`` naming the member that
    is missing or of the wrong kind."""
    fmt = raw.get("f")
    if fmt is None:
        return raw
    if fmt != FORMAT:
        raise ValueError(f"f: unknown event format {fmt!r}")
    key, payload = raw.get("k"), raw.get("p")
    if not isinstance(key, str):
        raise ValueError("k: the event's key is missing")
    if not isinstance(payload, dict):
        raise ValueError("p: the event's payload is missing")
    tenant, _, schedule_id = key.partition("/")
    causation = raw.get("c")
    if "id" in raw:
        event_id = raw["id"]
    elif isinstance(causation, str) and isinstance(raw.get("n"), int):
        event_id = f"{causation}.{raw['n']}"
    else:
        raise ValueError("n: the event's index is missing")
    return {
        "event_id": event_id, "type": payload.get("type"), "version": raw.get("v", 1),
        "key": key, "tenant": raw.get("tenant", tenant),
        "schedule_id": raw.get("schedule_id", schedule_id), "at": raw.get("at"),
        "causation_id": causation, "payload": expand_payload(payload, raw.get("at")),
    }
