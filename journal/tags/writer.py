"""The tag writer: one per tag, batching tag rows into the tag view.

:class:`TagWriterState` is the pure part (numbering, batching, progress) and is driven step by
step in tests; :class:`TagWriter` is the thin asyncio loop around it and :class:`TagWriters`
routes a pid's tagged events to the writers and runs the crash recovery.

Rules (the reference's): ``tag_pid_seq_nr`` is previous + 1 per (tag, pid), from 1; a batch holds
at most ``max_message_batch_size`` rows (and ``max_message_batch_bytes``, one row always fits)
and never spans two time buckets; flush when full, when
the bucket changes, or when the oldest buffered row waited ``flush_interval``; one write in
flight per tag (rows arriving meanwhile wait, so batches grow under load); progress is written
after the rows; a failed write is retried with backoff. The buffer is bounded: ``add`` waits for
room (back-pressure) instead of growing without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..backend import TaggedEvent, TagProgress, TagRow, TagStore
from ..buckets import bucket_of
from ..errors import JournalUnavailable, TagWriteTimeout
from ..settings import TagSettings
from ..waits import within

log = logging.getLogger("journal.tags.writer")


ROW_OVERHEAD = 200
"""Bytes counted per tag row beside its payloads: keys, TimeUUID, numbers, manifests."""


def row_bytes(row: TagRow) -> int:
    """What a row weighs in a batch (a close upper estimate of its mutation size)."""
    meta = len(row.meta.payload) + len(row.meta.manifest) if row.meta else 0
    return ROW_OVERHEAD + len(row.event.payload) + len(row.event.manifest) + meta


@dataclass
class TagWriterState:
    tag: str
    bucket_size: str
    max_batch: int
    flush_interval: float
    max_buffered: int
    max_bytes: int = 4 * 1024 * 1024
    buffer: deque[TagRow] = field(default_factory=deque)
    counters: dict[str, int] = field(default_factory=dict)
    in_flight: list[TagRow] | None = None
    oldest_at: float | None = None

    def has_room(self) -> bool:
        return len(self.buffer) < self.max_buffered

    def add(self, ev: TaggedEvent, now: float) -> TagRow:
        """Number the event for this tag and buffer its row."""
        n = self.counters.get(ev.persistence_id, 0) + 1
        self.counters[ev.persistence_id] = n
        row = TagRow(
            tag=self.tag,
            timebucket=bucket_of(ev.timeuuid, self.bucket_size),
            timeuuid=ev.timeuuid,
            persistence_id=ev.persistence_id,
            tag_pid_seq_nr=n,
            seq_nr=ev.seq_nr,
            writer=ev.writer,
            event=ev.event,
            meta=ev.meta,
        )
        if not self.buffer:
            self.oldest_at = now
        self.buffer.append(row)
        return row

    def next_batch(self, now: float) -> list[TagRow] | None:
        """The batch to write now, or None (one in flight, nothing buffered, or not due)."""
        if self.in_flight is not None or not self.buffer:
            return None
        bucket = self.buffer[0].timebucket
        n = size = 0
        full = False
        for row in self.buffer:
            size += row_bytes(row)
            if n and size > self.max_bytes:
                full = True
                break
            if row.timebucket != bucket or n == self.max_batch:
                break
            n += 1
        full = full or n == self.max_batch
        bucket_change = n < len(self.buffer)
        due = self.oldest_at is None or now - self.oldest_at >= self.flush_interval
        if not (full or bucket_change or due):
            return None
        batch = [self.buffer.popleft() for _ in range(n)]
        self.oldest_at = now if self.buffer else None
        self.in_flight = batch
        return batch

    def flush_due_in(self, now: float) -> float | None:
        """Seconds until the buffered rows are due (None: nothing buffered)."""
        if not self.buffer or self.oldest_at is None:
            return None
        return max(0.0, self.flush_interval - (now - self.oldest_at))

    def completed(self) -> list[TagProgress]:
        """The in-flight batch is written: the progress rows to write, one per pid."""
        assert self.in_flight is not None
        last: dict[str, TagRow] = {}
        for row in self.in_flight:
            last[row.persistence_id] = row
        self.in_flight = None
        return [TagProgress(r.persistence_id, self.tag, r.seq_nr, r.tag_pid_seq_nr, r.timeuuid) for r in last.values()]

    def failed(self) -> None:
        """The in-flight batch failed: it goes back to the front, to be retried as is."""
        assert self.in_flight is not None
        self.buffer.extendleft(reversed(self.in_flight))
        self.in_flight = None

    def reset_pid(self, pid: str, progress: TagProgress | None) -> list[TagRow]:
        """Recovery: drop the pid's buffered rows and number from the stored progress on."""
        dropped = [r for r in self.buffer if r.persistence_id == pid]
        if dropped:
            self.buffer = deque(r for r in self.buffer if r.persistence_id != pid)
        self.counters[pid] = progress.tag_pid_seq_nr if progress else 0
        return dropped


