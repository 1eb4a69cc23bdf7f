"""Per-schedule aggregate state: plain slotted classes, small enough for 100,000 schedules.

``ScheduleState`` is the fold of one schedule's events (``evolve``); it holds the compact
policy derived from the spec (shared between schedules with identical specs), the counters
that make identities unique (fence, last materialized instant), and the live runs plus a
few recent terminal ones (enough to answer duplicate hints and repeated completions).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.ids import QUOTA_ID
from chronolog.domain.messages import JobSpec, ScheduleSpec
from chronolog.domain.recurrence import compile_trigger

ACTIVE_STATES = frozenset({"READY", "LEASED", "RETRY_WAIT"})
TERMINAL = frozenset({"SUCCEEDED", "DEAD", "CANCELLED", "SKIPPED"})
RECENT_TERMINAL_KEPT = 1  # finished runs kept per schedule: state.done (besides DEAD ones)
DEAD_KEPT = 64  # dead-lettered runs kept for redrive per schedule
MANUAL_KEYS_KEPT = 256  # manual-trigger request keys remembered per schedule
BACKFILL_KEYS_KEPT = 16  # backfill request keys remembered per schedule (their ranges: all)


class Policy:
    """The decider's view of a ScheduleSpec; interned, so identical specs share one."""

    __slots__ = (
        "_fields",
        "_shape_spec",
        "_spec",
        "concurrency",
        "effects",
        "exclude",
        "grace",
        "initial_backoff",
        "jitter",
        "job",
        "kind",
        "lease",
        "max_attempts",
        "max_backoff",
        "max_catchup",
        "max_count",
        "misfire",
        "misfire_max_age",
        "multiplier",
        "overlap",
        "priority",
        "resource_class",
        "retry_max_age",
        "shape",
        "spec_hash",
        "start_deadline",
    )

    def __init__(self, spec: ScheduleSpec, spec_hash: str) -> None:
        self._spec: ScheduleSpec | None = spec
        self._shape_spec: ScheduleSpec | None = None
        self._fields: dict[str, Any] | None = None  # a ``with_job`` policy's own fields
        # (hash, body, own fields) of the spec without its job's params and the fields
        # each schedule may set for itself, as the state codec stores it
        # (chronolog.commands.state_codec); filled on first use
        self.shape: tuple[str, bytes, dict[str, Any] | None] | None = None
        self.spec_hash = spec_hash
        self.job: JobSpec = spec.job
        self.misfire = spec.misfire.policy
        self.grace = spec.misfire.grace
        self.max_catchup = spec.misfire.max_catchup
        self.misfire_max_age = spec.misfire.max_age
        self.overlap = spec.overlap
        self.max_attempts = spec.retry.max_attempts
        self.initial_backoff = spec.retry.initial_backoff
        self.max_backoff = spec.retry.max_backoff
        self.multiplier = spec.retry.multiplier
        self.retry_max_age = spec.retry.max_age
        self.lease = spec.lease
        self.start_deadline = spec.start_deadline
        self.jitter = spec.jitter
        self.effects = spec.effects
        self.resource_class = spec.resource_class
        self.priority = spec.priority
        self.concurrency = spec.concurrency
        self.exclude = spec.exclude
        self.max_count = spec.max_count
        self.kind = (
            "cron"
            if spec.cron is not None
            else "every"
            if spec.every is not None
            else "at"
            if spec.at is not None
            else "delay"
        )

    @property
    def spec(self) -> ScheduleSpec:
        """The spec (of a policy built ``with_job``: built when first asked for)."""
        spec = self._spec
        if spec is None:
            shape = self._shape_spec
            assert shape is not None
            spec = self._spec = shape.model_copy(update={"job": self.job,
                                                         **(self._fields or {})})
        return spec

    def with_job(self, job: JobSpec, spec_hash: str,
                 fields: dict[str, Any] | None = None,
                 shape: tuple[str, bytes, dict[str, Any] | None] | None = None) -> Policy:
        """This policy with another job and, given ``fields``, other values of fields none
        of the attributes here derive from (a schedule's ``anchor``, ``start``, ``end``);
        its spec: this one's with those, hashed ``spec_hash``, only built when asked for.
        For a snapshot's states, whose specs differ from a shared *shape* in those alone;
        ``shape``: the codec's parts of the result (default: this policy's)."""
        p = Policy.__new__(Policy)
        p._spec = None
        p._shape_spec = self.spec
        p._fields = fields
        p.shape = shape if shape is not None else self.shape
        p.spec_hash = spec_hash
        p.job = job
        p.misfire = self.misfire
        p.grace = self.grace
        p.max_catchup = self.max_catchup
        p.misfire_max_age = self.misfire_max_age
        p.overlap = self.overlap
        p.max_attempts = self.max_attempts
        p.initial_backoff = self.initial_backoff
        p.max_backoff = self.max_backoff
        p.multiplier = self.multiplier
        p.retry_max_age = self.retry_max_age
        p.lease = self.lease
        p.start_deadline = self.start_deadline
        p.jitter = self.jitter
        p.effects = self.effects
        p.concurrency = self.concurrency
        p.exclude = self.exclude
        p.resource_class = self.resource_class
        p.priority = self.priority
        p.max_count = self.max_count
        p.kind = self.kind
        return p


