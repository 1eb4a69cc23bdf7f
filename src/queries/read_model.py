"""The read model's queries and their documents: what ``GET`` answers in the HTTP API and what
``chronolog schedule show|list``, ``runs``, ``run`` and ``workers list`` print (the same
function serves both, so ``--json`` prints exactly what the API answers).

Every query is tenant-scoped (workers excepted: they serve every tenant).

History paging: a schedule's runs are listed newest first by ``(scheduledAt, runId)``. The
first page fixes an upper bound (the newest key then); ``nextCursor`` encodes that bound and
the last key returned, and each next page is strictly below the last key and at or below the
bound. Keys are immutable and unique, so runs created while a client pages (above the bound)
never shift a page: nothing is skipped or repeated. The cursor also pins the schedule and the
``state`` filter (``InvalidQuery`` on a mismatch). Workers page by worker ID; their cursor
pins the ``live`` filter.

Tenant-wide lists (``GET /v1/schedules``, ``/v1/runs``, ``/v1/dlq``):

* schedules by ID ascending, in code-point order (``COLLATE "C"``, whatever the database's
  collation), each page strictly after the last ID returned. IDs are unique and never
  change, so paging skips or repeats nothing; a schedule created meanwhile shows up on a
  later page when its ID sorts after the page being read. ``prefix`` is a literal ID prefix
  (``%`` and ``_`` are plain characters). The default ``state`` filter leaves DELETED out.
* runs of every schedule of the tenant, newest first by ``(scheduledAt, runId)`` with the
  same upper bound as a schedule's runs (the tenant's newest key when the first page was
  read), filtered by ``state``, ``jobType``, ``scheduleId`` and ``[from, to)`` on
  ``scheduledAt``;
* dead letters oldest first by ``(at, dlq partition, dlq offset)``, unique and immutable,
  each page strictly after the last one returned; a tenant's only (those naming it), or
  every one for an operator.

Each cursor pins its query's filters (another query's cursor is ``InvalidQuery`` on
``after``), and is checked — kind, shape, types, no NUL, IDs of the right pattern — before
anything of it is sent to the database.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, get_args

import orjson

from chronolog.commands.backlog import plan_due
from chronolog.commands.state import policy_for
from chronolog.domain import codec
from chronolog.domain import limits as lim
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.domain.recurrence import (
    RecurrenceError,
    compile_trigger,
    dst_marks,
    jitter_offset,
    parse_instant,
    resolve_zone,
    upcoming,
)
from chronolog.log.partitioner import partition_for
from chronolog.log.reading import read_partition
from chronolog.queries import workers as wk
from chronolog.queries.documents import (
    AttemptOut,
    DeadLetterItem,
    DeadLetterPage,
    DeadLetterWatermark,
    EffectOut,
    PreviewItem,
    ResultOut,
    ResumeItem,
    ResumePlan,
    RunItem,
    RunListItem,
    RunListPage,
    RunOut,
    RunPage,
    ScheduleOut,
    WatermarkOut,
    WorkerClassOut,
    WorkerOut,
    WorkerPage,
    definition_document,
    definition_of,
    iso,
    jsonable,
)
from chronolog.queries.exclusions import (
    Calendars,
    calendar_specs,
    excluded,
    exclusion_out,
    mark_excluded,
)
from chronolog.telemetry.ids import run_trace_id

if TYPE_CHECKING:  # only annotations: the CLI uses the queries' parsing without asyncpg
    import asyncpg

__all__ = [
    "HISTORY_SCAN", "LIST_PAGE", "MAX_PAGE", "OUTCOME_STATES", "PREVIEW_COUNT", "RUN_STATES",
    "SCHEDULES_LISTED", "SCHEDULE_STATES", "InvalidQuery", "LetterCursor", "LetterQuery",
    "ReadModel", "RunCursor", "RunListCursor", "RunQuery", "ScheduleQuery", "dead_letters_page",
    "decode_letter_cursor", "decode_run_cursor", "decode_run_list_cursor",
    "decode_schedule_cursor", "decode_worker_cursor", "instants_with_dst", "last_results",
    "occurrences", "parse_list_instant", "parse_run_states", "parse_schedule_states", "preview",
    "recent_outcomes", "result_expired", "run_document", "run_list_page", "runs_page",
    "schedule_calendars", "schedule_document", "schedule_history", "schedule_rows",
    "schedule_summary", "schedules_page", "watermark",
    "worker_out", "workers_page",
]

PREVIEW_COUNT = 5
MAX_PAGE = 500
LIST_PAGE = 100  # the default page of the tenant-wide lists
RESUME_ITEMS_SHOWN = 200
RUN_STATES: tuple[str, ...] = get_args(m.RunState)
SCHEDULE_STATES: tuple[str, ...] = ("ACTIVE", "PAUSED", "COMPLETED", "DELETED")
SCHEDULES_LISTED: tuple[str, ...] = ("ACTIVE", "COMPLETED", "PAUSED")  # without a filter


# a run's start lateness in milliseconds, computed as it is read (it was a stored generated
# column until migration 0010, with this expression)
LATENESS_MS = ("(EXTRACT(EPOCH FROM (started_at - COALESCE(due_at, scheduled_at))) * 1000)"
               "::bigint")


class InvalidQuery(ValueError):
    """A query parameter the read model refuses (a 400 in the API, a usage error in the
    CLI); ``field`` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


# =======================================================================================
# the queries


