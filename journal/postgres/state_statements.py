"""The SQL of the durable state store (``durable_state``, docs/durable-state.md).

One statement writes a list of rows (an upsert's one, or an ``upsert_many``'s, each pid once):
revision 1 inserts (nothing if the pid has a row), revision n updates the pid's row only where it
holds n - 1. Under READ COMMITTED a racing writer's update of the same row makes this one wait
and then check the row it committed: so of two writers of one revision exactly one finds n - 1. Each row meets
its pid's row through the primary key alone (a filter on the whole pid array beside it had the
planner scan the table, 3.5 x slower on a table of 2,000 rows). For a large call the planner may
still hash-join the parts to a table of some 20,000 rows (a sequential scan, 5-7 ms of a 1,000-row
call's 12-14) rather than probe the key once a part: the remaining gap to a raw
``ON CONFLICT DO UPDATE``, which would insert revision n > 1 for a pid with no row.
``db_timestamp`` follows the journal's one timestamp rule (:mod:`.timestamp_rule`): the clock read
once in the statement, after its lock, and never below the pid's previous stamp plus 1 µs; the
n-th row of the statement steps n - 1 µs, and the statement ends once the clock passed its steps.
"""

from __future__ import annotations

from ..settings import validate_identifier
from .slice_queries import SliceTable
from .timestamp_rule import MICROSECOND, clock, delete_check_sql, read_check

_STATE_COLUMNS = (
    "persistence_id, entity_type, slice, revision AS seq_nr, db_timestamp, state_ser_id AS event_ser_id, "
    "coalesce(state_ser_manifest, '') AS event_ser_manifest, "
    "CASE WHEN state_ser_id = 0 THEN NULL ELSE state_payload END AS event_payload, '' AS writer, tags, "
    "NULL::int AS meta_ser_id, NULL::text AS meta_ser_manifest, NULL::bytea AS meta_payload, "
    "state_ser_id = 0 AS deleted"
)

STATES = SliceTable(
    "durable_state",
    _STATE_COLUMNS,
    _STATE_COLUMNS.replace("CASE WHEN state_ser_id = 0 THEN NULL ELSE state_payload END", "NULL::bytea"),
    "revision",
    "true",
)
"""``durable_state`` for the slice queries (changes by slices): a row per pid in the layout of
an event row, its revision as ``seq_nr``; a tombstone has no payload and ``deleted`` set."""

_SRC = (
    "unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::int[], $6::text[], $7::bytea[], $8::text[])"
    " WITH ORDINALITY AS s(pid, slice, entity_type, revision, ser_id, manifest, payload, tags, n)"
)
_UNIFORM_SRC = (
    "(SELECT u.pid, u.slice, $3::text AS entity_type, u.revision, $5::int AS ser_id, $6::text AS manifest,"
    " u.payload, NULL::text AS tags, u.n"
    " FROM unnest($1::text[], $2::int[], $4::bigint[], $7::bytea[])"
    " WITH ORDINALITY AS u(pid, slice, revision, payload, n)"
    ") s"
)
"""The rows of an upsert whose rows share one entity type, serializer id and manifest and have
no tags (the commonest bulk call): those as single values, so only four arrays are sent."""
_TAGS = "CASE WHEN s.tags IS NULL THEN NULL ELSE ARRAY(SELECT json_array_elements_text(s.tags::json)) END"


def _stamp(prev: str) -> str:
    return f"GREATEST((SELECT t FROM clock), {prev} + {MICROSECOND}) + (s.n - 1) * {MICROSECOND}"


def _settled(written: str) -> str:
    """:func:`.timestamp_rule.settle` for rows stepped by their ordinal ``n``: true once the clock
    has passed the last step of the rows of ``written`` (their greatest ``n``). Reading them
    runs the data-modifying CTEs to their end first, so the wait overlaps nothing."""
    last = f"(SELECT t FROM clock) + (coalesce((SELECT max(n) FROM {written}), 1) - 1) * {MICROSECOND}"
    return f"(SELECT true FROM pg_sleep(GREATEST(0, extract(epoch FROM {last} - clock_timestamp()))))"


def _upsert(schema: str, src: str, epoch: str) -> str:
    """The upsert statement over the rows of ``src`` (a FROM item ``s``), ``epoch`` the
    parameter of the writer's map epoch (see :class:`StateStatements`)."""
    ds = f'"{schema}".durable_state'
    return f"""
WITH {clock(schema, epoch, "$2")},
src AS MATERIALIZED (SELECT * FROM {src}),
upd AS (
  UPDATE {ds} d SET revision = s.revision, db_timestamp = {_stamp("d.db_timestamp")}, state_ser_id = s.ser_id,
         state_ser_manifest = s.manifest, state_payload = s.payload, tags = {_TAGS}
    FROM src s
   WHERE d.persistence_id = s.pid AND s.revision > 1 AND d.revision = s.revision - 1
  RETURNING s.n, d.db_timestamp AS ts
),
ins AS (
  INSERT INTO {ds} (slice, entity_type, persistence_id, revision, db_timestamp, state_ser_id,
                    state_ser_manifest, state_payload, tags)
  SELECT s.slice, s.entity_type, s.pid, 1, {_stamp("NULL::timestamptz")}, s.ser_id, s.manifest, s.payload, {_TAGS}
    FROM src s WHERE s.revision = 1
  ON CONFLICT (persistence_id) DO NOTHING
  RETURNING persistence_id, db_timestamp AS ts
),
done AS (SELECT n, ts FROM upd UNION ALL SELECT s.n, i.ts FROM ins i JOIN src s ON s.pid = i.persistence_id)
SELECT array_agg(n) AS ns, array_agg(ts) AS ts FROM done WHERE {_settled("done")}"""


