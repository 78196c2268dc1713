"""Slice reads that start from snapshots (:class:`~journal.backend.SnapshotSliceReads`) on PostgreSQL.

A page is the slice page of :mod:`.slice_queries` (same window, same ``seen`` rule, same order,
same partition check) over ``event_journal`` joined with each row's pid's snapshot (the range's
snapshots saved before the catch-up's cutoff ``$13``, hashed once per page), read below a bound
``$9`` fixed when the catch-up started:

- an event whose pid's snapshot names it or a later sequence number is covered, but only when the
  event the snapshot names is stored and below the bound (a snapshot beyond the pid's last event
  covers nothing: its events come);
- the first covered event at or after the query's start (``$10``-``$12``) comes as the snapshot
  (``snap_kind`` 'replace'), the other covered events are left out: what is left out always lies
  after a delivered snapshot;
- a pid's first stored event after its snapshot, when the snapshot's own event is no longer
  stored (deleted up to the snapshot), comes with the snapshot before it (``snap_kind`` 'before').
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..backend import SliceRange, SnapshotRow, SnapshotSlicePage
from .connections import PostgresConnections
from .schema_sql import SchemaSql
from .snapshots import snapshot_row
from .statements import EVENT_COLUMNS
from .timestamp_rule import read_check

_EVENT = ", ".join(
    f"CASE WHEN x.kind = 'replace' THEN NULL ELSE x.{c} END AS {c}" if c == "event_payload" else f"x.{c}"
    for c in EVENT_COLUMNS.split(", ")
)
_SNAP_COLUMNS = (
    "seq_nr", "ser_id", "ser_manifest", "snapshot", "tags", "meta_ser_id", "meta_ser_manifest", "meta_payload",
)  # fmt: skip
_SNAP = ", ".join(f"s.{c} AS snap_{c}" for c in _SNAP_COLUMNS)


class SnapshotSliceStatements(SchemaSql):
    @property
    def page(self) -> str:
        """``$1``-``$8`` as the slice page (:meth:`.SliceStatements.page`); ``$9`` the catch-up's
        bound; ``$10``-``$12`` where the query started (its timestamp, NULL from the beginning, and
        the pids and seq_nrs seen at it); ``$13`` the snapshot cutoff.

        First the range's snapshots saved before the cutoff (``o``: the snapshot index by slice
        and entity type), each with the timestamp of the event it names and, when that lies below
        the bound, the pid's lowest stored seq_nr (a primary key lookup each), hashed once per
        page; then the window's rows joined to it by pid. Before, the named event was a lateral
        lookup memoized per row of the window: its cache probe on every row (most of them of pids
        without a snapshot) cost more than the scan itself (1M events, 3,000 snapshots: 4.6 s of
        SQL, then 1.7 s; benchmarks/README.md). The cost per page is the window's rows plus the
        range's snapshots: with a snapshot for most pids (25,000 a range) the lookups dominate.

        A covered event (seq_nr at or below its used snapshot's) is the snapshot's place when it is
        the pid's lowest stored event, or (a query with a start) when the pid's stored event before
        it lies before the start: one primary key lookup per covered row, only for a query that
        did not start from the beginning. Whether the snapshot's own event is gone ('before') is
        probed only when it is not found. The page's rows (at most ``$7``) then get the
        snapshot's columns when ``kind`` is set."""
        ej, snap = self.t("event_journal"), self.t("snapshot")
        inner = ", ".join(f"e.{c}" for c in EVENT_COLUMNS.split(", "))
        covered = "o.seq_nr >= e.seq_nr AND o.at < $9"
        before_start = (
            f"(SELECT n.db_timestamp < $10 OR (n.db_timestamp = $10 AND EXISTS (SELECT 1 FROM unnest($11::text[], "
            "$12::bigint[]) AS v(pid, seq) WHERE v.pid = n.persistence_id AND v.seq >= n.seq_nr)) "
            f"FROM {ej} n WHERE n.persistence_id = e.persistence_id AND n.seq_nr < e.seq_nr AND n.deleted = false "
            "ORDER BY n.seq_nr DESC LIMIT 1)"
        )
        return (
            "WITH o AS MATERIALIZED (SELECT o.persistence_id, o.seq_nr, o.at, CASE WHEN o.at < $9 THEN "
            f"(SELECT n.seq_nr FROM {ej} n WHERE n.persistence_id = o.persistence_id AND n.deleted = false "
            "ORDER BY n.seq_nr LIMIT 1) END AS first FROM (SELECT o.persistence_id, o.seq_nr, "
            f"(SELECT n.db_timestamp FROM {ej} n WHERE n.persistence_id = o.persistence_id AND n.seq_nr = o.seq_nr "
            f"AND n.deleted = false LIMIT 1) AS at FROM {snap} o WHERE o.entity_type = $1 AND o.slice = ANY($2::int[]) "
            "AND o.db_timestamp < $13) o) "
            f"SELECT {_EVENT}, x.kind AS snap_kind, {_SNAP} FROM (SELECT {inner}, "
            f"CASE WHEN {covered} THEN 'replace' WHEN o.seq_nr < e.seq_nr AND o.at IS NULL "
            f"AND NOT EXISTS (SELECT 1 FROM {ej} n WHERE n.persistence_id = e.persistence_id "
            "AND n.seq_nr >= o.seq_nr AND n.seq_nr < e.seq_nr AND n.deleted = false) THEN 'before' END AS kind "
            f"FROM {ej} e LEFT JOIN o ON o.persistence_id = e.persistence_id "
            "WHERE e.entity_type = $1 AND e.slice = ANY($2::int[]) AND e.db_timestamp >= $3 AND e.db_timestamp < $4 "
            "AND e.deleted = false "
            "AND NOT (e.db_timestamp = $3 AND EXISTS (SELECT 1 FROM unnest($5::text[], $6::bigint[]) AS v(pid, seq) "
            "WHERE v.pid = e.persistence_id AND v.seq >= e.seq_nr)) "
            f"AND CASE WHEN NOT COALESCE({covered}, false) OR e.seq_nr = o.first THEN true "
            f"WHEN $10::timestamptz IS NULL THEN false ELSE COALESCE({before_start}, true) END "
            f"AND {read_check(self.schema, '$8', '$2')} "
            "ORDER BY e.db_timestamp, e.seq_nr, e.persistence_id LIMIT $7) x "
            f"LEFT JOIN {snap} s ON x.kind IS NOT NULL AND s.persistence_id = x.persistence_id "
            "ORDER BY x.db_timestamp, x.seq_nr, x.persistence_id"
        )

    @property
    def cutoff(self) -> str:
        """The database clock, or the start of the earliest transaction still writing the snapshot
        table (a granted RowExclusiveLock, as the horizon reads event_journal's writers; one whose
        start this role cannot see: the epoch, no snapshot is used). A snapshot saved before it is
        committed, so every later statement sees it; one saved after it is not used by the
        catch-up."""
        return (
            "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now) "
            "SELECT least(c.now, (SELECT min(COALESCE(a.xact_start, '1970-01-01 00:00:00+00'::timestamptz)) "
            "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE c.now IS NOT NULL AND l.locktype = 'relation' "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.relation = $1::regclass AND l.mode = 'RowExclusiveLock' AND l.granted "
            "AND l.pid IS DISTINCT FROM pg_backend_pid() "
            "AND (a.xact_start IS NOT NULL OR l.pid IS NULL OR (a.pid IS NOT NULL AND a.state IS NULL)))) FROM c"
        )

    @property
    def only_snapshots(self) -> str:
        """Snapshots of the range whose pid has no stored event, by pid after ``$3``, ``$4`` at most."""
        ej = self.t("event_journal")
        return (
            "SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, "
            "ser_manifest, snapshot, tags, meta_ser_id, meta_ser_manifest, meta_payload "
            f"FROM {self.t('snapshot')} s WHERE s.entity_type = $1 AND s.slice = ANY($2::int[]) "
            f"AND s.persistence_id > $3 AND NOT EXISTS (SELECT 1 FROM {ej} e WHERE "
            "e.persistence_id = s.persistence_id AND e.deleted = false) ORDER BY s.persistence_id LIMIT $4"
        )


class PostgresSnapshotSlices:
    """:class:`~journal.backend.SnapshotSliceReads` over the backend's connections."""

    def __init__(self, conns: PostgresConnections) -> None:
        self.conns = conns
        self.sql = SnapshotSliceStatements(conns.settings.schema)
        self._page = self.sql.page
        self._only = self.sql.only_snapshots
        self._cutoff = self.sql.cutoff

    async def read_snapshot_slice_rows(self, slices: SliceRange, page: SnapshotSlicePage) -> list[Any]:
        req, seen = page.request, page.request.seen
        return await self.conns.fetch(
            "slice page from snapshots", self._page,
            slices.entity_type, list(range(slices.min_slice, slices.max_slice + 1)), req.from_timestamp,
            req.to_timestamp, list(seen.keys()), list(seen.values()), req.limit, self.conns.epoch, page.bound,
            page.start, list(page.start_seen.keys()), list(page.start_seen.values()), page.saved_before,
        )  # fmt: skip

    async def snapshot_cutoff(self) -> datetime:
        value: datetime = await self.conns.fetchval("snapshot cutoff", self._cutoff, self.sql.t("snapshot"))
        return value

    async def read_only_snapshots(self, slices: SliceRange, after: str, limit: int) -> list[SnapshotRow]:
        rows = await self.conns.fetch(
            "snapshots without events", self._only,
            slices.entity_type, list(range(slices.min_slice, slices.max_slice + 1)), after, limit,
        )  # fmt: skip
        return [snapshot_row(r) for r in rows]
