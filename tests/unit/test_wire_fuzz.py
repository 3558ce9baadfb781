"""Malformed and adversarial executor replies against the gateway: ``wire.parse_reply``, the ``Session`` state
machine, and the socket code around them (the real ``ws.ExecutorSocket`` protocol fed real frames, with a fake gateway).

Properties: decoding and ``Session.receive`` either succeed or raise ``ProtocolError``, never anything else; a
valid handshake always opens the session, whatever came before it; the socket keeps serving after malformed
frames, fails the request a malformed reply answers, and logs and audits each malformed frame (rate-limited),
with a reason of bounded size however large the frame.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import pytest
import uvicorn
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.frames import Close, Opcode
from websockets.frames import Frame as WsFrame
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from core import models, wire
from core.errors import ExecutorUnavailableError, IdentityError, ProtocolError
from core.store import Principal
from gateway import session as sm
from gateway import ws
from gateway.admission import Admission
from gateway.hub import Connection, Hub
from gateway.runtime import Gateway
from tests.quick import examples
from tests.support import LogRecords
from tests.transports import ServerTransport
from workflows.contracts.common import ConnectedSignal

# Audit rows and log lines quote the reason: a frame of megabytes must not make one of megabytes.
MAX_REASON = 1000
HUGE = 1_000_000

# -- strategies ------------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**64) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
request_ids = st.sampled_from(["r1", "r2", "dup", ""]) | st.text(max_size=12)

# The fields of each reply the gateway understands, with a valid value for each (kept equal to the models by
# test_the_field_table_matches_the_wire_models).
_optional_text = st.none() | st.text(max_size=20)
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "executor_info": {"executor_id": st.text(min_size=1, max_size=20), "application_version": _optional_text,
                      "hostname": _optional_text, "language": _optional_text, "dbos_version": _optional_text,
                      "executor_metadata": st.none() | st.dictionaries(st.text(max_size=5), json_values, max_size=3)},
    "recovery": {"success": st.booleans()},
    "exist_pending_workflows": {"exist": st.booleans()},
    "retention": {"success": st.booleans()},
}
COMMON: dict[str, st.SearchStrategy[Any]] = {"request_id": request_ids, "error_message": _optional_text}


@st.composite
def valid_replies(draw: st.DrawFn, type_: str | None = None, request_id: str | None = None) -> dict[str, Any]:
    """A reply the gateway must accept: every field of its type valid, some optional ones left out, and
    unknown fields added (SDKs add fields between releases)."""
    type_ = type_ or draw(st.sampled_from(sorted(FIELDS)))
    reply: dict[str, Any] = {"type": type_}
    for name, values in {**COMMON, **FIELDS[type_]}.items():
        required = name in ("request_id", "executor_id", "success", "exist")
        if required or draw(st.booleans()):
            reply[name] = draw(values)
    if request_id is not None:
        reply["request_id"] = request_id
    known = {"type", *COMMON, *FIELDS[type_]}
    reply.update(draw(st.dictionaries(st.text(max_size=8).filter(lambda k: k not in known), json_values, max_size=2)))
    return reply


@st.composite
def broken_replies(draw: st.DrawFn, *, huge: bool = True) -> dict[str, Any]:
    """A valid reply with one thing wrong: any field (``type`` too) of any wrong type, or a field missing."""
    reply = draw(valid_replies())
    name = draw(st.sampled_from(sorted(reply)))
    if draw(st.booleans()):
        del reply[name]
    else:
        odd = ["\ud800", "\x00", *(["x" * HUGE] if huge else [])]
        reply[name] = draw(json_values | st.sampled_from(odd))
    return reply


def _nested(depth: int, opener: str) -> str:
    if opener == "[":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


deep = st.builds(_nested, st.integers(min_value=1, max_value=100_000), st.sampled_from("[{"))
deep_in_reply = st.builds(
    lambda depth, reply: json.dumps(reply)[:-1] + ', "nested": ' + "[" * depth + "]" * depth + "}",
    st.integers(min_value=1, max_value=100_000), valid_replies(),
)
huge = st.builds(lambda reply, name, size: json.dumps({**reply, name: "x" * size}),
                 valid_replies(), st.sampled_from(["type", "request_id", "executor_id", "error_message", "zz"]),
                 st.sampled_from([10_000, HUGE]))
invalid_utf8 = st.builds(lambda prefix, bad, suffix: prefix + bad + suffix,
                         st.sampled_from([b"", b'{"type": "recovery", "request_id": "']),
                         st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80"]),
                         st.sampled_from([b"", b'", "success": true}']))
encoded = st.builds(lambda reply, encoding: json.dumps(reply).encode(encoding), valid_replies(),
                    st.sampled_from(["utf-8", "utf-16", "utf-32", "utf-8-sig"]))


@dataclass(frozen=True)
class Frame:
    """One frame from the executor; its repr is clipped, so a failing megabyte frame prints as a line."""

    data: str | bytes

    def __repr__(self) -> str:
        full = repr(self.data)
        return full if len(full) <= 160 else f"{full[:100]}...{full[-40:]} ({len(self.data)} long)"


frames: st.SearchStrategy[Frame] = st.one_of(
    json_values.map(json.dumps),
    valid_replies().map(json.dumps),
    broken_replies().map(json.dumps),
    valid_replies().map(lambda r: json.dumps({**r, "type": "fancy"})),  # a type the gateway does not know
    deep, deep_in_reply, huge, invalid_utf8, encoded,
    st.text(), st.binary(),
).map(Frame)
# Small frames for the long state-machine runs, which model requests and replies: shrinking a failure through
# megabyte frames takes minutes there. The frames above cover what is adversarial in a single frame.
light_frames: st.SearchStrategy[Frame] = st.one_of(
    valid_replies().map(json.dumps),
    broken_replies(huge=False).map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=40), st.binary(max_size=40),
).map(Frame)

FUZZ = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])
# Found by this test; kept as explicit examples so they are tried on every run.
DEEP = Frame("[" * 100_000 + "]" * 100_000)
TYPE_LIST = Frame('{"type": ["recovery"], "request_id": "r1"}')
TYPE_HUGE = Frame(json.dumps({"type": "x" * HUGE, "request_id": 5}))
UNKNOWN_ID_HUGE = Frame(json.dumps({"type": "recovery", "request_id": "x" * HUGE, "success": True}))
ADVERSARIAL = [DEEP, TYPE_LIST, TYPE_HUGE, UNKNOWN_ID_HUGE]


# Python's JSON parser recurses; it parses this deep on any stack a test or the gateway runs on.
PARSED_DEPTH = 500


def _text_depth(data: str | bytes) -> int:
    """How deep the brackets of a frame's JSON text nest, strings skipped (its nesting, before any parse)."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    depth = deepest = 0
    quoted = escaped = False
    for char in text:
        if quoted:
            escaped, quoted = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _clipped(reason: str) -> None:
    length = len(reason)
    assert length <= MAX_REASON, f"a {length}-character reason: {reason[:80]!r}..."


