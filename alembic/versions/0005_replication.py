"""replication: origin, vector time and log position per event; log state and progress tables

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

The event_journal columns are nullable, so the reference DDL's inserts (a JVM service) keep
working: such rows are local events, stamped later by the location's replication endpoint.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("event_journal", sa.Column("origin_location", sa.String(length=255), nullable=True))
    op.add_column("event_journal", sa.Column("origin_seq_nr", sa.BigInteger(), nullable=True))
    op.add_column("event_journal", sa.Column("vector_time", postgresql.JSONB(), nullable=True))
    op.add_column("event_journal", sa.Column("log_seq_nr", sa.BigInteger(), nullable=True))
    op.create_index("event_journal_log_idx", "event_journal", ["entity_type", "log_seq_nr"])
    op.create_table(
        "replication_log",
        sa.Column("log_name", sa.String(length=255), nullable=False),
        sa.Column("location", sa.String(length=255), nullable=False),
        sa.Column("log_seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("version_vector", postgresql.JSONB(), nullable=False),
        sa.Column("recovering", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("log_name", name="replication_log_pkey"),
    )
    op.create_table(
        "replication_progress",
        sa.Column("log_name", sa.String(length=255), nullable=False),
        sa.Column("source_location", sa.String(length=255), nullable=False),
        sa.Column("source_log_seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("log_name", "source_location", name="replication_progress_pkey"),
    )
    op.create_table(
        "replication_target_progress",
        sa.Column("log_name", sa.String(length=255), nullable=False),
        sa.Column("target_location", sa.String(length=255), nullable=False),
        sa.Column("log_seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("log_name", "target_location", name="replication_target_progress_pkey"),
    )


def downgrade() -> None:
    op.drop_table("replication_target_progress")
    op.drop_table("replication_progress")
    op.drop_table("replication_log")
    op.drop_index("event_journal_log_idx", table_name="event_journal")
    op.drop_column("event_journal", "log_seq_nr")
    op.drop_column("event_journal", "vector_time")
    op.drop_column("event_journal", "origin_seq_nr")
    op.drop_column("event_journal", "origin_location")
