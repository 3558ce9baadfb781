"""The P3 baseline: raw ``client.start_workflow(..., start_signal=...)`` calls against the Temporal dev server
Relay uses, for a trivial workflow that a worker (a separate process, like Relay's) runs.

    python -m tests.bench.trivial worker ADDRESS [relay-polls]   run the worker until SIGTERM
    python -m tests.bench.trivial storm ADDRESS N [relay-polls]  N concurrent calls; prints one JSON line of timings

``relay-polls``: a worker that polls for workflow tasks as Relay's does (``worker.WORKFLOW_TASK_POLLERS``), on a task
queue of its own; without it, the SDK's default (at most 5 polls at once).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import PollerBehavior, PollerBehaviorSimpleMaximum, Worker

TASK_QUEUE = "bench-trivial"


def _queue(relay_polls: bool) -> str:
    return f"{TASK_QUEUE}-relay-polls" if relay_polls else TASK_QUEUE


@workflow.defn(name="BenchTrivial")
class Trivial:
    """Waits for its start signal, then ends."""

    def __init__(self) -> None:
        self.signalled = False

    @workflow.signal
    def connected(self, payload: dict[str, str]) -> None:
        self.signalled = True

    @workflow.run
    async def run(self, name: str) -> None:
        await workflow.wait_condition(lambda: self.signalled)


async def worker(address: str, relay_polls: bool) -> None:
    client = await Client.connect(address)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    from worker import WORKFLOW_TASK_POLLERS  # here, not at the top: the sandbox re-imports this module

    polls: PollerBehavior = WORKFLOW_TASK_POLLERS if relay_polls else PollerBehaviorSimpleMaximum(5)
    async with Worker(client, task_queue=_queue(relay_polls), workflows=[Trivial], workflow_task_poller_behavior=polls):
        print("ready", flush=True)
        await stop.wait()


async def storm(address: str, count: int, relay_polls: bool) -> None:
    client = await Client.connect(address)
    run = uuid.uuid4().hex[:8]
    calls_done: list[float] = []

    async def one(i: int) -> float:
        handle = await client.start_workflow(
            Trivial.run, f"trivial-{i}", id=f"bench-trivial/{run}/{i}", task_queue=_queue(relay_polls),
            start_signal="connected", start_signal_args=[{"connection_id": str(uuid.uuid4())}],
            execution_timeout=timedelta(minutes=10),
        )
        calls_done.append(time.time())
        await handle.result()
        return time.time()

    t0 = time.time()
    finished = await asyncio.gather(*(one(i) for i in range(count)))
    print(json.dumps({"t0": t0, "calls_done": max(calls_done), "workflows_done": max(finished)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        asyncio.run(worker(sys.argv[2], sys.argv[3:] == ["relay-polls"]))
    else:
        asyncio.run(storm(sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["relay-polls"]))
        # The figures are out; the SDK's runtime threads have crashed this interpreter at exit (SIGSEGV in
        # PyGILState_Release), failing a run that had measured what it should: leave without tearing them down.
        os._exit(0)
