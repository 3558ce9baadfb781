"""The uvicorn internals Relay's socket code builds on, checked one by one.

``gateway.liveness``, ``gateway.ws`` and ``gateway.http_limits`` subclass uvicorn's websockets-sansio and h11
protocol classes: they override some of their methods (uvicorn must still call them), call others, and read and
write their instance attributes. None of that is uvicorn's public API, so a uvicorn release may rename or rewire
any of it, and a rename would not fail loudly: an override uvicorn no longer calls is just a method nobody calls
(liveness would fall back to uvicorn's own per-socket timers, or stop pinging). These tests name every such
internal and fail, naming it, when it is gone or has changed shape; ``pyproject.toml`` pins the uvicorn releases
they pass on.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
import tomllib
from collections.abc import Iterator
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import h11
import pytest
import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from gateway import http_limits, liveness, ws
from gateway.liveness import LivenessProtocol
from tests.transports import ServerTransport

ROOT = Path(__file__).resolve().parents[2]

# Methods of WebSocketsSansIOProtocol that Relay overrides (uvicorn must call them: the comment says when) or
# calls, with their parameters.
SANSIO_METHODS: dict[str, tuple[str, ...]] = {
    "__init__": ("self", "config", "server_state", "app_state", "_loop"),
    "connection_made": ("self", "transport"),  # overridden: stamps the first frame time
    "data_received": ("self", "data"),  # overridden: every frame, control frames included, moves the deadline
    "connection_lost": ("self", "exc"),  # overridden: the executor's `disconnected`
    "handle_connect": ("self", "event"),  # overridden: called with the upgrade request; executor paths stay here
    "send_receive_event_to_app": ("self",),  # overridden: called per complete message; executor frames stay here
    "start_keepalive": ("self",),  # overridden: pings come from the shared ticker
    "stop_keepalive": ("self",),  # overridden: called when the socket closes
    "schedule_ping": ("self",),  # overridden to do nothing: uvicorn arms its per-socket ping timer through it
    "handle_ping": ("self",),  # overridden: called per ping received, its pong queued by websockets
    "send_keepalive_ping": ("self",),  # called by the ticker
    "handle_parser_exception": ("self",),  # called after failing a frame that is not UTF-8
    "on_task_complete": ("self", "task"),  # called: the handshake task's done callback
}
# Instance attributes of WebSocketsSansIOProtocol that Relay reads or writes (set by __init__ or connection_made).
SANSIO_ATTRIBUTES = {
    "conn", "loop", "tasks", "client", "transport", "default_headers", "handshake_initiated", "handshake_complete",
    "close_sent", "disconnected", "close_timer", "close_timeout", "frames", "curr_msg_data_type", "writable",
    "ping_interval", "ping_timeout", "pending_ping_payload",
}
# The same for uvicorn's h11 protocol (``http_limits.GuardedHTTP``).
H11_METHODS: dict[str, tuple[str, ...]] = {
    "__init__": ("self", "config", "server_state", "app_state", "_loop"),
    "connection_made": ("self", "transport"),  # overridden: arms the header timeout
    "connection_lost": ("self", "exc"),  # overridden: disarms it
    "data_received": ("self", "data"),  # overridden: the head limits, before h11 parses
    "handle_websocket_upgrade": ("self", "event"),  # overridden: called with the parsed upgrade request
}
H11_ATTRIBUTES = {"conn", "loop", "transport", "client"}
# uvicorn.Config keywords `relay gateway` and `relay dev` serve with (cli/serve.py).
CONFIG_KEYWORDS = {"host", "port", "http", "ws", "ws_ping_interval", "ws_ping_timeout", "ws_per_message_deflate",
                   "ws_max_size", "log_level", "lifespan"}


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not reached")


def _config(**kwargs: Any) -> uvicorn.Config:
    config = uvicorn.Config(_no_app, log_config=None, **kwargs)
    config.load()
    return config


# -- the pin -------------------------------------------------------------------------------------------------------


def test_the_installed_uvicorn_is_in_the_pinned_range() -> None:
    """The range in pyproject.toml is the one these tests (and the suite) ran on: it has an upper bound."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [Requirement(d) for d in dependencies if Requirement(d).name == "uvicorn"]
    assert any(s.operator == "<" for s in pin.specifier), f"{pin}: pin below the next untested release"
    assert pin.specifier.contains(version("uvicorn")), f"uvicorn {version('uvicorn')} is outside {pin}"


