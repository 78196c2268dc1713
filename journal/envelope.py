"""The event envelope every query delivers.

A hand-written slots class rather than a dataclass so the slice queries can build envelopes
whose payload is decoded (and whose offset is computed) on first access: a catch-up over a large
backlog spends most of its time there otherwise, often for envelopes a consumer skips. The public
surface is a frozen dataclass's: same constructor, attributes, equality, hash and repr.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta
from itertools import accumulate, repeat
from typing import Any, Protocol

from .ids import entity_type_of, slice_for
from .offsets import Offset, SequenceOffset
from .timeuuid import datetime_of

_FIELDS = (
    "persistence_id", "entity_type", "slice", "seq_nr", "db_timestamp", "event", "offset",
    "tags", "metadata", "writer", "has_payload", "source",
)  # fmt: skip
_UNSET: Any = object()
TRACE_MANIFEST = "slice-journal.trace"
"""The metadata manifest of rows whose metadata is only the trace context of their write (see
:mod:`journal.tracing`): such rows read as ``metadata=None``, the context kept aside."""

ROW_STEP = timedelta(microseconds=1)
"""Rows of one write statement are stamped one microsecond apart (the write rule, see
docs/concepts.md): event i of a call has its first event's db_timestamp + i steps."""


def consecutive_stamps(first: datetime, n: int) -> list[datetime]:
    """The db_timestamps of ``n`` consecutive rows of one write, the first stamped ``first``."""
    return list(accumulate(repeat(ROW_STEP, n - 1), operator.add, initial=first))


class LazySource(Protocol):
    """Where lazily built envelopes get their event and offset: one object per page, so no
    per-envelope closure is built. Both must be pure (called at most once per envelope)."""

    def event_at(self, index: int) -> Any: ...

    def offset_at(self, index: int) -> Offset: ...


class EventEnvelope:
    """One stored event with everything a consumer needs. Immutable.

    ``event`` is the deserialized payload (decoded on first access when the query delivered it
    lazily; a payload that cannot be read raises :class:`~journal.errors.SerializationError`
    there). Envelopes found only by a payload-free query (backtracking) carry ``event=None`` and
    ``has_payload=False`` until loaded.
    """

    __slots__ = (
        "_event", "_index", "_offset", "_src", "_trace", "db_timestamp", "entity_type", "has_payload",
        "metadata", "persistence_id", "seq_nr", "slice", "source", "tags", "writer",
    )  # fmt: skip
    __match_args__ = _FIELDS

    persistence_id: str
    entity_type: str
    slice: int
    seq_nr: int
    db_timestamp: datetime
    tags: tuple[str, ...]
    metadata: Any
    writer: str
    has_payload: bool
    source: str
    _event: Any
    _offset: Any
    _src: LazySource | None
    _index: int

    def __init__(
        self,
        persistence_id: str,
        entity_type: str,
        slice: int,
        seq_nr: int,
        db_timestamp: datetime,
        event: Any,
        offset: Offset,
        tags: tuple[str, ...] = (),
        metadata: Any = None,
        writer: str = "",
        has_payload: bool = True,
        source: str = "query",
    ) -> None:
        _INIT(self, persistence_id, entity_type, slice, seq_nr, db_timestamp, event, offset,
              tags, metadata, writer, has_payload, source, None, 0)  # fmt: skip

    @classmethod
    def lazy(
        cls,
        persistence_id: str,
        entity_type: str,
        slice: int,
        seq_nr: int,
        db_timestamp: datetime,
        src: LazySource,
        index: int,
        tags: tuple[str, ...],
        metadata: Any,
        writer: str,
        has_payload: bool,
        source: str,
    ) -> EventEnvelope:
        """Hot-path constructor: ``src.event_at(index)`` gives the event (when ``has_payload``,
        else it is None) and ``src.offset_at(index)`` the offset, on first access."""
        e = _NEW(cls)
        _INIT(e, persistence_id, entity_type, slice, seq_nr, db_timestamp,
              _UNSET if has_payload else None, _UNSET, tags, metadata, writer,
              has_payload, source, src, index)  # fmt: skip
        return e

    @classmethod
    def written(
        cls,
        persistence_id: str,
        entity_type: str,
        slice: int,
        first_seq_nr: int,
        db_timestamp: datetime,
        events: Sequence[Any],
        tags: tuple[str, ...],
        metadata: Any,
        writer: str,
    ) -> list[EventEnvelope]:
        """Hot-path constructor of what one ``persist`` call returns: its events, numbered from
        ``first_seq_nr`` and stamped from ``db_timestamp`` (:data:`ROW_STEP` apart), each with
        its :class:`~journal.offsets.SequenceOffset`."""
        out: list[EventEnvelope] = []
        append = out.append
        seq_nr = first_seq_nr
        stamps = consecutive_stamps(db_timestamp, len(events)) if len(events) > 1 else (db_timestamp,)
        for ev, db_timestamp in zip(events, stamps, strict=True):
            # filled with plain slot stores, then given its frozen class (the same layout)
            e: Any = _NEW(_Unfrozen)
            e.persistence_id = persistence_id
            e.entity_type = entity_type
            e.slice = slice
            e.seq_nr = seq_nr
            e.db_timestamp = db_timestamp
            e._event = ev
            e._offset = _UNSET  # built on first access (most writers never read it)
            e.tags = tags
            e.metadata = metadata
            e.writer = writer
            e.has_payload = True
            e.source = "query"
            e._src = _SEQUENCE_OFFSETS
            e._index = seq_nr
            e.__class__ = cls
            append(e)
            seq_nr += 1
        return out

    @property
    def event(self) -> Any:
        v = self._event
        if v is _UNSET:
            src = self._src
            assert src is not None
            v = src.event_at(self._index)
            _SET["_event"](self, v)
            if self._offset is not _UNSET:
                _SET["_src"](self, None)  # the page is no longer needed
        return v

    @property
    def offset(self) -> Offset:
        v = self._offset
        if v is _UNSET:
            src = self._src
            assert src is not None
            v = src.offset_at(self._index)
            _SET["_offset"](self, v)
            if self._event is not _UNSET:
                _SET["_src"](self, None)
        return v  # type: ignore[no-any-return]

    def _values(self) -> tuple[Any, ...]:
        return (
            self.persistence_id, self.entity_type, self.slice, self.seq_nr, self.db_timestamp,
            self.event, self.offset, self.tags, self.metadata, self.writer, self.has_payload,
            self.source,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventEnvelope):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        body = ", ".join(f"{n}={v!r}" for n, v in zip(_FIELDS, self._values(), strict=True))
        return f"{_public(self).__qualname__}({body})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_public(self), self._values())

    def __copy__(self) -> EventEnvelope:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> EventEnvelope:
        import copy

        return _public(self)(*copy.deepcopy(self._values(), memo))


