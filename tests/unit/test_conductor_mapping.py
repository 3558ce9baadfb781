"""``api.conductor``: SDK replies -> upstream schemas and upstream requests -> SDK fields, as property-based round
trips. The encoders below write what the Python SDK writes (``dbos/_conductor/protocol.py``, dbos 3.2.0:
``WorkflowsOutput.from_workflow_information`` stringifies every number and epoch-millisecond instant), so mapping
an SDK reply of an upstream value must give that value back, unit for unit."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api import conductor as c
from core import units
from tests.quick import examples

# -- strategies ------------------------------------------------------------------------------------------------

# Instants the SDKs can send: whole milliseconds, within what a datetime holds.
instants = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9998, 12, 31),  # noqa: DTZ001
                        timezones=st.just(UTC)).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))
texts = st.text(max_size=20)
maybe_text = st.none() | texts
maybe_instant = st.none() | instants
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64 = st.integers(min_value=0, max_value=2**53 - 1)

workflows = st.builds(
    c.Workflow, workflowId=texts, status=st.sampled_from(["PENDING", "SUCCESS", "ERROR", "CANCELLED", "ENQUEUED"]),
    workflowName=maybe_text, workflowClass=maybe_text, workflowConfig=maybe_text, user=maybe_text,
    assumedRole=maybe_text, roles=maybe_text, input=maybe_text, output=maybe_text, error=maybe_text,
    createdAt=instants, updatedAt=instants, queueName=maybe_text, appVersion=maybe_text, executorId=maybe_text,
    timeoutMs=st.none() | int64, deadline=maybe_instant, deduplicationId=maybe_text, priority=int32,
    queuePartitionKey=maybe_text, forkedFrom=maybe_text, wasForkedFrom=st.booleans(), parentWorkflowId=maybe_text,
    dequeuedAt=maybe_instant, delayUntil=maybe_instant, completedAt=maybe_instant, attributes=maybe_text,
    scheduleName=maybe_text, applicationName=maybe_text)


def _ms(value: datetime | None) -> str | None:
    return None if value is None else units.datetime_to_epoch_ms_text(value)


def _str(value: int | None) -> str | None:
    return None if value is None else str(value)


def sdk_workflow(w: c.Workflow) -> dict[str, Any]:
    """``WorkflowsOutput`` as the Python SDK builds it from the workflow ``w`` describes."""
    return {
        "WorkflowUUID": w.workflowId, "Status": w.status, "WorkflowName": w.workflowName,
        "WorkflowClassName": w.workflowClass, "WorkflowConfigName": w.workflowConfig,
        "AuthenticatedUser": w.user, "AssumedRole": w.assumedRole, "AuthenticatedRoles": w.roles,
        "Input": w.input, "Output": w.output, "Error": w.error, "CreatedAt": _ms(w.createdAt),
        "UpdatedAt": _ms(w.updatedAt), "QueueName": w.queueName, "ApplicationVersion": w.appVersion,
        "ExecutorID": w.executorId, "WorkflowTimeoutMS": _str(w.timeoutMs),
        "WorkflowDeadlineEpochMS": _ms(w.deadline), "DeduplicationID": w.deduplicationId,
        "Priority": str(w.priority), "QueuePartitionKey": w.queuePartitionKey, "ForkedFrom": w.forkedFrom,
        "WasForkedFrom": w.wasForkedFrom, "ParentWorkflowID": w.parentWorkflowId, "DequeuedAt": _ms(w.dequeuedAt),
        "DelayUntilEpochMS": _ms(w.delayUntil), "CompletedAt": _ms(w.completedAt), "Attributes": w.attributes,
        "ScheduleName": w.scheduleName, "ApplicationName": w.applicationName,
    }


def sdk_step(s: c.Step) -> dict[str, Any]:
    return {"function_id": s.stepId, "function_name": s.stepName, "output": s.output, "error": s.error,
            "child_workflow_id": s.childWorkflowId, "started_at_epoch_ms": _ms(s.startedAt),
            "completed_at_epoch_ms": _ms(s.completedAt)}


def sdk_queue(q: c.Queue) -> dict[str, Any]:
    return {"name": q.name, "concurrency": q.concurrency, "worker_concurrency": q.workerConcurrency,
            "rate_limit_max": q.rateLimitMax, "rate_limit_period_sec": q.rateLimitPeriodSecs,
            "priority_enabled": q.priorityEnabled, "partition_queue": q.partitionQueue,
            "polling_interval_sec": q.pollingIntervalSecs, "application_name": q.applicationName,
            "partition_concurrency": None}  # a field upstream has no place for: ignored


def sdk_schedule(s: c.Schedule) -> dict[str, Any]:
    return {"schedule_id": s.scheduleId, "schedule_name": s.scheduleName, "workflow_name": s.workflowName,
            "workflow_class_name": s.workflowClass, "schedule": s.cronExpression, "status": s.status,
            "context": s.context, "last_fired_at": None if s.lastFiredAt is None else s.lastFiredAt.isoformat(),
            "automatic_backfill": s.automaticBackfill, "cron_timezone": s.cronTimezone, "queue_name": None,
            "application_name": s.applicationName}


def sdk_version(v: c.ApplicationVersion) -> dict[str, Any]:
    return {"version_id": v.versionId, "version_name": v.versionName,
            "version_timestamp": units.datetime_to_epoch_ms(v.versionTimestamp),
            "created_at": units.datetime_to_epoch_ms(v.createdAt)}


def sdk_notification(n: c.Notification) -> dict[str, Any]:
    return {"topic": n.topic, "message": n.message, "created_at_epoch_ms": units.datetime_to_epoch_ms(n.createdAt),
            "consumed": n.consumed}


# -- replies -> upstream -----------------------------------------------------------------------------------------


@given(workflows)
@settings(max_examples=examples(200))
def test_workflow_round_trip(w: c.Workflow) -> None:
    assert workflow_of(c.SdkWorkflow.model_validate(sdk_workflow(w))) == w


def workflow_of(row: c.SdkWorkflow) -> c.Workflow:
    return c.Workflow.model_validate_json(c.dump_workflow(row))


def test_every_sdk_workflow_field_maps_to_an_upstream_one_in_order() -> None:
    aliases = [f.serialization_alias for f in c.SdkWorkflow.model_fields.values()]
    assert aliases == list(c.Workflow.model_fields)


def test_a_page_is_the_list_of_its_workflows() -> None:
    rows = [c.SdkWorkflow.model_validate({"WorkflowUUID": f"w{i}", "CreatedAt": str(i)}) for i in range(3)]
    page = json.loads(c.dump_workflows(rows))
    assert page == [json.loads(c.dump_workflow(row)) for row in rows]
    assert [w["createdAt"] for w in page] == [f"1970-01-01T00:00:00.00{i}000Z" if i else "1970-01-01T00:00:00Z"
                                             for i in range(3)]


@given(st.builds(c.Step, stepId=int32, stepName=texts, output=maybe_text, error=maybe_text,
                 childWorkflowId=maybe_text, startedAt=maybe_instant, completedAt=maybe_instant))
def test_step_round_trip(s: c.Step) -> None:
    assert c.step_of(c.SdkStep.model_validate(sdk_step(s))) == s


floats = st.floats(min_value=0, max_value=1e9, allow_nan=False)


@given(st.builds(c.Queue, name=texts, concurrency=st.none() | int32, workerConcurrency=st.none() | int32,
                 rateLimitMax=st.none() | int32, rateLimitPeriodSecs=st.none() | floats,
                 priorityEnabled=st.booleans(), partitionQueue=st.booleans(), pollingIntervalSecs=floats,
                 applicationName=maybe_text))
def test_queue_round_trip(q: c.Queue) -> None:
    assert c.queue_of(c.SdkQueue.model_validate(sdk_queue(q))) == q


@given(st.builds(c.Schedule, scheduleId=texts, scheduleName=texts, workflowName=texts, workflowClass=maybe_text,
                 cronExpression=texts, status=st.sampled_from(["ACTIVE", "PAUSED"]), context=maybe_text,
                 lastFiredAt=maybe_instant, automaticBackfill=st.booleans(), cronTimezone=maybe_text,
                 applicationName=maybe_text))
def test_schedule_round_trip(s: c.Schedule) -> None:
    assert c.schedule_of(c.SdkSchedule.model_validate(sdk_schedule(s))) == s


@given(st.builds(c.ApplicationVersion, versionId=texts, versionName=texts, versionTimestamp=instants,
                 createdAt=instants))
def test_version_round_trip(v: c.ApplicationVersion) -> None:
    assert c.version_of(c.SdkVersion.model_validate(sdk_version(v))) == v


@given(st.builds(c.Notification, topic=maybe_text, message=texts, createdAt=instants, consumed=st.booleans()))
def test_notification_round_trip(n: c.Notification) -> None:
    assert c.notification_of(c.SdkNotification.model_validate(sdk_notification(n))) == n


@given(st.builds(c.WorkflowAggregate, group=st.dictionaries(texts, maybe_text, max_size=3),
                 count=st.none() | int64, maxQueueWaitMs=st.none() | int64, maxTotalLatencyMs=st.none() | int64,
                 minCreatedAt=maybe_instant))
def test_workflow_aggregate_round_trip(a: c.WorkflowAggregate) -> None:
    sdk = {"group": a.group, "count": a.count, "max_queue_wait_ms": a.maxQueueWaitMs,
           "max_total_latency_ms": a.maxTotalLatencyMs,
           "min_created_at": None if a.minCreatedAt is None else units.datetime_to_epoch_ms(a.minCreatedAt)}
    assert c.workflow_aggregate_of(c.SdkWorkflowAggregate.model_validate(sdk)) == a


# A range of up to 10**9 s (31.7 years) must end before datetime's year 9999.
@given(instants.filter(lambda d: d.year < 9960), st.integers(min_value=0, max_value=10**9))
def test_metric_is_one_bucket_over_the_range(start: datetime, seconds: int) -> None:
    end = start + timedelta(seconds=seconds, milliseconds=999)
    metric = c.metric_of(c.SdkMetric(metric_type="workflow_count", metric_name="w", value=3), app_id="a",
                         start=start, end=end)
    assert (metric.timeBucket, metric.granularity, metric.value) == (start, min(seconds, c.INT32_MAX), 3)


def test_integers_the_typescript_sdk_leaves_undefined_are_absent() -> None:
    row = c.SdkWorkflow.model_validate({"WorkflowUUID": "w", "CreatedAt": "5", "Priority": "undefined",
                                        "WorkflowTimeoutMS": None, "Unknown": 1})
    workflow = workflow_of(row)
    assert (workflow.priority, workflow.timeoutMs) == (0, None)
    assert workflow.createdAt == workflow.updatedAt == datetime(1970, 1, 1, 0, 0, 0, 5000, tzinfo=UTC)


@pytest.mark.parametrize("created", ["yesterday", "1e3", True, [1], "9" * 30, "2025-01-01T00:00:00"])
def test_an_instant_that_is_not_epoch_milliseconds_is_refused(created: Any) -> None:
    with pytest.raises(ValidationError):
        c.SdkWorkflow.model_validate({"WorkflowUUID": "w", "CreatedAt": created})


def test_a_naive_last_fired_at_is_utc_and_garbage_is_unknown() -> None:
    base = {"schedule_id": "i", "schedule_name": "n", "workflow_name": "w", "schedule": "* * * * *",
            "status": "ACTIVE"}
    naive = c.SdkSchedule.model_validate({**base, "last_fired_at": "2025-01-01T10:00:00"})
    assert naive.last_fired_at == datetime(2025, 1, 1, 10, tzinfo=UTC)
    assert c.SdkSchedule.model_validate({**base, "last_fired_at": "soon"}).last_fired_at is None


# -- units -------------------------------------------------------------------------------------------------------


@given(instants)
def test_epoch_ms_text_round_trip(at: datetime) -> None:
    assert units.epoch_ms_text_to_datetime(units.datetime_to_epoch_ms_text(at)) == at
    assert units.epoch_ms_text_to_datetime(units.datetime_to_epoch_ms(at)) == at


# Request instants come from RFC 3339 text: fixed offsets.
offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))


@given(st.datetimes(timezones=offsets,
                    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31)))  # noqa: DTZ001
def test_wire_iso_is_the_same_instant_in_utc(at: datetime) -> None:
    text = units.datetime_to_wire_iso(at)
    assert text.endswith("+00:00") and datetime.fromisoformat(text) == at


# -- requests -> SDK fields --------------------------------------------------------------------------------------

names = st.none() | st.lists(texts, max_size=3)
body_instants = st.none() | instants


@given(status=names, workflow_name=names, app_version=names, queue_name=names, user=names, start=body_instants,
       end=body_instants, limit=st.integers(1, c.MAX_PAGE), offset=int64, queues_only=st.booleans(),
       load=st.booleans())
def test_search_body_maps_every_given_filter(status: list[str] | None, workflow_name: list[str] | None,
                                             app_version: list[str] | None, queue_name: list[str] | None,
                                             user: list[str] | None, start: datetime | None, end: datetime | None,
                                             limit: int, offset: int, queues_only: bool, load: bool) -> None:
    given_ = {"status": status, "workflowName": workflow_name, "appVersion": app_version, "queueName": queue_name,
              "user": user, "startTime": None if start is None else start.isoformat(),
              "endTime": None if end is None else end.isoformat().replace("+00:00", "Z")}
    raw = {k: v for k, v in given_.items() if v is not None}
    body = c.WorkflowSearchBody.model_validate({**raw, "limit": limit, "offset": offset, "queuesOnly": queues_only,
                                                "loadInput": load})
    sdk = c.list_body_of_search(body)
    assert (sdk["limit"], sdk["offset"], sdk["queues_only"], sdk["load_input"], sdk["load_output"]) \
        == (limit, offset, queues_only, load, False)
    for rest, key in [("status", "status"), ("workflowName", "workflow_name"), ("appVersion", "application_version"),
                      ("queueName", "queue_name"), ("user", "authenticated_user")]:
        assert sdk.get(key) == raw.get(rest)
    for rest, key, at in [("startTime", "start_time", start), ("endTime", "end_time", end)]:
        assert (key in sdk) == (rest in raw)
        if at is not None:
            assert datetime.fromisoformat(sdk[key]) == at


def test_search_defaults_are_a_page_of_100_without_inputs_or_outputs() -> None:
    sdk = c.list_body_of_search(c.WorkflowSearchBody())
    assert sdk == {"limit": 100, "offset": 0, "sort_desc": False, "load_input": False, "load_output": False,
                   "queues_only": False}


@pytest.mark.parametrize("body", [{"limit": 0}, {"limit": 1001}, {"startTime": 0}, {"startTime": "2025-01-01"},
                                  {"status": "PENDING"}, {"limit": "10"}, {"nope": 1}])
def test_search_body_refuses(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        c.WorkflowSearchBody.model_validate(body)


def test_aggregate_bodies_map_to_the_sdk_names() -> None:
    body = c.WorkflowAggregatesBody.model_validate({
        "groupByWorkflowName": True, "groupByAppVersion": True, "selectCount": True, "workflowName": ["w"],
        "appVersion": ["v1"], "user": ["u"], "workflowIds": ["a"], "timeBucketSizeMs": 60000,
        "startTime": "2025-01-01T00:00:00Z"})
    sdk = c.workflow_aggregates_body(body)
    assert sdk["group_by_name"] and sdk["group_by_application_version"] and sdk["select_count"]
    assert not sdk["group_by_status"]
    assert (sdk["name"], sdk["app_version"], sdk["user"], sdk["workflow_ids"], sdk["time_bucket_size_ms"]) \
        == (["w"], ["v1"], ["u"], ["a"], 60000)
    assert sdk["start_time"] == "2025-01-01T00:00:00+00:00"
    steps = c.step_aggregates_body(c.StepAggregatesBody.model_validate({"groupByStatus": True, "stepName": ["s"]}))
    assert steps == {"function_name": ["s"], "group_by_function_name": False, "group_by_status": True,
                     "select_count": False, "select_max_duration_ms": False}
    with pytest.raises(ValidationError):
        c.WorkflowAggregatesBody.model_validate({"selectCount": True})
    with pytest.raises(ValidationError):
        c.StepAggregatesBody.model_validate({})


def test_fork_bodies() -> None:
    assert c.fork_body("w", c.ForkWorkflowInputBody()) == {
        "workflow_id": "w", "start_step": 1, "application_version": None, "new_workflow_id": None,
        "queue_name": None, "queue_partition_key": None}
    body = c.BulkForkFromFailureBody.model_validate({"workflowIds": ["a"], "fromStepName": "s", "appVersion": "v2"})
    assert c.fork_from_failure_body(["a"], body) == {
        "workflow_ids": ["a"], "application_version": "v2", "queue_name": None, "queue_partition_key": None,
        "from_last_failure": False, "from_last_step": False, "from_step_name": "s"}  # no null from_step: see bulk.py


def test_a_bulk_filter_must_narrow() -> None:
    for empty in [{}, {"dryRun": True}, {"status": []}, {"status": None, "queueName": []}]:
        with pytest.raises(ValidationError):
            c.BulkFilter.model_validate(empty)
    body = c.BulkFilter.model_validate({"status": ["PENDING"], "endTime": "2025-01-01T00:00:00Z"})
    assert c.filter_list_body(body, limit=1001) == {
        "status": ["PENDING"], "end_time": "2025-01-01T00:00:00+00:00", "limit": 1001, "offset": 0,
        "sort_desc": False, "load_input": False, "load_output": False}


# -- against the real SDK's encoders (dbos 3.2.0, installed for the executor tests) ---------------------------------


@given(workflows)
@settings(max_examples=examples(100))
def test_workflow_as_the_python_sdk_encodes_it(w: c.Workflow) -> None:
    """The SDK's own ``WorkflowsOutput.from_workflow_information`` and ``to_json``, then Relay's mapping."""
    from dbos._conductor import protocol as p
    from dbos._sys_db import WorkflowStatus

    info = WorkflowStatus()
    values = {
        "workflow_id": w.workflowId, "status": w.status, "name": w.workflowName, "class_name": w.workflowClass,
        "config_name": w.workflowConfig, "authenticated_user": w.user, "assumed_role": w.assumedRole,
        "authenticated_roles": None, "input": w.input, "output": w.output, "error": w.error,
        "created_at": units.datetime_to_epoch_ms(w.createdAt), "updated_at": units.datetime_to_epoch_ms(w.updatedAt),
        "queue_name": w.queueName, "executor_id": w.executorId, "app_version": w.appVersion,
        "workflow_timeout_ms": w.timeoutMs, "workflow_deadline_epoch_ms": _epoch(w.deadline),
        "deduplication_id": w.deduplicationId, "priority": w.priority, "queue_partition_key": w.queuePartitionKey,
        "forked_from": w.forkedFrom, "was_forked_from": w.wasForkedFrom, "parent_workflow_id": w.parentWorkflowId,
        "dequeued_at": _epoch(w.dequeuedAt), "delay_until_epoch_ms": _epoch(w.delayUntil),
        "completed_at": _epoch(w.completedAt), "attributes": None, "schedule_name": w.scheduleName,
        "application_name": w.applicationName}
    for name, value in values.items():
        setattr(info, name, value)
    reply = p.ListWorkflowsResponse(type=p.MessageType.LIST_WORKFLOWS, request_id="r",
                                    output=[p.WorkflowsOutput.from_workflow_information(info)])
    parsed = c.ListWorkflowsReply.model_validate_json(reply.to_json())
    assert [workflow_of(x) for x in parsed.output] == [w.model_copy(update={"roles": None, "attributes": None})]


def _epoch(value: datetime | None) -> int | None:
    return None if value is None else units.datetime_to_epoch_ms(value)


@given(st.builds(c.Step, stepId=st.integers(1, 10_000), stepName=texts, output=maybe_text, error=maybe_text,
                 childWorkflowId=maybe_text, startedAt=maybe_instant, completedAt=maybe_instant),
       st.builds(c.ApplicationVersion, versionId=texts, versionName=texts, versionTimestamp=instants,
                 createdAt=instants),
       st.builds(c.Notification, topic=maybe_text, message=texts, createdAt=instants, consumed=st.booleans()))
def test_steps_versions_notifications_as_the_python_sdk_encodes_them(s: c.Step, v: c.ApplicationVersion,
                                                                     n: c.Notification) -> None:
    from dbos._conductor import protocol as p

    step = p.WorkflowSteps.from_step_info({
        "function_id": s.stepId, "function_name": s.stepName, "output": s.output,
        "error": None if s.error is None else Exception(s.error),  # the SDK sends str(error)
        "child_workflow_id": s.childWorkflowId, "started_at_epoch_ms": _epoch(s.startedAt),
        "completed_at_epoch_ms": _epoch(s.completedAt)})
    steps = p.ListStepsResponse(type=p.MessageType.LIST_STEPS, request_id="r", output=[step])
    assert [c.step_of(x) for x in c.ListStepsReply.model_validate_json(steps.to_json()).output or []] == [s]
    version = p.ApplicationVersionOutput.from_version_info({
        "version_id": v.versionId, "version_name": v.versionName, "application_name": None,
        "version_timestamp": units.datetime_to_epoch_ms(v.versionTimestamp),
        "created_at": units.datetime_to_epoch_ms(v.createdAt)})
    versions = p.ListApplicationVersionsResponse(type=p.MessageType.LIST_APPLICATION_VERSIONS, request_id="r",
                                                 output=[version])
    assert [c.version_of(x) for x in c.ListVersionsReply.model_validate_json(versions.to_json()).output] == [v]
    note = p.NotificationOutput.from_notification_info({
        "topic": n.topic, "message": n.message, "created_at_epoch_ms": units.datetime_to_epoch_ms(n.createdAt),
        "consumed": n.consumed})
    notes = p.GetWorkflowNotificationsResponse(type=p.MessageType.GET_WORKFLOW_NOTIFICATIONS, request_id="r",
                                               notifications=[note])
    parsed = c.NotificationsReply.model_validate_json(notes.to_json())
    assert [c.notification_of(x) for x in parsed.notifications or []] == [n]
