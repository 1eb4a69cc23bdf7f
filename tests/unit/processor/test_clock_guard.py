"""The processor's clock-step guard (``chronolog.processors.clock``, docs/design.md §24),
driven by two fake clocks: the wall clock (which can be stepped) and the clock that cannot
be set. No sleeps: each test moves both clocks itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import structlog

from chronolog.log.memory import MemoryEventLog
from chronolog.processors.clock import ClockGuard
from chronolog.processors.config import ProcessorConfig
from chronolog.processors.runtime import Processor
from chronolog.settings import ConfigError, clock_step_from_env

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Clocks:
    """A wall clock and an uptime clock; ``run(s)`` advances both, ``step(s)`` the wall."""

    def __init__(self) -> None:
        self.wall_at = T0
        self.up = 1000.0

    def wall(self) -> datetime:
        return self.wall_at

    def mono(self) -> float:
        return self.up

    def run(self, seconds: float) -> None:
        self.wall_at += timedelta(seconds=seconds)
        self.up += seconds

    def step(self, seconds: float) -> None:
        self.wall_at += timedelta(seconds=seconds)


def guard(c: Clocks, bound_s: float = 30.0, hold_s: float | None = 300.0) -> ClockGuard:
    g = ClockGuard(c.wall, c.mono, bound_s=bound_s, hold_s=hold_s)
    assert g() == T0  # the first reading is the wall clock's
    return g


def seconds_after_t0(t: datetime) -> float:
    return (t - T0).total_seconds()


def test_a_forward_step_beyond_the_bound_is_held_and_logged() -> None:
    c = Clocks()
    g = guard(c)
    c.run(1)
    assert seconds_after_t0(g()) == 1
    c.step(600)
    with structlog.testing.capture_logs() as logs:
        now = g()
    # the processor's time goes on from where it was: nothing 10 minutes ahead is due
    assert seconds_after_t0(now) == 1
    assert g.held and g.steps.forward == 1 and g.steps.held_s == 600
    [line] = logs
    assert line["event"] == "clock_step_detected" and line["direction"] == "forward"
    assert line["step_s"] == 600 and line["held_s"] == 600
    # ... and keeps going at the rate of the clock that cannot be set
    for _ in range(10):
        c.run(5)
        assert seconds_after_t0(g()) == 1 + 5 * (_ + 1)
    assert g.steps.forward == 1  # detected once, not at every reading


def test_drift_and_slew_below_the_bound_pass_unheld() -> None:
    c = Clocks()
    g = guard(c, bound_s=30.0)
    # NTP slewing the wall clock by 0.5 ms/s, and a correction of 29 s in one go: followed
    for _ in range(100):
        c.run(10)
        c.step(0.005)
        g()
    c.run(1)
    c.step(29)
    now = g()
    assert seconds_after_t0(now) == pytest.approx(1001 + 0.5 + 29)
    assert not g.held and g.steps.forward == g.steps.backward == 0


def test_a_small_backward_slew_never_moves_the_time_back() -> None:
    c = Clocks()
    g = guard(c)
    c.run(10)
    first = g()
    c.step(-2)  # below the bound: not a step, but the time handed out does not go back
    assert g() == first
    c.run(1)
    assert g() == first  # the wall clock (9 s) has not passed it yet
    c.run(1.5)
    assert seconds_after_t0(g()) == 10.5
    assert not g.held


def test_a_backward_step_keeps_the_time_going_forward_and_the_wall_coming_back_clears_it(
) -> None:
    c = Clocks()
    g = guard(c)
    c.run(100)
    before = g()
    c.step(-600)
    with structlog.testing.capture_logs() as logs:
        held = g()
    assert held == before  # not 10 minutes back: nothing materialized is due again
    assert g.steps.backward == 1 and g.steps.held_s == -600
    assert logs[0]["event"] == "clock_step_detected" and logs[0]["direction"] == "backward"
    readings = [held]
    for _ in range(20):
        c.run(3)
        readings.append(g())
    assert readings == sorted(readings)  # monotone, at the uptime clock's rate
    assert seconds_after_t0(readings[-1]) == 160
    # the wall clock is set right again: the step is cleared, no second step is held
    c.step(600)
    with structlog.testing.capture_logs() as logs:
        after = g()
    assert seconds_after_t0(after) == 160
    assert not g.held and g.steps.cleared == 1 and g.steps.forward == 1
    assert [line["event"] for line in logs] == ["clock_step_cleared"]


def test_a_forward_step_that_holds_is_accepted_after_the_hold() -> None:
    c = Clocks()
    g = guard(c, hold_s=300)
    c.step(600)
    g()
    c.run(299)
    assert seconds_after_t0(g()) == 299  # still held
    c.run(1)
    with structlog.testing.capture_logs() as logs:
        now = g()
    # followed from now on: the instants of the skipped 10 minutes are due (late)
    assert seconds_after_t0(now) == 900
    assert not g.held and g.steps.accepted == 1
    assert logs[0]["event"] == "clock_step_accepted" and logs[0]["held_s"] == 600
    c.run(1)
    assert seconds_after_t0(g()) == 901


def test_a_further_step_restarts_the_hold() -> None:
    c = Clocks()
    g = guard(c, hold_s=300)
    c.step(600)
    g()
    c.run(200)
    c.step(120)  # another step before the first was accepted: the hold starts again
    g()
    assert g.steps.held_s == 720
    c.run(299)
    assert seconds_after_t0(g()) == 499
    c.run(1)
    assert seconds_after_t0(g()) == 500 + 720


def test_an_accepted_backward_step_stands_still_until_the_wall_clock_passes() -> None:
    c = Clocks()
    g = guard(c, hold_s=60)
    c.step(-600)
    g()
    c.run(60)
    with structlog.testing.capture_logs() as logs:
        accepted = g()
    assert seconds_after_t0(accepted) == 60  # never back
    assert logs[0]["event"] == "clock_step_accepted" and logs[0]["standstill_s"] == 600
    for _ in range(10):
        c.run(59)
        assert g() == accepted  # the wall clock (-540 s ... +50 s) is still behind
    c.run(20)  # the wall clock reads 60 + 10 s now
    assert seconds_after_t0(g()) == 70
    assert not g.held and g.steps.backward == 1 and g.steps.accepted == 1


def test_a_hold_of_none_holds_until_the_wall_comes_back() -> None:
    c = Clocks()
    g = guard(c, hold_s=None)
    c.step(600)
    g()
    c.run(86_400)
    assert seconds_after_t0(g()) == 86_400
    assert g.held


def test_the_bound_must_be_positive() -> None:
    c = Clocks()
    with pytest.raises(ValueError, match="more than 0"):
        ClockGuard(c.wall, c.mono, bound_s=0)


def test_the_processor_reads_its_time_through_the_guard_when_configured() -> None:
    c = Clocks()
    lg = MemoryEventLog()
    plain = Processor(lg, "p1", clock=c.wall)
    assert plain.clock_guard is None and plain.clock == c.wall  # the library's default
    guarded = Processor(lg, "p2", config=ProcessorConfig(clock_step_s=30.0), clock=c.wall)
    assert guarded.clock_guard is not None and guarded.clock is guarded.clock_guard
    assert guarded.clock_guard.wall == c.wall and guarded.clock_guard.hold_s == 300.0


def test_the_environment_sets_the_bound_and_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    assert clock_step_from_env(30.0, 300.0) == (30.0, 300.0)
    monkeypatch.setenv("CHRONOLOG_CLOCK_STEP", "10s")
    monkeypatch.setenv("CHRONOLOG_CLOCK_STEP_HOLD", "2m")
    assert clock_step_from_env(30.0, 300.0) == (10.0, 120.0)
    monkeypatch.setenv("CHRONOLOG_CLOCK_STEP", "off")
    monkeypatch.setenv("CHRONOLOG_CLOCK_STEP_HOLD", "never")
    assert clock_step_from_env(30.0, 300.0) == (None, None)
    monkeypatch.setenv("CHRONOLOG_CLOCK_STEP", "0s")
    with pytest.raises(ConfigError, match="CHRONOLOG_CLOCK_STEP"):
        clock_step_from_env(30.0, 300.0)
