"""A workflow's steps: the SDKs' step rows and upstream's ``Step``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from api.conductor.common import EpochMs, SdkReply


class SdkStep(SdkReply):
    function_id: int
    function_name: str
    output: str | None = None
    error: str | None = None
    child_workflow_id: str | None = None
    started_at_epoch_ms: EpochMs = None
    completed_at_epoch_ms: EpochMs = None


class ListStepsReply(SdkReply):
    output: list[SdkStep] | None = None


class Step(BaseModel):
    """Upstream ``Step``."""

    stepId: int
    stepName: str
    output: str | None
    error: str | None
    childWorkflowId: str | None
    startedAt: datetime | None
    completedAt: datetime | None


def step_of(s: SdkStep) -> Step:
    return Step(stepId=s.function_id, stepName=s.function_name, output=s.output, error=s.error,
                childWorkflowId=s.child_workflow_id, startedAt=s.started_at_epoch_ms,
                completedAt=s.completed_at_epoch_ms)
