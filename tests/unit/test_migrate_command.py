"""``relay migrate`` as a release step runs it: the real command on a SQLite file, its exit code and what it prints.
A new database ends at head with the models' schema; a second run changes nothing; a database from before
migrations is adopted with its rows. (The migrations themselves, and PostgreSQL: tests/unit/test_migrations.py and
tests/e2e/test_migrations.py.)"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from sqlalchemy import create_engine

from core import migrations
from tests.support import STARTS_PROCESSES, VENV_BIN, relay_env
from tests.unit.test_migrations import check_filled, legacy_create_all, revision, schema_differences

pytestmark = list(STARTS_PROCESSES)


def migrate(data_dir: Path) -> str:
    done = subprocess.run([str(VENV_BIN / "relay"), "migrate"], env=relay_env(data_dir), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_new_database_is_migrated_to_head(tmp_path: Path) -> None:
    data_dir = tmp_path / "not-yet"  # a first run: the data dir does not exist either
    out = migrate(data_dir)
    db = data_dir / "relay.db"
    assert out == f"sqlite:///{db}: at revision {', '.join(sorted(migrations.heads()))}\n"
    engine = create_engine(f"sqlite:///{db}")
    try:
        assert revision(engine) == migrations.heads()
        assert schema_differences(engine) == []
    finally:
        engine.dispose()


def test_migrating_again_changes_nothing(tmp_path: Path) -> None:
    first = migrate(tmp_path)
    digest = hashlib.sha256((tmp_path / "relay.db").read_bytes()).hexdigest()
    assert migrate(tmp_path) == first
    # Not one page written: a database at head is read, not locked and upgraded again.
    assert hashlib.sha256((tmp_path / "relay.db").read_bytes()).hexdigest() == digest


def test_a_database_from_before_migrations_is_adopted_with_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    legacy_create_all(url)
    migrate(tmp_path)
    engine = create_engine(url)
    try:
        assert revision(engine) == migrations.heads()
        check_filled(engine)
    finally:
        engine.dispose()
