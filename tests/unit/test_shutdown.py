"""Stopping without recoveries, piece by piece: the drain setting, a gateway's drain (``Gateway.step_down``: not
ready and refusing upgrades at once, sockets kept, then closed with 1012), the signals that start and cut it short,
and the worker's probes on its metrics listener. The same with real processes behind a load balancer:
tests/e2e/test_drain.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pydantic
import pytest
from sqlalchemy.exc import OperationalError
from temporalio.client import Client
from websockets.client import ClientProtocol
from websockets.http11 import Response
from websockets.uri import parse_uri

from api.app import create_app
from cli import serve
from cli.worker_health import Polling, WorkerReadiness
from core import metrics
from core.models import make_engine
from core.settings import Settings
from core.store import Store, hash_key
from core.store.base import StoreBase
from gateway import runtime, ws
from gateway import session as sm
from gateway.admission import Admission
from gateway.hub import Connection
from gateway.runtime import Gateway
from tests.support import free_port
from tests.transports import ServerTransport
from tests.unit.test_wire_fuzz import FakeGateway, _protocol

LIVE_KEY = "dbos_" + "l" * 43


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    yield s
    s.engine.dispose()


# -- the setting --------------------------------------------------------------------------------------------------


def test_the_drain_is_5_s_by_default_and_read_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().shutdown_drain == timedelta(seconds=5)
    monkeypatch.setenv("RELAY_SHUTDOWN_DRAIN_SECS", "0.25")
    assert Settings().shutdown_drain == timedelta(milliseconds=250)
    monkeypatch.setenv("RELAY_SHUTDOWN_DRAIN_SECS", "0")
    assert Settings().shutdown_drain == timedelta(0)  # close at once, still not ready first
    monkeypatch.setenv("RELAY_SHUTDOWN_DRAIN_SECS", "-1")
    with pytest.raises(pydantic.ValidationError):
        Settings()


# -- the gateway's drain ------------------------------------------------------------------------------------------


class Held:
    """Executor sockets in a gateway's hub that record when, and how, the gateway closed them (and leave it then,
    as a socket does once its executor answers the close)."""

    def __init__(self, gateway: Gateway, n: int) -> None:
        self.closed: dict[str, tuple[float, int, str]] = {}
        for i in range(n):
            self._attach(gateway, f"ex-{i}")

    def _attach(self, gateway: Gateway, executor_id: str) -> None:
        async def send(_frame: str) -> None:
            pass

        async def close(code: int, reason: str) -> None:
            self.closed[executor_id] = (time.monotonic(), code, reason)
            gateway.hub.detach(conn)

        conn = Connection(connection_id=f"c-{executor_id}", org="o", app="a", executor_id=executor_id,
                          session=sm.Session(), send=send, close=close)
        gateway.hub.attach(conn)


def _gateway(tmp_path: Path, store: Store | None = None) -> Gateway:
    return Gateway(settings=Settings(data_dir=tmp_path), store=cast(Store, store), client=cast(Client, None))


async def test_step_down_is_not_ready_at_once_and_closes_the_sockets_with_1012_after_the_drain(
        tmp_path: Path) -> None:
    gateway = _gateway(tmp_path)
    held = Held(gateway, 3)
    began = time.monotonic()
    stepping = asyncio.create_task(gateway.step_down(timedelta(milliseconds=300), asyncio.Event()))
    await asyncio.sleep(0)
    assert gateway.draining and held.closed == {}  # not ready at once; the sockets are kept
    await asyncio.sleep(0.15)
    assert held.closed == {} and not stepping.done()
    await asyncio.wait_for(stepping, 5)
    assert sorted(held.closed) == ["ex-0", "ex-1", "ex-2"] and len(gateway.hub) == 0
    assert {(code, reason) for _, code, reason in held.closed.values()} == {(1012, runtime.RESTART_CLOSE_REASON)}
    assert min(t for t, _, _ in held.closed.values()) - began >= 0.3


async def test_cut_short_closes_the_sockets_at_once(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path)
    held = Held(gateway, 2)
    now = asyncio.Event()
    began = time.monotonic()
    stepping = asyncio.create_task(gateway.step_down(timedelta(seconds=30), now))
    await asyncio.sleep(0.05)
    assert held.closed == {}
    now.set()  # a second SIGTERM, or a SIGINT
    await asyncio.wait_for(stepping, 5)
    assert [code for _, code, _ in held.closed.values()] == [1012, 1012]
    assert time.monotonic() - began < 2


async def test_step_down_waits_no_longer_than_close_wait_for_sockets_that_never_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "CLOSE_WAIT", timedelta(milliseconds=200))
    gateway = _gateway(tmp_path)

    async def send(_frame: str) -> None:
        pass

    async def close(_code: int, _reason: str) -> None:
        pass  # the close frame is sent; the peer never answers (uvicorn's shutdown cuts it off next)

    gateway.hub.attach(Connection(connection_id="c-1", org="o", app="a", executor_id="silent", session=sm.Session(),
                                  send=send, close=close))
    began = time.monotonic()
    await asyncio.wait_for(gateway.step_down(timedelta(0), asyncio.Event()), 5)
    assert 0.2 <= time.monotonic() - began < 2


async def test_readyz_is_503_from_the_drain_on(tmp_path: Path, store: Store) -> None:
    gateway = _gateway(tmp_path, store)
    app = create_app(gateway.settings, gateway=gateway)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://relay.test") as client:
        assert (await client.get("/readyz")).status_code == 200
        gateway.draining = True
        response = await client.get("/readyz")
        assert (await client.get("/healthz")).status_code == 200  # alive: it must not be killed meanwhile
    assert response.status_code == 503 and response.headers["content-type"] == "application/problem+json"
    assert "shutting down" in response.json()["detail"]


def _refused(answer: bytes | None) -> tuple[int, dict[str, str], dict[str, Any]]:
    assert answer is not None
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_a_draining_gateway_refuses_every_upgrade_before_it_with_retry_after() -> None:
    gw = FakeGateway()
    gw.admission = Admission(clock=time.monotonic, live_keys=frozenset({hash_key(LIVE_KEY)}))
    check = ws.refusal_before_upgrade(lambda: cast(Gateway, gw))
    assert check(f"/websocket/shop/{LIVE_KEY}", "10.0.0.9") is None
    gw.draining = True
    before = _refusals("draining")
    status, headers, body = _refused(check(f"/websocket/shop/{LIVE_KEY}", "10.0.0.9"))
    assert (status, headers["retry-after"], headers["content-type"]) == (503, "1", "application/problem+json")
    assert body["status"] == 503 and "shutting down" in body["detail"]
    assert _refusals("draining") == before + 1
    assert check("/v2/orgs/local/apps", "10.0.0.9") is None  # REST goes on during the drain


def _refusals(reason: str) -> float:
    return metrics.REGISTRY.get_sample_value("relay_refusals_total", {"reason": reason}) or 0.0


async def test_an_upgrade_past_the_http_layer_when_the_drain_began_is_refused_too() -> None:
    gw = FakeGateway()
    gw.draining = True
    response = await _upgrade(gw, LIVE_KEY)
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert json.loads(response.body)["status"] == 503
    assert gw.connected == []


async def _upgrade(gw: FakeGateway, key: str) -> Response:
    """The answer of a real ``ExecutorSocket`` to an upgrade with ``key`` (its own check, after the HTTP layer's)."""
    protocol = _protocol(gw)
    client = ClientProtocol(parse_uri(f"ws://relay.test/websocket/shop/{key}"))
    transport = ServerTransport(client)
    protocol.connection_made(transport)
    await asyncio.wait_for(protocol._open(client.connect(), "shop", key), 5)
    [response] = [e for e in client.events_received() if isinstance(e, Response)]
    transport.closing = True
    protocol.connection_lost(None)
    return response


# -- the signals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("signals", "expected"), [
    ([signal.SIGTERM], (True, False)),  # drain
    ([signal.SIGTERM, signal.SIGTERM], (True, True)),  # the second cuts it short
    ([signal.SIGTERM, signal.SIGINT], (True, True)),
    ([signal.SIGINT], (True, True)),  # Ctrl-C: no drain
])
async def test_sigterm_asks_for_a_drain_and_sigint_or_a_second_sigterm_for_a_stop_now(
        signals: list[signal.Signals], expected: tuple[bool, bool]) -> None:
    stop, now = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    serve._stop_on_signals(stop, now=now)
    try:
        for n, sig in enumerate(signals, 1):
            os.kill(os.getpid(), sig)
            # The handler runs on the loop, after the signal's wake-up; for the last one, wait for what it should
            # set (a stop now, when it is due), or give it the time it would take.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for((now if n == len(signals) and expected[1] else stop).wait(), 5)
            await asyncio.sleep(0.05)
    finally:
        for sig, handler in handlers.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
    assert (stop.is_set(), now.is_set()) == expected


