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


def envelope(row: TagRow, serializers: SerializerRegistry) -> EventEnvelope:
    what = f"{row.persistence_id}#{row.seq_nr}"
    event = serializers.deserialize(row.event.ser_id, row.event.manifest, row.event.payload, what=what)
    meta = (
        serializers.deserialize(row.meta.ser_id, row.meta.manifest, row.meta.payload, what="metadata")
        if row.meta is not None
        else None
    )
    return EventEnvelope(
        persistence_id=row.persistence_id,
        entity_type=entity_type_of(row.persistence_id),
        slice=slice_for(row.persistence_id),
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
        backend.tag_store(), clean, settings.tags, after=after, live=live, page_size=settings.query.buffer_size
    )


async def envelopes(query: TagQuery, serializers: SerializerRegistry) -> AsyncIterator[EventEnvelope]:
    async for row in query.rows():
        yield envelope(row, serializers)
