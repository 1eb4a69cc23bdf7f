"""Effect destinations: the tenants-file format, what a tenant may choose, the breaker, the
address rule of webhook targets."""

from __future__ import annotations

import ipaddress
import re
from datetime import UTC
from pathlib import Path
from typing import Any

import orjson
import pytest

from chronolog.commands.aggregate import TenantContext
from chronolog.commands.decider import ungranted_effect
from chronolog.destinations import adapter_config, give_up_after, parse_destinations
from chronolog.domain import messages as m
from chronolog.effect_adapters.netguard import address_refusal
from chronolog.effects.runner import Breaker
from chronolog.settings import ConfigError
from chronolog.tenants import load_tenants

DEPLOYMENT = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


def readme_blocks() -> tuple[str, str]:
    """The TOML and JSON examples of the effect destinations section of docs/deployment.md."""
    text = DEPLOYMENT.read_text()
    section = text[text.index("#### Effect destinations"):]
    toml = re.search(r"```toml\n(.*?)```", section, re.S)
    json = re.search(r"```json\n(.*?)```", section, re.S)
    assert toml and json
    return toml.group(1), json.group(1)


def test_the_readme_example_is_a_valid_tenants_file(tmp_path: Path) -> None:
    toml, json = readme_blocks()
    (tmp_path / "tenants.toml").write_text(toml)
    tenants = load_tenants(tmp_path / "tenants.toml")
    assert tenants.destinations("acme") == {"billing": "webhook", "ledger": "postgres",
                                            "results": "kafka", "ops-mail": "email"}
    assert tenants.destinations("nobody") == {}
    from chronolog.queries.documents import EffectIn

    effects = [EffectIn.model_validate(e) for e in orjson.loads("{" + json + "}")["effects"]]
    spec = m.ScheduleSpec.model_validate({"every": "1h", "job": {"type": "noop"}, "effects": [
        e.model_dump(exclude_none=True) for e in effects]})
    granted = TenantContext(destinations=tenants.destinations("acme"))
    assert ungranted_effect(spec, granted) is None


@pytest.mark.parametrize(("table", "message"), [
    ({"kind": "webhook"}, r"destinations\.d\.url: Field required"),
    ({"kind": "webhook", "url": "file:///etc/passwd"}, r"destinations\.d\.url: .* not an http"),
    ({"kind": "webhook", "url": "http://a", "headers": {"Host": "b"}},
     r"destinations\.d\.headers: header 'Host'"),
    ({"kind": "postgres", "dsn": "postgresql://a/b"}, r"destinations\.d\.sql: Field required"),
    ({"kind": "kafka", "topic": "a b"}, r"destinations\.d\.topic"),
    ({"kind": "email", "host": "h"}, r"destinations\.d\.to: Field required"),
    ({"kind": "webhook", "url": "http://a", "give_up_after": "30d"},
     r"destinations\.d\.give_up_after"),
    ({"kind": "kafka", "topic": "a", "dns": "x"}, r"destinations\.d\.dns: Extra inputs"),
])
def test_a_bad_destination_is_a_config_error_naming_the_key(
    table: dict[str, Any], message: str,
) -> None:
    with pytest.raises(ConfigError, match=r"^invalid tenants\.acme\." + message):
        parse_destinations("acme", {"d": table})


def test_the_tenant_adds_only_its_options_and_the_operator_wins() -> None:
    dest = parse_destinations("acme", {"d": {
        "kind": "webhook", "url": "https://b.example/h", "headers": {"Authorization": "op"},
        "give_up_after": "10m"}})["d"]
    cfg = adapter_config(dest, {"headers": {"authorization": "tenant", "Host": "evil",
                                            "X-Trace": "t"}, "url": "http://evil"})
    assert cfg["url"] == "https://b.example/h"
    assert cfg["headers"] == {"X-Trace": "t", "Authorization": "op"}
    assert give_up_after(dest, {"give_up_after": 60.0}) == 60.0
    assert give_up_after(dest, {"give_up_after": 86_400.0}) == 600.0  # capped
    assert give_up_after(dest, {}) == 600.0


@pytest.mark.parametrize(("effect", "problem"), [
    ({"kind": "email", "destination": "d", "headers": {"X-A": "1"}}, "webhook effects only"),
    ({"kind": "webhook", "destination": "d", "subject": "s"}, "email effects only"),
    ({"kind": "webhook", "destination": "d", "headers": {"X-Forwarded-Host": "a"}},
     "may not be set"),
    ({"kind": "webhook", "destination": "d", "headers": {"X-A": "a\r\nHost: b"}}, "pattern"),
    ({"kind": "webhook", "destination": "d", "give_up_after": "30d"}, "give_up_after"),
    ({"kind": "webhook"}, "destination"),
])
def test_an_effect_chooses_only_small_validated_options(
    effect: dict[str, Any], problem: str,
) -> None:
    with pytest.raises(ValueError, match=problem):
        m.EffectSpec.model_validate(effect)


