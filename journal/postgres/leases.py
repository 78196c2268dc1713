"""Slice leases: the live members of a named job (a projection, an event router) share its slices.

One lease row per (job, slice) in ``projection_slice_lease`` and one membership row per member in
``projection_worker``. Every round (:meth:`PostgresSliceLeases.rebalance`) a member heartbeats its
membership, renews its leases, and rebalances: live members sorted by id split the slices into
contiguous chunks (:func:`journal.ids.chunk`); a member gives away what is no longer its chunk (after its
``give_up`` callback stopped the work on it) and takes free or expired leases of its chunk. A dead
member's leases expire after the ttl and the others take its chunk. ``epoch`` grows with every
acquisition: a job whose writes must be fenced checks it under a row lock (:meth:`LeaseSql.fence`).

What a job that shares slices has done per slice is kept in the offset rows, whose statements
live in :mod:`.offset_store` (a heartbeat row says "every event of the slice before this
timestamp is done": :meth:`PostgresSliceLeases.save_progress`).
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from ..ids import NUMBER_OF_SLICES, chunk
from .offset_store import HEARTBEAT_PID, OffsetRow, OffsetSql, held_leases
from .schema_sql import SchemaSql

FORGET_DEAD_AFTER = timedelta(hours=1)
"""Membership rows of members gone this long are deleted (a failed one stays, for status)."""


@dataclass(frozen=True)
class LeaseSql(SchemaSql):
    """Statements of the leases, the membership and the offset rows, for one schema. Functions
    take an asyncpg connection, so callers choose the transaction."""

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
        """Extend every lease ``owner`` holds; return slice -> epoch of what it still holds. The rows
        are locked in slice order first, then updated by key (no join: see :meth:`acquire_leases`)."""
        lease = self.t("projection_slice_lease")
        rows = await conn.fetch(
            f"""UPDATE {lease} SET expires_at = clock_timestamp() + $3::interval
WHERE projection_name = $1 AND slice = ANY(ARRAY(
  SELECT slice FROM {lease} WHERE projection_name = $1 AND owner = $2 ORDER BY slice FOR UPDATE))
RETURNING slice, epoch""",
            name,
            owner,
            ttl,
        )
        return {r["slice"]: r["epoch"] for r in rows}

    async def acquire_leases(
        self, conn: Any, name: str, owner: str, slices: list[int], ttl: timedelta
    ) -> dict[int, int]:
        """Take the free or expired leases among ``slices`` (never waits on a busy row): locked in
        slice order first, then updated by key. A join of the locked rows back to the table was
        planned, on a job's fresh rows (no statistics yet), as a scan of the job's 1,024 rows per
        locked row: a round of 1,024 leases took 0.8-1.7 s (tests/test_projection_runner.py)."""
        lease = self.t("projection_slice_lease")
        rows = await conn.fetch(
            f"""UPDATE {lease} SET owner = $2, epoch = epoch + 1, expires_at = clock_timestamp() + $4::interval
WHERE projection_name = $1 AND slice = ANY(ARRAY(
  SELECT slice FROM {lease} WHERE projection_name = $1 AND slice = ANY($3::int[])
    AND (owner IS NULL OR expires_at < clock_timestamp())
  ORDER BY slice FOR UPDATE SKIP LOCKED))
