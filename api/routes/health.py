"""Health: ``/healthz`` (liveness: the process serves) and ``/readyz`` (Temporal and the database reachable)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from fastapi import APIRouter

from api.deps import GatewayDep
from api.problems import responses
from api.schemas import EXTENSION, Health
from core.errors import ServiceUnavailableError
from core.store import outage

router = APIRouter(tags=["Health"])


@router.get("/healthz", operation_id="healthz", summary="Health check", responses=responses(),
                   openapi_extra=EXTENSION)
async def healthz() -> Health:
    """Liveness: the process serves. Readiness (Temporal, the database) is ``/readyz``."""
    return Health()


# A database that does not answer a SELECT 1 within this long counts as unreachable for readiness.
READY_DB_TIMEOUT = timedelta(seconds=2)


@router.get("/readyz", operation_id="readyz", summary="Readiness check", responses=responses(503),
                   openapi_extra=EXTENSION)
async def readyz(gateway: GatewayDep) -> Health:
    """Ready when this gateway is in contact with Temporal (not fenced) and its database answers; otherwise 503
    with the reason. A load balancer should send executors only to ready gateways."""
    reasons = []
    contact = gateway.contact_state
    if not contact.in_contact:
        fenced = "; fenced: executor sockets closed and refused" if contact.fenced else ""
        reasons.append(f"Temporal unreachable for {contact.away_for().total_seconds():.0f} s "
                       f"({contact.reason}){fenced}")
    elif gateway.rejoining:
        reasons.append("rejoining: executor sockets refused until this gateway is watched again")
    try:
        await asyncio.wait_for(asyncio.to_thread(gateway.store.ping), READY_DB_TIMEOUT.total_seconds())
    except Exception as err:  # any failure to answer is "not ready", with the driver's one-line reason
        reasons.append(f"database unreachable ({outage(err) if not isinstance(err, TimeoutError) else 'no answer'})")
    if reasons:
        raise ServiceUnavailableError("; ".join(reasons))
    return Health()
