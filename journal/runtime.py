"""Running an entry point on the fastest event loop available, with the garbage collector tuned.

uvloop (a declared dependency on the platforms it supports) runs asyncpg's protocol, futures
and callbacks in C, which is most of the journal's per-call cost outside the database. Where it
is not installed, or ``uvloop=False`` is asked for, the standard asyncio loop runs instead, so
the journal works the same everywhere; only the speed differs.

CPython's cyclic garbage collector runs a full pass over every tracked object each time enough
young objects have survived two young passes. A service that holds thousands of objects across
an ``await`` (a bulk write's parts, a batch of envelopes) promotes them steadily, so the full
passes come often, and each walks the whole heap: the imported modules alone are ~90,000
objects, ~25 ms a pass on the 2-core test machine, about a third of ``persist_many``'s client
time. :func:`tune_gc` (which :func:`run` calls unless ``gc_tuning=False``) freezes the heap that
exists at startup out of those passes (``gc.freeze``: it lives as long as the process anyway)
and lets the young generation grow larger between passes. Nothing is leaked that would have
been freed: cyclic garbage created later is still collected. The freeze alone is what a
library may do for its process, and :func:`journal.open_journal` does it (:func:`freeze_heap`,
once per process, setting ``write.freeze_heap``); the threshold stays the application's choice.
"""

from __future__ import annotations

import asyncio
import gc
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
    """ "uvloop" or "asyncio": what :func:`run` would use (benchmarks print it)."""
    return "uvloop" if loop_factory(uvloop) is not None else "asyncio"


GEN0_THRESHOLD = 10_000
"""Young-generation threshold :func:`tune_gc` sets (CPython 3.11's default is 700, 3.12's 2000)."""


def freeze_heap() -> None:
    """Collect once, then freeze what is alive out of the collector's later passes, unless
    something froze the heap already. :func:`journal.open_journal` calls it (the setting
    ``write.freeze_heap``): a process that writes through the journal pays for the full passes
    its writes trigger, and the heap those passes walk is mostly what was imported before."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


def tune_gc(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    """Collect once, freeze what is alive out of later passes, and raise the young threshold.

    Call it once the service has imported its modules and built its long-lived objects (see the
    module docstring); calling it again freezes whatever has been created since.
    """
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, gen0_threshold), middle, old)


def run(main: Coroutine[Any, Any, T], *, uvloop: bool = True, gc_tuning: bool = True) -> T:
    """``asyncio.run(main)``, on uvloop when available, after :func:`tune_gc` unless
    ``gc_tuning=False`` (see the module docstring)."""
    if gc_tuning:
        tune_gc()
    with asyncio.Runner(loop_factory=loop_factory(uvloop)) as runner:
        return runner.run(main)
