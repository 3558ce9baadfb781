"""Candidate selection against real SQLite and PostgreSQL: same version first, spread by recoveries in flight,
cross-version only when the app allows it, claims released when the dead executor's record is deleted; an operator's
slow request claims its executor in a table of its own."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, select
from temporalio.testing import ActivityEnvironment

from activities.registry import RegistryActivities
from core import metrics
from core.errors import AuthError
from core.models import AuditLog, ManagementClaim, RecoveryClaim, make_engine
from core.store import MANAGEMENT_CLAIM_TTL, GraceBegun, Move, RowSeen, StatusWritten, Store
from core.store.registry import _GATEWAY_GONE_AT, AppExecutors
from core.units import utcnow
from tests.postgres import PostgresCluster, postgres_cluster
from workflows.contracts.common import ExecutorInfo, ExecutorStatus
from workflows.contracts.lifecycle import DeleteExecutorInput, RecordStatusInput, WriteAuditInput

ORG, APP = "local", "spread-app"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The same queries on both stores Relay runs on (PostgreSQL: a private cluster, a database per test; it needs
    Debian's server binaries, so that variant is in the e2e tier)."""
    url = (f"sqlite:///{tmp_path / 'relay.db'}" if request.param == "sqlite"
           else request.getfixturevalue("cluster").create_database("recovery"))
    store = Store(make_engine(url))
    store.ensure_app(ORG, APP)
    yield store
    store.engine.dispose()


def _executor(store: Store, executor_id: str, version: str, status: ExecutorStatus, *,
              gateway_queue: str = "relay-gateway-test") -> None:
    store.record_status(org=ORG, app=APP, executor_id=executor_id, status=status, operation="test",
                        event_key=f"{executor_id}/{status}", connection_id=f"conn-{executor_id}",
                        gateway_queue=gateway_queue, details={},
                        info=ExecutorInfo(executor_id, application_version=version))


def _pick(store: Store, dead: str, version: str = "v1", exclude: list[str] | None = None, *,
          prefer_gateway: str = "") -> tuple[str, bool] | None:
    found = store.select_candidate(org=ORG, app=APP, app_version=version, exclude=[dead, *(exclude or [])],
                                   dead_executor_id=dead, prefer_gateway=prefer_gateway)
    return None if found is None else (found[0].executor_id, found[1])


def test_an_idle_peer_on_the_dead_executors_gateway_comes_first(store: Store) -> None:
    """``prefer_gateway``: the idle peers on that gateway queue before those elsewhere (that gateway then looks for
    the dead executor's socket itself as it sends the request); once they are all busy, any idle one; then the
    least busy, wherever it is."""
    for peer, queue in (("a1", "gw-a"), ("a2", "gw-a"), ("b1", "gw-b"), ("b2", "gw-b"), ("b3", "gw-b")):
        _executor(store, peer, "v1", ExecutorStatus.HEALTHY, gateway_queue=queue)
    first = [_pick(store, f"dead-{i}", prefer_gateway="gw-a") for i in range(2)]
    assert sorted(p[0] for p in first if p is not None) == ["a1", "a2"]
    then = [_pick(store, f"dead-{i}", prefer_gateway="gw-a") for i in range(2, 5)]
    assert sorted(p[0] for p in then if p is not None) == ["b1", "b2", "b3"]
    assert _pick(store, "dead-5", prefer_gateway="gw-a") is not None  # all busy: the least busy, anywhere


def test_recoveries_spread_evenly_across_survivors(store: Store) -> None:
    for peer in ("p1", "p2", "p3"):
        _executor(store, peer, "v1", ExecutorStatus.HEALTHY)
    picks = [_pick(store, f"dead-{i}") for i in range(9)]
    load = Counter(p[0] for p in picks if p is not None)
    assert sorted(load.values()) == [3, 3, 3]  # fair share exactly; never more than fair share + 1


