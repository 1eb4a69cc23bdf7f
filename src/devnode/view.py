"""The live terminal view of ``chronolog dev`` (rich): what is due, running, done, skipped.

Three parts, so that what is drawn is a pure function of what was seen:

* ``gather(node) -> Snapshot`` reads the node once — the processor's folded state (upcoming
  instants, running attempts with their fences), the events it committed (``Recent``: the
  newest outcome of recent runs with their reasons, start lateness, throughput), the
  supervisor's restarts and the read model's runs waiting for a worker — into plain frozen
  data. It is the only part that touches the node, the clock or the database; a part it
  cannot read (the database is away) becomes a line in ``Snapshot.problems``.
* ``render(snapshot) -> Frame`` builds the renderables from the snapshot alone: no clock, no
  I/O (tests render recorded snapshots with ``Console(record=True, width=...)``). Every
  section is built on its own: one that raises is replaced by a red panel with the exception
  line, the others are still drawn, and the errors are returned with the frame.
* ``LiveView`` runs the two for the node's refresh loop: a failure — gathering, rendering or
  drawing — is shown on screen (``error_panel``) and logged once per distinct error
  (``live_view_failed``, with its traceback, in the node's log file), and the view keeps
  refreshing. ``Recent`` records events inside the processor's commit, so it never raises:
  an event it cannot record is counted, shown as a problem line and logged once.

Long schedule IDs, job types, worker IDs and reasons are cut with an ellipsis (``clip``), and
every column is a single line that rich shortens with an ellipsis too, so a long name never
breaks the layout.
"""

from __future__ import annotations

import heapq
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from chronolog.domain import messages as m
from chronolog.domain.durations import format_duration

__all__ = [
    "Frame",
    "LiveView",
    "Outcome",
    "Recent",
    "Restart",
    "Running",
    "Snapshot",
    "Upcoming",
    "Waiting",
    "clip",
    "error_panel",
    "gather",
    "render",
]

log = structlog.get_logger("chronolog.devnode.view")

UPCOMING_ROWS = 6
RUNNING_ROWS = 8
RECENT_ROWS = 10
WAITING_ROWS = 6
RESTART_WINDOW_S = 600  # restarts shown for ten minutes

# longest text per column before it is cut with an ellipsis (rich may cut it further)
SCHEDULE_W = 36
JOB_W = 20
RUN_W = 24
WORKER_W = 24
REASON_W = 120
ERROR_LINE_W = 300

STATE_STYLE = {
    "SUCCEEDED": "green", "RETRY_WAIT": "yellow", "DEAD": "bold red", "SKIPPED": "magenta",
    "CANCELLED": "dim", "RECONCILING": "bold yellow", "READY": "cyan",
}


def clip(text: str | None, width: int) -> str:
    """``text`` on one line, at most ``width`` characters (``…`` marks a cut)."""
    if text is None:
        return "-"
    one = " ".join(str(text).split())
    return one if len(one) <= width else one[: max(0, width - 1)] + "…"


def exception_line(exc: BaseException) -> str:
    """``TypeError: message`` on one line, bounded."""
    return clip(f"{type(exc).__name__}: {exc}", ERROR_LINE_W)


# ---------------------------------------------------------------------------------------
# what the processor committed


@dataclass
class _Entry:
    at: datetime
    tenant: str
    schedule_id: str
    run_id: str
    state: m.RunState
    job_type: str | None = None
    attempt: int | None = None
    fence: int | None = None
    reason: str | None = None
    error: str | None = None
    count: int = 1
    through: datetime | None = None


