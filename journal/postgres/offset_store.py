"""The offset store's SQL, its one home: the rows of ``projection_timestamp_offset_store``.

A job that splits the slices (a projection, an event router) records there what it has done per
slice and per persistence id: a row per (slice, pid, seq_nr, timestamp) a batch delivered, and
heartbeat rows (persistence id ``''``, seq_nr 0) saying "every event of the slice before this
timestamp is done". The projections' store (:class:`projections.postgres_store.ProjectionSql`)
and the slice leases' progress (:class:`.leases.PostgresSliceLeases`) both run these statements.

Identifiers come from validated configuration and are quoted once here; values are always
parameters. Functions take an asyncpg connection so callers choose the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from .schema_sql import SchemaSql

HEARTBEAT_PID = ""
"""persistence_id of heartbeat offset rows (seq_nr 0): the slice is done up to their timestamp."""


@dataclass(frozen=True)
class OffsetRow:
    slice: int
    persistence_id: str
    seq_nr: int
    timestamp: datetime


@dataclass(frozen=True)
class LeaseFence:
    """The leases a transaction commits under: each slice of ``epochs`` held by ``owner`` at its
    epoch (``projection_slice_lease``)."""

    owner: str
    epochs: dict[int, int]


def held_leases(table: str, name: str, owner: str, slices: str) -> str:
    """The owner's lease rows of ``slices`` (each argument an SQL expression), locked ``FOR
    SHARE`` by the primary key until the transaction ends: the check of a :class:`LeaseFence`,
    alone (:meth:`LeaseSql.fence <journal.postgres.leases.LeaseSql.fence>`) or before the offset
    rows (:meth:`OffsetSql.save_offsets`)."""
    return (
        f"SELECT slice, epoch FROM {table} WHERE projection_name = {name} AND owner = {owner} "
        f"AND slice = ANY({slices}::int[]) ORDER BY slice FOR SHARE"
    )


@dataclass(frozen=True)
class OffsetSql(SchemaSql):
    """Statements of the offset rows, for one schema."""

    async def save_offsets(
        self, conn: Any, name: str, key: str, rows: Sequence[OffsetRow], notify: tuple[str, str] | None = None,
        fence: LeaseFence | None = None,
    ) -> list[int]:  # fmt: skip
        """Insert offset rows (insert-only; a repeat of an identical row is ignored). With
        ``notify`` (channel, payload), the same statement also ``pg_notify``-s it: sent when the
        transaction commits (waits for a write). With ``fence``, the same statement first locks
        the leases the transaction commits under (``FOR SHARE``, as :meth:`LeaseSql.fence
        <journal.postgres.leases.LeaseSql.fence>`) and stores nothing when one of them is no
        longer the owner's at its epoch: the slices lost are returned (empty: stored)."""
        if not rows:
            return []
        columns = (
            [r.slice for r in rows], [r.persistence_id for r in rows], [r.seq_nr for r in rows],
            [r.timestamp for r in rows],
        )  # fmt: skip
        if fence is not None:
            fenced = (fence.owner, list(fence.epochs), list(fence.epochs.values()))
            lost: list[int] = await conn.fetchval(
                self._fenced_insert(notify is not None), name, key, *columns, *fenced, *(notify or ())
            )
            if lost:
                return lost
        elif notify is not None:
            await conn.execute(
                f"WITH i AS ({self._insert()} RETURNING 1) SELECT pg_notify($7, $8)", name, key, *columns, *notify
            )
        else:
            await conn.execute(self._insert(), name, key, *columns)
        beats = [r for r in rows if r.persistence_id == HEARTBEAT_PID]
        if beats:  # only the newest heartbeat row of a slice is worth keeping
            await conn.execute(
                f"""DELETE FROM {self.t("projection_timestamp_offset_store")} s
USING unnest($2::int[], $3::timestamptz[]) AS u(sl, t)
WHERE s.slice = u.sl AND s.projection_name = $1 AND s.persistence_id = '' AND s.timestamp_offset < u.t""",
                name,
                [r.slice for r in beats],
                [r.timestamp for r in beats],
            )
        return []

    def _insert(self, where: str = "") -> str:
        """The offset rows' INSERT: $1 name, $2 key, $3-$6 the rows' columns."""
        return f"""INSERT INTO {self.t("projection_timestamp_offset_store")}
  (projection_name, projection_key, slice, persistence_id, seq_nr, timestamp_offset, timestamp_consumed)
SELECT $1, $2, u.s, u.p, u.n, u.t, clock_timestamp()
FROM unnest($3::int[], $4::text[], $5::bigint[], $6::timestamptz[]) AS u(s, p, n, t){where}
ON CONFLICT DO NOTHING"""

    def _fenced_insert(self, notify: bool) -> str:
        """The INSERT behind the lease check: $7 owner, $8 slices, $9 their epochs (then $10,
        $11 the notification). ``held``: the owner's lease rows of the slices (:func:`held_leases`,
        as the check alone reads them); ``lost``: the (slice, epoch) pairs not held (``held`` is
        read whole by the EXCEPT, so every lease row is locked)."""
        return f"""WITH held AS ({held_leases(self.t("projection_slice_lease"), "$1", "$7", "$8")}),
lost AS MATERIALIZED (
  SELECT s FROM (SELECT * FROM unnest($8::int[], $9::bigint[]) AS f(s, e) EXCEPT SELECT * FROM held) f),
i AS ({self._insert(" WHERE NOT EXISTS (SELECT 1 FROM lost)")})
SELECT array(SELECT s FROM lost ORDER BY s){", pg_notify($10, $11)" if notify else ""}"""

    async def heartbeats(self, conn: Any, name: str, slices: Sequence[int]) -> dict[int, datetime]:
        """Per slice of ``slices``: the timestamp of its newest heartbeat row (absent: none)."""
        rows = await conn.fetch(
            f"""SELECT slice, max(timestamp_offset) AS ts FROM {self.t("projection_timestamp_offset_store")}
WHERE projection_name = $1 AND slice = ANY($2::int[]) AND persistence_id = '' GROUP BY slice""",
            name,
            list(slices),
        )
        return {r["slice"]: r["ts"] for r in rows}

    async def load_offsets(
        self, conn: Any, name: str, slices: list[int], window: timedelta
    ) -> dict[int, tuple[datetime, list[tuple[str, int, datetime]]]]:
        """Per slice: its latest timestamp and the latest (pid, seq_nr, ts) within ``window``."""
        store = self.t("projection_timestamp_offset_store")
        rows = await conn.fetch(
            f"""
WITH latest AS (
  SELECT slice, max(timestamp_offset) AS ts FROM {store}
  WHERE projection_name = $1 AND slice = ANY($2::int[]) GROUP BY slice)
SELECT l.slice, l.ts AS latest, s.persistence_id, max(s.seq_nr) AS seq_nr, max(s.timestamp_offset) AS ts
FROM latest l JOIN {store} s
  ON s.slice = l.slice AND s.projection_name = $1 AND s.timestamp_offset >= l.ts - $3::interval
GROUP BY l.slice, l.ts, s.persistence_id""",
            name,
            slices,
            window,
        )
        out: dict[int, tuple[datetime, list[tuple[str, int, datetime]]]] = {}
        for r in rows:
            entry = out.setdefault(r["slice"], (r["latest"], []))
            entry[1].append((r["persistence_id"], r["seq_nr"], r["ts"]))
        return out

    async def load_pid(self, conn: Any, name: str, slice_: int, pid: str) -> tuple[int, datetime] | None:
        """The latest stored (seq_nr, timestamp) of one pid (lazy load), or None."""
        r = await conn.fetchrow(
            f"""SELECT seq_nr, timestamp_offset FROM {self.t("projection_timestamp_offset_store")}
WHERE slice = $1 AND projection_name = $2 AND persistence_id = $3 ORDER BY seq_nr DESC LIMIT 1""",
            slice_,
            name,
            pid,
        )
        return None if r is None else (r["seq_nr"], r["timestamp_offset"])

    async def offset_row_exists(self, conn: Any, name: str, row: OffsetRow) -> bool:
        """Is this offset row stored? (Did a transaction whose COMMIT got no answer commit?)"""
        found = await conn.fetchval(
            f"""SELECT 1 FROM {self.t("projection_timestamp_offset_store")}
WHERE slice = $1 AND projection_name = $2 AND timestamp_offset = $3 AND persistence_id = $4 AND seq_nr = $5""",
            row.slice,
            name,
            row.timestamp,
            row.persistence_id,
            row.seq_nr,
        )
        return found is not None

    async def prune(
        self, conn: Any, name: str, slices: list[int], delete_after: timedelta, delete_after_consumed: timedelta
    ) -> int:
        """Delete the offset rows of ``slices`` no one needs, consumed more than
        ``delete_after_consumed`` ago: those ``delete_after`` behind their slice's latest row, and
        those a later row of the same pid supersedes (validation reads only a pid's latest row).
        The latest row of a slice is neither, so it always stays."""
        store = self.t("projection_timestamp_offset_store")
        status: str = await conn.execute(
            f"""WITH latest AS (
  SELECT slice, max(timestamp_offset) AS m FROM {store}
  WHERE projection_name = $1 AND slice = ANY($2::int[]) GROUP BY slice),
newest AS (
  SELECT slice, persistence_id, max(seq_nr) AS n FROM {store}
  WHERE projection_name = $1 AND slice = ANY($2::int[]) GROUP BY slice, persistence_id HAVING count(*) > 1)
DELETE FROM {store} s USING latest l
WHERE s.projection_name = $1 AND s.slice = l.slice AND s.timestamp_consumed < clock_timestamp() - $4::interval
  AND (s.timestamp_offset < l.m - $3::interval OR EXISTS (
    SELECT 1 FROM newest p WHERE p.slice = s.slice AND p.persistence_id = s.persistence_id AND s.seq_nr < p.n))""",
            name,
            slices,
            delete_after,
            delete_after_consumed,
        )
        return int(status.split()[-1])

    async def delete_offsets(self, conn: Any, name: str, slices: list[int]) -> int:
        status: str = await conn.execute(
            f"DELETE FROM {self.t('projection_timestamp_offset_store')} "
            "WHERE projection_name = $1 AND slice = ANY($2::int[])",
            name,
            slices,
        )
        return int(status.split()[-1])

    async def slice_offsets(self, conn: Any, name: str) -> list[asyncpg.Record]:
        """Per slice: latest timestamp and when it was consumed (for status)."""
        return list(
            await conn.fetch(
                f"""SELECT slice, max(timestamp_offset) AS ts, max(timestamp_consumed) AS consumed
FROM {self.t("projection_timestamp_offset_store")} WHERE projection_name = $1 GROUP BY slice ORDER BY slice""",
                name,
            )
        )
