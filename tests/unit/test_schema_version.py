"""Migrations as a release step, on SQLite: with RELAY_MIGRATE_ON_START=false a process runs no DDL and refuses a
database behind its code; with or without it, it refuses a database ahead of its code (migrated by a newer Relay);
either way `relay gateway`, `relay worker` and `relay dev` exit 1 with one line naming both revisions, before they
start anything. `relay migrate --sql` prints the statements it would run and changes nothing. (PostgreSQL, with a
role that has no CREATE rights: tests/e2e/test_pg_operations.py.)"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from core import migrations
from core.errors import SchemaVersionError
from core.models import make_engine, open_engine
from core.settings import Settings
from core.store import Store
from tests.support import VENV_BIN, Process, free_port, relay_env, starts_processes
from tests.unit.test_migrations import legacy_create_all, revision, schema_differences

# This code's head, the revision before it (a database an older release left), and one only a newer Relay knows.
[HEAD] = migrations.heads()
BEHIND = str(ScriptDirectory.from_config(migrations.config()).get_revision(HEAD).down_revision)
AHEAD = "9999_from_a_newer_relay"


def at_revision(url: str, target: str) -> None:
    """A database migrated up to ``target`` only, as an older Relay left it."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            cfg = migrations.config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, target)
            conn.commit()
    finally:
        engine.dispose()


def ahead(url: str) -> None:
    """A database at head, then migrated by a newer Relay to a revision this code does not know."""
    make_engine(url, migrate=True).dispose()
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (AHEAD,))


def revision_of(url: str) -> frozenset[str]:
    engine = create_engine(url)
    try:
        return revision(engine)
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_the_revisions_named_here_are_the_codes() -> None:
    assert migrations.heads() == {HEAD} and BEHIND in migrations.known() and AHEAD not in migrations.known()


def test_without_migrate_on_start_an_older_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    at_revision(url, BEHIND)
    before = tables(url)
    with pytest.raises(SchemaVersionError) as refused:
        make_engine(url, migrate=False)
    assert str(refused.value) == (f"database schema is at {BEHIND}, this Relay needs {HEAD}: run `relay migrate`")
    assert (refused.value.database, refused.value.code) == (frozenset({BEHIND}), frozenset({HEAD}))
    assert tables(url) == before and revision_of(url) == {BEHIND}  # no DDL ran

    # With migrate on start (the default), the same database is upgraded, as before.
    make_engine(url, migrate=True).dispose()
    engine = create_engine(url)
    try:
        assert revision(engine) == {HEAD} and schema_differences(engine) == []
    finally:
        engine.dispose()


def test_without_migrate_on_start_a_new_database_gets_no_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    with pytest.raises(SchemaVersionError, match=rf"^database schema is at no revision \(a new database\), this "
                                                 rf"Relay needs {HEAD}: run `relay migrate`$"):
        make_engine(url, migrate=False)
    assert tables(url) == set()


@pytest.mark.parametrize("migrate", [True, False])
def test_a_database_migrated_by_a_newer_relay_is_refused_either_way(tmp_path: Path, migrate: bool) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    ahead(url)
    with pytest.raises(SchemaVersionError) as refused:
        make_engine(url, migrate=migrate)
    assert str(refused.value).startswith(f"database schema is at {AHEAD}, newer than this Relay's {HEAD}")
    engine = create_engine(url)
    try:
        assert revision(engine) == {AHEAD}  # untouched
    finally:
        engine.dispose()


