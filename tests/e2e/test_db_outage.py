"""Relay's database away mid-grace and mid-recovery, with real processes: `relay dev`
on a private PostgreSQL that the test stops (by PID, a fast shutdown that ends every session) and starts again on
the same port and data, and `relay dev` on SQLite locked by another process.

A realistic outage lasts a minute or more; here PostgreSQL stays down ``OUTAGE_S``, longer than the shortened grace
(``GRACE_S``), so the DEAD write, the recovery's audit rows and the deletion all meet the outage, and the suite stays
fast. The database activities retry at most ``DB_RETRY``'s 5 s apart, so a 60 s outage costs the same few seconds
after the database is back. Every run is checked against the same invariants: the executor that left is recovered
exactly once (one ``recovery`` naming it), its record deleted once, its audit rows each written once and in the
order of a run without an outage, the peer never disturbed, the registry right at the end, Relay still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import IntegrityError
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import ActivityEnvironment
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from activities.database import DATABASE_UNAVAILABLE
from activities.registry import RegistryActivities
from core.errors import ConflictError, NotFoundError
from core.models import make_engine
from core.store import Store, subject_of
from core.store.registry import AppExecutors
from core.temporal import connect as temporal_connect
from tests.postgres import PostgresCluster, postgres_cluster, relay_on_postgres
from tests.support import (
    RawPeer,
    Relay,
    audit_rows_at,
    free_port,
    healthy_answer,
    play_executor,
    registry_at,
    wait_recorded,
    wait_until,
)
from workflows.contracts.common import ExecutorInfo, ExecutorStatus, lifecycle_workflow_id
from workflows.contracts.lifecycle import LifecycleResult, WriteAuditInput

pytestmark = pytest.mark.e2e

ORG = "/v2/orgs/local"
GRACE_S = 3
# > GRACE_S: the grace ends, and DEAD is due, while the database is away. RELAY_TEST_OUTAGE_SECS=60 runs a
# minute-long outage (two minutes more).
OUTAGE_S = float(os.environ.get("RELAY_TEST_OUTAGE_SECS", "8"))
LOCK_S = 6  # > GRACE_S, and < SQLite's 30 s busy timeout: writers wait for the lock rather than fail
# A run without an outage, oldest first: what every outage must leave behind for the executor that left.
RECOVERED = ["executor.healthy", "executor.disconnected", "executor.dead", "executor.recovery.dispatched",
             "executor.recovery.succeeded", "executor.deleted"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


@pytest.fixture(scope="module")
def relay_pg(cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    with relay_on_postgres(cluster, tmp_path_factory.mktemp("relay-pg")) as started:
        yield started


@contextlib.contextmanager
def postgres_down(cluster: PostgresCluster) -> Iterator[None]:
    """PostgreSQL stopped for the block, and started again (same port, same data) even if the block fails."""
    cluster.stop()
    try:
        yield
    finally:
        cluster.start()


@contextlib.contextmanager
def sqlite_locked(relay: Relay) -> Iterator[None]:
    """Another process's view of it: a connection holding ``BEGIN EXCLUSIVE`` on Relay's SQLite file."""
    with contextlib.closing(sqlite3.connect(relay.data_dir / "relay.db", timeout=10, isolation_level=None)) as db:
        db.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            db.execute("ROLLBACK")


def _new_app(relay: Relay, *, grace_s: int | None = GRACE_S) -> str:
    app = f"dbo-{uuid.uuid4().hex[:8]}"
    with relay.api() as api:
        api.put(f"{ORG}/apps/{app}").raise_for_status()
        if grace_s is not None:
            api.patch(f"{ORG}/apps/{app}", json={"executorTimeoutSecs": grace_s}).raise_for_status()
    return app


@contextlib.contextmanager
def _peers(relay: Relay, app: str, answer: object = healthy_answer) -> Iterator[tuple[RawPeer, RawPeer]]:
    """A ``survivor`` that stays (and answers with ``answer``) and a ``victim`` that will leave for good."""
    survivor = RawPeer(relay.ws_url, app, relay.key, "survivor", answer=answer)
    victim = RawPeer(relay.ws_url, app, relay.key, "victim", reconnect=False)
    try:
        for peer in (survivor, victim):
            wait_recorded(relay.temporal_address, app, peer.executor_id, timeout=30)
        yield survivor, victim
    finally:
        victim.stop()
        survivor.stop()


def _leave(relay: Relay, app: str, victim: RawPeer) -> None:
    """The victim closes its socket and does not come back; returns once its grace has started."""
    victim.stop()
    wait_until(lambda: registry_at(relay.db_url, app).get("victim") == "DISCONNECTED", timeout=15,
               interval=0.1, what="victim DISCONNECTED")


def _result(relay: Relay, app: str, executor_id: str) -> LifecycleResult:
    async def wait() -> LifecycleResult:
        client = await temporal_connect(relay.temporal_address, "default")
        handle = client.get_workflow_handle(lifecycle_workflow_id("local", app, executor_id),
                                            result_type=LifecycleResult)
        return await asyncio.wait_for(handle.result(), 60)

    return asyncio.run(wait())


def _assert_recovered_once(relay: Relay, app: str, survivor: RawPeer) -> None:
    wait_until(lambda: "victim" not in registry_at(relay.db_url, app), timeout=90, interval=0.2,
               what="the victim's record deleted")
    result = _result(relay, app, "victim")  # its workflow has ended: nothing more will be sent for it
    assert (result.status, result.recovered_by, result.attempts) == ("RECOVERED", "survivor", 1)
    assert [r["executor_ids"] for r in survivor.requests_of("recovery")] == [["victim"]]
    assert [r.operation for r in audit_rows_at(relay.db_url, app, "victim")] == RECOVERED
    # The peer was never disturbed: one socket all along, recorded HEALTHY once.
    assert survivor.handshakes == 1
    assert [r.operation for r in audit_rows_at(relay.db_url, app, "survivor")] == ["executor.healthy"]
    assert registry_at(relay.db_url, app) == {"survivor": "HEALTHY"}
    assert relay.process.popen.poll() is None, relay.process.output()[-3000:]


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
def test_recovery_without_an_outage_is_the_reference(relay_pg: Relay) -> None:
    """The run every outage is compared with, on PostgreSQL."""
    app = _new_app(relay_pg)
    with _peers(relay_pg, app) as (survivor, victim):
        _leave(relay_pg, app, victim)
        _assert_recovered_once(relay_pg, app, survivor)


def test_postgres_stopped_mid_grace(relay_pg: Relay, cluster: PostgresCluster) -> None:
    app = _new_app(relay_pg)
    with _peers(relay_pg, app) as (survivor, victim):
        _leave(relay_pg, app, victim)
        with postgres_down(cluster):
            time.sleep(OUTAGE_S)  # the outage itself, held for a fixed time; the grace ends inside it
            assert survivor.requests_of("recovery") == []
        _assert_recovered_once(relay_pg, app, survivor)


class _HeldAnswer:
    """A peer that answers ``recovery`` only when released, so the database can go away while it is answering."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: dict[str, object]) -> dict[str, object] | str | None:
        if request["type"] == "recovery":
            self.asked.set()
            self.release.wait(60)
        return healthy_answer(request)


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
def test_postgres_stopped_mid_recovery(relay_pg: Relay, cluster: PostgresCluster) -> None:
    app = _new_app(relay_pg)
    held = _HeldAnswer()
    with _peers(relay_pg, app, answer=held) as (survivor, victim):
        _leave(relay_pg, app, victim)
        wait_until(held.asked.is_set, timeout=30, what="the recovery request")
        with postgres_down(cluster):
            held.release.set()  # answered while the database is away: the audit and the deletion must wait
            time.sleep(OUTAGE_S)  # the outage itself, held for a fixed time
        _assert_recovered_once(relay_pg, app, survivor)


