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
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

from journal.envelope import EventEnvelope
from journal.errors import HandlerFailed
from journal.offsets import Offset, TimeUUIDOffset
from journal.settings import JournalSettings

from .read_ahead import ReadAhead
from .recovery import Failures, HandlerRecovery
from .runner import _END, RangeProcessor
from .tag_offset_store import TagOffsetSql
from .worker import Worker

log = logging.getLogger("projections.tag_runner")
TagRows = dict[str, tuple[int, uuid.UUID]]
"""A tag's offset rows: pid -> (seq_nr, TimeUUID offset) (``projection_tag_offset_store``)."""


class TagEventSource(Protocol):
    """What a tag projection needs of a journal."""

    def events_by_tag(self, tag: str, offset: Offset | uuid.UUID | None = None) -> AsyncIterator[EventEnvelope]: ...


class TagProcessor(RangeProcessor):
    """Processes one tag while it holds the tag's lease (slice 0) at ``epoch``."""

    def __init__(self, *, tag: str, tag_sql: TagOffsetSql, epoch: int, **kw: Any) -> None:
        self.tag = tag
        self.tag_sql = tag_sql
        super().__init__(entity_type="", lo=0, hi=0, epochs={0: epoch}, **kw)
        self.seq_nrs: dict[str, int] = {}
        self.pending: dict[str, tuple[int, uuid.UUID]] = {}

    def _unit_key(self) -> str:
        """The processor's unit of work as stored and logged: its tag."""
        return f"tag:{self.tag}"

    async def run(self) -> None:
        async with self.tx.pool.acquire() as conn:
            stored = await self.tag_sql.load(conn, self.name, self.tag)
        self.seq_nrs = dict(stored.seq_nrs)
        log.info("%s %s: starting after %s", self.name, self.key, stored.latest or "the first time bucket")
        queue: ReadAhead[Any] = ReadAhead(self.s.queue_size)
        reader = asyncio.create_task(self._read_tag(stored.latest, queue))
        try:
            while not self._stopping.is_set():
                batch = await self._next_batch(queue, reader)
                if batch:
                    await self._process_tag(batch)
                elif self.pending:
                    await self._flush(force=False)
            if self.pending:
                await self._flush(force=True)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read_tag(self, after: uuid.UUID | None, queue: ReadAhead[Any]) -> None:
        source: TagEventSource = self.journal  # type: ignore[assignment]
        try:
            async for env in source.events_by_tag(self.tag, TimeUUIDOffset(after) if after else None):
                await queue.put(env)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            await queue.put(e)
            return
        await queue.put(_END)  # a live query does not end; a finite source stops the processor

    def _fresh(self, env: EventEnvelope) -> bool:
        """Dedup per pid by seq_nr (pending first, then committed)."""
        pid = env.persistence_id
        known = self.pending[pid][0] if pid in self.pending else self.seq_nrs.get(pid)
        return known is None or env.seq_nr > known

    async def _process_tag(self, batch: list[EventEnvelope]) -> None:
        accepted: list[EventEnvelope] = []
        for env in batch:
            if not self._fresh(env):
                self.stats.duplicates += 1
                continue
            assert isinstance(env.offset, TimeUUIDOffset)
            accepted.append(env)
            self.pending[env.persistence_id] = (env.seq_nr, env.offset.value)
        if not accepted:
            return
        if self.mode == "at-least-once":
            for env in accepted:

                async def once(_conn: Any, env: EventEnvelope = env) -> None:
                    await self.handler(env)

                failures = Failures()
                try:
                    await self.tx.run(once, tries=self._tries, transactional=False, failures=failures)
                except HandlerFailed:
                    if not self.recovery.isolates:
                        raise
                    await self._park(env, failures, {})  # its offset goes with the next flush
            self._unflushed += len(accepted)
            await self._flush(force=False)
            return
        if self.recovery.isolates:
            await self._commit_tag_isolating(accepted)
            return

        async def body(conn: Any) -> None:
            if self.mode == "grouped":
                await self.handler(conn, accepted)
            else:
                for env in accepted:
                    await self.handler(conn, env)
            await self.tag_sql.save(conn, self.name, self.tag, self.pending)

        await self._commit_tag(body, len(accepted), max(e.db_timestamp for e in accepted))

    async def _commit_tag_isolating(self, accepted: list[EventEnvelope]) -> None:
        """``retry-and-skip`` / ``retry-and-dead-letter``: the batch, or its halves until the
        poisoned events are alone, each with its offsets (as a slice range does it)."""
        started = time.monotonic()
        try:
            parked = await self._commit_isolating(accepted, dict(self.pending))
        except BaseException:
            self.pending = {}
            raise
        self._committed()
        newest = max(e.db_timestamp for e in accepted)
        self.stats.committed(len(accepted) - parked, newest, time.monotonic() - started)

    def _committed(self) -> None:
        for pid, (seq_nr, _) in self.pending.items():
            self.seq_nrs[pid] = seq_nr
        self.pending = {}

    # -- the tag's offset rows, for the isolation of poisoned events (RangeProcessor's) -----

    async def _store(self, conn: Any, rows: TagRows) -> None:
        await self.tag_sql.save(conn, self.name, self.tag, rows)

    def _fence(self, rows: TagRows, env: EventEnvelope | None = None) -> dict[int, int]:
        return dict(self.epochs)  # the tag's one lease

    def _rest(self, rows: TagRows) -> TagRows:
        return {}

    def _rows_of(self, envs: Sequence[EventEnvelope]) -> TagRows:
        rows: TagRows = {}
        for e in envs:
            assert isinstance(e.offset, TimeUUIDOffset)
            rows[e.persistence_id] = (e.seq_nr, e.offset.value)
        return rows

    def _proven_by(self, rows: TagRows) -> Callable[[Any], Awaitable[bool]]:
        proof = next(iter(rows.items()), None)

        async def committed(conn: Any) -> bool:
            if proof is None:
                return False
            stored = await self.tag_sql.stored_seq_nr(conn, self.name, self.tag, proof[0])
            return stored is not None and stored >= proof[1][0]

        return committed

    async def _commit_tag(self, body: Callable[[Any], Awaitable[None]], n: int, newest: Any) -> None:
        started = time.monotonic()
        try:
            await self.tx.run(body, tries=self._tries, fence=dict(self.epochs), committed=self._proven_by(self.pending))
        except BaseException:
            self.pending = {}
            raise
        self._committed()
        self.stats.committed(n, newest, time.monotonic() - started)

    async def _flush(self, *, force: bool) -> None:
        """At-least-once: store the offsets every N envelopes / T seconds."""
        due = self._unflushed >= self.s.at_least_once_every or (
            time.monotonic() - self._last_flush >= self.s.at_least_once_interval
        )
        if not (force or due) or not self.pending:
            return

        async def body(conn: Any) -> None:
            await self.tag_sql.save(conn, self.name, self.tag, self.pending)

        await self._commit_tag(body, self._unflushed, None)
        self._unflushed = 0
        self._last_flush = time.monotonic()


