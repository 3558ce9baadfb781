"""Autoscaling end to end: `relay dev` and two real ``dbos==3.2.0`` executors of one app, versions v1 and then v2 (the
latest), sharing a system database, each with gated workflows enqueued on a real queue of worker_concurrency 2 (so
the backlog is known: ENQUEUED and PENDING until their gates open). The policy is refused for a queue that does not
exist, one without worker_concurrency and a partitioned one; the recommendation per version follows the backlog and
the rollout; the gauge on the bearer-scoped ``/metrics`` follows it, and goes with the policy."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sdk import SDKS, SystemDatabase
from tests.support import Process, Relay, running_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

PYTHON = SDKS["python"]
APP = "scaling"
QUEUE = "work"
WORKER_CONCURRENCY = 2
V1_WORKFLOWS = [f"old-{i}" for i in range(5)]
V2_WORKFLOWS = [f"new-{i}" for i in range(3)]
GAUGE = "relay_app_desired_executors"


@dataclass
class Scaling:
    relay: Relay
    sys_db: SystemDatabase
    gates: Path


@pytest.fixture(scope="module")
def scaling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaling]:
    data_dir = tmp_path_factory.mktemp("relay-autoscale")
    with running_relay(data_dir, RELAY_AUTOSCALE_INTERVAL_SECS="1") as relay:
        tmp = tmp_path_factory.mktemp("autoscale-executors")
        gates = tmp / "gates"
        gates.mkdir()
        sys_db = PYTHON.system_database(tmp, None)
        executors: list[Process] = []
        try:
            with relay.api() as api:
                assert api.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
            # One at a time: two executors migrating a brand-new SQLite system database at once can crash one. v2
            # starts second, so its version is the latest (the newest version_timestamp).
            for version, ids in (("v1", V1_WORKFLOWS), ("v2", V2_WORKFLOWS)):
                executors.append(PYTHON.start(relay, tmp, f"executor-{version}", APP, sys_db, APP_VERSION=version,
                                              GATE_DIR=str(gates), SCALED_QUEUE=f"{QUEUE}:{WORKER_CONCURRENCY}",
                                              SCALED_WORKFLOWS=",".join(ids), PARTITIONED_QUEUE="parted"))
                wait_until(partial(_all_healthy, relay, len(executors)), timeout=60,
                           what=f"the {version} executor HEALTHY")
                wait_until(partial(_started, sys_db, ids), timeout=30, what=f"{version}'s workflows")
            yield Scaling(relay, sys_db, gates)
        finally:
            for process in executors:  # stopped by PID
                process.stop()


def _all_healthy(relay: Relay, n: int) -> bool:
    return list(relay.executors(APP).values()) == ["HEALTHY"] * n


def _started(sys_db: SystemDatabase, ids: list[str]) -> bool:
    return set(ids) <= set(sys_db.statuses())


def _api(relay: Relay) -> httpx.Client:
    return httpx.Client(base_url=f"{relay.url}/v2/orgs/local/apps/{APP}/", timeout=30,
                        headers={"Authorization": f"Bearer {relay.key}"})


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.text[:2000])
    return response.json() if response.content else None


def _backlog(sys_db: SystemDatabase, ids: list[str]) -> int:
    statuses = sys_db.statuses()
    return sum(statuses.get(i) in ("ENQUEUED", "PENDING") for i in ids)


def _recommended(api: httpx.Client) -> list[tuple[str, bool, int, int, str | None]]:
    rows = _ok(api.get("autoscale"))
    now = int(time.time() * 1000)
    assert all(now - 60_000 <= r["observedAt"] <= now for r in rows), rows
    return [(r["applicationVersion"], r["isLatest"], r["queueDepth"], r["desiredExecutors"], r.get("queueName"))
            for r in rows]


def _gauge(relay: Relay) -> dict[str, float]:
    """The app's ``relay_app_desired_executors`` series by version, from the REST API's ``/metrics``."""
    with relay.api() as client:
        text = client.get("/metrics").raise_for_status().text
    return {s.labels["version"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == GAUGE and s.labels.get("org") == "local" and s.labels.get("app") == APP}


def test_a_policy_needs_a_queue_that_exists_is_not_partitioned_and_has_a_worker_concurrency(
        scaling: Scaling) -> None:
    with _api(scaling.relay) as api:
        assert _ok(api.get("autoscaling-policy"), 404)["status"] == 404
        assert _ok(api.get("autoscale"), 404)["status"] == 404
        for queue, says in [("no-such-queue", "does not exist"), ("serial", "has no worker_concurrency"),
                            ("parted", "is partitioned")]:
            problem = _ok(api.put("autoscaling-policy", json={"queue": queue}), 422)
            assert says in problem["detail"], problem
            assert [e["location"] for e in problem["errors"]] == ["body.queue"]
        assert _ok(api.get("autoscaling-policy"), 404)["status"] == 404


def test_the_recommendation_and_the_gauge_follow_the_queues_backlog(scaling: Scaling) -> None:
    relay, sys_db = scaling.relay, scaling.sys_db
    # Each executor runs worker_concurrency of its version's workflows (PENDING, at their gates); the rest wait.
    assert _backlog(sys_db, V1_WORKFLOWS) == 5 and _backlog(sys_db, V2_WORKFLOWS) == 3
    with _api(relay) as api:
        policy = {"queue": QUEUE, "rollout": {"maxOldApplicationVersions": 1}}
        assert _ok(api.put("autoscaling-policy", json=policy)) == {"policy": policy}
        assert _ok(api.get("autoscaling-policy")) == {"policy": policy}
        # v2, the latest: ceil(3 / 2) = 2; v1: ceil(5 / 2) = 3
        assert _recommended(api) == [("v2", True, 3, 2, QUEUE), ("v1", False, 5, 3, QUEUE)]
        wait_until(lambda: _gauge(relay) == {"v2": 2, "v1": 3}, timeout=30, interval=0.5, what="the gauge")

        capped = {"queue": QUEUE, "rollout": {"maxOldApplicationVersions": 1,
                                              "maxExecutorsForOldApplicationVersions": 1}}
        _ok(api.put("autoscaling-policy", json=capped))
        assert _recommended(api) == [("v2", True, 3, 2, QUEUE), ("v1", False, 5, 1, QUEUE)]
        wait_until(lambda: _gauge(relay) == {"v2": 2, "v1": 1}, timeout=30, interval=0.5, what="the capped gauge")

        for workflow_id in V2_WORKFLOWS:  # v2's backlog drains: its floor is one executor
            (scaling.gates / workflow_id).touch()
        wait_until(lambda: _backlog(sys_db, V2_WORKFLOWS) == 0, timeout=60, interval=0.2, what="v2's backlog done")
        assert _recommended(api) == [("v2", True, 0, 1, QUEUE), ("v1", False, 5, 1, QUEUE)]
        wait_until(lambda: _gauge(relay) == {"v2": 1, "v1": 1}, timeout=30, interval=0.5, what="the drained gauge")

        _ok(api.put("autoscaling-policy", json={"queue": QUEUE}))  # no rollout: the latest version alone
        assert _recommended(api) == [("v2", True, 0, 1, QUEUE)]
        wait_until(lambda: _gauge(relay) == {"v2": 1}, timeout=30, interval=0.5, what="v1's series gone")

        _ok(api.delete("autoscaling-policy"), 204)
        assert _gauge(relay) == {}  # removed on the gateway that served the delete at once
        assert _ok(api.get("autoscaling-policy"), 404)["status"] == 404
        assert _ok(api.get("autoscale"), 404)["status"] == 404
        _ok(api.delete("autoscaling-policy"), 204)  # deleting an absent policy succeeds
        time.sleep(2.5)  # two refresh rounds: nothing brings the series back
        assert _gauge(relay) == {}
    operations = [op for op, _ in relay.audit(APP) if op.startswith("app.autoscaling_policy.")]
    assert operations == ["app.autoscaling_policy.set"] * 3 + ["app.autoscaling_policy.deleted"], operations