class StateStatements:
    """The statements for one schema.

    Upsert parameters, one element per row: $1 pid, $2 slice, $3 entity type, $4 revision,
    $5 serializer id (0: a tombstone), $6 manifest, $7 payload, $8 tags as a JSON array (NULL:
    none); $9 the writer's partition map epoch (the owner check of the clock). It returns one
    row of two arrays, the written rows only (NULL when none is): ``ns`` their ordinals in the
    input (from 1) and ``ts`` their db_timestamps; a row not among them was refused."""

    def __init__(self, schema: str) -> None:
        validate_identifier(schema, "schema")
        ds = f'"{schema}".durable_state'
        self.upsert = _upsert(schema, _SRC, "$9")
        self.upsert_uniform = _upsert(schema, _UNIFORM_SRC, "$8")
        """:attr:`upsert` of uniform rows: $1 pids, $2 slices, $3 the entity type, $4 revisions, $5
        the serializer id, $6 the manifest, $7 payloads (no tags), $8 the map epoch."""
        self.revisions = f"SELECT persistence_id, revision FROM {ds} WHERE persistence_id = ANY($1::text[])"
        """The stored revision of each pid of a refused row (read after the statement: the revision
        a racing writer committed, which the statement's own snapshot may not show)."""
        self.read_back = (
            f"SELECT persistence_id, revision, db_timestamp, state_ser_id, state_ser_manifest, state_payload, tags"
            f" FROM {ds} WHERE persistence_id = ANY($1::text[]) AND {read_check(schema, '$2', '$3')}"
        )
        """The rows of an upsert whose answer was lost, to resolve its outcome, read only while this
        database still serves their slices ($3) at the writer's map epoch ($2): a range moved away
        meanwhile took the rows with it (the owner check raises)."""
        self.delete_check = delete_check_sql(schema)
        """First in a transaction that deletes rows ($1 the map epoch, $2 the slices): the owner
        check for deletes (they wait while a move copies the range, as the events' deletes)."""
        self.busy = "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state IS DISTINCT FROM 'idle'"
        """The server process of an interrupted upsert still runs it (or a transaction)."""
        self.get = (
            f"SELECT revision, db_timestamp, state_ser_id, state_ser_manifest, state_payload, tags"
            f" FROM {ds} WHERE persistence_id = $1"
        )
        self.hard_delete = f"DELETE FROM {ds} WHERE persistence_id = $1"
        old = "state_ser_id = 0 AND db_timestamp < $1 AND slice BETWEEN $3 AND $4"
        self.delete_tombstones = (
            f"DELETE FROM {ds} WHERE persistence_id IN (SELECT persistence_id FROM {ds} WHERE {old} LIMIT $2) AND {old}"
        )
        """Up to $2 tombstones older than $1 of slices $3 to $4 (the outer condition again: a
        tombstone written over meanwhile is rechecked on its new row version and kept)."""
        self.count_tombstones = (
            f"SELECT count(*) FROM {ds} WHERE {old.replace('$3', '$2').replace('$4', '$3')}"
            f" AND {read_check(schema, '$4', 'ARRAY(SELECT generate_series($2::int, $3::int))')}"
        )
        """The tombstones older than $1 of slices $2 to $3, while this database serves them ($4: the map epoch)."""
        self.counts = f"SELECT count(*) AS states, count(*) FILTER (WHERE state_ser_id = 0) AS tombstones FROM {ds}"
        self.load = f"SELECT {_STATE_COLUMNS} FROM {ds} WHERE persistence_id = $1 AND revision = $2"
        """The pid's row if it is still at the revision (a backtracking read's payload)."""


def column_writes(schema: str, columns: list[tuple[str | None, str]]) -> list[tuple[str, list[int]]]:
    """The statements writing a pid's additional column values ($1 the pid, then the values in
    the order of ``columns``), one per table: ``durable_state``'s row updated, a table of its own
    upserted on ``persistence_id``. Each statement with the indexes of its values."""
    by_table: dict[str | None, list[int]] = {}
    for i, (table, _) in enumerate(columns):
        by_table.setdefault(table, []).append(i)
    out = []
    for table, its in by_table.items():
        names = [f'"{validate_identifier(columns[i][1], "column")}"' for i in its]
        params = [f"${n + 2}" for n in range(len(its))]
        if table is None:
            sets = ", ".join(f"{c} = {p}" for c, p in zip(names, params, strict=True))
            sql = f'UPDATE "{schema}".durable_state SET {sets} WHERE persistence_id = $1'
        else:
            t = f'"{schema}"."{validate_identifier(table, "table")}"'
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in names)
            sql = (
                f"INSERT INTO {t} (persistence_id, {', '.join(names)}) VALUES ($1, {', '.join(params)}) "
                f"ON CONFLICT (persistence_id) DO UPDATE SET {sets}"
            )
        out.append((sql, its))
    return out


COLUMNS_OF = (
    "SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) "
    "AND a.attnum > 0 AND NOT a.attisdropped"
)
"""The columns of these tables ($2) of the schema ($1)."""

KEYED_BY_PID = (
    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0] "
    "WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) AND i.indisunique AND i.indnatts = 1 "
    "AND a.attname = 'persistence_id'"
)
"""Which of these tables ($2) have a unique index on ``persistence_id`` alone (the upsert's conflict target)."""