RETURNING slice, epoch""",
            name,
            owner,
            slices,
            ttl,
        )
        return {r["slice"]: r["epoch"] for r in rows}

    async def lock_job(self, conn: Any, name: str) -> None:
        """Inside a transaction: wait for the job's other members' acquisitions to commit (an
        advisory lock on the job's name, released at the end of the transaction)."""
        key = zlib.crc32(f"slice_journal.leases.{self.schema}".encode()) - 2**31
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", key, name)

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
        rows = await conn.fetch(held_leases(self.t("projection_slice_lease"), "$1", "$2", "$3"), name, owner, slices)
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

    # -- members -----------------------------------------------------------------------------

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


class PostgresSliceLeases:
    """One member of the job ``name`` (:class:`~journal.backend.SliceLeases`), over ``pool``."""

    def __init__(
        self, pool: Callable[[], asyncpg.Pool], schema: str, name: str, owner: str, ttl: float,
        slice_count: int = NUMBER_OF_SLICES,
    ) -> None:  # fmt: skip
        """``pool``: returns the pool to use (the journal's, or a worker's own)."""
        self._pool = pool
        self.sql = LeaseSql(schema)
        self.offsets = OffsetSql(schema)
        self.name = name
        self.owner = owner
        self.ttl = timedelta(seconds=ttl)
        self.slice_count = slice_count
        self.held: dict[int, int] = {}
        """Slice -> epoch of the leases held after the last round."""
        self.members: tuple[str, ...] = ()
        """The live members the last round saw (a change quickens the next rounds:
        :mod:`projections.worker`)."""
        self._forgot_dead_at = 0.0

    async def join(self) -> None:
        """Count as a live member at once (members that start together see each other in their
        first round), and create the job's lease rows if they are missing."""
        async with self._pool().acquire() as conn:
            await self.sql.heartbeat_worker(
                conn, self.name, self.owner, socket.gethostname(), os.getpid(), self.ttl, "running", 0, None
            )
            await self.sql.ensure_leases(conn, self.name, self.slice_count)

    async def rebalance(
        self,
        give_up: Callable[[set[int]], Awaitable[None]],
        *,
        events: int = 0,
        error: str | None = None,
    ) -> Mapping[int, int]:
        """One round: heartbeat, renew, give away (after ``give_up`` stopped the work on those
        slices, and on slices lost to an expiry), take free leases of this member's chunk.
        Returns slice -> epoch of what is held now."""
        pool = self._pool()
        async with pool.acquire() as conn:
            await self.sql.heartbeat_worker(
                conn, self.name, self.owner, socket.gethostname(), os.getpid(), self.ttl, "running", events, error
            )
            members = await self.sql.live_workers(conn, self.name)
            self.members = tuple(members)
            held = await self.sql.renew_leases(conn, self.name, self.owner, self.ttl)
            if time.monotonic() - self._forgot_dead_at > FORGET_DEAD_AFTER.total_seconds() / 4:
                self._forgot_dead_at = time.monotonic()
                await self.sql.forget_dead_workers(conn, self.name, FORGET_DEAD_AFTER)
        desired: set[int] = set()
        if self.owner in members:
            desired = set(chunk(members.index(self.owner), len(members), self.slice_count))
        lost = {s for s, e in self.held.items() if held.get(s) != e}
        give = set(held) - desired
        if lost or give:
            await give_up(lost | give)
        if give:
            async with pool.acquire() as conn:
                await self.sql.release_leases(conn, self.name, self.owner, sorted(give))
            for s in give:
                held.pop(s, None)
        if desired - set(held):
            async with pool.acquire() as conn, conn.transaction():
                # one member of the job acquires at a time, after reading the members again: two
                # members that start at once (one of them saw itself alone above) would otherwise
                # take interleaved slices of the same chunk, skipping each other's locked rows
                await self.sql.lock_job(conn, self.name)
                members = await self.sql.live_workers(conn, self.name)
                mine = chunk(members.index(self.owner), len(members), self.slice_count) if self.owner in members else ()
                desired &= set(mine)
                want = sorted(desired - set(held))
                if want:
                    held.update(await self.sql.acquire_leases(conn, self.name, self.owner, want, self.ttl))
        self.held = held
        return held

    async def leave(self, *, state: str = "stopped", events: int = 0, error: str | None = None) -> None:
        """Release every lease and record the member's last state (it stops counting as live)."""
        async with self._pool().acquire() as conn:
            await self.sql.release_leases(conn, self.name, self.owner, None)
            await self.sql.heartbeat_worker(
                conn, self.name, self.owner, socket.gethostname(), os.getpid(), timedelta(0), state, events, error
            )
        self.held = {}

    async def save_progress(self, key: str, done: Mapping[int, datetime]) -> None:
        """Record per slice that every event before its timestamp is done (heartbeat rows of
        the offset store under ``key``, the job's name for that stream)."""
        rows = [OffsetRow(s, HEARTBEAT_PID, 0, ts) for s, ts in done.items()]
        async with self._pool().acquire() as conn:
            await self.offsets.save_offsets(conn, key, f"{min(done)}-{max(done)}" if done else "", rows)

    async def load_progress(self, key: str, slices: Sequence[int]) -> dict[int, datetime]:
        async with self._pool().acquire() as conn:
            return await self.offsets.heartbeats(conn, key, slices)
