"""tag_views, tag_write_progress, tag_scanning, tag_view_settings (events by tag)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tag_views",
        sa.Column("tag_name", sa.String(length=255), nullable=False),
        sa.Column("timebucket", sa.BigInteger(), nullable=False),
        sa.Column("timestamp", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("uuid_time", sa.BigInteger(), nullable=False),
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("tag_pid_sequence_nr", sa.BigInteger(), nullable=False),
        sa.Column("sequence_nr", sa.BigInteger(), nullable=False),
        sa.Column("writer_uuid", sa.String(length=255), nullable=False),
        sa.Column("ser_id", sa.Integer(), nullable=False),
        sa.Column("ser_manifest", sa.String(length=255), nullable=False),
        sa.Column("event_manifest", sa.String(length=255), nullable=True),
        sa.Column("event", sa.LargeBinary(), nullable=False),
        sa.Column("meta_ser_id", sa.Integer(), nullable=True),
        sa.Column("meta_ser_manifest", sa.String(length=255), nullable=True),
        sa.Column("meta", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint(
            "tag_name",
            "timebucket",
            "uuid_time",
            "timestamp",
            "persistence_id",
            "tag_pid_sequence_nr",
            name="tag_views_pkey",
        ),
    )
    op.create_index(
        "tag_views_pid_idx", "tag_views", ["tag_name", "persistence_id", "tag_pid_sequence_nr"], unique=True
    )
    op.create_table(
        "tag_write_progress",
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("tag", sa.String(length=255), nullable=False),
        sa.Column("sequence_nr", sa.BigInteger(), nullable=False),
        sa.Column("tag_pid_sequence_nr", sa.BigInteger(), nullable=False),
        sa.Column("offset", postgresql.UUID(as_uuid=True), nullable=False),
        sa.PrimaryKeyConstraint("persistence_id", "tag", name="tag_write_progress_pkey"),
    )
    op.create_table(
        "tag_scanning",
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("sequence_nr", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("persistence_id", name="tag_scanning_pkey"),
    )
    op.create_table(
        "tag_view_settings",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="tag_view_settings_pkey"),
    )


def downgrade() -> None:
    op.drop_table("tag_view_settings")
    op.drop_table("tag_scanning")
    op.drop_table("tag_write_progress")
    op.drop_index("tag_views_pid_idx", table_name="tag_views")
    op.drop_table("tag_views")