_POLICIES: dict[str, Policy] = {}
_POLICY_CACHE_MAX = 50_000


def spec_hash(spec: ScheduleSpec) -> str:
    """A stable digest of a spec (idempotent create: same key + same spec)."""
    return dump_hash(spec.model_dump(mode="json"))


def dump_hash(dumped: dict[str, Any]) -> str:
    """``spec_hash`` of the spec whose ``model_dump(mode="json")`` is ``dumped``."""
    raw = orjson.dumps(dumped, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=12).hexdigest()


_BY_IDENTITY: dict[int, tuple[ScheduleSpec, Policy]] = {}


def policy_for(spec: ScheduleSpec) -> Policy:
    """The interned Policy of a spec (the same spec object is hashed only once)."""
    hit = _BY_IDENTITY.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    pol = _policy_by_hash(spec)
    if len(_BY_IDENTITY) >= 4096:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[id(spec)] = (spec, pol)
    return pol


def _policy_by_hash(spec: ScheduleSpec) -> Policy:
    return policy_hashed(spec, spec_hash(spec))


def interned_policy(h: str) -> Policy | None:
    """The interned Policy of the spec whose ``spec_hash`` is ``h``, if there is one."""
    return _POLICIES.get(h)


def policy_hashed(spec: ScheduleSpec, h: str) -> Policy:
    """The interned Policy of a spec whose ``spec_hash`` is known to be ``h``."""
    pol = _POLICIES.get(h)
    if pol is None:
        pol = intern_policy(Policy(spec, h))
    return pol


def intern_policy(pol: Policy) -> Policy:
    """The interned Policy of ``pol``'s spec hash: ``pol`` itself if there was none."""
    found = _POLICIES.get(pol.spec_hash)
    if found is not None:
        return found
    if len(_POLICIES) >= _POLICY_CACHE_MAX:
        _POLICIES.clear()
    _POLICIES[pol.spec_hash] = pol
    return pol


class Run:
    """One occurrence (run) of a schedule and its current attempt."""

    __slots__ = (
        "age_base",
        "attempt",
        "attempt_base",
        "cancel_requested",
        "checksum",
        "claimed",
        "concurrency",
        "due_at",
        "effects",
        "fence",
        "job",
        "lease_until",
        "permit",
        "permitted",
        "priority",
        "reconcile",
        "resource_class",
        "result",
        "result_fence",
        "retry_at",
        "revision",
        "run_id",
        "scheduled_at",
        "start_deadline_at",
        "state",
        "trigger",
        "worker_id",
    )

    def __init__(
        self,
        run_id: str,
        scheduled_at: datetime,
        due_at: datetime,
        revision: int,
        job: JobSpec,
        trigger: str,
        state: str,
        start_deadline_at: datetime | None,
        resource_class: str,
        priority: int,
    ) -> None:
        self.run_id = run_id
        self.scheduled_at = scheduled_at
        self.due_at = due_at
        self.revision = revision
        self.job = job
        self.trigger = trigger
        self.state = state
        self.attempt = 1
        self.attempt_base = 1
        self.age_base: datetime | None = None  # max-age origin after a redrive
        self.fence = 0
        self.worker_id: str | None = None
        self.lease_until: datetime | None = None
        self.retry_at: datetime | None = None
        self.start_deadline_at = start_deadline_at
        self.claimed = False
        # a concurrency key's (rendered key, limit), once the run first asked for a permit;
        # the ask it waits on or holds (None: none); whether the key's aggregate granted it
        self.concurrency: tuple[str, int] | None = None
        self.permit: str | None = None
        self.permitted = False
        self.cancel_requested = False
        self.checksum: str | None = None
        self.result_fence = 0
        self.result: tuple[int, str | None, Any] | None = None  # (size, uri, inline)
        self.reconcile: str | None = None  # "run" or an effect_id
        self.effects: dict[str, list[Any]] | None = None  # effect_id -> [state, attempt, intent]
        self.resource_class = resource_class
        self.priority = priority

    def clone(self) -> Run:
        r = Run.__new__(Run)
        r.run_id = self.run_id
        r.scheduled_at = self.scheduled_at
        r.due_at = self.due_at
        r.revision = self.revision
        r.job = self.job
        r.trigger = self.trigger
        r.state = self.state
        r.attempt = self.attempt
        r.attempt_base = self.attempt_base
        r.age_base = self.age_base
        r.fence = self.fence
        r.worker_id = self.worker_id
        r.lease_until = self.lease_until
        r.retry_at = self.retry_at
        r.start_deadline_at = self.start_deadline_at
        r.claimed = self.claimed
        r.concurrency = self.concurrency
        r.permit = self.permit
        r.permitted = self.permitted
        r.cancel_requested = self.cancel_requested
        r.checksum = self.checksum
        r.result_fence = self.result_fence
        r.result = self.result
        r.reconcile = self.reconcile
        r.effects = (None if self.effects is None
                     else {k: list(v) for k, v in self.effects.items()})
        r.resource_class = self.resource_class
        r.priority = self.priority
        return r

    @property
    def active(self) -> bool:
        """Holds the overlap guard: executing, or about to, or its outcome unknown. A
        backfill's run never does: it paces itself (``decider._backfill``)."""
        return self.trigger != "backfill" and (self.state in ACTIVE_STATES or (
            self.state == "RECONCILING" and self.reconcile == "run"))

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def snapshot(self) -> tuple[Any, ...]:
        """A comparable value of everything the run holds (tests compare folds)."""
        return tuple(
            (k, v if k != "effects" else sorted((v or {}).items()))
            for k in Run.__slots__
            for v in [getattr(self, k)]
            if k != "job"
        ) + (("job", self.job.model_dump()),)