def test_a_dead_executors_own_claim_does_not_count_against_its_peer(store: Store) -> None:
    _executor(store, "p1", "v1", ExecutorStatus.HEALTHY)
    _executor(store, "p2", "v1", ExecutorStatus.HEALTHY)
    first = _pick(store, "dead-1")
    assert first is not None
    other = "p2" if first[0] == "p1" else "p1"
    assert _pick(store, "dead-2") == (other, False)  # the least loaded peer
    # dead-1 tries again, excluding the peer that failed it: its old claim moves with it.
    assert _pick(store, "dead-1", exclude=[first[0]]) == (other, False)


def test_other_versions_only_when_the_app_allows_it(store: Store) -> None:
    _executor(store, "new-1", "v2", ExecutorStatus.HEALTHY)
    _executor(store, "sick", "v1", ExecutorStatus.DISCONNECTED)
    assert _pick(store, "dead-1", "v1") is None
    store.update_app(ORG, APP, {"cross_version_recovery": True}, subject="test")
    assert _pick(store, "dead-1", "v1") == ("new-1", True)
    _executor(store, "old-1", "v1", ExecutorStatus.HEALTHY)
    assert _pick(store, "dead-1", "v1") == ("old-1", False)  # its own version still comes first


def test_deleting_the_dead_record_releases_its_claim(store: Store) -> None:
    _executor(store, "p1", "v1", ExecutorStatus.HEALTHY)
    _executor(store, "p2", "v1", ExecutorStatus.HEALTHY)
    first = _pick(store, "dead-1")
    assert first is not None
    busy, idle = first[0], ("p2" if first[0] == "p1" else "p1")
    assert _pick(store, "dead-2") == (idle, False)
    store.delete_executor(org=ORG, app=APP, executor_id="dead-1", event_key="deleted-1", details={})
    # dead-1's recovery is over: `busy` carries nothing now, so it is the least loaded peer.
    assert _pick(store, "dead-3") == (busy, False)


def _claims(store: Store) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(dead executor, peer)`` of every recovery claim and ``(request, executor)`` of every management claim."""
    with Session(store.engine) as s:
        recovery = [(c.dead_executor_id, c.candidate_id) for c in s.exec(select(RecoveryClaim)).all()]
        management = [(c.request_id, c.candidate_id) for c in s.exec(select(ManagementClaim)).all()]
    return recovery, management


def test_a_management_claim_has_a_table_of_its_own_and_counts_as_work_in_flight(store: Store) -> None:
    _executor(store, "p1", "v1", ExecutorStatus.HEALTHY)
    _executor(store, "p2", "v1", ExecutorStatus.HEALTHY)
    store.claim_for_management(org=ORG, app=APP, executor_id="p1", request_id="r1")
    assert _pick(store, "dead-1") == ("p2", False)  # p1 is busy with the operator's request
    assert _claims(store) == ([("dead-1", "p2")], [("r1", "p1")])
    assert store.management_candidates(ORG, APP).busy == {"p1", "p2"}
    store.release_management_claim(org=ORG, app=APP, request_id="r1")
    assert _claims(store) == ([("dead-1", "p2")], [])
    assert store.management_candidates(ORG, APP).busy == {"p2"}


def test_a_management_claim_left_behind_expires(store: Store) -> None:
    """A gateway that died mid-request never releases its claim: past ``MANAGEMENT_CLAIM_TTL`` it stops counting."""
    _executor(store, "p1", "v1", ExecutorStatus.HEALTHY)
    store.claim_for_management(org=ORG, app=APP, executor_id="p1", request_id="r1")
    assert store.management_candidates(ORG, APP).busy == {"p1"}
    with Session(store.engine) as s:
        claim = s.exec(select(ManagementClaim)).one()
        claim.claimed_at = utcnow() - MANAGEMENT_CLAIM_TTL - timedelta(seconds=1)
        s.add(claim)
        s.commit()
    assert store.management_candidates(ORG, APP).busy == set()
    _executor(store, "p2", "v1", ExecutorStatus.HEALTHY)
    store.claim_for_management(org=ORG, app=APP, executor_id="p2", request_id="r2")
    assert _pick(store, "dead-1") == ("p1", False)  # p2's request counts, p1's stale one does not


def test_get_apps_one_read_says_what_the_executor_list_says(store: Store) -> None:
    """getApp and listApps read ``available`` and ``language`` through the same SQL (``app_executors_columns``), and
    it agrees with the executor rows: a HEALTHY executor makes the app available, and the language is the newest
    executor's that named one."""
    key = store.create_token(org=ORG, name="t", apps=None, subject="test", source_ip="")
    store.ensure_app(ORG, "other")  # no executors: listApps must not take APP's for it

    def read() -> tuple[bool, str | None]:
        executors = store.authorize_app(key, ORG, APP, with_executors=True).executors
        assert executors is not None
        listed = {app.name: e for app, e in store.list_apps(ORG)}
        assert listed == {APP: executors, "other": AppExecutors(False, None)}
        return executors.available, executors.language

    assert read() == (False, None)
    for executor_id, language in (("a", "python"), ("b", None), ("c", "go"), ("d", "")):
        store.record_status(org=ORG, app=APP, executor_id=executor_id, status=ExecutorStatus.DISCONNECTED,
                            operation="test", event_key=f"{executor_id}/lang", connection_id=f"conn-{executor_id}",
                            gateway_queue="relay-gateway-test", details={},
                            info=ExecutorInfo(executor_id, application_version="v1", language=language))
    assert read() == (False, "go")
    _executor(store, "b", "v1", ExecutorStatus.HEALTHY)
    assert read() == (True, "go")
    rows = store.list_executors(ORG, APP)
    assert read() == (any(e.status == ExecutorStatus.HEALTHY for e in rows),
                      next(e.language for e in reversed(rows) if e.language))


