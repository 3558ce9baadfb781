"""The connection hub: the live executor sockets this gateway process holds, and request/reply over them."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from core.errors import ExecutorTimeoutError, ExecutorUnavailableError
from gateway import session as sm
from workflows.contracts.common import ConnectedSignal

Send = Callable[[str], Awaitable[None]]
Close = Callable[[int, str], Awaitable[None]]
Widen = Callable[[bool], None]  # True: the socket takes replies up to RELAY_MAX_REPLY_BYTES; False: back to normal

K = TypeVar("K")
SUPERSEDED_CLOSE_CODE = 4000  # private-use range: "another connection of this executor replaced this one"


class Connection:
    """One executor socket, after its handshake."""

    __slots__ = ("connection_id", "key_id", "app_id", "org", "app", "executor_id", "session", "signal", "landed",
                 "shed", "_send", "_close", "_widen", "_wide", "_waiters", "_operator")

    def __init__(self, *, connection_id: str, org: str, app: str, executor_id: str, session: sm.Session,
                 send: Send, close: Close, key_id: str = "", app_id: str = "", widen: Widen | None = None) -> None:
        self.connection_id = connection_id
        self.key_id = key_id  # the API key it authenticated with: revoking that key closes this socket
        # The id of the app it joined: an app deleted and registered again has a new id, and this socket must go.
        self.app_id = app_id
        self.org = org
        self.app = app
        self.executor_id = executor_id
        self.session = session
        # The `connected` signal sent for it: the fence's probe answers with it, and reconciliation resends it.
        self.signal: ConnectedSignal | None = None
        # Whether that signal has landed in Temporal: reconciliation resends only what landed (one still being sent
        # lands by itself, and a second copy would only cost Temporal a signal and a workflow task).
        self.landed = False
        # Closed by its gateway to even out the gateways' shares (``gateway.balance``): its disconnect is held back.
        self.shed = False
        self._send = send
        self._close = close
        self._widen = widen
        self._wide = 0  # requests in flight whose reply may be large
        self._waiters: dict[str, asyncio.Future[sm.Reply]] = {}
        # Operators' requests go to the executor one at a time: the SDKs answer one request at a time, so a
        # recovery sent meanwhile waits behind at most one of them, not behind a crowd queued in the SDK.
        self._operator = asyncio.Lock()

    @property
    def idle(self) -> bool:
        """No request in flight on it, and no operator's request waiting for its turn."""
        return not self._waiters and not self._operator.locked()

    async def request(self, request_id: str, frame: str, *, timeout: timedelta, large_reply: bool = False
                      ) -> sm.Reply:
        """Send a request and wait for the reply carrying ``request_id``.

        ``large_reply``: an operator's request (workflow management), whose reply may exceed
        RELAY_MAX_MESSAGE_BYTES (a page of workflows), so the socket takes frames up to RELAY_MAX_REPLY_BYTES
        while it is due: asking for data must never cost an executor its connection; the normal limit holds
        whenever no such request is in flight. Operators' requests are sent one at a time (waiting for the turn
        counts toward ``timeout``); Relay's own (recovery, retention) go at once.
        """
        if not large_reply:
            return await self._request(request_id, frame, timeout=timeout, large_reply=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout.total_seconds()
        try:
            await asyncio.wait_for(self._operator.acquire(), timeout.total_seconds())
        except TimeoutError:
            raise ExecutorTimeoutError(f"executor {self.executor_id} was busy with other operators' requests "
                                       f"for {timeout}") from None
        try:
            left = timedelta(seconds=max(deadline - loop.time(), 0.001))
            return await self._request(request_id, frame, timeout=left, large_reply=True)
        finally:
            self._operator.release()

    async def _request(self, request_id: str, frame: str, *, timeout: timedelta, large_reply: bool) -> sm.Reply:
        waiter: asyncio.Future[sm.Reply] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = waiter
        self.session.expect(request_id)
        wide = large_reply and self._widen is not None
        if wide:
            self._wide += 1
            if self._wide == 1 and self._widen is not None:
                self._widen(True)
        try:
            await self._send(frame)
            return await asyncio.wait_for(waiter, timeout.total_seconds())
        except TimeoutError:
            raise ExecutorTimeoutError(f"executor {self.executor_id} did not answer within {timeout}") from None
        finally:
            self._waiters.pop(request_id, None)
            self.session.forget(request_id)
            if wide:
                self._wide -= 1
                if self._wide == 0 and self._widen is not None:
                    self._widen(False)

    def deliver(self, reply: sm.Reply) -> None:
        waiter = self._waiters.get(reply.reply.request_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)

    def fail(self, request_id: str, error: Exception) -> None:
        """A reply came but was unusable: the waiting request fails now instead of at its timeout."""
        waiter = self._waiters.get(request_id)
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def lost(self) -> None:
        """The socket closed: every request still waiting fails now, not at its timeout."""
        self.session.close()
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(ExecutorUnavailableError(f"executor {self.executor_id} disconnected"))

    async def close(self, code: int, reason: str) -> None:
        await self._close(code, reason)


ConnectionKey = tuple[str, str, str]  # org, app, executor id: ids are chosen by executors, so never alone


class Hub:
    """Connections by executor, indexed by key and by app so that revocation checks cost per key and per app,
    not per socket."""

    def __init__(self) -> None:
        self._connections: dict[ConnectionKey, Connection] = {}
        self._by_key: dict[str, set[Connection]] = {}
        self._by_app: dict[tuple[str, str], set[Connection]] = {}
        self._app_ids: dict[tuple[str, str], Counter[str]] = {}
        self._awaited: dict[ConnectionKey, set[asyncio.Future[Connection | None]]] = {}  # ``arrival``'s waiters
        # False once the process retires (its sockets closed): nothing is waited for any more (``stop_holding``).
        self.holding = True

    def __len__(self) -> int:
        return len(self._connections)

    def attach(self, conn: Connection) -> Connection | None:
        """Make ``conn`` the executor's current connection; returns the one it supersedes, if any."""
        key = (conn.org, conn.app, conn.executor_id)
        old = self._connections.get(key)
        if old is not None:
            self._unindex(old)
        self._connections[key] = conn
        self._by_key.setdefault(conn.key_id, set()).add(conn)
        self._by_app.setdefault((conn.org, conn.app), set()).add(conn)
        self._app_ids.setdefault((conn.org, conn.app), Counter())[conn.app_id] += 1
        for waiter in self._awaited.pop(key, ()):
            if not waiter.done():
                waiter.set_result(conn)
        return old

    def detach(self, conn: Connection) -> None:
        key = (conn.org, conn.app, conn.executor_id)
        if self._connections.get(key) is conn:
            del self._connections[key]
            self._unindex(conn)
        conn.lost()

    def _unindex(self, conn: Connection) -> None:
        _discard(self._by_key, conn.key_id, conn)
        _discard(self._by_app, (conn.org, conn.app), conn)
        ids = self._app_ids.get((conn.org, conn.app))
        if ids is not None:
            ids[conn.app_id] -= 1
            if ids[conn.app_id] <= 0:
                del ids[conn.app_id]
            if not ids:
                del self._app_ids[(conn.org, conn.app)]

    def get(self, org: str, app: str, executor_id: str) -> Connection:
        conn = self._connections.get((org, app, executor_id))
        if conn is None:
            raise ExecutorUnavailableError(f"executor {executor_id} is not connected to this gateway")
        return conn

    def find(self, org: str, app: str, executor_id: str) -> Connection | None:
        return self._connections.get((org, app, executor_id))

    async def arrival(self, org: str, app: str, executor_id: str, within: timedelta) -> Connection | None:
        """The executor's connection: the one held now, else the first attached ``within`` from now, else None (at
        once, or as soon as ``stop_holding`` is called, once this process stops holding)."""
        key = (org, app, executor_id)
        conn = self._connections.get(key)
        if conn is not None or within <= timedelta(0) or not self.holding:
            return conn
        waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
        self._awaited.setdefault(key, set()).add(waiter)
        try:
            async with asyncio.timeout(within.total_seconds()):
                return await waiter
        except TimeoutError:
            return self._connections.get(key)
        finally:
            waiters = self._awaited.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._awaited[key]

    def stop_holding(self) -> None:
        """This process retires: every ``arrival`` waited for ends now, with no connection, and none is waited for
        from now on."""
        self.holding = False
        for waiters in self._awaited.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def connections(self) -> list[Connection]:
        return list(self._connections.values())

    def key_ids(self) -> set[str]:
        return set(self._by_key)

    def apps(self) -> set[tuple[str, str]]:
        return set(self._by_app)

    def with_key(self, key_id: str) -> list[Connection]:
        return list(self._by_key.get(key_id, ()))

    def app_ids_in(self, org: str, app: str) -> set[str]:
        """The app ids the app's sockets joined under (one, unless the app was deleted and registered again)."""
        return set(self._app_ids.get((org, app), ()))

    def in_app(self, org: str, app: str) -> list[Connection]:
        return list(self._by_app.get((org, app), ()))


def _discard(index: dict[K, set[Connection]], key: K, conn: Connection) -> None:
    group = index.get(key)
    if group is not None:
        group.discard(conn)
        if not group:
            del index[key]