class Manual(NamedTuple):
    """A remembered manual trigger (``ScheduleState.manual``, keyed by its request key)."""

    run_id: str
    digest: str  # of the trigger's params: the same key with other params is a conflict
    # the run's state when it left the schedule's state (its final one), or None while the
    # run is held (``ScheduleState.run`` answers), or when unknown: a state restored from a
    # snapshot of version 1, which did not record it, for a run already forgotten then
    final: str | None = None


class QuotaWait(NamedTuple):
    """A create that passed its checks and waits for the tenant quota's answer."""

    command_id: str
    request_key: str | None
    spec: ScheduleSpec
    reply_to: str | None = None  # the client waiting for the answer (the create's reply_to)


_DERIVED: Any = object()  # ScheduleState._trigger: compile policy.spec at anchor when used


def trigger_of(spec: ScheduleSpec, anchor: datetime, *, recorded: bool = True) -> Any:
    """The compiled (cached, immutable) trigger of ``spec`` at ``anchor``. A ``recorded``
    spec (one the log holds) compiles even if its cron can never fire: an earlier version
    accepted some such rules, and the log must always fold."""
    return compile_trigger(
        cron=spec.cron,
        every=spec.every,
        at=spec.at,
        delay=spec.delay,
        timezone=spec.timezone,
        anchor=anchor,
        start=spec.start,
        end=spec.end,
        dst_ambiguous=spec.dst.ambiguous,
        dst_nonexistent=spec.dst.nonexistent,
        recorded=recorded,
    )


class CalendarCopy(NamedTuple):
    """A schedule's copy of a calendar it names (``chronolog.commands.calendars``):
    ``revision`` and ``spec`` as the calendar's aggregate last sent them; ``received`` False
    while none has come yet (the schedule waits for it before it materializes an instant);
    ``spec`` None once received: the calendar does not exist."""

    name: str
    revision: int
    spec: CalendarSpec | None
    received: bool


@dataclass(slots=True)
class CalendarHome:
    """A calendar's own aggregate state (kept in ``QuotaState.calendar``): its current
    revision and spec (None: never put, or deleted — ``revision`` still counts on, so every
    copy a schedule receives is newer than the one before) and the schedules that name it."""

    name: str
    revision: int = 0
    spec: CalendarSpec | None = None
    subscribers: set[str] = field(default_factory=set)


class Backfills(NamedTuple):
    """A schedule's backfills (``decider._backfill``): its last ``BACKFILL_KEYS_KEPT``
    requests, oldest first, as (request key, digest of its range and overlap, instants in
    the range, runs it made), and every range it backfilled, [start, end) merged, in order."""

    requests: tuple[tuple[str, str, int, int], ...]
    ranges: tuple[tuple[datetime, datetime], ...]


