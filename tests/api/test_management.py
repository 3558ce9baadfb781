"""Workflow management routes in-process (``conftest.Api``) against ``FakeManagement``, which records what each
route asks an executor (kind, fields, pick, version) and answers as a dbos 3.2.0 executor would: so each test
checks the request sent, the mapped response (against upstream's schema facts), the status codes, the problems
and the audit rows."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx
import pytest
from dbos._conductor import protocol as p
from dbos._error import DBOSNonExistentWorkflowError

from api.managed import BulkLimiter
from cli import admin, common
from core.errors import ExecutorsFailedError, NoExecutorError
from core.settings import Settings
from core.store import Candidates
from gateway.management import Answer, Management, Pick
from tests.api.conftest import BASE_URL, ORG, Api
from tests.api.test_compat import (
    ARRAY,
    BOOLEAN,
    INTEGER,
    INTEGER_OR_NULL,
    OBJ,
    STRING,
    STRING_OR_NULL,
    Shape,
    _types,
    assert_problem,
    conformance_errors,
)
from tests.cli_kit import parser as cli_parser
from tests.transports import LoopASGITransport

APP = "mgmt-app"
BASE = f"/v2/orgs/{ORG}/apps/{APP}"
EXECUTOR = "exec-1"
T0 = datetime(2025, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)
T0_MS = "1740830400123"

# -- the fake ----------------------------------------------------------------------------------------------------


def sdk_workflow(workflow_id: str, **overrides: Any) -> dict[str, Any]:
    """A ``WorkflowsOutput`` as dbos 3.2.0 sends it: every number and instant as text."""
    row: dict[str, Any] = {
        "WorkflowUUID": workflow_id, "Status": "PENDING", "WorkflowName": "work", "WorkflowClassName": None,
        "WorkflowConfigName": None, "AuthenticatedUser": None, "AssumedRole": None, "AuthenticatedRoles": None,
        "Input": None, "Output": None, "Error": None, "CreatedAt": T0_MS, "UpdatedAt": T0_MS, "QueueName": "q",
        "ApplicationVersion": "v1", "ExecutorID": EXECUTOR, "WorkflowTimeoutMS": "60000",
        "WorkflowDeadlineEpochMS": None, "DeduplicationID": None, "Priority": "0", "QueuePartitionKey": None,
        "ForkedFrom": None, "WasForkedFrom": False, "ParentWorkflowID": None, "DequeuedAt": T0_MS,
        "DelayUntilEpochMS": None, "CompletedAt": None, "Attributes": None, "ScheduleName": None,
        "ApplicationName": "orders"}
    return {**row, **overrides}


SCHEDULE = {"schedule_id": "s-1", "schedule_name": "nightly", "workflow_name": "work", "workflow_class_name": None,
            "schedule": "0 0 * * *", "status": "ACTIVE", "context": "None", "last_fired_at": T0.isoformat(),
            "automatic_backfill": False, "cron_timezone": None, "queue_name": None, "application_name": "orders"}
QUEUE = {"name": "q", "concurrency": 1, "worker_concurrency": None, "rate_limit_max": None,
         "rate_limit_period_sec": None, "priority_enabled": True, "partition_queue": False,
         "polling_interval_sec": 1.0, "application_name": "orders", "partition_concurrency": None}

Reply = Callable[[Mapping[str, Any]], dict[str, Any]]


def _ids(fields: Mapping[str, Any]) -> list[str]:
    body = fields.get("body", {})
    return list(body.get("workflow_uuids") or body.get("workflow_ids") or ["w-1", "w-2"])


# What a dbos 3.2.0 executor answers to each request (``dbos/_conductor/conductor.py``), for any fields.
PLAUSIBLE: dict[str, Reply] = {
    "list_workflows": lambda f: {"output": [sdk_workflow(i) for i in _ids(f)]},
    "get_workflow": lambda f: {"output": sdk_workflow(f["workflow_id"], Input="[1]", Output="2")},
    "list_steps": lambda f: {"output": [{"function_id": 1, "function_name": "step", "output": "1", "error": None,
                                         "child_workflow_id": None, "started_at_epoch_ms": T0_MS,
                                         "completed_at_epoch_ms": T0_MS}]},
    "get_workflow_events": lambda f: {"events": [{"key": "k", "value": "v"}]},
    "get_workflow_notifications": lambda f: {"notifications": [
        {"topic": None, "message": "m", "created_at_epoch_ms": 1740830400123, "consumed": True}]},
    "get_workflow_streams": lambda f: {"streams": [{"key": "s", "values": ["a", "b"]}]},
    "cancel": lambda f: {"success": True},
    "resume": lambda f: {"success": True},
    "delete": lambda f: {"success": True},
    "import_workflow": lambda f: {"success": True},
    "fork_workflow": lambda f: {"new_workflow_id": f["body"]["new_workflow_id"] or "forked-1"},
    "fork_from_failure": lambda f: {"forked_workflow_ids": [f"{i}-fork" for i in f["body"]["workflow_ids"]]},
    "export_workflow": lambda f: {"serialized_workflow": "H4sIAAAA"},
    "get_workflow_aggregates": lambda f: {"output": [{"group": {"status": "SUCCESS", "name": None}, "count": 3,
                                                      "min_created_at": None, "max_queue_wait_ms": None,
                                                      "max_total_latency_ms": None}]},
    "get_step_aggregates": lambda f: {"output": [{"group": {"function_name": "step"}, "count": 2,
                                                  "max_duration_ms": 15}]},
    "list_queues": lambda f: {"output": [QUEUE]},
    "get_queue": lambda f: {"output": {**QUEUE, "name": f["name"]}},
    "list_schedules": lambda f: {"output": [SCHEDULE]},
    "get_schedule": lambda f: {"output": {**SCHEDULE, "schedule_name": f["schedule_name"]}},
    "pause_schedule": lambda f: {"success": True},
    "resume_schedule": lambda f: {"success": True},
    "trigger_schedule": lambda f: {"workflow_id": "sched-run-1"},
    "backfill_schedule": lambda f: {"workflow_ids": ["b-1", "b-2"]},
    "list_application_versions": lambda f: {"output": [
        {"version_id": "id-1", "version_name": "v1", "version_timestamp": 1740830400123, "created_at": 1740830400000}]},
    "set_latest_application_version": lambda f: {"success": True},
    "get_metrics": lambda f: {"metrics": [{"metric_type": "workflow_count", "metric_name": "work", "value": 7}]},
}


# Each request as the Python SDK reads it (``dbos/_conductor/protocol.py``): the dataclass, and the TypedDict of
# its ``body`` where it has one.
SDK_REQUESTS: dict[str, tuple[type[p.BaseMessage], type | None]] = {
    "list_workflows": (p.ListWorkflowsRequest, p.ListWorkflowsBody), "get_workflow": (p.GetWorkflowRequest, None),
    "list_steps": (p.ListStepsRequest, None), "get_workflow_events": (p.GetWorkflowEventsRequest, None),
    "get_workflow_notifications": (p.GetWorkflowNotificationsRequest, None),
    "get_workflow_streams": (p.GetWorkflowStreamsRequest, None), "cancel": (p.CancelRequest, None),
    "resume": (p.ResumeRequest, None), "delete": (p.DeleteRequest, None),
    "fork_workflow": (p.ForkWorkflowRequest, p.ForkWorkflowBody),
    "fork_from_failure": (p.ForkFromFailureRequest, p.ForkFromFailureBody),
    "export_workflow": (p.ExportWorkflowRequest, None), "import_workflow": (p.ImportWorkflowRequest, None),
    "get_workflow_aggregates": (p.GetWorkflowAggregatesRequest, p.GetWorkflowAggregatesBody),
    "get_step_aggregates": (p.GetStepAggregatesRequest, p.GetStepAggregatesBody),
    "list_queues": (p.ListQueuesRequest, p.ListQueuesBody), "get_queue": (p.GetQueueRequest, None),
    "list_schedules": (p.ListSchedulesRequest, p.ListSchedulesBody), "get_schedule": (p.GetScheduleRequest, None),
    "pause_schedule": (p.PauseScheduleRequest, None), "resume_schedule": (p.ResumeScheduleRequest, None),
    "backfill_schedule": (p.BackfillScheduleRequest, None), "trigger_schedule": (p.TriggerScheduleRequest, None),
    "list_application_versions": (p.BaseMessage, None),
    "set_latest_application_version": (p.SetLatestApplicationVersionRequest, None),
    "get_metrics": (p.GetMetricsRequest, None),
}


def assert_the_sdk_reads(kind: str, fields: Mapping[str, Any]) -> None:
    """Every field (and ``body`` key) is one the SDK reads, and every field it requires is there: the SDK's
    ``from_json`` drops unknown keys silently, so a misspelt one would simply be ignored by a real executor."""
    request, body = SDK_REQUESTS[kind]
    known = {f.name for f in dataclasses.fields(request)}
    assert fields.keys() <= known, (kind, fields.keys() - known)
    message = request.from_json(json.dumps({"type": kind, "request_id": "r", **fields}))  # TypeError if one is missing
    if body is not None:
        assert fields["body"].keys() <= body.__annotations__.keys(), (kind, fields["body"].keys())
        assert getattr(body, "__required_keys__", frozenset()) <= fields["body"].keys(), kind  # read with [...]
    for name in ("start_time", "end_time", "start", "end"):  # the SDK parses these with datetime.fromisoformat
        for value in (fields.get(name), fields.get("body", {}).get(name)):
            if value is not None:
                assert datetime.fromisoformat(value).tzinfo is not None
    assert message.type == kind


@dataclass(frozen=True)
class Sent:
    org: str
    app: str
    kind: str
    fields: dict[str, Any]
    pick: Pick
    version: str | None
    candidates: Candidates | None = None


@dataclass
class FakeManagement:
    """``gateway.management`` as the routes use it: ``ask`` records the request and answers from ``replies`` (by
    kind), else as an executor would (``PLAUSIBLE``); ``fail`` makes every request raise it instead."""

    replies: dict[str, Reply] = field(default_factory=dict)
    fail: Exception | None = None
    sent: list[Sent] = field(default_factory=list)
    executor_id: str = EXECUTOR

    async def ask(self, org: str, app: str, kind: str, fields: Mapping[str, Any], *, pick: Pick = Pick.ANY,
                  version: str | None = None, timeout: timedelta | None = None,
                  candidates: Candidates | None = None) -> Answer:
        self.sent.append(Sent(org, app, kind, dict(fields), pick, version, candidates))
        assert_the_sdk_reads(kind, fields)
        if self.fail is not None:
            raise self.fail
        reply = self.replies.get(kind) or PLAUSIBLE.get(kind) or (lambda f: {"error_message": "Unknown message type"})
        return Answer(executor_id=self.executor_id, body={"error_message": None, **reply(fields)})

    @property
    def last(self) -> Sent:
        return self.sent[-1]


def install(api: Api, fake: FakeManagement) -> Management:
    """Puts ``fake`` in the gateway's place; returns what was there."""
    original = api.gateway.management
    api.gateway.management = cast(Management, fake)
    return original


