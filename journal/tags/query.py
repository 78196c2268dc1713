"""The events-by-tag query over a :class:`TagStore` (one algorithm for every backend).

Reads (tag, bucket) partitions in TimeUUID order from the start offset, bucket after bucket, up
to ``now - eventual_consistency_delay``; checks each pid's ``tag_pid_seq_nr`` with
:class:`PidTracker`; on a gap holds the row and searches the bucket (and the previous one) for
the missing rows, re-querying until ``gap_timeout``, then fails with :class:`TagEventsMissing`
naming the pid, the tag and the missing range. A live query also back-tracks: every
``back_track_interval`` it rescans ``back_track_period`` behind its position for rows that
arrived late. Starting in the current bucket it first scans ``offset_scanning_period`` ahead to
learn each pid's lowest number. A live query rides out outages: a read that fails with
:class:`JournalUnavailable` is retried with backoff until the store answers again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from ..backend import PID, TAG_PID_SEQ_NR, TIMEBUCKET, TIMEUUID, TagPageRow, TagRow, TagStore, row_of
from ..buckets import bucket_end, bucket_of, bucket_of_millis, parse_first_bucket, previous_bucket
from ..errors import JournalUnavailable, TagEventsMissing
from ..settings import TagSettings
from ..timeuuid import ticks, ticks_of_micros, unix_millis
from .gaps import PidTracker, Verdict

log = logging.getLogger("journal.tags.query")
T = TypeVar("T")

SEARCH_POLL = 0.25
"""Seconds between re-queries while searching for missing rows."""


class TagQuery:
    def __init__(
        self,
        store: TagStore,
        tag: str,
        settings: TagSettings,
        *,
        after: uuid.UUID | None,
        live: bool,
        page_size: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.tag = tag
        self.s = settings
        self.after = after
        self.live = live
        self.page = page_size
        self.clock = clock
        size = settings.bucket_size
        now_ms = int(clock() * 1000)
        start_ms = unix_millis(after) if after is not None else parse_first_bucket(settings.first_time_bucket, size)
        self.bucket = bucket_of_millis(start_ms, size)
        self.started_in_current = after is not None and self.bucket >= bucket_of_millis(now_ms, size)
        self.tracker = PidTracker(
            accept_unknown=not self.started_in_current or settings.new_persistence_id_scan_timeout == 0
        )
        # exclusive bound in whole milliseconds: +1 so the current millisecond is read too
        self.fixed_upper_ms = None if live else now_ms - int(settings.eventual_consistency_delay * 1000) + 1
        self.position: uuid.UUID | None = after
        self.delivered = 0

    def _upper_ms(self) -> int:
        if self.fixed_upper_ms is not None:
            return self.fixed_upper_ms
        return int((self.clock() - self.s.eventual_consistency_delay) * 1000) + 1

    async def rows(self) -> AsyncIterator[TagRow]:
        """The tag's rows in delivery order (a live query never ends)."""
        async for page in self.pages():
            for p in page:
                yield row_of(p)

    async def _read_rows(self, bucket: int, after: uuid.UUID | None, before_ticks: int) -> Sequence[TagPageRow]:
        return await self._ride_out(lambda: self.store.read_tag_rows(self.tag, bucket, after, before_ticks, self.page))

    async def _next_bucket(self, from_bucket: int, to_bucket: int) -> int | None:
        return await self._ride_out(lambda: self.store.next_bucket(self.tag, from_bucket, to_bucket))

    async def _ride_out(self, read: Callable[[], Awaitable[T]]) -> T:
        """One store read; in a live query retried with backoff while the store is unavailable."""
        backoff = self.s.retry_initial_backoff
        while True:
            try:
                return await read()
            except JournalUnavailable as e:
                if not self.live:
                    raise
                log.warning("live events_by_tag %r: %s; retrying in %.2fs", self.tag, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.s.retry_max_backoff)

    def _read(self, bucket: int, after: uuid.UUID | None, upper_ms: int) -> asyncio.Task[Sequence[TagPageRow]]:
        t = asyncio.ensure_future(self._read_rows(bucket, after, ticks_of_micros(upper_ms * 1000)))
        t.add_done_callback(_retrieve)
        return t

    async def pages(self) -> AsyncIterator[Sequence[TagPageRow]]:
        """The tag's rows in delivery order, a run of rows at a time (:data:`TagPageRow`; a live
        query never ends). A full page's successor is fetched while the page is handed out."""
        size = self.s.bucket_size
        if self.started_in_current and self.after is not None:
            await self._scan_start(self.after)
        after_in_bucket = self.after
        last_backtrack = time.monotonic()
        pending: tuple[asyncio.Task[Sequence[TagPageRow]], int] | None = None
        try:
            while True:
                if pending is None:
                    upper_ms = self._upper_ms()
                    if self.bucket >= upper_ms:
                        if not self.live:
                            return
                        await asyncio.sleep(self.s.query_refresh_interval)
                        continue
                    pending = (self._read(self.bucket, after_in_bucket, upper_ms), upper_ms)
                task, upper_ms = pending
                rows = await task
                pending = None
                if rows:
                    after_in_bucket = self.position = rows[-1][TIMEUUID]
                full = len(rows) == self.page
                if full:  # same bucket, same bound: the rest of the page's range
                    pending = (self._read(self.bucket, after_in_bucket, upper_ms), upper_ms)
                async for run in self._deliver(rows):
                    yield run
                if full:
                    continue
                if bucket_end(self.bucket, size) <= upper_ms:
                    last = bucket_of_millis(upper_ms, size)
                    nb = await self._next_bucket(bucket_end(self.bucket, size), last)
                    self.bucket = last if nb is None else nb
                    after_in_bucket = None
                    continue
                if not self.live:
                    return
                if time.monotonic() - last_backtrack >= self.s.back_track_interval:
                    last_backtrack = time.monotonic()
                    async for r in self._back_track():
                        yield [r]
                await asyncio.sleep(self.s.query_refresh_interval)
        finally:
            if pending is not None:
                pending[0].cancel()

    async def _deliver(self, rows: Sequence[TagPageRow]) -> AsyncIterator[Sequence[TagPageRow]]:
        """Check a page's rows per pid; hand out the in-order runs whole (the common case: the
        next number of a known pid, or a pid's first row), anything else through the tracker's
        full classification and gap search."""
        expected = self.tracker.expected
        accept_unknown = self.tracker.accept_unknown
        get = expected.get
        start = 0
        i = 0
        for row in rows:
            pid = row[PID]
            n = row[TAG_PID_SEQ_NR]
            last = get(pid)
            if (last is not None and n == last + 1) or (last is None and (n == 1 or accept_unknown)):
                expected[pid] = n
            else:
                if i > start:
                    self.delivered += i - start
                    yield rows[start:i]
                async for r in self._handle(row):
                    yield [r]
                start = i + 1
            i += 1
        if i > start:
            self.delivered += i - start
            yield rows if start == 0 else rows[start:i]

    async def _handle(self, row: TagPageRow) -> AsyncIterator[TagPageRow]:
        verdict = self.tracker.classify(row[PID], row[TAG_PID_SEQ_NR])
        if verdict is Verdict.DUPLICATE:
            return
        if verdict is Verdict.DELIVER:
            self.tracker.delivered(row[PID], row[TAG_PID_SEQ_NR])
            self.delivered += 1
            yield row
            return
        async for r in self._search(row, unknown=verdict is Verdict.UNKNOWN_PID):
            yield r

    async def _search(self, held: TagPageRow, *, unknown: bool) -> AsyncIterator[TagPageRow]:
        """Hold ``held``; find the pid's missing rows before it, or fail after the timeout."""
        pid = held[PID]
        lo, hi = self.tracker.missing(pid, held[TAG_PID_SEQ_NR])
        if hi - lo + 1 > self.s.max_missing_to_search:
            raise TagEventsMissing(pid, self.tag, lo, hi, "more missing than max_missing_to_search")
        timeout = self.s.new_persistence_id_scan_timeout if unknown else self.s.gap_timeout
        deadline = time.monotonic() + timeout
        size = self.s.bucket_size
        while True:
            found: dict[int, TagPageRow] = {}
            for b in (previous_bucket(held[TIMEBUCKET], size), held[TIMEBUCKET]):
                after: uuid.UUID | None = None
                while True:
                    rows = await self._read_rows(b, after, ticks(held[TIMEUUID]))
                    for r in rows:
                        if r[PID] == pid and lo <= r[TAG_PID_SEQ_NR] <= hi:
                            found[r[TAG_PID_SEQ_NR]] = r
                    if len(rows) < self.page:
                        break
                    after = rows[-1][TIMEUUID]
            n = lo
            while n in found:
                if not self._before_start(found[n][TIMEUUID]):  # else delivered before the offset
                    yield found[n]
                    self.delivered += 1
                self.tracker.delivered(pid, n)
                n += 1
            lo = n
            if lo > hi:
                break
            if time.monotonic() >= deadline:
                if unknown:
                    break  # a pid first seen mid-stream: accept it after the scan timeout
                raise TagEventsMissing(pid, self.tag, lo, hi, f"not found within gap_timeout={self.s.gap_timeout}s")
            await asyncio.sleep(min(SEARCH_POLL, max(0.0, deadline - time.monotonic())))
        self.tracker.delivered(pid, held[TAG_PID_SEQ_NR])
        self.delivered += 1
        yield held

    def _before_start(self, u: uuid.UUID) -> bool:
        """At or before the query's start offset: a resumed query never hands such a row out again."""
        return self.after is not None and (u == self.after or ticks(u) < ticks(self.after))

    async def _scan_start(self, after: uuid.UUID) -> None:
        """Learn each pid's lowest number just after the start offset (seeding the tracker)."""
        end_ticks = ticks(after) + int(self.s.offset_scanning_period * 10_000_000)
        lowest: dict[str, int] = {}
        cursor: uuid.UUID | None = after
        while True:
            rows = await self._read_rows(self.bucket, cursor, end_ticks)
            for r in rows:
                lowest[r[PID]] = min(lowest.get(r[PID], r[TAG_PID_SEQ_NR]), r[TAG_PID_SEQ_NR])
            if len(rows) < self.page:
                break
            cursor = rows[-1][TIMEUUID]
        for pid, n in lowest.items():
            self.tracker.seed(pid, n)

    async def _back_track(self) -> AsyncIterator[TagPageRow]:
        """Rescan behind the position for rows that committed late (their pid ran ahead or is new)."""
        if self.position is None:
            return
        size = self.s.bucket_size
        pos_ms = unix_millis(self.position)
        lower_ms = pos_ms - int(self.s.back_track_period * 1000)
        b = bucket_of_millis(lower_ms, size)
        end = ticks(self.position) + 1
        while b <= bucket_of(self.position, size):
            cursor: uuid.UUID | None = None
            while True:
                rows = await self._read_rows(b, cursor, end)
                for r in rows:
                    if unix_millis(r[TIMEUUID]) >= lower_ms:
                        async for x in self._handle(r):
                            yield x
                if len(rows) < self.page:
                    break
                cursor = rows[-1][TIMEUUID]
            b = bucket_end(b, size)


def _retrieve(t: asyncio.Task[Sequence[TagPageRow]]) -> None:
    if not t.cancelled():
        t.exception()  # an abandoned prefetch's error is not an unhandled one
