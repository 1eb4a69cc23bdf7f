"""What the routes share, held in ``app.state.chronolog`` and handed to them as dependencies:
the command client and how a command is sent and answered, the read model, the tenants and
their rate limits, and the read-your-writes wait.

Writes validate what they can first, then send one command and wait — bounded,
``reply_timeout`` — for the processor's reply. No reply in time is 503 ``unavailable``: the
command may still be decided, so the message says to read the resource (or retry with the
same ``Idempotency-Key``) before retrying blindly.

A refused command is the error body of its reply's status (``quota`` is 429); a refusal over
the tenant's storage budget names the tenants-file setting, ``storage_budget``, as its field
and carries the processor's ``retry_after`` as ``Retry-After``.

Read your writes by default: after an ok reply the write waits, at most ``visible_timeout``
(default 2 s), until the projection has passed the log positions of the events the command
caused (for a write that caused none, e.g. an idempotent replay, just past the last record
of its partition of ``events`` when the reply came, which covers the events of the
original), so a read sent after the answer sees the write without any header. The answer
says which happened in ``X-Chronolog-Visible``: ``true``, or ``false`` when the bound passed
first — the write is then still answered with its normal status and body (it was accepted;
only the read model lags).

Every successful write also returns ``X-Chronolog-Consistency``: a token that encodes those
positions, for clients whose later reads may go elsewhere (another API process behind a
load balancer) or that write through the log. A read that sends it back waits until the
projection has passed the positions, at most ``consistency_timeout``; if it has not by then
the read is 503 ``unavailable`` with ``Retry-After: 1`` — never stale data presented as
fresh. A token naming a position the log has not written yet (or a partition it does not
have) cannot be one of its writes: it is 400 at once, never a wait. At most
``max_consistency_waits`` reads wait at a time; one more is 503 with ``Retry-After: 1`` at
once, so waiting reads cannot crowd out the others (``/healthz`` among them).
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import asyncpg
import orjson
from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from chronolog.api.cursors import CONSISTENCY_HEADER, VISIBLE_HEADER, decode_token, encode_token
from chronolog.api.errors import ApiError
from chronolog.api.limits import RateLimiter
from chronolog.api.sessions import SessionStore
from chronolog.api.throttle import AuthFailures
from chronolog.client import Client, ReplyTimeout
from chronolog.commands.aggregate import TenantContext
from chronolog.commands.decider import ungranted_effect
from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key
from chronolog.domain.storage_budget import SETTING as STORAGE_SETTING
from chronolog.log.partitioner import partition_for
from chronolog.log.port import LogError, Topics
from chronolog.queries import workers as wk
from chronolog.queries.calendars import missing_calendars
from chronolog.queries.documents import camel_path, jsonable
from chronolog.queries.metrics import MetricsSource
from chronolog.queries.read_model import ReadModel
from chronolog.tenants import DEFAULT_RETENTION_S, Tenant, Tenants
from chronolog.wakeup import wait_within

__all__ = [
    "ApiContext",
    "ConsistentDep",
    "Context",
    "Written",
    "consistent",
    "context",
    "with_warnings",
    "written",
]

QUORUM_CHECK_S = 1.0  # how long the API trusts its last look at the log's write quorum

_REPLY_HTTP = {"invalid": 400, "forbidden": 403, "not_found": 404, "conflict": 409,
               "quota": 429, "stale_fence": 409}


@dataclass
class ApiContext:
    """The services of one app (``create_app`` makes it)."""

    client: Client | None
    pool: Any  # an asyncpg pool, or None: no read model
    tenants: Tenants
    projector: Any = None
    projection: str = "main"
    reply_timeout: float = 10.0
    consistency_timeout: float = 5.0
    consistency_poll: float = 0.02
    known_job_types: Mapping[str, Iterable[str]] | None = None
    visible_timeout: float = 2.0
    retention: float = DEFAULT_RETENTION_S  # the deployment's --retention (tenants' default)
    limiter: RateLimiter = field(default_factory=RateLimiter)
    query_names: dict[str, frozenset[str]] = field(default_factory=dict)
    # the not-ready parts of a node in this process, "<part>: <reason>" (create_app)
    alongside: Callable[[], list[str]] | None = None
    max_consistency_waits: int = 64
    sessions: SessionStore = field(default_factory=SessionStore)  # the dashboard's
    secure_cookies: bool = False  # Secure cookies even over plain HTTP (behind TLS)
    auth_failures: AuthFailures = field(default_factory=AuthFailures)
    _waiting: int = 0  # reads waiting for a consistency token now
    _partitions: dict[str, int] = field(default_factory=dict)
    _quorum: tuple[float, str | None] = (0.0, None)  # (monotonic time asked, answer)

    def __post_init__(self) -> None:
        self.log = self.client.log if self.client is not None else None
        self.topics = self.client.topics if self.client is not None else Topics()
        self.rm = (ReadModel(self.pool, self.topics.events, self.projection)
                   if self.pool is not None else None)
        self.metrics = (MetricsSource(self.pool, self.log, self.projection, self.projector)
                        if self.pool is not None else None)

    # ------------------------------------------------------------------ reads

    def read(self) -> ReadModel:
        """The read model (503 when the app has none)."""
        if self.rm is None:
            raise ApiError(503, "no read model configured")
        return self.rm

    async def schedule_row(self, tenant: Tenant, schedule_id: str) -> asyncpg.Record:
        row = await self.read().schedule(tenant.name, schedule_id)
        if row is None:
            raise ApiError(404, f"no schedule '{schedule_id}'", "scheduleId")
        return row

    async def run_row(self, tenant: Tenant, run_id: str) -> asyncpg.Record:
        row = await self.read().run(tenant.name, run_id)
        if row is None:
            raise ApiError(404, f"no run '{run_id}'", "runId")
        return row

    async def events_partitions(self) -> int:
        """The partitions of ``events`` (0 without a log)."""
        return await self.topic_partitions(self.topics.events)

    async def topic_partitions(self, topic: str) -> int:
        """The partitions of ``topic`` (0 without a log), asked once."""
        if self.log is None:
            return 0
        n = self._partitions.get(topic)
        if n is None:
            n = self._partitions[topic] = await self.log.partitions_for(topic)
        return n

    async def reached(self, required: dict[int, int], timeout: float) -> bool:
        """Whether the projection reached ``required`` (``partition -> next offset``) within
        ``timeout`` seconds: waiting on the in-process projector, else polling the offsets
        stored in the read model (False at once without either)."""
        if not required:
            return True
        if self.projector is not None:
            return bool(await self.projector.wait_for(required, timeout))
        if self.rm is None:
            return False
        deadline = time.monotonic() + timeout
        while True:
            have, _ = await self.rm.offsets()
            if all(have.get(p, 0) >= n for p, n in required.items()):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self.consistency_poll)

    async def check_token(self, required: dict[int, int]) -> None:
        """400 when ``required`` names a partition ``events`` does not have or a position
        past what the log has written: no write of this log gave that token."""
        if self.log is None:
            return
        n = await self.events_partitions()
        for p, offset in sorted(required.items()):
            if p < 0 or p >= n or offset < 0 or offset > await self.log.end_offset(
                    self.topics.events, p):
                raise ApiError(400, f"invalid {CONSISTENCY_HEADER}: it names a position the "
                               f"log has not written (partition {p})", CONSISTENCY_HEADER)

    async def wait_consistent(self, required: dict[int, int]) -> None:
        """Return once the projection reached ``required``; 503 after the timeout (or at
        once when ``max_consistency_waits`` reads already wait)."""
        if self.projector is None:
            self.read()  # 503 without a read model
        await self.check_token(required)
        if self._waiting >= self.max_consistency_waits:
            raise ApiError(503, f"too many reads wait for a consistency token "
                           f"({self.max_consistency_waits}); retry shortly",
                           CONSISTENCY_HEADER, headers={"Retry-After": "1"})
        self._waiting += 1
        try:
            reached = await self.reached(required, self.consistency_timeout)
        finally:
            self._waiting -= 1
        if reached:
            return
        raise ApiError(503, f"the read model has not reached the consistency token within "
                       f"{self.consistency_timeout:g}s; retry shortly", CONSISTENCY_HEADER,
                       headers={"Retry-After": "1"})

    # ------------------------------------------------------------------ writes

    async def check_writable(self) -> None:
        """503 at once while the log has too few replicas to accept a write
        (``EventLog.write_quorum``, asked at most once a second), instead of a command sent
        into a log that cannot take it and a reply awaited in vain."""
        if self.log is None:
            return
        asked, answer = self._quorum
        now = time.monotonic()
        if now - asked >= QUORUM_CHECK_S:
            try:
                answer = await wait_within(self.log.write_quorum(), 3)
            except (TimeoutError, LogError):
                answer = None  # not known: the send itself will tell
            self._quorum = (now, answer)
        if answer is not None:
            raise ApiError(503, f"the log cannot accept writes now: {answer}", None,
                           headers={"Retry-After": "1"})

    def check_job(self, tenant: Tenant, spec: m.ScheduleSpec) -> None:
        """403 when the tenant may not run the job type or use an effect's destination."""
        if tenant.allowed_jobs is not None and spec.job.type not in tenant.allowed_jobs:
            raise ApiError(403, f"job type '{spec.job.type}' not allowed", "job.type")
        refused = ungranted_effect(spec, TenantContext(destinations={
            name: d.kind for name, d in tenant.destinations.items()}))
        if refused is not None:
            raise ApiError(403 if refused.status == "forbidden" else 400, refused.reason,
                           refused.field)

    async def check_calendars(self, tenant: Tenant, spec: m.ScheduleSpec) -> None:
        """400 naming ``exclude[i]`` when a calendar the definition names does not exist (the
        read model's view: a calendar put through this API is visible before its answer)."""
        if self.pool is None or not spec.exclude:
            return
        missing = await missing_calendars(self.pool, tenant.name, spec.exclude)
        if missing:
            i = spec.exclude.index(missing[0])
            raise ApiError(400, f"no calendar '{missing[0]}': put it first (PUT "
                           f"/v1/calendars/{missing[0]})", f"exclude[{i}]")

    async def job_warnings(self, spec: m.ScheduleSpec) -> list[str]:
        """What to warn about (or, on a dev node, refuse) in a new schedule's job type."""
        if self.pool is None:
            return []
        known_job_types = self.known_job_types
        cls, job = spec.resource_class, spec.job.type
        if job in (known_job_types or {}).get(cls, ()) or await wk.ever_served(
                self.pool, cls, job):
            return []
        if known_job_types is not None:
            known = sorted({*known_job_types.get(cls, ()),
                            *await wk.served_types(self.pool, cls)})
            raise ApiError(400, f"job type '{job}' is not served in resource class '{cls}' "
                           f"(known job types: {', '.join(known) or 'none'}); start a worker "
                           f"that serves it first", "job.type")
        return [f"no worker of resource class '{cls}' has ever served job type '{job}': its "
                f"runs will wait READY until one does"]

    async def send(self, tenant: Tenant, schedule_id: str, payload: Any
                   ) -> tuple[m.Reply, "Written"]:
        """Send one command; the ok reply and, once its events are visible in the read
        model (or ``visible_timeout`` passed), its consistency token and visibility; or an
        ApiError."""
        client = self.client
        if client is None:
            raise ApiError(503, "no command client configured")
        limit = tenant.rate_limit
        wait = self.limiter.take(tenant.name, limit)
        if wait is not None and limit is not None:
            raise ApiError(429, f"tenant '{tenant.name}' sends commands faster than its rate "
                           f"limit ({limit.per_second:g}/s, burst {limit.burst}); retry in "
                           f"{wait}s", None, headers={"Retry-After": str(wait)})
        await self.check_writable()
        env = client.envelope(tenant.name, schedule_id, payload)
        env = env.model_copy(update={"principal": f"api:{tenant.name}"})
        try:
            reply = await client.send(env, self.reply_timeout)
        except ReplyTimeout:
            raise ApiError(503, f"no reply from the processor within {self.reply_timeout:g}s; "
                           "the command may still be decided: read the resource (or retry "
                           "with the same Idempotency-Key) before retrying", None,
                           headers={"Retry-After": "1"}) from None
        except LogError as exc:
            raise ApiError(503, f"the log is unavailable: {exc}", None,
                           headers={"Retry-After": "1"}) from None
        if reply.status != "ok":
            raise _refused(reply)
        required: dict[int, int] = {}
        for pos in reply.positions:
            if pos.topic == self.topics.events:
                required[pos.partition] = max(required.get(pos.partition, 0), pos.offset + 1)
        if not required and self.log is not None:
            required = await self.tail_of_partition(tenant.name, schedule_id)
        visible = await self.reached(required, self.visible_timeout)
        return reply, Written(encode_token(required), visible)

    async def tail_of_partition(self, tenant_name: str, schedule_id: str) -> dict[int, int]:
        """For a reply without events: just past the last record of its partition of events.

        (Not the end offset itself: on Kafka the end may be a transaction marker, which the
        projection never stores as consumed.)"""
        assert self.log is not None
        n = await self.events_partitions()
        p = partition_for(partition_key(tenant_name, schedule_id).encode(), n)
        end = await self.log.end_offset(self.topics.events, p)
        if end == 0:
            return {}
        recs = await self.log.read(self.topics.events, p, max(0, end - 16), 16, 0)
        offsets = [r.offset for r in recs if r.offset < end]
        return {p: max(offsets) + 1} if offsets else {}


