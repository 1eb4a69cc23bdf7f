"""The rows a schedule state implies (``chronolog.projections.window.state_rows`` and
``effect_rows``, docs/design.md §9 "Replay of the window") are the projection's rows of the
same history in every column but the stand-ins (``STAND_INS``).

The stateful property drives the decider's machine (random specs, every command kind, clock
advances; tests/unit/decider/test_invariants.py), keeps each event with its authority time,
and after every step compares, for each schedule, the rows its state gives with the rows
``project_batch`` gives for its whole history: the same schedules, runs and effects rows
for every state-made row, equal in each column a state carries."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from chronolog.commands.aggregate import Decision
from chronolog.commands.quota import decide_quota, evolve_quota
from chronolog.commands.state import CalendarHome, QuotaState
from chronolog.domain import messages as m
from chronolog.domain.calendars import CalendarSpec
from chronolog.domain.ids import calendar_id
from chronolog.projections.project import project_batch
from chronolog.projections.store import First, RowChanges
from chronolog.projections.window import STAND_INS, effect_rows, state_rows
from support.decider import SCHEDULE, T0, Story, complete, sec
from unit.decider.test_invariants import TENANT, DeciderMachine

BEFORE = datetime(2000, 1, 1, tzinfo=UTC)  # the stand-in: before every event of the machine
DEFAULTS = {"cancellation_requested": False, "fence": 0}  # the columns' defaults


def _value(v: Any) -> Any:
    return v.value if isinstance(v, First) else v


def _agree(made: RowChanges, projected: RowChanges, table: str) -> None:
    rows = projected.table(table)
    for key, row in made.table(table).items():
        assert key in rows, (table, key)
        for col, value in row.items():
            if col in STAND_INS[table]:
                continue
            want = _value(rows[key].get(col, DEFAULTS.get(col)))
            assert _value(value) == want, (table, key, col, value, want)


class WindowRowsMachine(DeciderMachine):
    """The decider's machine, keeping the envelopes each decision's events make."""

    def __init__(self) -> None:
        super().__init__()
        self.envelopes: dict[str, list[m.EventEnvelope]] = {}

    def _do(self, sid: str, payload: Any) -> Decision:
        decision = super()._do(sid, payload)
        for event in decision.events:
            self.envelopes.setdefault(sid, []).append(m.EventEnvelope(
                event_id=f"e{len(self.envelopes.get(sid, []))}", type=event.type,
                key=f"{TENANT}/{sid}", tenant=TENANT, schedule_id=sid, at=self.now,
                payload=event))
        return decision

    @invariant()
    def a_states_rows_are_the_projections_in_every_column_it_carries(self) -> None:
        for sid, state in self.states.items():
            projected = project_batch(self.envelopes.get(sid, []))
            _agree(state_rows([state], BEFORE), projected, "schedules")
            _agree(state_rows([state], BEFORE), projected, "runs")
            _agree(effect_rows([state], BEFORE), projected, "effects")


WindowRowsMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestStateRowsAreTheProjectionsRows = WindowRowsMachine.TestCase
TestStateRowsAreTheProjectionsRows.pytestmark = [  # type: ignore[attr-defined]
    pytest.mark.exhaustive]


def test_the_effects_of_a_states_runs_are_the_projections_in_every_column_it_carries() -> None:
    story = Story().create(T0, effects=[{"kind": "webhook", "destination": "d-webhook"}])
    [occ] = story.materialize(T0)
    claimed = story.claim(occ.run_id, T0 + sec(1))
    story.given(complete(claimed), T0 + sec(2))
    envelopes = [m.EventEnvelope(event_id=f"e{i}", type=e.type, key=f"{TENANT}/{SCHEDULE}",
                                 tenant=TENANT, schedule_id=SCHEDULE, at=T0 + sec(2),
                                 payload=e) for i, e in enumerate(story.history)]
    made = effect_rows([story.state], BEFORE)
    assert len(made.effects) == 1
    _agree(made, project_batch(envelopes), "effects")
    [row] = made.effects.values()
    assert (row["kind"], row["state"], row["created_at"]) == ("webhook", "INTENDED", First(BEFORE))


def test_a_calendars_state_implies_the_calendars_row_its_events_project() -> None:
    home = QuotaState(TENANT, calendar_id("hol"))
    envelopes: list[m.EventEnvelope] = []
    steps: list[Any] = [m.PutCalendar(name="hol", spec=CalendarSpec(dates=(date(2026, 12, 25),))),
                        m.PutCalendar(name="hol", spec=CalendarSpec(timezone="Europe/Paris"),
                                      expected_revision=1)]
    for i, payload in enumerate(steps):
        env = m.CommandEnvelope(command_id=f"c{i}", type=payload.type, tenant=TENANT,
                                principal="ops", schedule_id=home.schedule_id, issued_at=T0,
                                payload=payload)
        for event in decide_quota(home, env, T0, None).events:
            evolve_quota(home, event)
            envelopes.append(m.EventEnvelope(
                event_id=f"c{i}.0", type=event.type, key=f"{TENANT}/{home.schedule_id}",
                tenant=TENANT, schedule_id=home.schedule_id, at=T0 + sec(i), payload=event))
    made = state_rows([], BEFORE, [home, QuotaState(TENANT, calendar_id("never"))])
    _agree(made, project_batch(envelopes), "calendars")
    assert list(made.table("calendars")) == [(TENANT, "hol")]  # one never put: no row
    assert made.table("calendars")[(TENANT, "hol")]["revision"] == 2
    deleted = QuotaState(TENANT, home.schedule_id)
    deleted.calendar = CalendarHome("hol", 3, None)
    row = state_rows([], BEFORE, [deleted]).table("calendars")[(TENANT, "hol")]
    assert (row["revision"], row["spec"], _value(row["deleted_at"])) == (3, None, BEFORE)
