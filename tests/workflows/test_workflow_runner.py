"""The worker's workflow runner: the sandbox, with the SDK's per-payload serialization-context questions answered
outside it (``worker.ContextlessSandboxRunner``), and only where no context could change a payload. The lifecycle's
workflow tests and the history replays run under it too (``workflow_runner``)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec, WorkflowSerializationContext
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker, WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

with workflow.unsafe.imports_passed_through():  # the sandbox re-imports this module for _Echo
    from core.temporal import RelayPayloadConverter, data_converter
    from worker import ContextlessSandboxRunner, workflow_runner


class _Identity(PayloadCodec):
    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


def test_the_payload_converters_the_sdk_builds_share_one_set_of_encoding_converters() -> None:
    """The SDK builds a payload converter two or three times per workflow task: each shares the same encoding
    converters (building the pydantic one was 7 % of the worker's CPU), and what one writes another reads."""
    first, second = RelayPayloadConverter(), dataclasses.replace(data_converter).payload_converter
    assert [type(c) for c in first.converters.values()][-1].__name__ == "_SharedAdapterJSONConverter"
    assert all(a is b for a, b in zip(first.converters.values(), RelayPayloadConverter().converters.values(),
                                      strict=True))
    assert second.from_payloads(first.to_payloads([timedelta(seconds=3)]), [timedelta]) == [timedelta(seconds=3)]


def test_contextless_only_without_a_codec() -> None:
    assert type(workflow_runner(data_converter)) is ContextlessSandboxRunner
    coded = dataclasses.replace(data_converter, payload_codec=_Identity())
    assert type(workflow_runner(coded)) is SandboxedWorkflowRunner


@workflow.defn(sandboxed=True)
class _Echo:
    @workflow.run
    async def run(self, text: str) -> str:
        await workflow.sleep(timedelta(seconds=1))
        return f"{text}:{workflow.info().workflow_id}"


class _Kept(ContextlessSandboxRunner):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.instances: list[WorkflowInstance] = []

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        instance = super().create_instance(det)
        self.instances.append(instance)
        return instance


async def test_a_workflow_runs_in_its_sandbox_and_answers_its_own_context(
        time_skipping_env: WorkflowEnvironment) -> None:
    client, queue, workflow_id = time_skipping_env.client, f"runner-{uuid.uuid4()}", f"echo-{uuid.uuid4()}"
    runner = _Kept(restrictions=workflow_runner(data_converter).restrictions)
    async with Worker(client, task_queue=queue, workflows=[_Echo], workflow_runner=runner):
        assert await client.execute_workflow(_Echo.run, "hi", id=workflow_id, task_queue=queue) == f"hi:{workflow_id}"
    ours = [i for i in runner.instances if i.get_info().workflow_id == workflow_id]
    assert ours  # one per run it built (the worker may evict it from its cache and rebuild it)
    for instance in ours:
        assert instance.get_serialization_context(None) == WorkflowSerializationContext(
            namespace=client.namespace, workflow_id=workflow_id)
