"""The replicated logs of a partitioned location: the one store
(:class:`~journal.postgres.replication_store.ReplicationLogs`) with the log's state at home and
its events by slice.

A log's state (position, version vector, recovering flag, progress per source and per target)
is the ``replication_log`` row and its companions in the journal's home database, like leases
and keys; its events stay in the database of their slice. :class:`PartitionedPlaces` says which
database each statement goes to; what each step guarantees (the home row lock over the parts'
commits, readers stopping at the committed position, the adoption of a dead writer's positions,
moves) is written beside the store's logic.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..backend import ReplicationStore
from ..errors import JournalUnavailable, SliceRangeMoved
from ..ids import slice_for
from ..postgres import LogPlaces, PostgresBackend, ReplicationLogs, ReplicationPart
from .databases import Databases
from .layout import NOWHERE, PartitionMap
from .routing import Router

T = TypeVar("T")


class PartitionedPlaces:
    """Where a partitioned location's statements go: the log rows to the home database, the
    events to the databases serving their slices, each part's writes committed before H."""

    bounded = True

    def __init__(self, dbs: Databases, router: Router, home: Callable[[], PostgresBackend], location: str) -> None:
        self.dbs = dbs
        self.router = router
        self.location = location
        self._home_backend = home
        self._home: ReplicationPart | None = None
        self._parts: dict[int, ReplicationPart] = {}

    @property
    def home(self) -> ReplicationPart:
        b = self._home_backend()
        if self._home is None or self._home.backend is not b:
            self._home = ReplicationPart(b, self.location)
        return self._home

    def _part(self, backend: PostgresBackend) -> ReplicationPart:
        p = self._parts.get(id(backend))
        if p is None or p.backend is not backend:
            p = self._parts[id(backend)] = ReplicationPart(backend, self.location)
        return p

    async def everywhere(self) -> list[ReplicationPart]:
        """Every database the journal knows (each must answer: JournalUnavailable otherwise)."""
        return [self._part(await self.dbs.usable(i)) for i in range(len(self.dbs.backends))]

    async def others(self) -> list[ReplicationPart]:
        home = self._home_backend()
        return [p for p in await self.everywhere() if p.backend is not home]

    async def apart(self) -> list[ReplicationPart]:
        return await self.everywhere()

    @staticmethod
    def _served(m: PartitionMap) -> dict[int, list[int]]:
        """Database index -> the slices it serves."""
        out: dict[int, list[int]] = {}
        for s, owner in enumerate(m.owners):
            if owner != NOWHERE:
                out.setdefault(owner, []).append(s)
        return out

    async def serving(self, what: str, op: Callable[[ReplicationPart], Awaitable[T]]) -> list[T]:
        """``op`` on every database serving slices, then each one's owner check: a result read
        where the map changed meanwhile is read again where the slices are now."""
        deadline: float | None = None
        while True:
            m, generation = self.dbs.map, self.dbs.generation
            if NOWHERE in m.owners:  # a move's switch in progress (or a dead move's): its slices wait
                deadline = deadline or self.router.deadline()
                nowhere = [s for s, owner in enumerate(m.owners) if owner == NOWHERE]
                await self.router.settle(deadline, what, generation, waiting=True, slices=nowhere)
                continue
            try:
                backends = [(await self.dbs.usable(i), slices) for i, slices in self._served(m).items()]
                got = await asyncio.gather(*(op(self._part(b).serving(slices, m.epoch)) for b, slices in backends))
                for b, slices in backends:
                    await b.partitions().check(m.epoch, slices, "read")
                return list(got)
            except SliceRangeMoved as e:
                deadline = deadline or self.router.deadline()
                await self.router.settle(deadline, what, generation, waiting=e.waiting)

    async def writing(self) -> list[ReplicationPart]:
        m = self.dbs.map
        return [self._part(await self.dbs.usable(i)).serving(slices, m.epoch) for i, slices in self._served(m).items()]

    async def placed(
        self, log_name: str, slices: Sequence[int], new: Sequence[int]
    ) -> list[tuple[ReplicationPart, list[int]]]:
        m = self.dbs.map
        groups: dict[int, list[int]] = {}
        for i in new:
            owner = m.owner(slices[i])
            if owner == NOWHERE:  # the batch is pulled again; a dead move's switch is finished first
                if await self.router.dead_moves.clear([slices[i]]):
                    await self.dbs.reload()
                raise JournalUnavailable(f"log {log_name!r}: a slice of the batch is being switched to a database")
            groups.setdefault(owner, []).append(i)
        return [(self._part(await self.dbs.usable(db)), idx) for db, idx in groups.items()]

    async def stored(self, held: Any, log_name: str, ids: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        got = await asyncio.gather(*(p.stored_ids(log_name, ids) for p in await self.everywhere()))
        return set().union(*got)

    async def on_owner(self, persistence_id: str, what: str, op: Callable[[ReplicationPart], Awaitable[T]]) -> T:
        return await self.router.on_owner(slice_for(persistence_id), what, lambda b: op(self._part(b)), check="read")

    def within(
        self, held: Any, part: ReplicationPart, *, replicated: bool
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        """A transaction of ``part``'s database, committed before H."""
        return part.transaction(replicated=replicated)

    async def moved(self) -> None:
        await self.dbs.reload()


class PartitionedReplicationStore(ReplicationLogs):
    """The replicated logs of ``location`` over a partitioned journal (:class:`ReplicationStore`)."""

    def __init__(self, dbs: Databases, router: Router, home: Callable[[], PostgresBackend], location: str) -> None:
        super().__init__(PartitionedPlaces(dbs, router, home, location), location)


_check: type[ReplicationStore] = PartitionedReplicationStore
"""mypy checks here that the store implements the whole protocol."""
_places: type[LogPlaces] = PartitionedPlaces
