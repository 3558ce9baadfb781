"""The load generator: thousands of lightweight protocol-speaking executors in one asyncio process.

Each fake executor is an ``asyncio.Protocol`` around websockets' sans-I/O client (no compression, no
keepalive of its own). It answers the server's ``executor_info`` (that is when it counts as connected),
answers server pings (the sans-I/O protocol queues the pong), and plays a healthy peer when asked to
recover another executor: ``recovery`` → success, ``exist_pending_workflows`` → exist=false,
``retention`` → success. Real DBOS processes are far too heavy for 10,000 of them.

Driven by the bench over stdin/stdout, one JSON object per line each way. Commands (executors are named
``{prefix}{i}`` for ``i`` in ``range(start, start + count)``):

- ``connect``   url (or urls: spread over them round-robin, as a load balancer would), prefix, start, count,
                version, concurrency, timeout: connect (retrying every second, as the SDKs do) until each has
                answered ``executor_info``. With ``reconnect``, an executor whose socket the server closes or
                drops reconnects a second later, as the SDKs do, until it is back: to its own URL first, then to
                any of it and ``fallback_urls`` (other gateways behind the same address), at random
- ``close``     prefix, start, count, mode ("close": a close frame; "abort": the TCP connection dropped),
                spread (seconds to spread the closes over; 0: all at once): each one's wall-clock close time;
                an executor closed so does not reconnect
- ``ping``      prefix, start, count, rate, duration: WebSocket pings round-robin at ``rate`` frames/s,
                started in the background (so the bench can read CPU counters around the window)
- ``ping_result`` waits for the pinging to end: frames sent, pongs received
- ``stats``     counters
- ``quit``
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import WebSocketURI, parse_uri

from tests.bench.common import percentile, raise_nofile


class HandshakeRefused(Exception):
    pass


@dataclass
class Redial:
    """Where an executor reconnects after its socket was closed or dropped under it."""

    uri: WebSocketURI
    fallbacks: list[WebSocketURI]
    version: str


class Fleet:
    def __init__(self) -> None:
        self.clients: dict[str, FakeExecutor] = {}
        self.counters: Counter[str] = Counter()
        self.unexpected: list[tuple[str, int | None]] = []
        self.redial: dict[str, Redial] = {}  # executors that reconnect (``connect`` with ``reconnect``)
        self.redialing: set[asyncio.Task[None]] = set()
        self.redialed_at: list[float] = []  # when each reconnect's handshake completed (epoch seconds)

    def lost(self, client: FakeExecutor) -> None:
        if self.clients.get(client.executor_id) is client:
            del self.clients[client.executor_id]
            if not client.expected_close:
                self.counters["unexpected_closes"] += 1
                if len(self.unexpected) < 20:
                    self.unexpected.append((client.executor_id, client.ws.close_code))
                redial = self.redial.get(client.executor_id)
                if redial is not None:
                    task = asyncio.get_running_loop().create_task(self._redial(client.executor_id, redial))
                    self.redialing.add(task)
                    task.add_done_callback(self.redialing.discard)

    async def _redial(self, executor_id: str, redial: Redial) -> None:
        """Reconnect a second after the loss and every second after a failure, as the SDKs do; its own URL first,
        then any at random."""
        loop = asyncio.get_running_loop()
        attempt = 0
        while self.redial.get(executor_id) is redial and executor_id not in self.clients:
            await asyncio.sleep(1.0)
            uri = redial.uri if attempt == 0 else random.choice([redial.uri, *redial.fallbacks])
            attempt += 1
            client = FakeExecutor(self, uri, executor_id, redial.version)
            try:
                await loop.create_connection(lambda: client, uri.host, uri.port)  # noqa: B023
                await asyncio.wait_for(asyncio.shield(client.handshake), 30)
            except (OSError, HandshakeRefused, TimeoutError):
                client.abort()
                self.counters["redial_failures"] += 1
                continue
            if self.redial.get(executor_id) is not redial:  # closed on purpose meanwhile
                client.abort()
                return
            self.clients[executor_id] = client
            self.counters["redials"] += 1
            self.redialed_at.append(time.time())


class FakeExecutor(asyncio.Protocol):
    def __init__(self, fleet: Fleet, uri: WebSocketURI, executor_id: str, version: str) -> None:
        self.fleet = fleet
        self.executor_id = executor_id
        self.version = version
        self.ws = ClientProtocol(uri, max_size=None)
        self.transport: asyncio.Transport | None = None
        self.handshake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.expected_close = False
        self.open = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.open = True
        self.ws.send_request(self.ws.connect())
        self._flush()

    def data_received(self, data: bytes) -> None:
        self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Response):
                if event.status_code != 101:
                    self._fail(HandshakeRefused(f"HTTP {event.status_code}"))
                    return
            elif not isinstance(event, Frame):
                continue
            elif event.opcode is Opcode.TEXT:
                self._on_text(event.data)
            elif event.opcode is Opcode.PONG:
                self.fleet.counters["pongs"] += 1
            elif event.opcode is Opcode.PING:
                self.fleet.counters["server_pings"] += 1  # the sans-I/O protocol has queued the pong
        self._flush()

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        self._flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if not self.handshake.done():
            self.handshake.set_exception(ConnectionError(f"closed before executor_info ({exc or 'EOF'})"))
        self.fleet.lost(self)

    # protocol

    def _on_text(self, data: bytes | bytearray | memoryview) -> None:
        message: dict[str, Any] = json.loads(bytes(data))
        kind, request_id = message.get("type"), message.get("request_id")
        reply: dict[str, Any]
        if kind == "executor_info":
            reply = {"type": kind, "request_id": request_id, "executor_id": self.executor_id,
                     "application_version": self.version, "hostname": "bench", "language": "python",
                     "dbos_version": "3.2.0", "executor_metadata": None, "error_message": None}
        elif kind == "recovery":
            self.fleet.counters["recovery"] += 1
            reply = {"type": kind, "request_id": request_id, "success": True}
        elif kind == "exist_pending_workflows":
            self.fleet.counters["exist_pending_workflows"] += 1
            reply = {"type": kind, "request_id": request_id, "exist": False}
        elif kind == "retention":
            self.fleet.counters["retention"] += 1
            reply = {"type": kind, "request_id": request_id, "success": True}
        else:
            self.fleet.counters["other_requests"] += 1
            reply = {"type": kind, "request_id": request_id, "error_message": f"unsupported: {kind}"}
        self.ws.send_text(json.dumps(reply).encode())
        if kind == "executor_info" and not self.handshake.done():
            self.handshake.set_result(None)

    def _flush(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        for data in self.ws.data_to_send():
            if data:
                self.transport.write(data)
            else:  # end of stream
                self.transport.close()
                return

    def _fail(self, err: Exception) -> None:
        if not self.handshake.done():
            self.handshake.set_exception(err)
        self.abort()

    def ping(self) -> None:
        self.ws.send_ping(b"hb")
        self._flush()

    def close(self) -> None:
        """A clean close: the close frame goes out now; the server answers and closes the TCP connection."""
        self.expected_close = True
        self.ws.send_close(1000, "bench")
        self._flush()

    def abort(self) -> None:
        """The connection simply drops (RST), as when a host or network dies."""
        self.expected_close = True
        if self.transport is not None:
            self.transport.abort()


def _ids(args: dict[str, Any]) -> list[str]:
    prefix, start, count = args["prefix"], int(args.get("start", 0)), int(args["count"])
    return [f"{prefix}{i}" for i in range(start, start + count)]


async def connect(fleet: Fleet, args: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    uris = [parse_uri(url) for url in args.get("urls") or [args["url"]]]
    fallbacks = [parse_uri(url) for url in args.get("fallback_urls", [])]
    ids = _ids(args)
    version = args.get("version", "v1")
    timeout = float(args.get("timeout", 120))
    gate = asyncio.Semaphore(int(args.get("concurrency", len(ids))))
    deadline = loop.time() + timeout
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    retries = 0

    async def one(n: int, executor_id: str) -> bool:
        nonlocal retries
        uri = uris[n % len(uris)]
        if args.get("reconnect"):
            fleet.redial[executor_id] = Redial(uri, fallbacks, version)
        async with gate:
            began = loop.time()
            while True:
                client = FakeExecutor(fleet, uri, executor_id, version)
                try:
                    await loop.create_connection(lambda: client, uri.host, uri.port)  # noqa: B023
                    await asyncio.wait_for(asyncio.shield(client.handshake), max(0.1, deadline - loop.time()))
                    fleet.clients[executor_id] = client
                    latencies.append(loop.time() - began)
                    return True
                except (OSError, HandshakeRefused, TimeoutError) as err:
                    client.abort()
                    errors[type(err).__name__ + ": " + str(err)[:60]] += 1
                    if loop.time() + 1.0 > deadline:
                        return False
                    retries += 1
                    await asyncio.sleep(1.0)  # the SDKs retry a refused or failed connection every second

    t0 = time.time()
    results = await asyncio.gather(*(one(n, i) for n, i in enumerate(ids)))
    t1 = time.time()
    return {"connected": sum(results), "failed": len(results) - sum(results), "retries": retries,
            "errors": dict(errors.most_common(5)), "t0": t0, "t1": t1,
            "latency_p50": percentile(latencies, 50), "latency_p99": percentile(latencies, 99),
            "latency_max": max(latencies, default=float("nan"))}


async def close(fleet: Fleet, args: dict[str, Any]) -> dict[str, Any]:
    """Close the executors at once, or evenly over ``spread`` seconds."""
    loop = asyncio.get_running_loop()
    abort = args.get("mode", "close") == "abort"
    ids = _ids(args)
    step = float(args.get("spread", 0)) / max(1, len(ids))
    start = loop.time()
    closed: dict[str, float] = {}
    for n, executor_id in enumerate(ids):
        if step:
            await asyncio.sleep(max(0.0, start + n * step - loop.time()))
        fleet.redial.pop(executor_id, None)
        client = fleet.clients.get(executor_id)
        if client is None:
            continue
        closed[executor_id] = time.time()
        if abort:
            client.abort()
        else:
            client.close()
    return {"closed": closed}


async def ping(fleet: Fleet, args: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    clients = [c for i in _ids(args) if (c := fleet.clients.get(i)) is not None]
    rate, duration = float(args["rate"]), float(args["duration"])
    pongs_before = fleet.counters["pongs"]
    scheduled = sent = 0
    start = loop.time()
    t0 = time.time()
    while clients:
        elapsed = loop.time() - start
        if elapsed >= duration:
            break
        due = int(elapsed * rate) - scheduled
        for _ in range(due):
            client = clients[scheduled % len(clients)]
            scheduled += 1
            if client.open:
                client.ping()
                sent += 1
        await asyncio.sleep(0.005)
    t1 = time.time()
    await asyncio.sleep(0.5)  # the last pongs
    return {"sent": sent, "pongs": fleet.counters["pongs"] - pongs_before, "clients": len(clients),
            "t0": t0, "t1": t1}


def stats(fleet: Fleet) -> dict[str, Any]:
    return {"open": len(fleet.clients), "redialing": len(fleet.redialing), **fleet.counters,
            "unexpected": fleet.unexpected}


async def main() -> None:
    raise_nofile()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    fleet = Fleet()
    pinging: asyncio.Task[dict[str, Any]] | None = None
    while True:
        line = await reader.readline()
        if not line:
            break
        request = json.loads(line)
        cmd = request.pop("cmd")
        try:
            if cmd == "connect":
                reply = await connect(fleet, request)
            elif cmd == "close":
                reply = await close(fleet, request)
            elif cmd == "ping":
                pinging = asyncio.create_task(ping(fleet, request))
                reply = {"started": time.time()}
            elif cmd == "ping_result":
                assert pinging is not None, "no ping running"
                reply = await pinging
            elif cmd == "stats":
                reply = stats(fleet)
            elif cmd == "redialed_at":
                reply = {"at": [t for t in fleet.redialed_at if t >= float(request.get("since", 0))]}
            elif cmd == "quit":
                sys.stdout.write(json.dumps({"ok": True}) + "\n")
                sys.stdout.flush()
                break
            else:
                reply = {"error": f"unknown command {cmd!r}"}
        except Exception as err:  # report it to the bench rather than dying silently
            reply = {"error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    os._exit(0)  # the kernel closes every socket at once; no per-connection close handshake


if __name__ == "__main__":
    asyncio.run(main())
