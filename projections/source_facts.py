"""What a worker knows of the source it reads, beyond the slice-query contract.

A :class:`journal.Journal` tells it where each slice lives, its pool, its serializers (they seal
dead letters), its page-at-a-time queries (from the events, or from each pid's latest snapshot)
and its query mode; a source of the caller's (any :class:`projections.runner.EventSource`) tells
it none of these, and the worker uses its own defaults. Asked once, here, so the worker never
asks what kind of source it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from journal import Journal
from journal.backend import Backend
from journal.serialization import SerializerRegistry
from journal.settings import QueryMode

from .runner import EventSource, PageQuery


@dataclass(frozen=True)
class SourceFacts:
    backend: Backend | None
    """Where each slice lives and the pool the worker may share (None: the worker opens its own
    pool and reads the ranges as given)."""
    serializers: SerializerRegistry | None
    pages: PageQuery | None
    """The source's query a page at a time (None: ``events_by_slices``, one envelope a page)."""
    snapshot_pages: PageQuery | None
    """Its query from each pid's latest snapshot, a page at a time (None: it has none)."""
    query_mode: QueryMode | None
    """The late-commit mode of the source's slice queries (None: the worker's settings say)."""

    @classmethod
    def of(cls, source: EventSource) -> SourceFacts:
        if isinstance(source, Journal):
            return cls(
                source.backend, source.serializers, source.event_pages_by_slices,
                source.event_pages_by_slices_starting_from_snapshots, source.settings.query.mode,
            )  # fmt: skip
        return cls(None, None, None, None, None)
