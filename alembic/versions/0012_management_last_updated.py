"""projection_management.last_updated: BIGINT (epoch milliseconds), as in Akka Projection's DDL

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27

Akka Projection R2DBC's management table (``akka_projection_management``, named
``projection_management`` here and in a JVM service configured to share it) stores
``last_updated`` as ``BIGINT`` epoch milliseconds; this library had ``timestamptz``, so a JVM
projection's pause or resume through its management API could not write the row. The values
are converted (and back on downgrade); a table already ``BIGINT`` (created by Akka's DDL) is left.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _is_bigint() -> bool:
    if op.get_context().as_sql:  # offline, for a DBA: the script converts
        return False
    columns = {c["name"]: c["type"] for c in sa.inspect(op.get_bind()).get_columns("projection_management")}
    return isinstance(columns["last_updated"], sa.BigInteger)


def upgrade() -> None:
    if _is_bigint():
        return
    op.alter_column(
        "projection_management",
        "last_updated",
        type_=sa.BigInteger(),
        postgresql_using="(extract(epoch FROM last_updated) * 1000)::bigint",
        existing_nullable=False,
    )


def downgrade() -> None:
    op.alter_column(
        "projection_management",
        "last_updated",
        type_=sa.TIMESTAMP(timezone=True),
        postgresql_using="to_timestamp(last_updated / 1000.0)",
        existing_nullable=False,
    )
