"""History that stays bounded: one executor id connecting and disconnecting 2,000 times, on a dev server whose
continue-as-new suggestion comes early. The lifecycle workflow must continue-as-new, lose no signal, and never
recover an executor that kept coming back."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator

import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from websockets.sync.client import connect

from core.temporal import connect as temporal_connect
from tests.support import Relay, relay_env, start_relay, start_temporal, wait_until
from workflows.contracts.common import lifecycle_workflow_id
from workflows.contracts.lifecycle import LifecycleState
from workflows.lifecycle import ExecutorLifecycleWorkflow

pytestmark = pytest.mark.e2e
CYCLES = int(os.environ.get("RELAY_FLAP_CYCLES", "2000"))


@pytest.fixture(scope="module")
def flappy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Relay, str]]:
    data_dir = tmp_path_factory.mktemp("flapping")
    temporal, address = start_temporal(
        data_dir, "--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=300")
    try:
        relay = start_relay(data_dir, relay_env(data_dir, RELAY_TEMPORAL_ADDRESS=address,
                                                RELAY_HANDSHAKES_PER_KEY_PER_SECOND="10000"))
        try:
            yield relay, address
        finally:
            relay.process.stop()
    finally:
        temporal.stop()


def _cycle(relay: Relay, executor_id: str) -> None:
    with connect(f"{relay.ws_url}websocket/flap-app/{relay.key}") as ws:
        request = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "executor_info", "request_id": request["request_id"],
                            "executor_id": executor_id, "application_version": "v1"}))
        # Wait for the server to have taken the handshake before closing (it signals, then reads on).
        ws.ping().wait(10)


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
def test_two_thousand_flaps(flappy: tuple[Relay, str]) -> None:
    relay, address = flappy
    with relay.api() as api:
        api.put("/v2/orgs/local/apps/flap-app")
        api.patch("/v2/orgs/local/apps/flap-app", json={"executorTimeoutSecs": 600})
    started = time.monotonic()
    for _ in range(CYCLES):
        _cycle(relay, "flapper")
    elapsed = time.monotonic() - started
    with connect(f"{relay.ws_url}websocket/flap-app/{relay.key}") as last:
        request = json.loads(last.recv(timeout=10))
        last.send(json.dumps({"type": "executor_info", "request_id": request["request_id"],
                              "executor_id": "flapper", "application_version": "v1"}))
        state, runs = asyncio.run(_workflow_facts(address))
        assert state.status == "HEALTHY" and state.connection is not None, (state, relay.process.output()[-3000:])
        assert state.recorded_connection_id == state.connection.connection_id
        assert runs > 1, "history was never continued-as-new"
    wait_until(lambda: relay.executors("flap-app").get("flapper") == "DISCONNECTED", timeout=10,
               what="DISCONNECTED after the last close")
    ops = [op for op, ex in relay.audit("flap-app") if ex == "flapper"]
    assert "executor.dead" not in ops and not any(op.startswith("executor.recovery") for op in ops)
    print(f"\n{CYCLES} cycles in {elapsed:.1f}s; {runs} runs; {len(ops)} audit rows")


async def _workflow_facts(address: str) -> tuple[LifecycleState, int]:
    client: Client = await temporal_connect(address, "default")
    handle = client.get_workflow_handle(lifecycle_workflow_id("local", "flap-app", "flapper"))

    async def settled() -> LifecycleState:
        # Every signal sent has been handled once the workflow holds the last connection as recorded.
        state = LifecycleState()
        for _ in range(600):  # generous: a loaded machine may take a while to drain thousands of signals
            try:
                state = await handle.query(ExecutorLifecycleWorkflow.state)
            except RPCError:
                # A workflow task that lost a race with new signals (e.g. a continue-as-new refused for them)
                # is retried by the server; queries are refused meanwhile.
                await asyncio.sleep(0.1)
                continue
            if state.connection is not None and state.recorded_connection_id == state.connection.connection_id:
                return state
            await asyncio.sleep(0.1)
        return state

    state = await settled()
    runs = 0
    async for _ in client.list_workflows(f'WorkflowId = "{handle.id}"'):
        runs += 1
    return state, runs
