"""Recovery when the chosen peer fails, end to end on `relay dev` with a short reply
timeout: the peer answers ``success: false``, never answers, drops its socket mid-request, leaves workflows
pending, or (a real ``dbos==3.2.0`` executor) is SIGKILLed while the request is in flight — each time the
attempt is audited as failed with its reason and the next peer recovers the dead executor, exactly once. And a
``recovery`` reply lost on the way back (an in-test TCP proxy drops it) leads to a harmless retry and exactly one
deletion, the workflow finishing on the peer."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import (
    DROP,
    AuditRow,
    Process,
    RawPeer,
    Relay,
    audit_rows,
    dbos_executor,
    healthy_answer,
    registry,
    relay_env,
    start_relay,
    wait_recorded,
    wait_until,
    workflow_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]
RECOVERY_TIMEOUT_SECS = 2  # RELAY_RECOVERY_TIMEOUT_SECS: how long a peer has to answer
RECOVERY_OPS = ("executor.dead", "executor.recovery.dispatched", "executor.recovery.failed",
                "executor.recovery.succeeded", "executor.deleted")
TO_EXECUTOR, TO_RELAY = "to executor", "to relay"


@dataclass
class Stack:
    relay: Relay
    temporal: str  # the embedded Temporal's address, for workflow queries

    def status(self, app: str, executor_id: str) -> str | None:
        return registry(self.relay.data_dir, app).get(executor_id)

    def wait_healthy(self, app: str, *executor_ids: str, timeout: float = 10) -> None:
        """HEALTHY in the registry and in the workflow (see ``wait_recorded``)."""
        for executor_id in executor_ids:
            wait_until(lambda e=executor_id: self.status(app, e) == "HEALTHY", timeout=timeout,
                       what=f"{executor_id} HEALTHY")
            wait_recorded(self.temporal, app, executor_id)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("relay-peer-failures")
    env = relay_env(data_dir, RELAY_RECOVERY_TIMEOUT_SECS=str(RECOVERY_TIMEOUT_SECS))
    relay = start_relay(data_dir, env)
    try:
        yield Stack(relay, f"127.0.0.1:{env['RELAY_TEMPORAL_PORT']}")
    finally:
        relay.process.stop()


def _register(relay: Relay, app: str, grace_secs: int) -> None:
    with relay.api() as api:
        assert api.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert api.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": grace_secs}).status_code == 204


def _recovery_rows(relay: Relay, app: str, executor_id: str) -> list[AuditRow]:
    return [r for r in audit_rows(relay.data_dir, app, executor_id) if r.operation in RECOVERY_OPS]


def _assert_one_retry(rows: list[AuditRow], reason: str) -> tuple[str, str]:
    """dead → dispatched → failed (with ``reason``) → dispatched to another peer → succeeded → deleted, once
    each; returns (failed peer, recovering peer)."""
    assert [r.operation for r in rows] == [
        "executor.dead", "executor.recovery.dispatched", "executor.recovery.failed",
        "executor.recovery.dispatched", "executor.recovery.succeeded", "executor.deleted"], rows
    _, first, failed, second, succeeded, deleted = rows
    assert (first.details["attempt"], second.details["attempt"]) == (1, 2)
    assert failed.details["candidate"] == first.details["candidate"]
    assert failed.details["request_id"] == first.details["request_id"]
    assert reason in str(failed.details["reason"]), failed.details
    assert second.details["candidate"] != first.details["candidate"], "the peer that just failed was chosen again"
    assert succeeded.details["candidate"] == second.details["candidate"]
    assert deleted.details["recovered_by"] == second.details["candidate"]
    # Backoff: 1 s (plus up to 20 % jitter) between a failure and the next attempt.
    assert second.emit_time - failed.emit_time >= 0.9, second.emit_time - failed.emit_time
    return str(first.details["candidate"]), str(second.details["candidate"])


# -- raw peers: each failure mode once, whichever peer is chosen first ------------------------------------------

def _fail_success_false(request: dict[str, object]) -> dict[str, object] | str | None:
    return {"type": "recovery", "request_id": request["request_id"], "success": False, "error_message": "disk full"}


def _fail_never_answer(request: dict[str, object]) -> dict[str, object] | str | None:
    return None


def _fail_disconnect(request: dict[str, object]) -> dict[str, object] | str | None:
    return DROP


def _fail_pending_remain(request: dict[str, object]) -> dict[str, object] | str | None:
    return {"type": "exist_pending_workflows", "request_id": request["request_id"], "exist": True,
            "error_message": None}


FAILURES = {
    # name: (request type that fails, the failing answer, what the audit's reason says)
    "success-false": ("recovery", _fail_success_false, "success=false: disk full"),
    "never-answers": ("recovery", _fail_never_answer, "did not answer"),
    "disconnects-mid-request": ("recovery", _fail_disconnect, "disconnected"),
    "pending-workflows-remain": ("exist_pending_workflows", _fail_pending_remain, "pending workflows remain"),
}


class FailFirst:
    """Shared by every peer of a test: the first request of ``kind`` that any of them gets fails as ``failure``
    says; everything else is answered as a healthy peer would. So the test does not depend on which peer Relay
    picks first, only on it picking another one next."""

    def __init__(self, kind: str, failure: Callable[[dict[str, object]], dict[str, object] | str | None]) -> None:
        self.kind, self.failure = kind, failure
        self.failed_request: dict[str, object] | None = None
        self._lock = threading.Lock()

    def __call__(self, request: dict[str, object]) -> dict[str, object] | str | None:
        with self._lock:
            if request["type"] == self.kind and self.failed_request is None:
                self.failed_request = request
                return self.failure(request)
        return healthy_answer(request)


@pytest.mark.parametrize("failure", list(FAILURES))
def test_failed_attempt_moves_on_to_the_next_peer(stack: Stack, failure: str) -> None:
    relay, app = stack.relay, f"peer-fail-{failure}"[:30]
    kind, answer, reason = FAILURES[failure]
    _register(relay, app, 1)
    fail_first = FailFirst(kind, answer)
    peers = [RawPeer(relay.ws_url, app, relay.key, f"peer-{i}", answer=fail_first) for i in (1, 2)]
    dead = RawPeer(relay.ws_url, app, relay.key, "dead")
    try:
        stack.wait_healthy(app, "peer-1", "peer-2", "dead")
        dead.stop()
        wait_until(lambda: "dead" not in registry(relay.data_dir, app), timeout=RECOVERY_TIMEOUT_SECS + 20,
                   what="the dead executor recovered and deleted")
        failed_peer, recovering_peer = _assert_one_retry(_recovery_rows(relay, app, "dead"), reason)
        by_id = {p.executor_id: p for p in peers}
        assert fail_first.failed_request in by_id[failed_peer].requests
        assert [r["executor_ids"] for r in by_id[recovering_peer].requests_of("recovery")] == [["dead"]]
    finally:
        for p in (*peers, dead):
            p.stop()


# -- real executors behind an in-test proxy ------------------------------------------------------------------------

Decide = Callable[[str, str, dict[str, object]], bool]


class FrameProxy:
    """A TCP proxy between one executor and the gateway that reads the WebSocket frames going each way and lets
    ``decide(proxy_name, direction, message)`` withhold a text frame (return False): the frame is never delivered,
    the connection stays up. Frames are whole messages here: Relay never negotiates permessage-deflate, the Python
    SDK's messages are not fragmented, and a withheld frame leaves the stream's framing intact."""

    def __init__(self, name: str, upstream_port: int, decide: Decide) -> None:
        self.name, self._upstream, self._decide = name, upstream_port, decide
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"proxy-{name}", daemon=True).start()

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self._upstream))
            except OSError:
                return
            self._sockets += [client, upstream]
            for src, dst, direction in ((client, upstream, TO_RELAY), (upstream, client, TO_EXECUTOR)):
                threading.Thread(target=self._pump, args=(src, dst, direction), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        buf, upgraded = bytearray(), False
        try:
            while data := src.recv(65536):
                buf += data
                if not upgraded:  # the HTTP upgrade request or response goes through as it is
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        continue
                    dst.sendall(buf[:end + 4])
                    del buf[:end + 4]
                    upgraded = True
                for raw, opcode, payload in _frames(buf):
                    if opcode != 1 or self._decide(self.name, direction, json.loads(payload)):
                        dst.sendall(raw)
        except OSError:
            pass
        finally:  # one side gone: so is the other, as with a direct connection
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


def _frames(buf: bytearray) -> Iterator[tuple[bytes, int, bytes]]:
    """Take each complete frame off the front of ``buf``: (the frame as sent, opcode, unmasked payload)."""
    while len(buf) >= 2:
        length, offset = buf[1] & 0x7F, 2
        if length >= 126:
            size = 2 if length == 126 else 8
            if len(buf) < 2 + size:
                return
            length, offset = int.from_bytes(buf[2:2 + size], "big"), 2 + size
        mask = b""
        if buf[1] & 0x80:  # executor → relay frames are masked
            mask, offset = bytes(buf[offset:offset + 4]), offset + 4
        if len(buf) < offset + length:
            return
        raw, payload = bytes(buf[:offset + length]), bytes(buf[offset:offset + length])
        del buf[:offset + length]
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        yield raw, raw[0] & 0x0F, payload


@dataclass
class Executors:
    """Real dbos==3.2.0 executors of one app sharing a SQLite system database; A runs the workflow."""

    stack: Stack
    tmp: Path
    app: str
    processes: dict[str, Process]
    ids: dict[str, str]

    @property
    def sys_db(self) -> Path:
        return self.tmp / "sys.sqlite"

    @property
    def steps(self) -> Path:
        return self.tmp / "steps"

    def start(self, name: str, ws_url: str, **extra: str) -> None:
        # One at a time: two executors migrating a brand-new SQLite system database at once can crash one.
        known = set(registry(self.stack.relay.data_dir, self.app))
        self.processes[name] = dbos_executor(ws_url, self.stack.relay.key, self.app, self.sys_db,
                                             self.tmp / f"{name}.log", STEP_LOG=str(self.steps), **extra)
        wait_until(lambda: set(registry(self.stack.relay.data_dir, self.app)) - known, timeout=60,
                   what=f"{name} connected")
        [self.ids[name]] = set(registry(self.stack.relay.data_dir, self.app)) - known
        self.stack.wait_healthy(self.app, self.ids[name])

    def steps_by(self, name: str) -> list[int]:
        pid = str(self.processes[name].pid)
        lines = self.steps.read_text().splitlines() if self.steps.exists() else []
        return [int(step) for p, step in (line.split() for line in lines) if p == pid]

    def crash_a_mid_workflow(self, workflow_id: str) -> None:
        (self.tmp / "go").touch()
        wait_until(lambda: len(self.steps_by("a")) >= 3, timeout=30, what="A ran 3 steps")
        self.processes["a"].kill()
        assert workflow_status(self.sys_db, workflow_id) == "PENDING"

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()


@pytest.fixture
def executors(stack: Stack, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Executors]:
    app = request.node.name.removeprefix("test_")[:30].rstrip("_-")
    _register(stack.relay, app, 1)
    group = Executors(stack, tmp_path, app, {}, {})
    try:
        yield group
    finally:
        group.stop()


def _start_a(group: Executors, workflow_id: str) -> None:
    group.start("a", group.stack.relay.ws_url, START_WORKFLOW=workflow_id, START_WORKFLOW_WHEN=str(group.tmp / "go"),
                STEP_SECONDS="0.2")


def test_real_peer_sigkilled_while_recovering(stack: Stack, executors: Executors) -> None:
    """Two real peers, each behind a proxy; the first `recovery` sent to either is held in flight and that peer
    is SIGKILLed: the attempt fails as a disconnect, the other peer recovers, the workflow finishes there."""
    workflow_id, lock = "sigkill-peer-wf", threading.Lock()
    held: dict[str, dict[str, object]] = {}

    def hold_first_recovery(proxy: str, direction: str, message: dict[str, object]) -> bool:
        with lock:
            if direction == TO_EXECUTOR and message["type"] == "recovery" and not held:
                held[proxy] = message
                return False
        return True

    port = int(stack.relay.url.rsplit(":", 1)[1])
    proxies = {name: FrameProxy(name, port, hold_first_recovery) for name in ("p1", "p2")}
    try:
        _start_a(executors, workflow_id)
        for name, proxy in proxies.items():
            executors.start(name, proxy.ws_url, STEP_SECONDS="0.2")
        executors.crash_a_mid_workflow(workflow_id)
        wait_until(lambda: held, timeout=20, what="a recovery request in flight")
        [(victim, request)] = held.items()
        assert request["executor_ids"] == [executors.ids["a"]]
        executors.processes[victim].kill()
        survivor = "p2" if victim == "p1" else "p1"

        wait_until(lambda: workflow_status(executors.sys_db, workflow_id) == "SUCCESS", timeout=60,
                   what="the workflow SUCCESS on the surviving peer")
        wait_until(lambda: executors.ids["a"] not in registry(stack.relay.data_dir, executors.app), timeout=10,
                   what="A deleted")
        failed, recovered = _assert_one_retry(_recovery_rows(stack.relay, executors.app, executors.ids["a"]),
                                              "disconnected")
        assert (failed, recovered) == (executors.ids[victim], executors.ids[survivor])
        by_survivor = executors.steps_by(survivor)
        assert by_survivor and sorted(set(executors.steps_by("a")) | set(by_survivor)) == list(range(20))
    finally:
        for proxy in proxies.values():
            proxy.close()


def test_lost_recovery_reply_is_retried_harmlessly(stack: Stack, executors: Executors) -> None:
    """The only peer recovers the workflow but its reply is dropped on the way: the attempt times out, the same
    peer is asked again (it finds nothing left, and says so), and the dead executor is deleted exactly once."""
    workflow_id = "lost-reply-wf"
    dropped: list[dict[str, object]] = []

    def drop_first_recovery_reply(proxy: str, direction: str, message: dict[str, object]) -> bool:
        if direction == TO_RELAY and message["type"] == "recovery" and not dropped:
            dropped.append(message)
            return False
        return True

    proxy = FrameProxy("peer", int(stack.relay.url.rsplit(":", 1)[1]), drop_first_recovery_reply)
    try:
        _start_a(executors, workflow_id)
        executors.start("peer", proxy.ws_url, STEP_SECONDS="0.2")
        executors.crash_a_mid_workflow(workflow_id)
        wait_until(lambda: dropped, timeout=20, what="the recovery reply dropped")
        assert dropped[0]["success"] is True  # the peer did the work; Relay never heard it

        wait_until(lambda: workflow_status(executors.sys_db, workflow_id) == "SUCCESS", timeout=60,
                   what="the workflow SUCCESS on the peer")
        a_id = executors.ids["a"]
        wait_until(lambda: a_id not in registry(stack.relay.data_dir, executors.app),
                   timeout=RECOVERY_TIMEOUT_SECS + 20, what="A deleted")
        rows = _recovery_rows(stack.relay, executors.app, a_id)
        ops = [r.operation for r in rows]
        assert ops[0] == "executor.dead" and ops[-2:] == ["executor.recovery.succeeded", "executor.deleted"], ops
        assert ops.count("executor.deleted") == 1 and ops.count("executor.recovery.succeeded") == 1, ops
        dispatched = [r for r in rows if r.operation == "executor.recovery.dispatched"]
        failures = [r for r in rows if r.operation == "executor.recovery.failed"]
        assert len(dispatched) == 2 and len(failures) == 1, ops
        assert {r.details["candidate"] for r in dispatched} == {executors.ids["peer"]}
        assert "did not answer" in str(failures[0].details["reason"]), failures[0].details
        # The retry re-ran nothing: every step ran once, A's before the crash and the peer's after.
        by_peer = executors.steps_by("peer")
        assert by_peer and len(by_peer) == len(set(by_peer))
        assert sorted(set(executors.steps_by("a")) | set(by_peer)) == list(range(20))
        # Only the step A was in when killed may run twice: it logs its line just before DBOS checkpoints it.
        by_a = executors.steps_by("a")
        assert set(by_a) & set(by_peer) <= {max(by_a)}
    finally:
        proxy.close()
