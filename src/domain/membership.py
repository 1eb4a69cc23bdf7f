"""The membership record: a worker announcing itself on the ``workers`` topic.

Every worker writes one record every ``ANNOUNCE_INTERVAL_S`` seconds to the ``workers``
topic, keyed by its worker ID (on Kafka the topic is compacted: the newest record per worker
is kept), and a last one with ``stopping`` set when it leaves. The record names the resource
classes the worker serves, per class the job types it has handlers for and its slots, when
the worker started and when the record was sent.

Membership records are not events: no decision reads them. The projector folds them into the
``workers`` and ``served_job_types`` tables (``chronolog.projections.workers``), from which
the read side (``chronolog.queries.workers``) answers ``GET /v1/workers`` and explains why a
READY run waits: a worker is *live* while it has not said it is stopping and its last
record is at most ``LIVE_S`` seconds old.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

ANNOUNCE_INTERVAL_S = 2.0
# A worker whose last record is older than this is not live (several missed announcements:
# a paused or dead worker, or one cut off from the log).
LIVE_S = 10.0


class BadAnnouncement(ValueError):
    """A record on the workers topic that does not decode."""


@dataclass(frozen=True, slots=True)
class ClassService:
    """What a worker serves in one resource class."""

    job_types: tuple[str, ...]
    slots: int


@dataclass(frozen=True, slots=True)
class Announcement:
    worker_id: str
    classes: Mapping[str, ClassService]
    started_at: datetime
    sent_at: datetime
    stopping: bool = False

    def encode(self) -> bytes:
        return orjson.dumps({
            "worker_id": self.worker_id,
            "classes": {c: {"job_types": sorted(s.job_types), "slots": s.slots}
                        for c, s in sorted(self.classes.items())},
            "started_at": self.started_at, "sent_at": self.sent_at, "stopping": self.stopping,
        }, option=orjson.OPT_UTC_Z)

    @classmethod
    def decode(cls, value: bytes) -> Announcement:
        try:
            raw = orjson.loads(value)
            classes = {str(c): ClassService(tuple(sorted(str(j) for j in s["job_types"])),
                                            int(s["slots"]))
                       for c, s in dict(raw["classes"]).items()}
            out = cls(str(raw["worker_id"]), classes, _time(raw["started_at"]),
                      _time(raw["sent_at"]), bool(raw.get("stopping", False)))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadAnnouncement(f"not a membership record: {exc}") from None
        if not out.worker_id or not out.classes:
            raise BadAnnouncement("a membership record needs a worker_id and a class")
        return out


def announcement(worker_id: str, classes: Iterable[str], job_types: Iterable[str], slots: int,
                 started_at: datetime, now: datetime, *, stopping: bool = False) -> Announcement:
    """A worker serving the same ``job_types`` with ``slots`` in each of ``classes``, sent at
    ``now`` (the caller's clock: this module reads none)."""
    jobs = tuple(sorted(job_types))
    return Announcement(worker_id, {c: ClassService(jobs, slots) for c in classes}, started_at,
                        now, stopping)


def waiting_reason(job_type: str | None, resource_class: str | None) -> str:
    """Why a READY run waits when no live worker of its class serves its job type."""
    return (f"no worker serves job type '{job_type or ''}' in class "
            f"'{resource_class or 'default'}'")


def _time(value: object) -> datetime:
    t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
