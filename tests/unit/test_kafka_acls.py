"""The Kafka principal's settings (``kafka_auth_from_env``: bad values name the variable)
and the ACLs of each role (``chronolog.log.kafka_acls``) as data; the ACL tables in
docs/security.md are the output of ``chronolog kafka-acls`` (run here). On a real broker:
tests/integration/test_kafka_acls.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from chronolog.log.kafka_acls import ROLES, AclError, acls_for
from chronolog.log.kafka_config import NO_AUTH, KafkaAuth
from chronolog.log.port import Topics
from chronolog.settings import ConfigError, kafka_auth_from_env, open_log, parse_log_url

ROOT = Path(__file__).resolve().parents[2]
CHRONOLOG = str(Path(sys.executable).parent / "chronolog")
T = Topics(prefix="p.")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SECURITY_PROTOCOL", "SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD",
                 "SASL_PASSWORD_FILE"):
        monkeypatch.delenv(f"CHRONOLOG_KAFKA_{name}", raising=False)


def test_no_settings_no_authentication() -> None:
    assert kafka_auth_from_env() is NO_AUTH
    assert NO_AUTH.client_kwargs() == {"security_protocol": "PLAINTEXT"}


def test_a_user_name_and_password_mean_sasl_scram(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("CHRONOLOG_KAFKA_SASL_USERNAME", "worker-a")
    monkeypatch.setenv("CHRONOLOG_KAFKA_SASL_PASSWORD", "s3cret")
    auth = kafka_auth_from_env()
    assert auth == KafkaAuth("SASL_PLAINTEXT", "SCRAM-SHA-512", "worker-a", "s3cret")
    assert "s3cret" not in repr(auth)
    assert auth.client_kwargs() == {
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "worker-a", "sasl_plain_password": "s3cret"}
    # the password from a file instead, and every client of the log gets it
    monkeypatch.delenv("CHRONOLOG_KAFKA_SASL_PASSWORD")
    (tmp_path / "pw").write_text("from-file\n")
    monkeypatch.setenv("CHRONOLOG_KAFKA_SASL_PASSWORD_FILE", str(tmp_path / "pw"))
    monkeypatch.setenv("CHRONOLOG_KAFKA_SASL_MECHANISM", "scram-sha-256")
    lg = open_log(parse_log_url("kafka://127.0.0.1:9", partitions=2))
    assert lg.auth == KafkaAuth("SASL_PLAINTEXT", "SCRAM-SHA-256",  # type: ignore[attr-defined]
                                "worker-a", "from-file")


@pytest.mark.parametrize(("env", "message"), [
    ({"CHRONOLOG_KAFKA_SECURITY_PROTOCOL": "TLS"},
     "invalid CHRONOLOG_KAFKA_SECURITY_PROTOCOL 'TLS': expected PLAINTEXT or SASL_PLAINTEXT"),
    ({"CHRONOLOG_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT", "CHRONOLOG_KAFKA_SASL_USERNAME": "u"},
     "invalid CHRONOLOG_KAFKA_SECURITY_PROTOCOL 'PLAINTEXT': CHRONOLOG_KAFKA_SASL_USERNAME"),
    ({"CHRONOLOG_KAFKA_SASL_USERNAME": "u", "CHRONOLOG_KAFKA_SASL_PASSWORD": "p",
      "CHRONOLOG_KAFKA_SASL_MECHANISM": "GSSAPI"},
     "invalid CHRONOLOG_KAFKA_SASL_MECHANISM 'GSSAPI': expected SCRAM-SHA-512"),
    ({"CHRONOLOG_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"},
     "missing CHRONOLOG_KAFKA_SASL_USERNAME"),
    ({"CHRONOLOG_KAFKA_SASL_USERNAME": "u"}, "missing CHRONOLOG_KAFKA_SASL_PASSWORD"),
    ({"CHRONOLOG_KAFKA_SASL_USERNAME": "u", "CHRONOLOG_KAFKA_SASL_PASSWORD_FILE": "/nope/pw"},
     "invalid CHRONOLOG_KAFKA_SASL_PASSWORD_FILE '/nope/pw': No such file"),
])
def test_a_bad_setting_is_named(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                message: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        kafka_auth_from_env()
    assert str(info.value).startswith(message), info.value


def _grants(role: str, pool: str | None = None) -> set[tuple[str, str, str, str, str]]:
    return {(a.permission, a.operation, a.resource, a.pattern, a.name)
            for a in acls_for(role, "User:x", T, pool)}


def _reads(role: str, pool: str | None = None) -> set[tuple[str, str]]:
    return {(pattern, name) for perm, op, res, pattern, name in _grants(role, pool)
            if perm == "ALLOW" and res == "TOPIC" and op in ("READ", "ALL")}


def test_a_pool_worker_reads_only_its_pools_assignments() -> None:
    assert {n for _, n in _reads("worker", "b")} == {"p.replies", "p.routing",
                                                     "p.ready.pool-b."}
    writes = {n for perm, op, res, _, n in _grants("worker", "b")
              if res == "TOPIC" and op in ("WRITE", "ALL", "CREATE")}
    assert writes == {"p.commands", "p.dlq", "p.workers"}
    assert not any(res == "TRANSACTIONAL_ID" for _, _, res, _, _ in _grants("worker", "b"))
    # a pool-less worker reads every ready.<class> but is denied the pools' topics
    assert ("PREFIXED", "p.ready.") in _reads("worker")
    assert ("DENY", "READ", "TOPIC", "PREFIXED", "p.ready.pool-") in _grants("worker")
    # the API reads no ready topic, the reader writes only the audit's checkpoint
    assert not any("ready" in n for _, n in _reads("api"))
    assert {(res, name) for _, op, res, _, name in _grants("reader")
            if op in ("WRITE", "ALL")} == {("TOPIC", "p.audit")}


@pytest.mark.parametrize(("role", "principal", "pool", "message"), [
    ("workr", "User:x", None, "invalid role 'workr': expected one of processor, "),
    ("worker", "x", None, "invalid principal 'x': expected User:NAME"),
    ("worker", "User:x", "a.b", "invalid pool 'a.b': letters, digits, '_' and '-' only"),
    ("api", "User:x", "a", "invalid pool 'a': only a worker has a pool"),
])
def test_bad_input_is_named(role: str, principal: str, pool: str | None, message: str) -> None:
    with pytest.raises(AclError) as info:
        acls_for(role, principal, T, pool)
    assert str(info.value).startswith(message)


def test_the_command_refuses_bad_input_with_exit_2() -> None:
    done = subprocess.run([CHRONOLOG, "kafka-acls", "--role", "worker", "--principal",
                           "User:w", "--pool", "a.b"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "error: --pool: 'a.b': letters, digits, '_' and '-' only"


def test_the_acl_tables_in_docs_are_the_commands_output() -> None:
    """docs/security.md shows ``$ chronolog kafka-acls ...`` blocks with their output."""
    text = (ROOT / "docs" / "security.md").read_text()
    blocks = re.findall(r"```\n\$ (chronolog kafka-acls [^\n]*)\n(.*?)```", text, re.S)
    assert {re.search(r"--role (\w+)", cmd).group(1) for cmd, _ in blocks  # type: ignore[union-attr]
            } == set(ROLES)
    for cmd, shown in blocks:
        done = subprocess.run([CHRONOLOG, *cmd.split()[1:]], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr
        assert done.stdout == shown, cmd


def test_the_group_names_are_the_ones_deployments_grant() -> None:
    """A consumer group's name holds its committed offsets and is granted by the ACLs: the
    processors' and the effect runners' groups are ``<prefix>processors`` and
    ``<prefix>effects``, and each role is granted the group its process joins."""
    assert (T.processor_group, T.effects_group) == ("p.processors", "p.effects")
    for role, group in (("processor", T.processor_group), ("effects", T.effects_group)):
        assert ("ALLOW", "READ", "GROUP", "LITERAL", group) in _grants(role)
