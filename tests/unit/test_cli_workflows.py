"""What ``relay workflows|queues|schedules|versions`` send and print, without a server.

The REST API is a ``httpx.MockTransport`` that records each request and answers from a table of canned
responses (anything else is a 404 problem, so a wrong path fails). The expected requests are upstream
Conductor's (method, path, query parameter and body field names, as in its OpenAPI document), written out by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli import admin, common, workflows
from core.settings import Settings
from tests.cli_kit import parser
from tests.support import starts_processes

NOW = datetime(2026, 11, 30, 21, 43, 5, tzinfo=UTC)
APP = "/apps/orders"

WORKFLOW: dict[str, Any] = {
    "workflowId": "wf-1", "status": "PENDING", "workflowName": "checkout", "workflowClass": None,
    "workflowConfig": None, "user": "ana", "assumedRole": None, "roles": None, "input": None, "output": None,
    "error": None, "createdAt": "2026-11-30T21:40:05Z", "updatedAt": "2026-11-30T21:41:04.250Z",
    "queueName": "payments", "appVersion": "v7", "executorId": "ex-1", "timeoutMs": 90_000, "deadline": None,
    "deduplicationId": None, "priority": 0, "queuePartitionKey": None, "forkedFrom": None, "wasForkedFrom": False,
    "parentWorkflowId": None, "dequeuedAt": None, "delayUntil": None, "completedAt": None, "attributes": None,
    "scheduleName": None, "applicationName": "orders",
}
STEPS = [
    {"stepId": 1, "stepName": "reserve", "output": "'ok'", "error": None, "childWorkflowId": None,
     "startedAt": "2026-11-30T21:40:05Z", "completedAt": "2026-11-30T21:40:06.5Z"},
    {"stepId": 2, "stepName": "charge", "output": None, "error": "CardDeclined: " + "x" * 100,
     "childWorkflowId": "wf-1-child", "startedAt": "2026-11-30T21:40:07Z", "completedAt": None},
]
QUEUE = {"name": "payments", "concurrency": 1, "workerConcurrency": None, "rateLimitMax": 10,
         "rateLimitPeriodSecs": 1.0, "priorityEnabled": True, "partitionQueue": False, "pollingIntervalSecs": 0.5,
         "applicationName": "orders"}
SCHEDULE = {"scheduleId": "s-1", "scheduleName": "nightly", "workflowName": "report", "workflowClass": None,
            "cronExpression": "0 2 * * *", "status": "ACTIVE", "context": None,
            "lastFiredAt": "2026-11-29T02:00:00Z", "automaticBackfill": False, "cronTimezone": "UTC",
            "applicationName": "orders"}
VERSIONS = [{"versionId": "v-id-7", "versionName": "v7", "versionTimestamp": "2026-11-30T20:43:05Z",
             "createdAt": "2026-11-30T20:43:06Z"}]


def problem(status: int, detail: str) -> httpx.Response:
    return httpx.Response(status, json={"title": "Problem", "status": status, "detail": detail},
                          headers={"content-type": "application/problem+json"})


class FakeApi:
    """Answers the requests in ``routes`` (by method and path under the org) and records every request."""

    def __init__(self, routes: dict[tuple[str, str], httpx.Response] | None = None) -> None:
        self.routes = routes or {}
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        raw = request.url.raw_path.decode().split("?")[0]  # as sent: an id's "/" must stay %2F
        assert raw.startswith("/v2/orgs/local/"), raw
        path = raw.removeprefix("/v2/orgs/local")
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, path, dict(request.url.params), body))
        assert request.headers["authorization"] == "Bearer dbos_test"
        return self.routes.get((request.method, path)) or problem(404, f"no route {request.method} {path}")


Run = Callable[..., tuple[str, str]]


@pytest.fixture
def relay(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[[FakeApi], Run]:
    def bind(fake: FakeApi) -> Run:
        real = common.Api.__init__

        def init(self: common.Api, url: str, key: str, org: str, *, timeout: float = 10.0) -> None:
            real(self, url, key, org, timeout=timeout)
            self._client = httpx.Client(base_url=self.url, transport=httpx.MockTransport(fake.handle),
                                        headers={"Authorization": f"Bearer {key}"})

        monkeypatch.setattr(common.Api, "__init__", init)
        monkeypatch.setattr(workflows, "utcnow", lambda: NOW)
        monkeypatch.setenv("RELAY_API_KEY", "dbos_test")

        def run(*argv: str) -> tuple[str, str]:
            args = parser().parse_args([*argv, "--url", "http://relay.test"])
            admin.run(args, Settings())
            out = capsys.readouterr()
            return out.out, out.err

        return run

    return bind


def ok(body: Any, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=body)


NO_CONTENT = httpx.Response(204)


# -- workflows list -------------------------------------------------------------------------------------------------


def test_list_is_list_workflows_with_a_table_and_human_times(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows"): ok([WORKFLOW])})
    out, err = relay(fake)("workflows", "list", "--app", "orders")
    assert fake.requests == [("GET", f"{APP}/workflows", {"limit": "10"}, None)]
    header, row = out.splitlines()
    assert header.split("  ")[0] == "WORKFLOW ID" and "CREATED" in header and "UPDATED" in header
    assert row.split() == ["wf-1", "PENDING", "checkout", "payments", "v7", "ex-1", "2026-11-30", "21:40:05.000Z",
                           "(3m", "ago)", "2m", "ago"]
    assert row.index("PENDING") == header.index("STATUS")  # aligned
    assert err == ""


def test_list_filters_that_fit_the_query_stay_on_list_workflows(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows"): ok([])})
    relay(fake)("workflows", "list", "-a", "orders", "-S", "PENDING", "-n", "checkout", "-l", "50", "--offset", "5",
                "-d", "--load-input", "--load-output")
    assert fake.requests == [("GET", f"{APP}/workflows", {
        "status": "PENDING", "workflowName": "checkout", "limit": "50", "offset": "5", "sortDesc": "true",
        "loadInput": "true", "loadOutput": "true"}, None)]


def test_list_filters_beyond_the_query_search_workflows(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("POST", f"{APP}/workflows/search"): ok([WORKFLOW])})
    out, _ = relay(fake)("workflows", "list", "--app", "orders", "--status", "PENDING", "--status", "ENQUEUED",
                         "--user", "ana", "--start-time", "2026-11-30T20:00:00+01:00",
                         "--end-time", "2026-11-30T21:00Z",
                         "-v", "v6", "-v", "v7", "-q", "payments", "--queues-only", "--executor-id", "ex-1",
                         "--workflow-id-prefix", "wf-", "--sort-desc")
    assert fake.requests == [("POST", f"{APP}/workflows/search", {}, {
        "status": ["PENDING", "ENQUEUED"], "user": ["ana"], "appVersion": ["v6", "v7"], "queueName": ["payments"],
        "queuesOnly": True, "executorId": ["ex-1"], "workflowIdPrefix": ["wf-"],
        "startTime": "2026-11-30T19:00:00Z", "endTime": "2026-11-30T21:00:00Z", "limit": 10, "sortDesc": True})]
    assert out.splitlines()[1].startswith("wf-1 ")


def test_list_several_statuses_or_names_search_workflows(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("POST", f"{APP}/workflows/search"): ok([])})
    run = relay(fake)
    run("workflows", "list", "--app", "orders", "-S", "PENDING", "-S", "ENQUEUED")
    run("workflows", "list", "--app", "orders", "-n", "checkout", "-n", "refund", "-l", "3")
    assert fake.requests == [
        ("POST", f"{APP}/workflows/search", {}, {"status": ["PENDING", "ENQUEUED"], "limit": 10}),
        ("POST", f"{APP}/workflows/search", {}, {"workflowName": ["checkout", "refund"], "limit": 3})]


def test_list_start_time_as_a_duration_ago(relay: Callable[[FakeApi], Run], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "utcnow", lambda: NOW)
    fake = FakeApi({("POST", f"{APP}/workflows/search"): ok([])})
    relay(fake)("workflows", "list", "--app", "orders", "-t", "1h")
    assert fake.requests[0][3]["startTime"] == "2026-11-30T20:43:05Z"


def test_list_json_is_the_api_answer_whole(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows"): ok([WORKFLOW, {**WORKFLOW, "workflowId": "wf-2"}])})
    out, _ = relay(fake)("workflows", "list", "--app", "orders", "-o", "json")
    assert json.loads(out) == [WORKFLOW, {**WORKFLOW, "workflowId": "wf-2"}]


def test_an_app_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        parser().parse_args(["workflows", "list"])
    assert refused.value.code == 2 and "--app" in capsys.readouterr().err


# -- one workflow ---------------------------------------------------------------------------------------------------


def test_get_shows_every_field(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows/wf-1"): ok(WORKFLOW),
                    ("GET", f"{APP}/workflows/wf-2"): ok({**WORKFLOW, "deadline": "2026-11-30T23:45:00Z"})})
    out, _ = relay(fake)("workflows", "get", "wf-2", "--app", "orders")
    assert "deadline:" in out and "2026-11-30 23:45:00.000Z (in 2h)" in out
    fake.requests.clear()
    out, _ = relay(fake)("workflows", "get", "wf-1", "--app", "orders")
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["workflow id", "status", "workflow name"]
    assert len(lines) == len(WORKFLOW)
    card = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in lines}
    assert card["created at"] == "2026-11-30 21:40:05.000Z (3m ago)"
    assert card["timeout"] == "1m30s" and card["completed at"] == "-" and card["was forked from"] == "false"
    assert fake.requests == [("GET", f"{APP}/workflows/wf-1", {}, None)]
    out, _ = relay(fake)("workflows", "get", "wf-1", "--app", "orders", "-o", "json")
    assert json.loads(out) == WORKFLOW


def test_ids_are_one_path_segment(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows/batch%2F7%3F"): ok(WORKFLOW)})
    relay(fake)("workflows", "get", "batch/7?", "--app", "orders")
    assert fake.requests[0][1] == f"{APP}/workflows/batch%2F7%3F"


def test_steps_table(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows/wf-1/steps"): ok(STEPS)})
    out, _ = relay(fake)("workflows", "steps", "wf-1", "--app", "orders", "--limit", "2", "--offset", "1")
    assert fake.requests == [("GET", f"{APP}/workflows/wf-1/steps", {"limit": "2", "offset": "1"}, None)]
    header, first, second = out.splitlines()
    assert header.split() == ["STEP", "NAME", "STARTED", "DURATION", "CHILD", "WORKFLOW", "OUTPUT"]
    assert first.split() == ["1", "reserve", "2026-11-30", "21:40:05.000Z", "(3m", "ago)", "1s500ms", "-", "'ok'"]
    assert "wf-1-child" in second and "error: CardDeclined: xxx" in second and second.endswith("…")
    assert len(second) - second.index("error:") == 60  # cut; -o json has it whole
    out, _ = relay(fake)("workflows", "steps", "wf-1", "--app", "orders", "-o", "json")
    assert json.loads(out) == STEPS


# -- mutations: one id to the single route, several to the bulk one ------------------------------------------------


def test_cancel_one_and_several(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("POST", f"{APP}/workflows/wf-1/cancel"): NO_CONTENT,
                    ("POST", f"{APP}/workflows/bulk-cancel"): NO_CONTENT})
    run = relay(fake)
    out, _ = run("workflows", "cancel", "wf-1", "--app", "orders")
    assert out == "cancelled wf-1\n"
    run("workflows", "cancel", "wf-1", "wf-1", "--app", "orders", "--cancel-children")  # a repeated id is one
    out, _ = run("workflows", "cancel", "wf-1", "wf-2", "--app", "orders")
    assert out == "cancelled wf-1\ncancelled wf-2\n"
    out, _ = run("workflows", "cancel", "wf-1", "wf-2", "--app", "orders", "--cancel-children", "-o", "json")
    assert out == ""
    assert fake.requests == [
        ("POST", f"{APP}/workflows/wf-1/cancel", {}, None),
        ("POST", f"{APP}/workflows/wf-1/cancel", {}, {"cancelChildren": True}),
        ("POST", f"{APP}/workflows/bulk-cancel", {}, {"workflowIds": ["wf-1", "wf-2"]}),
        ("POST", f"{APP}/workflows/bulk-cancel", {}, {"workflowIds": ["wf-1", "wf-2"], "cancelChildren": True})]


def test_resume_one_and_several(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("POST", f"{APP}/workflows/wf-1/resume"): NO_CONTENT,
                    ("POST", f"{APP}/workflows/bulk-resume"): NO_CONTENT})
    run = relay(fake)
    out, _ = run("workflows", "resume", "wf-1", "--app", "orders", "-q", "slow")
    assert out == "resumed wf-1\n"
    out, _ = run("workflows", "resume", "wf-1", "wf-2", "wf-3", "--app", "orders")
    assert out == "resumed wf-1\nresumed wf-2\nresumed wf-3\n"
    assert fake.requests == [
        ("POST", f"{APP}/workflows/wf-1/resume", {}, {"queueName": "slow"}),
        ("POST", f"{APP}/workflows/bulk-resume", {}, {"workflowIds": ["wf-1", "wf-2", "wf-3"]})]


def test_delete_one_and_several(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("DELETE", f"{APP}/workflows/wf-1"): NO_CONTENT,
                    ("POST", f"{APP}/workflows/bulk-delete"): NO_CONTENT})
    run = relay(fake)
    run("workflows", "delete", "wf-1", "--app", "orders")
    out, _ = run("workflows", "delete", "wf-1", "--app", "orders", "--delete-children")
    assert out == "deleted wf-1\n"
    run("workflows", "delete", "wf-1", "wf-2", "--app", "orders", "--delete-children")
    assert fake.requests == [
        ("DELETE", f"{APP}/workflows/wf-1", {}, None),
        ("DELETE", f"{APP}/workflows/wf-1", {"deleteChildren": "true"}, None),
        ("POST", f"{APP}/workflows/bulk-delete", {}, {"workflowIds": ["wf-1", "wf-2"], "deleteChildren": True})]


def test_fork_takes_dbos_ctl_flags(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("POST", f"{APP}/workflows/wf-1/fork"): ok({"workflowId": "wf-1-again"}, 201)})
    run = relay(fake)
    out, _ = run("workflows", "fork", "wf-1", "--app", "orders", "-S", "3", "-f", "wf-1-again", "-v", "v8",
                 "-q", "slow", "--queue-partition-key", "eu")
    assert out == "forked wf-1 as wf-1-again\n"
    out, _ = run("workflows", "fork", "wf-1", "--app", "orders", "-o", "json")
    assert json.loads(out) == {"workflowId": "wf-1-again"}
    assert fake.requests == [
        ("POST", f"{APP}/workflows/wf-1/fork", {}, {"startStep": 3, "newWorkflowId": "wf-1-again", "appVersion": "v8",
                                                    "queueName": "slow", "queuePartitionKey": "eu"}),
        ("POST", f"{APP}/workflows/wf-1/fork", {}, {})]


# -- queues, schedules, versions ------------------------------------------------------------------------------------


def test_queues(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/queues"): ok([QUEUE]), ("GET", f"{APP}/queues/payments"): ok(QUEUE)})
    run = relay(fake)
    out, _ = run("queues", "list", "--app", "orders")
    header, row = out.splitlines()
    assert header.split("  ")[0] == "NAME" and "RATE LIMIT" in header
    assert row.split() == ["payments", "1", "-", "10/1s", "true", "false", "500ms"]
    out, _ = run("queues", "get", "payments", "--app", "orders")
    assert out.splitlines()[0].split() == ["name:", "payments"]
    card = {line.split(":")[0]: line.split(":")[1].strip() for line in out.splitlines()}
    assert card["rate limit period"] == "1s" and card["polling interval"] == "500ms"
    out, _ = run("queues", "list", "--app", "orders", "-o", "json")
    assert json.loads(out) == [QUEUE]
    assert [r[:2] for r in fake.requests] == [("GET", f"{APP}/queues"), ("GET", f"{APP}/queues/payments"),
                                               ("GET", f"{APP}/queues")]


def test_schedules_list_and_get(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/schedules"): ok([SCHEDULE]), ("GET", f"{APP}/schedules/nightly"): ok(SCHEDULE)})
    run = relay(fake)
    out, _ = run("schedules", "list", "--app", "orders", "-S", "PAUSED", "-n", "report",
                 "--schedule-name-prefix", "night", "--load-context")
    header, row = out.splitlines()
    assert row.split() == ["nightly", "ACTIVE", "report", "0", "2", "*", "*", "*", "UTC", "2026-11-29", "02:00:00.000Z",
                           "(1d", "ago)", "false"]
    assert row.index("0 2 * * *") == header.index("CRON")
    out, _ = run("schedules", "get", "nightly", "--app", "orders", "-o", "json")
    assert json.loads(out) == SCHEDULE
    out, _ = run("schedules", "get", "nightly", "--app", "orders")
    assert "last fired at:       2026-11-29 02:00:00.000Z (1d ago)" in out
    assert fake.requests[0] == ("GET", f"{APP}/schedules", {"status": "PAUSED", "workflowName": "report",
                                                           "scheduleNamePrefix": "night", "loadContext": "true"}, None)
    assert fake.requests[1][:2] == ("GET", f"{APP}/schedules/nightly")


def test_schedule_actions(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("POST", f"{APP}/schedules/nightly/pause"): NO_CONTENT,
                    ("POST", f"{APP}/schedules/nightly/resume"): NO_CONTENT,
                    ("POST", f"{APP}/schedules/nightly/trigger"): ok({"workflowId": "sched-1"}, 201),
                    ("POST", f"{APP}/schedules/nightly/backfill"): ok({"workflowIds": ["b-1", "b-2"]})})
    run = relay(fake)
    assert run("schedules", "pause", "nightly", "--app", "orders")[0] == "paused nightly\n"
    assert run("schedules", "resume", "nightly", "--app", "orders")[0] == "resumed nightly\n"
    assert run("schedules", "trigger", "nightly", "--app", "orders")[0] == "triggered nightly: workflow sched-1\n"
    out, _ = run("schedules", "backfill", "nightly", "--app", "orders", "--start-time", "2026-11-28T00:00:00Z",
                 "--end-time", "2026-11-30T00:00:00+00:00")
    assert out == "backfilled nightly: 2 workflows\nb-1\nb-2\n"
    out, _ = run("schedules", "backfill", "nightly", "--app", "orders", "-t", "2026-11-28T00:00:00Z",
                 "-e", "2026-11-30T00:00:00Z", "-o", "json")
    assert json.loads(out) == {"workflowIds": ["b-1", "b-2"]}
    window = {"startTime": "2026-11-28T00:00:00Z", "endTime": "2026-11-30T00:00:00Z"}
    assert fake.requests == [("POST", f"{APP}/schedules/nightly/pause", {}, None),
                             ("POST", f"{APP}/schedules/nightly/resume", {}, None),
                             ("POST", f"{APP}/schedules/nightly/trigger", {}, None),
                             ("POST", f"{APP}/schedules/nightly/backfill", {}, window),
                             ("POST", f"{APP}/schedules/nightly/backfill", {}, window)]


def test_backfill_refuses_an_empty_window_without_calling(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi()
    with pytest.raises(SystemExit) as refused:
        relay(fake)("schedules", "backfill", "nightly", "--app", "orders", "-t", "2026-11-30T00:00:00Z",
                    "-e", "2026-11-29T00:00:00Z")
    assert "--end-time must be after --start-time" in str(refused.value.code)
    assert fake.requests == []


def test_versions(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/versions"): ok(VERSIONS), ("PATCH", f"{APP}/versions/latest"): NO_CONTENT})
    run = relay(fake)
    out, _ = run("versions", "list", "--app", "orders")
    assert out.splitlines()[1].split() == ["v7", "v-id-7", "2026-11-30", "20:43:05.000Z", "(1h", "ago)", "2026-11-30",
                                           "20:43:06.000Z", "(59m", "ago)"]
    assert json.loads(run("versions", "list", "--app", "orders", "-o", "json")[0]) == VERSIONS
    assert run("versions", "set-latest", "v6", "--app", "orders")[0] == "latest version of orders: v6\n"
    assert fake.requests[-1] == ("PATCH", f"{APP}/versions/latest", {}, {"versionName": "v6"})


def test_org_flag_and_app_name_in_the_path(relay: Callable[[FakeApi], Run]) -> None:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return ok([])

    fake = FakeApi()
    fake.handle = handle  # type: ignore[method-assign]
    relay(fake)("queues", "list", "--app", "billing", "--org", "acme")
    assert seen == ["/v2/orgs/acme/apps/billing/queues"]


# -- errors ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["workflows", "get", "wf-1"], ["workflows", "cancel", "wf-1", "wf-2"], ["workflows", "fork", "wf-1"],
    ["queues", "get", "payments"], ["schedules", "trigger", "nightly"], ["versions", "set-latest", "v1"]])
def test_a_problem_exits_non_zero_with_its_detail(relay: Callable[[FakeApi], Run], argv: list[str]) -> None:
    fake = FakeApi()  # no route: every request answers 404 with a detail naming it
    with pytest.raises(SystemExit) as failed:
        relay(fake)(*argv, "--app", "orders")
    method, path = fake.requests[0][:2]
    assert failed.value.code == f"relay: no route {method} {path}"


def test_a_problem_without_detail_shows_the_status(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows"): httpx.Response(502, text="bad gateway")})
    with pytest.raises(SystemExit) as failed:
        relay(fake)("workflows", "list", "--app", "orders", "-o", "json")
    assert failed.value.code == "relay: HTTP 502 Bad Gateway"


@pytest.fixture
def unavailable() -> Iterator[str]:
    """A real HTTP server that answers every request as Relay does with no HEALTHY executor: 503 problem+json."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"title": "Service Unavailable", "status": 503,
                               "detail": "no HEALTHY executor of application 'orders'"}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/problem+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@starts_processes
