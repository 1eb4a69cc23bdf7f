"""What the audit folds, and its checkpoint: the auditor's state as a JSON document.

The auditor (``chronolog.audit.auditor``) keeps, per key, what its checks need of the events
seen so far: per schedule its revisions, fences, claimed occurrence spans, manual request keys
and runs (``ScheduleFold``), per effect ID its intent and success (``EffectFold``), per
tenant its quota aggregate (``QuotaFold``, ``SlotHolder``) and per key its partition
(``Home``), per calendar its latest revisions (``CalendarFold``) and the copies of a
revision still waiting for it, and the report found so far (``AuditReport``). All of it is
bounded by the live schedules and runs (and a calendar's latest revisions): what the
auditor forgets, and why its checks stay sound, is told in its module docstring.
``encode_state`` writes all of it as one JSON-able document
(``CHECKPOINT_VERSION``), ``decode_state`` reads it back; ``encode_state_lines`` writes the
same as JSON lines, a schedule's fold a line (``LINES_VERSION``: what ``chronolog audit``
saves), and ``decode_document`` reads either. An audit that resumes from the document and
reads on gives the report an audit of the whole log gives (docs/design.md §10,
"Checkpoints"). Pure: no I/O.

How the folds are held (``FoldStore``): a schedule's fold takes about 13 KB as objects for
an hourly schedule a day old, so a log of a million schedules would need 13 GB. In log order
a schedule's events come in clusters (a run's materialization, claim and result within
seconds, then nothing for an hour), so only the folds of the last stretch of the log need to
be objects: the store keeps the ``hot_max`` most recently used ones so and seals the others
— the fold's checkpoint encoding (``encode_schedule``, exact both ways) as JSON compressed
with zstd. A sealed fold is decoded when its schedule's next event comes. Holding a fold
sealed changes nothing the audit finds: a resumed audit already relies on the same
encoding.

Encoding: an event reference is ``[partition, offset, event_id, type]``; instants are ISO 8601
strings; a spec is its JSON form (validated again as a stored spec on reading); sets are
sorted lists, so one state always encodes to the same document.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import orjson
import zstandard

from chronolog.commands.state import CalendarCopy
from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.codec import kept

CHECKPOINT_VERSION = 2  # 2: bounded state (finished runs, span watermark, effects by run)
LINES_VERSION = 3  # the version-2 document as JSON lines, a schedule's fold a line

# the checks, in report order (each is described in chronolog.audit.auditor)
CHECKS: tuple[str, ...] = (
    "occurrence_unique",
    "fence_monotonic",
    "fence_current",
    "result_once",
    "result_within_lease",
    "overlap",
    "misfire_all_complete",
    "effect_unique",
    "completed_final",
    "quota_exact",
    "quota_balance",
    "concurrency_limit",
    "calendar_exclusion",
    "single_home",
    "move_matched",
    "decodable",
    "archive_intact",
)


class CheckpointError(ValueError):
    """A checkpoint document this code cannot read (another version, damaged)."""


class EventRef(NamedTuple):
    """Where an event sits in the log and what it is. (A named tuple: the auditor holds
    tens of them per schedule, and a sealed fold makes them again each time it is read.)"""

    partition: int
    offset: int
    event_id: str
    type: str

    def __str__(self) -> str:
        return f"p{self.partition}@{self.offset} {self.type} {self.event_id}"

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset,
                "event_id": self.event_id, "type": self.type}


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: the check, a sentence, and the events that show it (log order)."""

    check: str
    message: str
    events: tuple[EventRef, ...]
    tenant: str = ""
    schedule_id: str = ""
    run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "message": self.message, "tenant": self.tenant,
                "schedule_id": self.schedule_id, "run_id": self.run_id,
                "events": [e.to_dict() for e in self.events]}


