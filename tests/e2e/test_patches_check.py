"""`relay patches check` on `relay dev`: an open lifecycle run of a generation the next release no longer replays
makes it exit 1 and names the run; once no such run is open it exits 0.

Beside a real executor's run (started by the gateway, the newest generation), two runs as older code started them: a
stand-in workflow registered under the lifecycle's type name, on a task queue of the test's own that Relay's worker
does not poll, writes the marker its code wrote first thing (generation 3's; a patch of before generation 1) and
idles, as a HEALTHY executor's run does. Only their histories are read, so the test's worker may stop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from core.temporal import connect as temporal_connect
from tests.support import VENV_BIN, Relay, play_executor, running_relay, wait_recorded, wait_until
from workflows.contracts.common import LIFECYCLE_WORKFLOW_TYPE, lifecycle_workflow_id
from workflows.lifecycle_generations import GENERATION_3_PATCH, NEWEST_GENERATION

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

# A patch from before generation 1: a run whose first patch marker is this one is of generation 0.
BEFORE_GENERATION_1 = "local-db-activities"


@workflow.defn(name=LIFECYCLE_WORKFLOW_TYPE)
class OlderLifecycle:
    """A lifecycle run as older code started it: ``marker`` first thing, then idle."""

    @workflow.run
    async def run(self, marker: str) -> None:
        workflow.patched(marker)
        await workflow.wait_condition(lambda: False)


def _check(relay: Relay, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "relay"), "patches", "check", *args], env=relay.env, capture_output=True,
                          text=True, timeout=60)


async def _start_older_runs(address: str) -> list[str]:
    """Start the two older runs and wait until each wrote its marker (the worker then stops); their workflow ids,
    generation 3's first."""
    client = await temporal_connect(address, "default")
    queue = f"older-lifecycle-{uuid.uuid4()}"
    ids = []
    async with Worker(client, task_queue=queue, workflows=[OlderLifecycle],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        for name, marker in [("gen3", GENERATION_3_PATCH), ("gen0", BEFORE_GENERATION_1)]:
            handle = await client.start_workflow(OlderLifecycle.run, marker, task_queue=queue,
                                                 id=lifecycle_workflow_id("local", "patches", f"older-{name}"))
            for _ in range(100):
                events = [e async for e in handle.fetch_history_events()]
                if any(e.HasField("marker_recorded_event_attributes") for e in events):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"{handle.id} wrote no marker")
            ids.append(handle.id)
    return ids


async def _terminate(address: str, workflow_id: str) -> None:
    client = await temporal_connect(address, "default")
    await client.get_workflow_handle(workflow_id).terminate("ended in the test")


def test_an_open_run_of_an_older_generation_blocks_the_upgrade_until_it_ends(tmp_path: Path) -> None:
    current = lifecycle_workflow_id("local", "patches", "current-1")
    with running_relay(tmp_path) as relay:
        with relay.api() as api:
            api.put("/v2/orgs/local/apps/patches")
        with play_executor(relay, "patches", "current-1"):
            wait_recorded(relay.temporal_address, "patches", "current-1")
            gen3, gen0 = asyncio.run(_start_older_runs(relay.temporal_address))

            # Visibility lists a started run within moments on the dev server.
            wait_until(lambda: gen0 in _check(relay).stdout, timeout=20, what="both older runs listed")
            blocked = _check(relay)
            assert blocked.returncode == 1, blocked.stdout + blocked.stderr
            assert gen3 in blocked.stdout and gen0 in blocked.stdout, blocked.stdout
            assert "not safe yet: 2 open lifecycle run(s) older than generation 4" in blocked.stdout, blocked.stdout
            assert current not in blocked.stdout  # generation 6: the next release replays it
            print(f"\n{blocked.stdout}")

            report = json.loads(_check(relay, "-o", "json").stdout)
            generations = {run["workflow_id"]: run["generation"] for run in report["runs"]}
            assert generations == {current: NEWEST_GENERATION, gen3: 3, gen0: 0}, generations
            assert report["safe"] is False and report["replaysFrom"] == 4

            # Code that still replays generation 3 (this release's) is blocked by the run of generation 0 only.
            this_release = _check(relay, "--replays-from", "3")
            assert this_release.returncode == 1, this_release.stdout
            assert "not safe yet: 1 open lifecycle run(s)" in this_release.stdout and gen0 in this_release.stdout

            asyncio.run(_terminate(relay.temporal_address, gen0))
            wait_until(lambda: _check(relay, "--replays-from", "3").returncode == 0, timeout=20,
                       what="safe for generation 3 once the run of generation 0 ended")
            assert _check(relay).returncode == 1  # the run of generation 3 is still open
            asyncio.run(_terminate(relay.temporal_address, gen3))
            wait_until(lambda: _check(relay).returncode == 0, timeout=20, what="safe once no older run is open")
            safe = _check(relay)
            assert "safe: every open lifecycle run (1) is of generation 4 or newer" in safe.stdout, safe.stdout
