"""One database of a location's replicated logs, and where a location's statements go.

:class:`ReplicationPart` is one database: every slice of it (a location of one database, or the
home database's log rows) or only the slices it serves of a partitioned location, with the map
epoch its owner check is run against. :class:`LogPlaces` is what the one store
(:class:`~.replication_store.PostgresReplicationStore`) asks where a statement goes, the way
Akka Persistence R2DBC's DAOs pick a connection factory per slice; :class:`OneDatabase` answers
for a location of one database (``journal.partitioned.replication`` for a partitioned one).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from itertools import repeat
from typing import Any, Protocol, TypeVar

import asyncpg
import orjson

from ..buckets import bucket_millis
from ..errors import ConfigurationError, JournalUnavailable
from ..replicated import ReplicatedEvent
from ..serialization import Serialized
from ..vector_time import VectorTime
from ..write_batch import WriteBatch
from . import recovery_guard
from .errors import is_transient, partition_refusal
from .replication_sql import dump_vt, stamp_columns, statements_for, stored_ids, vector_time_of
from .statements import notify_groups
from .timestamp_rule import MARK_WRITER_LOCAL_SQL, delete_check_sql
from .writes import PostgresWrites

T = TypeVar("T")

MARK_REPLICATED = f"{recovery_guard.MARK_REPLICATED_SQL}; {MARK_WRITER_LOCAL_SQL}"
"""A transaction's rows are replicated: they pass the recovery guard and the timestamp rule."""