class TagWriter:
    """The asyncio loop of one tag's writer."""

    def __init__(self, tag: str, store: TagStore, settings: TagSettings) -> None:
        self.state = TagWriterState(
            tag,
            settings.bucket_size,
            settings.max_message_batch_size,
            settings.flush_interval,
            settings.max_buffered_events,
            settings.max_message_batch_bytes,
        )
        self._store = store
        self._settings = settings
        self._wake = asyncio.Condition()
        self._futures: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.batches_written = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"tag-writer-{self.state.tag}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for f in self._futures.values():
            if not f.done():
                f.cancel()

    async def add(self, ev: TaggedEvent) -> asyncio.Future[None]:
        """Buffer the event (waiting while the buffer is full); the future resolves when written."""
        self.start()
        async with self._wake:
            await self._wake.wait_for(self.state.has_room)
            row = self.state.add(ev, time.monotonic())
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._futures[(row.persistence_id, row.tag_pid_seq_nr)] = fut
            self._wake.notify_all()
            return fut

    async def reset_pid(self, pid: str, progress: TagProgress | None) -> None:
        async with self._wake:
            for r in self.state.reset_pid(pid, progress):
                f = self._futures.pop((r.persistence_id, r.tag_pid_seq_nr), None)
                if f is not None and not f.done():
                    f.cancel()
            self._wake.notify_all()

    async def _next(self) -> list[TagRow]:
        async with self._wake:
            while True:
                now = time.monotonic()
                batch = self.state.next_batch(now)
                if batch is not None:
                    self._wake.notify_all()  # room in the buffer
                    return batch
                due = self.state.flush_due_in(now)
                with contextlib.suppress(TimeoutError):
                    await within(self._wake.wait(), due)

    async def _run(self) -> None:
        backoff = self._settings.retry_initial_backoff
        while True:
            batch = await self._next()
            try:
                await self._store.write_tag_rows(batch)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning(
                    "tag %r: write of %d rows failed (retrying in %.2fs): %s", self.state.tag, len(batch), backoff, e
                )
                async with self._wake:
                    self.state.failed()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._settings.retry_max_backoff)
                continue
            backoff = self._settings.retry_initial_backoff
            self.batches_written += 1
            async with self._wake:
                progress = self.state.completed()
                self._wake.notify_all()
            try:
                await self._store.write_progress(progress)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # best effort: recovery resends what progress does not cover
                log.warning("tag %r: progress write failed: %s", self.state.tag, e)
            for r in batch:
                f = self._futures.pop((r.persistence_id, r.tag_pid_seq_nr), None)
                if f is not None and not f.done():
                    f.set_result(None)