class Recent:
    """A bounded memory of what a processor committed (fed by its ``on_commit``): the newest
    outcome of each recent run, start lateness, event times."""

    def __init__(self, size: int = 200) -> None:
        self.size = size
        self.runs: OrderedDict[str, _Entry] = OrderedDict()  # oldest first
        self.lateness_ms: deque[float] = deque(maxlen=1000)
        self.events: deque[float] = deque(maxlen=20000)
        self.scheduled: dict[str, tuple[datetime, str]] = {}  # run -> (due_at, job type)
        self.failed = 0  # events that could not be recorded
        self.last_failure: str | None = None
        self._logged: set[str] = set()

    def __call__(self, partition: int, events: list[m.EventEnvelope]) -> None:
        """Record committed events. Called inside the processor's commit: it never raises
        (an event it cannot record is counted, shown by the view and logged once)."""
        now = time.monotonic()
        for env in events:
            self.events.append(now)
            try:
                self._one(env)
            except Exception as exc:  # noqa: BLE001 - the view must never hurt the processor
                self.failed += 1
                self.last_failure = exception_line(exc)
                if self.last_failure not in self._logged and len(self._logged) < 100:
                    self._logged.add(self.last_failure)
                    log.error("live_view_failed", where="recording", error=self.last_failure,
                              traceback="".join(traceback.format_exception(exc))[-4000:])

    def _one(self, env: m.EventEnvelope) -> None:
        p = env.payload
        if isinstance(p, m.OccurrenceMaterialized):
            self.scheduled[p.run_id] = (p.due_at, p.job.type)
            if len(self.scheduled) > 5000:
                self.scheduled.pop(next(iter(self.scheduled)))
        elif isinstance(p, m.AttemptClaimed):
            if p.attempt == 1 and p.run_id in self.scheduled:
                due = self.scheduled[p.run_id][0]
                self.lateness_ms.append((p.claimed_at - due).total_seconds() * 1000)
        elif isinstance(p, m.ResultPublished):
            self._set(env, p.run_id, "SUCCEEDED", attempt=p.attempt, fence=p.fence,
                      reason=None)
        # the run states of the read model (m.RunState), the ones `chronolog runs --state`
        # and the API filter on: a failed attempt leaves its run LEASED until the processor
        # schedules the retry (RETRY_WAIT) or dead-letters it (DEAD), right after
        elif isinstance(p, m.AttemptFailed):
            self._set(env, p.run_id, "LEASED", attempt=p.attempt, fence=p.fence, reason=None,
                      error=f"{p.error_class}: {p.message}" if p.message else p.error_class)
        elif isinstance(p, m.RetryScheduled):
            self._set(env, p.run_id, "RETRY_WAIT",
                      reason=f"retry {p.attempt} at {p.retry_at.astimezone(UTC):%H:%M:%S}")
        elif isinstance(p, m.LeaseExpired):
            self._set(env, p.run_id, "LEASED", attempt=p.attempt, fence=p.fence,
                      reason="lease expired")
        elif isinstance(p, m.OccurrenceDeadLettered):
            self._set(env, p.run_id, "DEAD",
                      reason=f"{p.reason}: {p.message}" if p.message else p.reason)
        elif isinstance(p, m.OccurrenceSkipped):
            self._set(env, p.run_id, "SKIPPED", reason=p.reason, count=p.count,
                      through=p.through)
        elif isinstance(p, m.OccurrenceCancelled):
            why = p.reason or "cancelled"
            self._set(env, p.run_id, "CANCELLED", reason=f"{why} (by {p.by})" if p.by else why)
        elif isinstance(p, m.ReconciliationRequired):
            self._set(env, p.run_id, "RECONCILING", reason=p.reason)
        elif isinstance(p, m.ReconciliationResolved) and p.decision == "delivered":
            self._set(env, p.run_id, "SUCCEEDED", reason="reconciled: delivered")
        elif isinstance(p, m.OccurrenceRedriven):
            self._set(env, p.run_id, "READY", attempt=p.attempt,
                      reason=f"redriven by {p.by}" if p.by else "redriven")

    def _set(self, env: m.EventEnvelope, run_id: str, state: m.RunState,
             **changes: Any) -> None:
        entry = self.runs.get(run_id)
        if entry is None:
            entry = self.runs[run_id] = _Entry(env.at, env.tenant, env.schedule_id, run_id,
                                               state)
            known = self.scheduled.get(run_id)
            entry.job_type = known[1] if known else None
            if len(self.runs) > self.size:
                self.runs.popitem(last=False)
        else:
            self.runs.move_to_end(run_id)
        entry.at = env.at
        entry.state = state
        if state == "SUCCEEDED":
            entry.error = None
        for k, v in changes.items():
            setattr(entry, k, v)

    def rate(self, seconds: float = 10.0) -> float:
        cutoff = time.monotonic() - seconds
        return sum(1 for t in self.events if t >= cutoff) / seconds

    def outcomes(self, n: int) -> list[Outcome]:
        """The newest outcomes of the ``n`` runs changed last, oldest first."""
        newest = list(self.runs.values())[-n:]
        return [Outcome(e.at, e.tenant, e.schedule_id, e.run_id, e.state, e.job_type,
                        e.attempt, e.fence, e.reason, e.error, e.count, e.through)
                for e in newest]


