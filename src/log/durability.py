"""What a Kafka cluster must guarantee for chronolog's promises to hold, checked at start.

chronolog promises that an accepted command is durable, that an occurrence is materialized
once, and that a superseded owner is fenced. On Kafka each of these rests on replication:

* an append is acknowledged (``acks=all``) once every in-sync replica has it; with
  ``min.insync.replicas`` = 1 that can be one broker, whose disk then holds the only copy;
* a partition whose in-sync replicas are all lost may elect an out-of-sync replica as leader
  when ``unclean.leader.election.enable`` is true — acknowledged records are then silently
  truncated (an occurrence materialized and run could be materialized again);
* the processors' transactions (and with them fencing and exactly-once consumption of
  commands) are recorded in ``__transaction_state``, which needs the same replication.

``Durability`` is what a deployment asks for: the replication factor of the topics chronolog
creates and their minimum in-sync replicas. ``durability_problems`` compares it with what the
cluster has (its broker count, its broker settings, the topics that exist) and lists every
setting that cannot keep the promise; the Kafka adapter refuses to start on any unless the
deployment allows it explicitly (``allow_unsafe``). Pure: the adapter gathers the facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# the largest replication a deployment asks for by default: three copies survive one broker
# lost and one more in maintenance
DEFAULT_REPLICATION = 3


@dataclass(frozen=True)
class Durability:
    """``replication``/``min_isr``: None = the default for the cluster (``resolve``)."""

    replication: int | None = None
    min_isr: int | None = None
    allow_unsafe: bool = False

    def resolve(self, brokers: int) -> tuple[int, int]:
        """The replication factor and min ISR for a cluster of ``brokers``: as configured, or
        by default min(3, brokers) copies and a majority of them in sync (1 of 1 or 2,
        2 of 3)."""
        rf = self.replication or max(1, min(DEFAULT_REPLICATION, brokers))
        isr = self.min_isr or (rf // 2 + 1 if rf >= 3 else 1)
        return rf, isr


SAFE_DEFAULT = Durability()


@dataclass(frozen=True)
class TopicFacts:
    """One existing topic: its smallest replica count over its partitions, and settings."""

    replicas: int
    min_isr: int
    unclean_election: bool


def durability_problems(
    brokers: int,
    replication: int,
    min_isr: int,
    broker_config: Mapping[str, str],
    topics: Mapping[str, TopicFacts],
) -> list[str]:
    """Every way the cluster cannot keep chronolog's promises at ``replication`` copies with
    ``min_isr`` in sync; empty when it can. ``broker_config``: the broker settings
    ``unclean.leader.election.enable``, ``transaction.state.log.replication.factor`` and
    ``transaction.state.log.min.isr`` (missing keys are not judged)."""
    problems: list[str] = []
    if replication > brokers:
        problems.append(f"replication {replication} needs {replication} brokers; the cluster "
                        f"has {brokers}")
    if min_isr > replication:
        problems.append(f"min ISR {min_isr} is more than the replication {replication}: "
                        "no write could ever be acknowledged")
    if replication > 1 and min_isr < 2:
        problems.append(f"min ISR {min_isr} with replication {replication}: an acknowledged "
                        "write may be on one broker only")
    if broker_config.get("unclean.leader.election.enable", "false").lower() == "true":
        problems.append("the brokers allow unclean leader election "
                        "(unclean.leader.election.enable=true): acknowledged records can be "
                        "lost in a leader change")
    txn_rf = broker_config.get("transaction.state.log.replication.factor")
    if txn_rf is not None and int(txn_rf) < replication:
        problems.append(f"the transaction state log is replicated {txn_rf} times, fewer than "
                        f"the replication {replication}")
    txn_isr = broker_config.get("transaction.state.log.min.isr")
    if txn_isr is not None and int(txn_isr) < min(min_isr, replication):
        problems.append(f"the transaction state log's min ISR is {txn_isr}, below {min_isr}")
    for name in sorted(topics):
        facts = topics[name]
        if facts.replicas < replication:
            problems.append(f"topic {name} has {facts.replicas} replica(s), fewer than the "
                            f"replication {replication}")
        if facts.min_isr < min_isr:
            problems.append(f"topic {name} has min.insync.replicas={facts.min_isr}, below "
                            f"{min_isr}")
        if facts.unclean_election:
            problems.append(f"topic {name} allows unclean leader election")
    return problems
