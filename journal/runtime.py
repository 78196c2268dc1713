"""Running an entry point on the fastest event loop available.

uvloop (a declared dependency on the platforms it supports) runs asyncpg's protocol, futures
and callbacks in C, which is most of the journal's per-call cost outside the database. Where it
is not installed, or ``uvloop=False`` is asked for, the standard asyncio loop runs instead, so
the journal works the same everywhere; only the speed differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory(uvloop: bool = True) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor when asked for and importable, else None (asyncio's default)."""
    if not uvloop:
        return None
    try:
        import uvloop as _uvloop
    except ImportError:  # not installed here (e.g. Windows): the standard loop
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = _uvloop.new_event_loop
    return factory


def loop_name(uvloop: bool = True) -> str:
    """"uvloop" or "asyncio": what :func:`run` would use (benchmarks print it)."""
    return "uvloop" if loop_factory(uvloop) is not None else "asyncio"


def run(main: Coroutine[Any, Any, T], *, uvloop: bool = True) -> T:
    """``asyncio.run(main)``, on uvloop when available (see the module docstring)."""
    with asyncio.Runner(loop_factory=loop_factory(uvloop)) as runner:
        return runner.run(main)
