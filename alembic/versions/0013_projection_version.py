"""projection_version: the versions of a projection's read model, and which one readers see

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27

A projection run with ``--version N`` keeps its offsets under ``NAME@N`` and its tables in a
schema of its own; ``projections switch NAME N`` points the readers' views at that schema and
marks the row ``serving`` in one transaction (docs/projections.md, "Rebuild a read model
without downtime").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projection_version",
        sa.Column("projection_name", sa.String(length=255), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("entity_type", sa.String(length=255), nullable=False),
        sa.Column("tables_schema", sa.String(length=63), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("switched_at", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("projection_name", "version", name="projection_version_pkey"),
    )


def downgrade() -> None:
    op.drop_table("projection_version")
