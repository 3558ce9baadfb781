"""The recovery gate end to end, on one `relay dev` with a short pace (RELAY_RECOVERY_PACE_SECS=1):

- the storm: 12 executors of one app — 2 real ``dbos==3.2.0`` executors that survive (they answer ``recovery`` and
  ``exist_pending_workflows`` as the SDK does) and 10 protocol-level peers that die together. The breaker trips once,
  the 10 recoveries go one per pace, no survivor carries more than its fair share + 1, and all 10 are deleted;
- below the storm: a third of 27 protocol-level peers die together: none is held, all are recovered at once;
- drain: a real executor, drained with the CLI, is never sent an operator's request until it is undrained.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_cli import relay_cli
from tests.sdk import SDKS
from tests.support import (
    Process,
    RawPeer,
    Relay,
    audit_rows_at,
    registry_at,
    running_relay,
    wait_recorded,
    wait_until,
)

pytestmark = pytest.mark.e2e

PACE = 1.0  # RELAY_RECOVERY_PACE_SECS: Temporal fires shorter timers about a second late
RECHECK = 1  # RELAY_RECOVERY_PAUSE_RECHECK_SECS
PYTHON = SDKS["python"]


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    with running_relay(tmp_path_factory.mktemp("relay-storm"), RELAY_RECOVERY_PACE_SECS=str(PACE),
                       RELAY_RECOVERY_STORM_WINDOW_SECS="30", RELAY_RECOVERY_STORM_SHARE="0.5",
                       RELAY_RECOVERY_STORM_MIN_EXECUTORS="3",
                       RELAY_RECOVERY_PAUSE_RECHECK_SECS=str(RECHECK)) as started:
        yield started


def _register(relay: Relay, app: str, *, grace_secs: int) -> None:
    with relay.api() as api:
        assert api.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert api.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": grace_secs}).status_code == 204


def _survivors(relay: Relay, tmp: Path, app: str, count: int) -> tuple[list[Process], list[str]]:
    """Real executors, started one at a time (two migrating a new SQLite system database at once can crash one)."""
    sys_db = PYTHON.system_database(tmp, None)
    processes: list[Process] = []
    def healthy() -> int:
        return list(relay.executors(app).values()).count("HEALTHY")

    for n in range(count):
        processes.append(PYTHON.start(relay, tmp, f"survivor-{n}", app, sys_db))
        wait_until(lambda: healthy() == len(processes), timeout=60, what=f"survivor {n} HEALTHY")
    return processes, list(relay.executors(app))


def test_a_storm_is_paced_spread_alerted_once_and_fully_recovered(relay: Relay, tmp_path: Path) -> None:
    app = "storm"
    _register(relay, app, grace_secs=1)
    survivors, survivor_ids = _survivors(relay, tmp_path, app, 2)
    doomed = [RawPeer(relay.ws_url, app, relay.key, f"doomed-{n}") for n in range(10)]
    try:
        wait_until(lambda: len(relay.executors(app)) == 12, timeout=30, what="12 executors")
        for peer in doomed:
            wait_recorded(relay.temporal_address, app, peer.executor_id)

        # Together: every socket closed at the same moment.
        threads = [threading.Thread(target=peer.stop) for peer in doomed]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        wait_until(lambda: set(registry_at(relay.db_url, app)) == set(survivor_ids), timeout=40,
                   what="all 10 recovered and deleted")
        rows = audit_rows_at(relay.db_url, app)
        dispatched = [r for r in rows if r.operation == "executor.recovery.dispatched"]
        assert sorted(r.executor_id or "" for r in dispatched) == sorted(p.executor_id for p in doomed)
        times = sorted(r.emit_time for r in dispatched)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        print(f"pacing gaps (s) at {PACE} s: min {min(gaps):.3f} median {statistics.median(gaps):.3f} "
              f"max {max(gaps):.3f}; all {[round(g, 3) for g in gaps]}")
        assert min(gaps) >= PACE * 0.5, gaps  # paced: never two at once
        assert PACE * 0.85 <= statistics.median(gaps) <= PACE * 1.3, gaps  # at the rate
        carried = Counter(str(r.details["candidate"]) for r in dispatched)
        assert set(carried) <= set(survivor_ids)
        fair = 10 // len(survivor_ids)
        assert max(carried.values()) <= fair + 1, carried
        assert [r.operation for r in rows].count("app.recovery.breaker_tripped") == 1
        deleted = {r.executor_id for r in rows if r.operation == "executor.deleted"}
        assert deleted == {p.executor_id for p in doomed}
        assert not [r for r in rows if r.operation == "executor.recovery.failed"]
        with relay.api() as api:
            status = api.get(f"/v2/orgs/local/apps/{app}/recovery").json()
        assert status["breaker"]["trips"] == 1 and status["waiting"] == []
    finally:
        for peer in doomed:
            peer.stop()
        for process in survivors:
            process.stop()


def test_a_third_dying_together_is_no_storm_and_nobody_waits(relay: Relay) -> None:
    """Under the storm share nothing is held, however far apart the clocks of the dead executors'
    workflows are when they ask the gate. 9 of 27 close at once: all recovered a moment after their grace."""
    app = "a-third"
    grace = 3
    _register(relay, app, grace_secs=grace)
    survivors = [RawPeer(relay.ws_url, app, relay.key, f"stays-{n}") for n in range(18)]
    doomed = [RawPeer(relay.ws_url, app, relay.key, f"goes-{n}") for n in range(9)]
    try:
        wait_until(lambda: len(relay.executors(app)) == 27, timeout=30, what="27 executors")
        for peer in doomed:
            wait_recorded(relay.temporal_address, app, peer.executor_id)

        closed = time.monotonic()
        threads = [threading.Thread(target=peer.stop) for peer in doomed]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        gone = {p.executor_id for p in doomed}
        recovered = wait_until(lambda: not gone & set(registry_at(relay.db_url, app)), timeout=60,
                               what="all 9 recovered and deleted")
        print(f"below the storm: all 9 recovered {recovered - closed:.2f} s after the close (grace {grace} s)")
        rows = audit_rows_at(relay.db_url, app)
        assert [r.details for r in rows if r.operation == "executor.recovery.held"] == []
        assert [r.details for r in rows if r.operation == "app.recovery.breaker_tripped"] == []
        assert recovered - closed <= grace + 6, f"recovered {recovered - closed:.1f} s after the close"
        succeeded = Counter(r.executor_id for r in rows if r.operation == "executor.recovery.succeeded")
        assert succeeded == Counter(gone)
        requested = [r["executor_ids"] for p in survivors for r in p.requests_of("recovery")]
        assert sorted(requested, key=str) == [[e] for e in sorted(gone)]  # one request each, nothing retried
    finally:
        for peer in doomed + survivors:
            peer.stop()


def test_a_drained_executor_gets_no_operator_request(relay: Relay, tmp_path: Path) -> None:
    app = "drained"
    _register(relay, app, grace_secs=60)
    [executor], [executor_id] = _survivors(relay, tmp_path, app, 1)
    try:
        workflows = f"/v2/orgs/local/apps/{app}/workflows"
        with relay.api() as api:
            assert api.get(workflows).status_code == 200  # served by the executor
        relay_cli(relay, "drain", "set", executor_id, "--app", app, "--for", "5m", "--reason", "e2e", key=relay.key)
        listed = relay_cli(relay, "drain", "list", "--app", app, key=relay.key).stdout
        assert executor_id in listed and "e2e" in listed
        with relay.api() as api:
            refused = api.get(workflows)
            assert refused.status_code == 503, refused.text  # its only executor is drained: no one to ask
            assert refused.headers["content-type"] == "application/problem+json"
        assert relay.executors(app) == {executor_id: "HEALTHY"}  # still connected, its lifecycle unchanged
        relay_cli(relay, "drain", "clear", executor_id, "--app", app, key=relay.key)
        with relay.api() as api:
            assert api.get(workflows).status_code == 200
        operations = [r.operation for r in audit_rows_at(relay.db_url, app)]
        assert operations.count("executor.drain.set") == 1 and operations.count("executor.drain.cleared") == 1
    finally:
        executor.stop()


def test_a_paused_recovery_waits_and_goes_when_resumed(relay: Relay) -> None:
    app = "paused"
    _register(relay, app, grace_secs=1)
    survivor = RawPeer(relay.ws_url, app, relay.key, "stays")
    doomed = RawPeer(relay.ws_url, app, relay.key, "goes")
    try:
        wait_until(lambda: len(relay.executors(app)) == 2, timeout=30, what="2 executors")
        wait_recorded(relay.temporal_address, app, "goes")
        relay_cli(relay, "recovery", "pause", "--app", app, "--for", "1h", "--reason", "maintenance", key=relay.key)
        doomed.stop()
        wait_until(lambda: any(r.operation == "executor.recovery.held" for r in audit_rows_at(relay.db_url, app)),
                   timeout=20, what="the recovery held")
        assert registry_at(relay.db_url, app)["goes"] == "DEAD"  # DEAD on time, all the same
        shown = relay_cli(relay, "recovery", "status", "--app", app, key=relay.key).stdout
        assert "maintenance" in shown and "breaker:  closed" in shown and "goes" in shown
        time.sleep(3 * RECHECK)  # several looks at the gate, all held: nothing may go out meanwhile
        assert survivor.requests_of("recovery") == []
        relay_cli(relay, "recovery", "resume", "--app", app, key=relay.key)
        resumed = time.monotonic()
        wait_until(lambda: "goes" not in registry_at(relay.db_url, app), timeout=20, what="recovered after resume")
        assert time.monotonic() - resumed < RECHECK + 5
        assert [r["executor_ids"] for r in survivor.requests_of("recovery")] == [["goes"]]
        as_json = relay_cli(relay, "recovery", "status", "--app", app, "-o", "json", key=relay.key).stdout
        assert json.loads(as_json)["pause"] is None
        operations = [r.operation for r in audit_rows_at(relay.db_url, app)]
        assert operations.count("app.recovery.paused") == 1 and operations.count("app.recovery.resumed") == 1
    finally:
        survivor.stop()
        doomed.stop()