@dataclass
class Env:
    api: Api
    fake: FakeManagement
    client: httpx.AsyncClient


@pytest.fixture
async def env(api: Api) -> AsyncIterator[Env]:
    api.store.ensure_app(ORG, APP)
    fake = FakeManagement()
    original = install(api, fake)
    api.app.state.bulk_limiter = BulkLimiter(10_000)  # rate limiting has its own test
    try:
        async with api.client() as client:
            yield Env(api, fake, client)
    finally:
        api.gateway.management = original


# -- upstream's schema facts (``../shared/conductor-openapi.json``, read by hand as in test_compat) ---------------

DATE_TIME_OR_NULL = _types("string", "null")
WORKFLOW = Shape("Workflow", {
    **{k: STRING_OR_NULL for k in [
        "workflowName", "workflowClass", "workflowConfig", "user", "assumedRole", "roles", "input", "output", "error",
        "queueName", "appVersion", "executorId", "deduplicationId", "queuePartitionKey", "forkedFrom",
        "parentWorkflowId", "attributes", "scheduleName", "applicationName", "deadline", "dequeuedAt",
        "delayUntil", "completedAt"]},
    "workflowId": STRING, "status": STRING, "createdAt": STRING, "updatedAt": STRING, "timeoutMs": INTEGER_OR_NULL,
    "priority": INTEGER, "wasForkedFrom": BOOLEAN,
}, frozenset({"workflowId", "status", "workflowName", "workflowClass", "workflowConfig", "user", "assumedRole",
              "roles", "input", "output", "error", "createdAt", "updatedAt", "queueName", "appVersion", "executorId",
              "timeoutMs", "deadline", "deduplicationId", "priority", "queuePartitionKey", "forkedFrom",
              "wasForkedFrom", "parentWorkflowId", "dequeuedAt", "delayUntil", "completedAt", "attributes",
              "scheduleName", "applicationName"}), date_times=frozenset({"createdAt", "updatedAt"}))
SHAPES = {s.name: s for s in [
    WORKFLOW,
    Shape("Step", {"stepId": INTEGER, "stepName": STRING, "output": STRING_OR_NULL, "error": STRING_OR_NULL,
                   "childWorkflowId": STRING_OR_NULL, "startedAt": STRING_OR_NULL, "completedAt": STRING_OR_NULL},
          frozenset({"stepId", "stepName", "output", "error", "childWorkflowId", "startedAt", "completedAt"})),
    Shape("Event", {"key": STRING, "value": STRING}, frozenset({"key", "value"})),
    Shape("Notification", {"topic": STRING_OR_NULL, "message": STRING, "createdAt": STRING, "consumed": BOOLEAN},
          frozenset({"topic", "message", "createdAt", "consumed"}), date_times=frozenset({"createdAt"})),
    Shape("StreamEntry", {"key": STRING, "values": ARRAY}, frozenset({"key", "values"})),
    Shape("Queue", {"name": STRING, "concurrency": INTEGER_OR_NULL, "workerConcurrency": INTEGER_OR_NULL,
                    "rateLimitMax": INTEGER_OR_NULL, "rateLimitPeriodSecs": _types("number", "integer", "null"),
                    "priorityEnabled": BOOLEAN, "partitionQueue": BOOLEAN,
                    "pollingIntervalSecs": _types("number", "integer"), "applicationName": STRING_OR_NULL},
          frozenset({"name", "concurrency", "workerConcurrency", "rateLimitMax", "rateLimitPeriodSecs",
                     "priorityEnabled", "partitionQueue", "pollingIntervalSecs", "applicationName"})),
    Shape("Schedule", {"scheduleId": STRING, "scheduleName": STRING, "workflowName": STRING,
                       "workflowClass": STRING_OR_NULL, "cronExpression": STRING, "status": STRING,
                       "context": STRING_OR_NULL, "lastFiredAt": DATE_TIME_OR_NULL, "automaticBackfill": BOOLEAN,
                       "cronTimezone": STRING_OR_NULL, "applicationName": STRING_OR_NULL},
          frozenset({"scheduleId", "scheduleName", "workflowName", "workflowClass", "cronExpression", "status",
                     "context", "lastFiredAt", "automaticBackfill", "cronTimezone", "applicationName"})),
    Shape("ApplicationVersion", {"versionId": STRING, "versionName": STRING, "versionTimestamp": STRING,
                                 "createdAt": STRING},
          frozenset({"versionId", "versionName", "versionTimestamp", "createdAt"}),
          date_times=frozenset({"versionTimestamp", "createdAt"})),
    Shape("Metric", {"appId": STRING, "metricType": STRING, "metricName": STRING, "granularity": INTEGER,
                     "timeBucket": STRING, "value": INTEGER},
          frozenset({"appId", "metricType", "metricName", "granularity", "timeBucket", "value"}),
          date_times=frozenset({"timeBucket"})),
    Shape("WorkflowAggregate", {"group": _types(OBJ), "count": INTEGER, "maxQueueWaitMs": INTEGER,
                                "maxTotalLatencyMs": INTEGER, "minCreatedAt": STRING}, frozenset({"group"}),
          date_times=frozenset({"minCreatedAt"})),
    Shape("StepAggregate", {"group": _types(OBJ), "count": INTEGER, "maxDurationMs": INTEGER}, frozenset({"group"})),
    Shape("WorkflowIdBody", {"workflowId": STRING}, frozenset({"workflowId"})),
    Shape("WorkflowIdsBody", {"workflowIds": ARRAY}, frozenset({"workflowIds"})),
    Shape("ExportWorkflowOutputBody", {"serializedWorkflow": STRING}, frozenset({"serializedWorkflow"})),
]}


