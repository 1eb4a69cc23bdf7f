"""The API's own request and response models (camelCase): the bodies of writes and what they
answer, and the preview of a rule. A schedule's definition and the documents reads answer
(schedules, runs, workers) are the read side's, shared with the CLI
(``chronolog.queries.documents``); their limits come from the domain spec.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from chronolog.domain import limits as lim
from chronolog.domain import messages as m
from chronolog.queries.documents import DEFINITION_EXAMPLE, CamelModel, ScheduleDefinition

__all__ = [
    "MAX_SCHEDULE_ID",
    "SCHEDULE_EXAMPLE",
    "BackfillIn",
    "CancelIn",
    "InstantOut",
    "PauseIn",
    "PreviewOut",
    "ReconcileIn",
    "RevisedOut",
    "RunCreated",
    "RunWritten",
    "ScheduleCreated",
    "ScheduleIn",
    "ScheduleStateOut",
    "ScheduleWritten",
    "TriggerIn",
]

MAX_SCHEDULE_ID = 200  # characters of a schedule ID (its pattern bounds nothing)


# =======================================================================================
# requests


# the body the API documentation shows (``DEFINITION_EXAMPLE`` with its ID)
SCHEDULE_EXAMPLE = {"scheduleId": "nightly-report", **DEFINITION_EXAMPLE}


class ScheduleIn(ScheduleDefinition):
    """``POST /v1/schedules``."""

    model_config = ConfigDict(json_schema_extra={"examples": [SCHEDULE_EXAMPLE]})

    schedule_id: str = Field(min_length=1, max_length=MAX_SCHEDULE_ID,
                             pattern=lim.SCHEDULE_ID_PATTERN)


class TriggerIn(CamelModel):
    params: m.Params | None = None


class CancelIn(CamelModel):
    reason: str = Field(default="", max_length=1000)


class PauseIn(CamelModel):
    """``POST /v1/schedules/{id}:pause`` (optional body): why, recorded with the pause."""

    reason: str = Field(default="", max_length=1000)


class ReconcileIn(CamelModel):
    decision: Literal["delivered", "retry", "abandon"]
    note: str = Field(default="", max_length=2000)
    effect_id: str | None = Field(default=None, max_length=200)


# =======================================================================================
# write responses


class CalendarWritten(CamelModel):
    name: str
    revision: int


class CalendarRemoved(CalendarWritten):
    deleted: bool = Field(default=True, description="the calendar is deleted (at "
                          "``revision``)")


class ScheduleWritten(CamelModel):
    schedule_id: str
    revision: int
    next_run_at: datetime | None


class ScheduleCreated(ScheduleWritten):
    warnings: list[str] | None = Field(
        default=None, description="present when the schedule was created but may not run as "
        "meant, e.g. no worker of its resource class has ever served its job type")


class ScheduleStateOut(ScheduleWritten):
    state: Literal["ACTIVE", "PAUSED", "COMPLETED", "DELETED"]


class RevisedOut(CamelModel):
    revision: int
    next_run_at: datetime | None


class RunCreated(CamelModel):
    run_id: str
    trace_id: str = Field(description="the run's OpenTelemetry trace ID (docs/tracing.md)")
    state: str | None = Field(description=(
        "the run's state; null only for a run that finished before this deployment "
        "recorded how (GET /v1/runs/{runId} tells)"))


class BackfillIn(CamelModel):
    """A past range of the schedule's rule to run: every instant in [from, to)."""

    start: m.Instant = Field(alias="from", description="the first instant that may run "
                             "(inclusive), ISO-8601 with an offset or Z")
    end: m.Instant = Field(alias="to", description="the end of the range (exclusive), not "
                           "after now")
    overlap: Literal["buffer_all", "allow"] = Field(
        default="buffer_all", description="buffer_all: its runs one after another, oldest "
        "first; allow: side by side (workers and fair dispatch permitting)")


class RunWritten(CamelModel):
    run_id: str
    state: str
    outcome: str | None = None
    attempt: int | None = None


# =======================================================================================
# preview


class InstantOut(CamelModel):
    utc: str
    local: str
    dst: Literal["shifted", "repeated", "skipped"] | None = Field(
        None, description="what daylight saving time did to a fixed-time cron instant, in "
        "the words of the dashboard and `chronolog preview`: `shifted` (its wall time does "
        "not exist that day: moved to the end of the gap), `repeated` (its wall time "
        "happens twice that day), `skipped` (left out by the DST policy: never runs); null "
        "when unmarked")
    note: str | None = Field(None, description="why the instant is marked (null when not)")


class PreviewOut(CamelModel):
    instants: list[InstantOut] = Field(description="the next `count` instants the rule "
                                       "fires at")
    skipped: list[InstantOut] = Field(description="the instants daylight saving time left "
                                      "out between the first and the last of `instants` "
                                      "(each marked `skipped`: they never run)")
