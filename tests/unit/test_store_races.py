"""Every row the store writes once per key, written by two writers at once, on SQLite and PostgreSQL: the second
gets the first's row as landed, never a unique violation (``core.store.base.InsertOnce``).

Each race is deterministic: the first writer runs until its transaction is about to end (commit, or roll back)
and is held there; the second runs meanwhile, two stores on two engines as a gateway and a worker are, until it
waits for the first (PostgreSQL: on a lock, seen in ``pg_stat_activity``; SQLite: at its first write, for the write
lock); then the first ends. Neither may raise, and PostgreSQL's log must show no ERROR: a failed insert caught as
``IntegrityError`` logged a unique violation there, for every race lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import event, text
from sqlmodel import Session, SQLModel, select

from core.autoscale import Policy, Rollout
from core.gate import GatePolicy
from core.gateways import WATCH
from core.models import (
    AlertWatermark,
    Application,
    AuditLog,
    AutoscalingPolicy,
    Executor,
    ExecutorDrain,
    GatewayProcess,
    ManagementClaim,
    OwnAlertState,
    RecoveryClaim,
    RecoveryGate,
    RecoveryPause,
    RecoveryTicket,
    RetentionState,
    make_engine,
)
from core.own_alerts import OwnAlertRates
from core.store import GraceBegun, StatusWritten, Store
from core.types import ExecutorInfo, ExecutorStatus
from tests.postgres import PostgresCluster, postgres_cluster
from tests.support import wait_until

ORG, APP = "local", "races"
GRACE = timedelta(seconds=60)  # an app's default executorTimeoutSecs
WAIT = 20.0  # seconds: far above any of these writes, on a loaded machine
T = TypeVar("T")
U = TypeVar("U")
M = TypeVar("M", bound=SQLModel)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


@dataclass
class Writers:
    """Two stores on one database, each with its own engine (its own connections), as two processes have."""

    first: Store
    second: Store
    log: Path | None  # PostgreSQL's server log

    def race(self, write_first: Callable[[Store], T], write_second: Callable[[Store], U]) -> tuple[T, U]:
        """``write_first`` held just before its transaction ends while ``write_second`` runs into it; both results."""
        held, release, writing = threading.Event(), threading.Event(), threading.Event()

        def hold(_conn: Any) -> None:
            if not held.is_set():
                held.set()
                release.wait(WAIT)

        def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
                writing.set()

        logged = self.log.stat().st_size if self.log is not None else 0
        for end in ("commit", "rollback"):
            event.listen(self.first.engine, end, hold)
        event.listen(self.second.engine, "before_cursor_execute", note)
        try:
            with ThreadPoolExecutor(2) as pool:
                first = pool.submit(write_first, self.first)
                if not held.wait(WAIT):
                    first.result(0)  # its own failure, if it failed before
                    raise AssertionError("the first writer never ended a transaction")
                second = pool.submit(write_second, self.second)
                if self.log is not None:
                    wait_until(self._waiting, timeout=WAIT, what="the second writer to wait on the first's lock")
                else:
                    assert writing.wait(WAIT), "the second writer never wrote"
                assert not second.done(), "the second writer did not wait for the first"
                release.set()
                results = first.result(WAIT), second.result(WAIT)
        finally:
            release.set()
            for end in ("commit", "rollback"):
                event.remove(self.first.engine, end, hold)
            event.remove(self.second.engine, "before_cursor_execute", note)
        if self.log is not None:  # no ERROR at all: a unique violation, or a deadlock detected
            said = self.log.read_bytes()[logged:].decode(errors="replace")
            assert "ERROR:" not in said, said
        return results

    def _waiting(self) -> bool:
        with self.first.engine.connect() as c:
            return bool(c.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND wait_event_type = 'Lock'")).scalar())

    def rows(self, model: type[M], **where: Any) -> list[M]:
        with Session(self.first.engine) as s:
            query = select(model)
            for name, value in where.items():
                query = query.where(getattr(model, name) == value)
            return list(s.exec(query).all())


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def writers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Writers]:
    """On SQLite (one file), and on PostgreSQL (a private cluster's database: Debian's server binaries, so that
    variant is in the e2e tier). The app is registered, with executor ``x`` HEALTHY on ``conn-1``."""
    cluster: PostgresCluster | None = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'relay.db'}"
    else:
        cluster = request.getfixturevalue("cluster")
        url = cluster.create_database("races")
    first = Store(make_engine(url))
    second = Store(make_engine(url))
    first.ensure_app(ORG, APP)
    _healthy(first, "x", "conn-1")
    yield Writers(first, second, None if cluster is None else cluster.log)
    first.engine.dispose()
    second.engine.dispose()


def _healthy(store: Store, executor_id: str, connection_id: str, key: str | None = None) -> StatusWritten:
    return store.record_status(org=ORG, app=APP, executor_id=executor_id, status=ExecutorStatus.HEALTHY,
                               operation="executor.connected", event_key=key or f"{executor_id}/{connection_id}",
                               info=ExecutorInfo(executor_id, application_version="v1"),
                               connection_id=connection_id, gateway_queue="q", details={})


def _registry(w: Writers, executor_id: str) -> Executor:
    [row] = w.rows(Executor, executor_id=executor_id)
    return row


# -- the drain: the gateway's DISCONNECTED and the workflow's grace, under one key ---------------------------------


def _disconnect(store: Store) -> bool:
    return store.record_disconnect(org=ORG, app=APP, executor_id="x", connection_id="conn-1", event_key="x/gone")


def _begin_grace(store: Store) -> GraceBegun | None:
    return store.begin_grace(org=ORG, app=APP, executor_id="x", event_key="x/gone", details={})


def test_the_gateway_writes_a_disconnect_first_and_the_workflows_grace_finds_it(writers: Writers) -> None:
    """The issue's drain: the gateway's ``record_disconnect`` holds the key when ``begin_grace`` comes."""
    wrote, begun = writers.race(_disconnect, _begin_grace)
    [row] = writers.rows(AuditLog, event_key="x/gone")
    assert wrote and begun == GraceBegun(at=row.emit_time, grace=GRACE, written=False, by_gateway=True)
    assert (row.details or {})["recordedBy"] == "gateway"
    registry = _registry(writers, "x")
    assert (registry.status, registry.connection_id, registry.updated_at) == (
        ExecutorStatus.DISCONNECTED, "conn-1", row.emit_time)


def test_the_workflows_grace_writes_first_and_the_gateways_disconnect_finds_it(writers: Writers) -> None:
    begun, wrote = writers.race(_begin_grace, _disconnect)
    [row] = writers.rows(AuditLog, event_key="x/gone")
    assert not wrote and begun == GraceBegun(at=row.emit_time, grace=GRACE, written=True)
    assert "recordedBy" not in (row.details or {})
    assert _registry(writers, "x").status == ExecutorStatus.DISCONNECTED


def test_a_grace_retried_while_its_first_try_runs_lands_once(writers: Writers) -> None:
    first, second = writers.race(_begin_grace, _begin_grace)
    [row] = writers.rows(AuditLog, event_key="x/gone")
    assert first == GraceBegun(at=row.emit_time, grace=GRACE, written=True)
    assert second == GraceBegun(at=row.emit_time, grace=GRACE, written=False)


def test_a_disconnect_over_another_sockets_row_leaves_the_key_to_the_workflow(writers: Writers) -> None:
    """The gateway's write of a socket the row no longer names is undone, audit row and all: the grace waiting on
    its key writes its own."""
    _healthy(writers.first, "x", "conn-2")
    wrote, begun = writers.race(_disconnect, _begin_grace)  # held before its rollback
    assert not wrote and begun is not None and begun.written
    [row] = writers.rows(AuditLog, event_key="x/gone")
    assert "recordedBy" not in (row.details or {})


# -- status writes and deletions of the lifecycle workflow --------------------------------------------------------


@pytest.mark.parametrize("executor_id", ["x", "new"])
def test_a_status_write_retried_while_its_first_try_runs_lands_once(writers: Writers, executor_id: str) -> None:
    """The same activity twice at once (its first try timed out, still running), over a row there and a new one."""

    def dead(store: Store) -> StatusWritten:
        return store.record_status(org=ORG, app=APP, executor_id=executor_id, status=ExecutorStatus.DEAD,
                                   operation="executor.dead", event_key=f"{executor_id}/dead", info=None,
                                   connection_id=None, gateway_queue=None, details={})

    first, second = writers.race(dead, dead)
    [row] = writers.rows(AuditLog, event_key=f"{executor_id}/dead")
    assert (first.written, first.at) == (True, row.emit_time)
    assert (second.written, second.at) == (False, row.emit_time)
    assert _registry(writers, executor_id).status == ExecutorStatus.DEAD


def test_a_new_executors_first_row_written_under_two_keys_is_inserted_once(writers: Writers) -> None:
    first, second = writers.race(lambda store: _healthy(store, "new", "conn-a"),
                                 lambda store: _healthy(store, "new", "conn-b"))
    assert first.written and second.written
    assert len(writers.rows(AuditLog, executor_id="new")) == 2
    assert _registry(writers, "new").connection_id == "conn-b"  # the second, written over the first


def test_a_deletion_retried_while_its_first_try_runs_lands_once(writers: Writers) -> None:
    def delete(store: Store) -> None:
        store.delete_executor(org=ORG, app=APP, executor_id="x", event_key="x/deleted", details={})

    writers.race(delete, delete)
    assert len(writers.rows(AuditLog, event_key="x/deleted")) == 1
    assert writers.rows(Executor, executor_id="x") == []


# -- audit rows, retention rounds, apps, alerts -------------------------------------------------------------------


def test_an_audit_row_written_twice_at_once_lands_once(writers: Writers) -> None:
    def audit(store: Store) -> bool:
        return store.write_audit(org=ORG, app=APP, operation="executor.recovery.blocked", event_key="k")

    assert writers.race(audit, audit) == (True, False)
    assert len(writers.rows(AuditLog, event_key="k")) == 1


def _round(key: str, executor_id: str, started_at: datetime) -> Callable[[Store], bool]:
    def write(store: Store) -> bool:
        return store.write_retention_audit(org=ORG, app=APP, operation="app.retention.started", event_key=key,
                                           status="success", executor_id=executor_id, details={},
                                           started_at=started_at, request_id=f"r-{key}")
    return write


def test_a_retention_audit_retried_while_its_first_try_runs_lands_once(writers: Writers) -> None:
    started = datetime.now(UTC)
    assert writers.race(_round("k", "x", started), _round("k", "x", started)) == (True, False)
    assert len(writers.rows(AuditLog, event_key="k")) == 1
    [state] = writers.rows(RetentionState)
    assert (state.last_started_at, state.executor_id) == (started, "x")


def test_two_retention_rounds_of_an_app_at_once_both_land(writers: Writers) -> None:
    """Two rounds (two keys) creating the app's last-round row at once: both audited, the later start kept."""
    started = datetime.now(UTC)
    later = started + timedelta(seconds=1)
    assert writers.race(_round("k1", "x", later), _round("k2", "y", started)) == (True, True)
    assert len(writers.rows(AuditLog, operation="app.retention.started")) == 2
    [state] = writers.rows(RetentionState)
    assert (state.last_started_at, state.executor_id, state.request_id) == (later, "y", "r-k2")