def upstream(response: httpx.Response, status: int, shape: str, *, listed: bool = False) -> Any:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    for item in body if listed else [body]:
        errors = conformance_errors(item, SHAPES[shape])
        assert not errors, errors
    return body


# -- every operation: request sent, response mapped ----------------------------------------------------------------


async def test_list_workflows_pages_without_inputs_by_default(env: Env) -> None:
    body = upstream(await env.client.get(f"{BASE}/workflows"), 200, "Workflow", listed=True)
    assert [w["workflowId"] for w in body] == ["w-1", "w-2"]
    assert body[0]["createdAt"] == "2025-03-01T12:00:00.123000Z" and body[0]["timeoutMs"] == 60000
    sent = env.fake.last
    assert (sent.org, sent.app, sent.kind, sent.pick, sent.version) == (ORG, APP, "list_workflows", Pick.ANY, None)
    assert sent.fields == {"body": {"limit": 100, "offset": 0, "sort_desc": False, "load_input": False,
                                    "load_output": False}}
    await env.client.get(f"{BASE}/workflows", params={
        "status": "PENDING", "workflowName": "work", "limit": 1000, "offset": 5, "sortDesc": "true",
        "loadInput": "true", "loadOutput": "true"})
    assert env.fake.last.fields == {"body": {"status": "PENDING", "workflow_name": "work", "limit": 1000,
                                             "offset": 5, "sort_desc": True, "load_input": True,
                                             "load_output": True}}


@pytest.mark.parametrize("params", [{"limit": 1001}, {"limit": 0}, {"offset": -1}, {"loadInput": "maybe"}])
async def test_list_workflows_refuses_out_of_bounds_pages(env: Env, params: dict[str, Any]) -> None:
    assert_problem(await env.client.get(f"{BASE}/workflows", params=params), 422)
    assert env.fake.sent == []


async def test_search_workflows(env: Env) -> None:
    body = upstream(await env.client.post(f"{BASE}/workflows/search", json={
        "workflowIds": ["a", "b"], "status": ["ENQUEUED"], "queuesOnly": True, "startTime": "2025-03-01T13:00:00+01:00",
        "limit": 10, "loadOutput": True}), 200, "Workflow", listed=True)
    assert [w["workflowId"] for w in body] == ["a", "b"]
    assert env.fake.last.fields["body"] == {
        "workflow_uuids": ["a", "b"], "status": ["ENQUEUED"], "queues_only": True,
        "start_time": "2025-03-01T12:00:00+00:00", "limit": 10, "offset": 0, "sort_desc": False,
        "load_input": False, "load_output": True}
    upstream(await env.client.post(f"{BASE}/workflows/search"), 200, "Workflow", listed=True)  # the body is optional
    assert env.fake.last.fields["body"]["limit"] == 100
    assert_problem(await env.client.post(f"{BASE}/workflows/search", json={"limit": 5000}), 422)


async def test_get_workflow_and_its_parts(env: Env) -> None:
    w = upstream(await env.client.get(f"{BASE}/workflows/w-9"), 200, "Workflow")
    assert (w["workflowId"], w["input"], w["output"]) == ("w-9", "[1]", "2")
    assert env.fake.last.fields == {"workflow_id": "w-9", "load_input": True, "load_output": True}
    steps = upstream(await env.client.get(f"{BASE}/workflows/w-9/steps", params={"limit": 5, "offset": 1}), 200,
                     "Step", listed=True)
    assert steps == [{"stepId": 1, "stepName": "step", "output": "1", "error": None, "childWorkflowId": None,
                      "startedAt": "2025-03-01T12:00:00.123000Z", "completedAt": "2025-03-01T12:00:00.123000Z"}]
    assert env.fake.last.fields == {"workflow_id": "w-9", "load_output": True, "limit": 5, "offset": 1}
    assert upstream(await env.client.get(f"{BASE}/workflows/w-9/events"), 200, "Event", listed=True) \
        == [{"key": "k", "value": "v"}]
    notes = upstream(await env.client.get(f"{BASE}/workflows/w-9/notifications"), 200, "Notification", listed=True)
    assert notes[0]["createdAt"] == "2025-03-01T12:00:00.123000Z"
    assert upstream(await env.client.get(f"{BASE}/workflows/w-9/streams"), 200, "StreamEntry", listed=True) \
        == [{"key": "s", "values": ["a", "b"]}]
    assert [s.kind for s in env.fake.sent] == ["get_workflow", "list_steps", "get_workflow_events",
                                               "get_workflow_notifications", "get_workflow_streams"]
    assert all(s.pick is Pick.ANY and s.fields["workflow_id"] == "w-9" for s in env.fake.sent)


async def test_a_workflow_the_executor_does_not_know_is_404(env: Env) -> None:
    env.fake.replies["get_workflow"] = lambda f: {"output": None}
    assert "w-404" in assert_problem(await env.client.get(f"{BASE}/workflows/w-404"), 404)["detail"]
    env.fake.replies["export_workflow"] = lambda f: {"serialized_workflow": None}
    assert_problem(await env.client.get(f"{BASE}/workflows/w-404/export"), 404)
    env.fake.replies["list_steps"] = lambda f: {"output": None}
    assert_problem(await env.client.get(f"{BASE}/workflows/w-404/steps"), 404)


async def test_export(env: Env) -> None:
    body = upstream(await env.client.get(f"{BASE}/workflows/w-1/export", params={"exportChildren": "true"}), 200,
                    "ExportWorkflowOutputBody")
    assert body == {"serializedWorkflow": "H4sIAAAA"}
    assert env.fake.last.fields == {"workflow_id": "w-1", "export_children": True}


async def test_aggregates(env: Env) -> None:
    rows = upstream(await env.client.post(f"{BASE}/workflows/aggregates", json={
        "groupByStatus": True, "selectCount": True, "workflowName": ["work"], "timeBucketSizeMs": 60000}), 200,
        "WorkflowAggregate", listed=True)
    assert rows == [{"group": {"status": "SUCCESS", "name": None}, "count": 3}]  # unselected values left out
    sent = env.fake.last.fields["body"]
    assert sent["group_by_status"] and sent["select_count"] and not sent["group_by_name"]
    assert (sent["name"], sent["time_bucket_size_ms"]) == (["work"], 60000)
    steps = upstream(await env.client.post(f"{BASE}/steps/aggregates", json={"groupByFunctionName": True}), 200,
                     "StepAggregate", listed=True)
    assert steps == [{"group": {"function_name": "step"}, "count": 2, "maxDurationMs": 15}]
    assert env.fake.last.kind == "get_step_aggregates"
    assert_problem(await env.client.post(f"{BASE}/workflows/aggregates", json={"selectCount": True}), 422)


