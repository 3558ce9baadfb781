"""One gateway process at run time: its settings, store, connection hub, Temporal client, its own task queue
(for socket-bound activities), and the signals it sends to lifecycle workflows."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities.dispatch import HubActivities
from gateway.admission import Admission
from gateway.hub import Hub
from gateway.settings import Settings
from gateway.store import Store
from workflows.gateway import GatewayWorkflow
from workflows.inputs import (
    GATEWAY_TASK_QUEUE_PREFIX,
    SHARED_TASK_QUEUE,
    ConnectedSignal,
    DisconnectedSignal,
    GatewayInput,
    LifecycleInput,
    gateway_workflow_id,
    lifecycle_workflow_id,
)
from workflows.lifecycle import ExecutorLifecycleWorkflow

log = logging.getLogger("relay.gateway")

SIGNAL_ATTEMPTS = 8
SIGNAL_BACKOFF_INITIAL = timedelta(milliseconds=200)
SIGNAL_BACKOFF_MAX = timedelta(seconds=5)


class Gateway:
    def __init__(self, *, settings: Settings, store: Store, client: Client) -> None:
        self.settings = settings
        self.store = store
        self.client = client
        self.hub = Hub()
        self.admission = Admission(
            clock=time.monotonic,
            max_connections_per_key=settings.max_connections_per_key,
            handshakes_per_second=settings.handshakes_per_key_per_second,
            allowed_origins=settings.origins,
        )
        self.task_queue = GATEWAY_TASK_QUEUE_PREFIX + uuid.uuid4().hex
        self._background: set[asyncio.Task[None]] = set()
        self._lanes = SignalLanes()

    def worker(self) -> Worker:
        return Worker(self.client, task_queue=self.task_queue, activities=HubActivities(self.hub).all())

    async def start_watch(self) -> None:
        """Start the workflow that disconnects this gateway's executors if this process dies."""
        await self.client.start_workflow(
            GatewayWorkflow.run,
            GatewayInput(self.task_queue, heartbeat_timeout=self.settings.gateway_heartbeat_timeout),
            id=gateway_workflow_id(self.task_queue),
            task_queue=SHARED_TASK_QUEUE,
            static_summary=f"gateway process {self.task_queue}",
        )

    async def signal_connected(self, org: str, app: str, signal: ConnectedSignal) -> bool:
        """Signal-with-start the executor's lifecycle workflow. False when Temporal stayed unreachable."""
        executor_id = signal.info.executor_id

        async def send() -> None:
            await self.client.start_workflow(
                ExecutorLifecycleWorkflow.run,
                LifecycleInput(org, app, executor_id, recovery_timeout=self.settings.recovery_timeout),
                id=lifecycle_workflow_id(org, app, executor_id),
                task_queue=SHARED_TASK_QUEUE,
                start_signal="connected",
                start_signal_args=[signal],
                search_attributes=_search_attributes(org, app, executor_id, signal.info.application_version),
                static_summary=f"DBOS executor {executor_id} of {org}/{app}",
            )

        return await self._lanes.send((org, app, executor_id), signal.connection_id, connected=True,
                                    send=lambda: _retry(send, f"connected for {executor_id}"))

    def spawn_disconnected(self, org: str, app: str, executor_id: str, connection_id: str) -> None:
        """Signal ``disconnected`` in the background (with retries) so closing a socket never waits on it."""
        signal = DisconnectedSignal(connection_id=connection_id, signal_id=str(uuid.uuid4()))

        async def send() -> None:
            handle = self.client.get_workflow_handle(lifecycle_workflow_id(org, app, executor_id))
            await handle.signal(ExecutorLifecycleWorkflow.disconnected, signal)

        self.spawn(self._lanes.send((org, app, executor_id), connection_id, connected=False,
                                  send=lambda: _retry(send, f"disconnected for {executor_id}")))

    def spawn(self, work: Awaitable[object]) -> None:
        """Run ``work`` in the background; ``drain`` waits for what is still running at shutdown."""
        task = asyncio.ensure_future(_drop(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close_all(self, code: int = 1001, reason: str = "gateway shutting down") -> None:
        for conn in self.hub.connections():
            await conn.close(code, reason)

    async def drain(self, timeout: timedelta = timedelta(seconds=10)) -> None:
        """Wait for in-flight ``disconnected`` signals before the process exits."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout.total_seconds())


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


async def _drop(work: Awaitable[object]) -> None:
    try:
        await work
    except Exception:
        log.exception("background work failed")


async def _retry(send: Callable[[], Awaitable[None]], what: str) -> bool:
    delay = SIGNAL_BACKOFF_INITIAL
    for attempt in range(1, SIGNAL_ATTEMPTS + 1):
        try:
            await send()
            return True
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False  # the workflow already ended: nothing to tell it
            log.warning("signal %s failed (attempt %d): %s", what, attempt, err.message)
        await asyncio.sleep(delay.total_seconds())
        delay = min(delay * 2, SIGNAL_BACKOFF_MAX)
    return False


RELAY_ORG = SearchAttributeKey.for_keyword("RelayOrg")
RELAY_APP = SearchAttributeKey.for_keyword("RelayApp")
RELAY_EXECUTOR_ID = SearchAttributeKey.for_keyword("RelayExecutorId")
RELAY_APP_VERSION = SearchAttributeKey.for_keyword("RelayAppVersion")


def _search_attributes(org: str, app: str, executor_id: str, version: str) -> TypedSearchAttributes:
    return TypedSearchAttributes([
        SearchAttributePair(RELAY_ORG, org),
        SearchAttributePair(RELAY_APP, app),
        SearchAttributePair(RELAY_EXECUTOR_ID, executor_id),
        SearchAttributePair(RELAY_APP_VERSION, version),
    ])
