"""The hot/cold schedule store (``chronolog.processors.schedule_store``): a dict of states
whose idle ones are held as their snapshot bytes, hydrated exactly as they were."""

from __future__ import annotations

import tracemalloc
from datetime import datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given as for_all
from hypothesis import settings
from hypothesis import strategies as hs

from chronolog.commands.decider import decide, evolve, next_wakeup
from chronolog.commands.state import ScheduleState, initial_state
from chronolog.commands.state_codec import encode_schedule
from chronolog.domain import messages as m
from chronolog.log.record_codec import pack
from chronolog.processors.schedule_store import SEAL_SIZE, ScheduleStore, seal, unseal, unsealed
from support.decider import T0, TENANT, envelope, spec
from support.states import every_field

HOUR = timedelta(hours=1)
_ID, _REF = 1, 4  # a schedule body's schedule ID and spec reference (state_codec)


def created(sid: str, every: float = 3600.0, params: dict[str, Any] | None = None,
            ) -> ScheduleState:
    """A schedule created at T0: every ``every`` seconds from ``T0 + every``, job params
    ``params``."""
    s = initial_state(TENANT, sid)
    sp = spec(every=every, start=T0 + timedelta(seconds=every),
              job={"type": "report", "params": params or {"n": 1}})
    dec = decide(s, envelope(m.CreateSchedule(spec=sp), sid, command_id=f"c-{sid}"), T0)
    assert dec.ok
    for e in dec.events:
        evolve(s, e)
    return s


def store(horizon: timedelta | None = HOUR) -> ScheduleStore:
    return ScheduleStore(horizon, next_wakeup)


def test_an_idle_state_goes_cold_and_is_hydrated_equal_to_the_original() -> None:
    # given a daily schedule, whose next instant is a day away
    s = created("daily", every=86400.0)
    before, data = every_field(s), seal(s, next_wakeup(s))
    st = store()
    st.put("acme/daily", s)
    # when it cools
    assert st.cool(T0) == ["acme/daily"]
    # then it is held as its sealed bytes (quiet, its wake-up, its encoded state), and
    # reading it gives a state equal to the original
    assert st.is_cold("acme/daily") and st.hot == 0 and len(st) == 1
    assert list(st.cold_items()) == [("acme/daily", data)]
    back = st.get("acme/daily")
    assert back is not None and back is not s
    assert every_field(back) == before
    assert not st.is_cold("acme/daily") and "acme/daily" in st


def test_a_state_whose_wakeup_is_within_the_horizon_stays_hot() -> None:
    # given an every-minute schedule
    st = store()
    st.put("acme/minutely", created("minutely", every=60.0))
    # when the store cools, then it stays an object
    assert st.cool(T0) == []
    assert st.hot == 1 and st.cold == 0


def test_without_a_horizon_nothing_goes_cold() -> None:
    st = store(None)
    st.put("acme/daily", created("daily", every=86400.0))
    assert st.cool(T0) == [] and st.hot == 1


def test_a_cold_state_is_warmed_once_its_wakeup_comes_within_the_horizon() -> None:
    # given a schedule due every two hours, cold
    s = created("two", every=7200.0)
    wake = next_wakeup(s)
    assert wake is not None
    st = store()
    st.put("acme/two", s)
    st.cool(T0)
    # when the sweep runs before its wake-up is within the horizon, nothing is warmed
    assert st.warm(wake - HOUR - timedelta(minutes=2)) == []
    assert st.is_cold("acme/two")
    # when it runs once it is, the state comes back hot, ahead of its instant
    warmed = st.warm(wake - HOUR)
    assert [k for k, _ in warmed] == ["acme/two"]
    assert every_field(warmed[0][1]) == every_field(s)
    # and a later sweep does not warm it twice
    assert st.warm(wake) == []