@dataclass
class AuditReport:
    """What the audit saw and what it found."""

    events: int = 0
    schedules: int = 0
    runs: int = 0
    results: int = 0
    effects: int = 0
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def violation_counts(self) -> dict[str, int]:
        """Violations per check, every check listed (zero included)."""
        counts = dict.fromkeys(CHECKS, 0)
        for v in self.violations:
            counts[v.check] = counts.get(v.check, 0) + 1
        return counts

    def by_check(self, check: str) -> list[Violation]:
        return [v for v in self.violations if v.check == check]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "events": self.events, "schedules": self.schedules,
                "runs": self.runs, "results": self.results, "effects": self.effects,
                "violation_counts": self.violation_counts,
                "violations": [v.to_dict() for v in self.violations], "notes": list(self.notes)}


# ---------------------------------------------------------------------------------------
# per-schedule fold


class RunFold:
    __slots__ = (
        "cause",
        "claim_ref",
        "claimed_fence",
        "effects",
        "lease_ref",
        "lease_until",
        "materialized_ref",
        "permit",
        "result_ref",
        "revision",
        "run_fence",
        "run_id",
        "state",
    )

    def __init__(self, run_id: str, revision: int, state: str, ref: EventRef | None) -> None:
        self.run_id = run_id
        self.revision = revision
        self.state = state
        self.claimed_fence = 0  # the fence of the latest AttemptClaimed
        self.run_fence = 0  # the latest FenceAdvanced for this run
        self.lease_until: datetime | None = None  # None: no lease held
        self.lease_ref: EventRef | None = None
        self.claim_ref: EventRef | None = None
        self.result_ref: EventRef | None = None
        self.materialized_ref = ref
        self.cause: str | None = None  # the command whose decision materialized it
        self.effects: list[str] = []  # the effect IDs intended for it (held in the auditor)
        # its concurrency permit: None (none asked), "asked" (RunAwaitsPermit), "granted"
        self.permit: str | None = None


@dataclass
class RevisionFold:
    """One revision's spec, and what misfire ``all`` must see recorded under it."""

    revision: int
    spec: m.ScheduleSpec
    anchor: datetime
    ref: EventRef
    check_misfire: bool
    instants: dict[datetime, EventRef] = field(default_factory=dict)
    ranges: list[tuple[datetime, datetime, int, EventRef]] = field(default_factory=list)
    # misfire ``all`` checked through this instant (at a checkpoint), the instants and ranges
    # up to it dropped; the event that recorded it (a gap after it names it)
    settled: datetime | None = None
    settled_ref: EventRef | None = None


class ScheduleFold:
    __slots__ = (
        "calendars",
        "claimed_ref",
        "claimed_through",
        "completed_ref",
        "current",
        "dead",
        "fence",
        "fence_ref",
        "fence_run",
        "finished",
        "last_instant",
        "leased",
        "manual",
        "max_fence",
        "pending",
        "revised_at",
        "revisions",
        "runs",
        "schedule_id",
        "scheduled_runs",
        "spans",
        "starts",
        "tenant",
    )

    def __init__(self, tenant: str, schedule_id: str) -> None:
        self.tenant = tenant
        self.schedule_id = schedule_id
        self.revisions: dict[int, RevisionFold] = {}
        self.current: RevisionFold | None = None
        self.fence = 0
        self.max_fence = 0
        self.fence_ref: EventRef | None = None
        self.fence_run: str | None = None
        # claimed occurrence spans [start, end] (an instant is [t, t]), disjoint, by start
        self.starts: list[datetime] = []
        self.spans: list[tuple[datetime, datetime, EventRef]] = []
        # the end of the latest span dropped from ``spans`` (only the last few are kept) and
        # the event that recorded it: every later claim must start after it
        self.claimed_through: datetime | None = None
        self.claimed_ref: EventRef | None = None
        self.manual: dict[str, EventRef] = {}
        self.runs: dict[str, RunFold] = {}
        # finished runs (SUCCEEDED, CANCELLED, SKIPPED) still held, oldest first; DEAD ones
        self.finished: dict[str, None] = {}
        self.dead: dict[str, None] = {}
        self.leased: set[str] = set()
        self.pending: set[str] = set()
        self.completed_ref: EventRef | None = None  # its ScheduleCompleted, once ended
        self.scheduled_runs = 0  # runs that advanced the schedule (its maxCount count)
        self.last_instant: datetime | None = None  # the latest scheduled instant recorded
        self.revised_at: datetime | None = None  # authority time of the current revision
        # the copies of the calendars its spec names, in its order, as the decider holds
        # them (``chronolog.commands.calendars``); None: it names none
        self.calendars: tuple[CalendarCopy, ...] | None = None

    def checks_misfire(self) -> bool:
        """Whether a revision still has misfire ``all`` records to judge."""
        return any(r.check_misfire for r in self.revisions.values())

    def overlap_policy(self, revision: int | None = None) -> str | None:
        rev = self.current if revision is None else self.revisions.get(revision, self.current)
        return None if rev is None else rev.spec.overlap