async def test_queues(env: Env) -> None:
    queues = upstream(await env.client.get(f"{BASE}/queues"), 200, "Queue", listed=True)
    assert queues[0] == {"name": "q", "concurrency": 1, "workerConcurrency": None, "rateLimitMax": None,
                         "rateLimitPeriodSecs": None, "priorityEnabled": True, "partitionQueue": False,
                         "pollingIntervalSecs": 1.0, "applicationName": "orders"}
    assert (env.fake.last.kind, env.fake.last.fields) == ("list_queues", {"body": {}})
    assert upstream(await env.client.get(f"{BASE}/queues/q2"), 200, "Queue")["name"] == "q2"
    assert (env.fake.last.kind, env.fake.last.fields) == ("get_queue", {"name": "q2"})
    env.fake.replies["get_queue"] = lambda f: {"output": None}
    assert_problem(await env.client.get(f"{BASE}/queues/none"), 404)


async def test_schedules(env: Env) -> None:
    schedules = upstream(await env.client.get(f"{BASE}/schedules", params={"status": "ACTIVE", "loadContext": "false"}),
                         200, "Schedule", listed=True)
    assert schedules[0]["cronExpression"] == "0 0 * * *"
    assert schedules[0]["lastFiredAt"] == "2025-03-01T12:00:00.123000Z"
    assert env.fake.last.fields == {"body": {"status": "ACTIVE", "load_context": False}}
    assert upstream(await env.client.get(f"{BASE}/schedules/daily"), 200, "Schedule")["scheduleName"] == "daily"
    env.fake.replies["get_schedule"] = lambda f: {"output": None}
    assert_problem(await env.client.get(f"{BASE}/schedules/none"), 404)
    del env.fake.replies["get_schedule"]  # back to a schedule of every name
    for action in ("pause", "resume"):
        response = await env.client.post(f"{BASE}/schedules/nightly/{action}")
        assert response.status_code == 204 and response.content == b""
        assert (env.fake.last.kind, env.fake.last.fields) == (f"{action}_schedule", {"schedule_name": "nightly"})
    trigger = upstream(await env.client.post(f"{BASE}/schedules/nightly/trigger"), 201, "WorkflowIdBody")
    assert trigger == {"workflowId": "sched-run-1"}
    backfill = upstream(await env.client.post(f"{BASE}/schedules/nightly/backfill", json={
        "startTime": "2025-03-01T00:00:00Z", "endTime": "2025-03-01T02:00:00+01:00"}), 200, "WorkflowIdsBody")
    assert backfill == {"workflowIds": ["b-1", "b-2"]}
    assert env.fake.last.fields == {"schedule_name": "nightly", "start": "2025-03-01T00:00:00+00:00",
                                    "end": "2025-03-01T01:00:00+00:00"}
    assert_problem(await env.client.post(f"{BASE}/schedules/nightly/backfill", json={"startTime": "x"}), 422)
    operations = [row.operation for row in env.api.store.list_audit(ORG, app=APP, limit=4)]
    assert operations == ["schedule.backfill", "schedule.trigger", "schedule.resume", "schedule.pause"]


async def test_a_fork_under_an_existing_id_is_a_409_and_nothing_is_sent(env: Env) -> None:
    """The SDKs refuse to make a second workflow under an id with an error (a 502 that blamed the executor)."""
    problem = assert_problem(await env.client.post(f"{BASE}/workflows/w-1/fork", json={"newWorkflowId": "w-2"}), 409)
    assert problem["detail"] == "workflow 'w-2' already exists: give the fork another newWorkflowId"
    # One look naming both: w-1 there (or 404), w-2 there too (so 409); no fork sent.
    assert [(sent.kind, sent.fields["body"]["workflow_uuids"]) for sent in env.fake.sent] == \
        [("list_workflows", ["w-1", "w-2"])]
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert (row.operation, row.status) == ("workflow.fork", "failure")


async def test_an_unknown_schedule_is_a_404_and_nothing_is_sent(env: Env) -> None:
    """The SDKs answer a trigger or a backfill of an unknown schedule with an error (a 502 that blamed the executor)
    and a pause or a resume with success: Relay looks it up first, as it does workflow ids."""
    env.fake.replies["get_schedule"] = lambda f: {"output": None}
    for action, body in (("pause", None), ("resume", None), ("trigger", None),
                         ("backfill", {"startTime": "2025-03-01T00:00:00Z", "endTime": "2025-03-01T02:00:00Z"})):
        problem = assert_problem(await env.client.post(f"{BASE}/schedules/gone/{action}", json=body), 404)
        assert problem["detail"] == "schedule 'gone' not found"
        assert (env.fake.last.kind, env.fake.last.fields) == ("get_schedule", {"schedule_name": "gone"})
    rows = env.api.store.list_audit(ORG, app=APP, limit=4)
    assert [(r.operation, r.status) for r in rows] == [(f"schedule.{a}", "failure")
                                                       for a in ("backfill", "trigger", "resume", "pause")]


async def test_versions_and_metrics(env: Env) -> None:
    versions = upstream(await env.client.get(f"{BASE}/versions"), 200, "ApplicationVersion", listed=True)
    assert versions == [{"versionId": "id-1", "versionName": "v1", "versionTimestamp": "2025-03-01T12:00:00.123000Z",
                         "createdAt": "2025-03-01T12:00:00Z"}]
    response = await env.client.patch(f"{BASE}/versions/latest", json={"versionName": "v2"})
    assert response.status_code == 204
    assert (env.fake.last.kind, env.fake.last.fields) == ("set_latest_application_version", {"version_name": "v2"})
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert (row.operation, row.executor_id, row.details) == (
        "version.set_latest", EXECUTOR, {"versionName": "v2", "outcome": "success"})
    metrics = upstream(await env.client.get(f"{BASE}/metrics", params={
        "startTime": "2025-03-01T00:00:00Z", "endTime": "2025-03-01T01:00:00Z"}), 200, "Metric", listed=True)
    app_id = env.api.store.get_app(ORG, APP).id
    assert metrics == [{"appId": app_id, "metricType": "workflow_count", "metricName": "work", "granularity": 3600,
                        "timeBucket": "2025-03-01T00:00:00Z", "value": 7}]
    assert env.fake.last.fields == {"start_time": "2025-03-01T00:00:00+00:00", "end_time": "2025-03-01T01:00:00+00:00",
                                    "metric_class": "workflow_step_count"}
    assert_problem(await env.client.get(f"{BASE}/metrics", params={"startTime": "2025-03-01T00:00:00Z"}), 422)


# -- mutations: pick, audit ------------------------------------------------------------------------------------------


