"""The processor's budget of retries per tenant per minute (``AttemptBudget``)."""

from __future__ import annotations

from chronolog.processors.attempt_budget import AttemptBudget


def test_a_burst_goes_through_then_each_retry_waits_for_its_token() -> None:
    b = AttemptBudget()
    for _ in range(3):  # three a minute: a burst of three
        assert b.delay("acme", 3, now=0.0) == 0.0
        b.take("acme", 3, now=0.0)
    assert b.delay("acme", 3, now=0.0) == 20.0  # one token every 20 s
    b.take("acme", 3, now=0.0)
    assert b.delay("acme", 3, now=0.0) == 40.0  # delayed further, never dropped
    assert b.delay("other", 3, now=0.0) == 0.0  # per tenant
    b.take("acme", 3, now=0.0)
    assert b.delay("acme", 3, now=50.0) == 10.0  # refilled with time
    assert b.delay("acme", 3, now=1000.0) == 0.0  # at most the burst is banked
    for _ in range(3):
        b.take("acme", 3, now=1000.0)
    assert b.delay("acme", 3, now=1000.0) == 20.0
