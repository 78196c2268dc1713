"""The backend seam: a small Protocol of storage operations.

PostgreSQL and Cassandra implement it; SQL and CQL live only behind it. Rows cross the seam
serialized (bytes plus serializer id and manifest); the :class:`~journal.Journal` facade does
validation and (de)serialization above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from .serialization import Serialized


@dataclass(frozen=True, slots=True)
class WriteRequest:
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


@dataclass(frozen=True, slots=True)
class WriteResult:
    """Where a request landed: its first sequence number and the shared db_timestamp."""

    first_seq_nr: int
    db_timestamp: datetime


@dataclass(frozen=True, slots=True)
class StoredEvent:
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

    async def save_snapshot(self, row: SnapshotRow) -> None: ...

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None: ...

    async def delete_snapshot(self, persistence_id: str) -> None: ...
