"""Schema migrations on PostgreSQL (a private cluster, tests/postgres.py; a database per test): a new database
migrated to head has exactly the models' schema (enum type included), a database made by ``create_all`` before
migrations is adopted with its rows, and processes opening the store together (two gateways and a worker) all get
there, one upgrading under the advisory lock. SQLite: tests/unit/test_migrations.py, whose helpers these share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlmodel import Session, SQLModel, select

from core import migrations
from core.models import Application, make_engine, open_engine
from core.settings import DatabasePool, Settings
from tests.postgres import PostgresCluster, postgres_cluster
from tests.unit.test_migrations import (
    check_autoscaling_policies_added,
    check_filled,
    check_gateway_reports_added,
    check_management_claims_move,
    fill,
    legacy_create_all,
    open_at_once,
    revision,
    schema,
    schema_differences,
)

# Asserts no timing: `make test` runs it two at a time with the others so marked (docs/pages/contributing/tests.md).
pytestmark = pytest.mark.concurrent


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


def _enum_types(url: str) -> list[tuple[str, list[str]]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT t.typname, array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_type t "
            "JOIN pg_enum e ON e.enumtypid = t.oid GROUP BY t.typname ORDER BY t.typname")).all()
    engine.dispose()
    return [(name, list(labels)) for name, labels in rows]


def test_migrations_on_an_empty_database_make_the_models_schema(cluster: PostgresCluster) -> None:
    url = cluster.create_database("migrate")
    engine = make_engine(url)
    assert schema_differences(engine) == []
    assert revision(engine) == migrations.heads()
    legacy_url = cluster.create_database("legacy")
    legacy = create_engine(legacy_url)
    SQLModel.metadata.create_all(legacy)
    assert schema(engine) == schema(legacy)  # exactly what create_all made: named the same, unique constraints too
    assert _enum_types(url) == _enum_types(legacy_url) == [("executorstatus", ["HEALTHY", "DISCONNECTED", "DEAD"])]
    legacy.dispose()
    fill(engine)
    check_filled(engine)
    engine.dispose()


def test_a_database_made_by_create_all_is_adopted_with_its_rows(cluster: PostgresCluster) -> None:
    url = cluster.create_database("adopt")
    legacy_create_all(url)
    engine = make_engine(url)
    assert revision(engine) == migrations.heads()
    assert schema_differences(engine) == []
    check_filled(engine)
    engine.dispose()
    engine = make_engine(url)  # and again: at head, nothing to do
    check_filled(engine)
    engine.dispose()


@pytest.mark.parametrize("legacy", [False, True], ids=["new", "create_all"])
def test_two_gateways_and_a_worker_opening_the_store_at_once(cluster: PostgresCluster, legacy: bool) -> None:
    url = cluster.create_database("together")
    if legacy:
        legacy_create_all(url)
    results = open_at_once(url, 3)
    assert [r.returncode for r in results] == [0] * 3, "\n".join(r.stdout for r in results)
    engine = make_engine(url)
    assert revision(engine) == migrations.heads()
    assert schema_differences(engine) == []
    with Session(engine) as s:
        assert [a.name for a in s.exec(select(Application)).all()] == ["orders"]
    if legacy:
        check_filled(engine)
    engine.dispose()


def test_many_processes_opening_a_new_database_at_once(cluster: PostgresCluster) -> None:
    url = cluster.create_database("crowd")
    results = open_at_once(url, 5)
    assert [r.returncode for r in results] == [0] * 5, "\n".join(r.stdout for r in results)


def test_pool_size_and_statement_timeout_settings(cluster: PostgresCluster) -> None:
    engine = make_engine(cluster.create_database("settings"),
                         DatabasePool(pool_size=2, max_overflow=1, statement_timeout_secs=1.5))
    assert (engine.pool.size(), engine.pool._max_overflow) == (2, 1)  # type: ignore[attr-defined]
    with engine.connect() as conn:
        assert conn.execute(text("SHOW statement_timeout")).scalar() == "1500ms"
        with pytest.raises(Exception, match="statement timeout"):
            conn.execute(text("SELECT pg_sleep(5)"))
    engine.dispose()


def test_settings_from_the_environment(cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_DATABASE_POOL_SIZE", "3")
    monkeypatch.setenv("RELAY_DATABASE_STATEMENT_TIMEOUT_SECS", "20")
    engine = open_engine(Settings(database_url=cluster.create_database("env")))  # as every process opens it
    assert engine.pool.size() == 3  # type: ignore[attr-defined]
    with engine.connect() as conn:
        assert conn.execute(text("SHOW statement_timeout")).scalar() == "20s"
    engine.dispose()


def test_management_claims_move_to_their_own_table(cluster: PostgresCluster) -> None:
    check_management_claims_move(cluster.create_database("claims"))


def test_gateway_reports_are_added_to_known_processes(cluster: PostgresCluster) -> None:
    check_gateway_reports_added(cluster.create_database("reports"))


def test_autoscaling_policies_get_their_table(cluster: PostgresCluster) -> None:
    check_autoscaling_policies_added(cluster.create_database("autoscaling"))
