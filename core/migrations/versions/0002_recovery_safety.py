"""Drain, pause and the recovery-storm breaker: ``executordrain``, ``recoverypause``, ``recoverygate`` and
``recoveryticket``.

Like 0001 it creates only what is missing: a database that ``create_all`` made with the current models already has
these tables, and is adopted as it is.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from core.migrations import existing_tables

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)


def _keys(*names: str) -> list[sa.Column[Any]]:
    return [sa.Column(name, sa.String(), nullable=False) for name in names]


def _tables() -> list[tuple[str, list[sa.Column[Any] | sa.Constraint]]]:
    return [
        ("executordrain", [
            *_keys("org", "app", "executor_id"),
            sa.Column("until", UTC_DATETIME, nullable=False),
            sa.Column("subject", sa.String(), nullable=False),
            sa.Column("reason", sa.String(), nullable=False),
            sa.Column("created_at", UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("org", "app", "executor_id"),
        ]),
        ("recoverypause", [
            *_keys("org", "app"),
            sa.Column("until", UTC_DATETIME, nullable=False),
            sa.Column("subject", sa.String(), nullable=False),
            sa.Column("reason", sa.String(), nullable=False),
            sa.Column("created_at", UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("org", "app"),
        ]),
        ("recoverygate", [
            *_keys("org", "app"),
            sa.Column("tripped_at", UTC_DATETIME, nullable=True),
            sa.Column("trips", sa.Integer(), nullable=False),
            sa.Column("last_slot_at", UTC_DATETIME, nullable=True),
            sa.Column("last_granted_at", UTC_DATETIME, nullable=True),
            sa.Column("version", sa.Integer(), nullable=False),
            sa.PrimaryKeyConstraint("org", "app"),
        ]),
        ("recoveryticket", [
            *_keys("org", "app", "executor_id", "ticket"),
            sa.Column("died_at", UTC_DATETIME, nullable=False),
            sa.Column("slot_at", UTC_DATETIME, nullable=True),
            sa.Column("granted_at", UTC_DATETIME, nullable=True),
            sa.Column("paused", sa.Boolean(), nullable=False),
            sa.Column("held", sa.String(), nullable=False),
            sa.Column("candidate_id", sa.String(), nullable=True),
            sa.PrimaryKeyConstraint("org", "app", "executor_id"),
        ]),
    ]


def upgrade() -> None:
    existing = existing_tables()
    for table, items in _tables():
        if table not in existing:
            op.create_table(table, *items)


def downgrade() -> None:
    for table, _items in reversed(_tables()):
        op.drop_table(table)
