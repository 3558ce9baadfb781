"""Management requests (``gateway.management``) over a real hub and real sessions, with scripted executors: which
executor is asked, in what order, what happens when one fails, and the socket's frame limit while a large reply is
due. Routing through another gateway process is tested end to end (tests/e2e/test_management.py)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.errors import ExecutorRefusedError, ExecutorsFailedError, ExecutorUnsupportedError, NoExecutorError
from core.models import Executor
from core.settings import Settings
from core.store import Candidates
from gateway import session as sm
from gateway.hub import Connection, Hub
from gateway.management import Management, Pick, order
from workflows.contracts.common import ExecutorStatus
from workflows.contracts.management import pack, unpack

ORG, APP = "local", "orders"
QUEUE = "relay-gateway-here"
Script = Callable[[dict[str, Any]], dict[str, Any] | None]  # the request -> the reply fields, or None: silence


def _row(executor_id: str, version: str = "v1", queue: str = QUEUE) -> Executor:
    return Executor(org=ORG, app=APP, executor_id=executor_id, app_version=version, status=ExecutorStatus.HEALTHY,
                    gateway_queue=queue, created_at=datetime(2026, 1, 1, tzinfo=UTC))


@dataclass
class FakeStore:
    rows: list[Executor]
    busy: set[str] = field(default_factory=set)

    claims: dict[str, str] = field(default_factory=dict)  # request id -> executor id
    claimed: list[str] = field(default_factory=list)  # every executor ever claimed

    def management_candidates(self, org: str, app: str) -> Candidates:
        assert (org, app) == (ORG, APP)
        return Candidates(list(self.rows), set(self.busy) | set(self.claims.values()))

    def claim_for_management(self, *, org: str, app: str, executor_id: str, request_id: str) -> None:
        self.claims[request_id] = executor_id
        self.claimed.append(executor_id)

    def release_management_claim(self, *, org: str, app: str, request_id: str) -> None:
        del self.claims[request_id]


@dataclass
class Scripted:
    """An executor socket: answers each request by its script, after the handshake the session already did."""

    executor_id: str
    script: Script
    asked: list[dict[str, Any]] = field(default_factory=list)
    limits: list[bool] = field(default_factory=list)
    conn: Connection | None = None

    def attach(self, hub: Hub) -> Connection:
        session = sm.Session()
        session.state = sm.State.OPEN
        self.conn = Connection(connection_id=f"c-{self.executor_id}", org=ORG, app=APP,
                               executor_id=self.executor_id, session=session, send=self._send, close=self._close,
                               widen=self.limits.append)
        hub.attach(self.conn)
        return self.conn

    async def _send(self, frame: str) -> None:
        request = json.loads(frame)
        self.asked.append(request)
        fields = self.script(request)
        if fields is not None:
            reply = json.dumps({"type": request["type"], "request_id": request["request_id"], **fields})
            asyncio.get_running_loop().call_soon(self._deliver, reply)

    def _deliver(self, reply: str) -> None:
        assert self.conn is not None
        event = self.conn.session.receive(reply)
        assert isinstance(event, sm.Reply)
        self.conn.deliver(event)

    async def _close(self, code: int, reason: str) -> None:
        pass


def _management(store: FakeStore, hub: Hub, timeout: float = 0.2) -> Management:
    settings = Settings(management_timeout_secs=timeout)
    return Management(settings=settings, store=store, hub=hub, client=None, task_queue=QUEUE)  # type: ignore[arg-type]


def ok(request: dict[str, Any]) -> dict[str, Any]:
    return {"output": [request["type"]], "error_message": None}


def silent(request: dict[str, Any]) -> None:
    return None


async def test_a_read_goes_to_one_executor_with_the_request_fields_and_returns_its_whole_reply() -> None:
    hub = Hub()
    a = Scripted("a", lambda r: {"output": {"WorkflowUUID": r["workflow_id"]}, "extra": [1, 2]})
    a.attach(hub)
    answer = await _management(FakeStore([_row("a")]), hub).ask(ORG, APP, "get_workflow", {"workflow_id": "w-1"})
    assert answer.executor_id == "a"
    assert answer.body == {"output": {"WorkflowUUID": "w-1"}, "extra": [1, 2], "error_message": None}
    [request] = a.asked
    assert request["type"] == "get_workflow" and request["workflow_id"] == "w-1" and request["request_id"]
    assert a.limits == [True, False]  # the frame limit is raised only while the reply is due


async def test_no_healthy_executor_is_a_503_naming_nobody() -> None:
    with pytest.raises(NoExecutorError) as raised:
        await _management(FakeStore([]), Hub()).ask(ORG, APP, "list_workflows", {})
    assert raised.value.status == 503 and raised.value.tried == []


async def test_a_silent_executor_is_passed_over_for_the_next_and_every_failure_is_a_502_naming_them() -> None:
    hub = Hub()
    a, b = Scripted("a", silent), Scripted("b", ok)
    a.attach(hub)
    b.attach(hub)
    store = FakeStore([_row("a"), _row("b")], busy={"b"})  # b is busy, so a (free) goes first
    answer = await _management(store, hub).ask(ORG, APP, "list_workflows", {"body": {}})
    assert (answer.executor_id, len(a.asked), len(b.asked)) == ("b", 1, 1)

    b.script = silent
    with pytest.raises(ExecutorsFailedError) as raised:
        await _management(store, hub).ask(ORG, APP, "list_workflows", {"body": {}})
    assert raised.value.status == 502 and raised.value.tried == ["a", "b"]
    assert "did not answer" in raised.value.detail


async def test_a_fork_that_may_have_been_delivered_is_never_sent_to_a_second_executor() -> None:
    hub = Hub()
    a, b = Scripted("a", silent), Scripted("b", ok)
    a.attach(hub)
    b.attach(hub)
    store = FakeStore([_row("a"), _row("b")], busy={"b"})
    with pytest.raises(ExecutorsFailedError) as raised:
        await _management(store, hub).ask(ORG, APP, "fork_workflow", {"body": {"workflow_id": "w"}},
                                          version="v1")
    assert raised.value.tried == ["a"] and b.asked == []
    assert "may or may not have been carried out" in raised.value.detail


async def test_an_executor_without_a_socket_here_or_a_gateway_is_passed_over() -> None:
    hub = Hub()
    b = Scripted("b", ok)
    b.attach(hub)
    # "a" claims to be on this gateway but has no socket: never sent, so even a fork may go on to "b".
    store = FakeStore([_row("a"), _row("b")], busy={"b"})
    answer = await _management(store, hub).ask(ORG, APP, "fork_workflow", {}, version="v1")
    assert answer.executor_id == "b"


async def test_resume_and_fork_go_to_the_latest_version_as_the_sdk_reports_it() -> None:
    hub = Hub()
    versions = {"output": [
        {"version_id": "1", "version_name": "v-old", "version_timestamp": 200, "created_at": 100},
        {"version_id": "2", "version_name": "v-new", "version_timestamp": 300, "created_at": 50},
        {"version_id": "3", "version_name": "v-newest-created", "version_timestamp": 100, "created_at": 900},
    ]}

    def script(request: dict[str, Any]) -> dict[str, Any]:
        return versions if request["type"] == "list_application_versions" else ok(request)

    old, new = Scripted("old", script), Scripted("new", script)
    old.attach(hub)
    new.attach(hub)
    store = FakeStore([_row("old", "v-old"), _row("new", "v-new")])
    management = _management(store, hub)
    assert await management.latest_version(ORG, APP) == "v-new"
    for _ in range(5):
        answer = await management.ask(ORG, APP, "resume", {"workflow_id": "w"}, pick=Pick.LATEST)
        assert answer.executor_id == "new"
    answer = await management.ask(ORG, APP, "resume", {"workflow_id": "w"}, pick=Pick.LATEST, version="v-old")
    assert answer.executor_id == "old"
    with pytest.raises(NoExecutorError, match="'v-gone'"):
        await management.ask(ORG, APP, "resume", {}, pick=Pick.LATEST, version="v-gone")


async def test_a_refusal_in_metadata_only_mode_is_a_409_not_a_retry_elsewhere() -> None:
    hub = Hub()
    a = Scripted("a", lambda r: {"error_message": "export_workflow is not allowed in conductor metadata-only mode"})
    b = Scripted("b", ok)
    a.attach(hub)
    b.attach(hub)
    with pytest.raises(ExecutorRefusedError) as raised:
        await _management(FakeStore([_row("a"), _row("b")], busy={"b"}), hub).ask(ORG, APP, "export_workflow", {})
    assert raised.value.status == 409 and raised.value.executor_id == "a" and b.asked == []


def unsupported(request: dict[str, Any]) -> dict[str, Any]:
    """As Relay's client for dbos 3.4 answers what DBOS moved out of its MIT package."""
    return {"metrics": [], "unsupported": True,
            "error_message": f"{request['type']} is not available with dbos 3.4.0: DBOS moved it out"}


