"""REST admin API routes (Conductor v2 subset): applications and executors, plus the token and audit routers.

Every operation documents its problem responses (``api.problems``); app changes are audited with the
caller's key as subject and the request's source IP.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Body, Request, Response
from fastapi.concurrency import run_in_threadpool
from temporalio.service import RPCError, RPCStatusCode

from api.deps import (
    AppName,
    AppPrincipal,
    GatewayDep,
    GivenKey,
    OrgName,
    OrgPrincipal,
    StoreDep,
    authorized_app,
    source_ip,
)
from api.problems import responses
from api.routes import audit as api_audit
from api.routes import tokens as api_tokens
from api.schemas import Application, Executor, PatchAppInputBody, PutAppInputBody
from core.errors import TemporalUnavailableError
from core.store import subject_of
from gateway import Gateway
from workflows.contracts.common import lifecycle_workflow_id
from workflows.contracts.lifecycle import RemovedSignal

log = logging.getLogger("relay.gateway")

# deleteApp: how hard to try to tell each lifecycle workflow, and how long to let them end before closing
# sockets (a socket closed first reconnects at once, and its ``connected`` would race the removal).
SIGNAL_ATTEMPTS = 3
SIGNAL_BACKOFF = timedelta(milliseconds=200)
REMOVAL_WAIT = timedelta(seconds=3)

router = APIRouter(prefix="/v2/orgs/{orgName}")
router.include_router(api_tokens.router)
router.include_router(api_audit.router)

APP_ERRORS = responses(401, 403, 404, 422)


@router.get("/apps", operation_id="listApps", summary="List applications", tags=["Applications"],
            responses=responses(401, 403, 404, 422))
async def list_apps(orgName: OrgName, p: OrgPrincipal, store: StoreDep) -> list[Application]:
    """The org's applications, by name; an app-restricted key sees only its own."""
    rows = await run_in_threadpool(store.list_apps, orgName, p.apps)
    return [Application.of(app, available=e.available, language=e.language) for app, e in rows]


@router.get("/apps/{appName}", operation_id="getApp", summary="Get application", tags=["Applications"],
            responses=APP_ERRORS)
async def get_app(orgName: OrgName, appName: AppName, credentials: GivenKey, store: StoreDep) -> Application:
    access = await authorized_app(store, orgName, appName, credentials, with_executors=True)
    executors = access.executors
    if executors is None:  # read whenever asked for (Store.authorize_app): a bug, not the client's mistake
        raise RuntimeError("the app's executors were asked for and not read")
    return Application.of(access.app, available=executors.available, language=executors.language)


@router.put("/apps/{appName}", operation_id="registerApp", summary="Register application", status_code=204,
            tags=["Applications"], responses=responses(401, 403, 404, 422))
async def register_app(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep, request: Request,
                       body: Annotated[PutAppInputBody, Body(default_factory=PutAppInputBody)]) -> Response:
    """Registers the app with default settings; registering it again changes nothing but ``privateMode``, when
    given."""
    private_mode = body.privateMode if "privateMode" in body.model_fields_set else None

    def register() -> None:
        app, created = store.ensure_app(orgName, appName, subject=subject_of(p), source_ip=source_ip(request),
                                        private_mode=private_mode)
        if not created and private_mode is not None and private_mode != app.private_mode:
            store.update_app(orgName, appName, {"private_mode": private_mode}, subject=subject_of(p),
                             source_ip=source_ip(request))

    await run_in_threadpool(register)
    return Response(status_code=204)


@router.patch("/apps/{appName}", operation_id="updateApp", summary="Update application", status_code=204,
              tags=["Applications"], responses=APP_ERRORS)
async def update_app(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep, request: Request,
                     body: PatchAppInputBody) -> Response:
    """A changed ``executorTimeoutSecs`` applies to every grace period that starts afterwards. Relay extension:
    an explicit ``null`` clears ``gcTimeThresholdMs``, ``gcRowsThreshold`` or ``globalTimeoutMs``."""
    await run_in_threadpool(store.update_app, orgName, appName, body.changes(), subject=subject_of(p),
                            source_ip=source_ip(request))
    return Response(status_code=204)