# -- names and shapes ----------------------------------------------------------------------------------------------


def _parameters(cls: type, name: str) -> tuple[str, ...]:
    function = getattr(cls, name, None)
    assert callable(function), f"{cls.__qualname__}.{name} is gone"
    return tuple(inspect.signature(function).parameters)


@pytest.mark.parametrize("name", sorted(SANSIO_METHODS))
def test_websockets_sansio_methods(name: str) -> None:
    assert _parameters(WebSocketsSansIOProtocol, name) == SANSIO_METHODS[name], name


@pytest.mark.parametrize("name", sorted(H11_METHODS))
def test_h11_methods(name: str) -> None:
    assert _parameters(H11Protocol, name) == H11_METHODS[name], name


def test_instance_attributes() -> None:
    loop = asyncio.new_event_loop()
    try:
        sansio = WebSocketsSansIOProtocol(_config(), ServerState(), {}, _loop=loop)
        sansio.connection_made(ServerTransport())
        http = H11Protocol(_config(ws="websockets-sansio"), ServerState(), {}, _loop=loop)
        http.connection_made(ServerTransport())
    finally:
        loop.close()
    assert sorted(a for a in SANSIO_ATTRIBUTES if not hasattr(sansio, a)) == []
    assert isinstance(sansio.conn, ServerProtocol)
    assert sorted(a for a in H11_ATTRIBUTES if not hasattr(http, a)) == []
    assert isinstance(http.conn, h11.Connection)
    assert hasattr(http.conn, "their_state") and hasattr(http.conn, "trailing_data")


def test_config_keywords() -> None:
    assert sorted(CONFIG_KEYWORDS - set(inspect.signature(uvicorn.Config).parameters)) == []


