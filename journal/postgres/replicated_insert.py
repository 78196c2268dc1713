"""SQL of a replicated batch: every event of it in one INSERT, with its origin, vector time and position.

The events arrive in their source's log order, which extends the causal order; the target must
store them so that its slice queries deliver them in that order too. Slice queries order by
``(db_timestamp, seq_nr, persistence_id)``, and :mod:`.timestamp_rule` gives the n-th row of a
statement base + (n - 1) µs, so the events are stamped in batch order; ``prev`` is the newest
stored event of every pid of the batch (one base for the whole batch). Sequence numbers continue
each pid's, in batch order. The statement settles before it returns (the clock has passed its
per-row steps), so any event written after the commit, here or by a reader of these events, gets
a later timestamp.

Parameters are parallel arrays, one element per event (see :func:`insert_replicated`); tags
get their tag-view rows in the same statement, and the NOTIFY of the journal's write path is sent
the same way.
"""

from __future__ import annotations

from ..settings import validate_identifier
from .statements import notify_channel
from .tag_statements import TagStatements
from .timestamp_rule import clock, settle, stamp

_COLUMNS = (
    "slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, event_ser_manifest, "
    "event_payload, deleted, writer, tags, meta_ser_id, meta_ser_manifest, meta_payload, "
    "origin_location, origin_seq_nr, vector_time, log_seq_nr"
)


def insert_replicated(schema: str, *, notify: bool, tagged: bool) -> str:
    """The batch insert. $1 pids, $2 slices, $3 serializer ids, $4 manifests, $5 payloads,
    $6 tags (JSON text or NULL), $7-$9 metadata (id, manifest, payload) (each of $6-$9 may be
    one NULL instead of an array of NULLs: ``unnest`` pads it), $10 origin locations,
    $11 origin seq nrs, $12 vector times (JSON text), $13 log positions, $14 the entity type
    (the log), $15 the writer id, $16 the writer's partition map epoch; then with ``notify`` $17
    the notification payloads; then with ``tagged`` the tag bucket size (milliseconds). Returns
    the number of rows and the last timestamp."""
    validate_identifier(schema, "schema")
    ej = f'"{schema}".event_journal'
    rows = f"""
WITH {clock(schema, "$16", "$2")}, i AS MATERIALIZED (
  SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::text[], $5::bytea[], $6::text[], $7::int[],
                       $8::text[], $9::bytea[], $10::text[], $11::bigint[], $12::text[], $13::bigint[])
    WITH ORDINALITY AS i(persistence_id, slice, ser_id, ser_manifest, payload, tags_json, meta_ser_id,
                         meta_ser_manifest, meta_payload, origin, origin_seq, vt, log_seq, n)
), prev AS MATERIALIZED (
  SELECT p.persistence_id, h.seq_nr, h.db_timestamp FROM (SELECT DISTINCT persistence_id FROM i) p
  LEFT JOIN LATERAL (
    SELECT e.seq_nr, e.db_timestamp FROM {ej} e
    WHERE e.persistence_id = p.persistence_id ORDER BY e.seq_nr DESC LIMIT 1
  ) h ON true
), src AS MATERIALIZED (
  SELECT i.slice, $14::text AS entity_type, i.persistence_id,
    COALESCE(prev.seq_nr, 0) + row_number() OVER (PARTITION BY i.persistence_id ORDER BY i.n) AS seq_nr,
    {stamp("(SELECT max(db_timestamp) FROM prev)", "i.n")} AS db_timestamp,
    i.ser_id, i.ser_manifest, i.payload,
    CASE WHEN i.tags_json IS NULL THEN NULL
         ELSE ARRAY(SELECT jsonb_array_elements_text(i.tags_json::jsonb)) END AS tags,
    i.meta_ser_id, i.meta_ser_manifest, i.meta_payload, i.origin, i.origin_seq, i.vt::jsonb AS vt, i.log_seq
  FROM i JOIN prev USING (persistence_id)
), ins AS (
  INSERT INTO {ej} ({_COLUMNS})
  SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, ser_id, ser_manifest, payload, false, $15,
    tags, meta_ser_id, meta_ser_manifest, meta_payload, origin, origin_seq, vt, log_seq
  FROM src
  RETURNING db_timestamp
)"""
    tags = ""
    if tagged:
        bucket = "$18" if notify else "$17"
        tag_rows = TagStatements(schema).insert_from_events("src", "$15", bucket, "")
        tags = f", tv AS ({tag_rows}\n)"
    notified = (
        f", (SELECT count(pg_notify('{notify_channel(schema)}', g)) FROM unnest($17::text[]) g) AS notified"
        if notify
        else ""
    )
    result = f"count(*) AS n, max(db_timestamp) AS last_timestamp, {settle('ins')} AS settled"
    return f"{rows}{tags}\nSELECT {result}{notified} FROM ins"
