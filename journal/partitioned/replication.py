"""The replicated logs of a partitioned location: the log's state at home, its events by slice.

A log's state (position, version vector, recovering flag, progress per source and per target)
is the ``replication_log`` row and its companions in the journal's home database, like leases
and keys; its events stay in the database of their slice. The single-database ordering argument
(``journal.postgres.replication_store``: position N+1 is never visible before N) is kept so:

- **Writing** (a stamp of local events, a replicated batch) takes the home row's lock in a
  transaction H that stays open, writes its events in each partition database in a transaction
  of that database (all statements first, then the commits), and only then saves the position
  and version vector (and a batch's progress) in H and commits H.
- **Reading** (``read_log``, ``read_ids``) first reads the home row's committed position M and
  reads only positions <= M from every database (each filtered to the slices it serves, so a
  move's copy is never read twice), merged by position. Every event <= M was committed before
  H, so nothing at or below M appears later.
- **Repair.** A crash between a partition's commit and H's leaves committed events past M
  (orphans). Every writer, under the home lock and before handing out a position, looks past M
  in every database and adopts what it finds: the position moves to the highest orphan and the
  orphans' vector times fold into the version vector. Nobody has read past M, so adopting keeps
  every identity once; a position handed to a part that rolled back is never used (a gap, as
  after ``reserve_positions``). A replicated batch whose H did not commit is pulled again from
  the unchanged progress, and what a part stored is skipped by identity (``missing_ids``).
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
from typing import Any, TypeVar

from ..backend import ReplicationStore
from ..errors import JournalUnavailable, SliceRangeMoved
from ..ids import slice_for
from ..postgres import (
    STAMP_LIMIT,
    PostgresBackend,
    PostgresReplicationStore,
    ReplicationPart,
    dump_vt,
    events_of,
    log_head,
    merged,
    not_in,
    racing_local_writes,
    vector_time_of,
)
from ..replicated import ReplicatedEvent, WriteOutcome
from ..serialization import Serialized
from ..vector_time import VectorTime
from ..write_batch import WriteBatch
from .databases import Databases
from .layout import NOWHERE, PartitionMap
from .routing import Router

T = TypeVar("T")


@dataclass
class _Held:
    """The home log row under its lock (transaction H): what the writer hands out from."""

    conn: Any
    pos: int
    vv: VectorTime
    recovering: bool


class PartitionedReplicationStore:
    """The replicated logs of ``location`` over a partitioned journal (:class:`ReplicationStore`)."""

    def __init__(self, dbs: Databases, router: Router, home: Callable[[], PostgresBackend], location: str) -> None:
        self.dbs = dbs
        self.router = router
        self.location = location
        self._home_backend = home
        self._home: PostgresReplicationStore | None = None
        self._parts: dict[int, ReplicationPart] = {}
        self._writers: dict[str, asyncio.Lock] = {}
        """Per log: one writer of this process at a time waits for the home row. A writer holds a
        home connection while it waits and takes a second one when the home database is also a
        partition; without this, enough waiters could hold every pooled connection."""

    # -- where things are -------------------------------------------------------------------

    @property
    def home(self) -> PostgresReplicationStore:
        b = self._home_backend()
        if self._home is None or self._home.backend is not b:
            self._home = PostgresReplicationStore(b, self.location)
        return self._home

    def _part(self, backend: PostgresBackend) -> ReplicationPart:
        p = self._parts.get(id(backend))
        if p is None or p.backend is not backend:
            p = self._parts[id(backend)] = ReplicationPart(backend, self.location)
        return p

    async def _all_parts(self) -> list[ReplicationPart]:
        """Every database the journal knows (each must answer: JournalUnavailable otherwise)."""
        return [self._part(await self.dbs.usable(i)) for i in range(len(self.dbs.backends))]

    async def _others(self) -> list[ReplicationPart]:
        """Every database but the home one (which holds the log rows themselves)."""
        home = self._home_backend()
        return [p for p in await self._all_parts() if p.backend is not home]

    @staticmethod
    def _served(m: PartitionMap) -> dict[int, list[int]]:
        """Database index -> the slices it serves."""
        out: dict[int, list[int]] = {}
        for s, owner in enumerate(m.owners):
            if owner != NOWHERE:
                out.setdefault(owner, []).append(s)
        return out

    async def _each_served(self, what: str, op: Callable[[ReplicationPart, list[int]], Awaitable[T]]) -> list[T]:
        """``op(part, its slices)`` on every database serving slices, then each one's owner
        check: a result read where the map changed meanwhile is read again where the slices
        are now (``op`` must be a read, or idempotent)."""
        deadline: float | None = None
        while True:
            m, generation = self.dbs.map, self.dbs.generation
            served = self._served(m)
            if NOWHERE in m.owners:  # a move's switch in progress (or a dead move's): its slices wait
                deadline = deadline or self.router.deadline()
                nowhere = [s for s, owner in enumerate(m.owners) if owner == NOWHERE]
                await self.router.settle(deadline, what, generation, waiting=True, slices=nowhere)
                continue
            try:
                backends = [(await self.dbs.usable(i), slices) for i, slices in served.items()]
                got = await asyncio.gather(*(op(self._part(b), slices) for b, slices in backends))
                for b, slices in backends:
                    await b.partitions().check(m.epoch, slices, "read")
                return list(got)
            except SliceRangeMoved as e:
                deadline = deadline or self.router.deadline()
                await self.router.settle(deadline, what, generation, waiting=e.waiting)

    # -- the log's state: at home -------------------------------------------------------------

    async def ensure_log(self, log_name: str) -> None:
        await self.home.ensure_log(log_name)
        for p in await self._all_parts():
            await p.ensure_indexes(log_name)

    async def version_vector(self, log_name: str) -> VectorTime:
        return await self.home.version_vector(log_name)

    async def log_seq_nr(self, log_name: str) -> int:
        return await self.home.log_seq_nr(log_name)

    async def progress(self, log_name: str, source_location: str) -> int:
        return await self.home.progress(log_name, source_location)

    async def all_progress(self, log_name: str) -> dict[str, int]:
        return await self.home.all_progress(log_name)

    async def record_target_progress(self, log_name: str, target_location: str, log_seq_nr: int) -> None:
        await self.home.record_target_progress(log_name, target_location, log_seq_nr)

    async def target_progress(self, log_name: str) -> dict[str, int]:
        return await self.home.target_progress(log_name)

    async def reserve_positions(self, log_name: str, at_least: int) -> None:
        await self.home.reserve_positions(log_name, at_least)

    async def recovering(self, log_names: Sequence[str]) -> bool:
        return await self.home.recovering(log_names)

    async def begin_recovery(self, log_names: Sequence[str]) -> None:
        """The guard on every database (local writes refused everywhere), then the home flag."""
        for p in await self._others():
            await p.begin_recovery(log_names)
        await self.home.begin_recovery(log_names)

    async def end_recovery(self, log_names: Sequence[str]) -> None:
        await self.home.end_recovery(log_names)
        for p in await self._others():
            await p.end_recovery(log_names)

    async def guard_installed(self) -> bool:
        others = [await p.store.guard_installed() for p in await self._others()]
        return await self.home.guard_installed() and all(others)

    # -- writing: under the home lock ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _held(self, log_name: str) -> AsyncIterator[_Held]:
        """Transaction H on the home log row, repaired first; the position and version vector
        the block leaves are saved in H, which commits after the block (and its parts)."""
        home = self.home
        try:
            async with (
                self._writers.setdefault(log_name, asyncio.Lock()),
                home.connection() as conn,
                conn.transaction(),
            ):
                head = await log_head(conn, home.sql.lock_log, log_name)
                saved = (int(head["log_seq_nr"]), vector_time_of(head["version_vector"]))
                held = _Held(conn, saved[0], saved[1], bool(head["recovering"]))
                await self._adopt(log_name, held)
                yield held
                if (held.pos, held.vv) != saved:
                    await conn.execute(home.sql.save_log, log_name, held.pos, dump_vt(held.vv))
        except SliceRangeMoved:
            await self.dbs.reload()  # the next attempt writes where the slices are now
            raise

    async def _adopt(self, log_name: str, held: _Held) -> None:
        """The repair: events committed past the home position by a writer whose H did not
        commit become the log's (every database must answer, or nothing is handed out)."""
        found = await asyncio.gather(*(p.above(log_name, held.pos) for p in await self._all_parts()))
        top = max((t for t, _ in found), default=0)
        if top > held.pos:
            held.pos = top
            for _, vts in found:
                for vt in vts:
                    held.vv = held.vv.merge(vt)

    async def stamp(self, log_name: str, limit: int = STAMP_LIMIT) -> int:
        """Stamp local events (oldest first over every database); none while recovering (as
        :meth:`PostgresReplicationStore.stamp`)."""
        async with self._held(log_name) as held:
            return 0 if held.recovering else await self._stamp_locked(log_name, held, limit)

    async def _stamp_locked(self, log_name: str, held: _Held, limit: int) -> int:
        m = self.dbs.map
        async with contextlib.AsyncExitStack() as stack:
            found: list[tuple[Any, ReplicationPart, Any]] = []
            for i, slices in self._served(m).items():
                part = self._part(await self.dbs.usable(i))
                conn = await stack.enter_async_context(part.transaction())
                rows = await part.unstamped(conn, log_name, limit, slices, m.epoch)
                found.extend((r, part, conn) for r in rows)
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
            await asyncio.gather(*(p.stamp(c, log_name, rows) for p, c, rows in by_part.values()))
        held.pos, held.vv = pos, vv  # every part committed
        return len(found)

    async def write_replicated(
        self, log_name: str, source_location: str, events: Sequence[ReplicatedEvent], last_scanned: int
    ) -> WriteOutcome:
        """As :meth:`PostgresReplicationStore.write_replicated`, each event in the database of
        its slice, the progress saved in H after every part committed."""
        return await racing_local_writes(
            log_name, events, lambda b: self._write_replicated(log_name, source_location, b, events, last_scanned)
        )

    async def _write_replicated(
        self, log_name: str, source_location: str, batch: WriteBatch, events: Sequence[ReplicatedEvent],
        last_scanned: int,
    ) -> WriteOutcome:  # fmt: skip
        async with self._held(log_name) as held:
            while not held.recovering and await self._stamp_locked(log_name, held, STAMP_LIMIT) == STAMP_LIMIT:
                pass  # local events committed before this batch are stamped first
            new = await self._not_stored(log_name, events)
            if new:
                await self._insert(log_name, batch, events, new, held)
            await held.conn.execute(self.home.sql.save_progress, log_name, source_location, last_scanned)
        return WriteOutcome(written=len(new), dropped=len(events) - len(new), progress=last_scanned)

    async def _not_stored(self, log_name: str, events: Sequence[ReplicatedEvent]) -> list[int]:
        if not events:
            return []
        return not_in(events, await self._stored(log_name, [e.event_id for e in events]))

    async def _insert(
        self, log_name: str, batch: WriteBatch, events: Sequence[ReplicatedEvent], new: list[int], held: _Held
    ) -> None:
        """The batch's new events at the next positions, in batch order, each in its slice's
        database: every part's statement first, then the commits."""
        m = self.dbs.map
        groups: dict[int, list[int]] = {}
        for i in new:
            owner = m.owner(batch.slices[i])
            if owner == NOWHERE:  # the batch is pulled again; a dead move's switch is finished first
                if await self.router.dead_moves.clear([batch.slices[i]]):
                    await self.dbs.reload()
                raise JournalUnavailable(f"log {log_name!r}: a slice of the batch is being switched to a database")
            groups.setdefault(owner, []).append(i)
        position = {i: held.pos + 1 + k for k, i in enumerate(new)}
        async with contextlib.AsyncExitStack() as stack:
            work = []
            for db, idx in groups.items():
                part = self._part(await self.dbs.usable(db))
                conn = await stack.enter_async_context(part.transaction(replicated=True))
                work.append(
                    part.store.insert(conn, log_name, batch.select(idx), [events[i] for i in idx],
                                      [position[i] for i in idx])
                )  # fmt: skip
            await asyncio.gather(*work)
        held.pos, held.vv = held.pos + len(new), merged(held.vv, [events[i] for i in new])

    # -- reading: up to the home position -----------------------------------------------------

    async def read_log(self, log_name: str, after: int, limit: int) -> tuple[list[ReplicatedEvent], int]:
        upto = await self.home.log_seq_nr(log_name)
        if upto <= after:
            return [], after
        got = await self._each_served("read log", lambda p, slices: p.read_log(log_name, after, upto, limit, slices))
        rows = list(heapq.merge(*got, key=lambda r: int(r["log_seq_nr"])))[:limit]
        return events_of(rows), (int(rows[-1]["log_seq_nr"]) if rows else after)

    async def read_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> list[ReplicatedEvent]:
        upto = await self.home.log_seq_nr(log_name)
        got = await self._each_served("read ids", lambda p, slices: p.read_ids(log_name, ids, upto, slices))
        return events_of(list(heapq.merge(*got, key=lambda r: int(r["log_seq_nr"]))))

    async def missing_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        if not ids:
            return []
        stored = await self._stored(log_name, ids)
        return [i for i in ids if i not in stored]

    async def _stored(self, log_name: str, ids: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        """Those of ``ids`` stored in any database (in any slice: a move's copy counts)."""
        got = await asyncio.gather(*(p.stored_ids(log_name, ids) for p in await self._all_parts()))
        return set().union(*got)

    async def event_ids(self, log_name: str) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for got in await self._each_served("event ids", lambda p, slices: p.event_ids(log_name, slices)):
            for k, n in got.items():
                out[k] = out.get(k, 0) + n
        return out

    async def entity_events(self, persistence_id: str) -> list[tuple[Serialized, str, int, VectorTime]]:
        return await self.router.on_owner(
            slice_for(persistence_id), "entity events", lambda b: self._part(b).store.entity_events(persistence_id),
            check="read",
        )  # fmt: skip

    # -- deleting: on every database ----------------------------------------------------------

    async def delete_logically(self, log_name: str, to_log_seq_nr: int) -> int:
        """Up to the committed position, on every database (refused while a range of it moves)."""
        applied = min(to_log_seq_nr, await self.home.log_seq_nr(log_name))
        epoch = self.dbs.map.epoch
        await self._each_served("delete", lambda p, slices: p.delete_logically(log_name, applied, slices, epoch))
        return applied

    async def delete_physically(self, log_name: str, to_log_seq_nr: int, replicated_to: Sequence[str]) -> int:
        progress = await self.target_progress(log_name)
        bound = min([to_log_seq_nr, *(progress.get(t, 0) for t in replicated_to)])
        if bound > 0:
            epoch = self.dbs.map.epoch
            await self._each_served("delete", lambda p, slices: p.delete_physically(log_name, bound, slices, epoch))
        return max(bound, 0)

    async def delete_invalid_snapshots(self, log_name: str) -> int:
        return sum(await self._each_served("delete snapshots", lambda p, _: p.store.delete_invalid_snapshots(log_name)))


_check: type[ReplicationStore] = PartitionedReplicationStore
"""mypy checks here that the store implements the whole protocol."""
