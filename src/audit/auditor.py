"""The audit: a pure checker of the guarantees of docs/design.md §10 over a sequence of events.

``Auditor.feed(envelope, partition, offset)`` folds the events of each schedule in log order
(one schedule's events all live in one partition, so per-partition order is enough);
``Auditor.finish()`` returns an ``AuditReport``. ``audit(events)`` does both for an iterable
of envelopes (numbered partition 0, offsets 0, 1, ...) or ``(partition, offset, envelope)``.
No I/O and no clock: ``chronolog audit`` (``chronolog.cli.audit``) reads the log and prints.

Checks (``CHECKS``), each reported with the offending events (partition, offset, event_id,
type):

``occurrence_unique``
    One occurrence per key for the life of a schedule, whatever its revision: an
    ``OccurrenceMaterialized`` or an ``OccurrenceSkipped`` with ``materialized=False`` claims
    the key ``(schedule_id, scheduled_at)``, or ``(schedule_id, request_key)`` for a manual
    trigger (within the schedule's last ``MANUAL_KEYS_KEPT`` manual triggers: the window in
    which a key is idempotent), and no run ID is materialized twice. A collapsed skip range
    (``through``/``count``) claims the whole span ``[scheduled_at, through]``: its first
    instant is its key, and the instants inside it
    are implied by the trigger, so any later scheduled occurrence whose instant falls inside
    an earlier range (or a range that swallows an earlier instant) is a duplicate too. Only
    the schedule's last ``SPANS_KEPT`` spans are held; the decider records a schedule's
    instants in increasing order, so a span that does not start after the end of the
    forgotten ones (its watermark) repeats or reorders one of them and is reported as such.
``fence_monotonic``
    ``FenceAdvanced.fence`` is strictly greater than every earlier fence of the schedule.
``fence_current``
    ``AttemptClaimed.fence`` equals the schedule's latest ``FenceAdvanced``, which must have
    been advanced for that same run. ``LeaseExtended.fence`` and ``ResultPublished.fence``
    equal the fence the run was claimed with *and* the run's latest fence: any later
    ``FenceAdvanced`` for the run (lease expired, superseded) makes the claimed fence stale.
    (The run's latest fence rather than the schedule's: under overlap ``allow`` two runs of
    one schedule legitimately hold different fences at once, and the decider checks a
    heartbeat or completion against its own run's fence.) A fence is advanced and a run
    claimed only for a run the decider holds live: a ``FenceAdvanced`` or ``AttemptClaimed``
    for a finished or DEAD run, or for one the schedule does not hold (never materialized, or
    finished and forgotten), is reported, as is a ``LeaseExtended`` or ``ResultPublished``
    for a run not held (as one never claimed).
``result_once``
    At most one ``ResultPublished`` per run.
``result_within_lease``
    A ``ResultPublished`` comes from an attempt holding a lease: the run was claimed, its
    lease was not expired or ended by a failure since, and the envelope's ``at`` (authority
    time) is no later than the ``lease_until`` of the latest ``AttemptClaimed`` /
    ``LeaseExtended`` of the run.
``overlap``
    Under overlap ``skip``, ``buffer_one`` and ``buffer_all`` never two LEASED runs of one
    schedule at once (checked at each ``AttemptClaimed``; a run stops being LEASED at its
    result, failure, lease expiry, cancellation, reconciliation or dead-lettering); under
    ``buffer_one`` never more than one PENDING run (except the occurrences of one misfire
    ``all`` catch-up, which one decision queues together). The policy is the one of the schedule's
    ``ScheduleCreated``/``ScheduleRevised`` spec; a claim is only judged when both the
    current policy and the policy of the revision its run was materialized with are guarded,
    so a revision from ``allow`` to ``skip`` does not turn runs admitted under ``allow``
    into violations.
``misfire_all_complete``
    For each revision of a schedule whose spec has misfire ``all`` and a cron or interval
    trigger, every instant of that trigger (compiled from the revision's spec and anchor)
    between the first and the last scheduled instant recorded under that revision is
    recorded as materialized or skipped (a skip range covers its span; its ``count`` must
    equal the trigger's instants in it). Work is bounded: at most ``misfire_walk_limit``
    instants per revision; a truncated walk is listed in ``AuditReport.notes``. A revision's
    records are judged (and dropped) whenever it holds more than ``MISFIRE_KEPT`` of them,
    and at each checkpoint.
``effect_unique``
    One ``EffectIntended`` per effect ID, unless a ``ReconciliationResolved`` with decision
    ``retry`` for that effect came in between; an effect ID belongs to one schedule; at most
    one ``EffectSucceeded`` per effect ID. An effect is held with its run, so an
    ``EffectIntended`` or ``EffectSucceeded`` of an effect not held whose run the schedule
    does not hold either (its effects settled, the run forgotten) is reported.
``completed_final``
    A ``ScheduleCompleted`` is final and true. Final: after it no scheduled occurrence is
    materialized or skipped and the schedule is not revised, paused or resumed (only a
    deletion follows; a re-creation of a deleted ID starts afresh). True: the schedule
    really had no further instant — its ``count`` is the number of scheduled runs the log
    shows, and with reason ``max_count`` that number reached the spec's ``max_count``;
    ``at``: the one-shot's instant was recorded; ``end``: the current revision's trigger
    (``delay``: counted from the completion) has no instant after the last one recorded
    (and after the revision) before ``end``.
``quota_exact``
    A tenant's quota aggregate (schedule ID ``@quota``; its events are in one partition, so
    in one order) never holds more slots, reserved or taken, than the ``max_schedules``
    written in its latest reservation event; every schedule created under the quota was
    created with a slot reserved for its create; and at the end the live schedules holding
    a slot number at most that quota.
``quota_balance``
    Every reservation ends once: confirmed (the schedule was created) or released (the
    create was refused, the reservation expired); a confirmed slot is released once, when
    its schedule stops being live. Nothing confirms or releases a slot not held under that
    create; at the end the quota's taken slots are exactly the live schedules holding one.
    Reservations still open at the end (creates in flight) are listed in the notes.
``concurrency_limit``
    A concurrency key's aggregate (schedule ID ``@limit:…``; its events are in one partition,
    so in one order) never holds more permits than the limit written in each grant, and
    releases only a permit it holds; a run with a concurrency key is claimed only while its
    schedule recorded the permit granted (``RunPermitted`` after its ``RunAwaitsPermit``,
    and no ``RunPermitReturned`` since). With the decider giving a permit back in the
    decision that ends the attempt, this bounds the runs of one key LEASED at once.
``calendar_exclusion``
    A schedule runs no instant that a calendar it names excludes, and skips none it does
    not. The schedule's copies of its calendars are folded as the decider holds them: one
    per name its ``ScheduleCreated``/``ScheduleRevised`` spec lists under ``exclude`` (a
    name still listed keeps its copy, a new one waits for its first copy), each replaced by
    its ``CalendarCopied``; a copy without a spec (the calendar does not exist) excludes
    every instant. An ``OccurrenceMaterialized`` of a scheduled or backfill run (not a
    manual one) is reported when one of the copies held then excludes its instant, or when
    a copy had not come yet (the decider materializes nothing while it waits for one). An
    ``OccurrenceSkipped`` with reason ``excluded`` is reported unless the calendar and
    revision it names are a copy the schedule held and that copy excludes the instant (for
    a collapsed range: each trigger instant in it, at most ``misfire_walk_limit``) — else
    the skip lost a run. A calendar's aggregate (schedule ID ``@calendar:…``) counts its
    revisions on (``CalendarRevised``, ``CalendarDeleted``), and every ``CalendarCopied``
    must carry the spec of that revision of the calendar (none for a deleted calendar, or
    revision 0: never put): compared as a digest when both are seen, whichever partition
    is read first; copies of one revision whose calendar event the audited log does not
    hold must at least agree with each other (judged at the end).
``single_home``
    A key (a schedule, a tenant's quota aggregate) has its events on one partition at a
    time: its first partition, until its ``KeyMovedOut``; then, from its ``KeyMovedIn``, the
    partition it moved to. An event of the key anywhere else — on its old home after it
    moved out, on a partition before the key moved in there — means two partitions held it.
``move_matched``
    A ``KeyMovedIn(from_partition p, version v)`` on q comes after the key's
    ``KeyMovedOut(to_partition q, version v)`` on p, and p's ``HandedOver`` of v is in the log
    (else the moved-in key's partition waits for it for ever: readers that apply the move
    barrier hold it there; ``handover_missing``).
``decodable``
    Only for readers of raw records (the CLI): a record of ``events`` that does not decode.
``archive_intact``
    Only for readers of the log (the CLI): history that cannot be read whole — a segment of
    the archive (``chronolog audit --archive``) that is missing or does not match its
    manifest, or events pruned from the log that no archive given holds (a gap between the
    archive and the live log) — so the history there cannot be proved.

What the auditor forgets (docs/design.md §10), so that its state — and a checkpoint — is
bounded by the live schedules and runs, not by the length of the history: a finished run
(SUCCEEDED, CANCELLED, SKIPPED) once its effects are settled and ``FINISHED_KEPT`` newer
finished runs of its schedule are held, with its effects; a DEAD run beyond the schedule's
``DEAD_KEPT`` (the decider's rule: the earliest materialized goes); a claimed span beyond the
last ``SPANS_KEPT`` (kept as a watermark); a manual request key beyond the last
``MANUAL_KEYS_KEPT``; misfire ``all`` records once judged; a calendar's revisions beyond
its last ``CALENDAR_REVISIONS_KEPT`` (a copy of a forgotten revision is not compared) and
the copies of a revision once compared with it. The decider forgets the same
things (it keeps fewer finished runs) and answers any later command for a run it no longer
holds with ``not_found``, writing nothing, so an event of a forgotten run is by itself a
violation, reported under the checks above. All of it happens while folding, by rules on
the events alone, so a checkpoint anywhere changes nothing.

Across partitions, ``feed`` must be given a moved key's events in its order: the events of
its old home up to its ``KeyMovedOut``, then those of its new home from its ``KeyMovedIn``
(``chronolog.domain.barrier``: the CLI reads the log in move-barrier order); the key's
state — fences, occurrences, runs, results, effects, quota slots — continues across the
move, so every other check holds across it too.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any, assert_never

from chronolog.audit.folds import (
    CHECKS,
    DEFAULT_HOT_MAX,
    NO_SPEC,
    AuditReport,
    AuditState,
    CalendarFold,
    EffectFold,
    EventRef,
    FoldStore,
    Home,
    QuotaFold,
    RevisionFold,
    RunFold,
    ScheduleFold,
    SlotHolder,
    Violation,
    decode_document,
    decode_state,
    encode_state,
    encode_state_lines,
    spec_digest,
)
from chronolog.commands.calendars import copied, copies_for, exclusion
from chronolog.commands.decider import LEAVES_LIVE
from chronolog.commands.state import DEAD_KEPT, MANUAL_KEYS_KEPT, CalendarCopy
from chronolog.domain import messages as m
from chronolog.domain.barrier import Barrier, in_barrier_order
from chronolog.domain.calendars import excluded_by
from chronolog.domain.ids import (
    BACKFILL_RUN,
    CALENDAR_PREFIX,
    LIMIT_PREFIX,
    QUOTA_ID,
    ROUTING_ID,
    calendar_id,
)
from chronolog.domain.recurrence import RecurrenceError, Trigger, compile_trigger

__all__ = [
    "CHECKS",
    "AuditReport",
    "Auditor",
    "EventRef",
    "Violation",
    "audit",
]


GUARDED_OVERLAP = frozenset({"skip", "buffer_one", "buffer_all"})
DEFAULT_MISFIRE_WALK_LIMIT = 100_000  # trigger instants walked per schedule revision
# what the auditor holds per schedule besides its live runs (docs/design.md §10, "What the
# audit forgets"): finished runs, claimed occurrence spans, misfire ``all`` records
FINISHED_KEPT = 4  # finished runs (SUCCEEDED, CANCELLED, SKIPPED) whose effects are settled
SPANS_KEPT = 16  # the latest claimed occurrence spans; older ones: a watermark
MISFIRE_KEPT = 64  # recorded instants and ranges of a revision before they are judged
CALENDAR_REVISIONS_KEPT = 64  # a calendar's latest revisions its copies are compared with
FINISHED = frozenset({"SUCCEEDED", "CANCELLED", "SKIPPED"})
_US = timedelta(microseconds=1)



def _compile(spec: m.ScheduleSpec, anchor: datetime) -> Trigger:
    """The schedule's trigger, compiled exactly as the decider folds it (a recorded rule)."""
    return compile_trigger(cron=spec.cron, every=spec.every, at=spec.at, delay=spec.delay,
                           timezone=spec.timezone, anchor=anchor, start=spec.start,
                           end=spec.end, dst_ambiguous=spec.dst.ambiguous,
                           dst_nonexistent=spec.dst.nonexistent, recorded=True)


