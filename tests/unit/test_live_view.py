"""The dev node's live view, rendered from recorded state with rich's recording console.

The snapshot is what ``gather`` would read from a node: here it is built from a real
``ScheduleState`` fold (two schedules due at the same instant, one with a long ID and a long
job type) and from the events a processor would commit (``Recent``): a success, an attempt
that failed and is retried, a run gone DEAD with its reason and last error, skips with their
reasons, a cancellation. ``render`` is a pure function of it; the exported text is checked.
A section that raises is drawn as a panel with the exception line, never raised, and the
refresh loop's ``LiveView`` logs each distinct error once.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from rich.console import Console

from chronolog.commands.decider import next_wakeup
from chronolog.commands.state import ScheduleState
from chronolog.devnode.view import (
    LiveView,
    Outcome,
    Recent,
    Restart,
    Running,
    Snapshot,
    Upcoming,
    Waiting,
    error_panel,
    gather,
    render,
)
from chronolog.domain import messages as m
from chronolog.processors.schedule_store import ScheduleStore

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LONG_ID = "nightly-" + "warehouse-reconciliation-" * 7 + "eu"  # 185 characters
LONG_JOB = "reports.generate_quarterly_consolidated_statements_v2"


def text_of(renderable: Any, width: int) -> str:
    console = Console(record=True, width=width, color_system=None, file=_Null())
    console.print(renderable)
    return console.export_text()


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def _env(schedule_id: str, payload: Any, at: datetime, tenant: str = "default") -> m.EventEnvelope:
    return m.EventEnvelope(event_id=f"e-{schedule_id}-{at.timestamp()}-{payload.type}",
                           type=payload.type, key=f"{tenant}/{schedule_id}", tenant=tenant,
                           schedule_id=schedule_id, at=at, causation_id="c", payload=payload)


def _materialized(run_id: str, job: str, at: datetime) -> m.OccurrenceMaterialized:
    return m.OccurrenceMaterialized(run_id=run_id, scheduled_at=at, due_at=at, revision=1,
                                    job=m.JobSpec(type=job), state="READY", sequence=1)


def recorded() -> Recent:
    """What a processor committed: the outcomes of five runs, and two skips."""
    recent = Recent()
    t = NOW - timedelta(minutes=5)
    events = [
        _env("demo-echo", _materialized("r_ok", "echo", t), t),
        _env("demo-echo", m.ResultPublished(run_id="r_ok", attempt=1, fence=3, worker_id="w",
                                            checksum="sha256:ab", size=2, finished_at=t), t),
        _env("flaky", _materialized("r_retry", "fail", t), t),
        _env("flaky", m.AttemptFailed(run_id="r_retry", attempt=1, fence=4, worker_id="w",
                                      error_class="transient", message="ConnectionError: "
                                      "refused"), t + timedelta(seconds=1)),
        _env("flaky", m.RetryScheduled(run_id="r_retry", attempt=2,
                                       retry_at=t + timedelta(seconds=3)),
             t + timedelta(seconds=1)),
        _env(LONG_ID, _materialized("r_dead", LONG_JOB, t), t),
        _env(LONG_ID, m.AttemptFailed(run_id="r_dead", attempt=1, fence=7, worker_id="w",
                                      error_class="permanent", message="no region " * 40),
             t + timedelta(seconds=2)),
        _env(LONG_ID, m.OccurrenceDeadLettered(run_id="r_dead", reason="permanent_error"),
             t + timedelta(seconds=2)),
        _env("paused-one", m.OccurrenceSkipped(run_id="r_skip", scheduled_at=t,
                                               reason="coalesced", count=17,
                                               through=t + timedelta(seconds=34)),
             t + timedelta(seconds=3)),
        _env("paused-one", m.OccurrenceSkipped(run_id="r_over", scheduled_at=t,
                                               reason="overlap"), t + timedelta(seconds=3)),
        _env("cancel-me", m.OccurrenceCancelled(run_id="r_cancel", by="ops",
                                                reason="[bold]wrong params[/]"),
             t + timedelta(seconds=4)),
    ]
    recent(0, events)
    return recent


def snapshot() -> Snapshot:
    """Upcoming from real schedule states: two due at the very same instant (a tie)."""
    due = NOW + timedelta(seconds=30)
    states = []
    for sid in ("b-tie", "a-tie", LONG_ID):
        st = ScheduleState("default", sid)
        st.status, st.next_due_at = "ACTIVE", due if sid != LONG_ID else due + timedelta(hours=1)
        states.append(st)
    upcoming = sorted((Upcoming(st.tenant, st.schedule_id, LONG_JOB if st.schedule_id ==
                                LONG_ID else "echo", st.next_due_at, st.status)
                       for st in states), key=lambda u: (u.due, u.tenant, u.schedule_id))
    return Snapshot(now=NOW, api="http://127.0.0.1:8080", schedules=len(states),
                    upcoming=tuple(upcoming), recent=tuple(recorded().outcomes(10)),
                    lateness_p50_ms=12.0, lateness_p99_ms=40.0, events_per_s=3.5)


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


@pytest.mark.parametrize("width", [100, 160])
def test_the_view_of_a_recorded_state(width: int) -> None:
    frame = render(snapshot(), width)
    assert frame.errors == ()
    text = text_of(frame.renderable, width)
    assert all(len(line) <= width for line in text.splitlines())

    # ties in the next instant: both shown, in a stable order
    a, b = text.index("a-tie"), text.index("b-tie")
    assert a < b

    # every recent run with its state and why
    def row(run_id: str) -> str:
        found = lines_with(text, run_id)
        assert len(found) == 1, (run_id, found)  # one line: nothing wraps
        return found[0]

    assert "SUCCEEDED" in row("r_ok")
    assert "RETRY_WAIT" in row("r_retry") and "transient: Conn" in row("r_retry")
    if width >= 160:
        assert "transient: ConnectionError: refused · retry 2 at 08:55:03" in row("r_retry")
    dead = row("r_dead")
    assert "DEAD" in dead and "permanent_error" in dead and "…" in dead
    skip = row("r_skip")
    assert "SKIPPED" in skip and "coalesced" in skip
    assert "SKIPPED" in row("r_over") and "overlap" in row("r_over")
    cancelled = row("r_cancel")
    assert "CANCELLED" in cancelled and "[bold]wrong params[/]" in cancelled  # not markup

    # long names are cut with an ellipsis, never wrapped onto other lines
    assert LONG_ID not in text and LONG_JOB not in text
    assert LONG_ID[:30] in text and "…" in text
    long_rows = lines_with(text, LONG_ID[:9])
    assert len(long_rows) == 2  # one upcoming row, one recent row
    assert all("…" in line for line in long_rows)
    assert "start lateness p50 12 ms  p99 40 ms" in text


def test_recent_results_keep_the_newest_state_of_each_run() -> None:
    recent = recorded()
    ok = m.ResultPublished(run_id="r_retry", attempt=2, fence=5, worker_id="w",
                           checksum="sha256:cd", size=2, finished_at=NOW)
    recent(0, [_env("flaky", ok, NOW)])
    last = recent.outcomes(10)[-1]
    assert (last.run_id, last.state, last.attempt, last.fence, last.error) == (
        "r_retry", "SUCCEEDED", 2, 5, None)
    assert [o.run_id for o in recent.outcomes(10)].count("r_retry") == 1
    dead = next(o for o in recent.outcomes(10) if o.run_id == "r_dead")
    assert dead.state == "DEAD" and dead.reason == "permanent_error"
    assert dead.error is not None and dead.error.startswith("permanent: no region")
    assert dead.job_type == LONG_JOB


def test_a_section_that_fails_is_shown_not_raised() -> None:
    broken = Snapshot(now=NOW, api="http://x", recent=(
        Outcome(at=NOW, tenant="default", schedule_id="s", run_id="r_x", state="SKIPPED",
                count=None),))  # type: ignore[arg-type]
    frame = render(broken)
    assert [name for name, _ in frame.errors] == ["recent results"]
    text = text_of(frame.renderable, 100)
    assert "live view error (recent results)" in text
    assert "TypeError: '>' not supported between instances of 'NoneType' and 'int'" in text
    assert "upcoming" in text and "start lateness" in text  # the other sections are drawn


class _Node:
    host, port = "127.0.0.1", 8080

    def __init__(self, parts: dict[str, Any]) -> None:
        self.parts = parts


async def test_a_failing_frame_is_shown_and_logged_once_per_distinct_error() -> None:
    calls = 0

    async def failing(node: Any) -> Snapshot:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise TypeError("'<' not supported between instances of 'ScheduleState' and "
                            "'ScheduleState'")
        if calls == 4:
            raise KeyError("processor")
        return snapshot()

    view = LiveView(_Node({}), gather_=failing)
    with structlog.testing.capture_logs() as logs:
        frames = [text_of(await view.frame(), 120) for _ in range(5)]
    assert "live view error (gathering)" in frames[0]
    assert "TypeError: '<' not supported between instances of 'ScheduleState'" in frames[0]
    assert "KeyError: 'processor'" in frames[3]
    assert "recent results" in frames[4] and "live view error" not in frames[4]
    failures = [e for e in logs if e["event"] == "live_view_failed"]
    assert [f["error"].split(":")[0] for f in failures] == ["TypeError", "KeyError"]
    assert "Traceback" in failures[0]["traceback"]


async def test_gather_reads_a_node_and_the_render_is_clean() -> None:
    class Proc:
        class stats:  # shaped like ProcessorStats
            commands, transactions, offers = 7, 3, 40

        def __init__(self, states: ScheduleStore) -> None:
            self.partitions = {0: type("P", (), {"states": states})}

    due = datetime.now(UTC) + timedelta(minutes=1)
    states = ScheduleStore(timedelta(0), next_wakeup)
    for sid in ("z", "y", "x"):  # the same next instant: sorting must not compare states
        st = ScheduleState("default", sid)
        st.status, st.next_due_at, st.next_run_at = "ACTIVE", due, due
        states.put(f"default/{sid}", st)
    # held as the processor holds them: idle ones cold, one read again (hot)
    assert states.cool(datetime.now(UTC)) and states.get("default/y") is not None
    assert states.cold == 2 and states.hot == 1
    snap = await gather(_Node({"processor": Proc(states), "recent": recorded()}))
    assert [u.schedule_id for u in snap.upcoming] == ["x", "y", "z"]
    assert snap.commands == 7 and snap.schedules == 3 and len(snap.recent) == 6
    frame = render(snap)
    assert frame.errors == ()
    assert "x" in text_of(frame.renderable, 120)


def test_the_error_panel_holds_the_exception_line() -> None:
    text = text_of(error_panel(ValueError("bad\nvalue"), "drawing"), 80)
    assert "live view error (drawing)" in text and "ValueError: bad value" in text


async def test_an_event_the_view_cannot_record_never_reaches_the_processor() -> None:
    recent = recorded()
    bad = _env("odd", m.ResultPublished(run_id="r_odd", attempt=1, fence=1, worker_id="w",
                                        checksum="sha256:ab", size=2, finished_at=NOW), NOW)
    recent._set = None  # type: ignore[assignment,method-assign]  # a bug in recording
    with structlog.testing.capture_logs() as logs:
        recent(0, [bad, bad])  # called inside the processor's commit: must not raise
    assert recent.failed == 2
    assert [e["where"] for e in logs if e["event"] == "live_view_failed"] == ["recording"]
    snap = await gather(_Node({"recent": recent}))
    assert any("2 events could not be recorded" in p for p in snap.problems)
    text = text_of(render(snap, 120).renderable, 120)
    assert "2 events could not be recorded (last: TypeError" in text


def test_every_state_the_live_view_shows_is_one_the_runs_filter_accepts() -> None:
    from chronolog.queries.read_model import RUN_STATES, parse_run_states

    recent = recorded()
    t = NOW - timedelta(minutes=1)
    recent(0, [  # a failed attempt and an expired lease, before the processor moves the run
        _env("flaky", _materialized("r_failing", "fail", t), t),
        _env("flaky", m.AttemptFailed(run_id="r_failing", attempt=1, fence=1, worker_id="w",
                                      error_class="transient"), t),
        _env("flaky", _materialized("r_lapsed", "fail", t), t),
        _env("flaky", m.LeaseExpired(run_id="r_lapsed", attempt=1, fence=2,
                                     lease_until=t), t)])
    shown = {o.state for o in recent.outcomes(20)}
    assert {"SUCCEEDED", "RETRY_WAIT", "DEAD", "SKIPPED", "CANCELLED", "LEASED"} <= shown
    for state in shown:
        assert state in RUN_STATES
        assert parse_run_states(state.lower()) == [state]  # what `runs --state` and the API use


# ---------------------------------------------------------------------------------------
# fitting the screen: 80x24, 120x40, 200x50


def busy(tenants: tuple[str, ...] = ("default",)) -> Snapshot:
    """A node with more to show than 80x24 holds: eight schedules due, twelve attempts
    running (eight known), ten recent results, three runs waiting, a restart and a problem."""
    def tenant(i: int) -> str:
        return tenants[i % len(tenants)]

    upcoming = tuple(Upcoming(tenant(i), f"report-{i}", "reports.daily",
                              NOW + timedelta(minutes=i + 1), "ACTIVE") for i in range(6))
    running = tuple(Running(f"r_run{i:02d}", tenant(i), f"sync-{i}", "sync.accounts", 1,
                            10 + i, f"worker-{i}", NOW + timedelta(seconds=30 + i))
                    for i in range(8))
    recent = list(recorded().outcomes(10))
    recent = [o if o.job_type else replace(o, job_type="reports.weekly") for o in recent]
    recent += [Outcome(NOW - timedelta(seconds=30 - i), tenant(i), f"ping-{i}", f"r_ping{i}",
                       "SUCCEEDED", "http.ping", 1, 2) for i in range(4)]
    waiting = tuple(Waiting(tenant(i), f"gpu-{i}", f"r_wait{i}", "no worker for class gpu")
                    for i in range(3))
    return Snapshot(now=NOW, api="http://127.0.0.1:8080", schedules=40, upcoming=upcoming,
                    running=running, running_total=12, recent=tuple(recent), waiting=waiting,
                    restarts=(Restart("projector", "ConnectionError: database away", 2,
                                      NOW - timedelta(seconds=20)),),
                    lateness_p50_ms=12.0, lateness_p99_ms=40.0, events_per_s=3.5,
                    commands=1234, offers=98765, transactions=456,
                    problems=("runs waiting to start: OSError: connection refused",))


def screen(width: int, height: int, snap: Snapshot | None = None) -> list[str]:
    frame = render(busy() if snap is None else snap, width, height)
    assert frame.errors == ()
    return [line.rstrip() for line in text_of(frame.renderable, width).splitlines()]


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (200, 50)])
def test_the_live_view_fits_the_screen_with_every_section(width: int, height: int) -> None:
    lines = screen(width, height)
    text = "\n".join(lines)
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    assert len(lines) <= height
    for title in ("upcoming", "running attempts", "waiting to start", "recent results"):
        assert any(line.startswith(title) for line in lines), title
    header = {title: lines[next(i for i, line in enumerate(lines) if line.startswith(title))
                           + 1] for title in ("upcoming", "running attempts", "recent results")}
    for column in ("schedule", "job", "next (UTC)", "in"):
        assert column in header["upcoming"]
    for column in ("schedule", "job", "attempt", "lease until"):
        assert column in header["running attempts"]
    for column in ("at", "schedule", "job", "state", "reason / last error"):
        assert column in header["recent results"]
    assert "projector failed (ConnectionError: database away)" in text
    assert "OSError: connection refused" in text
    # the status line and the API's address, at the bottom
    assert lines[-2].startswith("start lateness p50 12 ms  p99 40 ms   events/s 3.5")
    assert "commands 1234" in lines[-2]
    assert lines[-1].startswith("API http://127.0.0.1:8080   schedules 40")


def test_a_short_screen_shows_fewer_rows_and_says_how_many() -> None:
    lines = screen(80, 24)
    assert any(line.startswith("recent results (") and "of 10)" in line for line in lines)
    assert any(line.startswith("running attempts (") and "of 12)" in line for line in lines)
    # the newest results are the ones kept
    assert any("ping-3" in line for line in lines)
    tall = screen(200, 50)
    assert "running attempts (8 of 12)" in tall  # all eight known of the twelve
    assert "recent results" in tall and "upcoming" in tall


def test_a_wide_screen_shows_extra_columns_sized_to_their_content() -> None:
    narrow, wide = screen(80, 24), screen(200, 50)

    def header(lines: list[str], title: str) -> str:
        return lines[next(i for i, line in enumerate(lines) if line.startswith(title)) + 1]

    for title, extras in (("running attempts", ("run", "fence", "worker")),
                          ("recent results", ("run", "att/fence")), ("upcoming", ("state",))):
        for extra in extras:
            assert extra not in header(narrow, title).split(), (title, extra)
            assert extra in header(wide, title).split(), (title, extra)
    assert "transactions 456" not in "\n".join(narrow) and "transactions 456" in wide[-2]
    # the schedule column is as wide as its longest name, not the leftover of the screen
    upcoming_header = wide[wide.index("upcoming") + 1]
    assert upcoming_header.index("job") - upcoming_header.index("schedule") <= len(
        "report-5") + 3


def test_schedules_are_named_with_their_tenant_only_when_several_are_shown() -> None:
    one = "\n".join(screen(200, 50))
    assert "default/" not in one and "report-1" in one and "gpu-1" in one
    two = "\n".join(screen(200, 50, busy(("default", "acme"))))
    for name in ("default/report-0", "acme/report-1", "acme/sync-1", "default/gpu-0",
                 "acme/gpu-1", "acme/ping-1"):
        assert name in two, name  # the same naming in every table


def test_a_dead_run_says_its_error_once() -> None:
    recent = Recent()
    t = NOW - timedelta(seconds=5)
    recent(0, [
        _env("geo", _materialized("r_geo", "geo.lookup", t), t),
        _env("geo", m.AttemptFailed(run_id="r_geo", attempt=1, fence=2, worker_id="w",
                                    error_class="permanent", message="no region eu-x"), t),
        _env("geo", m.OccurrenceDeadLettered(run_id="r_geo", reason="permanent_error",
                                             message="no region eu-x"), t),
        _env("poll", _materialized("r_poll", "http.ping", t), t),
        _env("poll", m.AttemptFailed(run_id="r_poll", attempt=3, fence=5, worker_id="w",
                                     error_class="transient", message="timeout"), t),
        _env("poll", m.OccurrenceDeadLettered(run_id="r_poll", reason="max_attempts",
                                              message="3 attempts used"), t)])
    snap = Snapshot(now=NOW, api="http://x", recent=tuple(recent.outcomes(10)))
    for width in (80, 200):
        text = text_of(render(snap, width, 24).renderable, width)
        geo = lines_with(text, "geo")
        assert len(geo) == 1 and "DEAD" in geo[0]
        assert text.count("no region") == 1
    wide = text_of(render(snap, 200).renderable, 200)
    assert "permanent_error · permanent: no region eu-x" in wide
    assert "max_attempts: 3 attempts used · transient: timeout" in wide


async def test_a_skipped_run_shows_its_schedules_job() -> None:
    from chronolog.commands.state import policy_for

    class Proc:
        class stats:
            commands, transactions, offers = 0, 0, 0

        def __init__(self, states: ScheduleStore) -> None:
            self.partitions = {0: type("P", (), {"states": states})}

    st = ScheduleState("default", "paused-one")
    st.status, st.anchor = "PAUSED", NOW
    st.policy = policy_for(m.ScheduleSpec(every=60, job=m.JobSpec(type="billing.close")))
    states = ScheduleStore(timedelta(0), next_wakeup)
    states.put("default/paused-one", st)
    assert states.cool(NOW) == ["default/paused-one"]  # paused: held cold, in no bucket
    snap = await gather(_Node({"processor": Proc(states), "recent": recorded()}))
    skipped = [o for o in snap.recent if o.state == "SKIPPED"]
    assert [o.job_type for o in skipped] == ["billing.close", "billing.close"]
    for width in (80, 200):
        rows = lines_with(text_of(render(snap, width, 24).renderable, width), "SKIPPED")
        assert len(rows) == 2 and all("billing.close" in row for row in rows)
