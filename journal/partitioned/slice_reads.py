"""Slice queries over several databases: each range read where it is served, pages merged.

The slice query algorithms (:mod:`journal.query`) run unchanged over this
:class:`~journal.backend.SliceQueryBackend`. Each database keeps its own horizon (a
:class:`~journal.query.horizon.HorizonTracker` per database: the horizon argument holds per
database, with its own clock and its own writers); the bound a query reads up to is the least
of them. A page of a range that spans databases is the first ``limit`` rows, in
``(db_timestamp, seq_nr, persistence_id)`` order, of the same page read on each database, so
its offsets, its per-pid order and its exactly-once delivery are those of one database holding
every row.

A page is read from a database only below a bound that a horizon reading of that very database
proved (``covered``): after the map changed, a bound taken from the databases of the old map is
not trusted for a new one until its own horizon has passed it (the wait is the clock skew
between the two servers, usually nothing). Backtracking mode's "now" is that least horizon too.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from ..backend import (
    HorizonReading,
    Listening,
    PageRequest,
    SliceQueryBackend,
    SliceRange,
    StoredEvent,
    stored_event,
)
from ..errors import JournalUnavailable, SliceRangeMoved
from ..ids import slice_for
from ..postgres import PostgresBackend
from ..query.horizon import HorizonTracker
from .databases import Databases
from .layout import NOWHERE, Piece
from .routing import POLL, Router

T = TypeVar("T")


def _key(r: Any) -> tuple[datetime, int, str]:
    return (r[4], r[3], r[0])


def events_of(backend: PostgresBackend) -> SliceQueryBackend:
    """A database's slice reads of ``event_journal``."""
    return backend.slices