@router.delete("/apps/{appName}", operation_id="deleteApp", summary="Delete application", status_code=204,
               tags=["Applications"], responses=responses(401, 403, 404, 422, 503))
async def delete_app(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep, gateway: GatewayDep,
                     request: Request) -> Response:
    """Ends the lifecycle of every executor of the app — HEALTHY, DISCONNECTED and DEAD alike, without
    recovery: pending workflows of DISCONNECTED and DEAD executors are not re-enqueued — removes their records,
    closes the sockets of the connected ones (close code 1008) and deletes the app. 503, app kept, when Temporal
    cannot be reached."""
    def registry() -> list[str]:
        store.get_app(orgName, appName)  # 404 for an unknown app
        return [e.executor_id for e in store.list_executors(orgName, appName)]

    # Those on record, and those connected here whose ``connected`` is not recorded yet.
    ids = sorted(set(await run_in_threadpool(registry)) | gateway.connected_in(orgName, appName))
    running = dict(zip(ids, await asyncio.gather(*(_signal_removed(gateway, orgName, appName, i) for i in ids)),
                       strict=True))
    await _await_removed(gateway, orgName, appName, [i for i, ok in running.items() if ok])
    await gateway.close_app_sockets(orgName, appName)
    # Last, so that other gateways' watchers close their sockets only once the lifecycles have ended.
    await run_in_threadpool(lambda: store.delete_app(
        orgName, appName, subject=subject_of(p), source_ip=source_ip(request), details={"executors": ids},
        orphans=[i for i, ok in running.items() if not ok]))
    return Response(status_code=204)


async def _signal_removed(gateway: Gateway, org: str, app: str, executor_id: str) -> bool:
    """Signal ``removed``; False when the workflow no longer runs. 503 when Temporal stays unreachable."""
    signal = RemovedSignal(signal_id=str(uuid.uuid4()), reason="app deleted")
    for attempt in range(1, SIGNAL_ATTEMPTS + 1):
        try:
            await gateway.signal_removed(org, app, executor_id, signal)
            return True
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            log.warning("signal removed to %s failed (attempt %d): %s", lifecycle_workflow_id(org, app, executor_id),
                        attempt, err.message)
        await asyncio.sleep(SIGNAL_BACKOFF.total_seconds() * attempt)
    raise TemporalUnavailableError("Temporal could not be reached to end the executors' lifecycles; the app was "
                                   "not deleted: retry")


async def _await_removed(gateway: Gateway, org: str, app: str, executor_ids: list[str]) -> None:
    """Give the signalled workflows up to ``REMOVAL_WAIT`` to end, so no reconnect races their removal."""
    if not executor_ids:
        return
    tasks = [asyncio.ensure_future(gateway.lifecycle_ended(org, app, i)) for i in executor_ids]
    _, pending = await asyncio.wait(tasks, timeout=REMOVAL_WAIT.total_seconds())
    for task in pending:
        task.cancel()
    if pending:
        log.warning("%d lifecycle workflows still running %s after removal", len(pending), REMOVAL_WAIT)


@router.get("/apps/{appName}/executors", operation_id="listExecutors", summary="List executors",
            tags=["Executors"], responses=APP_ERRORS)
async def list_executors(orgName: OrgName, appName: AppName, _p: AppPrincipal,
                         store: StoreDep) -> list[Executor]:
    def load() -> list[Executor]:
        app = store.get_app(orgName, appName)
        rows = store.list_executors(orgName, appName)
        gateways = store.gateway_identities({row.gateway_queue for row in rows if row.gateway_queue})
        return [Executor.of(row, app_id=app.id, gateway=gateways.get(row.gateway_queue or ""))
                for row in rows]

    return await run_in_threadpool(load)
