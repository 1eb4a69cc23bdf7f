"""Configuration from flags and environment, and the wiring of ports to adapters.

``CHRONOLOG_LOG``: ``sqlite:///path/to/log.db`` or ``kafka://host:port[,host:port]``;
``CHRONOLOG_DATABASE_URL``; ``CHRONOLOG_TENANTS``; ``CHRONOLOG_PARTITIONS`` (default 12);
``CHRONOLOG_TOPIC_PREFIX`` (default ``chronolog.``); ``CHRONOLOG_REPLICATION``,
``CHRONOLOG_MIN_ISR`` and ``CHRONOLOG_KAFKA_ALLOW_UNSAFE`` (Kafka:
``chronolog.log.durability``); ``CHRONOLOG_DATA_DIR`` (default ``./.chronolog``);
``CHRONOLOG_MAX_BODY_BYTES`` and ``CHRONOLOG_VISIBLE_TIMEOUT`` (the API's);
``CHRONOLOG_KAFKA_SECURITY_PROTOCOL``, ``CHRONOLOG_KAFKA_SASL_MECHANISM``,
``CHRONOLOG_KAFKA_SASL_USERNAME``, ``CHRONOLOG_KAFKA_SASL_PASSWORD`` or
``CHRONOLOG_KAFKA_SASL_PASSWORD_FILE`` (Kafka: the principal, ``kafka_auth_from_env``);
``CHRONOLOG_CLOCK_STEP`` and ``CHRONOLOG_CLOCK_STEP_HOLD`` (a processor's,
``clock_step_from_env``). A bad value raises ``ConfigError`` with one line naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from chronolog.domain.durations import InvalidDuration, parse_duration
from chronolog.domain.limits import MAX_BODY_BYTES
from chronolog.domain.recurrence import ENGINE_VERSION
from chronolog.environment import tzdata_in_use
from chronolog.log.durability import SAFE_DEFAULT, Durability
from chronolog.log.kafka_config import (
    COMPRESSIONS,
    NO_AUTH,
    PRUNED_SEGMENT_MS,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    KafkaAuth,
)
from chronolog.log.port import EventLog, Topics


class ConfigError(ValueError):
    """A configuration value is invalid; the message names it (exit status 2)."""


DEFAULT_DATA_DIR = ".chronolog"


@dataclass(frozen=True)
class LogConfig:
    kind: str  # "sqlite" | "kafka"
    target: str  # a file path or bootstrap servers
    topics: Topics
    durability: Durability = SAFE_DEFAULT  # Kafka only
    auth: KafkaAuth = NO_AUTH  # Kafka only
    compression: str = "zstd"  # Kafka only: the producers' batch compression
    segment_ms: int = PRUNED_SEGMENT_MS  # Kafka only: the pruned topics' segment roll


def _positive_env(name: str, limit: int) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        n = int(raw)
    except ValueError:
        raise ConfigError(f"invalid {name} '{raw}': not an integer") from None
    if not 1 <= n <= limit:
        raise ConfigError(f"invalid {name} '{raw}': must be 1..{limit}")
    return n


# the most of an effect destination's response body read into memory (its evidence)
DEFAULT_EFFECT_RESPONSE_BYTES = 1 << 20


def effect_response_cap() -> int:
    """``CHRONOLOG_EFFECT_MAX_RESPONSE_BYTES``: the most bytes of a webhook response read
    (default 1 MiB); the rest is never read."""
    cap = _positive_env("CHRONOLOG_EFFECT_MAX_RESPONSE_BYTES", 1 << 30)
    return DEFAULT_EFFECT_RESPONSE_BYTES if cap is None else cap


def durability_from_env() -> Durability:
    """``CHRONOLOG_REPLICATION`` (the topics' replication factor; default 3 on a cluster of
    three or more brokers, else 1), ``CHRONOLOG_MIN_ISR`` (default a majority of the
    replicas: 2 of 3) and ``CHRONOLOG_KAFKA_ALLOW_UNSAFE`` (``1``: start on a cluster that
    cannot keep the guarantees, logging why)."""
    raw = os.environ.get("CHRONOLOG_KAFKA_ALLOW_UNSAFE", "").strip().lower()
    if raw not in ("", "0", "1", "true", "false", "yes", "no"):
        raise ConfigError(f"invalid CHRONOLOG_KAFKA_ALLOW_UNSAFE '{raw}': expected 1 or 0")
    return Durability(replication=_positive_env("CHRONOLOG_REPLICATION", 16),
                      min_isr=_positive_env("CHRONOLOG_MIN_ISR", 16),
                      allow_unsafe=raw in ("1", "true", "yes"))


def compression_from_env() -> str:
    """``CHRONOLOG_KAFKA_COMPRESSION``: how Kafka producers compress their batches — ``zstd``
    (the default: the fewest bytes for the CPU, docs/performance.md), ``lz4``, ``gzip`` or
    ``none``."""
    raw = os.environ.get("CHRONOLOG_KAFKA_COMPRESSION", "").strip().lower() or "zstd"
    if raw not in COMPRESSIONS:
        raise ConfigError(f"invalid CHRONOLOG_KAFKA_COMPRESSION '{raw}': expected one of "
                          f"{', '.join(COMPRESSIONS)}")
    return raw


def kafka_auth_from_env() -> KafkaAuth:
    """The principal a process speaks to Kafka as. ``CHRONOLOG_KAFKA_SECURITY_PROTOCOL``:
    ``PLAINTEXT`` (no authentication; the default without a user name) or
    ``SASL_PLAINTEXT`` (the default with one); ``CHRONOLOG_KAFKA_SASL_MECHANISM``:
    ``SCRAM-SHA-512`` (default), ``SCRAM-SHA-256`` or ``PLAIN``;
    ``CHRONOLOG_KAFKA_SASL_USERNAME``; the password from ``CHRONOLOG_KAFKA_SASL_PASSWORD``
    or, kept out of the environment, the first line of the file named by
    ``CHRONOLOG_KAFKA_SASL_PASSWORD_FILE``."""
    env = os.environ
    user = env.get("CHRONOLOG_KAFKA_SASL_USERNAME", "").strip()
    raw = env.get("CHRONOLOG_KAFKA_SECURITY_PROTOCOL", "").strip()
    protocol = raw.upper() or ("SASL_PLAINTEXT" if user else "PLAINTEXT")
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(f"invalid CHRONOLOG_KAFKA_SECURITY_PROTOCOL '{raw}': expected "
                          + " or ".join(SECURITY_PROTOCOLS))
    sasl_vars = ("CHRONOLOG_KAFKA_SASL_MECHANISM", "CHRONOLOG_KAFKA_SASL_USERNAME",
                 "CHRONOLOG_KAFKA_SASL_PASSWORD", "CHRONOLOG_KAFKA_SASL_PASSWORD_FILE")
    if protocol == "PLAINTEXT":
        given = [name for name in sasl_vars if env.get(name, "").strip()]
        if given:
            raise ConfigError(f"invalid CHRONOLOG_KAFKA_SECURITY_PROTOCOL '{raw}': {given[0]} "
                              "is set but PLAINTEXT does not authenticate (use SASL_PLAINTEXT)")
        return NO_AUTH
    raw_mech = env.get("CHRONOLOG_KAFKA_SASL_MECHANISM", "").strip()
    mechanism = raw_mech.upper() or "SCRAM-SHA-512"
    if mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"invalid CHRONOLOG_KAFKA_SASL_MECHANISM '{raw_mech}': expected "
                          + ", ".join(SASL_MECHANISMS))
    if not user:
        raise ConfigError(f"missing CHRONOLOG_KAFKA_SASL_USERNAME: {protocol} needs a user name")
    password = env.get("CHRONOLOG_KAFKA_SASL_PASSWORD", "")
    path = env.get("CHRONOLOG_KAFKA_SASL_PASSWORD_FILE", "").strip()
    if password and path:
        raise ConfigError("invalid CHRONOLOG_KAFKA_SASL_PASSWORD_FILE: "
                          "CHRONOLOG_KAFKA_SASL_PASSWORD is set too (give one)")
    if path:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"invalid CHRONOLOG_KAFKA_SASL_PASSWORD_FILE '{path}': "
                              f"{exc.strerror if isinstance(exc, OSError) else exc}") from None
        password = lines[0] if lines else ""
        if not password:
            raise ConfigError(f"invalid CHRONOLOG_KAFKA_SASL_PASSWORD_FILE '{path}': empty")
    if not password:
        raise ConfigError("missing CHRONOLOG_KAFKA_SASL_PASSWORD (or "
                          f"CHRONOLOG_KAFKA_SASL_PASSWORD_FILE): {protocol} needs a password")
    return KafkaAuth(protocol, mechanism, user, password)


MAX_PARTITIONS = 1024  # of a deployment's topics (CHRONOLOG_PARTITIONS, repartition --to)


def partitions_from_env(value: str | None = None) -> int:
    raw = value if value is not None else os.environ.get("CHRONOLOG_PARTITIONS", "12")
    try:
        n = int(raw)
    except ValueError:
        raise ConfigError(f"invalid CHRONOLOG_PARTITIONS '{raw}': not an integer") from None
    if not 1 <= n <= MAX_PARTITIONS:
        raise ConfigError(f"invalid CHRONOLOG_PARTITIONS '{raw}': must be 1..{MAX_PARTITIONS}")
    return n


def max_body_bytes(value: int | None = None) -> int:
    """The API's request body limit: the flag, else ``CHRONOLOG_MAX_BODY_BYTES``, else
    256 KiB."""
    raw: object = value if value is not None else os.environ.get("CHRONOLOG_MAX_BODY_BYTES")
    if raw is None:
        return MAX_BODY_BYTES
    try:
        n = int(raw)  # type: ignore[call-overload]
    except ValueError:
        raise ConfigError(f"invalid max-body-bytes '{raw}': not an integer") from None
    if not 1024 <= n <= 64 * 1024 * 1024:
        raise ConfigError(f"invalid max-body-bytes '{raw}': must be 1024..67108864")
    return n


DEFAULT_VISIBLE_TIMEOUT = 2.0
MAX_VISIBLE_TIMEOUT = 60.0


def interval_from_env(name: str, default: float) -> float:
    """A period set by the environment variable ``name`` as a duration (``30s``, ``5m``),
    else ``default`` seconds; ``ConfigError`` naming the variable for a bad or non-positive
    one. For the log's pruning (``CHRONOLOG_PRUNE_EVERY``) and the dev node's audits
    (``CHRONOLOG_AUDIT_EVERY``)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        seconds = parse_duration(raw)
    except InvalidDuration as exc:
        raise ConfigError(f"invalid {name} '{raw}': {exc}") from None
    if not seconds > 0:
        raise ConfigError(f"invalid {name} '{raw}': must be more than 0s")
    return seconds