def test_a_status_write_says_when_its_audit_row_happened_and_a_retry_the_same(store: Store) -> None:
    """``record_status`` answers with its audit row's time (the lifecycle starts the grace from the DISCONNECTED
    row's); a retried activity, finding the row written, answers with that first write's time, not its own."""
    def write() -> StatusWritten:
        return store.record_status(org=ORG, app=APP, executor_id="x1", status=ExecutorStatus.DISCONNECTED,
                                   operation="executor.disconnected", event_key="x1/disconnected/1",
                                   info=None, connection_id=None, gateway_queue=None, details={})

    before = utcnow()
    first = write()
    assert first.written and before <= first.at <= utcnow()
    with Session(store.engine) as s:
        [row] = s.exec(select(AuditLog).where(AuditLog.event_key == "x1/disconnected/1")).all()
    assert row.emit_time == first.at
    again = write()
    assert not again.written and again.at == first.at


def test_status_writes_keep_what_they_do_not_set_and_a_healthy_one_names_the_dead(store: Store) -> None:
    """``record_status`` (SQLAlchemy Core): a new row takes the executor's info and connection; a later write without
    them changes the status and ``updated_at`` only; a HEALTHY write answers the app's DEAD executors; each event
    lands once, however often it is retried."""
    _executor(store, "gone", "v1", ExecutorStatus.DEAD)
    info = ExecutorInfo("x1", application_version="v2", hostname="h1", language="python", dbos_version="3.2.0",
                        executor_metadata={"k": "v"})
    healthy = store.record_status(org=ORG, app=APP, executor_id="x1", status=ExecutorStatus.HEALTHY,
                                  operation="executor.healthy", event_key="x1/healthy", info=info,
                                  connection_id="c1", gateway_queue="q1", details={"connection_id": "c1"})
    assert healthy.written and healthy.dead == ["gone"]
    for _ in range(2):  # the second, a retry: nothing new
        store.record_status(org=ORG, app=APP, executor_id="x1", status=ExecutorStatus.DISCONNECTED,
                            operation="executor.disconnected", event_key="x1/disconnected", info=None,
                            connection_id=None, gateway_queue=None, details={})
    [row] = [e for e in store.list_executors(ORG, APP) if e.executor_id == "x1"]
    assert (row.status, row.app_version, row.hostname, row.language, row.dbos_version, row.executor_metadata,
            row.connection_id, row.gateway_queue) == (
        ExecutorStatus.DISCONNECTED, "v2", "h1", "python", "3.2.0", {"k": "v"}, "c1", "q1")
    assert row.created_at == healthy.at < row.updated_at
    with Session(store.engine) as s:
        audited = s.exec(select(AuditLog.operation).where(AuditLog.executor_id == "x1")).all()
    assert sorted(audited) == ["executor.disconnected", "executor.healthy"]


