"""The slice range the current projection task processes, for handlers that keep state per range
(the Kafka publisher's transactional producer: one per owned range, see docs/kafka.md).

A :class:`~projections.runner.RangeProcessor` sets it when it starts, in its own task, so a
handler it calls reads its own range; a new processor of the same range gets a new token. A
handler that is a :class:`RangeStarts` is told then too, so it can prepare the range's state
while the processor loads the range's offsets and reads its first page.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, eq=False)
class OwnedRange:
    """Slices ``lo..hi`` as one processor owns them (compared by identity: each start is new)."""

    projection: str
    lo: int
    hi: int
    owner: str = field(default="")

    @property
    def key(self) -> str:
        return f"{self.lo}-{self.hi}"


_CURRENT: ContextVar[OwnedRange | None] = ContextVar("sj_owned_range", default=None)


def enter(owned: OwnedRange) -> None:
    """Mark the calling task (and the tasks it creates) as processing ``owned``."""
    _CURRENT.set(owned)


def current() -> OwnedRange | None:
    """The range of the processor this code runs for, or None outside a projection."""
    return _CURRENT.get()


@runtime_checkable
class RangeStarts(Protocol):
    """A handler told when a processor of its starts, before the range's first batch: it starts
    preparing the range (the Kafka publisher opens its producer: ``init_transactions``, the
    offsets topic read back) in a task of its own, and reports that task's failure at the first
    batch, as it would have failed there. It must not block: the processor is loading offsets and
    reading its first page meanwhile."""

    def range_started(self, owned: OwnedRange) -> None: ...
