"""The CLI over a node's HTTP API: each operation is one request (httpx) to the documented
routes (``chronolog.api.routes``; ``schemas/api/openapi.json``), and its answer is the API's
body as it came.

A 2xx answer is the result. Any other answer is a ``Failure`` (exit status 1) carrying the
API's error body ``{"error", "field", "message", ...}`` — ``--json`` prints it as is — and
the line ``error: <error>: <message>``; a 401 also says whether the token was missing or
wrong. No connection, a 503 or no answer within the bound is ``unavailable`` (a write that
got no answer may still be decided, and the message says so); a node found through its
data directory that does not answer is bad configuration instead (exit status 2, one line
saying how to point the CLI at a node).
"""

from __future__ import annotations

from datetime import datetime
from http import HTTPStatus
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from chronolog.cli.errors import Failure, UsageError
from chronolog.cli.transport import (
    ENV_TOKEN,
    RunsQuery,
    SchedulesQuery,
    Target,
    WorkersQuery,
    no_node_line,
)

__all__ = ["HttpTransport"]

_CONNECT_TIMEOUT = 5.0
_ALL_PAGE = 500  # the API's largest page (all_schedules reads page after page)


def _id(value: str) -> str:
    # IDs are checked against their patterns before sending; quoting keeps a path a path
    return quote(value, safe=":@")


