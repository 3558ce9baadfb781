"""The Temporal worker for Relay's workflows and database activities, on the shared task queue."""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client
from temporalio.worker import Worker

from activities.registry import RegistryActivities
from gateway.models import make_engine
from gateway.settings import Settings
from gateway.store import Store
from gateway.temporal import connect
from workflows.inputs import SHARED_TASK_QUEUE
from workflows.lifecycle import ExecutorLifecycleWorkflow

log = logging.getLogger("relay.worker")


def build_worker(client: Client, store: Store, *, task_queue: str = SHARED_TASK_QUEUE) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[ExecutorLifecycleWorkflow],
        activities=RegistryActivities(store).all(),
    )


async def run(settings: Settings, stop: asyncio.Event) -> None:
    """Run the worker until ``stop`` is set."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(make_engine(settings.db_url))
    client = await connect(settings.temporal_target, settings.temporal_namespace)
    async with build_worker(client, store):
        log.info("worker running on task queue %s", SHARED_TASK_QUEUE)
        await stop.wait()
    store.engine.dispose()
