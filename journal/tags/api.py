"""Events by tag for the facade: offset checks, the query, envelopes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..backend import Backend, TagPageRow
from ..envelope import EventEnvelope, lazy_tag_page_envelopes
from ..errors import OffsetError
from ..ids import validate_tags
from ..offsets import NoOffset, Offset, TimeUUIDOffset
from ..serialization import SerializerRegistry
from ..settings import JournalSettings
from .query import TagQuery


def start_after(offset: Offset | uuid.UUID | None) -> uuid.UUID | None:
    """The exclusive start UUID of a tag query (None: from the first time bucket)."""
    if offset is None or isinstance(offset, NoOffset):
        return None
    if isinstance(offset, TimeUUIDOffset):
        return offset.value
    if isinstance(offset, uuid.UUID):
        return TimeUUIDOffset(offset).value
    raise OffsetError(f"events by tag take a TimeUUIDOffset (or None), got {type(offset).__name__}")


def tag_query(
    backend: Backend, settings: JournalSettings, tag: str, offset: Offset | uuid.UUID | None, *, live: bool
) -> TagQuery:
    """Validate (before any I/O) and build the query."""
    (clean,) = validate_tags([tag])
    after = start_after(offset)
    return TagQuery(
        backend.tag_store(), clean, settings.tags, after=after, live=live, page_size=settings.tags.query_page_size
    )


class _TagPage:
    """One run of tag page rows (:data:`~journal.backend.TagPageRow`): decodes an envelope's
    event and builds its offset when first asked (:class:`~journal.envelope.LazySource`)."""

    __slots__ = ("rows", "serializers")

    def __init__(self, rows: Sequence[TagPageRow], serializers: SerializerRegistry) -> None:
        self.rows = rows
        self.serializers = serializers

    def event_at(self, i: int) -> Any:
        r = self.rows[i]
        return self.serializers.deserialize(r[5], r[6], r[7], what=r[0], pid=r[0])

    def offset_at(self, i: int) -> TimeUUIDOffset:
        return TimeUUIDOffset(self.rows[i][1])

    def metadata(self, r: TagPageRow) -> Any:
        return self.serializers.deserialize(r[10], r[11] or "", r[12] or b"", what="metadata")


async def envelopes(query: TagQuery, serializers: SerializerRegistry) -> AsyncIterator[EventEnvelope]:
    """The query's rows as envelopes built lazily a run at a time (payload decoded, offset made
    on first access): the catch-up hot path."""
    async for rows in query.pages():
        if serializers.keyed:
            await serializers.load_keys((r[0], r[5]) for r in rows)
        page = _TagPage(rows, serializers)
        for env in lazy_tag_page_envelopes(rows, page, page.metadata):
            yield env
