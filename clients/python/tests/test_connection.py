"""The socket thread (``Connection``) against a real local websockets server: it answers the server's first request,
reconnects when the socket is lost or stops answering pings, closes cleanly, and never logs its key.

websockets' sync server has no switch to stop answering pings (the protocol answers them as they are read), so a
frozen gateway is a TCP proxy of the test's that stops forwarding bytes (``Proxy.freeze``): the server's pongs no
longer reach the client, as with a gateway process that was stopped while its sockets stay open.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import pytest
from dbos import DBOS
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

import relay_dbos
import relay_dbos.connection
from relay_dbos.connection import Backoff, Connection
from tests.conftest import DbosEnv
from tests.support import Asker, wait_until

APP = "relay-client-tests"
KEY = "dbos_s3cr3t-key/with+odd chars"
QUOTED_KEY = quote(KEY, safe="")


class RelayStub:
    """A websockets server playing Relay: each connection gets ``executor_info`` first and its reply is kept;
    ``then(connection, n)`` decides what happens next on the n-th connection (by default: wait for its close)."""

    def __init__(self, refuse: HTTPStatus | None = None) -> None:
        self.refuse = refuse
        self.then: Callable[[ServerConnection, int], None] = self.wait_for_close
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: list[str] = []  # the path of every upgrade request
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self.closes: list[tuple[int | None, str | None]] = []  # the close code and reason each client sent
        self.server: Server = serve(self.handler, "127.0.0.1", 0, process_request=self.process_request,
                                    ping_interval=None, close_timeout=1)
        self.port: int = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="relay-stub", daemon=True)
        self.thread.start()

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        with self.lock:
            self.requests.append(request.path)
        if self.refuse is not None:
            return connection.respond(self.refuse, "no\n")
        return None

    def handler(self, connection: ServerConnection) -> None:
        with self.lock:
            self.connections += 1
            n = self.connections
        request_id = str(uuid.uuid4())
        try:
            connection.send(json.dumps({"type": "executor_info", "request_id": request_id}))
            reply = json.loads(connection.recv(timeout=10))
        except ConnectionClosed:  # the client went away first (the test is ending)
            return
        assert reply["request_id"] == request_id
        self.replies.put(reply)
        self.then(connection, n)

    def wait_for_close(self, connection: ServerConnection, n: int) -> None:
        try:
            while True:
                connection.recv()
        except ConnectionClosed as closed:
            with self.lock:
                self.closes.append((closed.rcvd.code if closed.rcvd else None,
                                    closed.rcvd.reason if closed.rcvd else None))

    def reply(self, timeout: float = 10) -> dict[str, Any]:
        return self.replies.get(timeout=timeout)

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(10)
        assert not self.thread.is_alive()


class Proxy:
    """A TCP proxy to ``port``; ``freeze()`` stops it forwarding anything on the links open at that moment (what
    arrives is read and dropped), while new links are forwarded."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.address = self.listener.getsockname()
        self.stopping = threading.Event()
        self.frozen: set[int] = set()  # ids of frozen links
        self.links: list[tuple[int, socket.socket, socket.socket]] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self._start(self.accept)

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self.lock:
            self.threads.append(thread)
        thread.start()

    def accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                client.close()
                continue
            with self.lock:
                link = len(self.links)
                self.links.append((link, client, upstream))
            self._start(self.pump, link, client, upstream)
            self._start(self.pump, link, upstream, client)

    def pump(self, link: int, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if link not in self.frozen:
                    target.sendall(data)
        except OSError:
            pass
        for end in (source, target):  # one side gone: the link is
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def freeze(self) -> None:
        with self.lock:
            self.frozen.update(link for link, _, _ in self.links)

    def close(self) -> None:
        self.stopping.set()  # no new link first: a client whose link is cut comes back
        self.threads[0].join(10)
        self.listener.close()
        with self.lock:
            links, threads = list(self.links), list(self.threads)
        for _, client, upstream in links:
            for end in (client, upstream):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(10)
            assert not thread.is_alive()
        for _, client, upstream in links:
            client.close()
            upstream.close()


@pytest.fixture
def stubs() -> Iterator[Callable[..., RelayStub]]:
    made: list[RelayStub] = []

    def make(refuse: HTTPStatus | None = None) -> RelayStub:
        made.append(RelayStub(refuse))
        return made[-1]

    yield make
    for stub in made:
        stub.close()


@pytest.fixture
def connections(asker: Asker, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Connection]]:
    """Starts ``Connection``s on the real operations table, with short timeouts; each is closed at the test's end
    and its threads must be gone."""
    monkeypatch.setattr(relay_dbos.connection, "CLOSE_TIMEOUT", timedelta(seconds=0.3))
    made: list[Connection] = []

    def make(port: int, *, base_url: str | None = None, **options: Any) -> Connection:
        options.setdefault("backoff", Backoff(initial=timedelta(milliseconds=50), cap=timedelta(milliseconds=200),
                                              rng=random.Random(1)))
        connection = Connection(base_url=base_url or f"ws://127.0.0.1:{port}/", app_name=APP, key=KEY,
                                operations=asker.table, **options)
        made.append(connection)
        connection.start()
        return connection

    yield make
    for connection in made:
        connection.close(timedelta(seconds=5))
        assert not connection._thread.is_alive()
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("relay-dbos")],
               what="every thread of the client ending")