# ---------------------------------------------------------------------------------------
# the snapshot: plain data


@dataclass(frozen=True)
class Upcoming:
    tenant: str
    schedule_id: str
    job_type: str | None
    due: datetime
    status: str


@dataclass(frozen=True)
class Running:
    run_id: str
    tenant: str
    schedule_id: str
    job_type: str | None
    attempt: int
    fence: int
    worker_id: str | None
    lease_until: datetime | None


@dataclass(frozen=True)
class Outcome:
    """The newest state of a recent run and why it is in it."""

    at: datetime
    tenant: str
    schedule_id: str
    run_id: str
    state: m.RunState  # the read model's: SUCCEEDED | RETRY_WAIT | DEAD | SKIPPED | ...
    job_type: str | None = None
    attempt: int | None = None
    fence: int | None = None
    reason: str | None = None  # skipped / dead / cancel / reconciliation reason, next retry
    error: str | None = None  # the last error, "class: message"
    count: int = 1  # instants of a collapsed skip
    through: datetime | None = None  # the last of them


@dataclass(frozen=True)
class Waiting:
    tenant: str
    schedule_id: str
    run_id: str
    reason: str


@dataclass(frozen=True)
class Restart:
    part: str
    error: str
    restarts: int
    at: datetime


@dataclass(frozen=True)
class Snapshot:
    """Everything one frame of the view shows."""

    now: datetime
    api: str
    schedules: int = 0
    upcoming: tuple[Upcoming, ...] = ()
    running: tuple[Running, ...] = ()
    running_total: int = 0
    recent: tuple[Outcome, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    restarts: tuple[Restart, ...] = ()
    lateness_p50_ms: float | None = None
    lateness_p99_ms: float | None = None
    events_per_s: float = 0.0
    commands: int = 0
    transactions: int = 0
    problems: tuple[str, ...] = ()  # what could not be gathered, one line each


# ---------------------------------------------------------------------------------------
# gathering


def _upcoming_key(u: Upcoming) -> tuple[datetime, str, str]:
    return (u.due, u.tenant, u.schedule_id)  # a total order: ties in instant are common


async def gather(node: Any) -> Snapshot:
    """Read the node once into a ``Snapshot`` (the only part that touches the node)."""
    now = datetime.now(UTC)
    problems: list[str] = []
    proc = node.parts.get("processor")
    recent: Recent | None = node.parts.get("recent")
    states: list[Any] = []
    if proc is None:
        problems.append("the processor is not running")
    else:
        states = [st for ps in list(proc.partitions.values()) for st in ps.states.values()]
    upcoming = heapq.nsmallest(UPCOMING_ROWS, (
        Upcoming(st.tenant, st.schedule_id, st.policy.job.type if st.policy else None,
                 st.next_due_at, st.status)
        for st in states if st.status == "ACTIVE" and st.next_due_at is not None),
        key=_upcoming_key)
    leased = [
        Running(run.run_id, st.tenant, st.schedule_id, run.job.type if run.job else None,
                run.attempt, run.fence, run.worker_id, run.lease_until)
        for st in states for run in (st.runs or {}).values() if run.state == "LEASED"]
    running = heapq.nsmallest(RUNNING_ROWS, leased, key=lambda r: (
        r.lease_until or now, r.run_id))
    waiting: list[Waiting] = []
    store = node.parts.get("store")
    if store is not None:
        from chronolog.queries.workers import waiting_runs

        try:
            waiting = [Waiting(*row) for row in await waiting_runs(store.pool, WAITING_ROWS)]
        except Exception as exc:  # noqa: BLE001 - the database may be away: say so, go on
            problems.append(f"runs waiting for a worker: {exception_line(exc)}")
    if recent is not None and recent.failed:
        problems.append(f"recent results: {recent.failed} events could not be recorded "
                        f"(last: {recent.last_failure})")
    lat = sorted(recent.lateness_ms) if recent is not None else []
    return Snapshot(
        now=now,
        api=f"http://{node.host}:{node.port}",
        schedules=len(states),
        upcoming=tuple(upcoming),
        running=tuple(running),
        running_total=len(leased),
        recent=tuple(recent.outcomes(RECENT_ROWS)) if recent is not None else (),
        waiting=tuple(waiting),
        restarts=tuple(_restarts(node, now)),
        lateness_p50_ms=lat[len(lat) // 2] if lat else None,
        lateness_p99_ms=lat[max(0, int(len(lat) * 0.99) - 1)] if lat else None,
        events_per_s=recent.rate() if recent is not None else 0.0,
        commands=proc.stats.commands if proc is not None else 0,
        transactions=proc.stats.transactions if proc is not None else 0,
        problems=tuple(problems),
    )


def _restarts(node: Any, now: datetime) -> list[Restart]:
    """The newest restart of each part restarted in the last ten minutes."""
    sup = node.parts.get("supervisor")
    if sup is None:
        return []
    cutoff = now.timestamp() - RESTART_WINDOW_S
    last = {n.part: n for n in list(sup.notices) if n.at >= cutoff}
    return [Restart(n.part, n.error, n.restarts, datetime.fromtimestamp(n.at, UTC))
            for n in last.values()]


# ---------------------------------------------------------------------------------------
# rendering: a pure function of the snapshot


@dataclass(frozen=True)
class Frame:
    """One rendered frame and the errors of the sections that could not be built."""

    renderable: RenderableType
    errors: tuple[tuple[str, BaseException], ...] = field(default=())  # (section, error)


def error_panel(exc: BaseException, where: str) -> Panel:
    """A red panel with the exception line: what the view shows instead of what failed."""
    return Panel(Text(exception_line(exc)), title=f"live view error ({where})",
                 title_align="left", border_style="red")


def _hm(t: datetime | None) -> str:
    return "-" if t is None else t.astimezone(UTC).strftime("%H:%M:%S")


def _when(t: datetime, now: datetime) -> str:
    """Time of day today, or the date too when it is another day."""
    fmt = "%H:%M:%S" if t.date() == now.date() else "%a %d %b %H:%M"
    return t.astimezone(UTC).strftime(fmt)


def _schedule(tenant: str, schedule_id: str) -> str:
    name = schedule_id if tenant == "default" else f"{tenant}/{schedule_id}"
    return clip(name, SCHEDULE_W)


@dataclass(frozen=True)
class Col:
    """A column of a table: ``shrink_to`` how narrow it may be cut (None: never, as for
    times, states and numbers); ``fill``: it takes the width left over."""

    name: str
    shrink_to: int | None = None
    fill: bool = False
    weight: float = 1.0  # how readily it gives up width (a reason column: less so)


def _table(title: str, cols: list[Col], rows: list[list[Text]], width: int) -> Table:
    """A table exactly ``width`` wide (when it fits at all): the columns that may shrink are
    cut (widest first) until the rest fits, the filling column takes what is left, and every
    cell stays on one line, cut with an ellipsis."""
    natural = [max([len(c.name), *(row[i].cell_len for row in rows)])
               for i, c in enumerate(cols)]
    widths = list(natural)
    budget = width - (3 * len(cols) + 1)  # a border and two spaces of padding per column
    excess = sum(widths) - budget
    while excess > 0:
        room = [((w - c.shrink_to) * c.weight, i)
                for i, (c, w) in enumerate(zip(cols, widths, strict=True))
                if c.shrink_to is not None and w > c.shrink_to]
        if not room:
            break  # too narrow for the minimums: rich cuts further
        _, i = max(room)
        widths[i] -= 1
        excess -= 1
    fill = next((i for i, c in enumerate(cols) if c.fill), None)
    if excess < 0 and fill is not None:
        widths[fill] -= excess
    table = Table(title=title, title_justify="left")
    for c, w in zip(cols, widths, strict=True):
        table.add_column(c.name, width=max(1, w), no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*row)
    return table


def _cells(*values: str | Text) -> list[Text]:
    """Cells as Text: an ID or a message is never read as rich markup."""
    return [v if isinstance(v, Text) else Text(v) for v in values]


def _upcoming(s: Snapshot, width: int) -> RenderableType:
    rows = []
    for u in sorted(s.upcoming, key=_upcoming_key):
        wait = max(0.0, round((u.due - s.now).total_seconds()))
        rows.append(_cells(_schedule(u.tenant, u.schedule_id), clip(u.job_type, JOB_W),
                           _when(u.due, s.now), format_duration(wait), u.status))
    return _table("upcoming", [Col("schedule", 8, fill=True), Col("job", 4),
                               Col("next (UTC)"), Col("in"), Col("state")], rows, width)


def _running(s: Snapshot, width: int) -> RenderableType:
    title = "running attempts"
    if s.running_total > len(s.running):
        title += f" ({len(s.running)} of {s.running_total})"
    rows = [_cells(clip(r.run_id, RUN_W), _schedule(r.tenant, r.schedule_id),
                   clip(r.job_type, JOB_W), str(r.attempt), str(r.fence),
                   clip(r.worker_id, WORKER_W), _hm(r.lease_until)) for r in s.running]
    return _table(title, [Col("run", 8, weight=0.5), Col("schedule", 8, fill=True), Col("job", 4),
                          Col("attempt"), Col("fence"), Col("worker", 6),
                          Col("lease until")], rows, width)


def _why(o: Outcome) -> str:
    """The reason column: why the run is in its state, and its last error."""
    parts: list[str] = []
    if o.reason:
        parts.append(o.reason)
    if o.state == "SKIPPED" and o.count > 1:
        parts.append(f"x{o.count}" + (f" through {_hm(o.through)}" if o.through else ""))
    if o.error and o.state != "SUCCEEDED":
        # a failed attempt: its error first (then when it is retried); else the reason first
        parts.insert(0 if o.state in ("LEASED", "RETRY_WAIT") else len(parts), o.error)
    return clip(" · ".join(parts), REASON_W) if parts else ""


def _recent(s: Snapshot, width: int) -> RenderableType:
    rows = []
    for o in s.recent:
        tries = "-" if o.attempt is None else (
            f"{o.attempt}/{o.fence}" if o.fence is not None else str(o.attempt))
        rows.append(_cells(_hm(o.at), _schedule(o.tenant, o.schedule_id),
                           clip(o.job_type, JOB_W), clip(o.run_id, RUN_W),
                           Text(o.state, style=STATE_STYLE.get(o.state, "")), tries, _why(o)))
    return _table("recent results", [
        Col("at"), Col("schedule", 8), Col("job", 4), Col("run", 6, weight=0.5), Col("state"),
        Col("att/fence", 5), Col("reason / last error", 10, fill=True, weight=0.3)], rows, width)


def _waiting(s: Snapshot, width: int) -> RenderableType | None:
    if not s.waiting:
        return None
    rows = [_cells(clip(w.run_id, RUN_W), clip(f"{w.tenant}/{w.schedule_id}", SCHEDULE_W),
                   clip(w.reason, REASON_W)) for w in s.waiting]
    return _table("waiting for a worker", [Col("run", 8, weight=0.5), Col("schedule", 8),
                                           Col("waiting", 10, fill=True, weight=0.3)], rows, width)


def _alerts(s: Snapshot, width: int) -> RenderableType | None:
    lines = [Text(clip(f"{r.part} failed ({r.error}) and was restarted {r.restarts}x, last at "
                       f"{r.at:%H:%M:%S} UTC", ERROR_LINE_W), style="bold red")
             for r in s.restarts]
    lines += [Text(clip(p, ERROR_LINE_W), style="red") for p in s.problems]
    return Group(*lines) if lines else None


def _footer(s: Snapshot, width: int) -> RenderableType:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} ms"

    return Text(f"start lateness p50 {ms(s.lateness_p50_ms)}  p99 {ms(s.lateness_p99_ms)}   "
                f"events/s {s.events_per_s:.1f}   commands {s.commands}  transactions "
                f"{s.transactions}  schedules {s.schedules}\nAPI {s.api}")


Section = Callable[[Snapshot, int], RenderableType | None]
SECTIONS: tuple[tuple[str, Section], ...] = (
    ("alerts", _alerts),
    ("upcoming", _upcoming),
    ("running attempts", _running),
    ("waiting for a worker", _waiting),
    ("recent results", _recent),
    ("footer", _footer),
)


def render(snapshot: Snapshot, width: int = 120,
           sections: Iterable[tuple[str, Section]] = SECTIONS) -> Frame:
    """The frame of a snapshot for a screen ``width`` columns wide (pure). A section that
    raises is shown as ``error_panel``."""
    parts: list[RenderableType] = []
    errors: list[tuple[str, BaseException]] = []
    for name, build in sections:
        try:
            part = build(snapshot, width)
        except Exception as exc:  # noqa: BLE001 - shown on screen, never raised
            errors.append((name, exc))
            part = error_panel(exc, name)
        if part is not None:
            parts.append(part)
    return Frame(Group(*parts), tuple(errors))


# ---------------------------------------------------------------------------------------
# the refresh loop's guard


class LiveView:
    """Frames for the refresh loop: never raises; every failure is shown and logged once."""

    MAX_DISTINCT = 100  # distinct errors remembered (then new ones are shown, not logged)

    def __init__(self, node: Any,
                 gather_: Callable[[Any], Any] = gather) -> None:
        self.node = node
        self._gather = gather_
        self.logged: dict[str, int] = {}  # error -> times seen

    async def frame(self, width: int = 120) -> RenderableType:
        """The next frame for a screen ``width`` wide: the view, or the panel of what
        failed."""
        try:
            snapshot = await self._gather(self.node)
        except Exception as exc:  # noqa: BLE001 - the view must never stop
            self.report(exc, "gathering")
            return error_panel(exc, "gathering")
        try:
            frame = render(snapshot, width)
        except Exception as exc:  # noqa: BLE001 - render builds each section safely already
            self.report(exc, "rendering")
            return error_panel(exc, "rendering")
        for name, error in frame.errors:
            self.report(error, name)
        return frame.renderable

    def report(self, exc: BaseException, where: str) -> None:
        """Log ``exc`` the first time it is seen (where, class and message)."""
        key = f"{where}|{type(exc).__name__}|{exc}"
        if key in self.logged:
            self.logged[key] += 1
            return
        if len(self.logged) >= self.MAX_DISTINCT:
            return
        self.logged[key] = 1
        log.error("live_view_failed", where=where, error=exception_line(exc),
                  traceback="".join(traceback.format_exception(exc))[-4000:])
