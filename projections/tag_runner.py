"""Projections over a tag instead of a slice range (issue 7).

The source is ``journal.events_by_tag(tag, offset)``; the offsets are TimeUUIDs stored per pid in
``projection_tag_offset_store`` (:mod:`projections.tag_offset_store`) in the handler's
transaction. A restart resumes after the greatest stored offset; events delivered again are
dropped per pid by seq_nr. Gaps in a pid's seq_nrs are normal here (not every event carries the
tag): the tag query's own per-(tag, pid) numbering finds missing tag rows.

A tag is one unit of work: its workers share a single lease (slice 0 of the projection's lease
rows), so one worker processes the tag and the others stand by; the offset transaction is fenced
by that lease's epoch exactly as a slice range is.

Every failure strategy of an event projection applies (issue 32): ``retry-and-skip`` and
``retry-and-dead-letter`` isolate a poisoned event by halving the batch, as a slice range does,
with the tag's offset rows. A dead letter is keyed as any other (projection, pid, seq_nr: one
event whatever tag brought it), its ``projection_key`` is ``tag:<tag>``, and
``projections dead-letters retry`` applies it the same way.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from journal.envelope import EventEnvelope
from journal.offsets import Offset, TimeUUIDOffset
from journal.settings import JournalSettings

from .batches import Batch, Batches, one_a_page, process
from .offset_rows import TagOffsetRows
from .parts import ProjectionParts
from .recovery import HandlerRecovery
from .tag_offset_store import TagOffsets, TagOffsetSql
from .worker import Worker

log = logging.getLogger("projections.tag_runner")


class TagEventSource(Protocol):
    """What a tag projection needs of a journal."""

    def events_by_tag(self, tag: str, offset: Offset | uuid.UUID | None = None) -> AsyncIterator[EventEnvelope]: ...


class TagProcessor:
    """Processes one tag while it holds the tag's lease (slice 0) at ``epoch``: reads the tag's
    query, drops what was delivered before (per pid by seq_nr), and hands the rest to the
    projection's delivery with the tag's offset rows (:class:`~projections.offset_rows.TagOffsetRows`)."""

    def __init__(self, parts: ProjectionParts, *, tag: str, tag_sql: TagOffsetSql, epoch: int) -> None:
        self.journal: TagEventSource = parts.journal
        self.s = parts.settings
        self.name = parts.name
        self.tag = tag
        self.tag_sql = tag_sql
        self.key = f"tag:{tag}"
        """The processor's unit of work as stored and logged: its tag."""
        self.stats = parts.stats
        self._stopping = asyncio.Event()
        self.tx = parts.transactions(self.key, self._stopping)
        self.offsets = TagOffsetRows(tag_sql, parts.sql.leases, self.tx.unit, tag, epoch)
        self.delivery = parts.delivery(self.tx, self.offsets)

    def stop(self) -> None:
        """Ask to stop after the current batch (committed, or rolled back if it cannot commit)."""
        self._stopping.set()

    async def run(self) -> None:
        async def load() -> TagOffsets:
            async with self.tx.pool.acquire() as conn:
                return await self.tag_sql.load(conn, self.name, self.tag)

        stored = await self.tx.read("loading offsets", load)
        self.offsets.seq_nrs = dict(stored.seq_nrs)
        log.info("%s %s: starting after %s", self.name, self.key, stored.latest or "the first time bucket")
        batches = Batches(self.s.queue_size, self.delivery.batch_size, self.s.group_max_wait, self._stopping)
        after = TimeUUIDOffset(stored.latest) if stored.latest else None

        def query() -> AsyncIterator[EventEnvelope]:
            return self.journal.events_by_tag(self.tag, after)

        await process(one_a_page(query), batches, self._process, self.delivery)

    async def _process(self, batch: Batch) -> None:
        """Drop what was delivered before; hand the rest on."""
        accepted: list[EventEnvelope] = []
        offsets = self.offsets
        for env in batch:
            if not offsets.fresh(env):
                self.stats.duplicates += 1
                continue
            accepted.append(env)
            offsets.accept(env)
        if accepted:
            await self.delivery.deliver(accepted, {})


class TagWorker(Worker):
    """A :class:`Worker` whose unit of work is one tag (one lease) instead of slice ranges."""

    slice_count = 1
    lag_by_slice = False

    def __init__(
        self, journal: TagEventSource, settings: JournalSettings, name: str, tag: str,
        handler: Callable[..., Awaitable[None]], mode: str = "grouped", *, worker_id: str | None = None,
        recovery: str | HandlerRecovery | None = None,
    ) -> None:  # fmt: skip
        from journal.ids import validate_tags

        (self.tag,) = validate_tags([tag])
        super().__init__(
            journal, settings, name, f"tag:{tag}", handler, mode, worker_id=worker_id,  # type: ignore[arg-type]
            recovery=recovery,
        )  # fmt: skip
        self.tag_sql = TagOffsetSql(settings.schema)

    def _processor(self, lo: int, hi: int) -> TagProcessor:
        assert lo == hi == 0
        return TagProcessor(self._parts(), tag=self.tag, tag_sql=self.tag_sql, epoch=self.epochs[0])
