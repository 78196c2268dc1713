"""The one way the tests wait: poll a condition until it holds, with a deadline (never a fixed sleep)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_until(
    cond: Callable[[], Any | Awaitable[Any]],
    timeout: float = 20.0,  # noqa: ASYNC109 (a deadline for the whole wait, reported by name)
    what: str = "a condition",
    *,
    every: float = 0.02,
) -> Any:
    """Poll ``cond`` (sync or async) until it returns something truthy, and return that.

    Raises AssertionError naming ``what`` and the last value after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        await asyncio.sleep(every)
