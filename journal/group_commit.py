"""Group commit: many concurrent ``persist`` calls, one statement and one commit.

:class:`BatchPlanner` is the pure part (which queued calls go into the next batch) and can be
driven step by step in a test; :class:`GroupCommit` is the thin asyncio loop around it.
Rules: FIFO; at most ``max_batch_events`` events per batch (a larger single call goes alone);
at most one call per persistence id in a batch and in flight, so calls for one pid are written
in the order they were made; at most ``max_in_flight`` batches at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, cast

from .backend import WriteRequest, WriteResult, new_row
from .columns import WriteColumns
from .envelope import consecutive_stamps
from .errors import JournalUnavailable

log = logging.getLogger("journal.group_commit")

WriteBatch = Callable[[Sequence[WriteRequest]], Awaitable[list[WriteResult | Exception]]]
WriteColumnsFn = Callable[[WriteColumns], Awaitable[datetime | list[WriteResult | Exception]]]
"""Writes one-event calls given as columns: the timestamp all got, or a result per call."""
Result = WriteResult | Exception | datetime
"""Per call of a bulk write: a WriteResult, the timestamp of a call written as a column, or its error."""


class Pending(NamedTuple):
    request: WriteRequest
    future: asyncio.Future[WriteResult]


@dataclass
class BatchPlanner:
    """Chooses the next batch from the queue; tracks pids in flight."""

    max_batch_events: int
    queue: deque[Pending] = field(default_factory=deque)
    in_flight_pids: set[str] = field(default_factory=set)

    def next_batch(self) -> list[Pending]:
        batch: list[Pending] = []
        blocked = set(self.in_flight_pids)
        events = 0
        kept: deque[Pending] = deque()
        while self.queue:
            p = self.queue.popleft()
            if p.future.done():  # cancelled while queued
                continue
            pid = p.request.persistence_id
            n = len(p.request.events)
            fits = not batch or events + n <= self.max_batch_events
            if pid in blocked or not fits:
                blocked.add(pid)
                kept.append(p)
                if not fits and events >= self.max_batch_events:
                    break
                continue
            blocked.add(pid)
            batch.append(p)
            events += n
        kept.extend(self.queue)
        self.queue = kept
        self.in_flight_pids.update([p.request.persistence_id for p in batch])
        return batch

    def done(self, batch: Sequence[Pending]) -> None:
        self.in_flight_pids.difference_update([p.request.persistence_id for p in batch])


MIN_BULK_CHUNK_EVENTS = 250
"""A bulk write is split across connections only into statements of at least this many events."""


def plan_chunks(requests: Sequence[WriteRequest], max_events: int) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` slices of at most ``max_events`` events (a larger request
    goes alone), in order: the statements of one bulk write."""
    chunks: list[tuple[int, int]] = []
    start, events = 0, 0
    for i, r in enumerate(requests):
        n = len(r.events)
        if i > start and events + n > max_events:
            chunks.append((start, i))
            start, events = i, 0
        events += n
    if start < len(requests):
        chunks.append((start, len(requests)))
    return chunks


RELEASE_WAVE_MIN = 200
"""A finished batch of at least twice this many calls wakes its callers in two waves (see
:meth:`GroupCommit._release`)."""


def _settle(batch: Sequence[Pending], results: Sequence[WriteResult | Exception]) -> None:
    for p, res in zip(batch, results, strict=True):
        if p.future.done():
            continue
        if isinstance(res, Exception):
            p.future.set_exception(res)
        else:
            p.future.set_result(res)


