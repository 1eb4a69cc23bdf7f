"""A Kafka broker of its own with SASL/SCRAM and ACLs (``scripts/kafka.sh up --sasl``), on
free loopback ports and in its own state directory, stopped by PID (``down``) afterwards."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from chronolog.log.kafka_config import KafkaAuth
from support.net import free_port

from .conftest import ROOT

SCRIPT = ROOT / "scripts" / "kafka.sh"
USERS = ("processor", "projector", "api", "effects", "worker", "worker-a", "worker-b",
         "reader", "operator")


@dataclass
class SaslKafka:
    bootstrap: str
    state: Path
    passwords: dict[str, str]  # user -> password, admin included

    def auth(self, user: str, password: str | None = None) -> KafkaAuth:
        return KafkaAuth("SASL_PLAINTEXT", "SCRAM-SHA-512", user,
                         password if password is not None else self.passwords[user])

    def env(self, user: str) -> dict[str, str]:
        """The CHRONOLOG_KAFKA_* settings of a process running as ``user``."""
        return {"CHRONOLOG_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "CHRONOLOG_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "CHRONOLOG_KAFKA_SASL_USERNAME": user,
                "CHRONOLOG_KAFKA_SASL_PASSWORD": self.passwords[user]}


def sasl_kafka(state: Path) -> Iterator[SaslKafka]:
    passwords = {u: secrets.token_hex(12) for u in USERS}
    port = free_port()
    cport = free_port()
    while cport == port:
        cport = free_port()
    env = {**os.environ, "KAFKA_STATE_DIR": str(state), "KAFKA_PORT": str(port),
           "KAFKA_CONTROLLER_PORT": str(cport),
           "KAFKA_SASL_USERS": " ".join(f"{u}:{p}" for u, p in passwords.items())}
    done = subprocess.run([str(SCRIPT), "up", "--sasl"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"kafka.sh up --sasl failed: {done.stderr[-3000:]}"
    try:
        passwords["admin"] = (state / "admin.password").read_text().strip()
        yield SaslKafka((state / "bootstrap").read_text().strip(), state, passwords)
    finally:
        subprocess.run([str(SCRIPT), "down"], env=env, cwd=ROOT, capture_output=True,
                       timeout=120)
