"""The executor socket ``/websocket/{app}/{key}``, spoken inside the connection's protocol object.

An executor socket needs no ASGI app: uvicorn's websockets-sansio protocol already parses the upgrade and the
frames. This subclass answers the upgrade itself (refusals before it, 401/403/404/429 with a problem body; 503, for
"retry shortly", with ``Retry-After`` too), runs
the ``executor_info`` handshake and the ``connected`` signal in one short task, and from then on handles each
frame as it arrives, in ``data_received``: an idle executor costs its protocol object, its frame parser and its
``Connection``, with no task or coroutine kept per socket. Any other path goes to the ASGI app as usual.

After the handshake the executor's lifecycle workflow is signalled ``connected``; on close, ``disconnected``.
Both carry the connection id; ``connected`` also carries when the handshake was done (``relay_signal_delay_seconds``
runs from then to the registry write). Refusals and failed handshakes count in ``relay_refusals_total{reason}``;
upgrade request to ``executor_info`` reply in ``relay_handshake_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import unquote

from sqlalchemy.exc import SQLAlchemyError
from websockets.datastructures import Headers
from websockets.exceptions import InvalidState
from websockets.http11 import Request, Response
from websockets.protocol import State

from core import metrics, units
from core.errors import (
    AuthError,
    ExecutorUnavailableError,
    ForbiddenError,
    IdentityError,
    NotFoundError,
    ProtocolError,
    RelayError,
    ServiceUnavailableError,
)
from core.logs import WarningsOnly
from core.models import Application
from core.names import APP_PATTERN
from core.problem import PROBLEM_JSON, problem_body
from core.store import Principal, Store, hash_key, outage
from gateway import identity
from gateway import session as sm
from gateway.http_limits import BeforeUpgrade, raw_problem
from gateway.hub import SUPERSEDED_CLOSE_CODE, Connection
from gateway.liveness import LivenessProtocol
from gateway.runtime import Gateway
from workflows.contracts.common import ConnectedSignal, ExecutorInfo

log = logging.getLogger("relay.gateway")
_PATH = re.compile(r"/websocket/([^/?]*)/([^/?]*)")
_app_name = re.compile(APP_PATTERN)
MALFORMED_AUDITED = 20  # per connection, before audit rows for malformed frames are rate-limited
CLOSE_REASON_BYTES = 123  # RFC 6455 5.5: a close frame carries at most 123 bytes of reason
# Executors whose client may miss the pong to its own ping get a second one (gateway.liveness, ``echo_pings``).
ECHOED_LANGUAGES = frozenset({"java"})
# A 503 refusal (this gateway is draining or fenced, the database is away, the key's look-up must wait) says when to
# try again: the SDKs retry every second anyway, and a load balancer sends the retry to a ready gateway.
RETRY_AFTER = timedelta(seconds=1)
DRAINING = "this gateway is shutting down; reconnect (to another)"
# websockets logs every upgrade it answers at INFO ("connection open", "connection rejected (401 Unauthorized)"),
# on uvicorn's logger, past Relay's rate limit: a flood of wrong keys made a line each. Relay logs its own
# accepted and (rate-limited) refused lines; websockets' warnings and errors still come through.
QUIET_PROTOCOL_LOG = WarningsOnly(logging.getLogger("uvicorn.error"), {})


class _Lost(Exception):
    """The peer went away before the handshake finished."""


@dataclass(frozen=True)
class Joined:
    """Who a socket is, once admitted: its org and app (and the app's id), its key, its address."""

    org: str
    app: str
    app_id: str
    key_id: str
    source_ip: str


class GatewayOf(Protocol):
    def __call__(self) -> Gateway: ...


class ExecutorSocket(LivenessProtocol):
    """One TCP connection. Executor paths are served here; anything else is handed to the ASGI app."""

    gateway: GatewayOf  # set by ``executor_protocol``

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn.logger = QUIET_PROTOCOL_LOG
        self.session: sm.Session | None = None  # set when the path is an executor's
        self.handshake: asyncio.Future[sm.Handshake] | None = None  # pending while executor_info is due
        self.executor: Connection | None = None  # set once the handshake is done
        self.registered = False  # `connected` sent: from then on a close is reported by connection_lost
        self.held_key: str | None = None  # the key whose connection slot this socket holds
        self.malformed = 0
        self.audits: list[dict[str, Any]] | None = None  # rows being written, oldest first
        self.requested_at = 0.0  # monotonic time of the upgrade request

    # -- the upgrade ----------------------------------------------------------------------------------------

    def handle_connect(self, event: Request) -> None:
        match = _PATH.fullmatch(event.path.partition("?")[0])
        if match is None:
            super().handle_connect(event)
            return
        self.handshake_initiated = True
        self.requested_at = time.monotonic()
        task = self.loop.create_task(self._open(event, unquote(match[1]), unquote(match[2])))
        task.add_done_callback(self.on_task_complete)
        self.tasks.add(task)

    async def _open(self, request: Request, app_name: str, key: str) -> None:
        gw = self.gateway()
        source_ip = self.client[0] if self.client else ""
        try:
            response = self.conn.accept(request)
            if response.status_code != 101:  # not a valid WebSocket upgrade
                self._respond(response)
                return
            joined = await self._admit(gw, request, app_name, key, source_ip)
            if joined is None:
                return
            if self.disconnected or self.transport.is_closing():  # gone while being admitted
                self._release(gw)
                return
            del response.headers["Date"]
            response.headers.update((k.decode("latin-1"), v.decode("latin-1")) for k, v in self.default_headers)
            self.handshake_complete = True
            self.conn.send_response(response)
            self._flush()
            self.start_keepalive()
            log.info('%s - "WebSocket /websocket/%s/<key>" [accepted]', source_ip, app_name)
            await self.serve(gw, joined)
        except Exception:
            log.exception("executor socket of app %r from %s failed", app_name, source_ip)
            if not self.handshake_complete:
                self._respond(self.conn.reject(500, "Internal Server Error"))
            else:
                await self.close_with(1011, "internal error")

    async def _admit(self, gw: Gateway, request: Request, app_name: str, key: str, source_ip: str) -> Joined | None:
        org: str | None = None
        digest = hash_key(key)
        try:
            if gw.fenced:
                await self._refuse(gw, ServiceUnavailableError(
                    "this gateway has lost contact with Temporal; reconnect (to another)"),
                    app=app_name, org=None, source_ip=source_ip, reason="fenced")
                return None
            if gw.draining:  # upgraded past the HTTP layer's check just before the drain began
                await self._refuse(gw, ServiceUnavailableError(DRAINING), app=app_name, org=None,
                                   source_ip=source_ip, reason="draining")
                return None
            gw.admission.check_origin(request.headers.get("Origin"))
            if not (3 <= len(app_name) <= 30 and _app_name.match(app_name)):
                raise NotFoundError("app names are 3-30 characters of [a-z0-9-_]")
            gw.admission.check_key(digest, upgraded=True)  # a wrong key ends here, with no database trip
            principal, application = await asyncio.to_thread(_join, gw.store, key, app_name, source_ip)
            gw.admission.remember_live(digest)  # the rest of a burst on a key made since the refresh goes through
            org = principal.org
            if application is None:
                raise ForbiddenError(f"this key is not allowed for app {app_name!r}")
            gw.admission.admit(principal.key_id)
            self.held_key = principal.key_id
            return Joined(principal.org, app_name, application.id, principal.key_id, source_ip)
        except _Unknown as err:
            gw.admission.remember_unknown(digest)
            await self._refuse(gw, err.error, app=app_name, org=None, source_ip=source_ip)
        except RelayError as err:
            await self._refuse(gw, err, app=app_name, org=org, source_ip=source_ip)
        except SQLAlchemyError as err:
            # Relay's database is away (stopped, restarting, locked): refuse before the upgrade with 503, not 500;
            # the SDK tries again a second later. No audit row (it could not be written now); the driver's message
            # goes to the log, once a minute, not to the client.
            if gw.admission.should_report("database", "unavailable"):
                log.warning("database unavailable while admitting an executor of app %r: %s", app_name, outage(err))
            await self._refuse(gw, ServiceUnavailableError("Relay's database is unavailable; retry shortly"),
                               app=app_name, org=None, source_ip=source_ip, reason="database_unavailable")
        return None

    async def _refuse(self, gw: Gateway, err: RelayError, *, app: str, org: str | None, source_ip: str,
                      reason: str | None = None) -> None:
        """Refuse before the upgrade. SDKs retry every second forever, so reporting is rate-limited (counting is
        not: ``reason`` labels it, by default after the status)."""
        metrics.REFUSALS.labels(reason or metrics.refusal_reason(err.status)).inc()
        if _report_refusal(gw, err, app=app, org=org, source_ip=source_ip) and org is not None:
            await asyncio.to_thread(gw.store.write_audit, org=org, app=app, operation="executor.refused",
                                    status="failure", source_ip=source_ip,
                                    details={"status": err.status, "reason": err.detail})
        body = problem_body(err.status, err.title, err.detail)
        headers = Headers([("Content-Type", PROBLEM_JSON), ("Content-Length", str(len(body))),
                           ("Connection", "close")])
        if err.status == HTTPStatus.SERVICE_UNAVAILABLE:
            headers["Retry-After"] = str(units.timedelta_to_seconds(RETRY_AFTER))
        self._respond(Response(err.status, HTTPStatus(err.status).phrase, headers, body))

    def _respond(self, response: Response) -> None:
        """Answer the upgrade request with a plain HTTP response, then close."""
        self.handshake_complete = True
        self.close_sent = True
        if self.transport.is_closing():
            return
        self.conn.send_response(response)
        self._flush()
        self.transport.close()

    # -- the handshake, then registration ---------------------------------------------------------------------

    async def serve(self, gw: Gateway, joined: Joined) -> None:
        """Send ``executor_info``, wait for the reply, register the executor. Frames after that are handled by
        ``send_receive_event_to_app`` as they come; this returns once the executor is registered (or refused)."""
        org, app, source_ip = joined.org, joined.app, joined.source_ip
        session = self.session = sm.Session(identity=identity.checker(org, app))
        self.handshake = self.loop.create_future()
        self.send_now(session.start())
        try:
            async with asyncio.timeout(gw.settings.handshake_timeout.total_seconds()):
                handshake = await self.handshake
        except (ProtocolError, TimeoutError) as err:
            reason = err.detail if isinstance(err, ProtocolError) else "no executor_info reply in time"
            code = err.close_code if isinstance(err, ProtocolError) else 1008
            metrics.REFUSALS.labels("handshake_timeout" if isinstance(err, TimeoutError) else
                                    "identity" if isinstance(err, IdentityError) else "protocol_error").inc()
            # A broken client reconnects every second: report each kind of failure once a minute per address, and
            # a bad identity once a minute per app (its reason carries sizes, never the values).
            source, kind = ((f"{org}/{app}", "identity") if isinstance(err, IdentityError)
                            else (source_ip, f"handshake:{app}:{reason[:60]}"))
            if gw.admission.should_report(source, kind):
                log.warning("closing executor socket of app %r from %s: %s", app, source_ip, reason)
                try:
                    await asyncio.to_thread(gw.store.write_audit, org=org, app=app,
                                            operation="executor.protocol_error", status="failure",
                                            source_ip=source_ip, details={"reason": reason})
                except SQLAlchemyError as db_err:  # the database is away: the log line above must do
                    log.warning("could not audit it: %s", outage(db_err))
            await self.close_with(code, reason)
            return
        except _Lost:
            return
        finally:
            self.handshake = None
        metrics.HANDSHAKE.observe(time.monotonic() - self.requested_at)
        info = handshake.info
        conn = Connection(connection_id=str(uuid.uuid4()), org=org, app=app, executor_id=info.executor_id,
                          session=session, send=self.send_text, key_id=joined.key_id, app_id=joined.app_id,
                          close=self.close_with, widen=self._widen_for(gw))
        self.executor = conn
        if (info.language or "").lower() in ECHOED_LANGUAGES:
            self.echo_pings = True
            self.echo_later()  # its first ping went out as it connected, before it said what it is
        # The signal is the connection's before the hub holds it: a fence probe that finds the socket (or is woken
        # by its arrival, ``Hub.arrival``) answers with it, even while the superseded socket is being closed.
        conn.signal = signal = ConnectedSignal(
            connection_id=conn.connection_id, gateway_queue=gw.task_queue, signal_id=str(uuid.uuid4()),
            source_ip=source_ip, at=datetime.now(UTC),
            info=ExecutorInfo(
                executor_id=info.executor_id, application_version=info.application_version or "",
                hostname=info.hostname, language=info.language, dbos_version=info.dbos_version,
                executor_metadata=info.executor_metadata,
            ),
        )
        superseded = gw.hub.attach(conn)
        if superseded is not None:
            await superseded.close(SUPERSEDED_CLOSE_CODE, "superseded by a newer connection")
        landed = await gw.signal_connected(org, app, signal)
        # `disconnected` must follow `connected`: a close while signalling is reported only now.
        self.registered = True
        if self.disconnected:
            self._gone(gw, conn)
        elif not landed:
            await self.close_with(1011, "could not register the connection; retry")

    # -- frames -----------------------------------------------------------------------------------------------

    def send_receive_event_to_app(self) -> None:
        session = self.session
        if session is None:  # not an executor path: the ASGI app reads it
            super().send_receive_event_to_app()
            return
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        if self.close_sent:
            return
        frame: str | bytes
        if self.curr_msg_data_type == "text":
            try:
                frame = bytes(data).decode()
            except UnicodeDecodeError:
                self.conn.fail(1007, "invalid UTF-8")
                self.handle_parser_exception()
                return
        else:
            frame = bytes(data)
        self.on_frame(session, frame)

    def on_frame(self, session: sm.Session, frame: str | bytes) -> None:
        handshake = self.handshake
        try:
            event = session.receive(frame)
        except ProtocolError as err:
            if handshake is not None and not handshake.done():
                handshake.set_exception(err)
            elif self.executor is not None:
                self._malformed(self.executor, err)
            return
        if isinstance(event, sm.Handshake):
            if handshake is not None and not handshake.done():
                handshake.set_result(event)
        elif isinstance(event, sm.Reply):
            if self.executor is not None:
                self.executor.deliver(event)
        else:
            # Late replies (to a request that timed out) and unsolicited ones are harmless, but an executor may send
            # them in a stream: like malformed frames, at most one line a minute per connection.
            admission = self.gateway().admission
            if admission.should_report(self.executor.connection_id if self.executor else str(id(self)), "ignored"):
                log.info("ignored frame from executor %s: %s (%d repeated reports suppressed so far)",
                         self.executor.executor_id if self.executor else "?", event.reason, admission.suppressed)

    def _malformed(self, conn: Connection, err: ProtocolError) -> None:
        # A malformed reply must not bring the connection down with it: the request it answers (if that much
        # could be read) fails now; the frame is logged and audited (the first ones of a connection, then at most
        # one a minute, so a broken executor cannot flood the audit log) and serving goes on.
        self.malformed += 1
        if err.request_id is not None:
            conn.fail(err.request_id, err)
        gw = self.gateway()
        if self.malformed <= MALFORMED_AUDITED or gw.admission.should_report(conn.connection_id, "malformed"):
            log.warning("malformed frame from executor %s: %s", conn.executor_id, err.detail)
            self._audit(gw, org=conn.org, app=conn.app, executor_id=conn.executor_id,
                        operation="executor.protocol_error", status="failure",
                        details={"reason": err.detail, "connection_id": conn.connection_id, "count": self.malformed})

    def _audit(self, gw: Gateway, **row: Any) -> None:
        """Write an audit row in the background, after this socket's earlier ones (in the order of the frames)."""
        if self.audits is None:
            self.audits = []
        self.audits.append(row)
        if len(self.audits) == 1:
            gw.spawn(self._write_audits(gw, self.audits))

    @staticmethod
    async def _write_audits(gw: Gateway, rows: list[dict[str, Any]]) -> None:
        while rows:
            try:
                await asyncio.to_thread(gw.store.write_audit, **rows[0])
            except Exception:  # one row lost must not strand the ones after it
                log.exception("could not write an audit row for an executor socket")
            del rows[0]

    # -- sending and closing ----------------------------------------------------------------------------------

    def _widen_for(self, gw: Gateway) -> Callable[[bool], None]:
        """Raise the socket's message limit to RELAY_MAX_REPLY_BYTES while a large reply is due, then back; the
        parser reads the limit at each frame."""
        def widen(on: bool) -> None:
            normal = gw.settings.max_message_bytes
            self.conn.max_message_size = max(gw.settings.max_reply_bytes, normal) if on else normal

        return widen

    def send_now(self, frame: str) -> None:
        if self.disconnected or self.close_sent:
            raise ExecutorUnavailableError("the executor socket is closed")
        self.conn.send_text(frame.encode())
        self._flush()

    async def send_text(self, frame: str) -> None:
        await self.writable.wait()
        self.send_now(frame)

    async def close_with(self, code: int, reason: str) -> None:
        """Start the closing handshake (the transport is closed when the peer answers, or after a timeout)."""
        if self.close_sent or self.disconnected or self.transport.is_closing():
            return
        try:
            self.conn.send_close(code, reason.encode()[:CLOSE_REASON_BYTES].decode(errors="ignore"))
        except InvalidState:  # the peer's close came first: it is being answered already
            return
        self._flush()
        self.close_sent = True
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)

    def _flush(self) -> None:
        self.transport.write(b"".join(self.conn.data_to_send()))

    def shutdown(self) -> None:
        """The server shuts down (uvicorn calls this on every connection it still lists). uvicorn's own answers an
        open socket with a close frame; but one whose executor closed first was answered already (``handle_close``
        closed its transport, and it stays listed until ``connection_lost``, a turn later): websockets refuses a
        second close there (``InvalidState``), and that exception, out of the server's shutdown, left the gateway
        process hanging on SIGTERM instead of shutting its lifespan down."""
        if self.handshake_complete and not self.close_sent and self.conn.state is not State.OPEN:
            self.stop_keepalive()
            self.transport.close()
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.session is None and self.held_key is None:
            return  # not an executor socket, or one refused or still being admitted (``_open`` sees it gone)
        gw = self.gateway()
        self._release(gw)
        if self.handshake is not None and not self.handshake.done():
            self.handshake.set_exception(_Lost())
        if self.executor is not None and self.registered:
            self._gone(gw, self.executor)

    def _release(self, gw: Gateway) -> None:
        """Give back the key's connection slot, once."""
        if self.held_key is not None:
            gw.admission.release(self.held_key)
            self.held_key = None

    def _gone(self, gw: Gateway, conn: Connection) -> None:
        gw.socket_closed(conn)