def test_a_healthy_write_says_when_its_gateway_is_already_known_gone(store: Store) -> None:
    """A connection recorded HEALTHY on a gateway already marked gone (its watch swept the rows on it before this
    one named it) is answered as such, so its workflow can be told; a live or unknown gateway, a retried write and a
    write of another status are not. On PostgreSQL the read holds a share lock on the gateway's row until the write
    commits: a ``mark_gone`` of it waits, so the sweep behind it reads the row."""
    store.gateways.register("q-live", "live")
    store.gateways.register("q-gone", "gone")
    assert store.gateways.mark_gone("q-gone", "its watch found it gone")

    def healthy(executor_id: str, queue: str, key: str = "") -> StatusWritten:
        return store.record_status(org=ORG, app=APP, executor_id=executor_id, status=ExecutorStatus.HEALTHY,
                                   operation="executor.healthy", event_key=key or f"{executor_id}/healthy",
                                   info=ExecutorInfo(executor_id, application_version="v1"),
                                   connection_id=f"c-{executor_id}", gateway_queue=queue, details={})

    assert [healthy(e, q).gateway_gone for e, q in (("a", "q-live"), ("b", "q-gone"), ("c", "q-never-seen"))] == [
        False, True, False]
    again = healthy("b", "q-gone")  # a retry of the same activity: it landed, and the gateway is still gone
    assert (again.written, again.gateway_gone) == (False, True)
    assert not store.record_status(org=ORG, app=APP, executor_id="b", status=ExecutorStatus.DISCONNECTED,
                                   operation="executor.disconnected", event_key="b/disconnected", info=None,
                                   connection_id="c-b", gateway_queue="q-gone", details={}).gateway_gone
    assert store.gateways.revive("q-gone", "gone") is not None
    assert not healthy("b", "q-gone", key="b/healthy/2").gateway_gone
    if store.engine.dialect.name != "postgresql":
        return
    # A HEALTHY write's transaction, open after its gone check: the mark waits for it, then lands.
    marked: list[bool] = []
    with store.engine.connect() as c, c.begin():
        assert c.execute(_GATEWAY_GONE_AT, {"queue": "q-live"}).scalar() is None
        thread = threading.Thread(target=lambda: marked.append(store.gateways.mark_gone("q-live", "test")))
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive() and marked == []  # held by the share lock
    thread.join(timeout=10)
    assert marked == [True]


def _row(store: Store, executor_id: str) -> tuple[ExecutorStatus, str | None, str | None]:
    [row] = [e for e in store.list_executors(ORG, APP) if e.executor_id == executor_id]
    return row.status, row.connection_id, row.gateway_queue


