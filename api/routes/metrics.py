"""``GET /metrics``: the metrics of the metrics listener (``core.metrics``, RELAY_METRICS_PORT) under the same
names, scoped like every other read: only the key's org, and of an app-restricted key only its apps (executors
per status, recoveries, ...), with the process's own numbers (sockets held by this gateway, handshakes, CPU).

Bearer-authenticated like the REST API (Prometheus sends ``authorization: bearer``). Every org's numbers are on
the metrics listener, which takes no key."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from api.deps import Credentials, StoreDep
from core import metrics as relay_metrics
from core.errors import AuthError

router = APIRouter(tags=["Health"])


@router.get("/metrics", operation_id="metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
            include_in_schema=False)
async def metrics(credentials: Credentials, store: StoreDep) -> PlainTextResponse:
    if credentials is None:
        raise AuthError("missing bearer token")
    principal = await run_in_threadpool(store.authenticate, credentials.credentials)
    text = await run_in_threadpool(relay_metrics.scoped_exposition, store.engine, org=principal.org,
                                   allows=principal.allows)
    return PlainTextResponse(text, media_type=CONTENT_TYPE_PLAIN_0_0_4)
