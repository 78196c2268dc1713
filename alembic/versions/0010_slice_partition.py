"""slice_partition, slice_move and the owner check: a journal over several databases

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

``slice_partition`` is this database's part of the partition map (no row: it serves every
slice, as before); ``slice_move`` the state of a move of a range out of it. The function
``slice_journal_check`` is what every insert reads its clock from (see
``journal.postgres.timestamp_rule``): it refuses slices this database does not serve.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

from journal.postgres.timestamp_rule import check_function_sql, drop_check_function_sql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _schema() -> str:
    schema: str = context.config.attributes["resolved_schema"]
    return schema


def upgrade() -> None:
    op.create_table(
        "slice_partition",
        sa.Column("min_slice", sa.Integer(), nullable=False),
        sa.Column("max_slice", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("location", sa.Text(), nullable=True),
        sa.Column("floor", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column("updated_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("min_slice", name="slice_partition_pkey"),
    )
    op.create_table(
        "slice_move",
        sa.Column("min_slice", sa.Integer(), nullable=False),
        sa.Column("max_slice", sa.Integer(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.String(length=16), nullable=False),
        sa.Column("copied_to", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column("copied_seen", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("started_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("updated_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("min_slice", name="slice_move_pkey"),
    )
    op.execute(check_function_sql(_schema()))


def downgrade() -> None:
    op.execute(drop_check_function_sql(_schema()))
    op.drop_table("slice_move")
    op.drop_table("slice_partition")