def test_a_gateways_move_writes_only_over_the_row_it_read_before_its_signal(store: Store) -> None:
    """``move_healthy``: a HEALTHY executor's new socket, written by the gateway once its ``connected`` landed, over
    the row exactly as ``row_seen`` read it before the signal: any write in between (the workflow's, a gateway's
    DISCONNECTED, another move) wins, and so does a gateway known gone; a write of this very socket in between (its
    workflow was first) counts as ``already``. No audit row: the workflow audits it."""
    store.gateways.register("q2", "g2")
    store.gateways.register("q-gone", "gone")
    assert store.gateways.mark_gone("q-gone", "its watch found it gone")
    _executor(store, "x1", "v1", ExecutorStatus.HEALTHY)  # conn-x1 on relay-gateway-test
    assert store.row_seen(ORG, APP, "nobody") is None
    seen = store.row_seen(ORG, APP, "x1")
    assert seen is not None and (seen.status, seen.connection_id) == (ExecutorStatus.HEALTHY, "conn-x1")
    first = seen
    audited = len(store.list_audit(ORG, app=APP))

    def move(seen: RowSeen | None, connection_id: str, queue: str = "q2", version: str = "v2") -> Move:
        assert seen is not None
        return store.move_healthy(org=ORG, app=APP, executor_id="x1", seen=seen, connection_id=connection_id,
                                  gateway_queue=queue, info=ExecutorInfo("x1", application_version=version))

    assert move(seen, "conn-x1") == Move.ALREADY  # its own connection: nothing to move
    assert move(seen, "c-gone", queue="q-gone") == Move.LOST  # onto a gateway known gone: rolled back
    assert _row(store, "x1") == (ExecutorStatus.HEALTHY, "conn-x1", "relay-gateway-test")
    assert move(seen, "c2") == Move.WRITTEN
    assert _row(store, "x1") == (ExecutorStatus.HEALTHY, "c2", "q2")
    assert [e.app_version for e in store.list_executors(ORG, APP) if e.executor_id == "x1"] == ["v2"]
    assert len(store.list_audit(ORG, app=APP)) == audited
    assert move(seen, "c3") == Move.LOST  # the row it read was written over (by its own move here)
    assert move(seen, "c2") == Move.ALREADY  # the same socket's move, written already
    # The workflow writes between the read and the move: the workflow's row stays.
    seen = store.row_seen(ORG, APP, "x1")
    store.record_status(org=ORG, app=APP, executor_id="x1", status=ExecutorStatus.HEALTHY,
                        operation="executor.superseded", event_key="x1/wf", connection_id="c4", gateway_queue="q2",
                        details={}, info=ExecutorInfo("x1", application_version="v2"))
    assert move(seen, "c5") == Move.LOST
    assert _row(store, "x1") == (ExecutorStatus.HEALTHY, "c4", "q2")
    assert move(seen, "c4") == Move.ALREADY  # the workflow took this very socket in first
    assert _row(store, "x1") == (ExecutorStatus.HEALTHY, "c4", "q2")
    # Written again as it was (the workflow taking in late the very socket the row names): still a write between.
    seen = store.row_seen(ORG, APP, "x1")
    store.record_status(org=ORG, app=APP, executor_id="x1", status=ExecutorStatus.HEALTHY,
                        operation="executor.superseded", event_key="x1/wf-again", connection_id="c4",
                        gateway_queue="q2", details={}, info=ExecutorInfo("x1", application_version="v2"))
    assert move(seen, "c5") == Move.LOST
    assert _row(store, "x1") == (ExecutorStatus.HEALTHY, "c4", "q2")
    # The gateway's own DISCONNECTED between them: the row stays DISCONNECTED, and a DISCONNECTED row is not moved.
    seen = store.row_seen(ORG, APP, "x1")
    assert store.record_disconnect(org=ORG, app=APP, executor_id="x1", connection_id="c4", event_key="x1/gone")
    assert move(seen, "c6") == Move.LOST
    assert move(store.row_seen(ORG, APP, "x1"), "c6") == Move.LOST
    assert move(first, "c4") == Move.LOST  # the row names c4, but DISCONNECTED: not "already"
    assert _row(store, "x1") == (ExecutorStatus.DISCONNECTED, "c4", "q2")


