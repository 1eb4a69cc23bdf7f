"""Effect destinations: the capabilities an operator grants a tenant in the tenants file.

A schedule's effect names a destination (``EffectSpec.destination``); where it points and
how it is reached (URL, DSN, SQL, topic, SMTP server, credentials, whether private addresses
may be reached, the give-up time, the circuit breaker) are the operator's, per tenant::

    [tenants.acme.destinations.billing]
    kind = "webhook"
    url = "https://billing.example/hooks/chronolog"

A tenant's own options (``headers``, ``subject``, ``give_up_after``) are merged in at perform
time by ``adapter_config``; they can never change the target.

Two targets are refused even when an operator configures them (``check_destinations``, a
``ConfigError`` at start): the node's own read-model database, and chronolog's own topics
(every topic under the topic prefix except the kafka-effect output topic ``<prefix>effects.out``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from chronolog.domain import messages as m
from chronolog.log.port import Topics
from chronolog.settings import ConfigError

DEFAULT_GIVE_UP = 3600.0
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$"
_SERVERS = r"^[A-Za-z0-9.:\[\]_-]+(,[A-Za-z0-9.:\[\]_-]+)*$"  # host:port[,host:port]


class _Destination(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    give_up_after: m.Seconds = Field(default=DEFAULT_GIVE_UP, gt=0, le=m.MAX_EFFECT_GIVE_UP)
    breaker_failures: int = Field(default=5, ge=1, le=10_000)
    breaker_cooldown: m.Seconds = Field(default=30.0, gt=0, le=86_400)


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"'{value}' is not an http(s) URL with a host")
    if parts.username or parts.password:
        raise ValueError("credentials in the URL are not allowed; use headers")
    return value


class WebhookDestination(_Destination):
    kind: Literal["webhook"]
    url: str
    status_url: str | None = None
    headers: dict[m.EffectHeaderName, m.EffectHeaderValue] = Field(default_factory=dict)
    allow_private: bool = False
    timeout: m.Seconds = Field(default=10.0, gt=0, le=300)
    max_attempts: int = Field(default=4, ge=1, le=20)
    backoff: m.Seconds = Field(default=0.5, le=60)
    max_backoff: m.Seconds = Field(default=10.0, le=600)
    retention: m.Seconds = 24 * 3600.0
    idempotent: bool = True
    status_checks: int = Field(default=5, ge=1, le=100)
    status_interval: m.Seconds = Field(default=1.0, le=60)

    @field_validator("url", "status_url")
    @classmethod
    def _urls(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @field_validator("headers")
    @classmethod
    def _no_routing_headers(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [h for h in v if h.lower() in ("host", "content-length", "transfer-encoding",
                                              "connection", "idempotency-key")]
        if bad:
            raise ValueError(f"header '{bad[0]}' may not be configured")
        return v


class PostgresDestination(_Destination):
    kind: Literal["postgres"]
    dsn: str
    sql: str = Field(min_length=1)
    inbox_table: str = Field(default="chronolog_inbox", pattern=_IDENT)

    @field_validator("dsn")
    @classmethod
    def _url_dsn(cls, v: str) -> str:
        if urlsplit(v).scheme not in ("postgres", "postgresql"):
            raise ValueError("dsn must be a postgresql:// URL")
        return v


class KafkaDestination(_Destination):
    kind: Literal["kafka"]
    topic: str = Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")
    # another Kafka cluster (host:port[,host:port]); none: the node's own log
    bootstrap: str | None = Field(default=None, pattern=_SERVERS)


class EmailDestination(_Destination):
    kind: Literal["email"]
    host: str = Field(min_length=1)
    port: int = Field(default=25, ge=1, le=65535)
    from_: str = Field(alias="from", default="chronolog@localhost")
    to: list[str] = Field(min_length=1)
    timeout: m.Seconds = Field(default=30.0, gt=0, le=300)
    use_tls: bool = False
    start_tls: bool | None = None
    username: str | None = None
    password: str | None = None


Destination = Annotated[
    WebhookDestination | PostgresDestination | KafkaDestination | EmailDestination,
    Field(discriminator="kind"),
]
_DESTINATION: TypeAdapter[Any] = TypeAdapter(Destination)
AnyDestination = (WebhookDestination | PostgresDestination | KafkaDestination
                  | EmailDestination)
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def parse_destinations(tenant: str, raw: Any) -> dict[str, AnyDestination]:
    """The ``[tenants.<tenant>.destinations.<name>]`` tables; ``ConfigError`` names the key."""
    where = f"tenants.{tenant}.destinations"
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid {where}: not a table")
    out: dict[str, AnyDestination] = {}
    for name, cfg in raw.items():
        if not _NAME.match(name):
            raise ConfigError(f"invalid {where}.{name}: a name is 1-100 of A-Z a-z 0-9 _ . -")
        try:
            out[name] = _DESTINATION.validate_python(cfg)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err.get("loc", ()) if p not in
                           ("webhook", "postgres", "kafka", "email"))
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            raise ConfigError(f"invalid {where}.{name}{'.' + loc if loc else ''}: {msg}") from None
    return out


# ---------------------------------------------------------------------- refused targets

_LOOPBACK_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1", "localhost.localdomain"})


def _db_identity(dsn: str) -> tuple[str, int, str]:
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    host = (parts.hostname or query.get("host", [""])[0] or "").lower()
    try:
        if ipaddress.ip_address(host).is_loopback:
            host = "localhost"
    except ValueError:
        pass
    if host in _LOOPBACK_HOSTS or host.startswith("/"):
        host = "localhost"  # loopback and the local socket reach the same server
    port = parts.port or int(query.get("port", ["5432"])[0])
    db = parts.path.lstrip("/") or query.get("dbname", [""])[0] or parts.username or ""
    return host, port, db


def same_database(dsn: str, node_database_url: str | None) -> bool:
    """Whether ``dsn`` names the node's own database (same server address, port and name)."""
    if not node_database_url:
        return False
    return _db_identity(dsn) == _db_identity(node_database_url)


