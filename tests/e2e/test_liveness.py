"""Liveness and the executor socket's hardening, against `relay dev` with shortened timings:
ping wait 2 s, server ping every 0.5 s, handshake timeout 1 s, frames over 64 KiB refused."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.frames import Opcode
from websockets.sync.client import connect

from gateway.liveness import ECHO_AFTER
from tests.rawclient import RawClient
from tests.support import VENV_BIN, Process, Relay, play_executor, relay_env, running_relay, wait_until

pytestmark = pytest.mark.e2e
PING_WAIT = 2.0
EXECUTOR_APP = Path(__file__).parents[1] / "executor_app.py"


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    data_dir = tmp_path_factory.mktemp("fast-relay")
    env = relay_env(data_dir, RELAY_EXECUTOR_PING_WAIT_SECS=str(PING_WAIT), RELAY_SERVER_PING_INTERVAL_SECS="0.5",
                    RELAY_HANDSHAKE_TIMEOUT_SECS="1", RELAY_MAX_MESSAGE_BYTES=str(64 * 1024),
                    RELAY_ALLOWED_ORIGINS="https://ops.example")
    with running_relay(data_dir, env) as relay:
        with relay.api() as client:
            for app in ("live-app", "sigstop-app"):
                client.put(f"/v2/orgs/local/apps/{app}")
                client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 60})
        yield relay
    # Keys never reach the logs; the only place the dev key is printed is `relay dev`'s banner.
    log = "\n".join(line for line in relay.process.output().splitlines() if "dev key:" not in line)
    assert relay.key[5:] not in log


def _url(relay: Relay, app: str = "live-app", key: str | None = None) -> str:
    return f"{relay.ws_url}websocket/{app}/{key or relay.key}"


def _status(relay: Relay, executor_id: str) -> str | None:
    return relay.executors("live-app").get(executor_id)


def test_close_is_disconnected_within_half_a_second(fast: Relay) -> None:
    delays = []
    for trial in range(8):
        executor_id = f"closer-{trial}"
        with play_executor(fast, "live-app", executor_id):
            wait_until(lambda: _status(fast, executor_id) == "HEALTHY", timeout=10, what="HEALTHY")  # noqa: B023
        closed = time.monotonic()
        seen = wait_until(lambda: _status(fast, executor_id) == "DISCONNECTED", timeout=2,  # noqa: B023
                          interval=0.01, what="DISCONNECTED")
        delays.append(seen - closed)
    assert max(delays) <= 0.5, delays


def test_silent_executor_is_disconnected_at_the_ping_wait(fast: Relay) -> None:
    client = RawClient(_url(fast))
    try:
        client.handshake("silent-1")
        last_frame = time.monotonic()  # nothing is sent (or answered) after this
        wait_until(lambda: _status(fast, "silent-1") == "HEALTHY", timeout=5, what="HEALTHY")
        seen = wait_until(lambda: _status(fast, "silent-1") == "DISCONNECTED", timeout=PING_WAIT + 3,
                          interval=0.02, what="DISCONNECTED")
        assert PING_WAIT - 0.2 <= seen - last_frame <= PING_WAIT + 1.0
    finally:
        client.close()


def test_client_that_only_pings_is_never_dropped(fast: Relay) -> None:
    client = RawClient(_url(fast))
    try:
        client.handshake("pinger-1")
        wait_until(lambda: _status(fast, "pinger-1") == "HEALTHY", timeout=5, what="HEALTHY")
        deadline = time.monotonic() + 3 * PING_WAIT
        while time.monotonic() < deadline:
            client.send_ping()  # it never reads, so it never answers the server's pings
            time.sleep(0.5)
        assert _status(fast, "pinger-1") == "HEALTHY"
    finally:
        client.close()


def test_a_java_executor_gets_a_second_pong_after_its_ping(fast: Relay) -> None:
    """An executor that says it is Java gets one unsolicited pong ``ECHO_AFTER`` after a ping of its own (its client
    may arm its pong timer after the first pong has come, gateway.liveness); an executor of another language gets
    only the pongs to its pings. Both ping every 0.5 s (the ping wait here is 2 s) for one ECHO_AFTER and a second."""
    clients = {language: RawClient(_url(fast)) for language in ("java", "python")}
    try:
        for language, client in clients.items():
            client.handshake(f"echo-{language}", language=language)
            wait_until(lambda: _status(fast, f"echo-{language}") == "HEALTHY", timeout=5,  # noqa: B023
                       what="HEALTHY")
            client.events.clear()
        began = time.monotonic()
        sent = 0
        while time.monotonic() - began < ECHO_AFTER.total_seconds() + 1.0:
            for client in clients.values():
                client.send_ping()  # payload b"p": the pongs to these carry it
            sent += 1
            time.sleep(0.5)
        for client in clients.values():
            client.send_ping()
            client.read_until(lambda frames: sum(1 for f in frames if f.opcode is Opcode.PONG and f.data == b"p")
                              == sent + 1, timeout=2)  # every ping's pong is in
        pongs = {language: [bytes(f.data) for f in client.events if f.opcode is Opcode.PONG]
                 for language, client in clients.items()}
        assert pongs["python"] == [b"p"] * (sent + 1), pongs["python"]
        unasked = [p for p in pongs["java"] if p != b"p"]
        assert unasked == [b""] * len(unasked) and 1 <= len(unasked) <= 2, pongs["java"]  # one an ECHO_AFTER
    finally:
        for client in clients.values():
            client.close()


def test_client_that_only_answers_server_pings_is_never_dropped(fast: Relay) -> None:
    with connect(_url(fast), ping_interval=None) as ws:  # the library answers pings; it sends none itself
        request = json.loads(ws.recv(timeout=5))
        ws.send(json.dumps({"type": "executor_info", "request_id": request["request_id"],
                            "executor_id": "ponger-1", "application_version": "v1"}))
        wait_until(lambda: _status(fast, "ponger-1") == "HEALTHY", timeout=5, what="HEALTHY")
        time.sleep(3 * PING_WAIT)  # the property under test is "nothing happens for a while"
        assert _status(fast, "ponger-1") == "HEALTHY"


def test_second_connection_supersedes_the_first(fast: Relay) -> None:
    first = RawClient(_url(fast))
    try:
        first.handshake("twin-1")
        wait_until(lambda: _status(fast, "twin-1") == "HEALTHY", timeout=5, what="HEALTHY")
        with play_executor(fast, "live-app", "twin-1"):
            assert first.close_code(timeout=5) == 4000
            time.sleep(0.5)  # let the old socket's late `disconnected` arrive; it must change nothing
            assert _status(fast, "twin-1") == "HEALTHY"
            ops = [op for op, ex in fast.audit("live-app") if ex == "twin-1"]
            assert ops == ["executor.healthy", "executor.superseded"], ops
    finally:
        first.close()


def test_handshake_timeout_closes(fast: Relay) -> None:
    client = RawClient(_url(fast))
    try:
        assert client.recv_json()["type"] == "executor_info"
        started = time.monotonic()
        assert client.close_code(timeout=5) == 1008
        assert 0.8 <= time.monotonic() - started <= 2.5
    finally:
        client.close()


@pytest.mark.parametrize(("reply", "reason"), [
    ("{not json", "invalid JSON"),
    (json.dumps({"type": "recovery", "request_id": "{rid}", "success": True}), "expected an executor_info"),
    (json.dumps({"type": "executor_info", "request_id": "{rid}"}), "executor_id"),
])
def test_malformed_handshake_reply_closes_and_is_audited(fast: Relay, reply: str, reason: str) -> None:
    client = RawClient(_url(fast))
    try:
        request = client.recv_json()
        client.send_text(reply.replace("{rid}", request["request_id"]))
        assert client.close_code(timeout=5) == 1002
    finally:
        client.close()
    wait_until(lambda: any(reason in (d or "") for d in _protocol_errors(fast)), timeout=5, what="audit row")


def _protocol_errors(relay: Relay, executor_id: str | None = None) -> list[str]:
    with sqlite3.connect(relay.data_dir / "relay.db") as db:
        rows = db.execute("SELECT details, executor_id FROM auditlog WHERE operation = 'executor.protocol_error' "
                          "ORDER BY emit_time").fetchall()
    return [json.loads(d)["reason"] for d, ex in rows if executor_id is None or ex == executor_id]


def test_oversize_frame_closes_with_1009(fast: Relay) -> None:
    client = RawClient(_url(fast))
    try:
        client.handshake("big-1")
        wait_until(lambda: _status(fast, "big-1") == "HEALTHY", timeout=5, what="HEALTHY")
        client.send_text("x" * (65 * 1024))
        assert client.close_code(timeout=5) == 1009
        wait_until(lambda: _status(fast, "big-1") == "DISCONNECTED", timeout=2, what="DISCONNECTED")
    finally:
        client.close()


def test_foreign_origin_is_refused_before_upgrade(fast: Relay) -> None:
    refused = RawClient(_url(fast), origin="https://evil.example")
    allowed = RawClient(_url(fast), origin="https://ops.example")
    try:
        assert refused.response is not None and refused.response.status_code == 403
        assert allowed.accepted
    finally:
        refused.close()
        allowed.close()


def test_wrong_key_retrying_every_second_is_refused_cheaply_and_quietly(fast: Relay) -> None:
    bad = "dbos_" + "x" * 43
    before = fast.process.output().count("refused executor connection")
    for _ in range(5):
        client = RawClient(_url(fast, key=bad))
        assert client.response is not None and client.response.status_code == 401
        client.close()
    output = fast.process.output()
    assert output.count("refused executor connection") - before <= 1  # rate-limited
    assert bad not in output and bad[5:] not in output


def test_sigstopped_executor_disconnects_at_ping_wait_then_reconnects(fast: Relay, tmp_path: Path) -> None:
    env = {"PATH": str(VENV_BIN), "RELAY_URL": fast.ws_url, "RELAY_KEY": fast.key, "APP_NAME": "sigstop-app",
           "SYS_DB": str(tmp_path / "sys.sqlite"), "STEP_LOG": str(tmp_path / "steps.log")}
    executor = Process([sys.executable, str(EXECUTOR_APP)], env=env, log=tmp_path / "executor.log")
    try:
        wait_until(lambda: list(fast.executors("sigstop-app").values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        [executor_id] = fast.executors("sigstop-app")
        os.kill(executor.pid, signal.SIGSTOP)
        stopped = time.monotonic()  # its last frame (a pong) is at most one server ping interval earlier
        seen = wait_until(lambda: fast.executors("sigstop-app").get(executor_id) == "DISCONNECTED",
                          timeout=PING_WAIT + 3, interval=0.02, what="DISCONNECTED")
        assert PING_WAIT - 1.5 <= seen - stopped <= PING_WAIT + 1.0
        os.kill(executor.pid, signal.SIGCONT)
        wait_until(lambda: fast.executors("sigstop-app").get(executor_id) == "HEALTHY", timeout=20,
                   what="HEALTHY after SIGCONT")
        ops = [op for op, ex in fast.audit("sigstop-app") if ex == executor_id and op.startswith("executor.")]
        assert ops == ["executor.healthy", "executor.disconnected", "executor.reconnected"], ops
    finally:
        os.kill(executor.pid, signal.SIGCONT)
        executor.stop()


def test_malformed_frame_after_the_handshake_is_audited_and_the_socket_stays(fast: Relay) -> None:
    client = RawClient(_url(fast))
    try:
        client.handshake("garbler-1")
        wait_until(lambda: _status(fast, "garbler-1") == "HEALTHY", timeout=5, what="HEALTHY")
        client.send_text("{this is not json")
        client.send_text(json.dumps({"type": "exist_pending_workflows", "request_id": "r-1"}))  # no `exist`
        wait_until(lambda: len(_protocol_errors(fast, "garbler-1")) == 2, timeout=5, what="both audited")
        first, second = _protocol_errors(fast, "garbler-1")
        assert "invalid JSON" in first and "exist" in second
        time.sleep(0.3)
        assert _status(fast, "garbler-1") == "HEALTHY"
        client.send_ping()  # the socket is still served
    finally:
        client.close()


def test_repeated_handshake_failures_are_audited_once_a_minute(fast: Relay) -> None:
    before = len(_protocol_errors(fast))
    for _ in range(4):  # a broken client retrying every second, as the SDKs do
        client = RawClient(_url(fast))
        try:
            request = client.recv_json()
            client.send_text(json.dumps({"type": "recovery", "request_id": request["request_id"], "success": 1}))
            assert client.close_code(timeout=5) == 1002  # every one is still refused
        finally:
            client.close()
    assert len(_protocol_errors(fast)) - before <= 1
