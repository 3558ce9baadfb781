"""The docs' visibility queries (concepts/lifecycle.md) find what they promise, on the dev server (the time-skipping
server has no visibility)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from activities.reconcile import RUNNING_LIFECYCLES, running_lifecycles
from core.temporal import connect
from tests.support import Relay, play_executor, wait_until
from workflows.contracts.common import lifecycle_workflow_id

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]


async def _ids(relay: Relay, query: str) -> set[str]:
    client = await connect(relay.temporal_address, "default")
    return {w.id async for w in client.list_workflows(query)}


def test_dead_executors_and_recoveries_in_progress_are_one_query_away(relay: Relay) -> None:
    app = "visible-app"
    with relay.api() as api:
        api.put(f"/v2/orgs/local/apps/{app}")
        api.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 1})
    with play_executor(relay, app, "vis-dead", version="lonely"):  # no peer of its version: blocked once DEAD
        wait_until(lambda: relay.executors(app).get("vis-dead") == "HEALTHY", timeout=10, what="HEALTHY")
    with play_executor(relay, app, "vis-alive", version="other"):
        wait_until(lambda: relay.executors(app).get("vis-dead") == "DEAD", timeout=10, what="DEAD")
        dead = lifecycle_workflow_id("local", app, "vis-dead")
        alive = lifecycle_workflow_id("local", app, "vis-alive")
        by_app = f"RelayApp = '{app}' AND RelayExecutorStatus = 'DEAD' AND ExecutionStatus = 'Running'"
        wait_until(lambda: asyncio.run(_ids(relay, by_app)) == {dead}, timeout=15, what="DEAD by app")
        everywhere = asyncio.run(_ids(relay, "RelayExecutorStatus = 'DEAD' AND ExecutionStatus = 'Running'"))
        assert dead in everywhere and alive not in everywhere
        healthy = asyncio.run(_ids(relay, f"RelayApp = '{app}' AND RelayExecutorStatus = 'HEALTHY'"))
        assert healthy == {alive}
    with relay.api() as api:  # end both workflows, so nothing of this test keeps running
        assert api.delete(f"/v2/orgs/local/apps/{app}").status_code == 204


def test_metrics_count_executors_of_the_callers_org_only(relay: Relay) -> None:
    app = "metered-app"
    with relay.api() as api:
        api.put(f"/v2/orgs/local/apps/{app}")
        assert api.get("/metrics", headers={"Authorization": ""}).status_code == 401
        with play_executor(relay, app, "metered-1"):
            wait_until(lambda: relay.executors(app).get("metered-1") == "HEALTHY", timeout=10, what="HEALTHY")
            text = api.get("/metrics").text
    counts = {(sample.labels["org"], sample.labels["app"], sample.labels["status"]): sample.value
              for family in text_string_to_metric_families(text) if family.name == "relay_executors"
              for sample in family.samples}
    assert counts[("local", app, "HEALTHY")] == 1
    assert "relay_gateway_connections" in text and 'org="fuzz"' not in text


def test_the_reconciliation_lists_every_running_lifecycle_page_by_page_and_no_other(relay: Relay) -> None:
    """``running_lifecycles``, read off the service's pages a few ids at a time: every running lifecycle workflow
    (those of this test's app among them), none that ended."""
    app = "listed-app"
    with relay.api() as api:
        api.put(f"/v2/orgs/local/apps/{app}")
    names = [f"listed-{n}" for n in range(5)]
    ids = {lifecycle_workflow_id("local", app, name) for name in names}

    async def listed() -> set[str]:
        found = await running_lifecycles(await connect(relay.temporal_address, "default"), page_size=2)
        assert found is not None, "the dev server has visibility"
        return found

    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(play_executor(relay, app, name))
        wait_until(lambda: all(relay.executors(app).get(n) == "HEALTHY" for n in names), timeout=20, what="HEALTHY")
        wait_until(lambda: ids <= asyncio.run(listed()), timeout=15, what="all five listed")
        ours = lifecycle_workflow_id("local", app, "")
        assert {i for i in asyncio.run(listed()) if i.startswith(ours)} == ids
        assert ids <= asyncio.run(_ids(relay, RUNNING_LIFECYCLES))  # as the SDK's own list has them
    with relay.api() as api:  # the app deleted: its workflows end
        assert api.delete(f"/v2/orgs/local/apps/{app}").status_code == 204
    wait_until(lambda: not ids & asyncio.run(listed()), timeout=15, what="none listed once ended")
