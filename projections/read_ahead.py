"""The bounded hand-over between a projection's reader task and its processing loop.

Used like ``asyncio.Queue`` (``put``, ``get``, ``get_nowait``, ``empty``) by exactly one
producer and one consumer, at a fraction of its cost per item: a queue keeps waiter futures and
wakes one per item, which at 100k+ envelopes per second was a tenth of a projection's time. Here
an item is a deque append and a popleft; the tasks are woken only when one actually waits
(the consumer on an empty buffer, the reader on a full one).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from journal.errors import InvalidArgument

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """At most ``maxsize`` items, first in first out; one putter and one getter."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise InvalidArgument(f"maxsize must be >= 1, got {maxsize}")
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._putter_waits = False

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    async def put(self, item: T) -> None:
        while len(self._items) >= self._maxsize:
            self._writable.clear()
            self._putter_waits = True
            await self._writable.wait()
        self._items.append(item)
        if len(self._items) == 1:
            self._readable.set()

    def get_nowait(self) -> T:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
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