def test_a_key_cooled_again_with_a_later_wakeup_is_not_lost_by_a_stale_bucket() -> None:
    s = created("two", every=7200.0)
    st = store()
    st.put("acme/two", s)
    st.cool(T0)
    st.get("acme/two")  # a command reads it (hot again) ...
    st.cool(T0)  # ... and it goes cold again under the same wake-up
    wake = next_wakeup(s)
    assert wake is not None
    assert [k for k, _ in st.warm(wake - HOUR)] == ["acme/two"]


def test_pop_and_put_cover_both_forms() -> None:
    st = store()
    st.put("acme/a", created("a", every=86400.0))
    st.put("acme/b", created("b", every=60.0))
    st.cool(T0)
    assert sorted(st) == ["acme/a", "acme/b"]
    popped = st.pop("acme/a")
    assert popped is not None and popped.schedule_id == "a"
    assert "acme/a" not in st and st.pop("acme/a") is None and len(st) == 1


def test_a_restored_cold_state_is_hydrated_without_being_decoded_before() -> None:
    # given the sealed bytes a snapshot stores for a state
    s = created("daily", every=86400.0)
    first = store()
    first.put("acme/daily", s)
    first.cool(T0)
    (key, data), = first.cold_items()
    restored = store()
    for h, shape in first.shapes().items():
        restored.add_shape(h, shape)
    # when a new store holds them cold, then it reads the same state back
    restored.put_cold(key, data)
    assert restored.cold == 1
    got = restored.get(key)
    assert got is not None and every_field(got) == every_field(s)


@settings(max_examples=30, deadline=None)
@for_all(hs.lists(hs.tuples(hs.sampled_from([60.0, 600.0, 3600.0, 7200.0, 86400.0]),
                            hs.integers(0, 5)), min_size=1, max_size=8),
         hs.integers(0, 48 * 60))
def test_cool_then_warm_round_trips_every_state(plans: list[tuple[float, int]],
                                               minutes: int) -> None:
    st = store()
    originals = {}
    for i, (every, n) in enumerate(plans):
        s = created(f"s{i}", every=every, params={"n": n})
        originals[f"acme/s{i}"] = every_field(s)
        st.put(f"acme/s{i}", s)
    now = T0 + timedelta(minutes=minutes)
    st.cool(now)
    st.warm(now + timedelta(hours=3))
    assert len(st) == len(originals)
    for key, fields in originals.items():
        got = st.get(key)
        assert got is not None and every_field(got) == fields


@pytest.mark.long(6)
def test_an_idle_schedule_costs_at_most_500_bytes_cold() -> None:
    # given 25,000 idle hourly and daily schedules with distinct job params and each its
    # own start, one template each encoded, so building them is not decide's cost (the
    # cost per schedule is the same at 100,000: the keys' table is a fixed share of each
    # entry)
    n = 25_000
    templates = [created("h", every=3600.0), created("d", every=86400.0)]
    st = store()
    for t in templates:
        st.put(f"acme/{t.schedule_id}", t)
    st.cool(T0 - timedelta(minutes=1))
    shapes = st.shapes()
    sealed = [dict(st.cold_items())[f"acme/{t.schedule_id}"] for t in templates]
    heads = [data[:SEAL_SIZE] for data in sealed]
    bodies = [orjson.loads(unsealed(data)) for data in sealed]
    cold = ScheduleStore(HOUR, next_wakeup)
    for h, shape in shapes.items():
        cold.add_shape(h, shape)
    # when they are held cold (keys, bytes and buckets allocated while traced)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            body = list(bodies[i % 2])
            spec_h, shape_h, _, own = body[_REF]
            body[_ID] = f"s{i:06d}"
            start = datetime.fromisoformat(own["start"]) + timedelta(seconds=i)
            body[_REF] = [f"{spec_h[:-6]}{i:06d}", shape_h, {"customer": f"c-{i:06d}"},
                          {"start": start.isoformat().replace("+00:00", "Z")}]
            cold.put_cold(f"acme/s{i:06d}", heads[i % 2] + pack(orjson.dumps(body)))
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    # then each costs at most 500 bytes, and reads back as its schedule
    assert cold.cold == n
    assert used / n <= 500, f"{used / n:.0f} B per idle schedule"
    got = cold.get("acme/s000007")
    assert got is not None and got.schedule_id == "s000007"
    assert got.policy is not None and got.policy.job.params == {"customer": "c-000007"}
    daily = templates[1].policy
    assert daily is not None and daily.spec.start is not None
    assert got.policy.spec.start == daily.spec.start + timedelta(seconds=7)


