"""``relay migrate``: bring Relay's database to the newest schema revision, as a deployment step of its own.

Processes upgrade the schema at start-up too, unless RELAY_MIGRATE_ON_START is false (``core.migrations``); in
production the upgrade is run first, once, by a release step (a compose one-shot, a Kubernetes Job), so a schema
change that fails stops the release before any gateway or worker is replaced, and says so where the operator looks.
The command always migrates, whatever RELAY_MIGRATE_ON_START says: it is the step that setting leaves the DDL to.
``--sql`` prints the statements instead (Alembic's offline mode), for a DBA to review or run: the database is only
read, for its current revision.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from core.settings import Settings

# The database's modules (SQLAlchemy, Alembic's migrations, the models) are imported by this command when it runs,
# not by every `relay` command that builds the parser: together they cost more than `relay --help` takes in all.


def _migrate(args: argparse.Namespace, settings: Settings) -> None:
    # A database a newer Relay migrated raises SchemaVersionError: `relay` prints it in one line, exit status 1.
    if args.sql:
        _print_sql(settings.db_url)
    else:
        _upgrade(settings)


def _upgrade(settings: Settings) -> None:
    from core import migrations
    from core.models import make_engine

    if settings.database_url is None:  # SQLite in the data dir: the directory may not exist yet on a first run
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    # Upgrades under the migration lock, or finds it at head.
    engine = make_engine(settings.db_url, settings.database_pool, migrate=True)
    try:
        with engine.connect() as conn:
            revision = migrations.current(conn)
    finally:
        engine.dispose()
    # A password in the URL stays out of the output: the host and database name are what identify it.
    print(f"{engine.url.render_as_string(hide_password=True)}: at revision {', '.join(sorted(revision))}")


def _print_sql(url: str) -> None:
    from sqlalchemy import create_engine, make_url

    from core import migrations
    from core.models import engine_url

    url = engine_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).exists():
        # No file yet: an empty in-memory database of the same dialect stands for it, so none is created.
        url = "sqlite://"
    engine = create_engine(url)  # no pragmas, no pool settings: one read of the revision
    try:
        migrations.upgrade_sql(engine, sys.stdout)
    finally:
        engine.dispose()


def add_commands(sub: Any) -> None:
    """Add ``migrate`` to the ``relay`` command's ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "migrate", help="apply the database schema migrations (RELAY_DATABASE_URL or the data dir's SQLite), then exit")
    p.add_argument("--sql", action="store_true",
                   help="print the SQL the migration would run, from the database's current revision; change nothing")
    p.set_defaults(admin=_migrate)
