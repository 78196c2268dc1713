"""Events by tag for the facade: offset checks, the query, envelopes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from ..backend import SEQ_NR, Backend, TagPageRow
from ..codec import KeysInUse
from ..envelope import EventEnvelope, tag_page_envelopes
from ..errors import OffsetError, SerializationError
from ..ids import entity_type_of, slice_for, validate_tags
from ..offsets import NoOffset, Offset, TimeUUIDOffset
from ..serialization import SerializerRegistry, stored_plain_json
from ..settings import JournalSettings
from ..timeuuid import datetime_of
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
    event when first asked, once, and makes its offset and timestamp from the row's TimeUUID
    (:class:`~journal.envelope.LazySource`)."""

    __slots__ = ("_events", "keys", "rows", "serializers")

    def __init__(self, rows: Sequence[TagPageRow], serializers: SerializerRegistry, keys: KeysInUse = ()) -> None:
        self.rows = rows
        self.serializers = serializers
        self.keys = keys
        """The run's keys, held while its envelopes may still be decoded (not evicted meanwhile)."""
        self._events: dict[int, Any] = {}

    def event_at(self, i: int) -> Any:
        if i not in self._events:
            r = self.rows[i]
            pid = r["persistence_id"]
            try:
                self._events[i] = self.serializers.deserialize(r["ser_id"], r["ser_manifest"], r["event"], pid=pid)
            except SerializationError as e:  # named as the slice queries name it: pid#seq_nr
                raise e.located(f"{pid}#{r[SEQ_NR]}") from e
        return self._events[i]

    def stored_json_at(self, i: int) -> bytes | None:
        r = self.rows[i]
        return stored_plain_json(r["ser_id"], r["ser_manifest"], r["event"])

    def offset_at(self, i: int) -> TimeUUIDOffset:
        return TimeUUIDOffset(self.rows[i]["timestamp"])

    def db_timestamp_at(self, i: int) -> datetime:
        return datetime_of(self.rows[i]["timestamp"])

    def metadata(self, r: TagPageRow) -> Any:
        return self.serializers.deserialize(
            r["meta_ser_id"], r["meta_ser_manifest"] or "", r["meta_payload"] or b"", what="metadata"
        )


async def envelopes(query: TagQuery, serializers: SerializerRegistry) -> AsyncIterator[EventEnvelope]:
    """The query's rows as envelopes built lazily a run at a time (payload decoded, offset made
    on first access): the catch-up hot path."""
    async for rows in query.pages():
        keyed = serializers.keyed
        keys = await serializers.load_keys((r["persistence_id"], r["ser_id"]) for r in rows) if keyed else ()
        page = _TagPage(rows, serializers, keys)
        for env in tag_page_envelopes(rows, page, page.metadata, entity_type_of, slice_for):
            yield env
