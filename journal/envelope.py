"""The event envelope every query delivers and every ``persist`` returns.

A frozen record (msgspec.Struct: built in C, about a tenth of the cost of a frozen dataclass's
constructor). Two kinds defer work a consumer often never asks for, with a property each that
shadows the field: envelopes of a query page take their event and offset from the page (which
decodes and computes each once, when first asked for: a catch-up over a large backlog spends
most of its time there otherwise, often for envelopes a consumer skips), and envelopes a
``persist`` returns make their offset, the sequence number, when asked. Equality, hash, repr
and pickling go by the public values, so every kind equals the envelope built by the
constructor from the same values.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from itertools import accumulate, repeat
from typing import Any, Protocol

import msgspec

from .offsets import NO_OFFSET, Offset, SequenceOffset

TRACE_MANIFEST = "slice-journal.trace"
"""The metadata manifest of rows whose metadata is only the trace context of their write (see
:mod:`journal.tracing`): such rows read as ``metadata=None``, the context kept aside."""

SNAPSHOT_SOURCE = "snapshot"
"""The ``source`` of a snapshot envelope (the slice query that starts from snapshots,
:mod:`journal.query.from_snapshots`): ``event`` is the pid's snapshot state as of ``seq_nr``,
``db_timestamp`` and ``offset`` those of the event it stands for, ``writer`` empty."""

ROW_STEP = timedelta(microseconds=1)
"""Rows of one write statement are stamped one microsecond apart (the write rule, see
docs/concepts.md): event i of a call has its first event's db_timestamp + i steps."""


def consecutive_stamps(first: datetime, n: int) -> list[datetime]:
    """The db_timestamps of ``n`` consecutive rows of one write, the first stamped ``first``."""
    return list(accumulate(repeat(ROW_STEP, n - 1), operator.add, initial=first))


_FIELDS = (
    "persistence_id", "entity_type", "slice", "seq_nr", "db_timestamp", "event", "offset",
    "tags", "metadata", "writer", "has_payload", "source",
)  # fmt: skip


