"""The PostgreSQL schema, declared once as SQLAlchemy Core MetaData.

Column-compatible with the reference DDL (names and types), so a JVM service using Akka
Persistence R2DBC and a Python service can share the tables. Alembic migrates it; a test
checks that the Alembic head matches this MetaData. Tables are declared without a schema:
the configured schema is applied through the connection's ``search_path``.
"""

from __future__ import annotations

from typing import Any

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
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, UUID

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
    # replication (issue 14): NULL until the location's endpoint stamps a local event; set in the
    # same transaction for a replicated one. See journal/replication and docs/replication.md.
    Column("origin_location", String(255)),
    Column("origin_seq_nr", BigInteger),
    Column("vector_time", JSONB),
    Column("log_seq_nr", BigInteger),
    PrimaryKeyConstraint("persistence_id", "seq_nr", name="event_journal_pkey"),
    Index("event_journal_slice_idx", "slice", "entity_type", "db_timestamp", "seq_nr"),
    # partial (migration 0006): rows that are not in a replicated log cost these indexes nothing
    Index("event_journal_log_idx", "entity_type", "log_seq_nr", postgresql_where=text("log_seq_nr IS NOT NULL")),
    Index(
        "event_journal_origin_idx",
        "entity_type",
        "origin_location",
        "origin_seq_nr",
        unique=True,
        postgresql_where=text("origin_location IS NOT NULL"),
    ),
)


def _snapshot_columns() -> list[Column[Any]]:
    """The columns of a snapshot row (reference DDL), in ``snapshot`` and ``snapshot_older`` alike."""
    return [
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
    ]


snapshot = Table(
    "snapshot",
    metadata,
    *_snapshot_columns(),
    PrimaryKeyConstraint("persistence_id", name="snapshot_pkey"),
    Index("snapshot_slice_idx", "slice", "entity_type", "db_timestamp"),
)

# Older snapshots of a pid (entities.snapshots_per_emitter_max > 1); ``snapshot`` keeps the newest
# (one row per pid, as the reference DDL), so a JVM service sharing the tables sees no change.
snapshot_older = Table(
    "snapshot_older",
    metadata,
    *_snapshot_columns(),
    PrimaryKeyConstraint("persistence_id", "seq_nr", name="snapshot_older_pkey"),
)

# -- events by tag (issue 7) ------------------------------------------------------------------
# The reference's Cassandra tag tables, plus ``uuid_time``: PostgreSQL compares uuids bytewise,
# not by time, so rows are ordered by (uuid_time, timestamp). Tag rows of the journal's own
# writes are inserted by the events statement itself (same transaction).

