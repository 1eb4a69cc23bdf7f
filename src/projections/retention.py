"""Retention of finished runs in the read model (docs/design.md §9, "Retention").

A *finished* run is one in a terminal state of the run lifecycle (docs/design.md, run
states): ``SUCCEEDED``, ``DEAD`` (failed for good, dead-lettered, timed out before its start),
``CANCELLED`` and ``SKIPPED`` — ``FINISHED_STATES``. ``RECONCILING`` is not one (a person has
still to decide it), nor is any state of a run that may still be claimed or retried. Once
its ``finished_at`` is older than its tenant's retention (``RetentionPolicy``: the tenants
file's ``retention``, else the deployment's ``--retention``), ``prune`` deletes:

* its ``runs`` row and its ``attempts`` rows (the history the API lists);
* its ``effects`` rows in a final state (``SUCCEEDED``, ``FAILED``, ``ABANDONED``); an effect
  still ``INTENDED``, ``UNCERTAIN`` or ``RECONCILING`` is work the effect runner or an
  operator has still to do and is kept until it ends.

Kept for ever: ``schedules`` (definitions and revisions), every run that is not finished,
``run_counters`` and ``ready_runs`` (the metrics are sums over all history; a finished run is
never READY), ``dead_letters`` (one row per *log record* skipped, not per run: an operator's
record of what a consumer could not read), ``workers``, ``served_job_types`` and
``projection_offsets``.

**Whose clock.** "Older than" compares ``finished_at`` (the finishing event's time, as the
projection recorded it) with the read model's *now*: the newest event time it has projected
(``max(projection_offsets.last_event_at)`` over ``events``) — never the wall clock. A replay
of old history therefore prunes against the same instant the live projector reached, and a
deployment stopped for a month does not lose its rows when it starts again before any new
event arrives. A run's rows go only when the log has moved on past its window.

**Whole days.** ``runs`` and ``attempts`` are partitioned by day of the run's
``scheduled_at`` (``chronolog.projections.partitions``). ``prune`` first takes the *closed*
days — ended more than the deployment's window (``RetentionPolicy.default``) before now —
oldest first: a day whose runs are all finished and past their own tenant's window is
dropped (its two partitions, and first its runs' final effects); a day with at most
``straggler_limit`` runs that are not (live, ``RECONCILING``, finished late, or of a tenant
with a longer window) has them moved to the default partition — the day detached, the
stragglers and their attempts inserted again through the parent — and is dropped; a day with
more stays, its expired rows deleted one by one below. Each day is one transaction that
locks ``runs`` and ``attempts`` (waiting ``LOCK_WAIT_MS`` at most, else tried on the next
pass) and checks the day again under the lock, so a run redriven meanwhile is kept.

**Row by row.** Rows outside a droppable day are deleted one by one: a tenant whose window
is shorter than the deployment's, or shorter than a day, in every partition (its runs never
wait for their day); every other tenant in the default partition and in the closed days
that stayed — in every partition too when the deployment's window is shorter than a day (a
two-minute window waiting for its day would keep a day of rows). A run of a window of a day
or more in a day not yet closed waits for its day: at most a day after its own window.

**How.** ``prune`` deletes in batches of at most ``batch`` runs (their attempts and effects
with them), one transaction per batch, per tenant and per partition searched (the tenants of
the deployment's window found in the partition by a loose scan of ``runs_by_tenant``), so no
transaction holds many row locks or runs for long. No index holds ``finished_at`` (migration
0011: the publish that sets it is then a heap-only update); a finished run's ``finished_at``
is never before its ``scheduled_at``, so a tenant's expired runs are among its runs
scheduled before the cut-off, a range of ``runs_by_tenant (tenant, scheduled_at, run_id)``,
whose finished state and ``finished_at`` are checked on the row. (A run cancelled before its
instant, the one case of a ``finished_at`` before it, goes once both are past the cut-off.)
The ``DELETE`` repeats the terminal-state and cut-off test on each row it locks, so a run
redriven between the choice and the delete is kept. The live projector runs it on a timer
beside its batches (``Projector(retention=...)``); ``chronolog replay`` runs it once its
build is complete, with the same policy — both are functions of the events projected, so
they leave the same rows.
A later event of a pruned run (a redrive of a run dead past its window) finds no row: the
projector counts it among its missing rows, as a replay that pruned at the same point would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import asyncpg

from chronolog.projections.partitions import (
    DEFAULT_PARTITION,
    LOCK_WAIT_MS,
    DayPartition,
    day_partitions,
    days_back,
    ensure_days,
    insertable_columns,
    quote,
)
from chronolog.tenants import DEFAULT_RETENTION_S, Tenants

__all__ = [
    "DEFAULT_PRUNE_BATCH",
    "FINAL_EFFECT_STATES",
    "FINISHED_STATES",
    "ONE_TENANT_SQL",
    "STRAGGLER_LIMIT",
    "PruneReport",
    "RetentionPolicy",
    "delete_sql",
    "ensure_partitions",
    "projected_now",
    "prune",
]

FINISHED_STATES = ("SUCCEEDED", "DEAD", "CANCELLED", "SKIPPED")
FINAL_EFFECT_STATES = ("SUCCEEDED", "FAILED", "ABANDONED")
DEFAULT_PRUNE_BATCH = 1000  # runs per transaction (with their attempts and effects)
# a window shorter than a day does not wait for its day (that would keep its rows for more
# than twice the window): its rows go one by one in every partition
ONE_DAY_S = 86400.0
STRAGGLER_LIMIT = 10_000  # the most runs a closed day moves to the default partition


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished runs keep their rows: ``default`` seconds, ``tenants`` (tenant ->
    seconds) for the tenants that set their own."""

    default: float = DEFAULT_RETENTION_S
    tenants: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, tenants: Tenants, default: float) -> RetentionPolicy:
        own = {n: t.retention for n, t in tenants.tenants.items() if t.retention is not None}
        return cls(default, own)

    def window(self, tenant: str) -> float:
        return self.tenants.get(tenant, self.default)

    def longest(self) -> float:
        """The longest window of any tenant: the log's own (it serves every tenant)."""
        return max([self.default, *self.tenants.values()])


