"""Tracing of writes (issue 26, every write shape since issue 32): the trace context a write's
events carry in their metadata columns when the call has none of its own, and the group
commit's batch span linked to the calls it writes (docs/tracing.md)."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from . import tracing
from .envelope import TRACE_MANIFEST
from .serialization import JSON_SERIALIZER_ID, Serialized
from .write_batch import BatchResult, WriteBatch, WriteFn


def trace_metadata() -> Serialized:
    """The current trace context as the metadata of a write's events (docs/tracing.md)."""
    return Serialized(JSON_SERIALIZER_ID, TRACE_MANIFEST, tracing.carrier())


def carrying(batch: WriteBatch, carried: Serialized) -> WriteBatch:
    """``batch`` with ``carried`` as the metadata of its calls that have none of their own."""
    if all(m is not None for m in batch.metadata):
        return batch
    return msgspec.structs.replace(batch, metadata=tuple(carried if m is None else m for m in batch.metadata))


def carrying_chunks(chunks: Iterator[WriteBatch], carried: Serialized, noted: list[str]) -> Iterator[WriteBatch]:
    """A bulk write's chunks carrying the trace context; each chunk's first pid noted, so the
    batch that writes it links to the persist_many span (once per chunk, not per part)."""
    for chunk in chunks:
        if len(chunk):
            tracing.note(chunk.persistence_ids[0])
            noted.append(chunk.persistence_ids[0])
        yield carrying(chunk, carried)


def traced_batches(write: WriteFn) -> WriteFn:
    """The group commit's batch writer, in a span linked to the persist spans of its calls
    (a batch serves calls of many traces) while tracing is on."""

    async def write_batch(batch: WriteBatch) -> BatchResult:
        if not tracing.ON:
            return await write(batch)
        attributes = {"calls": len(batch), "events": batch.events}
        with tracing.span("journal.write_batch", links=tracing.links_of(batch.persistence_ids), attributes=attributes):
            return await write(batch)

    return write_batch
