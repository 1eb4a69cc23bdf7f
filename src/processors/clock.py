"""The processor's clock: the wall clock, watched for steps (docs/design.md §24).

Every decision of a processor takes its time from one reading of ``ClockGuard``: the host's
wall clock, compared at each reading with a clock that cannot be set — the time since boot
(``CLOCK_BOOTTIME`` on Linux, which keeps counting through a suspend; ``time.monotonic``
elsewhere). Between two readings the wall clock should advance as much as that one does; NTP
slews it by at most 0.5 ms a second. A difference larger than ``bound_s`` is a *step* (an
operator's ``date -s``, NTP stepping a clock that was far off, a VM restored from a snapshot).

What a step does (README, "Time and clocks"):

* it is *held*: the processor's time goes on from where it was, at the rate of the clock
  that cannot be set, as if the step had not happened — instants are not fired early by a
  forward step, nor leases ended early; nothing is decided twice after a backward one. The
  step is logged (``clock_step_detected``) and counted (``ClockGuard.steps``);
* it is *cleared* when the wall clock comes back within ``bound_s`` of the processor's time
  (the step was undone: ``clock_step_cleared``);
* it is *accepted* once it has held its size for ``hold_s`` with no further step (None: never;
  a restart of the processor accepts it too — a new process trusts the clock it starts on):
  from then on the processor's time is the wall clock again (``clock_step_accepted``). After
  a forward step the instants it skipped fall due at once (late, by the new clock, as after
  a downtime; each schedule's misfire policy applies); after a backward step the
  processor's time stands still until the wall clock passes it: it never goes back.

The processor's time never goes back in any case: each reading is at least the previous one.
Pure but for its two clocks, both injected (``wall``, ``mono``): tests drive it
deterministically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from chronolog.environment import uptime, utc_now

__all__ = ["CLOCK_STEP_HOLD_S", "CLOCK_STEP_S", "ClockGuard"]

log = structlog.get_logger("chronolog.processor")

# ``chronolog processor`` / ``chronolog dev`` defaults (env CHRONOLOG_CLOCK_STEP and
# CHRONOLOG_CLOCK_STEP_HOLD): a step is a jump of more than 30 s between two readings, and one
# that holds its size for 5 minutes is followed
CLOCK_STEP_S = 30.0
CLOCK_STEP_HOLD_S = 300.0

_ZERO = timedelta(0)


@dataclass
class ClockSteps:
    """What the guard saw (``Processor.clock_guard.steps``)."""

    forward: int = 0  # steps detected, by direction
    backward: int = 0
    cleared: int = 0  # held steps undone by the wall clock
    accepted: int = 0  # held steps followed after the hold
    held_s: float = 0.0  # the step held now: wall clock minus the processor's time (0: none)
    last_s: float = 0.0  # the size of the last step detected (+ forward, - backward)


class ClockGuard:
    """``guard()``: the processor's time — the wall clock, with steps held (module doc)."""

    def __init__(self, wall: Callable[[], datetime] = utc_now,
                 mono: Callable[[], float] = uptime, *, bound_s: float = CLOCK_STEP_S,
                 hold_s: float | None = CLOCK_STEP_HOLD_S) -> None:
        if not bound_s > 0:
            raise ValueError(f"clock step bound must be more than 0 s, not {bound_s}")
        self.wall = wall
        self.mono = mono
        self.bound = timedelta(seconds=bound_s)
        self.hold_s = hold_s
        self.steps = ClockSteps()
        self._now: datetime | None = None  # the last time handed out
        self._last_wall: datetime | None = None
        self._last_mono = 0.0
        self._offset = _ZERO  # added to the wall clock: minus the step held
        self._held_since = 0.0  # mono reading when the step held now was (last) detected

    @property
    def held(self) -> bool:
        """Whether a step is held now (the processor's time is not the wall clock's)."""
        return self._offset != _ZERO

    def __call__(self) -> datetime:
        wall, mono = self.wall(), self.mono()
        last_wall, self._last_wall = self._last_wall, wall
        last_mono, self._last_mono = self._last_mono, mono
        if last_wall is None or self._now is None:
            self._now = wall
            return wall
        jump = (wall - last_wall) - timedelta(seconds=mono - last_mono)
        if abs(jump) > self.bound:
            self._step(jump, mono)
        now = wall + self._offset
        if self._offset != _ZERO and self.hold_s is not None \
                and mono - self._held_since >= self.hold_s:
            self._accept(wall, now)
            now = max(now, wall)  # forward: the wall clock; backward: where it was
        if now < self._now:
            now = self._now  # never back: it stands still until the wall clock passes it
        self._now = now
        return now

    def _step(self, jump: timedelta, mono: float) -> None:
        s = self.steps
        forward = jump > _ZERO
        if forward:
            s.forward += 1
        else:
            s.backward += 1
        s.last_s = jump.total_seconds()
        self._offset -= jump
        self._held_since = mono
        if abs(self._offset) <= self.bound:  # this step undid the one held
            self._offset = _ZERO
            s.cleared += 1
            s.held_s = 0.0
            log.warning("clock_step_cleared", step_s=round(s.last_s, 3),
                        bound_s=self.bound.total_seconds())
            return
        s.held_s = -self._offset.total_seconds()
        log.warning("clock_step_detected", direction="forward" if forward else "backward",
                    step_s=round(s.last_s, 3), held_s=round(s.held_s, 3),
                    bound_s=self.bound.total_seconds(), hold_s=self.hold_s)

    def _accept(self, wall: datetime, now: datetime) -> None:
        s = self.steps
        held = s.held_s
        self._offset = _ZERO
        s.accepted += 1
        s.held_s = 0.0
        log.warning("clock_step_accepted", held_s=round(held, 3), hold_s=self.hold_s,
                    standstill_s=round(max(0.0, (now - wall).total_seconds()), 3))
