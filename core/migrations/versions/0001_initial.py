"""The schema as ``SQLModel.metadata.create_all`` made it before migrations.

It creates only what is missing, so a database that ``create_all`` made (no ``alembic_version`` table, some or
all of these tables present, with their rows) is adopted as it is: nothing existing is altered or dropped.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from core.migrations import existing_tables

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)
# Frozen here rather than imported: later revisions may change workflows.contracts.common.ExecutorStatus.
EXECUTOR_STATUS = sa.Enum("HEALTHY", "DISCONNECTED", "DEAD", name="executorstatus")


def _tables() -> list[tuple[str, list[sa.Column[Any] | sa.Constraint], list[tuple[str, list[str], bool]]]]:
    """(table, columns and constraints, indexes as (name, columns, unique)), in dependency order (there are no
    foreign keys)."""
    return [
        ("apikey", [
            sa.Column("id", sa.String(), nullable=False),
            sa.Column("org", sa.String(), nullable=False),
            sa.Column("name", sa.String(), nullable=False),
            sa.Column("key_hash", sa.String(), nullable=False),
            sa.Column("apps", sa.JSON(), nullable=True),
            sa.Column("created_at", UTC_DATETIME, nullable=False),
            sa.Column("revoked_at", UTC_DATETIME, nullable=True),
            sa.PrimaryKeyConstraint("id"),
        ], [("ix_apikey_key_hash", ["key_hash"], True), ("ix_apikey_org", ["org"], False)]),
        ("application", [
            sa.Column("id", sa.String(), nullable=False),
            sa.Column("org", sa.String(), nullable=False),
            sa.Column("name", sa.String(), nullable=False),
            sa.Column("executor_timeout", sa.Interval(), nullable=False),
            sa.Column("gc_time_threshold", sa.Interval(), nullable=True),
            sa.Column("gc_rows_threshold", sa.Integer(), nullable=True),
            sa.Column("global_timeout", sa.Interval(), nullable=True),
            sa.Column("private_mode", sa.Boolean(), nullable=False),
            sa.Column("cross_version_recovery", sa.Boolean(), nullable=False),
            sa.Column("language", sa.String(), nullable=True),
            sa.Column("created_at", UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("id"),
            sa.UniqueConstraint("org", "name"),
        ], [("ix_application_org", ["org"], False)]),
        ("auditlog", [
            sa.Column("id", sa.String(), nullable=False),
            sa.Column("event_key", sa.String(), nullable=True),
            sa.Column("emit_time", UTC_DATETIME, nullable=False),
            sa.Column("org", sa.String(), nullable=False),
            sa.Column("app", sa.String(), nullable=True),
            sa.Column("executor_id", sa.String(), nullable=True),
            sa.Column("operation", sa.String(), nullable=False),
            sa.Column("status", sa.String(), nullable=False),
            sa.Column("subject", sa.String(), nullable=False),
            sa.Column("source_ip", sa.String(), nullable=False),
            sa.Column("details", sa.JSON(), nullable=True),
            sa.PrimaryKeyConstraint("id"),
            sa.UniqueConstraint("event_key"),
        ], [("ix_auditlog_emit_time", ["emit_time"], False), ("ix_auditlog_operation", ["operation"], False),
            ("ix_auditlog_org", ["org"], False)]),
        ("executor", [
            sa.Column("org", sa.String(), nullable=False),
            sa.Column("app", sa.String(), nullable=False),
            sa.Column("executor_id", sa.String(), nullable=False),
            sa.Column("app_version", sa.String(), nullable=False),
            sa.Column("status", EXECUTOR_STATUS, nullable=False),
            sa.Column("hostname", sa.String(), nullable=True),
            sa.Column("language", sa.String(), nullable=True),
            sa.Column("dbos_version", sa.String(), nullable=True),
            sa.Column("executor_metadata", sa.JSON(), nullable=True),
            sa.Column("gateway_queue", sa.String(), nullable=True),
            sa.Column("connection_id", sa.String(), nullable=True),
            sa.Column("created_at", UTC_DATETIME, nullable=False),
            sa.Column("updated_at", UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("org", "app", "executor_id"),
        ], []),
        ("recoveryclaim", [
            sa.Column("org", sa.String(), nullable=False),
            sa.Column("app", sa.String(), nullable=False),
            sa.Column("dead_executor_id", sa.String(), nullable=False),
            sa.Column("candidate_id", sa.String(), nullable=False),
            sa.Column("claimed_at", UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("org", "app", "dead_executor_id"),
        ], [("ix_recoveryclaim_candidate_id", ["candidate_id"], False)]),
        ("retentionstate", [
            sa.Column("org", sa.String(), nullable=False),
            sa.Column("app", sa.String(), nullable=False),
            sa.Column("last_started_at", UTC_DATETIME, nullable=False),
            sa.Column("executor_id", sa.String(), nullable=True),
            sa.Column("request_id", sa.String(), nullable=True),
            sa.PrimaryKeyConstraint("org", "app"),
        ], []),
    ]


def upgrade() -> None:
    existing = existing_tables()
    for table, items, indexes in _tables():
        if table not in existing:
            op.create_table(table, *items)
            present: set[str | None] = set()
        else:  # made by create_all; it created a table's indexes with the table, but be sure
            present = {index["name"] for index in sa.inspect(op.get_bind()).get_indexes(table)}
        for name, columns, unique in indexes:
            if name not in present:
                op.create_index(name, table, columns, unique=unique)


def downgrade() -> None:
    for table, _items, _indexes in reversed(_tables()):
        op.drop_table(table)
    EXECUTOR_STATUS.drop(op.get_bind(), checkfirst=True)
