"""The mapping between the DBOS SDKs' conductor messages and the upstream Conductor REST schemas.

The SDKs answer in their own shapes (``dbos/_conductor/protocol.py`` in the Python SDK): ``WorkflowsOutput`` has
PascalCase fields and carries every number and instant as a string (``CreatedAt`` is ``str(epoch_ms)``), steps
and notifications carry epoch milliseconds under snake_case names, schedules an ISO 8601 ``last_fired_at``.
Upstream's schemas are camelCase, with integers and RFC 3339 date-times. Replies are validated here (unknown
fields ignored, as from every executor reply), instants converted through ``core.units``, and mapped; request
bodies are mapped the other way. Nothing here does I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from api.schemas import _JSON_INT, EXTENSION, MAX_JSON_INT, InputBody, _rfc3339, _utc, extended
from core import nesting, units

UNKNOWN_STATUS = "UNKNOWN"  # an SDK row without a status (never seen; ``status`` is required upstream)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# -- the SDKs' replies -----------------------------------------------------------------------------------------


def _lenient_int(value: Any) -> int | None:
    """An integer the SDKs send as text (``Priority``, ``WorkflowTimeoutMS``). TypeScript writes
    ``String(undefined)`` for a priority it does not have: anything not an integer counts as absent."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _iso_or_none(value: Any) -> datetime | None:
    """``last_fired_at``: the scheduler's ``datetime.isoformat()``, naive when its clock was (taken as UTC). A
    value that does not parse is reported as unknown rather than failing the whole list."""
    return units.iso_to_utc(value)


# An instant as epoch milliseconds, integer or decimal text (``str(created_at)``): parsed by pydantic-core itself
# (``val_temporal_unit``, on every ``SdkReply``), a quarter of the cost of a Python validator per field, as a page
# holds up to a thousand workflows of six instants. The same instant as ``units.epoch_ms_text_to_datetime``; an
# RFC 3339 text with an offset is accepted too, a naive one is not.
EpochMs = AwareDatetime | None
RequiredEpochMs = AwareDatetime
IntText = Annotated[int | None, BeforeValidator(_lenient_int)]
IsoTime = Annotated[datetime | None, BeforeValidator(_iso_or_none)]


class SdkReply(BaseModel):
    """An executor's reply: unknown fields are ignored, a missing required one or a wrong type is an error."""

    model_config = ConfigDict(extra="ignore", val_temporal_unit="milliseconds")


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


class SdkStep(SdkReply):
    function_id: int
    function_name: str
    output: str | None = None
    error: str | None = None
    child_workflow_id: str | None = None
    started_at_epoch_ms: EpochMs = None
    completed_at_epoch_ms: EpochMs = None


class SdkQueue(SdkReply):
    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit_max: int | None = None
    rate_limit_period_sec: float | None = None
    priority_enabled: bool = True
    partition_queue: bool = False
    polling_interval_sec: float = 1.0
    application_name: str | None = None


class SdkSchedule(SdkReply):
    schedule_id: str
    schedule_name: str
    workflow_name: str
    workflow_class_name: str | None = None
    schedule: str
    status: str
    context: str | None = None
    last_fired_at: IsoTime = None
    automatic_backfill: bool = False
    cron_timezone: str | None = None
    application_name: str | None = None


class SdkVersion(SdkReply):
    version_id: str
    version_name: str
    version_timestamp: RequiredEpochMs
    created_at: RequiredEpochMs


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


class SdkMetric(SdkReply):
    metric_type: str
    metric_name: str
    value: int


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


# One model per reply that carries data: what the routes read.
class ListWorkflowsReply(SdkReply):
    output: list[SdkWorkflow] = []


class GetWorkflowReply(SdkReply):
    output: SdkWorkflow | None = None


class ListStepsReply(SdkReply):
    output: list[SdkStep] | None = None


class EventsReply(SdkReply):
    events: list[SdkEvent] | None = None


class NotificationsReply(SdkReply):
    notifications: list[SdkNotification] | None = None


class StreamsReply(SdkReply):
    streams: list[SdkStream] | None = None


# A reply's data is required where only an error leaves it out (error replies are refused before they are read).
class ForkReply(SdkReply):
    new_workflow_id: str


class ForkFromFailureReply(SdkReply):
    forked_workflow_ids: list[str]


class ExportReply(SdkReply):
    serialized_workflow: str | None = None


class ListQueuesReply(SdkReply):
    output: list[SdkQueue] = []


class GetQueueReply(SdkReply):
    output: SdkQueue | None = None


class ListSchedulesReply(SdkReply):
    output: list[SdkSchedule] = []


class GetScheduleReply(SdkReply):
    output: SdkSchedule | None = None


class BackfillReply(SdkReply):
    workflow_ids: list[str] = []


class TriggerReply(SdkReply):
    workflow_id: str