def test_a_grace_begun_on_the_gateways_row_puts_back_disconnected_over_the_same_socket(store: Store) -> None:
    """The gateway wrote a socket's move and then its close; the workflow, taking both in, writes the socket HEALTHY
    (its own key) and then begins the grace on the gateway's DISCONNECTED: the row is DISCONNECTED again, as of the
    gateway's time. A newer socket's row is left alone."""
    store.update_app(ORG, APP, {"executor_timeout": timedelta(seconds=7)}, subject="test")
    for executor_id in ("x1", "x2"):
        _executor(store, executor_id, "v1", ExecutorStatus.HEALTHY)
        seen = store.row_seen(ORG, APP, executor_id)
        assert seen is not None
        assert store.move_healthy(org=ORG, app=APP, executor_id=executor_id, seen=seen, connection_id="c2",
                                  gateway_queue="q2", info=ExecutorInfo(executor_id, application_version="v1")
                                  ) == Move.WRITTEN
        assert store.record_disconnect(org=ORG, app=APP, executor_id=executor_id, connection_id="c2",
                                       event_key=f"{executor_id}/gone")

    def workflow_healthy(executor_id: str, connection_id: str) -> None:
        store.record_status(org=ORG, app=APP, executor_id=executor_id, status=ExecutorStatus.HEALTHY,
                            operation="executor.superseded", event_key=f"{executor_id}/{connection_id}",
                            connection_id=connection_id, gateway_queue="q2", details={},
                            info=ExecutorInfo(executor_id, application_version="v1"))

    workflow_healthy("x1", "c2")
    workflow_healthy("x2", "c2")
    workflow_healthy("x2", "c3")  # x2 came back on a newer socket before its grace began
    assert _row(store, "x1") == (ExecutorStatus.HEALTHY, "c2", "q2")
    [gateway_row] = _disconnected_rows(store, "x1")
    begun = store.begin_grace(org=ORG, app=APP, executor_id="x1", event_key="x1/gone", details={})
    assert begun == GraceBegun(at=gateway_row.emit_time, grace=timedelta(seconds=7), written=False, by_gateway=True)
    assert _row(store, "x1") == (ExecutorStatus.DISCONNECTED, "c2", "q2")
    [row] = [e for e in store.list_executors(ORG, APP) if e.executor_id == "x1"]
    assert row.updated_at == gateway_row.emit_time
    store.begin_grace(org=ORG, app=APP, executor_id="x2", event_key="x2/gone", details={})
    assert _row(store, "x2") == (ExecutorStatus.HEALTHY, "c3", "q2")


def test_a_joining_executor_is_checked_on_one_connection_and_registers_a_new_app_once(store: Store) -> None:
    """``Store.join``, the gateway's check of a joining executor: an unknown key is refused; a key's first executor of
    a new app registers it (audited once); later ones find it; a key not allowed the app gets no app, nothing
    registered."""
    fleet, narrow = store.create_key(org=ORG, name="fleet"), store.create_key(org=ORG, name="narrow", apps=[APP])
    with pytest.raises(AuthError):
        store.join("rk_not-a-key", APP)
    principal, first = store.join(fleet, "new-app", source_ip="10.0.0.9")
    _, again = store.join(fleet, "new-app")
    assert principal.org == ORG and first is not None and again is not None and first.id == again.id
    assert store.join(fleet, APP)[1] == store.get_app(ORG, APP)
    assert store.join(narrow, "other-app") == (store.authenticate(narrow), None)
    with Session(store.engine) as s:
        registered = s.exec(select(AuditLog.app, AuditLog.source_ip).where(
            AuditLog.operation == "app.registered")).all()
    assert sorted(registered) == sorted([(APP, ""), ("new-app", "10.0.0.9")])


def _disconnected_rows(store: Store, executor_id: str) -> list[AuditLog]:
    with Session(store.engine) as s:
        return list(s.exec(select(AuditLog).where(AuditLog.executor_id == executor_id,
                                                  AuditLog.operation == "executor.disconnected")).all())


