"""REST routes for drain and pause (Relay extensions): an executor drained (never chosen to recover others or to
carry an operator's request), an app's recoveries paused for a maintenance window, and the app's recovery gate
(pause, storm breaker, held recoveries). Every change is audited with the caller's key as subject.

Durations are seconds here (``expiresInSecs``) and ``timedelta`` from the schema on.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import AppName, AppPrincipal, GatewayDep, OrgName, StoreDep, source_ip
from api.problems import responses
from api.schemas import (
    EXTENSION,
    PRINTABLE_PATTERN,
    Drain,
    DrainInputBody,
    PauseInputBody,
    RecoveryBlocked,
    RecoveryBreaker,
    RecoveryPause,
    RecoveryStatus,
    RecoveryWaiting,
)
from core import units
from core.errors import NotFoundError
from core.models import ExecutorDrain
from core.store import Store, subject_of
from core.units import utcnow
from gateway import Gateway
from workflows.contracts.lifecycle import PeerAvailableSignal

log = logging.getLogger("relay.gateway")

router = APIRouter(prefix="/v2/orgs/{orgName}/apps/{appName}", tags=["Recovery"])

EXECUTOR_ID_MAX = 1000
ExecutorId = Annotated[str, Path(min_length=1, max_length=EXECUTOR_ID_MAX, pattern=PRINTABLE_PATTERN,
                                 description="an executor's id, as it reported it in executor_info")]
ERRORS = responses(401, 403, 404, 422)


@router.put("/executors/{executorId}/drain", operation_id="drainExecutor", summary="Drain an executor",
            responses=ERRORS, openapi_extra=EXTENSION)
async def drain_executor(orgName: OrgName, appName: AppName, executorId: ExecutorId, p: AppPrincipal,
                         store: StoreDep, request: Request, body: DrainInputBody) -> Drain:
    """Relay extension. Until it expires (or is deleted), the executor is never chosen to recover a dead peer or
    to carry an operator's request; it stays connected, and its own lifecycle is unchanged. Draining it again
    replaces the drain. 404 for an executor not in the registry."""
    now = utcnow()
    row = await run_in_threadpool(
        store.set_drain, org=orgName, app=appName, executor_id=executorId, until=now + body.expires_in,
        reason=body.reason, subject=subject_of(p), source_ip=source_ip(request),
        details=units.rest_durations({"expiresInSecs": body.expires_in}))
    return Drain.of(row, now=now, key_names={p.key_id: p.key_name})


@router.get("/executors/{executorId}/drain", operation_id="getExecutorDrain", summary="Get an executor's drain",
            responses=ERRORS, openapi_extra=EXTENSION)
async def get_drain(orgName: OrgName, appName: AppName, executorId: ExecutorId, _p: AppPrincipal,
                    store: StoreDep) -> Drain:
    """Relay extension. The drain, expired or not (``active`` says which); 404 when the executor has none."""
    drain = next((d for d in await _drains(store, orgName, appName) if d.executorId == executorId), None)
    if drain is None:
        raise NotFoundError(f"executor {executorId!r} of app {appName!r} is not drained")
    return drain


@router.delete("/executors/{executorId}/drain", operation_id="undrainExecutor", summary="End an executor's drain",
               status_code=204, responses=ERRORS, openapi_extra=EXTENSION)
async def undrain_executor(orgName: OrgName, appName: AppName, executorId: ExecutorId, p: AppPrincipal,
                           store: StoreDep, gateway: GatewayDep, request: Request) -> Response:
    """Relay extension. The executor may be chosen again at once; recoveries waiting for a peer look again."""
    dead = await run_in_threadpool(store.clear_drain, org=orgName, app=appName, executor_id=executorId,
                                   subject=subject_of(p), source_ip=source_ip(request))
    await _wake(gateway, orgName, appName, dead, executorId)
    return Response(status_code=204)


@router.get("/drains", operation_id="listDrains", summary="List drains", responses=ERRORS,
            openapi_extra=EXTENSION)
async def list_drains(orgName: OrgName, appName: AppName, _p: AppPrincipal, store: StoreDep) -> list[Drain]:
    """Relay extension. The app's drains by executor id, expired ones included (``active: false``)."""
    return await _drains(store, orgName, appName)


