"""A WebSocket client that does only what the test says: websockets' sans-I/O protocol over a plain socket.

Unlike a library client it never answers pings by itself, so a test can play a silent (half-dead) executor.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri


class RawClient:
    def __init__(self, url: str, *, origin: str | None = None, timeout: float = 10) -> None:
        uri = parse_uri(url)
        self.protocol = ClientProtocol(uri, origin=origin, max_size=None)  # type: ignore[arg-type]
        self.sock = socket.create_connection((uri.host, uri.port), timeout=timeout)
        self.events: list[Frame] = []
        self.response: Response | None = None
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        while self.response is None:
            self._read()

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.sock.sendall(data)

    def _read(self) -> bool:
        data = self.sock.recv(65536)
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        for event in self.protocol.events_received():
            if isinstance(event, Response):
                self.response = event
            elif isinstance(event, Frame):
                self.events.append(event)
        return bool(data)

    @property
    def accepted(self) -> bool:
        return self.response is not None and self.response.status_code == 101

    def recv_json(self) -> dict[str, Any]:
        """The next text frame (pings are recorded, not answered)."""
        while True:
            for i, frame in enumerate(self.events):
                if frame.opcode is Opcode.TEXT:
                    del self.events[i]
                    parsed: dict[str, Any] = json.loads(bytes(frame.data))
                    return parsed
            if not self._read():
                raise ConnectionError("closed")

    def read_until(self, done: Callable[[list[Frame]], bool], timeout: float) -> None:
        """Read frames until ``done`` holds for those recorded (each read may wait ``timeout``)."""
        self.sock.settimeout(timeout)
        while not done(self.events):
            if not self._read():
                raise ConnectionError("closed")

    def send_text(self, text: str) -> None:
        self.protocol.send_text(text.encode())
        self._flush()

    def send_ping(self) -> None:
        self.protocol.send_ping(b"p")
        self._flush()

    def handshake(self, executor_id: str, **fields: Any) -> None:
        request = self.recv_json()
        assert request["type"] == "executor_info"
        self.send_text(json.dumps({"type": "executor_info", "request_id": request["request_id"],
                                   "executor_id": executor_id, "application_version": "v1", **fields}))

    def close_code(self, timeout: float) -> int | None:
        """Read until the server closes; the close code it sent (None if it just dropped the connection)."""
        self.sock.settimeout(timeout)
        while True:
            for frame in self.events:
                if frame.opcode is Opcode.CLOSE:
                    return int.from_bytes(frame.data[:2], "big") if len(frame.data) >= 2 else 1005
            try:
                if not self._read():
                    return None
            except ConnectionResetError:
                return None

    def close(self) -> None:
        self.sock.close()