class ListVersionsReply(SdkReply):
    output: list[SdkVersion] = []


class MetricsReply(SdkReply):
    metrics: list[SdkMetric] = []


class WorkflowAggregatesReply(SdkReply):
    output: list[SdkWorkflowAggregate] = []


class StepAggregatesReply(SdkReply):
    output: list[SdkStepAggregate] = []


# -- upstream response schemas -------------------------------------------------------------------------------


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


class Step(BaseModel):
    """Upstream ``Step``."""

    stepId: int
    stepName: str
    output: str | None
    error: str | None
    childWorkflowId: str | None
    startedAt: datetime | None
    completedAt: datetime | None


class Queue(BaseModel):
    """Upstream ``Queue``."""

    name: str
    concurrency: int | None
    workerConcurrency: int | None
    rateLimitMax: int | None
    rateLimitPeriodSecs: float | None
    priorityEnabled: bool
    partitionQueue: bool
    pollingIntervalSecs: float
    applicationName: str | None


class Schedule(BaseModel):
    """Upstream ``Schedule``."""

    scheduleId: str
    scheduleName: str
    workflowName: str
    workflowClass: str | None
    cronExpression: str
    status: str
    context: str | None
    lastFiredAt: datetime | None
    automaticBackfill: bool
    cronTimezone: str | None
    applicationName: str | None


class ApplicationVersion(BaseModel):
    """Upstream ``ApplicationVersion``."""

    versionId: str
    versionName: str
    versionTimestamp: datetime
    createdAt: datetime


class Metric(BaseModel):
    """Upstream ``Metric``. The SDKs count over the whole requested range, so each metric is one bucket: it
    starts at ``startTime`` and ``granularity`` is the range's length in seconds."""

    appId: str
    metricType: str
    metricName: str
    granularity: int
    timeBucket: datetime
    value: int


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


class WorkflowIdOutput(BaseModel):
    workflowId: str


class ForkWorkflowOutputBody(WorkflowIdOutput):
    """Upstream ``ForkWorkflowOutputBody``."""


class TriggerOutputBody(WorkflowIdOutput):
    """Upstream ``TriggerOutputBody``."""


class WorkflowIdsOutput(BaseModel):
    workflowIds: list[str]


class BackfillOutputBody(WorkflowIdsOutput):
    """Upstream ``BackfillOutputBody``."""


class BulkForkFromFailureOutputBody(WorkflowIdsOutput):
    """Upstream ``BulkForkFromFailureOutputBody``: the new workflows' ids."""


class ExportWorkflowOutputBody(BaseModel):
    """Upstream ``ExportWorkflowOutputBody``: the executor's export, as it sent it (base64 of gzip, from Python
    executors of pickle)."""

    serializedWorkflow: str


# -- SDK replies -> upstream ---------------------------------------------------------------------------------

INT32_MAX = 2**31 - 1


_WORKFLOW_PAGE = TypeAdapter(list[SdkWorkflow])


def dump_workflows(rows: list[SdkWorkflow]) -> bytes:
    """A page of workflows as upstream ``Workflow`` JSON objects."""
    return _WORKFLOW_PAGE.dump_json(rows)


def dump_workflow(row: SdkWorkflow) -> bytes:
    return row.model_dump_json().encode()


def step_of(s: SdkStep) -> Step:
    return Step(stepId=s.function_id, stepName=s.function_name, output=s.output, error=s.error,
                childWorkflowId=s.child_workflow_id, startedAt=s.started_at_epoch_ms,
                completedAt=s.completed_at_epoch_ms)


def queue_of(q: SdkQueue) -> Queue:
    return Queue(name=q.name, concurrency=q.concurrency, workerConcurrency=q.worker_concurrency,
                 rateLimitMax=q.rate_limit_max, rateLimitPeriodSecs=q.rate_limit_period_sec,
                 priorityEnabled=q.priority_enabled, partitionQueue=q.partition_queue,
                 pollingIntervalSecs=q.polling_interval_sec, applicationName=q.application_name)


def schedule_of(s: SdkSchedule) -> Schedule:
    return Schedule(scheduleId=s.schedule_id, scheduleName=s.schedule_name, workflowName=s.workflow_name,
                    workflowClass=s.workflow_class_name, cronExpression=s.schedule, status=s.status,
                    context=s.context, lastFiredAt=s.last_fired_at, automaticBackfill=s.automatic_backfill,
                    cronTimezone=s.cron_timezone, applicationName=s.application_name)


def version_of(v: SdkVersion) -> ApplicationVersion:
    return ApplicationVersion(versionId=v.version_id, versionName=v.version_name,
                              versionTimestamp=v.version_timestamp, createdAt=v.created_at)