def _receive(session: sm.Session, frame: Frame) -> sm.Event | ProtocolError:
    """``Session.receive``'s event, or the ProtocolError it raised; anything else fails the test."""
    try:
        event = session.receive(frame.data)
    except ProtocolError as err:
        failure = err
    else:
        if isinstance(event, sm.Ignored):
            _clipped(event.reason)  # logged each time
        return event
    _clipped(failure.detail)
    return failure


def _open_session(*pending: str) -> sm.Session:
    session = sm.Session()
    session.receive(json.dumps({"type": "executor_info", "request_id": session.info_request_id, "executor_id": "e"}))
    for request_id in pending:
        session.expect(request_id)
    return session


# -- decoding and the state machine -----------------------------------------------------------------------------


def test_the_field_table_matches_the_wire_models() -> None:
    for model in (wire.ExecutorInfoReply, wire.RecoveryReply, wire.ExistPendingWorkflowsReply, wire.RetentionReply):
        type_ = model.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
        assert set(model.model_fields) == {"type", *COMMON, *FIELDS[type_]}, model


@given(frames)
@FUZZ
@example(DEEP)
@example(TYPE_LIST)
@example(TYPE_HUGE)
def test_parse_reply_decodes_or_raises_protocol_error(frame: Frame) -> None:
    try:
        reply = wire.parse_reply(frame.data)
    except ProtocolError as err:
        failure = err
    else:
        assert isinstance(reply, wire.ExecutorInfoReply | wire.RecoveryReply | wire.ExistPendingWorkflowsReply
                          | wire.RetentionReply | wire.OtherReply)
        return
    _clipped(failure.detail)


