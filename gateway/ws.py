"""The executor WebSocket endpoint ``/websocket/{app}/{key}``: thin socket code around ``session.Session``.

Refusals happen before the upgrade (401/403/404 with a small problem body). After the handshake the executor's
lifecycle workflow is signalled ``connected``; on close, ``disconnected``. Both carry the connection id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from dataclasses import dataclass

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from gateway import session as sm
from gateway.errors import AuthError, ForbiddenError, NotFoundError, ProtocolError, RelayError
from gateway.hub import SUPERSEDED_CLOSE_CODE, Connection
from gateway.problems import relay_problem
from gateway.runtime import Gateway
from gateway.schemas import APP_PATTERN
from gateway.store import hash_key, subject_of
from workflows.inputs import ConnectedSignal, ExecutorInfo

log = logging.getLogger("relay.gateway")
router = APIRouter()
_app_name = re.compile(APP_PATTERN)
MALFORMED_AUDITED = 20  # per connection, before audit rows for malformed frames are rate-limited


@router.websocket("/websocket/{app_name}/{key}")
async def executor_socket(websocket: WebSocket, app_name: str, key: str) -> None:
    gw: Gateway = websocket.app.state.gateway
    source_ip = websocket.client.host if websocket.client else ""
    org: str | None = None
    try:
        gw.admission.check_origin(websocket.headers.get("origin"))
        if not (3 <= len(app_name) <= 30 and _app_name.match(app_name)):
            raise NotFoundError("app names are 3-30 characters of [a-z0-9-_]")
        digest = hash_key(key)
        gw.admission.check_unknown(digest)
        try:
            principal = await asyncio.to_thread(gw.store.authenticate, key)
        except AuthError:
            gw.admission.remember_unknown(digest)
            raise
        org = principal.org
        if not principal.allows(app_name):
            raise ForbiddenError(f"this key is not allowed for app {app_name!r}")
        gw.admission.admit(principal.key_id)
    except RelayError as err:
        await _refuse(gw, websocket, err, app=app_name, org=org, source_ip=source_ip)
        return
    try:
        application, _ = await asyncio.to_thread(gw.store.ensure_app, principal.org, app_name,
                                                 subject=subject_of(principal), source_ip=source_ip)
        await websocket.accept()
        await _serve(gw, websocket, Joined(principal.org, app_name, application.id, principal.key_id, source_ip))
    finally:
        gw.admission.release(principal.key_id)


async def _refuse(gw: Gateway, websocket: WebSocket, err: RelayError, *, app: str, org: str | None,
                  source_ip: str) -> None:
    """Refuse before the upgrade. SDKs retry every second forever, so reporting is rate-limited."""
    if gw.admission.should_report(source_ip, f"{err.status}:{app}"):
        log.info("refused executor connection for app %r from %s: %s (%d similar refusals suppressed so far)",
                 app, source_ip, err.detail, gw.admission.suppressed)
        if org is not None:
            await asyncio.to_thread(gw.store.write_audit, org=org, app=app, operation="executor.refused",
                                    status="failure", source_ip=source_ip,
                                    details={"status": err.status, "reason": err.detail})
    await websocket.send_denial_response(relay_problem(err))


@dataclass(frozen=True)
class Joined:
    """Who a socket is, once admitted: its org and app (and the app's id), its key, its address."""

    org: str
    app: str
    app_id: str
    key_id: str
    source_ip: str


async def _serve(gw: Gateway, websocket: WebSocket, joined: Joined) -> None:
    org, app, source_ip = joined.org, joined.app, joined.source_ip
    session = sm.Session()
    await websocket.send_text(session.start())
    try:
        handshake = await _handshake(gw, websocket, session)
    except (ProtocolError, TimeoutError) as err:
        reason = err.detail if isinstance(err, ProtocolError) else "no executor_info reply in time"
        code = err.close_code if isinstance(err, ProtocolError) else 1008
        # A broken client reconnects every second: report each kind of failure once a minute per address.
        if gw.admission.should_report(source_ip, f"handshake:{app}:{reason[:60]}"):
            log.warning("closing executor socket of app %r from %s: %s", app, source_ip, reason)
            await asyncio.to_thread(gw.store.write_audit, org=org, app=app, operation="executor.protocol_error",
                                    status="failure", source_ip=source_ip, details={"reason": reason})
        await _close(websocket, code, reason)
        return
    except WebSocketDisconnect:
        return
    info = handshake.info
    conn = Connection(connection_id=str(uuid.uuid4()), org=org, app=app, executor_id=info.executor_id,
                      session=session, send=websocket.send_text, key_id=joined.key_id, app_id=joined.app_id,
                      close=lambda code, reason: _close(websocket, code, reason))
    superseded = gw.hub.attach(conn)
    if superseded is not None:
        await superseded.close(SUPERSEDED_CLOSE_CODE, "superseded by a newer connection")
    signal = ConnectedSignal(
        connection_id=conn.connection_id, gateway_queue=gw.task_queue, signal_id=str(uuid.uuid4()),
        source_ip=source_ip,
        info=ExecutorInfo(
            executor_id=info.executor_id, application_version=info.application_version or "",
            hostname=info.hostname, language=info.language, dbos_version=info.dbos_version,
            executor_metadata=info.executor_metadata,
        ),
    )
    try:
        if not await gw.signal_connected(org, app, signal):
            await _close(websocket, 1011, "could not register the connection; retry")
            return
        await _read_loop(gw, websocket, conn)
    finally:
        gw.hub.detach(conn)
        gw.spawn_disconnected(org, app, info.executor_id, conn.connection_id)


async def _handshake(gw: Gateway, websocket: WebSocket, session: sm.Session) -> sm.Handshake:
    async with asyncio.timeout(gw.settings.handshake_timeout.total_seconds()):
        while True:
            event = session.receive(await _next_frame(websocket))
            if isinstance(event, sm.Handshake):
                return event


async def _read_loop(gw: Gateway, websocket: WebSocket, conn: Connection) -> None:
    malformed = 0
    while True:
        try:
            frame = await _next_frame(websocket)
        except WebSocketDisconnect:
            return
        try:
            event = conn.session.receive(frame)
        except ProtocolError as err:
            # A malformed reply must not bring the connection down with it: the request it answers (if that
            # much could be read) fails now; the frame is logged and audited (the first ones of a connection,
            # then at most one a minute, so a broken executor cannot flood the audit log) and serving goes on.
            malformed += 1
            if err.request_id is not None:
                conn.fail(err.request_id, err)
            if malformed <= MALFORMED_AUDITED or gw.admission.should_report(conn.connection_id, "malformed"):
                log.warning("malformed frame from executor %s: %s", conn.executor_id, err.detail)
                await asyncio.to_thread(
                    gw.store.write_audit, org=conn.org, app=conn.app, executor_id=conn.executor_id,
                    operation="executor.protocol_error", status="failure",
                    details={"reason": err.detail, "connection_id": conn.connection_id, "count": malformed})
            continue
        if isinstance(event, sm.Reply):
            conn.deliver(event)
        elif isinstance(event, sm.Ignored):
            log.info("ignored frame from executor %s: %s", conn.executor_id, event.reason)


async def _next_frame(websocket: WebSocket) -> str | bytes:
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text: str | None = message.get("text")
    return text if text is not None else message.get("bytes") or b""


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    # RFC 6455 5.5: a close frame carries at most 123 bytes of reason (websockets raises on more), in UTF-8.
    reason = reason.encode()[:123].decode(errors="ignore")
    if websocket.application_state == WebSocketState.CONNECTED:
        # The peer may be gone already (its disconnect not yet read by its handler): nothing left to close.
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close(code, reason)
