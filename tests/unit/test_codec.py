"""orjson codec round trips, the upcasting hook, and one-line decode errors."""

from __future__ import annotations

from datetime import datetime, timezone

import orjson
import pytest

from chronolog.domain import codec
from chronolog.domain import messages as m

T0 = datetime(2026, 3, 8, 7, 0, tzinfo=timezone.utc)


def _event() -> m.EventEnvelope:
    return m.EventEnvelope(
        event_id="c1.0", type="FenceAdvanced", key="acme/s1", tenant="acme", schedule_id="s1",
        at=T0, causation_id="c1",
        payload=m.FenceAdvanced(fence=3, run_id="r_1", reason="claim"),
    )


def test_event_round_trip_keeps_every_field() -> None:
    env = _event()
    data = codec.encode_event(env)
    assert b'"2026-03-08T07:00:00Z"' in data
    assert codec.decode_event(data) == env


def test_command_round_trip_with_durations_as_strings() -> None:
    raw = {
        "command_id": "c9", "type": "CreateSchedule", "tenant": "acme", "schedule_id": "s1",
        "issued_at": "2026-03-08T07:00:00Z",
        "payload": {"type": "CreateSchedule",
                    "spec": {"every": "15m", "lease": "2m", "job": {"type": "echo"}}},
    }
    env = codec.decode_command(orjson.dumps(raw))
    assert isinstance(env.payload, m.CreateSchedule)
    assert env.payload.spec.every == 900.0 and env.payload.spec.lease == 120.0
    assert codec.decode_command(codec.encode_command(env)) == env


def test_decode_error_names_the_field() -> None:
    raw = {"command_id": "c9", "type": "ClaimRun", "tenant": "acme", "schedule_id": "s1",
           "issued_at": "2026-03-08T07:00:00Z",
           "payload": {"type": "ClaimRun", "run_id": "r", "attempt": 0, "worker_id": "w"}}
    with pytest.raises(codec.DecodeError) as err:
        codec.decode_command(orjson.dumps(raw))
    assert "attempt" in str(err.value) and "\n" not in str(err.value)


def test_garbage_bytes_are_a_decode_error() -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode_command(b"\xff not json")


def test_upcaster_is_applied_by_type_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(m, "CURRENT_VERSION", 2)
    monkeypatch.setattr(codec, "CURRENT_VERSION", 2)
    monkeypatch.setattr(codec, "_UPCASTERS", {})

    @codec.register_upcaster("FenceAdvanced", 1)
    def _v1_to_v2(raw: dict) -> dict:  # v1 named the field "epoch"
        raw["payload"]["fence"] = raw["payload"].pop("epoch")
        return raw

    old = orjson.loads(codec.encode_event(_event()))
    old["payload"]["epoch"] = old["payload"].pop("fence")
    env = codec.decode_event(orjson.dumps(old))
    assert env.payload.fence == 3 and env.version == 2