class ReadModel:
    """The queries on the PostgreSQL read model; every one is tenant-scoped."""

    def __init__(self, pool: asyncpg.Pool, topic: str, projection: str = "main") -> None:
        self.pool = pool
        self.topic = topic
        self.projection = projection

    async def offsets(self, topic: str | None = None
                      ) -> tuple[dict[int, int], datetime | None]:
        """The projection's next offset per partition of ``events`` (or of ``topic``) and
        the authority time of its last event."""
        rows = await self.pool.fetch(
            "SELECT partition, next_offset, last_event_at FROM projection_offsets "
            "WHERE projection = $1 AND topic = $2", self.projection, topic or self.topic)
        times = [r["last_event_at"] for r in rows if r["last_event_at"] is not None]
        return {r["partition"]: r["next_offset"] for r in rows}, (max(times) if times else None)

    async def schedule(self, tenant: str, schedule_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT * FROM schedules WHERE tenant = $1 AND schedule_id = $2", tenant, schedule_id)

    async def calendars(self, tenant: str, names: Sequence[str]) -> Calendars:
        """The tenant's calendars of these names with their current specs (None: deleted);
        a name never created is absent."""
        if not names:
            return {}
        rows = await self.pool.fetch(
            "SELECT name, spec FROM calendars WHERE tenant = $1 AND name = ANY($2::text[])",
            tenant, list(names))
        return calendar_specs(rows)

    async def schedules(self, tenant: str, state: str | None, limit: int) -> list[asyncpg.Record]:
        """The tenant's schedules by ID, optionally only those in ``state``."""
        sql = "SELECT * FROM schedules WHERE tenant = $1"
        params: list[Any] = [tenant]
        if state:
            params.append(state)
            sql += " AND state = $2"
        params.append(limit)
        sql += f" ORDER BY schedule_id LIMIT ${len(params)}"
        return list(await self.pool.fetch(sql, *params))

    async def runs_so_far(self, tenant: str, schedule_id: str) -> int:
        """How many scheduled runs the schedule has had (its last sequence number)."""
        n = await self.pool.fetchval(
            "SELECT max(sequence) FROM runs WHERE tenant = $1 AND schedule_id = $2",
            tenant, schedule_id)
        return int(n or 0)

    async def run(self, tenant: str, run_id: str) -> asyncpg.Record | None:
        """The run's row with its start lateness (``lateness_ms``: its first claim versus its
        intended start, due_at else scheduled_at; NULL before a claim)."""
        return await self.pool.fetchrow(
            f"SELECT *, {LATENESS_MS} AS lateness_ms FROM runs "
            "WHERE run_id = $1 AND tenant = $2", run_id, tenant)

    async def attempts(self, run_id: str) -> list[asyncpg.Record]:
        """The run's attempts in order: its attempt 1 from the columns of its run row, the
        later ones from ``attempts`` (migration 0012; an attempt 1 written before it is a row
        of ``attempts`` too, its run row's columns empty)."""
        return await self.pool.fetch(
            "SELECT 1 AS attempt, first_fence AS fence, first_worker_id AS worker_id, "
            "started_at AS claimed_at, first_lease_until AS lease_until, "
            "first_outcome AS outcome, first_error_class AS error_class, "
            "first_error AS error, first_finished_at AS finished_at "
            "FROM runs WHERE run_id = $1 AND first_fence IS NOT NULL "
            "UNION ALL "
            "SELECT attempt, fence, worker_id, claimed_at, lease_until, outcome, error_class, "
            "error, finished_at FROM attempts WHERE run_id = $1 ORDER BY attempt", run_id)

    async def effects(self, run_id: str) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            "SELECT * FROM effects WHERE run_id = $1 ORDER BY created_at, effect_id", run_id)

    async def newest_run_key(self, tenant: str, schedule_id: str) -> tuple[datetime, str] | None:
        row = await self.pool.fetchrow(
            "SELECT scheduled_at, run_id FROM runs WHERE tenant = $1 AND schedule_id = $2 "
            "ORDER BY scheduled_at DESC, run_id DESC LIMIT 1", tenant, schedule_id)
        return None if row is None else (row["scheduled_at"], row["run_id"])

    async def runs_page(
        self, tenant: str, schedule_id: str, bound: tuple[datetime, str],
        last: tuple[datetime, str] | None, states: list[str] | None, limit: int,
    ) -> list[asyncpg.Record]:
        sql = ("SELECT run_id, schedule_id, scheduled_at, state, attempt, started_at, "
               "finished_at, job_type, resource_class, permit_wait, skipped_reason, exclusion "
               "FROM runs "
               "WHERE tenant = $1 AND schedule_id = $2 "
               "AND (scheduled_at, run_id) <= ($3, $4)")
        args: list[Any] = [tenant, schedule_id, bound[0], bound[1]]
        if last is not None:
            sql += " AND (scheduled_at, run_id) < ($5, $6)"
            args += [last[0], last[1]]
        if states:
            args.append(states)
            sql += f" AND state = ANY(${len(args)}::text[])"
        args.append(limit)
        sql += f" ORDER BY scheduled_at DESC, run_id DESC LIMIT ${len(args)}"
        return await self.pool.fetch(sql, *args)


    async def schedule_list(self, tenant: str, q: ScheduleQuery, after: str | None,
                            limit: int) -> list[asyncpg.Record]:
        """The tenant's schedules matching ``q`` with an ID after ``after``, by ID in
        code-point order."""
        sql = "SELECT * FROM schedules WHERE tenant = $1 AND state = ANY($2::text[])"
        args: list[Any] = [tenant, list(q.states)]
        if q.job_type is not None:
            args.append(q.job_type)
            sql += f" AND spec->'job'->>'type' = ${len(args)}"
        if q.resource_class is not None:
            args.append(q.resource_class)
            sql += f" AND COALESCE(spec->>'resource_class', 'default') = ${len(args)}"
        if q.prefix is not None:  # the range lets the index find it; starts_with decides
            args.append(q.prefix)
            n = len(args)
            sql += f' AND schedule_id COLLATE "C" >= ${n} AND starts_with(schedule_id, ${n})'
            args.append(q.prefix[:-1] + chr(ord(q.prefix[-1]) + 1))
            sql += f' AND schedule_id COLLATE "C" < ${len(args)}'
        if after is not None:
            args.append(after)
            sql += f' AND schedule_id COLLATE "C" > ${len(args)}'
        args.append(limit)
        sql += f' ORDER BY schedule_id COLLATE "C" LIMIT ${len(args)}'
        return list(await self.pool.fetch(sql, *args))

    async def newest_tenant_run_key(self, tenant: str) -> tuple[datetime, str] | None:
        row = await self.pool.fetchrow(
            "SELECT scheduled_at, run_id FROM runs WHERE tenant = $1 "
            "ORDER BY scheduled_at DESC, run_id DESC LIMIT 1", tenant)
        return None if row is None else (row["scheduled_at"], row["run_id"])

    async def run_list(self, tenant: str, q: RunQuery, bound: tuple[datetime, str],
                       last: tuple[datetime, str] | None, limit: int) -> list[asyncpg.Record]:
        """The tenant's runs matching ``q``, at or below ``bound``, below ``last``, newest
        first."""
        sql = ("SELECT run_id, schedule_id, scheduled_at, state, attempt, started_at, "
               "finished_at, job_type, resource_class, permit_wait, skipped_reason, exclusion "
               "FROM runs "
               "WHERE tenant = $1 AND (scheduled_at, run_id) <= ($2, $3)")
        args: list[Any] = [tenant, bound[0], bound[1]]
        if last is not None:
            args += [last[0], last[1]]
            sql += f" AND (scheduled_at, run_id) < (${len(args) - 1}, ${len(args)})"
        for column, value in (("schedule_id", q.schedule_id), ("job_type", q.job_type)):
            if value is not None:
                args.append(value)
                sql += f" AND {column} = ${len(args)}"
        if q.states:
            args.append(list(q.states))
            sql += f" AND state = ANY(${len(args)}::text[])"
        if q.since is not None:
            args.append(q.since)
            sql += f" AND scheduled_at >= ${len(args)}"
        if q.until is not None:
            args.append(q.until)
            sql += f" AND scheduled_at < ${len(args)}"
        args.append(limit)
        sql += f" ORDER BY scheduled_at DESC, run_id DESC LIMIT ${len(args)}"
        return list(await self.pool.fetch(sql, *args))

    async def letter_list(self, q: LetterQuery, after: tuple[datetime, int, int] | None,
                          limit: int) -> list[asyncpg.Record]:
        """Dead letters matching ``q`` after ``after``, oldest first."""
        sql = "SELECT * FROM dead_letters WHERE true"
        args: list[Any] = []
        if q.tenant is not None:
            args.append(q.tenant)
            sql += f" AND tenant = ${len(args)}"
        if q.consumer is not None:
            if q.consumer.endswith("*"):
                args.append(q.consumer[:-1])
                sql += f" AND starts_with(consumer, ${len(args)})"
            else:
                args.append(q.consumer)
                sql += f" AND consumer = ${len(args)}"
        if after is not None:
            args += list(after)
            n = len(args)
            sql += (f" AND (dead_lettered_at, dlq_partition, dlq_offset) > "
                    f"(${n - 2}, ${n - 1}, ${n})")
        args.append(limit)
        sql += f" ORDER BY dead_lettered_at, dlq_partition, dlq_offset LIMIT ${len(args)}"
        return list(await self.pool.fetch(sql, *args))


