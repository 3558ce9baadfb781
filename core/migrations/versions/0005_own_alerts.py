"""The rate of Relay's own alerts, sent as they happen: ``ownalertstate`` (``core.own_alerts``).

Like 0001 it creates only what is missing: a database that ``create_all`` made with the current models already has
this table, and is adopted as it is.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from core.migrations import existing_tables

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)
TABLE = "ownalertstate"


def upgrade() -> None:
    if TABLE in existing_tables():
        return
    op.create_table(
        TABLE,
        sa.Column("org", sa.String(), nullable=False),
        sa.Column("app", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("last_sent_at", UTC_DATETIME, nullable=True),
        sa.Column("last_alert_id", sa.String(), nullable=False),
        sa.Column("held", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("org", "app", "kind"),
    )


def downgrade() -> None:
    op.drop_table(TABLE)
