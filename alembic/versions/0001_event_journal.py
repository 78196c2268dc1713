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


def _existing_tables() -> tuple[set[str] | None, set[str] | None]:
    """Index names of event_journal and column names of snapshot when those tables exist already
    (a database created from Akka Persistence R2DBC's own DDL), else None. Offline (SQL for a
    DBA) there is nothing to inspect: the script creates the tables."""
    if op.get_context().as_sql:
        return None, None
    inspector = sa.inspect(op.get_bind())
    journal = snapshot = None
    if inspector.has_table("event_journal"):
        journal = {i["name"] for i in inspector.get_indexes("event_journal")}
    if inspector.has_table("snapshot"):
        snapshot = {c["name"] for c in inspector.get_columns("snapshot")}
    return journal, snapshot


def upgrade() -> None:
    journal, snapshot = _existing_tables()
    if journal is None:
        _create_event_journal()
    elif "event_journal_slice_idx" not in journal:  # the plugin's DDL calls it optional
        op.create_index("event_journal_slice_idx", "event_journal", ["slice", "entity_type", "db_timestamp", "seq_nr"])
    if snapshot is None:
        _create_snapshot()
        return
    # the plugin's 1.1.x snapshot table: same columns but these two
    if "db_timestamp" not in snapshot:
        op.add_column("snapshot", sa.Column("db_timestamp", postgresql.TIMESTAMP(timezone=True), nullable=True))
    if "tags" not in snapshot:
        op.add_column("snapshot", sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=True))
    if "snapshot_slice_idx" not in {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("snapshot")}:
        op.create_index("snapshot_slice_idx", "snapshot", ["slice", "entity_type", "db_timestamp"])


def _create_event_journal() -> None:
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


def _create_snapshot() -> None:
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
