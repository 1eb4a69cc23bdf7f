"""Garbage collection of staged result objects (``chronolog gc``).

The reference registry is the log itself: a staged object is *referenced* when a
ResultPublished event names its uri. ``collect`` folds the ``events`` topic into, per run,
the published uris and the fate of every claimed fence, then deletes a staged object only
when ALL of these hold:

1. no ResultPublished names it;
2. the attempt that staged it can never publish: its fence ``f`` was claimed for that run
   (AttemptClaimed in the log) and that claim is *closed* — a later claim of the run with a
   higher fence, LeaseExpired / AttemptFailed of fence ``f``, a ResultPublished, or the run
   ending (OccurrenceCancelled / OccurrenceDeadLettered);
3. it is older than the grace period (mtime).

Why this is safe against a publication in flight: the processor publishes a CompleteRun only
while the run is LEASED under the presented fence (``_current_lease`` in the decider), and a
closed claim never reopens — fences only grow and a run leaves LEASED for good under that
fence. All events of one schedule are in one partition, in order, so a ResultPublished for
fence ``f`` must precede the event that closed ``f``: if gc has read the closing event it has
also read any publication that could name the object. An object whose fence gc has not seen
claimed (gc's read raced the claim, or the object is a stranger) is kept — gc errs only on the
side of keeping. Nothing is deleted because of what gc *did not* read.

The grace period is belt and braces (and a window for people who want to look at a stale
attempt's output); safety does not depend on clocks.

**Result retention** (docs/design.md §7). With ``result_retention`` (tenant -> seconds: the
tenants file's ``result_retention``), a *published* object is removed too once its run
finished longer ago than its tenant's window: the run's finish is its ResultPublished's
``finished_at``, and "now" is the newest event time gc read in the log — the read model's
notion of now (chronolog.projections.retention), never the wall clock, so a deployment
stopped for a while loses nothing when gc runs before new events arrive. A published object
of a run inside its window is kept, whatever its age; the API answers a GET of an expired
run's result with 410 Gone naming ``result_retention``.

**Pruned history** (docs/design.md §20). gc reads the log as it is now: once a partition was
pruned, the events of its oldest runs are gone, and their objects would be "unknown to the
log" for ever. An object unknown to the log and staged before the oldest event every pruned
partition still holds belongs to that pruned history (its attempt's claim came before its
staging): its run finished longer ago than the log's window, which is never shorter than a
tenant's ``result_retention``, so it is removed (``pruned``), past the grace as well.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from chronolog.domain import codec
from chronolog.log.port import EventLog
from chronolog.log.reading import read_partition
from chronolog.workers.results import ResultStore, StagedObject

_CLOSING_ALL = ("OccurrenceCancelled", "OccurrenceDeadLettered")


@dataclass
class _RunRefs:
    claimed: set[int] = field(default_factory=set)  # every fence ever claimed for the run
    open_fence: int | None = None  # the fence of the current, still-open claim
    published: set[str] = field(default_factory=set)
    tenant: str = ""
    finished_at: datetime | None = None  # its ResultPublished's finish (None: not published)


@dataclass
class References:
    """What the log says about staged objects: published uris and claim fates per run."""

    runs: dict[str, _RunRefs] = field(default_factory=dict)
    events_read: int = 0
    newest: datetime | None = None  # the newest event time read: the read model's now
    # the oldest event time (ms) every pruned partition still holds (None: none pruned)
    pruned_before_ms: int | None = None

    def apply_envelope(self, env: dict[str, Any]) -> None:
        """An event as the log holds it: its envelope's time and tenant, then its payload."""
        at = env.get("at")
        if isinstance(at, str):
            t = datetime.fromisoformat(at)
            if self.newest is None or t > self.newest:
                self.newest = t
        payload = env.get("payload")
        if isinstance(payload, dict):
            self.apply(payload)
            run = self.runs.get(str(payload.get("run_id")))
            if run is not None and isinstance(env.get("tenant"), str):
                run.tenant = env["tenant"]

    def apply(self, ev: dict[str, Any]) -> None:
        t = ev.get("type")
        run_id = ev.get("run_id")
        if not isinstance(run_id, str):
            return
        if t == "AttemptClaimed":
            r = self.runs.setdefault(run_id, _RunRefs())
            r.claimed.add(int(ev["fence"]))
            r.open_fence = int(ev["fence"])
        elif t in ("LeaseExpired", "AttemptFailed"):
            r = self.runs.setdefault(run_id, _RunRefs())
            if r.open_fence == int(ev["fence"]):
                r.open_fence = None
        elif t == "ResultPublished":
            r = self.runs.setdefault(run_id, _RunRefs())
            if ev.get("uri"):
                r.published.add(str(ev["uri"]))
            if isinstance(ev.get("finished_at"), str):
                r.finished_at = datetime.fromisoformat(ev["finished_at"])
            r.open_fence = None
        elif t in _CLOSING_ALL:
            r = self.runs.setdefault(run_id, _RunRefs())
            r.open_fence = None

    def referenced(self, uri: str, run_id: str) -> bool:
        r = self.runs.get(run_id)
        return r is not None and uri in r.published

    def expired(self, uri: str, run_id: str, window: Callable[[str], float]) -> bool:
        """A published object whose run finished longer than its tenant's ``window``
        (seconds) before the newest event read."""
        r = self.runs.get(run_id)
        if r is None or uri not in r.published or r.finished_at is None or self.newest is None:
            return False
        return r.finished_at < self.newest - timedelta(seconds=window(r.tenant))

    def of_pruned_history(self, obj: StagedObject) -> bool:
        """An object of a run the log no longer holds: unknown to it, and staged before the
        oldest event a pruned partition still holds (module docstring)."""
        return (self.pruned_before_ms is not None and obj.run_id not in self.runs
                and obj.mtime * 1000 < self.pruned_before_ms)

    def can_never_publish(self, obj: StagedObject) -> bool:
        """True only when the log proves the staging attempt's claim is closed."""
        r = self.runs.get(obj.run_id)
        if r is None or obj.fence not in r.claimed:
            return False  # unknown to the log we read: keep
        return r.open_fence != obj.fence