tag_views = Table(
    "tag_views",
    metadata,
    Column("tag_name", String(255), nullable=False),
    Column("timebucket", BigInteger, nullable=False),
    Column("timestamp", UUID(as_uuid=True), nullable=False),
    Column("uuid_time", BigInteger, nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("tag_pid_sequence_nr", BigInteger, nullable=False),
    Column("sequence_nr", BigInteger, nullable=False),
    Column("writer_uuid", String(255), nullable=False),
    Column("ser_id", Integer, nullable=False),
    Column("ser_manifest", String(255), nullable=False),
    Column("event_manifest", String(255)),
    Column("event", LargeBinary, nullable=False),
    Column("meta_ser_id", Integer),
    Column("meta_ser_manifest", String(255)),
    Column("meta", LargeBinary),
    PrimaryKeyConstraint(
        "tag_name",
        "timebucket",
        "uuid_time",
        "timestamp",
        "persistence_id",
        "tag_pid_sequence_nr",
        name="tag_views_pkey",
    ),
    Index("tag_views_pid_idx", "tag_name", "persistence_id", "tag_pid_sequence_nr", unique=True),
)

tag_write_progress = Table(
    "tag_write_progress",
    metadata,
    Column("persistence_id", String(255), nullable=False),
    Column("tag", String(255), nullable=False),
    Column("sequence_nr", BigInteger, nullable=False),
    Column("tag_pid_sequence_nr", BigInteger, nullable=False),
    Column("offset", UUID(as_uuid=True), nullable=False),
    PrimaryKeyConstraint("persistence_id", "tag", name="tag_write_progress_pkey"),
)

tag_scanning = Table(
    "tag_scanning",
    metadata,
    Column("persistence_id", String(255), nullable=False),
    Column("sequence_nr", BigInteger, nullable=False),
    PrimaryKeyConstraint("persistence_id", name="tag_scanning_pkey"),
)

tag_view_settings = Table(
    "tag_view_settings",
    metadata,
    Column("name", String(64), nullable=False),
    Column("value", Text, nullable=False),
    PrimaryKeyConstraint("name", name="tag_view_settings_pkey"),
)
# -- projections (issue 4) ---------------------------------------------------------------------

projection_timestamp_offset_store = Table(
    "projection_timestamp_offset_store",
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("projection_key", String(255), nullable=False),
    Column("slice", Integer, nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("timestamp_offset", TIMESTAMP(timezone=True), nullable=False),
    Column("timestamp_consumed", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint(
        "slice",
        "projection_name",
        "timestamp_offset",
        "persistence_id",
        "seq_nr",
        name="projection_timestamp_offset_store_pkey",
    ),
)
"""Insert-only offset rows (reference columns). A row with persistence_id '' and seq_nr 0 is a
heartbeat row: every event of the slice before its timestamp_offset was processed."""

projection_management = Table(
    "projection_management",
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("projection_key", String(255), nullable=False),
    Column("paused", Boolean, nullable=False),
    Column("last_updated", BigInteger, nullable=False),
    PrimaryKeyConstraint("projection_name", "projection_key", name="projection_management_pkey"),
)
"""Pause flag per projection and slice-range key (reference columns; ``last_updated`` in epoch
milliseconds, as Akka Projection's DDL, since migration 0012)."""

projection_version = Table(
    "projection_version",
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("version", Integer, nullable=False),
    Column("entity_type", String(255), nullable=False),
    Column("tables_schema", String(63), nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at", TIMESTAMP(timezone=True), nullable=False),
    Column("switched_at", TIMESTAMP(timezone=True)),
    PrimaryKeyConstraint("projection_name", "version", name="projection_version_pkey"),
)
"""Versions of a projection's read model (migration 0013): version N keeps its offsets and leases
under ``NAME@N`` and its tables in the schema ``tables_schema``; ``state`` is ``building``,
``serving`` (the one the readers' views show; at most one per name) or ``retired`` (replaced by a
switch: its workers stop). See projections.versions."""

projection_slice_lease = Table(
    "projection_slice_lease",
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("slice", Integer, nullable=False),
    Column("owner", String(255)),
    Column("epoch", BigInteger, nullable=False),
    Column("expires_at", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("projection_name", "slice", name="projection_slice_lease_pkey"),
)
"""One row per (projection, slice): who owns it and until when. ``epoch`` grows with every
acquisition; offset transactions lock the rows they touch (FOR SHARE) and check owner and epoch,
so a worker that lost a slice can never commit for it."""

projection_worker = Table(
    "projection_worker",
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("worker_id", String(255), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", TIMESTAMP(timezone=True), nullable=False),
    Column("expires_at", TIMESTAMP(timezone=True), nullable=False),
    Column("state", String(32), nullable=False),
    Column("events", BigInteger, nullable=False),
    Column("error", Text),
    PrimaryKeyConstraint("projection_name", "worker_id", name="projection_worker_pkey"),
)
"""Live workers (membership for rebalancing) and their last state and error (for status)."""

projection_tag_offset_store = Table(
    "projection_tag_offset_store",
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("tag", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("tag_offset", UUID(as_uuid=True), nullable=False),
    Column("offset_time", BigInteger, nullable=False),
    Column("timestamp_consumed", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("projection_name", "tag", "persistence_id", name="projection_tag_offset_store_pkey"),
)
"""Offsets of projections over a tag (issue 7): per pid its latest processed seq_nr and TimeUUID
offset. The query resumes after the greatest offset (``offset_time``, then the uuid bytes: the
order of tag_views); ``seq_nr`` drops what a re-read delivers twice."""

projection_dead_letter = Table(
    "projection_dead_letter",
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("projection_key", String(255), nullable=False),
    Column("slice", Integer, nullable=False),
    Column("db_timestamp", TIMESTAMP(timezone=True), nullable=False),
    Column("error", Text, nullable=False),
    Column("traceback", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("first_failure", TIMESTAMP(timezone=True), nullable=False),
    Column("last_failure", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("projection_name", "persistence_id", "seq_nr", name="projection_dead_letter_pkey"),
)
"""Events a projection's handler kept failing on (``retry-and-dead-letter``): inserted in the
transaction that moves the offset past the event, deleted in the transaction that applies it on
``projections dead-letters retry`` (issue 26). The event itself stays in the journal."""

projection_parked_event = Table(
    "projection_parked_event",
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("projection_key", String(255), nullable=False),
    Column("slice", Integer, nullable=False),
    Column("db_timestamp", TIMESTAMP(timezone=True), nullable=False),
    Column("parked_at", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("projection_name", "persistence_id", "seq_nr", name="projection_parked_event_pkey"),
)
"""Events held behind a dead letter of their persistence id (``retry-and-dead-letter-sequenced``,
issue 36): inserted in the offset transaction that moves past the event, applied in seq_nr order
and deleted when the dead letter ahead is retried or discarded. The event stays in the journal."""

encryption_key = Table(
    "encryption_key",
    metadata,
    Column("subject", String(255), nullable=False),
    Column("data_key", LargeBinary),
    Column("created_at", TIMESTAMP(timezone=True), nullable=False),
    Column("forgotten_at", TIMESTAMP(timezone=True)),
    PrimaryKeyConstraint("subject", name="encryption_key_pkey"),
)
"""Data keys of encrypted payloads, one per subject (issue 26). Forgetting a subject sets
``data_key`` NULL and ``forgotten_at``: the row stays, so the key is never made again, and every
payload encrypted with it is unreadable for good (crypto-shredding)."""

# -- replication (issue 14) ---------------------------------------------------------------------

replication_log = Table(
    "replication_log",
    metadata,
    Column("log_name", String(255), nullable=False),
    Column("location", String(255), nullable=False),
    Column("log_seq_nr", BigInteger, nullable=False),
    Column("version_vector", JSONB, nullable=False),
    Column("recovering", Boolean, nullable=False, server_default=false()),
    PrimaryKeyConstraint("log_name", name="replication_log_pkey"),
)
"""One row per replicated log at this location: the last log position handed out and the log's
version vector. Every stamping and replicated write locks this row until it commits, so log
positions commit in order (a reader paging "after position N" never skips one). ``recovering``
is set while a disaster recovery runs: replicated entities refuse local writes meanwhile."""

replication_progress = Table(
    "replication_progress",
    metadata,
    Column("log_name", String(255), nullable=False),
    Column("source_location", String(255), nullable=False),
    Column("source_log_seq_nr", BigInteger, nullable=False),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("log_name", "source_location", name="replication_progress_pkey"),
)
"""How far this location has read each source's log, written in the transaction of the events."""

replication_target_progress = Table(
    "replication_target_progress",
    metadata,
    Column("log_name", String(255), nullable=False),
    Column("target_location", String(255), nullable=False),
    Column("log_seq_nr", BigInteger, nullable=False),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("log_name", "target_location", name="replication_target_progress_pkey"),
)
"""How far each target has stored this log, as its reads say (a read after N proves the target
committed everything up to N): what deferred physical deletion waits for."""

# -- data partitions (issue 25) -------------------------------------------------------------------

slice_partition = Table(
    "slice_partition",
    metadata,
    Column("min_slice", Integer, nullable=False),
    Column("max_slice", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("location", Text),
    Column("floor", TIMESTAMP(timezone=True)),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("min_slice", name="slice_partition_pkey"),
)
"""Which slice ranges this database serves, as its part of the partition map (docs/scaling-out.md).
No row: every slice (a database never partitioned). ``state``: owned, moving, fenced, moved,
incoming; ``epoch``: the map epoch of the range's last change; ``location``: where a moving or
moved range goes (an incoming one comes from), as a DSN without its password; ``floor``: no new
event of the range is stamped below it. Every write and slice read checks it in the database
(``journal.postgres.timestamp_rule.check_function_sql``)."""

slice_move = Table(
    "slice_move",
    metadata,
    Column("min_slice", Integer, nullable=False),
    Column("max_slice", Integer, nullable=False),
    Column("target", Text, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("step", String(16), nullable=False),
    Column("copied_to", TIMESTAMP(timezone=True)),
    Column("copied_seen", JSONB),
    Column("started_at", TIMESTAMP(timezone=True), nullable=False),
    Column("updated_at", TIMESTAMP(timezone=True), nullable=False),
    PrimaryKeyConstraint("min_slice", name="slice_move_pkey"),
)
"""The state of a move of a slice range out of this database (``journal partitions move``): its
target, the epoch it will switch to, the step it reached and how far the copy got (a slice
query offset). Present from the move's start until the source's rows are removed: a move
interrupted at any step is finished by running it again."""

# -- durable state (issue 34) ---------------------------------------------------------------------

durable_state = Table(
    "durable_state",
    metadata,
    Column("slice", Integer, nullable=False),
    Column("entity_type", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("db_timestamp", TIMESTAMP(timezone=True), nullable=False),
    Column("state_ser_id", Integer, nullable=False),
    Column("state_ser_manifest", String(255)),
    Column("state_payload", LargeBinary, nullable=False),
    Column("tags", ARRAY(Text)),
    PrimaryKeyConstraint("persistence_id", name="durable_state_pkey"),
    Index("durable_state_slice_idx", "slice", "entity_type", "db_timestamp", "revision"),
)
"""One row per persistence id of the durable state store (docs/durable-state.md), the columns of
Akka Persistence R2DBC's ``durable_state`` so a JVM service and this library share the rows. A
delete keeps the row as a tombstone (``state_ser_id`` 0, empty payload, the revision kept), as
the plugin does: a revision is never used twice. ``durable_state_slice_idx`` serves the changes
by slices (the plugin's 1.1 index; its newer DDL leaves ``revision`` out, a prefix of this one)."""
