"""Effect destinations: the capabilities an operator grants a tenant in the tenants file.

A schedule's effect names a destination (``EffectSpec.destination``); where it points and
how it is reached (URL, DSN, SQL, topic, SMTP server, credentials, whether private addresses
may be reached, the give-up time, the circuit breaker) are the operator's, per tenant::

    [tenants.acme.destinations.billing]
    kind = "webhook"
    url = "https://billing.example/hooks/chronolog"

A tenant's own options (``headers``, ``subject``, ``give_up_after``) are merged in at perform
time by ``adapter_config``; they can never change the target.

A webhook destination may sign its deliveries (Standard Webhooks, see
``chronolog.effect_adapters.webhook``): ``signing_secrets = ["whsec_<base64>", ...]``, several
while a secret is rotated. A secret is a ``SecretStr``: its ``repr``, a JSON dump and a
validation error never show it; only ``signing_key`` reads it, for the adapter.

Two targets are refused even when an operator configures them (``check_destinations``, a
``ConfigError`` at start): the node's own read-model database server — any database on it,
however its address is written (``database_refusal``) — and chronolog's own topics (every
topic under the topic prefix except the kafka-effect output topic ``<prefix>effects.out``).
The effect runner refuses them again for each intent, and the postgres adapter checks the
DSN once more, host names resolved, just before it connects.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from chronolog.domain import messages as m
from chronolog.log.port import Topics
from chronolog.settings import ConfigError

DEFAULT_GIVE_UP = 3600.0
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$"
_SERVERS = r"^[A-Za-z0-9.:\[\]_-]+(,[A-Za-z0-9.:\[\]_-]+)*$"  # host:port[,host:port]


class _Destination(BaseModel):
    # built on first use: a process that reads no destinations table pays nothing for them
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              defer_build=True)

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


# the Standard Webhooks headers the adapter sets on every delivery: nobody configures them
SIGNATURE_HEADERS = m.WEBHOOK_SIGNATURE_HEADERS
SECRET_PREFIX = "whsec_"
SECRET_BYTES = (24, 64)  # the decoded key's length, bounds included
MAX_SIGNING_SECRETS = 8
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


def signing_key(secret: str | SecretStr) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (standard base64, padding optional).
    ``ValueError`` says what is wrong without repeating the secret."""
    text = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    if not isinstance(text, str):
        raise ValueError("a signing secret is text: whsec_<base64>")
    if not text.startswith(SECRET_PREFIX):
        raise ValueError(f"a signing secret is written {SECRET_PREFIX}<base64>; this one does "
                         f"not start with '{SECRET_PREFIX}'")
    encoded = text[len(SECRET_PREFIX):]
    digits = encoded.rstrip("=")
    if not _BASE64.fullmatch(encoded) or len(digits) % 4 == 1:
        raise ValueError(f"a signing secret is not valid base64 after '{SECRET_PREFIX}'")
    key = base64.b64decode(digits + "=" * (-len(digits) % 4), validate=True)
    low, high = SECRET_BYTES
    if not low <= len(key) <= high:
        raise ValueError(f"a signing secret decodes to {len(key)} bytes; {low} to {high} "
                         "are required")
    return key


def _signing_secret(secret: SecretStr) -> SecretStr:
    signing_key(secret)
    return secret


SigningSecret = Annotated[SecretStr, AfterValidator(_signing_secret)]


