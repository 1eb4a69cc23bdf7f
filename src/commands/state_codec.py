"""An exact, versioned encoding of the aggregates' states (``ScheduleState``, ``QuotaState``).

A processor's snapshot of a partition (``chronolog.processors.snapshots``, docs/design.md
§14) stores every state of the partition with this codec, so that a new owner can start
from it instead of folding ``events`` from offset 0. Decoding what was encoded gives a state
equal to the original in every field (``tests/unit/test_state_codec.py`` checks it on random
states): the same status, counters, instants, runs in the same order, the same manual keys
in the same order, the same quota wait; the compiled trigger and the interned ``Policy`` are
derived again from the spec, as ``evolve`` derives them (the trigger on first use).

The encoding is orjson of positional lists (no field names: a state is about 300 bytes for
a schedule with its last run). A state's spec is stored in two parts (see "specs" below):
its job's params in the state, the rest — its *shape*, shared by the schedules that differ
in their params alone — once per partition (``shape_of`` / ``decode_shape``), so 100,000
schedules validate a handful of shapes at restore, not 100,000 specs.

``STATE_VERSION`` is the version of this layout. Change ``ScheduleState``, ``Run``,
``QuotaState`` or the layout below, and bump it: snapshots of the older version are then
ignored (a new owner folds from offset 0 and writes a new snapshot) unless an upcaster
registered with ``register_state_upcaster(kind, old_version)`` turns an old body into the next
version's. ``tests/unit/test_state_codec.py::test_the_state_layout_is_the_one_of_its_version``
fails when the slots change without a new version.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import orjson

from chronolog.commands.state import (
    Backfills,
    CalendarCopy,
    CalendarHome,
    Manual,
    Policy,
    QuotaState,
    QuotaWait,
    Run,
    ScheduleState,
    dump_hash,
    intern_policy,
    interned_policy,
)
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.codec import dumps_kept
from chronolog.domain.ids import QUOTA_ID
from chronolog.domain.messages import STORED, EffectIntended, JobSpec, ScheduleSpec

__all__ = [
    "STATE_VERSION",
    "StateDecodeError",
    "decode_moved_quota",
    "decode_moved_schedule",
    "decode_quota",
    "decode_schedule",
    "decode_shape",
    "encode_quota",
    "encode_schedule",
    "moved_quota",
    "moved_schedule",
    "register_state_upcaster",
    "shape_of",
    "upcast_state",
]

STATE_VERSION = 5

_OPTS = orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC
_fromiso = datetime.fromisoformat

# (kind, version v) -> fn(body of version v) -> body of version v + 1; kinds: "schedule",
# "quota" (the bodies of encode_schedule and encode_quota, parsed)
StateUpcaster = Callable[[list[Any]], list[Any]]
_UPCASTERS: dict[tuple[str, int], StateUpcaster] = {}


class StateDecodeError(ValueError):
    """Bytes that are not a state of this codec (or of a version it cannot upcast)."""


def register_state_upcaster(kind: str, from_version: int,
                            ) -> Callable[[StateUpcaster], StateUpcaster]:
    """Register ``fn(body) -> body`` turning a ``kind`` ("schedule" or "quota") body of
    ``from_version`` into one of ``from_version + 1``; an old snapshot is then upcast
    instead of ignored."""

    def deco(fn: StateUpcaster) -> StateUpcaster:
        _UPCASTERS[(kind, from_version)] = fn
        return fn

    return deco


def upcast_state(kind: str, body: list[Any], version: int) -> list[Any]:
    """``body`` of ``version`` brought to ``STATE_VERSION``; ``StateDecodeError`` when a step
    has no upcaster (the snapshot is then ignored)."""
    if version > STATE_VERSION:
        raise StateDecodeError(f"state version {version} is newer than this code's "
                               f"({STATE_VERSION})")
    while version < STATE_VERSION:
        fn = _UPCASTERS.get((kind, version))
        if fn is None:
            raise StateDecodeError(f"no upcaster for {kind} states of version {version}")
        body = fn(body)
        version += 1
    return body


# Version 2: a manual key's entry gains the final state of its run, recorded when the run
# leaves the state. Version 1 did not record it: an entry whose run is still held needs none
# (the run answers, and records it when it leaves); one whose run was already forgotten
# cannot know it — its final state is None, answered as unknown (``decider._manual_answer``),
# never guessed. ``_MANUAL`` is the index of the manual keys in a schedule body.
_MANUAL = 18


@register_state_upcaster("schedule", 1)
def _manual_final_state(body: list[Any]) -> list[Any]:
    manual = body[_MANUAL]
    if manual is not None:
        body[_MANUAL] = [[*entry, None] for entry in manual]
    return body


@register_state_upcaster("quota", 1)
def _quota_unchanged(body: list[Any]) -> list[Any]:
    return body


# Version 5: a schedule may carry the copies of the calendars it names (one element after
# its backfills, which is then written even when None), and a calendar is a quota-kind
# state (one element after a concurrency key's); both only when there is one, so a body of
# version 4 is a body of version 5 as it is.
@register_state_upcaster("schedule", 4)
@register_state_upcaster("quota", 4)
def _calendars_absent(body: list[Any]) -> list[Any]:
    return body


# Version 4: a schedule may carry its backfills (one element after its quota field), only
# when it was backfilled: a body of version 3 is a body of version 4 as it is.
@register_state_upcaster("schedule", 3)
@register_state_upcaster("quota", 3)
def _backfills_absent(body: list[Any]) -> list[Any]:
    return body


# Version 3: a run may carry its concurrency key, the request for a permit it waits on or
# holds and whether it was granted (three elements after its priority), and a concurrency
# key's permits are a quota-kind state (four elements after its slots); both only when
# there is something to hold, so a body of version 2 is a body of version 3 as it is.
@register_state_upcaster("schedule", 2)
@register_state_upcaster("quota", 2)
def _permits_absent(body: list[Any]) -> list[Any]:
    return body


def _t(value: str | None) -> datetime | None:
    return None if value is None else _fromiso(value)


# ------------------------------------------------------------------------------- specs
#
# A spec is stored in two parts: its *shape* — the spec with its job's params emptied and
# without the fields a schedule may set for itself (``OWN_FIELDS``: its anchor, start and
# end), stored once per partition under its own hash (``encode_shape``), validated once at
# restore — and, in each state that has it, the spec's hash, its shape's hash, its params
# and (when any is set) those own fields. Specs of one partition mostly differ in those
# alone (the customer, the report, when it began), and validating a whole spec costs about
# 25-50 us (100,000 of them: seconds of a takeover); building one from its validated shape
# and its params costs a few: exactly what validating the whole spec gives, because a
# stored spec's params are only checked to be a JSON object (``messages.STORED``: the input
# limits are for new input) and its own fields are instants no other field depends on.
# Held as one shape each, 1,000,000 schedules created with their own anchors would cost
# about 4.7 KB each, even cold.

OWN_FIELDS = ("anchor", "start", "end")


def _parts(pol: Policy) -> tuple[str, bytes, dict[str, Any] | None]:
    parts = pol.shape
    if parts is None:
        raw = pol.spec.model_dump(mode="json")
        raw["job"]["params"] = {}
        own: dict[str, Any] = {}
        for name in OWN_FIELDS:
            if raw[name] is not None:
                own[name] = raw[name]
                raw[name] = None
        shape_hash = dump_hash(raw)
        parts = pol.shape = (shape_hash, orjson.dumps([shape_hash, raw], option=_OPTS),
                             own or None)
    return parts


def shape_of(policy: Policy) -> tuple[str, bytes]:
    """(shape hash, body) of a policy's spec shape: store the body once per partition
    under the hash (``decode_shape`` reads it back)."""
    h, body, _ = _parts(policy)
    return h, body


def decode_shape(data: bytes) -> tuple[str, Policy]:
    """(hash, policy of the validated spec with empty params) of a stored shape; the
    stored hash must be the shape's."""
    try:
        stored_hash, raw = orjson.loads(data)
        if raw["job"]["params"] != {}:
            raise StateDecodeError("a stored shape has params")
        spec = ScheduleSpec.model_validate(raw, context=STORED)
    except StateDecodeError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise StateDecodeError(f"not a stored spec shape: {type(exc).__name__}: {exc}") \
            from exc
    h = dump_hash(raw)  # raw is the shape's model_dump(mode="json"): its hash
    if h != stored_hash:
        raise StateDecodeError(f"shape hash {stored_hash} does not match its shape ({h})")
    shape = Policy(spec, f"shape:{h}")  # a template, never interned
    shape.shape = (h, data, None)
    return h, shape