async def _drains(store: Store, org: str, app: str) -> list[Drain]:
    """The app's drains, each naming the key that set it (404: no such app)."""
    def read() -> tuple[list[ExecutorDrain], dict[str, str]]:
        rows = store.list_drains(org, app)
        return rows, store.key_names([row.subject for row in rows])

    rows, names = await run_in_threadpool(read)
    now = utcnow()
    return [Drain.of(row, now=now, key_names=names) for row in rows]


@router.put("/recovery-pause", operation_id="pauseRecovery", summary="Pause recoveries", responses=ERRORS,
            openapi_extra=EXTENSION)
async def pause_recovery(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep, request: Request,
                         body: PauseInputBody) -> RecoveryPause:
    """Relay extension. Until it expires (or is deleted), no recovery of the app starts: DEAD executors wait,
    durably, and are then recovered one at a time at the breaker's pace. Executors still die on time, and
    recoveries already under way finish. Pausing again replaces the pause."""
    now = utcnow()
    row = await run_in_threadpool(
        store.set_pause, org=orgName, app=appName, until=now + body.expires_in, reason=body.reason,
        subject=subject_of(p), source_ip=source_ip(request),
        details=units.rest_durations({"expiresInSecs": body.expires_in}))
    return RecoveryPause.of(row, now=now, key_names={p.key_id: p.key_name})


@router.get("/recovery-pause", operation_id="getRecoveryPause", summary="Get the recovery pause", responses=ERRORS,
            openapi_extra=EXTENSION)
async def get_pause(orgName: OrgName, appName: AppName, _p: AppPrincipal, store: StoreDep) -> RecoveryPause:
    """Relay extension. The pause, expired or not (``active`` says which); 404 when none was set."""
    pause, _, _ = await run_in_threadpool(store.recovery_state, orgName, appName)
    if pause is None:
        raise NotFoundError(f"recovery of app {appName!r} is not paused")
    names = await run_in_threadpool(store.key_names, [pause.subject])
    return RecoveryPause.of(pause, now=utcnow(), key_names=names)


@router.delete("/recovery-pause", operation_id="resumeRecovery", summary="Resume recoveries", status_code=204,
               responses=ERRORS, openapi_extra=EXTENSION)
async def resume_recovery(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep,
                          request: Request) -> Response:
    """Relay extension. Lifts the pause: held recoveries go, paced, at their next look (within
    RELAY_RECOVERY_PAUSE_RECHECK_SECS)."""
    await run_in_threadpool(store.clear_pause, org=orgName, app=appName, subject=subject_of(p),
                            source_ip=source_ip(request))
    return Response(status_code=204)


@router.get("/recovery", operation_id="getRecoveryStatus", summary="Get the recovery gate", responses=ERRORS,
            openapi_extra=EXTENSION)
async def recovery_status(orgName: OrgName, appName: AppName, _p: AppPrincipal, store: StoreDep) -> RecoveryStatus:
    """Relay extension. The app's pause, its recovery-storm breaker, the recoveries the gate holds, and those
    blocked for lack of a peer (with the drained executors that could otherwise carry them)."""
    def read() -> tuple[Any, ...]:
        pause, gate, waiting = store.recovery_state(orgName, appName)
        return (pause, gate, waiting, store.blocked_recoveries(orgName, appName),
                store.drained_executors(orgName, appName), store.key_names([pause.subject] if pause else []))

    pause, gate, waiting, blocked, drained, names = await run_in_threadpool(read)
    now = utcnow()
    breaker = RecoveryBreaker(tripped=gate is not None and gate.tripped_at is not None,
                              trippedAt=gate.tripped_at if gate else None, trips=gate.trips if gate else 0,
                              lastSlotAt=gate.last_slot_at if gate else None)
    return RecoveryStatus(
        pause=RecoveryPause.of(pause, now=now, key_names=names) if pause else None, breaker=breaker,
        waiting=[RecoveryWaiting(executorId=t.executor_id, diedAt=t.died_at, slotAt=t.slot_at, reason=t.held)
                 for t in waiting],
        blocked=[RecoveryBlocked(executorId=b.executor_id, appVersion=b.app_version, diedAt=b.died_at,
                                 blockedAt=b.blocked_at, reason=b.reason,
                                 drainedPeers=[i for i, v in drained if v == b.app_version])
                 for b in blocked])


async def _wake(gateway: Gateway, org: str, app: str, dead: list[str], executor_id: str) -> None:
    await gateway.wake_recoveries(org, app, dead, PeerAvailableSignal(executor_id))
