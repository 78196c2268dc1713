"""The PostgreSQL schema, declared once as SQLAlchemy Core MetaData.

Column-compatible with the reference DDL (names and types), so a JVM service using Akka
Persistence R2DBC and a Python service can share the tables. Alembic migrates it; a test
checks that the Alembic head matches this MetaData. Tables are declared without a schema:
the configured schema is applied through the connection's ``search_path``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    false,
)
from sqlalchemy.dialects.postgresql import ARRAY, TIMESTAMP

metadata = MetaData()

VERSION_TABLE = "slice_journal_alembic_version"
"""Alembic's version table for this library's migrations (distinct from an application's)."""

event_journal = Table(
    "event_journal",
    metadata,
    Column("slice", Integer, nullable=False),
    Column("entity_type", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("db_timestamp", TIMESTAMP(timezone=True), nullable=False),
    Column("event_ser_id", Integer, nullable=False),
    Column("event_ser_manifest", String(255), nullable=False),
    Column("event_payload", LargeBinary, nullable=False),
    Column("deleted", Boolean, nullable=False, server_default=false()),
    Column("writer", String(255), nullable=False),
    Column("adapter_manifest", String(255)),
    Column("tags", ARRAY(Text)),
    Column("meta_ser_id", Integer),
    Column("meta_ser_manifest", String(255)),
    Column("meta_payload", LargeBinary),
    PrimaryKeyConstraint("persistence_id", "seq_nr", name="event_journal_pkey"),
    Index("event_journal_slice_idx", "slice", "entity_type", "db_timestamp", "seq_nr"),
)

snapshot = Table(
    "snapshot",
    metadata,
    Column("slice", Integer, nullable=False),
    Column("entity_type", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("db_timestamp", TIMESTAMP(timezone=True)),
    Column("write_timestamp", BigInteger, nullable=False),
    Column("ser_id", Integer, nullable=False),
    Column("ser_manifest", String(255), nullable=False),
    Column("snapshot", LargeBinary, nullable=False),
    Column("tags", ARRAY(Text)),
    Column("meta_ser_id", Integer),
    Column("meta_ser_manifest", String(255)),
    Column("meta_payload", LargeBinary),
    PrimaryKeyConstraint("persistence_id", name="snapshot_pkey"),
    Index("snapshot_slice_idx", "slice", "entity_type", "db_timestamp"),
)