# -- the worker's probes ------------------------------------------------------------------------------------------


def test_the_metrics_listener_serves_probes_beside_the_metrics() -> None:
    reason: list[str | None] = [None]
    port = free_port()
    with metrics.serving("127.0.0.1", port, readiness=lambda: reason[0]) as listener:
        assert listener is not None
        url = f"http://127.0.0.1:{listener.port}"
        assert httpx.get(f"{url}/readyz").json() == {"status": "ok"}
        reason[0] = "shutting down"
        not_ready = httpx.get(f"{url}/readyz")
        healthz = httpx.get(f"{url}/healthz")
        scrape = httpx.get(f"{url}/metrics")
    assert not_ready.status_code == 503 and not_ready.headers["content-type"] == "application/problem+json"
    assert not_ready.json() == {"title": "Service Unavailable", "status": 503, "detail": "shutting down"}
    assert healthz.status_code == 200 and healthz.json() == {"status": "ok"}
    assert scrape.status_code == 200 and "relay_refusals_total" in scrape.text


class FakeService:
    def __init__(self) -> None:
        self.error: Exception | None = None

    async def check_health(self, *, timeout: timedelta | None = None) -> bool:
        if self.error is not None:
            raise self.error
        return True


class FakeWorker:
    is_running = True


class DeadStore:
    unreachable = StoreBase.unreachable  # the real readiness question, asked of this ping

    def ping(self) -> None:
        raise OperationalError("SELECT 1", {}, Exception("could not connect"))


