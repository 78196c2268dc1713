"""Every SQL statement of the projections: the offset store (its statements have one home,
:class:`journal.postgres.OffsetSql`, shared with other jobs that split the slices: event
routers) and management. The leases and the workers' membership are shared too:
:class:`journal.postgres.leases.LeaseSql`, here as :attr:`ProjectionSql.leases`.

Identifiers come from validated configuration and are quoted once here; values are always
parameters. Functions take an asyncpg connection so callers choose the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from journal.postgres import HEARTBEAT_PID, LeaseSql, OffsetRow, OffsetSql

__all__ = ["HEARTBEAT_PID", "OffsetRow", "ProjectionSql"]


@dataclass(frozen=True)
class ProjectionSql(OffsetSql):
    """Statements for one schema: the offset store's, and the projections' own."""

    leases: LeaseSql = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "leases", LeaseSql(self.schema))

    async def now(self, conn: Any) -> datetime:
        """The database clock (lag is measured against it, not against this host's clock)."""
        now: datetime = await conn.fetchval("SELECT clock_timestamp()")
        return now

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
VALUES ($1, $2, $3, (extract(epoch FROM now()) * 1000)::bigint)
ON CONFLICT (projection_name, projection_key) DO UPDATE SET paused = $3, last_updated = EXCLUDED.last_updated""",
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
