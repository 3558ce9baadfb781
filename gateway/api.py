"""REST admin API routes (Conductor v2 subset): applications and executors, Bearer-authenticated."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.errors import AuthError, ForbiddenError
from gateway.models import ExecutorStatus
from gateway.schemas import (
    APP_PATTERN,
    ORG_PATTERN,
    Application,
    Executor,
    Health,
    PatchAppInputBody,
    PutAppInputBody,
)
from gateway.store import Principal, Store

OrgName = Annotated[str, Path(min_length=3, max_length=30, pattern=ORG_PATTERN)]
AppName = Annotated[str, Path(min_length=3, max_length=30, pattern=APP_PATTERN)]

bearer = HTTPBearer(auto_error=False)


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


StoreDep = Annotated[Store, Depends(get_store)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def app_principal(store: StoreDep, orgName: OrgName, appName: AppName, credentials: Credentials) -> Principal:
    """The caller's key, checked against the org and app in the path (401 missing/unknown, 403 not allowed)."""
    if credentials is None:
        raise AuthError("missing bearer token")
    p = await run_in_threadpool(store.authorize, credentials.credentials, orgName)
    if not p.allows(appName):
        raise ForbiddenError(f"this key is not allowed for app {appName!r}")
    return p


AppPrincipal = Annotated[Principal, Depends(app_principal)]

router = APIRouter(prefix="/v2/orgs/{orgName}")
health_router = APIRouter(tags=["Health"])


def _public(store: Store, org: str, name: str) -> Application:
    app = store.get_app(org, name)
    executors = store.list_executors(org, name)
    available = any(e.status == ExecutorStatus.HEALTHY for e in executors)
    language = next((e.language for e in reversed(executors) if e.language), None)
    return Application.of(app, available=available, language=language)


def _source_ip(request: Request) -> str:
    return request.client.host if request.client else ""


@router.get("/apps/{appName}", operation_id="getApp", summary="Get application", tags=["Applications"])
async def get_app(orgName: OrgName, appName: AppName, _p: AppPrincipal, store: StoreDep) -> Application:
    return await run_in_threadpool(_public, store, orgName, appName)


@router.put("/apps/{appName}", operation_id="registerApp", summary="Register application", status_code=204,
            tags=["Applications"])
async def register_app(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep, request: Request,
                       body: Annotated[PutAppInputBody | None, Body()] = None) -> Response:
    await run_in_threadpool(store.ensure_app, orgName, appName, subject=f"key:{p.key_name}",
                            source_ip=_source_ip(request), private_mode=body.privateMode if body else None)
    return Response(status_code=204)


@router.patch("/apps/{appName}", operation_id="updateApp", summary="Update application", status_code=204,
              tags=["Applications"])
async def update_app(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep, request: Request,
                     body: PatchAppInputBody) -> Response:
    """A changed ``executorTimeoutSecs`` applies to every grace period that starts afterwards."""
    await run_in_threadpool(store.update_app, orgName, appName, body.changes(), subject=f"key:{p.key_name}",
                            source_ip=_source_ip(request))
    return Response(status_code=204)


@router.get("/apps/{appName}/executors", operation_id="listExecutors", summary="List executors",
            tags=["Executors"])
async def list_executors(orgName: OrgName, appName: AppName, _p: AppPrincipal,
                         store: StoreDep) -> list[Executor]:
    def load() -> list[Executor]:
        app = store.get_app(orgName, appName)
        return [Executor.of(row, app_id=app.id) for row in store.list_executors(orgName, appName)]

    return await run_in_threadpool(load)


@health_router.get("/healthz", operation_id="healthz", summary="Health check")
async def healthz() -> Health:
    return Health()
