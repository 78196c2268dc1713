"""The bounded hand-over between a projection's reader task and its processing loop.

Used like ``asyncio.Queue`` (``put``, ``get``, ``get_nowait``, ``empty``) by exactly one
producer and one consumer, at a fraction of its cost per item: a queue keeps waiter futures and
wakes one per item, which at 100k+ envelopes per second was a tenth of a projection's time. Here
an item is a deque append and a popleft; the tasks are woken only when one actually waits
(the consumer on an empty buffer, the reader on a full one). An item may weigh more than one (a
page of envelopes weighs its length): ``maxsize`` bounds the weight held, and a putter waits
while the buffer holds that much (one item heavier than the rest of the room still goes in).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from journal.errors import InvalidArgument

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """Items of at most ``maxsize`` weight in all (an item weighs one unless told), first in
    first out; one putter and one getter."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise InvalidArgument(f"maxsize must be >= 1, got {maxsize}")
        self._items: deque[tuple[T, int]] = deque()
        self._maxsize = maxsize
        self._weight = 0
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._putter_waits = False

    def qsize(self) -> int:
        """The weight held."""
        return self._weight

    def empty(self) -> bool:
        return not self._items

    async def put(self, item: T, weight: int = 1) -> None:
        while self._weight >= self._maxsize:
            self._writable.clear()
            self._putter_waits = True
            await self._writable.wait()
        self._items.append((item, weight))
        self._weight += weight
        if len(self._items) == 1:
            self._readable.set()

    def get_nowait(self) -> T:
        if not self._items:
            raise asyncio.QueueEmpty
        item, weight = self._items.popleft()
        self._weight -= weight
        if not self._items:
            self._readable.clear()
        if self._putter_waits:
            self._putter_waits = False
            self._writable.set()
        return item

    async def get(self) -> T:
        while not self._items:
            await self._readable.wait()
        return self.get_nowait()
