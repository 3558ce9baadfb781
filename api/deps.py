"""What every REST route shares: path parameters with the upstream patterns, the Bearer scheme, and the
dependencies that turn the caller's key into a ``Principal`` checked against the org and app in the path."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.schemas import PRINTABLE_PATTERN, TOKEN_NAME_MAX, extended
from core.errors import AuthError, ForbiddenError
from core.names import APP_PATTERN, ORG_PATTERN
from core.store import AppAccess, Principal, Store
from gateway import Gateway

OrgName = Annotated[str, Path(min_length=3, max_length=30, pattern=ORG_PATTERN)]
AppName = Annotated[str, Path(min_length=3, max_length=30, pattern=APP_PATTERN)]
TokenName = Annotated[str, Path(
    min_length=1, max_length=TOKEN_NAME_MAX, pattern=PRINTABLE_PATTERN,
    json_schema_extra=extended(f"1-{TOKEN_NAME_MAX} characters, no control characters"))]

bearer = HTTPBearer(auto_error=False, scheme_name="ApiKeyAuth",
                    description='Relay API key (`relay keys create`, or POST /v2/orgs/{orgName}/tokens/{tokenName}), '
                                'prefixed "dbos_".')
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def given_key(credentials: Credentials) -> HTTPAuthorizationCredentials:
    """401 for a call without a key, before the path is validated (as ``org_principal`` does for an app path)."""
    if credentials is None:
        raise AuthError("missing bearer token")
    return credentials


GivenKey = Annotated[HTTPAuthorizationCredentials, Depends(given_key)]


# ``async``, though they do no I/O: FastAPI runs a plain ``def`` dependency on the thread pool, a hop per call.
async def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


async def get_gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


StoreDep = Annotated[Store, Depends(get_store)]
GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def source_ip(request: Request) -> str:
    return request.client.host if request.client else ""


async def org_principal(store: StoreDep, orgName: OrgName, credentials: Credentials) -> Principal:
    """401 missing or unknown key, 404 unknown org, 403 a key of another org."""
    if credentials is None:
        raise AuthError("missing bearer token")
    return await run_in_threadpool(store.authorize_org, credentials.credentials, orgName)


OrgPrincipal = Annotated[Principal, Depends(org_principal)]


async def admin_principal(p: OrgPrincipal) -> Principal:
    """Token and audit operations need an org-wide key: an app-restricted one could mint itself a wider key."""
    if p.apps is not None:
        raise ForbiddenError("this key is restricted to some apps; this operation needs an org-wide key")
    return p


AdminPrincipal = Annotated[Principal, Depends(admin_principal)]


async def app_principal(p: OrgPrincipal, appName: AppName) -> Principal:
    """As ``org_principal``, and 403 for a key not allowed for the app (before any 404 for it, so a restricted
    key cannot probe which apps exist)."""
    p.require(appName)
    return p


AppPrincipal = Annotated[Principal, Depends(app_principal)]


async def authorized_app(store: Store, org: str, app: str, credentials: HTTPAuthorizationCredentials | None, *,
                         with_candidates: bool = False, with_executors: bool = False) -> AppAccess:
    """``app_principal`` and the app's row (404 when it is not registered), with what else the route reads of the
    app (``Store.authorize_app``), in one thread-pool hop."""
    if credentials is None:
        raise AuthError("missing bearer token")
    return await run_in_threadpool(store.authorize_app, credentials.credentials, org, app,
                                   with_candidates=with_candidates, with_executors=with_executors)


async def app_access(request: Request, orgName: OrgName, appName: AppName, credentials: Credentials) -> AppAccess:
    """``authorized_app`` with the app's management candidates: for the workflow-management routes, where a second
    hop would be a tenth of the latency."""
    return await authorized_app(request.app.state.store, orgName, appName, credentials, with_candidates=True)


AppAccessDep = Annotated[AppAccess, Depends(app_access)]
