"""A batch of writes split by database: each part written by that database's backend, at once.

Every call stays atomic and conflict-checked on its own (each database's backend writes its
part as it writes any batch), and gets one outcome. Calls whose range the database refuses (it
moved, or a move is switching it) go again once the map says where the range is; calls of a
database that is down fail with JournalUnavailable at once, without holding up the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..backend import WriteRequest, WriteResult
from ..errors import JournalUnavailable, SliceRangeMoved
from .databases import Databases
from .layout import NOWHERE
from .routing import Router


class PartitionedWrites:
    def __init__(self, dbs: Databases, router: Router) -> None:
        self.dbs = dbs
        self.router = router

    async def write_batch(self, requests: Sequence[WriteRequest]) -> list[WriteResult | Exception]:
        m = self.dbs.map
        owners = m.owners
        first = owners[requests[0].slice]
        generation = self.dbs.generation
        if first != NOWHERE and all([owners[r.slice] == first and not m.fenced[r.slice] for r in requests]):
            out = await self._part(first, requests)  # every call on one database: the common case
            if not any([type(r) is SliceRangeMoved for r in out]):
                return out
            results: list[WriteResult | Exception | None] = list(out)
            pending = [i for i, r in enumerate(out) if type(r) is SliceRangeMoved]
            retry = True
            waiting = any(r.waiting for r in out if isinstance(r, SliceRangeMoved))
        else:
            results = [None] * len(requests)
            pending = list(range(len(requests)))
            retry = waiting = False
        deadline = self.router.deadline()
        while pending:
            if retry:
                try:
                    await self.router.settle(deadline, "write", generation, waiting)
                except JournalUnavailable as e:
                    for i in pending:
                        results[i] = e
                    break
            m, generation = self.dbs.map, self.dbs.generation
            groups: dict[int, list[int]] = {}
            later: list[int] = []
            for i in pending:
                s = requests[i].slice
                o = m.owners[s]
                if o == NOWHERE or m.fenced[s]:
                    later.append(i)
                else:
                    groups.setdefault(o, []).append(i)
            outs = await asyncio.gather(*(self._part(db, [requests[i] for i in idx]) for db, idx in groups.items()))
            pending, retry, waiting = later, True, bool(later)
            for idx, out in zip(groups.values(), outs, strict=True):
                for i, r in zip(idx, out, strict=True):
                    if isinstance(r, SliceRangeMoved):
                        pending.append(i)
                        waiting = waiting or r.waiting
                    else:
                        results[i] = r
        return [r if r is not None else JournalUnavailable("write not attempted") for r in results]

    async def _part(self, db: int, requests: Sequence[WriteRequest]) -> list[WriteResult | Exception]:
        """One database's part; an outage fails its calls (the others' go on)."""
        try:
            backend = await self.dbs.usable(db)
            return await backend.write_batch(requests)
        except JournalUnavailable as e:
            self.dbs.failed(db, e)
            return [e] * len(requests)
