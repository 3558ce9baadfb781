"""The contracts decode inside the workflow sandbox, the SDK's stock one as well as the worker's, whatever the process
imported first (``workflows.contracts``' docstring): each case is a fresh interpreter that imports its modules first,
then runs a workflow taking and returning contracts that carry ``core.types``' dataclasses, and an activity's reply.

A contract whose annotations are names had pydantic look its module up in the sandbox's module table, where the
stock sandbox has no ``core.types``: its payloads decoded only if this process had already built their decoder
outside (``core.temporal`` shares them), so the answer depended on which test ran first."""

import asyncio
import dataclasses
import importlib
import pkgutil
import sys
import traceback
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():  # the sandbox re-imports this module for _ContractEcho
    import pytest
    from temporalio.api.failure.v1 import Failure
    from temporalio.client import Client
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Worker
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    import workflows.contracts
    from core.temporal import _type_adapter, data_converter, exit_now
    from workflows.contracts.common import Activity, ConnectedSignal, ExecutorInfo, ExecutorStatus
    from workflows.contracts.gate import AdmitRecoveryInput, AdmitRecoveryReply
    from workflows.contracts.lifecycle import LifecycleInput, LifecycleState
    from workflows.contracts.orphans import OrphanInfo

ROOT = Path(__file__).parents[2]  # the repository, where the child imports from
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
STATE = LifecycleState(
    status=ExecutorStatus.DISCONNECTED, grace_deadline=T0 + timedelta(seconds=30), grace=timedelta(seconds=30),
    connection=ConnectedSignal("c1", "relay-gateway-1", ExecutorInfo("e1", "v1", executor_metadata={"k": [1]}), "s1",
                               at=T0))
INPUT = LifecycleInput("org", "app", "e1", state=STATE,
                       orphan=OrphanInfo("v1", pending=3, oldest_created_at=T0, other_versions=["v0"]))
REPLY = AdmitRecoveryReply(go=False, until=T0 + timedelta(minutes=1), reason="paced", storm={"down": 3})
# What the workflow answers: its input, with what the activity replied.
OUTPUT = dataclasses.replace(INPUT, state=dataclasses.replace(STATE, gate_ticket="paced", blocked_since=REPLY.until))
# The SDK's deadlock detector's message (a workflow task not done within 2 s).
DEADLOCK = "[TMPRL1101]"
# Which modules the process imports before this one: none, Relay's worker (everything), the relay command as it
# starts (no Temporal SDK), the DBOS SDK.
FIRST = {"nothing": (), "worker": ("worker",), "cli": ("cli.main",), "dbos": ("dbos",)}


@activity.defn(name=Activity.ADMIT_RECOVERY)
async def _admit(input: AdmitRecoveryInput) -> AdmitRecoveryReply:
    return REPLY


@workflow.defn(sandboxed=True)
class _ContractEcho:
    @workflow.run
    async def run(self, input: LifecycleInput) -> LifecycleInput:
        state = input.state
        if not (state and state.connection and type(state.connection.info) is ExecutorInfo
                and type(input.orphan) is OrphanInfo):
            raise ApplicationError(f"decoded as {input!r}", non_retryable=True)
        reply = await workflow.execute_activity(
            Activity.ADMIT_RECOVERY, AdmitRecoveryInput("org", "app", "e1", "t1", workflow.now()),
            result_type=AdmitRecoveryReply, start_to_close_timeout=timedelta(seconds=10))
        return dataclasses.replace(input, state=dataclasses.replace(state, gate_ticket=reply.reason,
                                                                      blocked_since=reply.until))


def _innermost(failure: Failure) -> str:
    while failure.HasField("cause"):
        failure = failure.cause
    return failure.message


async def _run_once(client: Client, runner: SandboxedWorkflowRunner) -> None:
    """One run of ``_ContractEcho`` under ``runner``. A payload that does not decode fails the workflow task on
    every attempt: the first such failure ends it at once, with pydantic's message. Only the SDK's deadlock
    detector is waited out (a first activation slower than 2 s on a loaded machine; the task is retried)."""
    queue = f"contracts-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=[_ContractEcho], activities=[_admit],
                      workflow_runner=runner):
        handle = await client.start_workflow(_ContractEcho.run, INPUT, id=queue, task_queue=queue)
        async with asyncio.timeout(60):
            while True:
                events = (await handle.fetch_history()).events
                failed = [_innermost(e.workflow_task_failed_event_attributes.failure) for e in events
                          if e.HasField("workflow_task_failed_event_attributes")]
                if any(not message.startswith(DEADLOCK) for message in failed):
                    raise SystemExit(f"{type(runner).__name__}: workflow tasks failed: {failed}")
                if any(e.HasField("workflow_execution_completed_event_attributes")
                       or e.HasField("workflow_execution_failed_event_attributes") for e in events):
                    break
                await asyncio.sleep(0.1)
        assert await handle.result() == OUTPUT


async def _run_both(target: str, namespace: str) -> None:
    """In the fresh interpreter: the SDK's stock sandbox first, then the worker's; each starts with no decoder
    built, as the process shares them (``core.temporal``), so neither runs on what the other built."""
    client = await Client.connect(target, namespace=namespace, data_converter=data_converter)
    await _run_once(client, SandboxedWorkflowRunner())
    _type_adapter.cache_clear()
    from worker import workflow_runner
    await _run_once(client, workflow_runner(data_converter))


def run_both(target: str, namespace: str) -> None:
    """The child's work; it ends without the interpreter's finalization, which a Temporal client can abort."""
    try:
        asyncio.run(_run_both(target, namespace))
    except BaseException:
        traceback.print_exc()
        exit_now(1)
    exit_now(0)


# The child: import the case's modules first, then this one, and run it.
_CHILD = """import importlib, sys
for name in sys.argv[3:]:
    importlib.import_module(name)
from tests.workflows.test_contract_decoding import run_both
run_both(*sys.argv[1:3])
"""


@pytest.mark.parametrize("first", FIRST)
async def test_contracts_decode_in_the_sandbox_whatever_was_imported_first(
        time_skipping_env: WorkflowEnvironment, first: str) -> None:
    client = time_skipping_env.client
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, client.service_client.config.target_host, client.namespace, *FIRST[first],
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(child.communicate(), timeout=120)
    finally:
        if child.returncode is None:
            child.kill()
    assert child.returncode == 0, (out + err).decode(errors="replace")[-4000:]


def test_no_contract_is_annotated_by_name() -> None:
    """Every dataclass the contracts define or carry has its annotations as types: a name (``from __future__ import
    annotations``, a quoted forward reference) is resolved later, by looking its module up, which the sandbox may
    not answer."""
    seen: set[type] = set()
    for module in pkgutil.iter_modules(workflows.contracts.__path__, "workflows.contracts."):
        for value in vars(importlib.import_module(module.name)).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__.startswith(
                    ("workflows.", "core.")):
                seen.add(value)
    by_name = [f"{cls.__module__}.{cls.__qualname__}.{field.name}: {field.type!r}"
               for cls in seen for field in dataclasses.fields(cls)
               if isinstance(field.type, str) or "ForwardRef" in repr(field.type)]
    assert len(seen) > 60  # every contract module's dataclasses and core.types' were found
    assert sorted(by_name) == []
