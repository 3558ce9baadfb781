"""Each live gateway reports its socket count and whether it takes new sockets (``gatewayprocess.sockets``,
``accepting``, ``reported_at``), so that a gateway holding more than its share sheds the excess (``gateway.balance``).

Added with defaults (0, false, none): a row of a process from before this revision reads as one that has not reported,
which no gateway counts among the live.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from core.migrations import existing_columns

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

TABLE = "gatewayprocess"


def _columns() -> list[sa.Column[Any]]:
    """Built anew per use: a column belongs to the one table it is added to."""
    return [sa.Column("sockets", sa.Integer(), nullable=False, server_default="0"),
            sa.Column("accepting", sa.Boolean(), nullable=False, server_default=sa.false()),
            sa.Column("reported_at", sa.DateTime(timezone=True), nullable=True)]


def upgrade() -> None:
    # A database that ``create_all`` made with the current models already has them.
    # ADD COLUMN with a constant default: plain DDL on both databases (and offline, ``relay migrate --sql``).
    present = existing_columns(TABLE)
    for column in _columns():
        if column.name not in present:
            op.add_column(TABLE, column)


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        for column in reversed(_columns()):
            batch.drop_column(column.name)
