"""Workflow management end to end: the Conductor console's operations through Relay's REST API, answered by real
``dbos==3.2.0`` executors over their conductor sockets, on real workflows in their system database — and the
routing around them: no executor (503), one that never answers (502), a reply over RELAY_MAX_MESSAGE_BYTES, an
executor held by another gateway process.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_cli import relay_cli
from tests.sdk import SDKS, SystemDatabase
from tests.support import (
    VENV_BIN,
    Process,
    RawPeer,
    Relay,
    audit_rows_at,
    free_port,
    healthy,
    healthy_answer,
    running_relay,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

# RELAY_MANAGEMENT_TIMEOUT_SECS: a silent executor costs this much; and how long an operator's held list keeps its
# executor claimed while a recovery happens beside it (on a loaded machine, over 4.5 s).
TIMEOUT_SECS = 12
PYTHON = SDKS["python"]


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    with running_relay(tmp_path_factory.mktemp("relay-management"),
                       RELAY_MANAGEMENT_TIMEOUT_SECS=str(TIMEOUT_SECS)) as started:
        yield started


@pytest.fixture(scope="module")
def app(relay: Relay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SystemDatabase, Path, Process]]:
    """One real executor of app ``mgmt`` with gated, queued, three-step and big workflows and an hourly schedule."""
    tmp = tmp_path_factory.mktemp("mgmt-executor")
    (tmp / "gates").mkdir()
    name, sys_db = "mgmt", PYTHON.system_database(tmp, None)
    with relay.api() as api:
        assert api.put(f"/v2/orgs/local/apps/{name}").status_code == 204
    executor = PYTHON.start(relay, tmp, "executor", name, sys_db, GATE_DIR=str(tmp / "gates"),
                            GATED_WORKFLOWS="g1,g2", QUEUED_WORKFLOWS="q1,q2", THREE_STEPS="t1",
                            BIG_WORKFLOWS="b1,b2", BIG_BYTES="400000", SCHEDULE="hourly")
    try:
        wait_until(lambda: list(relay.executors(name).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        wait_until(lambda: {"g1", "g2", "q1", "q2", "t1", "b1", "b2"} <= set(sys_db.statuses()), timeout=30,
                   what="the workflows")
        yield name, sys_db, tmp, executor
    finally:
        executor.stop()


def _api(relay: Relay) -> httpx.Client:
    return httpx.Client(base_url=f"{relay.url}/v2/orgs/local/apps/", timeout=30,
                        headers={"Authorization": f"Bearer {relay.key}"})


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.text[:2000])
    return response.json() if response.content else None


def test_workflows_are_listed_got_cancelled_resumed_and_forked(relay: Relay, app: tuple[Any, ...]) -> None:
    name, sys_db, tmp, _ = app
    with _api(relay) as api:
        pending = _ok(api.get(f"{name}/workflows", params={"status": "PENDING"}))
        assert {"g1", "g2"} <= {w["workflowId"] for w in pending}
        assert all(w["status"] == "PENDING" for w in pending)
        g1 = _ok(api.get(f"{name}/workflows/g1"))
        assert (g1["workflowId"], g1["workflowName"], g1["status"]) == ("g1", "gated", "PENDING")
        assert api.get(f"{name}/workflows/no-such-workflow").status_code == 404

        steps = _ok(api.get(f"{name}/workflows/t1/steps"))
        assert [s["stepName"] for s in steps if "logged_step" in s["stepName"]] == [steps[0]["stepName"]] * 3
        assert [s["output"] for s in steps] == [0, 1, 2] or [str(s["output"]) for s in steps] == ["0", "1", "2"]

        _ok(api.post(f"{name}/workflows/g1/cancel", json={}), 204)
        wait_until(lambda: sys_db.status("g1") == "CANCELLED", timeout=10, what="g1 CANCELLED")
        (tmp / "gates" / "g1").touch()
        time.sleep(1.0)  # the gate is open, but a cancelled workflow does not look at it any more
        assert sys_db.status("g1") == "CANCELLED"
        _ok(api.post(f"{name}/workflows/g1/resume", json={}), 204)
        wait_until(lambda: sys_db.status("g1") == "SUCCESS", timeout=20, what="g1 resumed to SUCCESS")

        forked = _ok(api.post(f"{name}/workflows/t1/fork", json={"startStep": 2, "newWorkflowId": "t1-fork"}), 201)
        assert forked == {"workflowId": "t1-fork"}
        wait_until(lambda: sys_db.status("t1-fork") == "SUCCESS", timeout=20, what="the fork SUCCESS")
    ran = [line.split()[1:] for line in (tmp / "steps.log").read_text().splitlines() if len(line.split()) == 3]
    assert [s for w, s in ran if w == "t1"] == ["0", "1", "2"]
    by_fork = [s for w, s in ran if w == "t1-fork"]
    assert by_fork and "0" not in by_fork, by_fork  # steps before the fork's start step are copied, not rerun

    [executor_id] = relay.executors(name)
    audit = [(r.operation, r.executor_id, r.status) for r in audit_rows_at(relay.db_url, name)
             if r.operation.startswith("workflow.")]
    assert [op for op, _, _ in audit] == ["workflow.cancel", "workflow.resume", "workflow.fork"], audit
    assert all(ex == executor_id and status == "success" for _, ex, status in audit), audit


def test_a_blocked_queue_is_visible(relay: Relay, app: tuple[Any, ...]) -> None:
    name, sys_db, _, _ = app
    with _api(relay) as api:
        queue = _ok(api.get(f"{name}/queues/serial"))
        assert queue["name"] == "serial" and queue["concurrency"] == 1
        assert "serial" in {q["name"] for q in _ok(api.get(f"{name}/queues"))}
        queued = _ok(api.post(f"{name}/workflows/search", json={"queuesOnly": True}))
        statuses = {w["workflowId"]: w["status"] for w in queued}
        assert {"q1", "q2"} <= set(statuses)
        assert sorted(statuses[i] for i in ("q1", "q2")) == ["ENQUEUED", "PENDING"]  # one runs, one waits
        assert all(w["queueName"] == "serial" for w in queued if w["workflowId"] in ("q1", "q2"))


def test_schedules_pause_and_trigger(relay: Relay, app: tuple[Any, ...]) -> None:
    name, sys_db, _, _ = app
    with _api(relay) as api:
        [schedule] = [s for s in _ok(api.get(f"{name}/schedules")) if s["scheduleName"] == "hourly"]
        assert schedule["cronExpression"] == "0 0 * * * *" and schedule["status"] == "ACTIVE"
        _ok(api.post(f"{name}/schedules/hourly/pause"), 204)
        assert _ok(api.get(f"{name}/schedules/hourly"))["status"] == "PAUSED"
        before = set(sys_db.statuses())
        _ok(api.post(f"{name}/schedules/hourly/trigger"), 201)
        wait_until(lambda: any(s == "SUCCESS" for i, s in sys_db.statuses().items() if i not in before), timeout=20,
                   what="the triggered run")
        _ok(api.post(f"{name}/schedules/hourly/resume"), 204)
        assert _ok(api.get(f"{name}/schedules/hourly"))["status"] == "ACTIVE"


def test_a_reply_over_the_frame_limit_costs_the_executor_nothing(relay: Relay, app: tuple[Any, ...]) -> None:
    name, _, _, _ = app
    [executor_id] = relay.executors(name)
    with _api(relay) as api:
        response = api.get(f"{name}/workflows", params={"loadInput": True, "loadOutput": True, "limit": 100})
        big = [w for w in _ok(response) if w["workflowId"] in ("b1", "b2")]
    assert len(response.content) > 1024 * 1024  # four payloads of 400,000 characters: over RELAY_MAX_MESSAGE_BYTES
    assert len(big) == 2 and all("x" * 1000 in str(w["input"]) for w in big)
    assert relay.executors(name) == {executor_id: "HEALTHY"}
    assert [r.operation for r in audit_rows_at(relay.db_url, name, executor_id)
            if r.operation.startswith("executor.")] == ["executor.healthy"]


def test_an_executor_in_metadata_only_mode_refuses_data_with_a_409_and_withholds_inputs(
        relay: Relay, tmp_path: Path) -> None:
    name, sys_db = "metadata-only", PYTHON.system_database(tmp_path, None)
    with _api(relay) as api:
        assert api.put(name).status_code == 204
        executor = PYTHON.start(relay, tmp_path, "executor", name, sys_db, METADATA_ONLY="1",
                                BIG_WORKFLOWS="m1", BIG_BYTES="10")
        try:
            wait_until(lambda: list(relay.executors(name).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
            wait_until(lambda: sys_db.status("m1") == "SUCCESS", timeout=30, what="m1")
            exported = api.get(f"{name}/workflows/m1/export")
            assert exported.status_code == 409, exported.text
            assert exported.headers["content-type"] == "application/problem+json"
            assert "metadata-only" in exported.json()["detail"]
            listed = _ok(api.get(f"{name}/workflows", params={"loadInput": True, "loadOutput": True}))
            [m1] = [w for w in listed if w["workflowId"] == "m1"]
            assert m1["status"] == "SUCCESS" and m1["input"] is None and m1["output"] is None
        finally:
            executor.stop()


def test_no_executor_is_a_503_and_a_silent_one_a_502_naming_it(relay: Relay) -> None:
    with _api(relay) as api:
        assert api.put("silent-app").status_code == 204
        response = api.get("silent-app/workflows")
        assert response.status_code == 503 and response.headers["content-type"] == "application/problem+json"

        def never_lists(request: dict[str, object]) -> dict[str, object] | None:
            return None if request["type"] == "list_workflows" else healthy_answer(request)  # type: ignore[return-value]

        peer = RawPeer(relay.ws_url, "silent-app", relay.key, "silent-1", answer=never_lists)
        try:
            wait_until(lambda: relay.executors("silent-app") == {"silent-1": "HEALTHY"}, timeout=10, what="HEALTHY")
            began = time.monotonic()
            response = api.get("silent-app/workflows")
            took = time.monotonic() - began
        finally:
            peer.stop()
    assert response.status_code == 502, response.text
    problem = response.json()
    assert "silent-1" in problem["detail"]
    assert problem["errors"] == [{"location": "executors", "message": "executors tried", "value": ["silent-1"]}]
    assert TIMEOUT_SECS <= took < TIMEOUT_SECS + 5
    assert len(peer.requests_of("list_workflows")) == 1


def test_a_recovery_during_an_operators_slow_query_goes_to_the_free_peer(relay: Relay) -> None:
    """Two peers answer one request at a time, as the SDKs do; an operator's list holds whichever gets it until the
    test lets it go. A third executor dies meanwhile: its recovery goes to the other peer and is confirmed while the
    list is still held."""
    name, released = "busy-app", threading.Event()

    def slow_lists(request: dict[str, object]) -> dict[str, object] | None:
        if request["type"] == "list_workflows":
            released.wait(60)  # blocks this peer's loop: nothing else is answered meanwhile
            return {"type": "list_workflows", "request_id": request["request_id"], "output": [],
                    "error_message": None}
        return healthy_answer(request)  # type: ignore[return-value]

    with _api(relay) as api:
        assert api.put(name).status_code == 204
        assert api.patch(name, json={"executorTimeoutSecs": 1}).status_code == 204
        peers = [RawPeer(relay.ws_url, name, relay.key, f"peer-{i}", answer=slow_lists) for i in (1, 2)]
        try:
            wait_until(lambda: sorted(relay.executors(name)) == ["peer-1", "peer-2"], timeout=10, what="two HEALTHY")
            with ThreadPoolExecutor(1) as pool:
                listing = pool.submit(api.get, f"{name}/workflows")
                wait_until(lambda: any(p.requests_of("list_workflows") for p in peers), timeout=5, what="the list")
                # The list is slow now (its executor claimed); a third executor comes and dies meanwhile.
                doomed = RawPeer(relay.ws_url, name, relay.key, "doomed", reconnect=False)
                wait_until(lambda: relay.executors(name).get("doomed") == "HEALTHY", timeout=5, what="doomed")
                doomed.stop()
                wait_until(lambda: "doomed" not in relay.executors(name), timeout=15, what="doomed recovered")
                assert not listing.done(), "the list ended first: nothing was proven"
                released.set()
                assert listing.result().status_code == 200
        finally:
            released.set()
            for peer in peers:
                peer.stop()
    [busy] = [p.executor_id for p in peers if p.requests_of("list_workflows")]
    [free] = [p.executor_id for p in peers if p.executor_id != busy]
    recovered = [r for r in audit_rows_at(relay.db_url, name, "doomed") if r.operation == "executor.recovery.succeeded"]
    assert len(recovered) == 1 and recovered[0].details["candidate"] == free, recovered
    assert not [r for r in audit_rows_at(relay.db_url, name, "doomed") if r.operation == "executor.recovery.failed"]


def test_an_executor_on_another_gateway_process_is_reached_through_it(relay: Relay, tmp_path: Path) -> None:
    """A second `relay gateway` on the same Temporal and database holds the app's only executor; a REST call to the
    first gateway is routed to it (a ManagementRequestWorkflow on the second gateway's queue)."""
    env = {**relay.env, "RELAY_PORT": str(free_port()), "RELAY_TEMPORAL_ADDRESS": relay.temporal_address}
    gateway = Process([str(VENV_BIN / "relay"), "gateway"], env=env, log=tmp_path / "gateway-2.log")
    second = Relay(gateway, f"http://127.0.0.1:{env['RELAY_PORT']}", f"ws://127.0.0.1:{env['RELAY_PORT']}/",
                   relay.key, relay.data_dir, env)
    name, executor = "routed", None
    try:
        wait_until(lambda: healthy(second.url), timeout=60, what="second gateway")
        with _api(relay) as api:
            assert api.put(name).status_code == 204
        (tmp_path / "gates").mkdir()
        executor = PYTHON.start(second, tmp_path, "executor", name, PYTHON.system_database(tmp_path, None),
                                GATE_DIR=str(tmp_path / "gates"), GATED_WORKFLOWS="r1")
        wait_until(lambda: list(relay.executors(name).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        [executor_id] = relay.executors(name)
        timings: dict[str, list[float]] = {"local": [], "routed": []}
        for where, via in (("local", second), ("routed", relay)):
            with _api(via) as api:
                for _ in range(10):
                    began = time.monotonic()
                    listed = _ok(api.get(f"{name}/workflows", params={"limit": 10}))
                    timings[where].append(time.monotonic() - began)
                    assert [w["workflowId"] for w in listed] == ["r1"]
        with _api(relay) as api:
            _ok(api.post(f"{name}/workflows/r1/cancel", json={}), 204)
        [row] = [r for r in audit_rows_at(relay.db_url, name) if r.operation == "workflow.cancel"]
        assert (row.executor_id, row.status) == (executor_id, "success")
        local, routed = (sorted(timings[k])[len(timings[k]) // 2] * 1000 for k in ("local", "routed"))
        print(f"\nlistWorkflows p50: {local:.1f} ms on the executor's gateway, {routed:.1f} ms routed through "
              "another gateway process")
    finally:
        if executor is not None:
            executor.stop()
        gateway.stop()


def test_the_cli_lists_gets_and_cancels_through_a_real_executor(relay: Relay, app: tuple[Any, ...]) -> None:
    name, sys_db, _, _ = app
    listed = json.loads(relay_cli(relay, "workflows", "list", "--app", name, "--status", "PENDING", "-o", "json",
                                  key=relay.key).stdout)
    assert "g2" in {w["workflowId"] for w in listed}
    table = relay_cli(relay, "workflows", "list", "--app", name, "--limit", "100", key=relay.key).stdout
    assert "g2" in table and "gated" in table
    got = json.loads(relay_cli(relay, "workflows", "get", "g2", "--app", name, "-o", "json", key=relay.key).stdout)
    assert (got["workflowId"], got["status"]) == ("g2", "PENDING")
    relay_cli(relay, "workflows", "cancel", "g2", "--app", name, key=relay.key)
    wait_until(lambda: sys_db.status("g2") == "CANCELLED", timeout=10, what="g2 CANCELLED")
    queues = relay_cli(relay, "queues", "list", "--app", name, key=relay.key).stdout
    assert "serial" in queues
    missing = relay_cli(relay, "workflows", "get", "no-such", "--app", name, key=relay.key, rc=1)
    assert "no-such" in missing.stderr
    # An unknown id is "not found" whatever dbos 3.2.0 answers for it: success for a cancel, no steps, a traceback
    # for a resume or a fork.
    for argv in (["cancel", "no-such"], ["steps", "no-such"], ["resume", "no-such"], ["fork", "no-such"]):
        refused = relay_cli(relay, "workflows", *argv, "--app", name, key=relay.key, rc=1)
        assert (refused.stdout, refused.stderr) == ("", "relay: workflow 'no-such' not found\n"), argv


def test_a_bulk_fork_without_exactly_one_start_is_refused_before_the_executor(relay: Relay, tmp_path: Path) -> None:
    """dbos 3.2.0 raises ``ValueError`` for a fork-from-failure with none, or more than one, of its four start
    options: Relay refuses such a body with a 422 naming them, and sends nothing (no audit row, no executor log of
    it, no fork); the same request with one option forks (issue: it came back as a 502 carrying the ValueError)."""
    name, sys_db = "fork-options", PYTHON.system_database(tmp_path, None)
    with _api(relay) as api:
        assert api.put(name).status_code == 204
        executor = PYTHON.start(relay, tmp_path, "executor", name, sys_db, THREE_STEPS="f1")
        try:
            wait_until(lambda: list(relay.executors(name).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
            wait_until(lambda: sys_db.status("f1") == "SUCCESS", timeout=30, what="f1")
            for options, given in [({}, "none was given"),
                                   ({"fromLastStep": True, "fromStep": 2}, "fromLastStep and fromStep were given")]:
                response = api.post(f"{name}/workflows/bulk-fork-from-failure", json={"workflowIds": ["f1"], **options})
                assert response.status_code == 422, (response.status_code, response.text)
                assert response.headers["content-type"] == "application/problem+json"
                problem = response.json()
                assert problem["detail"] == ("body: give exactly one of fromLastFailure: true, fromLastStep: true, "
                                             f"fromStep, fromStepName; {given}"), problem
            assert set(sys_db.statuses()) == {"f1"}
            assert [op for op, _ in relay.audit(name) if op.startswith("workflow.")] == []
            assert "bulk forking" not in executor.output()
            forked = _ok(api.post(f"{name}/workflows/bulk-fork-from-failure",
                                  json={"workflowIds": ["f1"], "fromLastStep": True, "fromLastFailure": False}))
            assert len(forked["workflowIds"]) == 1
            wait_until(lambda: sys_db.status(forked["workflowIds"][0]) == "SUCCESS", timeout=20, what="the fork")
        finally:
            executor.stop()
    assert [op for op, _ in relay.audit(name) if op.startswith("workflow.")] == ["workflow.bulk_fork_from_failure"]
