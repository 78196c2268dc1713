"""projection_parked_event: events held behind a dead letter of their persistence id

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27

Under ``retry-and-dead-letter-sequenced`` every later event of a dead letter's persistence id is
inserted here, in the offset transaction that moves past it, and applied in seq_nr order (and
deleted) when the dead letter is retried or discarded (docs/handler-failures.md). A row names
the event; its payload stays in the journal.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projection_parked_event",
        sa.Column("projection_name", sa.String(length=255), nullable=False),
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("seq_nr", sa.BigInteger(), nullable=False),
        sa.Column("projection_key", sa.String(length=255), nullable=False),
        sa.Column("slice", sa.Integer(), nullable=False),
        sa.Column("db_timestamp", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("parked_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("projection_name", "persistence_id", "seq_nr", name="projection_parked_event_pkey"),
    )


def downgrade() -> None:
    op.drop_table("projection_parked_event")
