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
goes to a live worker; a run nobody can handle (no seat offers its job type) waits, READY and
visible, instead of burning attempts. Seats and the waiting list are in-memory state derived
from the partition's schedules and the offers: a new owner rebuilds the waiting list from the
fold and learns the seats from the next offers (within a second).

Waiting runs of one resource class are served fairly across tenants and by priority within a
tenant (``FairQueue``): each tenant has a weight (tenants file, default 1) and a virtual time
that advances by 1/weight per run assigned; the tenant with the least virtual time goes next
(stride scheduling). A tenant that had nothing waiting starts at the current virtual time, so
idling banks no credit: one tenant's burst of thousands of runs delays another tenant's next
run by about one assignment, not by the burst. Within a tenant, higher ``priority`` first, then
the order the runs became ready.

Worker pools (tenants file ``[pools.<name>]``): a seat records the pool its worker proved
membership of (the runtime verifies an offer's proof before it reaches ``offer``; an offer
that does not verify seats nobody), ``None`` for a pool-less worker. A run is assigned only to
a seat whose pool is one its tenant may use (``seat_for``'s ``pools``: the tenant's pools, or
``{None}`` for a tenant without pools). A live seat keeps its pool: an offer naming the same
worker with another pool is ignored until the seat lapses, so nobody can move a pool worker's
seat (and its assignments) out of the pool by offering under its name. A pool seat's
assignment records go to ``ready.pool-<pool>.<class>``, read only by the pool's workers.

A tenant's share of the running slots is capped by ``max_running`` (tenants file): the most
runs of that tenant assigned and not finished at once. The processor counts them over all the
partitions it owns (``Dispatcher.tenant_of``, summed by ``running_by_tenant``), so the cap
holds per processor node: with N processors sharing the partitions a tenant may hold up to
N times its cap. A run over the cap is not assigned; it waits READY and visible, and the next
dispatch after one of the tenant's runs finishes takes it.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator
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
    pool: str | None = None  # the pool the worker proved membership of (None: pool-less)

    @property
    def credit(self) -> int:
        return self.window - len(self.outstanding)

    def takes(self, job_type: str) -> bool:
        return self.job_types is None or job_type in self.job_types


@dataclass(slots=True)
class _TenantQueue:
    weight: float
    vtime: float  # virtual time: advances by 1/weight per run assigned
    heap: list[tuple[int, int, str, str, int]] = field(default_factory=list)
    # (-priority, arrival, key, run_id, attempt)


class FairQueue:
    """READY runs of one resource class waiting for a seat (see the module docstring)."""

    def __init__(self) -> None:
        self.tenants: dict[str, _TenantQueue] = {}
        self.vnow = 0.0  # the virtual time of the last run assigned
        self._arrivals = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, tenant: str, weight: float, priority: int, key: str, run_id: str,
             attempt: int) -> None:
        q = self.tenants.get(tenant)
        if q is None:
            q = self.tenants[tenant] = _TenantQueue(weight, self.vnow)
        elif not q.heap:
            q.vtime = max(q.vtime, self.vnow)  # idling banks no credit
        q.weight = weight
        heapq.heappush(q.heap, (-priority, self._arrivals, key, run_id, attempt))
        self._arrivals += 1
        self._size += 1

    def entries(self) -> Iterator[tuple[str, tuple[int, int, str, str, int]]]:
        """Pop the waiting runs in service order (tenant with least virtual time, then
        priority, then arrival); ``charge`` the tenant of each one assigned, ``restore``
        an entry that stays waiting. Stops when the queue is empty."""
        while self._size:
            tenant, q = min(((t, q) for t, q in self.tenants.items() if q.heap),
                            key=lambda tq: tq[1].vtime)
            entry = heapq.heappop(q.heap)
            self._size -= 1
            yield tenant, entry

    def charge(self, tenant: str) -> None:
        """A run of ``tenant`` was assigned: its virtual time advances."""
        q = self.tenants[tenant]
        self.vnow = max(self.vnow, q.vtime)
        q.vtime += 1.0 / q.weight

    def restore(self, tenant: str, entry: tuple[int, int, str, str, int]) -> None:
        """Put back a popped entry that was not assigned (its place in the order kept)."""
        heapq.heappush(self.tenants[tenant].heap, entry)
        self._size += 1

    def prune(self) -> None:
        """Forget tenants with nothing waiting that are not ahead of the virtual time."""
        for tenant in [t for t, q in self.tenants.items() if not q.heap and q.vtime <= self.vnow]:
            del self.tenants[tenant]


