"""Bulk actions: upstream's bulk bodies (by ids; forking from failure), and Relay's extension, bulk actions by
filter, with their per-workflow results."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from api.conductor.common import Names, NotNull, OptStr, OptTime, SdkReply, WorkflowIdsOutput, sdk_fields
from api.conductor.workflows import StartStep
from api.schemas import EXTENSION, InputBody

# -- upstream bulk actions ------------------------------------------------------------------------------------------


class ForkFromFailureReply(SdkReply):
    forked_workflow_ids: list[str]


class BulkForkFromFailureOutputBody(WorkflowIdsOutput):
    """Upstream ``BulkForkFromFailureOutputBody``: the new workflows' ids."""


class BulkInputBody(InputBody):
    workflowIds: list[str]


class BulkCancelInputBody(BulkInputBody):
    cancelChildren: bool = False


class BulkDeleteInputBody(BulkInputBody):
    deleteChildren: bool = False


class BulkResumeInputBody(BulkInputBody):
    queueName: OptStr = None


class ForkOptions(InputBody):
    """Where each fork starts (at most one of the four, as upstream says; the executor refuses more, 502), and
    where it runs."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)  # a schema of its own only in bulk-fork-by-filter

    fromLastFailure: bool = False
    fromLastStep: bool = False
    fromStep: Annotated[StartStep | SkipJsonSchema[None], NotNull] = None
    fromStepName: OptStr = None
    appVersion: OptStr = None
    queueName: OptStr = None
    queuePartitionKey: OptStr = None


class BulkForkFromFailureBody(ForkOptions):
    """Upstream ``BulkForkFromFailureBody``."""

    model_config = ConfigDict(json_schema_extra={})  # upstream's: not an extension

    workflowIds: list[str]


def fork_from_failure_body(workflow_ids: list[str], body: ForkOptions) -> dict[str, Any]:
    return {"workflow_ids": workflow_ids, "application_version": body.appVersion, "queue_name": body.queueName,
            "queue_partition_key": body.queuePartitionKey, "from_last_failure": body.fromLastFailure,
            "from_last_step": body.fromLastStep, "from_step": body.fromStep, "from_step_name": body.fromStepName}


# -- Relay extension: bulk actions by filter ------------------------------------------------------------------------


FIRST_IDS = 20  # a dry run shows this many of the matching ids


# The spec states the validator's rule: some list given and not empty, or a time bound.
_FILTER_SCHEMA: dict[str, Any] = {**EXTENSION, "anyOf": [
    {"required": [f], "properties": {f: {"type": "array", "minItems": 1}}}
    for f in ("status", "workflowName", "queueName", "appVersion")] + [
    {"required": [f]} for f in ("startTime", "endTime")]}


class BulkFilter(InputBody):
    """Which workflows a bulk action by filter applies to: every criterion given must hold, and at least one must
    be given (an empty filter would match every workflow of the app)."""

    model_config = ConfigDict(json_schema_extra=_FILTER_SCHEMA)

    status: Names = None
    workflowName: Names = None
    queueName: Names = None
    appVersion: Names = None
    startTime: OptTime = None
    endTime: OptTime = None
    dryRun: bool = Field(default=False, description="count the matching workflows and show the first ids; "
                                                    "change nothing")

    @model_validator(mode="after")
    def _narrowed(self) -> BulkFilter:
        if all(getattr(self, f) in (None, []) for f in _FILTER_NAMES):
            raise ValueError(f"give at least one of {', '.join(_FILTER_NAMES)}")
        return self


_FILTER_NAMES = {"status": "status", "workflowName": "workflow_name", "queueName": "queue_name",
                 "appVersion": "application_version", "startTime": "start_time", "endTime": "end_time"}


class BulkCancelByFilterBody(BulkFilter):
    cancelChildren: bool = False


class BulkResumeByFilterBody(BulkFilter):
    resumeQueueName: OptStr = Field(default=None, description="the queue to resume the workflows on "
                                                               "(resumeWorkflow's queueName)")


class BulkForkByFilterBody(BulkFilter):
    fork: ForkOptions = Field(default_factory=ForkOptions, description="bulkForkWorkflowsFromFailure's options")


def filter_list_body(body: BulkFilter, *, limit: int) -> dict[str, Any]:
    """``list_workflows``'s body for a filter: ids only (no inputs or outputs), oldest first."""
    return {**sdk_fields(body, _FILTER_NAMES), "limit": limit, "offset": 0, "sort_desc": False, "load_input": False,
            "load_output": False}


class BulkResult(BaseModel):
    model_config = ConfigDict(json_schema_extra=EXTENSION)

    workflowId: str
    outcome: Literal["success", "failure"]
    error: str | None = None
    forkedWorkflowId: str | None = Field(default=None, description="bulk-fork: the new workflow's id")


class BulkByFilterOutputBody(BaseModel):
    """A dry run's ``count`` and ``firstIds``; otherwise also ``results``, one per matching workflow."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)

    dryRun: bool
    count: int
    firstIds: list[str]
    results: list[BulkResult] | None = None