def clock_step_from_env(bound_s: float, hold_s: float) -> tuple[float | None, float | None]:
    """A processor's clock-step guard (``chronolog.processors.clock``): the bound from
    ``CHRONOLOG_CLOCK_STEP`` (a duration, or ``off``: no guard), else ``bound_s``; the hold
    from ``CHRONOLOG_CLOCK_STEP_HOLD`` (a duration, or ``never``: a step is held until the
    clock comes back or the processor restarts), else ``hold_s``."""
    bound: float | None = bound_s
    hold: float | None = hold_s
    if os.environ.get("CHRONOLOG_CLOCK_STEP", "").strip().lower() == "off":
        bound = None
    else:
        bound = interval_from_env("CHRONOLOG_CLOCK_STEP", bound_s)
    if os.environ.get("CHRONOLOG_CLOCK_STEP_HOLD", "").strip().lower() == "never":
        hold = None
    else:
        hold = interval_from_env("CHRONOLOG_CLOCK_STEP_HOLD", hold_s)
    return bound, hold


def visible_timeout(value: float | str | None = None) -> float:
    """How long an API write waits for the read model to show its events: the flag, else
    ``CHRONOLOG_VISIBLE_TIMEOUT``, else 2 s (seconds, 0..60; 0: answer without waiting)."""
    raw: object = value if value is not None else os.environ.get("CHRONOLOG_VISIBLE_TIMEOUT")
    if raw is None:
        return DEFAULT_VISIBLE_TIMEOUT
    text = str(raw).strip()
    try:
        if not text.isascii():
            raise ValueError
        seconds = float(text)
    except ValueError:
        raise ConfigError(f"invalid visible-timeout '{raw}': not a number of seconds") from None
    if not 0 <= seconds <= MAX_VISIBLE_TIMEOUT:  # NaN fails this too
        raise ConfigError(f"invalid visible-timeout '{raw}': must be 0..{MAX_VISIBLE_TIMEOUT:g} "
                          "seconds")
    return seconds


