"""projection_dead_letter: events a projection's handler kept failing on

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Inserted in the transaction that moves a projection's offset past the event
(``retry-and-dead-letter``), deleted when ``projections dead-letters retry`` applies it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projection_dead_letter",
        sa.Column("projection_name", sa.String(length=255), nullable=False),
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("projection_key", sa.String(length=255), nullable=False),
        sa.Column("slice", sa.Integer(), nullable=False),
        sa.Column("db_timestamp", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("first_failure", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("last_failure", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("projection_name", "persistence_id", "seq_nr", name="projection_dead_letter_pkey"),
    )


def downgrade() -> None:
    op.drop_table("projection_dead_letter")