def test_sealed_bytes_say_whether_the_state_is_quiet_and_when_it_wakes() -> None:
    s = created("daily", every=86400.0)
    wake = next_wakeup(s)
    assert wake is not None
    quiet, us = unseal(seal(s, wake))
    assert quiet and us == int(wake.timestamp()) * 1_000_000 + wake.microsecond
    assert unseal(seal(s, None)) == (True, None)
    assert unsealed(seal(s, wake)) == encode_schedule(s)
    assert len(seal(s, wake)) < SEAL_SIZE + len(encode_schedule(s))  # compressed


def test_cool_looks_only_at_the_states_read_or_put_since_the_last_cool() -> None:
    # given a daily schedule that cooled, then was read through ``get`` (a command for it)
    st = store()
    st.put("acme/daily", created("daily", every=86400.0))
    assert st.cool(T0) == ["acme/daily"]
    assert not st.cooling
    st.get("acme/daily")
    assert st.cooling
    # when the store cools again, then it goes cold again; a ``peek`` does not hydrate it
    assert st.cool(T0) == ["acme/daily"]
    assert st.peek("acme/daily") is not None and st.is_cold("acme/daily")
    assert not st.cooling


def test_cool_and_warm_take_at_most_their_limit_and_leave_the_rest_for_the_next_call() -> None:
    st = store()
    for i in range(5):
        st.put(f"acme/s{i}", created(f"s{i}", every=7200.0))
    first = st.cool(T0, limit=2)
    assert len(first) == 2 and st.cooling
    rest = st.cool(T0, limit=10)
    assert len(rest) == 3 and st.cold == 5 and not st.cooling
    wake = next_wakeup(created("x", every=7200.0))
    assert wake is not None
    nw = st.next_warm()
    assert nw is not None and nw <= wake - HOUR
    got = st.warm(wake - HOUR, limit=3)
    assert len(got) == 3 and st.cold == 2
    assert len(st.warm(wake - HOUR, limit=3)) == 2 and st.cold == 0
    assert st.next_warm() is None


def test_reading_every_state_decodes_the_cold_ones_without_hydrating_them() -> None:
    st = store()
    st.put("acme/a", created("a", every=86400.0))
    st.put("acme/b", created("b", every=60.0))
    st.cool(T0)
    assert sorted(s.schedule_id for s in st.values()) == ["a", "b"]
    assert st.is_cold("acme/a") and st.hot == 1
    assert [s.schedule_id for s in st.soonest_cold(5)] == ["a"]
    sealed = st.sealed(["acme/a", "acme/b", "acme/none"])
    assert sorted(sealed) == ["acme/a", "acme/b"] and st.is_cold("acme/a")
    a, b = created("a", every=86400.0), created("b", every=60.0)
    shape = sealed["acme/a"][1]
    assert shape is not None and shape.spec_hash.startswith("shape:")  # its stored shape
    assert sealed["acme/a"][0] == seal(a, next_wakeup(a))
    assert sealed["acme/b"][0] == seal(b, next_wakeup(b)) and st.hot == 1


def test_sealed_bytes_that_do_not_expand_are_a_value_error() -> None:
    s = created("daily", every=86400.0)
    data = seal(s, next_wakeup(s))
    with pytest.raises(ValueError, match="do not expand"):
        unsealed(data[:SEAL_SIZE] + b"\x00" * 20)
