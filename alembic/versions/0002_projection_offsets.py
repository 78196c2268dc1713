"""projection offset store, management, slice leases and workers

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = postgresql.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "projection_timestamp_offset_store",
        sa.Column("projection_name", sa.String(length=255), nullable=False),
        sa.Column("projection_key", sa.String(length=255), nullable=False),
        sa.Column("slice", sa.Integer(), nullable=False),
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("timestamp_offset", TS, nullable=False),
        sa.Column("timestamp_consumed", TS, nullable=False),
        sa.PrimaryKeyConstraint(
            "slice",
            "projection_name",
            "timestamp_offset",
            "persistence_id",
            "seq_nr",
            name="projection_timestamp_offset_store_pkey",
        ),
    )
    op.create_table(
        "projection_management",
        sa.Column("projection_name", sa.String(length=255), nullable=False),
        sa.Column("projection_key", sa.String(length=255), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("last_updated", TS, nullable=False),
        sa.PrimaryKeyConstraint("projection_name", "projection_key", name="projection_management_pkey"),
    )
    op.create_table(
        "projection_slice_lease",
        sa.Column("projection_name", sa.String(length=255), nullable=False),
        sa.Column("slice", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("projection_name", "slice", name="projection_slice_lease_pkey"),
    )
    op.create_table(
        "projection_worker",
        sa.Column("projection_name", sa.String(length=255), nullable=False),
        sa.Column("worker_id", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("projection_name", "worker_id", name="projection_worker_pkey"),
    )


def downgrade() -> None:
    op.drop_table("projection_worker")
    op.drop_table("projection_slice_lease")
    op.drop_table("projection_management")
    op.drop_table("projection_timestamp_offset_store")
