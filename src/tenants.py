"""Tenants and their policies, from a TOML file (``--tenants`` / ``CHRONOLOG_TENANTS``).

```toml
[tenants.acme]
tokens = ["s3cret"]
allowed_jobs = ["*"]        # or a list of job types
max_schedules = 1000

[tenants.acme.destinations.billing]   # effect destinations granted to the tenant
kind = "webhook"
url = "https://billing.example/hooks"
```

Destinations are parsed by ``chronolog.destinations`` (see README, Tenants).

Without a file, ``dev_tenants()`` has one tenant ``default`` with token ``dev``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from chronolog.destinations import AnyDestination, parse_destinations
from chronolog.settings import ConfigError


@dataclass(frozen=True)
class Tenant:
    name: str
    tokens: tuple[str, ...] = ()
    allowed_jobs: frozenset[str] | None = None  # None: every job type
    max_schedules: int | None = None
    destinations: dict[str, AnyDestination] = field(default_factory=dict, compare=False)


@dataclass
class Tenants:
    """The tenant registry: token lookup (API) and policies (processor)."""

    tenants: dict[str, Tenant] = field(default_factory=dict)

    def by_token(self, token: str) -> Tenant | None:
        for t in self.tenants.values():
            if token in t.tokens:
                return t
        return None

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
                           parse_destinations(name, cfg.get("destinations")))
    return Tenants(out)
