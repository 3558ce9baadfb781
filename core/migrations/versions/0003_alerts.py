"""Alerting rules and the alerts round's audit watermark: ``alertingrule`` and ``alertwatermark``.

Like 0001 it creates only what is missing: a database that ``create_all`` made with the current models already has
these tables, and is adopted as it is.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from core.migrations import existing_tables

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)


def _tables() -> list[tuple[str, list[sa.Column[Any] | sa.Constraint], list[tuple[str, list[str]]]]]:
    """(table, columns and constraints, indexes as (name, columns))."""
    return [
        ("alertingrule", [
            sa.Column("id", sa.String(), nullable=False),
            sa.Column("org", sa.String(), nullable=False),
            sa.Column("app", sa.String(), nullable=False),
            sa.Column("app_id", sa.String(), nullable=False),
            sa.Column("receiving_app", sa.String(), nullable=False),
            sa.Column("receiving_app_id", sa.String(), nullable=False),
            sa.Column("rule_type", sa.String(), nullable=False),
            sa.Column("rule_metadata", sa.JSON(), nullable=True),
            sa.Column("min_interval", sa.Interval(), nullable=True),
            sa.Column("last_fired_at", UTC_DATETIME, nullable=True),
            sa.Column("checked_until", UTC_DATETIME, nullable=True),
            sa.Column("condition_since", UTC_DATETIME, nullable=True),
            sa.Column("suppressed", sa.Integer(), nullable=False),
            sa.Column("created_at", UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("id"),
        ], [("ix_alertingrule_org", ["org"]), ("ix_alertingrule_app_id", ["app_id"])]),
        ("alertwatermark", [
            sa.Column("name", sa.String(), nullable=False),
            sa.Column("until", UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("name"),
        ], []),
    ]


def upgrade() -> None:
    existing = existing_tables()
    for table, items, indexes in _tables():
        if table not in existing:
            op.create_table(table, *items)
            for name, columns in indexes:
                op.create_index(name, table, columns, unique=False)


def downgrade() -> None:
    for table, _items, _indexes in reversed(_tables()):
        op.drop_table(table)
