"""encryption_key: data keys of encrypted payloads, one per subject

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Forgetting a subject sets ``data_key`` NULL (crypto-shredding); the row stays so the key is
never made again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "encryption_key",
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("data_key", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("forgotten_at", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("subject", name="encryption_key_pkey"),
    )


def downgrade() -> None:
    op.drop_table("encryption_key")
