"""Every SQL statement of the Postgres journal, built once per schema.

Identifiers come from validated configuration and are quoted here; values are always
parameters. Nothing outside ``journal.postgres`` writes SQL for the journal tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..backend import SLICE_GROUP_SIZE, SLICE_ROW_COLUMNS
from ..settings import validate_identifier
from .timestamp_rule import CLOCK, settle, stamp

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
class Statements:
    schema: str

    def __post_init__(self) -> None:
        validate_identifier(self.schema, "schema")

    @property
    def ej(self) -> str:
        return f'"{self.schema}".event_journal'

    @property
    def snap(self) -> str:
        return f'"{self.schema}".snapshot'

    @property
    def channel(self) -> str:
        return notify_channel(self.schema)

    def _event_rows(self) -> str:
        """The rows a batch inserts, computed from the parameter arrays (shared by both inserts).

        Parameters are parallel arrays, one element per event; the ordinal, manifest, tag and
        metadata arrays may be sent empty when every element would be 1, '' or NULL (a multi-
        argument unnest pads them with NULLs); an empty serializer-id array means JSON (id 1).
        Each row's db_timestamp follows :mod:`.timestamp_rule` (its pid's newest stored event
        is ``prev``; ``n`` its position in the arrays, so a call's events get consecutive
        microseconds). A call whose ``base_seq_nr`` does not match the stored highest yields no
        rows (reported as a conflict). Needs the statement's ``clock`` CTE.
        """
        return f"""
  SELECT i.slice, i.entity_type, i.persistence_id, COALESCE(prev.seq_nr, 0) + COALESCE(i.ordinal, 1) AS seq_nr,
    {stamp("prev.db_timestamp", "i.n")} AS db_timestamp,
    COALESCE(i.ser_id, 1) AS ser_id, COALESCE(i.ser_manifest, '') AS ser_manifest, i.payload,
    CASE WHEN i.tags_json IS NULL THEN NULL
         ELSE ARRAY(SELECT jsonb_array_elements_text(i.tags_json::jsonb)) END AS tags,
    i.meta_ser_id, i.meta_ser_manifest, i.meta_payload
  FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::bigint[], $6::int[],
              $7::text[], $8::bytea[], $10::text[], $11::int[], $12::text[], $13::bytea[])
    WITH ORDINALITY AS i(persistence_id, entity_type, slice, ordinal, base_seq_nr, ser_id, ser_manifest,
                         payload, tags_json, meta_ser_id, meta_ser_manifest, meta_payload, n)
  LEFT JOIN LATERAL (
    SELECT e.seq_nr, e.db_timestamp FROM {self.ej} e
    WHERE e.persistence_id = i.persistence_id ORDER BY e.seq_nr DESC LIMIT 1
  ) prev ON true
  WHERE i.base_seq_nr IS NULL OR i.base_seq_nr = COALESCE(prev.seq_nr, 0)"""

    def _insert_from(self, source: str, conflict: str) -> str:
        return f"""INSERT INTO {self.ej} (slice, entity_type, persistence_id, seq_nr, db_timestamp,
    event_ser_id, event_ser_manifest, event_payload, deleted, writer, tags,
    meta_ser_id, meta_ser_manifest, meta_payload)
  SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, ser_id, ser_manifest, payload,
    false, $9, tags, meta_ser_id, meta_ser_manifest, meta_payload
  FROM {source}
  {conflict}
  RETURNING persistence_id, seq_nr, db_timestamp"""

    def _result(self, notify: bool) -> str:
        # $14: the batch's distinct "<slice // 64>:<entity_type>" groups, computed by the client
        # (a DISTINCT over the inserted rows costs a text sort per row, a third of the statement)
        notify_col = (
            f", (SELECT count(pg_notify('{self.channel}', g)) FROM unnest($14::text[]) g) AS notified"
            if notify
            else ""
        )
        return f"""
SELECT persistence_id, min(seq_nr) AS first_seq_nr, count(*) AS n, min(db_timestamp) AS db_timestamp,
  {settle("ins")} AS settled{notify_col}
