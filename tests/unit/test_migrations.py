"""Schema migrations on SQLite (core/migrations): a new database migrated to head has exactly the models' schema, a
database made by ``create_all`` before migrations is adopted with its rows, and processes starting together on one
new database all get there; 0006 moves operators' request claims to their own table. The same on PostgreSQL:
tests/e2e/test_migrations.py, with these helpers."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text
from sqlmodel import Session, SQLModel, select

from core import migrations
from core.models import (
    ApiKey,
    Application,
    AuditLog,
    AutoscalingPolicy,
    Executor,
    ManagementClaim,
    RecoveryClaim,
    make_engine,
)
from tests.support import starts_processes
from workflows.contracts.common import ExecutorStatus

ORG = "local"


def schema_differences(engine: Engine) -> list[Any]:
    """What Alembic's autogenerate finds between the database and ``SQLModel.metadata`` (types included)."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return list(compare_metadata(ctx, SQLModel.metadata))


def schema(engine: Engine) -> dict[str, Any]:
    """Every table's columns, primary key, unique constraints and indexes, as reflected; ``alembic_version`` left
    out. What ``create_all`` makes and what the migrations make must be equal."""
    found = inspect(engine)
    tables: dict[str, Any] = {}
    for table in sorted(set(found.get_table_names()) - {"alembic_version"}):
        tables[table] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"], c.get("default")) for c in found.get_columns(table)],
            "pk": found.get_pk_constraint(table)["constrained_columns"],
            "unique": sorted(tuple(u["column_names"]) for u in found.get_unique_constraints(table)),
            "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                              for i in found.get_indexes(table)),
        }
    return tables


def revision(engine: Engine) -> frozenset[str]:
    with engine.connect() as conn:
        return migrations.current(conn)


def fill(engine: Engine) -> None:
    """Rows in every kind of column (JSON, interval, enum, aware timestamps), written through the models."""
    with Session(engine) as s:
        s.add(ApiKey(id="k1", org=ORG, name="ci", key_hash="h1", apps=["orders"]))
        s.add(Application(id="a1", org=ORG, name="orders", executor_timeout=timedelta(seconds=5),
                          gc_time_threshold=timedelta(days=7)))
        s.add(Executor(org=ORG, app="orders", executor_id="e1", status=ExecutorStatus.DEAD,
                       executor_metadata={"k": [1, 2]}))
        s.add(AuditLog(id="l1", event_key="ev1", org=ORG, app="orders", operation="app.registered",
                       details={"app": "orders"}))
        s.commit()


def check_filled(engine: Engine) -> None:
    with Session(engine) as s:
        assert [k.apps for k in s.exec(select(ApiKey)).all()] == [["orders"]]
        app = s.exec(select(Application)).one()
        assert (app.name, app.executor_timeout, app.gc_time_threshold) == ("orders", timedelta(seconds=5),
                                                                           timedelta(days=7))
        executor = s.exec(select(Executor)).one()
        assert (executor.status, executor.executor_metadata) == (ExecutorStatus.DEAD, {"k": [1, 2]})
        assert executor.created_at.tzinfo is not None
        assert [a.event_key for a in s.exec(select(AuditLog)).all()] == ["ev1"]