class Dispatcher:
    """The seats and waiting runs of one partition (in-memory; see the module docstring)."""

    def __init__(self) -> None:
        self.seats: dict[str, dict[str, Seat]] = {}  # class -> worker -> seat
        self.waiting: dict[str, FairQueue] = {}  # class -> runs waiting for a seat
        self.assigned: dict[str, tuple[str, str, int]] = {}  # run -> (class, worker, fence)
        self.tenant_of: dict[str, str] = {}  # run -> tenant, of the runs in ``assigned``

    def hold(self, run_id: str, tenant: str) -> None:
        """``run_id`` (assigned or adopted) counts against ``tenant``'s ``max_running``."""
        if run_id in self.assigned:
            self.tenant_of[run_id] = tenant

    def offer(self, offer: Offer, now: float) -> None:
        seats = self.seats.setdefault(offer.resource_class, {})
        seat = seats.get(offer.worker_id)
        if seat is not None and seat.pool != offer.pool:
            if now - seat.renewed <= SEAT_TTL_S:
                return  # a live seat keeps its pool (see the module docstring)
            seat.pool = offer.pool
        if offer.window == 0:
            if seat is not None:
                seat.window = 0  # no new assignments; outstanding ones still finish
            return
        if seat is None:
            seats[offer.worker_id] = Seat(offer.worker_id, offer.window, offer.job_types, now,
                                          pool=offer.pool)
            return
        seat.window, seat.job_types, seat.renewed = offer.window, offer.job_types, now

    def wait(self, resource_class: str, tenant: str, weight: float, priority: int, key: str,
             run_id: str, attempt: int) -> None:
        queue = self.waiting.get(resource_class)
        if queue is None:
            queue = self.waiting[resource_class] = FairQueue()
        queue.push(tenant, weight, priority, key, run_id, attempt)

    def has_credit(self, resource_class: str) -> bool:
        return any(s.credit > 0 for s in self.seats.get(resource_class, {}).values())

    def adopt(self, resource_class: str, worker_id: str, run_id: str, fence: int) -> None:
        """An attempt leased to ``worker_id`` before this processor owned the partition."""
        self.assigned[run_id] = (resource_class, worker_id, fence)
        seat = self.seats.setdefault(resource_class, {}).setdefault(
            worker_id, Seat(worker_id, 0, None, float("-inf")))
        seat.outstanding.add(run_id)

    def seat_for(self, resource_class: str, job_type: str, now: float,
                 pools: frozenset[str | None] = frozenset({None})) -> Seat | None:
        """The live seat with the most credit that takes ``job_type`` and whose pool is in
        ``pools`` (None: none has any)."""
        best: Seat | None = None
        for seat in self.seats.get(resource_class, {}).values():
            if (seat.credit > 0 and now - seat.renewed <= SEAT_TTL_S and seat.takes(job_type)
                    and seat.pool in pools
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
        self.tenant_of.pop(run_id, None)
        seat = self.seats.get(cls, {}).get(worker)
        if seat is not None:
            seat.outstanding.discard(run_id)

    def prune(self, now: float) -> None:
        """Forget lapsed seats that hold nothing, and idle tenants of the queues."""
        for queue in self.waiting.values():
            queue.prune()
        for seats in self.seats.values():
            for worker in [w for w, s in seats.items()
                           if not s.outstanding and now - s.renewed > SEAT_TTL_S]:
                del seats[worker]


def running_by_tenant(dispatchers: Iterable[Dispatcher]) -> Counter[str]:
    """Runs assigned and not finished, per tenant, over ``dispatchers`` (the partitions one
    processor owns): what ``max_running`` is compared with."""
    counts: Counter[str] = Counter()
    for d in dispatchers:
        counts.update(d.tenant_of.values())
    return counts
