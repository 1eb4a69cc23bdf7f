"""Tenants and their policies, from a TOML file (``--tenants`` / ``CHRONOLOG_TENANTS``).

```toml
[operators]
tokens = ["ops-s3cret"]     # may read /metrics; a tenant token may not

[tenants.acme]
tokens = ["s3cret"]
allowed_jobs = ["*"]        # or a list of job types
max_schedules = 1000
min_interval = "1s"         # shortest every / delay / cron gap (text or seconds)
rate_limit = { per_second = 50, burst = 100 }   # API commands; a number = per second
weight = 1                  # share of the workers when tenants' runs wait for a seat
max_attempts = 100          # the most retry.maxAttempts a schedule may ask for (<= 100)
min_backoff = "1s"          # the shortest wait before a retry (>= 1s)
max_running = 8             # the most runs assigned and not finished at once (per node)
execution_timeout = "10m"   # the longest an attempt may run (default 1h)
max_attempts_per_minute = 600   # retries scheduled a minute at most (more are delayed)
pools = ["acme-workers"]    # only workers of these pools run acme's runs (see below)
retention = "30d"           # how long a finished run's read-model rows are kept (see below)
result_retention = "7d"     # how long a finished run's result object is kept (<= retention)
storage_budget = "256MiB"   # bytes of params and results written in any hour (see below)

[tenants.acme.job_timeouts]           # per job type, instead of execution_timeout
report = "1h"

[tenants.acme.job_concurrency]        # per job type, for schedules that declare none
report = { key = "report-{customer}", limit = 2 }   # at most 2 LEASED per customer

[pools.acme-workers]
credentials = ["pool-s3cret"]   # a worker of the pool proves it holds one (rotation: several)

[tenants.acme.destinations.billing]   # effect destinations granted to the tenant
kind = "webhook"
url = "https://billing.example/hooks"
```

Destinations are parsed by ``chronolog.destinations`` (see docs/deployment.md, "Tenants").

Without a file, ``dev_tenants()`` has one tenant ``default`` with token ``dev``, no rate
limit, and ``/metrics`` open (a tenants file always closes it to all but operators).
Tokens are compared in constant time, over every token of every tenant.

Worker pools: a tenant with ``pools`` has its runs assigned only to workers that proved
membership of one of those pools (``chronolog.domain.offers``); a tenant without ``pools`` has
its runs assigned only to pool-less workers, so a pool's workers never see another tenant's
runs and a pool-bound tenant's runs never reach a worker that proved nothing.

Retention (docs/design.md §9, "Retention"): ``retention`` is how long the read model keeps a
finished run's rows after its finish (a tenant without it: the deployment's ``--retention``,
default 30 days); ``result_retention`` how long its result object is kept (default 7 days, or
the run's retention when that is shorter). A file whose ``result_retention`` exceeds the
tenant's ``retention`` is refused, naming both (``retention_of`` checks the same against the
deployment's default for a tenant that sets only ``result_retention``).

Storage budget (docs/design.md §9, "Storage budget"): ``storage_budget`` is the most bytes
of params (creates, revisions, manual triggers) and results the tenant may write in any
hour — an integer of bytes or a text such as ``"256MiB"`` (B, KB, MB, GB, KiB, MiB, GiB). A
tenant of a tenants file without it has ``DEFAULT_STORAGE_BUDGET`` (256 MiB an hour); it is
at least ``MAX_PARAMS_BYTES``, so the largest params a command may carry always fit an empty
window. ``dev_tenants()`` has no budget.
"""

from __future__ import annotations

import hmac
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chronolog.destinations import AnyDestination, parse_destinations
from chronolog.domain.durations import InvalidDuration, parse_duration
from chronolog.domain.limits import (
    DEFAULT_EXECUTION_TIMEOUT_SECONDS,
    MAX_INT,
    MAX_PARAMS_BYTES,
    MAX_RETRY_ATTEMPTS,
    MIN_INTERVAL_SECONDS,
    MIN_RETRY_BACKOFF_SECONDS,
)
from chronolog.domain.messages import ConcurrencySpec
from chronolog.settings import ConfigError

