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
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, get_args

import asyncpg
import orjson

from chronolog.commands.backlog import plan_due
from chronolog.commands.state import policy_for
from chronolog.domain import limits as lim
from chronolog.domain import messages as m
from chronolog.domain.recurrence import compile_trigger, jitter_offset, resolve_zone, upcoming
from chronolog.projections import workers as wk
from chronolog.projections.documents import (
    AttemptOut,
    EffectOut,
    PreviewItem,
    ResultOut,
    ResumeItem,
    ResumePlan,
    RunItem,
    RunOut,
    RunPage,
    ScheduleOut,
    WatermarkOut,
    WorkerClassOut,
    WorkerOut,
    WorkerPage,
    definition_of,
    iso,
    jsonable,
)

__all__ = [
    "MAX_PAGE", "PREVIEW_COUNT", "RUN_STATES", "InvalidQuery", "ReadModel", "RunCursor",
    "decode_run_cursor", "decode_worker_cursor", "parse_run_states", "preview",
    "run_document", "runs_page", "schedule_document", "schedule_summary", "watermark",
    "worker_out", "workers_page",
]

PREVIEW_COUNT = 5
MAX_PAGE = 500
RESUME_ITEMS_SHOWN = 200
RUN_STATES: tuple[str, ...] = get_args(m.RunState)


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

    async def offsets(self) -> tuple[dict[int, int], datetime | None]:
        rows = await self.pool.fetch(
            "SELECT partition, next_offset, last_event_at FROM projection_offsets "
            "WHERE projection = $1 AND topic = $2", self.projection, self.topic)
        times = [r["last_event_at"] for r in rows if r["last_event_at"] is not None]
        return {r["partition"]: r["next_offset"] for r in rows}, (max(times) if times else None)

    async def schedule(self, tenant: str, schedule_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT * FROM schedules WHERE tenant = $1 AND schedule_id = $2", tenant, schedule_id)

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
        return await self.pool.fetchrow(
            "SELECT * FROM runs WHERE run_id = $1 AND tenant = $2", run_id, tenant)

    async def attempts(self, run_id: str) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            "SELECT * FROM attempts WHERE run_id = $1 ORDER BY attempt", run_id)

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
               "finished_at, job_type, resource_class FROM runs "
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
        dst_ambiguous=spec.dst.ambiguous, dst_nonexistent=spec.dst.nonexistent,
    )


def preview(row: asyncpg.Record, count: int = PREVIEW_COUNT) -> list[PreviewItem]:
    """An ACTIVE schedule's next ``count`` instants from its ``nextRunAt``, with the
    deterministic jitter the processor applies (none for another state)."""
    if row["state"] != "ACTIVE" or row["next_run_at"] is None:
        return []
    spec = _stored_spec(row)
    first: datetime = row["next_run_at"]
    instants = [first]
    trigger = _recurrence(row, spec, first)
    if trigger is not None:
        instants += upcoming(trigger, first, count - 1)
    zone = resolve_zone(spec.timezone)
    out = []
    for t in instants[:count]:
        due = t + timedelta(seconds=jitter_offset(row["schedule_id"], t, spec.jitter)) \
            if spec.jitter > 0 else t
        out.append(PreviewItem(scheduled_at=t, due_at=due,
                               local=t.astimezone(zone).isoformat(timespec="seconds")))
    return out


def resume_plan(row: asyncpg.Record, runs_so_far: int, now: datetime) -> ResumePlan:
    """What a resume at ``now`` would run or skip: the decider's own plan (``plan_due``)
    for the paused schedule's next instant, its policy and the runs it already had."""
    first: datetime | None = row["next_run_at"]
    if first is None:
        return ResumePlan(as_of=now, instants=[])
    spec = _stored_spec(row)
    pol = policy_for(spec)
    plan = plan_due(row["schedule_id"], pol, _recurrence(row, spec, first), first, now, "paused")
    items: list[ResumeItem] = []
    for p in plan.within_count(runs_so_far, spec.max_count):
        last = items[-1] if items else None
        if (last is not None and not p.runs and last.action == "skip"
                and last.reason == p.reason):
            last.through, last.count = p.instant, last.count + 1
            continue
        items.append(ResumeItem(scheduled_at=p.instant, action="run" if p.runs else "skip",
                                reason=p.reason))
    return ResumePlan(as_of=now, instants=items[:RESUME_ITEMS_SHOWN],
                      truncated=len(items) > RESUME_ITEMS_SHOWN, more_due=plan.later)


async def schedule_document(rm: ReadModel, row: asyncpg.Record, now: datetime
                            ) -> dict[str, Any]:
    """The body of ``GET /v1/schedules/{id}`` for a schedules row; ``now`` is when a resume
    is supposed to happen."""
    resume = None
    if row["state"] == "PAUSED":
        runs = await rm.runs_so_far(row["tenant"], row["schedule_id"])
        resume = resume_plan(row, runs, now)
    out = ScheduleOut(
        schedule_id=row["schedule_id"], state=row["state"], revision=row["revision"],
        next_run_at=row["next_run_at"], next_due_at=row["next_due_at"],
        created_at=row["created_at"], updated_at=row["updated_at"],
        paused_at=row["paused_at"], pause_reason=row["pause_reason"],
        deleted_at=row["deleted_at"], completed_at=row["completed_at"],
        completed_reason=row["completed_reason"], definition=definition_of(row["spec"]),
        preview=preview(row), resume=resume,
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
            "definition": definition_of(row["spec"]).model_dump(mode="json", by_alias=True,
                                                                exclude_none=True)}


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
        items=[RunItem(run_id=r["run_id"], schedule_id=r["schedule_id"],
                       scheduled_at=r["scheduled_at"], state=r["state"],
                       attempt=r["attempt"], started_at=r["started_at"],
                       finished_at=r["finished_at"],
                       waiting=wk.waiting_for(r["state"], r["resource_class"],
                                              r["job_type"], served)) for r in rows],
        next_cursor=next_cursor, watermark=watermark(offsets, wm_time, partitions),
    )


def _json(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return orjson.loads(value)
    return value


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
        waiting = wk.waiting_for(r["state"], r["resource_class"], r["job_type"],
                                 await wk.live_served(rm.pool))
    result = None
    if r["result_checksum"] is not None:
        result = ResultOut(checksum=r["result_checksum"], size=r["result_size"] or 0,
                           uri=r["result_uri"], attempt=r["result_attempt"],
                           inline=_json(r["result_inline"]) if r["result_uri"] is None else None)
    out = RunOut(
        run_id=r["run_id"], schedule_id=r["schedule_id"], revision=r["revision"],
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
