"""Alerts end to end: `relay dev` evaluating every 2 s, a real `dbos==3.2.0` executor whose workflow fails, and a
local HTTP receiver (``http.server`` in a thread) standing in for the webhook.

A WorkflowFailure rule fires once: the receiver gets one POST signed with HMAC-SHA256 over the exact body, the
executor logs the ``alert`` message (the SDK logs "Alert: <name> | Message: ..." when the app set no handler), and
the audit log has ``alert.sent`` for both channels. Stopping the app's only executor then fires its
UnresponsiveApplication rule (its ``alert`` message has no executor left to go to: audited as failed). The webhook
secret never appears in Relay's output; ``relay alerts list`` shows both rules.

Relay's own alerts go out as they happen, with the alerts round left at its test default (30 days, so it never
runs): a recovery blocked for want of a peer of its version is POSTed as ``RecoveryBlocked`` within a couple of
seconds of its audit row, and ``RecoveryUnblocked`` follows once a peer of the version connects and the recovery
goes ahead.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from core import alerts
from tests.support import (
    VENV_BIN,
    RawPeer,
    Relay,
    audit_rows_at,
    dbos_executor,
    free_port,
    healthy_answer,
    relay_env,
    running_relay,
    wait_until,
    workflow_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]
APP = "alerting"
SECRET = "e2e-webhook-secret-not-for-logs"
RECEIVED_AT = "test-received-at"  # not a header sent: the receiver's note of when the POST arrived


@dataclass
class Receiver:
    """A webhook receiver on a free port, recording every POST as (headers, body)."""

    port: int
    # (headers, body) of each POST; the headers also carry RECEIVED_AT, when it arrived (``time.time()``).
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def of_kind(self, kind: str, app: str = APP) -> list[tuple[dict[str, str], dict[str, Any]]]:
        out = []
        for headers, body in list(self.posts):
            payload: dict[str, Any] = json.loads(body)
            if (payload["kind"], payload["app"]) == (kind, app):
                out.append((headers, payload))
        return out


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    port = free_port()
    received = Receiver(port)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            received.posts.append(({**headers, RECEIVED_AT: str(time.time())}, body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="alert-receiver", daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Relay]:
    with running_relay(tmp_path_factory.mktemp("relay-alerts"), RELAY_ALERT_INTERVAL_SECS="2",
                       RELAY_ALERT_WEBHOOK_URL=receiver.url, RELAY_ALERT_WEBHOOK_SECRET=SECRET) as started:
        yield started


def _rule(relay: Relay, body: dict[str, Any], app: str = APP) -> str:
    with relay.api() as client:
        response = client.post(f"/v2/orgs/local/apps/{app}/alerting-rules", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _alert_audit(relay: Relay, app: str = APP) -> list[tuple[str, Any, Any]]:
    return [(r.operation, r.details.get("kind"), r.details.get("channel")) for r in audit_rows_at(relay.db_url, app)
            if r.operation.startswith("alert.")]


def _status(sys_db: Path, workflow_id: str) -> str | None:
    try:
        return workflow_status(sys_db, workflow_id)
    except sqlite3.OperationalError:  # the executor is still creating its system database
        return None


def test_workflow_failure_then_unresponsive(relay: Relay, receiver: Receiver, tmp_path: Path) -> None:
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
    failure_rule = _rule(relay, {"ruleType": "WorkflowFailure", "ruleMetadata": {}, "minIntervalSecs": 3600})
    sys_db = tmp_path / "sys.db"
    # GATED_WORKFLOWS without GATE_DIR: the workflow's first step raises KeyError, and the workflow ends in ERROR.
    executor = dbos_executor(relay.ws_url, relay.key, APP, sys_db, tmp_path / "executor.log",
                             GATED_WORKFLOWS="doomed-1")
    try:
        wait_until(lambda: _status(sys_db, "doomed-1") == "ERROR", timeout=30, what="the workflow to fail")
        wait_until(lambda: receiver.of_kind("WorkflowFailure"), timeout=20, what="the WorkflowFailure webhook")
        wait_until(lambda: "Alert: WorkflowFailure | Message:" in executor.output(), timeout=10,
                   what="the executor's alert log line")
        wait_until(lambda: ("alert.sent", "WorkflowFailure", "executor") in _alert_audit(relay), timeout=10,
                   what="the executor channel's audit row")
        [(headers, payload)] = receiver.of_kind("WorkflowFailure")
        [(_, body)] = [(h, b) for h, b in receiver.posts if json.loads(b)["kind"] == "WorkflowFailure"]
        assert alerts.verify(body, SECRET, headers["x-relay-signature"])
        expected = {"org": "local", "app": APP, "kind": "WorkflowFailure", "ruleId": failure_rule}
        assert expected.items() <= payload.items()
        assert "1 workflow(s)" in payload["message"] and payload["time"].endswith("Z")
        assert ("alert.sent", "WorkflowFailure", "webhook") in _alert_audit(relay)
        with relay.api() as client:
            [rule] = client.get(f"/v2/orgs/local/apps/{APP}/alerting-rules").json()
        assert rule["lastFiredAt"] is not None

        wait_until(lambda: relay.executors(APP) and set(relay.executors(APP).values()) == {"HEALTHY"}, timeout=10,
                   what="the executor HEALTHY")
        _rule(relay, {"ruleType": "UnresponsiveApplication", "ruleMetadata": {"thresholdSecs": 1}})
    finally:
        executor.stop()
    wait_until(lambda: receiver.of_kind("UnresponsiveApplication"), timeout=20, what="the unresponsive webhook")
    # Nobody is left to take the ``alert`` message: that channel's failure is audited too.
    wait_until(lambda: ("alert.failed", "UnresponsiveApplication", "executor") in _alert_audit(relay), timeout=10,
               what="the executor channel's failure")
    assert len(receiver.of_kind("WorkflowFailure")) == 1  # fired once
    listed = subprocess.run([str(VENV_BIN / "relay"), "alerts", "list", "--app", APP, "-o", "json", "--url", relay.url],
                            env={**os.environ, "RELAY_API_KEY": relay.key}, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert {r["ruleType"] for r in json.loads(listed.stdout)} == {"WorkflowFailure", "UnresponsiveApplication"}
    assert SECRET not in relay.process.output()


def test_slow_queue_on_the_wire(relay: Relay, receiver: Receiver) -> None:
    """A raw protocol peer plays the executor, to check the exact frames: the aggregate query Relay sends for a
    SlowQueue rule, and the ``alert`` message it sends when the rule fires."""
    app = "slow-queue"
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
    enqueued_at_ms = time.time_ns() // 1_000_000 - 120_000  # waiting for two minutes

    def answer(request: dict[str, object]) -> dict[str, object]:
        reply: dict[str, object] = {"type": request["type"], "request_id": request["request_id"],
                                    "error_message": None}
        if request["type"] == "get_workflow_aggregates":
            reply["output"] = [{"group": {"queue_name": "payments"}, "count": 3, "min_created_at": enqueued_at_ms}]
        else:
            reply["success"] = True
        return reply

    peer = RawPeer(relay.ws_url, app, relay.key, "slow-peer", answer=answer)
    try:
        wait_until(lambda: relay.executors(app) == {"slow-peer": "HEALTHY"}, timeout=10, what="the peer HEALTHY")
        _rule(relay, {"ruleType": "SlowQueue", "ruleMetadata": {"queueName": "payments", "thresholdSecs": 60},
                      "minIntervalSecs": 3600}, app)
        wait_until(lambda: receiver.of_kind("SlowQueue", app), timeout=20, what="the SlowQueue webhook")
        wait_until(lambda: peer.requests_of("alert"), timeout=10, what="the alert message")
        [query] = peer.requests_of("get_workflow_aggregates")[:1]
        assert query["body"] == {"group_by_queue_name": True, "select_count": True, "select_min_created_at": True,
                                 "status": ["ENQUEUED"], "queue_name": ["payments"]}
        [alert] = peer.requests_of("alert")
        assert alert["name"] == "SlowQueue" and "queue 'payments'" in str(alert["message"])
        metadata = alert["metadata"]
        assert isinstance(metadata, dict) and (metadata["app"], metadata["kind"]) == (app, "SlowQueue")
        assert all(isinstance(v, str) for v in metadata.values())  # the SDK's AlertRequest: Dict[str, str]
        [(_, payload)] = receiver.of_kind("SlowQueue", app)
        waited = re.search(r"has waited (\d+) s \(threshold 60 s\)", payload["message"])
        assert waited is not None and 120 <= int(waited.group(1)) < 150, payload["message"]
        wait_until(lambda: ("alert.sent", "SlowQueue", "executor") in _alert_audit(relay, app), timeout=10,
                   what="the executor channel's audit row")
    finally:
        peer.stop()


# -- Relay's own alerts, as they happen ------------------------------------------------------------------------

# The audit row → webhook POST delay a blocked recovery's alert must beat: the old round's took up to its interval.
AT_ONCE = 3.0


@pytest.fixture(scope="module")
def relay_without_rounds(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Relay]:
    """`relay dev` with the alerts round left at the tests' 30 days (``relay_env``): no round ever runs."""
    data_dir = tmp_path_factory.mktemp("relay-own-alerts")
    env = relay_env(data_dir, RELAY_ALERT_WEBHOOK_URL=receiver.url)
    assert int(env["RELAY_ALERT_INTERVAL_SECS"]) >= 86400
    with running_relay(data_dir, env) as started:
        yield started