async def test_cancel_delete_resume_are_audited_with_their_executor(env: Env) -> None:
    assert (await env.client.post(f"{BASE}/workflows/w-1/cancel", json={"cancelChildren": True})).status_code == 204
    assert (env.fake.last.kind, env.fake.last.fields, env.fake.last.pick) == (
        "cancel", {"workflow_id": "w-1", "cancel_children": True}, Pick.ANY)
    assert (await env.client.post(f"{BASE}/workflows/w-1/cancel")).status_code == 204  # the body is optional
    assert (await env.client.delete(f"{BASE}/workflows/w-1", params={"deleteChildren": "true"})).status_code == 204
    assert env.fake.last.fields == {"workflow_id": "w-1", "delete_children": True}
    assert (await env.client.post(f"{BASE}/workflows/w-1/resume", json={"queueName": "q"})).status_code == 204
    assert (env.fake.last.kind, env.fake.last.fields, env.fake.last.pick, env.fake.last.version) == (
        "resume", {"workflow_id": "w-1", "queue_name": "q"}, Pick.LATEST, None)
    rows = env.api.store.list_audit(ORG, app=APP, limit=4)
    assert [r.operation for r in rows] == ["workflow.resume", "workflow.delete", "workflow.cancel", "workflow.cancel"]
    assert all(r.executor_id == EXECUTOR and r.status == "success" and r.source_ip for r in rows)
    assert rows[3].details == {"workflowId": "w-1", "cancelChildren": True, "outcome": "success"}
    key_id = env.api.store.authenticate(env.api.key).key_id
    assert all(r.subject.endswith(key_id) for r in rows)


async def test_fork_goes_to_the_named_or_latest_version(env: Env) -> None:
    env.fake.replies["list_workflows"] = lambda f: {"output": [sdk_workflow(i) for i in _ids(f) if i == "w-1"]}
    body = upstream(await env.client.post(f"{BASE}/workflows/w-1/fork", json={
        "startStep": 3, "newWorkflowId": "w-1-b", "appVersion": "v2", "queueName": "q"}), 201, "WorkflowIdBody")
    assert body == {"workflowId": "w-1-b"}
    sent = env.fake.last
    assert (sent.kind, sent.pick, sent.version) == ("fork_workflow", Pick.LATEST, "v2")
    assert sent.fields == {"body": {"workflow_id": "w-1", "start_step": 3, "application_version": "v2",
                                    "new_workflow_id": "w-1-b", "queue_name": "q", "queue_partition_key": None}}
    assert upstream(await env.client.post(f"{BASE}/workflows/w-1/fork"), 201, "WorkflowIdBody") \
        == {"workflowId": "forked-1"}
    assert (env.fake.last.pick, env.fake.last.version, env.fake.last.fields["body"]["start_step"]) \
        == (Pick.LATEST, None, 1)
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert row.operation == "workflow.fork" and row.details is not None
    assert row.details["newWorkflowId"] == "forked-1"


async def test_import_needs_an_org_wide_key_and_is_audited_with_its_hash(env: Env) -> None:
    payload = "H4sIAAAA" * 10
    response = await env.client.post(f"{BASE}/workflows/import", json={"serializedWorkflow": payload})
    assert response.status_code == 201 and response.content == b""
    assert (env.fake.last.kind, env.fake.last.fields) == ("import_workflow", {"serialized_workflow": payload})
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert row.operation == "workflow.import"
    assert row.details == {"sha256": hashlib.sha256(payload.encode()).hexdigest(), "sizeBytes": len(payload),
                           "outcome": "success"}
    restricted = env.api.new_key(apps=[APP])
    async with env.api.client(restricted) as client:
        assert_problem(await client.post(f"{BASE}/workflows/import", json={"serializedWorkflow": payload}), 403)
        upstream(await client.get(f"{BASE}/workflows"), 200, "Workflow", listed=True)  # reads are allowed
    assert_problem(await env.client.post(f"{BASE}/workflows/import", json={"serializedWorkflow": ""}), 422)
    # Not an export (every SDK's is base64 of gzip data): refused here, not sent for the executor to fail on.
    for wrong, said in [("not base64!", "not base64"), ("eyJ3b3JrZmxvdyI6IHt9fQ==", "not gzip")]:
        problem = assert_problem(await env.client.post(f"{BASE}/workflows/import", json={"serializedWorkflow": wrong}),
                                 422)
        assert said in str(problem), problem
    assert env.fake.last.kind == "list_workflows"


# -- errors -----------------------------------------------------------------------------------------------------------


async def test_an_executor_error_is_a_502_naming_it(env: Env) -> None:
    traceback = "Exception encountered when cancelling workflow(s) ['w-1']: Traceback\n" + "x" * 5000 + "\nBoom"
    env.fake.replies["cancel"] = lambda f: {"success": False, "error_message": traceback}
    problem = assert_problem(await env.client.post(f"{BASE}/workflows/w-1/cancel"), 502)
    assert EXECUTOR in problem["detail"] and "Boom" in problem["detail"] and len(problem["detail"]) < 400
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert (row.operation, row.status, row.executor_id) == ("workflow.cancel", "failure", EXECUTOR)
    assert row.details is not None and "Boom" in row.details["outcome"]
    env.fake.replies["list_workflows"] = lambda f: {"output": [], "error_message": "database is locked"}
    assert "database is locked" in assert_problem(await env.client.get(f"{BASE}/workflows"), 502)["detail"]
    env.fake.replies["delete"] = lambda f: {"success": False}
    assert_problem(await env.client.delete(f"{BASE}/workflows/w-1"), 502)


async def test_a_reply_relay_cannot_read_is_a_502(env: Env) -> None:
    env.fake.replies["list_workflows"] = lambda f: {"output": [{"WorkflowUUID": "w", "CreatedAt": "yesterday"}]}
    assert "cannot read" in assert_problem(await env.client.get(f"{BASE}/workflows"), 502)["detail"]
    env.fake.replies["fork_workflow"] = lambda f: {"new_workflow_id": None}  # no id, and no error either
    assert EXECUTOR in assert_problem(await env.client.post(f"{BASE}/workflows/w-1/fork"), 502)["detail"]
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert (row.operation, row.status, row.executor_id) == ("workflow.fork", "failure", EXECUTOR)


async def test_metadata_only_mode_is_a_409(env: Env) -> None:
    env.fake.replies["export_workflow"] = lambda f: {
        "error_message": "MessageType.EXPORT_WORKFLOW is not allowed in conductor metadata-only mode"}
    problem = assert_problem(await env.client.get(f"{BASE}/workflows/w-1/export"), 409)
    assert "metadata-only" in problem["detail"]


@pytest.mark.parametrize(("error", "status"), [
    (NoExecutorError("no HEALTHY executor of app 'mgmt-app' is connected"), 503),
    (ExecutorsFailedError("every executor tried failed", tried=["a", "b"]), 502),
])
async def test_routing_errors_pass_through(env: Env, error: Exception, status: int) -> None:
    env.fake.fail = error
    assert_problem(await env.client.get(f"{BASE}/workflows/w-1"), status)
    problem = assert_problem(await env.client.post(f"{BASE}/workflows/w-1/cancel"), status)
    if status == 502:
        assert problem["errors"][0]["value"] == ["a", "b"]
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert (row.operation, row.status) == ("workflow.cancel", "failure")
    assert row.executor_id == ("b" if status == 502 else None)


async def test_unknown_app_and_foreign_keys(env: Env) -> None:
    assert_problem(await env.client.get(f"/v2/orgs/{ORG}/apps/no-such-app/workflows"), 404)
    other = env.api.new_key(apps=["other-app"])
    async with env.api.client(other) as client:
        assert_problem(await client.get(f"{BASE}/workflows"), 403)
    async with env.api.anonymous() as anonymous:
        assert_problem(await anonymous.get(f"{BASE}/workflows"), 401)
    assert env.fake.sent == []


# -- unknown workflow ids --------------------------------------------------------------------------------------------


def dbos_error(context: str, workflow_id: str) -> str:
    """An ``error_message`` as dbos 3.2.0 builds it (``_report_exception``): the context, then the whole traceback of
    the ``DBOSNonExistentWorkflowError`` it raised."""
    try:
        raise DBOSNonExistentWorkflowError("target", workflow_id)
    except DBOSNonExistentWorkflowError:
        return f"{context}: {traceback.format_exc()}"


