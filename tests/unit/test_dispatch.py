"""The dispatcher's rules (one test per rule), on plain in-memory values."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from chronolog.domain.offers import SEAT_TTL_S, BadOffer, Offer
from chronolog.processors.dispatch import Dispatcher, FairQueue
from chronolog.settings import ConfigError
from chronolog.tenants import load_tenants


def leased(fence: int) -> SimpleNamespace:
    return SimpleNamespace(state="LEASED", fence=fence)


def test_an_offer_round_trips_and_a_bad_one_is_refused() -> None:
    offer = Offer("w1", "gpu", 7, frozenset({"b", "a"}))
    assert Offer.decode(offer.encode()) == offer
    assert Offer.decode(Offer("w2", "default", 0).encode()).job_types is None
    for bad in (b"not json", b"{}", b'{"worker_id": "", "resource_class": "x", "window": 1}',
                b'{"worker_id": "w", "resource_class": "x", "window": -1}'):
        with pytest.raises(BadOffer):
            Offer.decode(bad)


def test_a_seats_credit_is_its_window_less_the_runs_it_holds() -> None:
    d = Dispatcher()
    d.offer(Offer("w1", "default", 2), now=0.0)
    seat = d.seat_for("default", "echo", now=0.0)
    assert seat is not None and seat.credit == 2
    d.assign("default", seat, "r1", fence=1)
    d.assign("default", seat, "r2", fence=2)
    assert seat.credit == 0
    assert d.seat_for("default", "echo", now=0.0) is None


def test_the_live_seat_with_most_credit_that_takes_the_job_type_is_chosen() -> None:
    d = Dispatcher()
    d.offer(Offer("small", "default", 1), now=0.0)
    d.offer(Offer("big", "default", 5, frozenset({"report"})), now=0.0)
    d.offer(Offer("other-class", "gpu", 50), now=0.0)
    assert d.seat_for("default", "report", now=0.0).worker_id == "big"  # type: ignore[union-attr]
    assert d.seat_for("default", "echo", now=0.0).worker_id == "small"  # type: ignore[union-attr]
    assert d.seat_for("default", "train", now=0.0).worker_id == "small"  # type: ignore[union-attr]
    d.offer(Offer("small", "default", 1, frozenset({"echo"})), now=0.0)
    assert d.seat_for("default", "train", now=0.0) is None  # nobody has a handler


def test_an_offer_not_renewed_lapses_and_a_withdrawn_one_gets_nothing() -> None:
    d = Dispatcher()
    d.offer(Offer("w1", "default", 3), now=0.0)
    assert d.seat_for("default", "echo", now=SEAT_TTL_S) is not None
    assert d.seat_for("default", "echo", now=SEAT_TTL_S + 0.01) is None
    d.offer(Offer("w1", "default", 3), now=10.0)
    assert d.seat_for("default", "echo", now=10.0) is not None
    d.offer(Offer("w1", "default", 0), now=10.5)
    assert d.seat_for("default", "echo", now=10.5) is None


def test_finishing_an_attempt_gives_its_credit_back_but_a_current_lease_keeps_it() -> None:
    d = Dispatcher()
    d.offer(Offer("w1", "default", 1), now=0.0)
    seat = d.seat_for("default", "echo", now=0.0)
    assert seat is not None
    d.assign("default", seat, "r1", fence=4)
    d.settle("r1", leased(4))  # a heartbeat, say: still held
    assert seat.credit == 0
    d.settle("r1", SimpleNamespace(state="SUCCEEDED", fence=4))
    assert seat.credit == 1 and "r1" not in d.assigned
    d.assign("default", seat, "r2", fence=5)
    d.settle("r2", leased(6))  # taken over under a newer fence: not this seat's any more
    assert seat.credit == 1


def test_a_worker_that_let_a_lease_expire_gets_no_run_until_it_offers_again() -> None:
    d = Dispatcher()
    d.offer(Offer("w1", "default", 5), now=0.0)
    seat = d.seat_for("default", "echo", now=0.0)
    assert seat is not None
    d.assign("default", seat, "r1", fence=1)
    d.lapse_holder("r1")
    d.settle("r1", SimpleNamespace(state="RETRY_WAIT", fence=1))
    assert d.seat_for("default", "echo", now=0.5) is None
    d.offer(Offer("w1", "default", 5), now=1.0)
    assert d.seat_for("default", "echo", now=1.0) is seat


def test_an_attempt_leased_before_the_takeover_counts_against_its_worker() -> None:
    d = Dispatcher()
    d.adopt("default", "w1", "r1", fence=3)
    assert d.seat_for("default", "echo", now=0.0) is None  # known, but it has not offered
    d.offer(Offer("w1", "default", 1), now=0.0)
    assert d.seat_for("default", "echo", now=0.0) is None  # its one slot is taken by r1
    d.settle("r1", None)
    assert d.seat_for("default", "echo", now=0.0) is not None


def _served(queue: FairQueue, n: int) -> list[str]:
    """The run IDs of the first ``n`` runs assigned, in order (every run popped is assigned)."""
    out = []
    for tenant, entry in queue.entries():
        queue.charge(tenant)
        out.append(entry[3])
        if len(out) == n:
            break
    return out


def test_waiting_runs_of_tenants_are_served_in_turn_not_in_arrival_order() -> None:
    queue = FairQueue()
    for i in range(1000):
        queue.push("a", 1.0, 0, f"a/s{i}", f"a{i}", 1)
    queue.push("b", 1.0, 0, "b/s", "b0", 1)
    queue.push("b", 1.0, 0, "b/s", "b1", 1)
    assert _served(queue, 4) == ["a0", "b0", "a1", "b1"]


def test_a_tenants_weight_is_its_share_of_the_runs_assigned() -> None:
    queue = FairQueue()
    for i in range(100):
        queue.push("heavy", 3.0, 0, "h/s", f"h{i}", 1)
        queue.push("light", 1.0, 0, "l/s", f"l{i}", 1)
    served = _served(queue, 40)
    assert sum(r.startswith("h") for r in served) == 30


def test_a_tenant_that_had_nothing_waiting_banks_no_credit() -> None:
    queue = FairQueue()
    for i in range(10):
        queue.push("a", 1.0, 0, "a/s", f"a{i}", 1)
    assert _served(queue, 6) == [f"a{i}" for i in range(6)]
    queue.push("b", 1.0, 0, "b/s", "b0", 1)
    queue.push("b", 1.0, 0, "b/s", "b1", 1)
    queue.push("b", 1.0, 0, "b/s", "b2", 1)
    # b arrives after a was served six times: it alternates with a, it does not get six in a row
    assert _served(queue, 4) == ["b0", "a6", "b1", "a7"]


def test_within_a_tenant_higher_priority_goes_first_then_arrival() -> None:
    queue = FairQueue()
    queue.push("a", 1.0, 0, "a/s1", "low-first", 1)
    queue.push("a", 1.0, 5, "a/s2", "high", 1)
    queue.push("a", 1.0, 0, "a/s3", "low-second", 1)
    assert _served(queue, 3) == ["high", "low-first", "low-second"]


def test_a_run_put_back_keeps_its_place() -> None:
    queue = FairQueue()
    for i in range(3):
        queue.push("a", 1.0, 0, "a/s", f"a{i}", 1)
    tenant, entry = next(queue.entries())
    queue.restore(tenant, entry)  # not assigned (no seat takes its job type, no credit)
    assert len(queue) == 3
    assert _served(queue, 3) == ["a0", "a1", "a2"]


def test_the_tenants_file_sets_a_tenants_weight_and_refuses_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "tenants.toml"
    good.write_text('[tenants.a]\ntokens = ["t-a"]\nweight = 3\n[tenants.b]\ntokens = ["t-b"]\n')
    tenants = load_tenants(good)
    assert (tenants.weight("a"), tenants.weight("b"), tenants.weight("unknown")) == (3.0, 1.0, 1.0)
    for bad in ("0", "-1", '"heavy"', "true", "1e9"):
        path = tmp_path / "bad.toml"
        path.write_text(f'[tenants.a]\ntokens = ["t"]\nweight = {bad}\n')
        with pytest.raises(ConfigError, match=r"tenants.a.weight"):
            load_tenants(path)


def test_a_tenants_running_runs_are_counted_over_the_partitions_until_they_finish() -> None:
    from chronolog.processors.dispatch import running_by_tenant

    p0, p1 = Dispatcher(), Dispatcher()
    for d in (p0, p1):
        d.offer(Offer("w1", "default", 4), now=0.0)
    for d, run_id, tenant in ((p0, "r1", "hog"), (p1, "r2", "hog"), (p1, "r3", "meek")):
        seat = d.seat_for("default", "echo", now=0.0)
        assert seat is not None
        d.assign("default", seat, run_id, fence=1)
        d.hold(run_id, tenant)
    assert running_by_tenant([p0, p1]) == {"hog": 2, "meek": 1}
    p0.settle("r1", leased(1))  # still running the assigned attempt: still counted
    assert running_by_tenant([p0, p1])["hog"] == 2
    p0.settle("r1", None)  # finished
    assert running_by_tenant([p0, p1]) == {"hog": 1, "meek": 1}
    p1.hold("r9", "hog")  # not assigned here: nothing to count
    assert running_by_tenant([p0, p1])["hog"] == 1


def test_the_tenants_file_sets_the_running_share_and_retry_bounds(tmp_path: Path) -> None:
    good = tmp_path / "tenants.toml"
    good.write_text('[tenants.a]\ntokens = ["t-a"]\nmax_running = 2\nmax_attempts = 10\n'
                    'min_backoff = "5s"\n[tenants.b]\ntokens = ["t-b"]\n')
    tenants = load_tenants(good)
    assert (tenants.max_running("a"), tenants.retry_bounds("a")) == (2, (10, 5.0))
    assert (tenants.max_running("b"), tenants.retry_bounds("b")) == (None, (100, 1.0))
    for key, bad in (("max_running", "0"), ("max_running", '"2"'), ("max_attempts", "1000"),
                     ("max_attempts", "0"), ("min_backoff", '"0s"'), ("min_backoff", '"soon"')):
        path = tmp_path / "bad.toml"
        path.write_text(f'[tenants.a]\ntokens = ["t"]\n{key} = {bad}\n')
        with pytest.raises(ConfigError, match=rf"tenants.a.{key}"):
            load_tenants(path)
