"""How a gateway sends an executor's socket events to Temporal: one lane per executor, so its signals go out in
the order its sockets came and went (``SignalLanes``), and the registry rows a burst of connects reads before
signalling, read together (``RowReads``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from core.store import RowSeen, Store


class Read(NamedTuple):
    row: RowSeen | None
    at: float  # time.monotonic() once the query had returned


class RowReads:
    """The registry rows a burst of connects reads before signalling (``Gateway.signal_connected``), read together:
    a read runs as soon as one is asked for, and those asked for meanwhile go in the next one, one query for up to
    ``ROWS_SEEN_AT_ONCE`` executors (``Store.rows_seen``), on a thread of its own (beside SQLite's writer thread:
    WAL). A query per connect, in the event loop's default pool, queued behind the handshakes' own key checks when a
    gateway's 3,333 executors all moved here at once, and many took longer than the wait allowed.

    The reading thread takes the next batch itself as soon as a query returns, without a turn of the event loop in
    between: under a burst of handshakes the loop is busy for seconds, and batches that waited for it to start them
    were read too late (203 of 3,333 moves in the scale kill). Each row comes with the moment (``time.monotonic``,
    taken on the reading thread once the query returned) it was read: whether it was read before a signal was sent
    is a fact about that moment, not about when the busy loop got round to handing it over."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, str, str], list[asyncio.Future[Read]]] = {}  # under the lock
        self._reading = False  # under the lock: the thread is reading, and takes what waits when it is done
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-row-reads")

    async def seen(self, executor: tuple[str, str, str]) -> Read:
        """The executor's row (None: it has none) and when it was read."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Read] = loop.create_future()
        with self._lock:
            self._waiting.setdefault(executor, []).append(future)
            start, self._reading = not self._reading, True
        if start:
            self._thread.submit(self._read, loop)
        return await future

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the reading thread: batch after batch, until none waits. Should it end any other way, the next read
        asked for starts the thread again (the batch it held is left to its waits' timeouts)."""
        try:
            while True:
                with self._lock:
                    batch, self._waiting = self._waiting, {}
                    if not batch:
                        self._reading = False
                        return
                try:
                    rows: dict[tuple[str, str, str], RowSeen] | Exception = self._store.rows_seen(list(batch))
                except Exception as err:  # each waiting connect takes it as "not read"
                    rows = err
                read_at = time.monotonic()
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(_hand_over, batch, rows, read_at)
        except BaseException:
            with self._lock:
                self._reading = False
            raise


def _hand_over(batch: dict[tuple[str, str, str], list[asyncio.Future[Read]]],
               rows: dict[tuple[str, str, str], RowSeen] | Exception, read_at: float) -> None:
    """On the event loop: each waiting connect gets its row, or the read's failure."""
    for key, futures in batch.items():
        for future in futures:
            if future.done():  # given up on meanwhile
                continue
            if isinstance(rows, Exception):
                future.set_exception(rows)
            else:
                future.set_result(Read(rows.get(key), read_at))


class SignalLanes:
    """Each executor's signals, sent one at a time in the order its sockets came and went.

    Sends are retried and may be slow, so without this a socket's ``connected`` could land after a newer
    socket's, and the workflow would take the old one for current (seen with an executor reconnecting every few
    milliseconds). A signal whose turn comes after a newer connection's ``connected`` was queued is dropped: the
    newer connection supersedes it in the workflow anyway, and a fast-flapping executor builds no backlog.
    """

    def __init__(self) -> None:
        self._lanes: dict[tuple[str, str, str], _Lane] = {}

    def __len__(self) -> int:
        return len(self._lanes)

    def is_latest(self, executor: tuple[str, str, str], connection_id: str) -> bool:
        """False once a newer connection's ``connected`` is queued for the executor: this one's signals are stale."""
        lane = self._lanes.get(executor)
        return lane is None or lane.latest == connection_id

    async def send(self, executor: tuple[str, str, str], connection_id: str, *, connected: bool,
                   send: Callable[[], Awaitable[bool]]) -> bool:
        """``send()``'s result, or True when the signal was dropped as stale."""
        lane = self._lanes.get(executor)
        if lane is None:
            lane = self._lanes[executor] = _Lane()
            lane.latest = connection_id  # nothing newer is queued
        elif connected:
            lane.latest = connection_id
        previous, mine = lane.tail, asyncio.get_running_loop().create_future()
        lane.tail = mine
        try:
            if previous is not None:
                await asyncio.shield(previous)  # a cancelled waiter must not cancel the one it waits for
            if lane.latest != connection_id:
                return True
            return await send()
        finally:
            if not mine.done():
                mine.set_result(None)
            if lane.tail is mine:
                del self._lanes[executor]


class _Lane:
    """The last signal queued (the next one waits for it), and the connection of the newest ``connected``."""

    __slots__ = ("tail", "latest")

    def __init__(self) -> None:
        self.tail: asyncio.Future[None] | None = None
        self.latest = ""
