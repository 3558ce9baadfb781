"""Bulk actions: upstream's bulk bodies (by ids; forking from failure), and Relay's extension, bulk actions by
filter, with their per-workflow results."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from api.conductor.common import Names, NotNull, OptStr, OptTime, SdkReply, WorkflowIdsOutput, sdk_fields
from api.conductor.workflows import StartStep
from api.schemas import EXTENSION, InputBody, extended

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


# Where a fork starts: exactly one of these. Upstream calls them mutually exclusive, and every SDK also needs one
# (dbos 3.2.0's ``SystemDatabase.fork_from_failure`` raises ValueError for none or several; TypeScript's, Go's and
# Java's refuse them too), so Relay refuses any other count rather than send it to fail on the executor (a 502).
# A flag counts when true.
START_FLAGS = ("fromLastFailure", "fromLastStep")
START_FIELDS = ("fromStep", "fromStepName")
_ONE_START: dict[str, Any] = {"oneOf": [
    {"required": [f], "properties": {f: {"enum": [True]}}} for f in START_FLAGS] + [
    {"required": [f]} for f in START_FIELDS]}
STARTS = "fromLastFailure: true, fromLastStep: true, fromStep, fromStepName"
ONE_START = f"give exactly one of {STARTS}"


class ForkOptions(InputBody):
    """Where each fork starts (exactly one of the four), and where it runs."""

    # A schema of its own only in bulk-fork-by-filter.
    model_config = ConfigDict(json_schema_extra={**EXTENSION, **_ONE_START})

    fromLastFailure: bool = False
    fromLastStep: bool = False
    fromStep: Annotated[StartStep | SkipJsonSchema[None], NotNull] = None
    fromStepName: OptStr = None
    appVersion: OptStr = None
    queueName: OptStr = None
    queuePartitionKey: OptStr = None

    @model_validator(mode="after")
    def _one_start(self) -> Self:
        given = [f for f in START_FLAGS if getattr(self, f)] + [f for f in START_FIELDS if getattr(self, f) is not None]
        if len(given) != 1:
            said = "none was given" if not given else f"{', '.join(given[:-1])} and {given[-1]} were given"
            raise ValueError(f"{ONE_START}; {said}")
        return self


class BulkForkFromFailureBody(ForkOptions):
    """Upstream ``BulkForkFromFailureBody``."""

    # Upstream's, not an extension; it says the four are mutually exclusive, Relay also needs one of them.
    model_config = ConfigDict(json_schema_extra={**_ONE_START, **extended(f"exactly one of {STARTS} (upstream: at "
                                                                            "most one)")})

    workflowIds: list[str]


def fork_from_failure_body(workflow_ids: list[str], body: ForkOptions) -> dict[str, Any]:
    """``from_step`` and ``from_step_name`` only when given: TypeScript's SDK counts a null one as given
    (``fromStep !== undefined`` in its ``forkFromFailure``), so nulls would make every request name several starts."""
    return {"workflow_ids": workflow_ids, "application_version": body.appVersion, "queue_name": body.queueName,
            "queue_partition_key": body.queuePartitionKey, "from_last_failure": body.fromLastFailure,
            "from_last_step": body.fromLastStep,
            **sdk_fields(body, {"fromStep": "from_step", "fromStepName": "from_step_name"})}


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
    # The example is also where schemathesis' coverage phase starts (tests/api/test_fuzz.py): without one it finds no
    # valid body (an anyOf around a required object that is a oneOf), and tests the path parameters with an invalid
    # one as if it were valid.
    model_config = ConfigDict(json_schema_extra={**_FILTER_SCHEMA, "examples": [
        {"status": ["ERROR"], "fork": {"fromLastFailure": True}}]})

    fork: ForkOptions = Field(description="bulkForkWorkflowsFromFailure's options; needed even for a dry run, which "
                                          "previews the same request")


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
