"""Waits with a time limit that never swallow a cancellation.

Before Python 3.12, ``asyncio.wait_for`` can lose the caller's cancellation when the awaited
thing completes (or its timeout fires) at the moment ``cancel()`` arrives: it returns the result
instead of raising, and a loop around it goes on as if never cancelled (a live query that
ignores ``cancel()``). ``asyncio.timeout`` counts cancellations (``Task.uncancel``) and lets
the caller's through. Every wait with a limit in ``journal`` and ``projections`` uses these.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """``await aw``, raising TimeoutError after ``seconds`` (None: no limit)."""
    async with asyncio.timeout(seconds):
        return await aw


async def wait_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until ``event`` is set, at most ``seconds``; whether it is set."""
    if not event.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()
    return event.is_set()
