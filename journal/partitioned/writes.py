"""A write batch split by database: each part written by that database's backend, at once.

Every call stays atomic and conflict-checked on its own (each database's backend writes its
part as it writes any batch), and gets one outcome, at its index in the caller's batch. Calls
whose range the database refuses (it moved, or a move is switching it) go again once the map
says where the range is; calls of a database that is down fail with JournalUnavailable at once,
without holding up the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

from ..errors import JournalUnavailable, SliceRangeMoved
from ..write_batch import BatchResult, ResultBuilder, WriteBatch
from .databases import Databases
from .layout import NOWHERE
from .routing import Router


class PartitionedWrites:
    def __init__(self, dbs: Databases, router: Router) -> None:
        self.dbs = dbs
        self.router = router

    async def write_batch(self, batch: WriteBatch) -> BatchResult:
        m = self.dbs.map
        owners, slices = m.owners, batch.slices
        first = owners[slices[0]]
        generation = self.dbs.generation
        if first != NOWHERE and all([owners[s] == first and not m.fenced[s] for s in slices]):
            out = await self._part(first, batch)  # every call on one database: the common case
            if not any([type(e) is SliceRangeMoved for e in out.errors.values()]):
                return out
            result = ResultBuilder(len(batch))
            pending, waiting = self._file(result, range(len(batch)), out)
            retry = True
        else:
            result = ResultBuilder(len(batch))
            pending, retry, waiting = list(range(len(batch))), False, False
        deadline = self.router.deadline()
        while pending:
            if retry:
                try:
                    await self.router.settle(deadline, "write", generation, waiting)
                except JournalUnavailable as e:
                    for i in pending:
                        result.failed(i, e)
                    break
            m, generation = self.dbs.map, self.dbs.generation
            groups: dict[int, list[int]] = {}
            later: list[int] = []
            for i in sorted(pending):
                s = slices[i]
                o = m.owners[s]
                if o == NOWHERE or m.fenced[s]:
                    later.append(i)
                else:
                    groups.setdefault(o, []).append(i)
            outs = await asyncio.gather(*(self._part(db, batch.select(idx)) for db, idx in groups.items()))
            pending, retry, waiting = later, True, bool(later)
            for idx, out in zip(groups.values(), outs, strict=True):
                again, wait = self._file(result, idx, out)
                pending += again
                waiting = waiting or wait
        return result.result()

    @staticmethod
    def _file(result: ResultBuilder, calls: Sequence[int], out: BatchResult) -> tuple[list[int], bool]:
        """A part's outcomes into the batch's result; the calls refused as moved are returned
        (to go again), and whether a move's switch is under way."""
        again: list[int] = []
        waiting = False
        for j, i in enumerate(calls):
            e = out.errors.get(j)
            if isinstance(e, SliceRangeMoved):
                again.append(i)
                waiting = waiting or e.waiting
            elif e is not None:
                result.failed(i, e)
            else:
                result.written(i, out.first_seq_nrs[j], out.db_timestamps[j])
        return again, waiting

    async def write_chunks(self, chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        """A bulk write: every chunk checked first (a bad one further on writes nothing), then
        each written as a batch (split by database)."""
        return [await self.write_batch(c) for c in list(chunks)]

    async def _part(self, db: int, batch: WriteBatch) -> BatchResult:
        """One database's part; an outage fails its calls (the others' go on)."""
        try:
            backend = await self.dbs.usable(db)
            return await backend.write_batch(batch)
        except JournalUnavailable as e:
            self.dbs.failed(db, e)
            return BatchResult.failed(len(batch), e)
