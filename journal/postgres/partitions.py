"""One database's part of the partition map, and the row work of a move (copy, drain, removal).

The partitioned journal (:mod:`journal.partitioned`) composes one PostgreSQL backend per
database; what it needs of a database beyond the seam lives here: reading and changing this
database's ``slice_partition`` rows, the owner check on its own, listing and waiting out the
writers in progress, and copying or removing a slice range's rows (every table that follows its
slice). SQL in :mod:`.partition_statements`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from ..errors import ConfigurationError, JournalUnavailable
from .connections import PostgresConnections
from .partition_statements import PartitionStatements
from .timestamp_rule import MARK_WRITER_LOCAL_SQL

T = TypeVar("T")

OWNED, MOVING, FENCED, MOVED, INCOMING = "owned", "moving", "fenced", "moved", "incoming"
SERVING = (OWNED, MOVING, FENCED)
"""States in which a database serves a range (reads; writes too unless fenced)."""


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """A slice range as one database records it (see ``journal.postgres.schema.slice_partition``)."""

    min_slice: int
    max_slice: int
    state: str
    epoch: int
    location: str | None = None
    floor: datetime | None = None


@dataclass(frozen=True, slots=True)
class MoveRecord:
    """A move of a range out of this database, as far as it got."""

    min_slice: int
    max_slice: int
    target: str
    epoch: int
    step: str
    copied_to: datetime | None


class PostgresPartitions:
    """The partition map rows and the move work of one database (over the backend's connections)."""

    def __init__(self, conns: PostgresConnections) -> None:
        self.conns = conns
        self.sql = PartitionStatements(conns.settings.schema)
        self._columns: dict[str, list[str]] = {}

    async def _run(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        return await self.conns.run(what, fn)

    # -- the map ------------------------------------------------------------------------------

    async def rows(self) -> list[PartitionRow]:
        return [PartitionRow(*r) for r in await self.conns.fetch("partition map", self.sql.rows)]

    async def claim(self, min_slice: int, max_slice: int) -> list[PartitionRow]:
        """Record that this database serves ``[min_slice, max_slice]`` (its range in the layout of
        ``partitions.databases``) unless its map already has rows; refuse a database that holds
        events of other slices (its data was written with another layout)."""

        async def op(conn: Any) -> list[PartitionRow]:
            async with conn.transaction():
                await conn.execute(self.sql.lock_map)
                rows = [PartitionRow(*r) for r in await conn.fetch(self.sql.rows)]
                if rows:
                    return rows
                if await conn.fetchval(self.sql.events_outside, min_slice, max_slice):
                    raise ConfigurationError(
                        f"this database holds events of slices outside {min_slice}-{max_slice}, its range in "
                        "partitions.databases: it was written with another layout (a count or order of "
                        "databases that changed); move ranges with `journal partitions move` instead"
                    )
                await conn.execute(self.sql.insert_row, min_slice, max_slice, OWNED, 0, None, None)
                return [PartitionRow(min_slice, max_slice, OWNED, 0)]

        return await self._run("claim slices", op)

    async def set_range(
        self, min_slice: int, max_slice: int, state: str, epoch: int, location: str | None = None,
        floor: datetime | None = None, *, expect: Sequence[str | None] = (), keep: Sequence[str] = (),
        on: asyncpg.Connection | None = None,
    ) -> PartitionRow:  # fmt: skip
        """Give ``[min_slice, max_slice]`` this state: the row that covers it is split around it
        (its other slices keep their row), or a row is added where none covers it. ``expect``:
        the states the range may be in now (None: no row); anything else is refused. ``keep``:
        states in which the range is left as it is (a step that another process did already).
        ``on``: on this connection (a move's own session, which holds its locks: if that session
        is gone, the change fails rather than being made by a move that no longer holds them)."""

        async def op(conn: Any) -> PartitionRow:
            async with conn.transaction():
                await conn.execute(self.sql.lock_map)
                rows = [PartitionRow(*r) for r in await conn.fetch(self.sql.rows)]
                touching = [r for r in rows if r.min_slice <= max_slice and r.max_slice >= min_slice]
                now = touching[0].state if len(touching) == 1 else None
                if len(touching) > 1 or (
                    touching and (touching[0].min_slice > min_slice or touching[0].max_slice < max_slice)
                ):
                    raise ConfigurationError(
                        f"slices {min_slice}-{max_slice} are not one range of this database's map "
                        f"({', '.join(f'{r.min_slice}-{r.max_slice} {r.state}' for r in touching)})"
                    )
                if expect and now not in expect:
                    raise ConfigurationError(
                        f"slices {min_slice}-{max_slice} are {now or 'not in the map'} here, "
                        f"expected {' or '.join(str(e) for e in expect)}"
                    )
                if touching and now in keep:
                    return touching[0]
                if touching:
                    old = touching[0]
                    await conn.execute(self.sql.delete_rows, [old.min_slice])
                    for lo, hi in ((old.min_slice, min_slice - 1), (max_slice + 1, old.max_slice)):
                        if lo <= hi:
                            await conn.execute(
                                self.sql.insert_row, lo, hi, old.state, old.epoch, old.location, old.floor
                            )
                await conn.execute(self.sql.insert_row, min_slice, max_slice, state, epoch, location, floor)
                return PartitionRow(min_slice, max_slice, state, epoch, location, floor)

        if on is None:
            return await self._run("change the partition map", op)
        try:
            return await op(on)
        except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError) as e:
            raise JournalUnavailable(
                f"the move's own session on the source was lost ({e}); nothing was changed: run the move again"
            ) from e

    async def check(self, epoch: int, slices: Sequence[int], mode: str) -> None:
        """The owner check on its own: raises :class:`~journal.errors.SliceRangeMoved` unless
        this database serves ``slices`` for ``mode`` (read, write, delete) at ``epoch``."""
        await self.conns.fetch("owner check", self.sql.check, epoch, list(slices), mode)

    async def in_deleting_transaction(self, epoch: int, slices: Sequence[int], fn: Callable[[Any], Awaitable[T]]) -> T:
        """``fn(conn)`` in a transaction that first passes the owner check for deletes (it takes
        the write lock, so a move's drain waits for it; a moving range's deletes are refused)."""

        async def op(conn: Any) -> T:
            async with conn.transaction():
                await conn.execute(self.sql.delete_check, epoch, list(slices))
                return await fn(conn)

        return await self._run("delete", op)

    async def has_replication(self) -> bool:
        return bool(await self.conns.fetchval("replication logs", self.sql.has_replication))

    async def events_inside(self, min_slice: int, max_slice: int) -> bool:
        return bool(await self.conns.fetchval("events of a range", self.sql.events_inside, min_slice, max_slice))

    # -- the mover, the fence and the drain -------------------------------------------------

    async def hold_mover(self, min_slice: int, max_slice: int, patience: float) -> asyncpg.Connection:
        """A connection of its own holding the range's mover lock, for as long as the move runs
        (session level, with TCP keepalives: it lapses with the mover, and a process waiting for
        the range then finishes or undoes what the move left: :meth:`lapse_fence`,
        :meth:`finish_switch`). Refused while another live move of the range holds it."""
        conn = await asyncpg.connect(self.conns.dsn, timeout=self.conns.settings.connection.connect_timeout)
        try:
            await conn.fetchrow(self.sql.keepalive)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + patience
            while not await conn.fetchval(self.sql.try_lock, self.sql.mover_key, min_slice):
                if loop.time() > deadline:
                    pid = await self.mover(min_slice)
                    raise ConfigurationError(
                        f"another move of slices {min_slice}-{max_slice} is running (its session on the source "
                        f"is server process {pid}): let it finish, or stop it and run the move again"
                    )
                await asyncio.sleep(0.05)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def fence(self, mover: asyncpg.Connection, min_slice: int, on: bool) -> None:
        """Take (``on``) or give back the range's fence lock on the mover's own connection
        (while it holds it, the range's writes wait; it lapses with that connection)."""
        await mover.execute(self.sql.lock_fence if on else self.sql.unlock_fence, self.sql.fence_key, min_slice)

    async def mover(self, min_slice: int) -> int | None:
        """The server process of the live move of the range starting at ``min_slice`` (None: no
        move of it is running)."""
        keys = (self.sql.mover_key % 2**32, min_slice)
        pid: int | None = await self.conns.fetchval("mover", self.sql.holder, *keys)
        return pid

    async def lapse_fence(self, min_slice: int) -> bool:
        """Undo the fence of a move that is gone: the range, ``fenced`` here with no live mover,
        goes back to ``moving`` (writable here again; its copy so far is kept) and the move's
        record says ``fence lapsed``. One transaction holding the mover lock, so no move of the
        range starts meanwhile. False: a live move holds the range, or it is not fenced here."""

        async def op(conn: Any) -> bool:
            async with conn.transaction():
                if not await conn.fetchval(self.sql.try_xact_lock, self.sql.mover_key, min_slice):
                    return False
                await conn.execute(self.sql.lock_map)
                if not await conn.fetchval(self.sql.refence, min_slice, FENCED, MOVING):
                    return False
                await conn.execute(self.sql.save_step, min_slice, "fence lapsed")
                return True

        return await self._run("undo a lapsed fence", op)

    async def abandon_move(self, min_slice: int) -> bool:
        """Give up a move that is gone before its fence (the range ``moving`` here, no live
        mover): the range is ``owned`` here again and the move record goes, so its deletes
        (which a move's copy makes wait) go on; the target's copies stay unserved, ``incoming``
        (the next move of the range removes them first). False: a live move holds the range, or
        it is not moving here."""

        async def op(conn: Any) -> bool:
            async with conn.transaction():
                if not await conn.fetchval(self.sql.try_xact_lock, self.sql.mover_key, min_slice):
                    return False
                await conn.execute(self.sql.lock_map)
                if not await conn.fetchval(self.sql.give_back, min_slice):
                    return False
                await conn.execute(self.sql.end_move, min_slice)
                return True

        return await self._run("give up a dead move", op)

    async def finish_switch(
        self, min_slice: int, complete: Callable[[PartitionRow, datetime], Awaitable[None]]
    ) -> bool:
        """Finish the switch of a move that is gone after its commit point: the range is
        ``moved`` here and its move record is still here, no live mover holds it: ``complete``
        (the target's part: it serves the range from the floor given, this server's clock now)
        runs while this transaction holds the mover lock; the record says ``switch finished``.
        False: a live move holds the range, or there is nothing to finish here."""

        async def op(conn: Any) -> bool:
            async with conn.transaction():
                if not await conn.fetchval(self.sql.try_xact_lock, self.sql.mover_key, min_slice):
                    return False
                rows = [PartitionRow(*r) for r in await conn.fetch(self.sql.rows)]
                row = next((r for r in rows if r.min_slice == min_slice and r.state == MOVED), None)
                if row is None or not await conn.fetchval(self.sql.has_move, min_slice):
                    return False
                await complete(row, await conn.fetchval(self.sql.clock))
                await conn.execute(self.sql.save_step, min_slice, "switch finished")
                return True

        return await self._run("finish a switch", op)

    async def drain(self, patience: float) -> None:
        """Wait until every transaction holding the write lock on event_journal or durable_state
        now has ended: a
        state committed before this call is then seen by every write still to come (refused
        after ``patience`` seconds)."""
        vxids = [r[0] for r in await self.conns.fetch("writers", self.sql.writers)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        while vxids and await self.conns.fetchval("writers", self.sql.still_running, vxids):
            if loop.time() > deadline:
                raise JournalUnavailable(f"writers in progress did not end within {patience}s")
            await asyncio.sleep(0.005)

    async def clock(self) -> datetime:
        value: datetime = await self.conns.fetchval("clock", self.sql.clock)
        return value

    # -- the move record ----------------------------------------------------------------------

    async def moves(self) -> list[MoveRecord]:
        return [MoveRecord(*r) for r in await self.conns.fetch("moves", self.sql.moves)]

    async def start_move(self, min_slice: int, max_slice: int, target: str, epoch: int, step: str) -> None:
        await self.conns.execute("start a move", self.sql.start_move, min_slice, max_slice, target, epoch, step)

    async def save_move(self, min_slice: int, step: str, copied_to: datetime | None) -> None:
        await self.conns.execute("save a move", self.sql.save_move, min_slice, step, copied_to)

    async def end_move(self, min_slice: int) -> None:
        await self.conns.execute("end a move", self.sql.end_move, min_slice)

    # -- copies -------------------------------------------------------------------------------

    async def columns(self, table: str) -> list[str]:
        got = self._columns.get(table)
        if got is None:
            rows = await self.conns.fetch("columns", self.sql.columns, self.sql.t(table))
            got = self._columns[table] = [r[0] for r in rows]
        return got

    async def event_rows(
        self,
        min_slice: int,
        max_slice: int,
        since: datetime,
        until: datetime | None,
        after: tuple[str, int],
        limit: int,
    ) -> list[asyncpg.Record]:
        """A page of every event row (deleted ones too) of the range stamped in ``[since, until)``."""
        return await self.conns.fetch(
            "copy events", self.sql.copy_events, min_slice, max_slice, since, until, after[0], after[1], limit
        )

    async def state_rows(
        self, min_slice: int, max_slice: int, since: datetime, until: datetime | None, after: str, limit: int
    ) -> list[asyncpg.Record]:
        """A page of the range's ``durable_state`` rows stamped in ``[since, until)``, by pid after ``after``."""
        return await self.conns.fetch(
            "copy durable states", self.sql.copy_states, min_slice, max_slice, since, until, after, limit
        )

    async def rows_by_slices(self, table: str, min_slice: int, max_slice: int) -> list[asyncpg.Record]:
        return await self.conns.fetch(f"copy {table}", self.sql.by_slices(table), min_slice, max_slice)

    async def pids_after(self, min_slice: int, max_slice: int, after: str, limit: int) -> list[str]:
        rows = await self.conns.fetch("pids of a range", self.sql.pids_after, min_slice, max_slice, after, limit)
        return [r[0] for r in rows]

    async def rows_by_pids(self, table: str, pids: Sequence[str]) -> list[asyncpg.Record]:
        return await self.conns.fetch(f"copy {table}", self.sql.by_pids(table), list(pids))

    async def tag_rows(self, tags: Sequence[str], pids: Sequence[str]) -> list[asyncpg.Record]:
        return await self.conns.fetch("copy tag rows", self.sql.tag_rows_of, list(tags), list(pids))

    async def write_rows(
        self, table: str, rows: Sequence[asyncpg.Record], *, replace_slices: tuple[int, int] | None = None,
        replace_pids: Sequence[str] | None = None,
    ) -> None:  # fmt: skip
        """Insert copied rows as they are (their db_timestamp kept; rows already here are left
        alone, but a durable state copied again at a later revision replaces its copy), in one
        transaction; ``replace_slices``/``replace_pids``: first delete this table's rows of those
        slices or pids (a table copied whole at the fence)."""
        columns = await self.columns(table)
        names = ", ".join(f'"{c}"' for c in columns)

        async def op(conn: Any) -> None:
            async with conn.transaction():
                # copies keep their stamps: the timestamp rule's trigger, if installed, skips them
                await conn.execute(MARK_WRITER_LOCAL_SQL)
                if replace_slices is not None:
                    await conn.execute(self.sql.delete_by_slices(table), *replace_slices)
                if replace_pids is not None:
                    await conn.execute(self.sql.delete_by_pids(table), list(replace_pids))
                if not rows:
                    return
                await conn.execute(self.sql.stage(table))
                await conn.copy_records_to_table(
                    f"sj_stage_{table}", records=[tuple(r[c] for c in columns) for r in rows], columns=columns
                )
                if table == "durable_state":
                    await conn.execute(self.sql.insert_staged(table, names, self.sql.newer_state))
                else:
                    await conn.execute(self.sql.insert_staged(table, names))

        await self._run(f"copy {table}", op)

    # -- removal ------------------------------------------------------------------------------

    async def remove_range(self, min_slice: int, max_slice: int, batch: int = 500) -> int:
        """Delete every row of the range from this database (events, snapshots, tag rows and tag
        progress of its pids, durable states), in batches of pids; returns the number of pids
        (a pid with events and a state counted twice)."""
        sql = self.sql
        total = 0
        while True:
            pids = [r[0] for r in await self.conns.fetch("remove a range", sql.pids_in, min_slice, max_slice, batch)]
            if not pids:
                break
            tags = [r[0] for r in await self.conns.fetch("remove a range", sql.tags_of, pids)]

            async def op(conn: Any, pids: list[str] = pids, tags: list[str] = tags) -> None:
                async with conn.transaction():
                    if tags:
                        await conn.execute(sql.delete_tag_rows_of, tags, pids)
                    for table in ("tag_write_progress", "tag_scanning", "event_journal"):
                        await conn.execute(sql.delete_by_pids(table), pids)

            await self._run("remove a range", op)
            total += len(pids)

        while True:  # the range's durable states
            pids = [r[0] for r in await self.conns.fetch("remove a range", sql.states_in, min_slice, max_slice, batch)]
            if not pids:
                break
            await self.conns.execute("remove a range", sql.delete_by_pids("durable_state"), pids)
            total += len(pids)

        async def snapshots(conn: Any) -> None:
            async with conn.transaction():
                for table in ("snapshot", "snapshot_older"):
                    await conn.execute(sql.delete_by_slices(table), min_slice, max_slice)

        await self._run("remove a range", snapshots)
        return total