def as_dbos_3_2_for(known: set[str]) -> dict[str, Reply]:
    """What dbos 3.2.0 answers about workflows of which only ``known`` exist (``dbos/_conductor/conductor.py``):
    nothing for an unknown id's steps, events, notifications and streams, null for ``get_workflow``, success for a
    cancel or a delete, and a traceback for a resume, a fork or an export."""
    def listing(f: Mapping[str, Any]) -> dict[str, Any]:
        return {"output": [sdk_workflow(i) for i in f["body"].get("workflow_uuids") or [] if i in known]}

    def either(found: Reply, unknown: Reply) -> Reply:
        def reply(f: Mapping[str, Any]) -> dict[str, Any]:
            ids = f.get("workflow_ids") or [f.get("workflow_id") or f.get("body", {}).get("workflow_id")]
            return found(f) if set(ids) <= known else unknown(f)
        return reply

    def fails(context: str) -> Reply:
        return lambda f: {"success": False, "error_message": dbos_error(context, str(f.get("workflow_id")))}

    return {
        "list_workflows": listing,
        "get_workflow": either(PLAUSIBLE["get_workflow"], lambda f: {"output": None}),
        "list_steps": either(PLAUSIBLE["list_steps"], lambda f: {"output": []}),
        "get_workflow_events": either(PLAUSIBLE["get_workflow_events"], lambda f: {"events": []}),
        "get_workflow_notifications": either(PLAUSIBLE["get_workflow_notifications"],
                                             lambda f: {"notifications": []}),
        "get_workflow_streams": either(PLAUSIBLE["get_workflow_streams"], lambda f: {"streams": []}),
        "export_workflow": either(PLAUSIBLE["export_workflow"], lambda f: {
            "serialized_workflow": None, "error_message": dbos_error("Exception encountered when exporting workflow",
                                                                     str(f["workflow_id"]))}),
        "cancel": lambda f: {"success": True},
        "delete": lambda f: {"success": True},
        "resume": either(PLAUSIBLE["resume"],
                         fails("Exception encountered when resuming workflow(s) ['nosuch']")),
        "fork_workflow": either(PLAUSIBLE["fork_workflow"], lambda f: {
            "new_workflow_id": None, "error_message": dbos_error("Exception encountered when forking workflow nosuch",
                                                                 "nosuch")}),
    }


UNKNOWN_ID_REQUESTS = [
    ("GET", "/workflows/nosuch"), ("GET", "/workflows/nosuch/steps"), ("GET", "/workflows/nosuch/events"),
    ("GET", "/workflows/nosuch/notifications"), ("GET", "/workflows/nosuch/streams"),
    ("GET", "/workflows/nosuch/export"), ("POST", "/workflows/nosuch/cancel"), ("POST", "/workflows/nosuch/resume"),
    ("DELETE", "/workflows/nosuch"), ("POST", "/workflows/nosuch/fork"),
]


@pytest.mark.parametrize(("method", "path"), UNKNOWN_ID_REQUESTS)
async def test_an_unknown_workflow_id_is_a_404_everywhere(env: Env, method: str, path: str) -> None:
    env.fake.replies.update(as_dbos_3_2_for({"w-1"}))
    problem = assert_problem(await env.client.request(method, f"{BASE}{path}"), 404)
    assert problem["detail"] == "workflow 'nosuch' not found"
    if method != "GET":  # a mutation: only the look, nothing sent to change anything; audited as a failure
        assert [s.kind for s in env.fake.sent] == ["list_workflows"]
        assert env.fake.last.fields["body"]["workflow_uuids"] == ["nosuch"]
        row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
        assert row.status == "failure" and row.details is not None and "not found" in row.details["outcome"]


async def test_a_known_workflow_with_nothing_to_list_is_an_empty_list(env: Env) -> None:
    env.fake.replies.update(as_dbos_3_2_for({"w-1"}))
    env.fake.replies["list_steps"] = lambda f: {"output": []}
    assert (await env.client.get(f"{BASE}/workflows/w-1/steps")).json() == []
    assert [s.kind for s in env.fake.sent] == ["list_steps", "list_workflows"]  # looked, and it exists
    assert upstream(await env.client.get(f"{BASE}/workflows/w-1/events"), 200, "Event", listed=True)
    assert (await env.client.post(f"{BASE}/workflows/w-1/cancel")).status_code == 204
    assert [s.kind for s in env.fake.sent][-2:] == ["list_workflows", "cancel"]


@pytest.mark.parametrize("argv", [["cancel", "nosuch"], ["steps", "nosuch"], ["resume", "nosuch"],
                                  ["fork", "nosuch"], ["get", "nosuch"], ["delete", "nosuch", "w-1"]])
async def test_the_cli_says_an_unknown_workflow_is_not_found(env: Env, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str],
                                                             argv: list[str]) -> None:
    """`relay workflows ...` against this REST app: exit 1 with the problem's detail, never "cancelled nosuch" or
    an empty table."""
    env.fake.replies.update(as_dbos_3_2_for({"w-1"}))

    loop = asyncio.get_running_loop()

    def init(self: common.Api, url: str, key: str, org: str, *, timeout: float = 10.0) -> None:
        self.url, self.org = url, org
        self._client = httpx.Client(base_url=url, transport=LoopASGITransport(env.api.app, loop),
                                    headers={"Authorization": f"Bearer {key}"})

    monkeypatch.setattr(common.Api, "__init__", init)
    args = cli_parser().parse_args(["workflows", *argv, "--app", APP, "--url", BASE_URL, "--api-key", env.api.key])
    with pytest.raises(SystemExit) as failed:
        await asyncio.to_thread(admin.run, args, Settings())
    assert failed.value.code == ("relay: 1 of the 2 workflows not found, so none was changed: 'nosuch'"
                                 if len(argv) > 2 else "relay: workflow 'nosuch' not found")
    assert capsys.readouterr().out == ""


async def test_bulk_operations_naming_an_unknown_id_change_nothing(env: Env) -> None:
    env.fake.replies.update(as_dbos_3_2_for({"a", "b"}))
    for path, options in [("bulk-cancel", {}), ("bulk-resume", {}), ("bulk-delete", {}),
                          ("bulk-fork-from-failure", {"fromLastFailure": True})]:
        env.fake.sent.clear()
        problem = assert_problem(await env.client.post(f"{BASE}/workflows/{path}", json={
            "workflowIds": ["a", "nosuch", "b", "gone"], **options}), 404)
        assert problem["detail"] == "2 of the 4 workflows not found, so none was changed: 'nosuch', 'gone'"
        assert [s.kind for s in env.fake.sent] == ["list_workflows"]
    assert (await env.client.post(f"{BASE}/workflows/bulk-cancel", json={"workflowIds": ["a", "b"]})).status_code \
        == 204


