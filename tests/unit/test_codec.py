"""orjson codec round trips, the upcasting hook, and one-line decode errors."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from chronolog.client import Client
from chronolog.domain import codec
from chronolog.domain import messages as m
from chronolog.log.sqlite import SqliteEventLog

T0 = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)


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


def _lifecycle_events() -> list[m.EventEnvelope]:
    """Every event a schedule's life produces, enveloped as the processor does."""
    from datetime import timedelta

    from chronolog.commands.aggregate import TenantContext
    from chronolog.commands.decider import decide, evolve
    from chronolog.commands.state import initial_state

    spec = m.ScheduleSpec.model_validate({
        "every": "1h", "job": {"type": "echo", "params": {"x": [1, 2.5, None]}, "timeout": 5},
        "effects": [{"kind": "webhook", "destination": "hook", "headers": {"X-Trace": "t"}}],
        "start_deadline": "10m",
    })
    st = initial_state("acme", "s1")
    out: list[m.EventEnvelope] = []
    now = T0

    def run(payload: object, cid: str) -> dict[str, object]:
        env = m.CommandEnvelope(command_id=cid, type=payload.type,  # type: ignore[attr-defined]
                                tenant="acme", schedule_id="s1", issued_at=now,
                                payload=payload)  # type: ignore[arg-type]
        dec = decide(st, env, now, TenantContext())
        for i, ev in enumerate(dec.events):
            evolve(st, ev)
            out.append(m.EventEnvelope(event_id=f"{cid}.{i}", type=ev.type, key="acme/s1",
                                       tenant="acme", schedule_id="s1", at=now,
                                       causation_id=cid, payload=ev))
        return dec.body

    run(m.CreateSchedule(spec=spec), "c1")
    run(m.Tick(), "t1")
    rid = next(e.payload.run_id for e in out if e.type == "OccurrenceMaterialized")  # type: ignore[attr-defined]
    body = run(m.ClaimRun(run_id=rid, attempt=1, worker_id="w"), "c2")
    fence = int(body["fence"])  # type: ignore[arg-type]
    run(m.Heartbeat(run_id=rid, attempt=1, fence=fence, worker_id="w"), "c3")
    run(m.CompleteRun(run_id=rid, attempt=1, fence=fence, worker_id="w", checksum="sha256:0",
                      size=3, inline={"ok": True}), "c4")
    run(m.TriggerRun(request_key="k1", params={"y": "z"}), "c5")
    run(m.PauseSchedule(reason="r"), "c6")
    run(m.ResumeSchedule(), "c7")
    now = now + timedelta(hours=2)
    run(m.Tick(), "t2")
    run(m.DeleteSchedule(), "c8")
    return out


def test_encode_event_is_byte_identical_to_the_generic_dump() -> None:
    events = _lifecycle_events()
    assert len({e.type for e in events}) >= 8
    for env in events:
        assert codec.encode_event(env) == codec.dumps(env), env.type
        assert codec.decode_event(codec.encode_event(env)) == env
        fields = codec.encode_event_fields(env.event_id, env.version, env.key, env.tenant,
                                           env.schedule_id, env.at, env.causation_id,
                                           env.payload)
        assert fields == codec.dumps(env), env.type


def test_dumps_kept_gives_the_bytes_orjson_gives() -> None:
    value = {"at": T0, "n": [1, 2.5, None], "s": "x" * 2000}
    kept = codec.dumps_kept(value)
    assert kept == orjson.dumps(value, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC)
    assert type(kept) is bytes


def test_encode_reply_fields_is_byte_identical_to_a_reply_model() -> None:
    body = {"run_id": "r_1", "lease_until": T0, "params": {"a": [1, None]}, "timeout": None}
    positions = [("p.events", 3, 17), ("p.events", 3, 18)]
    reply = m.Reply(command_id="c1", status="ok", reason="", body=body,
                    positions=tuple(m.LogPosition(topic=t, partition=p, offset=o)
                                    for t, p, o in positions),
                    tenant="acme", schedule_id="s1")
    data = codec.encode_reply_fields("c1", "ok", "", body, positions, "acme", "s1")
    assert data == codec.encode_reply(reply)
    pre = codec.encode_reply_fields("c1", "ok", "", codec.encode_body(body), positions, "acme",
                                    "s1")
    assert pre == data
    assert codec.decode_reply(data).body["lease_until"] == "2026-03-08T07:00:00Z"
    assert codec.encode_reply_fields("c2", "invalid", "bad", {}, [], "", "") == codec.encode_reply(
        m.Reply(command_id="c2", status="invalid", reason="bad"))


def test_an_event_already_in_the_log_decodes_even_past_todays_input_limits() -> None:
    spec = {"every": 60, "jitter": 1e300, "at": None,
            "job": {"type": "echo", "params": {"k\u0000": "a\u0000b"}}}
    with pytest.raises(ValueError):
        m.ScheduleSpec.model_validate(spec)  # as new input: refused (jitter, NUL)
    raw = {"event_id": "c1.0", "type": "ScheduleCreated", "version": 1, "key": "acme/s1",
           "tenant": "acme", "schedule_id": "s1", "at": "2026-03-08T07:00:00Z",
           "causation_id": "c1",
           "payload": {"type": "ScheduleCreated", "revision": 1, "spec": spec,
                       "created_at": "2026-03-08T07:00:00Z", "anchor": "2026-03-08T07:00:00Z",
                       "next_run_at": "2026-03-08T07:01:00Z",
                       "next_due_at": "2026-03-08T07:01:00Z"}}
    env = codec.decode_event(orjson.dumps(raw))  # written before the limits: it must fold
    assert env.payload.spec.jitter == 1e300
    assert env.payload.spec.job.params == {"k\u0000": "a\u0000b"}


def test_a_client_envelope_with_nul_in_any_text_is_refused_naming_the_field(
    tmp_path: Path
) -> None:
    client = Client(SqliteEventLog(tmp_path / "log.db"))  # not started: nothing is sent
    ok = client.envelope("acme", "s1", m.PauseSchedule(reason="maintenance"))
    assert codec.decode_command(codec.encode_command(ok)) == ok
    with pytest.raises(ValidationError, match="reason: text must not contain NUL"):
        client.envelope("acme", "s1", m.PauseSchedule(reason="main\x00tenance"))