def _answer_alerts(request: dict[str, object]) -> dict[str, object] | str | None:
    """A peer whose SDK has an alert handler: ``alert`` succeeds, the rest as a healthy peer answers."""
    if request["type"] == "alert":
        return {"type": "alert", "request_id": request["request_id"], "success": True, "error_message": None}
    return healthy_answer(request)


def _delay(relay: Relay, receiver: Receiver, app: str, operation: str, kind: str) -> float:
    """Seconds from the audit row of ``operation`` to the arrival of its alert's POST."""
    [row] = [r for r in audit_rows_at(relay.db_url, app) if r.operation == operation]
    [(headers, _)] = receiver.of_kind(kind, app)
    return float(headers[RECEIVED_AT]) - row.emit_time


def test_a_blocked_recovery_is_alerted_at_once_and_its_end_too(relay_without_rounds: Relay,
                                                               receiver: Receiver) -> None:
    relay, app = relay_without_rounds, "own-alerts"
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 1}).status_code == 204
    peers = [RawPeer(relay.ws_url, app, relay.key, "doomed", version="v1"),
             RawPeer(relay.ws_url, app, relay.key, "bystander", version="v2", answer=_answer_alerts)]
    try:
        wait_until(lambda: relay.executors(app) == {"doomed": "HEALTHY", "bystander": "HEALTHY"}, timeout=15,
                   what="both peers HEALTHY")
        peers[0].stop()  # the only v1 executor: its recovery is blocked
        wait_until(lambda: receiver.of_kind("RecoveryBlocked", app), timeout=20, what="the RecoveryBlocked webhook")
        blocked = _delay(relay, receiver, app, "executor.recovery.blocked", "RecoveryBlocked")
        [(headers, payload)] = receiver.of_kind("RecoveryBlocked", app)
        assert headers["x-relay-alert-id"] == payload["id"] and payload["ruleId"] is None
        assert "doomed" in payload["message"] and "no HEALTHY executor of version 'v1'" in payload["message"]
        assert not receiver.of_kind("RecoveryUnblocked", app)  # still blocked

        peers.append(RawPeer(relay.ws_url, app, relay.key, "rescuer", version="v1", answer=_answer_alerts))
        wait_until(lambda: receiver.of_kind("RecoveryUnblocked", app), timeout=20,
                   what="the RecoveryUnblocked webhook")
        unblocked = _delay(relay, receiver, app, "executor.recovery.unblocked", "RecoveryUnblocked")
        wait_until(lambda: "doomed" not in relay.executors(app), timeout=20, what="doomed recovered and deleted")
        [(_, resolved)] = receiver.of_kind("RecoveryUnblocked", app)
        assert "goes ahead via rescuer" in resolved["message"] and resolved["id"] != payload["id"]
        assert [r.details["candidate"] for r in audit_rows_at(relay.db_url, app)
                if r.operation == "executor.recovery.succeeded"] == ["rescuer"]
        wait_until(lambda: sorted((r.details["kind"], r.details["channel"]) for r in audit_rows_at(relay.db_url, app)
                                  if r.operation == "alert.sent") == [
            ("RecoveryBlocked", "executor"), ("RecoveryBlocked", "webhook"),
            ("RecoveryUnblocked", "executor"), ("RecoveryUnblocked", "webhook")], timeout=15,
                   what="both alerts audited as sent on both channels")
    finally:
        for peer in peers:
            peer.stop()
    print(f"\naudit row -> webhook POST: RecoveryBlocked {blocked:.2f} s, RecoveryUnblocked {unblocked:.2f} s "
          f"(alerts round: every {relay.env['RELAY_ALERT_INTERVAL_SECS']} s)")
    assert blocked < AT_ONCE and unblocked < AT_ONCE, (blocked, unblocked)