def test_the_relay_process_prints_the_detail_on_stderr_and_exits_1(unavailable: str, tmp_path: Path) -> None:
    env = {**os.environ, "RELAY_API_KEY": "dbos_test", "RELAY_DATA_DIR": str(tmp_path / "relay")}
    done = subprocess.run([sys.executable, "-m", "cli.main", "workflows", "list", "--app", "orders", "--url",
                           unavailable], env=env, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2], stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "relay: no HEALTHY executor of application 'orders'\n"


# -- the app: as the first argument or --app; statuses in any case ------------------------------------------------


@pytest.mark.parametrize("argv", [
    ("workflows", "list", "orders"), ("workflows", "list", "--app", "orders"), ("workflows", "list", "-a", "orders"),
])
def test_the_app_is_the_first_argument_or_app(relay: Callable[[FakeApi], Run], argv: tuple[str, ...]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows"): ok([])})
    relay(fake)(*argv)
    assert [(m, p) for m, p, _, _ in fake.requests] == [("GET", f"{APP}/workflows")]


@pytest.mark.parametrize(("argv", "method", "path", "body"), [
    (("workflows", "get", "orders", "wf-1"), "GET", f"{APP}/workflows/wf-1", None),
    (("workflows", "get", "wf-1", "--app", "orders"), "GET", f"{APP}/workflows/wf-1", None),
    (("queues", "list", "orders"), "GET", f"{APP}/queues", None),
    (("versions", "list", "orders"), "GET", f"{APP}/versions", None),
    (("versions", "set-latest", "orders", "v8"), "PATCH", f"{APP}/versions/latest", {"versionName": "v8"}),
    (("workflows", "cancel", "orders", "wf-1", "wf-2"), "POST", f"{APP}/workflows/bulk-cancel",
     {"workflowIds": ["wf-1", "wf-2"]}),
    (("workflows", "cancel", "wf-1", "wf-2", "--app", "orders"), "POST", f"{APP}/workflows/bulk-cancel",
     {"workflowIds": ["wf-1", "wf-2"]}),
    (("workflows", "resume", "orders", "wf-1"), "POST", f"{APP}/workflows/wf-1/resume", None),
    (("drain", "set", "orders", "ex-1", "--for", "30m"), "PUT", f"{APP}/executors/ex-1/drain",
     {"expiresInSecs": 1800}),
    (("drain", "set", "ex-1", "--app", "orders", "--for", "30m"), "PUT", f"{APP}/executors/ex-1/drain",
     {"expiresInSecs": 1800}),
    (("drain", "clear", "orders", "ex-1"), "DELETE", f"{APP}/executors/ex-1/drain", None),
    (("drain", "clear", "ex-1", "-a", "orders"), "DELETE", f"{APP}/executors/ex-1/drain", None),
    (("drain", "list", "orders"), "GET", f"{APP}/drains", None),
    (("recovery", "pause", "orders", "--for", "1h"), "PUT", f"{APP}/recovery-pause", {"expiresInSecs": 3600}),
    (("recovery", "resume", "orders"), "DELETE", f"{APP}/recovery-pause", None),
    (("recovery", "status", "orders"), "GET", f"{APP}/recovery", None),
    (("recovery", "status", "--app", "orders"), "GET", f"{APP}/recovery", None),
])
def test_every_command_about_an_app_takes_it_either_way(relay: Callable[[FakeApi], Run], argv: tuple[str, ...],
                                                         method: str, path: str, body: Any) -> None:
    breaker = {"tripped": False, "trippedAt": None, "trips": 0, "lastSlotAt": None}
    status: dict[str, Any] = {"pause": None, "breaker": breaker, "waiting": [], "blocked": []}
    answers = {"GET": ok(WORKFLOW if "workflows/" in path else status if path.endswith("/recovery") else []),
               "PATCH": NO_CONTENT, "POST": NO_CONTENT, "DELETE": NO_CONTENT,
               "PUT": ok({"executorId": "ex-1", "until": "2026-11-30T22:13:05Z"})}
    fake = FakeApi({(method, path): answers[method]})
    relay(fake)(*argv)
    assert [(m, p, b) for m, p, _, b in fake.requests] == [(method, path, body)]


@pytest.mark.parametrize(("argv", "error"), [
    (("workflows", "list"), "the application is missing"),
    (("workflows", "get", "wf-1"), "the application is missing"),
    (("workflows", "list", "orders", "--app", "billing"), "the application is given twice: 'orders' and --app "
                                                          "'billing'"),
    (("workflows", "cancel", "wf-1"), "give the application and at least one workflow_id, or --app"),
    (("drain", "set", "--for", "30m", "ex-1"), "the application is missing"),
    (("recovery", "status"), "the application is missing"),
])
def test_no_app_or_two_is_a_usage_error(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                        error: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(list(argv))
    assert exited.value.code == 2
    assert error in capsys.readouterr().err


def test_statuses_are_taken_in_any_case(relay: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({("GET", f"{APP}/workflows"): ok([]), ("POST", f"{APP}/workflows/search"): ok([]),
                    ("GET", f"{APP}/schedules"): ok([])})
    run = relay(fake)
    run("workflows", "list", "orders", "-S", "success")
    run("workflows", "list", "orders", "-S", "Error", "--status", "cancelled")
    run("schedules", "list", "orders", "-S", "paused")
    assert fake.requests[0][2]["status"] == "SUCCESS"
    assert fake.requests[1][3]["status"] == ["ERROR", "CANCELLED"]
    assert fake.requests[2][2]["status"] == "PAUSED"
