"""The socket to Relay: connect, answer, keep alive, reconnect; on a background thread of its own.

Liveness is this client's own, not the library's: a ping every ``ping_interval`` (20 s) whose pong must come within
``pong_timeout`` (15 s), else the socket is dropped and another opened, through the load balancer, to whichever
gateway is alive. (dbos 3.2.0's client leaves this to websockets >= 15's keepalive, 20 s + 20 s, so it notices a
frozen gateway only about 40 s after the freeze.) Relay's own pings are answered by websockets as they arrive,
whatever request is being worked on.

Requests are answered one at a time, in order, as every SDK answers them; a retention round runs on its own
thread. A connection that fails to open, or is lost, is tried again after ``Backoff``: 1 s, doubling to 30 s,
jittered, and back to 1 s once a connection has been answered on.

The key is the last segment of the URL (the protocol puts it there); it is never logged: log lines name the URL
with the key replaced, and the websockets logger this connection uses has the key taken out of its records.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import quote

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from relay_dbos.protocol import Operation, handle

log = logging.getLogger("relay_dbos")

PING_INTERVAL = timedelta(seconds=20)
PONG_TIMEOUT = timedelta(seconds=15)
OPEN_TIMEOUT = timedelta(seconds=5)  # the handshake, as dbos 3.2.0 allows it
CLOSE_TIMEOUT = timedelta(seconds=2)  # a frozen gateway never answers the close: it is not waited for long
RECV_POLL = timedelta(seconds=1)  # how soon a close() is noticed by a connection waiting for a request


@dataclass
class Backoff:
    """Delays between connection attempts: ``initial`` doubling to ``cap``, each drawn from the upper
    ``1 - jitter`` .. 1 of its step (never above ``cap``), so a fleet that lost its gateway together does not
    come back in one wave."""

    initial: timedelta = timedelta(seconds=1)
    cap: timedelta = timedelta(seconds=30)
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0

    def next(self) -> timedelta:
        step = min(self.cap, self.initial * (1 << min(self.attempts, 30)))
        self.attempts += 1
        return step * (1 - self.jitter * self.rng.random())

    def reset(self) -> None:
        self.attempts = 0


class _Redact(logging.Filter):
    """Takes the key out of websockets' log records (at DEBUG it logs the request line, which holds it)."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(s in message for s in self.secrets):
            for secret in self.secrets:
                message = message.replace(secret, "***")
            record.msg, record.args = message, None
        return True


def websocket_url(base: str, app_name: str, key: str) -> str:
    """``{base}/websocket/{app}/{key}``: where every SDK's conductor client connects."""
    return f"{base.rstrip('/')}/websocket/{quote(app_name, safe='')}/{quote(key, safe='')}"


class Connection:
    """The thread that holds the socket. ``start`` once; ``close`` ends it (and the socket, cleanly)."""

    def __init__(self, *, base_url: str, app_name: str, key: str, operations: Mapping[str, Operation],
                 metadata_only: bool = False, stopping: threading.Event | None = None,
                 ping_interval: timedelta = PING_INTERVAL, pong_timeout: timedelta = PONG_TIMEOUT,
                 open_timeout: timedelta = OPEN_TIMEOUT, backoff: Backoff | None = None) -> None:
        self.url = websocket_url(base_url, app_name, key)
        self.shown_url = websocket_url(base_url, app_name, "") + "***"  # not quoted: "%2A%2A%2A" reads as a key
        self.operations = operations
        self.metadata_only = metadata_only
        self.stopping = stopping or threading.Event()
        self.ping_interval, self.pong_timeout, self.open_timeout = ping_interval, pong_timeout, open_timeout
        self.backoff = backoff or Backoff()
        self.connected = threading.Event()  # set while a socket is open and has been answered on
        self.connections = 0  # sockets opened so far (a reconnect makes it 2)
        self._socket: ClientConnection | None = None
        self._ws_log = logging.getLogger("relay_dbos.websockets")
        self._ws_log.addFilter(_Redact([key, quote(key, safe="")]))
        self._thread = threading.Thread(target=self._run, name="relay-dbos", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: timedelta = timedelta(seconds=5)) -> None:
        self.stopping.set()
        socket = self._socket
        if socket is not None:
            socket.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout.total_seconds())

    # -- the thread -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._serve()
            except InvalidStatus as err:
                log.warning("relay-dbos: Relay refused the connection to %s: HTTP %d", self.shown_url,
                            err.response.status_code)
            except ConnectionClosed as err:
                if not self.stopping.is_set():
                    log.warning("relay-dbos: connection to Relay lost (%s); reconnecting", _closed(err))
            except Exception as err:  # never the application's problem: this thread goes on
                if not self.stopping.is_set():
                    log.warning("relay-dbos: cannot reach Relay at %s (%s: %s); reconnecting", self.shown_url,
                                type(err).__name__, str(err).replace(self.url, self.shown_url)[:300])
            finally:
                self.connected.clear()
                self._socket = None
            if not self.stopping.is_set():
                self.stopping.wait(self.backoff.next().total_seconds())
        log.info("relay-dbos: connection to Relay closed")

    def _serve(self) -> None:
        with connect(self.url, open_timeout=self.open_timeout.total_seconds(),
                     close_timeout=CLOSE_TIMEOUT.total_seconds(), ping_interval=None, ping_timeout=None,
                     max_size=None, logger=self._ws_log) as socket:
            self._socket = socket
            self.connections += 1
            if self.stopping.is_set():  # close() came while the handshake ran
                return
            keepalive = threading.Thread(target=self._keepalive, args=(socket,), name="relay-dbos-keepalive",
                                         daemon=True)
            keepalive.start()
            while not self.stopping.is_set():
                try:
                    frame = socket.recv(timeout=RECV_POLL.total_seconds())
                except TimeoutError:
                    continue
                socket.send(handle(frame, self.operations, metadata_only=self.metadata_only))
                if not self.connected.is_set():
                    self.connected.set()
                    self.backoff.reset()
                    log.info("relay-dbos: connected to Relay at %s", self.shown_url)

    def _keepalive(self, socket: ClientConnection) -> None:
        """Ping every ``ping_interval``; a pong later than ``pong_timeout`` drops the socket (the reading thread then
        reconnects). Ends with its socket."""
        while not self.stopping.wait(self.ping_interval.total_seconds()):
            try:
                pong = socket.ping()
            except ConnectionClosed:
                return
            if not pong.wait(self.pong_timeout.total_seconds()):
                if self.stopping.is_set() or self._socket is not socket:
                    return
                log.warning("relay-dbos: no pong from Relay within %g s; reconnecting",
                            self.pong_timeout.total_seconds())
                socket.close(1011, "pong timeout")
                return
            if self._socket is not socket:
                return


def _closed(err: ConnectionClosed) -> str:
    close = err.rcvd or err.sent
    if close is None:
        return "no close frame"
    return f"code {close.code}" + (f": {close.reason[:100]}" if close.reason else "")