# a tenant of a tenants file without ``rate_limit``: commands per second, and the burst
DEFAULT_RATE_LIMIT = (50.0, 100)
DEFAULT_RETENTION_S = 30 * 86400.0  # a finished run's rows, unless told otherwise
DEFAULT_RESULT_RETENTION_S = 7 * 86400.0  # a finished run's result object
# a tenant of a tenants file without ``storage_budget``: bytes of params and results an hour.
# A busy normal tenant — ten runs a second, each with a few KiB of params and an inline result
# (at most 8 KiB) — writes well under 256 MiB an hour; a tenant writing the largest params at
# its whole default rate limit (50 a second) would write 11 GiB: it is refused at 256 MiB.
DEFAULT_STORAGE_BUDGET = 256 * 1024 * 1024
_SIZE = re.compile(r"^\s*([0-9]+)\s*(B|KB|MB|GB|KiB|MiB|GiB)?\s*$")
_UNITS = {None: 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20,
          "GiB": 2**30}
POOL_NAME = re.compile(r"^[a-z0-9-]{1,64}$")


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: ``burst`` commands at once, refilled at ``per_second``."""

    per_second: float
    burst: int


@dataclass(frozen=True)
class Tenant:
    name: str
    tokens: tuple[str, ...] = ()
    allowed_jobs: frozenset[str] | None = None  # None: every job type
    max_schedules: int | None = None
    destinations: dict[str, AnyDestination] = field(default_factory=dict, compare=False)
    min_interval: float = MIN_INTERVAL_SECONDS
    rate_limit: RateLimit | None = None  # None: unlimited
    weight: float = 1.0  # share of a resource class's seats when runs of tenants wait
    max_attempts: int = MAX_RETRY_ATTEMPTS  # retry.maxAttempts at most (node ceiling or less)
    min_backoff: float = MIN_RETRY_BACKOFF_SECONDS  # shortest retry wait (node floor or more)
    max_running: int | None = None  # runs assigned and not finished at once (None: no cap)
    execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT_SECONDS  # an attempt's longest run
    job_timeouts: dict[str, float] = field(default_factory=dict, compare=False)  # per job type
    max_attempts_per_minute: int | None = None  # retries a minute (None: no ceiling)
    pools: frozenset[str] = frozenset()  # worker pools that run its runs (none: pool-less)
    retention: float | None = None  # finished runs' rows, seconds (None: the deployment's)
    result_retention: float | None = None  # result objects, seconds (None: the default)
    storage_budget: int | None = None  # bytes of params and results an hour (None: no budget)
    # per job type, the concurrency rule of runs whose schedule declares none
    job_concurrency: dict[str, ConcurrencySpec] = field(default_factory=dict, compare=False)


@dataclass
class Tenants:
    """The tenant registry: token lookup (API) and policies (processor).

    ``operator_tokens`` may read ``/metrics``; ``None`` (a dev node without a tenants
    file) leaves ``/metrics`` open."""

    tenants: dict[str, Tenant] = field(default_factory=dict)
    operator_tokens: tuple[str, ...] | None = None
    pool_credentials: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pool -> secrets

    def seat_pools(self, tenant: str) -> frozenset[str | None]:
        """The pools whose seats may take ``tenant``'s runs (``None``: pool-less seats)."""
        t = self.tenants.get(tenant)
        if t is None or not t.pools:
            return frozenset({None})
        return frozenset(t.pools)

    def credentials(self, pool: str) -> tuple[str, ...]:
        """The credentials of ``pool`` (none: an unknown pool)."""
        return self.pool_credentials.get(pool, ())

    def by_token(self, token: str) -> Tenant | None:
        """The tenant holding ``token``; every token is compared (constant time)."""
        given = token.encode()
        found: Tenant | None = None
        for t in self.tenants.values():
            for candidate in t.tokens:
                if hmac.compare_digest(candidate.encode(), given):
                    found = t
        return found

    def is_operator(self, token: str) -> bool:
        """``token`` is an operator token (constant time over all of them)."""
        given = token.encode()
        hits = [hmac.compare_digest(c.encode(), given) for c in self.operator_tokens or ()]
        return any(hits)

    def min_interval(self, tenant: str) -> float:
        t = self.tenants.get(tenant)
        return t.min_interval if t is not None else MIN_INTERVAL_SECONDS

    def weight(self, tenant: str) -> float:
        t = self.tenants.get(tenant)
        return t.weight if t is not None else 1.0

    def retry_bounds(self, tenant: str) -> tuple[int, float]:
        """The tenant's ``(max_attempts, min_backoff)``; the node's bounds when unknown."""
        t = self.tenants.get(tenant)
        if t is None:
            return (MAX_RETRY_ATTEMPTS, MIN_RETRY_BACKOFF_SECONDS)
        return (t.max_attempts, t.min_backoff)

    def timeouts(self, tenant: str) -> tuple[float, dict[str, float]]:
        """The tenant's execution timeout and its per-job-type ones (seconds)."""
        t = self.tenants.get(tenant)
        if t is None:
            return (DEFAULT_EXECUTION_TIMEOUT_SECONDS, {})
        return (t.execution_timeout, t.job_timeouts)

    def attempts_per_minute(self, tenant: str) -> int | None:
        t = self.tenants.get(tenant)
        return t.max_attempts_per_minute if t is not None else None

    def job_concurrency(self, tenant: str) -> dict[str, ConcurrencySpec]:
        """The tenant's concurrency rule per job type (empty: none)."""
        t = self.tenants.get(tenant)
        return t.job_concurrency if t is not None else {}

    def max_running(self, tenant: str) -> int | None:
        t = self.tenants.get(tenant)
        return t.max_running if t is not None else None

    def retention(self, tenant: str, default: float) -> float:
        """How long ``tenant``'s finished runs keep their read-model rows (seconds);
        ``default``: the deployment's ``--retention``."""
        t = self.tenants.get(tenant)
        return default if t is None or t.retention is None else t.retention

    def result_retention(self, tenant: str, default: float) -> float:
        """How long ``tenant``'s finished runs keep their result objects (seconds): its own,
        else ``DEFAULT_RESULT_RETENTION_S`` capped by its ``retention(tenant, default)``."""
        t = self.tenants.get(tenant)
        if t is not None and t.result_retention is not None:
            return t.result_retention
        return min(DEFAULT_RESULT_RETENTION_S, self.retention(tenant, default))

    def check_retention(self, default: float) -> None:
        """``ConfigError`` naming the tenant and field when a tenant's ``result_retention``
        exceeds its retention (its own, else the deployment's ``default``)."""
        for name, t in self.tenants.items():
            if t.result_retention is not None and t.result_retention > self.retention(
                    name, default):
                raise ConfigError(
                    f"invalid tenants.{name}.result_retention '{t.result_retention:g}s': "
                    f"must not exceed the tenant's retention "
                    f"({self.retention(name, default):g}s)")

    def storage_budget(self, tenant: str) -> int | None:
        """The bytes of params and results ``tenant`` may write in any hour (None: no
        budget)."""
        t = self.tenants.get(tenant)
        return t.storage_budget if t is not None else None

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]:
        t = self.tenants.get(tenant)
        if t is None:
            return (frozenset(), 0)  # an unknown tenant may do nothing
        return (t.allowed_jobs, t.max_schedules)

    def destinations(self, tenant: str) -> dict[str, str]:
        """The destinations granted to ``tenant``: name -> kind (none for an unknown tenant)."""
        t = self.tenants.get(tenant)
        return {} if t is None else {n: d.kind for n, d in t.destinations.items()}

    def destination(self, tenant: str, name: str) -> AnyDestination | None:
        t = self.tenants.get(tenant)
        return None if t is None else t.destinations.get(name)

    def all_destinations(self) -> dict[str, dict[str, AnyDestination]]:
        return {n: t.destinations for n, t in self.tenants.items() if t.destinations}


