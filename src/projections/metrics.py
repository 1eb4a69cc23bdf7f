"""The projector's own Prometheus metrics, for ``chronolog projector --metrics-port``.

``ProjectorCollector(projector)`` renders, at scrape time, what the projector of this process
keeps in memory: the events it applied by type (``chronolog_projector_events_total``), its
batches and offset conflicts, the completions it saw rejected
(``chronolog_fence_rejections_total``), its last commit's delay
(``chronolog_projection_lag_seconds``), the rules versions of the partitions it read
(``chronolog_processor_rules``, ``rules_families``: the API's ``/metrics`` renders them too,
``chronolog.queries.metrics``) and the records it dead-lettered
(``chronolog_projector_dead_letters_total``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ProjectorCollector", "rules_families"]


def _projector_families(stats: Any) -> Iterator[Metric]:
    c = CounterMetricFamily("chronolog_projector_events", "Events applied by this projector",
                            labels=["type"])
    for t, n in sorted(stats.by_type.items()):
        c.add_metric([t], n)
    yield c
    yield CounterMetricFamily("chronolog_projector_batches", "Batches committed by this projector",
                              value=stats.batches)
    yield CounterMetricFamily("chronolog_projector_offset_conflicts",
                              "Batches discarded on an offset conflict", value=stats.conflicts)
    f = CounterMetricFamily("chronolog_fence_rejections", "Completions rejected (stale fence, "
                            "expired lease, ...) seen by this projector", labels=["reason"])
    for r, n in sorted(stats.completion_rejections.items()):
        f.add_metric([r], n)
    yield f
    yield GaugeMetricFamily("chronolog_projection_lag_seconds",
                            "Delay of the last commit behind the oldest record's append time",
                            value=stats.last_delay_s)
    yield from rules_families(stats.rules_in_use())


def rules_families(in_use: dict[Any, list[int]]) -> Iterator[Metric]:
    """The gauges of the rules versions in use (RulesVersion -> partitions naming it)."""
    r = GaugeMetricFamily("chronolog_processor_rules",
                          "Partitions whose newest event was computed with this recurrence "
                          "engine and tz database", labels=["engine", "tzdata"])
    for rv, parts in sorted(in_use.items(), key=lambda kv: kv[0].label):
        r.add_metric([rv.engine, rv.tzdata], len(parts))
    yield r
    yield GaugeMetricFamily("chronolog_processor_rules_mismatch",
                            "1 when the processors of this deployment compute instants with "
                            "different recurrence engines or tz databases",
                            value=1 if len(in_use) > 1 else 0)


def _projector_dead_letters(counts: Any) -> Iterator[Metric]:
    d = CounterMetricFamily("chronolog_projector_dead_letters",
                            "Records this projector dead-lettered and skipped", labels=["topic"])
    for topic, n in sorted(counts.items()):
        d.add_metric([topic], n)
    yield d


class ProjectorCollector(Collector):
    """The projector's own counters (for ``chronolog projector --metrics-port``)."""

    def __init__(self, projector: Any) -> None:
        self.projector = projector

    def collect(self) -> Iterator[Metric]:
        yield from _projector_families(self.projector.stats)
        yield from _projector_dead_letters(self.projector.dead_letters.counts)
