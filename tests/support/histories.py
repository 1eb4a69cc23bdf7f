"""Run histories as event envelopes, with event times chosen by the test (the retention
tests: a run's finish time is what its window is measured from).

``schedule(tenant, sid, at)`` creates a schedule; ``run_history(tenant, sid, run_id, outcome,
start, finish)`` is the events of one run from its materialization at ``start`` to
``outcome`` at ``finish``: ``succeeded`` (claimed, result published, an effect delivered),
``dead``, ``cancelled``, ``skipped`` (finished), or ``ready`` / ``leased`` (live: never
finished). A claimed run's attempt 1 failed and was retried (unless ``retried=False``): its
attempt 2 is the one that ends it, so both homes of an attempt are written — the run's row
(attempt 1) and a row of ``attempts`` (attempt 2, in its run's day). ``tick(tenant, sid,
at)`` is an event that only moves the log's time on.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.port import OutRecord

FINISHED = ("succeeded", "dead", "cancelled", "skipped")
LIVE = ("ready", "leased")
SPEC = {"every": "1s", "job": {"type": "echo"}}


def _env(tenant: str, sid: str, at: datetime, n: int, payload: Any, tag: str) -> m.EventEnvelope:
    return m.EventEnvelope(event_id=f"e-{tag}-{n}", type=payload.type, key=f"{tenant}/{sid}",
                           tenant=tenant, schedule_id=sid, at=at, payload=payload)


def schedule(tenant: str, sid: str, at: datetime) -> m.EventEnvelope:
    return _env(tenant, sid, at, 0, m.ScheduleCreated(
        revision=1, spec=m.ScheduleSpec.model_validate(SPEC), created_at=at, anchor=at,
        next_run_at=at, next_due_at=at), f"{tenant}-{sid}")


def tick(tenant: str, sid: str, at: datetime) -> m.EventEnvelope:
    return _env(tenant, sid, at, 0, m.NextRunPlanned(next_run_at=at, next_due_at=at),
                f"tick-{tenant}-{sid}-{at.timestamp()}")


def run_history(tenant: str, sid: str, run_id: str, outcome: str, start: datetime,
                finish: datetime, uri: str | None = None,
                retried: bool = True) -> list[m.EventEnvelope]:
    """The events of one run (module docstring); ``uri``: a succeeded run's result object."""
    out: list[Any] = []

    def add(at: datetime, payload: Any) -> None:
        out.append(_env(tenant, sid, at, len(out), payload, run_id))

    if outcome == "skipped":
        add(finish, m.OccurrenceSkipped(run_id=run_id, scheduled_at=start, reason="overlap",
                                        revision=1))
        return out
    add(start, m.OccurrenceMaterialized(
        run_id=run_id, scheduled_at=start, due_at=start, revision=1, job=m.JobSpec(type="echo"),
        state="READY", sequence=1, advances_schedule=False))
    if outcome == "ready":
        return out
    first, failed, claimed = (start + (finish - start) * k for k in (0.25, 0.375, 0.5))
    n = 2 if retried else 1  # the last attempt
    if retried:
        add(first, m.AttemptClaimed(run_id=run_id, attempt=1, fence=1, worker_id="w",
                                    claimed_at=first, lease_until=first + timedelta(hours=1)))
        add(failed, m.AttemptFailed(run_id=run_id, attempt=1, fence=1, worker_id="w",
                                    error_class="transient", message="once"))
        add(failed, m.RetryScheduled(run_id=run_id, attempt=2, retry_at=failed))
        add(failed, m.OccurrenceReady(run_id=run_id, attempt=2))
    add(claimed, m.AttemptClaimed(run_id=run_id, attempt=n, fence=n, worker_id="w",
                                  claimed_at=claimed, lease_until=claimed + timedelta(hours=1)))
    if outcome == "leased":
        return out
    if outcome == "succeeded":
        add(finish, m.ResultPublished(run_id=run_id, attempt=n, fence=n, worker_id="w",
                                      checksum="sha256:0", size=1,
                                      uri=uri or f"results:{run_id}/a{n}-f{n}-0000000000000000",
                                      finished_at=finish))
        add(finish, m.EffectIntended(effect_id=f"fx-{run_id}", run_id=run_id, kind="webhook",
                                     checksum="sha256:0"))
        add(finish, m.EffectSucceeded(effect_id=f"fx-{run_id}", run_id=run_id, evidence={}))
    elif outcome == "dead":
        add(finish, m.OccurrenceDeadLettered(run_id=run_id, reason="permanent_error"))
    elif outcome == "cancelled":
        add(finish, m.OccurrenceCancelled(run_id=run_id, reason="test"))
    else:
        raise ValueError(outcome)
    return out


def records(topic: str, envelopes: list[m.EventEnvelope], partition: int = 0
            ) -> list[OutRecord]:
    return [OutRecord(topic, e.key.encode(), codec.encode_event(e), partition=partition)
            for e in envelopes]
