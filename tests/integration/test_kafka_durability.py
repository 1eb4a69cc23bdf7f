"""On a real broker: topics are created with the deployment's replication and min ISR, and a
process refuses to start on a cluster that cannot keep chronolog's guarantees
(chronolog.log.durability), with exit status 2 and a message naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from chronolog.log.durability import Durability
from chronolog.log.kafka import KafkaEventLog
from chronolog.log.port import LogUnsafe, Topics

pytestmark = pytest.mark.kafka

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")


async def topic_settings(servers: str, topic: str) -> tuple[int, dict[str, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        [described] = await admin.describe_topics([topic])
        [resp] = await admin.describe_configs([ConfigResource(
            ConfigResourceType.TOPIC, topic,
            {"min.insync.replicas": None, "unclean.leader.election.enable": None})])
        [res] = resp.to_object()["resources"]
        return (min(len(p["replicas"]) for p in described["partitions"]),
                {e["config_names"]: e["config_value"] for e in res["config_entries"]})
    finally:
        await admin.close()


async def test_topics_are_created_with_the_clusters_replication_and_no_unclean_election(
    kafka_bootstrap: str, topic_prefix: str,
) -> None:
    lg = KafkaEventLog(kafka_bootstrap, Topics(prefix=topic_prefix, partitions=2))
    await lg.start()
    try:
        await lg.ensure_topics()
    finally:
        await lg.close()
    replicas, cfg = await topic_settings(kafka_bootstrap, f"{topic_prefix}events")
    assert replicas == 1  # a single broker: one copy
    assert cfg == {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"}


def run_processor(servers: str, prefix: str, tmp_path: Path,
                  **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHRONOLOG, "processor", "--log", f"kafka://{servers}", "--partitions", "2",
         "--topic-prefix", prefix, "--ready-file", str(tmp_path / "ready.json")],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_a_processor_asked_for_three_copies_on_one_broker_refuses_to_start(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path,
) -> None:
    done = run_processor(kafka_bootstrap, topic_prefix, tmp_path, CHRONOLOG_REPLICATION="3")
    assert done.returncode == 2, done.stderr
    assert "replication 3 needs 3 brokers; the cluster has 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_replication_setting_is_a_usage_error_naming_it(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path,
) -> None:
    done = run_processor(kafka_bootstrap, topic_prefix, tmp_path, CHRONOLOG_REPLICATION="x")
    assert done.returncode == 2
    assert "CHRONOLOG_REPLICATION" in done.stderr and "Traceback" not in done.stderr


async def test_a_topic_allowing_unclean_election_is_refused_unless_allowed(
    kafka_bootstrap: str, topic_prefix: str,
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(f"{topic_prefix}events", 2, 1, topic_configs={
            "unclean.leader.election.enable": "true"})])
    finally:
        await admin.close()
    topics = Topics(prefix=topic_prefix, partitions=2)
    lg = KafkaEventLog(kafka_bootstrap, topics)
    await lg.start()
    try:
        with pytest.raises(LogUnsafe, match=f"topic {topic_prefix}events allows unclean"):
            await lg.ensure_topics()
    finally:
        await lg.close()
    allowed = KafkaEventLog(kafka_bootstrap, topics, durability=Durability(allow_unsafe=True))
    await allowed.start()
    try:
        await allowed.ensure_topics()  # logged, not refused
        assert await allowed.partitions_for(topics.commands) == 2
    finally:
        await allowed.close()
