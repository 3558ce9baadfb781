"""Deploys without recoveries: SIGTERM to a `relay gateway` holding executor sockets, behind a stand-in
load balancer that sends new connections only to gateways whose ``/readyz`` answers 200. The gateway turns not-ready
at once, refuses new upgrades (503, ``Retry-After``) but keeps its sockets for RELAY_SHUTDOWN_DRAIN_SECS, then
closes them with 1012; its executors reconnect through the load balancer to the other gateway within their grace,
so none is ever DEAD and nothing is recovered; it retires, and exits 0 within the drain and 10 s. And SIGTERM to a
`relay worker`: its ``/readyz`` (on the metrics listener) is 200 while it polls, 503 once the signal came, and it
exits 0. Real processes: a Temporal dev server, `relay worker`, two `relay gateway`s on one SQLite database.

Run with ``-s`` for the timeline of the drain (the figures quoted when the behaviour changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import RetryPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from core.temporal import connect as temporal_connect
from tests.support import (
    VENV_BIN,
    Process,
    RawPeer,
    audit_rows,
    free_port,
    healthy,
    ready,
    registry,
    relay_env,
    start_gateways,
    start_temporal,
    wait_recorded,
    wait_until,
)
from workflows.contracts.alerts import Alert, SendAlertWebhookInput, WebhookResult
from workflows.contracts.common import SHARED_TASK_QUEUE, Activity, gateway_workflow_id, lifecycle_workflow_id

pytestmark = pytest.mark.e2e
DRAIN = 3.0  # RELAY_SHUTDOWN_DRAIN_SECS: longer than the proxy's check interval, and than a refusal's 1 s delay
HEARTBEAT_TIMEOUT = 2.0
GRACE = 4  # executorTimeoutSecs: the reconnection must beat it; DEAD would come this long after a disconnect
EXECUTORS = 6
APP = "drained"
CHECK_EVERY = 0.2  # the stand-in load balancer's readiness checks


class ReadyProxy:
    """A stand-in load balancer: a TCP proxy (its own event loop, in a thread) that sends each new connection to the
    next backend, round robin, among those whose ``/readyz`` answered 200 at its last check (every
    ``CHECK_EVERY``); with none ready, it closes the connection. Connections already open stay where they are."""

    def __init__(self, backends: list[int]) -> None:
        self.port = free_port()
        self.backends = backends
        self.ready: list[int] = []
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ready-proxy", daemon=True)
        self._thread.start()
        self._server, self._checks = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> tuple[asyncio.Server, asyncio.Task[None]]:
        return await asyncio.start_server(self._accept, "127.0.0.1", self.port), asyncio.create_task(self._check())

    async def _check(self) -> None:
        async with httpx.AsyncClient(timeout=1) as http:
            while True:
                ready = []
                for port in self.backends:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                            ready.append(port)
                self.ready = ready
                await asyncio.sleep(CHECK_EVERY)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ready = self.ready
        if not ready:
            writer.close()
            return
        port, self._next = ready[self._next % len(ready)], self._next + 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def stop(self) -> None:
        """Stop listening, drop the connections still proxied, and close the loop."""
        async def stop() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


class Peer(RawPeer):
    """A protocol executor (``RawPeer``) that notes when each of its sockets was closed by the server, and how, and
    when each handshake was done."""

    def __init__(self, ws_url: str, key: str, executor_id: str) -> None:
        self.closes: list[tuple[float, int | None]] = []  # (monotonic time, close code received)
        self.handshake_times: list[float] = []
        super().__init__(ws_url, APP, key, executor_id)

    @property
    def handshakes(self) -> int:
        return len(self.handshake_times)

    @handshakes.setter
    def handshakes(self, count: int) -> None:  # RawPeer counts them: note when
        if count > len(self.handshake_times):
            self.handshake_times.append(time.monotonic())

    def _serve(self, ws: ClientConnection) -> str | None:
        try:
            return super()._serve(ws)
        except ConnectionClosed as err:
            self.closes.append((time.monotonic(), err.rcvd.code if err.rcvd is not None else None))
            raise


@dataclass
class Stack:
    env: dict[str, str]
    data_dir: Path
    key: str
    gateways: list[Process]
    ports: list[int]
    proxy: ReadyProxy

    def lb_ws(self) -> str:
        return f"ws://127.0.0.1:{self.proxy.port}/"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """Temporal dev server, `relay worker`, two `relay gateway`s draining DRAIN seconds, the proxy in front."""
    processes: list[Process] = []
    proxy: ReadyProxy | None = None
    try:
        started = start_gateways(tmp_path, processes, RELAY_SHUTDOWN_DRAIN_SECS=str(DRAIN),
                                 RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS=str(HEARTBEAT_TIMEOUT))
        env, key, ports, gateways = started.env, started.key, started.ports, started.processes
        proxy = ReadyProxy(ports)
        wait_until(lambda: len(proxy.ready) == 2, timeout=10, what="both gateways ready at the proxy")
        yield Stack(env, tmp_path, key, gateways, ports, proxy)
    finally:
        if proxy is not None:
            proxy.stop()
        for process in reversed(processes):
            process.stop()


def test_sigterm_drains_a_gateway_and_its_executors_move_without_a_recovery(stack: Stack) -> None:
    doomed, survivor = stack.gateways
    doomed_url = f"http://127.0.0.1:{stack.ports[0]}"
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.ports[1]}",
                      headers={"Authorization": f"Bearer {stack.key}"}) as api:
        assert api.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
        assert api.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": GRACE}).status_code == 204
    ids = [f"x{n}" for n in range(EXECUTORS)]
    peers = [Peer(stack.lb_ws(), stack.key, executor_id) for executor_id in ids]
    try:
        wait_until(lambda: registry(stack.data_dir, APP) == dict.fromkeys(ids, "HEALTHY"), timeout=20,
                   what="every executor HEALTHY through the proxy")
        for executor_id in ids:
            wait_recorded(stack.env["RELAY_TEMPORAL_ADDRESS"], APP, executor_id)
        doomed_queue, survivor_queue = _queue(stack.data_dir, "gateway-1"), _queue(stack.data_dir, "gateway-2")
        held = {ex for ex, queue in _placed(stack.data_dir).items() if queue == doomed_queue}
        assert 0 < len(held) < EXECUTORS, _placed(stack.data_dir)  # round robin: some on each gateway

        signalled = time.monotonic()
        doomed.popen.send_signal(signal.SIGTERM)
        flipped = wait_until(lambda: not ready(doomed_url, timeout=0.5), timeout=2, interval=0.01,
                             what="/readyz 503 after SIGTERM")
        closed_before_flip = [p.executor_id for p in peers if p.closes]
        assert healthy(doomed_url)  # alive and serving: only not ready
        status, retry_after = _refused_upgrade(f"ws://127.0.0.1:{stack.ports[0]}/", stack.key)
        refused = time.monotonic()
        closed_while_refusing = [p.executor_id for p in peers if p.closes]
        code = doomed.popen.wait(DRAIN + 10 + 5)
        exited = time.monotonic()
        wait_until(lambda: set(_placed(stack.data_dir).values()) == {survivor_queue}
                   and registry(stack.data_dir, APP) == dict.fromkeys(ids, "HEALTHY"), timeout=GRACE,
                   what="every executor HEALTHY on the other gateway")
        moved = time.monotonic()

        closes = [(t, c, p.executor_id) for p in peers for t, c in p.closes]
        back = max((p.handshake_times[-1] for p in peers if p.executor_id in held), default=float("nan"))
        first_close = min((t for t, _, _ in closes), default=float("nan"))
        last_close = max((t for t, _, _ in closes), default=float("nan"))
        print(f"\ndrain timeline, seconds after SIGTERM (RELAY_SHUTDOWN_DRAIN_SECS={DRAIN:g}, {len(held)} of "
              f"{EXECUTORS} executors on the gateway): /readyz 503 at +{flipped - signalled:.3f}; new upgrade refused "
              f"{status} (Retry-After {retry_after}) at +{refused - signalled:.3f}; first socket closed at "
              f"+{first_close - signalled:.3f}, last at +{last_close - signalled:.3f} "
              f"(codes {sorted({c for _, c, _ in closes}, key=str)}); the last of them back (handshake done on the "
              f"other gateway) at +{back - signalled:.3f}; exit {code} at +{exited - signalled:.3f}; every executor "
              f"seen HEALTHY on the other gateway by +{moved - signalled:.3f}")

        assert code == 0, doomed.output()[-3000:]
        assert closed_before_flip == [] and closed_while_refusing == [], "a socket closed before the drain ended"
        assert (status, retry_after) == (503, "1")
        assert {ex for _, _, ex in closes} == held and {c for _, c, _ in closes} == {1012}, closes
        assert flipped < first_close and first_close - signalled >= DRAIN - 0.05, (flipped, first_close, signalled)
        assert exited - signalled <= DRAIN + 10
        assert all(p.handshakes == 2 for p in peers if p.executor_id in held)
        assert all(p.handshakes == 1 for p in peers if p.executor_id not in held)

        # Nothing DEAD for longer than a grace after the moves, and nothing recovered.
        _stays_healthy(stack.data_dir, ids, GRACE + 1)
        bad = [(r.operation, r.executor_id) for r in audit_rows(stack.data_dir, APP)
               if r.operation == "executor.dead" or r.operation.startswith("executor.recovery.")]
        assert bad == [], bad
    finally:
        for peer in peers:
            peer.stop()

    # Retired once its sockets were closed: its watch ends without a probe, and no fence probed it either.
    assert _gone_reason(stack.data_dir, doomed_queue) == "retired"
    address = stack.env["RELAY_TEMPORAL_ADDRESS"]
    wait_until(lambda: _watch_ended(address, gateway_workflow_id(doomed_queue)), timeout=HEARTBEAT_TIMEOUT + 10,
               what="the retired gateway's watch ended")
    assert _probed(address, gateway_workflow_id(doomed_queue)) == []
    for executor_id in ids:
        assert doomed_queue not in _probed(address, lifecycle_workflow_id("local", APP, executor_id))
    assert survivor.popen.poll() is None
    assert stack.key not in doomed.output()


def test_a_second_sigterm_cuts_the_drain_short(stack: Stack) -> None:
    doomed = stack.gateways[0]
    peer = Peer(f"ws://127.0.0.1:{stack.ports[0]}/", stack.key, "impatient")
    try:
        wait_until(lambda: registry(stack.data_dir, APP) == {"impatient": "HEALTHY"}, timeout=20, what="HEALTHY")
        signalled = time.monotonic()
        doomed.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: not ready(f"http://127.0.0.1:{stack.ports[0]}", timeout=0.5), timeout=2, interval=0.01,
                   what="/readyz 503 after SIGTERM")
        doomed.popen.send_signal(signal.SIGTERM)
        code = doomed.popen.wait(DRAIN + 10)
        exited = time.monotonic()
    finally:
        peer.stop()
    assert code == 0, doomed.output()[-3000:]
    assert [c for _, c in peer.closes] == [1012]
    assert peer.closes[0][0] - signalled < DRAIN - 1, "the second SIGTERM did not cut the drain short"
    print(f"\nsecond SIGTERM: socket closed at +{peer.closes[0][0] - signalled:.3f}, exit at "
          f"+{exited - signalled:.3f} s (drain {DRAIN:g} s)")


class SlowReceiver:
    """An alert webhook receiver (a thread) that holds each POST ``hold`` seconds before it answers 204: the
    worker's ``send_alert_webhook`` activity is in flight meanwhile. ``arrived`` is set when a POST came in;
    ``answered`` holds when each answer was sent, ``failed`` the answers the worker no longer read."""

    def __init__(self, hold: float) -> None:
        self.arrived = threading.Event()
        self.answered: list[float] = []
        self.failed: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.arrived.set()
                time.sleep(hold)  # the activity in flight, whatever the worker is told meanwhile
                try:
                    self.send_response(204)
                    self.end_headers()
                    receiver.answered.append(time.monotonic())
                except OSError as err:
                    receiver.failed.append(repr(err))

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.port = free_port()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="slow-receiver", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


WEBHOOK_HOLD = 2.0


@workflow.defn(name="DrainTestCallsTheWorker", sandboxed=False)
class CallsTheWorker:
    """Runs one activity of `relay worker`, by name on its task queue: its alert webhook POST."""

    @workflow.run
    async def run(self, input: SendAlertWebhookInput) -> WebhookResult:
        result: WebhookResult = await workflow.execute_activity(
            Activity.SEND_ALERT_WEBHOOK, input, result_type=WebhookResult, task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy(maximum_attempts=1))
        return result


async def test_sigterm_to_the_worker_turns_it_not_ready_and_it_finishes_its_activities(tmp_path: Path) -> None:
    """`relay worker`'s /readyz (on its metrics listener) is 200 while it polls. One of its activities (an alert
    webhook POST, to a receiver that takes WEBHOOK_HOLD to answer) is in flight when SIGTERM comes: /readyz turns 503,
    the activity completes, and only then does the worker exit, 0."""
    receiver = SlowReceiver(WEBHOOK_HOLD)
    temporal, address = start_temporal(tmp_path)
    port = free_port()
    env = relay_env(tmp_path, RELAY_TEMPORAL_ADDRESS=address, RELAY_METRICS_PORT=str(port),
                    RELAY_TEMPORAL_METRICS_PORT="0", RELAY_ALERT_WEBHOOK_URL=receiver.url)
    worker = Process([str(VENV_BIN / "relay"), "worker"], env=env, log=tmp_path / "worker.log")
    url = f"http://127.0.0.1:{port}"
    answers: list[tuple[float, int | None]] = []  # (monotonic time, /readyz status; None: nothing listens)
    done = threading.Event()
    watcher = threading.Thread(target=_watch_readiness, args=(url, answers, done), daemon=True)
    try:
        await asyncio.to_thread(wait_until, lambda: ready(url), timeout=60, what="the worker's /readyz 200")
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            assert "relay_executors" in (await http.get("/metrics")).text  # the listener's own job goes on
        watcher.start()
        await asyncio.to_thread(wait_until, lambda: bool(answers), timeout=5, what="the first readiness answer")
        client = await temporal_connect(address, "default")
        queue = f"drain-test-{uuid.uuid4()}"
        async with Worker(client, task_queue=queue, workflows=[CallsTheWorker],
                          workflow_runner=UnsandboxedWorkflowRunner()):
            alert = Alert(str(uuid.uuid4()), "local", APP, APP, "RecoveryBlocked", "held", datetime.now(UTC))
            call = await client.start_workflow(CallsTheWorker.run, SendAlertWebhookInput(alert), id=queue,
                                               task_queue=queue)
            await asyncio.to_thread(wait_until, receiver.arrived.is_set, timeout=30, what="the webhook POST")
            signalled = time.monotonic()
            worker.popen.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(worker.popen.wait, 30)
            exited = time.monotonic()
            result = await asyncio.wait_for(call.result(), 10)
    finally:
        done.set()
        worker.stop()
        temporal.stop()
        receiver.stop()
    watcher.join(10)
    before = {status for t, status in answers if t < signalled}
    after = [status for t, status in answers if t >= signalled]
    first_503 = next((t for t, status in answers if t >= signalled and status == 503), float("nan"))
    answered = min(receiver.answered, default=float("nan"))
    print(f"\nworker SIGTERM with an activity in flight (a webhook POST, {WEBHOOK_HOLD:g} s to answer): /readyz 503 "
          f"at +{first_503 - signalled:.3f}, the POST answered at +{answered - signalled:.3f}, exit {code} at "
          f"+{exited - signalled:.3f} s")
    assert code == 0, worker.output()[-3000:]
    assert result == WebhookResult(configured=True, status=204)  # the activity finished, and its result landed
    assert before == {200}, before
    assert 503 in after and set(after) <= {200, 503, None}, after
    assert 200 not in after[after.index(503):], after  # never ready again once it said it is stopping
    assert first_503 < answered < exited and not receiver.failed, receiver.failed
    assert exited - signalled < WEBHOOK_HOLD + 15  # the graceful shutdown's bound


def _watch_readiness(url: str, answers: list[tuple[float, int | None]], done: threading.Event) -> None:
    with httpx.Client(timeout=2) as http:
        while not done.is_set():
            try:
                status: int | None = http.get(f"{url}/readyz").status_code
            except httpx.HTTPError:
                status = None
            answers.append((time.monotonic(), status))
            done.wait(0.05)


def _refused_upgrade(ws_url: str, key: str) -> tuple[int, str | None]:
    """Status and ``Retry-After`` of the answer to an executor upgrade that the gateway refuses."""
    try:
        with connect(f"{ws_url}websocket/{APP}/{key}", open_timeout=5):
            pass
    except InvalidStatus as err:
        return err.response.status_code, err.response.headers.get("Retry-After")
    raise AssertionError("the upgrade was accepted")


def _stays_healthy(data_dir: Path, ids: list[str], seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen = registry(data_dir, APP)
        assert set(seen) == set(ids) and "DEAD" not in seen.values(), seen
        time.sleep(0.2)
    assert registry(data_dir, APP) == dict.fromkeys(ids, "HEALTHY")


def _db(data_dir: Path, query: str, *args: str) -> list[tuple[str, ...]]:
    with contextlib.closing(sqlite3.connect(data_dir / "relay.db", timeout=10)) as db:
        return [tuple(row) for row in db.execute(query, args).fetchall()]


def _queue(data_dir: Path, identity: str) -> str:
    [(queue,)] = _db(data_dir, "SELECT queue FROM gatewayprocess WHERE identity = ?", identity)
    return queue


def _gone_reason(data_dir: Path, queue: str) -> str | None:
    [(reason,)] = _db(data_dir, "SELECT gone_reason FROM gatewayprocess WHERE queue = ? AND gone_at IS NOT NULL",
                      queue)
    return reason


def _placed(data_dir: Path) -> dict[str, str]:
    """Executor id → the task queue of the gateway holding its socket, as the registry says."""
    return {ex: queue for ex, queue in _db(data_dir, "SELECT executor_id, gateway_queue FROM executor WHERE app = ?",
                                           APP)}


def _watch_ended(address: str, workflow_id: str) -> bool:
    async def ended() -> bool:
        client = await temporal_connect(address, "default")
        description = await client.get_workflow_handle(workflow_id).describe()
        return description.status is not None and description.status != WorkflowExecutionStatus.RUNNING

    return asyncio.run(ended())


def _probed(address: str, workflow_id: str) -> list[str]:
    """The task queue of every ``probe_gateway`` activity the workflow's latest run scheduled."""
    async def probes() -> list[str]:
        client = await temporal_connect(address, "default")
        return [e.activity_task_scheduled_event_attributes.task_queue.name
                async for e in client.get_workflow_handle(workflow_id).fetch_history_events()
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and e.activity_task_scheduled_event_attributes.activity_type.name == Activity.PROBE_GATEWAY]

    return asyncio.run(probes())