class EventEnvelope(msgspec.Struct, frozen=True):
    """One stored event with everything a consumer needs. Immutable.

    ``event`` is the deserialized payload (decoded on first access when the query delivered it
    lazily; a payload that cannot be read raises :class:`~journal.errors.SerializationError`
    there). Envelopes found only by a payload-free query (backtracking) carry ``event=None`` and
    ``has_payload=False`` until loaded.
    """

    persistence_id: str
    entity_type: str
    slice: int
    seq_nr: int
    db_timestamp: datetime
    event: Any
    offset: Offset
    tags: tuple[str, ...] = ()
    metadata: Any = None
    writer: str = ""
    has_payload: bool = True
    source: str = "query"
    _trace: bytes | None = None
    """The trace context its write left in its metadata columns (:mod:`journal.tracing`)."""

    @staticmethod
    def written(
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
        """What one ``persist`` call returns: its events, numbered from ``first_seq_nr`` and
        stamped from ``db_timestamp`` (:data:`ROW_STEP` apart), each with its
        :class:`~journal.offsets.SequenceOffset`."""
        if len(events) == 1:
            return [_Written(persistence_id, entity_type, slice, first_seq_nr, db_timestamp, events[0], NO_OFFSET,
                             tags, metadata, writer)]  # fmt: skip
        stamps = consecutive_stamps(db_timestamp, len(events))
        return [
            _Written(persistence_id, entity_type, slice, first_seq_nr + i, ts, ev, NO_OFFSET, tags, metadata, writer)
            for i, (ev, ts) in enumerate(zip(events, stamps, strict=True))
        ]

    def values(self) -> tuple[Any, ...]:
        """The public values, in the constructor's order."""
        return (
            self.persistence_id, self.entity_type, self.slice, self.seq_nr, self.db_timestamp,
            self.event, self.offset, self.tags, self.metadata, self.writer, self.has_payload,
            self.source,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventEnvelope):
            return NotImplemented
        return self.values() == other.values()

    def __hash__(self) -> int:
        return hash(self.values())

    def __repr__(self) -> str:
        body = ", ".join(f"{n}={v!r}" for n, v in zip(_FIELDS, self.values(), strict=True))
        return f"EventEnvelope({body})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (EventEnvelope, self.values())

    def __copy__(self) -> EventEnvelope:
        return self

    def stored_json(self) -> bytes | None:
        """The event's payload as stored, when it is plain JSON (the built-in JSON serializer's,
        no manifest, neither compressed nor encrypted): the event as JSON without decoding it.
        None otherwise, and for envelopes not read from the journal. The bytes are not parsed:
        a damaged payload under the JSON serializer's id, which ``event`` would refuse, is
        returned as it is stored."""
        return None

    def __deepcopy__(self, memo: dict[int, Any]) -> EventEnvelope:
        return EventEnvelope(*copy.deepcopy(self.values(), memo))


# The lazy kinds below shadow a field of EventEnvelope with a property (the field holds a
# placeholder): mypy flags each such override, hence the ignores.


class _Written(EventEnvelope, frozen=True):
    """An envelope a ``persist`` returned: its offset is made when first asked for (most writers
    never read it)."""

    @property  # type: ignore[misc]
    def offset(self) -> Offset:
        return SequenceOffset(self.seq_nr)


class LazySource(Protocol):
    """Where the envelopes of one page get their event and offset: each computed once, when
    first asked for."""

    def event_at(self, index: int) -> Any: ...

    def offset_at(self, index: int) -> Offset: ...

    def stored_json_at(self, index: int) -> bytes | None:
        """Row i's payload as stored when it is plain JSON, else None (:meth:`EventEnvelope.stored_json`)."""


class TagSource(LazySource, Protocol):
    """A :class:`LazySource` of tag rows, which also gives each row's timestamp."""

    def db_timestamp_at(self, index: int) -> datetime: ...


class _NoPage:
    """The page of no envelope (the default of the field, never read)."""

    def event_at(self, index: int) -> Any:
        raise AssertionError("not an envelope of a page")

    offset_at = db_timestamp_at = stored_json_at = event_at


_NO_PAGE: Any = _NoPage()
_NEVER = datetime.min


class _OnPage(EventEnvelope, frozen=True):
    """An envelope of a query page: its event and offset come from the page (:class:`LazySource`)."""

    page: LazySource = _NO_PAGE
    index: int = 0

    @property  # type: ignore[misc]
    def event(self) -> Any:
        return self.page.event_at(self.index) if self.has_payload else None

    @property  # type: ignore[misc]
    def offset(self) -> Offset:
        return self.page.offset_at(self.index)

    def stored_json(self) -> bytes | None:
        return self.page.stored_json_at(self.index) if self.has_payload else None


class _OnTagPage(_OnPage, frozen=True):
    """An envelope of a tag page: its timestamp comes from the row's TimeUUID, when first asked."""

    page: TagSource = _NO_PAGE

    @property  # type: ignore[misc]
    def db_timestamp(self) -> datetime:
        return self.page.db_timestamp_at(self.index)


def with_trace(e: EventEnvelope, payload: bytes) -> EventEnvelope:
    """``e`` with the trace context its write left in its metadata columns (:mod:`journal.tracing`)."""
    return msgspec.structs.replace(e, _trace=payload)


def trace_payload(e: EventEnvelope) -> bytes | None:
    """The trace metadata payload of ``e``'s write, if it carried one."""
    return e._trace


_NONE = (None, None)


def _metadata(r: Any, metadata: Callable[[Any], Any]) -> tuple[Any, bytes | None]:
    """The metadata and trace context of a row that has metadata: (None, the context) when the
    metadata is only its write's trace context."""
    if r["meta_ser_manifest"] == TRACE_MANIFEST:
        return None, r["meta_payload"]
    return metadata(r), None


def page_envelopes(rows: Sequence[Any], page: LazySource, metadata: Callable[[Any], Any]) -> list[EventEnvelope]:
    """The envelopes of one page of slice-query rows (columns named as
    :data:`journal.backend.SLICE_ROW_COLUMNS`), in one loop; ``page`` gives row i's event and
    offset on first access; ``metadata(row)`` decodes a row's metadata (called only for rows that
    have some). Source is ``"query"``."""
    out: list[EventEnvelope] = []
    for i, r in enumerate(rows):
        meta, trace = _NONE if r["meta_ser_id"] is None else _metadata(r, metadata)
        out.append(_OnPage(
            r["persistence_id"], r["entity_type"], r["slice"], r["seq_nr"], r["db_timestamp"], None, NO_OFFSET,
            tuple(r["tags"]) if r["tags"] else (), meta, r["writer"], r["event_payload"] is not None, "query",
            trace, page, i,
        ))  # fmt: skip
    return out


def tag_page_envelopes(
    rows: Sequence[Any], page: TagSource, metadata: Callable[[Any], Any], entity_type: Callable[[str], str],
    slice_of: Callable[[str], int],
) -> list[EventEnvelope]:  # fmt: skip
    """:func:`page_envelopes` for one page of tag rows (columns named as
    :data:`journal.backend.TAG_PAGE_COLUMNS`); ``page`` also gives each row's timestamp;
    ``entity_type`` and ``slice_of`` give a pid's."""
    out: list[EventEnvelope] = []
    for i, r in enumerate(rows):
        pid = r["persistence_id"]
        meta, trace = _NONE if r["meta_ser_id"] is None else _metadata(r, metadata)
        out.append(_OnTagPage(
            pid, entity_type(pid), slice_of(pid), r["sequence_nr"], _NEVER, None, NO_OFFSET, tuple(r["tags"]), meta,
            r["writer_uuid"], True, "query", trace, page, i,
        ))  # fmt: skip
    return out
