"""``relay migrate``: bring Relay's database to the newest schema revision, as a deployment step of its own.

Every process that opens the store already upgrades it at start-up (``core.migrations``); in production the upgrade
is run first, once, by a release step (a compose one-shot, a Kubernetes Job), so a schema change that fails stops the
release before any gateway or worker is replaced, and says so where the operator looks.
"""

from __future__ import annotations

import argparse
from typing import Any

from core import migrations
from core.models import make_engine
from core.settings import Settings


def _migrate(args: argparse.Namespace, settings: Settings) -> None:
    if settings.database_url is None:  # SQLite in the data dir: the directory may not exist yet on a first run
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)  # upgrades under the migration lock, or finds the database at head
    try:
        with engine.connect() as conn:
            revision = migrations.current(conn)
    finally:
        engine.dispose()
    # A password in the URL stays out of the output: the host and database name are what identify it.
    print(f"{engine.url.render_as_string(hide_password=True)}: at revision {', '.join(sorted(revision))}")


def add_commands(sub: Any) -> None:
    """Add ``migrate`` to the ``relay`` command's ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "migrate", help="apply the database schema migrations (RELAY_DATABASE_URL or the data dir's SQLite), then exit")
    p.set_defaults(admin=_migrate)
