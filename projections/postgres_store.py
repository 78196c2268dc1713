"""Every SQL statement of the projections: the offset store (its statements have one home,
:class:`journal.postgres.OffsetSql`, shared with other jobs that split the slices: event
routers) and management. The leases and the workers' membership are shared too:
:class:`journal.postgres.leases.LeaseSql`, here as :attr:`ProjectionSql.leases`.

Identifiers come from validated configuration and are quoted once here; values are always
parameters. Functions take an asyncpg connection so callers choose the transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from journal.ids import NUMBER_OF_SLICES, entity_type_of
from journal.postgres import HEARTBEAT_PID, LeaseFence, LeaseSql, OffsetRow, OffsetSql

__all__ = ["HEARTBEAT_PID", "OffsetRow", "ProjectionSql", "offsets_channel", "offsets_payload"]


def offsets_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which a projection's offset transaction announces its
    commit (payload: :func:`offsets_payload`); :mod:`projections.write_waits` listens on it."""
    return f"slice_journal_offsets.{schema}"


NOTIFIED_ROWS = 100
"""Up to this many offset rows a batch's notification carries (a waiter needs no query); a
larger batch's names only the projection (the waiters look its rows up)."""


def offsets_payload(name: str, rows: Sequence[OffsetRow]) -> str:
    """JSON ``[name, [[pid, seq_nr], ...]]``, or ``[name]`` for a batch over :data:`NOTIFIED_ROWS`
    (a notification's payload is at most 8000 bytes)."""
    stored = [[r.persistence_id, r.seq_nr] for r in rows if r.persistence_id != HEARTBEAT_PID]
    if len(stored) <= NOTIFIED_ROWS:
        payload = json.dumps([name, stored], separators=(",", ":"))
        if len(payload.encode()) < 7900:
            return payload
    return json.dumps([name])


@dataclass(frozen=True)
class ProjectionSql(OffsetSql):
    """Statements for one schema: the offset store's, and the projections' own."""

    leases: LeaseSql = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "leases", LeaseSql(self.schema))

    async def save_offsets(
        self, conn: Any, name: str, key: str, rows: Sequence[OffsetRow], notify: tuple[str, str] | None = None,
        fence: LeaseFence | None = None,
    ) -> list[int]:  # fmt: skip
        """The offset rows of a batch, announced on :func:`offsets_channel` at commit when they
        name persistence ids (not heartbeats only): :func:`offsets_payload`."""
        if notify is None and any(r.persistence_id != HEARTBEAT_PID for r in rows):
            notify = (offsets_channel(self.schema), offsets_payload(name, rows))
        return await super().save_offsets(conn, name, key, rows, notify, fence)

    async def processed(self, conn: Any, name: str, targets: Sequence[tuple[int, str]]) -> dict[str, int]:
        """The highest seq_nr stored for each ``(slice, pid)`` of ``targets`` (absent: none)."""
        rows = await conn.fetch(
            f"""SELECT u.p, (SELECT max(s.seq_nr) FROM {self.t("projection_timestamp_offset_store")} s
  WHERE s.slice = u.s AND s.projection_name = $1 AND s.persistence_id = u.p) AS n
FROM unnest($2::int[], $3::text[]) AS u(s, p)""",
            name,
            [s for s, _ in targets],
            [p for _, p in targets],
        )
        return {r["p"]: r["n"] for r in rows if r["n"] is not None}

    async def projected_entity_type(self, conn: Any, name: str) -> str | None:
        """The entity type of a persistence id the projection has processed (None: none yet)."""
        pid: str | None = await conn.fetchval(
            f"""SELECT persistence_id FROM {self.t("projection_timestamp_offset_store")}
WHERE slice = ANY($2::int[]) AND projection_name = $1 AND persistence_id <> '' LIMIT 1""",
            name,
            list(range(NUMBER_OF_SLICES)),
        )
        return None if pid is None else entity_type_of(pid)

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
        return await self._pending(conn, "event_journal", " AND NOT e.deleted", entity_type, offsets, cap)

    async def pending_states(
        self, conn: Any, entity_type: str, offsets: dict[int, datetime | None], cap: int
    ) -> tuple[int, datetime | None, datetime]:
        """As :meth:`pending_events` for a state projection: the states of ``entity_type`` changed
        after each slice's offset (a tombstone is a change), by ``durable_state_slice_idx``."""
        return await self._pending(conn, "durable_state", "", entity_type, offsets, cap)

    async def _pending(
        self, conn: Any, table: str, where: str, entity_type: str, offsets: dict[int, datetime | None], cap: int
    ) -> tuple[int, datetime | None, datetime]:
        rows = self.t(table)
        row = await conn.fetchrow(
            f"""
WITH o AS (SELECT * FROM unnest($2::int[], $3::timestamptz[]) AS o(slice, ts))
SELECT
  coalesce(sum((SELECT count(*) FROM (SELECT 1 FROM {rows} e WHERE e.slice = o.slice AND e.entity_type = $1
    AND e.db_timestamp > o.ts{where} LIMIT $4) n)), 0) AS pending,
  min((SELECT min(e.db_timestamp) FROM {rows} e WHERE e.slice = o.slice AND e.entity_type = $1
    AND e.db_timestamp > o.ts{where})) AS oldest,
  clock_timestamp() AS now
FROM o""",
            entity_type,
            list(offsets),
            [datetime.min.replace(tzinfo=UTC) if ts is None else ts for ts in offsets.values()],
            cap,
        )
        return int(row["pending"]), row["oldest"], row["now"]

    async def is_known(self, conn: Any, name: str) -> bool:
        """Has projection ``name`` run here (a worker, an offset or a pause stored)? Index probes,
        unlike :meth:`projection_names`."""
        known: bool = await conn.fetchval(
            f"""SELECT EXISTS (SELECT 1 FROM {self.t("projection_worker")} WHERE projection_name = $1)
  OR EXISTS (SELECT 1 FROM {self.t("projection_timestamp_offset_store")}
    WHERE slice = ANY($2::int[]) AND projection_name = $1)
  OR EXISTS (SELECT 1 FROM {self.t("projection_management")} WHERE projection_name = $1)""",
            name,
            list(range(NUMBER_OF_SLICES)),
        )
        return known

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
