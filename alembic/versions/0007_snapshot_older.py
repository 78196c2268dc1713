"""snapshot_older: the older snapshots of a pid, when more than one is kept

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23

``snapshot`` keeps one row per pid (the newest, as the reference DDL), so a JVM service sharing
the tables sees no change; ``entities.snapshots_per_emitter_max`` > 1 keeps the older ones here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshot_older",
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
        sa.PrimaryKeyConstraint("persistence_id", "seq_nr", name="snapshot_older_pkey"),
    )


def downgrade() -> None:
    op.drop_table("snapshot_older")