class TagWorker(Worker):
    """A :class:`Worker` whose unit of work is one tag (one lease) instead of slice ranges."""

    slice_count = 1
    lag_by_slice = False

    def __init__(
        self,
        journal: TagEventSource,
        settings: JournalSettings,
        name: str,
        tag: str,
        handler: Callable[..., Awaitable[None]],
        mode: str = "grouped",
        *,
        worker_id: str | None = None,
        recovery: str | HandlerRecovery | None = None,
    ) -> None:
        from journal.ids import validate_tags

        (self.tag,) = validate_tags([tag])
        super().__init__(
            journal, settings, name, f"tag:{tag}", handler, mode, worker_id=worker_id,  # type: ignore[arg-type]
            recovery=recovery,
        )  # fmt: skip
        self.tag_sql = TagOffsetSql(settings.schema)

    def _start(self, lo: int, hi: int) -> None:
        assert self._pool is not None and lo == hi == 0
        proc = TagProcessor(
            tag=self.tag, tag_sql=self.tag_sql, epoch=self.epochs[0], journal=self.journal,
            connections=self._connections(), sql=self.sql, settings=self.ps, name=self.name,
            owner=self.worker_id, handler=self.handler, mode=self.mode, stats=self.stats, outage=self.outage,
            recovery=self.recovery,
        )  # fmt: skip
        task = asyncio.create_task(proc.run(), name=f"{self.name}:tag:{self.tag}")
        self.processors[(0, 0)] = (proc, task)
        log.info("%s: processing tag %r", self.worker_id, self.tag)
