"""The `relay worker` process's probes, served on its metrics listener (RELAY_METRICS_PORT: it has no other HTTP
port): ``/healthz`` while the process serves; ``/readyz`` 200 only while its Temporal worker polls the shared task
queue, Temporal answers and Relay's database answers, and 503 from SIGTERM on (it stops polling then, and only
finishes the activities it has).

Whether the worker polls is read off the ``temporalio.worker.Worker`` that ``worker.run`` builds: ``Polling`` is a
plugin of the client it is built on, and the SDK makes a client's plugins plugins of every worker made with that
client, each handed the ``Worker`` as it starts (``is_running``: started, its namespace checked, not shut down).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import Client
from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker

from core.store import Store
from workflows.contracts.common import SHARED_TASK_QUEUE

# Temporal's health check must answer within this long for the worker to count as ready.
READY_TEMPORAL_TIMEOUT = timedelta(seconds=2)
# The listener's thread waits this long for the checks, which run on the event loop (each within its own limit).
READY_ANSWER_TIMEOUT = timedelta(seconds=5)


class Polling(SimplePlugin):
    """A client plugin that keeps the worker run on that client, so readiness can ask whether it is running."""

    def __init__(self) -> None:
        super().__init__("relay.readiness")
        self.worker: Worker | None = None

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        self.worker = worker
        await next(worker)

    def on(self, client: Client) -> Client:
        """``client`` (the same connection, namespace and converter) with this plugin added."""
        config = client.config()
        config["plugins"] = [*config["plugins"], self]
        return Client(**config)

    @property
    def polling(self) -> bool:
        return self.worker is not None and self.worker.is_running


@dataclass
class WorkerReadiness:
    """The worker's ``metrics.Readiness``: called on the listener's thread, it runs the checks on the event loop."""

    polling: Polling
    client: Client
    store: Store
    stop: asyncio.Event  # set on SIGTERM (or SIGINT)
    loop: asyncio.AbstractEventLoop

    async def reasons(self) -> list[str]:
        """Why the worker is not ready; empty when it is."""
        if self.stop.is_set():
            return ["shutting down: no longer polling; finishing the activities in flight"]
        reasons = []
        if not self.polling.polling:
            reasons.append(f"not polling task queue {SHARED_TASK_QUEUE}")
        try:
            await self.client.service_client.check_health(timeout=READY_TEMPORAL_TIMEOUT)
        except Exception as err:  # unreachable, or no answer in time: the SDK's one-line message
            reasons.append(f"Temporal unreachable ({str(err) or type(err).__name__})")
        if (database := await self.store.unreachable()) is not None:
            reasons.append(database)
        return reasons

    def __call__(self) -> str | None:
        future = asyncio.run_coroutine_threadsafe(self.reasons(), self.loop)
        try:
            reasons = future.result(READY_ANSWER_TIMEOUT.total_seconds())
        except concurrent.futures.TimeoutError:
            future.cancel()
            return "the worker process did not answer in time"
        return "; ".join(reasons) or None
