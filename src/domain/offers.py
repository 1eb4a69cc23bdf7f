"""The offer record: a worker's capacity for one partition of ``ready.<class>``.

Written by a worker onto partition p of ``commands`` with the header ``chronolog-kind:
offer``; read by the processor that owns partition p, which assigns READY runs to the
offering worker (``chronolog.processors.dispatch``). Offers are not commands: they change no
schedule, produce no event and get no reply.

A worker of a *pool* (tenants file ``[pools.<name>]``) names its pool and proves it holds one
of the pool's credentials without sending it: ``proof`` is an HMAC-SHA256, keyed by the
credential, over the worker, the pool, the partition the offer is written to, the resource
class and the time it was made (``issued_at``, Unix seconds). The processor recomputes it with
each credential of the pool (``verify_proof``) and accepts it only within ``PROOF_WINDOW_S`` of
its own clock, so a copied offer record stops seating anyone within that window, and an offer
copied to another partition, class or pool does not verify at all.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

OFFER_HEADER = ("chronolog-kind", b"offer")
# An offer not renewed within this many seconds lapses. Workers renew every second; the
# bound is below the embedded log's group session (4 s), so a dead worker's offer lapses
# before its partitions move to another worker.
SEAT_TTL_S = 3.0
# A pool offer's proof is accepted this many seconds either side of the processor's clock:
# offers are renewed every second, so this leaves room for clock skew and a slow log.
PROOF_WINDOW_S = 30.0


class BadOffer(ValueError):
    """An offer record that does not decode."""


@dataclass(frozen=True, slots=True)
class Offer:
    worker_id: str
    resource_class: str
    window: int  # runs of this partition the worker accepts at once; 0 withdraws the offer
    job_types: frozenset[str] | None = None  # None: any job type
    pool: str | None = None  # the worker's pool (None: a pool-less worker)
    issued_at: float | None = None  # when a pool offer was made (Unix seconds)
    proof: str | None = None  # offer_proof(...) of a pool offer, hex

    def encode(self) -> bytes:
        raw: dict[str, object] = {
            "worker_id": self.worker_id, "resource_class": self.resource_class,
            "window": self.window,
            "job_types": None if self.job_types is None else sorted(self.job_types)}
        if self.pool is not None:
            raw.update(pool=self.pool, issued_at=self.issued_at, proof=self.proof)
        return orjson.dumps(raw)

    @classmethod
    def decode(cls, value: bytes) -> Offer:
        try:
            raw = orjson.loads(value)
            jobs = raw.get("job_types")
            pool = raw.get("pool")
            issued = raw.get("issued_at")
            proof = raw.get("proof")
            offer = cls(str(raw["worker_id"]), str(raw["resource_class"]), int(raw["window"]),
                        None if jobs is None else frozenset(str(j) for j in jobs),
                        None if pool is None else str(pool),
                        None if issued is None else float(issued),
                        None if proof is None else str(proof))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadOffer(f"not an offer: {exc}") from None
        if not offer.worker_id or not 0 <= offer.window <= 100_000:
            raise BadOffer("offer needs a worker_id and a window in 0..100000")
        return offer


def offer_proof(credential: str, worker_id: str, pool: str, partition: int,
                resource_class: str, issued_at: float) -> str:
    """The proof a pool worker's offer carries: HMAC-SHA256 keyed by the pool credential over
    the fields that place and date the offer (hex)."""
    msg = "\n".join((worker_id, pool, str(partition), resource_class, f"{issued_at:.3f}"))
    return hmac.new(credential.encode(), msg.encode(), hashlib.sha256).hexdigest()


def verify_proof(offer: Offer, partition: int, credentials: Iterable[str],
                 now: float) -> str | None:
    """Why ``offer`` (read from ``partition``) does not prove membership of its pool, or None
    when it does: fresh (``now`` is the verifier's Unix time) and keyed by one of
    ``credentials`` (the pool's; none: an unknown pool). Every credential is compared."""
    if offer.pool is None:
        return "no pool"
    if offer.issued_at is None or offer.proof is None:
        return "no proof"
    if abs(now - offer.issued_at) > PROOF_WINDOW_S:
        return "stale proof"
    matched = False
    for credential in credentials:
        want = offer_proof(credential, offer.worker_id, offer.pool, partition,
                           offer.resource_class, offer.issued_at)
        matched |= hmac.compare_digest(want, offer.proof)
    return None if matched else "proof does not verify"


def is_offer(headers: Iterable[tuple[str, bytes]]) -> bool:
    return OFFER_HEADER in tuple(headers)


