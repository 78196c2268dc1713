"""Replicated logs (issue 14): stamping local events, reading a log by position, writing a
replicated batch with its progress in one transaction; one store for a location of one database
and for a partitioned one, its :class:`~.replication_part.LogPlaces` choosing where each
statement goes (the way Akka Persistence R2DBC's DAOs pick a connection factory per slice).

Ordering argument (why "after position N" is a sound cursor here, although a PostgreSQL sequence
would not be): a log position is handed out only by a transaction H that holds the row lock on
the log's ``replication_log`` row in the home database, and that lock is released after H's
commit became visible. So position N+1 is never visible before position N, and a reader paging
by position never skips an event that commits late. Where the events are in other databases
(a partitioned location) it is kept so:

- **Writing** (a stamp of local events, a replicated batch) takes the row lock in H, writes its
  events in each database in a transaction of that database (all statements first, then the
  commits), and only then saves the position and version vector (and a batch's progress) in H
  and commits H. In one database the events are written in H itself.
- **Reading** first reads the home row's committed position M and reads only positions <= M
  from every database (each filtered to the slices it serves, so a move's copy is never read
  twice), merged by position. Every event <= M was committed before H, so nothing at or below M
  appears later.
- **Repair.** A crash between a database's commit and H's leaves committed events past M
  (orphans). Every writer, under the home lock and before handing out a position, looks past M
  in every database whose writes commit apart from H and adopts what it finds: the position
  moves to the highest orphan and the orphans' vector times fold into the version vector.
  Nobody has read past M, so adopting keeps every identity once; a position handed to a part
  that rolled back is never used (a gap, as after ``reserve_positions``). A replicated batch
  whose H did not commit is pulled again from the unchanged progress, and what a part stored is
  skipped by identity (``missing_ids``).
- **Moves.** A stamp changes rows: it runs the delete check of their slices first, so the rows
  of a range being moved stay unstamped until the move is over (then they are stamped where the
  range lands). A replicated batch's inserts pass each database's owner check (a fenced range
  refuses: the batch fails whole, before any commit, and the endpoint pulls it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..errors import ConfigurationError, LocationMismatch, SequenceConflict, SliceRangeMoved
from ..replicated import ReplicatedEvent, WriteOutcome
from ..serialization import Serialized
from ..vector_time import VectorTime
from ..write_batch import WriteBatch
from ..write_validation import replicated_batch
from .replication_part import LogPlaces, OneDatabase, ReplicationPart, ensure_indexes
from .replication_sql import (
    ReplicationStatements,
    dump_vt,
    log_head,
    stamp_columns,
    stored_ids,
    unstamped_index_sql,
    vector_time_of,
)
from .writes import PostgresWrites

__all__ = [
    "STAMP_LIMIT",
    "PostgresReplicationStore",
    "ReplicationLogs",
    "ReplicationStatements",
    "dump_vt",
    "events_of",
    "log_head",
    "maybe_stored",
    "merged",
    "not_in",
    "racing_local_writes",
    "stamp_columns",
    "stored_ids",
    "unstamped_index_sql",
    "vector_time_of",
]

STAMP_LIMIT = 1000
"""Local events stamped per statement."""
SEQUENCE_RACE_ATTEMPTS = 3
"""Writes of a replicated batch that lost its sequence numbers to a local write, before giving up."""
PRIMARY_KEY = "event_journal_pkey"


@dataclass
class _Held:
    """The home log row under its lock (transaction H): what the writer hands out from."""

    conn: Any
    pos: int
    vv: VectorTime
    recovering: bool
    progress: tuple[str, int] | None = None
    """A replicated batch's source and last position scanned, saved with the log row."""