class ReplicationPart:
    """The replicated logs in one database: all its slices (``slices`` None) or those given,
    each statement of a partitioned database after the owner check of ``epoch``."""

    def __init__(
        self, backend: PostgresWrites, location: str, slices: Sequence[int] | None = None, epoch: int = 0
    ) -> None:
        self.backend = backend
        self.location = location
        self.slices = None if slices is None else list(slices)
        self.epoch = epoch
        self.sql = statements_for(backend.settings.schema)
        self.delete_check = delete_check_sql(backend.settings.schema)

    def serving(self, slices: Sequence[int], epoch: int) -> ReplicationPart:
        """This database, restricted to the slices it serves under the map of ``epoch``."""
        return ReplicationPart(self.backend, self.location, slices, epoch)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection; the database being away (refused, lost, shutting down) becomes
        :class:`JournalUnavailable`, which the endpoint answers as gRPC ``UNAVAILABLE``; the owner
        check's refusal (a partitioned database) becomes :class:`SliceRangeMoved`."""
        try:
            async with self.backend.pool.acquire() as conn:
                yield conn
        except Exception as e:
            if is_transient(e):
                raise JournalUnavailable(f"location {self.location!r}: database unavailable: {e}") from e
            moved = partition_refusal(e)
            if moved is not None:  # the owner check of a partitioned database
                raise moved from e
            raise

    @contextlib.asynccontextmanager
    async def transaction(self, *, replicated: bool = False) -> AsyncIterator[Any]:
        """A transaction on this database, committed when the block ends. ``replicated``: its
        rows pass the recovery guard and the timestamp rule."""
        async with self.connection() as conn, conn.transaction():
            if replicated:
                await conn.execute(MARK_REPLICATED)
            yield conn

    async def ensure_indexes(self, log_name: str) -> None:
        async with self.connection() as conn:
            await ensure_indexes(conn, self.sql.origin_index, self.sql.unstamped_index(log_name))

    async def above(self, log_name: str, position: int) -> tuple[int, list[VectorTime]]:
        """The log's events stamped here past ``position``: the highest position and their vector times."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.sql.above, log_name, position)
        return max((int(r[0]) for r in rows), default=0), [vector_time_of(r[1]) for r in rows]

    async def read_log(self, log_name: str, after: int, upto: int | None, limit: int) -> list[asyncpg.Record]:
        """The log's events after ``after`` (and up to ``upto``, the committed position of a
        partitioned location), in log order."""
        return await self._fetch(
            (self.sql.read_log, log_name, after, limit), (self.sql.read_log_within, log_name, after, upto, limit)
        )

    async def read_ids(self, log_name: str, ids: Sequence[tuple[str, int]], upto: int | None) -> list[asyncpg.Record]:
        origins, seqs = [i[0] for i in ids], [i[1] for i in ids]
        return await self._fetch(
            (self.sql.read_ids, log_name, origins, seqs), (self.sql.read_ids_within, log_name, origins, seqs, upto)
        )

    async def stored_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        """Those of ``ids`` stored here (in any slice: a move's copy counts)."""
        async with self.connection() as conn:
            return await stored_ids(conn, self.sql, log_name, ids)

    async def event_ids(self, log_name: str) -> dict[tuple[str, int], int]:
        rows = await self._fetch((self.sql.event_ids, log_name), (self.sql.event_ids_within, log_name))
        return {(r[0], int(r[1])): int(r[2]) for r in rows}

    async def _fetch(self, whole: tuple[Any, ...], within: tuple[Any, ...]) -> list[asyncpg.Record]:
        """``whole`` (a statement and its arguments) for a location with a database of its own,
        else ``within``, with this location's slices as its last argument."""
        async with self.connection() as conn:
            if self.slices is None:
                rows: list[asyncpg.Record] = await conn.fetch(*whole)
            else:
                rows = await conn.fetch(*within, self.slices)
        return rows

    async def unstamped(self, conn: Any, log_name: str, limit: int) -> list[asyncpg.Record]:
        """The oldest local events of the log not stamped yet. In a partitioned database, of
        its slices, after the delete check of their slices (it takes the write lock, so a move's
        drain waits for this transaction; it refuses a range being moved, whose rows a move's
        copy may have taken already: its events are left out until the move is over)."""
        if self.slices is None:
            found: list[asyncpg.Record] = await conn.fetch(self.sql.unstamped(log_name), limit)
            return found
        rows: list[asyncpg.Record] = await conn.fetch(self.sql.unstamped_within(log_name), limit, self.slices)
        while rows:
            try:
                async with conn.transaction():  # a savepoint: a refusal leaves the transaction usable
                    await conn.execute(self.delete_check, self.epoch, sorted({int(r["slice"]) for r in rows}))
                return rows
            except asyncpg.PostgresError as e:
                moved = partition_refusal(e)
                if moved is None:
                    raise
                # the refused range is being moved: its events are stamped where it lands
                kept = [r for r in rows if not moved.min_slice <= r["slice"] <= moved.max_slice]
                rows = kept if len(kept) < len(rows) else []
        return rows

    async def any_unstamped(self, log_name: str) -> bool:
        """Has the log a local event not stamped yet here (of this part's slices)?"""
        async with self.connection() as conn:
            return bool(await conn.fetchval(self.sql.any_unstamped(log_name), self.slices))

    async def stamp(self, conn: Any, rows: Sequence[tuple[str, int, int, VectorTime]]) -> None:
        """Stamp these local events (pid, seq nr, position, vector time) as this location's,
        in ``conn``'s transaction, the stamp planned for the table as it is now."""
        await conn.execute(self.sql.plan_stamps_per_call)
        await conn.execute(self.sql.stamp, *stamp_columns(self.location, rows))

    async def insert(
        self, conn: Any, log_name: str, batch: WriteBatch, events: Sequence[ReplicatedEvent], positions: Sequence[int]
    ) -> None:
        """The events (``batch``, checked, and the events it was made of) at these log
        positions, in one statement. A column of NULLs only (no tags, no metadata: the common
        case) goes as one NULL, which ``unnest`` pads: the driver checks every element of an
        array it sends, a few tenths of a microsecond each."""
        b = self.backend
        tagged = any(batch.tags)
        metas = batch.metadata
        with_meta = any(metas)
        params: list[Any] = [
            batch.persistence_ids, batch.slices, batch.ser_ids, batch.manifests, batch.payloads,
            [orjson.dumps(list(t)).decode() if t else None for t in batch.tags] if tagged else None,
            [m.ser_id if m else None for m in metas] if with_meta else None,
            [m.manifest if m else None for m in metas] if with_meta else None,
            [m.payload if m else None for m in metas] if with_meta else None,
            [e.origin_location for e in events], [e.origin_seq_nr for e in events],
            [dump_vt(e.vector_time) for e in events], positions, log_name, b.writer_id, b.conns.epoch,
        ]  # fmt: skip
        notify = b.settings.write.notify
        if notify:
            params.append(sorted(notify_groups(set(batch.slices), repeat(log_name))))
        if tagged:
            params.append(bucket_millis(b.settings.tags.bucket_size))
        await conn.fetchrow(self.sql.insert(notify=notify, tagged=tagged), *params)

    async def entity_events(self, persistence_id: str) -> list[tuple[Serialized, str, int, VectorTime]]:
        """A pid's stamped events in local order: payload, origin location and seq nr, vector time."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.sql.entity_events, persistence_id)
        return [
            (
                Serialized(r[0], r[1], bytes(r[2])),
                r["origin_location"],
                int(r["origin_seq_nr"]),
                vector_time_of(r["vector_time"]),
            )
            for r in rows
        ]

    async def delete(self, log_name: str, to: int, *, physically: bool) -> None:
        """Mark the log's events up to ``to`` deleted, or remove those marked (a partitioned
        database's after the delete check of its slices: refused while a range of it moves)."""
        async with self.connection() as conn, conn.transaction():
            if self.slices is None:
                await conn.execute(
                    self.sql.delete_physically if physically else self.sql.delete_logically, log_name, to
                )
                return
            await conn.execute(self.delete_check, self.epoch, self.slices)
            sql = self.sql.delete_physically_within if physically else self.sql.delete_logically_within
            await conn.execute(sql, log_name, to, self.slices)

    async def delete_invalid_snapshots(self, log_name: str) -> int:
        async with self.connection() as conn:
            status = await conn.execute(self.sql.delete_invalid_snapshots, log_name)
        return int(status.split()[-1])

    async def flag_recovering(self, log_names: Sequence[str], *, home: bool) -> None:
        """Flag the logs as recovering and install the recovery guard: from its commit on, every
        local write to them here, by any process or writer, is refused (:mod:`.recovery_guard`).
        A database other than the home one gets rows of its own (its guard reads them; a move
        keeps away from a database holding them)."""
        async with self.connection() as conn, conn.transaction():
            for name in log_names:
                if home:
                    await conn.execute(self.sql.set_recovering, name, True)
                else:
                    await conn.execute(self.sql.mark_recovering, name, self.location)
            await conn.execute(recovery_guard.install_sql(self.backend.settings.schema))

    async def unflag_recovering(self, log_names: Sequence[str], *, home: bool) -> None:
        """Clear the logs' flags; drop the guard when no log is recovering here any more."""
        async with self.connection() as conn, conn.transaction():
            for name in log_names:
                if home:
                    await conn.execute(self.sql.set_recovering, name, False)
                else:
                    await conn.execute(self.sql.unmark_recovering, name)
            if not await conn.fetchval(self.sql.any_recovering):
                await conn.execute(recovery_guard.remove_sql(self.backend.settings.schema))

    async def guard_installed(self) -> bool:
        schema = self.backend.settings.schema
        async with self.connection() as conn:
            found = await conn.fetchval(
                recovery_guard.INSTALLED_SQL, f'"{schema}".event_journal', recovery_guard.TRIGGER
            )
        return bool(found)


async def ensure_indexes(conn: Any, origin_index: str, unstamped_index: str) -> None:
    """Refuse a database without the replication indexes; create the log's unstamped index."""
    if await conn.fetchval("SELECT to_regclass($1)", origin_index) is None:
        raise ConfigurationError(
            "this database lacks the replication indexes: run `journal migrate` (migration 0006) first"
        )
    with contextlib.suppress(asyncpg.UniqueViolationError, asyncpg.DuplicateTableError):
        await conn.execute(unstamped_index)  # another process won the race


class LogPlaces(Protocol):
    """Where the statements of a location's replicated logs go: its log rows to the home
    database, its events to the databases of their slices."""

    @property
    def home(self) -> ReplicationPart:
        """The database of the log rows (position, version vector, flags, progress)."""
        ...

    @property
    def bounded(self) -> bool:
        """Do readers stop at the home row's committed position (events commit apart from H),
        or does the row lock alone keep N+1 from being visible before N (one database)?"""
        ...

    async def others(self) -> list[ReplicationPart]:
        """Every database but the home one (its recovery flags and guard)."""
        ...

    async def apart(self) -> list[ReplicationPart]:
        """The databases whose writes commit apart from the home transaction H (where the
        repair looks past the home position); none when H writes the events itself."""
        ...

    async def everywhere(self) -> list[ReplicationPart]:
        """Every database that may hold the log's events (in any slice: a move's copy counts)."""
        ...

    async def serving(self, what: str, op: Callable[[ReplicationPart], Awaitable[T]]) -> list[T]:
        """``op(part)`` on every database serving slices (each restricted to them); read where
        the slices are now if they moved meanwhile (``op`` must be a read, or idempotent)."""
        ...

    async def writing(self) -> list[ReplicationPart]:
        """The databases serving slices now, for a stamp under the home lock."""
        ...

    async def placed(
        self, log_name: str, slices: Sequence[int], new: Sequence[int]
    ) -> list[tuple[ReplicationPart, list[int]]]:
        """The indexes ``new`` of a batch grouped by the database of their slices (``slices``:
        each event's)."""
        ...

    async def on_owner(self, persistence_id: str, what: str, op: Callable[[ReplicationPart], Awaitable[T]]) -> T:
        """``op`` on the database serving the pid's slice."""
        ...

    async def stored(self, held: Any, log_name: str, ids: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        """Those of ``ids`` stored anywhere (in any slice: a move's copy counts); ``held``: H's
        connection when asked under H, else None."""
        ...

    def within(
        self, held: Any, part: ReplicationPart, *, replicated: bool
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        """The connection to write ``part``'s events on under transaction H (on ``held``, H's
        connection): H itself, or a transaction of that database committed before H."""
        ...

    async def moved(self) -> None:
        """A write failed because slices moved: the next attempt writes where they are now."""
        ...


class OneDatabase:
    """A location of one database: everything on its pool, a writer's events in H itself."""

    bounded = False

    def __init__(self, backend: PostgresWrites, location: str) -> None:
        self.home = ReplicationPart(backend, location)

    async def others(self) -> list[ReplicationPart]:
        return []

    async def apart(self) -> list[ReplicationPart]:
        return []

    async def everywhere(self) -> list[ReplicationPart]:
        return [self.home]

    async def serving(self, what: str, op: Callable[[ReplicationPart], Awaitable[T]]) -> list[T]:
        return [await op(self.home)]

    async def writing(self) -> list[ReplicationPart]:
        return [self.home]

    async def placed(
        self, log_name: str, slices: Sequence[int], new: Sequence[int]
    ) -> list[tuple[ReplicationPart, list[int]]]:
        return [(self.home, list(new))]

    async def on_owner(self, persistence_id: str, what: str, op: Callable[[ReplicationPart], Awaitable[T]]) -> T:
        return await op(self.home)

    async def stored(self, held: Any, log_name: str, ids: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        if held is None:
            return await self.home.stored_ids(log_name, ids)
        return await stored_ids(held, self.home.sql, log_name, ids)

    @contextlib.asynccontextmanager
    async def within(self, held: Any, part: ReplicationPart, *, replicated: bool) -> AsyncIterator[Any]:
        """H itself: a replicated write's H was marked when it took the log row's lock."""
        yield held

    async def moved(self) -> None:
        return None


_check: type[LogPlaces] = OneDatabase
"""mypy checks here that the one database answers every question of the store."""
