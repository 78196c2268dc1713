"""What every processor does around its batches: a reader task fills a bounded read-ahead queue
with the pages of the processor's query, batches are cut from them (up to the delivery's size, or what came
within ``group_max_wait``), and each is admitted (validated, deduplicated) and delivered until
the processor is asked to stop; then the delivery stores what is left (:func:`process`).

A slice range (:mod:`.runner`) and a tag (:mod:`.tag_runner`) differ only in their query, how
they admit an envelope, and their offset rows; this loop and the deliveries are theirs alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

from journal.envelope import EventEnvelope
from journal.waits import within

from .delivery import Delivery
from .read_ahead import ReadAhead

log = logging.getLogger("projections.runner")
_END = object()
Batch = list[EventEnvelope]


class Processor(Protocol):
    """One unit of work of a worker (a slice range, a tag) while it holds its leases."""

    key: str
    """The unit as stored and logged: ``lo-hi``, ``tag:<tag>``."""

    async def run(self) -> None: ...

    def stop(self) -> None:
        """Ask to stop after the current batch (committed, or rolled back if it cannot commit)."""
        ...


def _consume(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("reader ended with %r", task.exception())


Pages = Callable[[], AsyncIterator[Sequence[EventEnvelope]]]
"""Opens a processor's query, a page of envelopes at a time (a heartbeat alone on its page)."""
Reader = Callable[[ReadAhead[Any]], Awaitable[None]]
"""Fills a read-ahead with the pages of a query (:func:`pages`, :func:`one_a_page`)."""


def pages(source: Pages) -> Reader:
    """A query read a page at a time (``Journal.event_pages_by_slices``)."""

    async def fill(queue: ReadAhead[Any]) -> None:
        async for page in source():
            await queue.put(page, len(page))

    return fill


def one_a_page(source: Callable[[], AsyncIterator[EventEnvelope]]) -> Reader:
    """A query of single envelopes (a tag's, a source of the caller's): a page of one each."""

    async def fill(queue: ReadAhead[Any]) -> None:
        async for env in source():
            await queue.put((env,), 1)

    return fill


async def _read(fill: Reader, queue: ReadAhead[Any]) -> None:
    try:
        await fill(queue)
    except asyncio.CancelledError:
        raise
    except BaseException as e:
        await queue.put(e)
        return
    await queue.put(_END)  # a live query does not end; a finite source stops the processor


class Batches:
    """The batches of one query, read ahead a page at a time by a task of their own; a batch is
    cut from the pages (what is left of a page starts the next batch)."""

    def __init__(self, queue_size: int, size: int, max_wait: float, stopping: asyncio.Event) -> None:
        self.queue: ReadAhead[Any] = ReadAhead(queue_size)
        """Pages, weighed by their envelopes: ``queue_size`` envelopes read ahead (at least a page)."""
        self.size = size
        self.max_wait = max_wait
        self.stopping = stopping
        """Set by the end of a finite source too."""
        self._page: Sequence[EventEnvelope] = ()
        self._at = 0
        """Where the rest of the current page starts."""

    async def next(self) -> Batch:
        """Up to ``size`` envelopes: what is read ahead, or what comes within ``max_wait`` of the
        first; a heartbeat ends a batch; empty when nothing came for a moment."""
        size, stopping = self.size, self.stopping
        batch: Batch = []
        deadline: float | None = None
        while len(batch) < size:
            page, at = self._page, self._at
            if at >= len(page):
                item = await self._next_page(deadline if batch else None)
                if item is None:
                    break
                page, at = self._page, self._at = item, 0
            end = min(len(page), at + size - len(batch))
            batch += page[at:end]
            self._at = end
            if page[end - 1].source == "heartbeat":  # alone on its page
                break
            if deadline is None:
                deadline = time.monotonic() + self.max_wait
            if stopping.is_set():
                break
        return batch

    async def _next_page(self, deadline: float | None) -> Sequence[EventEnvelope] | None:
        """The next page read ahead, or the one that comes by ``deadline`` (a moment when the
        batch is empty); None when none came or the source ended."""
        queue = self.queue
        if queue.empty():  # only then is the clock read: pages already read ahead are free
            timeout = 0.2 if deadline is None else deadline - time.monotonic()
            if timeout <= 0:
                return None
            try:
                item = await within(queue.get(), timeout)
            except TimeoutError:
                return None
        else:
            item = queue.get_nowait()
        if item is _END:
            self.stopping.set()
            return None
        if isinstance(item, BaseException):
            raise item
        page: Sequence[EventEnvelope] = item
        return page


async def process(
    source: Reader,
    batches: Batches,
    admit: Callable[[Batch], Awaitable[None]],
    delivery: Delivery,
) -> None:
    """Read the query ``source`` fills the read-ahead with, admit each batch (it hands what it
    accepts to ``delivery``) until asked to stop; then the delivery stores what is left. An
    empty batch is the delivery's idle turn."""
    reader = asyncio.create_task(_read(source, batches.queue))
    try:
        while not batches.stopping.is_set():
            batch = await batches.next()
            if batch:
                await admit(batch)
            else:
                await delivery.deliver((), {})
        await delivery.stop()
    finally:
        delivery.close()
        # never let a reader that is slow to unwind (a query being cancelled) hold up the
        # hand-over of these slices: it finishes in the background
        reader.add_done_callback(_consume)
        reader.cancel()
