"""The offer record: a worker's capacity for one partition of ``ready.<class>``.

Written by a worker onto partition p of ``commands`` with the header ``chronolog-kind:
offer``; read by the processor that owns partition p, which assigns READY runs to the
offering worker (``chronolog.processors.dispatch``). Offers are not commands: they change no
schedule, produce no event and get no reply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson

OFFER_HEADER = ("chronolog-kind", b"offer")
# An offer not renewed within this many seconds lapses. Workers renew every second; the
# bound is below the embedded log's group session (4 s), so a dead worker's offer lapses
# before its partitions move to another worker.
SEAT_TTL_S = 3.0


class BadOffer(ValueError):
    """An offer record that does not decode."""


@dataclass(frozen=True, slots=True)
class Offer:
    worker_id: str
    resource_class: str
    window: int  # runs of this partition the worker accepts at once; 0 withdraws the offer
    job_types: frozenset[str] | None = None  # None: any job type

    def encode(self) -> bytes:
        return orjson.dumps({"worker_id": self.worker_id, "resource_class": self.resource_class,
                             "window": self.window,
                             "job_types": (None if self.job_types is None
                                           else sorted(self.job_types))})

    @classmethod
    def decode(cls, value: bytes) -> Offer:
        try:
            raw = orjson.loads(value)
            jobs = raw.get("job_types")
            offer = cls(str(raw["worker_id"]), str(raw["resource_class"]), int(raw["window"]),
                        None if jobs is None else frozenset(str(j) for j in jobs))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadOffer(f"not an offer: {exc}") from None
        if not offer.worker_id or not 0 <= offer.window <= 100_000:
            raise BadOffer("offer needs a worker_id and a window in 0..100000")
        return offer


def is_offer(headers: Iterable[tuple[str, bytes]]) -> bool:
    return OFFER_HEADER in tuple(headers)


