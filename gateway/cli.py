"""The ``relay`` command: ``dev``, ``gateway``, ``worker``, ``keys create``; the admin commands are in ``admin_cli``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Generator, Sequence

import uvicorn

import worker
from gateway import admin_cli
from gateway.app import create_app
from gateway.devserver import TemporalDevServer
from gateway.errors import AuthError
from gateway.liveness import liveness_protocol
from gateway.logs import install_redaction
from gateway.models import make_engine
from gateway.settings import Settings
from gateway.store import Store

log = logging.getLogger("relay")
DEV_ORG = "local"


class _Server(uvicorn.Server):
    """uvicorn re-raises captured signals after shutting down; Relay handles them itself instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _server(settings: Settings) -> _Server:
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        ws=liveness_protocol(settings.executor_ping_wait),
        ws_ping_interval=settings.server_ping_interval_secs,
        ws_ping_timeout=None,
        ws_per_message_deflate=settings.ws_permessage_deflate,
        ws_max_size=settings.max_message_bytes,
        log_level="info",
        lifespan="on",
    )
    return _Server(config)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def _serve_until(server: _Server, stop: asyncio.Event) -> None:
    task = asyncio.create_task(server.serve())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await task


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
    key = store.create_key(org=DEV_ORG, name="dev")
    path.touch(mode=0o600)
    path.write_text(key + "\n")
    return key


async def _dev(settings: Settings) -> None:
    stop = asyncio.Event()
    _stop_on_signals(stop)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    temporal = TemporalDevServer(settings) if settings.embedded_temporal else None
    try:
        if temporal is not None:
            await temporal.start()
        store = Store(make_engine(settings.db_url))
        key = dev_key(settings, store)
        store.engine.dispose()
        server = _server(settings)
        worker_task = asyncio.create_task(worker.run(settings, stop))
        ui = f"http://127.0.0.1:{settings.temporal_ui_port}" if temporal else "(external Temporal)"
        print(f"Relay is starting.\n  conductor_url: ws://{settings.host}:{settings.port}/\n"
              f"  REST API:      http://{settings.host}:{settings.port}/v2/orgs/{DEV_ORG}/apps\n"
              f"  Temporal UI:   {ui}\n  dev key:       {key}  (org {DEV_ORG})", flush=True)
        await _serve_until(server, stop)
        stop.set()
        await worker_task
    finally:
        if temporal is not None:
            temporal.stop()


async def _gateway(settings: Settings) -> None:
    stop = asyncio.Event()
    _stop_on_signals(stop)
    await _serve_until(_server(settings), stop)


async def _worker(settings: Settings) -> None:
    stop = asyncio.Event()
    _stop_on_signals(stop)
    await worker.run(settings, stop)


def _keys_create(settings: Settings, args: argparse.Namespace) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(make_engine(settings.db_url))
    print(store.create_key(org=args.org, name=args.name, apps=args.app or None))
    store.engine.dispose()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relay", description="Self-hosted control plane for DBOS executors.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("dev", help="embedded Temporal dev server + worker + gateway, in one process tree")
    sub.add_parser("gateway", help="executor WebSocket and REST API (RELAY_TEMPORAL_ADDRESS)")
    sub.add_parser("worker", help="Temporal worker for workflows and database activities")
    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="print one new key; only its hash is stored")
    create.add_argument("--org", default=DEV_ORG)
    create.add_argument("--app", action="append", help="restrict the key to this app (repeatable)")
    create.add_argument("--name", default="cli", help="a label for the key")
    admin_cli.add_commands(sub, keys)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("RELAY_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    install_redaction()
    settings = Settings()
    if args.command == "dev":
        asyncio.run(_dev(settings))
    elif args.command == "gateway":
        asyncio.run(_gateway(settings))
    elif args.command == "worker":
        asyncio.run(_worker(settings))
    elif args.command == "keys" and args.keys_command == "create" and not admin_cli.api_key(args):
        _keys_create(settings, args)  # no key to call the API with: bootstrap one in the local database
    else:
        admin_cli.run(args, settings)


if __name__ == "__main__":
    main()