def chronolog_topic(topic: str, topics: Topics) -> bool:
    """A topic chronolog itself reads or writes (anything under its prefix but the effect
    output topic)."""
    return topic.startswith(topics.prefix) and topic != topics.effects


def refusal(dest: AnyDestination, topics: Topics | None,
            node_database_url: str | None) -> str | None:
    """Why ``dest`` may never be used on this node, or None."""
    if isinstance(dest, PostgresDestination) and same_database(dest.dsn, node_database_url):
        return "dsn is the node's own database"
    if isinstance(dest, KafkaDestination) and topics is not None and chronolog_topic(
            dest.topic, topics):
        return f"topic '{dest.topic}' is one of chronolog's own topics"
    return None


def check_destinations(registry: Any, topics: Topics | None,
                       node_database_url: str | None) -> None:
    """``ConfigError`` for the first configured destination this node must refuse."""
    for tenant, dests in registry.all_destinations().items():
        for name, dest in dests.items():
            why = refusal(dest, topics, node_database_url)
            if why is not None:
                raise ConfigError(f"invalid tenants.{tenant}.destinations.{name}: {why}")


# ---------------------------------------------------------------------- perform time


def adapter_config(dest: AnyDestination, options: Mapping[str, Any]) -> dict[str, Any]:
    """The adapter's config: the operator's destination, plus the tenant's own options."""
    cfg = dest.model_dump(by_alias=True, exclude={"kind", "give_up_after", "breaker_failures",
                                                  "breaker_cooldown"})
    if isinstance(dest, WebhookDestination):
        tenant_headers = {k: v for k, v in dict(options.get("headers") or {}).items()
                          if isinstance(k, str) and isinstance(v, str)
                          and not m.effect_header_denied(k)}
        # the operator's headers win over a tenant's of the same name
        own = {k.lower() for k in dest.headers}
        cfg["headers"] = {**{k: v for k, v in tenant_headers.items() if k.lower() not in own},
                          **dest.headers}
    if isinstance(dest, EmailDestination) and isinstance(options.get("subject"), str):
        cfg["subject"] = options["subject"]
    return cfg


def give_up_after(dest: AnyDestination, options: Mapping[str, Any]) -> float:
    """The effect's give-up time: its own, capped by the destination's."""
    own = options.get("give_up_after")
    if isinstance(own, (int, float)) and own > 0:
        return min(float(own), dest.give_up_after)
    return dest.give_up_after
