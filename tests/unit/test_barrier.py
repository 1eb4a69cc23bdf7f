"""The move barrier (chronolog.domain.barrier) and the readers built on it: the projector's
batch cut (``cut_batch``) and the audit's move checks (``single_home``, ``move_matched``),
each rule by name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chronolog.audit.auditor import audit
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.domain.barrier import (
    Barrier,
    BarrierOrder,
    barrier_met,
    cut_at_barrier,
    in_barrier_order,
)
from chronolog.domain.ids import ROUTING_ID, ROUTING_TENANT
from chronolog.log.port import Record
from chronolog.projections.projector import cut_batch, decode_records

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
N = 0


def ev(payload: Any, sid: str = "s1", tenant: str = "acme") -> m.EventEnvelope:
    global N
    N += 1
    return m.EventEnvelope(event_id=f"e{N}", type=payload.type, key=f"{tenant}/{sid}",
                           tenant=tenant, schedule_id=sid, at=T0 + timedelta(seconds=N),
                           payload=payload)


def moved_in(from_partition: int, version: int, sid: str = "s1") -> m.EventEnvelope:
    return ev(m.KeyMovedIn(state="{}", state_version=1, from_partition=from_partition,
                           version=version), sid)


def moved_out(to_partition: int, version: int, sid: str = "s1") -> m.EventEnvelope:
    return ev(m.KeyMovedOut(to_partition=to_partition, version=version), sid)


def handed(version: int) -> m.EventEnvelope:
    return ev(m.HandedOver(version=version, moved=1), ROUTING_ID, ROUTING_TENANT)


def fence(n: int, sid: str = "s1") -> m.EventEnvelope:
    return ev(m.FenceAdvanced(run_id="r1", fence=n, reason="claim"), sid)


def numbered(envs: list[m.EventEnvelope]) -> list[tuple[int, m.EventEnvelope]]:
    return list(enumerate(envs))


# ---------------------------------------------------------------------------------------
# the rule


def test_rule_a_key_moved_in_waits_for_its_old_homes_handover_of_that_version() -> None:
    b = Barrier(partition=1, version=2)
    assert not barrier_met({}, b)
    assert not barrier_met({1: 1}, b)  # an older handover of the old home
    assert not barrier_met({0: 2}, b)  # another partition's handover
    assert barrier_met({1: 2}, b) and barrier_met({1: 3}, b)


def test_rule_events_before_the_key_moved_in_are_taken_while_it_waits() -> None:
    envs = [fence(1, "x"), fence(2, "x"), moved_in(1, 2), fence(3)]
    n, barrier = cut_at_barrier(envs, {})
    assert (n, barrier) == (2, Barrier(1, 2))
    assert cut_at_barrier(envs, {1: 2}) == (4, None)


def test_rule_a_handover_taken_is_remembered_per_partition_and_version() -> None:
    order = BarrierOrder()
    assert order.take(1, [fence(1), moved_out(3, 2), handed(2)]) == 3
    assert order.handovers == {1: 2}
    assert order.take(3, [moved_in(1, 2), fence(2)]) == 2
    assert order.take(2, [moved_in(1, 3)]) == 0  # version 3 is not handed over yet
    assert order.waiting == {2: Barrier(1, 3)} and not order.ready(2)


def test_rule_the_order_takes_the_old_home_first_when_keys_move_to_a_lower_partition() -> None:
    # 12 -> 20 partitions moves keys to higher and to lower numbers: partition 10 hands s1
    # to partition 2, partition 2 hands s2 to partition 10 (version 2)
    p10 = numbered([fence(1, "s1"), moved_out(2, 2, "s1"), handed(2),
                    moved_in(2, 2, "s2"), fence(8, "s2")])
    p2 = numbered([fence(7, "s2"), moved_out(10, 2, "s2"), handed(2),
                   moved_in(10, 2, "s1"), fence(2, "s1")])
    order = [(p, e.payload.type) for p, _, e in in_barrier_order({2: p2, 10: p10})]
    assert len(order) == 10
    pos = {(p, t): i for i, (p, t) in enumerate(order)}
    assert pos[(10, "HandedOver")] < pos[(2, "KeyMovedIn")]
    assert pos[(2, "HandedOver")] < pos[(10, "KeyMovedIn")]


def test_rule_a_key_moved_in_whose_handover_is_missing_is_stuck_and_may_be_read_past() -> None:
    p0 = numbered([fence(1, "x")])
    p1 = numbered([moved_in(0, 2), fence(2)])
    assert [t for _, _, t in in_barrier_order({0: p0, 1: p1})] == [p0[0][1]]  # ends there
    stuck: list[tuple[int, int, Barrier]] = []
    out = list(in_barrier_order({0: p0, 1: p1}, lambda *a: stuck.append(a)))
    assert stuck == [(1, 0, Barrier(0, 2))] and len(out) == 3


def test_rule_a_stuck_partition_waiting_on_a_partition_that_waits_for_nothing_goes_first() -> None:
    order = BarrierOrder(waiting={1: Barrier(0, 2), 2: Barrier(1, 2)})
    assert order.to_release() == 1  # partition 2 waits for partition 1, which is stuck


# ---------------------------------------------------------------------------------------
# the projector's cut of a batch


def record(p: int, offset: int, env: m.EventEnvelope | None) -> Record:
    value = codec.encode_event(env) if env is not None else b"not json"
    return Record(topic="events", partition=p, offset=offset, key=b"k", value=value,
                  timestamp_ms=0, headers=())


def test_rule_a_batch_is_cut_before_the_unmet_key_moved_in_with_what_follows_it() -> None:
    q = [record(3, 10, fence(1, "x")), record(3, 11, None), record(3, 12, moved_in(1, 2)),
         record(3, 13, None), record(3, 14, fence(2))]
    p = [record(1, 5, moved_out(3, 2)), record(1, 6, handed(2))]
    read = {3: q, 1: p}
    kept, envelopes, dead = decode_records(read)
    held = cut_batch(read, kept, envelopes, dead, {})
    assert held == {3: (12, Barrier(1, 2))}
    assert [r.offset for r in read[3]] == [10, 11]  # the batch ends before the KeyMovedIn
    assert [r.offset for r in kept[3]] == [10] and len(envelopes[3]) == 1
    assert [r.offset for r, _ in dead] == [11]  # the undecodable one after it waits too
    assert len(read[1]) == 2  # the old home's handover in the same batch does not count


def test_rule_a_batch_whose_barriers_are_met_is_not_cut() -> None:
    read = {3: [record(3, 0, moved_in(1, 2)), record(3, 1, fence(2))]}
    kept, envelopes, dead = decode_records(read)
    assert cut_batch(read, kept, envelopes, dead, {1: 2}) == {}
    assert len(read[3]) == len(kept[3]) == 2


# ---------------------------------------------------------------------------------------
# the audit across a move


def materialized(sid: str = "s1") -> m.EventEnvelope:
    """Run r1 of the key (the run ``fence`` advances for)."""
    return ev(m.OccurrenceMaterialized(run_id="r1", scheduled_at=T0, due_at=T0, revision=1,
                                       job=m.JobSpec(type="report"), state="READY",
                                       sequence=1), sid)


def planned(sid: str = "s1") -> m.EventEnvelope:
    """An event of the key that no check concerns but ``single_home`` (where it is)."""
    return ev(m.NextRunPlanned(next_run_at=None, next_due_at=None), sid)


def test_audit_rule_the_state_continues_across_a_move() -> None:
    p1 = [(1, 0, materialized()), (1, 1, fence(5)), (1, 2, moved_out(3, 2)),
          (1, 3, handed(2))]
    ok = audit([(3, 0, moved_in(1, 2)), (3, 1, fence(6)), *p1])  # new home listed first
    assert ok.ok, ok.violations
    bad = audit([(3, 0, moved_in(1, 2)), (3, 1, fence(4)), *p1])
    assert [v.check for v in bad.violations] == ["fence_monotonic"]


def test_audit_rule_single_home_events_on_the_old_home_after_the_move() -> None:
    report = audit([(1, 0, planned()), (1, 1, moved_out(3, 2)), (1, 2, handed(2)),
                    (1, 3, planned()), (3, 0, moved_in(1, 2))])
    assert [v.check for v in report.violations] == ["single_home"]
    assert [(e.partition, e.offset) for e in report.violations[0].events] == [(1, 1), (1, 3)]


def test_audit_rule_single_home_events_on_a_partition_that_does_not_hold_the_key() -> None:
    report = audit([(1, 0, planned()), (3, 0, planned())])
    assert [v.check for v in report.violations] == ["single_home"]


def test_audit_rule_move_matched_a_key_moved_in_without_its_moved_out() -> None:
    report = audit([(1, 0, planned()), (1, 1, handed(2)), (3, 0, moved_in(1, 2))])
    assert [v.check for v in report.violations] == ["move_matched"]


def test_audit_rule_move_matched_a_key_moved_in_whose_handover_is_missing() -> None:
    report = audit([(1, 0, planned()), (1, 1, moved_out(3, 2)), (3, 0, moved_in(1, 2)),
                    (3, 1, planned())])
    assert [v.check for v in report.violations] == ["move_matched"]
    assert report.events == 4  # read on past it