@dataclass
class PruneReport:
    days: list[date] = field(default_factory=list)  # day partitions dropped
    moved: int = 0  # stragglers moved from them to the default partition
    runs: int = 0
    attempts: int = 0
    effects: int = 0
    batches: int = 0
    now: datetime | None = None


async def projected_now(conn: asyncpg.Connection | asyncpg.Pool, projection: str,
                        topic: str) -> datetime | None:
    """The read model's now: the newest event time projected from ``topic`` (None: none)."""
    value: datetime | None = await conn.fetchval(
        "SELECT max(last_event_at) FROM projection_offsets "
        "WHERE projection = $1 AND topic = $2", projection, topic)
    return value


# the finished states written out (not a parameter)
_FINISHED_SQL = "state IN (" + ", ".join(f"'{st}'" for st in FINISHED_STATES) + ")"
# No index holds finished_at (migration 0011: the publish that sets it is then a HOT
# update). A finished run's finished_at is never before its scheduled_at (a run does not
# start before its instant), so ``finished_at < $2`` implies ``scheduled_at < $2``: the
# candidates of one tenant are a range of runs_by_tenant (tenant, scheduled_at, run_id),
# taken oldest instant first; the finished state and finished_at are checked on the row.
_DELETE = """
WITH chosen AS (
    SELECT run_id, scheduled_at FROM {source}
     WHERE {where} AND scheduled_at < $2 AND finished_at < $2 AND {finished}
     ORDER BY scheduled_at
     LIMIT $3
), doomed AS (
    DELETE FROM {source} r USING chosen c
     WHERE r.run_id = c.run_id AND r.scheduled_at = c.scheduled_at
       AND r.finished_at < $2 AND r.{finished}
    RETURNING r.run_id
), a AS (
    DELETE FROM attempts WHERE run_id IN (SELECT run_id FROM doomed) RETURNING 1
), e AS (
    DELETE FROM effects WHERE run_id IN (SELECT run_id FROM doomed)
       AND state = ANY($4::text[]) RETURNING 1
), o AS (
    DELETE FROM open_attempts WHERE run_id IN (SELECT run_id FROM doomed)
)
SELECT (SELECT count(*) FROM doomed), (SELECT count(*) FROM a), (SELECT count(*) FROM e)
"""
_ONE = "tenant = $1"


