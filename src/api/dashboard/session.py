"""The dashboard's session and its CSRF protection.

Logging in creates a session on the server (``SessionStore``): a random ID
(``secrets.token_urlsafe(32)``) that is all the cookie ``chronolog_session`` holds
(``HttpOnly``, ``SameSite=Strict``, ``Path=/``; ``Secure`` when the request came over HTTPS
or ``CHRONOLOG_SECURE_COOKIES=1`` says the node is behind a TLS proxy). The tenant token
typed at login stays on the server: the cookie is not a credential of the JSON API (a
Bearer token equal to it is an unknown token), and a copied cookie dies with its session.

A session ends at the first of: its absolute lifetime (``CHRONOLOG_SESSION_MAX_AGE``,
default 12 h), an idle gap longer than ``CHRONOLOG_SESSION_IDLE`` (default 30 min), logout
(revoked on the server, whatever the browser keeps), or its token no longer naming its
tenant (the tenants file changed: checked at every request). Sessions live in the API
process's memory: a restart logs everyone out, and several API processes behind a load
balancer need sticky sessions.

Every action (a POST) carries a CSRF token in the form field ``csrf``:

* logged in, the token is a random value made with the session and kept with it: only a
  page rendered for the session holds it, a new login (a new session) gets a new one, and
  it dies with the session;
* the login form itself is a double submit: ``GET /ui/login`` sets a random
  ``chronolog_login`` cookie (``HttpOnly``, ``SameSite=Strict``) and puts the same value in
  the form.

A POST whose token is missing or wrong, or whose ``Origin`` header names another origin, is
refused with 403 before anything is sent to the log.
"""

from __future__ import annotations

import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from chronolog.api.sessions import Session, SessionStore
from chronolog.tenants import Tenant, Tenants

__all__ = ["LOGIN_COOKIE", "SESSION_COOKIE", "Session", "SessionStore", "clear_session",
           "csrf_ok", "login_nonce", "login_ok", "origin_ok", "session_of", "set_cookie",
           "set_session"]

SESSION_COOKIE = "chronolog_session"
LOGIN_COOKIE = "chronolog_login"
def _store(request: Request) -> SessionStore:
    store: SessionStore = request.app.state.chronolog.sessions
    return store


def session_of(request: Request) -> tuple[Session, Tenant] | None:
    """The request's live session and its tenant (None: not logged in)."""
    tenants: Tenants = request.app.state.chronolog.tenants
    s = _store(request).get(request.cookies.get(SESSION_COOKIE), tenants)
    if s is None:
        return None
    tenant = tenants.by_token(s.token)
    return (s, tenant) if tenant is not None else None


def csrf_ok(request: Request, given: str | None) -> bool:
    """Whether ``given`` is the CSRF token of the request's session."""
    got = session_of(request)
    if got is None or not given:
        return False
    return hmac.compare_digest(got[0].csrf.encode(), given.encode())


def login_nonce() -> str:
    return secrets.token_urlsafe(24)


def login_ok(request: Request, given: str | None) -> bool:
    """Whether the login form's token matches its cookie (double submit)."""
    cookie = request.cookies.get(LOGIN_COOKIE) or ""
    return bool(cookie and given) and hmac.compare_digest(cookie, given or "")


def origin_ok(request: Request) -> bool:
    """No ``Origin`` header, or one naming this server (scheme, host and port)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"{request.url.scheme}://{host}",)


def set_cookie(response: Response, request: Request, name: str, value: str,
               max_age: int | None = None) -> None:
    secure = request.url.scheme == "https" or bool(
        getattr(request.app.state.chronolog, "secure_cookies", False))
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True,
                        samesite="strict", secure=secure)


def set_session(response: Response, request: Request, tenant: Tenant, token: str) -> Session:
    """A new session for ``tenant`` (the request's old one, if any, is revoked: a login
    always gets a new ID and a new CSRF token)."""
    store = _store(request)
    store.revoke(request.cookies.get(SESSION_COOKIE))
    s = store.create(tenant, token)
    set_cookie(response, request, SESSION_COOKIE, s.sid)
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return s


def clear_session(response: Response, request: Request) -> None:
    """Log out: the session is revoked on the server, the browser's cookie deleted."""
    _store(request).revoke(request.cookies.get(SESSION_COOKIE))
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
