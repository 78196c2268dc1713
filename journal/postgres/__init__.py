"""The PostgreSQL backend (asyncpg on every hot path; SQLAlchemy and Alembic for the schema).

Each module holds one concern (connections, writes, reads, slice reads, notifications, snapshots,
info, the tag, cleanup and replication stores, statements); ``backend.py`` puts them together.
SQL lives only here. The module map is in docs/architecture.md.

Code outside this package (the CLIs, projections, the backend chooser) imports only the names
below; the modules are the package's own (the ``postgres-surface`` import contract in
pyproject.toml keeps it so). The migrations are imported on first use: Alembic and SQLAlchemy
are about 0.2 s of imports that a journal which does not migrate never pays.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .backend import PostgresBackend
from .connections import connect
from .credentials import Passwords
from .dsn import asyncpg_dsn, redact, target_of, validate_dsn, without_password
from .embedded import start_embedded
from .errors import driver_error, is_transient, mapped_errors
from .key_store import PostgresKeyStore
from .leases import LeaseSql, PostgresSliceLeases
from .offset_store import HEARTBEAT_PID, LeaseFence, OffsetRow, OffsetSql
from .partitions import FENCED, INCOMING, MOVED, MOVING, OWNED, SERVING, MoveRecord, PartitionRow, PostgresPartitions
from .replication_part import LogPlaces, ReplicationPart
from .replication_store import PostgresReplicationStore, ReplicationLogs
from .schema_sql import SchemaSql
from .settling import settle
from .timestamp_rule import install as install_timestamp_rule
from .timestamp_rule import installed as timestamp_rule_installed
from .timestamp_rule import remove as remove_timestamp_rule

__all__ = [
    "FENCED",
    "HEARTBEAT_PID",
    "INCOMING",
    "MOVED",
    "MOVING",
    "OWNED",
    "SERVING",
    "LeaseFence",
    "LeaseSql",
    "LogPlaces",
    "MoveRecord",
    "OffsetRow",
    "OffsetSql",
    "PartitionRow",
    "Passwords",
    "PostgresBackend",
    "PostgresKeyStore",
    "PostgresPartitions",
    "PostgresReplicationStore",
    "PostgresSliceLeases",
    "ReplicationLogs",
    "ReplicationPart",
    "SchemaSql",
    "asyncpg_dsn",
    "connect",
    "driver_error",
    "install_timestamp_rule",
    "is_transient",
    "mapped_errors",
    "redact",
    "remove_timestamp_rule",
    "schema_migrations",
    "settle",
    "start_embedded",
    "target_of",
    "timestamp_rule_installed",
    "validate_dsn",
    "without_password",
]


def schema_migrations() -> ModuleType:
    """The migrations module (:mod:`journal.postgres.migrations`: upgrade, downgrade, revisions)."""
    return importlib.import_module(f"{__name__}.migrations")