def _fast(**seconds: float) -> dict[str, timedelta]:
    return {name: timedelta(seconds=value) for name, value in seconds.items()}


def test_the_server_speaks_first_and_gets_executor_info(stubs: Callable[..., RelayStub],
                                                        connections: Callable[..., Connection]) -> None:
    stub = stubs()
    connection = connections(stub.port)
    reply = stub.reply()
    assert reply["type"] == "executor_info"
    assert reply["executor_id"] == DBOS.executor_id
    assert reply["language"] == "python" and reply["error_message"] is None
    assert stub.requests == [f"/websocket/{APP}/{QUOTED_KEY}"]  # where every SDK connects: the key in the path
    wait_until(connection.connected.is_set, what="the connection counting as connected")
    assert connection.connections == 1


def test_a_socket_closed_by_the_server_is_opened_again(stubs: Callable[..., RelayStub],
                                                       connections: Callable[..., Connection],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    stub = stubs()

    def drop_the_first(connection: ServerConnection, n: int) -> None:
        if n == 1:
            connection.close(1012, "gateway restart")
        else:
            stub.wait_for_close(connection, n)

    stub.then = drop_the_first
    with caplog.at_level(logging.WARNING, logger="relay_dbos"):
        connection = connections(stub.port)
        first, second = stub.reply(), stub.reply()
        assert first["request_id"] != second["request_id"]  # a new executor_info on the new socket
        wait_until(lambda: connection.connections == 2, what="the second connection")
    assert stub.connections == 2
    assert any("connection to Relay lost (code 1012: gateway restart); reconnecting" in m for m in caplog.messages)
    # Answered on the new socket: the next loss is retried after the first delay again.
    wait_until(lambda: connection.backoff.attempts == 0, what="the backoff's reset")


def test_a_server_that_stops_answering_pings_is_dropped_within_the_pong_timeout(
        stubs: Callable[..., RelayStub], connections: Callable[..., Connection],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="relay_dbos")  # websockets' frame log shows the pongs
    stub = stubs()
    proxy = Proxy(stub.port)
    connection = connections(proxy.address[1], **_fast(ping_interval=0.2, pong_timeout=0.5))
    try:
        stub.reply()

        def pongs() -> int:
            return sum(r.getMessage().startswith("< PONG") for r in caplog.records)

        # While the proxy forwards, the pongs come back and the socket stays: three of them take > pong_timeout.
        wait_until(lambda: pongs() >= 3, what="three pongs")
        assert connection.connections == 1
        frozen_at = time.time()
        proxy.freeze()
        stub.reply()  # the client came back, through the proxy, on a new link
        drops = [r for r in caplog.records if r.levelno == logging.WARNING
                 and r.getMessage() == "relay-dbos: no pong from Relay within 0.5 s; reconnecting"]
        assert len(drops) == 1, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        waited = drops[0].created - frozen_at
        assert 0.3 <= waited <= 1.5, waited  # the next ping within 0.2 s, its pong overdue 0.5 s later
        assert connection.connections == 2 and stub.connections == 2
        wait_until(connection.connected.is_set, what="the new connection")
        assert any(m.endswith(f"connected to Relay at ws://127.0.0.1:{proxy.address[1]}/websocket/{APP}/***")
                   for m in caplog.messages)
    finally:
        connection.close()
        proxy.close()


def test_close_ends_the_thread_with_a_normal_close(stubs: Callable[..., RelayStub],
                                                   connections: Callable[..., Connection]) -> None:
    stub = stubs()
    connection = connections(stub.port, **_fast(ping_interval=0.05, pong_timeout=0.5))
    stub.reply()
    wait_until(connection.connected.is_set, what="the connection")
    started = time.monotonic()
    connection.close(timedelta(seconds=5))
    assert time.monotonic() - started < 2
    assert not connection._thread.is_alive()
    assert not connection.connected.is_set()
    wait_until(lambda: stub.closes, what="the server seeing the close")
    assert stub.closes == [(1000, "")]
    connection.close()  # idempotent
    assert stub.connections == 1  # and nothing reconnected


def test_close_while_waiting_to_reconnect(connections: Callable[..., Connection]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as unused:
        port = unused.getsockname()[1]
    connection = connections(port, backoff=Backoff(initial=timedelta(seconds=20), rng=random.Random(1)))
    wait_until(lambda: connection.backoff.attempts >= 1, what="a failed attempt")
    started = time.monotonic()
    connection.close(timedelta(seconds=5))
    assert time.monotonic() - started < 1  # not the 16-20 s backoff
    assert not connection._thread.is_alive()


def _all_text(record: logging.LogRecord) -> str:
    formatted = logging.Formatter("%(name)s %(levelname)s %(message)s").format(record)
    return f"{formatted} {record.msg!r} {record.args!r}"


@pytest.mark.parametrize("case", ["refused", "bad port", "not ws"])
def test_the_key_is_never_logged(stubs: Callable[..., RelayStub], connections: Callable[..., Connection],
                                 caplog: pytest.LogCaptureFixture, case: str) -> None:
    caplog.set_level(logging.DEBUG, logger="relay_dbos")
    caplog.set_level(logging.DEBUG, logger="relay_dbos.websockets")
    if case == "refused":
        stub = stubs(refuse=HTTPStatus.FORBIDDEN)
        connection = connections(stub.port)
        wait_until(lambda: len(stub.requests) >= 3, what="three refused attempts")
    else:
        connection = connections(0, base_url="ws://127.0.0.1:99999/" if case == "bad port" else "http://127.0.0.1:1/")
        wait_until(lambda: connection.backoff.attempts >= 3, what="three failed attempts")
    connection.close()
    texts = [_all_text(r) for r in caplog.records]
    for text in texts:
        assert KEY not in text and QUOTED_KEY not in text and "s3cr3t" not in text, text
    if case == "refused":
        assert sum("Relay refused the connection" in t and "HTTP 403" in t for t in texts) >= 3
        websockets_debug = [t for t in texts if t.startswith("relay_dbos.websockets DEBUG")]
        assert any(f"> GET /websocket/{APP}/*** HTTP/1.1" in t for t in websockets_debug), websockets_debug
        assert any("< HTTP/1.1 403" in t for t in websockets_debug)
    else:
        failures = [t for t in texts if "cannot reach Relay" in t]
        assert len(failures) >= 3
        assert "/websocket/relay-client-tests/***" in failures[0] or "Port out of range" in failures[0]


def test_connect_runs_the_client_until_close(stubs: Callable[..., RelayStub], dbos_env: DbosEnv,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The public ``connect()``: URL and key from the environment, the application's name from the system
    database, the metadata in ``executor_info``; ``close()`` (here by ``with``) ends it with a normal close."""
    stub = stubs()
    monkeypatch.setenv("RELAY_URL", f"ws://127.0.0.1:{stub.port}/")
    monkeypatch.setenv("RELAY_API_KEY", KEY)
    with relay_dbos.connect(executor_metadata={"pod": "orders-0"}, ping_interval=timedelta(seconds=0.2),
                            pong_timeout=timedelta(seconds=1)) as relay:
        reply = stub.reply()
        assert reply["executor_metadata"] == {"pod": "orders-0"}
        assert reply["executor_id"] == dbos_env.executor_id
        assert stub.requests == [f"/websocket/{APP}/{QUOTED_KEY}"]
        assert relay.wait_connected(timedelta(seconds=5)) and relay.connected
    assert not relay.connected
    wait_until(lambda: stub.closes == [(1000, "")], what="the normal close")
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("relay-dbos")],
               what="every thread of the client ending")


def test_connect_needs_a_url_and_a_key(dbos_env: DbosEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAY_URL", raising=False)
    monkeypatch.delenv("RELAY_API_KEY", raising=False)
    with pytest.raises(ValueError, match="no Relay URL"):
        relay_dbos.connect(key=KEY)
    with pytest.raises(ValueError, match="no API key"):
        relay_dbos.connect(url="ws://127.0.0.1:1/")
