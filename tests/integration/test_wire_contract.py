"""The command wire contract, as docs/deployment.md, "Commands from any Kafka producer" states it.

A plain aiokafka producer and consumer — nothing of chronolog is imported here — send a
``CreateSchedule`` envelope to a real ``chronolog processor`` on a real broker, keyed
``tenant/schedule_id`` with Kafka's default (murmur2) partitioner, and read the reply from the
same partition number of ``replies`` by its key (the command ID), then the event from
``events``. A command placed on another partition than its key's is refused ``invalid`` and
changes nothing; a re-sent command ID is answered with the original reply.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
PARTITIONS = 4
TENANT = "acme"

pytestmark = pytest.mark.kafka


def create_envelope(schedule_id: str, command_id: str) -> dict[str, Any]:
    """A CreateSchedule command envelope, written by hand as any producer would."""
    return {
        "command_id": command_id,
        "type": "CreateSchedule",
        "tenant": TENANT,
        "principal": "billing-service",
        "schedule_id": schedule_id,
        "issued_at": "2026-12-01T09:00:00Z",
        "payload": {
            "type": "CreateSchedule",
            "spec": {"every": "1h", "job": {"type": "noop", "params": {"batch": 7}}},
        },
    }


@pytest.fixture
async def processor(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
                    ) -> AsyncIterator[str]:
    """A ``chronolog processor`` on the broker under a fresh topic prefix; its prefix."""
    log_path = tmp_path / "processor.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [CHRONOLOG, "processor", "--log", f"kafka://{kafka_bootstrap}",
             "--topic-prefix", topic_prefix, "--partitions", str(PARTITIONS),
             "--member-id", "wire-test"],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        yield topic_prefix
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _partitions_of(consumer: AIOKafkaConsumer, topic: str, deadline: float) -> set[int]:
    """The partitions of ``topic`` once the processor has made it."""
    while time.monotonic() < deadline:
        if topic in await consumer.topics():  # a fresh metadata request each time
            consumer.subscribe([topic])  # asks the client to track the topic's partitions
            parts = consumer.partitions_for_topic(topic)
            consumer.unsubscribe()
            if parts:
                return set(parts)
        await asyncio.sleep(0.1)
    raise AssertionError(f"topic {topic} never appeared")


async def _record_with_key(servers: str, topic: str, partition: int, key: bytes,
                           timeout: float = 30.0) -> dict[str, Any]:
    """The first committed record of ``topic``/``partition`` whose key is ``key``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        # the topic's metadata first, within its own bound: on a loaded machine it took
        # longer than a short ``timeout`` (the wait for records), which then never began
        await _partitions_of(consumer, topic, time.monotonic() + 30)
        deadline = time.monotonic() + timeout
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=200)
            for rec in batch.get(tp, []):
                if rec.key == key:
                    return json.loads(rec.value)
        raise AssertionError(f"no record keyed {key!r} on {topic}/{partition}")
    finally:
        await consumer.stop()


