"""durable_state: the state store's table (column-compatible with Akka Persistence R2DBC)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27

The plugin's PostgreSQL DDL (``ddl-scripts/create_tables_postgres.sql``): one row per
persistence id. A table created from the plugin's older DDL (1.1.x: the key was
``(persistence_id, revision)``, dropped in the plugin's PR #559) gets the plugin's own migration:
the key becomes ``persistence_id`` alone, which the upsert's revision check needs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

INDEX_COLUMNS = ["slice", "entity_type", "db_timestamp", "revision"]


def _existing() -> tuple[list[str], set[str]] | None:
    """The key columns and index names of a durable_state created by the plugin's DDL, or None
    (offline, for a DBA, there is nothing to inspect: the script creates the table)."""
    if op.get_context().as_sql:
        return None
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table("durable_state"):
        return None
    key = inspector.get_pk_constraint("durable_state")
    return list(key["constrained_columns"]), {i["name"] for i in inspector.get_indexes("durable_state")}


def upgrade() -> None:
    existing = _existing()
    if existing is None:
        _create()
        return
    key, indexes = existing
    if key != ["persistence_id"]:
        op.execute("ALTER TABLE durable_state DROP CONSTRAINT IF EXISTS durable_state_pkey")
        op.create_primary_key("durable_state_pkey", "durable_state", ["persistence_id"])
    if "durable_state_slice_idx" not in indexes:
        op.create_index("durable_state_slice_idx", "durable_state", INDEX_COLUMNS)


def _create() -> None:
    op.create_table(
        "durable_state",
        sa.Column("slice", sa.Integer(), nullable=False),
        sa.Column("entity_type", sa.String(length=255), nullable=False),
        sa.Column("persistence_id", sa.String(length=255), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("db_timestamp", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("state_ser_id", sa.Integer(), nullable=False),
        sa.Column("state_ser_manifest", sa.String(length=255), nullable=True),
        sa.Column("state_payload", sa.LargeBinary(), nullable=False),
        sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.PrimaryKeyConstraint("persistence_id", name="durable_state_pkey"),
    )
    op.create_index("durable_state_slice_idx", "durable_state", INDEX_COLUMNS)


def downgrade() -> None:
    op.drop_index("durable_state_slice_idx", table_name="durable_state")
    op.drop_table("durable_state")