def _self_attributes(path: Path, classes: set[str]) -> set[str]:
    """Every ``self.<name>`` in the methods of ``classes`` in the file at ``path``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "self"}
    return names


def _own(cls: type, base: type) -> set[str]:
    """What Relay's classes between ``cls`` and ``base`` define themselves: methods, class attributes, and instance
    attributes first set in their ``__init__``s."""
    own: set[str] = set()
    for klass in cls.__mro__[:cls.__mro__.index(base)]:
        own |= set(vars(klass)) | set(getattr(klass, "__annotations__", {}))
        init = vars(klass).get("__init__")
        if init is not None:
            tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
            own |= {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign)
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return own


def test_every_internal_relay_uses_is_listed_here() -> None:
    """A ``self.<name>`` in Relay's protocol classes that Relay does not define is uvicorn's: it must be in the
    lists above, so the tests above check it. (Overriding a name uvicorn defines keeps it uvicorn's.)"""
    sansio_used = (_self_attributes(ROOT / "gateway/liveness.py", {"LivenessProtocol"})
                   | _self_attributes(ROOT / "gateway/ws.py", {"ExecutorSocket"}))
    sansio_relay = _own(ws.ExecutorSocket, WebSocketsSansIOProtocol) - set(dir(WebSocketsSansIOProtocol))
    unlisted = sansio_used - sansio_relay - SANSIO_ATTRIBUTES - set(SANSIO_METHODS)
    assert sorted(unlisted) == [], "uvicorn internals used by gateway/liveness.py or gateway/ws.py, unchecked"

    h11_used = _self_attributes(ROOT / "gateway/http_limits.py", {"GuardedHTTP"})
    h11_relay = _own(http_limits.GuardedHTTP, H11Protocol) - set(dir(H11Protocol))
    unlisted = h11_used - h11_relay - H11_ATTRIBUTES - set(H11_METHODS)
    assert sorted(unlisted) == [], "uvicorn internals used by gateway/http_limits.py, unchecked"


# -- uvicorn still calls what Relay overrides ----------------------------------------------------------------------


class _Recording(WebSocketsSansIOProtocol):
    """uvicorn's protocol with the hooks Relay overrides recorded, not acted on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, Any]] = []

    def handle_connect(self, event: Request) -> None:
        self.calls.append(("handle_connect", event))

    def send_receive_event_to_app(self) -> None:
        self.calls.append(("message", (self.curr_msg_data_type, b"".join(bytes(f) for f in self.frames))))
        self.frames = []

    def stop_keepalive(self) -> None:
        self.calls.append(("stop_keepalive", None))

    def handle_ping(self) -> None:
        self.calls.append(("handle_ping", b"".join(self.conn.data_to_send())))


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_the_upgrade_and_each_message_reach_the_hooks(loop: asyncio.AbstractEventLoop) -> None:
    protocol = _Recording(_config(ws_ping_interval=None), ServerState(), {}, _loop=loop)
    protocol.connection_made(ServerTransport())
    protocol.data_received(b"GET /websocket/app/key HTTP/1.1\r\nHost: relay.test\r\nUpgrade: websocket\r\n"
                           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           b"Sec-WebSocket-Version: 13\r\n\r\n")
    [(hook, request)] = protocol.calls
    assert hook == "handle_connect" and isinstance(request, Request) and request.path == "/websocket/app/key"

    # Past the handshake (as gateway.ws answers it), frames arrive as whole messages through the hook.
    protocol.conn = ServerProtocol(state=State.OPEN, max_size=None)
    client = ClientProtocol(parse_uri("ws://relay.test/"), state=State.OPEN, max_size=None)
    client.send_text(b'{"type": "executor_info"}')
    client.send_binary(b"\x00\x01")
    client.send_text(b"one ", fin=False)
    client.send_continuation(b"message", fin=True)
    client.send_ping(b"hb")
    protocol.data_received(b"".join(client.data_to_send()))
    assert protocol.calls[1:4] == [("message", ("text", b'{"type": "executor_info"}')),
                                   ("message", ("bytes", b"\x00\x01")), ("message", ("text", b"one message"))]
    [(hook, pong)] = protocol.calls[4:]  # a ping reaches its hook with websockets' pong queued, not yet written
    assert hook == "handle_ping"
    client.receive_data(pong)
    [frame] = client.events_received()
    assert isinstance(frame, Frame) and frame.opcode is Opcode.PONG and frame.data == b"hb"

    protocol.connection_lost(None)
    assert protocol.calls[-1] == ("stop_keepalive", None)


def test_pings_go_through_the_ticker_not_per_socket_timers(loop: asyncio.AbstractEventLoop,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With Relay's overrides (and no pong timeout, as `relay gateway` configures it), a socket's pings leave no
    timer of uvicorn's behind: uvicorn arms its next ping only through ``schedule_ping``, and a pong deadline only
    with a timeout. The one timer is the shared ticker."""
    config = _config(ws_ping_interval=20.0, ws_ping_timeout=None)
    protocol = ws.executor_protocol(timedelta(seconds=25), lambda: pytest.fail("no gateway needed"))(
        config, ServerState(), {}, _loop=loop)
    armed: list[Any] = []
    call_later = loop.call_later

    def recording(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        armed.append(callback)
        return call_later(delay, callback, *args)

    monkeypatch.setattr(loop, "call_later", recording)
    transport = ServerTransport()
    protocol.connection_made(transport)
    protocol.conn = ServerProtocol(state=State.OPEN, max_size=None)
    protocol.start_keepalive()
    protocol.send_keepalive_ping()
    protocol.check(loop.time())
    assert protocol.next_ping_at is not None and protocol.pending_ping_payload is not None
    client = ClientProtocol(parse_uri("ws://relay.test/"), state=State.OPEN, max_size=None)
    client.receive_data(bytes(transport.written))
    [ping] = client.events_received()
    assert isinstance(ping, Frame) and ping.opcode is Opcode.PING
    assert [getattr(c, "__self__", None) for c in armed] == [protocol.keepalive], f"uvicorn armed its own: {armed}"
    protocol.connection_lost(None)
    assert protocol.next_ping_at is None and protocol.slot is None


def test_the_upgrade_reaches_the_h11_hook(loop: asyncio.AbstractEventLoop) -> None:
    seen: list[tuple[str, str]] = []

    def refuse(target: str, source_ip: str) -> bytes:
        seen.append((target, source_ip))
        return http_limits.raw_problem(401, "no")

    cls = http_limits.http_protocol(header_timeout=timedelta(seconds=5), before_upgrade=refuse,
                                    refusal_delay=timedelta(0))
    protocol = cls(_config(http=cls, ws="websockets-sansio"), ServerState(), {}, _loop=loop)
    transport = ServerTransport()
    protocol.connection_made(transport)
    protocol.data_received(b"GET /websocket/app/key HTTP/1.1\r\nHost: relay.test\r\nUpgrade: websocket\r\n"
                           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           b"Sec-WebSocket-Version: 13\r\n\r\n")
    assert seen == [("/websocket/app/key", "10.0.0.7")]
    assert not transport.reading  # held until the refusal is sent
    protocol.connection_lost(None)


# -- every frame moves the silence deadline (gateway.liveness) -----------------------------------------------------


def test_a_heartbeat_moves_the_deadline_and_gets_websockets_own_pong(loop: asyncio.AbstractEventLoop,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``LivenessProtocol.data_received`` stamps every read, a ping's included, and hands it on to uvicorn: the ping
    goes through websockets' frame parser, whole or in pieces, and the pong written is websockets' own."""
    protocol = LivenessProtocol(_config(ws_ping_interval=None), ServerState(), {}, _loop=loop)
    transport = ServerTransport()
    protocol.connection_made(transport)
    protocol.conn = ServerProtocol(state=State.OPEN, max_size=None)
    client = ClientProtocol(parse_uri("ws://relay.test/"), state=State.OPEN, max_size=None)
    client.send_ping(b"hb")
    [ping] = client.data_to_send()
    websockets_server = ServerProtocol(state=State.OPEN, max_size=None)
    websockets_server.receive_data(ping)
    pong = b"".join(websockets_server.data_to_send())
    for at, pieces in ((100.0, [ping]), (200.0, [ping[:3], ping[3:]])):
        monkeypatch.setattr(loop, "time", lambda at=at: at)
        for piece in pieces:
            protocol.data_received(piece)
            assert protocol.last_frame_at == at
        assert bytes(transport.written) == pong
        transport.written.clear()
    client.receive_data(pong)
    [frame] = client.events_received()
    assert isinstance(frame, Frame) and frame.opcode is Opcode.PONG and frame.data == b"hb"
    protocol.connection_lost(None)


@pytest.mark.parametrize("echoed", [False, True])
def test_an_echoed_socket_gets_a_second_pong_after_each_ping(loop: asyncio.AbstractEventLoop,
                                                            monkeypatch: pytest.MonkeyPatch, echoed: bool) -> None:
    """With ``echo_pings``, a ping is answered at once by websockets and again, unasked, ``ECHO_AFTER`` later by
    the ticker (not before), one such pong at a time however often the client pings. Without it, one pong a ping."""
    now = [100.0]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    protocol = LivenessProtocol(_config(ws_ping_interval=None), ServerState(), {}, _loop=loop)
    transport = ServerTransport()
    protocol.connection_made(transport)
    protocol.conn = ServerProtocol(state=State.OPEN, max_size=None)
    protocol.echo_pings = echoed
    client = ClientProtocol(parse_uri("ws://relay.test/"), state=State.OPEN, max_size=None)

    def pongs_written() -> list[bytes]:
        client.receive_data(bytes(transport.written))
        transport.written.clear()
        frames = client.events_received()
        assert all(isinstance(f, Frame) and f.opcode is Opcode.PONG for f in frames), frames
        return [bytes(f.data) for f in frames if isinstance(f, Frame)]

    def ping(payload: bytes) -> None:
        client.send_ping(payload)
        protocol.data_received(b"".join(client.data_to_send()))

    echo = liveness.ECHO_AFTER.total_seconds()
    ping(b"one")
    assert pongs_written() == [b"one"]
    now[0] += echo / 2
    protocol.check(now[0])
    assert pongs_written() == []
    ping(b"two")  # one unsolicited pong is due already: this ping does not move it or add one
    assert pongs_written() == [b"two"]
    now[0] += echo / 2 - 0.01
    protocol.check(now[0])
    assert pongs_written() == []
    now[0] += 0.02
    protocol.check(now[0])
    assert pongs_written() == ([b""] if echoed else [])
    now[0] += 2 * echo  # (within the ping wait: the socket stays)
    protocol.check(now[0])
    assert pongs_written() == []  # one for those pings, not a stream
    assert protocol.echo_at is None
    ping(b"three")
    now[0] += echo
    protocol.check(now[0])
    assert pongs_written() == ([b"three", b""] if echoed else [b"three"])
    protocol.connection_lost(None)