def test_a_gateways_disconnect_moves_only_the_workflows_healthy_row_for_that_socket(store: Store) -> None:
    """``record_disconnect`` (the gateway, as a socket closes): DISCONNECTED, audited with the app's grace, only over
    the HEALTHY row of that very connection; any other row (a newer connection, not HEALTHY, none) is left to the
    lifecycle workflow. Once per key."""
    store.update_app(ORG, APP, {"executor_timeout": timedelta(seconds=7)}, subject="test")
    _executor(store, "x1", "v1", ExecutorStatus.HEALTHY)  # connection conn-x1

    def gateway(executor_id: str, connection_id: str, key: str) -> bool:
        return store.record_disconnect(org=ORG, app=APP, executor_id=executor_id, connection_id=connection_id,
                                       event_key=key)

    assert not gateway("x1", "conn-older", "k-older")  # a socket the workflow no longer records
    assert not gateway("nobody", "conn-nobody", "k-nobody")  # no row yet: HEALTHY not recorded
    before = utcnow()
    assert gateway("x1", "conn-x1", "k1")
    assert not gateway("x1", "conn-x1", "k1")  # the same event again
    [row] = [e for e in store.list_executors(ORG, APP) if e.executor_id == "x1"]
    assert (row.status, row.connection_id, row.app_version) == (ExecutorStatus.DISCONNECTED, "conn-x1", "v1")
    assert before <= row.updated_at <= utcnow()
    [audit] = _disconnected_rows(store, "x1")
    assert (audit.event_key, audit.details, audit.emit_time) == (
        "k1", {"connection_id": "conn-x1", "recordedBy": "gateway", "executorTimeoutSecs": 7}, row.updated_at)
    assert not gateway("x1", "conn-x1", "k2")  # not HEALTHY any more: a second close changes nothing
    # Its gateway's watch, finding the gateway gone, still disconnects it: the gateway's own signal may be lost.
    assert ("local", APP, "x1", "conn-x1") in store.executors_on_gateway("relay-gateway-test")
    _executor(store, "x2", "v1", ExecutorStatus.DEAD)
    assert not gateway("x2", "conn-x2", "k3")  # DEAD stays DEAD
    assert [e.status for e in store.list_executors(ORG, APP) if e.executor_id == "x2"] == [ExecutorStatus.DEAD]


def test_the_workflows_grace_begins_with_the_gateways_row_or_its_own(store: Store) -> None:
    """``begin_grace`` (the lifecycle's local activity): under the key the gateway wrote, that row's time and grace,
    nothing written again, even after the app's grace changed; under a key not landed, DISCONNECTED written now with
    the app's grace; None when the app is gone."""
    store.update_app(ORG, APP, {"executor_timeout": timedelta(seconds=7)}, subject="test")
    _executor(store, "x1", "v1", ExecutorStatus.HEALTHY)
    assert store.record_disconnect(org=ORG, app=APP, executor_id="x1", connection_id="conn-x1", event_key="k1")
    [gateway_row] = _disconnected_rows(store, "x1")
    store.update_app(ORG, APP, {"executor_timeout": timedelta(seconds=9)}, subject="test")

    def begin(executor_id: str, key: str) -> object:
        return store.begin_grace(org=ORG, app=APP, executor_id=executor_id, event_key=key,
                                 details={"connection_id": f"conn-{executor_id}"})

    found = begin("x1", "k1")
    assert found == GraceBegun(at=gateway_row.emit_time, grace=timedelta(seconds=7), written=False, by_gateway=True)
    assert len(_disconnected_rows(store, "x1")) == 1
    _executor(store, "x2", "v1", ExecutorStatus.HEALTHY)
    before = utcnow()
    own = begin("x2", "k2")
    assert isinstance(own, GraceBegun) and own.written and not own.by_gateway and own.grace == timedelta(seconds=9)
    assert before <= own.at <= utcnow()
    assert begin("x2", "k2") == GraceBegun(at=own.at, grace=timedelta(seconds=9), written=False)  # a retry
    [row] = _disconnected_rows(store, "x2")
    assert row.details == {"connection_id": "conn-x2", "executorTimeoutSecs": 9}
    assert [e.status for e in store.list_executors(ORG, APP) if e.executor_id == "x2"] == [ExecutorStatus.DISCONNECTED]
    store.delete_app(ORG, APP, subject="test", source_ip="", orphans=[], details={})
    assert begin("x3", "k3") is None