class _Unfrozen:
    """:class:`EventEnvelope`'s slots without its frozen ``__setattr__``: the write path fills
    an envelope as this with plain slot stores (a third of the cost of calling each slot's
    setter), then assigns it its class, which the identical layout allows."""

    __slots__ = EventEnvelope.__slots__


_SET: dict[str, Callable[[EventEnvelope, Any], None]] = {
    n: vars(EventEnvelope)[n].__set__ for n in EventEnvelope.__slots__
}
_NEW = object.__new__
# The order of _INIT's arguments.
_ORDER = (
    "persistence_id", "entity_type", "slice", "seq_nr", "db_timestamp", "_event", "_offset",
    "tags", "metadata", "writer", "has_payload", "source", "_src", "_index",
)  # fmt: skip
(_S0, _S1, _S2, _S3, _S4, _S5, _S6, _S7, _S8, _S9, _S10, _S11, _S12, _S13) = (_SET[n] for n in _ORDER)


def _INIT(
    e: EventEnvelope, a0: Any, a1: Any, a2: Any, a3: Any, a4: Any, a5: Any, a6: Any, a7: Any,
    a8: Any, a9: Any, a10: Any, a11: Any, a12: Any, a13: Any,
) -> None:  # fmt: skip
    """Set all slots by their descriptors (the class forbids ``setattr``)."""
    _S0(e, a0); _S1(e, a1); _S2(e, a2); _S3(e, a3); _S4(e, a4); _S5(e, a5); _S6(e, a6)  # noqa: E702
    _S7(e, a7); _S8(e, a8); _S9(e, a9); _S10(e, a10); _S11(e, a11); _S12(e, a12); _S13(e, a13)  # noqa: E702


class _SequenceOffsets:
    """The lazy source of written envelopes' offsets: index ``i`` is sequence number ``i``."""

    def event_at(self, index: int) -> Any:
        raise AssertionError("written envelopes carry their event")

    def offset_at(self, index: int) -> Offset:
        return SequenceOffset(index)


