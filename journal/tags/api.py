"""Events by tag for the facade: offset checks, the query, envelopes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from ..backend import Backend
from ..envelope import EventEnvelope
from ..errors import OffsetError, UnsupportedOperation
from ..ids import entity_type_of, slice_for, validate_tags
from ..offsets import NoOffset, Offset, TimeUUIDOffset
from ..serialization import SerializerRegistry
from ..settings import JournalSettings
from .query import TagQuery
from .store import HasTagStore, TagRow
from .timeuuid import datetime_of


def start_after(offset: Offset | uuid.UUID | None) -> uuid.UUID | None:
    """The exclusive start UUID of a tag query (None: from the first time bucket)."""
    if offset is None or isinstance(offset, NoOffset):
        return None
    if isinstance(offset, TimeUUIDOffset):
        return offset.value
    if isinstance(offset, uuid.UUID):
        return TimeUUIDOffset(offset).value
    raise OffsetError(f"events by tag take a TimeUUIDOffset (or None), got {type(offset).__name__}")


def envelope(
    row: TagRow, serializers: SerializerRegistry, pids: dict[str, tuple[str, int]] | None = None
) -> EventEnvelope:
    """``pids`` caches (entity type, slice) per pid across the rows of one query."""
    pid = row.persistence_id
    known = pids.get(pid) if pids is not None else None
    if known is None:
        known = (entity_type_of(pid), slice_for(pid))
        if pids is not None:
            pids[pid] = known
    event = serializers.deserialize(row.event.ser_id, row.event.manifest, row.event.payload, what=pid)
    meta = (
        serializers.deserialize(row.meta.ser_id, row.meta.manifest, row.meta.payload, what="metadata")
        if row.meta is not None
        else None
    )
    return EventEnvelope(
        persistence_id=pid,
        entity_type=known[0],
        slice=known[1],
        seq_nr=row.seq_nr,
        db_timestamp=datetime_of(row.timeuuid),
        event=event,
        offset=TimeUUIDOffset(row.timeuuid),
        tags=(row.tag,),
        metadata=meta,
        writer=row.writer,
    )


def tag_query(
    backend: Backend, settings: JournalSettings, tag: str, offset: Offset | uuid.UUID | None, *, live: bool
) -> TagQuery:
    """Validate (before any I/O) and build the query."""
    (clean,) = validate_tags([tag])
    after = start_after(offset)
    if not isinstance(backend, HasTagStore):
        raise UnsupportedOperation(f"events by tag are not supported on the {backend.name} backend")
    return TagQuery(
        backend.tag_store(), clean, settings.tags, after=after, live=live, page_size=settings.tags.query_page_size
    )


async def envelopes(query: TagQuery, serializers: SerializerRegistry) -> AsyncIterator[EventEnvelope]:
    pids: dict[str, tuple[str, int]] = {}
    async for row in query.rows():
        yield envelope(row, serializers, pids)
