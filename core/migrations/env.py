"""Alembic's environment for Relay's schema.

At start-up ``core.migrations.upgrade`` runs it on a connection it has locked and begun a transaction on (passed as
``config.attributes["connection"]``); ``core.migrations.upgrade_sql`` (`relay migrate --sql`) runs it offline, with
the database's URL (``config.attributes["url"]``) only for its dialect. A developer writing the next revision runs
the ``alembic`` command with
``-x url=...`` (``alembic -c core/migrations/alembic.ini -x url=sqlite:///scratch.db revision --autogenerate -m ...``)
against a database at head.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import core.models  # noqa: F401  (registers the tables on SQLModel.metadata, the autogenerate target)

config = context.config
connection = config.attributes.get("connection")
if context.is_offline_mode():
    # Statements written out, not run: values inline, as the script is read by a person or psql.
    context.configure(url=config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url"),
                      target_metadata=SQLModel.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif connection is not None:
    context.configure(connection=connection, target_metadata=SQLModel.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the database: alembic -x url=<SQLAlchemy URL> ...")
    engine = create_engine(url)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=SQLModel.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
