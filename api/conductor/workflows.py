"""Workflows: the SDKs' ``WorkflowsOutput`` rows, a workflow's events, notifications and streams, and the bodies
of listWorkflows, searchWorkflows, cancel, resume, fork and import."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from api.conductor.common import (
    INT32_MAX,
    Count,
    EpochMs,
    IntText,
    Names,
    OptAttributes,
    OptBool,
    OptStr,
    OptTime,
    RequiredEpochMs,
    SdkReply,
    WorkflowIdOutput,
    sdk_fields,
)
from api.schemas import JSON_INT, InputBody, extended
from core import nesting

UNKNOWN_STATUS = "UNKNOWN"  # an SDK row without a status (never seen; ``status`` is required upstream)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- the SDKs' replies ----------------------------------------------------------------------------------------------


def _to(name: str, default: Any = None) -> Any:
    """An SDK field, and the upstream ``Workflow`` field it is written to."""
    return Field(default, serialization_alias=name)


class SdkWorkflow(SdkReply):
    """``WorkflowsOutput``: every field but the id and ``WasForkedFrom`` is optional text. Each field names the
    upstream ``Workflow`` field it maps to, so a page is validated once and serialized straight to upstream's
    shape (``dump_workflows``), with no model built per row in between."""

    model_config = ConfigDict(serialize_by_alias=True)

    WorkflowUUID: str = _to("workflowId")
    Status: str | None = _to("status")
    WorkflowName: str | None = _to("workflowName")
    WorkflowClassName: str | None = _to("workflowClass")
    WorkflowConfigName: str | None = _to("workflowConfig")
    AuthenticatedUser: str | None = _to("user")
    AssumedRole: str | None = _to("assumedRole")
    AuthenticatedRoles: str | None = _to("roles")
    Input: str | None = _to("input")
    Output: str | None = _to("output")
    Error: str | None = _to("error")
    CreatedAt: EpochMs = _to("createdAt")
    UpdatedAt: EpochMs = _to("updatedAt")
    QueueName: str | None = _to("queueName")
    ApplicationVersion: str | None = _to("appVersion")
    ExecutorID: str | None = _to("executorId")
    WorkflowTimeoutMS: IntText = _to("timeoutMs")
    WorkflowDeadlineEpochMS: EpochMs = _to("deadline")
    DeduplicationID: str | None = _to("deduplicationId")
    Priority: IntText = _to("priority")
    QueuePartitionKey: str | None = _to("queuePartitionKey")
    ForkedFrom: str | None = _to("forkedFrom")
    WasForkedFrom: bool = _to("wasForkedFrom", False)
    ParentWorkflowID: str | None = _to("parentWorkflowId")
    DequeuedAt: EpochMs = _to("dequeuedAt")
    DelayUntilEpochMS: EpochMs = _to("delayUntil")
    CompletedAt: EpochMs = _to("completedAt")
    Attributes: str | None = _to("attributes")
    ScheduleName: str | None = _to("scheduleName")
    ApplicationName: str | None = _to("applicationName")

    @model_validator(mode="after")
    def _upstream_required(self) -> SdkWorkflow:
        """Upstream requires a status, both instants and a priority: an SDK row may leave them out. (Set only when
        missing: a pydantic attribute write costs a microsecond, and a page has up to a thousand rows.)"""
        if self.Status is None:
            self.Status = UNKNOWN_STATUS
        if self.CreatedAt is None:
            self.CreatedAt = self.UpdatedAt or EPOCH
        if self.UpdatedAt is None:
            self.UpdatedAt = self.CreatedAt
        if self.Priority is None:
            self.Priority = 0
        return self


class SdkEvent(SdkReply):
    key: str
    value: str


class SdkNotification(SdkReply):
    topic: str | None = None
    message: str
    created_at_epoch_ms: RequiredEpochMs
    consumed: bool


class SdkStream(SdkReply):
    key: str
    values: list[str]


# One model per reply that carries data: what the routes read.
class ListWorkflowsReply(SdkReply):
    output: list[SdkWorkflow] = []


class GetWorkflowReply(SdkReply):
    output: SdkWorkflow | None = None


class EventsReply(SdkReply):
    events: list[SdkEvent] | None = None


class NotificationsReply(SdkReply):
    notifications: list[SdkNotification] | None = None


class StreamsReply(SdkReply):
    streams: list[SdkStream] | None = None


# A reply's data is required where only an error leaves it out (error replies are refused before they are read).
class ForkReply(SdkReply):
    new_workflow_id: str


class ExportReply(SdkReply):
    serialized_workflow: str | None = None


# -- upstream response schemas --------------------------------------------------------------------------------------


class Workflow(BaseModel):
    """Upstream ``Workflow``."""

    workflowId: str
    status: str
    workflowName: str | None
    workflowClass: str | None
    workflowConfig: str | None
    user: str | None
    assumedRole: str | None
    roles: str | None
    input: str | None
    output: str | None
    error: str | None
    createdAt: datetime
    updatedAt: datetime
    queueName: str | None
    appVersion: str | None
    executorId: str | None
    timeoutMs: int | None
    deadline: datetime | None
    deduplicationId: str | None
    priority: int
    queuePartitionKey: str | None
    forkedFrom: str | None
    wasForkedFrom: bool
    parentWorkflowId: str | None
    dequeuedAt: datetime | None
    delayUntil: datetime | None
    completedAt: datetime | None
    attributes: str | None
    scheduleName: str | None
    applicationName: str | None


class Event(BaseModel):
    key: str
    value: str


class Notification(BaseModel):
    topic: str | None
    message: str
    createdAt: datetime
    consumed: bool


class StreamEntry(BaseModel):
    key: str
    values: list[str]


class ForkWorkflowOutputBody(WorkflowIdOutput):
    """Upstream ``ForkWorkflowOutputBody``."""


class ExportWorkflowOutputBody(BaseModel):
    """Upstream ``ExportWorkflowOutputBody``: the executor's export, as it sent it (base64 of gzip, from Python
    executors of pickle)."""

    serializedWorkflow: str


# -- SDK replies -> upstream ----------------------------------------------------------------------------------------


_WORKFLOW_PAGE = TypeAdapter(list[SdkWorkflow])


def dump_workflows(rows: list[SdkWorkflow]) -> bytes:
    """A page of workflows as upstream ``Workflow`` JSON objects."""
    return _WORKFLOW_PAGE.dump_json(rows)


def dump_workflow(row: SdkWorkflow) -> bytes:
    return row.model_dump_json().encode()


def notification_of(n: SdkNotification) -> Notification:
    return Notification(topic=n.topic, message=n.message, createdAt=n.created_at_epoch_ms, consumed=n.consumed)


# -- upstream request bodies ----------------------------------------------------------------------------------------


DEFAULT_PAGE = 100  # listWorkflows and searchWorkflows without a limit: upstream states no default
MAX_PAGE = 1000
PAGE_EXTENDED = extended(f"1-{MAX_PAGE}, default {DEFAULT_PAGE}: upstream states no bound and no default")
PageLimit = Annotated[int, Field(ge=1, le=MAX_PAGE, json_schema_extra=PAGE_EXTENDED), JSON_INT]


class WorkflowFilter(InputBody):
    """The filters ``WorkflowSearchBody`` and ``WorkflowAggregatesBody`` share."""

    appVersion: Names = None
    attributes: OptAttributes = Field(default=None, json_schema_extra=extended(
        f"at most {nesting.MAX_JSON_DEPTH} levels deep"))
    completedAfter: OptTime = None
    completedBefore: OptTime = None
    dequeuedAfter: OptTime = None
    dequeuedBefore: OptTime = None
    endTime: OptTime = None
    executorId: Names = None
    forkedFrom: Names = None
    hasParent: OptBool = None
    parentWorkflowId: Names = None
    queueName: Names = None
    scheduleName: Names = None
    startTime: OptTime = None
    status: Names = None
    user: Names = None
    wasForkedFrom: OptBool = None
    workflowIdPrefix: Names = None
    workflowIds: Names = None
    workflowName: Names = None


# Upstream filter name -> the SDK's ``list_workflows`` body name (``get_workflow_aggregates``' differ: aggregates.py).
LIST_NAMES = {
    "appVersion": "application_version", "attributes": "attributes", "completedAfter": "completed_after",
    "completedBefore": "completed_before", "dequeuedAfter": "dequeued_after", "dequeuedBefore": "dequeued_before",
    "endTime": "end_time", "executorId": "executor_id", "forkedFrom": "forked_from", "hasParent": "has_parent",
    "parentWorkflowId": "parent_workflow_id", "queueName": "queue_name", "scheduleName": "schedule_name",
    "startTime": "start_time", "status": "status", "user": "authenticated_user", "wasForkedFrom": "was_forked_from",
    "workflowIdPrefix": "workflow_id_prefix", "workflowIds": "workflow_uuids", "workflowName": "workflow_name",
}


class WorkflowSearchBody(WorkflowFilter):
    """Upstream ``WorkflowSearchBody``. Relay extension: ``limit`` at most 1000, 100 when not given; inputs and
    outputs are loaded only when asked (``loadInput``, ``loadOutput``)."""

    limit: PageLimit = DEFAULT_PAGE
    offset: Count = 0
    sortDesc: bool = False
    loadInput: bool = False
    loadOutput: bool = False
    queuesOnly: bool = False


def list_body_of_search(body: WorkflowSearchBody) -> dict[str, Any]:
    """``list_workflows``'s body for searchWorkflows (``queuesOnly`` is the SDK's ``queues_only``)."""
    return {**sdk_fields(body, LIST_NAMES), "limit": body.limit, "offset": body.offset, "sort_desc": body.sortDesc,
            "load_input": body.loadInput, "load_output": body.loadOutput, "queues_only": body.queuesOnly}


def list_body_of_query(*, status: str | None, workflow_name: str | None, limit: int, offset: int,
                       sort_desc: bool, load_input: bool, load_output: bool) -> dict[str, Any]:
    """``list_workflows``'s body for listWorkflows' query parameters."""
    body: dict[str, Any] = {"limit": limit, "offset": offset, "sort_desc": sort_desc, "load_input": load_input,
                            "load_output": load_output}
    if status is not None:
        body["status"] = status
    if workflow_name is not None:
        body["workflow_name"] = workflow_name
    return body


class CancelWorkflowInputBody(InputBody):
    cancelChildren: bool = False


class ResumeWorkflowInputBody(InputBody):
    queueName: OptStr = None


StartStep = Annotated[int, Field(ge=0, le=INT32_MAX), JSON_INT]


class ForkWorkflowInputBody(InputBody):
    """Upstream ``ForkWorkflowInputBody``: without ``startStep`` the fork reruns every step (step ids start at 1,
    and steps before ``startStep`` are copied)."""

    appVersion: OptStr = None
    newWorkflowId: OptStr = None
    queueName: OptStr = None
    queuePartitionKey: OptStr = None
    startStep: StartStep = 1


def fork_body(workflow_id: str, body: ForkWorkflowInputBody) -> dict[str, Any]:
    return {"workflow_id": workflow_id, "start_step": body.startStep, "application_version": body.appVersion,
            "new_workflow_id": body.newWorkflowId, "queue_name": body.queueName,
            "queue_partition_key": body.queuePartitionKey}


# Every SDK's export is base64 (standard alphabet, padded) of gzip data, whose first three bytes are always 1f 8b 08
# (the magic and deflate, the one method gzip defines): "H4sI" in base64. Said in the schema as a pattern, so a client
# (and the fuzzer) knows it; checked by the validator below with a message that says which part is wrong.
BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
GZIP_BASE64_PREFIX = "H4sI"
EXPORT_PATTERN = f"^{GZIP_BASE64_PREFIX}{BASE64.pattern}$"


class ImportWorkflowInputBody(InputBody):
    """Upstream ``ImportWorkflowInputBody``: an ``exportWorkflow`` payload, which the executor deserializes."""

    serializedWorkflow: Annotated[str, Field(min_length=1, json_schema_extra={
        **extended("must not be empty; base64 of gzip data, as every SDK's exportWorkflow writes it"),
        "pattern": EXPORT_PATTERN})]

    @field_validator("serializedWorkflow")
    @classmethod
    def _an_export(cls, value: str) -> str:
        """Checked here, not by the executor: anything but an export came back from the executor as its decoding
        error (a 502 blaming it). Only the text is matched; nothing is decoded or inflated."""
        if not BASE64.fullmatch(value):
            raise ValueError("serializedWorkflow is not base64: pass exportWorkflow's serializedWorkflow as it came")
        if not value.startswith(GZIP_BASE64_PREFIX):
            raise ValueError("serializedWorkflow is not gzip data: pass exportWorkflow's serializedWorkflow as it "
                             "came")
        return value


def existence_body(workflow_ids: list[str]) -> dict[str, Any]:
    """``list_workflows``'s body asking which of ``workflow_ids`` exist: ids only (no inputs or outputs)."""
    return {"workflow_uuids": workflow_ids, "limit": len(workflow_ids), "offset": 0, "sort_desc": False,
            "load_input": False, "load_output": False}