async def fold_references(log_: EventLog) -> References:
    """Read every partition of ``events`` to its current end."""
    refs = References()
    topic = log_.topics.events
    for p in range(await log_.partitions_for(topic)):
        pruned = await log_.start_offset(topic, p) > 0
        async for recs in read_partition(log_, topic, p):
            if pruned:
                pruned = False
                first = recs[0].timestamp_ms
                refs.pruned_before_ms = min(first, refs.pruned_before_ms or first)
            for rec in recs:
                env = orjson.loads(rec.value)
                if isinstance(env, dict):
                    with contextlib.suppress(codec.DecodeError):  # not an event: no reference
                        refs.apply_envelope(codec.expand_event(env))
                refs.events_read += 1
    return refs


@dataclass
class GcReport:
    scanned: int = 0
    deleted: list[str] = field(default_factory=list)
    kept_referenced: int = 0
    kept_open: int = 0  # the attempt may still publish (or the log does not know it yet)
    kept_young: int = 0
    expired: int = 0  # published objects of runs past their result retention (deleted)
    pruned: int = 0  # objects of runs whose events were pruned from the log (deleted)
    events_read: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"scanned": self.scanned, "deleted": len(self.deleted),
                "kept_referenced": self.kept_referenced, "kept_open": self.kept_open,
                "kept_young": self.kept_young, "expired": self.expired,
                "pruned": self.pruned,
                "events_read": self.events_read,
                "deleted_uris": self.deleted}


async def collect(
    log_: EventLog, store: ResultStore, grace_s: float, dry_run: bool = False,
    now: float | None = None, result_retention: Callable[[str], float] | None = None,
) -> GcReport:
    """Delete unreferenced staged objects that can never be published and are old enough,
    and (with ``result_retention``: tenant -> seconds) published objects of runs finished
    longer ago than their tenant's window."""
    objects = await store.list()
    refs = await fold_references(log_)
    report = GcReport(scanned=len(objects), events_read=refs.events_read)
    wall = time.time() if now is None else now
    for obj in objects:
        if result_retention is not None and refs.expired(obj.uri, obj.run_id,
                                                         result_retention):
            if not dry_run:
                await store.delete(obj.uri)
            report.expired += 1
            report.deleted.append(obj.uri)
        elif refs.referenced(obj.uri, obj.run_id):
            report.kept_referenced += 1
        elif refs.of_pruned_history(obj) and wall - obj.mtime >= grace_s:
            if not dry_run:
                await store.delete(obj.uri)
            report.pruned += 1
            report.deleted.append(obj.uri)
        elif not refs.can_never_publish(obj):
            report.kept_open += 1
        elif wall - obj.mtime < grace_s:
            report.kept_young += 1
        else:
            if not dry_run:
                await store.delete(obj.uri)
            report.deleted.append(obj.uri)
    return report
