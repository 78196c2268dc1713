"""Vector time (model layer, no I/O): the partial order that tells causality from concurrency.

A vector time maps a location id to a counter, that location's log position of the last event of
its own that the stamped event could have known. ``a <= b`` when every entry of ``a`` is at most
the one of ``b`` (missing entries are 0); ``a < b`` is "happened before"; neither is concurrency.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping
from typing import Any

from .errors import InvalidArgument


class VectorTime(Mapping[str, int]):
    """An immutable vector timestamp. Zero entries are dropped, so equal times compare equal."""

    __slots__ = ("_entries", "_hash")

    def __init__(self, entries: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        if type(entries) is VectorTime:  # already clean (type(): isinstance on an ABC is slow)
            self._entries: dict[str, int] = entries._entries
            self._hash: int | None = entries._hash
            return
        # a dict first: the abstract Mapping check is slow, and replication builds one per event
        items = entries.items() if isinstance(entries, dict | Mapping) else entries
        clean: dict[str, int] = {}
        for location, counter in items:
            if not isinstance(location, str) or not location:
                raise InvalidArgument(f"a vector time entry needs a non-empty location id, got {location!r}")
            if type(counter) is not int or counter < 0:
                raise InvalidArgument(f"vector time entry {location!r} must be an int >= 0, got {counter!r}")
            if counter:
                clean[location] = counter
        self._entries = dict(sorted(clean.items()))
        self._hash = None

    @classmethod
    def of_clean(cls, entries: dict[str, int]) -> VectorTime:
        """From a dict of positive int counters under non-empty str ids, checked in one pass
        (replication builds one per event it reads or receives); anything else goes through
        the full check of the constructor, which raises or drops zero entries."""
        for location, counter in entries.items():
            if type(location) is not str or not location or type(counter) is not int or counter <= 0:
                return cls(entries)
        return cls._trusted(entries)

    @classmethod
    def _trusted(cls, entries: dict[str, int]) -> VectorTime:
        """From entries known to be clean (non-zero ints, str keys): no validation."""
        vt = cls.__new__(cls)
        vt._entries = dict(sorted(entries.items()))
        vt._hash = None
        return vt

    # -- Mapping -------------------------------------------------------------------------------
    def __getitem__(self, location: str) -> int:
        return self._entries[location]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, location: str, default: Any = 0) -> Any:
        return self._entries.get(location, default)

    def items(self) -> ItemsView[str, int]:
        """The entries' own view (the Mapping default goes through ``__getitem__`` per key)."""
        return self._entries.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, VectorTime):
            return self._entries == other._entries
        if isinstance(other, Mapping):  # a plain dict compares by its non-zero entries
            return self._entries == {k: v for k, v in other.items() if v}
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._entries.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"VectorTime({self._entries!r})"

    # -- the algebra ---------------------------------------------------------------------------
    def merge(self, other: Mapping[str, int]) -> VectorTime:
        """The pointwise maximum: everything either time has seen."""
        if type(other) is not VectorTime:
            other = VectorTime(other)
        out = dict(self._entries)
        changed = False
        for location, counter in other._entries.items():
            if counter > out.get(location, 0):
                out[location] = counter
                changed = True
        return VectorTime._trusted(out) if changed else self

    def with_entry(self, location: str, counter: int) -> VectorTime:
        """This time with ``location``'s entry set (a local event's stamp)."""
        return VectorTime({**self._entries, location: counter})

    def __le__(self, other: VectorTime) -> bool:
        theirs = other._entries if type(other) is VectorTime else other
        for loc, c in self._entries.items():
            if c > theirs.get(loc, 0):
                return False
        return True

    def __lt__(self, other: VectorTime) -> bool:
        return self <= other and self != other

    def __ge__(self, other: VectorTime) -> bool:
        return other <= self

    def __gt__(self, other: VectorTime) -> bool:
        return other < self

    def concurrent(self, other: VectorTime) -> bool:
        """Neither happened before the other (and they differ)."""
        return not self <= other and not other <= self

    def total(self) -> int:
        """The sum of the entries: grows along every causal chain, so sorting by it (then by a
        tie-breaker) is a total order that extends the causal order."""
        return sum(self._entries.values())

    def to_json(self) -> dict[str, int]:
        return dict(self._entries)

    @classmethod
    def from_json(cls, value: Mapping[str, int] | None) -> VectorTime:
        return cls(value or {})
