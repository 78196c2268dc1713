"""event_journal and snapshot tables (column-compatible with the reference DDL)

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _adopt_plugin_tables() -> bool:
    """A database created from Akka Persistence R2DBC's own DDL already has these tables: keep
    them (same columns), and add what that DDL's older snapshot table lacks. True when adopted.
    Offline (SQL for a DBA) there is nothing to inspect: the script creates the tables."""
    if op.get_context().as_sql:
        return False
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table("event_journal"):
        return False
    have = {c["name"] for c in inspector.get_columns("snapshot")} if inspector.has_table("snapshot") else set()
    if have:
        if "db_timestamp" not in have:
            op.add_column("snapshot", sa.Column("db_timestamp", postgresql.TIMESTAMP(timezone=True), nullable=True))
        if "tags" not in have:
            op.add_column("snapshot", sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=True))
        if "snapshot_slice_idx" not in {i["name"] for i in inspector.get_indexes("snapshot")}:
            op.create_index("snapshot_slice_idx", "snapshot", ["slice", "entity_type", "db_timestamp"])
    return bool(have)


def upgrade() -> None:
    if _adopt_plugin_tables():
        return
    op.create_table(
        "event_journal",
        sa.Column("slice", sa.Integer(), nullable=False),
        sa.Column("entity_type", sa.String(length=255), nullable=False),
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("db_timestamp", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("event_ser_id", sa.Integer(), nullable=False),
        sa.Column("event_ser_manifest", sa.String(length=255), nullable=False),
        sa.Column("event_payload", sa.LargeBinary(), nullable=False),
        sa.Column("deleted", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("writer", sa.String(length=255), nullable=False),
        sa.Column("adapter_manifest", sa.String(length=255), nullable=True),
        sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("meta_ser_id", sa.Integer(), nullable=True),
        sa.Column("meta_ser_manifest", sa.String(length=255), nullable=True),
        sa.Column("meta_payload", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("persistence_id", "seq_nr", name="event_journal_pkey"),
    )
    op.create_index(
        "event_journal_slice_idx",
        "event_journal",
        ["slice", "entity_type", "db_timestamp", "seq_nr"],
    )
    op.create_table(
        "snapshot",
        sa.Column("slice", sa.Integer(), nullable=False),
        sa.Column("entity_type", sa.String(length=255), nullable=False),
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("db_timestamp", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column("write_timestamp", sa.BigInteger(), nullable=False),
        sa.Column("ser_id", sa.Integer(), nullable=False),
        sa.Column("ser_manifest", sa.String(length=255), nullable=False),
        sa.Column("snapshot", sa.LargeBinary(), nullable=False),
        sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("meta_ser_id", sa.Integer(), nullable=True),
        sa.Column("meta_ser_manifest", sa.String(length=255), nullable=True),
        sa.Column("meta_payload", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("persistence_id", name="snapshot_pkey"),
    )
    op.create_index("snapshot_slice_idx", "snapshot", ["slice", "entity_type", "db_timestamp"])


def downgrade() -> None:
    op.drop_index("snapshot_slice_idx", table_name="snapshot")
    op.drop_table("snapshot")
    op.drop_index("event_journal_slice_idx", table_name="event_journal")
    op.drop_table("event_journal")
