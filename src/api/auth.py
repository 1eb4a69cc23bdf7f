"""Who calls: ``Authorization: Bearer <token>`` -> a tenant (``Tenants.by_token``), or an
operator token (``Tenants.is_operator``). A missing or unknown token is 401. Every read and
write of a tenant route is scoped to its tenant: another tenant's schedule or run is 404,
exactly like a missing one.
"""

# no `from __future__ import annotations`: FastAPI resolves the dependency aliases

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from chronolog.api.context import Context
from chronolog.api.errors import ApiError
from chronolog.tenants import Tenant, Tenants

__all__ = ["Bearer", "TenantDep", "Viewer", "bearer", "require_operator", "tenant_of",
           "viewer"]

bearer = HTTPBearer(auto_error=False, description="a tenant token")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "Authorization", headers={"WWW-Authenticate": "Bearer"})


def _tenant(tenants: Tenants, creds: HTTPAuthorizationCredentials | None) -> Tenant:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise _unauthorized("missing bearer token")
    tenant = tenants.by_token(creds.credentials)
    if tenant is None:
        raise _unauthorized("unknown token")
    return tenant


async def tenant_of(ctx: Context, creds: Bearer) -> Tenant:
    """The tenant of the bearer token (401 without one)."""
    return _tenant(ctx.tenants, creds)


TenantDep = Annotated[Tenant, Depends(tenant_of)]


async def viewer(ctx: Context, creds: Bearer) -> Tenant | None:
    """An operator (None: sees every job type) or a tenant (sees the job types it may
    run); anyone else is 401."""
    tenants = ctx.tenants
    token = creds.credentials if creds is not None and creds.scheme.lower() == "bearer" \
        else ""
    if token and tenants.operator_tokens is not None and tenants.is_operator(token):
        return None
    return _tenant(tenants, creds)


Viewer = Annotated[Tenant | None, Depends(viewer)]


def require_operator(tenants: Tenants, creds: HTTPAuthorizationCredentials | None) -> None:
    """With a tenants file, only an operator token passes (a tenant's is 403); without
    one (a single default tenant) anyone does."""
    if tenants.operator_tokens is None:
        return
    token = creds.credentials if creds is not None else ""
    if not token:
        raise _unauthorized("missing bearer token (an operator token)")
    if not tenants.is_operator(token):
        if tenants.by_token(token) is not None:
            raise ApiError(403, "a tenant token cannot read /metrics: use an operator token",
                           "Authorization")
        raise _unauthorized("unknown token")
