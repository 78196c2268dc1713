"""Every SQL statement of the projections: offset store and management. The leases, the
workers' membership and the offset rows' insert are shared with other jobs that split the slices
(event routers): :class:`journal.postgres.leases.LeaseSql`, here as :attr:`ProjectionSql.leases`.

Identifiers come from validated configuration and are quoted once here; values are always
parameters. Functions take an asyncpg connection so callers choose the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from journal.postgres import HEARTBEAT_PID, LeaseSql, OffsetRow
from journal.settings import validate_identifier

__all__ = ["HEARTBEAT_PID", "OffsetRow", "ProjectionSql"]


@dataclass(frozen=True)
class ProjectionSql:
    """Statements for one schema."""

    schema: str
    leases: LeaseSql = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_identifier(self.schema, "schema")
        object.__setattr__(self, "leases", LeaseSql(self.schema))

    def t(self, name: str) -> str:
        return f'"{self.schema}".{name}'

    # -- offset store ------------------------------------------------------------------------

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

    async def backend_busy(self, conn: Any, pid: int, app: str | None) -> bool:
        """Is this server process (of the pool we run on, by application_name) still running a statement?"""
        found = await conn.fetchval(
            "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND ($2::text IS NULL OR application_name = $2) "
            "AND state = 'active'",
            pid,
            app,
        )
        return found is not None

    async def terminate_backend(self, conn: Any, pid: int, app: str | None) -> None:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid = $1 AND ($2::text IS NULL OR application_name = $2)",
            pid,
            app,
        )

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

    async def save_offsets(self, conn: Any, name: str, key: str, rows: list[OffsetRow]) -> None:
        """Insert offset rows (insert-only; a repeat of an identical row is ignored)."""
        await self.leases.save_offsets(conn, name, key, rows)

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

    async def now(self, conn: Any) -> datetime:
        """The database clock (lag is measured against it, not against this host's clock)."""
        now: datetime = await conn.fetchval("SELECT clock_timestamp()")
        return now

    async def slice_offsets(self, conn: Any, name: str) -> list[asyncpg.Record]:
        """Per slice: latest timestamp and when it was consumed (for status)."""
        return list(
            await conn.fetch(
                f"""SELECT slice, max(timestamp_offset) AS ts, max(timestamp_consumed) AS consumed
FROM {self.t("projection_timestamp_offset_store")} WHERE projection_name = $1 GROUP BY slice ORDER BY slice""",
                name,
            )
        )

    async def pending_events(
        self, conn: Any, entity_type: str, offsets: dict[int, datetime | None], cap: int
    ) -> tuple[int, datetime | None, datetime]:
        """Events of ``entity_type`` after each slice's offset (counted up to ``cap`` per slice),
        the oldest such event's timestamp, and the database clock (for the lag metrics).
        Index probes of ``event_journal_slice_idx`` per slice: cheap enough to sample every few seconds."""
        journal = self.t("event_journal")
        row = await conn.fetchrow(
            f"""
WITH o AS (SELECT * FROM unnest($2::int[], $3::timestamptz[]) AS o(slice, ts))
SELECT
  coalesce(sum((SELECT count(*) FROM (SELECT 1 FROM {journal} e WHERE e.slice = o.slice AND e.entity_type = $1
    AND e.db_timestamp > o.ts AND NOT e.deleted LIMIT $4) n)), 0) AS pending,
  min((SELECT min(e.db_timestamp) FROM {journal} e WHERE e.slice = o.slice AND e.entity_type = $1
    AND e.db_timestamp > o.ts AND NOT e.deleted)) AS oldest,
  clock_timestamp() AS now
FROM o""",
            entity_type,
            list(offsets),
            [datetime.min.replace(tzinfo=UTC) if ts is None else ts for ts in offsets.values()],
            cap,
        )
        return int(row["pending"]), row["oldest"], row["now"]

    async def projection_names(self, conn: Any) -> list[str]:
        rows = await conn.fetch(
            f"""SELECT projection_name FROM {self.t("projection_timestamp_offset_store")}
UNION SELECT projection_name FROM {self.t("projection_worker")}
UNION SELECT projection_name FROM {self.t("projection_management")} ORDER BY 1"""
        )
        return [r[0] for r in rows]

    # -- management --------------------------------------------------------------------------

    async def set_paused(self, conn: Any, name: str, key: str, paused: bool) -> None:
        await conn.execute(
            f"""INSERT INTO {self.t("projection_management")} (projection_name, projection_key, paused, last_updated)
VALUES ($1, $2, $3, now())
ON CONFLICT (projection_name, projection_key) DO UPDATE SET paused = $3, last_updated = now()""",
            name,
            key,
            paused,
        )

    async def paused_keys(self, conn: Any, name: str) -> list[str]:
        rows = await conn.fetch(
            f"SELECT projection_key FROM {self.t('projection_management')} WHERE projection_name = $1 AND paused",
            name,
        )
        return [r[0] for r in rows]
