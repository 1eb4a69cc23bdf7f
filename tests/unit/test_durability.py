"""The durability rule: what a Kafka cluster must have for chronolog's guarantees to hold
(chronolog.log.durability). One test per way a cluster can fail it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chronolog.log.durability import Durability, TopicFacts, durability_problems

SAFE_BROKER = {"unclean.leader.election.enable": "false",
               "transaction.state.log.replication.factor": "3",
               "transaction.state.log.min.isr": "2"}


def test_the_default_is_three_copies_two_in_sync_on_a_cluster_and_one_on_a_single_broker():
    assert Durability().resolve(3) == (3, 2)
    assert Durability().resolve(5) == (3, 2)
    assert Durability().resolve(1) == (1, 1)
    assert Durability().resolve(2) == (2, 1)
    assert Durability(replication=5).resolve(5) == (5, 3)
    assert Durability(replication=3, min_isr=3).resolve(3) == (3, 3)


def test_a_safe_cluster_has_no_problem():
    topics = {"chronolog.events": TopicFacts(3, 2, False)}
    assert durability_problems(3, 3, 2, SAFE_BROKER, topics) == []
    assert durability_problems(1, 1, 1, {"unclean.leader.election.enable": "false"}, {}) == []


def test_more_replicas_than_brokers_is_a_problem():
    [problem] = durability_problems(1, 3, 2, {}, {})
    assert "replication 3 needs 3 brokers; the cluster has 1" in problem


def test_min_isr_one_with_replication_three_is_a_problem():
    [problem] = durability_problems(3, 3, 1, SAFE_BROKER, {})
    assert "min ISR 1 with replication 3" in problem


def test_min_isr_above_the_replication_is_a_problem():
    assert any("more than the replication" in p
               for p in durability_problems(3, 3, 4, SAFE_BROKER, {}))


def test_unclean_leader_election_on_the_brokers_or_a_topic_is_a_problem():
    broker = {**SAFE_BROKER, "unclean.leader.election.enable": "true"}
    [problem] = durability_problems(3, 3, 2, broker, {})
    assert "unclean.leader.election.enable=true" in problem
    [problem] = durability_problems(3, 3, 2, SAFE_BROKER,
                                    {"chronolog.events": TopicFacts(3, 2, True)})
    assert problem == "topic chronolog.events allows unclean leader election"


def test_an_existing_topic_with_fewer_replicas_or_a_lower_min_isr_is_a_problem():
    problems = durability_problems(3, 3, 2, SAFE_BROKER,
                                   {"chronolog.commands": TopicFacts(1, 1, False)})
    assert problems == [
        "topic chronolog.commands has 1 replica(s), fewer than the replication 3",
        "topic chronolog.commands has min.insync.replicas=1, below 2"]


def test_a_transaction_state_log_replicated_less_than_the_topics_is_a_problem():
    broker = {**SAFE_BROKER, "transaction.state.log.replication.factor": "1",
              "transaction.state.log.min.isr": "1"}
    problems = durability_problems(3, 3, 2, broker, {})
    assert len(problems) == 2 and all("transaction state log" in p for p in problems)


@given(brokers=st.integers(1, 9), replication=st.integers(1, 9), min_isr=st.integers(1, 9))
def test_no_problem_means_every_acknowledged_write_is_on_two_brokers_or_the_only_one(
    brokers: int, replication: int, min_isr: int,
) -> None:
    if not durability_problems(brokers, replication, min_isr, SAFE_BROKER | {
            "transaction.state.log.replication.factor": str(replication),
            "transaction.state.log.min.isr": str(min_isr)}, {}):
        assert replication <= brokers and min_isr <= replication
        assert replication == 1 or min_isr >= 2