def test_at_head_the_store_opens_without_migrating_and_works(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    make_engine(url, migrate=True).dispose()
    monkeypatch.setenv("RELAY_MIGRATE_ON_START", "false")  # what a process's engine follows (open_engine)
    store = Store(open_engine(Settings(database_url=url)))
    try:
        store.ensure_app("local", "orders")
        assert [a.operation for a in store.list_audit("local")] == ["app.registered"]
    finally:
        store.engine.dispose()
    at_revision(url := f"sqlite:///{tmp_path / 'old.db'}", BEHIND)
    with pytest.raises(SchemaVersionError):  # the environment's false, again: checked, not upgraded
        open_engine(Settings(database_url=url))


# -- the processes: one line, exit 1, before anything starts ------------------------------------------------------


def _refused_at_start(command_name: str, data_dir: Path, **env: str) -> list[str]:
    """Run `relay <command_name>`; it must exit 1 by itself. Its output's lines. Temporal is pointed at a closed
    port with a short connect timeout, so a process that got past the check would say so and end too."""
    process = Process([str(VENV_BIN / "relay"), command_name],
                      env=relay_env(data_dir, RELAY_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",
                                    RELAY_TEMPORAL_CONNECT_TIMEOUT_SECS="1", **env),
                      log=data_dir.parent / f"{command_name}.log")
    try:
        code = process.popen.wait(60)
    finally:
        process.stop()
    lines = process.output().splitlines()
    assert code == 1, lines
    return lines


@starts_processes
@pytest.mark.parametrize("command_name", ["gateway", "worker", "dev"])
def test_a_process_on_an_older_database_without_migrate_on_start_exits_with_one_line(
    tmp_path: Path, command_name: str
) -> None:
    data_dir = tmp_path / "relay"
    data_dir.mkdir()
    at_revision(f"sqlite:///{data_dir / 'relay.db'}", BEHIND)
    lines = _refused_at_start(command_name, data_dir, RELAY_MIGRATE_ON_START="false")
    assert len(lines) == 1, lines
    assert lines[0].endswith(f"ERROR relay: cannot start: database schema is at {BEHIND}, this Relay needs {HEAD}: "
                             "run `relay migrate`"), lines


@starts_processes
@pytest.mark.parametrize("command_name", ["gateway", "worker"])
def test_a_process_on_a_newer_database_exits_with_one_line(tmp_path: Path, command_name: str) -> None:
    data_dir = tmp_path / "relay"
    data_dir.mkdir()
    ahead(f"sqlite:///{data_dir / 'relay.db'}")
    lines = _refused_at_start(command_name, data_dir)  # migrate on start: the default
    assert len(lines) == 1, lines
    assert f"cannot start: database schema is at {AHEAD}, newer than this Relay's {HEAD}" in lines[0], lines


# -- relay migrate ----------------------------------------------------------------------------------------------


def relay_migrate(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "relay"), "migrate", *args], env=relay_env(data_dir, **env),
                          capture_output=True, text=True, timeout=60)


@starts_processes
def test_migrate_migrates_whatever_migrate_on_start_says(tmp_path: Path) -> None:
    at_revision(f"sqlite:///{tmp_path / 'relay.db'}", BEHIND)
    done = relay_migrate(tmp_path, RELAY_MIGRATE_ON_START="false")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(f": at revision {HEAD}\n")


@starts_processes
def test_migrate_refuses_a_newer_database_in_one_line(tmp_path: Path) -> None:
    ahead(f"sqlite:///{tmp_path / 'relay.db'}")
    for args in ((), ("--sql",)):
        done = relay_migrate(tmp_path, *args)
        assert done.returncode == 1 and done.stdout == "", done
        assert done.stderr.splitlines()[-1].startswith(
            f"relay: database schema is at {AHEAD}, newer than this Relay's {HEAD}"), done.stderr


@starts_processes
def test_migrate_sql_prints_the_whole_schema_for_a_new_database_and_creates_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "not-yet"
    done = relay_migrate(data_dir, "--sql")
    assert done.returncode == 0, done.stderr
    assert not data_dir.exists()
    assert "CREATE TABLE apikey" in done.stdout and f"-- Running upgrade {BEHIND} -> {HEAD}" in done.stdout
    # The script is the migration: run by hand on an empty database, it makes the models' schema at head.
    script = tmp_path / "by-hand.db"
    with sqlite3.connect(script) as conn:
        conn.executescript(done.stdout)
    engine = create_engine(f"sqlite:///{script}")
    try:
        assert revision(engine) == {HEAD} and schema_differences(engine) == []
    finally:
        engine.dispose()


@starts_processes
def test_migrate_sql_starts_from_the_databases_revision_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "relay.db"
    at_revision(f"sqlite:///{db}", BEHIND)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    done = relay_migrate(tmp_path, "--sql")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"-- Running upgrade {BEHIND} -> {HEAD}") and "CREATE TABLE apikey" not in done.stdout
    assert f"UPDATE alembic_version SET version_num='{HEAD}' WHERE alembic_version.version_num = '{BEHIND}'" \
        in done.stdout
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    with sqlite3.connect(db) as conn:
        conn.executescript(done.stdout)
    engine = create_engine(f"sqlite:///{db}")
    try:
        assert revision(engine) == {HEAD} and schema_differences(engine) == []
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    finally:
        engine.dispose()

    done = relay_migrate(tmp_path, "--sql")  # now at head
    assert done.returncode == 0 and done.stdout == f"-- at revision {HEAD}: nothing to run\n", done


@starts_processes
def test_migrate_sql_refuses_a_database_from_before_migrations(tmp_path: Path) -> None:
    legacy_create_all(f"sqlite:///{tmp_path / 'relay.db'}")
    done = relay_migrate(tmp_path, "--sql")
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.splitlines()[-1] == ("relay: database has tables but no schema revision (made before "
                                            "migrations): only `relay migrate` itself can adopt it")