async def test_an_unsupported_operation_is_asked_of_another_executor_and_a_501_when_none_can() -> None:
    hub = Hub()
    a, b = Scripted("a", unsupported), Scripted("b", ok)
    a.attach(hub)
    b.attach(hub)
    store = FakeStore([_row("a"), _row("b")], busy={"b"})  # a first: free
    # Not carried out by "a", so even a request that must not run twice goes on to "b" (a dbos 3.2.0 executor).
    for kind in ("get_metrics", "export_workflow", "fork_from_failure"):
        answer = await _management(store, hub).ask(ORG, APP, kind, {}, version="v1")
        assert answer.executor_id == "b"
    b.script = unsupported
    with pytest.raises(ExecutorUnsupportedError) as raised:
        await _management(store, hub).ask(ORG, APP, "get_metrics", {})
    assert raised.value.status == 501 and raised.value.executor_id == "a"
    assert "get_metrics is not supported by the executors of app 'orders' asked (a, b)" in raised.value.detail
    assert "dbos 3.4.0" in raised.value.detail

    b.script = silent  # one unsupported, one silent: the executor's failure, a 502
    with pytest.raises(ExecutorsFailedError) as failed:
        await _management(store, hub).ask(ORG, APP, "get_metrics", {})
    assert failed.value.status == 502 and failed.value.tried == ["a", "b"]


