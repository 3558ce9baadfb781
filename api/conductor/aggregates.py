"""Workflow and step aggregates: the SDKs' groups, upstream's ``WorkflowAggregate`` and ``StepAggregate``, and
the bodies asking for them (a group or a time bucket needed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.json_schema import SkipJsonSchema

from api.conductor.common import BucketMs, EpochMs, OptNames, OptTime, SdkReply, sdk_fields
from api.conductor.workflows import LIST_NAMES, WorkflowFilter
from api.schemas import InputBody, extended

# -- the SDKs' replies ----------------------------------------------------------------------------------------------


class SdkWorkflowAggregate(SdkReply):
    group: dict[str, Any]
    count: int | None = None
    min_created_at: EpochMs = None
    max_queue_wait_ms: int | None = None
    max_total_latency_ms: int | None = None


class SdkStepAggregate(SdkReply):
    group: dict[str, Any]
    count: int | None = None
    max_duration_ms: int | None = None


class WorkflowAggregatesReply(SdkReply):
    output: list[SdkWorkflowAggregate] = []


class StepAggregatesReply(SdkReply):
    output: list[SdkStepAggregate] = []


# -- upstream response schemas --------------------------------------------------------------------------------------


# Properties upstream declares as plain integers or date-times but leaves out when not selected.
OptionalInt = int | SkipJsonSchema[None]
OptionalTime = datetime | SkipJsonSchema[None]


class WorkflowAggregate(BaseModel):
    """Upstream ``WorkflowAggregate``: ``group`` as the executor names it (``status``, ``name``, ``queue_name``,
    ``executor_id``, ``application_version``, ``application_name``, ``time_bucket``); unselected values left out."""

    group: dict[str, Any]
    count: OptionalInt = None
    maxQueueWaitMs: OptionalInt = None
    maxTotalLatencyMs: OptionalInt = None
    minCreatedAt: OptionalTime = None


class StepAggregate(BaseModel):
    """Upstream ``StepAggregate``."""

    group: dict[str, Any]
    count: OptionalInt = None
    maxDurationMs: OptionalInt = None


# -- SDK replies -> upstream ----------------------------------------------------------------------------------------


def workflow_aggregate_of(a: SdkWorkflowAggregate) -> WorkflowAggregate:
    return WorkflowAggregate(group=a.group, count=a.count, maxQueueWaitMs=a.max_queue_wait_ms,
                             maxTotalLatencyMs=a.max_total_latency_ms, minCreatedAt=a.min_created_at)


def step_aggregate_of(a: SdkStepAggregate) -> StepAggregate:
    return StepAggregate(group=a.group, count=a.count, maxDurationMs=a.max_duration_ms)


# -- upstream request bodies ----------------------------------------------------------------------------------------


_AGGREGATE_NAMES = {**LIST_NAMES, "appVersion": "app_version", "user": "user", "workflowIds": "workflow_ids",
                    "workflowName": "name"}


_WORKFLOW_GROUPS = {
    "groupByStatus": "group_by_status", "groupByWorkflowName": "group_by_name",
    "groupByQueueName": "group_by_queue_name", "groupByExecutorId": "group_by_executor_id",
    "groupByAppVersion": "group_by_application_version", "groupByApplicationName": "group_by_application_name",
    "selectCount": "select_count", "selectMinCreatedAt": "select_min_created_at",
    "selectMaxQueueWaitMs": "select_max_queue_wait_ms", "selectMaxTotalLatencyMs": "select_max_total_latency_ms",
}
# Each body's group flags, named once for its schema (``_one_of_given``) and its validator (``_require_grouping``).
_WORKFLOW_GROUPS_ONLY = sorted(f for f in _WORKFLOW_GROUPS if f.startswith("groupBy"))
_STEP_GROUPS_ONLY = ["groupByFunctionName", "groupByStatus"]


def _one_of_given(flags: list[str], others: list[str]) -> dict[str, Any]:
    """JSON Schema for "at least one of these flags is true or one of these fields is given", so that the spec
    states what the model validators below check."""
    branches = [{"required": [f], "properties": {f: {"enum": [True]}}} for f in flags]
    return {"anyOf": branches + [{"required": [f]} for f in others]}


class WorkflowAggregatesBody(WorkflowFilter):
    """Upstream ``WorkflowAggregatesBody``. At least one ``groupBy*`` or ``timeBucketSizeMs`` is needed (the SDKs
    refuse an aggregate without a group)."""

    model_config = ConfigDict(json_schema_extra={
        **_one_of_given(_WORKFLOW_GROUPS_ONLY, ["timeBucketSizeMs"]),
        **extended("at least one groupBy* or timeBucketSizeMs")})

    groupByAppVersion: bool = False
    groupByApplicationName: bool = False
    groupByExecutorId: bool = False
    groupByQueueName: bool = False
    groupByStatus: bool = False
    groupByWorkflowName: bool = False
    selectCount: bool = False
    selectMaxQueueWaitMs: bool = False
    selectMaxTotalLatencyMs: bool = False
    selectMinCreatedAt: bool = False
    timeBucketSizeMs: BucketMs = None

    @model_validator(mode="after")
    def _grouped(self) -> WorkflowAggregatesBody:
        _require_grouping(self, _WORKFLOW_GROUPS_ONLY)
        return self


def workflow_aggregates_body(body: WorkflowAggregatesBody) -> dict[str, Any]:
    out = {**sdk_fields(body, _AGGREGATE_NAMES), **{sdk: getattr(body, rest) for rest, sdk in _WORKFLOW_GROUPS.items()}}
    if body.timeBucketSizeMs is not None:
        out["time_bucket_size_ms"] = body.timeBucketSizeMs
    return out


class StepAggregatesBody(InputBody):
    """Upstream ``StepAggregatesBody``; as for workflows, a group or a time bucket is needed."""

    model_config = ConfigDict(json_schema_extra={
        **_one_of_given(_STEP_GROUPS_ONLY, ["timeBucketSizeMs"]),
        **extended("at least one groupBy* or timeBucketSizeMs")})

    completedAfter: OptTime = None
    completedBefore: OptTime = None
    groupByFunctionName: bool = False
    groupByStatus: bool = False
    selectCount: bool = False
    selectMaxDurationMs: bool = False
    status: OptNames = None
    stepName: OptNames = None
    timeBucketSizeMs: BucketMs = None
    workflowIdPrefix: OptNames = None

    @model_validator(mode="after")
    def _grouped(self) -> StepAggregatesBody:
        _require_grouping(self, _STEP_GROUPS_ONLY)
        return self


def _require_grouping(body: WorkflowAggregatesBody | StepAggregatesBody, groups: list[str]) -> None:
    """Either aggregates body, checked one way: at least one of its ``groups`` set, or a time bucket."""
    if not any(getattr(body, field) for field in groups) and body.timeBucketSizeMs is None:
        raise ValueError("group by at least one field (groupBy*) or set timeBucketSizeMs")


def step_aggregates_body(body: StepAggregatesBody) -> dict[str, Any]:
    out = sdk_fields(body, {"completedAfter": "completed_after", "completedBefore": "completed_before",
                         "status": "status", "stepName": "function_name", "workflowIdPrefix": "workflow_id_prefix",
                         "timeBucketSizeMs": "time_bucket_size_ms"})
    return {**out, "group_by_function_name": body.groupByFunctionName, "group_by_status": body.groupByStatus,
            "select_count": body.selectCount, "select_max_duration_ms": body.selectMaxDurationMs}
