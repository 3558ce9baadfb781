"""Relay's schema migrations (Alembic), applied at start-up by every process that opens the store.

``upgrade(engine)`` brings the database to the newest revision (``versions/``, shipped inside the package). Gateways,
workers, ``relay dev`` and the CLI may start together on a new database, so the upgrade runs under a lock held for
one transaction: on PostgreSQL a transaction-scoped advisory lock (``pg_advisory_xact_lock``), on SQLite the
database's write lock (``BEGIN IMMEDIATE``). Whoever takes it second finds the database at head and does nothing.
PostgreSQL's DDL is transactional, so a failed upgrade leaves nothing behind.

A database made by ``SQLModel.metadata.create_all`` before migrations (tables, no ``alembic_version``) is adopted by
the first revision, which creates only what is missing: its rows stay.
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

SCRIPT_LOCATION = Path(__file__).resolve().parent
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
    return frozenset(MigrationContext.configure(conn).get_current_heads())


def upgrade(engine: Engine) -> None:
    """Migrate the database to head, once across every process starting at the same time."""
    with engine.connect() as conn:
        at_head = current(conn) == heads()
        conn.rollback()
    if at_head:  # the usual start: nothing to do, no lock taken
        return
    with _RUNNING, engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL statement_timeout = 0"))  # waiting for the lock is not a stuck query
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        elif conn.dialect.name == "sqlite":
            # pysqlite begins no transaction before DDL; this one also takes the write lock at once (waiting up to
            # the busy timeout for another process's upgrade), so a second migrator sees the first one's result.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        cfg = config()
        cfg.attributes["connection"] = conn
        # Alembic runs inside this transaction (an external one): it commits nothing itself.
        command.upgrade(cfg, "head")
        conn.commit()