def _policy(ref: list[Any], shapes: Mapping[str, Policy]) -> Policy:
    if len(ref) == 3:
        spec_h, shape_h, params = ref
        own = None
    else:
        spec_h, shape_h, params, own = ref
    pol = interned_policy(spec_h)
    if pol is not None:
        return pol
    shape = shapes.get(shape_h)
    if shape is None:
        raise StateDecodeError(f"spec shape {shape_h} is not stored")
    if not isinstance(params, dict):
        raise StateDecodeError(f"job params that are no object: {params!r}")
    job = shape.job if not params else shape.job.model_copy(update={"params": params})
    if own is None:
        return intern_policy(shape.with_job(job, spec_h))
    if not isinstance(own, dict) or not own or not set(own) <= set(OWN_FIELDS):
        raise StateDecodeError(f"a spec's own fields that are not {OWN_FIELDS}: {own!r}")
    if any(getattr(shape.spec, name) is not None for name in own):
        raise StateDecodeError(f"a spec's own fields {sorted(own)} also in its shape")
    try:
        fields = {name: _fromiso(value) for name, value in own.items()}
    except (TypeError, ValueError) as exc:
        raise StateDecodeError(f"a spec's own fields that are no instants: {own!r}") from exc
    assert shape.shape is not None
    return intern_policy(shape.with_job(job, spec_h, fields,
                                        (shape.shape[0], shape.shape[1], own)))