def test_an_app_registered_by_two_connections_at_once_is_registered_once(writers: Writers) -> None:
    def register(store: Store) -> tuple[Application, bool]:
        return store.ensure_app(ORG, "fresh")

    (first, new), (second, again) = writers.race(register, register)
    assert new and not again and first.id == second.id
    assert len(writers.rows(AuditLog, operation="app.registered", app="fresh")) == 1


def test_two_alert_rounds_creating_the_watermark_keep_the_later(writers: Writers) -> None:
    until = datetime.now(UTC)
    writers.race(lambda store: store.advance_alert_watermark(until),
                 lambda store: store.advance_alert_watermark(until + timedelta(seconds=1)))
    [mark] = writers.rows(AlertWatermark)
    assert mark.until == until + timedelta(seconds=1)


def test_two_own_alerts_creating_their_rate_send_one(writers: Writers) -> None:
    now = datetime.now(UTC)

    def claim(alert: str) -> Callable[[Store], Any]:
        return lambda store: OwnAlertRates(store.engine).claim(org=ORG, app=APP, kind="RecoveryBlocked",
                                                              alert_id=alert, now=now, min_interval=GRACE)

    first, second = writers.race(claim("a1"), claim("a2"))
    assert first.send and not second.send and second.flush_at == now + GRACE
    [rate] = writers.rows(OwnAlertState)
    assert (rate.last_alert_id, rate.held) == ("a1", 1)


