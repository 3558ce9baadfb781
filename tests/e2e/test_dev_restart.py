"""`relay dev` as a process tree: SIGTERM stops everything (no `temporal` left behind), and a second start on
the same data directory resumes where the first stopped — same dev key, grace timers still running."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import play_executor, relay_env, running_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]


def _children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


def test_restart_resumes_and_sigterm_leaves_nothing(tmp_path: Path) -> None:
    env = relay_env(tmp_path)
    with running_relay(tmp_path, env, log="first.log") as first:
        [temporal_pid] = _children(first.process.pid)
        assert "temporal" in Path(f"/proc/{temporal_pid}/cmdline").read_text()
        with first.api() as client:
            client.put("/v2/orgs/local/apps/restart-app")
            assert client.patch("/v2/orgs/local/apps/restart-app", json={"executorTimeoutSecs": 6}).status_code == 204
        with play_executor(first, "restart-app", "ex-r"):
            wait_until(lambda: first.executors("restart-app").get("ex-r") == "HEALTHY", timeout=10, what="HEALTHY")
        wait_until(lambda: first.executors("restart-app").get("ex-r") == "DISCONNECTED", timeout=2,
                   what="DISCONNECTED")
    assert not Path(f"/proc/{temporal_pid}").exists() or _is_zombie(temporal_pid), "temporal left behind"

    with running_relay(tmp_path, env, log="second.log") as second:
        assert second.key == first.key
        # The grace timer started under the first run fires under the second: DEAD, then waiting for a peer.
        wait_until(lambda: second.executors("restart-app").get("ex-r") == "DEAD", timeout=20, what="DEAD")
        ops = [op for op, ex in second.audit("restart-app") if ex == "ex-r"]
        assert ops[:3] == ["executor.healthy", "executor.disconnected", "executor.dead"], ops
    assert os.path.exists(tmp_path / "temporal.db")


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True
