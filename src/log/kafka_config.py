"""What a process needs to know about Kafka before it talks to it: the security protocols,
SASL mechanisms and compressions chronolog accepts, the segment roll of pruned topics, and
``KafkaAuth``. Apart from ``chronolog.log.kafka`` so that reading the configuration (every
process does, through ``chronolog.settings``) does not import aiokafka: a process on the
embedded log never needs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# TLS (SSL, SASL_SSL) would need an SSL context, which nothing builds yet
SECURITY_PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT")
# the producers' batch compression (CHRONOLOG_KAFKA_COMPRESSION); lz4 and zstd come from
# cramjam, aiokafka's codec library
COMPRESSIONS = ("none", "gzip", "lz4", "zstd")
# the segment roll of the topics chronolog prunes (CHRONOLOG_KAFKA_SEGMENT)
PRUNED_SEGMENT_MS = 3_600_000
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


@dataclass(frozen=True)
class KafkaAuth:
    """How a process authenticates to the brokers: ``PLAINTEXT`` (none, the default) or SASL
    with a mechanism, a user name and a password (``chronolog.settings`` reads them from
    the environment). The password is left out of the repr."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def client_kwargs(self) -> dict[str, Any]:
        """The aiokafka keyword arguments of every producer, consumer and admin client."""
        if not self.security_protocol.startswith("SASL"):
            return {"security_protocol": self.security_protocol}
        return {"security_protocol": self.security_protocol,
                "sasl_mechanism": self.sasl_mechanism,
                "sasl_plain_username": self.username,
                "sasl_plain_password": self.password}


NO_AUTH = KafkaAuth()