@dataclass
class SlotHolder:
    """A schedule of a tenant with a quota: the create it waits with, or holds a slot for."""

    held: str | None = None  # the command ID of a create waiting for a slot
    slot: str | None = None  # the command ID of the create whose slot it holds
    live: bool = False
    ref: EventRef | None = None


@dataclass
class QuotaFold:
    """A tenant's quota aggregate: schedule ID -> [create command ID, event, confirmed]."""

    slots: dict[str, list[Any]] = field(default_factory=dict)
    max_schedules: int | None = None
    reserved: set[str] = field(default_factory=set)  # every create a slot was reserved for


@dataclass
class EffectFold:
    owner: tuple[str, str]
    intent_ref: EventRef
    retry_allowed: bool = False
    success_ref: EventRef | None = None
    run_id: str = ""  # the run it was intended for (forgotten with it)
    open: bool = True  # intended or uncertain: its run is kept until it is settled


NO_SPEC = "none"  # the digest of no spec: a calendar never put (revision 0) or deleted


def spec_digest(spec: CalendarSpec | None) -> str:
    """A short digest of a calendar's spec (``NO_SPEC`` for none), to compare a schedule's
    copy with the calendar's revision without holding either spec."""
    if spec is None:
        return NO_SPEC
    data = orjson.dumps(spec.model_dump(mode="json", by_alias=True),
                        option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()[:32]


@dataclass
class CalendarFold:
    """A calendar's aggregate (schedule ID ``@calendar:<name>``): its latest revisions
    (``CalendarRevised``, ``CalendarDeleted``) as revision -> (spec digest, event), at most
    ``CALENDAR_REVISIONS_KEPT`` of them; those up to ``forgotten`` are no longer held."""

    revisions: dict[int, tuple[str, EventRef]] = field(default_factory=dict)
    forgotten: int = 0

    @property
    def latest(self) -> int:
        return max(self.revisions, default=self.forgotten)


@dataclass(slots=True)
class Home:
    """Where a key is: its partition, and while it moves its KeyMovedOut's (to_partition,
    version, event)."""

    partition: int
    moving: tuple[int, int, EventRef] | None


# ---------------------------------------------------------------------------------------
# how the folds are held

Key = tuple[str, str]  # (tenant, schedule ID)

DEFAULT_HOT_MAX = 50_000  # folds held as objects (about 650 MB at 13 KB each)


class FoldStore:
    """A mapping of (tenant, schedule ID) to its fold: ``hot_max`` as objects (the most
    recently used), the rest sealed. ``get`` and ``put`` make a fold the most recent;
    ``folds`` visits every one (or those with misfire ``all`` records to judge) in the order
    their schedules were first seen, writing back what the visitor changed if asked."""

    def __init__(self, hot_max: int = DEFAULT_HOT_MAX) -> None:
        if hot_max < 1:
            raise ValueError(f"hot_max must be at least 1, not {hot_max}")
        self.hot_max = hot_max
        # every fold, as an object or sealed, in the order its schedule was first seen
        self._folds: dict[Key, ScheduleFold | bytes] = {}
        self._recent: OrderedDict[Key, None] = OrderedDict()  # the hot ones, least recent first
        self._cold_misfire: set[Key] = set()  # sealed folds with misfire records to judge
        self._compress = zstandard.ZstdCompressor(level=3)
        self._decompress = zstandard.ZstdDecompressor()

    def __len__(self) -> int:
        return len(self._folds)

    def __contains__(self, key: object) -> bool:
        return key in self._folds

    @property
    def hot(self) -> int:
        return len(self._recent)

    @property
    def cold(self) -> int:
        return len(self._folds) - len(self._recent)

    def get(self, key: Key) -> ScheduleFold | None:
        """The fold of ``key`` (decoded if sealed), now the most recently used; None when
        the store has none."""
        held = self._folds.get(key)
        if held is None:
            return None
        if isinstance(held, ScheduleFold):
            self._recent.move_to_end(key)
            return held
        s = self._unseal(held)
        self.put(key, s)
        return s

    def put(self, key: Key, s: ScheduleFold) -> None:
        """Hold ``s`` as the fold of ``key``, the most recently used; the least recently used
        beyond ``hot_max`` are sealed."""
        self._cold_misfire.discard(key)
        self._folds[key] = s
        self._recent[key] = None
        self._recent.move_to_end(key)
        while len(self._recent) > self.hot_max:
            old, _ = self._recent.popitem(last=False)
            fold = self._folds[old]
            assert isinstance(fold, ScheduleFold)
            self._seal(old, fold)

    def folds(self, misfire_only: bool = False,
              write_back: bool = False) -> Iterator[ScheduleFold]:
        """Every fold (``misfire_only``: those with misfire ``all`` records to judge) in the
        order its schedule was first seen; a sealed one is decoded for the visit, without
        becoming hot, and (``write_back``: for a visitor that changes folds) sealed again
        after it with what the visitor changed."""
        for key in list(self._folds):
            held = self._folds[key]
            if isinstance(held, ScheduleFold):
                if not misfire_only or held.checks_misfire():
                    yield held
            elif not misfire_only or key in self._cold_misfire:
                s = self._unseal(held)
                yield s
                if write_back:
                    self._seal(key, s)

    def lines(self) -> Iterator[bytes]:
        """Each fold's checkpoint encoding (``encode_schedule``) as a JSON line, in the order
        ``folds`` visits them; a sealed fold's is its bytes decompressed, not decoded."""
        for held in list(self._folds.values()):
            if isinstance(held, ScheduleFold):
                yield orjson.dumps(encode_schedule(held)) + b"\n"
            else:
                yield self._decompress.decompress(held) + b"\n"

    def _seal(self, key: Key, s: ScheduleFold) -> None:
        # a copy of its own size: the compressor's output keeps its worst-case buffer
        self._folds[key] = kept(self._compress.compress(orjson.dumps(encode_schedule(s))))
        if s.checks_misfire():
            self._cold_misfire.add(key)
        else:
            self._cold_misfire.discard(key)

    def _unseal(self, data: bytes) -> ScheduleFold:
        return decode_schedule(orjson.loads(self._decompress.decompress(data)))


# ---------------------------------------------------------------------------------------
# the checkpoint document


@dataclass
class AuditState:
    """Everything the auditor holds between two events."""

    report: AuditReport = field(default_factory=AuditReport)
    schedules: FoldStore = field(default_factory=FoldStore)
    effects: dict[str, EffectFold] = field(default_factory=dict)
    holders: dict[tuple[str, str], SlotHolder] = field(default_factory=dict)
    quotas: dict[str, QuotaFold] = field(default_factory=dict)
    homes: dict[tuple[str, str], Home] = field(default_factory=dict)
    # per concurrency key's aggregate (tenant, schedule ID): run ID -> its PermitGranted
    permits: dict[tuple[str, str], dict[str, EventRef]] = field(default_factory=dict)
    # per calendar (tenant, name): its latest revisions
    calendars: dict[tuple[str, str], CalendarFold] = field(default_factory=dict)
    # the copies (CalendarCopied) of a calendar's revision not seen yet (its home on a
    # partition read later), per (tenant, name, revision): spec digest -> [the first such
    # copy, its schedule ID, how many]
    copies: dict[tuple[str, str, int], dict[str, list[Any]]] = field(default_factory=dict)


def _ref(r: EventRef | None) -> list[Any] | None:
    return None if r is None else list(r)  # [partition, offset, event_id, type]


def _unref(a: list[Any] | None) -> EventRef | None:
    return None if a is None else _must(a)


def _must(a: list[Any]) -> EventRef:
    # the four fields as written (a document of another shape fails on its length)
    return EventRef._make(a)


def _t(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _unt(s: str | None) -> datetime | None:
    return None if s is None else datetime.fromisoformat(s)


def _encode_run(r: RunFold) -> list[Any]:
    return [r.run_id, r.revision, r.state, r.claimed_fence, r.run_fence, _t(r.lease_until),
            _ref(r.lease_ref), _ref(r.claim_ref), _ref(r.result_ref),
            _ref(r.materialized_ref), r.cause, list(r.effects)] + (
                [] if r.permit is None else [r.permit])


def _decode_run(a: list[Any]) -> RunFold:
    run = RunFold(a[0], a[1], a[2], _unref(a[9]))
    run.claimed_fence, run.run_fence, run.lease_until = a[3], a[4], _unt(a[5])
    run.lease_ref, run.claim_ref, run.result_ref = _unref(a[6]), _unref(a[7]), _unref(a[8])
    run.cause, run.effects = a[10], list(a[11])
    run.permit = a[12] if len(a) > 12 else None
    return run


def _encode_revision(r: RevisionFold) -> list[Any]:
    return [r.revision, r.spec.model_dump(mode="json"), _t(r.anchor), _ref(r.ref),
            r.check_misfire, [[_t(t), _ref(ref)] for t, ref in r.instants.items()],
            [[_t(a), _t(b), n, _ref(ref)] for a, b, n, ref in r.ranges],
            _t(r.settled), _ref(r.settled_ref)]


def _decode_revision(a: list[Any]) -> RevisionFold:
    anchor = _unt(a[2])
    assert anchor is not None
    return RevisionFold(
        a[0], m.ScheduleSpec.model_validate(a[1], context=m.STORED), anchor, _must(a[3]),
        a[4], {datetime.fromisoformat(t): _must(ref) for t, ref in a[5]},
        [(datetime.fromisoformat(x), datetime.fromisoformat(y), n, _must(ref))
         for x, y, n, ref in a[6]],
        _unt(a[7]), _unref(a[8]))


def encode_schedule(s: ScheduleFold) -> dict[str, Any]:
    return {
        "tenant": s.tenant, "id": s.schedule_id,
        "revisions": [_encode_revision(r) for r in s.revisions.values()],
        "current": None if s.current is None else s.current.revision,
        "fence": [s.fence, s.max_fence, _ref(s.fence_ref), s.fence_run],
        "spans": [[_t(a), _t(b), _ref(ref)] for a, b, ref in s.spans],
        "claimed": [_t(s.claimed_through), _ref(s.claimed_ref)],
        "finished": list(s.finished), "dead": list(s.dead),
        "manual": [[k, _ref(ref)] for k, ref in s.manual.items()],
        "runs": [_encode_run(r) for r in s.runs.values()],
        "leased": sorted(s.leased), "pending": sorted(s.pending),
        "completed": _ref(s.completed_ref), "scheduled_runs": s.scheduled_runs,
        "last_instant": _t(s.last_instant), "revised_at": _t(s.revised_at),
    } | ({} if s.calendars is None else {"calendars": [
        [c.name, c.revision, None if c.spec is None else c.spec.model_dump(
            mode="json", by_alias=True), c.received] for c in s.calendars]})


def decode_schedule(d: dict[str, Any]) -> ScheduleFold:
    s = ScheduleFold(d["tenant"], d["id"])
    for a in d["revisions"]:
        rev = _decode_revision(a)
        s.revisions[rev.revision] = rev
    s.current = None if d["current"] is None else s.revisions[d["current"]]
    s.fence, s.max_fence, fence_ref, s.fence_run = d["fence"]
    s.fence_ref = _unref(fence_ref)
    s.spans = [(datetime.fromisoformat(a), datetime.fromisoformat(b), _must(ref))
               for a, b, ref in d["spans"]]
    s.starts = [a for a, _, _ in s.spans]
    s.claimed_through, s.claimed_ref = _unt(d["claimed"][0]), _unref(d["claimed"][1])
    s.finished, s.dead = dict.fromkeys(d["finished"]), dict.fromkeys(d["dead"])
    s.manual = {k: _must(ref) for k, ref in d["manual"]}
    s.runs = {r.run_id: r for r in map(_decode_run, d["runs"])}
    s.leased, s.pending = set(d["leased"]), set(d["pending"])
    s.completed_ref = _unref(d["completed"])
    s.scheduled_runs = d["scheduled_runs"]
    s.last_instant, s.revised_at = _unt(d["last_instant"]), _unt(d["revised_at"])
    copies = d.get("calendars")
    s.calendars = None if copies is None else tuple(
        CalendarCopy(name, revision, None if spec is None else CalendarSpec.model_validate(spec),
                     received) for name, revision, spec, received in copies)
    return s


def _encode_report(r: AuditReport) -> dict[str, Any]:
    return {"counts": [r.events, r.schedules, r.runs, r.results, r.effects],
            "violations": [[v.check, v.message, [_ref(e) for e in v.events], v.tenant,
                            v.schedule_id, v.run_id] for v in r.violations],
            "notes": list(r.notes)}


def _decode_report(d: dict[str, Any]) -> AuditReport:
    events, schedules, runs, results, effects = d["counts"]
    return AuditReport(events, schedules, runs, results, effects,
                       [Violation(c, msg, tuple(_must(e) for e in refs), t, sid, run)
                        for c, msg, refs, t, sid, run in d["violations"]], list(d["notes"]))


def encode_state(state: AuditState) -> dict[str, Any]:
    """The checkpoint document of ``state`` (JSON-able; version 2)."""
    return {"version": CHECKPOINT_VERSION, **_encode_rest(state),
            "schedules": [encode_schedule(s) for s in state.schedules.folds()]}


def encode_state_lines(state: AuditState) -> Iterator[bytes]:
    """The checkpoint document of ``state`` as JSON lines (``LINES_VERSION``): a first line
    with everything but the schedules, then one line per schedule's fold — given out a line
    at a time, so a state of a million schedules is never one document in memory."""
    yield orjson.dumps({"version": LINES_VERSION, **_encode_rest(state)}) + b"\n"
    yield from state.schedules.lines()


def _encode_rest(state: AuditState) -> dict[str, Any]:
    """Everything of ``state`` but its schedules' folds."""
    return {
        "report": _encode_report(state.report),
        "effects": [[k, list(e.owner), _ref(e.intent_ref), e.retry_allowed,
                     _ref(e.success_ref), e.run_id, e.open]
                    for k, e in state.effects.items()],
        "holders": [[t, sid, h.held, h.slot, h.live, _ref(h.ref)]
                    for (t, sid), h in state.holders.items()],
        "quotas": [[t, [[sid, *slot[:1], _ref(slot[1]), slot[2]] for sid, slot in q.slots.items()],
                    q.max_schedules, sorted(q.reserved)] for t, q in state.quotas.items()],
        "homes": [[t, sid, h.partition,
                   None if h.moving is None else [h.moving[0], h.moving[1], _ref(h.moving[2])]]
                  for (t, sid), h in state.homes.items()],
        "permits": [[t, sid, [[r, _ref(ref)] for r, ref in held.items()]]
                    for (t, sid), held in state.permits.items() if held],
        "calendars": [[t, name, c.forgotten,
                       [[r, digest, _ref(ref)] for r, (digest, ref) in c.revisions.items()]]
                      for (t, name), c in state.calendars.items()],
        "copies": [[t, name, r, [[digest, _ref(first[0]), first[1], first[2]]
                                 for digest, first in seen.items()]]
                   for (t, name, r), seen in state.copies.items()],
    }


def decode_state(doc: Any, hot_max: int = DEFAULT_HOT_MAX) -> AuditState:
    """The state a checkpoint document holds (its folds in a ``FoldStore(hot_max)``);
    ``CheckpointError`` when it is not one this code wrote."""
    if not isinstance(doc, dict) or doc.get("version") != CHECKPOINT_VERSION:
        version = doc.get("version") if isinstance(doc, dict) else None
        raise CheckpointError(f"audit checkpoint version {version!r} (this chronolog reads "
                              f"{CHECKPOINT_VERSION})")
    try:
        state = _decode_rest(doc, hot_max)
        for d in doc["schedules"]:
            s = decode_schedule(d)
            state.schedules.put((s.tenant, s.schedule_id), s)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"audit checkpoint damaged: {type(exc).__name__}: {exc}") \
            from None
    return state


def decode_document(data: bytes, hot_max: int = DEFAULT_HOT_MAX) -> AuditState:
    """The state a checkpoint document holds, given as its bytes: JSON lines
    (``encode_state_lines``), read a line at a time, or a version-2 document (one JSON
    value); ``CheckpointError`` when it is neither."""
    end = data.find(b"\n")
    try:
        head = orjson.loads(data if end < 0 else data[:end])
    except orjson.JSONDecodeError as exc:
        raise CheckpointError(f"audit checkpoint damaged: {exc}") from None
    if isinstance(head, dict) and head.get("version") == CHECKPOINT_VERSION:
        return decode_state(head, hot_max)
    if not isinstance(head, dict) or head.get("version") != LINES_VERSION:
        version = head.get("version") if isinstance(head, dict) else None
        raise CheckpointError(f"audit checkpoint version {version!r} (this chronolog reads "
                              f"{CHECKPOINT_VERSION} and {LINES_VERSION})")
    view = memoryview(data)
    try:
        state = _decode_rest(head, hot_max)
        at = end + 1
        while 0 < at < len(data):
            end = data.find(b"\n", at)
            end = len(data) if end < 0 else end
            s = decode_schedule(orjson.loads(view[at:end]))
            state.schedules.put((s.tenant, s.schedule_id), s)
            at = end + 1
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"audit checkpoint damaged: {type(exc).__name__}: {exc}") \
            from None
    return state


