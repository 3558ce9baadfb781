"""The HTTP side of `relay gateway` and `relay dev`: uvicorn serving the REST API and the executor WebSocket on one
port (``cli.serve`` runs it). Its own module so that `relay worker`, which serves neither, never imports the web
stack (FastAPI, uvicorn, the REST routes): that is about a second of CPU at every worker start."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Generator
from datetime import timedelta

import uvicorn
from fastapi import FastAPI
from temporalio.client import Client

from api.app import create_app
from core import units
from core.settings import Settings
from gateway.http_limits import http_protocol
from gateway.runtime import Gateway
from gateway.ws import executor_protocol, refusal_before_upgrade

# After its drain, how long `relay gateway` lets REST requests still in flight finish before uvicorn cancels them:
# with the rest of its shutdown, the process is gone within about 10 s of the drain's end.
GATEWAY_REQUESTS_GRACE = timedelta(seconds=5)


class Server(uvicorn.Server):
    """uvicorn re-raises captured signals after shutting down; Relay handles them itself instead."""

    app: FastAPI  # the gateway's app, for its ``Gateway`` once the lifespan has built it

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def gateway(self) -> Gateway | None:
        """The running gateway; None before the lifespan has started it."""
        gw: Gateway | None = getattr(self.app.state, "gateway", None)
        return gw if self.started else None


def server(settings: Settings, client: Client, *, requests_grace: timedelta | None = None) -> Server:
    app = create_app(settings, client=client)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=http_protocol(header_timeout=settings.header_timeout,
                           before_upgrade=refusal_before_upgrade(lambda: app.state.gateway)),
        ws=executor_protocol(settings.executor_ping_wait, lambda: app.state.gateway),
        ws_ping_interval=settings.server_ping_interval_secs,
        ws_ping_timeout=None,
        ws_per_message_deflate=settings.ws_permessage_deflate,
        ws_max_size=settings.max_message_bytes,
        log_level="info",
        log_config=None,  # Relay's own logging (core.logs.configure): one format, RELAY_LOG_FORMAT, for every line
        lifespan="on",
        timeout_graceful_shutdown=None if requests_grace is None else units.timedelta_to_seconds(requests_grace),
    )
    server = Server(config)
    server.app = app
    return server


async def serve_until(server: Server, stop: asyncio.Event, *,
                       drain: Callable[[], Awaitable[None]] | None = None) -> None:
    """Serve until ``stop``; then ``drain`` (while uvicorn still serves), then stop uvicorn."""
    task = asyncio.create_task(server.serve())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    try:
        if drain is not None and not task.done():
            await drain()
    finally:  # a drain that failed still stops the server
        server.should_exit = True
        await task