def test_sqlite_locked_mid_grace(relay: Relay) -> None:
    """`relay dev` on SQLite (the session's), its file locked by another process through the end of a grace."""
    app = _new_app(relay)
    with _peers(relay, app) as (survivor, victim):
        _leave(relay, app, victim)
        with sqlite_locked(relay):
            time.sleep(LOCK_S)  # the lock itself, held for a fixed time; the grace ends inside it
            assert survivor.requests_of("recovery") == []  # DEAD is not written yet: nothing is recovered
        _assert_recovered_once(relay, app, survivor)


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
def test_gateway_answers_503_problems_while_postgres_is_down(relay_pg: Relay, cluster: PostgresCluster) -> None:
    app = _new_app(relay_pg, grace_s=None)  # the default 60 s grace: the executor below is not recovered here
    with postgres_down(cluster):
        with pytest.raises(InvalidStatus) as refused, connect(f"{relay_pg.ws_url}websocket/{app}/{relay_pg.key}",
                                                               open_timeout=10):
            pass
        response = refused.value.response
        assert response.status_code == 503
        assert response.headers["Content-Type"] == "application/problem+json"
        assert json.loads(response.body) == {"title": "Service Unavailable", "status": 503,
                                             "detail": "Relay's database is unavailable; retry shortly"}
        with relay_pg.api() as api:
            for method, path in (("GET", "/apps"), ("GET", f"/apps/{app}/executors"), ("PATCH", f"/apps/{app}")):
                answer = api.request(method, ORG + path, json={"executorTimeoutSecs": 5} if method == "PATCH" else None)
                assert answer.status_code == 503, answer.text
                assert answer.headers["Content-Type"] == "application/problem+json"
                assert answer.json()["status"] == 503
            assert api.get("/healthz").status_code == 200  # liveness: the process is fine
    # Back: the pooled connections the restart ended are replaced (pre-ping), and everything works again.
    with relay_pg.api() as api:
        assert api.get(f"{ORG}/apps/{app}").json()["executorTimeoutSecs"] == 60  # the PATCH did not land
    with play_executor(relay_pg, app, "after-outage"):
        wait_recorded(relay_pg.temporal_address, app, "after-outage", timeout=30)
    assert relay_pg.process.popen.poll() is None, relay_pg.process.output()[-3000:]


