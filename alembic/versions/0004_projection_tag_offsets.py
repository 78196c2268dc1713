"""projection_tag_offset_store (projections over a tag)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projection_tag_offset_store",
        sa.Column("projection_name", sa.String(length=255), nullable=False),
        sa.Column("tag", sa.String(length=255), nullable=False),
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("tag_offset", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("offset_time", sa.BigInteger(), nullable=False),
        sa.Column("timestamp_consumed", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("projection_name", "tag", "persistence_id", name="projection_tag_offset_store_pkey"),
    )


def downgrade() -> None:
    op.drop_table("projection_tag_offset_store")
