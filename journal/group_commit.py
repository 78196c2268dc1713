"""Group commit: many concurrent ``persist`` calls, one statement and one commit.

:class:`BatchPlanner` is the pure part (which queued calls go into the next batch) and can be
driven step by step in a test; :class:`GroupCommit` is the thin asyncio loop around it.
Rules: FIFO; at most ``max_batch_events`` events per batch (a larger single call goes alone);
at most one call per persistence id in a batch and in flight, so calls for one pid are written
in the order they were made; at most ``max_in_flight`` batches at once.

A call whose outcome must be waited for (a move fences or switches its slice range, its
interrupted write is being resolved, its tags are being written: the backend answers it
:class:`~journal.write_batch.WriteLater`) waits apart: the batch's other callers are answered
at once and its slot is free for the next batch, while the waiting call (its pid still in
flight, so no later call of that pid overtakes it) is finished on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain, islice
from typing import Any

import msgspec

from .errors import JournalUnavailable
from .write_batch import BatchResult, WriteBatch, WriteFn, WriteLater, completed, deferrals

log = logging.getLogger("journal.group_commit")

ChunksFn = Callable[[Iterator[WriteBatch]], Awaitable[list[BatchResult]]]
"""Writes the chunks of a bulk write (the backend's ``write_chunks``)."""
CallResult = tuple[int, datetime]
"""A lone call's result: its first sequence number and its first event's db_timestamp."""


class Pending(msgspec.Struct):
    """A queued batch (a ``persist`` call, or a chunk of a ``persist_many``) and the future its
    caller awaits: a :data:`CallResult` (or the call's error) for a ``persist`` call, a
    :class:`BatchResult` for a chunk (of any size: a chunk of one call too)."""

    batch: WriteBatch
    future: asyncio.Future[Any]
    chunk: bool = False


@dataclass
class BatchPlanner:
    """Chooses the next batch from the queue; tracks pids in flight."""

    max_batch_events: int
    queue: deque[Pending] = field(default_factory=deque)
    in_flight_pids: set[str] = field(default_factory=set)

    def next_batch(self) -> list[Pending]:
        queue, limit = self.queue, self.max_batch_events
        batch: list[Pending] = []
        blocked = set(self.in_flight_pids)
        events = 0
        kept: deque[Pending] = deque()
        while queue:
            p = queue.popleft()
            if p.future.done():  # cancelled while queued
                continue
            pids = p.batch.persistence_ids
            free = pids[0] not in blocked if len(pids) == 1 else blocked.isdisjoint(pids)
            blocked.update(pids)  # a later call of these pids never overtakes this one
            n = len(p.batch.payloads)
            if free and (not batch or events + n <= limit):
                batch.append(p)
                events += n
                continue
            kept.append(p)
            if free and events >= limit:
                break
        kept.extend(queue)
        self.queue = kept
        for p in batch:
            self.in_flight_pids.update(p.batch.persistence_ids)
        return batch

    def done(self, batch: Sequence[Pending]) -> None:
        for p in batch:
            self.in_flight_pids.difference_update(p.batch.persistence_ids)


MIN_BULK_CHUNK_EVENTS = 250
"""A bulk write is split across connections only into statements of at least this many calls."""
BULK_CHUNKS_PER_CONNECTION = 2
"""A bulk write is split into about this many chunks per connection (``write.bulk_in_flight``),
so one is checked while the others are written."""


def _failed_whole(chunk: WriteBatch, error: BaseException) -> BatchResult:
    """The result of a queued chunk whose whole statement failed."""
    return BatchResult.failed(len(chunk), error if isinstance(error, Exception) else JournalUnavailable(repr(error)))


def plan_chunks(counts: Sequence[int], max_events: int) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` slices of calls (``counts``: each call's events) of at most
    ``max_events`` events (a larger call goes alone), in order: the statements of one bulk write."""
    if not counts:
        return []
    if counts.count(1) == len(counts):  # one event each: fixed-size slices
        return [(s, min(len(counts), s + max_events)) for s in range(0, len(counts), max_events)]
    chunks: list[tuple[int, int]] = []
    start, events = 0, 0
    for i, n in enumerate(counts):
        if i > start and events + n > max_events:
            chunks.append((start, i))
            start, events = i, 0
        events += n
    chunks.append((start, len(counts)))
    return chunks


RELEASE_WAVE_MIN = 200
"""A finished batch of at least twice this many calls wakes its callers in two waves (see
:meth:`GroupCommit._release`)."""


def _settle(batch: Sequence[Pending], result: BatchResult, deferring: bool = False) -> None:
    """Give each queued batch its part of ``result`` (``batch`` written in that order), except
    (``deferring``: the result holds :class:`WriteLater`) the ones with a deferred call (they are
    answered when it is finished)."""
    firsts, stamps, errors = result.first_seq_nrs, result.db_timestamps, result.errors
    i = 0
    for p in batch:
        n = len(p.batch)
        fut = p.future
        if fut.done() or (deferring and any(type(errors.get(k)) is WriteLater for k in range(i, i + n))):
            pass
        elif n != 1 or p.chunk:
            fut.set_result(result.part(i, i + n))
        elif errors and i in errors:
            fut.set_exception(errors[i])
        else:
            fut.set_result((firsts[i], stamps[i]))
        i += n


Waiting = tuple[list[WriteLater], list[tuple[int, Pending]]]
"""Queued batches (each with the index of its first call) and the :class:`WriteLater` that
defer their calls: they are answered once every one of those is finished."""


def _waiting(batch: Sequence[Pending], laters: Sequence[WriteLater]) -> list[Waiting]:
    """The queued batches holding deferred calls, grouped by the ``laters`` deferring them."""
    owner = {k: later for later in laters for k in later.calls}
    groups: dict[tuple[int, ...], Waiting] = {}
    i = 0
    for p in batch:
        n = len(p.batch)
        mine = {id(owner[k]): owner[k] for k in range(i, i + n) if k in owner}
        if mine:
            groups.setdefault(tuple(mine), (list(mine.values()), []))[1].append((i, p))
        i += n
    return list(groups.values())


async def _finished(result: BatchResult) -> BatchResult:
    """``result`` with its deferred calls (if any) written."""
    laters = deferrals(result)
    return await _completed(result, laters, [later.finish() for later in laters])


async def _completed(
    result: BatchResult, laters: Sequence[WriteLater], finishing: Sequence[Awaitable[BatchResult]]
) -> BatchResult:
    """``result`` with the outcomes of the calls ``laters`` defer (``finishing``: their finishes)."""
    outcomes = [await finishing[0]] if len(finishing) == 1 else await asyncio.gather(*finishing)
    for later, got in zip(laters, outcomes, strict=True):
        result = completed(result, later, got)
    return result


class GroupCommit:
    """Coalesces concurrent write batches into one statement each, written by ``write_batch``."""

    def __init__(
        self,
        write_batch: WriteFn,
        write_chunks: ChunksFn,
        *,
        max_batch_events: int,
        max_in_flight: int,
        max_batch_wait: float = 0.0,
        bulk_in_flight: int = 1,
    ) -> None:
        self._write_batch = write_batch
        self._write_chunks = write_chunks
        self._planner = BatchPlanner(max_batch_events)
        self._max_in_flight = max_in_flight
        self._max_batch_wait = max_batch_wait
        self._bulk_in_flight = bulk_in_flight
        self._running: set[asyncio.Task[None]] = set()
        self._apart: set[asyncio.Task[None]] = set()
        """Calls of queued batches waiting on their own (:class:`WriteLater`; they hold no slot)."""
        self._direct_apart = 0
        """Callers' own writes (the idle paths) waiting so."""
        self._scheduled = False
        self._direct = 0
        self._releasing = 0
        self._closed = False
        self.batches_written = 0
        self.calls_written = 0

    def _idle(self) -> bool:
        return (
            not self._running and not self._direct and not self._planner.queue and not self._apart
            and not self._direct_apart
        )  # fmt: skip

    def submit(self, batch: WriteBatch) -> Awaitable[CallResult]:
        """The result of a batch of one call: from the batch it joins, or (idle journal) from
        writing it alone. Raises the call's error. Await it at once: the idle path takes its
        place among the writes in flight when it starts."""
        if self._closed:
            raise JournalUnavailable("the journal is closed")
        if self._idle() and not self._releasing:
            return self._write_now(batch)
        return self._enqueue(batch, self._max_batch_wait)

    def _enqueue(self, batch: WriteBatch, wait: float = 0.0, *, chunk: bool = False) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._planner.queue.append(Pending(batch, fut, chunk))
        if not self._scheduled:
            self._scheduled = True
            if wait > 0 and not self._running:
                loop.call_later(wait, self._pump)
            else:
                loop.call_soon(self._pump)
        return fut

    async def submit_chunks(self, chunks: Iterator[WriteBatch]) -> tuple[list[WriteBatch], list[BatchResult]]:
        """Write the chunks of a bulk write (distinct pids), each call atomic and failing alone;
        returns the chunks as written (split at ``max_batch_events`` events) and their results.

        When idle, they are written from the caller's task: a bulk write of one chunk (checked
        whole) in statements written at once by ``write_batch``, as batches of queued calls are
        (:meth:`_write_at_once`: nothing to hold open), and a larger one by ``write_chunks``,
        each chunk checked while the ones before it are written. As soon as other calls queue
        up, the rest is checked and joins the queue behind them, so a large bulk write does not
        starve them. The iterator's error (bad input) is raised as is: nothing was written.
        """
        if self._closed:
            raise JournalUnavailable("the journal is closed")
        taken: list[WriteBatch] = []
        rest: list[WriteBatch] = []
        results: list[BatchResult] = []
        if self._idle():
            split = self._split(chunks)
            head = list(islice(split, 2))  # checked before anything is sent: one chunk or more?
            if len(head) == 1:
                results = await self._write_chunks_now(iter(self._pieces(head[0])), taken, rest, self._write_at_once)
            else:
                results = await self._write_chunks_now(chain(head, split), taken, rest, self._write_chunks)
        else:
            rest = list(self._split(chunks))
        if rest:
            got = await asyncio.gather(*[self._enqueue(c, chunk=True) for c in rest], return_exceptions=True)
            results += [
                _failed_whole(c, r) if isinstance(r, BaseException) else r for c, r in zip(rest, got, strict=True)
            ]
        return taken + rest, results

    def bulk_chunk_calls(self, calls: int) -> int:
        """Calls per chunk of a bulk write: all of them when they fit one statement (one chunk,
        written as one statement); else several chunks per connection, so the next one is checked
        while the server writes the ones before, of at least ``MIN_BULK_CHUNK_EVENTS`` calls."""
        limit = self._planner.max_batch_events
        if calls <= limit:
            return max(1, calls)
        size = -(-calls // (BULK_CHUNKS_PER_CONNECTION * self._bulk_in_flight))
        return min(max(MIN_BULK_CHUNK_EVENTS, size), limit)

    def _pieces(self, chunk: WriteBatch) -> list[WriteBatch]:
        """A bulk write checked whole, in up to ``bulk_in_flight`` statements of at least
        ``MIN_BULK_CHUNK_EVENTS`` calls each."""
        n = len(chunk)
        size = -(-n // max(1, min(self._bulk_in_flight, n // MIN_BULK_CHUNK_EVENTS)))
        return [chunk.chunk(start, min(n, start + size)) for start in range(0, n, size)]

    async def _write_at_once(self, chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        """Statements of a bulk write checked whole, written at once by ``write_batch``, as
        group-commit batches are: nothing to hold open, the server writes them side by side."""
        pieces = list(chunks)
        got = await asyncio.gather(*map(self._write_batch, pieces), return_exceptions=True)
        return [_failed_whole(p, r) if isinstance(r, BaseException) else r for p, r in zip(pieces, got, strict=True)]

    def _split(self, chunks: Iterator[WriteBatch]) -> Iterator[WriteBatch]:
        """Chunks of at most ``max_batch_events`` events (a larger call goes alone)."""
        for chunk in chunks:
            if chunk.events <= self._planner.max_batch_events:
                yield chunk
            else:
                for start, end in plan_chunks(chunk.counts, self._planner.max_batch_events):
                    yield chunk.chunk(start, end)

    async def _write_chunks_now(
        self, chunks: Iterator[WriteBatch], taken: list[WriteBatch], rest: list[WriteBatch], write: ChunksFn
    ) -> list[BatchResult]:
        """Idle path of a bulk write: the chunks handed to ``write`` (appended to ``taken``)
        until other calls queue up; then the rest is checked into ``rest``."""
        in_flight = self._planner.in_flight_pids
        invalid: list[BaseException] = []

        def feed() -> Iterator[WriteBatch]:
            try:
                for chunk in chunks:
                    in_flight.update(chunk.persistence_ids)
                    taken.append(chunk)
                    yield chunk
                    if self._planner.queue:  # others wait: the rest joins the queue, once checked
                        rest.extend(chunks)
                        return
            except BaseException as e:
                invalid.append(e)
                raise

        self._direct += 1
        direct = True
        try:
            results = await write(feed())
            if any(map(deferrals, results)):  # calls waiting apart: free the slot
                self._direct -= 1
                self._direct_apart += 1
                direct = False
                if self._planner.queue:
                    self._pump()
                results = list(await asyncio.gather(*map(_finished, results)))
        except Exception as e:
            if invalid and invalid[0] is e:  # bad input: nothing was written
                raise
            rest.extend(chunks)  # checked all the same: bad input raises before an outage is reported
            results = [BatchResult.failed(len(c), e) for c in taken]
            rest_error = JournalUnavailable(f"not attempted after an earlier part failed: {e}")
            results += [BatchResult.failed(len(c), rest_error) for c in rest]
            taken.extend(rest)
            rest.clear()
        finally:
            for chunk in taken:
                in_flight.difference_update(chunk.persistence_ids)
            if direct:
                self._direct -= 1
            else:
                self._direct_apart -= 1
            if self._planner.queue:
                self._pump()
        self.batches_written += len(results)
        self.calls_written += sum(map(len, results))
        return results

    async def _write_now(self, batch: WriteBatch) -> CallResult:
        """Idle fast path: nothing queued or in flight, so write a call at once in the caller's task."""
        pid = batch.persistence_ids[0]
        self._direct += 1
        direct = True
        self._planner.in_flight_pids.add(pid)
        try:
            result = await self._write_batch(batch)
            if deferrals(result):  # its outcome must be waited for: free the slot, wait apart
                self._direct -= 1
                self._direct_apart += 1
                direct = False
                if self._planner.queue:
                    self._pump()
                result = await _finished(result)
        finally:
            if direct:
                self._direct -= 1
            else:
                self._direct_apart -= 1
            self._planner.in_flight_pids.discard(pid)
            if self._planner.queue:
                self._pump()
        self.batches_written += 1
        self.calls_written += 1
        if result.errors:
            raise result.errors[0]
        return result.first_seq_nrs[0], result.db_timestamps[0]

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
        done = batch
        try:
            result = await self._write_batch(WriteBatch.concat([p.batch for p in batch]))
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
            self.calls_written += len(result)
            laters = deferrals(result)
            if laters:
                done = self._wait_apart(batch, result, laters)
            half = len(batch) // 2 if len(batch) >= 2 * RELEASE_WAVE_MIN else len(batch)
            _settle(batch[:half], result, bool(laters))
            if half < len(batch):
                self._releasing += 1
                calls = sum(len(p.batch) for p in batch[:half])
                second = result.part(calls, len(result))
                asyncio.get_running_loop().call_soon(self._release, batch[half:], second, bool(laters))
        finally:
            self._planner.done(done)
            # this task no longer occupies a slot: without this, the pump below could see every
            # slot taken (by tasks that are finishing) and leave queued calls waiting forever
            task = asyncio.current_task()
            if task is not None:
                self._running.discard(task)
            if self._planner.queue and not self._releasing:  # else _release pumps, after its first wave
                self._pump()

    def _wait_apart(self, batch: list[Pending], result: BatchResult, laters: list[WriteLater]) -> list[Pending]:
        """Finish the calls ``laters`` defer, each in a task of its own (no slot; their pids stay
        in flight until they are answered), and answer each queued batch holding some as soon as
        those it waits for are finished; returns the batch's other queued batches."""
        loop = asyncio.get_running_loop()
        groups = _waiting(batch, laters)
        uses = Counter(id(m) for mine, _ in groups for m in mine)
        # a deferral that holds calls of one group is finished by it; one of several groups, once
        shared = {id(m): asyncio.ensure_future(m.finish()) for m in laters if uses[id(m)] > 1}
        held: set[int] = set()
        for mine, waiting in groups:
            finishing = [shared[id(m)] if id(m) in shared else m.finish() for m in mine]
            task = loop.create_task(self._finish_apart(waiting, result, mine, finishing))
            self._apart.add(task)
            task.add_done_callback(self._apart.discard)
            held.update(id(p) for _, p in waiting)
        return [p for p in batch if id(p) not in held]

    async def _finish_apart(
        self,
        waiting: list[tuple[int, Pending]],
        result: BatchResult,
        laters: list[WriteLater],
        finishing: list[Awaitable[BatchResult]],
    ) -> None:
        try:
            full = await _completed(result, laters, finishing)
        except BaseException as e:
            err = (
                e if isinstance(e, Exception) else JournalUnavailable(f"write interrupted: {e!r}", outcome_unknown=True)
            )
            for _, p in waiting:
                if not p.future.done():
                    p.future.set_exception(err)
            if not isinstance(e, Exception):
                raise
        else:
            for i, p in waiting:
                _settle([p], full.part(i, i + len(p.batch)))
        finally:
            self._planner.done([p for _, p in waiting])
            if self._planner.queue and not self._releasing:
                self._pump()

    def _release(self, batch: list[Pending], result: BatchResult, deferring: bool = False) -> None:
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
        _settle(batch, result, deferring)

    async def close(self) -> None:
        """Refuse new calls, then write everything already queued or in flight, and deliver
        every result (a batch's second wave is woken one loop turn after its first)."""
        self._closed = True
        while (
            self._running or self._planner.queue or self._direct or self._releasing or self._apart or self._direct_apart
        ):
            self._pump()
            if not self._running and self._apart:
                await asyncio.gather(*list(self._apart), return_exceptions=True)
                continue
            if not self._running:
                if self._direct or self._direct_apart:
                    await asyncio.sleep(0.001)  # a caller's own write is finishing; it pumps the queue after
                elif self._releasing:
                    await asyncio.sleep(0)  # one loop turn: the pending _release runs
                else:
                    break
                continue
            await asyncio.gather(*list(self._running), return_exceptions=True)