@given(st.lists(frames, max_size=6), valid_replies("executor_info"))
@FUZZ
@example(ADVERSARIAL, {"type": "executor_info", "request_id": "", "executor_id": "e"})
def test_a_valid_handshake_opens_the_session_whatever_came_first(garbage: list[Frame], info: dict[str, Any]) -> None:
    session = sm.Session()
    for frame in garbage:
        # Before the handshake nothing but the handshake is acceptable; the socket code closes on this error.
        assert isinstance(_receive(session, frame), ProtocolError)
        assert session.state is sm.State.AWAITING_INFO
    event = session.receive(json.dumps({**info, "request_id": session.info_request_id}))
    assert isinstance(event, sm.Handshake) and event.info.executor_id == info["executor_id"]
    assert session.state is sm.State.OPEN


@given(st.lists(frames, max_size=12))
@FUZZ
@example(ADVERSARIAL)
def test_an_open_session_survives_any_frames(garbage: list[Frame]) -> None:
    session = _open_session("r1", "r2", "dup")
    for frame in garbage:
        event = _receive(session, frame)
        assert session.state is sm.State.OPEN
        if isinstance(event, sm.Reply):
            assert event.reply.request_id not in session.pending  # answered once


class SessionMachine(RuleBasedStateMachine):
    """The session against a model: which requests are pending, and whether the handshake happened."""

    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.session = sm.Session()
        self.open = False
        self.closed = False
        self.pending: set[str] = set()

    @rule(target=requests, request_id=request_ids)
    def expect(self, request_id: str) -> str:
        self.session.expect(request_id)  # the same id twice: one pending entry, answered once
        self.pending.add(request_id)
        return request_id

    @rule(request_id=requests)
    def forget(self, request_id: str) -> None:
        self.session.forget(request_id)
        self.pending.discard(request_id)

    @rule(info=valid_replies("executor_info"))
    def handshake(self, info: dict[str, Any]) -> None:
        event = _receive(self.session, Frame(json.dumps({**info, "request_id": self.session.info_request_id})))
        if self.closed or self.open:  # once open, a second executor_info reply answers nothing pending
            assert isinstance(event, sm.Ignored)
        else:
            assert isinstance(event, sm.Handshake)
            self.open = True

    @rule(request_id=requests, data=st.data())
    def reply(self, request_id: str, data: st.DataObject) -> None:
        reply = data.draw(valid_replies(request_id=request_id) | valid_replies(request_id=request_id).map(
            lambda r: {**r, "type": "fancy"}))
        event = _receive(self.session, Frame(json.dumps(reply)))
        if self.closed:
            assert isinstance(event, sm.Ignored)
        elif not self.open:
            assert isinstance(event, ProtocolError)
        elif request_id in self.pending:
            assert isinstance(event, sm.Reply) and event.reply.request_id == request_id
            self.pending.discard(request_id)
        else:  # late, duplicated, or never asked for
            assert isinstance(event, sm.Ignored)

    @rule(frame=light_frames)
    def anything(self, frame: Frame) -> None:
        event = _receive(self.session, frame)
        if isinstance(event, sm.Reply):
            self.pending.discard(event.reply.request_id)
        if isinstance(event, sm.Handshake):
            self.open = True

    @rule()
    def close(self) -> None:
        self.session.close()
        self.closed = True
        self.pending.clear()

    @invariant()
    def matches_the_model(self) -> None:
        expected = sm.State.CLOSED if self.closed else sm.State.OPEN if self.open else sm.State.AWAITING_INFO
        assert self.session.state is expected
        assert self.session.pending == self.pending


