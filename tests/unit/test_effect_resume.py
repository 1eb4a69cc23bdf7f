"""Where an effect runner reads a partition from once it has folded it (``resume_offset``):
past everything when nothing there is left to do, else at the first thing left."""

from __future__ import annotations

from chronolog.effects.runner import resume_offset


def test_a_partition_whose_intents_all_have_outcomes_is_read_from_where_the_fold_ended() -> None:
    intents = {("e1", 1): 10, ("e2", 1): 20}
    assert resume_offset(500, intents, {("e1", 1), ("e2", 1)}, None) == 500
    assert resume_offset(500, {}, set(), None) == 500  # no intent at all


def test_the_first_intent_without_an_outcome_is_read_again() -> None:
    intents = {("e1", 1): 10, ("e2", 1): 20, ("e3", 1): 30}
    assert resume_offset(500, intents, {("e1", 1)}, None) == 20
    assert resume_offset(500, intents, {("e1", 1), ("e2", 1)}, None) == 30


def test_an_intent_retried_after_reconciliation_is_open_until_its_new_attempt_has_one() -> None:
    intents = {("e1", 1): 10, ("e1", 2): 40}
    assert resume_offset(500, intents, {("e1", 1)}, None) == 40


def test_a_record_that_does_not_decode_is_read_again_to_be_dead_lettered() -> None:
    assert resume_offset(500, {("e1", 1): 10}, {("e1", 1)}, 300) == 300
    assert resume_offset(500, {("e1", 1): 10}, set(), 300) == 10
