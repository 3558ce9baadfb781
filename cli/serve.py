"""Running Relay's processes: `relay dev` (embedded Temporal + worker + gateway), `relay gateway`, `relay worker`.

Kept apart from the CLI's argument parsing so the admin commands start without importing the server stack.

Each process serves its own metrics (``core.metrics``) on RELAY_METRICS_PORT, and the Temporal SDK's on
RELAY_TEMPORAL_METRICS_PORT; `relay dev` is one process, so one of each. The processes that run the worker (`relay
dev`, `relay worker`) also export ``relay_executors``, read from the registry at each scrape.

Each process reaches Temporal and checks Relay's setup there before it serves (``core.temporal.start_client``): one
that cannot (a refused TLS handshake, a missing search attribute, Temporal unreachable for
RELAY_TEMPORAL_CONNECT_TIMEOUT_SECS) logs one line and exits 1. The gateway does it before uvicorn starts, so the
line is not buried under uvicorn's lifespan traceback; an outage after start is the contact loop's (``/readyz``).

Stopping: SIGTERM to `relay gateway` drains it (``Gateway.step_down``: not ready and refusing upgrades at once, its
executor sockets kept for RELAY_SHUTDOWN_DRAIN_SECS, then closed with 1012), then it stops and retires; a second
SIGTERM, or a SIGINT, skips what is left of the drain, and a SIGINT first (Ctrl-C) stops it at once, as `relay dev`
stops on either. SIGTERM to `relay worker` turns its ``/readyz`` 503 and stops its polling; the activities in flight
get ``worker.build_worker``'s graceful shutdown timeout to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from temporalio.client import Client

import worker
from cli.devserver import TemporalDevServer
from cli.worker_health import Polling, WorkerReadiness
from core import metrics
from core.errors import AuthError
from core.models import open_engine
from core.names import DEFAULT_ORG
from core.settings import Settings
from core.store import Store
from core.temporal import (
    TemporalConnection,
    TemporalStartError,
    exit_now,
    install_sdk_runtime,
    start_client,
    temporal_connection,
)

log = logging.getLogger("relay")
T = TypeVar("T")


def _stop_on_signals(stop: asyncio.Event, *, now: asyncio.Event | None = None) -> None:
    """Set ``stop`` on SIGINT and SIGTERM. With ``now``, set that too on a SIGINT, or on a SIGTERM after the first:
    a stop that skips the gateway's drain."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if now is not None and (sig == signal.SIGINT or stop.is_set()):
            now.set()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)


async def _unless_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or None once ``stop`` is set first (a SIGTERM while waiting for Temporal)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


async def _temporal(settings: Settings, stop: asyncio.Event, *,
                    embedded: bool = False) -> tuple[TemporalConnection, Client] | None:
    """The process's Temporal connection and checked client; None if stopped meanwhile. Exits 1 with one line if
    it cannot have them: the cause is in the message, and a traceback would only hide it."""
    try:
        conn = temporal_connection(settings, embedded=embedded)
        client = await _unless_stopped(start_client(conn, timeout=settings.temporal_connect_timeout), stop)
        return None if client is None else (conn, client)
    except TemporalStartError as err:
        log.error("cannot start: %s", err)
        # Nothing has started that needs stopping (the embedded dev server gets SIGTERM as its parent dies).
        exit_now(1)


def dev_key(settings: Settings, store: Store) -> str:
    """The development key for org ``local``: created once, kept in the data dir across restarts."""
    path = settings.data_dir / "dev-key"
    if path.exists():
        key = path.read_text().strip()
        try:
            store.authenticate(key)
            return key
        except AuthError:
            pass  # the database was reset: issue a new one
    key = store.create_key(org=DEFAULT_ORG, name="dev")
    path.touch(mode=0o600)
    path.write_text(key + "\n")
    return key


