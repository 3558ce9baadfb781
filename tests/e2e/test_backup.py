"""The backup runbook (docs/pages/guides/backup-restore.md), on Debian's PostgreSQL: Relay's database alone is enough to
carry on.

``pg_dump`` of Relay's database while an executor is DISCONNECTED (its grace running), restored into a fresh
database, Relay started on it with a fresh Temporal (a new data dir: Temporal's state is not restored): the keys
authenticate, apps and their settings are intact, a reconnecting executor is HEALTHY, and the one that was
DISCONNECTED at the dump is recovered by it (``workflows.reconcile``) — a full grace after Relay noticed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.postgres import PostgresCluster, postgres_cluster
from tests.support import RawPeer, audit_rows_at, play_executor, running_relay, wait_recorded, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

APP = "backup-app"
GRACE_SECS = 5


def _pg(cluster: PostgresCluster, tool: str, *args: str) -> None:
    subprocess.run([str(cluster.bin / tool), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "relay", *args],
                   check=True, capture_output=True, timeout=60)


def test_relays_database_alone_restores_keys_apps_and_recovers_what_was_disconnected(tmp_path: Path) -> None:
    with postgres_cluster() as cluster:
        source = cluster.create_database()
        first_dir, second_dir = tmp_path / "first", tmp_path / "second"
        first_dir.mkdir()
        second_dir.mkdir()
        # A fixed gateway identity, as the deploy manifests set: the restored registry names the same gateway, which
        # answers the fence's probe at once (a new identity would be probed until it times out).
        peer: RawPeer | None = None
        with running_relay(first_dir, RELAY_DATABASE_URL=source, RELAY_GATEWAY_ID="gw-1") as first:
            try:
                with first.api() as client:
                    assert client.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
                    assert client.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": GRACE_SECS}
                                        ).status_code == 204
                    created = client.post("/v2/orgs/local/tokens/ops", json={"appNames": [APP]})
                    assert created.status_code == 201, created.text
                    token = created.json()["token"]
                    app_before = client.get(f"/v2/orgs/local/apps/{APP}").json()
                peer = RawPeer(first.ws_url, APP, first.key, "peer-b")
                wait_until(lambda: first.executors(APP).get("peer-b") == "HEALTHY", timeout=10, what="peer HEALTHY")
                with play_executor(first, APP, "lost-b"):
                    wait_until(lambda: first.executors(APP).get("lost-b") == "HEALTHY", timeout=10, what="HEALTHY")
                    wait_recorded(first.temporal_address, APP, "lost-b")
                wait_until(lambda: first.executors(APP).get("lost-b") == "DISCONNECTED", timeout=5, what="DISCONNECTED")
                dump = tmp_path / "relay.dump"
                started = time.monotonic()
                _pg(cluster, "pg_dump", "-Fc", "-f", str(dump), source.rsplit("/", 1)[1])
                dumped_in = time.monotonic() - started
            finally:
                if peer is not None:
                    peer.stop()

        target = cluster.create_database()
        started = time.monotonic()
        _pg(cluster, "pg_restore", "--no-owner", "-d", target.rsplit("/", 1)[1], str(dump))
        restored_in = time.monotonic() - started
        restarted_at = time.monotonic()
        peer = None
        with running_relay(second_dir, RELAY_DATABASE_URL=target, RELAY_GATEWAY_ID="gw-1") as second:
            try:
                # The token made before the dump authenticates; the app and its settings are as they were.
                with httpx.Client(base_url=second.url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as ops:
                    got = ops.get(f"/v2/orgs/local/apps/{APP}")
                    assert got.status_code == 200, got.text
                    live = ("status", "language")  # from the executors connected now, not stored settings
                    assert {k: v for k, v in got.json().items() if k not in live} == {
                        k: v for k, v in app_before.items() if k not in live}
                    assert got.json()["executorTimeoutSecs"] == GRACE_SECS
                peer = RawPeer(second.ws_url, APP, token, "peer-b")  # reconnects, with the restored token
                wait_until(lambda: second.executors(APP).get("peer-b") == "HEALTHY", timeout=15, what="peer HEALTHY")
                recovered_at = wait_until(lambda: "lost-b" not in second.executors(APP), timeout=40,
                                          what="the executor DISCONNECTED at the dump recovered")
                print(f"\npg_dump {dumped_in:.2f} s, pg_restore {restored_in:.2f} s; start on the restored database → "
                      f"recovered {recovered_at - restarted_at:.2f} s (grace {GRACE_SECS} s)")
                assert [r["executor_ids"] for r in peer.requests_of("recovery")] == [["lost-b"]]
                ops_lost = [row.operation for row in audit_rows_at(second.db_url, APP, "lost-b")]
                assert ops_lost[ops_lost.index("executor.reconciled"):][:3] == [
                    "executor.reconciled", "executor.disconnected", "executor.dead"], ops_lost
                assert ops_lost[-1] == "executor.deleted", ops_lost
                assert "executor.dead" not in [row.operation for row in audit_rows_at(second.db_url, APP, "peer-b")]
            finally:
                if peer is not None:
                    peer.stop()
