"""The live terminal view of ``chronolog dev`` (rich): what is due, running, done, skipped.

Everything shown comes from the processor's folded state and the events it commits, so the
view costs no database query: upcoming instants, running attempts with their fences, recent
results, skipped occurrences with their reasons, start lateness and throughput.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from chronolog.domain import messages as m
from chronolog.domain.durations import format_duration


class Recent:
    """A bounded memory of the events a processor committed (fed by ``on_commit``)."""

    def __init__(self, size: int = 200) -> None:
        self.results: deque[tuple[datetime, str, str, int]] = deque(maxlen=size)
        self.skips: deque[tuple[datetime, str, datetime, str, int]] = deque(maxlen=size)
        self.lateness_ms: deque[float] = deque(maxlen=1000)
        self.events: deque[float] = deque(maxlen=20000)
        self.scheduled: dict[str, datetime] = {}

    def __call__(self, partition: int, events: list[m.EventEnvelope]) -> None:
        now = time.monotonic()
        for env in events:
            self.events.append(now)
            p = env.payload
            if isinstance(p, m.OccurrenceMaterialized):
                self.scheduled[p.run_id] = p.due_at
                if len(self.scheduled) > 5000:
                    self.scheduled.pop(next(iter(self.scheduled)))
            elif isinstance(p, m.AttemptClaimed) and p.attempt == 1:
                due = self.scheduled.get(p.run_id)
                if due is not None:
                    self.lateness_ms.append((p.claimed_at - due).total_seconds() * 1000)
            elif isinstance(p, m.ResultPublished):
                self.results.append((env.at, env.schedule_id, p.run_id, p.fence))
            elif isinstance(p, m.OccurrenceSkipped):
                self.skips.append((env.at, env.schedule_id, p.scheduled_at, p.reason, p.count))

    def rate(self, seconds: float = 10.0) -> float:
        cutoff = time.monotonic() - seconds
        return sum(1 for t in self.events if t >= cutoff) / seconds


def _hm(t: datetime | None) -> str:
    return "-" if t is None else t.astimezone(UTC).strftime("%H:%M:%S")


def _when(t: datetime, now: datetime) -> str:
    """Time of day today, or the date too when it is another day."""
    fmt = "%H:%M:%S" if t.date() == now.date() else "%a %d %b %H:%M"
    return t.astimezone(UTC).strftime(fmt)


async def render(node: Any) -> Group:
    proc = node.parts["processor"]
    recent: Recent | None = node.parts.get("recent")
    now = datetime.now(UTC)
    states = [st for ps in list(proc.partitions.values()) for st in ps.states.values()]

    upcoming = Table(title="upcoming", expand=True)
    for col in ("schedule", "next (UTC)", "in", "state"):
        upcoming.add_column(col)
    nexts = sorted((st.next_due_at, st) for st in states
                   if st.status == "ACTIVE" and st.next_due_at is not None)
    for due, st in nexts[:6]:
        wait = max(0.0, round((due - now).total_seconds()))
        upcoming.add_row(f"{st.tenant}/{st.schedule_id}", _when(due, now),
                         format_duration(wait), st.status)

    running = Table(title="running attempts", expand=True)
    for col in ("run", "schedule", "attempt", "fence", "worker", "lease until"):
        running.add_column(col)
    for st in states:
        for run in (st.runs or {}).values():
            if run.state == "LEASED":
                running.add_row(run.run_id, st.schedule_id, str(run.attempt), str(run.fence),
                                run.worker_id or "-", _hm(run.lease_until))

    results = Table(title="recent results", expand=True)
    for col in ("at", "schedule", "run", "fence"):
        results.add_column(col)
    skips = Table(title="skipped occurrences", expand=True)
    for col in ("at", "schedule", "instant", "reason", "count"):
        skips.add_column(col)
    footer = Text("")
    if recent is not None:
        for at, sid, rid, fence in list(recent.results)[-6:]:
            results.add_row(_hm(at), sid, rid, str(fence))
        for at, sid, inst, reason, count in list(recent.skips)[-6:]:
            skips.add_row(_hm(at), sid, _hm(inst), reason, str(count))
        lat = sorted(recent.lateness_ms)
        p50 = f"{lat[len(lat) // 2]:.0f} ms" if lat else "-"
        p99 = f"{lat[max(0, int(len(lat) * 0.99) - 1)]:.0f} ms" if lat else "-"
        footer = Text(f"start lateness p50 {p50}  p99 {p99}   events/s {recent.rate():.1f}   "
                      f"commands {proc.stats.commands}  transactions {proc.stats.transactions}  "
                      f"schedules {len(states)}   API http://{node.host}:{node.port}")
    return Group(*_restarts(node), upcoming, running, *await _waiting(node), results, skips,
                 footer)


async def _waiting(node: Any) -> list[Table]:
    """READY runs no live worker serves, with the reason (from the read model)."""
    from chronolog.projections.workers import waiting_runs

    store = node.parts.get("store")
    if store is None:
        return []
    rows = await waiting_runs(store.pool, 6)
    if not rows:
        return []
    table = Table(title="waiting for a worker", expand=True)
    for col in ("run", "schedule", "waiting"):
        table.add_column(col)
    for tenant, sid, rid, reason in rows:
        table.add_row(rid, f"{tenant}/{sid}", reason)
    return [table]


def _restarts(node: Any) -> list[Text]:
    """A banner line per part restarted in the last 10 minutes (newest restart)."""
    sup = node.parts.get("supervisor")
    if sup is None:
        return []
    cutoff = time.time() - 600
    last = {n.part: n for n in sup.notices if n.at >= cutoff}
    return [Text(f"{n.part} failed ({n.error}) and was restarted {n.restarts}x, "
                 f"last at {datetime.fromtimestamp(n.at, UTC):%H:%M:%S} UTC",
                 style="bold red") for n in last.values()]