def watermark(offsets: dict[int, int], time: datetime | None, partitions: int) -> WatermarkOut:
    """How far the projection got: every partition of ``events`` (``partitions`` of them;
    0 when unknown: the ones projected)."""
    parts = {str(p): offsets.get(p, 0) for p in range(partitions)}
    parts.update({str(p): n for p, n in sorted(offsets.items()) if p >= partitions})
    return WatermarkOut(partitions=parts, time=time)


# =======================================================================================
# schedules


def _stored_spec(row: asyncpg.Record) -> m.ScheduleSpec:
    return m.ScheduleSpec.model_validate(orjson.loads(row["spec"]), context=m.STORED)


def _recurrence(row: asyncpg.Record, spec: m.ScheduleSpec, first: datetime) -> Any:
    """The recurrence of a stored cron / every schedule (None for at / delay)."""
    if spec.cron is None and spec.every is None:
        return None
    return compile_trigger(
        cron=spec.cron, every=spec.every, timezone=spec.timezone,
        anchor=row["anchor"] or spec.anchor or first, start=spec.start, end=spec.end,
        dst_ambiguous=spec.dst.ambiguous, dst_nonexistent=spec.dst.nonexistent, recorded=True,
    )


async def live_rules(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    """Every tenant's live (ACTIVE or PAUSED) schedules with their rule — the trigger part
    of the definition and the anchor the processor compiles it at — by tenant and ID
    (``chronolog rules snapshot``)."""
    rows = await pool.fetch(
        "SELECT tenant, schedule_id, state, spec, anchor, created_at FROM schedules "
        "WHERE state IN ('ACTIVE', 'PAUSED') ORDER BY tenant, schedule_id")
    out = []
    for row in rows:
        spec = _stored_spec(row)
        anchor = row["anchor"] or spec.anchor or row["created_at"]
        out.append({
            "tenant": row["tenant"], "scheduleId": row["schedule_id"], "state": row["state"],
            "rule": {
                "cron": spec.cron, "every": spec.every, "delay": spec.delay,
                "at": _iso_or_none(spec.at), "timezone": spec.timezone,
                "anchor": _iso_or_none(anchor), "start": _iso_or_none(spec.start),
                "end": _iso_or_none(spec.end),
                "dst": {"ambiguous": spec.dst.ambiguous, "nonexistent": spec.dst.nonexistent},
            },
        })
    return out


def _iso_or_none(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def preview(row: asyncpg.Record, count: int = PREVIEW_COUNT,
            calendars: Calendars | None = None) -> list[PreviewItem]:
    """An ACTIVE schedule's next ``count`` instants from its ``nextRunAt``, with the
    deterministic jitter the processor applies (none for another state), each marked
    ``excluded`` when one of the calendars the schedule names excludes it (``calendars``:
    the tenant's as :meth:`ReadModel.calendars` reads them; None: not marked)."""
    if row["state"] != "ACTIVE" or row["next_run_at"] is None:
        return []
    spec = _stored_spec(row)
    first: datetime = row["next_run_at"]
    instants = [first]
    trigger = _recurrence(row, spec, first)
    if trigger is not None:
        instants += upcoming(trigger, first, count - 1)
    zone = resolve_zone(spec.timezone)
    instants = instants[:count]
    marks = mark_excluded(spec.exclude if calendars is not None else (), calendars or {},
                          instants)
    out = []
    for t, mark in zip(instants, marks, strict=True):
        due = t + timedelta(seconds=jitter_offset(row["schedule_id"], t, spec.jitter)) \
            if spec.jitter > 0 else t
        out.append(PreviewItem(scheduled_at=t, due_at=due,
                               local=t.astimezone(zone).isoformat(timespec="seconds"),
                               excluded=mark))
    return out


async def schedule_calendars(rm: ReadModel, *rows: asyncpg.Record) -> Calendars:
    """The calendars these schedules rows (of one tenant) name (``exclude``), as the read
    model holds them now, in one query (none when no row with an instant to preview names
    one)."""
    names: dict[str, None] = {}
    for row in rows:
        if row["state"] in ("ACTIVE", "PAUSED") and row["next_run_at"] is not None:
            names.update(dict.fromkeys(_stored_spec(row).exclude))
    return await rm.calendars(rows[0]["tenant"], list(names)) if names else {}


def resume_plan(row: asyncpg.Record, runs_so_far: int, now: datetime,
                calendars: Calendars | None = None) -> ResumePlan:
    """What a resume at ``now`` would run or skip: the decider's own plan (``plan_due``)
    for the paused schedule's next instant, its policy and the runs it already had — an
    instant a calendar the schedule names excludes (``calendars``, as read now) is skipped,
    reason ``excluded``, whatever the misfire policy would do with it, as the decider does."""
    first: datetime | None = row["next_run_at"]
    if first is None:
        return ResumePlan(as_of=now, instants=[])
    spec = _stored_spec(row)
    pol = policy_for(spec)
    plan = plan_due(row["schedule_id"], pol, _recurrence(row, spec, first), first, now, "paused")
    items: list[ResumeItem] = []
    for p in plan.within_count(runs_so_far, spec.max_count):
        x = excluded(spec.exclude, calendars or {}, p.instant) if spec.exclude else None
        runs = p.runs and x is None
        reason = "excluded" if x is not None else p.reason
        last = items[-1] if items else None
        if (last is not None and not runs and last.action == "skip"
                and last.reason == reason and last.excluded == x):
            last.through, last.count = p.instant, last.count + 1
            continue
        items.append(ResumeItem(scheduled_at=p.instant, action="run" if runs else "skip",
                                reason=reason, excluded=x))
    return ResumePlan(as_of=now, instants=items[:RESUME_ITEMS_SHOWN],
                      truncated=len(items) > RESUME_ITEMS_SHOWN, more_due=plan.later)


async def schedule_document(rm: ReadModel, row: asyncpg.Record, now: datetime,
                            calendars: Calendars | None = None) -> dict[str, Any]:
    """The body of ``GET /v1/schedules/{id}`` for a schedules row; ``now`` is when a resume
    is supposed to happen. Its ``preview`` marks the instants the schedule's calendars
    exclude (``calendars``: those :func:`schedule_calendars` reads, read when not given)."""
    if calendars is None:
        calendars = await schedule_calendars(rm, row)
    resume = None
    if row["state"] == "PAUSED":
        runs = await rm.runs_so_far(row["tenant"], row["schedule_id"])
        resume = resume_plan(row, runs, now, calendars)
    out = ScheduleOut(
        schedule_id=row["schedule_id"], state=row["state"], revision=row["revision"],
        next_run_at=row["next_run_at"], next_due_at=row["next_due_at"],
        created_at=row["created_at"], updated_at=row["updated_at"],
        paused_at=row["paused_at"], pause_reason=row["pause_reason"],
        deleted_at=row["deleted_at"], completed_at=row["completed_at"],
        completed_reason=row["completed_reason"], definition=definition_of(row["spec"]),
        preview=preview(row, calendars=calendars), resume=resume,
    )
    content = out.model_dump(mode="json", by_alias=True)
    content["definition"] = out.definition.model_dump(mode="json", by_alias=True,
                                                      exclude_none=True)
    return content


def schedule_summary(row: asyncpg.Record) -> dict[str, Any]:
    """A schedule in a list: ``{scheduleId, state, revision, nextRunAt, nextDueAt,
    createdAt, updatedAt, definition}``."""
    return {"scheduleId": row["schedule_id"], "state": row["state"],
            "revision": row["revision"], "nextRunAt": iso(row["next_run_at"]),
            "nextDueAt": iso(row["next_due_at"]), "createdAt": iso(row["created_at"]),
            "updatedAt": iso(row["updated_at"]),
            "definition": definition_document(row["spec"])}


# =======================================================================================
# runs


def parse_run_states(text: str | None) -> list[str] | None:
    """``"ready, dead"`` -> ``["DEAD", "READY"]`` (None: no filter)."""
    if not text:
        return None
    states = sorted({s.strip().upper() for s in text.split(",") if s.strip()})
    if not states or any(s not in RUN_STATES for s in states):
        raise InvalidQuery(f"invalid state '{text}': expected {', '.join(RUN_STATES)}", "state")
    return states


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")


def _unb64(text: str) -> Any:
    return orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def _not_a_cursor(text: str) -> InvalidQuery:
    return InvalidQuery(f"invalid after '{text[:40]}': not a cursor of this API", "after")


def _another_query() -> InvalidQuery:
    return InvalidQuery("invalid after: the cursor belongs to another query", "after")


@dataclass(frozen=True)
class RunCursor:
    """Where a page of a schedule's runs continues: below ``last``, at or below ``bound``."""

    schedule_id: str
    states: list[str] | None
    bound: tuple[datetime, str]
    last: tuple[datetime, str]

    def encode(self) -> str:
        return _b64({"s": self.schedule_id,
                     "f": ",".join(self.states) if self.states else None,
                     "b": [self.bound[0].isoformat(), self.bound[1]],
                     "l": [self.last[0].isoformat(), self.last[1]]})


def decode_run_cursor(text: str, schedule_id: str, states: list[str] | None) -> RunCursor:
    """The cursor of a runs page made for the same schedule and ``state`` filter."""
    try:
        raw = _unb64(text)
        if not isinstance(raw, dict) or lim.text_violation(raw) is not None:
            raise ValueError  # a forged cursor: nothing of it reaches the database
        bound = (datetime.fromisoformat(raw["b"][0]), str(raw["b"][1]))
        last = (datetime.fromisoformat(raw["l"][0]), str(raw["l"][1]))
        if bound[0].tzinfo is None or last[0].tzinfo is None:
            raise ValueError
    except (binascii.Error, orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        raise _not_a_cursor(text) from None
    if raw.get("s") != schedule_id or raw.get("f") != (",".join(states) if states else None):
        raise _another_query()
    return RunCursor(schedule_id, states, bound, last)


async def runs_page(rm: ReadModel, tenant: str, schedule_id: str, *, states: list[str] | None,
                    after: RunCursor | None, limit: int, partitions: int) -> RunPage:
    """A page of a schedule's runs, newest first (the schedule is known to exist);
    ``partitions`` of ``events`` are shown in the watermark."""
    offsets, wm_time = await rm.offsets()  # read before the rows: a lower bound
    if after is not None:
        bound: tuple[datetime, str] | None = after.bound
        last: tuple[datetime, str] | None = after.last
    else:
        bound, last = await rm.newest_run_key(tenant, schedule_id), None
    rows = [] if bound is None else await rm.runs_page(
        tenant, schedule_id, bound, last, states, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more and bound is not None:
        tail = rows[-1]
        next_cursor = RunCursor(schedule_id, states, bound,
                                (tail["scheduled_at"], tail["run_id"])).encode()
    served = await wk.live_served(rm.pool) if any(
        r["state"] == "READY" for r in rows) else frozenset()
    return RunPage(
        items=[RunItem(run_id=r["run_id"], trace_id=run_trace_id(r["run_id"]),
                       schedule_id=r["schedule_id"],
                       scheduled_at=r["scheduled_at"], state=r["state"],
                       attempt=r["attempt"], started_at=r["started_at"],
                       finished_at=r["finished_at"],
                       waiting=_waiting(r, served),
                       exclusion=exclusion_out(r["state"], r["skipped_reason"],
                                               r["exclusion"])) for r in rows],
        next_cursor=next_cursor, watermark=watermark(offsets, wm_time, partitions),
    )


# =======================================================================================
# tenant-wide lists


def _pinned(raw: dict[str, Any], kind: str, pinned: dict[str, Any]) -> None:
    """``InvalidQuery`` on ``after`` unless a decoded cursor is of ``kind`` and made for
    the filters ``pinned``."""
    if raw.get("k") != kind or raw.get("f") != pinned:
        raise _another_query()


def _cursor_dict(text: str) -> dict[str, Any]:
    """A cursor's decoded data: a JSON object without NUL (else ``InvalidQuery``)."""
    try:
        raw = _unb64(text)
    except (binascii.Error, orjson.JSONDecodeError, ValueError):
        raw = None
    if not isinstance(raw, dict) or lim.text_violation(raw) is not None:
        raise _not_a_cursor(text)
    return raw


def _key(value: Any, id_pattern: re.Pattern[str], max_len: int) -> tuple[datetime, str]:
    """A ``[iso instant with offset, id]`` pair of a cursor (``ValueError`` else)."""
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], str) and len(value[1]) <= max_len
            and id_pattern.match(value[1])):
        raise ValueError
    t = datetime.fromisoformat(value[0])
    if t.tzinfo is None:
        raise ValueError
    return t, value[1]


_SCHEDULE_ID = re.compile(lim.SCHEDULE_ID_PATTERN)
_RUN_ID = re.compile(lim.RUN_ID_PATTERN)
_ID_CHARACTERS = re.compile(r"^[A-Za-z0-9_.:@-]*$")  # every character a schedule ID may have
_SCHEDULE_ID_MAX = 200


def parse_schedule_states(text: str | None) -> tuple[str, ...]:
    """``"paused, active"`` -> ``("ACTIVE", "PAUSED")``; nothing: every state but DELETED."""
    if not text:
        return SCHEDULES_LISTED
    states = sorted({s.strip().upper() for s in text.split(",") if s.strip()})
    if not states or any(s not in SCHEDULE_STATES for s in states):
        raise InvalidQuery(f"invalid state '{text}': expected a comma-separated list of "
                           f"{', '.join(SCHEDULE_STATES)}", "state")
    return tuple(states)


def parse_list_instant(text: str, field: str) -> datetime:
    """An instant of a list filter: ISO-8601 with an offset or ``Z``, within the limits of
    every instant (``chronolog.domain.limits``); ``InvalidQuery`` naming ``field``."""
    why = "expected an ISO-8601 instant with an offset or Z, such as 2026-03-08T09:00:00Z"
    try:
        parsed = datetime.fromisoformat(text.strip()) if text.isascii() else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or parsed.utcoffset() is None:
        shown = text[:60].encode("unicode_escape").decode()
        raise InvalidQuery(f"invalid {field} '{shown}': {why}", field)
    try:
        return parse_instant(parsed, field=field)
    except RecurrenceError as exc:
        raise InvalidQuery(str(exc), field) from None


@dataclass(frozen=True)
class ScheduleQuery:
    """The filters of ``GET /v1/schedules``."""

    states: tuple[str, ...] = SCHEDULES_LISTED
    job_type: str | None = None
    resource_class: str | None = None
    prefix: str | None = None

    def pinned(self) -> dict[str, Any]:
        return {"s": ",".join(self.states), "j": self.job_type, "r": self.resource_class,
                "p": self.prefix}


def decode_schedule_cursor(text: str, q: ScheduleQuery) -> str:
    """The last schedule ID of a schedules page's cursor made for the same filters."""
    raw = _cursor_dict(text)
    last = raw.get("l")
    if not (isinstance(last, str) and 0 < len(last) <= _SCHEDULE_ID_MAX
            and _SCHEDULE_ID.match(last)):
        raise _not_a_cursor(text)
    _pinned(raw, "schedules", q.pinned())
    return last


async def schedules_page(rm: ReadModel, tenant: str, q: ScheduleQuery, *, after: str | None,
                         limit: int, partitions: int) -> dict[str, Any]:
    """A page of the tenant's schedules by ID (``SchedulePage``: each item is
    ``schedule_summary``)."""
    offsets, wm_time = await rm.offsets()  # read before the rows: a lower bound
    if q.prefix is not None and not _ID_CHARACTERS.match(q.prefix):
        rows: list[asyncpg.Record] = []  # a character no schedule ID has: nothing matches
    else:
        rows = await rm.schedule_list(tenant, q, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = _b64({"k": "schedules", "f": q.pinned(), "l": rows[-1]["schedule_id"]}) \
        if more else None
    return {"items": [schedule_summary(r) for r in rows], "nextCursor": cursor,
            "watermark": jsonable(watermark(offsets, wm_time, partitions))}


@dataclass(frozen=True)
class RunQuery:
    """The filters of ``GET /v1/runs``: ``since`` is ``from`` (inclusive), ``until`` is
    ``to`` (exclusive), on ``scheduledAt``."""

    states: tuple[str, ...] | None = None
    job_type: str | None = None
    schedule_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since > self.until:
            raise InvalidQuery(f"invalid from '{iso(self.since)}': after to "
                               f"'{iso(self.until)}'", "from")

    def pinned(self) -> dict[str, Any]:
        return {"s": ",".join(self.states) if self.states else None, "j": self.job_type,
                "i": self.schedule_id, "a": iso(self.since), "b": iso(self.until)}


@dataclass(frozen=True)
class RunListCursor:
    """Where a page of the tenant's runs continues: below ``last``, at or below ``bound``."""

    bound: tuple[datetime, str]
    last: tuple[datetime, str]

    def encode(self, q: RunQuery) -> str:
        return _b64({"k": "runs", "f": q.pinned(),
                     "b": [self.bound[0].isoformat(), self.bound[1]],
                     "l": [self.last[0].isoformat(), self.last[1]]})


def decode_run_list_cursor(text: str, q: RunQuery) -> RunListCursor:
    """The cursor of a tenant's runs page made for the same filters."""
    raw = _cursor_dict(text)
    try:
        bound = _key(raw.get("b"), _RUN_ID, 64)
        last = _key(raw.get("l"), _RUN_ID, 64)
    except (TypeError, ValueError):
        raise _not_a_cursor(text) from None
    _pinned(raw, "runs", q.pinned())
    return RunListCursor(bound, last)


async def run_list_page(rm: ReadModel, tenant: str, q: RunQuery, *,
                        after: RunListCursor | None, limit: int,
                        partitions: int) -> RunListPage:
    """A page of the tenant's runs, newest first."""
    offsets, wm_time = await rm.offsets()  # read before the rows: a lower bound
    if after is not None:
        bound: tuple[datetime, str] | None = after.bound
        last: tuple[datetime, str] | None = after.last
    else:
        bound, last = await rm.newest_tenant_run_key(tenant), None
    rows = [] if bound is None else await rm.run_list(tenant, q, bound, last, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = None
    if more and bound is not None:
        tail = rows[-1]
        cursor = RunListCursor(bound, (tail["scheduled_at"], tail["run_id"])).encode(q)
    served = await wk.live_served(rm.pool) if any(
        r["state"] == "READY" for r in rows) else frozenset()
    return RunListPage(
        items=[RunListItem(run_id=r["run_id"], trace_id=run_trace_id(r["run_id"]),
                           schedule_id=r["schedule_id"],
                           scheduled_at=r["scheduled_at"], state=r["state"],
                           attempt=r["attempt"], started_at=r["started_at"],
                           finished_at=r["finished_at"], job_type=r["job_type"],
                           waiting=_waiting(r, served),
                           exclusion=exclusion_out(r["state"], r["skipped_reason"],
                                                   r["exclusion"])) for r in rows],
        next_cursor=cursor, watermark=watermark(offsets, wm_time, partitions),
    )


@dataclass(frozen=True)
class LetterQuery:
    """The filters of ``GET /v1/dlq``: ``tenant`` None is an operator's view (every
    letter); ``consumer`` ending in ``*`` is a prefix."""

    tenant: str | None = None
    consumer: str | None = None

    def pinned(self) -> dict[str, Any]:
        return {"t": self.tenant, "c": self.consumer}


@dataclass(frozen=True)
class LetterCursor:
    """Where a page of dead letters continues: after ``(at, dlq partition, dlq offset)``."""

    at: datetime
    partition: int
    offset: int


def decode_letter_cursor(text: str, q: LetterQuery) -> LetterCursor:
    """The cursor of a dead-letters page made for the same view and filter."""
    raw = _cursor_dict(text)
    pos = raw.get("l")
    try:
        if not (isinstance(pos, list) and len(pos) == 3 and isinstance(pos[0], str)
                and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= lim.MAX_INT
                        for n in pos[1:])):
            raise ValueError
        at = datetime.fromisoformat(pos[0])
        if at.tzinfo is None or pos[1] > 2**31 - 1:
            raise ValueError
    except (TypeError, ValueError):
        raise _not_a_cursor(text) from None
    _pinned(raw, "dlq", q.pinned())
    return LetterCursor(at, pos[1], pos[2])


async def dead_letters_page(rm: ReadModel, q: LetterQuery, *, after: LetterCursor | None,
                            limit: int, dlq_topic: str, partitions: int) -> DeadLetterPage:
    """A page of dead letters, oldest first; ``partitions`` of the dlq topic are shown in
    the watermark."""
    offsets, _ = await rm.offsets(dlq_topic)  # read before the rows: a lower bound
    rows = await rm.letter_list(
        q, None if after is None else (after.at, after.partition, after.offset), limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = None
    if more:
        tail = rows[-1]
        cursor = _b64({"k": "dlq", "f": q.pinned(),
                       "l": [tail["dead_lettered_at"].isoformat(), tail["dlq_partition"],
                             tail["dlq_offset"]]})
    parts = {str(p): offsets.get(p, 0) for p in range(partitions)}
    parts.update({str(p): n for p, n in sorted(offsets.items()) if p >= partitions})
    return DeadLetterPage(
        items=[DeadLetterItem(consumer=r["consumer"], topic=r["source_topic"],
                              partition=r["source_partition"], offset=r["source_offset"],
                              tenant=r["tenant"], schedule_id=r["schedule_id"],
                              reason=r["reason"], error_class=r["error_class"],
                              command_id=r["command_id"], original=r["original"],
                              original_size=r["original_size"], at=r["dead_lettered_at"])
               for r in rows],
        next_cursor=cursor, watermark=DeadLetterWatermark(partitions=parts))


def _json(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return orjson.loads(value)
    return value


def result_expired(finished_at: datetime | None, now: datetime | None, window: float) -> bool:
    """A run's result is past its tenant's ``result_retention`` (``window`` seconds): it
    finished longer ago than that before the read model's now (the newest event projected,
    never the wall clock), so ``chronolog gc`` removes or has removed its object."""
    return (finished_at is not None and now is not None
            and finished_at < now - timedelta(seconds=window))


def _waiting(r: Any, served: frozenset[tuple[str, str]]) -> str | None:
    """Why a READY run waits: for a permit of its concurrency key, or for a live worker of
    its resource class that serves its job type (None: it does not, or is not READY)."""
    if r["state"] != "READY":
        return None
    permit = _json(r["permit_wait"])
    if permit:
        return wk.permit_reason(permit)
    return wk.waiting_for(r["state"], r["resource_class"], r["job_type"], served)


async def run_document(rm: ReadModel, tenant: str, run_id: str) -> dict[str, Any] | None:
    """The body of ``GET /v1/runs/{id}``: a run with its attempts, result and effects
    (None: no such run of the tenant)."""
    r = await rm.run(tenant, run_id)
    if r is None:
        return None
    attempts = await rm.attempts(run_id)
    effects = await rm.effects(run_id)
    waiting = None
    if r["state"] == "READY":
        waiting = _waiting(r, await wk.live_served(rm.pool))
    result = None
    if r["result_checksum"] is not None:
        result = ResultOut(checksum=r["result_checksum"], size=r["result_size"] or 0,
                           uri=r["result_uri"], attempt=r["result_attempt"],
                           inline=_json(r["result_inline"]) if r["result_uri"] is None else None)
    out = RunOut(
        run_id=r["run_id"], trace_id=run_trace_id(r["run_id"]), schedule_id=r["schedule_id"],
        revision=r["revision"],
        trigger=r["trigger"], request_key=r["request_key"], scheduled_at=r["scheduled_at"],
        due_at=r["due_at"], state=r["state"], attempt=r["attempt"], job_type=r["job_type"],
        params=_json(r["params"]), resource_class=r["resource_class"],
        priority=r["priority"], ready_at=r["ready_at"], retry_at=r["retry_at"],
        started_at=r["started_at"], finished_at=r["finished_at"],
        lateness_ms=r["lateness_ms"],
        attempts=[AttemptOut(attempt=a["attempt"], fence=a["fence"], worker_id=a["worker_id"],
                             claimed_at=a["claimed_at"], lease_until=a["lease_until"],
                             outcome=a["outcome"], error_class=a["error_class"],
                             error=a["error"], finished_at=a["finished_at"])
                  for a in attempts],
        result=result, skipped_reason=r["skipped_reason"],
        skipped_through=r["skipped_through"], skipped_count=r["skipped_count"],
        cancellation_requested=r["cancellation_requested"], cancel_reason=r["cancel_reason"],
        dead_reason=r["dead_reason"], dead_message=r["dead_message"],
        last_error_class=r["last_error_class"], last_error=r["last_error"],
        reconciliation=_json(r["reconciliation"]),
        reconciliation_resolution=_json(r["reconciliation_resolution"]),
        effects=[EffectOut(effect_id=e["effect_id"], kind=e["kind"], state=e["state"],
                           attempts=e["attempts"], evidence=_json(e["evidence"]),
                           created_at=e["created_at"], updated_at=e["updated_at"])
                 for e in effects],
        waiting=waiting,
        exclusion=exclusion_out(r["state"], r["skipped_reason"], r["exclusion"]),
    )
    doc: dict[str, Any] = jsonable(out)
    if result is not None:  # uri | inline: exactly one of them is shown
        doc["result"].pop("inline" if result.uri is not None else "uri")
    return doc


# =======================================================================================
# workers


def worker_out(w: wk.WorkerRow, allowed: Iterable[str] | None) -> WorkerOut:
    """A worker as shown; ``allowed`` limits the job types shown (a tenant's)."""
    classes = wk.jobs_in(w.classes, allowed)
    return WorkerOut(worker_id=w.worker_id, started_at=w.started_at, last_seen=w.last_seen,
                     live=w.live, stopped=w.stopped,
                     classes=[WorkerClassOut(resource_class=c, job_types=list(s["jobTypes"]),
                                             slots=int(s.get("slots", 0)))
                              for c, s in sorted(classes.items())])


def decode_worker_cursor(text: str, live: bool | None) -> str:
    """The last worker ID of a workers page's cursor made for the same ``live``."""
    try:
        raw = _unb64(text)
    except (binascii.Error, orjson.JSONDecodeError, ValueError):
        raw = None
    if not isinstance(raw, dict) or raw.get("k") != "workers" or not isinstance(
            raw.get("l"), str) or lim.text_violation(raw) is not None:
        raise _not_a_cursor(text)
    if raw.get("f") != live:
        raise _another_query()
    return str(raw["l"])


async def workers_page(pool: Any, *, after: str | None, limit: int, live: bool | None,
                       allowed: Iterable[str] | None) -> WorkerPage:
    """A page of workers by ID after the worker ``after``; ``allowed`` limits the job
    types shown (None: all of them)."""
    rows = await wk.workers_page(pool, after=after, limit=limit + 1, live=live)
    more = len(rows) > limit
    rows = rows[:limit]
    return WorkerPage(items=[worker_out(w, allowed) for w in rows],
                      next_cursor=_b64({"k": "workers", "l": rows[-1].worker_id, "f": live})
                      if more else None)


# =======================================================================================
# the web dashboard's views (chronolog.api.dashboard): the API's documents above, plus what
# a page shows beside them — recent outcomes, occurrences with their skip reasons, the next
# instants with their daylight-saving marks, a schedule's history from the log


OUTCOME_STATES: tuple[str, ...] = ("SUCCEEDED", "DEAD", "RECONCILING", "CANCELLED", "SKIPPED")
HISTORY_SCAN = 20_000  # records of a schedule's partition read back for its history


async def recent_outcomes(rm: ReadModel, tenant: str, schedule_ids: list[str],
                          since: datetime) -> dict[str, dict[str, int]]:
    """Per schedule, its runs scheduled at or after ``since`` counted by state (a
    collapsed skip range counts each instant it stands for)."""
    rows = await rm.pool.fetch(
        "SELECT schedule_id, state, sum(CASE WHEN state = 'SKIPPED' "
        "THEN GREATEST(skipped_count, 1) ELSE 1 END)::bigint AS n FROM runs "
        "WHERE tenant = $1 AND schedule_id = ANY($2::text[]) AND scheduled_at >= $3 "
        "GROUP BY 1, 2", tenant, schedule_ids, since)
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["schedule_id"], {})[r["state"]] = int(r["n"])
    return out


async def last_results(rm: ReadModel, tenant: str, schedule_ids: list[str]
                       ) -> dict[str, dict[str, Any]]:
    """Per schedule, its newest run that reached an outcome: ``{runId, state,
    scheduledAt, finishedAt}``."""
    rows = await rm.pool.fetch(
        "SELECT s.id AS schedule_id, r.run_id, r.state, r.scheduled_at, r.finished_at "
        "FROM unnest($2::text[]) AS s(id) CROSS JOIN LATERAL ("
        " SELECT run_id, state, scheduled_at, finished_at FROM runs "
        " WHERE tenant = $1 AND schedule_id = s.id AND state = ANY($3::text[]) "
        " ORDER BY scheduled_at DESC, run_id DESC LIMIT 1) AS r",
        tenant, schedule_ids, list(OUTCOME_STATES))
    return {r["schedule_id"]: {"runId": r["run_id"], "state": r["state"],
                               "scheduledAt": iso(r["scheduled_at"]),
                               "finishedAt": iso(r["finished_at"])} for r in rows}


async def schedule_rows(rm: ReadModel, tenant: str, schedule_ids: list[str]
                        ) -> dict[str, asyncpg.Record]:
    """The tenant's schedules rows of these IDs."""
    rows = await rm.pool.fetch(
        "SELECT * FROM schedules WHERE tenant = $1 AND schedule_id = ANY($2::text[])",
        tenant, schedule_ids)
    return {r["schedule_id"]: r for r in rows}


async def occurrences(rm: ReadModel, tenant: str, schedule_id: str, limit: int = 60
                      ) -> list[dict[str, Any]]:
    """A schedule's newest ``limit`` occurrences, oldest first, with why a skipped one was
    skipped: ``{runId, scheduledAt, state, attempt, trigger, finishedAt, skippedReason,
    skippedThrough, skippedCount, exclusion}`` (``exclusion``: ``{calendar, revision,
    entry}`` of one skipped with reason ``excluded``, else None)."""
    rows = await rm.pool.fetch(
        "SELECT run_id, scheduled_at, state, attempt, trigger, finished_at, skipped_reason, "
        "skipped_through, skipped_count, exclusion FROM runs WHERE tenant = $1 "
        "AND schedule_id = $2 ORDER BY scheduled_at DESC, run_id DESC LIMIT $3",
        tenant, schedule_id, limit)
    out = []
    for r in reversed(rows):
        ex = exclusion_out(r["state"], r["skipped_reason"], r["exclusion"])
        out.append({"runId": r["run_id"], "scheduledAt": iso(r["scheduled_at"]),
                    "state": r["state"], "attempt": r["attempt"], "trigger": r["trigger"],
                    "finishedAt": iso(r["finished_at"]), "skippedReason": r["skipped_reason"],
                    "skippedThrough": iso(r["skipped_through"]),
                    "skippedCount": r["skipped_count"],
                    "exclusion": None if ex is None else jsonable(ex)})
    return out


def instants_with_dst(row: asyncpg.Record, count: int = 10,
                      calendars: Calendars | None = None) -> list[dict[str, Any]]:
    """An ACTIVE schedule's next ``count`` instants (``preview``) and where daylight saving
    time changed them, each ``{scheduledAt, dueAt, local, dst, note, excluded}``: ``dst``
    and ``note`` as :func:`chronolog.domain.recurrence.dst_marks` classifies them (a
    ``skipped`` one has no ``dueAt``: it never runs); ``excluded`` ``{calendar, entry}``
    when one of the schedule's ``calendars`` excludes it (None: not excluded, or
    ``calendars`` not given)."""
    items = preview(row, count, calendars)
    if not items:
        return []
    spec = _stored_spec(row)
    zone = resolve_zone(spec.timezone)
    due = {p.scheduled_at: p.due_at for p in items}
    excluded = {p.scheduled_at: p.excluded for p in items}
    marks = dst_marks(_recurrence(row, spec, items[0].scheduled_at),
                      [p.scheduled_at for p in items])
    out = []
    for mark in marks:
        gone = mark.mark == "skipped"  # left out by the DST policy: never an instant
        ex = None if gone else excluded.get(mark.at)
        out.append({"scheduledAt": iso(mark.at), "dueAt": None if gone else iso(due[mark.at]),
                    "local": mark.at.astimezone(zone).isoformat(timespec="seconds"),
                    "dst": mark.mark, "note": mark.note,
                    "excluded": None if ex is None else jsonable(ex)})
    return out


async def schedule_history(log: Any, topics: Any, tenant: str, schedule_id: str, *,
                           run_id: str | None = None, types: Iterable[str] | None = None,
                           scan: int = HISTORY_SCAN) -> tuple[list[dict[str, Any]], bool]:
    """A schedule's events from the log, oldest first (only those of ``run_id``, and of
    ``types``, when given), each ``{partition, offset, eventId, type, at, causationId,
    payload}``, and whether the scan reached back to offset 0 (False: only the partition's
    newest ``scan`` records were read). One schedule's events all live in one partition of
    ``events``: its records are picked by key, and by the bytes of the run ID or type,
    before anything is decoded."""
    if log is None:
        return [], False
    key = partition_key(tenant, schedule_id)
    wanted = frozenset(types) if types is not None else None
    marks = [f'"type":"{t}"'.encode() for t in wanted] if wanted is not None else None
    run_mark = run_id.encode() if run_id is not None else None
    n = await log.partitions_for(topics.events)
    p = partition_for(key.encode(), n)
    end = await log.end_offset(topics.events, p)
    start = max(0, end - scan)
    out: list[dict[str, Any]] = []
    async for recs in read_partition(log, topics.events, p, start, end):
        for rec in recs:
            if rec.key != key.encode():
                continue
            if run_mark is not None and run_mark not in rec.value:
                continue
            if marks is not None and not any(mk in rec.value for mk in marks):
                continue
            try:
                env = codec.decode_event(rec.value)
            except ValueError:
                continue
            if env.tenant != tenant or env.schedule_id != schedule_id or (
                    wanted is not None and env.type not in wanted):
                continue
            payload = env.payload.model_dump(mode="json")
            if run_id is not None and payload.get("run_id") != run_id:
                continue
            out.append({"partition": p, "offset": rec.offset, "eventId": env.event_id,
                        "type": env.type, "at": iso(env.at), "causationId": env.causation_id,
                        "payload": payload})
    return out, start == 0
