"""``GET /metrics``: Prometheus text for what an operator alerts on — executors per status (a DEAD executor is a
recovery in progress or blocked; every status of every app of the org, zero included, as ``core.metrics`` counts
them), sockets held by this gateway, and refused handshakes not reported.

Bearer-authenticated like the REST API (Prometheus sends ``authorization: bearer``), and scoped to the key's
org: org isolation holds here too. Every org's numbers, and the rest of Relay's metrics, are on the metrics
listener (``core.metrics``, RELAY_METRICS_PORT), which takes no key."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from api.deps import Credentials, GatewayDep, StoreDep
from core import metrics as relay_metrics
from core.errors import AuthError

router = APIRouter(tags=["Health"])


@router.get("/metrics", operation_id="metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
            include_in_schema=False)
async def metrics(credentials: Credentials, store: StoreDep, gateway: GatewayDep) -> PlainTextResponse:
    if credentials is None:
        raise AuthError("missing bearer token")
    principal = await run_in_threadpool(store.authenticate, credentials.credentials)
    counts = await run_in_threadpool(relay_metrics.executor_counts, store.engine, principal.org)
    lines = ["# HELP relay_executors Executors in the registry, by status.", "# TYPE relay_executors gauge"]
    lines += [f'relay_executors{{org="{org}",app="{app}",status="{status}"}} {n}'
              for (org, app, status), n in sorted(counts.items())]
    lines += ["# HELP relay_gateway_connections Executor sockets held by this gateway process.",
              "# TYPE relay_gateway_connections gauge", f"relay_gateway_connections {len(gateway.hub)}",
              "# HELP relay_refusals_suppressed_total Refused handshakes not logged (rate limit).",
              "# TYPE relay_refusals_suppressed_total counter",
              f"relay_refusals_suppressed_total {gateway.admission.suppressed}"]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")
