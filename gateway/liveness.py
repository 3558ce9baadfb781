"""Frame-level liveness, which ASGI cannot see (control frames never reach an app).

A subclass of uvicorn's websockets-sansio protocol stamps every ``data_received`` — text, binary, ping or pong
alike — and aborts the transport once the ping wait passes with nothing received. The disconnect is seen at
once, with no close handshake to wait out. The server keeps pinging on its interval, so a healthy executor that
never pings still produces pongs; a slow pong is not a failure by itself.
"""

from __future__ import annotations

from asyncio import BaseTransport, TimerHandle
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class LivenessProtocol(WebSocketsSansIOProtocol):
    ping_wait_s: float = 25.0  # set by the subclass the server is configured with

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Pong deadlines are replaced by the silence deadline below.
        self.ping_timeout = None
        self.last_frame_at = 0.0
        self.silence_timer: TimerHandle | None = None

    def connection_made(self, transport: BaseTransport) -> None:
        super().connection_made(transport)
        self.last_frame_at = self.loop.time()
        self.silence_timer = self.loop.call_later(self.ping_wait_s, self._check_silence)

    def data_received(self, data: bytes) -> None:
        self.last_frame_at = self.loop.time()
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.silence_timer is not None:
            self.silence_timer.cancel()
            self.silence_timer = None
        super().connection_lost(exc)

    def _check_silence(self) -> None:
        remaining = self.last_frame_at + self.ping_wait_s - self.loop.time()
        if remaining > 0:
            self.silence_timer = self.loop.call_later(remaining, self._check_silence)
            return
        self.silence_timer = None
        self.transport.abort()