# ------------------------------------------------------------------------------- runs


def _encode_run(r: Run, job: JobSpec | None) -> list[Any]:
    rjob = r.job
    same_job = job is not None and (rjob is job or rjob == job)
    effects = r.effects
    return [
        r.run_id, r.scheduled_at, r.due_at, r.revision,
        None if same_job else rjob.model_dump(mode="json"),
        r.trigger, r.state, r.attempt, r.attempt_base, r.age_base, r.fence, r.worker_id,
        r.lease_until, r.retry_at, r.start_deadline_at, r.claimed, r.cancel_requested,
        r.checksum, r.result_fence, None if r.result is None else list(r.result),
        r.reconcile,
        None if effects is None else [[k, v[0], v[1], v[2].model_dump(mode="json")]
                                      for k, v in effects.items()],
        r.resource_class, r.priority,
    ] + ([] if r.concurrency is None else [list(r.concurrency), r.permit, r.permitted])


def _decode_run(a: list[Any], job: JobSpec | None) -> Run:
    r = Run.__new__(Run)
    (r.run_id, scheduled_at, due_at, r.revision, rjob, r.trigger, r.state, r.attempt,
     r.attempt_base, age_base, r.fence, r.worker_id, lease_until, retry_at, start_deadline_at,
     r.claimed, r.cancel_requested, r.checksum, r.result_fence, result, r.reconcile, effects,
     r.resource_class, r.priority) = a[:24]
    if len(a) > 24:  # a run with a concurrency key (``chronolog.commands.permits``)
        (key, limit), r.permit, r.permitted = a[24:]
        r.concurrency = (key, int(limit))
    else:
        r.concurrency, r.permit, r.permitted = None, None, False
    r.scheduled_at = _fromiso(scheduled_at)
    r.due_at = _fromiso(due_at)
    r.age_base = _t(age_base)
    r.lease_until = _t(lease_until)
    r.retry_at = _t(retry_at)
    r.start_deadline_at = _t(start_deadline_at)
    if rjob is None:
        if job is None:
            raise StateDecodeError(f"run {r.run_id} names its schedule's job, which has none")
        r.job = job
    else:
        r.job = JobSpec.model_validate(rjob, context=STORED)
    r.result = None if result is None else (result[0], result[1], result[2])
    r.effects = None if effects is None else {
        k: [st, attempt, EffectIntended.model_validate(ev, context=STORED)]
        for k, st, attempt, ev in effects}
    return r


# ------------------------------------------------------------------------------- schedules


def _ref(pol: Policy) -> list[Any]:
    """How a state names its spec: [spec hash, shape hash, params(, own fields)]."""
    h, _, own = _parts(pol)
    return ([pol.spec_hash, h, pol.job.params] if own is None
            else [pol.spec_hash, h, pol.job.params, own])


