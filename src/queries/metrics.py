"""Prometheus metrics (names prefixed ``chronolog_``), read at scrape time.

Nothing here keeps its own counters on a hot path: a scrape reads the read model, the log's
end offsets and — when one runs in the same process — the projector's in-memory stats, and
renders them (``render(snapshot)``). The run metrics come from the counters the projector
keeps as it projects the events (``run_counters`` and ``ready_runs``, migration 0005; see
``chronolog.projections.store``): a scrape reads a handful of rows and never reads ``runs``.
The projector's own counters (``chronolog projector --metrics-port``) are
``chronolog.projections.metrics``. The families:

* ``chronolog_runs_finished_total`` (counter; tenant, resource_class, job_type, outcome):
  runs that reached an outcome — ``succeeded``, ``dead``, ``cancelled`` or ``skipped`` (a
  skipped instant, a collapsed range counting each instant it stands for); a redriven run
  counts again when it ends again;
* ``chronolog_runs_skipped_total`` (counter; tenant, resource_class, job_type, reason): the
  skipped instants by reason (an instant that never became a run has its schedule's labels);
* ``chronolog_run_start_lateness_seconds`` (histogram; tenant, resource_class; buckets 5 ms
  to 1 h): a run's first claim minus its due time (scheduled instant plus jitter), observed
  when it is claimed;
* ``chronolog_oldest_due_age_seconds`` (gauge; resource_class): how long the oldest READY
  run has been waiting for a worker;
* ``chronolog_runs_waiting_without_worker`` (gauge; resource_class, job_type): READY runs
  that no live worker of their class serves (``chronolog.queries.workers``);
  ``chronolog_workers_live`` (gauge; resource_class): live workers per class;
* ``chronolog_expired_leases`` (gauge): open attempts whose lease ended (database clock) and
  that the processor has not expired yet (``open_attempts``, migration 0011);
* ``chronolog_leases_expired_total`` (counter; tenant, resource_class, job_type): attempts
  the processor expired (LeaseExpired) — take ``rate()`` of it;
* ``chronolog_completions_rejected_total`` (counter; tenant, resource_class, job_type,
  reason): completions the processor rejected (CompletionRejected: ``stale_fence``,
  ``lease_expired``, ``not_leased``, ``checksum_conflict``), from the read model's counters;
* ``chronolog_effects_finished_total`` (counter; tenant, resource_class, job_type, outcome):
  effect outcomes — ``succeeded``, ``failed`` (a publication that failed for good),
  ``uncertain`` (delivery unknown: the run waits in RECONCILING);
* ``chronolog_fence_rejections_total`` (counter; reason): CompletionRejected events applied
  by *this process's* projector (the event changes no read-model row, so only a projector
  sees it: the API exposes it when it runs the projector in-process, ``chronolog projector
  --metrics-port`` always);
* ``chronolog_processor_rules`` (gauge; engine, tzdata): partitions whose newest event (as
  *this process's* projector saw it) was written by a processor computing with that
  recurrence engine and tz database (the events' ``rules`` header);
  ``chronolog_processor_rules_mismatch`` (gauge): 1 when there are several;
* ``chronolog_projection_lag_events`` (gauge; partition): records between the projection's
  stored offsets and the log's end (on Kafka a commit marker counts as one);
* ``chronolog_projection_lag_seconds`` (gauge): with an in-process projector, its last
  commit's delay behind the append time of the oldest record it applied; otherwise how long
  ago the projector last advanced a partition that still has unread records (0 caught up);
* ``chronolog_commands_total`` / ``chronolog_events_total`` (counters): records in the
  ``commands`` / ``events`` topics (sum of end offsets) — take ``rate()`` of them;
  ``chronolog_commands_per_second`` / ``chronolog_events_per_second`` (gauges): the same
  rate measured by this process between its last two scrapes (0 on the first);
* ``chronolog_schedules`` (gauge; tenant, state);
* ``chronolog_dead_letters_total`` (counter; consumer, topic): records a consumer skipped and
  dead-lettered (chronolog.log.dead_letters), one per record and consumer — read from the
  ``dlq`` topic, so every process's are counted (``chronolog dlq list`` shows them);
  ``chronolog_projector_dead_letters_total`` (counter; topic): the ones *this process's*
  projector wrote.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from chronolog.domain import codec
from chronolog.log.port import EventLog
from chronolog.log.reading import read_partition
from chronolog.projections.metrics import rules_families
from chronolog.projections.store import EVENT_COUNTERS, LATENESS_BUCKETS, bucket_label
from chronolog.queries.workers import live_served, live_workers_per_class

__all__ = ["LATENESS_BUCKETS", "MetricsSource", "Snapshot", "render"]


@dataclass
class Snapshot:
    """Everything one scrape renders."""

    # (tenant, resource class) -> cumulative count per bucket of LATENESS_BUCKETS, count, sum
    lateness: list[tuple[str, str, list[int], int, float]] = field(default_factory=list)
    # (tenant, resource class, job type, outcome | reason, count)
    finished: list[tuple[str, str, str, str, int]] = field(default_factory=list)
    skipped: list[tuple[str, str, str, str, int]] = field(default_factory=list)
    # EVENT_COUNTERS kind -> [(tenant, resource class, job type, label, count)]
    events: dict[str, list[tuple[str, str, str, str, int]]] = field(default_factory=dict)
    oldest_due: dict[str, float] = field(default_factory=dict)
    waiting_without_worker: list[tuple[str, str, int]] = field(default_factory=list)
    workers_live: dict[str, int] = field(default_factory=dict)
    expired_leases: int = 0
    fence_rejections: dict[str, int] | None = None  # None: no projector in this process
    # RulesVersion -> partitions whose newest event names it (None: no projector here)
    rules: dict[Any, list[int]] | None = None
    lag_events: dict[int, int] = field(default_factory=dict)
    lag_seconds: float = 0.0
    commands_total: int = 0
    events_total: int = 0
    commands_per_second: float = 0.0
    events_per_second: float = 0.0
    schedules: list[tuple[str, str, int]] = field(default_factory=list)
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)  # (consumer, topic)
    projector: dict[str, Any] | None = None


class MetricsSource:
    """Reads a ``Snapshot`` from the read model, the log and an optional projector."""

    def __init__(self, pool: asyncpg.Pool, log_: EventLog | None, projection: str = "main",
                 projector: Any = None) -> None:
        self.pool = pool
        self.log = log_
        self.projection = projection
        self.projector = projector
        self._last: tuple[float, int, int] | None = None
        # the dlq topic, read on from where the previous scrape stopped
        self._dlq_next: dict[int, int] = {}
        self._dlq_keys: set[bytes] = set()
        self._dlq_counts: dict[tuple[str, str], int] = {}

    async def snapshot(self) -> Snapshot:
        s = Snapshot()
        async with self.pool.acquire() as conn:
            counters = await conn.fetch(
                "SELECT metric, tenant, resource_class, job_type, label, sum(value)::bigint "
                "FROM run_counters GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5")
            _run_counters(s, counters)
            ready = [(r[2], r[3], int(r[5])) for r in counters if r[0] == "ready" and r[5] > 0]
            classes = sorted({rc for rc, _, _ in ready})
            if classes:  # the oldest READY run of each class: one index probe each
                for r in await conn.fetch(
                    "SELECT c, EXTRACT(EPOCH FROM (now() - (SELECT min(ready_at) FROM "
                    "ready_runs WHERE resource_class = c)))::float8 "
                    "FROM unnest($1::text[]) AS c", classes
                ):
                    if r[1] is not None:
                        s.oldest_due[r[0]] = max(0.0, r[1])
            served = await live_served(conn)
            s.waiting_without_worker = [(rc, job, n) for rc, job, n in ready
                                        if (rc, job) not in served]
            s.workers_live = await live_workers_per_class(conn)
            s.expired_leases = await conn.fetchval(
                "SELECT count(*) FROM open_attempts WHERE lease_until < now()")
            s.schedules = [(r[0], r[1], int(r[2])) for r in await conn.fetch(
                "SELECT tenant, state, count(*) FROM schedules GROUP BY 1, 2 ORDER BY 1, 2")]
            offsets = await conn.fetch(
                "SELECT topic, partition, next_offset, "
                "EXTRACT(EPOCH FROM (now() - updated_at))::float8 AS idle "
                "FROM projection_offsets WHERE projection = $1", self.projection)
        if self.log is not None:
            topics = self.log.topics
            stored = {r["partition"]: (r["next_offset"], r["idle"]) for r in offsets
                      if r["topic"] == topics.events}
            n_events = await self.log.partitions_for(topics.events)
            n_commands = await self.log.partitions_for(topics.commands)
            stalled = 0.0
            for p in range(n_events):
                end = await self.log.end_offset(topics.events, p)
                s.events_total += end
                nxt, idle = stored.get(p, (0, 0.0))
                s.lag_events[p] = max(0, end - nxt)
                if end - nxt > 1:  # > 1: a Kafka commit marker alone is not lag
                    stalled = max(stalled, idle)
            for p in range(n_commands):
                s.commands_total += await self.log.end_offset(topics.commands, p)
            s.lag_seconds = stalled
            now = time.monotonic()
            if self._last is not None and now > self._last[0]:
                dt = now - self._last[0]
                s.commands_per_second = max(0, s.commands_total - self._last[1]) / dt
                s.events_per_second = max(0, s.events_total - self._last[2]) / dt
            self._last = (now, s.commands_total, s.events_total)
            s.dead_letters = await self._dead_letters()
        if self.projector is not None:
            st = self.projector.stats
            s.fence_rejections = dict(st.completion_rejections)
            s.rules = st.rules_in_use()
            s.lag_seconds = st.last_delay_s
        return s


    async def _dead_letters(self) -> dict[tuple[str, str], int]:
        """Dead letters per (consumer, topic), one per key (a letter written again after a
        crash counts once)."""
        assert self.log is not None
        topic = self.log.topics.dlq
        for p in range(await self.log.partitions_for(topic)):
            async for recs in read_partition(self.log, topic, p, self._dlq_next.get(p, 0)):
                for rec in recs:
                    if rec.key is not None and rec.key in self._dlq_keys:
                        continue
                    try:
                        dl = codec.decode_dead_letter(rec.value)
                    except ValueError:
                        continue
                    if rec.key is not None:
                        self._dlq_keys.add(rec.key)
                    consumer = dl.consumer.split(":")[0]  # client:<id> -> client
                    k = (consumer, dl.source_topic or self.log.topics.commands)
                    self._dlq_counts[k] = self._dlq_counts.get(k, 0) + 1
                self._dlq_next[p] = recs[-1].offset + 1
        return dict(self._dlq_counts)


def _run_counters(s: Snapshot, rows: list[asyncpg.Record]) -> None:
    """The run counters of ``run_counters`` (summed over shards, sorted) into ``s``."""
    labels = [bucket_label(b) for b in LATENESS_BUCKETS]
    buckets: dict[tuple[str, str], dict[str, int]] = {}
    sums: dict[tuple[str, str], int] = {}
    for metric, tenant, rc, job, label, value in rows:
        if metric == "finished":
            s.finished.append((tenant, rc, job, label, int(value)))
        elif metric == "skipped":
            s.skipped.append((tenant, rc, job, label, int(value)))
        elif metric == "lateness":
            buckets.setdefault((tenant, rc), {})[label] = int(value)
        elif metric == "lateness_sum":
            sums[(tenant, rc)] = int(value)
        elif metric in EVENT_COUNTERS:
            s.events.setdefault(metric, []).append((tenant, rc, job, label, int(value)))
    for key in sorted(buckets):
        counts, running = [], 0
        for label in labels:
            running += buckets[key].get(label, 0)
            counts.append(running)
        total = running + buckets[key].get("+Inf", 0)
        s.lateness.append((*key, counts, total, sums.get(key, 0) / 1_000_000))


class _SnapshotCollector(Collector):
    def __init__(self, s: Snapshot) -> None:
        self.s = s

    def collect(self) -> Iterator[Metric]:
        s = self.s
        f = CounterMetricFamily(
            "chronolog_runs_finished", "Runs that reached an outcome "
            "(succeeded, dead, cancelled, skipped)",
            labels=["tenant", "resource_class", "job_type", "outcome"])
        for tenant, rc, job, outcome, n in s.finished:
            f.add_metric([tenant, rc, job, outcome], n)
        yield f
        k = CounterMetricFamily("chronolog_runs_skipped", "Skipped instants, by reason",
                                labels=["tenant", "resource_class", "job_type", "reason"])
        for tenant, rc, job, reason, n in s.skipped:
            k.add_metric([tenant, rc, job, reason], n)
        yield k
        h = HistogramMetricFamily(
            "chronolog_run_start_lateness_seconds",
            "A run's first claim minus its due time (observed when it is claimed)",
            labels=["tenant", "resource_class"])
        for tenant, rc, counts, total, total_s in s.lateness:
            buckets = [(bucket_label(b), float(c))
                       for b, c in zip(LATENESS_BUCKETS, counts, strict=True)]
            buckets.append(("+Inf", float(total)))
            h.add_metric([tenant, rc], buckets, total_s)
        yield h
        g = GaugeMetricFamily("chronolog_oldest_due_age_seconds",
                              "Age of the oldest READY run waiting for a worker",
                              labels=["resource_class"])
        for rc, age in sorted(s.oldest_due.items()):
            g.add_metric([rc], age)
        yield g
        w = GaugeMetricFamily("chronolog_runs_waiting_without_worker",
                              "READY runs no live worker of their resource class serves",
                              labels=["resource_class", "job_type"])
        for rc, job, n in s.waiting_without_worker:
            w.add_metric([rc, job], n)
        yield w
        lw = GaugeMetricFamily("chronolog_workers_live", "Live workers, by resource class",
                               labels=["resource_class"])
        for rc, n in sorted(s.workers_live.items()):
            lw.add_metric([rc], n)
        yield lw
        yield GaugeMetricFamily("chronolog_expired_leases",
                                "Open attempts whose lease has ended", value=s.expired_leases)
        e = CounterMetricFamily("chronolog_leases_expired", "Attempts the processor expired "
                                "(LeaseExpired)", labels=["tenant", "resource_class", "job_type"])
        for tenant, rc, job, _, n in s.events.get("lease_expired", []):
            e.add_metric([tenant, rc, job], n)
        yield e
        cr = CounterMetricFamily("chronolog_completions_rejected", "Completions the processor "
                                 "rejected (CompletionRejected), by reason",
                                 labels=["tenant", "resource_class", "job_type", "reason"])
        for tenant, rc, job, reason, n in s.events.get("rejected", []):
            cr.add_metric([tenant, rc, job, reason], n)
        yield cr
        o = CounterMetricFamily("chronolog_effects_finished", "Effect outcomes recorded: "
                                "succeeded, failed (publication failed for good), uncertain "
                                "(delivery unknown: reconciliation)",
                                labels=["tenant", "resource_class", "job_type", "outcome"])
        for tenant, rc, job, outcome, n in s.events.get("effect", []):
            o.add_metric([tenant, rc, job, outcome], n)
        yield o
        if s.fence_rejections is not None:
            f = CounterMetricFamily("chronolog_fence_rejections",
                                    "Completions rejected, by reason (in-process projector)",
                                    labels=["reason"])
            for r, n in sorted(s.fence_rejections.items()):
                f.add_metric([r], n)
            yield f
        if s.rules is not None:
            yield from rules_families(s.rules)
        lag = GaugeMetricFamily("chronolog_projection_lag_events",
                                "Records of events not yet projected", labels=["partition"])
        for p, n in sorted(s.lag_events.items()):
            lag.add_metric([str(p)], n)
        yield lag
        yield GaugeMetricFamily("chronolog_projection_lag_seconds",
                                "How far the projection is behind, in seconds",
                                value=s.lag_seconds)
        yield CounterMetricFamily("chronolog_commands", "Records in the commands topic",
                                  value=s.commands_total)
        yield CounterMetricFamily("chronolog_events", "Records in the events topic",
                                  value=s.events_total)
        yield GaugeMetricFamily("chronolog_commands_per_second",
                                "Commands per second since the previous scrape",
                                value=s.commands_per_second)
        yield GaugeMetricFamily("chronolog_events_per_second",
                                "Events per second since the previous scrape",
                                value=s.events_per_second)
        sc = GaugeMetricFamily("chronolog_schedules", "Schedules by state",
                               labels=["tenant", "state"])
        for tenant, state, n in s.schedules:
            sc.add_metric([tenant, state], n)
        yield sc
        d = CounterMetricFamily("chronolog_dead_letters",
                                "Records consumers dead-lettered and skipped",
                                labels=["consumer", "topic"])
        for (consumer, topic), n in sorted(s.dead_letters.items()):
            d.add_metric([consumer, topic], n)
        yield d


def render(snapshot: Snapshot) -> bytes:
    """The Prometheus text exposition of a snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot))
    return generate_latest(registry)


def utc_now() -> datetime:
    return datetime.now(UTC)