SessionMachine.TestCase.settings = settings(max_examples=examples(100), stateful_step_count=25, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_session_state_machine = SessionMachine.TestCase


# -- the socket code: the real ExecutorSocket protocol, fed real frames, with a fake gateway ---------------------


HANDSHAKE = Frame("stands for a valid executor_info reply to the request the server sent")


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("executor sockets never reach the ASGI app")


def _protocol(gw: FakeGateway) -> ws.ExecutorSocket:
    """A connection's protocol object, as uvicorn makes it (no server pings, so tests drive every frame)."""
    config = uvicorn.Config(_no_app, log_config=None, ws_ping_interval=None)
    config.load()
    return ws.executor_protocol(timedelta(seconds=25), lambda: cast(Gateway, gw))(config, ServerState(), {})


class Peer:
    """An executor on the other end of a real ``ws.ExecutorSocket`` whose handshake with the HTTP layer is done:
    frames go through websockets' real client and server frame code in both directions."""

    def __init__(self, gw: FakeGateway) -> None:
        self.protocol = _protocol(gw)
        self.protocol.conn = ServerProtocol(state=State.OPEN, max_size=None)
        self.protocol.handshake_complete = True
        self.client = ClientProtocol(parse_uri("ws://relay.test/"), state=State.OPEN, max_size=None)
        self.transport = ServerTransport(self.client)
        self.protocol.connection_made(self.transport)
        self.info_request_id: str | None = None
        self.closed: tuple[int, str] | None = None
        self.received: list[str] = []

    def send(self, frame: Frame) -> None:
        if self.client.state is not State.OPEN:  # the server's close frame came: the executor stops sending
            return
        data = _on_the_wire(frame).data
        if frame is HANDSHAKE:
            assert self.info_request_id is not None
            data = json.dumps({"type": "executor_info", "request_id": self.info_request_id,
                               "executor_id": "ex-1", "application_version": "v1"})
        if isinstance(data, str):
            self.client.send_text(data.encode())
        else:
            self.client.send_binary(data)
        self.protocol.data_received(b"".join(self.client.data_to_send()))

    def read(self) -> list[str]:
        """The text frames the server sent since the last read; a close frame is noted in ``closed``."""
        texts = []
        for event in self.client.events_received():
            if isinstance(event, WsFrame) and event.opcode is Opcode.TEXT:
                text = bytes(event.data).decode()
                texts.append(text)
                if json.loads(text).get("type") == "executor_info":
                    self.info_request_id = json.loads(text)["request_id"]
            elif isinstance(event, WsFrame) and event.opcode is Opcode.CLOSE:
                close = Close.parse(bytes(event.data))
                self.closed = (close.code, close.reason)
        self.received += texts
        return texts

    def leave(self) -> None:
        """The executor goes away (TCP closed)."""
        self.transport.closing = True
        self.protocol.connection_lost(None)


def _on_the_wire(frame: Frame) -> Frame:
    """A text frame is UTF-8 on the wire: text that cannot be encoded (lone surrogates) travels as bytes."""
    if isinstance(frame.data, str):
        try:
            frame.data.encode()
        except UnicodeEncodeError:
            return Frame(frame.data.encode(errors="surrogatepass"))
    return frame


@dataclass
class FakeStore:
    audits: list[dict[str, Any]] = field(default_factory=list)
    # join() says it was called, then waits for ``proceed`` (a slow database, in its thread).
    looking_up: threading.Event = field(default_factory=threading.Event)
    proceed: threading.Event = field(default_factory=threading.Event)

    def write_audit(self, **row: Any) -> None:
        self.audits.append(row)

    def join(self, key: str, name: str, **_: Any) -> tuple[Principal, models.Application | None]:
        self.looking_up.set()
        assert self.proceed.wait(5)
        return Principal("key-1", "fleet", "acme", None), models.Application(id="app-1", org="acme", name=name)


@dataclass
class FakeSettings:
    handshake_timeout: timedelta = timedelta(seconds=5)


@dataclass
class FakeGateway:
    """What ``ws.ExecutorSocket`` uses of ``runtime.Gateway``, with Temporal replaced by lists."""

    store: FakeStore = field(default_factory=FakeStore)
    settings: FakeSettings = field(default_factory=FakeSettings)
    hub: Hub = field(default_factory=Hub)
    admission: Admission = field(default_factory=lambda: Admission(clock=lambda: 0.0))  # time stands still
    task_queue: str = "relay-gateway-fuzz"
    fenced: bool = False  # in contact with Temporal: upgrades are not refused for want of it
    draining: bool = False  # not shutting down (SIGTERM): upgrades are not refused for that either
    connected: list[ConnectedSignal] = field(default_factory=list)
    disconnected: list[str] = field(default_factory=list)
    background: list[asyncio.Future[object]] = field(default_factory=list)

    async def signal_connected(self, org: str, app: str, signal: ConnectedSignal) -> bool:
        self.connected.append(signal)
        return True

    def socket_closed(self, conn: Connection) -> None:
        self.hub.detach(conn)
        self.disconnected.append(conn.connection_id)

    def spawn(self, work: Awaitable[object]) -> None:
        self.background.append(asyncio.ensure_future(work))

    async def settle(self) -> None:
        """Wait for the background work (audit writes) spawned so far."""
        await asyncio.gather(*self.background)


@contextmanager
def _gateway_log() -> Iterator[list[logging.LogRecord]]:
    """The gateway's log records (hypothesis runs many examples per test, so caplog cannot be used)."""
    handler = LogRecords()
    logger = logging.getLogger("relay.gateway")
    level = logger.level
    logger.setLevel(logging.INFO)  # the ignored frames too
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _malformed(frames_: list[Frame], *pending: str) -> int:
    """How many of ``frames_`` an open session expecting ``pending`` rejects (the oracle for the audits)."""
    session = _open_session(*pending)
    return sum(isinstance(_receive(session, _on_the_wire(frame)), ProtocolError) for frame in frames_)


SOCKET_FUZZ = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                             HealthCheck.data_too_large])
JOINED = ws.Joined("acme", "shop", "app-1", "key-1", "10.0.0.7")


