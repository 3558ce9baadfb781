"""Relay's schema migrations (Alembic): applied by ``relay migrate``, and at start-up by every process that opens the
store unless RELAY_MIGRATE_ON_START is false; then the process only checks the revision (``check``).

``upgrade(engine)`` brings the database to the newest revision (``versions/``, shipped inside the package). Gateways,
workers, ``relay dev`` and the CLI may start together on a new database, so the upgrade runs under a lock held for
one transaction: on PostgreSQL a transaction-scoped advisory lock (``pg_advisory_xact_lock``), on SQLite the
database's write lock (``BEGIN IMMEDIATE``). Whoever takes it second finds the database at head and does nothing.
PostgreSQL's DDL is transactional, so a failed upgrade leaves nothing behind.

A database at a revision this code does not know was migrated by a newer Relay: this code can neither use it nor
upgrade it, so ``upgrade`` and ``check`` both refuse it (``SchemaVersionError``), as ``check`` refuses an older one.
``upgrade_sql`` writes the SQL an upgrade would run (Alembic's offline mode) without running it.

A database made by ``SQLModel.metadata.create_all`` before migrations (tables, no ``alembic_version``) is adopted by
the first revision, which creates only what is missing: its rows stay.
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path
from typing import TextIO

import sqlalchemy as sa
from alembic import command, context, op
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from core.errors import SchemaVersionError

SCRIPT_LOCATION = Path(__file__).resolve().parent
VERSION_TABLE = "alembic_version"  # Alembic's default, which Relay keeps
# pg_advisory_xact_lock's key: any constant shared by every Relay process ("relay" in ASCII).
ADVISORY_LOCK_KEY = 0x72656C6179
# Alembic's ``context`` and ``op`` are module-level proxies, not thread-local: one upgrade at a time per process.
_RUNNING = threading.Lock()


def config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    return cfg


@cache
def heads() -> frozenset[str]:
    return frozenset(ScriptDirectory.from_config(config()).get_heads())


def current(conn: Connection) -> frozenset[str]:
    """The database's revisions (none: no ``alembic_version`` yet). Read here rather than through Alembic's
    ``MigrationContext``, which logs two INFO lines each time: every process reads this at start."""
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return frozenset()
    return frozenset(conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())


@cache
def known() -> frozenset[str]:
    """Every revision this code ships, head or not."""
    return frozenset(script.revision for script in ScriptDirectory.from_config(config()).walk_revisions())


def _named(revisions: frozenset[str]) -> str:
    return ", ".join(sorted(revisions)) or "no revision (a new database)"


def verify(database: frozenset[str], *, upgrading: bool) -> None:
    """Raise ``SchemaVersionError`` unless this code can run on a database at ``database``: at head, or (when
    ``upgrading``) at a revision this code's migrations lead on from."""
    if database == heads():
        return
    if database - known():
        raise SchemaVersionError(
            f"database schema is at {_named(database)}, newer than this Relay's {_named(heads())} (a newer Relay "
            "migrated it): run that Relay, or one at least as new", database=database, code=heads())
    if not upgrading:
        raise SchemaVersionError(f"database schema is at {_named(database)}, this Relay needs {_named(heads())}: "
                                 "run `relay migrate`", database=database, code=heads())


def _read(engine: Engine) -> frozenset[str]:
    with engine.connect() as conn:
        revisions = current(conn)
        conn.rollback()
    return revisions


def check(engine: Engine) -> None:
    """What a process does at start instead of ``upgrade`` when RELAY_MIGRATE_ON_START is false: read the revision
    (no DDL, so a role without CREATE rights will do) and refuse any other than head."""
    verify(_read(engine), upgrading=False)


def upgrade(engine: Engine) -> None:
    """Migrate the database to head, once across every process starting at the same time."""
    at = _read(engine)
    verify(at, upgrading=True)
    if at == heads():  # the usual start: nothing to do, no lock taken
        return
    with _RUNNING, engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL statement_timeout = 0"))  # waiting for the lock is not a stuck query
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        elif conn.dialect.name == "sqlite":
            # pysqlite begins no transaction before DDL; this one also takes the write lock at once (waiting up to
            # the busy timeout for another process's upgrade), so a second migrator sees the first one's result.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        verify(current(conn), upgrading=True)  # a newer Relay may have migrated it while this one waited
        cfg = config()
        cfg.attributes["connection"] = conn
        # Alembic runs inside this transaction (an external one): it commits nothing itself.
        command.upgrade(cfg, "head")
        conn.commit()


def upgrade_sql(engine: Engine, out: TextIO) -> None:
    """Write to ``out`` the SQL ``upgrade`` would run on this database, without running it: Alembic's offline mode,
    from the database's current revision (read, nothing written) to head."""
    at = _read(engine)
    verify(at, upgrading=True)
    if at == heads():
        out.write(f"-- at revision {_named(at)}: nothing to run\n")
        return
    if not at and sa.inspect(engine).get_table_names():
        # Made by create_all before migrations: adopting it means looking at what it has, which offline cannot.
        raise SchemaVersionError("database has tables but no schema revision (made before migrations): only "
                                 "`relay migrate` itself can adopt it", database=at, code=heads())
    cfg = config()
    cfg.output_buffer = out
    cfg.attributes["url"] = engine.url
    # One revision at a time: Relay's history is linear, so a database is at one revision or none.
    start = f"{next(iter(at))}:" if at else ""
    with _RUNNING:
        command.upgrade(cfg, f"{start}head", sql=True)


def existing_tables() -> set[str]:
    """The tables the database has, for a revision that creates only what is missing (adopting a database made by
    ``create_all``). Offline (``upgrade_sql``) there is no database to ask: the script is for a database at the
    revision it starts from, which has none of the tables the later revisions create."""
    if context.is_offline_mode():
        return set()
    return set(sa.inspect(op.get_bind()).get_table_names())


def existing_columns(table: str) -> set[str]:
    """A table's columns, for a revision that adds only what is missing (``existing_tables``' reasoning: offline, the
    script starts from the revision before, which has none of the columns it adds)."""
    if context.is_offline_mode():
        return set()
    return {column["name"] for column in sa.inspect(op.get_bind()).get_columns(table)}