def encode_schedule(s: ScheduleState) -> bytes:
    """A live schedule state (not a draft) as bytes of version ``STATE_VERSION``; its
    spec is its hash, its shape's hash and its params (store the shape: ``shape_of``)."""
    if s.owned is not None:
        raise ValueError("a draft state is not encoded (it shares runs with its original)")
    pol = s.policy
    job = None if pol is None else pol.job
    quota = s.quota
    if isinstance(quota, QuotaWait):
        quota_out: Any = [quota.command_id, quota.request_key,
                          quota.spec.model_dump(mode="json"), quota.reply_to]
    else:
        quota_out = quota
    # kept bytes (a snapshot chunk, a cold state in ``ScheduleStore``): ``dumps_kept``
    return dumps_kept([
        s.tenant, s.schedule_id, s.status, s.revision,
        None if pol is None else _ref(pol),
        s.request_key, s.created_hash, s.created_at, s.anchor, s.paused_at, s.next_run_at,
        s.next_due_at, s.last_scheduled_at, s.count, s.fence,
        None if s.runs is None else [_encode_run(r, job) for r in s.runs.values()],
        None if s.done is None else _encode_run(s.done, job),
        s.pending,
        None if s.manual is None else [[k, *v] for k, v in s.manual.items()],
        quota_out,
    ] + _tail(s), option=_OPTS)


def _tail(s: ScheduleState) -> list[Any]:
    """The optional elements after a schedule's quota field: its backfills, its calendars."""
    b = s.backfills
    backfills = None if b is None else [[list(r) for r in b.requests],
                                        [list(r) for r in b.ranges]]
    if s.calendars is None:
        return [] if backfills is None else [backfills]
    return [backfills, [[c.name, c.revision, c.received,
                         None if c.spec is None else c.spec.model_dump(mode="json", by_alias=True,
                                                                      exclude_defaults=True)]
                        for c in s.calendars]]