class GroupCommit:
    """Coalesces concurrent write requests into batches written by ``write_batch``."""

    def __init__(
        self,
        write_batch: WriteBatch,
        *,
        max_batch_events: int,
        max_in_flight: int,
        max_batch_wait: float = 0.0,
        bulk_in_flight: int = 1,
    ) -> None:
        self._write_batch = write_batch
        self._planner = BatchPlanner(max_batch_events)
        self._max_in_flight = max_in_flight
        self._max_batch_wait = max_batch_wait
        self._bulk_in_flight = bulk_in_flight
        self._running: set[asyncio.Task[None]] = set()
        self._scheduled = False
        self._direct = 0
        self._releasing = 0
        self._closed = False
        self.batches_written = 0
        self.calls_written = 0

    async def submit(self, request: WriteRequest) -> WriteResult:
        """The call's result: from the batch it joins, or (idle journal) from writing it alone."""
        if self._closed:
            raise JournalUnavailable("the journal is closed")
        if not self._running and not self._direct and not self._planner.queue and not self._releasing:
            return await self._write_now(request)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[WriteResult] = loop.create_future()
        self._planner.queue.append(new_row(Pending, (request, fut)))
        if not self._scheduled:
            self._scheduled = True
            if self._max_batch_wait > 0 and not self._running:
                loop.call_later(self._max_batch_wait, self._pump)
            else:
                loop.call_soon(self._pump)
        return await fut

    async def submit_many(self, requests: Sequence[WriteRequest]) -> list[WriteResult | Exception]:
        """Write many requests (distinct pids), each atomic and failing alone; results in order.

        When idle, they are written in the caller's task in chunks of at most
        ``max_batch_events`` events (no future per request); as soon as other calls queue up,
        the rest joins the queue behind them, so a large bulk write does not starve them.
        """
        if self._closed:
            raise JournalUnavailable("the journal is closed")
        out: list[Result] = []
        todo = list(requests)
        if not self._running and not self._direct and not self._planner.queue:
            total = sum([len(r.events) for r in todo])
            chunks = plan_chunks(todo, self._bulk_chunk_events(total))

            async def write(start: int, end: int) -> Sequence[Result]:
                return await self._write_batch(todo[start:end])

            done = await self._write_many_now(chunks, write, lambda s, e: [r.persistence_id for r in todo[s:e]], out)
            todo = todo[done:]
        if todo:
            out.extend(await self._queued(todo))
        return cast(list[WriteResult | Exception], out)

    async def submit_columns(self, columns: WriteColumns, write_columns: WriteColumnsFn) -> list[Result]:
        """:meth:`submit_many` for one-event calls given as columns, written by ``write_columns``
        (no object per call). A call's result is the timestamp it was written with (one
        :data:`~journal.envelope.ROW_STEP` after the call before it in its chunk), a
        WriteResult, or its error. Calls not written from the caller's task (other calls
        queued up) join the queue as requests."""
        if self._closed:
            raise JournalUnavailable("the journal is closed")
        out: list[Result] = []
        n = len(columns)
        done = 0
        if not self._running and not self._direct and not self._planner.queue:
            size = self._bulk_chunk_events(n)
            chunks = [(s, min(n, s + size)) for s in range(0, n, size)]

            async def write(start: int, end: int) -> Sequence[Result]:
                got = await write_columns(columns.chunk(start, end))
                return consecutive_stamps(got, end - start) if isinstance(got, datetime) else got

            done = await self._write_many_now(chunks, write, lambda s, e: columns.persistence_ids[s:e], out)
        if done < n:
            out.extend(await self._queued(columns.chunk(done, n).requests()))
        return out

    def _bulk_chunk_events(self, total: int) -> int:
        """Events per statement of a bulk write: at least ``bulk_in_flight`` statements when
        there is enough to share, so they overlap; at most ``max_batch_events``."""
        size = max(MIN_BULK_CHUNK_EVENTS, -(-total // self._bulk_in_flight))
        return min(size, self._planner.max_batch_events)

    async def _queued(self, requests: list[WriteRequest]) -> list[WriteResult | Exception]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[WriteResult]] = []
        for r in requests:
            fut: asyncio.Future[WriteResult] = loop.create_future()
            self._planner.queue.append(Pending(r, fut))
            futures.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._pump)
        got = await asyncio.gather(*futures, return_exceptions=True)
        return [g if isinstance(g, WriteResult | Exception) else JournalUnavailable(repr(g)) for g in got]

    async def _write_many_now(
        self,
        chunks: list[tuple[int, int]],
        write_chunk: Callable[[int, int], Awaitable[Sequence[Result]]],
        pids_of: Callable[[int, int], list[str]],
        out: list[Result],
    ) -> int:
        """Idle fast path of a bulk write: ``chunks`` (``[start, end)`` call ranges, in order)
        written from the caller's task, up to ``bulk_in_flight`` at once, until other calls
        queue up. Appends the results of the calls it handled (a prefix) to ``out`` and returns
        their number."""
        in_flight = self._planner.in_flight_pids
        running: list[asyncio.Task[Sequence[Result]]] = []
        failed: Exception | None = None
        done = 0

        async def write(start: int, end: int) -> Sequence[Result]:
            pids = pids_of(start, end)
            in_flight.update(pids)
            try:
                return await write_chunk(start, end)
            finally:
                in_flight.difference_update(pids)

        def collect(task: asyncio.Task[Sequence[Result]], size: int) -> None:
            nonlocal failed
            e = task.exception()
            if e is None:
                out.extend(task.result())
            elif isinstance(e, Exception):  # the whole statement failed: this chunk, and stop
                failed = failed or e
                out.extend([e] * size)
            else:
                raise e
            self.batches_written += 1
            self.calls_written += size

        self._direct += 1
        total = chunks[-1][1] if chunks else 0
        try:
            loop = asyncio.get_running_loop()
            sizes: list[int] = []
            for start, end in chunks:
                if failed is not None or self._planner.queue:
                    break
                if len(running) >= self._bulk_in_flight:
                    await asyncio.wait([running[0]])
                    collect(running.pop(0), sizes.pop(0))
                    if failed is not None:
                        break
                running.append(loop.create_task(write(start, end)))
                sizes.append(end - start)
                done = end
            for task, size in zip(running, sizes, strict=True):
                await asyncio.wait([task])
                collect(task, size)
            running = []
            if failed is not None and done < total:
                rest = JournalUnavailable(f"not attempted after an earlier part failed: {failed}")
                out.extend([rest] * (total - done))
                done = total
        finally:
            for task in running:  # the caller was cancelled: so are its statements
                task.cancel()
            self._direct -= 1
            if self._planner.queue:
                self._pump()
        return done

    async def _write_now(self, request: WriteRequest) -> WriteResult:
        """Idle fast path: nothing queued or in flight, so write at once in the caller's task."""
        pid = request.persistence_id
        self._direct += 1
        self._planner.in_flight_pids.add(pid)
        try:
            (result,) = await self._write_batch([request])
        finally:
            self._direct -= 1
            self._planner.in_flight_pids.discard(pid)
            if self._planner.queue:
                self._pump()
        self.batches_written += 1
        self.calls_written += 1
        if isinstance(result, Exception):
            raise result
        return result

    def _pump(self) -> None:
        self._scheduled = False
        while len(self._running) + self._direct < self._max_in_flight:
            batch = self._planner.next_batch()
            if not batch:
                return
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[Pending]) -> None:
        try:
            results = await self._write_batch([p.request for p in batch])
        except BaseException as e:
            # cancelled (e.g. the loop shutting down) while the statement may have been sent
            err = (
                e if isinstance(e, Exception) else JournalUnavailable(f"write interrupted: {e!r}", outcome_unknown=True)
            )
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)
            if not isinstance(e, Exception):
                raise
        else:
            self.batches_written += 1
            self.calls_written += len(batch)
            half = len(batch) // 2 if len(batch) >= 2 * RELEASE_WAVE_MIN else len(batch)
            _settle(batch[:half], results[:half])
            if half < len(batch):
                self._releasing += 1
                asyncio.get_running_loop().call_soon(self._release, batch[half:], results[half:])
        finally:
            self._planner.done(batch)
            # this task no longer occupies a slot: without this, the pump below could see every
            # slot taken (by tasks that are finishing) and leave queued calls waiting forever
            task = asyncio.current_task()
            if task is not None:
                self._running.discard(task)
            if self._planner.queue and not self._releasing:  # else _release pumps, after its first wave
                self._pump()

    def _release(self, batch: list[Pending], results: list[WriteResult | Exception]) -> None:
        """The second wave of a finished batch's callers.

        Woken all at once, a batch's callers would each write their next call before any of
        those calls is sent: the client would wake them all, then wait idle while the server
        writes the one large batch they make, and the server would idle meanwhile. Instead the
        first half is woken, then (here, one loop turn later, when those callers have queued
        their next calls) those calls are sent, and only then is the second half woken: the
        client wakes it while the server writes the first half's calls, on two cores at once.
        """
        self._releasing -= 1
        self._pump()
        _settle(batch, results)

    async def close(self) -> None:
        """Refuse new calls, then write everything already queued or in flight, and deliver
        every result (a batch's second wave is woken one loop turn after its first)."""
        self._closed = True
        while self._running or self._planner.queue or self._direct or self._releasing:
            self._pump()
            if not self._running:
                if self._direct:
                    await asyncio.sleep(0.001)  # a caller's own write is finishing; it pumps the queue after
                elif self._releasing:
                    await asyncio.sleep(0)  # one loop turn: the pending _release runs
                else:
                    break
                continue
            await asyncio.gather(*list(self._running), return_exceptions=True)
