"""Frame-level liveness, which ASGI cannot see (control frames never reach an app).

A subclass of uvicorn's websockets-sansio protocol stamps every ``data_received`` — text, binary, ping or pong
alike — and aborts the transport once the ping wait passes with nothing received. The disconnect is seen at
once, with no close handshake to wait out. The server keeps pinging on its interval, so a healthy executor that
never pings still produces pongs; a slow pong is not a failure by itself.

Both the pings and the silence checks run off one ticker per event loop (``Keepalive``), not two asyncio timers
per socket: with thousands of sockets those timers kept asyncio's timer heap large, and an idle gateway spent
more on heap upkeep than on the pings themselves.

An executor's ping goes through websockets' frame parser like any other frame, and websockets writes the pong.
Answering a lone ping before the parser saved about a tenth of a heartbeat's CPU (most of it is the event loop's
read and write), and P2 met its target without it; but only the parser knows whether some bytes are a whole frame
or the middle of a message, and asking it took reading its generator chain and its reader's buffer: websockets'
internals, which a release may change without a word (tests/unit/test_public_apis.py refuses such reads).

An executor whose client may miss the pong to its own ping (``echo_pings``) gets a second, unsolicited pong
``ECHO_AFTER`` later (RFC 6455 5.5.3: a pong may be sent unsolicited, as a one-way heartbeat). DBOS's Java client
(dev.dbos:transact) sends its ping, then arms its 15 s pong timer, and its pong handler cancels whichever timer is
armed: a pong that overtakes the arming (the pinging thread descheduled for a moment on a busy machine) cancels
nothing, and the timer then drops a socket whose gateway answered at once. The late pong cancels that timer. It
says nothing a frozen gateway could say: it comes off the same event loop as the first.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from asyncio import BaseTransport, TimerHandle
from datetime import timedelta
from typing import Any, ClassVar

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

TICK = timedelta(milliseconds=250)  # how late a ping or a silence check may come, at most
_TICK = TICK.total_seconds()  # on the event loop's clock, which counts seconds
# After the pinging thread has had ample time to arm its timer, well within the shortest pong timeout (15 s).
ECHO_AFTER = timedelta(seconds=5)
_ECHO_AFTER = ECHO_AFTER.total_seconds()


class Keepalive:
    """Sockets by the tick at which they next need looking at (a ping due, or their silence deadline)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.slots: dict[int, set[LivenessProtocol]] = {}
        self.ticker: TimerHandle | None = None

    def watch(self, protocol: LivenessProtocol, when: float) -> None:
        self.forget(protocol)
        slot = math.ceil(when / _TICK)
        self.slots.setdefault(slot, set()).add(protocol)
        protocol.slot = slot
        if self.ticker is None:
            self.ticker = self.loop.call_later(_TICK, self._tick)

    def forget(self, protocol: LivenessProtocol) -> None:
        if protocol.slot is not None:
            group = self.slots.get(protocol.slot)
            if group is not None:
                group.discard(protocol)
                if not group:
                    del self.slots[protocol.slot]
            protocol.slot = None

    def _tick(self) -> None:
        now = self.loop.time()
        current = math.floor(now / _TICK)
        for slot in [s for s in self.slots if s <= current]:
            for protocol in self.slots.pop(slot, ()):
                protocol.slot = None
                protocol.check(now)
        self.ticker = self.loop.call_later(_TICK, self._tick) if self.slots else None


class LivenessProtocol(WebSocketsSansIOProtocol):
    ping_wait_s: float = 25.0  # the ping wait on the loop's clock; set by the subclass the server is configured with
    _keepalives: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Keepalive]] = (
        weakref.WeakKeyDictionary())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Pong deadlines are replaced by the silence deadline below.
        self.ping_timeout = None
        self.last_frame_at = 0.0
        self.next_ping_at: float | None = None  # None: not pinging (before the upgrade, after the close)
        self.echo_pings = False  # a ping gets a second pong ECHO_AFTER later (one at a time: ``echo_later``)
        self.echo_at: float | None = None  # when that pong is due
        self.slot: int | None = None
        keepalive = self._keepalives.get(self.loop)
        if keepalive is None:
            keepalive = self._keepalives[self.loop] = Keepalive(self.loop)
        self.keepalive = keepalive

    def connection_made(self, transport: BaseTransport) -> None:
        super().connection_made(transport)
        self.last_frame_at = self.loop.time()
        self.keepalive.watch(self, self.last_frame_at + self.ping_wait_s)

    def data_received(self, data: bytes) -> None:
        self.last_frame_at = self.loop.time()  # the deadline moves; the ticker finds out when it looks next
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.keepalive.forget(self)
        super().connection_lost(exc)

    # uvicorn's keepalive, driven by the ticker instead of a timer per socket.

    def start_keepalive(self) -> None:
        if self.ping_interval is not None and self.ping_interval > 0:
            self.next_ping_at = self.loop.time() + self.ping_interval
            self._rewatch()

    def stop_keepalive(self) -> None:
        self.next_ping_at = None
        self.pending_ping_payload = None

    def schedule_ping(self) -> None:
        pass  # the ticker sends the next one

    def handle_ping(self) -> None:
        super().handle_ping()  # websockets' pong, at once
        if self.echo_pings and self.echo_at is None:
            self.echo_later()

    def echo_later(self) -> None:
        """One unsolicited pong, ``ECHO_AFTER`` from now: at most one that often, however often the client pings
        (a timer its client armed meanwhile is cancelled by its next ping)."""
        self.echo_at = self.loop.time() + _ECHO_AFTER
        self._rewatch()

    def check(self, now: float) -> None:
        """Called by the ticker when this socket's ping or silence deadline may be due."""
        if self.transport is None or self.transport.is_closing():
            return
        if now >= self.last_frame_at + self.ping_wait_s:
            self.transport.abort()
            return
        if self.next_ping_at is not None and now >= self.next_ping_at:
            self.send_keepalive_ping()
            if self.next_ping_at is not None and self.ping_interval is not None:
                self.next_ping_at = now + self.ping_interval
        if self.echo_at is not None and now >= self.echo_at:
            self.echo_at = None
            if self.conn.state is State.OPEN:
                self.conn.send_pong(b"")
                self.transport.write(b"".join(self.conn.data_to_send()))
        self._rewatch()

    def _rewatch(self) -> None:
        due = self.last_frame_at + self.ping_wait_s
        for then in (self.next_ping_at, self.echo_at):
            if then is not None:
                due = min(due, then)
        self.keepalive.watch(self, due)
