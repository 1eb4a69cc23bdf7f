"""The dashboard's session and its CSRF protection.

Logging in stores the tenant's token in the session cookie ``chronolog_session``
(``HttpOnly``, ``SameSite=Strict``, ``Path=/``; ``Secure`` when the request came over
HTTPS): every page and action is then the tenant's, exactly as a request with
``Authorization: Bearer <token>`` is (``Tenants.by_token``). Nothing is kept on the server,
so a session works on every API process that knows the tenants, and a restart keeps it.

Every action (a POST) carries a CSRF token in the form field ``csrf``:

* logged in, the token is ``HMAC-SHA256(tenant token, "chronolog dashboard csrf")``: only a
  page rendered for the session holds it, and another site can neither read it nor forge it;
* the login form itself is a double submit: ``GET /ui/login`` sets a random
  ``chronolog_login`` cookie (``HttpOnly``, ``SameSite=Strict``) and puts the same value in
  the form.

A POST whose token is missing or wrong, or whose ``Origin`` header names another origin, is
refused with 403 before anything is sent to the log.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from chronolog.tenants import Tenant, Tenants

__all__ = ["LOGIN_COOKIE", "SESSION_COOKIE", "clear_session", "csrf_for", "csrf_ok",
           "login_nonce", "login_ok", "origin_ok", "session_tenant", "set_cookie",
           "set_session", "token_of"]

SESSION_COOKIE = "chronolog_session"
LOGIN_COOKIE = "chronolog_login"
_CSRF_MESSAGE = b"chronolog dashboard csrf"


def _encode(token: str) -> str:
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def token_of(request: Request) -> str | None:
    """The tenant token of the request's session cookie (None: none, or not ours)."""
    raw = request.cookies.get(SESSION_COOKIE)
    if not raw or len(raw) > 2000:
        return None
    try:
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def session_tenant(request: Request, tenants: Tenants) -> Tenant | None:
    """The tenant whose token the session cookie holds (None: not logged in)."""
    token = token_of(request)
    return tenants.by_token(token) if token else None


def csrf_for(token: str) -> str:
    """The CSRF token of a session holding ``token``."""
    return hmac.new(token.encode(), _CSRF_MESSAGE, hashlib.sha256).hexdigest()


def csrf_ok(request: Request, given: str | None) -> bool:
    """Whether ``given`` is the CSRF token of the request's session."""
    token = token_of(request)
    if not token or not given:
        return False
    return hmac.compare_digest(csrf_for(token), given)


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
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")


def set_session(response: Response, request: Request, token: str) -> None:
    set_cookie(response, request, SESSION_COOKIE, _encode(token))
    response.delete_cookie(LOGIN_COOKIE, path="/")


def clear_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