async def test_no_problem_carries_an_executors_traceback(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """A known workflow whose resume fails on the executor: a 502 that quotes the exception, never the traceback,
    which goes to the gateway's log."""
    error = dbos_error("Exception encountered when resuming workflow(s) ['w-1']", "w-1")
    env.fake.replies["resume"] = lambda f: {"success": False, "error_message": error}
    env.fake.replies["export_workflow"] = lambda f: {"serialized_workflow": None, "error_message": error}
    with caplog.at_level("WARNING", logger="relay.gateway"):
        for response in [await env.client.post(f"{BASE}/workflows/w-1/resume"),
                         await env.client.get(f"{BASE}/workflows/w-1/export")]:
            detail = assert_problem(response, 502)["detail"]
            assert "Traceback" not in detail and 'File "' not in detail, detail
            assert detail.endswith("Exception encountered when resuming workflow(s) ['w-1']; dbos._error.DBOSNon"
                                   "ExistentWorkflowError: DBOS Error 5: Non-existent target workflow ID: w-1"), detail
    assert any("Traceback (most recent call last)" in r.getMessage() for r in caplog.records)
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert row.details is not None and "Traceback" not in row.details["outcome"]


# -- bulk ----------------------------------------------------------------------------------------------------------


async def test_bulk_operations_send_one_request_naming_every_id(env: Env) -> None:
    ids = ["a", "b", "a", "c"]
    cases: list[tuple[str, str, dict[str, Any], Pick]] = [
        ("bulk-cancel", "cancel", {"cancel_children": False}, Pick.ANY),
        ("bulk-resume", "resume", {"queue_name": None}, Pick.LATEST),
        ("bulk-delete", "delete", {"delete_children": False}, Pick.ANY),
    ]
    for path, kind, extra, pick in cases:
        response = await env.client.post(f"{BASE}/workflows/{path}", json={"workflowIds": ids})
        assert response.status_code == 204, response.text
        assert (env.fake.last.kind, env.fake.last.pick) == (kind, pick)
        assert env.fake.last.fields == {"workflow_id": "a", "workflow_ids": ["a", "b", "c"], **extra}
    body = upstream(await env.client.post(f"{BASE}/workflows/bulk-fork-from-failure", json={
        "workflowIds": ["a", "b"], "fromLastFailure": True, "appVersion": "v3"}), 200, "WorkflowIdsBody")
    assert body == {"workflowIds": ["a-fork", "b-fork"]}
    assert (env.fake.last.pick, env.fake.last.version) == (Pick.LATEST, "v3")
    assert env.fake.last.fields["body"]["from_last_failure"] is True
    rows = env.api.store.list_audit(ORG, app=APP, limit=4)
    assert [r.operation for r in rows] == ["workflow.bulk_fork_from_failure", "workflow.bulk_delete",
                                           "workflow.bulk_resume", "workflow.bulk_cancel"]
    assert rows[0].details is not None and rows[0].details["forkedWorkflowIds"] == ["a-fork", "b-fork"]
    assert rows[3].details is not None and rows[3].details["workflowIds"] == ["a", "b", "c"]
    sent = len(env.fake.sent)
    assert (await env.client.post(f"{BASE}/workflows/bulk-cancel", json={"workflowIds": []})).status_code == 204
    assert len(env.fake.sent) == sent  # nothing to do, nothing sent


@pytest.fixture
def small_cap(env: Env) -> Iterator[int]:
    settings = env.api.gateway.settings
    original = settings.bulk_max_workflows
    settings.bulk_max_workflows = 3
    try:
        yield 3
    finally:
        settings.bulk_max_workflows = original


async def test_bulk_size_is_capped(env: Env, small_cap: int) -> None:
    problem = assert_problem(await env.client.post(f"{BASE}/workflows/bulk-cancel",
                                                   json={"workflowIds": ["a", "b", "c", "d"]}), 422)
    assert problem["errors"][0]["location"] == "body.workflowIds"
    problem = assert_problem(await env.client.post(f"{BASE}/workflows/bulk-fork-from-failure",
                                                   json={"workflowIds": ["a", "b", "c", "d"], "fromStep": 2}), 422)
    assert problem["errors"][0]["location"] == "body.workflowIds"
    assert env.fake.sent == []
    assert (await env.client.post(f"{BASE}/workflows/bulk-cancel",
                                  json={"workflowIds": ["a", "b", "c", "c"]})).status_code == 204


ONE_START = "give exactly one of fromLastFailure: true, fromLastStep: true, fromStep, fromStepName"


@pytest.mark.parametrize(("path", "body", "location", "message"), [
    ("bulk-fork-from-failure", {"workflowIds": ["a"]}, "body", f"{ONE_START}; none was given"),
    ("bulk-fork-from-failure", {"workflowIds": ["a"], "fromLastFailure": False, "fromLastStep": False}, "body",
     f"{ONE_START}; none was given"),
    ("bulk-fork-from-failure", {"workflowIds": ["a"], "fromLastStep": True, "fromStep": 2}, "body",
     f"{ONE_START}; fromLastStep and fromStep were given"),
    ("bulk-fork-from-failure", {"workflowIds": [], "fromLastFailure": True, "fromLastStep": True, "fromStep": 0,
                                "fromStepName": "s"}, "body",
     f"{ONE_START}; fromLastFailure, fromLastStep, fromStep and fromStepName were given"),
    ("bulk-fork-by-filter", {"status": ["ERROR"], "fork": {"appVersion": "v2"}}, "body.fork",
     f"{ONE_START}; none was given"),
    ("bulk-fork-by-filter", {"status": ["ERROR"], "dryRun": True, "fork": {"fromStep": 1, "fromStepName": "s"}},
     "body.fork", f"{ONE_START}; fromStep and fromStepName were given"),
    ("bulk-fork-by-filter", {"status": ["ERROR"]}, "body.fork", "Field required"),
])
async def test_a_fork_from_failure_needs_exactly_one_start(env: Env, path: str, body: dict[str, Any], location: str,
                                                           message: str) -> None:
    """Every SDK refuses a fork from failure with none, or more than one, of its four starts (dbos 3.2.0 with a
    ValueError, which came back as a 502): Relay refuses it, naming them, and sends nothing, audits nothing."""
    audited = len(env.api.store.list_audit(ORG, app=APP, limit=1000))
    problem = assert_problem(await env.client.post(f"{BASE}/workflows/{path}", json=body), 422)
    assert problem["detail"] == f"{location}: {message}"
    assert [(e["location"], e["message"].removeprefix("Value error, ")) for e in problem["errors"]] \
        == [(location, message)]
    assert env.fake.sent == []
    assert len(env.api.store.list_audit(ORG, app=APP, limit=1000)) == audited


async def test_a_fork_from_failure_sends_only_the_start_given(env: Env) -> None:
    """A false flag beside the one start is no second start (the SDKs count flags when true); a step number of 0
    is one. No null ``from_step`` or ``from_step_name`` is sent: TypeScript's SDK would count it as given."""
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"fromLastFailure": False, "fromStep": 0}, {"from_step": 0}),
        ({"fromLastFailure": True, "fromLastStep": False}, {"from_last_failure": True}),
        ({"fromStepName": "s"}, {"from_step_name": "s"})]
    for options, start in cases:
        upstream(await env.client.post(f"{BASE}/workflows/bulk-fork-from-failure",
                                       json={"workflowIds": ["a"], **options}), 200, "WorkflowIdsBody")
        sent = {k: v for k, v in env.fake.last.fields["body"].items() if k.startswith("from_")}
        assert sent == {"from_last_failure": False, "from_last_step": False, **start}, options


async def test_bulk_operations_are_rate_limited_per_app(env: Env) -> None:
    env.api.app.state.bulk_limiter = BulkLimiter(2)
    body = {"workflowIds": ["a"]}
    for _ in range(2):
        assert (await env.client.post(f"{BASE}/workflows/bulk-cancel", json=body)).status_code == 204
    assert_problem(await env.client.post(f"{BASE}/workflows/bulk-delete", json=body), 429)
    assert_problem(await env.client.post(f"{BASE}/workflows/bulk-cancel-by-filter",
                                         json={"status": ["PENDING"]}), 429)
    env.api.store.ensure_app(ORG, "mgmt-other")
    response = await env.client.post(f"/v2/orgs/{ORG}/apps/mgmt-other/workflows/bulk-cancel", json=body)
    assert response.status_code == 204  # another app has its own bucket


def test_the_bucket_refills_over_a_minute() -> None:
    limiter = BulkLimiter(30)
    assert all(limiter.take(("o", "a"), 0.0) for _ in range(30))
    assert not limiter.take(("o", "a"), 0.0)
    assert limiter.take(("o", "a"), 2.0)  # 30 a minute: one token every 2 s
    assert not limiter.take(("o", "a"), 2.5)