class ScheduleState:
    """The fold of one schedule's events."""

    __slots__ = (
        "_trigger",
        "anchor",
        "backfills",
        "calendars",
        "count",
        "created_at",
        "created_hash",
        "done",
        "fence",
        "last_scheduled_at",
        "manual",
        "next_due_at",
        "next_run_at",
        "owned",
        "paused_at",
        "pending",
        "policy",
        "quota",
        "request_key",
        "revision",
        "runs",
        "schedule_id",
        "status",
        "tenant",
    )

    def __init__(self, tenant: str, schedule_id: str) -> None:
        self.tenant = tenant
        self.schedule_id = schedule_id
        self.status = "NEW"  # NEW | ACTIVE | PAUSED | COMPLETED | DELETED
        self.revision = 0
        self.policy: Policy | None = None
        # the compiled trigger of policy.spec at anchor (``trigger``); _DERIVED: compiled on
        # first use (a state decoded from a snapshot: most are never decided again soon, and
        # compiling costs more than decoding the whole state)
        self._trigger: Any = None
        self.request_key: str | None = None
        self.created_hash: str | None = None  # spec hash at creation (idempotent create)
        self.created_at: datetime | None = None
        self.anchor: datetime | None = None
        self.paused_at: datetime | None = None
        self.next_run_at: datetime | None = None
        self.next_due_at: datetime | None = None
        self.last_scheduled_at: datetime | None = None
        self.count = 0
        self.fence = 0
        self.runs: dict[str, Run] | None = None
        # the newest finished run, kept outside ``runs`` (a dict costs ~230 B even for one
        # entry): it answers a duplicate hint or a repeated completion with its saved result
        self.done: Run | None = None
        self.pending: list[str] | None = None
        # request key -> (run ID, params digest, final state): the last MANUAL_KEYS_KEPT
        # manual triggers. The final state is set when the run leaves ``runs`` and ``done``
        # (``Manual``): a repeated trigger answers it once the run itself is forgotten
        self.manual: dict[str, Manual] | None = None
        # None: this state owns all its runs (a live state). A set: a copy-on-write draft
        # (see ``draft``) that owns only the runs named in it; the others are shared.
        self.owned: set[str] | None = None
        # the tenant quota: None (not involved), a QuotaWait (a create waiting for a slot)
        # or the command ID of the create the schedule holds its slot under
        self.quota: QuotaWait | str | None = None
        self.backfills: Backfills | None = None
        # the copies of the calendars the policy names, in its order (None: it names none)
        self.calendars: tuple[CalendarCopy, ...] | None = None

    @property
    def exists(self) -> bool:
        return self.status in ("ACTIVE", "PAUSED")

    @property
    def trigger(self) -> Any:
        """The schedule's compiled trigger (None before it is created)."""
        t = self._trigger
        if t is _DERIVED:
            pol = self.policy
            assert pol is not None and self.anchor is not None, "a derived trigger needs both"
            t = self._trigger = trigger_of(pol.spec, self.anchor)
        return t

    @trigger.setter
    def trigger(self, value: Any) -> None:
        self._trigger = value

    def derive_trigger(self) -> None:
        """The trigger is ``policy.spec`` compiled at ``anchor``, on first use (``evolve``
        compiles exactly that; a decoded snapshot defers it)."""
        self._trigger = _DERIVED

    def clone(self) -> ScheduleState:
        """A deep, independent copy."""
        s = self.draft()
        if self.runs is not None:
            s.runs = {k: r.clone() for k, r in self.runs.items()}
        s.done = None if self.done is None else self.done.clone()
        if self.manual is not None:
            s.manual = dict(self.manual)
        s.owned = None
        return s

    def draft(self) -> ScheduleState:
        """A copy-on-write copy for deciding one command: cheap whatever the number of runs.

        The runs dict is copied but the runs themselves are shared until ``own`` clones one
        for a change; the manual-key map is copied on its first change. The original is
        never modified through a draft.
        """
        s = ScheduleState.__new__(ScheduleState)
        s.tenant = self.tenant
        s.schedule_id = self.schedule_id
        s.status = self.status
        s.revision = self.revision
        s.policy = self.policy
        s._trigger = self.trigger  # a deferred trigger is compiled once, into both
        s.request_key = self.request_key
        s.created_hash = self.created_hash
        s.created_at = self.created_at
        s.anchor = self.anchor
        s.paused_at = self.paused_at
        s.next_run_at = self.next_run_at
        s.next_due_at = self.next_due_at
        s.last_scheduled_at = self.last_scheduled_at
        s.count = self.count
        s.fence = self.fence
        s.runs = None if self.runs is None else dict(self.runs)
        s.done = self.done  # shared until ``own`` brings it back (cloned) into ``runs``
        s.pending = None if self.pending is None else list(self.pending)
        s.manual = self.manual
        s.owned = set()
        s.quota = self.quota
        s.backfills = self.backfills  # immutable: replaced whole by evolve
        s.calendars = self.calendars  # immutable: replaced whole by evolve
        return s

    def become(self, other: ScheduleState) -> None:
        """Take every field of ``other``, a state no one else holds (a key moved in or out
        of the partition, docs/design.md §18); a draft stays a draft."""
        owned = self.owned
        for name in ScheduleState.__slots__:
            setattr(self, name, getattr(other, name))
        self.owned = owned

    def own(self, run_id: str) -> Run:
        """The run ``run_id``, safe to change in place (cloned first in a draft)."""
        runs = self.runs
        done = self.done
        if (runs is None or run_id not in runs) and done is not None and done.run_id == run_id:
            # an event for the kept finished run (e.g. its effects): back into ``runs``
            if self.owned is not None:
                done = done.clone()
                self.owned.add(run_id)
            if runs is None:
                runs = self.runs = {}
            runs[run_id] = done
            self.done = None
            return done
        assert runs is not None, f"event for unknown run {run_id}"
        run = runs[run_id]
        owned = self.owned
        if owned is not None and run_id not in owned:
            run = runs[run_id] = run.clone()
            owned.add(run_id)
        return run

    def own_manual(self) -> dict[str, Manual]:
        """The manual-key map, safe to change in place (copied first in a draft)."""
        owned = self.owned
        if self.manual is None:
            self.manual = {}
        elif owned is not None and "\0manual" not in owned:
            self.manual = dict(self.manual)
        if owned is not None:
            owned.add("\0manual")
        return self.manual

    def run(self, run_id: str) -> Run | None:
        """A live run, a DEAD one, or the kept finished one; None when unknown/retired."""
        run = None if self.runs is None else self.runs.get(run_id)
        if run is None and self.done is not None and self.done.run_id == run_id:
            return self.done
        return run

    def active_runs(self) -> list[Run]:
        return [] if self.runs is None else [r for r in self.runs.values() if r.active]

    def snapshot(self) -> tuple[Any, ...]:
        """A comparable value of the whole state (restore == live, fold == live)."""
        return (
            self.tenant,
            self.schedule_id,
            self.status,
            self.revision,
            None if self.policy is None else self.policy.spec_hash,
            self.request_key,
            self.created_hash,
            self.created_at,
            self.anchor,
            self.paused_at,
            self.next_run_at,
            self.next_due_at,
            self.last_scheduled_at,
            self.count,
            self.fence,
            tuple((k, r.snapshot()) for k, r in (self.runs or {}).items()),
            None if self.done is None else self.done.snapshot(),
            tuple(self.pending or ()),
            tuple(sorted((self.manual or {}).items())),
            self.backfills,
            self.calendars,
        )


