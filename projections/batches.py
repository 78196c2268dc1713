"""What every processor does around its batches: a reader task fills a bounded read-ahead queue
from the processor's query, batches are taken from it (up to the delivery's size, or what came
within ``group_max_wait``), and each is admitted (validated, deduplicated) and delivered until
the processor is asked to stop; then the delivery stores what is left (:func:`process`).

A slice range (:mod:`.runner`) and a tag (:mod:`.tag_runner`) differ only in their query, how
they admit an envelope, and their offset rows; this loop and the deliveries are theirs alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
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


async def _read(source: Callable[[], AsyncIterator[EventEnvelope]], queue: ReadAhead[Any]) -> None:
    try:
        async for env in source():
            await queue.put(env)
    except asyncio.CancelledError:
        raise
    except BaseException as e:
        await queue.put(e)
        return
    await queue.put(_END)  # a live query does not end; a finite source stops the processor


class Batches:
    """The batches of one query, read ahead by a task of their own."""

    def __init__(self, queue_size: int, size: int, max_wait: float, stopping: asyncio.Event) -> None:
        self.queue: ReadAhead[Any] = ReadAhead(queue_size)
        self.size = size
        self.max_wait = max_wait
        self.stopping = stopping
        """Set by the end of a finite source too."""

    async def next(self) -> Batch:
        """Up to ``size`` envelopes: what is read ahead, or what comes within ``max_wait`` of the
        first; a heartbeat ends a batch; empty when nothing came for a moment."""
        queue, size, stopping = self.queue, self.size, self.stopping
        batch: Batch = []
        deadline: float | None = None
        while len(batch) < size:
            if queue.empty():  # only then is the clock read: items already read ahead are free
                if batch:
                    assert deadline is not None
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        break
                else:
                    timeout = 0.2
                try:
                    item = await within(queue.get(), timeout)
                except TimeoutError:
                    break
            else:
                item = queue.get_nowait()
            if item is _END:
                stopping.set()
                break
            if isinstance(item, BaseException):
                raise item
            batch.append(item)
            if item.source == "heartbeat":
                break
            if deadline is None:
                deadline = time.monotonic() + self.max_wait
            if stopping.is_set():
                break
        return batch


async def process(
    source: Callable[[], AsyncIterator[EventEnvelope]],
    batches: Batches,
    admit: Callable[[Batch], Awaitable[None]],
    delivery: Delivery,
) -> None:
    """Read the query ``source`` opens, admit each batch (it hands what it accepts to ``delivery``) until asked to
    stop; then the delivery stores what is left. An empty batch is the delivery's idle turn."""
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
        # never let a reader that is slow to unwind (a query being cancelled) hold up the
        # hand-over of these slices: it finishes in the background
        reader.add_done_callback(_consume)
        reader.cancel()