def dev_tenants() -> Tenants:
    return Tenants({"default": Tenant("default", ("dev",), None, None)})


def load_tenants(path: str | Path) -> Tenants:
    """Parse a tenants TOML file; ``ConfigError`` names the bad key."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"invalid tenants file '{p}': not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid tenants file '{p}': {exc}") from None
    section = raw.get("tenants")
    if not isinstance(section, dict) or not section:
        raise ConfigError(f"invalid tenants file '{p}': no [tenants.<name>] table")
    out: dict[str, Tenant] = {}
    for name, cfg in section.items():
        if not isinstance(cfg, dict):
            raise ConfigError(f"invalid tenants.{name}: not a table")
        tokens = cfg.get("tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
            raise ConfigError(f"invalid tenants.{name}.tokens: must be a list of strings")
        jobs = cfg.get("allowed_jobs", ["*"])
        if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
            raise ConfigError(f"invalid tenants.{name}.allowed_jobs: must be a list of strings")
        max_s = cfg.get("max_schedules")
        if max_s is not None and (not isinstance(max_s, int) or max_s < 0):
            raise ConfigError(f"invalid tenants.{name}.max_schedules '{max_s}'")
        out[name] = Tenant(name, tuple(tokens), None if "*" in jobs else frozenset(jobs), max_s,
                           parse_destinations(name, cfg.get("destinations")),
                           _min_interval(name, cfg.get("min_interval", MIN_INTERVAL_SECONDS)),
                           _rate_limit(name, cfg.get("rate_limit")),
                           _weight(name, cfg.get("weight", 1)),
                           *_retry_bounds(name, cfg),
                           _positive_int(name, "max_running", cfg.get("max_running")),
                           *_timeouts(name, cfg),
                           _positive_int(name, "max_attempts_per_minute",
                                         cfg.get("max_attempts_per_minute")))
    pools = _pools(p, raw.get("pools", {}))
    for name, cfg in section.items():
        rows, results = _retention(name, cfg)
        out[name] = replace(out[name], pools=_tenant_pools(p, name, cfg.get("pools", []), pools),
                            retention=rows, result_retention=results,
                            job_concurrency=_job_concurrency(name, cfg.get("job_concurrency", {})),
                            storage_budget=_storage_budget(
                                name, cfg.get("storage_budget", DEFAULT_STORAGE_BUDGET)))
    return Tenants(out, _operator_tokens(raw.get("operators", {})), pools)


def _pools(p: Path, section: Any) -> dict[str, tuple[str, ...]]:
    """``[pools.<name>]`` tables: name -> credentials."""
    if not isinstance(section, dict):
        raise ConfigError(f"invalid tenants file '{p}': pools: not a table")
    out: dict[str, tuple[str, ...]] = {}
    for name, cfg in section.items():
        if not POOL_NAME.match(name):
            raise ConfigError(f"invalid tenants file '{p}': pools.{name}: a pool name is "
                              "1 to 64 of a-z, 0-9 and -")
        if not isinstance(cfg, dict):
            raise ConfigError(f"invalid tenants file '{p}': pools.{name}: not a table")
        unknown = set(cfg) - {"credentials"}
        if unknown:
            raise ConfigError(f"invalid tenants file '{p}': pools.{name}: unknown key "
                              f"'{sorted(unknown)[0]}' (credentials)")
        creds = cfg.get("credentials")
        if (not isinstance(creds, list) or not creds
                or not all(isinstance(c, str) and len(c) >= 16 for c in creds)):
            raise ConfigError(f"invalid tenants file '{p}': pools.{name}.credentials: a "
                              "non-empty list of strings of at least 16 characters")
        out[name] = tuple(creds)
    return out


def _tenant_pools(p: Path, tenant: str, value: Any,
                  pools: dict[str, tuple[str, ...]]) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"invalid tenants file '{p}': tenants.{tenant}.pools: must be a "
                          "list of pool names")
    for name in value:
        if name not in pools:
            raise ConfigError(f"invalid tenants file '{p}': tenants.{tenant}.pools: unknown "
                              f"pool '{name}' (no [pools.{name}] table)")
    return frozenset(value)


def _positive_duration(name: str, key: str, value: Any) -> float:
    """``tenants.<name>.<key>``: a duration (text or seconds) greater than zero."""
    try:
        seconds = parse_duration(value)
    except InvalidDuration as exc:
        raise ConfigError(f"invalid tenants.{name}.{key} '{value}': {exc.reason}") from None
    if seconds <= 0:
        raise ConfigError(f"invalid tenants.{name}.{key} '{value}': must be positive")
    return seconds


def _retention(name: str, cfg: dict[str, Any]) -> tuple[float | None, float | None]:
    """``retention`` and ``result_retention`` (positive durations, or absent: None); the
    result's window must not exceed the rows' window when both are set."""
    rows, results = cfg.get("retention"), cfg.get("result_retention")
    r = None if rows is None else _positive_duration(name, "retention", rows)
    rr = None if results is None else _positive_duration(name, "result_retention", results)
    if rr is not None and r is not None and rr > r:
        raise ConfigError(f"invalid tenants.{name}.result_retention '{results}': must not "
                          f"exceed tenants.{name}.retention '{rows}'")
    return r, rr


def _storage_budget(name: str, value: Any) -> int:
    """``storage_budget``: bytes an hour, an integer or a text with a unit ("256MiB"), from
    ``MAX_PARAMS_BYTES`` (the largest params fit an empty window) to ``MAX_INT``."""
    text = value if isinstance(value, str) else None
    match = _SIZE.match(text) if text is not None else None
    if match is not None:
        size: Any = int(match[1]) * _UNITS[match[2]]
    else:
        size = value
    if (isinstance(size, bool) or not isinstance(size, int)
            or not MAX_PARAMS_BYTES <= size <= MAX_INT):
        raise ConfigError(f"invalid tenants.{name}.storage_budget '{value}': bytes an hour, "
                          f"an integer or a size such as \"256MiB\" (B, KB, MB, GB, KiB, "
                          f"MiB, GiB), at least {MAX_PARAMS_BYTES} (the largest params)")
    return size


def _min_interval(name: str, value: Any) -> float:
    return _positive_duration(name, "min_interval", value)


def _retry_bounds(name: str, cfg: dict[str, Any]) -> tuple[int, float]:
    """``max_attempts`` (1 to the node's ceiling) and ``min_backoff`` (the node's floor or
    more): a tenant may tighten the node's retry bounds, never loosen them."""
    attempts = cfg.get("max_attempts", MAX_RETRY_ATTEMPTS)
    if (isinstance(attempts, bool) or not isinstance(attempts, int)
            or not 1 <= attempts <= MAX_RETRY_ATTEMPTS):
        raise ConfigError(f"invalid tenants.{name}.max_attempts '{attempts}': an integer "
                          f"from 1 to {MAX_RETRY_ATTEMPTS}")
    value = cfg.get("min_backoff", MIN_RETRY_BACKOFF_SECONDS)
    try:
        backoff = parse_duration(value)
    except InvalidDuration as exc:
        raise ConfigError(f"invalid tenants.{name}.min_backoff '{value}': {exc.reason}") from None
    if backoff < MIN_RETRY_BACKOFF_SECONDS:
        raise ConfigError(f"invalid tenants.{name}.min_backoff '{value}': at least "
                          f"{MIN_RETRY_BACKOFF_SECONDS:g}s (the node's floor)")
    return attempts, backoff


