"""Workers on the read side: what readers ask of the directory the projector keeps.

The projector's ``WorkerDirectory`` (``chronolog.projections.workers``) folds the ``workers``
topic into ``workers`` (one row per worker) and ``served_job_types`` (every job type ever
announced per class). Readers (the API, the CLI, the live view, the metrics) derive from
those tables, with the database's clock, whether a worker is *live* (not stopped, last seen
within ``membership.LIVE_S``) and so why a READY run waits: ``waiting_reason`` when no live
worker of the run's resource class serves its job type. Nothing of this is an event.

The READY runs are read from ``ready_runs`` (what ``runs`` holds WHERE state = 'READY', with
its resource class, job type and when it became ready, kept by the projector in the same
transaction as the runs: docs/design.md §9), so ``runs`` needs no index of its own for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from chronolog.domain.membership import LIVE_S, waiting_reason

__all__ = [
    "WorkerRow",
    "ever_served",
    "jobs_in",
    "live_served",
    "live_workers_per_class",
    "served_types",
    "waiting_counts",
    "waiting_for",
    "waiting_runs",
    "workers_page",
]

_LIVE = f"(NOT w.stopped AND w.last_seen > now() - make_interval(secs => {LIVE_S}))"


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    classes: dict[str, dict[str, Any]]  # class -> {"jobTypes": [...], "slots": n}
    started_at: datetime
    last_seen: datetime
    stopped: bool
    live: bool


async def workers_page(pool: Any, *, after: str | None = None, limit: int = 100,
                       live: bool | None = None) -> list[WorkerRow]:
    """Workers by worker ID, after ``after``; ``live`` filters on liveness."""
    sql = f"SELECT w.*, {_LIVE} AS live FROM workers w WHERE true"
    args: list[Any] = []
    if after is not None:
        args.append(after)
        sql += f" AND w.worker_id > ${len(args)}"
    if live is not None:
        sql += f" AND {_LIVE} = {'true' if live else 'false'}"
    args.append(limit)
    sql += f" ORDER BY w.worker_id LIMIT ${len(args)}"
    return [WorkerRow(r["worker_id"], _obj(r["classes"]), r["started_at"], r["last_seen"],
                      r["stopped"], r["live"]) for r in await pool.fetch(sql, *args)]


async def live_served(pool: Any) -> frozenset[tuple[str, str]]:
    """(resource class, job type) pairs some live worker serves now."""
    rows = await pool.fetch(f"SELECT w.classes FROM workers w WHERE {_LIVE}")
    return frozenset((c, j) for r in rows for c, s in _obj(r["classes"]).items()
                     for j in s.get("jobTypes", ()))


def waiting_for(state: str, resource_class: str | None, job_type: str | None,
                served: frozenset[tuple[str, str]]) -> str | None:
    """A READY run no live worker of its class serves: why it waits (else None)."""
    if state != "READY" or (resource_class or "default", job_type or "") in served:
        return None
    return waiting_reason(job_type, resource_class)


async def live_workers_per_class(pool: Any) -> dict[str, int]:
    """Live workers per resource class."""
    return {r[0]: int(r[1]) for r in await pool.fetch(
        f"SELECT c.key, count(*) FROM workers w, jsonb_each(w.classes) AS c WHERE {_LIVE} "
        "GROUP BY 1")}


async def ever_served(pool: Any, resource_class: str, job_type: str) -> bool:
    """Whether any worker of ``resource_class`` has ever announced ``job_type``."""
    return bool(await pool.fetchval(
        "SELECT EXISTS (SELECT 1 FROM served_job_types WHERE resource_class = $1 "
        "AND job_type = $2)", resource_class, job_type))


async def served_types(pool: Any, resource_class: str) -> list[str]:
    """Every job type ever announced in ``resource_class``."""
    return [r[0] for r in await pool.fetch(
        "SELECT job_type FROM served_job_types WHERE resource_class = $1 ORDER BY 1",
        resource_class)]


async def waiting_counts(pool: Any) -> list[tuple[str, str, int]]:
    """(resource class, job type, READY runs no live worker serves), sorted. The READY runs
    are counted per (class, job type) first, so the cost does not grow with the workers."""
    served = await live_served(pool)
    return [(r[0], r[1], int(r[2])) for r in await pool.fetch(
        "SELECT resource_class, job_type, count(*) "
        "FROM ready_runs GROUP BY 1, 2 ORDER BY 1, 2")
        if (r[0], r[1]) not in served]


async def waiting_runs(pool: Any, limit: int = 10) -> list[tuple[str, str, str, str]]:
    """(tenant, schedule ID, run ID, reason) of the oldest READY runs that wait for a permit
    of their concurrency key or that no live worker serves."""
    unserved = await waiting_counts(pool)
    rows = await pool.fetch(
        "SELECT r.tenant, r.schedule_id, r.run_id, r.job_type, r.resource_class, "
        "r.permit_wait FROM ready_runs AS q JOIN runs AS r ON r.run_id = q.run_id "
        "WHERE r.permit_wait IS NOT NULL OR (q.resource_class, q.job_type) IN "
        "(SELECT * FROM unnest($1::text[], $2::text[])) "
        "ORDER BY q.ready_at, q.run_id LIMIT $3",
        [c for c, _, _ in unserved], [j for _, j, _ in unserved], limit)
    return [(r["tenant"], r["schedule_id"], r["run_id"],
             permit_reason(_obj(r["permit_wait"])) if r["permit_wait"] is not None
             else waiting_reason(r["job_type"], r["resource_class"])) for r in rows]


def permit_reason(permit: dict[str, Any]) -> str:
    """Why a READY run with ``permit_wait`` (its key and limit) waits."""
    return f"waiting for a permit of concurrency key '{permit['key']}' (limit {permit['limit']})"


def _obj(value: Any) -> dict[str, Any]:
    return orjson.loads(value) if isinstance(value, (str, bytes)) else dict(value or {})


def jobs_in(classes: dict[str, dict[str, Any]], allowed: Iterable[str] | None
            ) -> dict[str, dict[str, Any]]:
    """``classes`` with only the job types in ``allowed`` (None: all)."""
    if allowed is None:
        return classes
    keep = set(allowed)
    return {c: {**s, "jobTypes": [j for j in s.get("jobTypes", ()) if j in keep]}
            for c, s in classes.items()}
