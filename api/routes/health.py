"""Health: ``/healthz`` (liveness: the process serves) and ``/readyz`` (Temporal and the database reachable, and
not shutting down)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import GatewayDep
from api.problems import responses
from api.schemas import EXTENSION, Health
from core.errors import ServiceUnavailableError

router = APIRouter(tags=["Health"])


@router.get("/healthz", operation_id="healthz", summary="Health check", responses=responses(),
                   openapi_extra=EXTENSION)
async def healthz() -> Health:
    """Liveness: the process serves. Readiness (Temporal, the database) is ``/readyz``."""
    return Health()


@router.get("/readyz", operation_id="readyz", summary="Readiness check", responses=responses(503),
                   openapi_extra=EXTENSION)
async def readyz(gateway: GatewayDep) -> Health:
    """Ready when this gateway is in contact with Temporal (not fenced) and its database answers; otherwise 503
    with the reason. A load balancer should send executors only to ready gateways."""
    # From SIGTERM on (``Gateway.step_down``): not ready, at once and whatever else holds, so the load balancer stops
    # sending executors here while the drain keeps their sockets.
    if gateway.draining:
        raise ServiceUnavailableError("shutting down: draining executor sockets; connect to another gateway")
    reasons = []
    contact = gateway.contact_state
    if not contact.in_contact:
        fenced = "; fenced: executor sockets closed and refused" if contact.fenced else ""
        reasons.append(f"Temporal unreachable for {contact.away_for().total_seconds():.0f} s "
                       f"({contact.reason}){fenced}")
    elif gateway.rejoining:
        reasons.append("rejoining: executor sockets refused until this gateway is watched again")
    if (database := await gateway.store.unreachable()) is not None:
        reasons.append(database)
    if reasons:
        raise ServiceUnavailableError("; ".join(reasons))
    return Health()
