"""Every SQL statement of the Postgres journal, built once per schema.

Identifiers come from validated configuration and are quoted here; values are always
parameters. Nothing outside ``journal.postgres`` writes SQL for the journal tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..backend import SLICE_GROUP_SIZE, SLICE_ROW_COLUMNS
from .schema_sql import SchemaSql, Sql
from .timestamp_rule import delete_check_sql

EVENT_COLUMNS = ", ".join(SLICE_ROW_COLUMNS)
"""The event_journal columns every read selects, in the seam's row layout
(:func:`journal.backend.stored_event` decodes it)."""


def notify_groups(slices: Iterable[int], entity_types: Iterable[str]) -> list[str]:
    """The distinct NOTIFY payloads of a batch's rows, from each row's slice and entity type
    (formatted once per group, not once per row)."""
    groups = {(s // SLICE_GROUP_SIZE, t) for s, t in zip(slices, entity_types, strict=False)}
    return [f"{g}:{t}" for g, t in groups]


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a journal schema."""
    return f"slice_journal.{schema}"


_SNAP_COLS = (
    "slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, "
    "ser_manifest, snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload"
)


@dataclass(frozen=True)
class Statements(SchemaSql):
    @property
    def channel(self) -> str:
        return notify_channel(self.schema)

    @property
    def delete_check(self) -> str:
        """First in a transaction that deletes events or tag rows of one pid: the owner check for
        deletes ($1 the map epoch, $2 the pid's slice as an array; :mod:`.timestamp_rule`)."""
        return delete_check_sql(self.schema)

    written_check = Sql(
        "SELECT writer, event_payload, db_timestamp FROM {event_journal} WHERE persistence_id = $1 "
        "AND seq_nr BETWEEN $2 AND $3 ORDER BY seq_nr"
    )
    """Rows of one pid in a seq_nr range written by a writer (resolving unknown outcomes)."""

    highest_seq_nr = Sql("SELECT COALESCE(max(seq_nr), 0) FROM {event_journal} WHERE persistence_id = $1")

    events_by_pid = Sql(
        "SELECT {columns} FROM {event_journal} WHERE persistence_id = $1 "
        "AND seq_nr >= $2 AND seq_nr <= $3 AND deleted = false ORDER BY seq_nr LIMIT $4",
        columns=EVENT_COLUMNS,
    )

    load_event = Sql(
        "SELECT {columns} FROM {event_journal} WHERE persistence_id = $1 AND seq_nr = $2 AND deleted = false",
        columns=EVENT_COLUMNS,
    )

    timestamp_of = Sql("SELECT db_timestamp FROM {event_journal} WHERE persistence_id = $1 AND seq_nr = $2")

    delete_batch = Sql(
        "DELETE FROM {event_journal} WHERE persistence_id = $1 AND seq_nr IN (SELECT seq_nr FROM {event_journal} "
        "WHERE persistence_id = $1 AND seq_nr <= $2 ORDER BY seq_nr LIMIT $3)"
    )

    tombstone = Sql(
        "UPDATE {event_journal} SET deleted = true, event_payload = '\\x'::bytea, meta_payload = NULL "
        "WHERE persistence_id = $1 AND seq_nr = $2"
    )
    """Turn the highest event into the reference's tombstone: deleted, payload dropped."""

    persistence_ids = Sql(
        "SELECT DISTINCT persistence_id FROM {event_journal} WHERE persistence_id > $1 ORDER BY persistence_id LIMIT $2"
    )

    persistence_ids_by_type = Sql(
        "SELECT DISTINCT persistence_id FROM {event_journal} WHERE persistence_id > $1 AND entity_type = $3 "
        "ORDER BY persistence_id LIMIT $2"
    )

    @property
    def upsert_snapshot(self) -> str:
        cols = (
            "slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, "
            "ser_manifest, snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload"
        )
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols.split(", ") if c != "persistence_id")
        return (
            f"INSERT INTO {self.t('snapshot')} ({cols}) VALUES "
            "($1, $2, $3, $4, clock_timestamp(), $5, $6, $7, $8, $9, $10, $11, $12) "
            f"ON CONFLICT (persistence_id) DO UPDATE SET {updates}"
        )

    @property
    def replace_snapshot(self) -> str:
        """The upsert, also dropping the older snapshots kept before (one statement: atomic)."""
        return (
            f"WITH older AS (DELETE FROM {self.t('snapshot_older')} WHERE persistence_id = $3) {self.upsert_snapshot}"
        )

    load_snapshot = Sql(
        "SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, ser_manifest, "
        "snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload FROM {snapshot} WHERE persistence_id = $1"
    )

    table_exists = "SELECT to_regclass($1)"
    """The table (a regclass literal, :attr:`ej`) if it exists, else NULL."""

    server_version = "SHOW server_version"

    schema_revision = Sql("SELECT version_num FROM {slice_journal_alembic_version}")
    """The Alembic revision of the journal's schema (its own version table)."""

    keep_previous_snapshot = Sql(
        "INSERT INTO {snapshot_older} ({columns}) SELECT {columns} FROM {snapshot} "
        "WHERE persistence_id = $1 AND seq_nr < $2 ON CONFLICT (persistence_id, seq_nr) DO NOTHING",
        columns=_SNAP_COLS,
    )
    """Copy the pid's current snapshot (older than $2) into snapshot_older."""

    prune_older_snapshots = Sql(
        "DELETE FROM {snapshot_older} WHERE persistence_id = $1 AND (seq_nr >= $2 OR seq_nr NOT IN (SELECT seq_nr "
        "FROM {snapshot_older} WHERE persistence_id = $1 AND seq_nr < $2 ORDER BY seq_nr DESC LIMIT $3))"
    )
    """Keep the $3 newest older snapshots below the current one ($2)."""

    load_older_snapshots = Sql(
        "SELECT {columns} FROM {snapshot_older} WHERE persistence_id = $1 ORDER BY seq_nr DESC LIMIT $2",
        columns=_SNAP_COLS,
    )

    insert_keys = Sql(
        "INSERT INTO {encryption_key} (subject, data_key, created_at) SELECT s, k, now() "
        "FROM unnest($1::text[], $2::bytea[]) AS u(s, k) ON CONFLICT DO NOTHING"
    )

    load_keys = Sql("SELECT subject, data_key FROM {encryption_key} WHERE subject = ANY($1::text[])")

    forget_key = Sql(
        "WITH old AS (SELECT data_key FROM {encryption_key} WHERE subject = $1) "
        "INSERT INTO {encryption_key} AS k (subject, data_key, created_at, forgotten_at) "
        "VALUES ($1, NULL, now(), now()) "
        "ON CONFLICT (subject) DO UPDATE SET data_key = NULL, forgotten_at = coalesce(k.forgotten_at, now()) "
        "RETURNING coalesce((SELECT data_key IS NOT NULL FROM old), false)"
    )
    """A subject with no key yet gets its tombstone too: it is never made later."""

    manifest_counts = Sql(
        "SELECT 'event', event_ser_id, event_ser_manifest, count(*) FROM {event_journal} WHERE NOT deleted "
        "GROUP BY 2, 3 UNION ALL SELECT 'snapshot', ser_id, ser_manifest, count(*) FROM {snapshot} GROUP BY 2, 3 "
        "UNION ALL SELECT 'snapshot', ser_id, ser_manifest, count(*) FROM {snapshot_older} GROUP BY 2, 3 "
        "ORDER BY 1, 3, 2"
    )

    event_counts = Sql("SELECT entity_type, count(*) FROM {event_journal} GROUP BY entity_type ORDER BY entity_type")
