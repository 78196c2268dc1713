"""The backend seam: a small Protocol of storage operations.

PostgreSQL and Cassandra implement it; SQL and CQL live only behind it. Rows cross the seam
serialized (bytes plus serializer id and manifest); the :class:`~journal.Journal` facade does
validation and (de)serialization above it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol, runtime_checkable

from .serialization import Serialized


class WriteRequest(NamedTuple):
    """One ``persist`` call: all its events are written atomically, consecutively numbered.

    ``expected_seq_nr`` is the highest sequence number the caller believes is stored; None asks
    for "after the current highest".
    """

    persistence_id: str
    entity_type: str
    slice: int
    expected_seq_nr: int | None
    events: Sequence[Serialized]
    tags: tuple[str, ...] = ()
    metadata: Serialized | None = None


class WriteResult(NamedTuple):
    """Where a request landed: its first sequence number and the shared db_timestamp."""

    first_seq_nr: int
    db_timestamp: datetime


class StoredEvent(NamedTuple):
    """One event row as stored. ``payload`` is None for payload-free (backtracking) reads."""

    persistence_id: str
    entity_type: str
    slice: int
    seq_nr: int
    db_timestamp: datetime
    ser_id: int
    ser_manifest: str
    payload: bytes | None
    writer: str
    tags: tuple[str, ...] = ()
    meta: Serialized | None = None
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    persistence_id: str
    entity_type: str
    slice: int
    seq_nr: int
    write_timestamp: int
    """Milliseconds since the epoch when the snapshot was taken (reference column)."""
    state: Serialized
    tags: tuple[str, ...] = ()
    meta: Serialized | None = None
    db_timestamp: datetime | None = None


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """Per request of a batch: a WriteResult, or the exception that request alone gets."""

    results: list[WriteResult | Exception] = field(default_factory=list)


@runtime_checkable
class Backend(Protocol):
    """Storage operations every backend provides."""

    name: str
    writer_id: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def write_batch(self, requests: Sequence[WriteRequest]) -> list[WriteResult | Exception]:
        """Write many requests at once; each is atomic on its own, and fails alone."""
        ...

    async def highest_seq_nr(self, persistence_id: str) -> int: ...

    async def read_events(
        self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int
    ) -> list[StoredEvent]:
        """Non-deleted events of one pid in ``[from, to]``, ascending, at most ``limit``."""
        ...

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None: ...

    async def persistence_ids(self, entity_type: str | None, after: str | None, limit: int) -> list[str]: ...

    async def save_snapshot(self, row: SnapshotRow, keep: int = 1) -> None:
        """Store ``row`` as the pid's newest snapshot; keep at most ``keep`` snapshots of it."""
        ...

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None: ...

    async def load_snapshots(self, persistence_id: str, limit: int) -> list[SnapshotRow]:
        """At most ``limit`` snapshots of the pid, newest first."""
        ...

    async def delete_snapshot(self, persistence_id: str) -> None:
        """Every snapshot of the pid."""
        ...


@dataclass(frozen=True, slots=True)
class WriterInProgress:
    """A transaction holding the write lock on event_journal when the horizon was read.

    ``xact_start`` is None when the reader cannot see it (another role without
    pg_read_all_stats) or for a prepared transaction.
    """

    vxid: str
    pid: int | None
    xact_start: datetime | None


@dataclass(frozen=True, slots=True)
class HorizonReading:
    """The database clock, read first, then the writers in progress after it."""

    now: datetime
    writers: tuple[WriterInProgress, ...] = ()
    prepared: int = 0


class Listening(Protocol):
    """A running notification listener; ``close`` stops it."""

    async def close(self) -> None: ...


SLICE_ROW_COLUMNS = (
    "persistence_id", "entity_type", "slice", "seq_nr", "db_timestamp", "event_ser_id",
    "event_ser_manifest", "event_payload", "writer", "tags", "meta_ser_id", "meta_ser_manifest",
    "meta_payload", "deleted",
)  # fmt: skip
"""Positions of the columns of :meth:`SliceQueryBackend.read_slice_rows` rows."""