def migrate_to(url: str, target: str, *, down: bool = False) -> None:
    """Migrate the database up (or ``down``) to ``target`` only, as a Relay of that revision left it."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            cfg = migrations.config()
            cfg.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(cfg, target)
            conn.commit()
    finally:
        engine.dispose()


def check_management_claims_move(url: str) -> None:
    """0006 on a database at 0005 holding claims of both kinds: operators' request claims (until then recovery
    claims of ``management:<request id>``) move to ``managementclaim``, recovery claims stay; a downgrade puts the
    request claims back as they were."""
    migrate_to(url, "0005")
    claimed = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
    engine = create_engine(url)
    with Session(engine) as s:
        s.add(RecoveryClaim(org=ORG, app="orders", dead_executor_id="dead-1", candidate_id="p1", claimed_at=claimed))
        s.add(RecoveryClaim(org=ORG, app="orders", dead_executor_id="management:req-1", candidate_id="p2",
                            claimed_at=claimed))
        s.commit()
    migrate_to(url, "0006")
    with Session(engine) as s:
        assert [(c.dead_executor_id, c.candidate_id, c.claimed_at) for c in s.exec(select(RecoveryClaim)).all()] == [
            ("dead-1", "p1", claimed)]
        assert [(c.org, c.app, c.request_id, c.candidate_id, c.claimed_at)
                for c in s.exec(select(ManagementClaim)).all()] == [(ORG, "orders", "req-1", "p2", claimed)]
    migrate_to(url, "0005", down=True)
    assert "managementclaim" not in inspect(engine).get_table_names()
    with Session(engine) as s:
        assert sorted((c.dead_executor_id, c.candidate_id, c.claimed_at)
                      for c in s.exec(select(RecoveryClaim)).all()) == [("dead-1", "p1", claimed),
                                                                        ("management:req-1", "p2", claimed)]
    engine.dispose()


def legacy_create_all(url: str) -> None:
    """A database as Relay made it before migrations: ``create_all``, no ``alembic_version``; filled with rows."""
    engine = create_engine(url)
    SQLModel.metadata.create_all(engine)
    fill(engine)
    engine.dispose()


OPENER = """
import sys
from core.models import make_engine
from core.store import Store
print("ready", flush=True)
sys.stdin.readline()
store = Store(make_engine(sys.argv[1]))
store.ping()
store.ensure_app("local", "orders")
store.engine.dispose()
"""


def open_at_once(url: str, processes: int) -> list[subprocess.CompletedProcess[str]]:
    """``processes`` Python processes (gateways and workers starting together), each opening the store on ``url``
    at the same moment (once every one has imported Relay, each is told to go), then registering one app."""
    running = [subprocess.Popen([sys.executable, "-c", OPENER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(processes)]
    try:
        early: list[str] = []
        for process in running:
            assert process.stdout is not None
            lines = []
            for line in process.stdout:  # until "ready", or the end of its output if it died before that
                if line == "ready\n":
                    break
                lines.append(line)
            else:
                raise AssertionError(f"a process exited before it was ready: {''.join(lines)}")
            early.append("".join(lines))
        for process in running:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        done = []
        for before, process in zip(early, running, strict=True):
            out, _ = process.communicate(timeout=120)
            done.append(subprocess.CompletedProcess(process.args, process.returncode, before + out, None))
        return done
    finally:
        for process in running:  # stopped by PID whatever happened above
            if process.poll() is None:
                process.kill()
                process.wait()


def test_migrations_on_an_empty_database_make_the_models_schema(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'relay.db'}")
    assert schema_differences(engine) == []
    assert revision(engine) == migrations.heads()
    legacy = create_engine(f"sqlite:///{tmp_path / 'legacy.db'}")
    SQLModel.metadata.create_all(legacy)
    assert schema(engine) == schema(legacy)  # exactly what create_all made
    legacy.dispose()
    fill(engine)
    check_filled(engine)
    engine.dispose()


def test_opening_again_is_a_no_op(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    make_engine(url).dispose()
    engine = make_engine(url)
    fill(engine)
    engine.dispose()
    engine = make_engine(url)
    check_filled(engine)
    assert revision(engine) == migrations.heads()
    engine.dispose()


def test_in_memory_database() -> None:
    engine = make_engine("sqlite://")
    assert schema_differences(engine) == []
    engine.dispose()


def test_a_database_made_by_create_all_is_adopted_with_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    legacy_create_all(url)
    engine = make_engine(url)
    assert revision(engine) == migrations.heads()
    assert schema_differences(engine) == []
    check_filled(engine)
    engine.dispose()


def test_a_database_missing_a_later_table_is_completed(tmp_path: Path) -> None:
    """Before migrations, ``create_all`` added tables to an existing database as Relay gained them
    (``retentionstate`` came late): adoption creates the missing ones, and keeps the rest."""
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    legacy_create_all(url)
    with create_engine(url).begin() as conn:
        conn.execute(text("DROP TABLE retentionstate"))
        conn.execute(text("DROP INDEX ix_auditlog_operation"))
    engine = make_engine(url)
    assert schema_differences(engine) == []
    check_filled(engine)
    engine.dispose()


@starts_processes
def test_processes_migrating_one_new_database_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    results = open_at_once(url, 6)
    assert [r.returncode for r in results] == [0] * 6, "\n".join(r.stdout for r in results)
    engine = make_engine(url)
    assert revision(engine) == migrations.heads()
    assert schema_differences(engine) == []
    with Session(engine) as s:
        assert len(s.exec(select(Application)).all()) == 1
    engine.dispose()


def _migrate(url: str, ready: Any, go: Any) -> None:
    ready.set()  # imported: the parent lets every process go at once
    go.wait(60)
    make_engine(url).dispose()


@starts_processes
def test_processes_adopting_one_legacy_database_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    legacy_create_all(url)
    spawn = multiprocessing.get_context("spawn")
    go = spawn.Event()
    readies = [spawn.Event() for _ in range(4)]
    processes = [spawn.Process(target=_migrate, args=(url, ready, go)) for ready in readies]
    try:
        for process in processes:
            process.start()
        assert all(ready.wait(60) for ready in readies), "a process never got ready"
        go.set()
        for process in processes:
            process.join(120)
        assert [p.exitcode for p in processes] == [0] * 4
    finally:
        for process in processes:  # stopped by PID whatever happened above
            if process.is_alive():
                process.kill()
                process.join()
    engine = make_engine(url)
    assert revision(engine) == migrations.heads()
    check_filled(engine)
    engine.dispose()


def check_gateway_reports_added(url: str) -> None:
    """0007 on a database at 0006 holding a gateway process: its row gains the report columns as one that has not
    reported (0 sockets, not accepting, never); a downgrade drops them and keeps the row."""
    migrate_to(url, "0006")
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("INSERT INTO gatewayprocess (queue, identity, started_at, gone_reason) "
                       "VALUES ('relay-gateway-a', 'gateway-1', :at, '')"), {"at": datetime(2026, 12, 6, tzinfo=UTC)})
    migrate_to(url, "0007")
    with engine.connect() as c:
        assert c.execute(text("SELECT queue, sockets, accepting, reported_at FROM gatewayprocess")).all() == [
            ("relay-gateway-a", 0, False, None)]
    migrate_to(url, "0006", down=True)
    assert {col["name"] for col in inspect(engine).get_columns("gatewayprocess")} == {
        "queue", "identity", "started_at", "gone_at", "gone_reason"}
    with engine.connect() as c:
        assert c.execute(text("SELECT queue FROM gatewayprocess")).scalars().all() == ["relay-gateway-a"]
    engine.dispose()


def test_gateway_reports_are_added_to_known_processes(tmp_path: Path) -> None:
    check_gateway_reports_added(f"sqlite:///{tmp_path / 'relay.db'}")


def check_autoscaling_policies_added(url: str) -> None:
    """0008 on a database at 0007: ``autoscalingpolicy`` is created, and a policy written through the model reads
    back as written; a downgrade drops the table."""
    migrate_to(url, "0007")
    engine = create_engine(url)
    assert "autoscalingpolicy" not in inspect(engine).get_table_names()
    migrate_to(url, "0008")
    with Session(engine) as s:
        s.add(AutoscalingPolicy(org=ORG, app="orders", queue="work", max_old_versions=1))
        s.commit()
    with Session(engine) as s:
        row = s.exec(select(AutoscalingPolicy)).one()
        assert (row.org, row.app, row.queue, row.max_old_versions, row.max_old_executors) == (
            ORG, "orders", "work", 1, None)
        assert row.updated_at.tzinfo is not None
    migrate_to(url, "0007", down=True)
    assert "autoscalingpolicy" not in inspect(engine).get_table_names()
    engine.dispose()


def test_autoscaling_policies_get_their_table(tmp_path: Path) -> None:
    check_autoscaling_policies_added(f"sqlite:///{tmp_path / 'relay.db'}")


def test_the_scripts_ship_inside_the_package() -> None:
    """Alembic finds the revisions next to the installed ``core.migrations`` (package data, not the checkout)."""
    assert (migrations.SCRIPT_LOCATION / "env.py").is_file()
    assert (migrations.SCRIPT_LOCATION / "script.py.mako").is_file()
    assert migrations.heads() == frozenset({"0008"})


def test_management_claims_move_to_their_own_table(tmp_path: Path) -> None:
    check_management_claims_move(f"sqlite:///{tmp_path / 'relay.db'}")
