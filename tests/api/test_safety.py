"""The drain and pause REST extensions in-process (``conftest.Api``): status codes, problem bodies, the audit rows
with their subject, expiry, and what a drain does to the management candidates the routes read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.api.conftest import Api
from tests.api.test_compat import assert_problem
from workflows.contracts.common import ExecutorStatus, lifecycle_workflow_id

ORG = "/v2/orgs/local"


async def _audit(client: httpx.AsyncClient, app: str, operation: str) -> list[dict[str, Any]]:
    response = await client.get(f"{ORG}/audit-logs", params={"target": app, "operation": operation})
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()
    return entries


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_drain_set_get_list_and_clear_audited(api: Api) -> None:
    app = "drain-app"
    async with api.client() as client:
        assert (await client.put(f"{ORG}/apps/{app}")).status_code == 204
        api.record(app, "ex-1")
        api.record(app, "ex-2")
        before = datetime.now(UTC)
        response = await client.put(f"{ORG}/apps/{app}/executors/ex-1/drain",
                                    json={"expiresInSecs": 1800, "reason": "rolling deploy"})
        assert response.status_code == 200, response.text
        drain = response.json()
        assert (drain["executorId"], drain["active"], drain["reason"]) == ("ex-1", True, "rolling deploy")
        assert before + timedelta(seconds=1799) < _at(drain["until"]) <= datetime.now(UTC) + timedelta(seconds=1800)
        assert drain["subject"].startswith("api_key:")
        assert (await client.get(f"{ORG}/apps/{app}/executors/ex-1/drain")).json()["active"] is True
        listed = (await client.get(f"{ORG}/apps/{app}/drains")).json()
        assert [d["executorId"] for d in listed] == ["ex-1"]
        assert [e.executor_id for e in api.store.management_candidates("local", app).executors] == ["ex-2"]

        [entry] = await _audit(client, app, "executor.drain.set")
        assert entry["subject"]["type"] == "api_key" and entry["subject"]["display"] == "dev"
        assert entry["details"]["executorId"] == "ex-1" and entry["details"]["expiresInSecs"] == 1800
        assert entry["details"]["reason"] == "rolling deploy" and entry["sourceIp"] == "127.0.0.1"

        assert (await client.delete(f"{ORG}/apps/{app}/executors/ex-1/drain")).status_code == 204
        assert len(await _audit(client, app, "executor.drain.cleared")) == 1
        assert_problem(await client.get(f"{ORG}/apps/{app}/executors/ex-1/drain"), 404)
        assert_problem(await client.delete(f"{ORG}/apps/{app}/executors/ex-1/drain"), 404)
        assert sorted(e.executor_id for e in api.store.management_candidates("local", app).executors) == ["ex-1",
                                                                                                          "ex-2"]


async def test_undrain_wakes_recoveries_waiting_for_a_peer(api: Api) -> None:
    app = "drain-wake"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "only-peer")
        api.record(app, "gone", ExecutorStatus.DEAD)
        api.temporal.running.add(lifecycle_workflow_id("local", app, "gone"))
        await client.put(f"{ORG}/apps/{app}/executors/only-peer/drain", json={"expiresInSecs": 60})
        assert (await client.delete(f"{ORG}/apps/{app}/executors/only-peer/drain")).status_code == 204
    woken = [(w, name) for w, name, _ in api.temporal.signals if w == lifecycle_workflow_id("local", app, "gone")]
    assert woken == [(lifecycle_workflow_id("local", app, "gone"), "peer_available")]


async def test_an_expired_drain_is_listed_inactive_and_ignored(api: Api) -> None:
    app = "drain-expired"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "ex-1")
        api.store.set_drain(org="local", app=app, executor_id="ex-1", until=datetime.now(UTC) - timedelta(seconds=1),
                            reason="", subject="system", source_ip="", details={})
        [drain] = (await client.get(f"{ORG}/apps/{app}/drains")).json()
        assert drain["active"] is False
    assert [e.executor_id for e in api.store.management_candidates("local", app).executors] == ["ex-1"]


async def test_drain_errors_are_problems(api: Api) -> None:
    app = "drain-errors"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "ex-1")
        path = f"{ORG}/apps/{app}/executors/ex-1/drain"
        assert_problem(await client.put(f"{ORG}/apps/{app}/executors/nobody/drain", json={"expiresInSecs": 60}), 404)
        assert_problem(await client.put(f"{ORG}/apps/no-such-app/executors/ex-1/drain", json={"expiresInSecs": 60}),
                       404)
        for body in ({}, {"expiresInSecs": 0}, {"expiresInSecs": "60"}, {"expiresInSecs": 1.5},
                     {"expiresInSecs": 31 * 86400}, {"expiresInSecs": 60, "extra": 1}, {"expiresInSecs": 60,
                                                                                        "reason": "a\nb"}):
            assert_problem(await client.put(path, json=body), 422)
        other = api.new_key(apps=["someone-else"])
        async with api.client(other) as restricted:
            assert_problem(await restricted.put(path, json={"expiresInSecs": 60}), 403)
    async with api.anonymous() as anonymous:
        assert_problem(await anonymous.put(path, json={"expiresInSecs": 60}), 401)
    assert api.store.list_drains("local", app) == []


async def test_pause_set_get_status_and_resume_audited(api: Api) -> None:
    app = "pause-app"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        assert_problem(await client.get(f"{ORG}/apps/{app}/recovery-pause"), 404)
        assert_problem(await client.delete(f"{ORG}/apps/{app}/recovery-pause"), 404)
        response = await client.put(f"{ORG}/apps/{app}/recovery-pause",
                                    json={"expiresInSecs": 3600, "reason": "db maintenance"})
        assert response.status_code == 200, response.text
        pause = response.json()
        assert (pause["active"], pause["reason"]) == (True, "db maintenance")
        status = (await client.get(f"{ORG}/apps/{app}/recovery")).json()
        assert status["pause"]["reason"] == "db maintenance"
        assert status["breaker"] == {"tripped": False, "trippedAt": None, "trips": 0, "lastSlotAt": None}
        assert status["waiting"] == []
        [entry] = await _audit(client, app, "app.recovery.paused")
        assert entry["details"]["expiresInSecs"] == 3600 and entry["subject"]["display"] == "dev"

        assert (await client.delete(f"{ORG}/apps/{app}/recovery-pause")).status_code == 204
        assert len(await _audit(client, app, "app.recovery.resumed")) == 1
        assert (await client.get(f"{ORG}/apps/{app}/recovery")).json()["pause"] is None
        assert_problem(await client.put(f"{ORG}/apps/{app}/recovery-pause", json={"expiresInSecs": -1}), 422)
        assert_problem(await client.put(f"{ORG}/apps/nothing-here/recovery-pause", json={"expiresInSecs": 9}), 404)
        assert_problem(await client.get(f"{ORG}/apps/nothing-here/recovery"), 404)


async def test_recovery_status_shows_held_recoveries_and_the_breaker(api: Api) -> None:
    from core.gate import GatePolicy

    app = "gate-status"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        for n in range(4):
            api.record(app, f"ex-{n}", ExecutorStatus.DEAD if n < 3 else ExecutorStatus.HEALTHY)
        now = datetime.now(UTC)
        for n in range(3):
            api.store.admit_recovery(org="local", app=app, executor_id=f"ex-{n}", ticket="t", now=now,
                                     policy=GatePolicy(pace=timedelta(seconds=10)))
        status = (await client.get(f"{ORG}/apps/{app}/recovery")).json()
        assert status["breaker"]["tripped"] is True and status["breaker"]["trips"] == 1
        assert sorted(w["executorId"] for w in status["waiting"]) == ["ex-1", "ex-2"]
        assert {w["reason"] for w in status["waiting"]} == {"paced"}
        assert len(await _audit(client, app, "app.recovery.breaker_tripped")) == 1


async def test_an_app_deleted_and_registered_again_has_no_drain_or_pause_left(api: Api) -> None:
    app = "reborn-app"
    async with api.client() as client:
        assert (await client.put(f"{ORG}/apps/{app}")).status_code == 204
        api.record(app, "ex-1")
        assert (await client.put(f"{ORG}/apps/{app}/executors/ex-1/drain", json={"expiresInSecs": 600})).status_code \
            == 200
        assert (await client.put(f"{ORG}/apps/{app}/recovery-pause", json={"expiresInSecs": 600})).status_code \
            in (200, 204)
        assert (await client.delete(f"{ORG}/apps/{app}")).status_code == 204
        assert (await client.put(f"{ORG}/apps/{app}")).status_code == 204
        assert (await client.get(f"{ORG}/apps/{app}/drains")).json() == []
        assert_problem(await client.get(f"{ORG}/apps/{app}/recovery-pause"), 404)


async def test_a_drained_only_executor_is_named_in_the_503_with_how_to_end_the_drain(api: Api) -> None:
    """The 503 once said "no HEALTHY executor of app ... is connected" when the only one was connected and
    drained."""
    app = "drained-only"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "ex-1")
        await client.put(f"{ORG}/apps/{app}/executors/ex-1/drain", json={"expiresInSecs": 600})
        problem = assert_problem(await client.get(f"{ORG}/apps/{app}/workflows"), 503)
        assert problem["detail"] == (
            "the only HEALTHY executor of app 'drained-only' (ex-1) is connected but drained, and a drained executor "
            "carries no operator's request: end the drain with `relay drain clear ex-1 --app drained-only`")
        api.record(app, "ex-2")
        await client.put(f"{ORG}/apps/{app}/executors/ex-2/drain", json={"expiresInSecs": 600})
        detail = assert_problem(await client.get(f"{ORG}/apps/{app}/workflows"), 503)["detail"]
        assert detail.startswith("all 2 HEALTHY executors of app 'drained-only' (ex-1, ex-2) are connected but "
                                 "drained") and "relay drain clear ex-1 --app drained-only" in detail
        for executor_id in ("ex-1", "ex-2"):
            await client.delete(f"{ORG}/apps/{app}/executors/{executor_id}/drain")
        api.store.delete_executor(org="local", app=app, executor_id="ex-1", event_key="gone-1", details={})
        api.store.delete_executor(org="local", app=app, executor_id="ex-2", event_key="gone-2", details={})
        detail = assert_problem(await client.get(f"{ORG}/apps/{app}/workflows"), 503)["detail"]
        assert detail == "no HEALTHY executor of app 'drained-only' is connected"  # none at all: as before


async def test_recovery_status_shows_recoveries_blocked_for_lack_of_a_peer(api: Api) -> None:
    """The status once said "waiting: 0" while a DEAD executor's recovery was blocked. Blocked is what the lifecycle
    recorded last since the death (``executor.recovery.blocked``); a later step (dispatched) ends it."""
    app = "blocked-status"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "peer", version="v1")
        api.record(app, "dead-1", ExecutorStatus.DEAD, version="v1")
        api.record(app, "dead-2", ExecutorStatus.DEAD, version="v2")
        await client.put(f"{ORG}/apps/{app}/executors/peer/drain", json={"expiresInSecs": 600})
        for dead in ("dead-1", "dead-2"):
            api.store.write_audit(org="local", app=app, executor_id=dead, operation="executor.recovery.blocked",
                                  status="failure", details={"reason": "no HEALTHY executor of version 'v?'"})
        status = (await client.get(f"{ORG}/apps/{app}/recovery")).json()
        assert status["waiting"] == []
        blocked = {b["executorId"]: b for b in status["blocked"]}
        assert set(blocked) == {"dead-1", "dead-2"}
        assert (blocked["dead-1"]["appVersion"], blocked["dead-1"]["drainedPeers"]) == ("v1", ["peer"])
        assert blocked["dead-2"]["drainedPeers"] == [] and "no HEALTHY executor" in blocked["dead-2"]["reason"]
        api.store.write_audit(org="local", app=app, executor_id="dead-1", operation="executor.recovery.dispatched",
                              details={"candidate": "peer"})
        status = (await client.get(f"{ORG}/apps/{app}/recovery")).json()
        assert [b["executorId"] for b in status["blocked"]] == ["dead-2"]
        api.record(app, "dead-2", ExecutorStatus.HEALTHY, version="v2")  # back: nothing is blocked any more
        api.record(app, "dead-2", ExecutorStatus.DEAD, version="v2")  # and dead again: a death of its own
        assert (await client.get(f"{ORG}/apps/{app}/recovery")).json()["blocked"] == []


async def test_drains_and_pauses_name_the_key_that_set_them_as_the_audit_does(api: Api) -> None:
    """A drain or pause once said ``api_key:<uuid>`` where the audit log names the key."""
    app = "named-app"
    ops = api.store.create_key(org="local", name="ops-ana", apps=[app])
    async with api.client() as client:
        assert (await client.put(f"{ORG}/apps/{app}")).status_code == 204
        api.record(app, "ex-1")
        api.record(app, "ex-2")
        async with api.client(ops) as as_ops:
            drained = await as_ops.put(f"{ORG}/apps/{app}/executors/ex-1/drain", json={"expiresInSecs": 60})
            paused = await as_ops.put(f"{ORG}/apps/{app}/recovery-pause", json={"expiresInSecs": 60})
        assert (drained.json()["subjectName"], paused.json()["subjectName"]) == ("ops-ana", "ops-ana")
        api.store.set_drain(org="local", app=app, executor_id="ex-2", until=datetime.now(UTC) + timedelta(minutes=1),
                            reason="", subject="system", source_ip="", details={})
        assert (await client.delete(f"{ORG}/tokens/ops-ana")).status_code == 204  # revoked, still named

        listed = (await client.get(f"{ORG}/apps/{app}/drains")).json()
        assert [(d["executorId"], d["subjectName"]) for d in listed] == [("ex-1", "ops-ana"), ("ex-2", "Relay")]
        assert listed[0]["subject"] == drained.json()["subject"] != "ops-ana"
        assert (await client.get(f"{ORG}/apps/{app}/executors/ex-1/drain")).json()["subjectName"] == "ops-ana"
        assert (await client.get(f"{ORG}/apps/{app}/recovery-pause")).json()["subjectName"] == "ops-ana"
        assert (await client.get(f"{ORG}/apps/{app}/recovery")).json()["pause"]["subjectName"] == "ops-ana"
        audited = {e["details"]["executorId"]: e["subject"]["display"]
                   for e in await _audit(client, app, "executor.drain.set")}
        assert audited == {d["executorId"]: d["subjectName"] for d in listed}


async def test_declare_dead_records_dead_asks_the_gate_and_claims_a_peer_once_per_key(api: Api) -> None:
    """The lifecycle workflow's one local activity at a death (``GateActivities.declare_dead``) on each database:
    the DEAD row, the gate's admission, a peer of the version claimed and the dead one's gateway looked up; asked
    again under the same keys (a retried activity), the same answer and no second DEAD audit row. With no peer of
    the version, no gateway look-up."""
    from temporalio.testing import ActivityEnvironment

    from activities.gate import GateActivities
    from workflows.contracts.gate import AdmitRecoveryInput
    from workflows.contracts.lifecycle import DeclareDeadInput, RecordStatusInput, SelectCandidateInput

    app = "declare-dead"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "dead-1")
        api.record(app, "peer-1")
        api.record(app, "lonely", version="v9")
        gate, env, now = GateActivities(api.store), ActivityEnvironment(), datetime.now(UTC)

        def ask(executor_id: str, version: str) -> DeclareDeadInput:
            return DeclareDeadInput(
                record=RecordStatusInput("local", app, executor_id, ExecutorStatus.DEAD, "executor.dead",
                                         event_key=f"{executor_id}/dead", details={}),
                admit=AdmitRecoveryInput("local", app, executor_id, ticket=f"{executor_id}/t", now=now,
                                         event_key=f"{executor_id}/gate"),
                select=SelectCandidateInput("local", app, version, exclude=[executor_id], dead_executor_id=executor_id),
                gateway_queue=api.gateway.task_queue)

        first = await env.run(gate.declare_dead, ask("dead-1", "v1"))
        again = await env.run(gate.declare_dead, ask("dead-1", "v1"))
        assert first.admission.go and first.selected
        assert first.candidate is not None and first.candidate.executor_id == "peer-1"
        assert first.gateway_gone is not None and first.gateway_gone.gone is False
        assert again == first
        statuses = {row.executor_id: row.status for row in api.store.list_executors("local", app)}
        assert statuses["dead-1"] == ExecutorStatus.DEAD and statuses["peer-1"] == ExecutorStatus.HEALTHY
        assert len(await _audit(client, app, "executor.dead")) == 1

        alone = await env.run(gate.declare_dead, ask("lonely", "v9"))
        assert alone.admission.go and alone.selected and alone.candidate is None and alone.gateway_gone is None
