"""SQL of the partition map and of a move (``slice_partition``, ``slice_move``, range copies).

Built once per schema like :mod:`.statements`. The owner check every write and slice read runs
lives with the timestamp rule (:mod:`.timestamp_rule`); these are the statements of the map's
own maintenance and of ``journal partitions move``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import validate_identifier
from .schema_sql import SchemaSql, Sql
from .timestamp_rule import delete_check_sql, fence_key, mover_key

COPIED_TABLES = (
    "event_journal", "snapshot", "snapshot_older", "tag_views", "tag_write_progress", "tag_scanning", "durable_state",
)  # fmt: skip
"""The tables whose rows follow their slice (the projection and replication tables stay where
they are: they belong to a database, not to a slice)."""


@dataclass(frozen=True)
class PartitionStatements(SchemaSql):
    def t(self, table: str) -> str:
        """(Tables come from callers here too: each is checked.)"""
        validate_identifier(table, "table")
        return super().t(table)

    @property
    def fence_key(self) -> int:
        return fence_key(self.schema)

    rows = Sql("SELECT min_slice, max_slice, state, epoch, location, floor FROM {slice_partition} ORDER BY min_slice")

    lock_map = Sql("LOCK TABLE {slice_partition} IN EXCLUSIVE MODE")
    """Changes of this database's part of the map are serialized (a claim, a move's steps)."""

    events_outside = Sql("SELECT EXISTS (SELECT 1 FROM {event_journal} WHERE slice < $1 OR slice > $2)")
    """Does this database hold an event of a slice outside ``[$1, $2]``?"""

    events_inside = Sql("SELECT EXISTS (SELECT 1 FROM {event_journal} WHERE slice BETWEEN $1 AND $2)")
    """Does this database hold an event of a slice inside ``[$1, $2]``?"""

    delete_rows = Sql("DELETE FROM {slice_partition} WHERE min_slice = ANY($1::int[])")

    insert_row = Sql(
        "INSERT INTO {slice_partition} (min_slice, max_slice, state, epoch, location, floor, updated_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())"
    )

    check = Sql('SELECT "{schema}".slice_journal_check($1::bigint, $2::int[], $3::text)')
    """The owner check on its own (``$1`` epoch, ``$2`` slices, ``$3`` mode)."""

    @property
    def delete_check(self) -> str:
        return delete_check_sql(self.schema)

    has_replication = Sql("SELECT EXISTS (SELECT 1 FROM {replication_log})")

    @property
    def mover_key(self) -> int:
        return mover_key(self.schema)

    # -- the fence and the drain ------------------------------------------------------------

    lock_fence = "SELECT pg_advisory_lock($1, $2)"
    unlock_fence = "SELECT pg_advisory_unlock($1, $2)"
    try_lock = "SELECT pg_try_advisory_lock($1, $2)"
    try_xact_lock = "SELECT pg_try_advisory_xact_lock($1, $2)"
    keepalive = (
        "SELECT set_config('tcp_keepalives_idle', '5', false), set_config('tcp_keepalives_interval', '2', false), "
        "set_config('tcp_keepalives_count', '3', false)"
    )
    """The mover's lock session: a mover whose host vanished (no FIN) is noticed within ~11 s."""

    holder = (
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND mode = 'ExclusiveLock' LIMIT 1"
    )
    """The server process holding an advisory lock ($1, $2: the keys as unsigned 32-bit ints)."""

    writers = Sql(
        "SELECT DISTINCT l.virtualtransaction FROM pg_locks l WHERE l.locktype = 'relation' "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.relation IN ('{event_journal}'::regclass, '{durable_state}'::regclass) AND l.mode = 'RowExclusiveLock' "
        "AND l.granted AND l.pid IS DISTINCT FROM pg_backend_pid()"
    )
    """Transactions holding the write lock on event_journal or durable_state now (other than
    this session)."""

    still_running = "SELECT count(*) FROM pg_locks WHERE locktype = 'virtualxid' AND virtualxid = ANY($1::text[])"
    """How many of these transactions (virtual ids) are still running."""

    clock = "SELECT clock_timestamp()"

    # -- the move record ----------------------------------------------------------------------

    moves = Sql("SELECT min_slice, max_slice, target, epoch, step, copied_to FROM {slice_move} ORDER BY min_slice")

    start_move = Sql(
        "INSERT INTO {slice_move} (min_slice, max_slice, target, epoch, step, started_at, updated_at) "
        "VALUES ($1, $2, $3, $4, $5, clock_timestamp(), clock_timestamp())"
    )

    save_move = Sql(
        "UPDATE {slice_move} SET step = $2, copied_to = $3, updated_at = clock_timestamp() WHERE min_slice = $1"
    )

    save_step = Sql("UPDATE {slice_move} SET step = $2, updated_at = clock_timestamp() WHERE min_slice = $1")

    has_move = Sql("SELECT EXISTS (SELECT 1 FROM {slice_move} WHERE min_slice = $1)")

    refence = Sql(
        "WITH c AS (UPDATE {slice_partition} SET state = $3, updated_at = clock_timestamp() WHERE min_slice = $1 "
        "AND state = $2 RETURNING 1) SELECT EXISTS (SELECT 1 FROM c)"
    )
    """The range starting at ``$1`` from state ``$2`` to ``$3`` (true if it was in ``$2``)."""

    give_back = Sql(
        "WITH c AS (UPDATE {slice_partition} SET state = 'owned', location = NULL, updated_at = clock_timestamp() "
        "WHERE min_slice = $1 AND state = 'moving' RETURNING 1) SELECT EXISTS (SELECT 1 FROM c)"
    )
    """The range starting at ``$1``, ``moving`` here, ``owned`` again (true if it was moving)."""

    end_move = Sql("DELETE FROM {slice_move} WHERE min_slice = $1")

    # -- copies -------------------------------------------------------------------------------

    @property
    def columns(self) -> str:
        """A table's columns in their order ($1: the table, as regclass text)."""
        return (
            "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum"
        )

    copy_events = Sql(
        "SELECT * FROM {event_journal} WHERE slice BETWEEN $1 AND $2 AND db_timestamp >= $3 "
        "AND ($4::timestamptz IS NULL OR db_timestamp < $4) AND (persistence_id, seq_nr) > ($5, $6) "
        "ORDER BY persistence_id, seq_nr LIMIT $7"
    )
    """Every row (deleted ones too) of slices ``[$1, $2]`` stamped in ``[$3, $4)`` ($4 NULL: no
    end), after the key ``($5, $6)``, in key order, at most ``$7``."""

    copy_states = Sql(
        "SELECT * FROM {durable_state} WHERE slice BETWEEN $1 AND $2 AND db_timestamp >= $3 "
        "AND ($4::timestamptz IS NULL OR db_timestamp < $4) AND persistence_id > $5 ORDER BY persistence_id LIMIT $6"
    )
    """Every ``durable_state`` row (tombstones too) of slices ``[$1, $2]`` stamped in ``[$3, $4)``
    ($4 NULL: no end), after the pid ``$5``, in pid order, at most ``$6``."""

    newer_state = (
        "ON CONFLICT (persistence_id) DO UPDATE SET revision = EXCLUDED.revision, "
        "db_timestamp = EXCLUDED.db_timestamp, "
        "state_ser_id = EXCLUDED.state_ser_id, state_ser_manifest = EXCLUDED.state_ser_manifest, "
        "state_payload = EXCLUDED.state_payload, tags = EXCLUDED.tags "
        "WHERE durable_state.revision < EXCLUDED.revision"
    )
    """A state copied again at a later revision replaces the earlier copy (a state is one row,
    updated in place; an earlier revision copied late never goes back over a later one)."""

    states_in = Sql("SELECT persistence_id FROM {durable_state} WHERE slice BETWEEN $1 AND $2 LIMIT $3")
    """Up to ``$3`` persistence ids with a state in slices ``[$1, $2]``."""

    def by_slices(self, table: str) -> str:
        """Every row of a table with a slice column, of slices ``[$1, $2]``."""
        return f"SELECT * FROM {self.t(table)} WHERE slice BETWEEN $1 AND $2"

    def delete_by_slices(self, table: str) -> str:
        return f"DELETE FROM {self.t(table)} WHERE slice BETWEEN $1 AND $2"

    tag_rows_of = Sql("SELECT * FROM {tag_views} WHERE tag_name = ANY($1::text[]) AND persistence_id = ANY($2::text[])")
    """Tag rows of these tags ($1) and pids ($2) (the unique index leads with both)."""

    def by_pids(self, table: str) -> str:
        return f"SELECT * FROM {self.t(table)} WHERE persistence_id = ANY($1::text[])"

    def delete_by_pids(self, table: str) -> str:
        return f"DELETE FROM {self.t(table)} WHERE persistence_id = ANY($1::text[])"

    delete_tag_rows_of = Sql(
        "DELETE FROM {tag_views} WHERE tag_name = ANY($1::text[]) AND persistence_id = ANY($2::text[])"
    )

    pids_in = Sql("SELECT DISTINCT persistence_id FROM {event_journal} WHERE slice BETWEEN $1 AND $2 LIMIT $3")
    """Up to ``$3`` persistence ids with events in slices ``[$1, $2]``."""

    pids_after = Sql(
        "SELECT DISTINCT persistence_id FROM {event_journal} WHERE slice BETWEEN $1 AND $2 AND persistence_id > $3 "
        "ORDER BY persistence_id LIMIT $4"
    )
    """Up to ``$4`` persistence ids of slices ``[$1, $2]`` after ``$3``, in order."""

    tags_of = Sql(
        "SELECT DISTINCT unnest(tags) FROM {event_journal} WHERE persistence_id = ANY($1::text[]) AND tags IS NOT NULL"
    )
    """The tags the events of these pids ($1) carry."""

    def stage(self, table: str) -> str:
        """A session's staging table for rows copied into ``table`` (emptied at commit)."""
        return f"CREATE TEMP TABLE IF NOT EXISTS sj_stage_{table} (LIKE {self.t(table)}) ON COMMIT DELETE ROWS"

    def insert_staged(self, table: str, columns: str, conflict: str = "ON CONFLICT DO NOTHING") -> str:
        return f"INSERT INTO {self.t(table)} ({columns}) SELECT {columns} FROM sj_stage_{table} {conflict}"