# -- the recovery gate, claims, drains and pauses -----------------------------------------------------------------


def test_two_admissions_creating_the_gate_row_run_one_after_the_other(writers: Writers) -> None:
    now = datetime.now(UTC)
    for executor_id in ("d1", "d2"):
        writers.first.record_status(org=ORG, app=APP, executor_id=executor_id, status=ExecutorStatus.DEAD,
                                    operation="executor.dead", event_key=f"{executor_id}/dead", info=None,
                                    connection_id=None, gateway_queue=None, details={})

    def admit(executor_id: str) -> Callable[[Store], Any]:
        return lambda store: store.admit_recovery(org=ORG, app=APP, executor_id=executor_id, ticket="t", now=now,
                                                  policy=GatePolicy(storm_min=2))

    # Two of three executors dead: a storm. The first trips the breaker and goes; the second, after it, is paced.
    first, second = writers.race(admit("d1"), admit("d2"))
    assert (first.go, first.tripped, second.go, second.tripped) == (True, True, False, False)
    assert len(writers.rows(AuditLog, operation="app.recovery.breaker_tripped")) == 1
    [row] = writers.rows(RecoveryGate)
    assert row.version == 2
    assert len(writers.rows(RecoveryTicket)) == 2


def test_a_recovery_claimed_by_two_tries_at_once_has_one_claim(writers: Writers) -> None:
    _healthy(writers.first, "p1", "conn-p1")

    def select(store: Store) -> str:
        found = store.select_candidate(org=ORG, app=APP, app_version="v1", exclude=["dead"], dead_executor_id="dead")
        assert found is not None
        return found[0].executor_id

    first, second = writers.race(select, select)
    [claim] = writers.rows(RecoveryClaim)
    assert claim.dead_executor_id == "dead" and claim.candidate_id == second and first in ("x", "p1")