async def test_the_worker_is_ready_only_while_it_polls_and_temporal_and_the_database_answer(store: Store) -> None:
    service = FakeService()
    client = cast(Client, type("FakeClient", (), {"service_client": service})())
    polling, stop = Polling(), asyncio.Event()
    readiness = WorkerReadiness(polling=polling, client=client, store=store, stop=stop,
                                loop=asyncio.get_running_loop())
    assert await readiness.reasons() == ["not polling task queue relay"]  # not started yet
    polling.worker = cast(Any, FakeWorker())
    assert await readiness.reasons() == []
    service.error = RuntimeError("connection refused")
    assert await readiness.reasons() == ["Temporal unreachable (connection refused)"]
    service.error = None
    readiness.store = cast(Store, DeadStore())
    assert await readiness.reasons() == ["database unreachable (OperationalError: could not connect)"]
    stop.set()
    assert await readiness.reasons() == ["shutting down: no longer polling; finishing the activities in flight"]
    # From the listener's thread, the same checks run on the event loop.
    assert "shutting down" in (await asyncio.to_thread(readiness) or "")


async def test_the_polling_plugin_is_handed_the_worker_built_on_its_client() -> None:
    polling = Polling()
    ran: list[object] = []

    async def run(worker: Any) -> None:
        ran.append(worker)

    worker = object()
    await polling.run_worker(cast(Any, worker), run)
    assert polling.worker is worker and ran == [worker]


async def test_retiring_ends_the_fence_probes_it_holds_even_with_the_database_away(tmp_path: Path) -> None:
    """``retire`` answers the probes held for a grace's end (``Hub.stop_holding``), after recording itself gone, or
    failing to: its stopping worker would never answer them."""
    class AwayGateways:
        def mark_gone(self, queue: str, reason: str) -> None:
            raise OperationalError("UPDATE gatewayprocess", {}, Exception("connection refused"))

    class AwayStore:
        gateways = AwayGateways()

    gw = _gateway(tmp_path, cast(Store, AwayStore()))
    held = asyncio.ensure_future(gw.hub.arrival("o", "a", "x1", timedelta(seconds=30)))
    await asyncio.sleep(0.05)
    assert not held.done() and gw.hub.holding
    await gw.retire()
    assert await asyncio.wait_for(held, timeout=5) is None
    assert not gw.hub.holding