def notification_of(n: SdkNotification) -> Notification:
    return Notification(topic=n.topic, message=n.message, createdAt=n.created_at_epoch_ms, consumed=n.consumed)


def metric_of(m: SdkMetric, *, app_id: str, start: datetime, end: datetime) -> Metric:
    return Metric(appId=app_id, metricType=m.metric_type, metricName=m.metric_name,
                  granularity=min(units.seconds_between(start, end), INT32_MAX), timeBucket=start, value=m.value)


def workflow_aggregate_of(a: SdkWorkflowAggregate) -> WorkflowAggregate:
    return WorkflowAggregate(group=a.group, count=a.count, maxQueueWaitMs=a.max_queue_wait_ms,
                             maxTotalLatencyMs=a.max_total_latency_ms, minCreatedAt=a.min_created_at)


def step_aggregate_of(a: SdkStepAggregate) -> StepAggregate:
    return StepAggregate(group=a.group, count=a.count, maxDurationMs=a.max_duration_ms)


# -- upstream request bodies ---------------------------------------------------------------------------------

def _rfc3339_text(value: Any) -> Any:
    """A request body's date-time is RFC 3339 text: not a number (pydantic's lax mode reads 0.5 as a Unix time)."""
    if not isinstance(value, str):
        raise ValueError("not an RFC 3339 date-time, e.g. 2025-01-31T12:00:00Z")
    return _rfc3339(value)  # the pattern the query parameters use too


# Strict bodies take JSON only: a date-time is parsed from its text here (strict mode would refuse any string).
BodyTime = Annotated[AwareDatetime, Field(strict=False), BeforeValidator(_rfc3339_text), AfterValidator(_utc)]
Count = Annotated[int, Field(ge=0, le=MAX_JSON_INT), _JSON_INT]
Names = list[str] | None  # upstream: ``["array", "null"]`` of strings


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("leave the field out instead of sending null")
    return value


def _shallow(value: Any) -> Any:
    """Free-form JSON forwarded to an executor is bounded in depth (``core.nesting``): 422, not a frame the SDK's
    parser or Relay's own serializer gives up on."""
    nesting.check_depth(value, "attributes")
    return value


# Optional and not nullable, as upstream: left out is None (defaults are not validated), an explicit null is refused.
NotNull = BeforeValidator(_not_null)
OptStr = Annotated[str | SkipJsonSchema[None], NotNull]
OptBool = Annotated[bool | SkipJsonSchema[None], NotNull]
OptTime = Annotated[BodyTime | SkipJsonSchema[None], NotNull]
OptAttributes = Annotated[dict[str, Any] | SkipJsonSchema[None], NotNull, BeforeValidator(_shallow)]
OptNames = Annotated[list[str] | SkipJsonSchema[None], NotNull]
BucketMs = Annotated[Annotated[int, Field(gt=0, le=MAX_JSON_INT), _JSON_INT] | SkipJsonSchema[None], NotNull]

DEFAULT_PAGE = 100  # listWorkflows and searchWorkflows without a limit: upstream states no default
MAX_PAGE = 1000
PAGE_EXTENDED = extended(f"1-{MAX_PAGE}, default {DEFAULT_PAGE}: upstream states no bound and no default")
PageLimit = Annotated[int, Field(ge=1, le=MAX_PAGE, json_schema_extra=PAGE_EXTENDED), _JSON_INT]


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


# Upstream filter name -> the SDK's ``list_workflows`` body name (``get_workflow_aggregates`` differs, below).
_LIST_NAMES = {
    "appVersion": "application_version", "attributes": "attributes", "completedAfter": "completed_after",
    "completedBefore": "completed_before", "dequeuedAfter": "dequeued_after", "dequeuedBefore": "dequeued_before",
    "endTime": "end_time", "executorId": "executor_id", "forkedFrom": "forked_from", "hasParent": "has_parent",
    "parentWorkflowId": "parent_workflow_id", "queueName": "queue_name", "scheduleName": "schedule_name",
    "startTime": "start_time", "status": "status", "user": "authenticated_user", "wasForkedFrom": "was_forked_from",
    "workflowIdPrefix": "workflow_id_prefix", "workflowIds": "workflow_uuids", "workflowName": "workflow_name",
}
_AGGREGATE_NAMES = {**_LIST_NAMES, "appVersion": "app_version", "user": "user", "workflowIds": "workflow_ids",
                    "workflowName": "name"}


def _wire(value: Any) -> Any:
    return units.datetime_to_wire_iso(value) if isinstance(value, datetime) else value