@contextlib.contextmanager
def _metrics(settings: Settings, *, registry: bool,
             probes: Callable[[Store], metrics.Readiness] | None = None) -> Iterator[None]:
    """This process's metrics listener for the block; with ``registry``, ``relay_executors`` too (its own engine:
    a scrape must not take a connection the activities wait for); with ``probes``, ``/healthz`` and ``/readyz``,
    whose readiness checks the database on that engine too. Never fails the process."""
    engine = None
    if (registry or probes is not None) and settings.metrics_port:
        try:
            engine = open_engine(settings)
        except Exception as err:
            log.warning("relay_executors not exported: the database is unavailable: %s", type(err).__name__)
    readiness: metrics.Readiness | None = None
    if probes is not None:
        readiness = probes(Store(engine)) if engine is not None else lambda: "the database was unavailable at start"
    try:
        with metrics.serving(settings.metrics_host, settings.metrics_port, engine=engine if registry else None,
                             readiness=readiness):
            yield
    finally:
        if engine is not None:
            engine.dispose()


async def dev(settings: Settings) -> None:
    from cli import web  # the web stack: `relay worker` never loads it

    install_sdk_runtime(settings.temporal_metrics_address)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        if settings.embedded_temporal:  # started first, stopped last, restarted whenever it dies in between
            await stack.enter_async_context(TemporalDevServer(settings).running(stop))
        store = Store(open_engine(settings))
        key = dev_key(settings, store)
        store.engine.dispose()
        temporal = await _temporal(settings, stop, embedded=settings.embedded_temporal)
        if temporal is None:
            return
        conn, client = temporal
        stack.enter_context(_metrics(settings, registry=True))
        server = web.server(settings, client)
        worker_task = asyncio.create_task(worker.run(settings, stop, client=client))
        ui = f"http://127.0.0.1:{settings.temporal_ui_port}" if settings.embedded_temporal else "(external Temporal)"
        where = "embedded dev server" if settings.embedded_temporal else "external"
        print(f"Relay is starting.\n  conductor_url: ws://{settings.host}:{settings.port}/\n"
              f"  REST API:      http://{settings.host}:{settings.port}/v2/orgs/{DEFAULT_ORG}/apps\n"
              f"  console:       http://{settings.host}:{settings.port}/console\n"
              f"  API docs:      http://{settings.host}:{settings.port}/docs\n"
              f"  Temporal:      {conn.describe()} ({where})\n"
              f"  Temporal UI:   {ui}\n  dev key:       {key}  (org {DEFAULT_ORG})", flush=True)
        await web.serve_until(server, stop)
        stop.set()
        await worker_task


async def gateway(settings: Settings) -> None:
    from cli import web  # the web stack, imported as `dev` does: `relay worker` never loads it

    install_sdk_runtime(settings.temporal_metrics_address)
    stop, now = asyncio.Event(), asyncio.Event()
    _stop_on_signals(stop, now=now)
    temporal = await _temporal(settings, stop)
    if temporal is None:
        return
    _, client = temporal
    server = web.server(settings, client, requests_grace=web.GATEWAY_REQUESTS_GRACE)

    async def drain() -> None:
        gw = server.gateway()
        if gw is not None and not now.is_set():  # SIGTERM; not a SIGINT, nor before the gateway served
            await gw.step_down(settings.shutdown_drain, now)

    with _metrics(settings, registry=False):
        await web.serve_until(server, stop, drain=drain)


async def run_worker(settings: Settings) -> None:
    install_sdk_runtime(settings.temporal_metrics_address)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    temporal = await _temporal(settings, stop)
    if temporal is None:
        return
    _, client = temporal
    polling = Polling()
    loop = asyncio.get_running_loop()

    def probes(store: Store) -> metrics.Readiness:
        return WorkerReadiness(polling=polling, client=client, store=store, stop=stop, loop=loop)

    with _metrics(settings, registry=True, probes=probes):
        await worker.run(settings, stop, client=polling.on(client))
