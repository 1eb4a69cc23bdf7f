"""orjson codec round trips, the upcasting hook, and one-line decode errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chronolog.client import Client
from chronolog.domain import codec, wire
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

    old = orjson.loads(codec.encode_event_v1(_event()))
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


def test_both_event_formats_decode_to_the_same_envelope() -> None:
    events = _lifecycle_events()
    assert len({e.type for e in events}) >= 8
    for env in events:
        compact = codec.encode_event(env)
        assert codec.decode_event(compact) == env, env.type
        assert codec.decode_event(codec.encode_event_v1(env)) == env, env.type
        fields = codec.encode_event_fields(env.event_id, env.version, env.key, env.tenant,
                                           env.schedule_id, env.at, env.causation_id,
                                           env.payload)
        assert fields == compact, env.type
        assert len(compact) < len(codec.encode_event_v1(env)), env.type
        # a reader of raw records sees the first format's members, member for member
        assert codec.expand_event(orjson.loads(compact)) == orjson.loads(
            codec.encode_event_v1(env)), env.type


def test_a_compact_event_writes_each_value_once_and_no_wire_default() -> None:
    env = next(e for e in _lifecycle_events() if e.type == "OccurrenceMaterialized"
               and e.payload.trigger == "schedule")  # type: ignore[union-attr]
    raw = orjson.loads(codec.encode_event(env))
    assert set(raw) == {"f", "k", "c", "n", "at", "p"}  # no tenant, schedule_id, event_id
    assert (raw["f"], raw["k"], raw["n"]) == (2, "acme/s1", 0)
    assert "trigger" not in raw["p"] and "priority" not in raw["p"]
    assert raw["p"]["scheduled_at"] == 0  # at the event's time: microseconds after ``at``
    assert raw["p"]["next_run_at"] == 3_600_000_000  # the next hour
    assert "resource_class" not in raw["p"] and "advances_schedule" not in raw["p"]
    assert raw["p"]["type"] == "OccurrenceMaterialized"


def test_the_wire_format_example_of_the_design_is_what_the_codec_writes() -> None:
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    section = design[design.index("### Wire format"):]
    start = section.index("```json\n") + 8
    example = section[start:section.index("\n```", start)]
    assert orjson.loads(example) == orjson.loads(codec.encode_event(_event()))
    assert codec.decode_event(example.encode()) == _event()


def test_every_compact_event_is_valid_for_its_documented_schema() -> None:
    for env in _lifecycle_events():
        raw = orjson.loads(codec.encode_event(env))
        doc = wire.CompactEventEnvelope.model_validate(raw)
        assert (doc.k, doc.c, doc.p["type"]) == (env.key, env.causation_id, env.type)


def test_a_compact_event_reads_a_left_out_member_as_its_frozen_wire_default() -> None:
    for etype, defaults in wire.EVENT_DEFAULTS.items():
        assert wire.expand_payload({"type": etype}) == {"type": etype, **defaults}
    job = wire.expand_payload({"type": "OccurrenceMaterialized", "job": {"type": "noop"}})["job"]
    assert job == {"type": "noop", "params": {}, "timeout": None}


def test_a_compact_instant_is_exact_to_the_microsecond_before_or_after_at() -> None:
    env = _event()
    for delta in (timedelta(0), timedelta(microseconds=1), timedelta(microseconds=-1),
                  timedelta(days=-3650, microseconds=7), timedelta(days=3650, seconds=59)):
        payload = m.LeaseExtended(run_id="r_1", attempt=1, fence=3, lease_until=T0 + delta)
        ext = env.model_copy(update={"type": payload.type, "payload": payload})
        raw = orjson.loads(codec.encode_event(ext))
        assert raw["p"]["lease_until"] == delta // timedelta(microseconds=1)
        assert codec.decode_event(codec.encode_event(ext)) == ext


def test_a_compact_event_keeps_what_its_key_and_causation_do_not_say() -> None:
    env = _event().model_copy(update={"key": "routing@0", "event_id": "handover-7"})
    raw = orjson.loads(codec.encode_event(env))
    assert (raw["tenant"], raw["schedule_id"], raw["id"]) == ("acme", "s1", "handover-7")
    assert codec.decode_event(codec.encode_event(env)) == env
    bare = env.model_copy(update={"causation_id": None})
    assert codec.decode_event(codec.encode_event(bare)) == bare


def test_an_event_of_an_unknown_format_is_a_decode_error_naming_it() -> None:
    with pytest.raises(codec.DecodeError, match=r"^f: unknown event format 3"):
        codec.decode_event(b'{"f":3,"k":"a/b","p":{}}')
    with pytest.raises(codec.DecodeError, match=r"^n: "):
        codec.decode_event(b'{"f":2,"k":"a/b","c":"x","at":"2026-03-08T07:00:00Z",'
                           b'"p":{"type":"ScheduleDeleted"}}')
    with pytest.raises(codec.DecodeError, match=r"^at: "):
        codec.decode_event(b'{"f":2,"k":"a/b","c":"x","n":0,"p":{"type":"LeaseExtended",'
                           b'"run_id":"r","attempt":1,"fence":1,"lease_until":5}}')


def test_a_compact_command_decodes_to_the_command_it_was() -> None:
    spec = m.ScheduleSpec.model_validate({"every": "1h", "job": {"type": "echo"}})
    for payload in (m.CreateSchedule(spec=spec), m.Tick(), m.PauseSchedule(),
                    m.CompleteRun(run_id="r_1", attempt=1, fence=2, worker_id="w",
                                  checksum="sha256:0", size=0),
                    m.FailRun(run_id="r_1", attempt=1, fence=2, worker_id="w")):
        env = m.CommandEnvelope(command_id="c1", type=payload.type, tenant="acme",
                                schedule_id="s1", issued_at=T0, payload=payload)
        data = codec.encode_command(env)
        assert codec.decode_command(data) == env, payload.type
        assert codec.decode_command(codec.dumps(env)) == env, payload.type
        assert b'"principal"' not in data and b"null" not in data, payload.type


def test_a_compact_assignment_decodes_to_every_member() -> None:
    body = {"run_id": "r_1", "attempt": 1, "fence": 2, "lease_until": T0, "params": {},
            "timeout": None, "job_type": "noop"}
    data = codec.encode_assignment("w1", "acme", "s1", body)
    assert b"r_1" not in data and b"params" not in data and b"timeout" not in data
    assert codec.decode_assignment(data, b"r_1") == {
        "assignee": "w1", "tenant": "acme", "schedule_id": "s1", "run_id": "r_1", "attempt": 1,
        "fence": 2, "lease_until": "2026-03-08T07:00:00Z", "params": {}, "timeout": None,
        "job_type": "noop"}
    with pytest.raises(codec.DecodeError, match=r"^run_id: "):
        codec.decode_assignment(data, None)


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
    assert codec.decode_reply(data) == codec.decode_reply(codec.dumps(reply))  # first format
    assert b'"positions":[["p.events",3,17]' in data
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


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=12)
_INSTANT = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31),
                        timezones=st.just(UTC))


@settings(max_examples=200, deadline=None)
@given(event_id=_TEXT, causation=st.one_of(st.none(), _TEXT), index=st.integers(0, 10**6),
       derived=st.booleans(), tenant=_TEXT, schedule_id=_TEXT, slash=st.booleans(),
       version=st.integers(1, 3), at=_INSTANT, lease_until=_INSTANT,
       scheduled_at=_INSTANT, next_run_at=st.one_of(st.none(), _INSTANT),
       priority=st.integers(-100, 100),
       params=st.dictionaries(_TEXT, st.integers(-2**63, 2**63 - 1), max_size=2))
def test_any_event_reads_back_the_same_from_both_formats(
        event_id: str, causation: str | None, index: int, derived: bool, tenant: str,
        schedule_id: str, slash: bool, version: int, at: datetime, lease_until: datetime,
        scheduled_at: datetime, next_run_at: datetime | None, priority: int,
        params: dict[str, int]) -> None:
    if derived and causation is not None:
        event_id = f"{causation}.{index}"
    key = f"{tenant}/{schedule_id}" if slash else f"{tenant}{schedule_id}"
    for payload in (
            m.LeaseExtended(run_id="r_1", attempt=1, fence=2, lease_until=lease_until),
            m.OccurrenceMaterialized(
                run_id="r_1", scheduled_at=scheduled_at, due_at=scheduled_at, revision=1,
                job=m.JobSpec(type="noop", params=params), state="READY", sequence=1,
                priority=priority, next_run_at=next_run_at, next_due_at=next_run_at)):
        env = m.EventEnvelope(event_id=event_id, type=payload.type, version=version, key=key,
                              tenant=tenant, schedule_id=schedule_id, at=at,
                              causation_id=causation, payload=payload)
        assert codec.decode_event(codec.encode_event(env)) == env
        assert codec.decode_event(codec.encode_event_v1(env)) == env
        assert codec.expand_event(orjson.loads(codec.encode_event(env))) == orjson.loads(
            codec.encode_event_v1(env))
