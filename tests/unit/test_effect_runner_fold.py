"""The effect runner's partition fold: which (effect, delivery attempt) already has an outcome."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from chronolog.domain import messages as m
from chronolog.effects.runner import PartitionFold

AT = datetime(2026, 10, 8, 12, tzinfo=UTC)


def env(payload: Any) -> m.EventEnvelope:
    return m.EventEnvelope(event_id="e", type=payload.type, key="acme/s", tenant="acme",
                           schedule_id="s", at=AT, payload=payload)


def intent(attempt: int) -> m.EffectIntended:
    return m.EffectIntended(effect_id="send-r1", run_id="r1", kind="email", checksum="c",
                            attempt=attempt)


def test_an_intent_followed_by_its_outcome_is_done_and_a_reconciliation_retry_is_not() -> None:
    f = PartitionFold()
    f.apply(env(intent(1)))
    assert ("send-r1", 1) not in f.done
    f.apply(env(m.EffectUncertain(effect_id="send-r1", run_id="r1")))
    assert ("send-r1", 1) in f.done
    f.apply(env(m.ReconciliationResolved(run_id="r1", decision="retry", effect_id="send-r1")))
    f.apply(env(intent(2)))  # the operator's retry: same effect ID, next delivery attempt
    assert ("send-r1", 2) not in f.done
    f.apply(env(m.EffectSucceeded(effect_id="send-r1", run_id="r1")))
    assert f.done == {("send-r1", 1), ("send-r1", 2)}


def test_an_outcome_without_its_intent_in_the_fold_is_ignored() -> None:
    f = PartitionFold()  # folded from a committed offset past the intent
    f.apply(env(m.EffectSucceeded(effect_id="send-r1", run_id="r1")))
    assert f.done == set()
