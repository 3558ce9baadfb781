"""A fake server-side transport for protocol objects driven by unit tests (uvicorn's HTTP and WebSocket protocols,
the gateway's ``ExecutorSocket``), without a socket; and a synchronous client transport to an in-process ASGI app
(the admin CLI's ``httpx.Client`` against the REST app of tests/api)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from websockets.client import ClientProtocol


class ServerTransport(asyncio.Transport):
    """The server side of one connection. What the protocol writes is kept in ``written``, or handed to ``client``
    (a real websockets client protocol, which parses it); reading may be paused; the protocol may be switched (an
    upgrade)."""

    def __init__(self, client: ClientProtocol | None = None, *,
                 peer: tuple[str, int] = ("10.0.0.7", 50_000)) -> None:
        super().__init__()
        self.client = client
        self.peer = peer
        self.written = bytearray()
        self.closing = False
        self.reading = True
        self.protocol: asyncio.BaseProtocol | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.client is not None:
            self.client.receive_data(bytes(data))
        else:
            self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peer, "sockname": ("127.0.0.1", 8090)}.get(name, default)

    @property
    def status(self) -> int | None:
        """The HTTP status of what was written, if it began with a status line."""
        line = bytes(self.written).partition(b"\r\n")[0].split(b" ")
        return int(line[1]) if len(line) > 1 else None


class LoopASGITransport(httpx.BaseTransport):
    """A synchronous ``httpx`` transport that serves each request with ``app`` on ``loop``: a client running in
    another thread (``asyncio.to_thread``) reaches an app whose state lives on the test's own event loop."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._asgi = httpx.ASGITransport(app=app)
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def serve() -> httpx.Response:
            response = await self._asgi.handle_async_request(request)
            return httpx.Response(response.status_code, headers=response.headers, content=await response.aread())

        return asyncio.run_coroutine_threadsafe(serve(), self._loop).result()