def decode_schedule(data: bytes | memoryview | list[Any],
                    shapes: Mapping[str, Policy]) -> ScheduleState:
    """The state ``encode_schedule`` encoded (``data``: its bytes, or its body already
    parsed and upcast); ``shapes``: shape hash -> its policy (``decode_shape``)."""
    try:
        a = orjson.loads(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
        return _decode_schedule(a, shapes)
    except StateDecodeError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise StateDecodeError(f"not a stored schedule state: {type(exc).__name__}: {exc}") \
            from exc


def _decode_schedule(a: list[Any], shapes: Mapping[str, Policy]) -> ScheduleState:
    s = ScheduleState.__new__(ScheduleState)
    (s.tenant, s.schedule_id, s.status, s.revision, ref, s.request_key, s.created_hash,
     created_at, anchor, paused_at, next_run_at, next_due_at, last_scheduled_at, s.count,
     s.fence, runs, done, pending, manual, quota) = a[:20]
    if len(a) > 20 and a[20] is not None:  # a schedule that was backfilled
        requests, ranges = a[20]
        s.backfills = Backfills(tuple((k, d, int(n), int(r)) for k, d, n, r in requests),
                                tuple((_fromiso(x), _fromiso(y)) for x, y in ranges))
    else:
        s.backfills = None
    s.calendars = None if len(a) <= 21 else tuple(
        CalendarCopy(name, int(rev), None if spec is None else _calendar_spec(spec),
                     bool(received)) for name, rev, received, spec in a[21])
    s.created_at = _t(created_at)
    s.anchor = _t(anchor)
    s.paused_at = _t(paused_at)
    s.next_run_at = _t(next_run_at)
    s.next_due_at = _t(next_due_at)
    s.last_scheduled_at = _t(last_scheduled_at)
    if ref is None:
        s.policy = None
        s.trigger = None
        job = None
    else:
        pol = _policy(ref, shapes)
        s.policy = pol
        if s.anchor is None:
            raise StateDecodeError(f"{s.tenant}/{s.schedule_id}: a policy without an anchor")
        s.derive_trigger()  # compiled as evolve compiles it, when first used
        job = pol.job
    s.runs = None if runs is None else {r[0]: _decode_run(r, job) for r in runs}
    s.done = None if done is None else _decode_run(done, job)
    s.pending = pending
    s.manual = None if manual is None else {k: Manual(run_id, digest, final)
                                            for k, run_id, digest, final in manual}
    s.owned = None
    if isinstance(quota, list):
        cid, request_key, spec, reply_to = quota
        s.quota = QuotaWait(cid, request_key, ScheduleSpec.model_validate(spec, context=STORED),
                            reply_to)
    elif quota is None or isinstance(quota, str):
        s.quota = quota
    else:
        raise StateDecodeError(f"{s.tenant}/{s.schedule_id}: bad quota field {quota!r}")
    return s


# ------------------------------------------------------------------------------- quotas


def encode_quota(q: QuotaState) -> bytes:
    """A tenant's quota aggregate (or a concurrency key's) as bytes of ``STATE_VERSION``:
    [tenant, slots], and for a concurrency key its schedule ID, key, holders and waiting."""
    body: list[Any] = [q.tenant, [[sid, cid, until] for sid, (cid, until) in q.slots.items()]]
    if q.schedule_id != QUOTA_ID:
        body += [q.schedule_id, q.key, [[r, sid, ask] for r, (sid, ask) in q.holders.items()],
                 [list(w) for w in q.waiting]]
    c = q.calendar
    if c is not None:
        body.append([c.name, c.revision, None if c.spec is None else c.spec.model_dump(
            mode="json", by_alias=True, exclude_defaults=True), sorted(c.subscribers)])
    return orjson.dumps(body, option=_OPTS)


def _calendar_spec(data: Any) -> CalendarSpec:
    """A calendar's spec as a state stores it (``StateDecodeError`` for anything else)."""
    try:
        return CalendarSpec.model_validate(data)
    except ValueError as exc:
        raise StateDecodeError(f"not a stored calendar: {exc}") from exc


def decode_quota(data: bytes | list[Any]) -> QuotaState:
    try:
        a = orjson.loads(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
        tenant, slots = a[:2]
        q = QuotaState(tenant)
        q.slots = {sid: (cid, _t(until)) for sid, cid, until in slots}
        if len(a) > 2:
            q.schedule_id, q.key, holders, waiting = a[2:6]
            q.holders = {r: (sid, ask) for r, sid, ask in holders}
            q.waiting = [(r, sid, ask, int(limit)) for r, sid, ask, limit in waiting]
        if len(a) > 6:
            name, revision, spec, subscribers = a[6]
            q.calendar = CalendarHome(name, int(revision),
                                      None if spec is None else _calendar_spec(spec),
                                      set(subscribers))
        return q
    except (ValueError, TypeError) as exc:
        raise StateDecodeError(f"not a stored quota state: {type(exc).__name__}: {exc}") \
            from exc


# ------------------------------------------------------------------------------- moves
#
# A key moved to another partition (docs/design.md §18) carries its whole state in the
# adopt command and in the event that installs it: the JSON text of the encoding above, of
# ``STATE_VERSION`` when it was written (upcast when it is read by a later version), and, for
# a schedule, its spec shape.


def moved_schedule(s: ScheduleState) -> tuple[str, str | None]:
    """(state, shape) of a live schedule state as a move carries them."""
    pol = s.policy
    shape = None if pol is None else _parts(pol)[1].decode()
    return encode_schedule(s).decode(), shape


def decode_moved_schedule(state: str, shape: str | None, version: int) -> ScheduleState:
    """The state ``moved_schedule`` gave (``version``: the state version it was written in);
    ``StateDecodeError`` for anything else."""
    shapes: dict[str, Policy] = {}
    if shape is not None:
        h, pol = decode_shape(shape.encode())
        shapes[h] = pol
    return decode_schedule(_moved_body("schedule", state, version), shapes)


def moved_quota(q: QuotaState) -> str:
    """The state of a tenant's quota aggregate as a move carries it."""
    return encode_quota(q).decode()


def decode_moved_quota(state: str, version: int) -> QuotaState:
    return decode_quota(_moved_body("quota", state, version))


def _moved_body(kind: str, state: str, version: int) -> list[Any]:
    try:
        body = orjson.loads(state)
    except ValueError as exc:
        raise StateDecodeError(f"a moved {kind} state that is not JSON: {exc}") from exc
    if not isinstance(body, list):
        raise StateDecodeError(f"a moved {kind} state that is no list")
    return upcast_state(kind, body, version) if version != STATE_VERSION else body
