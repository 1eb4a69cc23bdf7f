"""How a user command reaches chronolog: a node's HTTP API, or — for operators, only when
asked with ``--log`` — the log and the read model directly.

``select_target`` decides, from the flags and the environment (a flag wins over its
variable):

1. ``--log URL`` (or ``CHRONOLOG_LOG`` when no ``--url``/``CHRONOLOG_URL`` is set): direct
   access (``chronolog.cli.direct``): commands to the log through ``chronolog.client.Client``,
   reads from the read model (``--database-url`` or the data directory's embedded
   PostgreSQL).
2. ``--url URL`` / ``CHRONOLOG_URL``, with ``--token TOKEN`` / ``CHRONOLOG_TOKEN``: that
   node's HTTP API (``chronolog.cli.http``).
3. Neither: the dev node recorded in ``--data-dir``'s ``node.json`` (default
   ``./.chronolog``, env ``CHRONOLOG_DATA_DIR``; ``chronolog.devnode.nodefile``) with its
   token (``--token`` or ``CHRONOLOG_TOKEN`` overrides it). None there, or one that does not
   answer: exit status 2 with one line saying how to point the CLI at a node.

Both transports implement ``Transport`` and answer the HTTP API's JSON bodies (camelCase),
so a command prints the same ``--json`` whichever way it went.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from chronolog.cli.errors import UsageError
from chronolog.devnode.nodefile import read_node_file
from chronolog.settings import LogConfig, data_dir

__all__ = ["ENV_LOG", "ENV_TOKEN", "ENV_URL", "Ctx", "RunsQuery", "SchedulesQuery", "Target",
           "Transport", "WorkersQuery", "no_node_line", "select_target", "wants_direct"]

ENV_URL, ENV_TOKEN, ENV_LOG = "CHRONOLOG_URL", "CHRONOLOG_TOKEN", "CHRONOLOG_LOG"

# flags that only direct access reads, and why the HTTP API does not need them
_DIRECT_ONLY = (
    ("database_url", "--database-url", "the node reads its own read model"),
    ("partitions", "--partitions", "the node knows its log"),
    ("topic_prefix", "--topic-prefix", "the node knows its log"),
    ("tenant", "--tenant", "the token names the tenant"),
    ("tenants", "--tenants", "the token names the tenant"),
)


@dataclass(frozen=True)
class Target:
    """Where a command goes: ``url`` (the HTTP API) or, when it is None, the log directly."""

    url: str | None = None
    token: str | None = None
    token_from: str | None = None  # where the token came from: a flag, a variable, a file
    node_dir: Path | None = None  # the data directory whose node.json named ``url``
    node_pid: int | None = None

    @property
    def direct(self) -> bool:
        return self.url is None


@dataclass
class Ctx:
    """What a command resolved before it sends anything."""

    args: Any
    direct: bool  # ``wants_direct(args)``
    tenant: str = "default"  # direct access: the tenant acted for (HTTP: the token's)
    allowed_jobs: frozenset[str] | None = None  # direct access with a tenants file
    log_cfg: LogConfig | None = None  # direct access


@dataclass(frozen=True)
class SchedulesQuery:
    """``GET /v1/schedules``."""

    states: tuple[str, ...] | None = None
    job_type: str | None = None
    resource_class: str | None = None
    prefix: str | None = None
    limit: int | None = None
    after: str | None = None

    def params(self) -> dict[str, str]:
        return _params(state=",".join(self.states) if self.states else None,
                       jobType=self.job_type, resourceClass=self.resource_class,
                       prefix=self.prefix, limit=self.limit, after=self.after)


@dataclass(frozen=True)
class RunsQuery:
    """``GET /v1/schedules/{id}/runs`` (``schedule_id`` and no other filter than states) or
    ``GET /v1/runs``."""

    schedule_id: str | None = None
    states: tuple[str, ...] | None = None
    job_type: str | None = None
    start: str | None = None  # ``from``: an ISO instant (UTC, ``Z``)
    end: str | None = None  # ``to``
    limit: int | None = None
    after: str | None = None

    @property
    def of_one_schedule(self) -> bool:
        """Answered by the schedule's own run list (``/v1/schedules/{id}/runs``)."""
        return self.schedule_id is not None and self.job_type is None and \
            self.start is None and self.end is None

    def params(self) -> dict[str, str]:
        own = self.of_one_schedule
        return _params(state=",".join(self.states) if self.states else None,
                       jobType=self.job_type, scheduleId=None if own else self.schedule_id,
                       **{"from": self.start, "to": self.end}, limit=self.limit,
                       after=self.after)


@dataclass(frozen=True)
class WorkersQuery:
    """``GET /v1/workers``."""

    live: bool | None = None
    limit: int | None = None
    after: str | None = None

    def params(self) -> dict[str, str]:
        return _params(live=None if self.live is None else str(self.live).lower(),
                       limit=self.limit, after=self.after)


def _params(**values: Any) -> dict[str, str]:
    return {k: str(v) for k, v in values.items() if v is not None}


