"""Dispatch: a processor hands ready runs straight to workers that offered capacity.

A worker that consumes partition p of ``ready.<class>`` *offers* itself to the owner of
partition p of ``commands``: an offer record (header ``chronolog-kind: offer``) naming the
worker, the resource class, the job types it has handlers for and its *window* — how many
runs of that partition it accepts at once. Offers are repeated every second and withdrawn
(window 0) when the worker loses the partition or stops; an offer not renewed within
``SEAT_TTL_S`` lapses.

The processor keeps, per owned partition, the *seats* (live offers) and the READY runs that
wait for one. At the end of every batch it assigns waiting runs to seats with credit
(window − runs assigned to that worker and not yet finished) whose job types include the run's:
the assignment is the decider's own ClaimRun on the worker's behalf, so it is the same
FenceAdvanced + AttemptClaimed (fence, lease) as a claim, committed in the same transaction
as whatever made the run ready; an *assignment record* carrying the attempt (the claim's
reply body and the assignee) goes to partition p of ``ready.<class>``. A worker starts its
handler as soon as it reads the record: no claim round trip remains.

Finishing an attempt (completion, failure, lease expiry, cancellation) gives the credit back.
A worker that vanishes keeps its assignments until their leases expire, exactly as a claimed
attempt; a worker that lets a lease expire loses its seat until it offers again, so the retry
goes to a live worker; a run nobody can handle (no seat offers its job type) waits, READY and visible,
instead of burning attempts. Seats and the waiting list are in-memory state derived from the
partition's schedules and the offers: a new owner rebuilds the waiting list from the fold
and learns the seats from the next offers (within a second).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from chronolog.domain.offers import SEAT_TTL_S, Offer

@dataclass(slots=True)
class Seat:
    """One worker's live offer on one partition and resource class."""

    worker_id: str
    window: int
    job_types: frozenset[str] | None
    renewed: float  # monotonic time of the last offer
    outstanding: set[str] = field(default_factory=set)  # run IDs assigned, not finished

    @property
    def credit(self) -> int:
        return self.window - len(self.outstanding)

    def takes(self, job_type: str) -> bool:
        return self.job_types is None or job_type in self.job_types


class Dispatcher:
    """The seats and waiting runs of one partition (in-memory; see the module docstring)."""

    def __init__(self) -> None:
        self.seats: dict[str, dict[str, Seat]] = {}  # class -> worker -> seat
        self.waiting: dict[str, deque[tuple[str, str, int]]] = {}  # class -> (key, run, attempt)
        self.assigned: dict[str, tuple[str, str, int]] = {}  # run -> (class, worker, fence)

    def offer(self, offer: Offer, now: float) -> None:
        seats = self.seats.setdefault(offer.resource_class, {})
        seat = seats.get(offer.worker_id)
        if offer.window == 0:
            if seat is not None:
                seat.window = 0  # no new assignments; outstanding ones still finish
            return
        if seat is None:
            seats[offer.worker_id] = Seat(offer.worker_id, offer.window, offer.job_types, now)
            return
        seat.window, seat.job_types, seat.renewed = offer.window, offer.job_types, now

    def wait(self, resource_class: str, key: str, run_id: str, attempt: int) -> None:
        self.waiting.setdefault(resource_class, deque()).append((key, run_id, attempt))

    def adopt(self, resource_class: str, worker_id: str, run_id: str, fence: int) -> None:
        """An attempt leased to ``worker_id`` before this processor owned the partition."""
        self.assigned[run_id] = (resource_class, worker_id, fence)
        seat = self.seats.setdefault(resource_class, {}).setdefault(
            worker_id, Seat(worker_id, 0, None, float("-inf")))
        seat.outstanding.add(run_id)

    def seat_for(self, resource_class: str, job_type: str, now: float) -> Seat | None:
        """The live seat with the most credit that takes ``job_type`` (None: none has any)."""
        best: Seat | None = None
        for seat in self.seats.get(resource_class, {}).values():
            if (seat.credit > 0 and now - seat.renewed <= SEAT_TTL_S and seat.takes(job_type)
                    and (best is None or seat.credit > best.credit)):
                best = seat
        return best

    def assign(self, resource_class: str, seat: Seat, run_id: str, fence: int) -> None:
        seat.outstanding.add(run_id)
        self.assigned[run_id] = (resource_class, seat.worker_id, fence)

    def lapse_holder(self, run_id: str) -> None:
        """The worker assigned ``run_id`` let its lease expire: it gets no new run until it
        offers again (a stopped or dead worker must not attract the retry)."""
        held = self.assigned.get(run_id)
        if held is not None:
            seat = self.seats.get(held[0], {}).get(held[1])
            if seat is not None:
                seat.renewed = float("-inf")

    def settle(self, run_id: str, run: Any) -> None:
        """Give the credit back once ``run`` no longer holds the assigned attempt."""
        held = self.assigned.get(run_id)
        if held is None:
            return
        cls, worker, fence = held
        if run is not None and run.state == "LEASED" and run.fence == fence:
            return
        del self.assigned[run_id]
        seat = self.seats.get(cls, {}).get(worker)
        if seat is not None:
            seat.outstanding.discard(run_id)

    def prune(self, now: float) -> None:
        """Forget lapsed seats that hold nothing."""
        for seats in self.seats.values():
            for worker in [w for w, s in seats.items()
                           if not s.outstanding and now - s.renewed > SEAT_TTL_S]:
                del seats[worker]