# -- the store itself on both databases: every query, and writes that land once by their event key ---------------

APP = "store-app"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'relay.db'}"
    else:
        url = request.getfixturevalue("cluster").create_database("store")
    opened = Store(make_engine(url))
    yield opened
    opened.engine.dispose()


def _status(store: Store, executor_id: str, status: ExecutorStatus, *, key: str, app: str = APP) -> list[str]:
    """The app's DEAD executors, as a HEALTHY write reports them."""
    return store.record_status(
        org="local", app=app, executor_id=executor_id, status=status, operation=f"executor.{status.lower()}",
        event_key=key, connection_id=f"conn-{executor_id}", gateway_queue="gw-1", details={"n": 1},
        info=ExecutorInfo(executor_id, application_version="v1", hostname="h", executor_metadata={"k": ["v"]})).dead


def _ops(store: Store, app: str = APP) -> list[str]:
    return [row.operation for row in reversed(store.list_audit("local", app=app))]


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
def test_every_store_query_runs(store: Store) -> None:
    store.ping()
    key = store.create_key(org="local", name="k")
    me = store.authenticate(key)
    assert store.authorize_org(key, "local") == me
    with pytest.raises(NotFoundError):
        store.authorize_org(key, "elsewhere")
    app, created = store.ensure_app("local", APP, subject=subject_of(me))
    assert created and store.ensure_app("local", APP)[1] is False
    store.update_app("local", APP, {"executor_timeout": timedelta(seconds=3), "gc_time_threshold": timedelta(days=7),
                                    "global_timeout": None}, subject=subject_of(me))
    got = store.get_app("local", APP)
    assert (got.executor_timeout, got.gc_time_threshold, got.global_timeout) == (timedelta(seconds=3),
                                                                                 timedelta(days=7), None)
    assert got.created_at.tzinfo is not None
    _status(store, "e1", ExecutorStatus.HEALTHY, key="e1/1")
    _status(store, "e2", ExecutorStatus.HEALTHY, key="e2/1")
    _status(store, "e1", ExecutorStatus.DEAD, key="e1/2")
    assert _status(store, "e3", ExecutorStatus.HEALTHY, key="e3/1") == ["e1"]  # a HEALTHY write names the DEAD
    registry = store.list_executors("local", APP)
    assert [e.executor_id for e in registry] == ["e1", "e2", "e3"]
    assert registry[1].executor_metadata == {"k": ["v"]} and registry[1].updated_at.tzinfo is not None
    found = store.select_candidate(org="local", app=APP, app_version="v1", exclude=["e1"], dead_executor_id="e1")
    assert found is not None and found[0].executor_id in {"e2", "e3"} and found[1] is False
    assert store.executor_counts("local") == Counter({("local", APP, "HEALTHY"): 2, ("local", APP, "DEAD"): 1})
    assert sorted(e for _, _, e, _ in store.executors_on_gateway("gw-1")) == ["e2", "e3"]
    store.delete_executor(org="local", app=APP, executor_id="e1", event_key="e1/3", details={})
    [(target, last)] = store.list_retention_targets("local")
    assert (target.name, last) == (APP, None)
    assert store.select_retention_executor(org="local", app=APP, exclude=[]) in {("e2", "gw-1"), ("e3", "gw-1")}
    started = datetime.now(UTC)
    store.write_retention_audit(org="local", app=APP, operation="retention.dispatched", event_key="r/1",
                                status="success", executor_id="e2", details={}, started_at=started, request_id="r")
    assert store.list_retention_targets("local", APP)[0][1] == started
    assert store.org_exists("local") and not store.org_exists("elsewhere")
    [(listed, executors)] = store.list_apps("local", (APP,))
    assert listed.id == app.id and executors == AppExecutors(available=True, language=None)
    store.create_token(org="local", name="ci", apps=[APP], subject=subject_of(me), source_ip="10.0.0.1")
    with pytest.raises(ConflictError):
        store.create_token(org="local", name="ci", apps=None, subject=subject_of(me), source_ip="")
    keys, app_ids = store.list_tokens("local")
    assert {k.name for k in keys} == {"k", "ci"} and app_ids == {APP: app.id}
    revoked = store.revoke_token("local", "ci", subject=subject_of(me), source_ip="")
    gone, registered = store.still_valid({me.key_id, *revoked}, {("local", APP), ("local", "nope")})
    assert gone == set(revoked) and registered == {("local", APP): app.id}
    rows, _ = store.query_audit("local", target="ci")  # by the token name inside the JSON details
    assert [r.operation for r in rows] == ["token.deleted", "token.created"]
    rows, names = store.query_audit("local", subject="k", operation="token.created", start=started,
                                    end=datetime.now(UTC) + timedelta(seconds=1))
    assert [r.operation for r in rows] == ["token.created"] and names == {me.key_id: "k"}
    store.write_audit(org="local", operation="test.note", app=APP, details={"x": 1})
    store.delete_app("local", APP, subject=subject_of(me), source_ip="", orphans=["e2", "e3"], details={})
    assert store.list_executors("local", APP) == []
    with pytest.raises(NotFoundError):
        store.get_app("local", APP)


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
def test_a_retried_write_lands_once(store: Store) -> None:
    store.ensure_app("local", APP)
    for _ in range(2):  # the same activity, tried twice
        _status(store, "e1", ExecutorStatus.DEAD, key="dead")
        store.write_audit(org="local", operation="executor.recovery.dispatched", app=APP, executor_id="e1",
                          event_key="dispatched")
        store.write_retention_audit(org="local", app=APP, operation="retention.dispatched", event_key="retention",
                                    status="success", executor_id=None, details={})
        store.delete_executor(org="local", app=APP, executor_id="e1", event_key="deleted", details={})
    assert _ops(store) == ["app.registered", "executor.dead", "executor.recovery.dispatched", "retention.dispatched",
                           "executor.deleted"]
    assert store.list_executors("local", APP) == []


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
def test_concurrent_tries_of_one_write_land_once(store: Store) -> None:
    """An attempt that timed out may still run when its retry starts (a thread cannot be cancelled): both write under
    the same event key. The insert-if-absent lets one land; the others find it landed and do nothing, none failing
    (a check then an insert let two miss each other's row: ``IntegrityError``), on both databases alike."""
    tries = 4
    barrier = threading.Barrier(tries)
    failures: list[Exception] = []
    apps: list[str] = []

    def attempt() -> None:
        barrier.wait()
        apps.append(store.ensure_app("local", APP)[0].id)  # registered concurrently, once
        try:
            _status(store, "e1", ExecutorStatus.DISCONNECTED, key="disconnected")
        except IntegrityError as err:
            failures.append(err)

    threads = [threading.Thread(target=attempt) for _ in range(tries)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    _status(store, "e1", ExecutorStatus.DISCONNECTED, key="disconnected")  # the retry after a failure
    assert len(set(apps)) == 1 and failures == []
    assert _ops(store) == ["app.registered", "executor.disconnected"]
    assert {e.executor_id: e.status for e in store.list_executors("local", APP)} == {"e1": "DISCONNECTED"}


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_processes_creating_the_schema_at_once(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """`relay worker` and `relay gateway` started together on a new database both create the tables (PostgreSQL:
    the loser fails on its catalog of types, an IntegrityError); each must start all the same."""
    url = (f"sqlite:///{tmp_path / 'relay.db'}" if kind == "sqlite"
           else request.getfixturevalue("cluster").create_database("schema").replace("+psycopg", ""))
    starters = 4
    barrier = threading.Barrier(starters)
    failures: list[Exception] = []

    def start() -> None:
        barrier.wait()
        try:
            make_engine(url).dispose()
        except Exception as err:
            failures.append(err)

    threads = [threading.Thread(target=start) for _ in range(starters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []


@pytest.mark.concurrent  # outcomes only, generous waits: two at a time
async def test_an_activity_finding_the_database_away_fails_retryably() -> None:
    """The attempt fails with a short, explicitly retryable error (the workflow retries it until the database is
    back); BENIGN, so the SDK does not log a traceback for every attempt of every workflow."""
    nowhere = create_engine(f"postgresql+psycopg://relay@127.0.0.1:{free_port()}/relay")  # nothing listens there
    activities = RegistryActivities(Store(nowhere))
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(activities.write_audit,
                                        WriteAuditInput("local", APP, "e1", "executor.dead", event_key="k"))
    nowhere.dispose()
    assert (failed.value.type, failed.value.non_retryable) == (DATABASE_UNAVAILABLE, False)
    assert failed.value.category == ApplicationErrorCategory.BENIGN
    assert failed.value.message.startswith("database unavailable: OperationalError: connection failed")
