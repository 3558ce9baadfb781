"""Gateway processes and whether each is known gone: ``gatewayprocess`` (``core.gateways``).

Like 0001 it creates only what is missing: a database that ``create_all`` made with the current models already has
this table, and is adopted as it is.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from core.migrations import existing_tables

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)
TABLE = "gatewayprocess"


def upgrade() -> None:
    if TABLE in existing_tables():
        return
    op.create_table(
        TABLE,
        sa.Column("queue", sa.String(), nullable=False),
        sa.Column("identity", sa.String(), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("gone_at", UTC_DATETIME, nullable=True),
        sa.Column("gone_reason", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("queue"),
    )
    op.create_index("ix_gatewayprocess_identity", TABLE, ["identity"], unique=False)


def downgrade() -> None:
    op.drop_table(TABLE)
