"""Hardening against hostile or broken clients: wrong keys refused from memory (and quietly), oversized and slow
request heads, REST body limits, rate-limited reports of ignored frames, and identities Temporal would refuse.

The tests drive the real protocol objects (uvicorn's h11 protocol as Relay configures it, ``ws.ExecutorSocket``)
or the real stores, without a server. The same limits over real sockets, on a second `relay gateway` process:
tests/e2e/test_hardening.py; one-line activity failures: tests/workflows/test_activity_failures.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from http import HTTPStatus
from pathlib import Path
from typing import Any, cast

import pytest
import uvicorn
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.http11 import Request
from websockets.streams import StreamReader
from websockets.uri import parse_uri

from core import nesting, wire
from core.errors import AuthError, IdentityError, NestingError, ServiceUnavailableError
from core.models import make_engine
from core.store import Store, hash_key
from gateway import http_limits, identity, ws
from gateway import session as sm
from gateway.admission import Admission
from gateway.http_limits import MAX_HEADERS, MAX_LINE, BodyLimit, GuardedHTTP, head_status, http_protocol
from gateway.revocation import Watcher
from gateway.runtime import Gateway
from tests.support import LogRecords
from tests.transports import ServerTransport
from tests.unit.test_wire_fuzz import (
    JOINED,
    FakeGateway,
    FakeSettings,
    Frame,
    Peer,
    _gateway_log,
    _protocol,
    _registered,
    _turns,
)
from workflows.contracts.common import lifecycle_workflow_id


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    yield s
    s.engine.dispose()


# -- admission: the live keys, and the budget of look-ups for the others -----------------------------------------


def test_a_key_not_live_is_told_to_retry_without_a_lookup_once_the_budget_is_spent() -> None:
    clock = Clock()
    a = Admission(clock=clock, unknown_key_lookups_per_second=2, live_keys=frozenset({"live"}))
    a.check_key("new-1")  # may be newer than the refresh: looked up
    a.check_key("new-2")
    with pytest.raises(ServiceUnavailableError):
        a.check_key("new-3")  # budget spent: no look-up, and no verdict either (it may be a new key): retry
    for _ in range(100):
        a.check_key("live")  # a live key is never refused here (the database decides)
    clock.now += 0.5
    a.check_key("new-3")  # one look-up refilled


def test_keys_are_looked_up_until_the_first_refresh() -> None:
    a = Admission(clock=Clock(), unknown_key_lookups_per_second=1)
    for n in range(20):
        a.check_key(f"k{n}")


def test_one_upgrade_costs_one_lookup_however_many_layers_check_it() -> None:
    clock = Clock()
    a = Admission(clock=clock, unknown_key_lookups_per_second=1, live_keys=frozenset())
    a.check_key("new")  # the HTTP layer, before the upgrade
    a.check_key("new", upgraded=True)  # the socket, after it: the same look-up
    with pytest.raises(ServiceUnavailableError):
        a.check_key("new")  # another upgrade, and the budget is spent
    a.remember_unknown("other")
    clock.now += 1
    with pytest.raises(AuthError):
        a.check_key("other")  # unknown moments ago: refused without spending the budget...
    a.check_key("third")  # ...which is still there


async def test_sixty_upgrades_at_once_on_a_key_made_a_moment_ago_are_never_told_it_is_wrong(store: Store) -> None:
    """Sixty executors dial at once with a key made since the gateway's last refresh of the live keys (it was
    refused 24 of them with 401 "unknown or revoked API key"). The look-up budget lets ten through to the database
    and tells the rest to retry (503, ``Retry-After``); once one got in, the key is known live, and every retry
    passes without a look-up."""
    clock = Clock()  # time stands still: the budget is ten look-ups, no more
    gw = FakeGateway(store=cast(Any, store), settings=FakeSettings(handshake_timeout=timedelta(milliseconds=1)))
    gw.admission = Admission(clock=clock, live_keys=frozenset())  # refreshed before the key was made
    key = store.create_key(org="acme", name="fleet")
    check = ws.refusal_before_upgrade(lambda: cast(Gateway, gw))
    first = [check(f"/websocket/shop/{key}", f"10.0.0.{n}") for n in range(60)]  # before any look-up is done
    retry = [a for a in first if a is not None]
    assert len(retry) == 50 and all(a.startswith(b"HTTP/1.1 503 ") and b"\r\nretry-after: 1\r\n" in a
                                    for a in retry)
    # The ten let through: each socket's own check uses the look-up granted before its upgrade.
    assert await asyncio.gather(*(_upgrade_status(gw, key) for _ in range(10))) == [101] * 10
    again = [check(f"/websocket/shop/{key}", f"10.0.0.{n}") for n in range(50)]
    assert again == [None] * 50
    assert await asyncio.gather(*(_upgrade_status(gw, key) for _ in range(50))) == [101] * 50


async def test_the_watcher_keeps_the_live_key_hashes_even_with_no_socket(store: Store) -> None:
    admission = Admission(clock=Clock())
    watcher = Watcher(store=store, hub=FakeGateway().hub, admission=admission)
    key = store.create_key(org="acme", name="fleet")
    assert await watcher.sweep() == 0
    assert admission.live_keys == frozenset({hash_key(key)})
    store.revoke_token("acme", "fleet", subject="system", source_ip="")
    await watcher.sweep()
    assert admission.live_keys == frozenset()


async def test_a_key_revoked_since_the_refresh_is_refused_at_once(store: Store) -> None:
    """The live set is stale for up to half a second; a key found in it still goes to the database."""
    key = store.create_key(org="acme", name="fleet")
    gw = FakeGateway(store=cast(Any, store))
    gw.admission.live_keys = frozenset({hash_key(key)})
    store.revoke_token("acme", "fleet", subject="system", source_ip="")
    status = await _upgrade_status(gw, key)
    assert status == 401


async def _upgrade_status(gw: FakeGateway, key: str, app: str = "shop") -> int | None:
    """The HTTP status an upgrade with ``key`` is answered with by a real ``ExecutorSocket`` (101: accepted)."""
    protocol = _protocol(gw)
    client = ClientProtocol(parse_uri(f"ws://relay.test/websocket/{app}/{key}"))
    transport = ServerTransport(client)
    protocol.connection_made(transport)
    await asyncio.wait_for(protocol._open(client.connect(), app, key), 5)
    responses = [e for e in client.events_received() if hasattr(e, "status_code")]
    transport.closing = True
    protocol.connection_lost(None)
    return responses[0].status_code if responses else None


# -- refusing wrong keys before the upgrade, quietly -------------------------------------------------------------


def test_wrong_keys_are_refused_before_the_upgrade_and_reported_once() -> None:
    """Past the look-up budget a key not known live is told to retry (503, ``Retry-After``), never that it is wrong:
    only the database says that, and a key it found unknown moments ago is refused (401) from memory."""
    gw = FakeGateway()
    gw.admission = Admission(clock=time.monotonic, unknown_key_lookups_per_second=1e-9, live_keys=frozenset())
    live = "dbos_" + "l" * 43
    gw.admission.live_keys = frozenset({hash_key(live)})
    check = ws.refusal_before_upgrade(lambda: cast(Gateway, gw))
    with _gateway_log() as log:
        answers = [check(f"/websocket/shop/dbos_{secrets.token_urlsafe(32)}", "10.0.0.9") for _ in range(200)]
    assert all(a is not None and a.startswith(b"HTTP/1.1 503 ") and b"application/problem+json" in a
               and b"\r\nretry-after: 1\r\n" in a for a in answers)
    assert json.loads(answers[0].partition(b"\r\n\r\n")[2])["status"] == 503  # type: ignore[union-attr]
    assert len([r for r in log if "refused executor connection" in r.getMessage()]) == 1
    wrong = "dbos_" + "w" * 43
    gw.admission.remember_unknown(hash_key(wrong))  # the database said so
    refused = check(f"/websocket/shop/{wrong}", "10.0.0.9")
    assert refused is not None and refused.startswith(b"HTTP/1.1 401 ") and b"retry-after" not in refused
    assert check(f"/websocket/shop/{live}", "10.0.0.9") is None  # a live key goes on to the upgrade
    assert check("/v2/orgs/local/apps", "10.0.0.9") is None  # not an executor path


async def test_an_executor_refusal_writes_no_line_of_websockets_own() -> None:
    gw = FakeGateway()
    gw.admission = Admission(clock=time.monotonic, unknown_key_lookups_per_second=1e-9, live_keys=frozenset())
    handler = LogRecords()
    uvicorn_log = logging.getLogger("uvicorn.error")
    level = uvicorn_log.level
    uvicorn_log.setLevel(logging.INFO)
    uvicorn_log.addHandler(handler)
    try:
        for _ in range(3):
            assert await _upgrade_status(gw, "dbos_" + "w" * 43) == 503  # the look-up budget is spent: retry
    finally:
        uvicorn_log.removeHandler(handler)
        uvicorn_log.setLevel(level)
    assert [r.getMessage() for r in handler.records] == []  # websockets' "connection rejected (401 ...)" is gone


# -- the HTTP layer: head limits, the header timeout, refusals before the upgrade --------------------------------


async def _ok_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
    elif scope["type"] == "websocket":  # accept, then hold the socket until the client leaves
        await receive()
        await send({"type": "websocket.accept"})
        await receive()


def _http(*, header_timeout: float = 5, before_upgrade: http_limits.BeforeUpgrade | None = None,
          refusal_delay: float = 1) -> tuple[GuardedHTTP, ServerTransport]:
    """A connection's HTTP protocol object, as Relay configures uvicorn's."""
    cls = http_protocol(header_timeout=timedelta(seconds=header_timeout), before_upgrade=before_upgrade,
                        refusal_delay=timedelta(seconds=refusal_delay))
    config = uvicorn.Config(_ok_app, log_config=None, http=cls, ws="websockets-sansio", access_log=False)
    config.load()
    protocol = cls(config, ServerState(), {})
    transport = ServerTransport(peer=("10.0.0.8", 40_000))
    transport.protocol = protocol
    protocol.connection_made(transport)
    return protocol, transport


UPGRADE = ("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           "Sec-WebSocket-Version: 13\r\n")


def _head(target: str = "/healthz", *, upgrade: bool = False, headers: list[str] | None = None) -> bytes:
    lines = [f"GET {target} HTTP/1.1", "Host: relay.test", *(headers or [])]
    return ("\r\n".join(lines) + "\r\n" + (UPGRADE if upgrade else "") + "\r\n").encode()


def _target(line_bytes: int) -> str:
    """A path that makes the request line ``GET <path> HTTP/1.1`` exactly ``line_bytes`` long."""
    return "/v2/" + "a" * (line_bytes - len("GET /v2/ HTTP/1.1"))


OVER_LIMITS = {
    "request line": (_target(MAX_LINE + 1), [], HTTPStatus.REQUEST_URI_TOO_LONG),
    "header line": ("/healthz", ["X-Big: " + "b" * (MAX_LINE - 6)], HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
    "header count": ("/healthz", [f"X-{n}: v" for n in range(MAX_HEADERS)], HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
    "whole head": ("/healthz", [f"X-{n}: " + "c" * 6000 for n in range(3)], HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
}


@pytest.mark.parametrize("upgrade", [False, True], ids=["rest", "upgrade"])
@pytest.mark.parametrize("case", sorted(OVER_LIMITS))
async def test_a_head_over_a_limit_is_answered_at_once_with_a_problem(case: str, upgrade: bool) -> None:
    target, headers, status = OVER_LIMITS[case]
    protocol, transport = _http()
    head = _head(target, upgrade=upgrade, headers=headers)
    protocol.data_received(head)
    assert transport.status == status and transport.closing
    head_part, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head_part
    assert json.loads(body)["status"] == status
    protocol.connection_lost(None)


async def test_a_head_that_grows_over_the_limit_across_reads_is_refused() -> None:
    protocol, transport = _http()
    protocol.data_received(b"GET /healthz HTTP/1.1\r\nHost: relay.test\r\n")
    assert transport.written == b""
    for n in range(3):
        protocol.data_received(f"X-{n}: ".encode() + b"d" * 6000 + b"\r\n")
    assert transport.status == 431 and transport.closing
    protocol.connection_lost(None)


UPGRADE_HEADERS = 5  # Host, and the four of UPGRADE
JUST_WITHIN_AND_OVER = {  # (target, headers) one byte or one header within each limit, and one over it
    "request line": ((_target(MAX_LINE), []), (_target(MAX_LINE + 1), [])),
    "header line": (("/", ["X-Big: " + "b" * (MAX_LINE - 7)]), ("/", ["X-Big: " + "b" * (MAX_LINE - 6)])),
    "header count": (("/", [f"X-{n}: v" for n in range(MAX_HEADERS - UPGRADE_HEADERS)]),
                     ("/", [f"X-{n}: v" for n in range(MAX_HEADERS - UPGRADE_HEADERS + 1)])),
    "whole head": (("/", [f"X-{n}: " + "c" * 5000 for n in range(3)]),
                   ("/", [f"X-{n}: " + "c" * 6000 for n in range(3)])),
}


@pytest.mark.parametrize("case", sorted(JUST_WITHIN_AND_OVER))
def test_what_the_http_layer_lets_through_websockets_parses(case: str) -> None:
    """The limits are websockets' own: an upgrade just within each is parsed by both; one just over is refused by
    both (where websockets has that limit at all)."""
    (target, headers), (over_target, over_headers) = JUST_WITHIN_AND_OVER[case]
    within = _head(target, upgrade=True, headers=headers)
    over = _head(over_target, upgrade=True, headers=over_headers)
    assert head_status(within) is None and head_status(over) == OVER_LIMITS[case][2]
    assert isinstance(_websockets_parse(within), Request)
    if case != "whole head":  # websockets has no limit on the whole head
        assert not isinstance(_websockets_parse(over), Request)


def _websockets_parse(head: bytes) -> Request | Exception:
    reader = StreamReader()
    reader.feed_data(head)
    parser = Request.parse(reader.read_line)
    try:
        next(parser)
    except StopIteration as done:
        return cast(Request, done.value)
    except Exception as err:
        return err
    return RuntimeError("incomplete")


async def test_a_head_within_the_limits_is_served() -> None:
    protocol, transport = _http()
    protocol.data_received(_head(headers=[f"X-{n}: v" for n in range(MAX_HEADERS - 1)]))
    await _until(lambda: b"ok" in transport.written)
    assert transport.status == 200
    protocol.connection_lost(None)


async def _until(done: Any, timeout: float = 2) -> None:
    async with asyncio.timeout(timeout):
        while not done():  # noqa: ASYNC110 - the protocol's own tasks and timers run meanwhile
            await asyncio.sleep(0.005)


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: rel", _head(upgrade=True)[:-10]],
                         ids=["nothing", "partial rest head", "partial upgrade head"])
async def test_a_connection_without_a_complete_head_is_closed_after_the_header_timeout(sent: bytes) -> None:
    protocol, transport = _http(header_timeout=0.1)
    if sent:
        protocol.data_received(sent)
    await asyncio.sleep(0.03)
    assert not transport.closing
    await _until(lambda: transport.closing, timeout=1)
    assert transport.written == b""
    protocol.connection_lost(None)


async def test_the_header_timeout_stops_with_the_head_and_starts_again_with_the_next_one() -> None:
    protocol, transport = _http(header_timeout=0.1)
    protocol.data_received(_head()[:20])
    protocol.data_received(_head()[20:])
    await _until(lambda: b"ok" in transport.written)
    await asyncio.sleep(0.2)
    assert not transport.closing  # kept alive: uvicorn's own keep-alive timer (5 s) governs the idle time
    protocol.data_received(b"GET /healthz HTT")  # the next request on the connection, never finished
    await _until(lambda: transport.closing, timeout=1)
    protocol.connection_lost(None)


async def test_an_upgrade_is_handed_to_the_websocket_protocol_with_no_deadline_left() -> None:
    protocol, transport = _http(header_timeout=0.05, before_upgrade=lambda target, ip: None)
    protocol.data_received(_head("/websocket/shop/dbos_key", upgrade=True))
    assert isinstance(transport.protocol, WebSocketsSansIOProtocol)
    assert protocol.head_deadline is None
    await asyncio.sleep(0.1)
    assert not transport.closing and transport.status == 101
    transport.protocol.connection_lost(None)
    await asyncio.sleep(0)


async def test_a_refused_upgrade_is_answered_after_the_refusal_delay() -> None:
    seen: list[tuple[str, str]] = []

    def refuse(target: str, source_ip: str) -> bytes:
        seen.append((target, source_ip))
        return http_limits.raw_problem(401, "unknown or revoked API key")

    protocol, transport = _http(before_upgrade=refuse, refusal_delay=0.1)
    protocol.data_received(_head("/websocket/shop/dbos_wrong", upgrade=True))
    assert seen == [("/websocket/shop/dbos_wrong", "10.0.0.8")]
    assert transport.written == b"" and not transport.reading and transport.protocol is protocol
    await _until(lambda: transport.closing, timeout=1)
    assert transport.status == 401
    protocol.connection_lost(None)


# -- REST body limit ---------------------------------------------------------------------------------------------


async def _call(app: Any, *, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, bytes, int]:
    """Run one HTTP request through ``app``: (status, body, chunks the server read)."""
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read < len(pending):
            read += 1
            return pending[read - 1]
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "PATCH", "path": "/v2/x", "headers": headers}
    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body, read


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def test_a_body_declared_over_the_limit_is_refused_before_it_is_read() -> None:
    status, body, read = await _call(BodyLimit(_echo, max_bytes=1024),
                                     headers=[(b"content-length", b"10000000")], chunks=[b"x" * 100] * 3)
    assert (status, read) == (413, 0)
    assert json.loads(body) == {"title": HTTPStatus(413).phrase, "status": 413,
                                "detail": "the request body is over 1024 bytes"}


async def test_a_streamed_body_is_refused_as_soon_as_it_passes_the_limit() -> None:
    status, _, read = await _call(BodyLimit(_echo, max_bytes=1024), headers=[(b"transfer-encoding", b"chunked")],
                                  chunks=[b"y" * 400] * 10)
    assert (status, read) == (413, 3)


async def test_a_body_within_the_limit_reaches_the_app_whole() -> None:
    chunks = [b"a" * 500, b"b" * 500, b"c" * 24]
    status, body, _ = await _call(BodyLimit(_echo, max_bytes=1024), headers=[], chunks=chunks)
    assert (status, body) == (200, b"".join(chunks))


# -- identities Temporal would refuse ----------------------------------------------------------------------------

ORG, APP = "acme", "shop"
ID_LIMIT = identity.WORKFLOW_ID_BYTES - len(lifecycle_workflow_id(ORG, APP, "").encode())


def _info(**fields: Any) -> wire.ExecutorInfoReply:
    return wire.ExecutorInfoReply.model_validate({"type": "executor_info", "request_id": "r", "executor_id": "e",
                                                  **fields})


LIMITS = [
    ("executor_id", ID_LIMIT),
    ("application_version", identity.SEARCH_ATTRIBUTE_BYTES),
    ("hostname", identity.HOSTNAME_BYTES),
    ("language", identity.SHORT_TEXT_BYTES),
    ("dbos_version", identity.SHORT_TEXT_BYTES),
]


@pytest.mark.parametrize(("field", "limit"), LIMITS)
def test_each_identity_field_is_refused_just_over_its_limit(field: str, limit: int) -> None:
    identity.check(ORG, APP, _info(**{field: "é" * (limit // 2) + "x" * (limit % 2)}))  # bytes, not characters
    assert len(lifecycle_workflow_id(ORG, APP, "x" * ID_LIMIT).encode()) == identity.WORKFLOW_ID_BYTES
    with pytest.raises(IdentityError) as refused:
        identity.check(ORG, APP, _info(**{field: "x" * (limit + 1)}))
    assert refused.value.field == field and refused.value.close_code == 1008
    assert refused.value.detail.startswith(f"permanent: {field} ") and str(limit) in refused.value.detail


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("hostname", "host\x00name", "NUL"),
    ("executor_metadata", {"k": "v\udfff"}, "not encodable"),
    ("executor_metadata", {"blob": "m" * identity.METADATA_BYTES}, f"{identity.METADATA_BYTES}-byte limit"),
])
def test_values_no_payload_or_registry_can_hold_are_refused(field: str, value: Any, problem: str) -> None:
    with pytest.raises(IdentityError, match=problem) as refused:
        identity.check(ORG, APP, _info(**{field: value}))
    assert refused.value.field == field


def test_every_refusal_fits_a_close_frame_and_never_quotes_the_value() -> None:
    huge = 1_048_576  # a frame over RELAY_MAX_MESSAGE_BYTES never gets this far
    for field, _ in [*LIMITS, ("executor_metadata", 0)]:
        value: Any = {"k": "v" * huge} if field == "executor_metadata" else "v" * huge
        with pytest.raises(IdentityError) as refused:
            identity.check(ORG, APP, _info(**{field: value}))
        assert len(refused.value.detail.encode()) <= ws.CLOSE_REASON_BYTES
        assert "vvvv" not in refused.value.detail


def test_a_bad_identity_fails_the_handshake_and_leaves_the_session_waiting() -> None:
    session = sm.Session(identity=identity.checker(ORG, APP))
    reply = {"type": "executor_info", "request_id": session.info_request_id, "executor_id": "x" * (ID_LIMIT + 1)}
    with pytest.raises(IdentityError):
        session.receive(json.dumps(reply))
    assert session.state is sm.State.AWAITING_INFO


async def test_a_bad_identity_closes_the_socket_permanently_and_is_reported_once_per_app() -> None:
    gw = FakeGateway()
    closes = []
    with _gateway_log() as log:
        for attempt in range(3):  # the SDK reconnecting every second with the same values
            peer = Peer(gw)
            serving = asyncio.ensure_future(peer.protocol.serve(cast(Gateway, gw), JOINED))
            await _turns()
            peer.read()
            peer.send(Frame(json.dumps({"type": "executor_info", "request_id": peer.info_request_id,
                                        "executor_id": f"ex-{attempt}-" + "z" * 2000, "hostname": "h"})))
            await asyncio.wait_for(serving, 5)
            peer.read()
            closes.append(peer.closed)
            peer.leave()
        await gw.settle()
    assert all(c is not None and c[0] == 1008 and c[1].startswith("permanent: executor_id") for c in closes)
    assert not gw.connected and len(gw.hub) == 0  # nothing sent to Temporal
    reports = [r.getMessage() for r in log if "permanent:" in r.getMessage()]
    assert len(reports) == 1 and len(gw.store.audits) == 1
    assert "zzzz" not in reports[0] and "zzzz" not in json.dumps(gw.store.audits)


def _nested(depth: int) -> Any:
    """A JSON object ``depth`` levels deep (``{"k": {"k": ... {}}}``)."""
    value: Any = {}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


@pytest.mark.parametrize("depth", [nesting.MAX_JSON_DEPTH + 1, 300, 600, 900])
def test_metadata_nested_too_deep_is_refused_for_good(depth: int) -> None:
    """Metadata 300 deep (about 2 KB, under the 64 KiB bound) was once accepted, then its `connected` signal
    failed to serialize on every retry: connected, never registered."""
    identity.check(ORG, APP, _info(executor_metadata=_nested(nesting.MAX_JSON_DEPTH)))
    with pytest.raises(IdentityError) as refused:
        identity.check(ORG, APP, _info(executor_metadata=_nested(depth)))
    assert refused.value.field == "executor_metadata" and refused.value.close_code == 1008
    assert refused.value.detail == ("permanent: executor_metadata is nested deeper than 32 levels; the same value "
                                    "will fail again")


def test_a_handshake_frame_too_deep_to_parse_is_refused_for_good_and_any_later_one_costs_only_itself() -> None:
    session = sm.Session(identity=identity.checker(ORG, APP))
    metadata = '{"k": ' * 100_000 + "{}" + "}" * 100_000
    deep = f'{{"type": "executor_info", "request_id": "{session.info_request_id}", "executor_id": "e", ' \
           f'"executor_metadata": {metadata}}}'
    with pytest.raises(IdentityError) as refused:
        session.receive(deep)
    assert refused.value.close_code == 1008 and refused.value.detail.startswith("permanent: executor_info ")
    assert len(refused.value.detail.encode()) <= ws.CLOSE_REASON_BYTES
    session.receive(json.dumps({"type": "executor_info", "request_id": session.info_request_id, "executor_id": "e"}))
    with pytest.raises(NestingError) as malformed:  # once open: a malformed reply, not a refusal of the executor
        session.receive("[" * 100_000 + "]" * 100_000)
    assert not isinstance(malformed.value, IdentityError) and session.state is sm.State.OPEN


@pytest.mark.parametrize("depth", [300, 600, 900])
async def test_deep_metadata_closes_the_socket_permanently_and_signals_nothing(depth: int) -> None:
    gw = FakeGateway()
    peer = Peer(gw)
    serving = asyncio.ensure_future(peer.protocol.serve(cast(Gateway, gw), JOINED))
    await _turns()
    peer.read()
    peer.send(Frame(json.dumps({"type": "executor_info", "request_id": peer.info_request_id, "executor_id": "deep-1",
                                "executor_metadata": _nested(depth)})))
    await asyncio.wait_for(serving, 5)
    peer.read()
    assert peer.closed is not None and peer.closed[0] == 1008
    assert peer.closed[1].startswith("permanent: executor_metadata is nested deeper than 32 levels")
    peer.leave()
    await gw.settle()
    assert not gw.connected and len(gw.hub) == 0  # nothing sent to Temporal


# -- replies nobody asked for ------------------------------------------------------------------------------------


async def test_replies_to_unknown_requests_are_reported_once_a_minute_per_connection() -> None:
    gw = FakeGateway()
    peer, conn = await _registered(gw)
    with _gateway_log() as log:
        for n in range(50):
            peer.send(Frame(json.dumps({"type": "recovery", "request_id": f"late-{n}", "success": True})))
    peer.leave()
    assert len([r for r in log if "ignored frame" in r.getMessage()]) == 1
    assert gw.admission.suppressed == 49
