"""SQL of the slice queries (events by slices, the horizon, the next-timestamp probe).

Built once per schema, like :mod:`journal.postgres.statements`. Identifiers come from validated
configuration; values are always parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema_sql import SchemaSql
from .statements import EVENT_COLUMNS
from .timestamp_rule import read_check


@dataclass(frozen=True)
class SliceTable:
    """A table the slice queries read: rows with (slice, entity_type, db_timestamp) and a number
    that orders a pid's rows, indexed on those, selected as :data:`~journal.backend.SLICE_ROW_COLUMNS`."""

    name: str
    columns: str
    """The select list, as the seam's row layout."""
    no_payload_columns: str
    seq: str
    """The column that orders a pid's rows (``seq_nr``; ``revision`` for durable state)."""
    delivered: str
    """The predicate of the rows a query delivers."""


EVENTS = SliceTable(
    "event_journal",
    EVENT_COLUMNS,
    EVENT_COLUMNS.replace("event_payload", "NULL::bytea AS event_payload"),
    "seq_nr",
    "deleted = false",
)


@dataclass(frozen=True)
class SliceStatements(SchemaSql):
    table: SliceTable = EVENTS

    @property
    def table_name(self) -> str:
        """The table, qualified; also as a regclass literal (a parameter, resolved by the server)."""
        return self.t(self.table.name)

    def page(self, *, with_payload: bool) -> str:
        """One page of a slice range in ``[$3, $4)``, ordered by (db_timestamp, seq_nr, pid).

        ``$2`` lists the slices: ``slice = ANY(...)`` makes one index descent per slice on
        (slice, entity_type, db_timestamp), where ``BETWEEN`` would walk every index entry of the
        whole slice range (the reference's known "BETWEEN vs IN" slowness). Rows at exactly
        ``$3`` already delivered (``$5``/``$6``: parallel arrays of pid and the highest seq_nr
        seen at that timestamp) are skipped in SQL, so a page always progresses even when more
        than a page of events share one timestamp. The time range is bounded on both sides, so
        the scan stays short far from the tail. ``$8``: the reader's partition map epoch; the
        database refuses the page if it does not serve these slices (:mod:`.timestamp_rule`).
        """
        t = self.table
        cols = t.columns if with_payload else t.no_payload_columns
        return (
            f"SELECT {cols} FROM {self.table_name} "
            "WHERE entity_type = $1 AND slice = ANY($2::int[]) "
            f"AND db_timestamp >= $3 AND db_timestamp < $4 AND {t.delivered} "
            "AND NOT (db_timestamp = $3 AND EXISTS (SELECT 1 FROM unnest($5::text[], $6::bigint[]) "
            f"AS s(pid, seq) WHERE s.pid = persistence_id AND s.seq >= {t.seq})) "
            f"AND {read_check(self.schema, '$8', '$2')} "
            f"ORDER BY db_timestamp, {t.seq}, persistence_id LIMIT $7"
        )

    @property
    def next_timestamp(self) -> str:
        """The smallest db_timestamp in ``[$4, $5)`` of the range: one index probe per slice.

        Used to jump over empty stretches of time without scanning them (so it is checked like
        a page: ``$6`` the reader's partition map epoch).
        """
        return (
            "SELECT min(t.db_timestamp) FROM generate_series($2::int, $3::int) AS s(slice) "
            "CROSS JOIN LATERAL ("
            f"SELECT e.db_timestamp FROM {self.table_name} e WHERE e.slice = s.slice "
            "AND e.entity_type = $1 AND e.db_timestamp >= $4 AND e.db_timestamp < $5 "
            f"AND {self.table.delivered} ORDER BY e.db_timestamp LIMIT 1) AS t "
            f"WHERE {read_check(self.schema, '$6', 'ARRAY(SELECT generate_series($2::int, $3::int))')}"
        )

    @property
    def horizon(self) -> str:
        """The database clock, then the in-progress writers of the table (event_journal).

        The clock (``now``) is read first (a materialized CTE; the lateral join that reads
        pg_locks depends on it, so it runs after). Writers are transactions holding a granted
        RowExclusiveLock on event_journal in this database, other than this session; their
        ``xact_start`` comes from pg_stat_activity, NULL when not visible to this role (its
        ``state`` is NULL then too) or for prepared transactions (their locks have no pid).

        pg_locks and pg_stat_activity are read one after the other, so a writer listed in one
        may have finished (or not yet begun) its transaction in the other: its activity row then
        shows a visible state with no ``xact_start``, or no row at all (the process exited).
        That writer's listed transaction either ended before the activity reading (visible to a
        later snapshot) or began after it (its timestamp is above ``now``): it is left out, not
        reported as "start not visible". ``$1``: the table, as regclass text.
        """
        return (
            "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now) "
            "SELECT c.now, w.vxid, w.pid, w.xact_start, "
            "(SELECT count(*) FROM pg_prepared_xacts) AS prepared "
            "FROM c LEFT JOIN LATERAL ("
            "SELECT l.virtualtransaction AS vxid, l.pid, a.xact_start "
            "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE c.now IS NOT NULL AND l.locktype = 'relation' "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.relation = $1::regclass AND l.mode = 'RowExclusiveLock' AND l.granted "
            "AND l.pid IS DISTINCT FROM pg_backend_pid() "
            "AND (a.xact_start IS NOT NULL OR l.pid IS NULL OR (a.pid IS NOT NULL AND a.state IS NULL))"
            ") AS w ON true"
        )

    @property
    def db_now(self) -> str:
        return "SELECT clock_timestamp()"