async def _turns(n: int = 3) -> None:
    """Let the serving task react to what was just received."""
    for _ in range(n):
        await asyncio.sleep(0)


async def _registered(gw: FakeGateway) -> tuple[Peer, Connection]:
    peer = Peer(gw)
    serving = asyncio.ensure_future(peer.protocol.serve(cast(Gateway, gw), JOINED))
    await _turns()
    peer.read()
    peer.send(HANDSHAKE)
    await asyncio.wait_for(serving, 5)
    return peer, gw.hub.get("acme", "shop", "ex-1")


@given(st.lists(frames, max_size=8))
@SOCKET_FUZZ
@example(ADVERSARIAL)
@example([Frame("garbage")] * (ws.MALFORMED_AUDITED + 15))  # a flood: audits are rate-limited
async def test_the_socket_keeps_serving_and_audits_each_malformed_frame(garbage: list[Frame]) -> None:
    gw = FakeGateway()
    peer, conn = await _registered(gw)
    for pending in ("r1", "r2"):  # requests still pending, with nobody waiting on them
        conn.session.expect(pending)
    with _gateway_log() as log:
        request = asyncio.ensure_future(conn.request("req-1", wire.recovery_request("req-1", ["dead-1"]),
                                                     timeout=timedelta(seconds=5)))
        await asyncio.sleep(0)
        for frame in garbage:
            peer.send(frame)
        peer.send(Frame(json.dumps({"type": "recovery", "request_id": "req-1", "success": True})))
        reply = await request  # answered after all the garbage: the socket kept serving
        await gw.settle()
    peer.leave()

    assert isinstance(reply.reply, wire.RecoveryReply) and reply.reply.success
    assert gw.disconnected == [conn.connection_id] and len(gw.hub) == 0
    malformed = _malformed(garbage, "r1", "r2")
    audits = gw.store.audits
    assert min(malformed, ws.MALFORMED_AUDITED) <= len(audits) <= min(malformed, ws.MALFORMED_AUDITED + 1)
    for row in audits:
        assert (row["operation"], row["status"], row["executor_id"]) == ("executor.protocol_error", "failure", "ex-1")
        _clipped(row["details"]["reason"])
    assert len([r for r in log if "malformed frame" in r.getMessage()]) == len(audits)
    assert all(len(r.getMessage()) <= MAX_REASON + 100 for r in log)


async def test_a_malformed_reply_fails_the_request_it_answers_at_once() -> None:
    gw = FakeGateway()
    peer, conn = await _registered(gw)
    request = asyncio.ensure_future(conn.request("req-1", wire.recovery_request("req-1", ["dead-1"]),
                                                 timeout=timedelta(minutes=5)))
    await asyncio.sleep(0)
    peer.send(Frame(json.dumps({"type": "recovery", "request_id": "req-1"})))
    with pytest.raises(ProtocolError, match="success"):
        await asyncio.wait_for(request, 1)  # not at the five-minute timeout
    await gw.settle()
    [audit] = gw.store.audits
    assert "success" in audit["details"]["reason"]
    peer.leave()


async def test_a_request_to_a_closed_socket_fails_at_once() -> None:
    gw = FakeGateway()
    peer, conn = await _registered(gw)
    peer.leave()
    with pytest.raises(ExecutorUnavailableError):
        await conn.request("req-1", wire.recovery_request("req-1", ["dead-1"]), timeout=timedelta(minutes=5))


