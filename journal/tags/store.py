"""The small store interface the tag algorithms run over (PostgreSQL and Cassandra implement it)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..serialization import Serialized


@dataclass(frozen=True, slots=True)
class TaggedEvent:
    """A stored event that carries tags, as the tag writer needs it (its TimeUUID included)."""

    persistence_id: str
    seq_nr: int
    timeuuid: uuid.UUID
    tags: tuple[str, ...]
    event: Serialized
    writer: str
    meta: Serialized | None = None


@dataclass(frozen=True, slots=True)
class TagRow:
    """One row of the tag view: an event under one tag, numbered per (tag, pid)."""

    tag: str
    timebucket: int
    timeuuid: uuid.UUID
    persistence_id: str
    tag_pid_seq_nr: int
    seq_nr: int
    writer: str
    event: Serialized
    meta: Serialized | None = None


TagPageRow = Sequence[Any]
"""One row of a tag page as the query reads it: positional, so a store can hand over its driver's
records without building an object per row. Columns (the slice page layout where they mean the
same, so :func:`journal.envelope.lazy_tag_page_envelopes` builds envelopes straight from them):
0 persistence_id, 1 timeuuid, 2 tag_pid_seq_nr, 3 seq_nr, 4 timebucket, 5 ser_id, 6 ser_manifest,
7 payload, 8 writer, 9 tags (a one-element sequence: the tag), 10 meta_ser_id,
11 meta_ser_manifest, 12 meta_payload."""

PID, TIMEUUID, TAG_PID_SEQ_NR, SEQ_NR, TIMEBUCKET = 0, 1, 2, 3, 4


def page_row(r: TagRow) -> tuple[Any, ...]:
    """A :class:`TagRow` in the :data:`TagPageRow` layout (for stores that build TagRows)."""
    m = r.meta
    return (
        r.persistence_id, r.timeuuid, r.tag_pid_seq_nr, r.seq_nr, r.timebucket, r.event.ser_id,
        r.event.manifest, r.event.payload, r.writer, (r.tag,),
        m.ser_id if m else None, m.manifest if m else None, m.payload if m else None,
    )  # fmt: skip


def row_of(p: TagPageRow) -> TagRow:
    """The :class:`TagRow` of a page row."""
    return TagRow(
        p[9][0], p[4], p[1], p[0], p[2], p[3], p[8], Serialized(p[5], p[6], bytes(p[7])),
        None if p[10] is None else Serialized(p[10], p[11] or "", bytes(p[12] or b"")),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class TagProgress:
    """How far the tag writer got for one (pid, tag): written after the tag rows (best effort)."""

    persistence_id: str
    tag: str
    seq_nr: int
    tag_pid_seq_nr: int
    offset: uuid.UUID


@runtime_checkable
class TagStore(Protocol):
    """Storage operations of the tag view."""

    async def write_tag_rows(self, rows: Sequence[TagRow]) -> None:
        """Idempotent upsert of rows of one (tag, bucket): a resend writes nothing twice."""
        ...

    async def write_progress(self, progress: Sequence[TagProgress]) -> None: ...

    async def read_progress(self, persistence_id: str) -> dict[str, TagProgress]: ...

    async def read_scanning(self, persistence_id: str) -> int:
        """The seq nr up to which recovery already rescanned this pid (0 when never)."""
        ...

    async def write_scanning(self, persistence_id: str, seq_nr: int) -> None: ...

    async def tagged_events(self, persistence_id: str, from_seq_nr: int, limit: int) -> list[TaggedEvent]:
        """Events of a pid with seq_nr >= from_seq_nr (tagged or not; ``tags`` may be empty), ascending."""
        ...

    async def read_tag_rows(
        self, tag: str, bucket: int, after: uuid.UUID | None, before_ticks: int, limit: int
    ) -> Sequence[TagPageRow]:
        """Rows of (tag, bucket) strictly after ``after`` (None: from the start) and with a UUID time
        strictly below ``before_ticks``, in TimeUUID order, at most ``limit`` (:data:`TagPageRow`)."""
        ...

    async def next_bucket(self, tag: str, from_bucket: int, to_bucket: int) -> int | None:
        """The first bucket in ``[from_bucket, to_bucket]`` that may hold rows of the tag (a store
        that cannot tell returns ``from_bucket``); None when none can."""
        ...

    async def ensure_bucket_size(self, size: str) -> None:
        """Persist the bucket size on first use; refuse a different one once tagged data exists."""
        ...


@runtime_checkable
class HasTagStore(Protocol):
    """A backend that serves events by tag."""

    def tag_store(self) -> TagStore: ...
