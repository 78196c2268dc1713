"""The durable state store over several databases: each state in the database serving its slice.

A pid's ``durable_state`` row lives where its events do (docs/durable-state.md, "Data
partitions"): gets and hard deletes go to the database serving the pid's slice, an upsert's rows
are split by database (one statement each, at once), changes by slices read each range where it
is served (:class:`~.slice_reads.PartitionedSliceReads` over each database's ``durable_state``),
and ``journal partitions move`` moves a range's states with its events (:mod:`.move`). Each
database checks in the upsert's own statement that it serves the rows' slices at the writer's map
epoch; a refusal reloads the map and sends the refused rows again where they are served now (the
statement wrote nothing), waiting while a move switches their range, as event writes do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..backend import SliceQueryBackend, StateColumn, StateOutcome, StateRow, StateTransaction, StoredState
from ..errors import JournalUnavailable, SliceRangeMoved
from ..ids import slice_for
from ..postgres import PostgresBackend
from .databases import Databases
from .layout import NOWHERE
from .routing import Router
from .slice_reads import PartitionedSliceReads


def _states_of(backend: PostgresBackend) -> SliceQueryBackend:
    """A database's slice reads of ``durable_state``."""
    return backend.durable_state_store().changes()


class PartitionedDurableState:
    """:class:`~journal.backend.DurableStateStore` over the databases of a partitioned journal."""

    def __init__(self, dbs: Databases, router: Router) -> None:
        self.dbs = dbs
        self.router = router
        self._changes = PartitionedSliceReads(dbs, router, _states_of)

    def changes(self) -> PartitionedSliceReads:
        return self._changes

    async def get_state(self, persistence_id: str) -> StoredState | None:
        return await self.router.on_owner(
            slice_for(persistence_id), "durable state get",
            lambda b: b.durable_state_store().get_state(persistence_id), check="read",
        )  # fmt: skip

    async def hard_delete_state(self, persistence_id: str) -> bool:
        return await self.router.on_owner(
            slice_for(persistence_id), "durable state hard delete",
            lambda b: b.durable_state_store().hard_delete_state(persistence_id),
        )  # fmt: skip

    async def check_columns(self, columns: Sequence[StateColumn]) -> None:
        """On every database that serves a slice (an additional column must be in each)."""
        for db in self.dbs.map.served():
            await (await self.dbs.usable(db)).durable_state_store().check_columns(columns)

    async def write_columns(self, conn: Any, persistence_id: str, values: Sequence[tuple[StateColumn, Any]]) -> None:
        """On ``conn``, a connection to the database of the pid's slice (the upsert's)."""
        owner = self.dbs.backends[max(self.dbs.map.owner(slice_for(persistence_id)), 0)]
        await owner.durable_state_store().write_columns(conn, persistence_id, values)

    async def upsert_states(
        self, rows: Sequence[StateRow], in_transaction: StateTransaction | None = None
    ) -> list[StateOutcome]:
        """Each database's rows in one statement (and, with ``in_transaction``, in one transaction
        with it), the databases at once. Rows a database refused (their range moved) are sent
        again where they are served now. A database that is unavailable gives its rows its
        JournalUnavailable as their outcome; the other databases' rows are written regardless."""
        out: dict[int, StateOutcome] = {}
        todo = list(range(len(rows)))
        deadline: float | None = None
        while todo:
            m, generation = self.dbs.map, self.dbs.generation
            groups: dict[int, list[int]] = {}
            for i in todo:
                groups.setdefault(m.owner(rows[i].slice), []).append(i)
            nowhere = groups.pop(NOWHERE, [])
            got = await asyncio.gather(
                *(self._upsert_on(db, [rows[i] for i in its], in_transaction) for db, its in groups.items()),
                return_exceptions=True,
            )
            todo, waiting, error = nowhere, bool(nowhere), None
            for its, answer in zip(groups.values(), got, strict=True):
                if isinstance(answer, SliceRangeMoved):
                    todo += its
                    waiting = waiting or answer.waiting
                elif isinstance(answer, JournalUnavailable):
                    out.update(dict.fromkeys(its, answer))
                elif isinstance(answer, BaseException):
                    error = error or answer
                else:
                    out.update(zip(its, answer, strict=True))
            if error is not None:
                raise error
            if todo:
                deadline = deadline or self.router.deadline()
                slices = sorted({rows[i].slice for i in todo})
                await self.router.settle(deadline, "durable state upsert", generation, waiting, slices)
        return [out[i] for i in range(len(rows))]

    async def _upsert_on(
        self, db: int, rows: list[StateRow], in_transaction: StateTransaction | None
    ) -> list[StateOutcome]:
        backend = await self.dbs.usable(db)
        try:
            return await backend.durable_state_store().upsert_states(rows, in_transaction)
        except JournalUnavailable as e:
            if not isinstance(e, SliceRangeMoved):
                self.dbs.failed(db, e)
            raise

    async def delete_tombstones(self, before: datetime, *, dry_run: bool = False) -> int:
        """Each database's tombstones of the slices it serves (its leftovers of a move are not
        counted), piece by piece of the map; a piece being moved waits for the move, as deletes
        do, and is done again where it is served then (the pieces done are not done again)."""
        done = 0
        left = [(0, 1023)]
        deadline: float | None = None
        while True:
            generation = self.dbs.generation
            rest: list[tuple[int, int]] = []
            held: list[int] = []
            for lo, hi in left:
                for p in self.dbs.map.pieces(lo, hi):
                    if p.database == NOWHERE or held:  # after a refusal: once the map is reloaded
                        rest.append((p.min_slice, p.max_slice))
                        held.append(p.min_slice)
                        continue
                    backend = await self.dbs.usable(p.database)
                    try:
                        done += await backend.durable_state_store().delete_tombstones(
                            before, dry_run=dry_run, slices=(p.min_slice, p.max_slice)
                        )
                    except SliceRangeMoved:
                        rest.append((p.min_slice, p.max_slice))
                        held.append(p.min_slice)
            if not rest:
                return done
            left = rest
            deadline = deadline or self.router.deadline()
            await self.router.settle(deadline, "durable state tombstones", generation, True, held)