@given(st.lists(frames, max_size=3), st.booleans(), st.lists(frames, max_size=3))
@SOCKET_FUZZ
@example([TYPE_HUGE], False, [])
@example([DEEP], False, [])
@example([Frame(json.dumps({"type": "\U0001f600" * 100, "request_id": "r"}, ensure_ascii=False))], False, [])
@example([], True, ADVERSARIAL)
async def test_serve_closes_on_anything_but_a_handshake_and_serves_after_one(
    before: list[Frame], handshake: bool, after: list[Frame]
) -> None:
    gw = FakeGateway()
    script = [*before, *([HANDSHAKE] if handshake else []), *after]
    peer = Peer(gw)
    serving = asyncio.ensure_future(peer.protocol.serve(cast(Gateway, gw), JOINED))
    await _turns()
    peer.read()
    for frame in script:
        peer.send(frame)
        await _turns()
    handshake_due = peer.protocol.handshake
    async with asyncio.timeout(5):  # until it is done with what it was sent: closed, registered, or still waiting
        while not (serving.done() or (handshake_due is not None and not handshake_due.done())):  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    peer.leave()
    await asyncio.wait_for(serving, 5)
    await gw.settle()
    peer.read()

    assert json.loads(peer.received[0])["type"] == "executor_info"  # the server speaks first
    if not script:  # the peer left before answering: nothing to register
        assert not gw.connected and not gw.store.audits and peer.closed is None
    elif script[0] is HANDSHAKE:  # registered, served until the peer left, then detached and signalled
        [signal] = gw.connected
        assert (signal.info.executor_id, signal.info.application_version) == ("ex-1", "v1")
        assert gw.disconnected == [signal.connection_id] and len(gw.hub) == 0
        assert len(gw.store.audits) == _malformed(after)
    else:  # anything else first breaks the protocol: audited, closed, never registered
        # A frame too deep to parse in place of executor_info is refused for good (1008): the SDK resends it. Where
        # the parser gives up depends on the stack it runs on, so the depth is only bounded here, not predicted.
        assert peer.closed is not None
        if peer.closed[0] == IdentityError.close_code:
            assert "nested too deep to parse" in peer.closed[1] and _text_depth(script[0].data) > PARSED_DEPTH
        else:
            assert peer.closed[0] == ProtocolError.close_code
        assert len(peer.closed[1].encode()) <= 123  # RFC 6455 5.5: a close frame's reason is at most 123 bytes
        [audit] = gw.store.audits
        assert audit["operation"] == "executor.protocol_error"
        _clipped(audit["details"]["reason"])
        assert not gw.connected and len(gw.hub) == 0


@pytest.mark.parametrize("leaves", [True, False])
async def test_a_socket_gone_while_being_admitted_gives_its_key_slot_back(leaves: bool) -> None:
    gw = FakeGateway()
    protocol = _protocol(gw)
    client = ClientProtocol(parse_uri("ws://relay.test/websocket/shop/dbos_not-a-real-key"))
    transport = ServerTransport(client)
    protocol.connection_made(transport)
    request = client.connect()
    opening = asyncio.ensure_future(protocol._open(request, "shop", "dbos_not-a-real-key"))
    await asyncio.to_thread(gw.store.looking_up.wait, 5)  # the key is being looked up in the database thread
    if leaves:
        transport.closing = True
        protocol.connection_lost(None)
    gw.store.proceed.set()
    if leaves:
        await asyncio.wait_for(opening, 5)
    else:
        async with asyncio.timeout(5):
            while client.state is not State.OPEN:  # noqa: ASYNC110 - upgraded once the lookup's thread is back
                await asyncio.sleep(0.01)
    # Gone while admitted: the slot it was given is back, and no upgrade was answered. Still there: it holds one.
    assert gw.admission.open_connections("key-1") == (0 if leaves else 1)
    assert (client.state is State.OPEN) is not leaves
    if not leaves:
        transport.closing = True
        protocol.connection_lost(None)
        await asyncio.wait_for(opening, 5)
        assert gw.admission.open_connections("key-1") == 0


async def test_a_server_shutdown_right_after_the_executors_own_close_does_not_raise() -> None:
    """The executor closes first: the socket answers its close and closes its transport, and the connection stays on
    the server's list until ``connection_lost`` comes on a later turn. A shutdown in between (SIGTERM) must not send
    a second close: websockets refuses (``InvalidState``), and the exception out of the server's shutdown left the
    gateway process hanging instead of shutting its lifespan down."""
    gw = FakeGateway()
    peer, _ = await _registered(gw)
    peer.client.send_close(1000, "bye")
    peer.protocol.data_received(b"".join(peer.client.data_to_send()))
    assert peer.protocol.conn.state is not State.OPEN
    peer.protocol.shutdown()  # raised InvalidState
    assert peer.transport.closing