_NOT_HELD = (" (or that finished and was forgotten: the decider answers a command for a run it "
             "no longer holds with not_found, writing nothing)")


def _iso(t: datetime | None) -> str:
    return "none" if t is None else t.isoformat().replace("+00:00", "Z")


class Auditor:
    """Feed events in log order (per partition); ``finish`` checks what needs the whole log."""

    def __init__(self, misfire_walk_limit: int = DEFAULT_MISFIRE_WALK_LIMIT,
                 state: AuditState | None = None, hot_max: int = DEFAULT_HOT_MAX) -> None:
        """``hot_max``: the schedules' folds held as objects, the most recently used (the
        others sealed: ``FoldStore``)."""
        self.misfire_walk_limit = misfire_walk_limit
        state = state if state is not None else AuditState(schedules=FoldStore(hot_max))
        self.report = state.report
        self._schedules = state.schedules
        self._effects = state.effects
        self._holders = state.holders
        self._quotas = state.quotas
        self._permits = state.permits
        self._calendars = state.calendars
        self._copies = state.copies
        # (tenant, schedule ID) -> where the key is: its partition, and its KeyMovedOut's
        # (to_partition, version, ref) while it is moving
        self._homes = state.homes

    # -- checkpoints ----------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """The auditor's state as a document (``chronolog.audit.folds``) to ``resume`` from,
        after settling what the checks no longer need: misfire ``all`` completeness is
        judged through each revision's latest recorded instant, and its instants up to
        there are dropped. Everything else is kept as it is (what the checks no longer need
        was forgotten while folding, by the same rules in one pass), so an audit resumed
        from here reports exactly what one pass over the same events reports."""
        self._settle_misfire()
        return encode_state(self._state())

    def checkpoint_lines(self) -> Iterator[bytes]:
        """What ``checkpoint`` holds, as the lines of a JSON-lines document (a schedule's
        fold a line: ``chronolog.audit.folds.encode_state_lines``), given out a line at a
        time; ``resume_document`` reads it back."""
        self._settle_misfire()
        return encode_state_lines(self._state())

    def _settle_misfire(self) -> None:
        for s in self._schedules.folds(misfire_only=True, write_back=True):
            for rev in s.revisions.values():
                if rev.check_misfire:
                    self._check_misfire_all(s, rev, settle=True)

    def _state(self) -> AuditState:
        return AuditState(self.report, self._schedules, self._effects, self._holders,
                          self._quotas, self._homes, self._permits, self._calendars,
                          self._copies)

    def held(self) -> dict[str, int]:
        """How much the auditor holds (what a checkpoint carries): schedules, runs (of which
        finished and DEAD), claimed occurrence spans, manual request keys, effects, misfire
        ``all`` records not yet judged. Bounded by the live schedules and runs, not by the
        length of the history (docs/design.md §10, "What the audit forgets")."""
        held = dict.fromkeys(("runs", "finished", "dead", "spans", "manual", "misfire"), 0)
        for s in self._schedules.folds():
            held["runs"] += len(s.runs)
            held["finished"] += len(s.finished)
            held["dead"] += len(s.dead)
            held["spans"] += len(s.spans)
            held["manual"] += len(s.manual)
            held["misfire"] += sum(len(r.instants) + len(r.ranges) for r in s.revisions.values())
        return {"schedules": len(self._schedules), **held, "effects": len(self._effects)}

    @classmethod
    def resume(cls, doc: Any, misfire_walk_limit: int = DEFAULT_MISFIRE_WALK_LIMIT,
               hot_max: int = DEFAULT_HOT_MAX) -> Auditor:
        """An auditor in the state of a ``checkpoint`` document (``CheckpointError`` when it
        is not one), to be fed the events after it."""
        return cls(misfire_walk_limit, decode_state(doc, hot_max))

    @classmethod
    def resume_document(cls, data: bytes,
                        misfire_walk_limit: int = DEFAULT_MISFIRE_WALK_LIMIT,
                        hot_max: int = DEFAULT_HOT_MAX) -> Auditor:
        """An auditor in the state of a checkpoint document given as bytes: the lines of
        ``checkpoint_lines``, or a ``checkpoint`` document written as JSON
        (``CheckpointError`` when it is neither)."""
        return cls(misfire_walk_limit, decode_document(data, hot_max))

    # -- input ----------------------------------------------------------------------

    def undecodable(self, partition: int, offset: int, reason: str) -> None:
        """Record a raw record that is not a valid event."""
        self.report.events += 1
        ref = EventRef(partition, offset, "?", "?")
        self.report.violations.append(
            Violation("decodable", f"record does not decode: {reason}", (ref,)))

    def archive_damaged(self, reason: str) -> None:
        """Record that the archived history could not be read whole (``reason``)."""
        self.report.violations.append(Violation("archive_intact", reason, ()))

    def handover_missing(self, partition: int, offset: int, from_partition: int,
                         version: int) -> None:
        """A ``KeyMovedIn`` at ``partition@offset`` waits for ``from_partition``'s handover
        to ``version``, which the log does not have (a reader in move-barrier order found
        nothing else to read: it reads on past it)."""
        ref = EventRef(partition, offset, "?", "KeyMovedIn")
        self.report.violations.append(Violation(
            "move_matched", f"a key moved in from partition {from_partition} (routing "
            f"version {version}), which never handed over to that version", (ref,)))

    def feed(self, env: m.EventEnvelope, partition: int = 0, offset: int = 0) -> None:
        """Fold one event (events of one schedule must come in log order)."""
        self.report.events += 1
        if env.schedule_id == ROUTING_ID:
            return  # a partition's routing view (docs/design.md §18): no guarantee of its own
        self._track_home(env, partition, EventRef(partition, offset, env.event_id,
                                                  env.payload.type))
        if isinstance(env.payload, (m.KeyMovedOut, m.KeyMovedIn)):
            return  # the key's state continues across the move
        if env.schedule_id == QUOTA_ID:
            self._fold_quota(env, EventRef(partition, offset, env.event_id, env.payload.type))
            return
        if env.schedule_id.startswith(LIMIT_PREFIX):
            self._fold_permit(env, EventRef(partition, offset, env.event_id, env.payload.type))
            return
        if env.schedule_id.startswith(CALENDAR_PREFIX):
            self._fold_calendar(env, EventRef(partition, offset, env.event_id,
                                              env.payload.type))
            return
        key = (env.tenant, env.schedule_id)
        s = self._schedules.get(key)
        if s is None:
            s = ScheduleFold(env.tenant, env.schedule_id)
            self._schedules.put(key, s)
        ref = EventRef(partition, offset, env.event_id, env.payload.type)
        self._fold(s, env, ref)

    # -- moves between partitions ---------------------------------------------------

    def _track_home(self, env: m.EventEnvelope, partition: int, ref: EventRef) -> None:
        """``single_home`` and ``move_matched`` for one event of a key."""
        key = (env.tenant, env.schedule_id)
        p = env.payload
        home = self._homes.get(key)
        if isinstance(p, m.KeyMovedIn):
            self._moved_in(env, p, home, partition, ref)
            self._homes[key] = Home(partition, None)
            return
        if home is None:
            home = self._homes[key] = Home(partition, None)
        elif home.moving is not None or home.partition != partition:
            where = (f"after it moved out to partition {home.moving[0]}"
                     if home.moving is not None and home.partition == partition
                     else f"while partition {home.partition} holds it")
            self.report.violations.append(Violation(
                "single_home", f"{p.type} on partition {partition} {where}",
                tuple(r for r in (home.moving[2] if home.moving else None, ref)
                      if r is not None), env.tenant, env.schedule_id))
        if isinstance(p, m.KeyMovedOut):
            home.moving = (p.to_partition, p.version, ref)

    def _moved_in(self, env: m.EventEnvelope, p: m.KeyMovedIn, home: Home | None,
                  partition: int, ref: EventRef) -> None:
        """A ``KeyMovedIn`` must follow the key's ``KeyMovedOut`` to here at that version."""
        if (home is not None and home.moving is not None and home.partition == p.from_partition
                and home.moving[:2] == (partition, p.version)):
            return
        if home is None or home.moving is None:
            what = "without its KeyMovedOut there"
        else:
            what = (f"but it moved out of partition {home.partition} to partition "
                    f"{home.moving[0]} at version {home.moving[1]}")
        self.report.violations.append(Violation(
            "move_matched", f"the key moved in from partition {p.from_partition} (routing "
            f"version {p.version}) {what}",
            tuple(r for r in (home.moving[2] if home and home.moving else None, ref)
                  if r is not None), env.tenant, env.schedule_id))

    # -- helpers --------------------------------------------------------------------

    def _violate(self, s: ScheduleFold, check: str, message: str, *refs: EventRef | None,
                 run_id: str | None = None) -> None:
        events = tuple(sorted({r for r in refs if r is not None},
                              key=lambda r: (r.partition, r.offset)))
        self.report.violations.append(
            Violation(check, message, events, s.tenant, s.schedule_id, run_id))

    def _run(self, s: ScheduleFold, run_id: str) -> RunFold:
        run = s.runs.get(run_id)
        if run is None:  # an event for a run never materialized: judge it from here on
            rev = s.current.revision if s.current else 0
            run = s.runs[run_id] = RunFold(run_id, rev, "UNKNOWN", None)
        return run

    def _set_state(self, s: ScheduleFold, run: RunFold, state: str) -> None:
        run.state = state
        rid = run.run_id
        if state in FINISHED:
            s.dead.pop(rid, None)
            s.finished.pop(rid, None)
            s.finished[rid] = None
            self._retire(s)
        elif state == "DEAD":
            s.finished.pop(rid, None)
            s.dead[rid] = None
            if len(s.dead) > DEAD_KEPT:  # as the decider: the earliest materialized goes
                self._forget(s, next(r for r in s.runs if r in s.dead))
        else:
            s.finished.pop(rid, None)
            s.dead.pop(rid, None)
        if state == "LEASED":
            s.leased.add(run.run_id)
        else:
            s.leased.discard(run.run_id)
            if state in ("EXPIRED", "FAILED", "CANCELLED", "RECONCILING", "DEAD"):
                run.lease_until = None  # the attempt's lease is over
        if state == "PENDING":
            s.pending.add(run.run_id)
        else:
            s.pending.discard(run.run_id)

    def _retire(self, s: ScheduleFold) -> None:
        """Forget the oldest finished runs beyond ``FINISHED_KEPT`` whose effects are all
        settled (a run with an open effect is kept besides, as the decider keeps it)."""
        if len(s.finished) <= FINISHED_KEPT:
            return
        settled = [rid for rid in s.finished if not self._effects_open(s.runs.get(rid))]
        for rid in settled[:len(settled) - FINISHED_KEPT]:
            self._forget(s, rid)

    def _effects_open(self, run: RunFold | None) -> bool:
        return run is not None and any((e := self._effects.get(eid)) is not None and e.open
                                       for eid in run.effects)

    def _forget(self, s: ScheduleFold, run_id: str) -> None:
        """Drop a finished run and its (settled) effects: a later event of it is reported
        as one of a run the schedule does not hold (docs/design.md §10)."""
        run = s.runs.pop(run_id, None)
        s.finished.pop(run_id, None)
        s.dead.pop(run_id, None)
        for eid in run.effects if run is not None else ():
            eff = self._effects.get(eid)
            if eff is not None and eff.run_id == run_id:
                del self._effects[eid]

    def _not_live(self, s: ScheduleFold, run_id: str, what: str, ref: EventRef) -> bool:
        """A fence is advanced and a run claimed only for a run the decider holds live
        (READY, LEASED, or the LEASED run whose lease expires or is superseded): report
        one the schedule does not hold or that has finished (True when reported)."""
        run = s.runs.get(run_id)
        if run is not None and run.state not in FINISHED and run.state != "DEAD":
            return False
        why = (f"which is {run.state}" if run is not None else
               "which the schedule does not hold (never materialized, or finished and "
               "forgotten: the decider answers a command for it with not_found)")
        self._violate(s, "fence_current", f"{what} for run {run_id}, {why}",
                      run.claim_ref if run is not None else None, ref, run_id=run_id)
        return True

    def _claim_key(self, s: ScheduleFold, start: datetime, end: datetime, ref: EventRef,
                   what: str) -> None:
        """Claim the occurrence span [start, end]; report it if an earlier one overlaps, or
        if it does not start after the forgotten ones (the decider claims a schedule's
        instants in increasing order)."""
        if s.claimed_through is not None and start <= s.claimed_through:
            self._violate(s, "occurrence_unique",
                          f"{what} [{_iso(start)} .. {_iso(end)}] is not after "
                          f"{_iso(s.claimed_through)}, where the schedule's occurrences "
                          f"older than its last {SPANS_KEPT} end: the decider records a "
                          "schedule's instants in increasing order, so this one repeats "
                          "(or reorders) an earlier one", s.claimed_ref, ref)
            return
        i = bisect.bisect_right(s.starts, end)
        if i > 0:
            a, b, old = s.spans[i - 1]
            if b >= start:
                if a == b == start == end:
                    msg = f"occurrence {_iso(start)} recorded twice ({what})"
                else:
                    msg = (f"{what} [{_iso(start)} .. {_iso(end)}] overlaps the occurrence(s) "
                           f"[{_iso(a)} .. {_iso(b)}] recorded earlier")
                self._violate(s, "occurrence_unique", msg, old, ref)
                return
        s.starts.insert(i, start)
        s.spans.insert(i, (start, end, ref))
        if len(s.spans) > SPANS_KEPT:
            del s.starts[0]
            _, b, old = s.spans.pop(0)
            if s.claimed_through is None or b > s.claimed_through:
                s.claimed_through, s.claimed_ref = b, old

    def _record_instant(self, s: ScheduleFold, start: datetime, end: datetime | None, count: int,
                        ref: EventRef, what: str) -> None:
        self._claim_key(s, start, end or start, ref, what)
        last = end or start
        if s.last_instant is None or last > s.last_instant:
            s.last_instant = last
        rev = s.current
        if rev is not None and rev.check_misfire:
            if end is None or (end == start and count == 1):
                rev.instants.setdefault(start, ref)
            else:
                rev.ranges.append((start, end, count, ref))
            if len(rev.instants) + len(rev.ranges) > MISFIRE_KEPT:
                self._check_misfire_all(s, rev, settle=True)  # judged as at a checkpoint

    def _fence_of_run(self, s: ScheduleFold, run: RunFold, fence: int, ref: EventRef,
                      what: str, held: bool = True) -> None:
        """A heartbeat or publication must carry the run's claimed and still-current fence
        (``held``: whether the schedule held the run before this event)."""
        if run.claim_ref is None:
            self._violate(s, "fence_current",
                          f"{what} with fence {fence} for a run that was never claimed"
                          + ("" if held else _NOT_HELD), ref, run_id=run.run_id)
        elif fence != run.claimed_fence:
            self._violate(s, "fence_current",
                          f"{what} carries fence {fence}, the run was claimed with "
                          f"{run.claimed_fence}", run.claim_ref, ref, run_id=run.run_id)
        elif fence != run.run_fence:
            self._violate(s, "fence_current",
                          f"{what} carries fence {fence}, but the run's fence has advanced "
                          f"to {run.run_fence}", run.claim_ref, s.fence_ref, ref,
                          run_id=run.run_id)

    # -- the fold -------------------------------------------------------------------

    def _fold(self, s: ScheduleFold, env: m.EventEnvelope, ref: EventRef) -> None:
        p = env.payload
        self._track_slot(s, p, ref)
        match p:
            case m.ScheduleCreated() | m.ScheduleRevised():
                if isinstance(p, m.ScheduleCreated):  # a new one, or a deleted ID's again
                    s.completed_ref, s.scheduled_runs, s.last_instant = None, 0, None
                    s.claimed_through = s.claimed_ref = None  # a new life's instants
                else:
                    self._after_completion(s, ref, "it was revised")
                s.revised_at = env.at
                kind_ok = p.spec.cron is not None or p.spec.every is not None
                rev = RevisionFold(p.revision, p.spec, p.anchor, ref,
                                check_misfire=kind_ok and p.spec.misfire.policy == "all")
                s.revisions[p.revision] = rev
                s.current = rev
                s.calendars = copies_for(s.calendars, p.spec.exclude)
            case m.SchedulePaused() | m.ScheduleResumed():
                self._after_completion(s, ref, "paused" if p.type == "SchedulePaused"
                                       else "resumed")
            case m.ScheduleDeleted() | m.NextRunPlanned():
                pass
            case m.ScheduleCompleted():
                self._completed(s, env, p, ref)
            case m.OccurrenceMaterialized():
                self.report.runs += 1
                if p.trigger in ("schedule", "backfill") and s.calendars:
                    self._materialized_excluded(s, p, ref)
                reported = len(self.report.violations)
                if p.request_key is not None or p.trigger == "manual":
                    self._manual_key(s, p.request_key or p.run_id, ref)
                elif p.trigger == "backfill":  # its own key: the instant, once per backfill
                    self._manual_key(s, f"backfill@{p.scheduled_at.isoformat()}", ref)
                else:
                    self._record_instant(s, p.scheduled_at, None, 1, ref, "materialized")
                    self._after_completion(s, ref, "an occurrence was materialized")
                    s.scheduled_runs += p.advances_schedule
                if (p.state == "PENDING" and s.overlap_policy() == "buffer_one"
                        and not self._one_catch_up(s, env.causation_id)):
                    other = s.runs.get(next(iter(sorted(s.pending))))
                    self._violate(s, "overlap",
                                  "overlap buffer_one: a second PENDING run while "
                                  f"{other.run_id if other else '?'} is PENDING",
                                  other.materialized_ref if other else None, ref,
                                  run_id=p.run_id)
                run = s.runs.get(p.run_id)
                if run is None:
                    run = s.runs[p.run_id] = RunFold(p.run_id, p.revision, p.state, ref)
                else:
                    if (run.materialized_ref is not None
                            and len(self.report.violations) == reported):  # not said above
                        self._violate(s, "occurrence_unique",
                                      f"run {p.run_id} materialized twice",
                                      run.materialized_ref, ref, run_id=p.run_id)
                    run.revision = p.revision
                    run.materialized_ref = run.materialized_ref or ref
                run.cause = env.causation_id
                self._set_state(s, run, p.state)
            case m.OccurrenceSkipped():
                if p.reason == "excluded":
                    self._skipped_excluded(s, p, ref)
                if p.materialized:
                    self._set_state(s, self._run(s, p.run_id), "SKIPPED")
                elif p.request_key is not None:
                    self._manual_key(s, p.request_key, ref)
                else:
                    self._record_instant(s, p.scheduled_at, p.through, p.count, ref,
                                         "skipped range" if p.through else "skipped")
                    self._after_completion(s, ref, "an occurrence was skipped")
            case m.OccurrenceReady():
                self._set_state(s, self._run(s, p.run_id), "READY")
            case m.FenceAdvanced():
                if p.fence <= s.max_fence:
                    self._violate(s, "fence_monotonic",
                                  f"fence advanced to {p.fence}, not above {s.max_fence}",
                                  s.fence_ref, ref, run_id=p.run_id)
                else:
                    self._not_live(s, p.run_id, f"fence advanced to {p.fence}", ref)
                s.fence = p.fence
                s.max_fence = max(s.max_fence, p.fence)
                s.fence_ref = ref
                s.fence_run = p.run_id
                if (advanced := s.runs.get(p.run_id)) is not None:
                    advanced.run_fence = p.fence
            case m.AttemptClaimed():
                reported = self._not_live(s, p.run_id, "AttemptClaimed", ref)
                run = self._run(s, p.run_id)
                if reported and s.fence_run == p.run_id:  # judge what follows from here
                    run.run_fence = max(run.run_fence, s.fence)
                if p.fence != s.fence or s.fence_run != p.run_id:
                    detail = (f"the schedule's current fence is {s.fence}"
                              if p.fence != s.fence else
                              f"fence {s.fence} was advanced for run {s.fence_run}")
                    self._violate(s, "fence_current",
                                  f"AttemptClaimed carries fence {p.fence}; {detail}",
                                  s.fence_ref, ref, run_id=p.run_id)
                self._check_overlap_claim(s, run, ref)
                if run.permit == "asked":
                    self._violate(s, "concurrency_limit", "a run claimed while it waits for "
                                  "a permit of its concurrency key", ref, run_id=p.run_id)
                run.claimed_fence = p.fence
                run.lease_until = p.lease_until
                run.lease_ref = ref
                run.claim_ref = ref
                self._set_state(s, run, "LEASED")
            case m.LeaseExtended():
                held = p.run_id in s.runs
                run = self._run(s, p.run_id)
                self._fence_of_run(s, run, p.fence, ref, "LeaseExtended", held)
                run.lease_until = p.lease_until
                run.lease_ref = ref
            case m.LeaseExpired():
                run = self._run(s, p.run_id)
                self._set_state(s, run, "EXPIRED")
                run.lease_ref = ref
            case m.AttemptFailed():
                run = self._run(s, p.run_id)
                self._set_state(s, run, "FAILED")
                run.lease_ref = ref
            case m.RetryScheduled():
                self._set_state(s, self._run(s, p.run_id), "RETRY_WAIT")
            case m.OccurrenceDeadLettered():
                self._set_state(s, self._run(s, p.run_id), "DEAD")
            case m.OccurrenceRedriven():
                self._set_state(s, self._run(s, p.run_id), "READY")
            case m.ResultPublished():
                self.report.results += 1
                self._result(s, env, p, ref)
            case m.CompletionRejected() | m.CancellationRequested():
                pass
            case m.OccurrenceCancelled():
                self._set_state(s, self._run(s, p.run_id), "CANCELLED")
            case m.ReconciliationRequired():
                if p.effect_id is None:
                    self._set_state(s, self._run(s, p.run_id), "RECONCILING")
                elif (held_run := s.runs.get(p.run_id)) is not None and \
                        held_run.state == "LEASED":
                    self._set_state(s, held_run, "RECONCILING")
            case m.ReconciliationResolved():
                self._resolved(s, p)
            case m.EffectIntended():
                self._effect_intended(s, p, ref)
            case m.EffectSucceeded():
                self._effect_succeeded(s, p, ref)
            case m.EffectFailed():
                self._effect_settled(s, p.effect_id)
            case m.EffectUncertain():
                pass
            case m.BackfillRequested():
                pass  # its runs are judged as they are materialized
            case m.RunAwaitsPermit():
                self._run(s, p.run_id).permit = "asked"
            case m.RunPermitted():
                self._run(s, p.run_id).permit = "granted"
            case m.RunPermitReturned():
                if (held_run := s.runs.get(p.run_id)) is not None:
                    held_run.permit = None
            case m.CalendarCopied():
                s.calendars = copied(s.calendars, p)
                self._copy_against_home(s, p, ref)
            case (m.ScheduleCreationHeld() | m.ScheduleCreationRefused() | m.QuotaSlotReserved()
                  | m.QuotaSlotRefused() | m.QuotaSlotConfirmed() | m.QuotaSlotReleased()
                  | m.PermitGranted() | m.PermitQueued() | m.PermitReleased()
                  | m.CalendarRevised() | m.CalendarDeleted() | m.CalendarSubscribed()
                  | m.CalendarUnsubscribed()):
                pass  # the tenant quota, permits and calendars: _track_slot, _fold_quota,
                # _fold_permit, _fold_calendar
            case (m.KeyMovedOut() | m.KeyMovedIn() | m.RoutingVersionAdded() | m.HandedOver()
                  | m.HandoverReceived()):
                pass  # a key moving between partitions (docs/design.md §18)
            case _:
                assert_never(p)

    # -- calendars --------------------------------------------------------------------

    def _materialized_excluded(self, s: ScheduleFold, p: m.OccurrenceMaterialized,
                               ref: EventRef) -> None:
        """A scheduled or backfill run is materialized only for an instant none of the
        schedule's calendars excludes, and only once every copy has come."""
        waiting = [c.name for c in s.calendars or () if not c.received]
        if waiting:
            self._violate(s, "calendar_exclusion",
                          f"{p.trigger} occurrence {_iso(p.scheduled_at)} materialized while "
                          f"the schedule waited for the copy of calendar '{waiting[0]}' (the "
                          "decider materializes nothing until it has come)", ref,
                          run_id=p.run_id)
            return
        x = exclusion(s.calendars, p.scheduled_at)
        if x is not None:
            self._violate(s, "calendar_exclusion",
                          f"{p.trigger} occurrence {_iso(p.scheduled_at)} materialized, yet "
                          f"calendar '{x.calendar}' (revision {x.revision}) excludes it: "
                          f"{x.entry}", ref, run_id=p.run_id)

    def _skipped_excluded(self, s: ScheduleFold, p: m.OccurrenceSkipped,
                          ref: EventRef) -> None:
        """A skip ``excluded`` names a calendar and revision the schedule held, whose copy
        excludes the instant (each instant of a collapsed range): else it lost a run."""
        name, revision = p.calendar, p.calendar_revision
        held = next((c for c in s.calendars or () if c.name == name), None)
        if held is None or not held.received or held.revision != revision:
            what = ("names no calendar" if name is None else
                    f"names calendar '{name}' revision {revision}")
            has = ("does not name it" if held is None else
                   "waits for its first copy" if not held.received else
                   f"holds its revision {held.revision}")
            self._violate(s, "calendar_exclusion",
                          f"occurrence {_iso(p.scheduled_at)} skipped as excluded: the skip "
                          f"{what}, and the schedule {has}", ref, run_id=p.run_id)
            return
        for t in self._skipped_instants(s, p):
            if not self._excludes(held, t):
                self._violate(s, "calendar_exclusion",
                              f"occurrence {_iso(t)} skipped as excluded by calendar '{name}' "
                              f"(revision {revision}, {p.excluded_by or 'no entry named'}), "
                              "which does not exclude it: a run lost", ref, run_id=p.run_id)
                return

    @staticmethod
    def _excludes(copy: CalendarCopy, t: datetime) -> bool:
        return copy.spec is None or excluded_by(copy.spec, t) is not None

    def _skipped_instants(self, s: ScheduleFold, p: m.OccurrenceSkipped) -> Iterator[datetime]:
        """The instants a skip records: its instant, and for a collapsed range every trigger
        instant up to its ``through`` (at most ``misfire_walk_limit``; its ends always)."""
        yield p.scheduled_at
        if p.through is None or p.through <= p.scheduled_at:
            return
        rev = s.revisions.get(p.revision, s.current)
        if rev is not None:
            try:
                trigger = _compile(rev.spec, rev.anchor)
            except RecurrenceError:
                trigger = None
            walked = 0
            t = None if trigger is None else trigger.next_after(p.scheduled_at)
            while t is not None and t < p.through:
                if walked >= self.misfire_walk_limit:
                    self.report.notes.append(
                        f"calendar_exclusion: {s.tenant}/{s.schedule_id}: checked {walked} "
                        f"instants of the skip range {_iso(p.scheduled_at)} .. "
                        f"{_iso(p.through)} (limit)")
                    break
                walked += 1
                yield t
                t = trigger.next_after(t) if trigger is not None else None
        yield p.through

    def _copy_against_home(self, s: ScheduleFold, p: m.CalendarCopied, ref: EventRef) -> None:
        """A copy carries the spec of that revision of the calendar: compared now when the
        calendar's event was seen, else when it comes (or, among copies, at the end)."""
        digest = spec_digest(p.spec)
        if p.revision == 0:  # the calendar was never put: nothing to copy
            if digest != NO_SPEC:
                self._violate(s, "calendar_exclusion",
                              f"a copy of calendar '{p.name}' at revision 0 (never put) "
                              "carries a spec", ref)
            return
        home = self._calendars.get((s.tenant, p.name))
        if home is not None:
            known = home.revisions.get(p.revision)
            if known is not None:
                if known[0] != digest:
                    self._violate(s, "calendar_exclusion",
                                  self._copy_differs(p.name, p.revision, known[0], 1),
                                  known[1], ref)
                return
            if p.revision <= home.latest:
                return  # forgotten (or never written: reported when read on the calendar)
        seen = self._copies.setdefault((s.tenant, p.name, p.revision), {})
        first = seen.get(digest)
        if first is None:
            seen[digest] = [ref, s.schedule_id, 1]
        else:
            first[2] += 1

    @staticmethod
    def _copy_differs(name: str, revision: int, home: str, count: int) -> str:
        what = "deleted" if home == NO_SPEC else "revised"
        copies = "a copy" if count == 1 else f"{count} copies"
        verb = "carries" if count == 1 else "carry"
        return (f"{copies} of calendar '{name}' at revision {revision} {verb} another spec "
                f"than the calendar {what} at that revision")

    def _fold_calendar(self, env: m.EventEnvelope, ref: EventRef) -> None:
        """One event of a calendar's aggregate, in its (one partition's) order."""
        p = env.payload
        if not isinstance(p, (m.CalendarRevised, m.CalendarDeleted, m.CalendarSubscribed,
                              m.CalendarUnsubscribed)) or calendar_id(p.name) != env.schedule_id:
            self._quota_violation("calendar_exclusion", env.tenant, env.schedule_id,
                                  f"{p.type} on calendar aggregate {env.schedule_id}", ref)
            return
        if isinstance(p, (m.CalendarSubscribed, m.CalendarUnsubscribed)):
            return  # which schedules it sends its copies to: their copies are judged
        home = self._calendars.setdefault((env.tenant, p.name), CalendarFold())
        if p.revision <= home.latest:
            self._quota_violation("calendar_exclusion", env.tenant, env.schedule_id,
                                  f"calendar '{p.name}' {p.type} at revision {p.revision}, not "
                                  f"above its revision {home.latest}",
                                  home.revisions.get(home.latest, (None, None))[1], ref)
            return
        digest = spec_digest(p.spec if isinstance(p, m.CalendarRevised) else None)
        home.revisions[p.revision] = (digest, ref)
        while len(home.revisions) > CALENDAR_REVISIONS_KEPT:
            home.forgotten = min(home.revisions)
            del home.revisions[home.forgotten]
        for other, (first, sid, count) in self._copies.pop(
                (env.tenant, p.name, p.revision), {}).items():
            if other != digest:
                self._quota_violation("calendar_exclusion", env.tenant, sid,
                                      self._copy_differs(p.name, p.revision, digest, count),
                                      first, ref)

    def _check_copies(self) -> None:
        """Copies of one revision whose calendar event the audited log does not hold must
        at least carry one spec (at the end)."""
        for (tenant, name, revision), seen in self._copies.items():
            if len(seen) > 1:
                self._quota_violation(
                    "calendar_exclusion", tenant, calendar_id(name),
                    f"the copies of calendar '{name}' at revision {revision} carry "
                    f"{len(seen)} different specs (the log audited does not hold that "
                    "revision)", *(first for first, _, _ in seen.values()))

    @staticmethod
    def _one_catch_up(s: ScheduleFold, cause: str | None) -> bool:
        """No PENDING run yet, or every PENDING run came from the same decision (``cause``):
        a misfire ``all`` catch-up queues its occurrences together under any overlap."""
        if not s.pending:
            return True
        return cause is not None and all(
            (r := s.runs.get(k)) is not None and r.cause == cause for k in s.pending)

    def _after_completion(self, s: ScheduleFold, ref: EventRef, what: str) -> None:
        """Nothing happens to a COMPLETED schedule's instants or definition."""
        if s.completed_ref is not None:
            self._violate(s, "completed_final", f"the schedule is COMPLETED, yet {what}",
                          s.completed_ref, ref)

    def _completed(self, s: ScheduleFold, env: m.EventEnvelope, p: m.ScheduleCompleted,
                   ref: EventRef) -> None:
        """A ScheduleCompleted must be the schedule's first, and the schedule really ended."""
        self._after_completion(s, ref, "it completed again")
        s.completed_ref = ref
        rev = s.current
        if rev is None:
            self._violate(s, "completed_final", "ScheduleCompleted for a schedule never created",
                          ref)
            return
        if p.count != s.scheduled_runs:
            self._violate(s, "completed_final", f"ScheduleCompleted says {p.count} runs, the log "
                          f"shows {s.scheduled_runs}", rev.ref, ref)
        spec = rev.spec
        left = self._instant_left(s, rev, env.at)
        if p.reason == "max_count" and (spec.max_count is None
                                        or s.scheduled_runs < spec.max_count):
            self._violate(s, "completed_final", f"completed for max_count after "
                          f"{s.scheduled_runs} runs (max_count {spec.max_count})", rev.ref, ref)
        elif p.reason != "max_count" and left is not None:
            self._violate(s, "completed_final", f"completed ({p.reason}) while instant "
                          f"{_iso(left)} was still to come", rev.ref, ref)

    def _instant_left(self, s: ScheduleFold, rev: RevisionFold, at: datetime) -> datetime | None:
        """An instant of the current revision still to come when it completed at ``at``."""
        spec = rev.spec
        if spec.at is not None:
            recorded = s.last_instant is not None and s.last_instant >= spec.at
            return None if recorded else spec.at
        try:
            trigger = _compile(spec, rev.anchor)
        except RecurrenceError:
            return None  # not checkable; misfire_all_complete notes such a trigger
        if spec.delay is not None:
            nxt = trigger.next_after(at)
        else:
            after = s.last_instant or rev.anchor - _US
            if s.revised_at is not None and s.revised_at - _US > after:
                after = s.revised_at - _US
            nxt = trigger.next_after(after)
        if nxt is not None and spec.end is not None and nxt > spec.end:
            return None
        return nxt
    # -- the tenant quota -------------------------------------------------------------

    def _track_slot(self, s: ScheduleFold, p: Any, ref: EventRef) -> None:
        """A schedule's side of the quota: held creates, the slot it holds, whether live."""
        key = (s.tenant, s.schedule_id)
        h = self._holders.get(key)
        if isinstance(p, m.ScheduleCreationHeld):
            if h is None:
                h = self._holders[key] = SlotHolder()
            h.held = p.command_id
        elif h is None:
            return
        elif isinstance(p, m.ScheduleCreationRefused):
            h.held = None
        elif isinstance(p, m.ScheduleCreated) and h.held is not None:
            h.slot, h.held, h.live, h.ref = h.held, None, True, ref
        elif isinstance(p, LEAVES_LIVE):
            h.live = False

    def _quota_violation(self, check: str, tenant: str, schedule_id: str, message: str,
                         *refs: EventRef | None) -> None:
        events = tuple(sorted({r for r in refs if r is not None},
                              key=lambda r: (r.partition, r.offset)))
        self.report.violations.append(Violation(check, message, events, tenant, schedule_id))

    def _fold_permit(self, env: m.EventEnvelope, ref: EventRef) -> None:
        """One event of a concurrency key's aggregate, in its (one partition's) order."""
        p = env.payload
        key = (env.tenant, env.schedule_id)
        if not isinstance(p, (m.PermitGranted, m.PermitQueued, m.PermitReleased)):
            self._quota_violation("concurrency_limit", env.tenant, env.schedule_id,
                                  f"{p.type} on a concurrency key's aggregate", ref)
            return
        held = self._permits.setdefault(key, {})
        if isinstance(p, m.PermitGranted):
            if p.run_id in held:
                self._quota_violation("concurrency_limit", env.tenant, env.schedule_id,
                                      f"a second permit of key '{p.key}' granted to run "
                                      f"{p.run_id}", held[p.run_id], ref)
            held[p.run_id] = ref
            if len(held) > p.limit:
                self._quota_violation("concurrency_limit", env.tenant, env.schedule_id,
                                      f"{len(held)} permits of key '{p.key}' held, limit "
                                      f"{p.limit}", ref)
        elif isinstance(p, m.PermitReleased) and p.held and held.pop(p.run_id, None) is None:
            self._quota_violation("concurrency_limit", env.tenant, env.schedule_id,
                                  f"a permit of key '{p.key}' released that run "
                                  f"{p.run_id} does not hold", ref)
        if not held:
            del self._permits[key]

    def _fold_quota(self, env: m.EventEnvelope, ref: EventRef) -> None:
        """One event of a tenant's quota aggregate, in its (one partition's) order."""
        q = self._quotas.setdefault(env.tenant, QuotaFold())
        p = env.payload
        if not isinstance(p, (m.QuotaSlotReserved, m.QuotaSlotRefused, m.QuotaSlotConfirmed,
                              m.QuotaSlotReleased)):
            self._quota_violation("quota_balance", env.tenant, env.schedule_id,
                                  f"{p.type} on the tenant's quota aggregate", ref)
            return
        tenant, sid = env.tenant, p.schedule_id
        slot = q.slots.get(sid)
        ours = slot is not None and slot[0] == p.create_command_id
        if isinstance(p, m.QuotaSlotRefused):
            q.max_schedules = p.max_schedules
            return
        if isinstance(p, m.QuotaSlotReserved):
            q.max_schedules = p.max_schedules
            if slot is not None:
                self._quota_violation("quota_balance", tenant, sid, "a second slot reserved "
                                      "for the schedule while it holds one", slot[1], ref)
            q.slots[sid] = [p.create_command_id, ref, False]
            q.reserved.add(p.create_command_id)
        elif isinstance(p, m.QuotaSlotConfirmed):
            if slot is None and p.late:
                q.slots[sid] = [p.create_command_id, ref, True]
            elif not ours or (slot is not None and slot[2]):
                self._quota_violation("quota_balance", tenant, sid, "a slot confirmed that is "
                                      "not reserved for this create", ref)
            else:
                assert slot is not None
                slot[2] = True
        else:
            if not ours:
                self._quota_violation("quota_balance", tenant, sid, "a slot released that is "
                                      "not held for this create", ref)
            else:
                del q.slots[sid]
            return
        held = len(q.slots)
        if q.max_schedules is not None and held > q.max_schedules:
            self._quota_violation("quota_exact", tenant, sid, f"{held} slots held, quota "
                                  f"{q.max_schedules}", ref)

    def _check_quotas(self) -> None:
        """Each tenant's quota against its schedules, at the end of the log."""
        live: dict[str, list[tuple[str, SlotHolder]]] = {}
        for (tenant, sid), h in self._holders.items():
            q = self._quotas.get(tenant, QuotaFold())
            if h.slot is not None and h.slot not in q.reserved:
                self._quota_violation("quota_exact", tenant, sid, "created under the quota "
                                      "without a slot reserved for its create", h.ref)
            if h.live and h.slot is not None:
                live.setdefault(tenant, []).append((sid, h))
                slot = q.slots.get(sid)
                if slot is None or slot[0] != h.slot:
                    self._quota_violation("quota_balance", tenant, sid, "a live schedule "
                                          "whose slot the quota does not hold", h.ref)
        for tenant, q in self._quotas.items():
            holders = dict(live.get(tenant, []))
            if q.max_schedules is not None and len(holders) > q.max_schedules:
                self._quota_violation("quota_exact", tenant, "", f"{len(holders)} live "
                                      f"schedules hold a slot, quota {q.max_schedules}")
            open_ = 0
            for sid, (_cid, ref, confirmed) in q.slots.items():
                if not confirmed:
                    open_ += 1
                elif sid not in holders:
                    self._quota_violation("quota_balance", tenant, sid, "a slot still taken "
                                          "by a schedule that is no longer live", ref)
            if open_:
                self.report.notes.append(f"tenant {tenant}: {open_} quota reservation(s) "
                                         "still open (creates in flight)")

    def _manual_key(self, s: ScheduleFold, request_key: str, ref: EventRef) -> None:
        """A manual trigger's request key is idempotent over the schedule's last
        ``MANUAL_KEYS_KEPT`` manual triggers: recorded again within them, it is a second
        occurrence of one request (a key reused after them is a new request)."""
        old = s.manual.get(request_key)
        if old is not None:
            self._violate(s, "occurrence_unique",
                          f"manual trigger request key {request_key!r} recorded twice within "
                          f"the schedule's last {MANUAL_KEYS_KEPT} manual triggers", old, ref)
            return
        s.manual[request_key] = ref
        if len(s.manual) > MANUAL_KEYS_KEPT:
            del s.manual[next(iter(s.manual))]

    def _check_overlap_claim(self, s: ScheduleFold, run: RunFold, ref: EventRef) -> None:
        if run.run_id.startswith(BACKFILL_RUN):
            return  # a backfill's runs hold no overlap guard (docs/design.md §22)
        others = sorted(r for r in s.leased if r != run.run_id
                        and not r.startswith(BACKFILL_RUN))
        if not others:
            return
        now_policy = s.overlap_policy()
        run_policy = s.overlap_policy(run.revision)
        if now_policy in GUARDED_OVERLAP and run_policy in GUARDED_OVERLAP:
            other = s.runs[others[0]]
            self._violate(s, "overlap",
                          f"overlap {now_policy}: run {run.run_id} claimed while run "
                          f"{other.run_id} is LEASED", other.claim_ref, ref, run_id=run.run_id)

    def _result(self, s: ScheduleFold, env: m.EventEnvelope, p: m.ResultPublished,
                ref: EventRef) -> None:
        held = p.run_id in s.runs
        run = self._run(s, p.run_id)
        self._fence_of_run(s, run, p.fence, ref, "ResultPublished", held)
        if run.result_ref is not None:
            self._violate(s, "result_once", f"a second ResultPublished for run {run.run_id}",
                          run.result_ref, ref, run_id=run.run_id)
        else:
            run.result_ref = ref
        if run.lease_until is None:
            why = (("the run was never claimed" + ("" if held else _NOT_HELD))
                   if run.claim_ref is None
                   else f"its lease had ended ({run.lease_ref.type if run.lease_ref else '?'})")
            self._violate(s, "result_within_lease",
                          f"ResultPublished at {_iso(env.at)} without a lease: {why}",
                          run.lease_ref, ref, run_id=run.run_id)
        elif env.at > run.lease_until:
            self._violate(s, "result_within_lease",
                          f"ResultPublished at {_iso(env.at)} after the lease ended at "
                          f"{_iso(run.lease_until)}", run.lease_ref, ref, run_id=run.run_id)
        self._set_state(s, run, "SUCCEEDED")

    def _resolved(self, s: ScheduleFold, p: m.ReconciliationResolved) -> None:
        """A human's decision: a retried effect may be intended once more; a delivered or
        abandoned one is settled; a run delivered has succeeded."""
        if p.effect_id is None:
            run = s.runs.get(p.run_id)
            if run is not None and p.decision == "delivered":
                self._set_state(s, run, "SUCCEEDED")
            return
        eff = self._effects.get(p.effect_id)
        if eff is None:
            return
        if p.decision == "retry":
            eff.retry_allowed = eff.open = True
        else:
            self._effect_settled(s, p.effect_id)

    def _effect_settled(self, s: ScheduleFold, effect_id: str) -> None:
        """An effect reached an outcome: its run may now be forgotten."""
        eff = self._effects.get(effect_id)
        if eff is not None and eff.open:
            eff.open = False
            self._retire(s)

    def _effect_of_run(self, s: ScheduleFold, run_id: str, effect_id: str, ref: EventRef,
                       what: str) -> RunFold | None:
        """The held run an effect not held belongs to; None (reported) when the schedule
        does not hold it: the decider writes an effect's events only while it holds its run
        (a finished run is kept until its effects are settled)."""
        run = s.runs.get(run_id)
        if run is None:
            self._violate(s, "effect_unique",
                          f"{what} for effect {effect_id} of run {run_id}, which the schedule "
                          "does not hold (never materialized, or finished with its effects "
                          "settled and forgotten: the decider answers it not_found)",
                          ref, run_id=run_id)
        return run

    def _effect_succeeded(self, s: ScheduleFold, p: m.EffectSucceeded, ref: EventRef) -> None:
        eff = self._effects.get(p.effect_id)
        if eff is None:
            run = self._effect_of_run(s, p.run_id, p.effect_id, ref, "EffectSucceeded")
            if run is not None:
                self.report.effects += 1
                self._effects[p.effect_id] = EffectFold((s.tenant, s.schedule_id), ref,
                                                        success_ref=ref, run_id=p.run_id,
                                                        open=False)
                run.effects.append(p.effect_id)
        elif eff.success_ref is not None:
            self._violate(s, "effect_unique",
                          f"effect {p.effect_id} succeeded twice",
                          eff.success_ref, ref, run_id=p.run_id)
        else:
            eff.success_ref = ref
            self._effect_settled(s, p.effect_id)

    def _effect_intended(self, s: ScheduleFold, p: m.EffectIntended, ref: EventRef) -> None:
        owner = (s.tenant, s.schedule_id)
        eff = self._effects.get(p.effect_id)
        if eff is None:
            run = self._effect_of_run(s, p.run_id, p.effect_id, ref, "EffectIntended")
            if run is not None:
                self.report.effects += 1
                self._effects[p.effect_id] = EffectFold(owner, ref, run_id=p.run_id)
                run.effects.append(p.effect_id)
            return
        if eff.owner != owner:
            self._violate(s, "effect_unique",
                          f"effect ID {p.effect_id} also intended by schedule "
                          f"{eff.owner[0]}/{eff.owner[1]}", eff.intent_ref, ref,
                          run_id=p.run_id)
        elif not eff.retry_allowed:
            self._violate(s, "effect_unique",
                          f"effect {p.effect_id} intended again without a reconciliation "
                          "retry in between", eff.intent_ref, ref, run_id=p.run_id)
        eff.intent_ref = ref
        eff.retry_allowed = False
        eff.open = True

    # -- whole-log checks -----------------------------------------------------------

    def finish(self) -> AuditReport:
        """The report as of the events fed so far: what was found while folding, and the
        checks that need every event — misfire ``all`` completeness (since the last
        checkpoint), the quotas — judged now. The state is left as it was: more events may
        be fed, and ``finish`` asked again."""
        found = self.report
        self.report = AuditReport(found.events, len(self._schedules), found.runs,
                                  found.results, found.effects, list(found.violations),
                                  list(found.notes))
        try:
            for s in self._schedules.folds(misfire_only=True):
                for rev in s.revisions.values():
                    if rev.check_misfire:
                        self._check_misfire_all(s, rev)
            self._check_quotas()
            self._check_copies()
            return self.report
        finally:
            self.report = found

    def _check_misfire_all(self, s: ScheduleFold, rev: RevisionFold,
                           settle: bool = False) -> None:
        """Every trigger instant between the first (or the settled) and the latest recorded
        one is recorded. ``settle``: then drop what was checked, keeping where it ended."""
        points = [(t, t) for t in rev.instants] + [(a, b) for a, b, _, _ in rev.ranges]
        if not points:
            return
        lo = min(a for a, _ in points)
        hi = max(b for _, b in points)
        if rev.settled is None and len(points) < 2:
            return  # one record: where the check will start (kept until there is another)
        if rev.settled is not None and hi <= rev.settled:
            if settle:
                self._settle(rev, rev.settled, rev.settled_ref)
            return
        try:
            trigger = _compile(rev.spec, rev.anchor)
        except RecurrenceError as exc:
            self.report.notes.append(
                f"misfire_all_complete: {s.tenant}/{s.schedule_id} revision {rev.revision}: "
                f"trigger does not compile ({exc}); not checked")
            if settle:
                rev.check_misfire = False
                rev.instants.clear()
                rev.ranges.clear()
            return
        ranges = sorted(rev.ranges, key=lambda r: r[0])
        starts = [r[0] for r in ranges]
        seen_in_range = [0] * len(ranges)
        walked = 0
        last_ref = rev.settled_ref
        gap: list[datetime] = []  # [first missing, last missing]
        gap_count = 0
        t = trigger.next_after(lo - _US if rev.settled is None else rev.settled)
        while t is not None and t <= hi:
            if walked >= self.misfire_walk_limit:
                self.report.notes.append(
                    f"misfire_all_complete: {s.tenant}/{s.schedule_id} revision "
                    f"{rev.revision}: checked {walked} instants up to {_iso(t)} of "
                    f"{_iso(lo)} .. {_iso(hi)} (limit)")
                break
            walked += 1
            ref = rev.instants.get(t)
            if ref is None:
                i = bisect.bisect_right(starts, t) - 1
                if i >= 0 and ranges[i][0] <= t <= ranges[i][1]:
                    seen_in_range[i] += 1
                    ref = ranges[i][3]
            if ref is None:
                if not gap:
                    gap = [t, t]
                else:
                    gap[1] = t
                gap_count += 1
            else:
                if gap:
                    self._gap(s, rev, gap, gap_count, last_ref, ref)
                    gap, gap_count = [], 0
                last_ref = ref
            t = trigger.next_after(t)
        else:
            if gap:
                self._gap(s, rev, gap, gap_count, last_ref, None)
            for i, (a, b, count, ref) in enumerate(ranges):
                if seen_in_range[i] != count and (rev.settled is None or a > rev.settled):
                    self._violate(s, "misfire_all_complete",
                                  f"skip range {_iso(a)} .. {_iso(b)} says {count} instants, "
                                  f"the trigger has {seen_in_range[i]} in it (misfire all)",
                                  ref)
        if settle:
            self._settle(rev, hi, rev.instants.get(hi) or next(
                (ref for _, b, _, ref in ranges if b == hi), last_ref))

    @staticmethod
    def _settle(rev: RevisionFold, through: datetime, ref: EventRef | None) -> None:
        rev.settled, rev.settled_ref = max(through, rev.settled or through), ref
        rev.instants.clear()
        rev.ranges.clear()

    def _gap(self, s: ScheduleFold, rev: RevisionFold, gap: list[datetime], count: int,
             before: EventRef | None, after: EventRef | None) -> None:
        span = _iso(gap[0]) if gap[0] == gap[1] else f"{_iso(gap[0])} .. {_iso(gap[1])}"
        self._violate(s, "misfire_all_complete",
                      f"misfire all (revision {rev.revision}): {count} instant(s) {span} "
                      "neither materialized nor skipped", before, after)


def audit(events: Iterable[m.EventEnvelope | tuple[int, int, m.EventEnvelope]],
          misfire_walk_limit: int = DEFAULT_MISFIRE_WALK_LIMIT,
          hot_max: int = DEFAULT_HOT_MAX) -> AuditReport:
    """Audit a sequence of envelopes (bare ones are numbered partition 0, offsets 0, 1, ...),
    each partition's in log order; across partitions they are fed in move-barrier order
    (``chronolog.domain.barrier.in_barrier_order``), whatever order they come in."""
    auditor = Auditor(misfire_walk_limit=misfire_walk_limit, hot_max=hot_max)
    partitions: dict[int, list[tuple[int, m.EventEnvelope]]] = {}
    for n, item in enumerate(events):
        partition, offset, env = (0, n, item) if isinstance(item, m.EventEnvelope) else item
        partitions.setdefault(partition, []).append((offset, env))

    def stuck(partition: int, offset: int, barrier: Barrier) -> None:
        auditor.handover_missing(partition, offset, barrier.partition, barrier.version)

    for partition, offset, env in in_barrier_order(partitions, stuck):
        auditor.feed(env, partition, offset)
    return auditor.finish()
