"""The gateway's FastAPI app: executor WebSocket, REST API, health, OpenAPI — and, for its lifetime, a Temporal
worker on this process's own task queue for the activities that write to sockets it holds."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from temporalio.client import Client

from api import autoscaling, problems
from api.routes import (
    alerts,
    apps,
    autoscale,
    console,
    docs,
    health,
    metrics,
    queues,
    safety,
    schedules,
    unsupported,
    versions,
    workflows,
)
from core.logs import install_redaction
from core.models import open_engine
from core.settings import Settings
from core.store import Store
from core.temporal import connect, temporal_connection
from gateway import BodyLimit, Gateway

log = logging.getLogger("relay.gateway")


def create_app(settings: Settings, *, gateway: Gateway | None = None, client: Client | None = None) -> FastAPI:
    """The app of one gateway process. Its lifespan opens the store, connects to Temporal, builds the ``Gateway``
    and runs its worker, revocation watcher, contact monitor and watch, and the autoscaling gauge's refresher.

    Args:
        settings: The process's settings.
        gateway: For tests of the REST contract in-process: the routes serve this gateway and its store, and the
            app has no lifespan, so nothing connects to Temporal or starts in the background (ASGI transports
            such as httpx's do not run a lifespan anyway). The caller owns the gateway, its store and client.
        client: The Temporal client the process checked at start (``core.temporal.start_client``), so a Temporal
            that refuses it stops the process before it serves; without it the lifespan connects on its own.
    """
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        install_redaction()
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        store = Store(open_engine(settings))
        gateway = Gateway(settings=settings, store=store,
                          client=client or await connect(temporal_connection(settings)))
        app.state.store = store
        app.state.gateway = gateway
        async with gateway.serving(), autoscaling.refreshing(gateway):
            yield
        store.engine.dispose()

    app = FastAPI(
        title="Relay",
        version="0.1.0",
        summary="Self-hosted control plane for DBOS executors (Conductor API v2 subset)",
        lifespan=lifespan if gateway is None else None,
        docs_url=None,  # api/routes/docs.py serves both pages, with their assets, instead of from a CDN
        redoc_url=None,
    )
    if gateway is not None:
        app.state.store = gateway.store
        app.state.gateway = gateway
    problems.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_body_bytes)
    app.include_router(apps.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(workflows.router)
    app.include_router(queues.router)
    app.include_router(autoscale.router)
    app.include_router(schedules.router)
    app.include_router(versions.router)
    app.include_router(safety.router)
    app.include_router(alerts.router)
    app.include_router(unsupported.router)
    app.include_router(docs.router)
    app.include_router(console.router)
    return app