def delete_sql(where: str, source: str) -> str:
    """One batch of row deletes among the runs of ``source`` (``runs``, or one partition)."""
    return _DELETE.format(where=where, finished=_FINISHED_SQL, source=quote(source))


# one tenant ($1) in every partition; the same in one partition is ``delete_sql(_ONE, it)``
ONE_TENANT_SQL = delete_sql(_ONE, "runs")

# the tenants that have runs in a partition (or all of ``runs``), one probe of
# runs_by_tenant each (a loose index scan): the deployment's window is applied tenant by
# tenant, each through its own range of that index
_TENANTS = """
WITH RECURSIVE t(tenant) AS (
    SELECT min(tenant) FROM {source}
    UNION ALL
    SELECT (SELECT min(tenant) FROM {source} WHERE tenant > t.tenant) FROM t
     WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL
"""


async def _tenants(pool: asyncpg.Pool, source: str) -> list[str]:
    return [r[0] for r in await pool.fetch(_TENANTS.format(source=quote(source)))]

# a run past its tenant's window ($1: tenants with their own, $2: their cut-offs, $3: the
# others' cut-off), as a condition on the row ``r`` joined with its cut-off ``w``
_EXPIRED = (f"(r.{_FINISHED_SQL} AND r.finished_at IS NOT NULL "
            "AND r.finished_at < COALESCE(w.cutoff, $3))")
_WINDOWS = "LEFT JOIN unnest($1::text[], $2::timestamptz[]) AS w(tenant, cutoff) " \
           "ON w.tenant = r.tenant"


def _stragglers_sql(runs: str) -> str:
    return (f"SELECT r.run_id FROM {quote(runs)} AS r {_WINDOWS} "
            f"WHERE {_EXPIRED} IS NOT TRUE LIMIT $4")


_DROPPED, _STAYS, _BUSY = "dropped", "stays", "busy"


async def _close_day(pool: asyncpg.Pool, day: DayPartition, cutoffs: tuple[Any, ...],
                     limit: int, report: PruneReport) -> str:
    """Drop a closed day whose stragglers are at most ``limit``, moving them to the default
    partition first (module docstring): ``_DROPPED``; ``_STAYS``: more stragglers (its
    expired rows go one by one); ``_BUSY``: the tables stayed locked (the next pass)."""
    # a first look without the lock: a day with many stragglers is not worth locking for
    if len(await pool.fetch(_stragglers_sql(day.runs), *cutoffs, limit + 1)) > limit:
        return _STAYS
    try:
        return await _drop_day(pool, day, cutoffs, limit, report)
    except (asyncpg.exceptions.LockNotAvailableError,
            asyncpg.exceptions.DeadlockDetectedError):
        return _BUSY


