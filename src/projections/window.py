"""The read-model rows a snapshot's states imply: where a replay of a pruned partition starts
(``chronolog replay``, docs/design.md §9, "Replay of the window").

Once partition p of ``events`` is pruned (§20), the events that created its older schedules
and runs are gone; its latest snapshot (§14) still holds every schedule's state as of its
record's ``through``. ``state_rows(states, before)`` turns those states into the row changes
of the read model, as ``project`` would have written them for the columns a state carries:

* ``schedules``: one row per created schedule (a state still waiting for its quota slot is
  no schedule yet, as in the projection) — revision, state, spec, request key, anchor, fence,
  next run and due times, paused_at, created_at;
* ``runs``: the runs the state holds — every live run, the dead-lettered runs kept for a
  redrive and the newest finished one — with their instant, due time, revision, trigger,
  job, resource class, priority, start deadline, attempt, cancellation request, result, and
  the request key of a manual run while the state remembers it;
* ``effects``: the effects of those runs, from the intents the state keeps (kind, checksum,
  config, attempt) and their state.

What a state does not carry is either a *stand-in* or left empty (``STAND_INS`` names these
columns): the times of the events that set them — a schedule's ``updated_at``,
``last_event_at``, ``deleted_at``, ``completed_at``, a run's
``ready_at``, ``updated_at``, an effect's ``created_at``, ``updated_at`` — are given
``before``, the authority time of the partition's first retained event, which the true
value precedes; the texts and documents of events (a pause or completion reason, a run's
errors, dead and cancel reasons, its reconciliation, its skip, an effect's evidence, a
sequence number, its first start) stay NULL. Every stand-in is written as ``First``, so a
value the retained events set is never replaced by it, and a retained event later in the
log replaces it as it replaces any value. Attempts are not rebuilt from a state (neither the
rows of ``attempts`` nor a run's attempt-1 columns, ``first_*``): it knows the current
attempt's worker, fence and lease, not when it was claimed.

A run the state holds as finished whose finish was pruned finished before the log's start,
so past every tenant's window: the live projector pruned it. ``drop_unknown_finishes``
deletes such rows (a finished run with no ``finished_at``, and its attempts and final
effects) once the replay folded the retained events.

Quota states imply no row (the quota saga changes none, ``project``), but a calendar's —
a quota-kind state — implies its ``calendars`` row: its revision and spec (none once
deleted, ``deleted_at`` a stand-in), its times stand-ins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

import asyncpg

from chronolog.commands.state import TERMINAL, QuotaState, Run, ScheduleState
from chronolog.projections.store import First, RowChanges

__all__ = ["STAND_INS", "drop_unknown_finishes", "effect_rows", "state_rows"]

# per table: the columns whose value, for a row made from a state, is a stand-in or NULL
# until a retained event sets it (module docstring); every other column is the projection's
STAND_INS: Mapping[str, frozenset[str]] = MappingProxyType({
    "schedules": frozenset({"updated_at", "last_event_at", "pause_reason", "deleted_at",
                            "completed_at", "completed_reason"}),
    "runs": frozenset({"updated_at", "ready_at", "sequence", "started_at",
                       "request_key", "retry_at", "skipped_reason", "skipped_through",
                       "skipped_count", "cancel_reason", "dead_reason", "dead_message",
                       "last_error_class", "last_error", "reconciliation",
                       "reconciliation_resolution", "first_fence", "first_worker_id",
                       "first_lease_until", "first_outcome", "first_error_class",
                       "first_error", "first_finished_at", "permit_wait"}),
    "attempts": frozenset(),
    "effects": frozenset({"created_at", "updated_at", "evidence"}),
    "calendars": frozenset({"created_at", "updated_at", "deleted_at"}),
    "ready_runs": frozenset({"ready_at"}),
    "open_attempts": frozenset(),
})

_CREATED = frozenset({"ACTIVE", "PAUSED", "DELETED", "COMPLETED"})
_FINAL_EFFECTS = ["SUCCEEDED", "FAILED", "ABANDONED"]


def state_rows(states: Iterable[ScheduleState], before: datetime,
               quotas: Iterable[QuotaState] = ()) -> RowChanges:
    """The ``schedules`` and ``runs`` rows the schedule states imply, and the ``calendars``
    rows of the calendars among ``quotas`` (module docstring); ``before``: the stand-in of
    the times a state does not carry."""
    c = RowChanges()
    stand_in = First(before)
    for q in quotas:
        home = q.calendar
        if home is None or home.revision == 0:
            continue  # never put: no row
        spec = None if home.spec is None else home.spec.model_dump(
            mode="json", by_alias=True, exclude_defaults=True)
        c.set("calendars", (q.tenant, home.name), revision=home.revision, spec=spec,
              created_at=stand_in, updated_at=stand_in,
              **({"deleted_at": stand_in} if spec is None else {}))
    for st in states:
        if st.status not in _CREATED or st.policy is None:
            continue  # not created (a create waiting for its quota slot): no row
        c.set("schedules", (st.tenant, st.schedule_id), revision=st.revision,
              state=st.status, spec=st.policy.spec.model_dump(mode="json"),
              request_key=st.request_key, anchor=st.anchor, fence=st.fence,
              next_run_at=st.next_run_at, next_due_at=st.next_due_at, paused_at=st.paused_at,
              created_at=st.created_at, updated_at=stand_in, last_event_at=stand_in,
              **({"deleted_at": stand_in} if st.status == "DELETED" else {}),
              **({"completed_at": stand_in} if st.status == "COMPLETED" else {}))
        keys = {v.run_id: key for key, v in (st.manual or {}).items()}
        for run in _runs(st):
            _run_row(c, st, run, keys.get(run.run_id), stand_in)
    return c


def _runs(st: ScheduleState) -> list[Run]:
    return list((st.runs or {}).values()) + ([] if st.done is None else [st.done])


def effect_rows(states: Iterable[ScheduleState], before: datetime) -> RowChanges:
    """The ``effects`` rows of the runs the states hold (module docstring)."""
    c = RowChanges()
    stand_in = First(before)
    for st in states:
        for run in _runs(st):
            for effect_id, (state, attempt, intent) in (run.effects or {}).items():
                c.set("effects", (effect_id,), tenant=st.tenant, schedule_id=st.schedule_id,
                      run_id=run.run_id, kind=intent.kind, state=state, attempts=attempt,
                      checksum=intent.checksum, config=intent.config, created_at=stand_in,
                      updated_at=stand_in)
    return c


def _run_row(c: RowChanges, st: ScheduleState, run: Run, request_key: str | None,
             stand_in: First) -> None:
    cols: dict[str, Any] = dict(
        tenant=st.tenant, schedule_id=st.schedule_id, scheduled_at=run.scheduled_at,
        due_at=run.due_at, revision=run.revision, trigger=run.trigger, state=run.state,
        attempt=run.attempt, job_type=run.job.type, params=run.job.params,
        resource_class=run.resource_class, priority=run.priority,
        start_deadline_at=run.start_deadline_at, cancellation_requested=run.cancel_requested,
        updated_at=stand_in)
    if request_key is not None:
        cols["request_key"] = First(request_key)
    if run.state == "READY":
        cols["ready_at"] = stand_in
    if run.state == "RETRY_WAIT":
        cols["retry_at"] = run.retry_at
    if run.result is not None:
        size, uri, inline = run.result
        cols.update(result_checksum=run.checksum, result_size=size, result_uri=uri,
                    result_inline=inline, result_attempt=run.attempt)
    c.set("runs", (run.run_id,), **cols)


async def drop_unknown_finishes(pool: asyncpg.Pool) -> int:
    """Delete the finished runs whose finish no event gave (made from a state: they finished
    before the log's start, past every window), their attempts and final effects; the runs
    deleted."""
    async with pool.acquire() as conn, conn.transaction():
        gone = [r[0] for r in await conn.fetch(
            "DELETE FROM runs WHERE state = ANY($1::text[]) AND finished_at IS NULL "
            "RETURNING run_id", sorted(TERMINAL))]
        if gone:
            await conn.execute("DELETE FROM attempts WHERE run_id = ANY($1::text[])", gone)
            await conn.execute("DELETE FROM effects WHERE run_id = ANY($1::text[]) "
                               "AND state = ANY($2::text[])", gone, _FINAL_EFFECTS)
    return len(gone)