class WebhookDestination(_Destination):
    # a validation error never repeats its input (it may be a signing secret)
    model_config = ConfigDict(hide_input_in_errors=True)

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
    # Standard Webhooks signing: each delivery is signed with every secret (rotation)
    signing_secrets: list[SigningSecret] = Field(default_factory=list,
                                                 max_length=MAX_SIGNING_SECRETS)

    @field_validator("url", "status_url")
    @classmethod
    def _urls(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @field_validator("headers")
    @classmethod
    def _no_routing_headers(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [h for h in v if h.lower() in ("host", "content-length", "transfer-encoding",
                                              "connection", "idempotency-key")
               or h.lower() in SIGNATURE_HEADERS]
        if bad:
            raise ValueError(f"header '{bad[0]}' may not be configured")
        return v

    @field_validator("signing_secrets")
    @classmethod
    def _distinct_secrets(cls, v: list[SecretStr]) -> list[SecretStr]:
        if len({s.get_secret_value() for s in v}) < len(v):
            raise ValueError("the same signing secret is listed twice")
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


@functools.cache
def _destination_adapter() -> TypeAdapter[Any]:
    return TypeAdapter(Destination)


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
            out[name] = _destination_adapter().validate_python(cfg)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err.get("loc", ()) if p not in
                           ("webhook", "postgres", "kafka", "email"))
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            raise ConfigError(f"invalid {where}.{name}{'.' + loc if loc else ''}: {msg}") from None
    return out


# ---------------------------------------------------------------------- refused targets

def _dsn_targets(dsn: str) -> list[tuple[str, int]]:
    """Every (host, port) a libpq/asyncpg URL may connect to: the hosts of the authority
    (``h1:p1,h2:p2``, ``[v6]:p``), a ``host``/``hostaddr`` query parameter (a comma list;
    a Unix socket directory starts with ``/``), the ``port`` parameter, then ``$PGPORT``,
    then 5432. A missing host is ``""`` (the client's default: a local socket or localhost).
    Host names are percent-decoded and lower-cased."""
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    authority = parts.netloc.rpartition("@")[2]
    hosts: list[str] = []
    ports: list[str] = []
    for item in authority.split(",") if authority else []:
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        elif item.count(":") == 1:
            host, port = item.split(":")
        else:
            host, port = item, ""
        hosts.append(host)
        ports.append(port)
    for key in ("host", "hostaddr"):
        for value in query.get(key, []):
            hosts += value.split(",")
    for value in query.get("port", []):
        ports += value.split(",")
    if not hosts:
        hosts = [""]
    default = os.environ.get("PGPORT", "") or "5432"
    numbers = [p for p in ports if p]
    out = []
    for i, host in enumerate(hosts):
        port = ports[i] if i < len(ports) and ports[i] else (
            numbers[0] if len(numbers) == 1 else default)
        try:
            number = int(port)
        except ValueError:
            number = -1  # not a port: matches nothing, and the client refuses it anyway
        out.append((unquote(host).strip().lower(), number))
    return out


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an address when it is one in any form the C resolver takes without a
    lookup (``127.1``, ``0x7f.1``, ``2130706433``, ``[::ffff:127.0.0.1]``, a zone suffix)."""
    text = host.strip("[]").split("%")[0]
    try:
        info = socket.getaddrinfo(text, None, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        return None
    return ipaddress.ip_address(info[0][4][0]) if info else None


# IPv6 prefixes whose last 32 bits are an IPv4 address (RFC 6052 NAT64 well-known prefix,
# RFC 2765 IPv4-translated, RFC 4291 IPv4-compatible)
_LAST_32_BITS = tuple(ipaddress.ip_network(n) for n in ("64:ff9b::/96", "::ffff:0:0:0/96",
                                                       "::/96"))


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, translated, compatible, NAT64,
    6to4, Teredo's client), or None. ``::`` and ``::1`` carry none."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if int(ip) > 1 and any(ip in net for net in _LAST_32_BITS):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _unwrap(ip: ipaddress.IPv4Address | ipaddress.IPv6Address
            ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The IPv4 address an IPv6 address carries (``embedded_ipv4``); others unchanged."""
    if isinstance(ip, ipaddress.IPv6Address):
        return embedded_ipv4(ip) or ip
    return ip


def _is_local(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, unspecified (0.0.0.0 and ``::`` reach this machine), or one of this
    machine's own addresses (the kernel lets a socket bind only to those)."""
    ip = _unwrap(ip)
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((str(ip), 0))
    except OSError:
        return False
    return True


_LOCAL_NAMES = ("", "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def _addresses(host: str, resolve: bool
               ) -> tuple[bool, frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """(whether ``host`` is this machine, the addresses it stands for)."""
    if host.startswith(("/", "@")):  # a Unix socket directory (or an abstract one)
        return True, frozenset()
    ip = _ip(host)
    if ip is not None:
        return _is_local(ip), frozenset({_unwrap(ip)})
    if host in _LOCAL_NAMES or host.endswith(".localhost") or host == socket.gethostname().lower():
        return True, frozenset()
    if not resolve:
        return False, frozenset()
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False, frozenset()  # a name that does not resolve reaches nothing
    ips = frozenset(_unwrap(ipaddress.ip_address(str(i[4][0]).split("%")[0])) for i in infos)
    return any(_is_local(i) for i in ips), ips


def database_refusal(dsn: str, node_database_url: str | None, *,
                     resolve: bool = True) -> str | None:
    """Why ``dsn`` reaches the node's own PostgreSQL server (any database on it), or None.

    A destination is the node's server when one of its hosts and the node's are the same
    server on the same port: both on this machine (any loopback address, ``0.0.0.0``,
    ``::``, IPv4-mapped or -compatible forms, ``localhost``, this machine's own addresses
    and names, a Unix socket directory, no host at all), or the same name, or names whose
    addresses overlap. ``resolve``: look host names up (config load and just before
    connecting); without it only literal addresses and local names are recognised.
    """
    if not node_database_url:
        return None
    node_targets = _dsn_targets(node_database_url)
    node_ports = {port for _, port in node_targets}
    node = [(host, *_addresses(host, resolve)) for host, _ in node_targets]
    node_local = any(local for _, local, _ in node)
    node_ips = frozenset().union(*(ips for _, _, ips in node))
    node_names = {host for host, _, _ in node}
    for host, port in _dsn_targets(dsn):
        if port not in node_ports:
            continue
        local, ips = _addresses(host, resolve)
        if (local and node_local) or host in node_names or ips & node_ips:
            shown = host or "the default local socket"
            return (f"dsn reaches the node's own database server ({shown} port {port}); "
                    "no database on it may be a destination")
    return None


def chronolog_topic(topic: str, topics: Topics) -> bool:
    """A topic chronolog itself reads or writes (anything under its prefix but the effect
    output topic)."""
    return topic.startswith(topics.prefix) and topic != topics.effects


def refusal(dest: AnyDestination, topics: Topics | None,
            node_database_url: str | None, *, resolve: bool = True) -> str | None:
    """Why ``dest`` may never be used on this node, or None (``resolve``: see
    ``database_refusal``)."""
    if isinstance(dest, PostgresDestination):
        why = database_refusal(dest.dsn, node_database_url, resolve=resolve)
        if why is not None:
            return why
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
                          and not m.effect_header_denied(k)
                          and k.lower() not in SIGNATURE_HEADERS}
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