def _timeouts(name: str, cfg: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """``execution_timeout`` and the ``[tenants.<name>.job_timeouts]`` table (job type ->
    duration): positive durations."""
    def seconds(key: str, value: Any) -> float:
        return _positive_duration(name, key, value)

    default = seconds("execution_timeout",
                      cfg.get("execution_timeout", DEFAULT_EXECUTION_TIMEOUT_SECONDS))
    table = cfg.get("job_timeouts", {})
    if not isinstance(table, dict):
        raise ConfigError(f"invalid tenants.{name}.job_timeouts: a table of job type = duration")
    return default, {job: seconds(f"job_timeouts.{job}", v) for job, v in table.items()}


def _job_concurrency(name: str, table: Any) -> dict[str, ConcurrencySpec]:
    """The ``[tenants.<name>.job_concurrency]`` table: job type -> { key, limit }."""
    if not isinstance(table, dict):
        raise ConfigError(f"invalid tenants.{name}.job_concurrency: a table of job type = "
                          "{ key = ..., limit = ... }")
    out: dict[str, ConcurrencySpec] = {}
    for job, rule in table.items():
        try:
            out[job] = ConcurrencySpec.model_validate(rule)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ConfigError(f"invalid tenants.{name}.job_concurrency.{job}"
                              f"{'.' + where if where else ''}: {err['msg']}") from None
    return out


def _positive_int(name: str, key: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ConfigError(f"invalid tenants.{name}.{key} '{value}': an integer >= 1")
    return value


def _weight(name: str, value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0.01 <= value <= 10_000):
        raise ConfigError(f"invalid tenants.{name}.weight '{value}': a number from 0.01 "
                          "to 10000")
    return float(value)


def _rate_limit(name: str, value: Any) -> RateLimit:
    """``rate_limit = 20`` (per second, burst twice that) or ``{per_second, burst}``."""
    per_second, burst = DEFAULT_RATE_LIMIT
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        per_second, burst = float(value), max(1, int(2 * value))
    elif isinstance(value, dict):
        unknown = set(value) - {"per_second", "burst"}
        if unknown:
            raise ConfigError(f"invalid tenants.{name}.rate_limit: unknown key "
                              f"'{sorted(unknown)[0]}' (per_second, burst)")
        per_second = value.get("per_second", per_second)
        burst = value.get("burst", max(1, int(2 * per_second))
                          if isinstance(per_second, (int, float)) else burst)
    elif value is not None:
        raise ConfigError(f"invalid tenants.{name}.rate_limit: a number (per second) or "
                          f"{{ per_second = N, burst = M }}")
    if isinstance(per_second, bool) or not isinstance(per_second, (int, float)) \
            or not per_second > 0:
        raise ConfigError(f"invalid tenants.{name}.rate_limit.per_second '{per_second}': "
                          f"must be a positive number")
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ConfigError(f"invalid tenants.{name}.rate_limit.burst '{burst}': must be an "
                          f"integer >= 1")
    return RateLimit(float(per_second), burst)


def _operator_tokens(section: Any) -> tuple[str, ...]:
    if not isinstance(section, dict):
        raise ConfigError("invalid operators: not a table")
    tokens = section.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
        raise ConfigError("invalid operators.tokens: must be a list of strings")
    return tuple(tokens)