async def _events_of(servers: str, topic: str, partition: int, schedule_key: bytes,
                     want: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    found: list[dict[str, Any]] = []
    try:
        # the topic's metadata first, within its own bound: on a loaded machine it took
        # longer than a short ``timeout`` (the wait for records), which then never began
        await _partitions_of(consumer, topic, time.monotonic() + 30)
        deadline = time.monotonic() + timeout
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while time.monotonic() < deadline and len(found) < want:
            batch = await consumer.getmany(tp, timeout_ms=200)
            found += [json.loads(r.value) for r in batch.get(tp, []) if r.key == schedule_key]
        return found
    finally:
        await consumer.stop()


async def _wait_for_topic(servers: str, topic: str) -> set[int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=servers)
    await consumer.start()
    try:
        return await _partitions_of(consumer, topic, time.monotonic() + 30)
    finally:
        await consumer.stop()


async def test_a_plain_kafka_producer_creates_a_schedule_and_reads_its_reply(
        processor: str, kafka_bootstrap: str) -> None:
    prefix = processor
    commands, replies, events = f"{prefix}commands", f"{prefix}replies", f"{prefix}events"
    assert await _wait_for_topic(kafka_bootstrap, commands) == set(range(PARTITIONS))
    schedule_id, command_id = "nightly-invoices", f"cmd-{uuid.uuid4().hex}"
    key = f"{TENANT}/{schedule_id}".encode()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all",
                                enable_idempotence=True)  # the default partitioner: murmur2
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            commands, json.dumps(create_envelope(schedule_id, command_id)).encode(), key=key)
        reply = await _record_with_key(kafka_bootstrap, replies, meta.partition,
                                       command_id.encode())
        assert reply["command_id"] == command_id
        assert reply["status"] == "ok", reply
        assert reply["body"]["revision"] == 1
        assert reply["body"]["schedule_id"] == schedule_id
        assert reply["body"]["state"] == "ACTIVE" and reply["body"]["next_run_at"]
        positions = reply["positions"]  # [topic, partition, offset] each
        assert positions and {t for t, _, _ in positions} == {events}
        assert {p for _, p, _ in positions} == {meta.partition}

        # the event, on the same partition number of events, under the same key, in the
        # compact format: f = 2, k = tenant/schedule_id, c = the command ID, p = the event
        [created, *_] = await _events_of(kafka_bootstrap, events, meta.partition, key, 1)
        assert created["f"] == 2 and created["p"]["type"] == "ScheduleCreated"
        assert created["k"] == f"{TENANT}/{schedule_id}"
        assert created["c"] == command_id

        # the same command ID again: the original reply, no second schedule
        meta2 = await producer.send_and_wait(
            commands, json.dumps(create_envelope(schedule_id, command_id)).encode(), key=key)
        assert meta2.partition == meta.partition
        deadline = time.monotonic() + 30
        again: list[dict[str, Any]] = []
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap,
                                    isolation_level="read_committed", enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(replies, meta.partition)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            while time.monotonic() < deadline and len(again) < 2:
                batch = await consumer.getmany(tp, timeout_ms=200)
                again += [json.loads(r.value) for r in batch.get(tp, [])
                          if r.key == command_id.encode()]
        finally:
            await consumer.stop()
        assert len(again) == 2 and again[1]["status"] == "ok"
        assert again[1]["body"] == again[0]["body"]
    finally:
        await producer.stop()


async def test_a_command_on_the_wrong_partition_is_refused_and_changes_nothing(
        processor: str, kafka_bootstrap: str) -> None:
    prefix = processor
    commands, replies, events = f"{prefix}commands", f"{prefix}replies", f"{prefix}events"
    await _wait_for_topic(kafka_bootstrap, commands)
    schedule_id = "misrouted-report"
    key = f"{TENANT}/{schedule_id}".encode()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        right = producer._partitioner(key, list(range(PARTITIONS)), list(range(PARTITIONS)))
        wrong = (right + 1) % PARTITIONS
        bad_id = f"cmd-{uuid.uuid4().hex}"
        await producer.send_and_wait(
            commands, json.dumps(create_envelope(schedule_id, bad_id)).encode(), key=key,
            partition=wrong)
        refused = await _record_with_key(kafka_bootstrap, replies, wrong, bad_id.encode())
        assert refused["status"] == "invalid"
        assert f"partition {right}" in refused["reason"], refused["reason"]

        # a record whose key is not the envelope's tenant/schedule_id is refused too
        other_id = f"cmd-{uuid.uuid4().hex}"
        meta = await producer.send_and_wait(
            commands, json.dumps(create_envelope(schedule_id, other_id)).encode(),
            key=b"acme/another-schedule")
        refused_key = await _record_with_key(kafka_bootstrap, replies, meta.partition,
                                             other_id.encode())
        assert refused_key["status"] == "invalid"
        assert "key" in refused_key["reason"], refused_key["reason"]

        # neither made a schedule: the correctly placed create is the first (revision 1)
        good_id = f"cmd-{uuid.uuid4().hex}"
        meta = await producer.send_and_wait(
            commands, json.dumps(create_envelope(schedule_id, good_id)).encode(), key=key)
        assert meta.partition == right
        reply = await _record_with_key(kafka_bootstrap, replies, right, good_id.encode())
        assert reply["status"] == "ok" and reply["body"]["revision"] == 1, reply
        on_wrong = await _events_of(kafka_bootstrap, events, wrong, key, 1, timeout=2.0)
        assert on_wrong == []
    finally:
        await producer.stop()