class ReplicationLogs:
    """The replicated logs of ``location`` (log name = entity type), each statement where
    ``places`` says (:class:`~journal.backend.ReplicationStore`)."""

    def __init__(self, places: LogPlaces, location: str) -> None:
        self.places = places
        self.location = location
        self._writers: dict[str, asyncio.Lock] = {}
        """Per log: one writer of this process at a time waits for the home row. A writer holds a
        home connection while it waits and may take a second one; without this, enough waiters
        could hold every pooled connection."""

    @property
    def sql(self) -> ReplicationStatements:
        return self.places.home.sql

    # -- the log's state: at home -------------------------------------------------------------

    async def ensure_log(self, log_name: str) -> None:
        """Create the log's state row for this location; refuse a database of another location."""
        async with self._home() as conn:
            try:
                await conn.execute(self.sql.ensure_log, log_name, self.location)
            except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError) as e:
                raise ConfigurationError(
                    "this database has no replication tables: run `journal migrate` (migration 0005) first"
                ) from e
            row = await log_head(conn, self.sql.log_row, log_name)
            await ensure_indexes(conn, self.sql.origin_index, self.sql.unstamped_index(log_name))
        if row["location"] != self.location:
            raise LocationMismatch(
                f"log {log_name!r} of this database belongs to location {row['location']!r}, not {self.location!r}"
            )
        for p in await self.places.others():
            await p.ensure_indexes(log_name)

    def _home(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.places.home.connection()

    async def version_vector(self, log_name: str) -> VectorTime:
        async with self._home() as conn:
            row = await conn.fetchrow(self.sql.log_row, log_name)
        return VectorTime() if row is None else vector_time_of(row["version_vector"])

    async def log_seq_nr(self, log_name: str) -> int:
        async with self._home() as conn:
            row = await conn.fetchrow(self.sql.log_row, log_name)
        return 0 if row is None else int(row["log_seq_nr"])

    async def target_state(self, log_name: str, source_location: str) -> tuple[int, VectorTime]:
        """:meth:`progress` and :meth:`version_vector` in one round trip (a replicator's every step)."""
        async with self._home() as conn:
            row = await conn.fetchrow(self.sql.target_state, log_name, source_location)
        if row is None:
            return 0, VectorTime()
        return int(row["progress"] or 0), vector_time_of(row["version_vector"])

    async def progress(self, log_name: str, source_location: str) -> int:
        async with self._home() as conn:
            v = await conn.fetchval(self.sql.progress, log_name, source_location)
        return 0 if v is None else int(v)

    async def all_progress(self, log_name: str) -> dict[str, int]:
        async with self._home() as conn:
            rows = await conn.fetch(self.sql.all_progress, log_name)
        return {r["source_location"]: int(r["source_log_seq_nr"]) for r in rows}

    async def record_target_progress(self, log_name: str, target_location: str, log_seq_nr: int) -> None:
        """A target read after ``log_seq_nr``: it has stored everything of this log up to there."""
        async with self._home() as conn:
            await conn.execute(self.sql.save_target_progress, log_name, target_location, log_seq_nr)

    async def target_progress(self, log_name: str) -> dict[str, int]:
        async with self._home() as conn:
            rows = await conn.fetch(self.sql.target_progress, log_name)
        return {r["target_location"]: int(r["log_seq_nr"]) for r in rows}

    async def reserve_positions(self, log_name: str, at_least: int) -> None:
        """Make the log's next position greater than ``at_least`` (disaster recovery: peers may
        have read this location's old log that far)."""
        async with self._home() as conn:
            await conn.execute(self.sql.reserve, log_name, at_least)

    async def recovering(self, log_names: Sequence[str]) -> bool:
        """Is one of these logs flagged as recovering (a recovery began and has not completed)?"""
        async with self._home() as conn:
            return bool(await conn.fetchval(self.sql.recovering, list(log_names)))

    async def begin_recovery(self, log_names: Sequence[str]) -> None:
        """Flag the logs as recovering and install the recovery guard, on every other database
        first (local writes refused everywhere), then at home."""
        for p in await self.places.others():
            await p.flag_recovering(log_names, home=False)
        await self.places.home.flag_recovering(log_names, home=True)

    async def end_recovery(self, log_names: Sequence[str]) -> None:
        """Clear the logs' recovering flags; drop each guard when no log is recovering there."""
        await self.places.home.unflag_recovering(log_names, home=True)
        for p in await self.places.others():
            await p.unflag_recovering(log_names, home=False)

    async def guard_installed(self) -> bool:
        others = [await p.guard_installed() for p in await self.places.others()]
        return await self.places.home.guard_installed() and all(others)

    # -- writing: under the home lock ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _held(self, log_name: str, *, replicated: bool = False) -> AsyncIterator[_Held]:
        """Transaction H on the home log row, repaired first; the position and version vector
        the block leaves are saved in H, which commits after the block (and its parts).
        ``replicated``: H is marked as a replicated write's (its rows pass the recovery guard and
        the timestamp rule) by the statement that takes the lock."""
        home = self.places.home
        try:
            async with (
                self._writers.setdefault(log_name, asyncio.Lock()),
                home.connection() as conn,
                conn.transaction(),
            ):
                head = await log_head(conn, self.sql.lock_log_replicated if replicated else self.sql.lock_log, log_name)
                saved = (int(head["log_seq_nr"]), vector_time_of(head["version_vector"]))
                held = _Held(conn, saved[0], saved[1], bool(head["recovering"]))
                await self._adopt(log_name, held)
                yield held
                if held.progress is not None and (held.pos, held.vv) != saved:
                    await conn.execute(
                        self.sql.save_log_and_progress, log_name, held.pos, dump_vt(held.vv), *held.progress
                    )
                elif held.progress is not None:
                    await conn.execute(self.sql.save_progress, log_name, *held.progress)
                elif (held.pos, held.vv) != saved:
                    await conn.execute(self.sql.save_log, log_name, held.pos, dump_vt(held.vv))
        except SliceRangeMoved:
            await self.places.moved()  # the next attempt writes where the slices are now
            raise

    async def _adopt(self, log_name: str, held: _Held) -> None:
        """The repair: events committed past the home position by a writer whose H did not
        commit become the log's (every database must answer, or nothing is handed out)."""
        found = await asyncio.gather(*(p.above(log_name, held.pos) for p in await self.places.apart()))
        top = max((t for t, _ in found), default=0)
        if top > held.pos:
            held.pos = top
            for _, vts in found:
                for vt in vts:
                    held.vv = held.vv.merge(vt)

    async def stamp(self, log_name: str, limit: int = STAMP_LIMIT) -> int:
        """Give local events not yet in the log (written by the plain journal) their position,
        origin and vector time, oldest first (the order of the slice queries). Returns how many.

        Nothing is stamped while the log is recovering: its positions are not yet past what the
        peers have read of this location, and its version vector does not yet hold what the
        location had; local events written before or during the recovery are stamped after it,
        at new positions, with a vector time that covers everything recovered."""
        if not await self._any_unstamped(log_name):
            return 0  # nothing to stamp: no lock taken (a read's stamp, the stamp loop's)
        async with self._held(log_name) as held:
            return 0 if held.recovering else await self._stamp_locked(log_name, held, limit)

    async def _any_unstamped(self, log_name: str) -> bool:
        """Is a local event of the log unstamped anywhere (no lock: one that commits after this
        answer is stamped by the next stamp, as if this one had come a moment earlier)?"""
        for part in await self.places.writing():
            if await part.any_unstamped(log_name):
                return True
        return False

    async def _stamp_locked(self, log_name: str, held: _Held, limit: int) -> int:
        """:meth:`stamp` under H: how many (``held`` moves past them once every part committed)."""
        async with contextlib.AsyncExitStack() as stack:
            found: list[tuple[Any, ReplicationPart, Any]] = []
            for part in await self.places.writing():
                conn = await stack.enter_async_context(self.places.within(held.conn, part, replicated=False))
                found.extend((r, part, conn) for r in await part.unstamped(conn, log_name, limit))
            found.sort(key=lambda f: (f[0]["db_timestamp"], f[0]["seq_nr"], f[0]["persistence_id"]))
            found = found[:limit]
            if not found:
                return 0
            # never reuse a position of ours that the log (after a disaster recovery) has seen
            pos, vv = max(held.pos, held.vv.get(self.location, 0)), held.vv
            by_part: dict[int, tuple[ReplicationPart, Any, list[tuple[str, int, int, VectorTime]]]] = {}
            for r, part, conn in found:
                pos += 1
                vv = vv.with_entry(self.location, pos)
                by_part.setdefault(id(part), (part, conn, []))[2].append((r["persistence_id"], r["seq_nr"], pos, vv))
            await asyncio.gather(*(p.stamp(c, rows) for p, c, rows in by_part.values()))
        held.pos, held.vv = pos, vv  # every part committed
        return len(found)

    async def write_replicated(
        self, log_name: str, source_location: str, events: Sequence[ReplicatedEvent], last_scanned: int
    ) -> WriteOutcome:
        """Write a batch from ``source_location`` in its order and store the progress, in one
        transaction (H; and each part's, committed before it), dropping every event this
        location already stored.

        An event is dropped by its exact identity (origin location, origin seq nr), never
        because the log's version vector covers it: a filter on one path can keep an event from
        this location while a later event of the same origin arrives, and the event must still be
        stored when it comes by another path. The version vector merges only stored events. The
        stored events go in with one statement per database (:mod:`.replicated_insert`).

        A local write to one of the batch's pids that commits first takes the sequence number
        the batch computed; the batch is then written again at once (a few times at most, then
        :class:`~journal.errors.SequenceConflict`: the endpoint retries after ``retry_delay``)."""
        return await racing_local_writes(
            log_name, events, lambda b: self._write_replicated(log_name, source_location, b, events, last_scanned)
        )

    async def _write_replicated(
        self, log_name: str, source_location: str, batch: WriteBatch, events: Sequence[ReplicatedEvent],
        last_scanned: int,
    ) -> WriteOutcome:  # fmt: skip
        async with self._held(log_name, replicated=True) as held:
            while not held.recovering and await self._stamp_locked(log_name, held, STAMP_LIMIT) == STAMP_LIMIT:
                pass  # local events committed before this batch are stamped first (their vector
                # times never cover what arrives now, which their writers cannot have seen)
            ids = maybe_stored(events, held.vv)
            new = not_in(events, await self.places.stored(held.conn, log_name, ids) if ids else set())
            if new:
                await self._insert(log_name, batch, events, new, held)
            held.progress = (source_location, last_scanned)
        return WriteOutcome(written=len(new), dropped=len(events) - len(new), progress=last_scanned)

    async def _insert(
        self, log_name: str, batch: WriteBatch, events: Sequence[ReplicatedEvent], new: list[int], held: _Held
    ) -> None:
        """The batch's new events at the next positions, in batch order, each in its slice's
        database: every part's statement first, then the commits."""
        position = {i: held.pos + 1 + k for k, i in enumerate(new)}
        async with contextlib.AsyncExitStack() as stack:
            work = []
            for part, idx in await self.places.placed(log_name, batch.slices, new):
                conn = await stack.enter_async_context(self.places.within(held.conn, part, replicated=True))
                work.append(
                    part.insert(conn, log_name, batch.select(idx), [events[i] for i in idx], [position[i] for i in idx])
                )
            await asyncio.gather(*work)
        held.pos, held.vv = held.pos + len(new), merged(held.vv, [events[i] for i in new])

    # -- reading: up to the committed position ------------------------------------------------

    async def _upto(self, log_name: str) -> int | None:
        return await self.log_seq_nr(log_name) if self.places.bounded else None

    async def read_log(self, log_name: str, after: int, limit: int) -> tuple[list[ReplicatedEvent], int]:
        """Events of the log after position ``after`` in log order, and the last position
        scanned (``after`` when none)."""
        upto = await self._upto(log_name)
        if upto is not None and upto <= after:
            return [], after
        got = await self.places.serving("read log", lambda p: p.read_log(log_name, after, upto, limit))
        rows = list(heapq.merge(*got, key=lambda r: int(r["log_seq_nr"])))[:limit]
        return events_of(rows), (int(rows[-1]["log_seq_nr"]) if rows else after)

    async def read_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> list[ReplicatedEvent]:
        """The log's events with these identities (origin location, origin seq nr), in log order."""
        upto = await self._upto(log_name)
        got = await self.places.serving("read ids", lambda p: p.read_ids(log_name, ids, upto))
        return events_of(list(heapq.merge(*got, key=lambda r: int(r["log_seq_nr"]))))

    async def missing_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        """Those of ``ids`` this location has not stored (in the order given)."""
        if not ids:
            return []
        stored = await self.places.stored(None, log_name, ids)
        return [i for i in ids if i not in stored]

    async def event_ids(self, log_name: str) -> dict[tuple[str, int], int]:
        """Every event id of the log with how many times it is stored (for checks and status)."""
        out: dict[tuple[str, int], int] = {}
        for got in await self.places.serving("event ids", lambda p: p.event_ids(log_name)):
            for k, n in got.items():
                out[k] = out.get(k, 0) + n
        return out

    async def entity_events(self, persistence_id: str) -> list[tuple[Serialized, str, int, VectorTime]]:
        """A pid's stamped events in local order: payload, origin location and seq nr, vector time."""
        return await self.places.on_owner(persistence_id, "entity events", lambda p: p.entity_events(persistence_id))

    # -- deleting: where the events are -------------------------------------------------------

    async def delete_logically(self, log_name: str, to_log_seq_nr: int) -> int:
        """Mark the log's events up to ``to_log_seq_nr`` deleted: local reads (slice queries,
        entities) skip them, replication still sends them. Returns the position actually applied
        (no further than the log's committed position; refused while a range of it moves)."""
        async with self._home() as conn:
            head = await log_head(conn, self.sql.log_row, log_name)
        applied = min(to_log_seq_nr, int(head["log_seq_nr"]))
        await self.places.serving("delete", lambda p: p.delete(log_name, applied, physically=False))
        return applied

    async def delete_physically(self, log_name: str, to_log_seq_nr: int, replicated_to: Sequence[str]) -> int:
        """Remove logically deleted events up to ``to_log_seq_nr`` that every location in
        ``replicated_to`` has stored (each pid's highest event stays as its tombstone). Returns
        the position it could go to: less than asked while a named target is behind."""
        progress = await self.target_progress(log_name)
        bound = min([to_log_seq_nr, *(progress.get(t, 0) for t in replicated_to)])
        if bound > 0:
            await self.places.serving("delete", lambda p: p.delete(log_name, bound, physically=True))
        return max(bound, 0)

    async def delete_invalid_snapshots(self, log_name: str) -> int:
        """Delete snapshots of the log's entities that cover events this location no longer has."""
        return sum(await self.places.serving("delete snapshots", lambda p: p.delete_invalid_snapshots(log_name)))


class PostgresReplicationStore(ReplicationLogs):
    """The replicated logs of one location in one journal database."""

    def __init__(self, backend: PostgresWrites, location: str) -> None:
        super().__init__(OneDatabase(backend, location), location)
        self.backend = backend


async def racing_local_writes(
    log_name: str, events: Sequence[ReplicatedEvent], write: Callable[[WriteBatch], Awaitable[WriteOutcome]]
) -> WriteOutcome:
    """``write(batch)`` of the events checked as a batch (the write path's one validator), again
    while a local write took a sequence number the batch computed (a few times, then
    :class:`~journal.errors.SequenceConflict`: the endpoint retries later)."""
    batch = replicated_batch(log_name, events)
    for attempt in range(SEQUENCE_RACE_ATTEMPTS):
        try:
            return await write(batch)
        except asyncpg.UniqueViolationError as e:
            if e.constraint_name != PRIMARY_KEY or attempt + 1 == SEQUENCE_RACE_ATTEMPTS:
                raise SequenceConflict(
                    events[0].persistence_id if events else "", None,
                    f"a replicated batch of {log_name!r} kept racing local writes: {e}",
                ) from e  # fmt: skip
    raise AssertionError("unreachable")


def not_in(events: Sequence[ReplicatedEvent], stored: set[tuple[str, int]]) -> list[int]:
    """The positions in ``events`` of those not in ``stored``, each identity once (a batch never
    repeats one; be safe)."""
    seen = set(stored)
    out = []
    for i, e in enumerate(events):
        if e.event_id not in seen:
            seen.add(e.event_id)
            out.append(i)
    return out


def maybe_stored(events: Sequence[ReplicatedEvent], vv: VectorTime) -> list[tuple[str, int]]:
    """The identities of ``events`` this location may have stored: those its version vector
    covers. Every stored event's identity is covered (:func:`merged` folds each one in, and a
    stamp's position is its own entry), so an event past the vector's entry for its origin is
    new without asking the database; in a catch-up that is every event of the batch."""
    return [e.event_id for e in events if e.origin_seq_nr <= vv.get(e.origin_location, 0)]


def merged(vv: VectorTime, events: Sequence[ReplicatedEvent]) -> VectorTime:
    """The version vector with the vector times of ``events`` folded in, and each event's own
    identity (origin location, origin seq nr): a well-formed vector time holds it already, and
    :func:`maybe_stored` relies on it for any other."""
    highest: dict[str, int] = {}
    for e in events:
        for location, counter in e.vector_time.items():
            if counter > highest.get(location, 0):
                highest[location] = counter
        if e.origin_seq_nr > highest.get(e.origin_location, 0):
            highest[e.origin_location] = e.origin_seq_nr
    return vv.merge(highest)


def events_of(rows: Sequence[asyncpg.Record]) -> list[ReplicatedEvent]:
    """The events of rows of :attr:`ReplicationStatements.read_log` (its columns, in their
    order: unpacked by position, the commonest read of a source endpoint)."""
    out: list[ReplicatedEvent] = []
    append = out.append
    for pid, ser_id, manifest, payload, tags, m_id, m_manifest, m_payload, origin, origin_seq, vt, pos, deleted in rows:
        if deleted and not payload:
            continue  # a tombstone of the journal's own delete_events_to: nothing to send
        meta = None if m_id is None else Serialized(m_id, m_manifest or "", bytes(m_payload or b""))
        append(
            ReplicatedEvent(
                pid, Serialized(ser_id, manifest, bytes(payload)), origin, origin_seq, vector_time_of(vt), pos,
                tuple(tags) if tags else (), meta,
            )
        )  # fmt: skip
    return out