def _refused(reply: m.Reply) -> ApiError:
    """The error answer of a refused command. A refusal over the tenant's storage budget
    names the tenants-file setting as its field and says when to retry (``Retry-After``)."""
    body = dict(reply.body)
    fld = body.pop("field", None)
    extra = {k: v for k, v in (("revision", body.get("revision")),
                               ("state", body.get("state"))) if v is not None}
    if fld == STORAGE_SETTING:
        wait = body.get("retry_after")
        return ApiError(_REPLY_HTTP["quota"], reply.reason, STORAGE_SETTING,
                        headers={"Retry-After": str(wait)} if isinstance(wait, int) else None)
    return ApiError(_REPLY_HTTP.get(reply.status, 409), reply.reason or reply.status,
                    camel_path(fld) if isinstance(fld, str) else None, **extra)


@dataclass(frozen=True)
class Written:
    """What a write's answer says of its events: the consistency token, and whether the
    read model showed them before the answer."""

    token: str
    visible: bool

    def headers(self) -> dict[str, str]:
        return {CONSISTENCY_HEADER: self.token,
                VISIBLE_HEADER: "true" if self.visible else "false"}


def written(content: BaseModel, status: int, mark: Written,
            headers: dict[str, str] | None = None) -> JSONResponse:
    """A write's answer with its consistency token and visibility."""
    return JSONResponse(jsonable(content), status_code=status,
                        headers={**mark.headers(), **(headers or {})})


def with_warnings(response: JSONResponse, warnings: list[str]) -> JSONResponse:
    if not warnings:
        return response
    body = orjson.loads(response.body)
    body["warnings"] = warnings
    return JSONResponse(body, status_code=response.status_code,
                        headers={h: response.headers[h]
                                 for h in (CONSISTENCY_HEADER, VISIBLE_HEADER)})


def context(request: Request) -> ApiContext:
    """The app's ``ApiContext``."""
    ctx: ApiContext = request.app.state.chronolog
    return ctx


Context = Annotated[ApiContext, Depends(context)]


async def consistent(
    ctx: Context,
    token: Annotated[str | None, Header(alias=CONSISTENCY_HEADER,
                                        description="a token from a write response")] = None,
) -> None:
    """Wait (bounded) until the projection reached the token's positions."""
    if not token:
        return
    try:
        required = decode_token(token)
    except ValueError:
        raise ApiError(400, f"invalid {CONSISTENCY_HEADER}: not a token of this API",
                       CONSISTENCY_HEADER) from None
    if required:
        await ctx.wait_consistent(required)


ConsistentDep = Depends(consistent)
