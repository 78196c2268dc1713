"""Every SQL statement of the Postgres journal, built once per schema.

Identifiers come from validated configuration and are quoted here; values are always
parameters. Nothing outside ``journal.postgres`` writes SQL for the journal tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..backend import SLICE_GROUP_SIZE, SLICE_ROW_COLUMNS
from .schema_sql import SchemaSql
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

    @property
    def written_check(self) -> str:
        """Rows of one pid in a seq_nr range written by a writer (resolving unknown outcomes)."""
        return (
            f"SELECT writer, event_payload, db_timestamp FROM {self.t('event_journal')} "
            "WHERE persistence_id = $1 AND seq_nr BETWEEN $2 AND $3 ORDER BY seq_nr"
        )

    @property
    def highest_seq_nr(self) -> str:
        return f"SELECT COALESCE(max(seq_nr), 0) FROM {self.t('event_journal')} WHERE persistence_id = $1"

    @property
    def event_columns(self) -> str:
        return EVENT_COLUMNS

    @property
    def events_by_pid(self) -> str:
        return (
            f"SELECT {EVENT_COLUMNS} FROM {self.t('event_journal')} WHERE persistence_id = $1 "
            "AND seq_nr >= $2 AND seq_nr <= $3 AND deleted = false ORDER BY seq_nr LIMIT $4"
        )

    @property
    def load_event(self) -> str:
        return (
            f"SELECT {EVENT_COLUMNS} FROM {self.t('event_journal')} "
            "WHERE persistence_id = $1 AND seq_nr = $2 AND deleted = false"
        )

    @property
    def timestamp_of(self) -> str:
        return f"SELECT db_timestamp FROM {self.t('event_journal')} WHERE persistence_id = $1 AND seq_nr = $2"

    @property
    def delete_batch(self) -> str:
        return (
            f"DELETE FROM {self.t('event_journal')} WHERE persistence_id = $1 AND seq_nr IN ("
            f"SELECT seq_nr FROM {self.t('event_journal')} WHERE persistence_id = $1 AND seq_nr <= $2 "
            "ORDER BY seq_nr LIMIT $3)"
        )

    @property
    def tombstone(self) -> str:
        """Turn the highest event into the reference's tombstone: deleted, payload dropped."""
        return (
            f"UPDATE {self.t('event_journal')} SET deleted = true, event_payload = '\\x'::bytea, "
            "meta_payload = NULL WHERE persistence_id = $1 AND seq_nr = $2"
        )

    @property
    def persistence_ids(self) -> str:
        return (
            f"SELECT DISTINCT persistence_id FROM {self.t('event_journal')} WHERE persistence_id > $1 "
            "ORDER BY persistence_id LIMIT $2"
        )

    @property
    def persistence_ids_by_type(self) -> str:
        return (
            f"SELECT DISTINCT persistence_id FROM {self.t('event_journal')} WHERE persistence_id > $1 "
            "AND entity_type = $3 ORDER BY persistence_id LIMIT $2"
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

    @property
    def load_snapshot(self) -> str:
        return (
            "SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, "
            "ser_id, ser_manifest, snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload "
            f"FROM {self.t('snapshot')} WHERE persistence_id = $1"
        )

    table_exists = "SELECT to_regclass($1)"
    """The table (a regclass literal, :attr:`ej`) if it exists, else NULL."""

    server_version = "SHOW server_version"

    @property
    def schema_revision(self) -> str:
        """The Alembic revision of the journal's schema (its own version table)."""
        return f"SELECT version_num FROM {self.t('slice_journal_alembic_version')}"

    @property
    def keep_previous_snapshot(self) -> str:
        """Copy the pid's current snapshot (older than $2) into snapshot_older."""
        return (
            f"INSERT INTO {self.t('snapshot_older')} ({_SNAP_COLS}) SELECT {_SNAP_COLS} FROM {self.t('snapshot')} "
            "WHERE persistence_id = $1 AND seq_nr < $2 ON CONFLICT (persistence_id, seq_nr) DO NOTHING"
        )

    @property
    def prune_older_snapshots(self) -> str:
        """Keep the $3 newest older snapshots below the current one ($2)."""
        return (
            f"DELETE FROM {self.t('snapshot_older')} WHERE persistence_id = $1 AND (seq_nr >= $2 OR seq_nr NOT IN "
            f"(SELECT seq_nr FROM {self.t('snapshot_older')} WHERE persistence_id = $1 AND seq_nr < $2 "
            "ORDER BY seq_nr DESC LIMIT $3))"
        )

    @property
    def load_older_snapshots(self) -> str:
        return (
            f"SELECT {_SNAP_COLS} FROM {self.t('snapshot_older')} "
            "WHERE persistence_id = $1 ORDER BY seq_nr DESC LIMIT $2"
        )

    @property
    def insert_keys(self) -> str:
        return (
            f"INSERT INTO {self.t('encryption_key')} (subject, data_key, created_at) "
            "SELECT s, k, now() FROM unnest($1::text[], $2::bytea[]) AS u(s, k) ON CONFLICT DO NOTHING"
        )

    @property
    def load_keys(self) -> str:
        return f"SELECT subject, data_key FROM {self.t('encryption_key')} WHERE subject = ANY($1::text[])"

    @property
    def forget_key(self) -> str:
        """A subject with no key yet gets its tombstone too: it is never made later."""
        t = self.t("encryption_key")
        return (
            f"WITH old AS (SELECT data_key FROM {t} WHERE subject = $1) "
            f"INSERT INTO {t} AS k (subject, data_key, created_at, forgotten_at) VALUES ($1, NULL, now(), now()) "
            "ON CONFLICT (subject) DO UPDATE SET data_key = NULL, forgotten_at = coalesce(k.forgotten_at, now()) "
            "RETURNING coalesce((SELECT data_key IS NOT NULL FROM old), false)"
        )

    @property
    def manifest_counts(self) -> str:
        return (
            "SELECT 'event', event_ser_id, event_ser_manifest, count(*) "
            f"FROM {self.t('event_journal')} WHERE NOT deleted GROUP BY 2, 3 "
            f"UNION ALL SELECT 'snapshot', ser_id, ser_manifest, count(*) FROM {self.t('snapshot')} GROUP BY 2, 3 "
            f"UNION ALL SELECT 'snapshot', ser_id, ser_manifest, count(*) FROM {self.t('snapshot_older')} "
            "GROUP BY 2, 3 ORDER BY 1, 3, 2"
        )

    @property
    def event_counts(self) -> str:
        return f"SELECT entity_type, count(*) FROM {self.t('event_journal')} GROUP BY entity_type ORDER BY entity_type"