def test_an_effect_may_only_name_a_granted_destination_of_its_kind() -> None:
    spec = m.ScheduleSpec.model_validate({"every": "1h", "job": {"type": "noop"}, "effects": [
        {"kind": "webhook", "destination": "hook"}, {"kind": "postgres", "destination": "db"}]})
    assert ungranted_effect(spec, TenantContext()) is None  # not checked without a registry
    missing = ungranted_effect(spec, TenantContext(destinations={"hook": "webhook"}))
    assert missing is not None and missing.status == "forbidden"
    assert missing.field == "effects[1].destination"
    wrong = ungranted_effect(spec, TenantContext(destinations={"hook": "email", "db": "postgres"}))
    assert wrong is not None and wrong.status == "invalid" and wrong.field == "effects[0].kind"


def test_the_circuit_breaker_opens_probes_and_closes() -> None:
    now = [100.0]
    b = Breaker(failures=3, cooldown=30.0, clock=lambda: now[0])
    for _ in range(2):
        b.record(available=False)
    assert b.state == "closed" and b.wait() == 0
    b.record(available=False)
    assert b.state == "open" and b.wait() == 30.0
    now[0] += 30.0
    assert b.state == "half-open" and b.wait() == 0  # one probe may go
    b.record(available=False)  # the probe failed: open again at once
    assert b.state == "open" and b.wait() == 30.0
    now[0] += 30.0
    b.record(available=True)
    assert b.state == "closed" and b.failures == 0


@pytest.mark.parametrize(("address", "private_ok", "refused"), [
    ("93.184.216.34", False, False),
    ("127.0.0.1", False, True), ("127.0.0.1", True, False),
    ("10.1.2.3", False, True), ("192.168.0.1", False, True), ("172.16.0.1", False, True),
    ("169.254.1.1", False, True), ("100.64.0.1", False, True), ("0.0.0.0", False, True),
    ("224.0.0.1", False, True), ("::1", False, True), ("fe80::1", False, True),
    ("fc00::1", False, True), ("::ffff:127.0.0.1", False, True),
    ("169.254.169.254", True, True), ("fd00:ec2::254", True, True),
    ("::ffff:169.254.169.254", True, True), ("2606:4700::1111", False, False),
])
def test_which_addresses_a_webhook_may_reach(address: str, private_ok: bool,
                                              refused: bool) -> None:
    assert (address_refusal(ipaddress.ip_address(address), private_ok) is not None) == refused


@pytest.mark.parametrize(("address", "private_ok", "refused"), [
    # NAT64 (64:ff9b::/96): judged by the IPv4 address in its last 32 bits
    ("64:ff9b::a9fe:a9fe", False, True), ("64:ff9b::a9fe:a9fe", True, True),  # metadata
    ("64:ff9b::7f00:1", False, True), ("64:ff9b::a00:1", False, True),
    ("64:ff9b::808:808", False, False),
    ("64:ff9b:1::808:808", False, True),  # local-use NAT64: the embedding is not knowable
    # 6to4 (2002::/16): the IPv4 address in bits 16-47
    ("2002:7f00:1::", False, True), ("2002:a9fe:a9fe::1", True, True),
    ("2002:c0a8:1::1", False, True), ("2002:808:808::1", False, False),
    # Teredo (2001::/32): a tunnel, refused; its client address is read for metadata
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False, True),
    ("2001:0:4136:e378:8000:63bf:5601:5601", True, True),  # client 169.254.169.254
    # IPv4-compatible (::a.b.c.d) and IPv4-translated (::ffff:0:a.b.c.d)
    ("::127.0.0.1", False, True), ("::10.0.0.1", False, True), ("::a9fe:a9fe", True, True),
    ("::ffff:0:7f00:1", False, True), ("::ffff:0:a9fe:a9fe", True, True),
    ("::8.8.8.8", False, False), ("::ffff:0:808:808", False, False),
    # every embedding of a public address still passes; :: and ::1 are themselves refused
    ("::", False, True), ("::1", False, True), ("::1", True, False),
])
def test_an_ipv6_address_carrying_an_ipv4_address_is_judged_by_the_ipv4_address(
        address: str, private_ok: bool, refused: bool) -> None:
    assert (address_refusal(ipaddress.ip_address(address), private_ok) is not None) == refused


def test_a_schedule_stored_before_destinations_still_decodes_and_names_no_target() -> None:
    """A ScheduleCreated already in the log with a tenant-written effect ``config`` decodes
    (the log is replayed forever); the config is dropped and the effect names the destination
    of its effect name. A new spec with a ``config`` is invalid."""
    from datetime import datetime

    from chronolog.domain import codec

    legacy = {"every": 3600.0, "job": {"type": "noop"}, "effects": [
        {"kind": "postgres", "name": "", "config": {"sql": "DELETE FROM schedules"}},
        {"kind": "email", "name": "", "config": {"host": "10.0.0.1"}}]}
    raw = {"event_id": "e1", "type": "ScheduleCreated", "version": 1, "key": "acme/s1",
           "tenant": "acme", "schedule_id": "s1", "at": datetime.now(UTC),
           "causation_id": None, "payload": {
               "type": "ScheduleCreated", "revision": 1, "spec": legacy,
               "created_at": datetime.now(UTC),
               "anchor": datetime.now(UTC), "next_run_at": None, "next_due_at": None}}
    env = codec.decode_event(orjson.dumps(raw))
    effects = env.payload.spec.effects  # type: ignore[union-attr]
    assert [(e.kind, e.destination, e.options()) for e in effects] == [
        ("postgres", "postgres", {}), ("email", "send", {})]
    with pytest.raises(ValueError, match="config"):
        m.ScheduleSpec.model_validate(legacy)