def test_an_operators_request_claimed_twice_at_once_has_one_claim(writers: Writers) -> None:
    def claim(executor_id: str) -> Callable[[Store], None]:
        return lambda store: store.claim_for_management(org=ORG, app=APP, executor_id=executor_id, request_id="r")

    writers.race(claim("x"), claim("p1"))
    [row] = writers.rows(ManagementClaim)
    assert row.candidate_id == "p1"


def test_two_operators_draining_one_executor_at_once_leave_the_second_drain(writers: Writers) -> None:
    until = datetime.now(UTC) + timedelta(hours=1)

    def drain(reason: str) -> Callable[[Store], Any]:
        return lambda store: store.set_drain(org=ORG, app=APP, executor_id="x", until=until, reason=reason,
                                             subject="system", source_ip="", details={})

    _, second = writers.race(drain("first"), drain("second"))
    [row] = writers.rows(ExecutorDrain)
    assert (second.reason, row.reason) == ("second", "second")


def test_two_operators_pausing_one_app_at_once_leave_the_second_pause(writers: Writers) -> None:
    until = datetime.now(UTC) + timedelta(hours=1)

    def pause(reason: str) -> Callable[[Store], Any]:
        return lambda store: store.set_pause(org=ORG, app=APP, until=until, reason=reason, subject="system",
                                             source_ip="", details={})

    writers.race(pause("first"), pause("second"))
    [row] = writers.rows(RecoveryPause)
    assert row.reason == "second"


def test_two_operators_setting_an_apps_first_autoscaling_policy_at_once_leave_the_second(writers: Writers) -> None:
    def policy(queue: str) -> Callable[[Store], Any]:
        return lambda store: store.set_autoscaling_policy(ORG, APP, Policy(queue=queue), subject="system",
                                                          source_ip="")

    writers.race(policy("first"), policy("second"))
    [row] = writers.rows(AutoscalingPolicy)
    assert row.queue == "second"


def test_a_rollout_takes_any_integer_the_api_takes(writers: Writers) -> None:
    """Upstream's rollout fields are int64 and the API takes up to 2**53 - 1: PostgreSQL's INTEGER is 32-bit (the
    fuzzer's 9007199254740990 was a 500)."""
    big = Rollout(max_old_versions=2**53 - 1, max_old_executors=2**31)
    writers.first.set_autoscaling_policy(ORG, APP, Policy(queue="q", rollout=big), subject="system", source_ip="")
    assert writers.second.get_autoscaling_policy(ORG, APP) == Policy(queue="q", rollout=big)


# -- gateway processes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", ["register", "revive"])
def test_a_gateway_found_gone_as_it_starts_is_marked_gone(writers: Writers, start: str) -> None:
    """Its row is new: the process inserts it (``register``, or ``revive`` on a database restored from before it
    started) while its watch marks it gone."""

    def starts(store: Store) -> Any:
        return getattr(store.gateways, start)("q-new", "g")

    started, marked = writers.race(starts, lambda store: store.gateways.mark_gone("q-new", WATCH))
    assert started in ([], None) and marked
    [row] = writers.rows(GatewayProcess, queue="q-new")
    assert (row.identity, row.gone_reason) == ("g", WATCH) and row.gone_at is not None


def test_an_unknown_gateway_marked_gone_twice_at_once_is_marked_once(writers: Writers) -> None:
    assert writers.race(lambda store: store.gateways.mark_gone("q-new", "first"),
                        lambda store: store.gateways.mark_gone("q-new", "second")) == (True, False)
    [row] = writers.rows(GatewayProcess, queue="q-new")
    assert row.gone_reason == "first"