FROM ins GROUP BY persistence_id"""

    def insert_events(self, *, on_conflict_do_nothing: bool, notify: bool) -> str:
        """Group-commit insert of many calls in one statement (see :meth:`_event_rows`).

        Returns one row per written call: pid, first seq_nr, row count, the first row's
        db_timestamp (each next row of the call is one microsecond later). With
        ``notify``, parameter $14 is the text[] of notification payloads to send.
        """
        conflict = "ON CONFLICT DO NOTHING" if on_conflict_do_nothing else ""
        rows = self._event_rows()
        return f"WITH {CLOCK}, ins AS (\n  {self._insert_from(f'({rows}) src', conflict)}\n){self._result(notify)}"

    def insert_events_tagged(self, *, on_conflict_do_nothing: bool, notify: bool, tag_rows: str) -> str:
        """:meth:`insert_events` for batches with tags: the same event rows (from CTE ``src``) plus
        a data-modifying CTE that inserts their tag rows in the same statement and transaction.
        ``tag_rows`` is that CTE's body (``TagStatements.insert_from_events``), with its bucket
        parameter after the notification payloads (:meth:`tag_bucket_param`). Only batches that
        carry tags use it; the untagged statement is unchanged."""
        conflict = "ON CONFLICT DO NOTHING" if on_conflict_do_nothing else ""
        return (
            f"WITH {CLOCK}, src AS MATERIALIZED ({self._event_rows()}\n),"
            f" ins AS (\n  {self._insert_from('src', conflict)}\n"
            f"), tv AS ({tag_rows}\n){self._result(notify)}"
        )

    @staticmethod
    def tag_bucket_param(notify: bool) -> str:
        """The tagged insert's bucket-size parameter: after $14 (the notifications) when notifying."""
        return "$15" if notify else "$14"

    def insert_one(self, *, notify: bool) -> str:
        """The same write rule for the most common batch: one call of one untagged event.

        Scalar parameters instead of arrays, so a lone ``persist`` costs about what a plain
        single-row INSERT does. Returns the same columns as :meth:`insert_events`.
        """
        notify_col = (
            f", pg_notify('{self.channel}', (slice / 64)::text || ':' || entity_type) AS notified" if notify else ""
        )
        return f"""
WITH {CLOCK}, prev AS (
  SELECT e.seq_nr, e.db_timestamp FROM {self.ej} e
  WHERE e.persistence_id = $3::text ORDER BY e.seq_nr DESC LIMIT 1
), ins AS (
  INSERT INTO {self.ej} (slice, entity_type, persistence_id, seq_nr, db_timestamp,
    event_ser_id, event_ser_manifest, event_payload, deleted, writer,
    meta_ser_id, meta_ser_manifest, meta_payload)
  SELECT $1::int, $2::text, $3::text, COALESCE((SELECT seq_nr FROM prev), 0) + 1,
    {stamp("(SELECT db_timestamp FROM prev)", "1")},
    $5::int, $6::text, $7::bytea, false, $8::text, $9::int, $10::text, $11::bytea
  WHERE $4::bigint IS NULL OR $4::bigint = COALESCE((SELECT seq_nr FROM prev), 0)
  RETURNING persistence_id, seq_nr, db_timestamp, slice, entity_type
)
SELECT persistence_id, seq_nr AS first_seq_nr, 1::bigint AS n, db_timestamp,
  {settle("ins")} AS settled{notify_col} FROM ins"""

    writer_busy = (
        "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND application_name = $2 AND state = 'active'"
    )
    """Is this write connection's server process still executing a statement?"""

    terminate_writer = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND application_name = $2"
    )

    @property
    def written_check(self) -> str:
        """Rows of one pid in a seq_nr range written by a writer (resolving unknown outcomes)."""
        return (
            f"SELECT writer, event_payload, db_timestamp FROM {self.ej} "
            "WHERE persistence_id = $1 AND seq_nr BETWEEN $2 AND $3 ORDER BY seq_nr"
        )

    @property
    def highest_seq_nr(self) -> str:
        return f"SELECT COALESCE(max(seq_nr), 0) FROM {self.ej} WHERE persistence_id = $1"

    @property
    def event_columns(self) -> str:
        return EVENT_COLUMNS

    @property
    def events_by_pid(self) -> str:
        return (
            f"SELECT {EVENT_COLUMNS} FROM {self.ej} WHERE persistence_id = $1 "
            "AND seq_nr >= $2 AND seq_nr <= $3 AND deleted = false ORDER BY seq_nr LIMIT $4"
        )

    @property
    def load_event(self) -> str:
        return (
            f"SELECT {EVENT_COLUMNS} FROM {self.ej} "
            "WHERE persistence_id = $1 AND seq_nr = $2 AND deleted = false"
        )

    @property
    def timestamp_of(self) -> str:
        return f"SELECT db_timestamp FROM {self.ej} WHERE persistence_id = $1 AND seq_nr = $2"

    @property
    def delete_batch(self) -> str:
        return (
            f"DELETE FROM {self.ej} WHERE persistence_id = $1 AND seq_nr IN ("
            f"SELECT seq_nr FROM {self.ej} WHERE persistence_id = $1 AND seq_nr <= $2 "
            "ORDER BY seq_nr LIMIT $3)"
        )

    @property
    def tombstone(self) -> str:
        """Turn the highest event into the reference's tombstone: deleted, payload dropped."""
        return (
            f"UPDATE {self.ej} SET deleted = true, event_payload = '\\x'::bytea, "
            "meta_payload = NULL WHERE persistence_id = $1 AND seq_nr = $2"
        )

    @property
    def persistence_ids(self) -> str:
        return (
            f"SELECT DISTINCT persistence_id FROM {self.ej} WHERE persistence_id > $1 "
            "ORDER BY persistence_id LIMIT $2"
        )

    @property
    def persistence_ids_by_type(self) -> str:
        return (
            f"SELECT DISTINCT persistence_id FROM {self.ej} WHERE persistence_id > $1 "
            "AND entity_type = $3 ORDER BY persistence_id LIMIT $2"
        )

    @property
    def upsert_snapshot(self) -> str:
        cols = (
            "slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, "
            "ser_manifest, snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload"
        )
        updates = ", ".join(
            f"{c} = EXCLUDED.{c}" for c in cols.split(", ") if c != "persistence_id"
        )
        return (
            f"INSERT INTO {self.snap} ({cols}) VALUES "
            "($1, $2, $3, $4, clock_timestamp(), $5, $6, $7, $8, $9, $10, $11, $12) "
            f"ON CONFLICT (persistence_id) DO UPDATE SET {updates}"
        )

    @property
    def replace_snapshot(self) -> str:
        """The upsert, also dropping the older snapshots kept before (one statement: atomic)."""
        return f"WITH older AS (DELETE FROM {self.older} WHERE persistence_id = $3) {self.upsert_snapshot}"

    @property
    def load_snapshot(self) -> str:
        return (
            "SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, "
            "ser_id, ser_manifest, snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload "
            f"FROM {self.snap} WHERE persistence_id = $1"
        )

    @property
    def delete_snapshot(self) -> str:
        return f"DELETE FROM {self.snap} WHERE persistence_id = $1"

    table_exists = "SELECT to_regclass($1)"
    """The table (a regclass literal, :attr:`ej`) if it exists, else NULL."""

    server_version = "SHOW server_version"

    @property
    def schema_revision(self) -> str:
        """The Alembic revision of the journal's schema (its own version table)."""
        return f'SELECT version_num FROM "{self.schema}".slice_journal_alembic_version'

    @property
    def older(self) -> str:
        return f'"{self.schema}".snapshot_older'

    @property
    def keep_previous_snapshot(self) -> str:
        """Copy the pid's current snapshot (older than $2) into snapshot_older."""
        return (
            f"INSERT INTO {self.older} ({_SNAP_COLS}) SELECT {_SNAP_COLS} FROM {self.snap} "
            "WHERE persistence_id = $1 AND seq_nr < $2 ON CONFLICT (persistence_id, seq_nr) DO NOTHING"
        )

    @property
    def prune_older_snapshots(self) -> str:
        """Keep the $3 newest older snapshots below the current one ($2)."""
        return (
            f"DELETE FROM {self.older} WHERE persistence_id = $1 AND (seq_nr >= $2 OR seq_nr NOT IN "
            f"(SELECT seq_nr FROM {self.older} WHERE persistence_id = $1 AND seq_nr < $2 "
            "ORDER BY seq_nr DESC LIMIT $3))"
        )

    @property
    def load_older_snapshots(self) -> str:
        return (
            f"SELECT {_SNAP_COLS} FROM {self.older} WHERE persistence_id = $1 ORDER BY seq_nr DESC LIMIT $2"
        )

    @property
    def delete_older_snapshots(self) -> str:
        return f"DELETE FROM {self.older} WHERE persistence_id = $1"

    @property
    def insert_keys(self) -> str:
        return (
            f'INSERT INTO "{self.schema}".encryption_key (subject, data_key, created_at) '
            "SELECT s, k, now() FROM unnest($1::text[], $2::bytea[]) AS u(s, k) ON CONFLICT DO NOTHING"
        )

    @property
    def load_keys(self) -> str:
        return f'SELECT subject, data_key FROM "{self.schema}".encryption_key WHERE subject = ANY($1::text[])'

    @property
    def forget_key(self) -> str:
        """A subject with no key yet gets its tombstone too: it is never made later."""
        t = f'"{self.schema}".encryption_key'
        return (
            f"WITH old AS (SELECT data_key FROM {t} WHERE subject = $1) "
            f"INSERT INTO {t} AS k (subject, data_key, created_at, forgotten_at) VALUES ($1, NULL, now(), now()) "
            "ON CONFLICT (subject) DO UPDATE SET data_key = NULL, forgotten_at = coalesce(k.forgotten_at, now()) "
            "RETURNING coalesce((SELECT data_key IS NOT NULL FROM old), false)"
        )

    @property
    def manifest_counts(self) -> str:
        return (
            f"SELECT 'event', event_ser_id, event_ser_manifest, count(*) FROM {self.ej} WHERE NOT deleted "
            f"GROUP BY 2, 3 UNION ALL SELECT 'snapshot', ser_id, ser_manifest, count(*) FROM {self.snap} "
            f"GROUP BY 2, 3 UNION ALL SELECT 'snapshot', ser_id, ser_manifest, count(*) FROM {self.older} "
            "GROUP BY 2, 3 ORDER BY 1, 3, 2"
        )

    @property
    def event_counts(self) -> str:
        return f"SELECT entity_type, count(*) FROM {self.ej} GROUP BY entity_type ORDER BY entity_type"
