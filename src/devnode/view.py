"""The live terminal view of ``chronolog dev`` (rich): what is due, running, done, skipped.

Three parts, so that what is drawn is a pure function of what was seen:

* ``gather(node) -> Snapshot`` reads the node once — the processor's folded state (upcoming
  instants, running attempts with their fences), the events it committed (``Recent``: the
  newest outcome of recent runs with their reasons, start lateness, throughput), the
  supervisor's restarts and the read model's runs waiting to start (for a worker or for a
  permit of their concurrency key) — into plain frozen data. It is the only part that
  touches the node, the clock or the database; a part it cannot read (the database is away)
  becomes a line in ``Snapshot.problems``.
* ``render(snapshot, width, height) -> Frame`` builds the renderables from the snapshot
  alone: no clock, no I/O (tests render recorded snapshots with ``Console(record=True,
  width=...)``). ``plan`` decides what the screen has room for (``Fit``): every line fits the
  width (the extra columns of wide screens are left out of narrow ones, long names are cut),
  and on a short screen each table shows fewer rows, saying how many it holds; the status
  line and the API's address are always the last two lines. Schedules are named
  ``tenant/id`` only when the frame shows more than one tenant. Every section is built on
  its own: one that raises is replaced by a red panel with the exception line, the others
  are still drawn, and the errors are returned with the frame.
* ``LiveView`` runs the two for the node's refresh loop: a failure — gathering, rendering or
  drawing — is shown on screen (``error_panel``) and logged once per distinct error
  (``live_view_failed``, with its traceback, in the node's log file), and the view keeps
  refreshing. ``Recent`` records events inside the processor's commit, so it never raises:
  an event it cannot record is counted, shown as a problem line and logged once.

Long schedule IDs, job types, worker IDs and reasons are cut with an ellipsis (``clip``), and
every column is a single line that rich shortens with an ellipsis too, so a long name never
breaks the layout. ``commands`` counts the commands the processor decided (from the API, the
CLI and workers); the offers idle workers renew every second are counted apart
(``worker offers``).
"""

from __future__ import annotations

import heapq
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import structlog
from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from chronolog.domain import messages as m
from chronolog.domain.durations import format_duration
from chronolog.domain.ids import partition_key