class HttpTransport:
    """``Transport`` on ``target.url`` with ``target.token`` (``async with`` it)."""

    def __init__(self, target: Target, timeout: float) -> None:
        assert target.url is not None
        self.target = target
        self.url = target.url
        self.timeout = timeout
        self._http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> HttpTransport:
        headers = {"Accept": "application/json"}
        if self.target.token:
            headers["Authorization"] = f"Bearer {self.target.token}"
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers,
            timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, _CONNECT_TIMEOUT)),
            # a dev node found on this machine is reached directly, never through a proxy
            trust_env=self.target.node_dir is None)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._http is not None:
            await self._http.aclose()

    # ------------------------------------------------------------------ writes

    async def create_schedule(self, schedule_id: str, body: dict[str, Any], spec: Any,
                              key: str | None) -> dict[str, Any]:
        return await self._call("POST", "/v1/schedules", write=True,
                                json={"scheduleId": schedule_id, **body},
                                headers={"Idempotency-Key": key} if key else None)

    async def revise_schedule(self, schedule_id: str, body: dict[str, Any], spec: Any,
                              revision: int) -> dict[str, Any]:
        return await self._call("PUT", f"/v1/schedules/{_id(schedule_id)}", write=True,
                                json=body, headers={"If-Match": str(revision)})

    async def patch_schedule(self, schedule_id: str, patch: dict[str, Any],
                             revision: int) -> dict[str, Any]:
        return await self._call("PATCH", f"/v1/schedules/{_id(schedule_id)}", write=True,
                                json=patch, headers={
                                    "If-Match": str(revision),
                                    "Content-Type": "application/merge-patch+json"})

    async def change_state(self, schedule_id: str, action: str,
                           reason: str) -> dict[str, Any]:
        if action == "delete":
            return await self._call("DELETE", f"/v1/schedules/{_id(schedule_id)}", write=True)
        return await self._call("POST", f"/v1/schedules/{_id(schedule_id)}:{action}",
                                write=True, json={"reason": reason} if reason else None)

    async def trigger(self, schedule_id: str, key: str,
                      params: dict[str, Any] | None) -> dict[str, Any]:
        return await self._call("POST", f"/v1/schedules/{_id(schedule_id)}/runs", write=True,
                                json={"params": params} if params is not None else None,
                                headers={"Idempotency-Key": key})

    async def backfill(self, schedule_id: str, key: str, start: datetime, end: datetime,
                       overlap: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/schedules/{_id(schedule_id)}:backfill",
                                write=True, headers={"Idempotency-Key": key},
                                json={"from": start.isoformat(), "to": end.isoformat(),
                                      "overlap": overlap})

    async def cancel(self, run_id: str, schedule_id: str | None,
                     reason: str) -> dict[str, Any]:
        # the API finds the run's schedule itself
        return await self._call("POST", f"/v1/runs/{_id(run_id)}:cancel", write=True,
                                json={"reason": reason} if reason else None)

    async def redrive(self, run_id: str, schedule_id: str | None) -> dict[str, Any]:
        return await self._call("POST", f"/v1/runs/{_id(run_id)}:redrive", write=True)

    async def put_calendar(self, name: str, body: dict[str, Any],
                           if_match: int | None) -> dict[str, Any]:
        return await self._call("PUT", f"/v1/calendars/{_id(name)}", write=True, json=body,
                                headers=None if if_match is None else {
                                    "If-Match": f'"{if_match}"'})

    async def delete_calendar(self, name: str, if_match: int | None) -> dict[str, Any]:
        return await self._call("DELETE", f"/v1/calendars/{_id(name)}", write=True,
                                headers=None if if_match is None else {
                                    "If-Match": f'"{if_match}"'})

    # ------------------------------------------------------------------ reads

    async def calendar(self, name: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/calendars/{_id(name)}")

    async def calendars(self, limit: int | None, after: str | None) -> dict[str, Any]:
        params = {k: str(v) for k, v in (("limit", limit), ("after", after)) if v is not None}
        return await self._call("GET", "/v1/calendars", params=params)

    async def schedule(self, schedule_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/schedules/{_id(schedule_id)}")

    async def schedules(self, query: SchedulesQuery) -> dict[str, Any]:
        return await self._call("GET", "/v1/schedules", params=query.params())

    async def all_schedules(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page = await self.schedules(SchedulesQuery(limit=_ALL_PAGE, after=after))
            items.extend(page["items"])
            after = page.get("nextCursor")
            if not after:
                return items

    async def runs(self, query: RunsQuery) -> dict[str, Any]:
        if query.of_one_schedule:
            assert query.schedule_id is not None
            return await self._call("GET", f"/v1/schedules/{_id(query.schedule_id)}/runs",
                                    params=query.params())
        return await self._call("GET", "/v1/runs", params=query.params())

    async def run(self, run_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/runs/{_id(run_id)}")

    async def workers(self, query: WorkersQuery) -> dict[str, Any]:
        return await self._call("GET", "/v1/workers", params=query.params())

    # ------------------------------------------------------------------ one request

    async def _call(self, method: str, path: str, *, write: bool = False, json: Any = None,
                    params: dict[str, str] | None = None,
                    headers: dict[str, str] | None = None) -> dict[str, Any]:
        assert self._http is not None, "use HttpTransport in `async with`"
        keyed = bool(headers and "Idempotency-Key" in headers)
        try:
            answer = await self._http.request(method, path, json=json, params=params,
                                              headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
            if self.target.node_dir is not None:
                raise UsageError(no_node_line(self.target.node_dir, self.target)) from None
            raise Failure("unavailable", f"cannot reach {self.url}: {_reason(exc)}") from None
        except httpx.TimeoutException:
            raise Failure("unavailable", f"no answer from {self.url} within "
                          f"{self.timeout:g}s" + _maybe_decided(write, keyed)) from None
        except httpx.HTTPError as exc:  # the connection broke, not HTTP, ...
            raise Failure("unavailable", f"{self.url}: {_reason(exc)}"
                          + _maybe_decided(write, keyed)) from None
        return self._answer(answer)

    def _answer(self, answer: httpx.Response) -> dict[str, Any]:
        status = answer.status_code
        try:
            body = answer.json()
        except ValueError:
            body = None
        if 200 <= status < 300:
            if not isinstance(body, dict):
                raise Failure("internal", f"{self.url} answered {status} without a JSON "
                              f"object")
            return body
        if isinstance(body, dict) and isinstance(body.get("error"), str) and \
                isinstance(body.get("message"), str):
            word, message = body["error"], body["message"]
            field = body.get("field") if isinstance(body.get("field"), str) else None
        else:  # not chronolog's answer (a proxy, another server)
            word = "unavailable" if status == 503 else _word(status)
            message = f"{self.url} answered {status} {_phrase(status)}".rstrip()
            field = None
            body = {"error": word, "field": None, "message": message}
        if status == 401:
            message += (f": the token (from {self.target.token_from}) is wrong for "
                        f"{self.url}; pass the right one with --token TOKEN (or {ENV_TOKEN})"
                        if self.target.token else
                        f": no token given; pass --token TOKEN (or set {ENV_TOKEN})")
        raise Failure(word, message, field, body=body)


def _maybe_decided(write: bool, keyed: bool) -> str:
    if not write:
        return ""
    again = " (or retry with the same --idempotency-key)" if keyed else ""
    return f"; the command may still be decided: read the resource{again} before retrying"


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _word(status: int) -> str:
    return _phrase(status).lower().replace(" ", "_").replace("-", "_") or str(status)