async def _drop_day(pool: asyncpg.Pool, day: DayPartition, cutoffs: tuple[Any, ...],
                    limit: int, report: PruneReport) -> str:
    runs, attempts = quote(day.runs), quote(day.attempts)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = {LOCK_WAIT_MS}")
        await conn.execute("LOCK TABLE ONLY runs, attempts IN ACCESS EXCLUSIVE MODE")
        kept = [r[0] for r in await conn.fetch(_stragglers_sql(day.runs), *cutoffs, limit + 1)]
        if len(kept) > limit:
            return _STAYS
        n_runs = await conn.fetchval(f"SELECT count(*) FROM {runs}")
        n_attempts = await conn.fetchval(
            f"SELECT count(*) FROM {attempts} WHERE run_id <> ALL($1::text[])", kept)
        n_effects = len(await conn.fetch(
            f"DELETE FROM effects WHERE run_id IN (SELECT run_id FROM {runs} "
            "WHERE run_id <> ALL($1::text[])) AND state = ANY($2::text[]) RETURNING 1",
            kept, list(FINAL_EFFECT_STATES)))
        await conn.execute(  # an attempt left open by a finished run (kept apart, 0011)
            f"DELETE FROM open_attempts WHERE run_id IN (SELECT run_id FROM {runs} "
            "WHERE run_id <> ALL($1::text[]))", kept)
        if kept:  # the stragglers go to the default partition (no partition holds the day)
            for parent, name in (("runs", runs), ("attempts", attempts)):
                await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {name}")
                cols = ", ".join(quote(c) for c in await insertable_columns(conn, parent))
                await conn.execute(f"INSERT INTO {parent} ({cols}) SELECT {cols} FROM {name} "
                                   "WHERE run_id = ANY($1::text[])", kept)
        await conn.execute(f"DROP TABLE {runs}, {attempts}")
    report.days.append(day.day)
    report.moved += len(kept)
    report.runs += n_runs - len(kept)
    report.attempts += n_attempts
    report.effects += n_effects
    return _DROPPED


async def ensure_partitions(pool: asyncpg.Pool, policy: RetentionPolicy,
                            today: date | None = None, now: datetime | None = None
                            ) -> list[str]:
    """Make the missing day partitions of ``today`` (the wall clock's by default) and the
    next days, and of the whole days of the deployment's window back
    (``chronolog.projections.partitions``), but none that ``prune`` would drop at the read
    model's ``now`` (a log whose time runs ahead of the wall clock); the runs partitions
    made."""
    closed = None if now is None else now - timedelta(seconds=policy.default)
    return await ensure_days(pool, today or datetime.now(UTC).date(),
                             back=days_back(policy.default), after=closed)


async def prune(pool: asyncpg.Pool, policy: RetentionPolicy, *, projection: str, topic: str,
                batch: int = DEFAULT_PRUNE_BATCH, max_batches: int | None = None,
                now: datetime | None = None,
                straggler_limit: int = STRAGGLER_LIMIT) -> PruneReport:
    """Drop the closed days and delete the rows of the runs finished longer than their
    tenant's window before the read model's now (module docstring); ``max_batches`` bounds
    one call's row deletes (the live projector's timer), ``None`` goes on until nothing is
    left."""
    report = PruneReport()
    report.now = now if now is not None else await projected_now(pool, projection, topic)
    if report.now is None:
        return report
    own = sorted(policy.tenants.items())
    cutoffs = ([t for t, _ in own], [report.now - timedelta(seconds=s) for _, s in own],
               report.now - timedelta(seconds=policy.default))
    closed = [d for d in await day_partitions(pool) if d.upper <= cutoffs[2]]
    sources = [DEFAULT_PARTITION]
    for day in closed:
        if await _close_day(pool, day, cutoffs, max(0, straggler_limit), report) == _STAYS:
            sources.append(day.runs)  # too many stragglers: its expired rows one by one
    # a tenant with a shorter window than the deployment's, everywhere; every other
    # tenant in the default partition and in the closed days left
    groups: list[tuple[str, float, str]] = []
    for tenant, seconds in own:
        for source in (["runs"] if seconds < policy.default or seconds < ONE_DAY_S
                       else sources):
            groups.append((tenant, seconds, source))
    for source in (["runs"] if policy.default < ONE_DAY_S else sources):
        groups += [(tenant, policy.default, source) for tenant in await _tenants(pool, source)
                   if tenant not in policy.tenants]
    for who, seconds, source in groups:
        sql = delete_sql(_ONE, source)
        cutoff = report.now - timedelta(seconds=seconds)
        while max_batches is None or report.batches < max_batches:
            async with pool.acquire() as conn, conn.transaction():
                runs, attempts, effects = await conn.fetchrow(
                    sql, who, cutoff, max(1, batch), list(FINAL_EFFECT_STATES))
            report.batches += 1
            report.runs += runs
            report.attempts += attempts
            report.effects += effects
            if runs < batch:
                break
    return report
