"""Conditional requests: answer only once a component has seen a given vector time.

A write returns the vector time of what it wrote (``{emitter pid: seq_nr}``, see
:meth:`EntityRegistry.ask_timed`); a view or entity has *seen* a vector time when, for every
entry, it has applied that pid's event with that sequence number or a later one, itself or as a
routed copy. Waiting for that before answering gives read-your-writes across components: write
to an entity, query a view with the returned time, and the answer includes the write.

Within one location an emitter's persistence id is its process in the vector (its events are
totally ordered by seq_nr); :class:`~journal.vector_time.VectorTime` gives the
algebra (merge several writes' times with ``merge``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import ConditionTimeout, InvalidArgument
from ..vector_time import VectorTime

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
"""Seconds a conditional request waits when the caller gives no timeout."""

RECHECK_EVERY = 1.0
"""A waiter re-reads the component's vector time at least this often (an entity that restarted
is a new instance whose changes the old waiter would not hear about)."""


@dataclass(frozen=True, slots=True)
class TimedReply(Generic[T]):
    """A reply and the vector time of the state it was computed on (after the command's writes)."""

    reply: T
    vector_time: VectorTime


def as_vector_time(after: Mapping[str, int] | None) -> VectorTime | None:
    """Validate a condition given by the caller (a VectorTime or a plain ``{pid: seq_nr}``)."""
    if after is None or isinstance(after, VectorTime):
        return after
    if not isinstance(after, Mapping):
        raise InvalidArgument(f"after must be a VectorTime or a mapping pid -> seq_nr, got {type(after).__name__}")
    return VectorTime(after)


def check_timeout(timeout: float | None) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def missing(seen: Mapping[str, int], wanted: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """The entries of ``wanted`` that ``seen`` does not reach: pid -> (wanted, seen)."""
    return {pid: (n, seen.get(pid, 0)) for pid, n in wanted.items() if seen.get(pid, 0) < n}


async def wait_until_seen(
    component: str,
    seen: Callable[[], Mapping[str, int]],
    changed: Callable[[float], Awaitable[Any]],
    wanted: VectorTime,
    limit: float,
) -> None:
    """Return once ``seen()`` covers ``wanted``; ``changed(t)`` waits (at most ``t`` s) for news.

    Raises:
        ConditionTimeout: not covered within ``limit`` seconds (names the unmet entries).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        gap = missing(seen(), wanted)
        if not gap:
            return
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise ConditionTimeout(component, gap, limit)
        await changed(min(remaining, RECHECK_EVERY))
