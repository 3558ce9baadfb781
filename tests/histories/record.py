"""Record the replay fixtures in ``tests/histories/``: one JSON history per workflow run. Run by hand::

    .venv/bin/python -m tests.histories.record                  # scenarios that have no fixture yet
    .venv/bin/python -m tests.histories.record --overwrite      # every scenario, replacing its fixtures
    .venv/bin/python -m tests.histories.record happy-recovery   # only the scenarios named

Each scenario (``scenarios.py``) runs on a fresh time-skipping test server and is checked before anything is
written. A workflow that continued-as-new is written as ``<scenario>.<n>.json``, one file per run, since the
replayer replays one run at a time. A scenario recorded with a lowered ``SIGNAL_BUDGET`` carries
``signal-budget-<n>`` in its name: the replay test reads the budget back from there.

Fixtures are history: once one is committed, re-record it only on purpose (see
docs/pages/contributing/changing-a-workflow.md), since replaying the old recording is what proves a change compatible
with running workflows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from core.temporal import data_converter, venv_binary
from tests.histories.scenarios import SCENARIOS, Lifecycle, Scenario, ScenarioError, check, gateway_watch
from tests.lifecycle_fakes import FakeRelay, Relay
from worker import workflow_runner
from workflows import lifecycle_base
from workflows.contracts.common import SEARCH_ATTRIBUTES
from workflows.lifecycle import ExecutorLifecycleWorkflow

HISTORIES = Path(__file__).parent


async def start_env() -> WorkflowEnvironment:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(venv_binary("temporal-test-server")),
        data_converter=data_converter,
    )
    # Relay's attributes, as `relay dev` and docker-compose register them, so the status upserts are recorded.
    await env.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=env.client.namespace,
        search_attributes={name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{kind.upper()}")
                           for name, kind in SEARCH_ATTRIBUTES.items()},
    ))
    return env


@contextlib.contextmanager
def _signal_budget(budget: int | None) -> Iterator[None]:
    """Lower the module constant; only an unsandboxed worker sees it (the sandbox re-imports the module)."""
    saved = lifecycle_base.SIGNAL_BUDGET
    lifecycle_base.SIGNAL_BUDGET = budget or saved
    try:
        yield
    finally:
        lifecycle_base.SIGNAL_BUDGET = saved


@contextlib.asynccontextmanager
async def _lifecycle_workers(env: WorkflowEnvironment, scenario: Scenario) -> AsyncIterator[Lifecycle]:
    """As test_lifecycle_workflow's fixture: the workflow and database fakes on the scenario's queue, each
    peer's fakes on its own gateway queue."""
    fakes = FakeRelay(task_queue=f"record-{scenario.name}", clock=env.get_current_time, hold_probes=True)
    relay = Relay(env, fakes, executor_id=f"exec-{scenario.name}")
    # The worker's own sandbox (as production and the lifecycle tests run it): under the stock runner the
    # contracts' pydantic types no longer decode ("not fully defined").
    runner = UnsandboxedWorkflowRunner() if scenario.signal_budget else workflow_runner(data_converter)
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(_signal_budget(scenario.signal_budget))
        await stack.enter_async_context(
            Worker(env.client, task_queue=fakes.task_queue, workflows=[ExecutorLifecycleWorkflow],
                   activities=fakes.db_activities(), workflow_runner=runner)
        )
        for peer in fakes.peers:
            await stack.enter_async_context(
                Worker(env.client, task_queue=peer.gateway_queue, activities=fakes.gateway_activities())
            )
        await stack.enter_async_context(
            Worker(env.client, task_queue=fakes.self_queue, activities=fakes.self_gateway_activities()))
        try:
            yield Lifecycle(env, fakes, relay)
        finally:
            await relay.stop()


async def record(env: WorkflowEnvironment, scenario: Scenario) -> list[WorkflowHistory]:
    """Play one scenario; the histories of its runs, oldest first."""
    if scenario.play is None:
        workflow_id, first_run = await gateway_watch(env, scenario.name)
    else:
        async with _lifecycle_workers(env, scenario) as lc:
            try:
                await scenario.play(lc)
            except (AssertionError, pytest.fail.Exception) as err:  # from the fakes' waits and Relay.result()
                raise ScenarioError(f"{err}; statuses {lc.fakes.statuses()}, audits {lc.fakes.audits()}") from None
            assert lc.relay.started is not None and lc.relay.started.result_run_id is not None
            workflow_id, first_run = lc.relay.workflow_id, lc.relay.started.result_run_id
    histories = await _runs(env, workflow_id, first_run)
    check(len(histories) == scenario.runs, f"{len(histories)} runs, expected {scenario.runs}")
    last = histories[-1].events[-1].event_type
    check(last == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, f"the last run ended {EventType.Name(last)}")
    return histories


async def _runs(env: WorkflowEnvironment, workflow_id: str, first_run: str) -> list[WorkflowHistory]:
    """Every run of the workflow, following continue-as-new from the first."""
    histories = []
    run_id: str | None = first_run
    while run_id:
        history = await env.client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW else None)
    return histories


def fixtures(scenario: Scenario) -> list[Path]:
    """The scenario's fixture files on disk."""
    return sorted([*HISTORIES.glob(f"{scenario.stem}.json"), *HISTORIES.glob(f"{scenario.stem}.[0-9]*.json")])


def write(scenario: Scenario, histories: list[WorkflowHistory]) -> list[Path]:
    for stale in fixtures(scenario):
        stale.unlink()
    if len(histories) == 1:
        paths = [HISTORIES / f"{scenario.stem}.json"]
    else:
        paths = [HISTORIES / f"{scenario.stem}.{n}.json" for n in range(1, len(histories) + 1)]
    for path, history in zip(paths, histories, strict=True):
        path.write_text(history.to_json() + "\n")
    return paths


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.histories.record",
                                     description="Record the replay fixtures in tests/histories/.")
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"default: all of {', '.join(s.name for s in SCENARIOS)}")
    parser.add_argument("--overwrite", action="store_true",
                        help="re-record scenarios that have fixtures already (their old histories go untested)")
    args = parser.parse_args(argv)
    unknown = set(args.scenarios) - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    # The fakes' scripted activity failures are expected; their tracebacks would bury the summary.
    logging.getLogger("temporalio.activity").setLevel(logging.CRITICAL)
    failed = 0
    for scenario in [s for s in SCENARIOS if not args.scenarios or s.name in args.scenarios]:
        if fixtures(scenario) and not args.overwrite:
            print(f"{scenario.name}: kept (recorded already; --overwrite re-records it)")
            continue
        # A fresh server per scenario: a hung activity or a held time-skipping lock cannot leak into the next.
        env = await start_env()
        try:
            histories = await record(env, scenario)
        except (ScenarioError, TimeoutError) as err:
            print(f"{scenario.name}: NOT RECORDED: {err or type(err).__name__}", file=sys.stderr)
            failed += 1
            continue
        finally:
            await env.shutdown()
        print(f"{scenario.name}: wrote {', '.join(p.name for p in write(scenario, histories))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