class TagWriters:
    """Routes tagged events to one :class:`TagWriter` per tag; recovers pids on first use."""

    def __init__(self, store: TagStore, settings: TagSettings) -> None:
        self.store = store
        self.settings = settings
        self.writers: dict[str, TagWriter] = {}
        self._recovered: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    def writer(self, tag: str) -> TagWriter:
        w = self.writers.get(tag)
        if w is None:
            w = self.writers[tag] = TagWriter(tag, self.store, self.settings)
        return w

    async def close(self) -> None:
        for w in self.writers.values():
            await w.close()

    def forget(self, pid: str) -> None:
        """The pid's events may be stored without their tag rows (a write whose outcome is
        unknown): recover it again before its next write."""
        self._recovered.discard(pid)

    async def ensure_recovered(self, pid: str, highest: int | None = None) -> None:
        """Call before storing a pid's new events: recovers it on first use (and after a timeout),
        reading at least up to ``highest`` (the stored highest the write starts from)."""
        if pid not in self._recovered:
            await self.recover(pid, highest)

    async def write(self, events: Sequence[TaggedEvent]) -> None:
        """Write the tag rows of freshly stored events (their pids recovered before they were
        stored, see :meth:`ensure_recovered`); wait, bounded, until they are written.

        Raises:
            TagWriteTimeout: not written within ``tag_write_timeout``; the pids are marked for
                recovery, so their next write resends the rows first (same UUIDs and numbers).
        """
        pids = {e.persistence_id for e in events}
        futures: list[asyncio.Future[None]] = []
        for ev in events:
            for tag in ev.tags:
                futures.append(await self.writer(tag).add(ev))
        if futures:
            await self._wait(futures, pids)

    async def _wait(self, futures: list[asyncio.Future[None]], pids: set[str]) -> None:
        try:
            await within(asyncio.gather(*futures), self.settings.tag_write_timeout)
        except (TimeoutError, asyncio.CancelledError) as e:
            self._recovered.difference_update(pids)
            raise TagWriteTimeout(
                f"tag view write for {sorted(pids)} not done within {self.settings.tag_write_timeout}s; "
                "the events are stored and their tag rows are resent on the next recovery"
            ) from e

    async def recover(self, pid: str, highest_stored: int | None = None) -> int:
        """Crash recovery of one pid: reset the writers' numbering from the stored progress, drop
        the pid's buffered rows, and resend its tagged events above the progress (idempotent:
        same UUIDs and numbers). Returns how many tag rows were resent.

        Raises:
            JournalUnavailable: (nothing sent) the events read end below ``highest_stored``: the
                numbering would skip the unread ones, so the pid stays unrecovered.
        """
        lock = self._locks.setdefault(pid, asyncio.Lock())
        async with lock:
            progress = await self.store.read_progress(pid)
            for tag, w in self.writers.items():
                await w.reset_pid(pid, progress.get(tag))
            for tag, prog in progress.items():
                if tag not in self.writers:
                    await self.writer(tag).reset_pid(pid, prog)
            start = await self.store.read_scanning(pid)
            futures: list[asyncio.Future[None]] = []
            highest = start
            page = 1000
            nxt = start + 1
            while True:
                evs = await self.store.tagged_events(pid, nxt, page)
                for ev in evs:
                    highest = max(highest, ev.seq_nr)
                    for tag in ev.tags:
                        done = progress.get(tag)
                        if done is not None and ev.seq_nr <= done.seq_nr:
                            continue
                        w = self.writer(tag)
                        if tag not in progress and pid not in w.state.counters:
                            await w.reset_pid(pid, None)
                        futures.append(await w.add(ev))
                if len(evs) < page:
                    break
                nxt = evs[-1].seq_nr + 1
            if highest_stored is not None and highest < highest_stored:
                raise JournalUnavailable(
                    f"tag recovery of {pid!r} read events up to {highest}, but {highest_stored} are stored: "
                    "not numbering past unread events",
                    outcome_unknown=False,
                )
            if futures:
                self._recovered.discard(pid)
                await self._wait(futures, {pid})
            if highest > start:
                # every resent row and its progress is written: later recoveries start here
                await self.store.write_scanning(pid, highest)
            self._recovered.add(pid)
            return len(futures)