# -- Relay extension: bulk by filter ---------------------------------------------------------------------------------


async def test_bulk_by_filter_dry_run_counts_and_shows_the_first_ids(env: Env) -> None:
    many = [f"w-{i:03}" for i in range(25)]
    env.fake.replies["list_workflows"] = lambda f: {"output": [sdk_workflow(i) for i in many]}
    response = await env.client.post(f"{BASE}/workflows/bulk-cancel-by-filter", json={
        "status": ["PENDING"], "appVersion": ["v1"], "startTime": "2025-03-01T00:00:00Z", "dryRun": True})
    assert response.status_code == 200, response.text
    assert response.json() == {"dryRun": True, "count": 25, "firstIds": many[:20], "results": None}
    assert [s.kind for s in env.fake.sent] == ["list_workflows"]
    assert env.fake.last.fields == {"body": {
        "status": ["PENDING"], "application_version": ["v1"], "start_time": "2025-03-01T00:00:00+00:00",
        "limit": 1001, "offset": 0, "sort_desc": False, "load_input": False, "load_output": False}}


async def test_bulk_by_filter_applies_per_id_and_reports_each(env: Env) -> None:
    env.fake.replies["list_workflows"] = lambda f: {"output": [sdk_workflow(i) for i in ["a", "b", "c"]]}
    env.fake.replies["cancel"] = lambda f: (
        {"success": False, "error_message": "no such workflow"} if f["workflow_id"] == "b" else {"success": True})
    response = await env.client.post(f"{BASE}/workflows/bulk-cancel-by-filter",
                                     json={"queueName": ["q"], "cancelChildren": True})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["count"], body["dryRun"]) == (3, False)
    outcomes = {r["workflowId"]: r["outcome"] for r in body["results"]}
    assert outcomes == {"a": "success", "b": "failure", "c": "success"}
    assert "no such workflow" in next(r["error"] for r in body["results"] if r["workflowId"] == "b")
    # The candidates read with the key check serve the first request only (the list); each cancel reads afresh.
    assert [s.candidates is not None for s in env.fake.sent] == [True, False, False, False]
    cancels = [s for s in env.fake.sent if s.kind == "cancel"]
    assert sorted(s.fields["workflow_id"] for s in cancels) == ["a", "b", "c"]
    assert all(s.fields["cancel_children"] for s in cancels)
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert (row.operation, row.status) == ("workflow.bulk_cancel_by_filter", "failure")
    assert row.details is not None and (row.details["count"], row.details["failed"]) == (3, 1)
    assert row.details["filter"]["queueName"] == ["q"]


async def test_bulk_resume_and_fork_by_filter(env: Env) -> None:
    env.fake.replies["list_workflows"] = lambda f: {"output": [sdk_workflow("a")]}
    body = (await env.client.post(f"{BASE}/workflows/bulk-resume-by-filter",
                                  json={"status": ["CANCELLED"], "resumeQueueName": "q2"})).json()
    assert body["results"] == [{"workflowId": "a", "outcome": "success", "error": None, "forkedWorkflowId": None}]
    assert (env.fake.last.kind, env.fake.last.pick, env.fake.last.fields) == (
        "resume", Pick.LATEST, {"workflow_id": "a", "queue_name": "q2"})
    body = (await env.client.post(f"{BASE}/workflows/bulk-fork-by-filter", json={
        "status": ["ERROR"], "fork": {"fromLastFailure": True, "appVersion": "v2"}})).json()
    assert body["results"][0]["forkedWorkflowId"] == "a-fork"
    assert (env.fake.last.kind, env.fake.last.pick, env.fake.last.version) == ("fork_from_failure", Pick.LATEST, "v2")
    assert env.fake.last.fields["body"]["workflow_ids"] == ["a"]


async def test_bulk_by_filter_over_the_cap_is_refused(env: Env, small_cap: int) -> None:
    env.fake.replies["list_workflows"] = lambda f: {
        "output": [sdk_workflow(f"w-{i}") for i in range(f["body"]["limit"])]}
    problem = assert_problem(await env.client.post(f"{BASE}/workflows/bulk-cancel-by-filter",
                                                   json={"status": ["PENDING"]}), 422)
    assert "more than 3" in problem["errors"][0]["message"]
    assert env.fake.last.fields["body"]["limit"] == 4  # the cap + 1 tells an overflow
    assert [s.kind for s in env.fake.sent] == ["list_workflows"]


@pytest.mark.parametrize("body", [{}, {"dryRun": True}, {"status": []}, {"status": ["PENDING"], "nope": 1}])
async def test_bulk_by_filter_needs_a_filter(env: Env, body: dict[str, Any]) -> None:
    assert_problem(await env.client.post(f"{BASE}/workflows/bulk-cancel-by-filter", json=body), 422)
    assert env.fake.sent == []


# -- unsupported ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("GET", f"/v2/orgs/{ORG}"), ("PATCH", f"/v2/orgs/{ORG}"), ("GET", f"/v2/orgs/{ORG}/members"),
    ("DELETE", f"/v2/orgs/{ORG}/members/alice"), ("PUT", f"/v2/orgs/{ORG}/members/alice/roles/admin"),
    ("GET", f"/v2/orgs/{ORG}/roles"), ("POST", f"/v2/orgs/{ORG}/roles"), ("DELETE", f"/v2/orgs/{ORG}/roles/admin"),
    ("GET", f"/v2/orgs/{ORG}/permissions"), ("POST", f"/v2/orgs/{ORG}/secrets"), ("POST", f"/v2/orgs/{ORG}/join"),
    ("GET", f"/v2/orgs/{ORG}/domain-claims"), ("POST", f"/v2/orgs/{ORG}/domain-claims"),
    ("DELETE", f"/v2/orgs/{ORG}/domain-claims/example.com"), ("POST", "/v2/users"), ("GET", "/v2/users/me"),
])
async def test_org_user_and_role_operations_are_404(api: Api, method: str, path: str) -> None:
    async with api.anonymous() as client:
        problem = assert_problem(await client.request(method, path, json={}), 404)
    assert "Relay (self-hosted) has no" in problem["detail"]


async def test_any_json_string_is_carried_and_audited_storably(env: Env) -> None:
    """Workflow and queue names are any string, NUL included: carried to the executor as given, audited in a form
    every database stores."""
    odd = "q\u0000\u00e9"

    async def post(path: str, body: dict[str, str]) -> httpx.Response:  # json.dumps escapes what httpx cannot encode
        return await env.client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})

    assert (await post(f"{BASE}/workflows/w-1/resume", {"queueName": odd})).status_code == 204
    assert env.fake.last.fields["queue_name"] == odd
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert row.details is not None and row.details["queueName"] == "q\ufffd\u00e9"
    # pydantic refuses a lone surrogate in a string: a 422 that echoes it escaped, not a 500
    problem = assert_problem(await post(f"{BASE}/workflows/import", {"serializedWorkflow": "\ud800"}), 422)
    assert problem["errors"][0]["value"] == '"\\ud800"'


async def test_a_route_hands_the_candidates_it_read_with_the_key_check_to_the_request(env: Env) -> None:
    env.api.record(APP, "cand-1")
    try:
        assert (await env.client.get(f"{BASE}/workflows")).status_code == 200
        sent = env.fake.last.candidates
        assert sent is not None and "cand-1" in {e.executor_id for e in sent.executors}
        assert sent.busy == set()
    finally:
        env.api.store.delete_executor(org=ORG, app=APP, executor_id="cand-1", event_key=uuid.uuid4().hex, details={})
