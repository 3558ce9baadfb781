"""A recovery request that carries its confirmation (``DispatchRecoveryInput.confirm``, lifecycle generation 5): the
gateway sends ``exist_pending_workflows`` on the same socket right after a successful ``recovery`` reply and answers
both; after a failed recovery it asks nothing more, and without ``confirm`` (a workflow of generation 4) it sends
the recovery alone, as before."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from core import wire
from core.models import make_engine
from core.store import Store
from gateway.activities import HubActivities
from gateway.hub import Connection, Hub
from gateway.session import Reply, Session
from workflows.contracts.common import ConnectedSignal, ExecutorInfo
from workflows.contracts.lifecycle import (
    DispatchRecoveryInput,
    ExistPendingInput,
    ExistPendingReply,
    RecoveryReply,
    WriteAuditInput,
)

ORG, APP, PEER, DEAD = "o", "a", "peer-1", "dead-1"
TIMEOUT = timedelta(seconds=5)


def _peer(hub: Hub, *, recovered: bool, pending: bool,
          on_send: Callable[[], None] = lambda: None) -> list[dict[str, object]]:
    """A peer's socket in ``hub`` that answers each request as an SDK would (calling ``on_send`` as each comes);
    the frames it was sent."""
    sent: list[dict[str, object]] = []

    async def send(frame: str) -> None:
        on_send()
        request = json.loads(frame)
        sent.append(request)
        body = ({"success": recovered} if request["type"] == "recovery" else {"exist": pending})
        reply = wire.parse_reply(json.dumps({"type": request["type"], "request_id": request["request_id"], **body}))
        asyncio.get_running_loop().call_soon(conn.deliver, Reply(reply))

    conn = _attach(hub, PEER, "c1", send)
    return sent


def _attach(hub: Hub, executor_id: str, connection_id: str, send: Callable[[str], Awaitable[None]]) -> Connection:
    """A socket of ``executor_id`` held by ``hub``, with the `connected` signal its gateway sent, as ``gateway.ws``
    makes one; ``send`` gets every frame written to it."""

    async def close(code: int, reason: str) -> None:
        pass

    conn = Connection(connection_id=connection_id, org=ORG, app=APP, executor_id=executor_id, session=Session(),
                      send=send, close=close)
    conn.signal = ConnectedSignal(connection_id=connection_id, gateway_queue="relay-gateway-test",
                                  info=ExecutorInfo(executor_id), signal_id=f"s-{connection_id}")
    hub.attach(conn)
    return conn


def _dispatch(confirm: bool) -> DispatchRecoveryInput:
    question = ExistPendingInput(PEER, DEAD, "v1", request_id="r-confirm", timeout=TIMEOUT, org=ORG, app=APP)
    return DispatchRecoveryInput(PEER, [DEAD], "r-recover", TIMEOUT, org=ORG, app=APP,
                                 confirm=question if confirm else None)


@pytest.mark.parametrize("pending", [False, True])
async def test_a_successful_recovery_is_confirmed_on_the_same_socket_in_the_same_activity(pending: bool) -> None:
    hub = Hub()
    sent = _peer(hub, recovered=True, pending=pending)
    reply = await ActivityEnvironment().run(HubActivities(hub).dispatch_recovery, _dispatch(confirm=True))
    assert reply == RecoveryReply(True, None, confirmed=ExistPendingReply(pending, None))
    assert [(f["type"], f["request_id"]) for f in sent] == [
        ("recovery", "r-recover"), ("exist_pending_workflows", "r-confirm")]
    assert (sent[1]["executor_id"], sent[1]["application_version"]) == (DEAD, "v1")


async def test_a_failed_recovery_asks_no_confirmation_and_a_request_without_one_asks_none() -> None:
    hub = Hub()
    sent = _peer(hub, recovered=False, pending=False)
    failed = await ActivityEnvironment().run(HubActivities(hub).dispatch_recovery, _dispatch(confirm=True))
    assert failed == RecoveryReply(False, None) and [f["type"] for f in sent] == ["recovery"]

    hub = Hub()
    sent = _peer(hub, recovered=True, pending=False)
    alone = await ActivityEnvironment().run(HubActivities(hub).dispatch_recovery, _dispatch(confirm=False))
    assert alone == RecoveryReply(True, None) and [f["type"] for f in sent] == ["recovery"]


def _audit_row() -> WriteAuditInput:
    return WriteAuditInput(ORG, APP, DEAD, "executor.recovery.dispatched", "wf/dispatched/1", "success",
                           {"candidate": PEER, "attempt": 1, "request_id": "r-recover"})


async def test_the_dispatched_row_sent_along_is_written_once_by_the_gateway_before_the_request(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The gateway writes the `dispatched` row the request carries, under its key, before it sends the request, and
    says so; a retried activity (the same key) finds it landed and says so too, and the console line is said once,
    with the workflow's id as the worker's lines carry it. A gateway without a store (or whose database is away)
    says it did not, and the workflow writes it."""
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    store.ensure_app(ORG, APP)
    rows_when_sent: list[int] = []

    def dispatched_rows() -> int:
        return len([r for r in store.list_audit(ORG, app=APP) if r.operation == "executor.recovery.dispatched"])

    try:
        hub = Hub()
        sent = _peer(hub, recovered=True, pending=False, on_send=lambda: rows_when_sent.append(dispatched_rows()))
        request = dataclasses.replace(_dispatch(confirm=True), audit=_audit_row())
        caplog.set_level(logging.INFO, logger="relay.gateway")
        first = await ActivityEnvironment().run(HubActivities(hub, store=store).dispatch_recovery, request)
        again = await ActivityEnvironment().run(HubActivities(hub, store=store).dispatch_recovery, request)
        assert first.audited and again.audited and first.confirmed == ExistPendingReply(False, None)
        assert dispatched_rows() == 1 and rows_when_sent[0] == 1  # written before the request went out
        [row] = [r for r in store.list_audit(ORG, app=APP) if r.operation == "executor.recovery.dispatched"]
        assert (row.event_key, row.executor_id, row.details) == ("wf/dispatched/1", DEAD, _audit_row().details)
        assert len(sent) == 4
        [line] = [r for r in caplog.records if "dispatched to" in r.getMessage()]
        assert line.getMessage() == f"recovery of executor {DEAD} of {ORG}/{APP} dispatched to {PEER} (attempt 1)"
        assert (line.__dict__["workflow_id"], line.__dict__["request_id"]) == (
            ActivityEnvironment().info.workflow_id, "r-recover")

        without = await ActivityEnvironment().run(HubActivities(hub).dispatch_recovery, request)
        assert not without.audited and without.success
    finally:
        store.engine.dispose()


