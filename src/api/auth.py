"""Who calls: ``Authorization: Bearer <token>`` -> a tenant (``Tenants.by_token``), or an
operator token (``Tenants.is_operator``). A missing or unknown token is 401; an unknown one
also counts against its source address (``chronolog.api.throttle``: logged, and 429 once a
source has failed too often). Every read and
write of a tenant route is scoped to its tenant: another tenant's schedule or run is 404,
exactly like a missing one.
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from chronolog.api.context import ApiContext, Context
from chronolog.api.errors import ApiError
from chronolog.api.throttle import source_of
from chronolog.tenants import Tenant

__all__ = ["Bearer", "TenantDep", "Viewer", "bearer", "require_operator", "tenant_of",
           "viewer"]

bearer = HTTPBearer(auto_error=False, description="a tenant token")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "Authorization", headers={"WWW-Authenticate": "Bearer"})


def _unknown(ctx: ApiContext, request: Request) -> ApiError:
    """A token nobody holds: counted against its source, then 401."""
    ctx.auth_failures.failed(request)
    return _unauthorized("unknown token")


def _throttle(ctx: ApiContext, request: Request) -> None:
    """429 before any token is looked at when the source failed too often."""
    wait = ctx.auth_failures.retry_after(source_of(request))
    if wait is not None:
        raise ApiError(429, f"too many failed authentications from this address; retry in "
                       f"{wait}s", "Authorization", headers={"Retry-After": str(wait)})


def _tenant(ctx: ApiContext, request: Request,
            creds: HTTPAuthorizationCredentials | None) -> Tenant:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise _unauthorized("missing bearer token")
    _throttle(ctx, request)
    tenant = ctx.tenants.by_token(creds.credentials)
    if tenant is None:
        raise _unknown(ctx, request)
    return tenant


async def tenant_of(request: Request, ctx: Context, creds: Bearer) -> Tenant:
    """The tenant of the bearer token (401 without one)."""
    return _tenant(ctx, request, creds)


TenantDep = Annotated[Tenant, Depends(tenant_of)]


async def viewer(request: Request, ctx: Context, creds: Bearer) -> Tenant | None:
    """An operator (None: sees every job type) or a tenant (sees the job types it may
    run); anyone else is 401."""
    tenants = ctx.tenants
    token = creds.credentials if creds is not None and creds.scheme.lower() == "bearer" \
        else ""
    if token:
        _throttle(ctx, request)
    if token and tenants.operator_tokens is not None and tenants.is_operator(token):
        return None
    return _tenant(ctx, request, creds)


Viewer = Annotated[Tenant | None, Depends(viewer)]


def require_operator(ctx: ApiContext, request: Request,
                     creds: HTTPAuthorizationCredentials | None) -> None:
    """With a tenants file, only an operator token passes (a tenant's is 403); without
    one (a single default tenant) anyone does."""
    tenants = ctx.tenants
    if tenants.operator_tokens is None:
        return
    token = creds.credentials if creds is not None else ""
    if not token:
        raise _unauthorized("missing bearer token (an operator token)")
    _throttle(ctx, request)
    if not tenants.is_operator(token):
        if tenants.by_token(token) is not None:
            raise ApiError(403, "a tenant token cannot read /metrics: use an operator token",
                           "Authorization")
        raise _unknown(ctx, request)
