"""Limits on what a client may make the gateway hold or parse, applied before Relay's code sees a request.

Every connection starts in uvicorn's HTTP/1.1 protocol (h11), REST and executor upgrades alike: uvicorn hands an
upgrade to the WebSocket protocol (``gateway.ws``) only once h11 has parsed its head. So the guards live there:

- A request head over the limits is answered at once: 414 when the request line is too long, 431 when the
  headers are, with a problem body, and the connection closed. Unguarded, h11 takes a head of any size that
  arrives in one read, and websockets' own limits (the ones used below) refused an oversized upgrade into a buffer
  uvicorn never sends: the client was never answered.
- A connection that has not sent a complete head within ``header_timeout`` is closed. Neither h11 nor uvicorn
  limits that (uvicorn's keep-alive timer runs only between requests), so partial heads were held forever.
- An executor upgrade may be refused before any WebSocket machinery is built for it (``before_upgrade``): a flood
  of wrong keys then costs an HTTP parse and a set look-up each. The refusal is sent ``refusal_delay`` later, so
  a client that retries the moment it is refused (rather than a second later, as the SDKs do) cannot make more
  than one attempt per socket per ``refusal_delay``.
- ``BodyLimit``, an ASGI middleware, caps request bodies (413), streamed ones included.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable
from datetime import timedelta
from http import HTTPStatus
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS

from core import units
from core.problem import PROBLEM_JSON
from core.problem import problem_body as _problem_body

# websockets' limits on an upgrade request, so that whatever passes here passes there too: bytes in the request
# line and in any header line (websockets counts the CRLF, these do not), and headers.
MAX_LINE = MAX_LINE_LENGTH - 2
MAX_HEADERS = MAX_NUM_HEADERS
# The whole head (16 KiB): what h11 allows of a head still incomplete, as uvicorn leaves it (cli/web.py sets no
# h11_max_incomplete_event_size). Read from h11.Connection's documented keyword default: the constant behind it is
# in a private module of h11's.
MAX_HEAD: int = inspect.signature(h11.Connection).parameters["max_incomplete_event_size"].default
_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")  # h11 accepts bare LF line ends too

# What the HTTP layer asks before an upgrade: (request target, client address) -> a whole response refusing it,
# or None to go on with the upgrade.
BeforeUpgrade = Callable[[str, str], bytes | None]


def head_status(head: bytes) -> HTTPStatus | None:
    """414 or 431 when the start of a request (its head, complete or not, perhaps followed by some of the body)
    is over a limit; None when it is within them so far."""
    end = _END_OF_HEAD.search(head, 0, MAX_HEAD + 4)
    block = head[:end.start()] if end else head[:MAX_HEAD + 1]
    lines = block.split(b"\n")
    if len(lines[0].rstrip(b"\r")) > MAX_LINE:
        return HTTPStatus.REQUEST_URI_TOO_LONG
    if len(block) > MAX_HEAD or len(lines) - 1 > MAX_HEADERS:
        return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
    if any(len(line.rstrip(b"\r")) > MAX_LINE for line in lines[1:]):
        return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
    return None


def problem_body(status: int, detail: str) -> bytes:
    """The body the REST app's problem responses carry, for answers written below the ASGI app."""
    return _problem_body(status, HTTPStatus(status).phrase, detail)


def raw_problem(status: int, detail: str, *, retry_after: timedelta | None = None) -> bytes:
    """A whole HTTP/1.1 response carrying a problem, after which the connection is closed; with ``retry_after``,
    a ``Retry-After`` header (whole seconds) saying the same request may succeed then."""
    body = problem_body(status, detail)
    retry = "" if retry_after is None else f"retry-after: {units.timedelta_to_seconds(retry_after)}\r\n"
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: {PROBLEM_JSON}\r\n"
            f"content-length: {len(body)}\r\n{retry}connection: close\r\n\r\n")
    return head.encode() + body


_TOO_LARGE = {
    HTTPStatus.REQUEST_URI_TOO_LONG: f"the request line is longer than {MAX_LINE} bytes",
    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE: f"the request head is over {MAX_HEAD} bytes, a header line over "
                                                f"{MAX_LINE} bytes, or there are more than {MAX_HEADERS} headers",
}


class GuardedHTTP(H11Protocol):
    """uvicorn's h11 protocol with the head limits, the header timeout and the upgrade check above."""

    header_timeout_s: float = 5.0  # on the loop's clock; set by the subclass the server is configured with
    refusal_delay_s: float = 1.0
    before_upgrade: BeforeUpgrade | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # a request head is (still) coming
            buffered = self.conn.trailing_data[0]
            status = head_status(buffered + data[:max(0, MAX_HEAD + 4 - len(buffered))])
            if status is not None:
                self._disarm()
                self.transport.write(raw_problem(status, _TOO_LARGE[status]))
                self.transport.close()
                return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._disarm()
        elif self.head_deadline is None:  # the first bytes of the next request on a kept-alive connection
            self.head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm()
        check = type(self).before_upgrade
        refusal = check(event.target.decode("latin-1"), self.client[0] if self.client else "") if check else None
        if refusal is not None:
            self.transport.pause_reading()
            self.loop.call_later(self.refusal_delay_s, self._answer, refusal)
            return
        super().handle_websocket_upgrade(event)

    def _answer(self, response: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()

    def _head_too_slow(self) -> None:
        self.head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def _disarm(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None


def http_protocol(*, header_timeout: timedelta, before_upgrade: BeforeUpgrade | None = None,
                  refusal_delay: timedelta = timedelta(seconds=1)) -> type[GuardedHTTP]:
    """The HTTP protocol class uvicorn is configured with (``http=``)."""

    class Configured(GuardedHTTP):
        pass

    Configured.header_timeout_s = header_timeout.total_seconds()
    Configured.refusal_delay_s = refusal_delay.total_seconds()
    Configured.before_upgrade = before_upgrade  # a plain function read off the class: never bound to an instance
    return Configured


class BodyLimit:
    """Refuses a request whose body is over ``max_bytes`` with 413, before the app reads any of it: at once when
    ``Content-Length`` says so, else as soon as the streamed (chunked) body passes the limit. The body is read
    here, whole, and handed on: the app never sees part of one."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        body = problem_body(413, f"the request body is over {self.max_bytes} bytes")
        # `connection: close`: the rest of the body is not read (uvicorn would read and discard it otherwise).
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
