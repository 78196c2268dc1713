"""A write batch split by database: each part written by that database's backend, at once.

Every call stays atomic and conflict-checked on its own (each database's backend writes its
part as it writes any batch), and gets one outcome, at its index in the caller's batch. Calls
whose range the database refuses (it moved, or a move is switching it) go again once the map
says where the range is, on their own (:class:`~journal.write_batch.WriteLater`: the group
commit answers the batch's other calls at once), and so do the calls of a database whose write
was interrupted, while it is resolved from the rows; calls of a database that is down fail with
JournalUnavailable at once, without holding up the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence

from ..errors import JournalUnavailable, SliceRangeMoved
from ..write_batch import BatchResult, ResultBuilder, WriteBatch, WriteLater, deferred
from .databases import Databases
from .layout import NOWHERE
from .routing import Router

Held = tuple[list[int], WriteLater]
"""Calls of a batch (their indexes, in the order of ``WriteLater.calls``) whose database's write
was interrupted, and its resolution."""


class PartitionedWrites:
    def __init__(self, dbs: Databases, router: Router) -> None:
        self.dbs = dbs
        self.router = router

    async def write_batch(self, batch: WriteBatch) -> BatchResult:
        """Every call that can be written now, at once; the calls of a range a move fences or
        switches (in the map, or refused by their database), and those of a database whose
        write was interrupted (resolved from its rows), come back
        :class:`~journal.write_batch.WriteLater`: they wait on their own (``finish``), so the
        other calls of a shared batch are answered without waiting for them."""
        m = self.dbs.map
        owners, slices = m.owners, batch.slices
        first = owners[slices[0]]
        generation = self.dbs.generation
        if first != NOWHERE and all([owners[s] == first and not m.fenced[s] for s in slices]):
            out = await self._part(first, batch)  # every call on one database: the common case
            if not any([type(e) is SliceRangeMoved for e in out.errors.values()]):
                return out
            result = ResultBuilder(len(batch))
            pending, waiting, held = self._file(result, range(len(batch)), out)
        else:
            result = ResultBuilder(len(batch))
            pending, waiting, held = await self._round(batch, result, range(len(batch)))
        if not pending and not held:
            return result.result()
        calls = sorted([*pending, *(i for part, _ in held for i in part)])
        rest = batch.select(pending)
        at = {i: k for k, i in enumerate(calls)}

        async def finish() -> BatchResult:
            got = ResultBuilder(len(calls))
            jobs = [(part, later.finish()) for part, later in held]
            if pending:
                jobs.append((pending, self._wait_and_write(rest, generation, waiting)))
            outs = await asyncio.gather(*(job for _, job in jobs))
            for (part, _), out in zip(jobs, outs, strict=True):
                got.merge([at[i] for i in part], out)
            return got.result()

        later = WriteLater(calls, finish)
        for i in calls:
            result.failed(i, later)
        return result.result()

    async def _wait_and_write(self, batch: WriteBatch, generation: int, waiting: bool) -> BatchResult:
        """The calls of ranges that a move fences or switches, once the map says where they are
        written (reloaded after each refusal), up to ``partitions.fence_wait``."""
        result = ResultBuilder(len(batch))
        pending: list[int] = list(range(len(batch)))
        deadline = self.router.deadline()
        while pending:
            try:
                await self.router.settle(
                    deadline, "write", generation, waiting, slices=[batch.slices[i] for i in pending]
                )
            except JournalUnavailable as e:
                for i in pending:
                    result.failed(i, e)
                break
            generation = self.dbs.generation
            pending, waiting, held = await self._round(batch, result, pending)
            for part, later in held:  # already apart: an interrupted write is resolved here
                result.merge(part, await later.finish())
        return result.result()

    async def _round(
        self, batch: WriteBatch, result: ResultBuilder, calls: Iterable[int]
    ) -> tuple[list[int], bool, list[Held]]:
        """One round of ``calls``: each written where the map says its slice is served; the
        ones to do again (fenced, served nowhere, or refused) are returned, with whether a move's
        fence or switch is under way, and the calls of each database whose write was
        interrupted (with its resolution)."""
        m = self.dbs.map
        groups: dict[int, list[int]] = {}
        later: list[int] = []
        for i in sorted(calls):
            s = batch.slices[i]
            o = m.owners[s]
            if o == NOWHERE or m.fenced[s]:
                later.append(i)
            else:
                groups.setdefault(o, []).append(i)
        outs = await asyncio.gather(*(self._part(db, batch.select(idx)) for db, idx in groups.items()))
        waiting = bool(later)
        held: list[Held] = []
        for idx, out in zip(groups.values(), outs, strict=True):
            again, wait, part_held = self._file(result, idx, out)
            later += again
            held += part_held
            waiting = waiting or wait
        return later, waiting, held

    @staticmethod
    def _file(result: ResultBuilder, calls: Sequence[int], out: BatchResult) -> tuple[list[int], bool, list[Held]]:
        """A part's outcomes into the batch's result; the calls refused as moved are returned
        (to go again), whether a move's switch is under way, and the calls whose write was
        interrupted (at their index in the batch) with their resolution."""
        again: list[int] = []
        waiting = False
        later = deferred(out)
        for j, i in enumerate(calls):
            e = out.errors.get(j)
            if isinstance(e, SliceRangeMoved):
                again.append(i)
                waiting = waiting or e.waiting
            elif e is later and later is not None:
                pass
            elif e is not None:
                result.failed(i, e)
            else:
                result.written(i, out.first_seq_nrs[j], out.db_timestamps[j])
        held = [] if later is None else [([calls[j] for j in later.calls], later)]
        return again, waiting, held

    async def write_chunks(self, chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        """A bulk write: every chunk checked first (a bad one further on writes nothing), then
        each written as a batch (split by database)."""
        return [await self.write_batch(c) for c in list(chunks)]

    async def _part(self, db: int, batch: WriteBatch) -> BatchResult:
        """One database's part; an outage fails its calls (the others' go on). A write whose
        connection broke comes back :class:`~journal.write_batch.WriteLater`: its resolution
        waits on its own."""
        try:
            backend = await self.dbs.usable(db)
            out = await backend.write_batch_resolving_apart(batch)
        except JournalUnavailable as e:
            self.dbs.failed(db, e)
            return BatchResult.failed(len(batch), e)
        later = deferred(out)
        if later is None:
            return out
        resolution = later.finish

        async def finish() -> BatchResult:
            try:
                return await resolution()
            except JournalUnavailable as e:
                self.dbs.failed(db, e)
                return BatchResult.failed(len(later.calls), e)

        later.finish = finish
        return out