async def test_an_error_the_executor_reports_is_its_answer() -> None:
    hub = Hub()
    a = Scripted("a", lambda r: {"output": None, "error_message": "workflow not found"})
    a.attach(hub)
    answer = await _management(FakeStore([_row("a")]), hub).ask(ORG, APP, "get_workflow", {})
    assert answer.error == "workflow not found"


async def test_a_slow_request_marks_its_executor_busy_until_it_ends_and_a_quick_one_never() -> None:
    hub = Hub()
    slow = Scripted("slow", silent)
    conn = slow.attach(hub)
    store = FakeStore([_row("slow")])
    management = _management(store, hub, timeout=5)
    asking = asyncio.create_task(management.ask(ORG, APP, "list_workflows", {}))
    for _ in range(200):  # a claim is written once the request has been unanswered for SLOW_AFTER (0.2 s)
        if store.claims:
            break
        await asyncio.sleep(0.01)
    assert list(store.claims.values()) == ["slow"]
    [request] = slow.asked
    event = conn.session.receive(json.dumps({"type": "list_workflows", "request_id": request["request_id"]}))
    assert isinstance(event, sm.Reply)
    conn.deliver(event)
    await asking
    assert store.claims == {} and store.claimed == ["slow"]

    slow.script = ok
    await management.ask(ORG, APP, "list_workflows", {})
    assert store.claimed == ["slow"]  # answered at once: no claim written


def test_order_prefers_free_then_local_and_keeps_only_the_version_asked() -> None:
    rows = [_row("busy-local"), _row("free-remote", queue="elsewhere"), _row("free-local"),
            _row("other-version", version="v2"), _row("busy-remote", queue="elsewhere")]
    local = {"busy-local", "free-local", "other-version"}
    for seed in range(20):
        got = order(rows, busy={"busy-local", "busy-remote"}, local=local, version="v1", rng=random.Random(seed))
        assert [r.executor_id for r in got] == ["free-local", "free-remote", "busy-local", "busy-remote"]
    assert len(order(rows, busy=set(), local=local, version=None)) == 5


def test_a_routed_reply_survives_packing_and_shrinks() -> None:
    body = {"output": [{"WorkflowUUID": f"wf-{i}", "Status": "SUCCESS", "CreatedAt": str(1_700_000_000_000 + i)}
                       for i in range(5000)], "error_message": None}
    packed = pack(body)
    assert unpack(packed) == body
    assert len(packed) < len(json.dumps(body)) / 4


async def test_operators_requests_go_one_at_a_time_and_relays_own_at_once() -> None:
    """The SDKs answer one request at a time: a recovery sent while operators' requests crowd in waits behind at
    most one of them. The frame limit is raised only while an operator's reply is due."""
    hub = Hub()
    a = Scripted("a", silent)
    conn = a.attach(hub)

    def request(request_id: str, kind: str, large: bool) -> asyncio.Task[sm.Reply]:
        frame = json.dumps({"type": kind, "request_id": request_id})
        return asyncio.create_task(conn.request(request_id, frame, timeout=timedelta(seconds=5), large_reply=large))

    def answer(request_id: str, kind: str) -> None:
        event = conn.session.receive(json.dumps({"type": kind, "request_id": request_id, "success": True}))
        assert isinstance(event, sm.Reply)
        conn.deliver(event)

    first, second = request("op-1", "list_workflows", True), request("op-2", "list_workflows", True)
    await asyncio.sleep(0.01)
    assert [r["request_id"] for r in a.asked] == ["op-1"] and a.limits == [True]
    recovery = request("rec", "recovery", False)
    await asyncio.sleep(0.01)
    assert [r["request_id"] for r in a.asked] == ["op-1", "rec"]  # not behind op-2
    answer("rec", "recovery")
    await recovery
    answer("op-1", "list_workflows")
    await first
    await asyncio.sleep(0.01)
    assert [r["request_id"] for r in a.asked] == ["op-1", "rec", "op-2"]
    answer("op-2", "list_workflows")
    await second
    assert a.limits == [True, False, True, False]