_SEQUENCE_OFFSETS = _SequenceOffsets()


class _RowEnvelope(EventEnvelope):
    """A lazy page envelope that reads its identity fields from its page row (properties set
    below) instead of copying them into slots: half the slot writes per row on the catch-up hot
    path, for a property call per field read. Looks like an :class:`EventEnvelope` in every
    other way (equality, hash, repr, pickling, copies)."""

    __slots__ = ("_r",)
    source = "query"


def _column(i: int) -> property:
    return property(lambda self: self._r[i], doc=f"column {i} of the page row")


for _i, _name in enumerate(("persistence_id", "entity_type", "slice", "seq_nr", "db_timestamp")):
    setattr(_RowEnvelope, _name, _column(_i))
setattr(_RowEnvelope, "writer", _column(8))  # noqa: B010
setattr(_RowEnvelope, "has_payload", property(lambda self: self._r[7] is not None))  # noqa: B010
_SET_ROW: Callable[[EventEnvelope, Any], None] = vars(_RowEnvelope)["_r"].__set__


class _TagRowEnvelope(_RowEnvelope):
    """A lazy page envelope over a tag page row (``journal.backend.TagPageRow``): same
    columns as a slice row for pid, seq_nr, payload, writer, tags and metadata; entity type and
    slice come from the pid and the timestamp from the TimeUUID (column 1), when read."""

    __slots__ = ()


setattr(_TagRowEnvelope, "entity_type", property(lambda self: entity_type_of(self._r[0])))  # noqa: B010
setattr(_TagRowEnvelope, "slice", property(lambda self: slice_for(self._r[0])))  # noqa: B010
setattr(_TagRowEnvelope, "db_timestamp", property(lambda self: datetime_of(self._r[1])))  # noqa: B010


_ST = _SET["_trace"]


def with_trace(e: EventEnvelope, payload: bytes) -> EventEnvelope:
    """``e`` with the trace context its write left in its metadata columns (:mod:`journal.tracing`)."""
    _ST(e, payload)
    return e


def trace_payload(e: EventEnvelope) -> bytes | None:
    """The trace metadata payload of ``e``'s write, if it carried one."""
    return getattr(e, "_trace", None)


def _public(e: EventEnvelope) -> type[EventEnvelope]:
    return EventEnvelope if isinstance(e, _RowEnvelope) else type(e)


def lazy_tag_page_envelopes(
    rows: Sequence[Any], src: LazySource, metadata: Callable[[Any], Any]
) -> list[EventEnvelope]:
    """:func:`lazy_page_envelopes` for one page of tag rows (``journal.backend.TagPageRow``)."""
    return lazy_page_envelopes(rows, src, metadata, _TagRowEnvelope)


def lazy_page_envelopes(
    rows: Sequence[Any],
    src: LazySource,
    metadata: Callable[[Any], Any],
    cls: type[_RowEnvelope] = _RowEnvelope,
) -> list[EventEnvelope]:
    """The envelopes of one page of slice-query rows, built lazily in one loop (the catch-up hot
    path: no per-row function call beyond the slot setters).

    Rows are positional, laid out as the slice page query's columns
    (``journal.postgres.slice_queries``): 0 persistence_id, 1 entity_type, 2 slice, 3 seq_nr,
    4 db_timestamp, 7 event_payload, 8 writer, 9 tags, 10 meta_ser_id. ``src`` gives row i's
    event and offset on first access (see :meth:`EventEnvelope.lazy`); ``metadata(row)`` decodes
    a row's metadata (called only for rows that have some). Source is ``"query"``.
    """
    new, unset, row = _NEW, _UNSET, _SET_ROW
    s5, s6, s7, s8, s12, s13 = _S5, _S6, _S7, _S8, _S12, _S13
    out: list[EventEnvelope] = []
    append = out.append
    i = 0
    for r in rows:
        e = new(cls)
        row(e, r)
        s5(e, None if r[7] is None else unset)
        s6(e, unset)
        t = r[9]
        s7(e, tuple(t) if t else ())
        if r[10] is None:
            s8(e, None)
        elif r[11] == TRACE_MANIFEST:
            s8(e, None)
            _ST(e, r[12])
        else:
            s8(e, metadata(r))
        s12(e, src)
        s13(e, i)
        append(e)
        i += 1
    return out