def _decode_rest(doc: dict[str, Any], hot_max: int) -> AuditState:
    """A state with everything of ``doc`` but its schedules (an empty ``FoldStore``)."""
    state = AuditState(report=_decode_report(doc["report"]), schedules=FoldStore(hot_max))
    for k, owner, intent, retry, success, run_id, open_ in doc["effects"]:
        state.effects[k] = EffectFold((owner[0], owner[1]), _must(intent), retry,
                                      _unref(success), run_id, open_)
    for t, sid, held, slot, live, ref in doc["holders"]:
        state.holders[(t, sid)] = SlotHolder(held, slot, live, _unref(ref))
    for t, slots, max_schedules, reserved in doc["quotas"]:
        state.quotas[t] = QuotaFold(
            {sid: [cid, _must(ref), confirmed] for sid, cid, ref, confirmed in slots},
            max_schedules, set(reserved))
    for t, sid, held in doc.get("permits", ()):
        state.permits[(t, sid)] = {r: _must(ref) for r, ref in held}
    for t, name, forgotten, revisions in doc.get("calendars", ()):
        state.calendars[(t, name)] = CalendarFold(
            {r: (digest, _must(ref)) for r, digest, ref in revisions}, forgotten)
    for t, name, r, seen in doc.get("copies", ()):
        state.copies[(t, name, r)] = {digest: [_must(ref), sid, n]
                                      for digest, ref, sid, n in seen}
    for t, sid, partition, moving in doc["homes"]:
        state.homes[(t, sid)] = Home(partition, None if moving is None else
                                     (moving[0], moving[1], _must(moving[2])))
    return state