class _Unknown(Exception):
    """The key is unknown or revoked (remembered briefly, so a client retrying it costs no database trip)."""

    def __init__(self, error: RelayError) -> None:
        self.error = error


def _join(store: Store, key: str, app_name: str, source_ip: str) -> tuple[Principal, Application | None]:
    """One trip to the database thread: the key, then the app (registered on first use if the key allows it)."""
    try:
        return store.join(key, app_name, source_ip=source_ip)
    except AuthError as err:
        raise _Unknown(err) from None


def _report_refusal(gw: Gateway, err: RelayError, *, app: str, org: str | None, source_ip: str) -> bool:
    """Log a refusal, at most once a minute per address and kind; True when it was logged (and is to be audited).

    Before the key is known, the app name is the client's own text: it must not make each refusal a new kind to
    report, so those are reported per address and status only."""
    if not gw.admission.should_report(source_ip, f"{err.status}:{app}" if org is not None else str(err.status)):
        return False
    log.info("refused executor connection for app %r from %s: %s (%d similar refusals suppressed so far)",
             app[:40], source_ip, err.detail, gw.admission.suppressed)
    return True


def refusal_before_upgrade(gateway: GatewayOf) -> BeforeUpgrade:
    """For the HTTP layer (``http_limits``): refuse an executor upgrade whose key is not live, or any upgrade while
    the gateway drains, before the WebSocket protocol object is built for it. Parsing the upgrade again and building
    that object cost about ten times the HTTP parse: a flood of wrong keys kept the event loop busy, and good
    executors' handshakes waited behind it."""

    def check(target: str, source_ip: str) -> bytes | None:
        match = _PATH.fullmatch(target.partition("?")[0])
        if match is None:
            return None
        gw = gateway()
        try:
            if gw.draining:
                raise ServiceUnavailableError(DRAINING)
            gw.admission.check_key(hash_key(unquote(match[2])))
        except RelayError as err:
            metrics.REFUSALS.labels("draining" if gw.draining else metrics.refusal_reason(err.status)).inc()
            _report_refusal(gw, err, app=unquote(match[1]), org=None, source_ip=source_ip)
            retry = RETRY_AFTER if err.status == HTTPStatus.SERVICE_UNAVAILABLE else None
            return raw_problem(err.status, err.detail, retry_after=retry)
        return None

    return check


def executor_protocol(ping_wait: timedelta, gateway: GatewayOf) -> type[ExecutorSocket]:
    """The protocol class uvicorn is configured with (``ws=``): the ping wait and the running ``Gateway``."""

    class Configured(ExecutorSocket):
        pass

    Configured.ping_wait_s = ping_wait.total_seconds()
    Configured.gateway = staticmethod(gateway)
    return Configured