def _mapped(model: BaseModel, names: dict[str, str]) -> dict[str, Any]:
    """The fields of ``model`` named in ``names`` that are set (not None), under their SDK names."""
    return {sdk: _wire(getattr(model, rest)) for rest, sdk in names.items() if getattr(model, rest) is not None}


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
    return {**_mapped(body, _LIST_NAMES), "limit": body.limit, "offset": body.offset, "sort_desc": body.sortDesc,
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


def _one_of_given(flags: list[str], others: list[str]) -> dict[str, Any]:
    """JSON Schema for "at least one of these flags is true or one of these fields is given", so that the spec
    states what the model validators below check."""
    branches = [{"required": [f], "properties": {f: {"enum": [True]}}} for f in flags]
    return {"anyOf": branches + [{"required": [f]} for f in others]}


class WorkflowAggregatesBody(WorkflowFilter):
    """Upstream ``WorkflowAggregatesBody``. At least one ``groupBy*`` or ``timeBucketSizeMs`` is needed (the SDKs
    refuse an aggregate without a group)."""

    model_config = ConfigDict(json_schema_extra={
        **_one_of_given(["groupByAppVersion", "groupByApplicationName", "groupByExecutorId", "groupByQueueName",
                         "groupByStatus", "groupByWorkflowName"], ["timeBucketSizeMs"]),
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
        if not any(getattr(self, f) for f in _WORKFLOW_GROUPS_ONLY) and self.timeBucketSizeMs is None:
            raise ValueError("group by at least one field (groupBy*) or set timeBucketSizeMs")
        return self


_WORKFLOW_GROUPS = {
    "groupByStatus": "group_by_status", "groupByWorkflowName": "group_by_name",
    "groupByQueueName": "group_by_queue_name", "groupByExecutorId": "group_by_executor_id",
    "groupByAppVersion": "group_by_application_version", "groupByApplicationName": "group_by_application_name",
    "selectCount": "select_count", "selectMinCreatedAt": "select_min_created_at",
    "selectMaxQueueWaitMs": "select_max_queue_wait_ms", "selectMaxTotalLatencyMs": "select_max_total_latency_ms",
}
_WORKFLOW_GROUPS_ONLY = [f for f in _WORKFLOW_GROUPS if f.startswith("groupBy")]


def workflow_aggregates_body(body: WorkflowAggregatesBody) -> dict[str, Any]:
    out = {**_mapped(body, _AGGREGATE_NAMES), **{sdk: getattr(body, rest) for rest, sdk in _WORKFLOW_GROUPS.items()}}
    if body.timeBucketSizeMs is not None:
        out["time_bucket_size_ms"] = body.timeBucketSizeMs
    return out


class StepAggregatesBody(InputBody):
    """Upstream ``StepAggregatesBody``; as for workflows, a group or a time bucket is needed."""

    model_config = ConfigDict(json_schema_extra={
        **_one_of_given(["groupByFunctionName", "groupByStatus"], ["timeBucketSizeMs"]),
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
        if not (self.groupByFunctionName or self.groupByStatus or self.timeBucketSizeMs is not None):
            raise ValueError("group by at least one field (groupBy*) or set timeBucketSizeMs")
        return self


def step_aggregates_body(body: StepAggregatesBody) -> dict[str, Any]:
    out = _mapped(body, {"completedAfter": "completed_after", "completedBefore": "completed_before",
                         "status": "status", "stepName": "function_name", "workflowIdPrefix": "workflow_id_prefix",
                         "timeBucketSizeMs": "time_bucket_size_ms"})
    return {**out, "group_by_function_name": body.groupByFunctionName, "group_by_status": body.groupByStatus,
            "select_count": body.selectCount, "select_max_duration_ms": body.selectMaxDurationMs}


class CancelWorkflowInputBody(InputBody):
    cancelChildren: bool = False


class ResumeWorkflowInputBody(InputBody):
    queueName: OptStr = None


StartStep = Annotated[int, Field(ge=0, le=INT32_MAX), _JSON_INT]


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


class ImportWorkflowInputBody(InputBody):
    """Upstream ``ImportWorkflowInputBody``: an ``exportWorkflow`` payload, which the executor deserializes."""

    serializedWorkflow: Annotated[str, Field(min_length=1, json_schema_extra=extended("must not be empty"))]


class BackfillInputBody(InputBody):
    startTime: BodyTime
    endTime: BodyTime


class PatchLatestVersionInputBody(InputBody):
    versionName: Annotated[str, Field(min_length=1, json_schema_extra=extended("must not be empty"))]


# -- Relay extension: bulk actions by filter -------------------------------------------------------------------

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
    return {**_mapped(body, _FILTER_NAMES), "limit": limit, "offset": 0, "sort_desc": False, "load_input": False,
            "load_output": False}


def existence_body(workflow_ids: list[str]) -> dict[str, Any]:
    """``list_workflows``'s body asking which of ``workflow_ids`` exist: ids only (no inputs or outputs)."""
    return {"workflow_uuids": workflow_ids, "limit": len(workflow_ids), "offset": 0, "sort_desc": False,
            "load_input": False, "load_output": False}


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