class Transport(Protocol):
    """One operation per method; each answers the HTTP API's body for it (a dict) or raises
    ``Failure`` (refused, not found, unavailable)."""

    async def create_schedule(self, schedule_id: str, body: dict[str, Any], spec: Any,
                              key: str | None) -> dict[str, Any]: ...

    async def revise_schedule(self, schedule_id: str, body: dict[str, Any], spec: Any,
                              revision: int) -> dict[str, Any]: ...

    async def patch_schedule(self, schedule_id: str, patch: dict[str, Any],
                             revision: int) -> dict[str, Any]:
        """Revise with a JSON merge patch of the definition at ``revision``."""
        ...

    async def change_state(self, schedule_id: str, action: str,
                           reason: str) -> dict[str, Any]: ...

    async def trigger(self, schedule_id: str, key: str,
                      params: dict[str, Any] | None) -> dict[str, Any]: ...

    async def backfill(self, schedule_id: str, key: str, start: datetime, end: datetime,
                       overlap: str) -> dict[str, Any]:
        """The schedule's instants in [start, end) run (``POST :backfill``'s body)."""
        ...

    async def cancel(self, run_id: str, schedule_id: str | None,
                     reason: str) -> dict[str, Any]: ...

    async def redrive(self, run_id: str, schedule_id: str | None) -> dict[str, Any]: ...

    async def put_calendar(self, name: str, body: dict[str, Any],
                           if_match: int | None) -> dict[str, Any]: ...

    async def delete_calendar(self, name: str, if_match: int | None) -> dict[str, Any]: ...

    async def calendar(self, name: str) -> dict[str, Any]: ...

    async def calendars(self, limit: int | None, after: str | None) -> dict[str, Any]: ...

    async def schedule(self, schedule_id: str) -> dict[str, Any]: ...

    async def schedules(self, query: SchedulesQuery) -> dict[str, Any]: ...

    async def all_schedules(self) -> list[dict[str, Any]]:
        """Every schedule of the tenant but the DELETED ones, by ID, each as an item of
        ``GET /v1/schedules`` (with its ``revision``, ``state`` and ``definition``): every
        page of it."""
        ...

    async def runs(self, query: RunsQuery) -> dict[str, Any]: ...

    async def run(self, run_id: str) -> dict[str, Any]: ...

    async def workers(self, query: WorkersQuery) -> dict[str, Any]: ...


# =======================================================================================
# which way


def wants_direct(args: Any) -> bool:
    """Direct access to the log: ``--log``, or ``CHRONOLOG_LOG`` with no URL given
    (``UsageError`` for ``--url`` and ``--log`` together). Reads no file."""
    env = os.environ
    if args.url is not None and args.log is not None:
        raise UsageError("invalid url: --url (a node's HTTP API) and --log (direct access to "
                         "the log) exclude each other")
    return args.log is not None or (args.url is None and not env.get(ENV_URL)
                                    and bool(env.get(ENV_LOG)))


def select_target(args: Any) -> Target:
    """Direct access, a given URL, or the dev node of the data directory (``UsageError``
    with one line when none is found)."""
    env = os.environ
    if wants_direct(args):
        if args.token is not None:
            raise UsageError("invalid token: --token applies to the HTTP API (--url); --log "
                             "accesses the log directly")
        return Target()
    for attr, flag, why in _DIRECT_ONLY:
        if getattr(args, attr, None) is not None:
            raise UsageError(f"invalid {flag.removeprefix('--')}: {flag} applies to direct "
                             f"access to the log (--log); over the HTTP API {why}")
    token, token_from = None, None
    if args.token is not None:
        token, token_from = _token(args.token, "token"), "--token"
    elif env.get(ENV_TOKEN):
        token, token_from = _token(env[ENV_TOKEN], ENV_TOKEN), ENV_TOKEN
    if args.url is not None:
        return Target(_url(args.url, "url"), token, token_from)
    if env.get(ENV_URL):
        return Target(_url(env[ENV_URL], ENV_URL), token, token_from)
    ddir = data_dir(args.data_dir)
    node = read_node_file(ddir)
    if node is None:
        raise UsageError(no_node_line(ddir))
    if token is None and node.token:
        token, token_from = node.token, f"{_shown(ddir)}/node.json"
    return Target(_url(node.url, f"url of {ddir / 'node.json'}"), token, token_from, ddir,
                  node.pid)


def no_node_line(ddir: Path, target: Target | None = None) -> str:
    """The one line saying how to point the CLI at a node: none recorded in ``ddir``, or
    ``target`` (the one recorded there) does not answer."""
    what = (f"no chronolog node found at {_shown(ddir)}" if target is None else
            f"the chronolog node recorded in {_shown(ddir)} ({target.url}, pid "
            f"{target.node_pid}) does not answer")
    return (f"error: {what}; pass --url URL --token TOKEN (or set {ENV_URL}, {ENV_TOKEN}), "
            f"or start one with 'chronolog dev'")


def _shown(path: Path) -> str:
    text = str(path)
    if path.is_absolute() or text.startswith(("./", "../")):
        return text
    return f"./{text}"


def _token(value: str, name: str) -> str:
    if not value:
        raise UsageError(f"invalid {name}: empty")
    if not all(c.isascii() and c.isprintable() and not c.isspace() for c in value):
        raise UsageError(f"invalid {name}: a token is printable ASCII without spaces")
    return value


def _url(value: str, name: str) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing slash."""
    shown = value.encode("unicode_escape").decode()[:200]
    try:
        parts = urlsplit(value)
        port = parts.port  # ValueError for a port that is not a number or out of range
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or \
            parts.query or parts.fragment or parts.username is not None or \
            not value.isascii() or any(c.isspace() for c in value):
        raise UsageError(f"invalid {name} '{shown}': expected http://host:port (or https://)")
    del port
    return value.rstrip("/")
