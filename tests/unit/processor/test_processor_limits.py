"""Commands written straight to the log (past the API, the CLI and the client) meet the same
limits in the processor, on the in-memory log: refused as ``invalid`` naming the field, and the
processor goes on deciding."""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from chronolog.domain import codec
from chronolog.log.partitioner import partition_for
from chronolog.log.port import OutRecord
from support.polling import wait_until
from support.processors import Running, read_all

JOB = {"type": "echo", "params": {}}


def raw_create(command_id: str, schedule_id: str, spec: dict[str, Any]) -> bytes:
    return json.dumps({
        "command_id": command_id, "type": "CreateSchedule", "tenant": "acme",
        "principal": "", "schedule_id": schedule_id, "issued_at": "2026-01-01T00:00:00Z",
        "reply_to": None, "payload": {"type": "CreateSchedule", "spec": spec},
    }).encode()  # json, not orjson: the hostile integers exceed 64 bits


async def test_raw_commands_beyond_the_limits_are_invalid_naming_the_field(
    event_log: Any,
) -> None:
    cases = {
        "every-1ms": ("s-fast", {"every": "1ms", "job": JOB}, "every"),
        "params-nul": ("s-nul", {"every": "1h", "job": {"type": "echo",
                                                        "params": {"k": "a\u0000"}}},
                       "job.params.k"),
        "jitter-huge": ("s-jit", {"every": "1h", "jitter": 1e300, "job": JOB}, "jitter"),
        "max-count-huge": ("s-max", {"every": "1h", "max_count": 2**70, "job": JOB},
                           "max_count"),
        "dots": ("..", {"every": "1h", "job": JOB}, "schedule_id"),
        "deep": ("s-deep", {"every": "1h", "job": {"type": "echo", "params": {
            "a": orjson.loads(b"[" * 50 + b"]" * 50)}}}, "params"),
    }
    suffix = uuid.uuid4().hex[:6]
    async with Running(event_log) as r:
        for name, (schedule_id, spec, _) in cases.items():
            await event_log.append([OutRecord(event_log.topics.commands,
                                              f"acme/{schedule_id}".encode(),
                                              raw_create(f"{name}-{suffix}", schedule_id, spec))])

        async def replies() -> dict[str, Any] | None:
            got = {}
            for rec in await read_all(event_log, event_log.topics.replies):
                reply = codec.decode_reply(rec.value)
                got[reply.command_id] = reply
            mine = {n: got.get(f"{n}-{suffix}") for n in cases}
            return mine if all(mine.values()) else None

        answered = await wait_until(replies, 30, what="a reply to every raw command")
        for name, (_, _, field) in cases.items():
            reply = answered[name]
            assert reply.status == "invalid", (name, reply)
            named = reply.body.get("field") or reply.reason
            assert field in named, (name, reply)
        # nothing of them reached the events, and the processor still decides
        assert await read_all(event_log, event_log.topics.events) == []
        body = await r.client.create_schedule("acme", "s-ok", {"every": "1s", "job": JOB})
        assert body["revision"] == 1


async def test_the_client_refuses_a_command_beyond_the_limits_before_appending(
    event_log: Any,
) -> None:
    async with Running(event_log) as r:
        cmds = event_log.topics.commands
        before = [await event_log.end_offset(cmds, p) for p in range(event_log.topics.partitions)]
        hostile = [
            ("s-a", {"every": "1h", "job": {"type": "echo", "params": {"k": "\u0000"}}}),
            ("s-b", {"every": "1h", "jitter": 1e300, "job": JOB}),
            ("..", {"every": "1h", "job": JOB}),
        ]
        for schedule_id, spec in hostile:
            with pytest.raises(ValidationError):
                await r.client.create_schedule("acme", schedule_id, spec)
        with pytest.raises(ValidationError, match="NUL"):
            await r.client.pause("acme", "s-a", reason="why\u0000")
        after = [await event_log.end_offset(cmds, p) for p in range(event_log.topics.partitions)]
        assert after == before


async def test_a_raw_command_off_its_keys_partition_is_invalid_and_changes_nothing(
    event_log: Any,
) -> None:
    parts = event_log.topics.partitions
    suffix = uuid.uuid4().hex[:6]
    key = b"acme/s-placed"
    right = partition_for(key, parts)
    spec = {"every": "1h", "job": JOB}
    async with Running(event_log) as r:
        await event_log.append([
            OutRecord(event_log.topics.commands, key, raw_create(f"wrong-{suffix}", "s-placed",
                                                                 spec),
                      partition=(right + 1) % parts),
            OutRecord(event_log.topics.commands, b"acme/s-elsewhere",
                      raw_create(f"key-{suffix}", "s-placed", spec)),
        ])

        async def replies() -> dict[str, Any] | None:
            got = {codec.decode_reply(rec.value).command_id: codec.decode_reply(rec.value)
                   for rec in await read_all(event_log, event_log.topics.replies)}
            mine = {n: got.get(f"{n}-{suffix}") for n in ("wrong", "key")}
            return mine if all(mine.values()) else None

        answered = await wait_until(replies, 30, what="replies to the misplaced commands")
        assert answered["wrong"].status == "invalid"
        assert f"belongs to partition {right}" in answered["wrong"].reason
        assert answered["key"].status == "invalid"
        assert "record key" in answered["key"].reason
        assert await read_all(event_log, event_log.topics.events) == []
        # the correctly placed create is the schedule's first
        body = await r.client.create_schedule("acme", "s-placed", spec)
        assert body["revision"] == 1
