"""Operators' request claims get a table of their own: ``managementclaim`` (``core.store.claims``). Until now they
were recovery claims (``recoveryclaim``) whose ``dead_executor_id`` was ``management:<request id>``; those rows move
to the new table and leave the old one.

Like 0001 it creates only what is missing: a database that ``create_all`` made with the current models already has
this table, and is adopted as it is (any old-style claim in it still moves).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from core.migrations import existing_tables

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)
TABLE = "managementclaim"
# What marked an operator's request claim in ``recoveryclaim``; plain SQL below (substr, ||, LIKE) reads the same
# on SQLite and PostgreSQL, and offline (``relay migrate --sql``). The prefix has no LIKE wildcard in it.
PREFIX = "management:"


def upgrade() -> None:
    if TABLE not in existing_tables():
        op.create_table(
            TABLE,
            sa.Column("org", sa.String(), nullable=False),
            sa.Column("app", sa.String(), nullable=False),
            sa.Column("request_id", sa.String(), nullable=False),
            sa.Column("candidate_id", sa.String(), nullable=False),
            sa.Column("claimed_at", UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("org", "app", "request_id"),
        )
    op.execute(f"INSERT INTO {TABLE} (org, app, request_id, candidate_id, claimed_at) "
               f"SELECT org, app, substr(dead_executor_id, {len(PREFIX) + 1}), candidate_id, claimed_at "
               f"FROM recoveryclaim WHERE dead_executor_id LIKE '{PREFIX}%'")
    op.execute(f"DELETE FROM recoveryclaim WHERE dead_executor_id LIKE '{PREFIX}%'")


def downgrade() -> None:
    op.execute("INSERT INTO recoveryclaim (org, app, dead_executor_id, candidate_id, claimed_at) "
               f"SELECT org, app, '{PREFIX}' || request_id, candidate_id, claimed_at FROM {TABLE}")
    op.drop_table(TABLE)