class PartitionedSliceReads:
    """:class:`~journal.backend.SliceQueryBackend` over the databases of a partitioned journal."""

    def __init__(
        self, dbs: Databases, router: Router, reader: Callable[[PostgresBackend], SliceQueryBackend] = events_of
    ) -> None:
        """``reader``: which table of each database (its events, or its durable states)."""
        self.dbs = dbs
        self.router = router
        self.reader = reader
        self._trackers: dict[int, HorizonTracker] = {}
        self.covered: dict[int, datetime] = {}
        """Per database: the greatest bound a horizon reading of it proved."""

    # -- the horizon --------------------------------------------------------------------------

    async def _bound(self, db: int) -> datetime:
        backend = await self.dbs.usable(db)
        try:
            reading = await self.reader(backend).horizon_reading()
        except JournalUnavailable as e:
            self.dbs.failed(db, e)
            raise
        bound = self._trackers.setdefault(db, HorizonTracker()).observe(reading)
        if db not in self.covered or bound > self.covered[db]:
            self.covered[db] = bound
        return bound

    async def horizon_reading(self) -> HorizonReading:
        """The least horizon of the databases that serve a slice (and answer), as a reading
        with no writer."""
        got = await asyncio.gather(*(self._bound(db) for db in self.dbs.map.served()), return_exceptions=True)
        bounds = [b for b in got if isinstance(b, datetime)]
        if not bounds:
            raise next(e for e in got if isinstance(e, BaseException))
        # a database that does not answer is left out: a page is read from a database only
        # below a bound its own reading proved (_cover), so its range waits, the others go on
        return HorizonReading(now=min(bounds))

    async def db_now(self) -> datetime:
        return (await self.horizon_reading()).now

    async def _cover(self, dbs: Sequence[int], bound: datetime) -> None:
        """Wait until a horizon reading of each database proved ``bound`` (see the module doc)."""
        deadline: float | None = None
        for db in dbs:
            while db not in self.covered or self.covered[db] < bound:
                if await self._bound(db) >= bound:
                    break
                loop = asyncio.get_running_loop()
                deadline = deadline or self.router.deadline()
                if loop.time() > deadline:
                    raise JournalUnavailable(f"the horizon of {self.dbs.names[db]} did not reach {bound}")
                await asyncio.sleep(POLL)

    # -- pages --------------------------------------------------------------------------------

    async def _pieces(self, et: str, lo: int, hi: int, bound: datetime, what: str, generation: int) -> list[Piece]:
        deadline: float | None = None
        while True:
            pieces = self.dbs.map.pieces(lo, hi)
            if all(p.database != NOWHERE for p in pieces):
                await self._cover(sorted({p.database for p in pieces}), bound)
                return pieces
            deadline = deadline or self.router.deadline()
            nowhere = [p.min_slice for p in pieces if p.database == NOWHERE]  # a switch (of a dead move?)
            await self.router.settle(deadline, what, generation, waiting=True, slices=nowhere)
            generation = self.dbs.generation

    async def _each(
        self, slices: SliceRange, bound: datetime, what: str,
        read: Callable[[PostgresBackend, SliceRange], Awaitable[T]],
    ) -> list[T]:  # fmt: skip
        """``read`` on every piece of the range (a refused piece: the map reloaded, all again)."""
        deadline: float | None = None
        while True:
            generation = self.dbs.generation
            pieces = await self._pieces(slices.entity_type, slices.min_slice, slices.max_slice, bound, what, generation)
            try:
                return list(
                    await asyncio.gather(
                        *(self._read(p, SliceRange(slices.entity_type, p.min_slice, p.max_slice), read) for p in pieces)
                    )
                )
            except SliceRangeMoved as e:
                deadline = deadline or self.router.deadline()
                await self.router.settle(deadline, what, generation, waiting=e.waiting)

    async def _read(self, p: Piece, r: SliceRange, read: Callable[[PostgresBackend, SliceRange], Awaitable[T]]) -> T:
        backend = await self.dbs.usable(p.database)
        try:
            return await read(backend, r)
        except JournalUnavailable as e:
            if not isinstance(e, SliceRangeMoved):
                self.dbs.failed(p.database, e)
            raise

    async def read_slice_rows(self, slices: SliceRange, page: PageRequest, *, with_payload: bool = True) -> list[Any]:
        got = await self._each(
            slices, page.to_timestamp, "slice page",
            lambda b, r: self.reader(b).read_slice_rows(r, page, with_payload=with_payload),
        )  # fmt: skip
        if len(got) == 1:
            return got[0]
        return list(heapq.merge(*got, key=_key))[: page.limit]

    async def read_slice_page(
        self, slices: SliceRange, page: PageRequest, *, with_payload: bool = True
    ) -> list[StoredEvent]:
        return [stored_event(r) for r in await self.read_slice_rows(slices, page, with_payload=with_payload)]

    async def next_slice_timestamp(
        self, slices: SliceRange, from_timestamp: datetime, to_timestamp: datetime
    ) -> datetime | None:
        got = await self._each(
            slices, to_timestamp, "next slice timestamp",
            lambda b, r: self.reader(b).next_slice_timestamp(r, from_timestamp, to_timestamp),
        )  # fmt: skip
        found = [t for t in got if t is not None]
        return min(found) if found else None

    # -- by persistence id --------------------------------------------------------------------

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        return await self.router.on_owner(
            slice_for(persistence_id), "timestamp of", lambda b: self.reader(b).timestamp_of(persistence_id, seq_nr),
            check="read",
        )  # fmt: skip

    async def load_event(self, persistence_id: str, seq_nr: int) -> StoredEvent | None:
        return await self.router.on_owner(
            slice_for(persistence_id), "load event", lambda b: self.reader(b).load_event(persistence_id, seq_nr),
            check="read",
        )  # fmt: skip

    async def read_events(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[StoredEvent]:
        return await self.router.on_owner(
            slice_for(persistence_id), "read events",
            lambda b: self.reader(b).read_events(persistence_id, from_seq_nr, to_seq_nr, limit), check="read",
        )  # fmt: skip

    async def persistence_ids(self, entity_type: str | None, after: str | None, limit: int) -> list[str]:
        """Each database's next ids, merged; an id counts where its slice is served now (a
        move's copies and leftovers are not listed twice)."""
        m = self.dbs.map
        served = m.served()
        got = await asyncio.gather(*(self._ids(db, entity_type, after, limit) for db in served))
        ids = (pid for db, its in zip(served, got, strict=True) for pid in its if m.owner(slice_for(pid)) == db)
        return sorted(ids)[:limit]

    async def _ids(self, db: int, entity_type: str | None, after: str | None, limit: int) -> list[str]:
        backend = await self.dbs.usable(db)
        return await self.reader(backend).persistence_ids(entity_type, after, limit)

    # -- notifications ------------------------------------------------------------------------

    async def listen(self, on_notify: Callable[[str], None], on_reconnect: Callable[[], None]) -> Listening:
        listeners = _Listeners(self.dbs, on_notify, on_reconnect)
        await listeners.follow()
        self.dbs.on_reload(listeners.follow_soon)
        return listeners


class _Listeners:
    """One LISTEN connection per database that serves a slice; more as the map grows."""

    def __init__(self, dbs: Databases, on_notify: Callable[[str], None], on_reconnect: Callable[[], None]) -> None:
        self.dbs = dbs
        self.on_notify = on_notify
        self.on_reconnect = on_reconnect
        self.by_db: dict[int, Listening] = {}
        self.closed = False
        self._task: asyncio.Task[None] | None = None

    async def follow(self) -> None:
        for db in self.dbs.map.served():
            if db not in self.by_db and not self.closed:
                self.by_db[db] = await events_of(self.dbs.backends[db]).listen(self.on_notify, self.on_reconnect)

    def follow_soon(self) -> None:
        """After a map load: listen on databases new to the map (and wake every query)."""
        if not self.closed and any(db not in self.by_db for db in self.dbs.map.served()):
            self._task = asyncio.ensure_future(self.follow())
            self.on_reconnect()

    async def close(self) -> None:
        self.closed = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        for listening in self.by_db.values():
            await listening.close()
        self.by_db.clear()
