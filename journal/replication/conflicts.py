"""Deterministic state of a replicated entity from its events (model layer, no I/O).

Every location ends with the same set of events but may have stored concurrent ones in another
order. The state is therefore folded in one total order that extends the causal order: by the
sum of the vector time, then origin location, then origin sequence number. An event that is
concurrent with one folded before it is *marked concurrent* and goes through the conflict hook
(by default the ordinary event handler: last writer wins by that order). Same events, same order,
same hook calls: the same state everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..vector_time import VectorTime

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Versioned:
    """An entity's event with its vector time and origin; ``concurrent`` is set by the fold."""

    event: Any
    vector_time: VectorTime
    origin_location: str
    origin_seq_nr: int
    concurrent: bool = False

    @property
    def order_key(self) -> tuple[int, str, int]:
        return (self.vector_time.total(), self.origin_location, self.origin_seq_nr)


OnEvent = Callable[[S, Any], S]
OnConcurrent = Callable[[S, Versioned, Sequence[Versioned]], S]


class ConflictFold(Generic[S]):
    """Folds versioned events into a state; add events in any order, read :attr:`state`.

    ``on_concurrent(state, event, concurrent_with)`` resolves an event concurrent with events
    already folded (``concurrent_with``); by default it applies ``on_event`` (last writer wins).
    """

    def __init__(self, initial: Callable[[], S], on_event: OnEvent[S], on_concurrent: OnConcurrent[S] | None = None):
        self._initial = initial
        self._on_event = on_event
        self._on_concurrent = on_concurrent or (lambda state, v, _others: on_event(state, v.event))
        self._events: list[Versioned] = []
        self._ids: set[tuple[str, int]] = set()
        self.state: S = initial()
        self.vector_time = VectorTime()
        self.folded: list[Versioned] = []

    def add(self, events: Iterable[Versioned]) -> None:
        new = [e for e in events if (e.origin_location, e.origin_seq_nr) not in self._ids]
        if not new:
            return
        for e in new:
            self._ids.add((e.origin_location, e.origin_seq_nr))
        self._events.extend(new)
        new.sort(key=lambda v: v.order_key)
        if self._events[: len(self._events) - len(new)] and new[0].order_key < self.folded[-1].order_key:
            self._refold()  # a concurrent event sorts before what is folded: fold again
        else:
            for e in new:
                self._apply(e)

    def _refold(self) -> None:
        self.state, self.vector_time, self.folded = self._initial(), VectorTime(), []
        for e in sorted(self._events, key=lambda v: v.order_key):
            self._apply(e)

    def _apply(self, e: Versioned) -> None:
        others = [f for f in self.folded if f.vector_time.concurrent(e.vector_time)]
        if others:
            marked = Versioned(e.event, e.vector_time, e.origin_location, e.origin_seq_nr, True)
            self.state = self._on_concurrent(self.state, marked, others)
        else:
            marked = e
            self.state = self._on_event(self.state, e.event)
        self.folded.append(marked)
        self.vector_time = self.vector_time.merge(e.vector_time)
