"""Every SQL statement of the projections: offset store, management, leases, workers.

Identifiers come from validated configuration and are quoted once here; values are always
parameters. Functions take an asyncpg connection so callers choose the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from journal.settings import validate_identifier

HEARTBEAT_PID = ""
"""persistence_id of heartbeat offset rows (seq_nr 0): the slice is done up to their timestamp."""


@dataclass(frozen=True)
class OffsetRow:
    slice: int
    persistence_id: str
    seq_nr: int
    timestamp: datetime


@dataclass(frozen=True)
class ProjectionSql:
    """Statements for one schema."""

    schema: str

    def __post_init__(self) -> None:
        validate_identifier(self.schema, "schema")

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
        """Is this server process (of our own pool, by application_name) still running a statement?"""
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
        if not rows:
            return
        await conn.execute(
            f"""INSERT INTO {self.t("projection_timestamp_offset_store")}
  (projection_name, projection_key, slice, persistence_id, seq_nr, timestamp_offset, timestamp_consumed)
SELECT $1, $2, u.s, u.p, u.n, u.t, clock_timestamp()
FROM unnest($3::int[], $4::text[], $5::bigint[], $6::timestamptz[]) AS u(s, p, n, t)
ON CONFLICT DO NOTHING""",
            name,
            key,
            [r.slice for r in rows],
            [r.persistence_id for r in rows],
            [r.seq_nr for r in rows],
            [r.timestamp for r in rows],
        )
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

    # -- leases ------------------------------------------------------------------------------

    async def ensure_leases(self, conn: Any, name: str, slices: int) -> None:
        await conn.execute(
            f"""INSERT INTO {self.t("projection_slice_lease")} (projection_name, slice, owner, epoch, expires_at)
SELECT $1, s, NULL, 0, '-infinity' FROM generate_series(0, $2 - 1) AS s
ON CONFLICT DO NOTHING""",
            name,
            slices,
        )

    async def renew_leases(self, conn: Any, name: str, owner: str, ttl: timedelta) -> dict[int, int]:
        """Extend every lease ``owner`` holds; return slice -> epoch of what it still holds."""
        lease = self.t("projection_slice_lease")
        rows = await conn.fetch(
            f"""UPDATE {lease} l SET expires_at = clock_timestamp() + $3::interval
FROM (SELECT slice FROM {lease} WHERE projection_name = $1 AND owner = $2 ORDER BY slice FOR UPDATE) x
WHERE l.projection_name = $1 AND l.slice = x.slice RETURNING l.slice, l.epoch""",
            name,
            owner,
            ttl,
        )
        return {r["slice"]: r["epoch"] for r in rows}

    async def acquire_leases(
        self, conn: Any, name: str, owner: str, slices: list[int], ttl: timedelta
    ) -> dict[int, int]:
        """Take the free or expired leases among ``slices`` (never waits on a busy row)."""
        lease = self.t("projection_slice_lease")
        rows = await conn.fetch(
            f"""UPDATE {lease} l SET owner = $2, epoch = l.epoch + 1, expires_at = clock_timestamp() + $4::interval
FROM (SELECT slice FROM {lease} WHERE projection_name = $1 AND slice = ANY($3::int[])
        AND (owner IS NULL OR expires_at < clock_timestamp())
      ORDER BY slice FOR UPDATE SKIP LOCKED) x
WHERE l.projection_name = $1 AND l.slice = x.slice RETURNING l.slice, l.epoch""",
            name,
            owner,
            slices,
            ttl,
        )
        return {r["slice"]: r["epoch"] for r in rows}

    async def release_leases(self, conn: Any, name: str, owner: str, slices: list[int] | None) -> None:
        await conn.execute(
            f"""UPDATE {self.t("projection_slice_lease")} SET owner = NULL, expires_at = '-infinity'
WHERE projection_name = $1 AND owner = $2 AND ($3::int[] IS NULL OR slice = ANY($3::int[]))""",
            name,
            owner,
            slices,
        )

    async def fence(self, conn: Any, name: str, owner: str, epochs: dict[int, int]) -> list[int]:
        """Inside the offset transaction: lock the leases of ``epochs`` (FOR SHARE) and return the
        slices that are no longer ours at that epoch (empty: the transaction may commit)."""
        slices = sorted(epochs)
        rows = await conn.fetch(
            f"""SELECT slice, epoch FROM {self.t("projection_slice_lease")}
WHERE projection_name = $1 AND owner = $2 AND slice = ANY($3::int[]) ORDER BY slice FOR SHARE""",
            name,
            owner,
            slices,
        )
        ok = {r["slice"] for r in rows if epochs.get(r["slice"]) == r["epoch"]}
        return [s for s in slices if s not in ok]

    async def lease_owners(self, conn: Any, name: str) -> list[asyncpg.Record]:
        return list(
            await conn.fetch(
                f"""SELECT slice, owner, epoch, expires_at > clock_timestamp() AS live
FROM {self.t("projection_slice_lease")} WHERE projection_name = $1 ORDER BY slice""",
                name,
            )
        )

    # -- workers -----------------------------------------------------------------------------

    async def heartbeat_worker(
        self, conn: Any, name: str, worker_id: str, host: str, pid: int, ttl: timedelta,
        state: str, events: int, error: str | None,
    ) -> None:  # fmt: skip
        await conn.execute(
            f"""INSERT INTO {self.t("projection_worker")}
  (projection_name, worker_id, host, pid, started_at, expires_at, state, events, error)
VALUES ($1, $2, $3, $4, clock_timestamp(), clock_timestamp() + $5::interval, $6, $7, $8)
ON CONFLICT (projection_name, worker_id) DO UPDATE
SET expires_at = EXCLUDED.expires_at, state = $6, events = $7, error = $8""",
            name, worker_id, host, pid, ttl, state, events, error,
        )  # fmt: skip

    async def live_workers(self, conn: Any, name: str) -> list[str]:
        rows = await conn.fetch(
            f"""SELECT worker_id FROM {self.t("projection_worker")}
WHERE projection_name = $1 AND state = 'running' AND expires_at > clock_timestamp() ORDER BY worker_id""",
            name,
        )
        return [r[0] for r in rows]

    async def workers(self, conn: Any, name: str) -> list[asyncpg.Record]:
        return list(
            await conn.fetch(
                f"""SELECT worker_id, host, pid, started_at, state, events, error,
  expires_at > clock_timestamp() AS live
FROM {self.t("projection_worker")} WHERE projection_name = $1 ORDER BY started_at""",
                name,
            )
        )

    async def forget_dead_workers(self, conn: Any, name: str, older_than: timedelta) -> None:
        await conn.execute(
            f"""DELETE FROM {self.t("projection_worker")} WHERE projection_name = $1
AND state <> 'failed' AND expires_at < clock_timestamp() - $2::interval""",
            name,
            older_than,
        )
