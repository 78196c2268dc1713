"""One database's part of a partitioned location's replicated logs (issue 25): its events.

A partitioned location keeps each log's state (position, version vector, progress) in its home
database (:class:`~.replication_store.PostgresReplicationStore`) and the log's events where
their slices are. This is the SQL a partitioned store runs on each of those databases: reads
bounded by the home position and filtered to the slices the database serves, the stamp and the
insert inside a transaction the caller commits before the home one, and the look past the home
position that repairs an interrupted write (``journal.partitioned.replication``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from ..vector_time import VectorTime
from . import recovery_guard
from .errors import partition_refusal
from .replication_store import PostgresReplicationStore, stamp_columns, stored_ids, vector_time_of
from .timestamp_rule import MARK_WRITER_LOCAL_SQL, delete_check_sql
from .writes import PostgresWrites


class ReplicationPart:
    """The replicated logs' events in one database of a partitioned location."""

    def __init__(self, backend: PostgresWrites, location: str) -> None:
        self.backend = backend
        self.store = PostgresReplicationStore(backend, location)
        self.sql = self.store.sql
        self.delete_check = delete_check_sql(backend.settings.schema)

    async def ensure_indexes(self, log_name: str) -> None:
        async with self.store.connection() as conn:
            await self.store.ensure_indexes(conn, log_name)

    async def above(self, log_name: str, position: int) -> tuple[int, list[VectorTime]]:
        """The log's events stamped here past ``position``: the highest position and their vector times."""
        async with self.store.connection() as conn:
            rows = await conn.fetch(self.sql.above, log_name, position)
        return max((int(r[0]) for r in rows), default=0), [vector_time_of(r[1]) for r in rows]

    async def read_log(
        self, log_name: str, after: int, upto: int, limit: int, slices: Sequence[int]
    ) -> list[asyncpg.Record]:
        async with self.store.connection() as conn:
            rows: list[asyncpg.Record] = await conn.fetch(
                self.sql.read_log_within, log_name, after, upto, limit, list(slices)
            )
        return rows

    async def read_ids(
        self, log_name: str, ids: Sequence[tuple[str, int]], upto: int, slices: Sequence[int]
    ) -> list[asyncpg.Record]:
        async with self.store.connection() as conn:
            rows: list[asyncpg.Record] = await conn.fetch(
                self.sql.read_ids_within, log_name, [i[0] for i in ids], [i[1] for i in ids], upto, list(slices)
            )
        return rows

    async def stored_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        """Those of ``ids`` stored here (in any slice: a move's copy counts)."""
        async with self.store.connection() as conn:
            return await stored_ids(conn, self.sql, log_name, ids)

    async def event_ids(self, log_name: str, slices: Sequence[int]) -> dict[tuple[str, int], int]:
        async with self.store.connection() as conn:
            rows = await conn.fetch(self.sql.event_ids_within, log_name, list(slices))
        return {(r[0], int(r[1])): int(r[2]) for r in rows}

    @contextlib.asynccontextmanager
    async def transaction(self, *, replicated: bool = False) -> AsyncIterator[Any]:
        """A transaction on this database, committed when the block ends (the caller commits its
        home transaction after every part's). ``replicated``: its rows pass the recovery guard."""
        async with self.store.connection() as conn, conn.transaction():
            if replicated:
                await conn.execute(f"{recovery_guard.MARK_REPLICATED_SQL}; {MARK_WRITER_LOCAL_SQL}")
            yield conn

    async def unstamped(
        self, conn: Any, log_name: str, limit: int, slices: Sequence[int], epoch: int
    ) -> list[asyncpg.Record]:
        """The oldest local events of the log not stamped yet, of the slices given, after the
        delete check of their slices (it takes the write lock, so a move's drain waits for this
        transaction; it refuses a range being moved, whose rows a move's copy may have taken
        already: its events are left out until the move is over)."""
        rows: list[asyncpg.Record] = await conn.fetch(self.sql.unstamped_within(log_name), limit, list(slices))
        while rows:
            try:
                async with conn.transaction():  # a savepoint: a refusal leaves the transaction usable
                    await conn.execute(self.delete_check, epoch, sorted({int(r["slice"]) for r in rows}))
                return rows
            except asyncpg.PostgresError as e:
                moved = partition_refusal(e)
                if moved is None:
                    raise
                # the refused range is being moved: its events are stamped where it lands
                kept = [r for r in rows if not moved.min_slice <= r["slice"] <= moved.max_slice]
                rows = kept if len(kept) < len(rows) else []
        return rows

    async def stamp(self, conn: Any, log_name: str, rows: Sequence[tuple[str, int, int, VectorTime]]) -> None:
        """Stamp these local events (pid, seq nr, position, vector time) as this location's."""
        await conn.execute(self.sql.stamp, *stamp_columns(self.store.location, rows))

    async def delete_logically(self, log_name: str, to: int, slices: Sequence[int], epoch: int) -> None:
        async with self.store.connection() as conn, conn.transaction():
            await conn.execute(self.delete_check, epoch, list(slices))
            await conn.execute(self.sql.delete_logically_within, log_name, to, list(slices))

    async def delete_physically(self, log_name: str, to: int, slices: Sequence[int], epoch: int) -> None:
        async with self.store.connection() as conn, conn.transaction():
            await conn.execute(self.delete_check, epoch, list(slices))
            await conn.execute(self.sql.delete_physically_within, log_name, to, list(slices))

    async def begin_recovery(self, log_names: Sequence[str]) -> None:
        """A database other than the home one: rows flagging the logs recovering (its recovery
        guard reads them; a move keeps away from a database holding them) and the guard."""
        async with self.store.connection() as conn, conn.transaction():
            for name in log_names:
                await conn.execute(self.sql.mark_recovering, name, self.store.location)
            await conn.execute(recovery_guard.install_sql(self.backend.settings.schema))

    async def end_recovery(self, log_names: Sequence[str]) -> None:
        async with self.store.connection() as conn, conn.transaction():
            for name in log_names:
                await conn.execute(self.sql.unmark_recovering, name)
            if not await conn.fetchval(self.sql.any_recovering):
                await conn.execute(recovery_guard.remove_sql(self.backend.settings.schema))