class QuotaState:
    """The fold of the events of a tenant's quota aggregate (``chronolog.commands.quota``):
    schedule ID -> (create command ID, end of the reservation, or None once the slot is
    taken); or, for a concurrency key's aggregate (``chronolog.commands.permits``, schedule ID
    ``limit_id(key)``), the permits held (run ID -> (schedule ID, ask)) and the requests
    waiting, in order (run ID, schedule ID, ask, limit)."""

    __slots__ = ("calendar", "holders", "key", "schedule_id", "slots", "tenant", "waiting")

    def __init__(self, tenant: str, schedule_id: str = QUOTA_ID) -> None:
        self.tenant = tenant
        self.schedule_id = schedule_id
        self.slots: dict[str, tuple[str, datetime | None]] = {}
        self.key: str | None = None  # a concurrency key's rendered text, once known
        self.holders: dict[str, tuple[str, str]] = {}
        self.waiting: list[tuple[str, str, str, int]] = []
        # a calendar's aggregate (schedule ID ``calendar_id(name)``): its revision, spec and
        # subscribers (``chronolog.commands.calendars``)
        self.calendar: CalendarHome | None = None

    def taken(self) -> int:
        return sum(1 for _, until in self.slots.values() if until is None)

    def reserved(self) -> int:
        return sum(1 for _, until in self.slots.values() if until is not None)

    @property
    def empty(self) -> bool:
        return not (self.slots or self.holders or self.waiting) and (
            self.calendar is None or (self.calendar.revision == 0
                                      and not self.calendar.subscribers))


def initial_state(tenant: str, schedule_id: str) -> ScheduleState:
    """The state of a schedule before its first event."""
    return ScheduleState(tenant, schedule_id)
