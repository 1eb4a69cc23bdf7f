"""The dispatcher's rules (one test per rule), on plain in-memory values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chronolog.domain.offers import SEAT_TTL_S, BadOffer, Offer
from chronolog.processors.dispatch import Dispatcher


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
