"""A registry row always gets its lifecycle workflow back (``workflows.reconcile``), end to end on `relay dev`.

- Temporal's state lost: an executor DISCONNECTED (grace running) when Relay stopped; the embedded Temporal's
  database removed (as after moving to a fresh cluster); Relay started again on its own database. The executor is
  declared DEAD a full grace after the restart and recovered by a live peer, which is never itself recovered.
- A lifecycle workflow terminated by hand while its executor is connected: the next round starts it again, the
  executor stays HEALTHY, and its socket closing is heard (DISCONNECTED)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from core.temporal import connect as temporal_connect
from tests.support import (
    RawPeer,
    audit_rows,
    play_executor,
    relay_env,
    running_relay,
    wait_recorded,
    wait_until,
)
from workflows.contracts.common import lifecycle_workflow_id

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

GRACE_SECS = 4


def _reconciled(data_dir: Path, app: str, executor_id: str) -> list[dict[str, object]]:
    return [row.details for row in audit_rows(data_dir, app, executor_id) if row.operation == "executor.reconciled"]


def test_an_executor_stranded_by_a_lost_temporal_is_recovered_after_a_full_grace(tmp_path: Path) -> None:
    env = relay_env(tmp_path)
    peer: RawPeer | None = None
    with running_relay(tmp_path, env, log="first.log") as first:
        with first.api() as client:
            client.put("/v2/orgs/local/apps/strand")
            assert client.patch("/v2/orgs/local/apps/strand",
                                json={"executorTimeoutSecs": GRACE_SECS}).status_code == 204
        peer = RawPeer(first.ws_url, "strand", first.key, "peer-1")
        wait_until(lambda: first.executors("strand").get("peer-1") == "HEALTHY", timeout=10, what="peer HEALTHY")
        with play_executor(first, "strand", "gone-1"):
            wait_until(lambda: first.executors("strand").get("gone-1") == "HEALTHY", timeout=10, what="HEALTHY")
            wait_recorded(first.temporal_address, "strand", "gone-1")
        wait_until(lambda: first.executors("strand").get("gone-1") == "DISCONNECTED", timeout=5,
                   what="DISCONNECTED")
    # Temporal's state is lost with its grace timer; Relay's own database is intact.
    for path in tmp_path.glob("temporal.db*"):
        path.unlink()

    restarted_at = time.monotonic()
    with running_relay(tmp_path, env, log="second.log") as second:
        try:
            dead_at = wait_until(lambda: second.executors("strand").get("gone-1") in ("DEAD", None), timeout=40,
                                 what="DEAD after the restart")
            recovered_at = wait_until(lambda: "gone-1" not in second.executors("strand"), timeout=40,
                                      what="recovered and deleted")
            print(f"\nrestart → DEAD {dead_at - restarted_at:.2f} s, → recovered {recovered_at - restarted_at:.2f} s "
                  f"(grace {GRACE_SECS} s)")
            assert dead_at - restarted_at >= GRACE_SECS  # a full grace from when Relay noticed, never less
            found = _reconciled(tmp_path, "strand", "gone-1")
            assert [f["found"] for f in found] == ["DISCONNECTED"], found
            ops = [row.operation for row in audit_rows(tmp_path, "strand", "gone-1")]
            assert ops[ops.index("executor.reconciled"):] == [
                "executor.reconciled", "executor.disconnected", "executor.dead", "executor.recovery.dispatched",
                "executor.recovery.succeeded", "executor.deleted"], ops
            assert peer is not None
            recoveries = peer.requests_of("recovery")
            assert [r["executor_ids"] for r in recoveries] == [["gone-1"]], recoveries
            # The live peer was never declared dead, whatever its row said after the restart.
            assert "executor.dead" not in [row.operation for row in audit_rows(tmp_path, "strand", "peer-1")]
            assert second.executors("strand").get("peer-1") == "HEALTHY"
        finally:
            if peer is not None:
                peer.stop()


def test_a_lifecycle_terminated_by_hand_is_started_again_and_keeps_its_executor(tmp_path: Path) -> None:
    with running_relay(tmp_path, RELAY_RECONCILE_INTERVAL_SECS="1") as relay:
        with relay.api() as client:
            client.put("/v2/orgs/local/apps/byhand")
            assert client.patch("/v2/orgs/local/apps/byhand",
                                json={"executorTimeoutSecs": GRACE_SECS}).status_code == 204
        with play_executor(relay, "byhand", "kept-1"):
            wait_until(lambda: relay.executors("byhand").get("kept-1") == "HEALTHY", timeout=10, what="HEALTHY")
            wait_recorded(relay.temporal_address, "byhand", "kept-1")

            async def terminate() -> None:
                client = await temporal_connect(relay.temporal_address, "default")
                handle = client.get_workflow_handle(lifecycle_workflow_id("local", "byhand", "kept-1"))
                await handle.terminate("terminated by hand in the test")

            asyncio.run(terminate())
            wait_until(lambda: _reconciled(tmp_path, "byhand", "kept-1"), timeout=20, what="executor.reconciled")
            [found] = _reconciled(tmp_path, "byhand", "kept-1")
            assert (found["found"], found["outcome"]) == ("HEALTHY", "its gateway holds a live socket"), found
            time.sleep(GRACE_SECS + 1)  # a grace wrongly started would have ended here
            assert relay.executors("byhand").get("kept-1") == "HEALTHY"
        # The socket closes: the new workflow hears it.
        wait_until(lambda: relay.executors("byhand").get("kept-1") == "DISCONNECTED", timeout=10,
                   what="DISCONNECTED after the close")
        ops = [row.operation for row in audit_rows(tmp_path, "byhand", "kept-1")]
        assert "executor.dead" not in ops and "executor.disconnected" in ops, ops
