"""Signed webhooks (Standard Webhooks): the ``signing_secrets`` of a webhook destination, how
they are validated and kept out of sight, the headers nobody else may set, and signatures
equal to the official library's (``standardwebhooks``)."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from standardwebhooks import Webhook

from chronolog.destinations import WebhookDestination, adapter_config, parse_destinations
from chronolog.domain import messages as m
from chronolog.effect_adapters.webhook import (
    request_headers,
    signature,
    signed_headers,
    signing_keys,
)
from chronolog.settings import ConfigError
from chronolog.tenants import load_tenants

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 148))
SECRET_A = "whsec_" + base64.b64encode(KEY_A).decode()
SECRET_B = "whsec_" + base64.b64encode(KEY_B).decode()


def webhook(**table: Any) -> dict[str, Any]:
    return {"kind": "webhook", "url": "https://hooks.example/h", **table}


def secret_of(n: int, fill: int = 7) -> str:
    return "whsec_" + base64.b64encode(bytes([fill]) * n).decode()


@pytest.mark.parametrize(("secret", "problem"), [
    ("sk_" + SECRET_A[6:], r"is written whsec_<base64>; this one does not start with 'whsec_'"),
    (SECRET_A[6:], r"does not start with 'whsec_'"),
    ("WHSEC_" + SECRET_A[6:], r"does not start with 'whsec_'"),
    ("", r"does not start with 'whsec_'"),
    ("whsec_" + "A" * 30 + "!!", r"not valid base64 after 'whsec_'"),
    ("whsec_" + base64.urlsafe_b64encode(b"\xfb" * 30).decode(), r"not valid base64"),
    ("whsec_" + "A" * 33, r"not valid base64"),  # 33 digits: no base64 length
    ("whsec_AAAA=AAA" + "A" * 28, r"not valid base64"),  # padding inside
    (SECRET_A + "\n", r"not valid base64"),
    (secret_of(23), r"decodes to 23 bytes; 24 to 64 are required"),
    (secret_of(65), r"decodes to 65 bytes; 24 to 64 are required"),
    ("whsec_", r"decodes to 0 bytes"),
])
def test_a_bad_signing_secret_is_a_config_error_naming_the_field_not_the_secret(
        secret: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_destinations("acme", {"billing": webhook(signing_secrets=[SECRET_A, secret])})
    message = str(err.value)
    assert message.startswith(
        "invalid tenants.acme.destinations.billing.signing_secrets.1: "), message
    assert re.search(problem, message), message
    assert SECRET_A not in message and SECRET_A[6:] not in message
    if len(secret) > 8:
        assert secret.strip() not in message and secret[6:].strip() not in message


@pytest.mark.parametrize(("value", "problem"), [
    (SECRET_A, "signing_secrets: Input should be a valid list"),
    ([SECRET_A, SECRET_A], "signing_secrets: the same signing secret is listed twice"),
    ([secret_of(32, n) for n in range(9)], "signing_secrets: List should have at most 8"),
    ([42], "signing_secrets.0: Input should be a valid string"),
])
def test_signing_secrets_is_a_short_list_of_distinct_secrets(value: Any, problem: str) -> None:
    with pytest.raises(ConfigError, match=r"^invalid tenants\.acme\.destinations\.billing\.") \
            as err:
        parse_destinations("acme", {"billing": webhook(signing_secrets=value)})
    assert problem in str(err.value)
    assert SECRET_A not in str(err.value) and SECRET_A[6:] not in str(err.value)


@pytest.mark.parametrize("secret", [
    secret_of(24), secret_of(64), SECRET_A, SECRET_A.rstrip("="),
    "whsec_" + base64.b64encode(b"\x01" * 25).decode().rstrip("="),  # 2 padding characters
])
def test_a_good_secret_signs_as_the_standardwebhooks_library_does(secret: str) -> None:
    dest = parse_destinations("acme", {"d": webhook(signing_secrets=[secret])})["d"]
    keys = signing_keys(adapter_config(dest, {}))
    at = 1_700_000_123
    body = '{"effect_id":"webhook-r_1","result":{"total":57,"name":"Zoë"}}'.encode()
    ours = signature(keys, "webhook-r_1", at, body)
    assert ours == Webhook(secret).sign("webhook-r_1", datetime.fromtimestamp(at, UTC), body)
    assert Webhook(secret).sign("webhook-r_1", datetime.fromtimestamp(at, UTC), body + b" ") \
        != ours


def test_with_two_secrets_the_header_carries_one_signature_each_in_order() -> None:
    at, body = 1_700_000_000, b'{"a":1}'
    both = signature([KEY_B, KEY_A], "e1", at, body).split(" ")
    when = datetime.fromtimestamp(at, UTC)
    assert both == [Webhook(SECRET_B).sign("e1", when, body),
                    Webhook(SECRET_A).sign("e1", when, body)]
    assert all(s.startswith("v1,") for s in both)


def test_each_try_has_the_id_its_own_timestamp_and_a_signature_only_with_keys() -> None:
    base = request_headers({"headers": {"X-Trace": "t"}}, "webhook-r_1")
    assert base == {"X-Trace": "t", "Content-Type": "application/json",
                    "Idempotency-Key": "webhook-r_1"}
    signed = signed_headers(base, [KEY_A], "webhook-r_1", b"{}", now=1_700_000_000.9)
    assert signed["webhook-id"] == signed["Idempotency-Key"] == "webhook-r_1"
    assert signed["webhook-timestamp"] == "1700000000"  # whole seconds
    assert signed["webhook-signature"] == signature([KEY_A], "webhook-r_1", 1_700_000_000, b"{}")
    later = signed_headers(base, [KEY_A], "webhook-r_1", b"{}", now=1_700_000_031)
    assert later["webhook-timestamp"] == "1700000031"
    assert later["webhook-signature"] != signed["webhook-signature"]
    unsigned = signed_headers(base, [], "webhook-r_1", b"{}", now=1_700_000_000)
    assert "webhook-signature" not in unsigned
    assert unsigned["webhook-id"] == "webhook-r_1" and unsigned["webhook-timestamp"]


@pytest.mark.parametrize("name", ["webhook-id", "Webhook-Timestamp", "WEBHOOK-SIGNATURE",
                                  "Idempotency-Key"])
def test_an_operator_may_not_configure_the_signature_headers(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"destinations\.d\.headers: header '{name}' may not"):
        parse_destinations("acme", {"d": webhook(headers={name: "v1,forged"})})


@pytest.mark.parametrize("name", ["webhook-id", "Webhook-Timestamp", "WEBHOOK-SIGNATURE"])
def test_a_new_schedule_may_not_set_a_signature_header_and_a_stored_one_still_decodes(
        name: str) -> None:
    effect = {"kind": "webhook", "destination": "d", "headers": {name: "v1,forged"}}
    with pytest.raises(ValidationError, match=f"effect header '{name}' may not be set"):
        m.EffectSpec.model_validate(effect)
    assert m.EffectSpec.model_validate(effect, context=m.STORED).headers == {name: "v1,forged"}


def test_a_tenant_header_of_a_signature_header_name_is_dropped_and_never_sent() -> None:
    dest = parse_destinations("acme", {"d": webhook(signing_secrets=[SECRET_A])})["d"]
    cfg = adapter_config(dest, {"headers": {"webhook-signature": "v1,forged", "Webhook-Id": "x",
                                            "webhook-timestamp": "1", "X-Trace": "t"}})
    assert cfg["headers"] == {"X-Trace": "t"}
    # and whatever a config carries, the adapter's own headers are the ones sent
    raw = {"headers": {"webhook-signature": "v1,forged", "Webhook-Id": "x",
                       "WEBHOOK-TIMESTAMP": "1", "idempotency-key": "y"}}
    sent = signed_headers(request_headers(raw, "e1"), [KEY_A], "e1", b"{}", now=5)
    assert {k.lower() for k in sent} == {"content-type", "idempotency-key", "webhook-id",
                                         "webhook-timestamp", "webhook-signature"}
    assert sent["webhook-id"] == sent["Idempotency-Key"] == "e1"
    assert sent["webhook-signature"] == signature([KEY_A], "e1", 5, b"{}")


def test_a_secret_is_in_no_repr_dump_error_or_tenants_registry(tmp_path: Path) -> None:
    toml = (f'[tenants.acme]\ntokens = ["t"]\n[tenants.acme.destinations.billing]\n'
            f'kind = "webhook"\nurl = "https://hooks.example/h"\n'
            f'signing_secrets = ["{SECRET_A}", "{SECRET_B}"]\n')
    (tmp_path / "tenants.toml").write_text(toml)
    tenants = load_tenants(tmp_path / "tenants.toml")
    dest = tenants.destination("acme", "billing")
    assert isinstance(dest, WebhookDestination) and len(dest.signing_secrets) == 2
    cfg = adapter_config(dest, {})
    shown = [repr(dest), str(dest), repr(tenants.tenants["acme"]), dest.model_dump_json(),
             repr(dest.model_dump()), str(dest.model_dump(mode="json")), repr(cfg),
             str(cfg), repr(tenants.all_destinations())]
    for text in shown:
        for secret in (SECRET_A, SECRET_B):
            assert secret not in text and secret[6:] not in text
            assert secret[6:20] not in text
    assert "**********" in dest.model_dump_json()
    # the adapter still reads the real keys
    assert signing_keys(cfg) == [KEY_A, KEY_B]
    # a validation error of the model itself does not repeat its input
    with pytest.raises(ValidationError) as err:
        WebhookDestination.model_validate(webhook(signing_secrets=[SECRET_A, "x" + SECRET_B]))
    assert SECRET_B[6:] not in str(err.value) and SECRET_A[6:] not in str(err.value)
    with pytest.raises(ValidationError) as err:
        WebhookDestination.model_validate(webhook(signing_secrets=SECRET_B))
    assert SECRET_B[6:] not in str(err.value)


def test_a_bad_secret_reaching_the_adapter_fails_without_showing_it() -> None:
    with pytest.raises(ValueError) as err:
        signing_keys({"signing_secrets": ["whsec_" + "A" * 30 + "!!"]})
    assert "A" * 30 not in str(err.value)
    assert signing_keys({}) == [] and signing_keys({"signing_secrets": []}) == []
    with pytest.raises(ValueError, match="a signing secret is text"):
        signing_keys({"signing_secrets": [42]})
    with pytest.raises(ValueError, match="must be a list"):
        signing_keys({"signing_secrets": "whsec_" + "A" * 32})