__all__ = [
    "Fit",
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
    "plan",
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
WIDE = 180  # a wide screen: longer names before they are cut
SCHEDULE_WIDE_W = 64
JOB_WIDE_W = 40
WORKER_WIDE_W = 40
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
            # a permanent error's message is the failed attempt's, already in ``error``
            entry = self.runs.get(p.run_id)
            said = bool(p.message) and entry is not None and entry.error is not None and (
                entry.error.endswith(p.message))
            self._set(env, p.run_id, "DEAD",
                      reason=f"{p.reason}: {p.message}" if p.message and not said else p.reason)
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
    commands: int = 0  # commands decided (from the API, the CLI and workers)
    offers: int = 0  # workers' offers to take work (renewed every second by each idle worker)
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
    held = 0  # every schedule the processor holds, hot or cold
    if proc is None:
        problems.append("the processor is not running")
    else:
        # the hot states, and the soonest cold ones of each partition (the cold ones are
        # quiet: no run of theirs is open; and their instants are beyond the hot ones')
        for ps in list(proc.partitions.values()):
            held += len(ps.states)
            states.extend(st for _, st in ps.states.hot_items())
            states.extend(ps.states.soonest_cold(UPCOMING_ROWS))
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
            problems.append(f"runs waiting to start: {exception_line(exc)}")
    if recent is not None and recent.failed:
        problems.append(f"recent results: {recent.failed} events could not be recorded "
                        f"(last: {recent.last_failure})")
    lat = sorted(recent.lateness_ms) if recent is not None else []
    # a run that never started (skipped, cancelled early) has its schedule's job type
    outcomes = tuple(o if o.job_type is not None else replace(
        o, job_type=_job_type(proc, o.tenant, o.schedule_id))
        for o in (recent.outcomes(RECENT_ROWS) if recent is not None else ()))
    return Snapshot(
        now=now,
        api=f"http://{node.host}:{node.port}",
        schedules=held,
        upcoming=tuple(upcoming),
        running=tuple(running),
        running_total=len(leased),
        recent=outcomes,
        waiting=tuple(waiting),
        restarts=tuple(_restarts(node, now)),
        lateness_p50_ms=lat[len(lat) // 2] if lat else None,
        lateness_p99_ms=lat[max(0, int(len(lat) * 0.99) - 1)] if lat else None,
        events_per_s=recent.rate() if recent is not None else 0.0,
        commands=proc.stats.commands if proc is not None else 0,
        offers=proc.stats.offers if proc is not None else 0,
        transactions=proc.stats.transactions if proc is not None else 0,
        problems=tuple(problems),
    )


def _job_type(proc: Any, tenant: str, schedule_id: str) -> str | None:
    """The job type of a schedule the processor holds (a cold one is read, not kept)."""
    if proc is None:
        return None
    key = partition_key(tenant, schedule_id)
    for ps in list(proc.partitions.values()):
        st = ps.states.peek(key)
        if st is not None and st.policy is not None:
            return str(st.policy.job.type)
    return None


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


@dataclass(frozen=True)
class Fit:
    """What one frame has room for: its ``width``, the rows each table may show (by section
    name), and whether schedules are named with their tenant (``tenant/id``: only when the
    frame shows schedules of more than one tenant)."""

    width: int
    rows: dict[str, int] = field(default_factory=dict)
    tenants: bool = False
    alerts: int = 6  # alert lines shown (the rest are counted on one more line)
    rules: bool = True  # a rule under each table's header

    def limit(self, narrow: int, wide: int) -> int:
        """The longest text of a column before it is cut: ``wide`` on a wide screen."""
        return wide if self.width >= WIDE else narrow

    def schedule(self, tenant: str, schedule_id: str) -> str:
        name = f"{tenant}/{schedule_id}" if self.tenants else schedule_id
        return clip(name, self.limit(SCHEDULE_W, SCHEDULE_WIDE_W))


def _tenants_shown(s: Snapshot) -> set[str]:
    return ({u.tenant for u in s.upcoming} | {r.tenant for r in s.running}
            | {o.tenant for o in s.recent} | {w.tenant for w in s.waiting})


@dataclass(frozen=True)
class Col:
    """A column of a table: ``shrink_to`` how narrow it may be cut (None: never, as for
    times, states and numbers); ``screen``: the narrowest screen it is shown on (an extra
    column of wide screens; 0: always)."""

    name: str
    shrink_to: int | None = None
    weight: float = 1.0  # how readily it gives up width (a reason column: less so)
    screen: int = 0


def _table_width(widths: list[int], rules: bool) -> int:
    """The width rich draws a table of these columns in (``_table``'s: one space of padding
    between a column and the next, a line too where the header has a rule, no outer edge)."""
    return sum(widths) + (3 if rules else 2) * (len(widths) - 1)


def _table(title: str, cols: list[Col], rows: list[list[Text]], fit: Fit) -> Table:
    """A table at most ``width`` wide, its columns sized to their content: the extra columns
    of wider screens are left out, then the columns that may shrink are cut (widest first)
    until the rest fits; every cell stays on one line, cut with an ellipsis."""
    width = fit.width
    keep = [i for i, c in enumerate(cols) if width >= c.screen]
    cols = [cols[i] for i in keep]
    rows = [[row[i] for i in keep] for row in rows]
    widths = [max([len(c.name), *(row[i].cell_len for row in rows)])
              for i, c in enumerate(cols)]
    excess = _table_width(widths, fit.rules) - width
    while excess > 0:
        room = [((w - c.shrink_to) * c.weight, i)
                for i, (c, w) in enumerate(zip(cols, widths, strict=True))
                if c.shrink_to is not None and w > c.shrink_to]
        if not room:
            break  # too narrow for the minimums: rich cuts further
        _, i = max(room)
        widths[i] -= 1
        excess -= 1
    # a rule under the header when the screen is tall enough for it
    table = Table(title=title, title_justify="left", title_style="bold",
                  box=box.SIMPLE_HEAD if fit.rules else None, show_edge=False,
                  pad_edge=False, header_style="bold underline")
    for c, w in zip(cols, widths, strict=True):
        table.add_column(c.name, width=max(1, w), no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*row)
    return table


def _titled(title: str, shown: int, total: int) -> str:
    return title if shown >= total else f"{title} ({shown} of {total})"


def _line(text: str, style: str = "") -> Text:
    """One line of the frame, cut with an ellipsis when the screen is narrower."""
    return Text(text.replace("\r", " ").replace("\n", " "), style=style, no_wrap=True,
                overflow="ellipsis")


def _cells(*values: str | Text) -> list[Text]:
    """Cells as Text: an ID or a message is never read as rich markup."""
    return [v if isinstance(v, Text) else Text(v) for v in values]


def _upcoming(s: Snapshot, fit: Fit) -> RenderableType:
    if not s.upcoming:
        return _line("upcoming: nothing due", "bold")
    shown = sorted(s.upcoming, key=_upcoming_key)[:fit.rows.get("upcoming", UPCOMING_ROWS)]
    rows = []
    for u in shown:
        wait = max(0.0, round((u.due - s.now).total_seconds()))
        rows.append(_cells(fit.schedule(u.tenant, u.schedule_id),
                           clip(u.job_type, fit.limit(JOB_W, JOB_WIDE_W)),
                           _when(u.due, s.now), format_duration(wait), u.status))
    title = _titled("upcoming", len(shown), len(s.upcoming))
    return _table(title, [Col("schedule", 12), Col("job", 12), Col("next (UTC)"), Col("in"),
                          Col("state", screen=100)], rows, fit)


def _running(s: Snapshot, fit: Fit) -> RenderableType:
    total = max(s.running_total, len(s.running))
    if not total:
        return _line("running attempts: none", "bold")
    shown = s.running[:fit.rows.get("running attempts", RUNNING_ROWS)]
    rows = [_cells(clip(r.run_id, RUN_W), fit.schedule(r.tenant, r.schedule_id),
                   clip(r.job_type, fit.limit(JOB_W, JOB_WIDE_W)), str(r.attempt),
                   str(r.fence), clip(r.worker_id, fit.limit(WORKER_W, WORKER_WIDE_W)),
                   _hm(r.lease_until)) for r in shown]
    return _table(_titled("running attempts", len(shown), total), [
        Col("run", 8, weight=0.5, screen=120), Col("schedule", 12), Col("job", 12),
        Col("attempt"), Col("fence", screen=120), Col("worker", 6, screen=100),
        Col("lease until")], rows, fit)


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


def _recent(s: Snapshot, fit: Fit) -> RenderableType:
    if not s.recent:
        return _line("recent results: none yet", "bold")
    n = fit.rows.get("recent results", RECENT_ROWS)
    shown = s.recent[-n:] if n > 0 else ()  # the newest
    rows = []
    for o in shown:
        tries = "-" if o.attempt is None else (
            f"{o.attempt}/{o.fence}" if o.fence is not None else str(o.attempt))
        rows.append(_cells(_hm(o.at), fit.schedule(o.tenant, o.schedule_id),
                           clip(o.job_type, fit.limit(JOB_W, JOB_WIDE_W)),
                           clip(o.run_id, RUN_W),
                           Text(o.state, style=STATE_STYLE.get(o.state, "")), tries, _why(o)))
    return _table(_titled("recent results", len(shown), len(s.recent)), [
        Col("at"), Col("schedule", 12), Col("job", 12), Col("run", 6, weight=0.5, screen=100),
        Col("state"), Col("att/fence", screen=120),
        Col("reason / last error", 10, weight=0.3)], rows, fit)


def _waiting(s: Snapshot, fit: Fit) -> RenderableType | None:
    if not s.waiting:
        return None
    shown = s.waiting[:fit.rows.get("waiting to start", WAITING_ROWS)]
    rows = [_cells(clip(w.run_id, RUN_W), fit.schedule(w.tenant, w.schedule_id),
                   clip(w.reason, REASON_W)) for w in shown]
    return _table(_titled("waiting to start", len(shown), len(s.waiting)), [
        Col("run", 8, weight=0.5, screen=100), Col("schedule", 12),
        Col("waiting", 10, weight=0.3)], rows, fit)


def _alert_lines(s: Snapshot) -> list[Text]:
    lines = [_line(f"{r.part} failed ({r.error}) and was restarted {r.restarts}x, last at "
                   f"{r.at:%H:%M:%S} UTC", "bold red") for r in s.restarts]
    return lines + [_line(p, "red") for p in s.problems]


def _alerts(s: Snapshot, fit: Fit) -> RenderableType | None:
    lines = _alert_lines(s)
    if len(lines) > fit.alerts:
        more = len(lines) - fit.alerts + 1
        lines = [*lines[:fit.alerts - 1], _line(f"… and {more} more (see the node's log)",
                                                "red")]
    return Group(*lines) if lines else None


def _status(s: Snapshot) -> tuple[list[str], list[str]]:
    """The status line's items and the address line's, the essential first (a narrow screen
    leaves out the last ones)."""
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} ms"

    return ([f"start lateness p50 {ms(s.lateness_p50_ms)}  p99 {ms(s.lateness_p99_ms)}",
             f"events/s {s.events_per_s:.1f}", f"commands {s.commands}",
             f"transactions {s.transactions}"],
            [f"API {s.api}", f"schedules {s.schedules}", f"worker offers {s.offers}"])


def _packed(items: list[str], width: int) -> str:
    """The items that fit ``width`` in order, three spaces apart (the first one always: cut
    if it must be)."""
    line = items[0]
    for item in items[1:]:
        if len(line) + 3 + len(item) > width:
            break
        line = f"{line}   {item}"
    return line


def _footer(s: Snapshot, fit: Fit) -> RenderableType:
    """The status line and the API's address line: what fits of ``_status``."""
    status, address = _status(s)
    return Group(_line(_packed(status, fit.width)), _line(_packed(address, fit.width)))


FOOTER_LINES = 2
TALL = 40  # a screen this tall has room for a rule under each table's header


def plan(s: Snapshot, width: int, height: int | None) -> Fit:
    """How much of each section a ``width`` x ``height`` screen shows: every non-empty table
    gets rows in turn (the recent results two for one) until the screen is full; with no
    ``height`` every row is shown."""
    tenants = len(_tenants_shown(s)) > 1
    wants = {"recent results": len(s.recent), "upcoming": len(s.upcoming),
             "running attempts": len(s.running), "waiting to start": len(s.waiting)}
    if height is None:
        return Fit(width, wants, tenants, alerts=max(1, len(_alert_lines(s))))
    alerts = min(len(_alert_lines(s)), 3 if height < 30 else 6)
    rules = height >= TALL
    # a table: its title, header (and rule); an empty section: one line (waiting: none)
    used = FOOTER_LINES + alerts + sum(
        ((3 if rules else 2) if n else (0 if name == "waiting to start" else 1))
        for name, n in wants.items())
    budget = height - used
    rows = dict.fromkeys(wants, 0)
    share = {"recent results": 2, "upcoming": 1, "running attempts": 1,
             "waiting to start": 1}
    progress = True
    while budget > 0 and progress:
        progress = False
        for name in wants:
            for _ in range(share[name]):
                if budget > 0 and rows[name] < wants[name]:
                    rows[name] += 1
                    budget -= 1
                    progress = True
    return Fit(width, rows, tenants, alerts=max(1, alerts), rules=rules)


Section = Callable[[Snapshot, Fit], RenderableType | None]
SECTIONS: tuple[tuple[str, Section], ...] = (
    ("alerts", _alerts),
    ("upcoming", _upcoming),
    ("running attempts", _running),
    ("waiting to start", _waiting),
    ("recent results", _recent),
    ("footer", _footer),
)


def render(snapshot: Snapshot, width: int = 120, height: int | None = None,
           sections: Iterable[tuple[str, Section]] = SECTIONS) -> Frame:
    """The frame of a snapshot for a screen ``width`` columns wide and ``height`` lines tall
    (None: as tall as it needs) (pure). Every line fits the width; the tables show fewer
    rows on a short screen. A section that raises is shown as ``error_panel``."""
    parts: list[RenderableType] = []
    errors: list[tuple[str, BaseException]] = []
    fit = plan(snapshot, width, height)
    for name, build in sections:
        try:
            part = build(snapshot, fit)
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

    async def frame(self, width: int = 120, height: int | None = None) -> RenderableType:
        """The next frame for a screen ``width`` x ``height``: the view, or the panel of what
        failed."""
        try:
            snapshot = await self._gather(self.node)
        except Exception as exc:  # noqa: BLE001 - the view must never stop
            self.report(exc, "gathering")
            return error_panel(exc, "gathering")
        try:
            frame = render(snapshot, width, height)
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