@runtime_checkable
class SliceQueryBackend(Protocol):
    """Storage operations of the slice queries (PostgreSQL; not Cassandra, which has tags)."""

    async def read_slice_page(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        from_timestamp: datetime,
        seen: Mapping[str, int],
        to_timestamp: datetime,
        limit: int,
        *,
        with_payload: bool = True,
    ) -> list[StoredEvent]:
        """Events of the range in ``[from, to)`` ordered by (db_timestamp, seq_nr, pid), at most
        ``limit``, skipping those at exactly ``from`` that ``seen`` covers."""
        ...

    async def read_slice_rows(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        from_timestamp: datetime,
        seen: Mapping[str, int],
        to_timestamp: datetime,
        limit: int,
        *,
        with_payload: bool = True,
    ) -> list[Any]:
        """The same page as positional rows (the hot path of catch-up: no per-row object), in
        the column order of :data:`SLICE_ROW_COLUMNS`."""
        ...

    async def next_slice_timestamp(
        self, entity_type: str, min_slice: int, max_slice: int, from_timestamp: datetime, to_timestamp: datetime
    ) -> datetime | None:
        """The smallest db_timestamp of the range in ``[from, to)``, or None."""
        ...

    async def horizon_reading(self) -> HorizonReading: ...

    async def db_now(self) -> datetime: ...

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None: ...

    async def read_events(
        self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int
    ) -> list[StoredEvent]:
        """Non-deleted events of one pid in ``[from, to]``, ascending, at most ``limit``."""
        ...

    async def load_event(self, persistence_id: str, seq_nr: int) -> StoredEvent | None: ...

    async def listen(self, on_notify: Callable[[str], None], on_reconnect: Callable[[], None]) -> Listening:
        """Start one listener connection for journal notifications (payload
        ``"<slice // 64>:<entity_type>"``); reconnects with backoff and calls ``on_reconnect``
        after each (re)connection, since notifications sent meanwhile are lost."""
        ...


@dataclass(frozen=True, slots=True)
class PidFootprint:
    """What a persistence id holds, as the cleanup tool reports it (before and after, dry runs)."""

    persistence_id: str
    events: int
    """Stored event rows (a Postgres tombstone row counts)."""
    highest_seq_nr: int
    snapshot_seq_nr: int | None
    tag_rows: int
    """Rows of the pid in the tag view (events by tag)."""


@runtime_checkable
class CleanupStore(Protocol):
    """Per-pid deletions of the cleanup tool (:mod:`journal.cleanup`). Each is idempotent, so an
    interrupted cleanup is finished by running it again."""

    async def footprint(self, persistence_id: str) -> PidFootprint: ...

    async def delete_tag_rows(self, persistence_id: str, *, keep_numbering: bool) -> None:
        """The pid's tag view rows (nothing of other pids). ``keep_numbering``: its tag writer
        progress stays, raised to the deleted rows' numbers, so later tagged events of the pid
        continue each tag's ``tag_pid_seq_nr`` (a consumer that saw the old numbers would drop
        repeated ones as duplicates); False deletes its progress and scanning rows too."""
        ...

    async def delete_all_events(self, persistence_id: str, *, reset_seq_nr: bool) -> None:
        """Every event of the pid. ``reset_seq_nr`` False keeps the highest sequence number (a
        later write continues after it); True forgets the pid, which may then start at 1."""
        ...


@runtime_checkable
class CleanupBackend(Protocol):
    """A backend the cleanup tool can drive (PostgreSQL and Cassandra)."""

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None: ...

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None: ...

    async def delete_snapshot(self, persistence_id: str) -> None: ...

    def cleanup_store(self) -> CleanupStore: ...