def data_dir(value: str | None = None) -> Path:
    return Path(value or os.environ.get("CHRONOLOG_DATA_DIR") or DEFAULT_DATA_DIR)


def parse_log_url(
    url: str | None, data_dir_: str | Path | None = None, partitions: int | None = None,
    prefix: str | None = None,
) -> LogConfig:
    """``sqlite:///path`` | ``kafka://h:p[,h:p]`` | None (the data dir's embedded log)."""
    n = partitions if partitions is not None else partitions_from_env()
    topics = Topics(prefix=prefix or os.environ.get("CHRONOLOG_TOPIC_PREFIX", "chronolog."),
                    partitions=n)
    url = url or os.environ.get("CHRONOLOG_LOG")
    if not url:
        return LogConfig("sqlite", str(data_dir(str(data_dir_) if data_dir_ else None) / "log.db"),
                         topics)
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        if not path or path == "/":
            raise ConfigError(f"invalid CHRONOLOG_LOG '{url}': no file path")
        return LogConfig("sqlite", path, topics)
    if url.startswith("kafka://"):
        parsed = url[len("kafka://"):].rstrip("/")
        hosts = [h for h in parsed.split(",") if h]
        for h in hosts:
            u = urlparse(f"//{h}")
            if not u.hostname or u.port is None:
                raise ConfigError(f"invalid CHRONOLOG_LOG '{url}': '{h}' is not host:port")
        if not hosts:
            raise ConfigError(f"invalid CHRONOLOG_LOG '{url}': no broker")
        segment = interval_from_env("CHRONOLOG_KAFKA_SEGMENT", PRUNED_SEGMENT_MS / 1000)
        return LogConfig("kafka", ",".join(hosts), topics, durability_from_env(),
                         kafka_auth_from_env(), compression_from_env(), int(segment * 1000))
    raise ConfigError(f"invalid CHRONOLOG_LOG '{url}': expected sqlite:///path or kafka://host:port")


