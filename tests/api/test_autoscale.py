"""Autoscaling in-process (``conftest.Api``): the four upstream operations (getAutoscale, getAutoscalingPolicy,
setAutoscalingPolicy, deleteAutoscalingPolicy) against ``FakeManagement``, which answers as a dbos 3.2.0 executor
would and records each request (checked against what the SDK reads): the policy's queue checked, stored, echoed,
audited and deleted; the recommendation from the queue, the versions and the backlog (by aggregate, or by list pages
from an SDK that cannot aggregate); the spec against upstream's facts; and the gauge's rounds (``Refresher``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest

from api import conductor as c
from api.autoscaling import Refresher
from core import metrics
from core.errors import ExecutorsFailedError, ExecutorUnsupportedError, NoExecutorError
from core.store import Candidates
from gateway.management import Answer, Pick
from tests.api.conftest import ORG, Api
from tests.api.test_compat import (
    BOOLEAN,
    INTEGER,
    STRING,
    Shape,
    assert_problem,
    conformance_errors,
)
from tests.api.test_management import QUEUE, FakeManagement, install

APP = "scaled-app"
BASE = f"/v2/orgs/{ORG}/apps/{APP}"
V1 = {"version_id": "id-1", "version_name": "v1", "version_timestamp": 1740830400000, "created_at": 1740830400000}
V2 = {"version_id": "id-2", "version_name": "v2", "version_timestamp": 1740830500000, "created_at": 1740830500000}
V3 = {"version_id": "id-3", "version_name": "v3", "version_timestamp": 1740830300000, "created_at": 1740830300000}
WORK = {**QUEUE, "name": "work", "concurrency": None, "worker_concurrency": 2}

# Upstream's facts (``../shared/conductor-openapi.json``, read by hand as in test_compat).
ROLLOUT = Shape("RolloutPolicy", {"maxExecutorsForOldApplicationVersions": INTEGER,
                                  "maxOldApplicationVersions": INTEGER}, frozenset())
POLICY = Shape("AutoscalePolicy", {"queue": STRING, "rollout": ROLLOUT, "$schema": STRING}, frozenset({"queue"}))
POLICY_OUTPUT = Shape("PolicyOutputBody", {"policy": POLICY, "$schema": STRING}, frozenset({"policy"}))
QUEUE_AUTOSCALE = Shape("QueueAutoscale", {
    "applicationVersion": STRING, "desiredExecutors": INTEGER, "isLatest": BOOLEAN, "observedAt": INTEGER,
    "queueDepth": INTEGER, "queueName": STRING}, frozenset({
        "applicationVersion", "isLatest", "desiredExecutors", "queueDepth", "observedAt"}))
OPERATIONS = [("getAutoscale", "get", "/autoscale", "200"),
              ("getAutoscalingPolicy", "get", "/autoscaling-policy", "200"),
              ("setAutoscalingPolicy", "put", "/autoscaling-policy", "200"),
              ("deleteAutoscalingPolicy", "delete", "/autoscaling-policy", "204")]


@dataclass
class Fake(FakeManagement):
    """``FakeManagement``, and ``raising``: kinds that raise instead of answering."""

    raising: dict[str, Exception] = field(default_factory=dict)

    async def ask(self, org: str, app: str, kind: str, fields: Mapping[str, Any], *, pick: Pick = Pick.ANY,
                  version: str | None = None, timeout: timedelta | None = None,
                  candidates: Candidates | None = None) -> Answer:
        answer = await super().ask(org, app, kind, fields, pick=pick, version=version, timeout=timeout,
                                   candidates=candidates)
        if kind in self.raising:
            raise self.raising[kind]
        return answer

    def kinds(self) -> list[str]:
        return [s.kind for s in self.sent]


@dataclass
class Env:
    api: Api
    fake: Fake
    client: httpx.AsyncClient


def aggregates(counts: dict[str | None, int]) -> dict[str, Any]:
    """A dbos 3.2.0 ``get_workflow_aggregates`` reply grouped by application version."""
    return {"output": [{"group": {"application_version": v}, "count": n, "min_created_at": None,
                        "max_queue_wait_ms": None, "max_total_latency_ms": None} for v, n in counts.items()]}


@pytest.fixture
async def env(api: Api) -> AsyncIterator[Env]:
    api.store.ensure_app(ORG, APP)
    fake = Fake(replies={"get_queue": lambda f: {"output": {**WORK, "name": f["name"]}},
                         "list_application_versions": lambda f: {"output": [V1, V2, V3]},
                         "get_workflow_aggregates": lambda f: aggregates({"v2": 3, "v1": 5, None: 1})})
    original = install(api, fake)
    try:
        async with api.client() as client:
            yield Env(api, fake, client)
    finally:
        api.gateway.management = original
        api.store.delete_autoscaling_policy(ORG, APP, subject="test", source_ip="")
        metrics.DESIRED_EXECUTORS.remove(ORG, APP)


def _audited(env: Env, operation: str) -> list[Any]:
    return [e for e in env.api.store.list_audit(ORG, app=APP) if e.operation == operation]


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


# -- the spec --------------------------------------------------------------------------------------------------------


def test_the_spec_has_the_four_operations_with_upstreams_schemas() -> None:
    from api.openapi import spec

    served = spec()
    for operation_id, method, path, success in OPERATIONS:
        op = served["paths"][f"/v2/orgs/{{orgName}}/apps/{{appName}}{path}"][method]
        assert (op["operationId"], op["tags"]) == (operation_id, ["Queues"]) and success in op["responses"]
    schemas = served["components"]["schemas"]
    for shape in (ROLLOUT, POLICY, POLICY_OUTPUT, QUEUE_AUTOSCALE):
        schema = schemas[shape.name]
        assert set(schema.get("required", [])) == shape.required, shape.name
        assert set(schema["properties"]) <= set(shape.properties), shape.name
    assert schemas["AutoscalePolicy"]["additionalProperties"] is False
    assert schemas["RolloutPolicy"]["additionalProperties"] is False


# -- the policy ------------------------------------------------------------------------------------------------------


async def test_a_policy_is_checked_on_an_executor_stored_echoed_and_audited(env: Env) -> None:
    assert_problem(await env.client.get(f"{BASE}/autoscaling-policy"), 404)
    body = {"queue": "work", "rollout": {"maxOldApplicationVersions": 1}}
    echoed = _ok(await env.client.put(f"{BASE}/autoscaling-policy", json=body))
    assert echoed == {"policy": body}
    assert not conformance_errors(echoed, POLICY_OUTPUT)
    assert (env.fake.last.kind, env.fake.last.fields, env.fake.last.pick) == ("get_queue", {"name": "work"}, Pick.ANY)
    assert _ok(await env.client.get(f"{BASE}/autoscaling-policy")) == {"policy": body}
    row = env.api.store.list_audit(ORG, app=APP, limit=1)[0]
    assert (row.operation, row.status, row.details) == ("app.autoscaling_policy.set", "success", body)
    # Replaced whole; a rollout with no field set is no rollout; $schema is accepted and ignored.
    assert _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={
        "$schema": "https://example.test/AutoscalePolicy.json", "queue": "work", "rollout": {}})) == {
        "policy": {"queue": "work"}}
    capped = {"queue": "work", "rollout": {"maxOldApplicationVersions": 0, "maxExecutorsForOldApplicationVersions": 0}}
    assert _ok(await env.client.put(f"{BASE}/autoscaling-policy", json=capped)) == {"policy": capped}


@pytest.mark.parametrize(("queue", "says"), [
    (None, "does not exist"),
    ({**WORK, "partition_queue": True, "partition_concurrency": 1}, "is partitioned"),
    ({**WORK, "worker_concurrency": None, "concurrency": 1}, "has no worker_concurrency"),
], ids=["unknown", "partitioned", "no-worker-concurrency"])
async def test_a_queue_that_cannot_drive_a_policy_is_a_422_naming_why(env: Env, queue: dict[str, Any] | None,
                                                                      says: str) -> None:
    env.fake.replies["get_queue"] = lambda f: {"output": queue}
    audited = len(_audited(env, "app.autoscaling_policy.set"))
    problem = assert_problem(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work"}), 422)
    assert says in problem["detail"] and "'work'" in problem["detail"], problem
    assert [(e["location"], e["value"]) for e in problem["errors"]] == [("body.queue", "work")]
    assert_problem(await env.client.get(f"{BASE}/autoscaling-policy"), 404)  # nothing stored
    assert len(_audited(env, "app.autoscaling_policy.set")) == audited


@pytest.mark.parametrize("body", [
    {}, {"queue": 5}, {"queue": None}, {"queue": "work", "rollout": None}, {"queue": "work", "other": 1},
    {"queue": "work", "rollout": {"maxOldApplicationVersions": -1}},
    {"queue": "work", "rollout": {"maxOldApplicationVersions": "1"}},
    {"queue": "work", "rollout": {"maxOldApplicationVersions": None}},
    {"queue": "work", "rollout": {"maxExecutorsForOldApplicationVersions": 1.5}},
    {"queue": "work", "rollout": {"maxOldVersions": 1}},
])
async def test_a_malformed_policy_is_a_422_and_asks_no_executor(env: Env, body: dict[str, Any]) -> None:
    assert_problem(await env.client.put(f"{BASE}/autoscaling-policy", json=body), 422)
    assert env.fake.sent == []


@pytest.mark.parametrize(("error", "status"), [
    (NoExecutorError("no HEALTHY executor of app 'scaled-app' is connected"), 503),
    (ExecutorsFailedError("no executor answered", tried=["exec-1"]), 502),
    (ExecutorUnsupportedError("get_queue is not supported", executor_id="exec-1"), 501),
])
async def test_a_policy_that_no_executor_could_check_is_not_stored(env: Env, error: Exception, status: int) -> None:
    env.fake.fail = error
    assert_problem(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work"}), status)
    assert env.api.store.get_autoscaling_policy(ORG, APP) is None


async def test_deleting_a_policy_even_an_absent_one_succeeds_and_is_audited_once(env: Env) -> None:
    deletions = len(_audited(env, "app.autoscaling_policy.deleted"))
    _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work"}))
    metrics.DESIRED_EXECUTORS.put(ORG, APP, {"v2": 3})
    assert _ok(await env.client.delete(f"{BASE}/autoscaling-policy"), 204) is None
    assert (ORG, APP) not in metrics.DESIRED_EXECUTORS.apps()  # its series go with it
    assert_problem(await env.client.get(f"{BASE}/autoscaling-policy"), 404)
    assert_problem(await env.client.get(f"{BASE}/autoscale"), 404)
    assert _ok(await env.client.delete(f"{BASE}/autoscaling-policy"), 204) is None
    deleted = _audited(env, "app.autoscaling_policy.deleted")
    assert len(deleted) == deletions + 1 and deleted[0].details == {"queue": "work"}  # newest first


async def test_unknown_apps_foreign_keys_and_no_key(env: Env) -> None:
    other = f"/v2/orgs/{ORG}/apps/no-such-app"
    for method, path in [("GET", "/autoscale"), ("GET", "/autoscaling-policy"), ("DELETE", "/autoscaling-policy")]:
        assert_problem(await env.client.request(method, other + path), 404)
    assert_problem(await env.client.put(other + "/autoscaling-policy", json={"queue": "work"}), 404)
    restricted = env.api.new_key(apps=["another-app"])
    async with env.api.client(restricted) as client:
        assert_problem(await client.get(f"{BASE}/autoscaling-policy"), 403)
        assert_problem(await client.put(f"{BASE}/autoscaling-policy", json={"queue": "work"}), 403)
        assert_problem(await client.delete(f"{BASE}/autoscaling-policy"), 403)
        assert_problem(await client.get(f"{BASE}/autoscale"), 403)
    async with env.api.anonymous() as anonymous:
        assert_problem(await anonymous.get(f"{BASE}/autoscale"), 401)
    assert env.fake.sent == []


async def test_deleting_the_app_deletes_its_policy(env: Env) -> None:
    app = "scaled-gone"
    env.api.store.ensure_app(ORG, app)
    _ok(await env.client.put(f"/v2/orgs/{ORG}/apps/{app}/autoscaling-policy", json={"queue": "work"}))
    _ok(await env.client.delete(f"/v2/orgs/{ORG}/apps/{app}"), 204)
    env.api.store.ensure_app(ORG, app)
    assert env.api.store.get_autoscaling_policy(ORG, app) is None
    env.api.store.delete_app(ORG, app, subject="test", source_ip="", orphans=[], details={})


# -- the recommendation ------------------------------------------------------------------------------------------


async def test_the_recommendation_per_version_from_the_queues_backlog(env: Env) -> None:
    _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work",
                                                                 "rollout": {"maxOldApplicationVersions": 1}}))
    env.fake.sent.clear()
    before = int(time.time() * 1000)
    rows = _ok(await env.client.get(f"{BASE}/autoscale"))
    for row in rows:
        assert not conformance_errors(row, QUEUE_AUTOSCALE), row
        assert before <= row.pop("observedAt") <= int(time.time() * 1000)
    # v2 is the latest (newest version_timestamp): its 3, and the 1 enqueued without a version, over 2 a worker;
    # v1, the one old version with a backlog the rollout allows: 5 over 2; v3 is older and has none.
    assert rows == [
        {"applicationVersion": "v2", "isLatest": True, "queueDepth": 4, "desiredExecutors": 2, "queueName": "work"},
        {"applicationVersion": "v1", "isLatest": False, "queueDepth": 5, "desiredExecutors": 3, "queueName": "work"}]
    assert env.fake.kinds() == ["get_queue", "list_application_versions", "get_workflow_aggregates"]
    assert env.fake.last.fields == {"body": {"group_by_application_version": True, "select_count": True,
                                             "status": ["ENQUEUED", "PENDING"], "queue_name": ["work"]}}
    _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work", "rollout": {
        "maxOldApplicationVersions": 1, "maxExecutorsForOldApplicationVersions": 1}}))
    assert [(r["applicationVersion"], r["desiredExecutors"]) for r in _ok(await env.client.get(f"{BASE}/autoscale"))
            ] == [("v2", 2), ("v1", 1)]


async def test_a_queue_no_longer_usable_leaves_the_queue_name_out(env: Env) -> None:
    _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work"}))
    env.fake.replies["get_queue"] = lambda f: {"output": None}
    [row] = _ok(await env.client.get(f"{BASE}/autoscale"))
    assert "queueName" not in row and (row["applicationVersion"], row["queueDepth"], row["desiredExecutors"]) == (
        "v2", 4, 1)
    assert not conformance_errors(row, QUEUE_AUTOSCALE)


async def test_an_sdk_that_cannot_aggregate_has_its_backlog_counted_from_list_pages(env: Env) -> None:
    """Relay's client on dbos 3.4 answers aggregates ``unsupported``: the same filter is listed, a page at a time."""
    _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work"}))
    env.fake.raising["get_workflow_aggregates"] = ExecutorUnsupportedError("moved out", executor_id="exec-1")

    def page(f: Mapping[str, Any]) -> dict[str, Any]:
        offset = f["body"]["offset"]
        rows = c.MAX_PAGE if offset == 0 else 3
        return {"output": [{"WorkflowUUID": f"w-{offset + i}", "Status": "ENQUEUED", "WasForkedFrom": False,
                            "ApplicationVersion": "v2" if i % 2 else None} for i in range(rows)]}

    env.fake.replies["list_workflows"] = page
    env.fake.sent.clear()
    [row] = _ok(await env.client.get(f"{BASE}/autoscale"))
    assert (row["queueDepth"], row["desiredExecutors"]) == (c.MAX_PAGE + 3, (c.MAX_PAGE + 3 + 1) // 2)
    listed = [s.fields["body"] for s in env.fake.sent if s.kind == "list_workflows"]
    assert [b["offset"] for b in listed] == [0, c.MAX_PAGE]
    assert listed[0] == {"status": ["ENQUEUED", "PENDING"], "queue_name": "work", "limit": c.MAX_PAGE, "offset": 0,
                         "sort_desc": False, "load_input": False, "load_output": False}


async def test_without_versions_from_the_sdk_the_registrys_newest_executor_is_the_latest(env: Env) -> None:
    _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work"}))
    env.fake.replies["list_application_versions"] = lambda f: {"output": []}
    env.api.record(APP, "scaled-old", version="v1")
    env.api.record(APP, "scaled-new", version="v2")
    try:
        [row] = _ok(await env.client.get(f"{BASE}/autoscale"))
        assert (row["applicationVersion"], row["isLatest"], row["queueDepth"]) == ("v2", True, 4)
        env.fake.raising["list_application_versions"] = ExecutorUnsupportedError("moved", executor_id="exec-1")
        [row] = _ok(await env.client.get(f"{BASE}/autoscale"))
        assert (row["applicationVersion"], row["isLatest"], row["queueDepth"]) == ("v2", True, 4)
    finally:
        for executor_id in ("scaled-old", "scaled-new"):
            env.api.store.delete_executor(org=ORG, app=APP, executor_id=executor_id, event_key=f"gone-{executor_id}",
                                          details={})


async def test_no_executor_to_ask_is_a_503_and_an_executor_error_a_502(env: Env) -> None:
    _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work"}))
    env.fake.raising["get_workflow_aggregates"] = NoExecutorError("no HEALTHY executor")
    assert_problem(await env.client.get(f"{BASE}/autoscale"), 503)
    env.fake.raising.clear()
    env.fake.replies["get_workflow_aggregates"] = lambda f: {"error_message": "Exception encountered"}
    assert_problem(await env.client.get(f"{BASE}/autoscale"), 502)


# -- the gauge ----------------------------------------------------------------------------------------------------


async def test_a_round_exports_the_apps_with_a_policy_and_an_executor_here(env: Env) -> None:
    refresher = Refresher(env.api.gateway, timedelta(seconds=1))
    _ok(await env.client.put(f"{BASE}/autoscaling-policy", json={"queue": "work",
                                                                 "rollout": {"maxOldApplicationVersions": 1}}))
    await refresher.round()
    assert (ORG, APP) not in metrics.DESIRED_EXECUTORS.apps()  # no executor of the app on this gateway
    env.api.connect(APP, "scaled-exec")
    conn = env.api.gateway.hub.get(ORG, APP, "scaled-exec")
    try:
        await refresher.round()
        assert _series() == {"v2": 2, "v1": 3}
        env.fake.replies["get_workflow_aggregates"] = lambda f: aggregates({"v2": 9})
        await refresher.round()
        assert _series() == {"v2": 5}  # v1's backlog gone: its series too
        env.fake.fail = ExecutorsFailedError("no executor answered", tried=["exec-1"])
        await refresher.round()
        assert _series() == {"v2": 5}  # a failed round keeps the last values
        env.fake.fail = None
        env.api.store.delete_autoscaling_policy(ORG, APP, subject="test", source_ip="")
        await refresher.round()
        assert (ORG, APP) not in metrics.DESIRED_EXECUTORS.apps()
    finally:
        env.api.gateway.hub.detach(conn)


def _series() -> dict[str, float]:
    [family] = metrics.DESIRED_EXECUTORS.collect()
    return {s.labels["version"]: s.value for s in family.samples
            if (s.labels["org"], s.labels["app"]) == (ORG, APP)}


def test_the_shapes_are_read_right() -> None:
    assert conformance_errors({"applicationVersion": "v1", "isLatest": True, "desiredExecutors": 1,
                               "queueDepth": 0}, QUEUE_AUTOSCALE)  # observedAt missing
    assert conformance_errors({"policy": {"queue": 1}}, POLICY_OUTPUT)
    assert conformance_errors({"policy": {"queue": "q", "rollout": {"maxOldApplicationVersions": "1"}}},
                              POLICY_OUTPUT)
