"""The tag view and the cleanup tool over several databases: rows by pid where its slice is served.

A tag spans persistence ids of every slice, so a tag page is the first ``limit`` rows, in the
tag view's order, of the same page read on each database serving a slice; a row counts only
from the database that serves its pid now (a move's copies and leftovers are not read twice).
Everything keyed by a persistence id goes to the database of its slice.
"""

from __future__ import annotations

import asyncio
import heapq
import uuid
from collections.abc import Sequence
from typing import Any

from ..backend import PID, TIMEUUID, PidFootprint, TaggedEvent, TagPageRow, TagProgress, TagRow
from ..errors import JournalUnavailable
from ..ids import slice_for
from ..timeuuid import ticks
from .databases import Databases
from .routing import Router


def _tag_key(r: TagPageRow) -> tuple[int, bytes]:
    u: uuid.UUID = r[TIMEUUID]
    return (ticks(u), u.bytes)


class PartitionedTagStore:
    """:class:`~journal.backend.TagStore` over the databases of a partitioned journal."""

    def __init__(self, dbs: Databases, router: Router) -> None:
        self.dbs = dbs
        self.router = router

    async def write_tag_rows(self, rows: Sequence[TagRow]) -> None:
        by_slice: dict[int, list[TagRow]] = {}
        for r in rows:
            by_slice.setdefault(slice_for(r.persistence_id), []).append(r)

        async def one(s: int, its: list[TagRow]) -> None:
            await self.router.on_owner(s, "write tag rows", lambda b: b.tag_store().write_tag_rows(its), check="write")

        await asyncio.gather(*(one(s, its) for s, its in by_slice.items()))

    async def write_progress(self, progress: Sequence[TagProgress]) -> None:
        by_slice: dict[int, list[TagProgress]] = {}
        for p in progress:
            by_slice.setdefault(slice_for(p.persistence_id), []).append(p)

        async def one(s: int, its: list[TagProgress]) -> None:
            await self.router.on_owner(
                s, "write tag progress", lambda b: b.tag_store().write_progress(its), check="write"
            )

        await asyncio.gather(*(one(s, its) for s, its in by_slice.items()))

    async def read_progress(self, persistence_id: str) -> dict[str, TagProgress]:
        return await self.router.on_owner(
            slice_for(persistence_id), "read tag progress", lambda b: b.tag_store().read_progress(persistence_id),
            check="read",
        )  # fmt: skip

    async def read_scanning(self, persistence_id: str) -> int:
        return await self.router.on_owner(
            slice_for(persistence_id), "read tag scanning", lambda b: b.tag_store().read_scanning(persistence_id),
            check="read",
        )  # fmt: skip

    async def write_scanning(self, persistence_id: str, seq_nr: int) -> None:
        await self.router.on_owner(
            slice_for(persistence_id), "write tag scanning",
            lambda b: b.tag_store().write_scanning(persistence_id, seq_nr), check="write",
        )  # fmt: skip

    async def tagged_events(self, persistence_id: str, from_seq_nr: int, limit: int) -> list[TaggedEvent]:
        return await self.router.on_owner(
            slice_for(persistence_id), "tagged events",
            lambda b: b.tag_store().tagged_events(persistence_id, from_seq_nr, limit), check="read",
        )  # fmt: skip

    async def read_tag_rows(
        self, tag: str, bucket: int, after: uuid.UUID | None, before_ticks: int, limit: int
    ) -> Sequence[TagPageRow]:
        m = self.dbs.map
        served = m.served()

        async def one(db: int) -> list[Any]:
            b = await self.dbs.usable(db)
            rows = await b.tag_store().read_tag_rows(tag, bucket, after, before_ticks, limit)
            return [r for r in rows if m.owner(slice_for(r[PID])) == db]

        got = await asyncio.gather(*(one(db) for db in served))
        if len(got) == 1:
            return got[0]
        return list(heapq.merge(*got, key=_tag_key))[:limit]

    async def next_bucket(self, tag: str, from_bucket: int, to_bucket: int) -> int | None:
        async def one(db: int) -> int | None:
            b = await self.dbs.usable(db)
            return await b.tag_store().next_bucket(tag, from_bucket, to_bucket)

        found = [x for x in await asyncio.gather(*(one(db) for db in self.dbs.map.served())) if x is not None]
        return min(found) if found else None

    async def ensure_bucket_size(self, size: str) -> None:
        """Each database that answers; one that is down is checked when the journal is opened
        while it answers (it fails its own slices meanwhile, the others go on)."""
        for db in self.dbs.map.served():
            try:
                backend = await self.dbs.usable(db)
            except JournalUnavailable:
                continue
            await backend.tag_store().ensure_bucket_size(size)


class PartitionedCleanup:
    """:class:`~journal.backend.CleanupStore` over the databases: each pid where it is served
    (the deletions are checked by the database itself, and wait while its range is moved)."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def footprint(self, persistence_id: str) -> PidFootprint:
        return await self.router.on_owner(
            slice_for(persistence_id), "cleanup footprint", lambda b: b.cleanup_store().footprint(persistence_id),
            check="read",
        )  # fmt: skip

    async def delete_tag_rows(self, persistence_id: str, *, keep_numbering: bool) -> None:
        await self.router.on_owner(
            slice_for(persistence_id), "cleanup tag rows",
            lambda b: b.cleanup_store().delete_tag_rows(persistence_id, keep_numbering=keep_numbering),
        )  # fmt: skip

    async def delete_all_events(self, persistence_id: str, *, reset_seq_nr: bool) -> None:
        await self.router.on_owner(
            slice_for(persistence_id), "cleanup events",
            lambda b: b.cleanup_store().delete_all_events(persistence_id, reset_seq_nr=reset_seq_nr),
        )  # fmt: skip