def open_log(cfg: LogConfig) -> EventLog:
    """The EventLog adapter for a configuration (not started)."""
    # each adapter is imported when a log of its kind is opened: a process imports the
    # driver of the log it uses, not both (aiokafka alone is about 60 ms of every start)
    if cfg.kind == "sqlite":
        from chronolog.log.sqlite import SqliteEventLog

        Path(cfg.target).parent.mkdir(parents=True, exist_ok=True)
        return SqliteEventLog(cfg.target, cfg.topics)
    from chronolog.log.kafka import KafkaEventLog

    return KafkaEventLog(cfg.target, cfg.topics, durability=cfg.durability, auth=cfg.auth,
                         compression=cfg.compression, segment_ms=cfg.segment_ms)


# The header a processor puts on each event it writes, next to ``processor`` and ``epoch``:
# the recurrence engine and the tz database its instants were computed with.
RULES_HEADER = "rules"


@dataclass(frozen=True)
class RulesVersion:
    """The recurrence engine and tz database a process computes instants with."""

    engine: str
    tzdata: str
    tzdata_source: str = field(default="", compare=False)  # where zoneinfo read it

    @property
    def label(self) -> str:
        """``engine=recurrence/1;tzdata=2025b`` (the value of the ``rules`` header)."""
        return f"engine={self.engine};tzdata={self.tzdata}"

    @classmethod
    def parse(cls, value: bytes | str) -> RulesVersion | None:
        """A ``rules`` header value back (None when it is not one)."""
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        parts = dict(p.partition("=")[::2] for p in text.split(";") if "=" in p)
        if "engine" not in parts or "tzdata" not in parts:
            return None
        return cls(parts["engine"], parts["tzdata"])


def installed_rules() -> RulesVersion:
    """The engine of this installation and the tz database ``zoneinfo`` reads now."""
    version, source = tzdata_in_use()
    return RulesVersion(ENGINE_VERSION, version, source)