def _dead_here(hub: Hub) -> ConnectedSignal:
    """The dead executor back on this gateway: a socket of it in ``hub`` (nothing is ever sent to it here)."""

    async def refuse(frame: str) -> None:
        raise AssertionError(f"sent to the dead executor: {frame}")

    signal = _attach(hub, DEAD, "c-dead", refuse).signal
    assert signal is not None
    return signal


async def test_the_dead_executor_here_is_the_answer_when_asked_to_look_and_a_refusal_when_not(
        tmp_path: Path) -> None:
    """Asked to look (lifecycle generation 6: the fence's last look is this gateway's own), a socket of the executor
    to recover answers the request with its connection: nothing sent to the peer, no `dispatched` row. Not asked
    (older workflows), the request is refused with ``ExecutorAlive``, as before. Either way nothing is sent."""
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    store.ensure_app(ORG, APP)
    try:
        hub = Hub()
        sent = _peer(hub, recovered=True, pending=False)
        signal = _dead_here(hub)
        request = dataclasses.replace(_dispatch(confirm=True), audit=_audit_row())
        activities = HubActivities(hub, store=store)

        looked = await ActivityEnvironment().run(activities.dispatch_recovery, dataclasses.replace(request, look=True))
        assert (looked.success, looked.alive, looked.audited, looked.confirmed) == (False, signal, False, None)
        with pytest.raises(ApplicationError) as refused:
            await ActivityEnvironment().run(activities.dispatch_recovery, request)
        assert refused.value.type == "ExecutorAlive" and refused.value.non_retryable
        assert sent == [] and [r.operation for r in store.list_audit(ORG, app=APP)] == ["app.registered"]

        hub.detach(hub.get(ORG, APP, DEAD))
        gone = await ActivityEnvironment().run(activities.dispatch_recovery, dataclasses.replace(request, look=True))
        assert gone.success and gone.alive is None and [f["type"] for f in sent] == [
            "recovery", "exist_pending_workflows"]
    finally:
        store.engine.dispose()
