"""The effect adapter port: contracts, outcomes and the context an adapter acts in.

An effect adapter performs ONE external action for ONE ``EffectIntended`` record and says
what happened. Every adapter declares its *contract* — what the destination promises about a
repeated or lost request — and the effect runner acts on it (docs/design.md §8):

* ``idempotent``: the destination deduplicates requests by the effect ID for a declared
  ``retention`` (a webhook honouring ``Idempotency-Key``). Re-sending the same effect ID
  within the retention is safe; past it, it is not, and an ambiguous outcome is uncertain.
* ``queryable``: the destination can be asked, by effect ID, whether the operation happened
  (a webhook ``status_url``). An ambiguous outcome is resolved by asking, bounded.
* ``transactional``: the effect commits atomically with a record of the effect ID (the
  PostgreSQL inbox; a Kafka transaction carrying the outcome and the runner's offset).
* ``none``: no deduplication, no lookup, no shared transaction (SMTP). A lost reply after
  the request may have been acted upon is *uncertain*: the run goes to reconciliation and
  the effect is never re-sent automatically.

``Outcome.status`` is one of:

* ``succeeded`` — the destination confirmed the effect (evidence: receipts, status codes);
* ``failed`` — a definitive, permanent refusal (4xx, 5xx SMTP reply, SQL error, checksum
  conflict); it will not be retried;
* ``uncertain`` — the effect may or may not have happened, and the contract does not allow
  finding out or safely repeating it: an operator decides (``chronolog reconcile``);
* ``retry_later`` — nothing ambiguous happened (or repeating is safe under the contract),
  but the destination is not available now: the runner tries again later, bounded.

Evidence is a JSON object kept in the outcome event: status codes, receipt IDs, the SMTP
phase reached, timings (``elapsed_ms``), attempts made.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from chronolog.domain import messages as m
from chronolog.domain.durations import parse_duration

Contract = Literal["idempotent", "queryable", "transactional", "none"]
OutcomeStatus = Literal["succeeded", "failed", "uncertain", "retry_later"]

__all__ = [
    "Contract",
    "EffectAdapter",
    "EffectContext",
    "Outcome",
    "OutcomeStatus",
    "Stopwatch",
    "seconds",
]


@dataclass(frozen=True)
class Outcome:
    """What an adapter learned about one effect attempt."""

    status: OutcomeStatus
    evidence: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None  # for retry_later: a hint, seconds
    # True when the outcome command was already written atomically with the effect (the
    # Kafka transaction path); the runner then only re-sends the same command for its reply.
    recorded: bool = False

    @classmethod
    def succeeded(cls, **evidence: Any) -> Outcome:
        return cls("succeeded", evidence)

    @classmethod
    def failed(cls, **evidence: Any) -> Outcome:
        return cls("failed", {"permanent": True, **evidence})

    @classmethod
    def uncertain(cls, **evidence: Any) -> Outcome:
        return cls("uncertain", evidence)

    @classmethod
    def retry_later(cls, after: float | None = None, **evidence: Any) -> Outcome:
        return cls("retry_later", evidence, retry_after=after)


@dataclass
class EffectContext:
    """Where an intent came from and how to record its outcome atomically (if possible).

    ``intended_at`` is the authority time of the EffectIntended record: no attempt of this
    effect (by any runner instance) can have happened before it, so "now - intended_at" is a
    conservative bound on how long ago the destination may first have seen the effect ID.
    """

    tenant: str
    schedule_id: str
    intended_at: datetime
    runner_id: str = ""
    group: str = ""
    events_topic: str = ""
    partition: int = 0
    offset: int = 0
    # Builds the RecordEffectOutcome command for an outcome (status, evidence); set by the
    # runner so a transactional adapter can commit it together with the effect.
    outcome_envelope: Callable[[str, dict[str, Any]], m.CommandEnvelope] | None = None
    # The group offset a transactional adapter may commit with this effect (the runner's
    # progress: past this intent unless an older one of the partition is still open);
    # None: ``offset + 1``.
    commit_to: Callable[[], int] | None = None

    def age(self, now: datetime | None = None) -> float:
        """Seconds since the intent was recorded (authority time)."""
        now = now or datetime.now(UTC)
        return (now - self.intended_at).total_seconds()


@runtime_checkable
class EffectAdapter(Protocol):
    """Performs one kind of effect under a declared contract."""

    kind: str

    @property
    def contract(self) -> Contract:
        """What the destination promises (see the module docstring)."""
        ...

    async def perform(
        self, intent: m.EffectIntended, payload: Any, ctx: EffectContext | None = None
    ) -> Outcome:
        """Attempt the effect for ``intent`` with the resolved result ``payload``."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def seconds(value: Any, default: float) -> float:
    """A duration from adapter config (``"24h"``, ``90``, ``"PT5M"``), or ``default``."""
    if value is None:
        return default
    return float(parse_duration(value)) if isinstance(value, str) else float(value)


class Stopwatch:
    """Elapsed milliseconds for evidence."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def ms(self) -> int:
        return int((time.monotonic() - self.t0) * 1000)
