"""The dashboard's sessions, kept on the server (``chronolog.api.dashboard.session`` says
how the dashboard uses them)."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from chronolog.tenants import Tenant, Tenants

__all__ = ["MAX_SESSIONS", "Session", "SessionStore"]

MAX_SESSIONS = 10_000  # the oldest session goes first past this many


@dataclass
class Session:
    sid: str
    tenant: str
    token: str  # the tenant token it was made with (server-side only)
    csrf: str
    created: float
    seen: float


class SessionStore:
    """The dashboard's sessions, in memory: ``create`` at login, ``get`` at each request
    (None once expired, idle too long, revoked, or its token no longer the tenant's),
    ``revoke`` at logout."""

    def __init__(self, max_age: float = 12 * 3600, idle: float = 30 * 60,
                 clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = MAX_SESSIONS) -> None:
        self.max_age = max_age
        self.idle = idle
        self.clock = clock
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, tenant: Tenant, token: str) -> Session:
        now = self.clock()
        s = Session(secrets.token_urlsafe(32), tenant.name, token,
                    secrets.token_urlsafe(32), now, now)
        self._sessions[s.sid] = s
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return s

    def get(self, sid: str | None, tenants: Tenants) -> Session | None:
        if not sid or len(sid) > 200:
            return None
        s = self._sessions.get(sid)
        if s is None:
            return None
        now = self.clock()
        tenant = tenants.by_token(s.token)
        if (now - s.created > self.max_age or now - s.seen > self.idle
                or tenant is None or tenant.name != s.tenant):
            self.revoke(sid)
            return None
        s.seen = now
        return s

    def revoke(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)
