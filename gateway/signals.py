"""How a gateway sends an executor's socket events to Temporal: one lane per executor, so its signals go out in
the order its sockets came and went (``SignalLanes``), and the registry rows a burst of connects reads before
signalling, read together (``RowReads``)."""

from __future__ import annotations

import asyncio
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

    Each row comes with the moment (``time.monotonic``, taken on the reading thread once the query returned) it was
    read: whether it was read before a signal was sent is a fact about that moment, not about when the event loop,
    busy with a burst of handshakes, got round to handing it over."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._waiting: dict[tuple[str, str, str], list[asyncio.Future[Read]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-row-reads")

    async def seen(self, executor: tuple[str, str, str]) -> Read:
        """The executor's row (None: it has none) and when it was read."""
        future: asyncio.Future[Read] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(executor, []).append(future)
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name="relay-gateway-row-reads")
        return await future

    async def _read(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                try:
                    rows, read_at = await asyncio.get_running_loop().run_in_executor(
                        self._thread, self._read_now, list(batch))
                except Exception as err:  # each waiting connect takes it as "not read"
                    for futures in batch.values():
                        for future in futures:
                            if not future.done():
                                future.set_exception(err)
                    continue
                for key, futures in batch.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(Read(rows.get(key), read_at))
        finally:
            self._reader = None

    def _read_now(self, executors: list[tuple[str, str, str]]) -> tuple[dict[tuple[str, str, str], RowSeen], float]:
        rows = self._store.rows_seen(executors)
        return rows, time.monotonic()


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