async def test_a_grace_is_reported_once_by_the_try_that_wrote_it_or_the_first_to_find_the_gateways(
        store: Store) -> None:
    """``begin_grace``'s activity counts the DISCONNECTED transition (and logs it) once: when it wrote the row, or
    when it finds the gateway's, on whatever try (a first try that failed while the gateway wrote, as SQLite's
    "database is locked" did: the transition went unreported); not when it finds a row an earlier try wrote."""
    store.update_app(ORG, APP, {"executor_timeout": timedelta(seconds=7)}, subject="test")
    for executor_id in ("x1", "x2"):
        _executor(store, executor_id, "v1", ExecutorStatus.HEALTHY)
    assert store.record_disconnect(org=ORG, app=APP, executor_id="x1", connection_id="conn-x1", event_key="k1")
    activities = RegistryActivities(store)

    def reported() -> float:
        labels = {"org": ORG, "app": APP, "status": ExecutorStatus.DISCONNECTED}
        return metrics.REGISTRY.get_sample_value("relay_executor_transitions_total", labels) or 0.0

    async def begin(executor_id: str, key: str, attempt: int) -> None:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, attempt=attempt)
        begun = await env.run(activities.begin_grace, RecordStatusInput(
            ORG, APP, executor_id, ExecutorStatus.DISCONNECTED, "executor.disconnected", event_key=key,
            details={"connection_id": f"conn-{executor_id}"}))
        assert begun is not None and begun.grace == timedelta(seconds=7)

    before = reported()
    await begin("x1", "k1", attempt=2)  # the gateway's row, found by a retry
    assert reported() == before + 1
    await begin("x2", "k2", attempt=2)  # its own row, on a retry
    assert reported() == before + 2
    await begin("x2", "k2", attempt=3)  # found again: the try before reported it
    assert reported() == before + 2


async def test_a_confirmed_recovery_and_its_deletion_are_one_write_landed_and_reported_once(store: Store) -> None:
    """``delete_executor`` with the recovery's success row (lifecycle generation 5): both audit rows and the
    deletion in one transaction, the DEAD time read before the row goes, for the recovery's metric. A retry of the
    activity (the same keys) writes nothing twice and reports nothing twice."""
    _executor(store, "p1", "v1", ExecutorStatus.HEALTHY)
    _executor(store, "dead", "v1", ExecutorStatus.DEAD)
    assert _pick(store, "dead") == ("p1", False)
    activities = RegistryActivities(store)
    succeeded = WriteAuditInput(ORG, APP, "dead", "executor.recovery.succeeded", "dead/succeeded/1", "success",
                                {"candidate": "p1", "attempt": 1, "request_id": "r1"})
    delete = DeleteExecutorInput(ORG, APP, "dead", "dead/deleted/1", {"recovered_by": "p1"}, succeeded=succeeded)

    def sample(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, {"org": ORG, "app": APP, **labels}) or 0.0

    before = (sample("relay_recoveries_total", outcome="succeeded"), sample("relay_recovery_duration_seconds_count"))
    await ActivityEnvironment().run(activities.delete_executor, delete)
    await ActivityEnvironment().run(activities.delete_executor, delete)  # retried: its first try had landed
    after = (sample("relay_recoveries_total", outcome="succeeded"), sample("relay_recovery_duration_seconds_count"))
    assert after == (before[0] + 1, before[1] + 1)
    with Session(store.engine) as s:
        rows = {r.operation: r for r in s.exec(select(AuditLog).where(AuditLog.executor_id == "dead")).all()
                if r.operation != "test"}
        assert {op: r.event_key for op, r in rows.items()} == {
            "executor.recovery.succeeded": "dead/succeeded/1", "executor.deleted": "dead/deleted/1"}
        assert rows["executor.deleted"].details == {"recovered_by": "p1"}
        assert rows["executor.recovery.succeeded"].details == succeeded.details
        # Listed in the order they happened (the audit log and `relay audit --follow` order by time).
        assert rows["executor.recovery.succeeded"].emit_time < rows["executor.deleted"].emit_time
        assert s.exec(select(RecoveryClaim)).all() == []
    assert "dead" not in {e.executor_id for e in store.list_executors(ORG, APP)}
