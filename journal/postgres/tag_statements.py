"""SQL of the tag view on PostgreSQL, built once per schema (values always parameters)."""

from __future__ import annotations

from dataclasses import dataclass

from .schema_sql import SchemaSql, Sql

GREGORIAN_OFFSET = 0x01B21DD213814000


def timeuuid_sql(uuid_time: str, pid: str, seq_nr: str) -> str:
    """SQL building :func:`journal.timeuuid.timeuuid_for_event` from a 60-bit time, the pid
    and the seq_nr (a test checks both sides agree)."""
    v = f"((({seq_nr} % 1073741824) << 32) | ('x' || substr(md5({pid}), 1, 8))::bit(32)::bigint)"
    return (
        f"(lpad(to_hex({uuid_time} & 4294967295), 8, '0') || "
        f"lpad(to_hex(({uuid_time} >> 32) & 65535), 4, '0') || "
        f"lpad(to_hex((({uuid_time} >> 48) & 4095) | 4096), 4, '0') || "
        f"lpad(to_hex(({v} >> 48) | 32768), 4, '0') || "
        f"lpad(to_hex({v} & 281474976710655), 12, '0'))::uuid"
    )


TAG_ROW_COLUMNS = (
    "tag_name, timebucket, timestamp, uuid_time, persistence_id, tag_pid_sequence_nr, sequence_nr, "
    "writer_uuid, ser_id, ser_manifest, event, meta_ser_id, meta_ser_manifest, meta"
)


TAG_PAGE_COLUMNS = (
    "persistence_id, timestamp, tag_pid_sequence_nr, sequence_nr, timebucket, ser_id, ser_manifest, "
    "event, writer_uuid, ARRAY[tag_name] AS tags, meta_ser_id, meta_ser_manifest, meta AS meta_payload"
)
"""The columns of a tag page, named as ``journal.backend.TAG_PAGE_COLUMNS``."""


@dataclass(frozen=True)
class TagStatements(SchemaSql):
    def insert_from_events(self, src: str, writer_param: str, bucket_param: str, conflict: str) -> str:
        """The data-modifying CTE body that inserts the tag rows of the events in CTE ``src``
        (same statement, same transaction as the events). Numbers continue per (tag, pid), after
        the pid's tag rows or its progress row, whichever is higher (the cleanup tool deletes the
        rows and keeps the progress)."""
        t = "tvs.uuid_time"
        return f"""
  INSERT INTO {self.t("tag_views")} ({TAG_ROW_COLUMNS})
  SELECT tvs.tag, ((tvs.uuid_time - {GREGORIAN_OFFSET}) / 10000 / {bucket_param}) * {bucket_param},
    {timeuuid_sql(t, "tvs.persistence_id", "tvs.seq_nr")}, tvs.uuid_time, tvs.persistence_id,
    COALESCE(pm.n, 0) + row_number() OVER (PARTITION BY tvs.tag, tvs.persistence_id ORDER BY tvs.seq_nr),
    tvs.seq_nr, {writer_param}, tvs.ser_id, tvs.ser_manifest, tvs.payload,
    tvs.meta_ser_id, tvs.meta_ser_manifest, tvs.meta_payload
  FROM (
    SELECT tg.tag, s.persistence_id, s.seq_nr, s.ser_id, s.ser_manifest, s.payload,
      s.meta_ser_id, s.meta_ser_manifest, s.meta_payload,
      (extract(epoch FROM s.db_timestamp) * 10000000)::bigint + {GREGORIAN_OFFSET} AS uuid_time
    FROM {src} s CROSS JOIN LATERAL unnest(s.tags) AS tg(tag)
  ) tvs
  LEFT JOIN LATERAL (
    SELECT GREATEST(max(v.tag_pid_sequence_nr), (SELECT p.tag_pid_sequence_nr FROM {self.t("tag_write_progress")} p
      WHERE p.persistence_id = tvs.persistence_id AND p.tag = tvs.tag)) AS n FROM {self.t("tag_views")} v
    WHERE v.tag_name = tvs.tag AND v.persistence_id = tvs.persistence_id
  ) pm ON true
  {conflict}
  RETURNING 1"""

    insert_rows = Sql(
        "INSERT INTO {tag_views} ({columns}) SELECT * FROM unnest($1::text[], $2::bigint[], "
        "$3::uuid[], $4::bigint[], $5::text[], $6::bigint[], $7::bigint[], $8::text[], $9::int[], "
        "$10::text[], $11::bytea[], $12::int[], $13::text[], $14::bytea[]) ON CONFLICT DO NOTHING",
        columns=TAG_ROW_COLUMNS,
    )
    """Idempotent upsert of tag rows (a resend after recovery writes nothing twice)."""

    read_rows = Sql(
        "SELECT {columns} FROM {tag_views} WHERE tag_name = $1 AND timebucket = $2 "
        "AND (uuid_time, timestamp) > ($3, $4) AND uuid_time < $5 ORDER BY uuid_time, timestamp LIMIT $6",
        columns=TAG_PAGE_COLUMNS,
    )

    next_bucket = Sql("SELECT min(timebucket) FROM {tag_views} WHERE tag_name = $1 AND timebucket BETWEEN $2 AND $3")

    upsert_progress = Sql(
        'INSERT INTO {tag_write_progress} (persistence_id, tag, sequence_nr, tag_pid_sequence_nr, "offset") SELECT * '
        "FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::uuid[]) "
        "ON CONFLICT (persistence_id, tag) DO UPDATE "
        'SET sequence_nr = EXCLUDED.sequence_nr, tag_pid_sequence_nr = EXCLUDED.tag_pid_sequence_nr, "offset" = '
        'EXCLUDED."offset"'
    )

    read_progress = Sql(
        'SELECT persistence_id, tag, sequence_nr, tag_pid_sequence_nr, "offset" FROM {tag_write_progress} '
        "WHERE persistence_id = $1"
    )

    read_scanning = Sql("SELECT sequence_nr FROM {tag_scanning} WHERE persistence_id = $1")

    upsert_scanning = Sql(
        "INSERT INTO {tag_scanning} (persistence_id, sequence_nr) VALUES ($1, $2) ON CONFLICT (persistence_id) DO "
        "UPDATE SET sequence_nr = EXCLUDED.sequence_nr"
    )

    def tagged_events(self, event_journal: str) -> str:
        return (
            "SELECT persistence_id, seq_nr, db_timestamp, tags, event_ser_id, event_ser_manifest, "
            f"event_payload, writer, meta_ser_id, meta_ser_manifest, meta_payload FROM {event_journal} "
            "WHERE persistence_id = $1 AND seq_nr >= $2 AND deleted = false ORDER BY seq_nr LIMIT $3"
        )

    claim_setting = Sql("INSERT INTO {tag_view_settings} (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")

    read_setting = Sql("SELECT value FROM {tag_view_settings} WHERE name = $1 FOR UPDATE")

    update_setting = Sql("UPDATE {tag_view_settings} SET value = $2 WHERE name = $1")

    any_rows = Sql("SELECT EXISTS (SELECT 1 FROM {tag_views})")
