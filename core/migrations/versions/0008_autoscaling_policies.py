"""Autoscaling policies (upstream's setAutoscalingPolicy): ``autoscalingpolicy`` (``core.store.autoscale``), one row
per app.

Like 0001 it creates only what is missing: a database that ``create_all`` made with the current models already has
this table, and is adopted as it is.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from core.migrations import existing_tables

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

TABLE = "autoscalingpolicy"


def upgrade() -> None:
    if TABLE in existing_tables():
        return
    op.create_table(
        TABLE,
        sa.Column("org", sa.String(), nullable=False),
        sa.Column("app", sa.String(), nullable=False),
        sa.Column("queue", sa.String(), nullable=False),
        sa.Column("max_old_versions", sa.BigInteger(), nullable=True),
        sa.Column("max_old_executors", sa.BigInteger(), nullable=True),
        sa.Column("subject", sa.String(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("org", "app"),
    )


def downgrade() -> None:
    op.drop_table(TABLE)
