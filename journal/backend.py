"""The backend seam: every storage interface a backend implements, declared here and nowhere else.

PostgreSQL (:mod:`journal.postgres`) and Cassandra (:mod:`journal.cassandra`) implement
:class:`Backend` in full; :func:`journal.backends.open_backend` chooses one from the DSN. SQL and
CQL live only behind this seam. Rows cross it serialized (bytes plus serializer id and manifest);
the :class:`~journal.Journal` facade validates and (de)serializes above it, and the algorithms
(group commit, slice and tag queries, tag writers, cleanup) run over these Protocols.

A capability a backend lacks is still part of its interface: it raises
:class:`~journal.errors.UnsupportedOperation` (Cassandra has no slice queries, no ``write_on``,
no replicated logs, no slice leases).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from .codec import KeyStore
from .errors import JournalUnavailable
from .serialization import Serialized
from .transaction_slots import TransactionSlots
from .write_batch import BatchResult, WriteBatch

if TYPE_CHECKING:
    from .replicated import ReplicatedEvent, WriteOutcome
    from .vector_time import VectorTime

# -- what crosses the seam ------------------------------------------------------------------

SLICE_GROUP_SIZE = 64
"""A write's NOTIFY payload names a group of 64 slices, ``"<slice // 64>:<entity_type>"``;
live queries listen for the groups of their slice range."""


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


SLICE_ROW_COLUMNS = (
    "persistence_id", "entity_type", "slice", "seq_nr", "db_timestamp", "event_ser_id",
    "event_ser_manifest", "event_payload", "writer", "tags", "meta_ser_id", "meta_ser_manifest",
    "meta_payload", "deleted",
)  # fmt: skip
"""The columns of event reads, read by name (:meth:`SliceReads.read_slice_rows` rows, and every
row :func:`stored_event` decodes): the fields of :class:`StoredEvent`, with the metadata flat."""


def stored_event(r: Any) -> StoredEvent:
    """A row with the :data:`SLICE_ROW_COLUMNS` (read by name) as a StoredEvent (the one decoder
    of it; a NULL payload stays None: a payload-free read)."""
    meta = None
    if r["meta_ser_id"] is not None:
        meta = Serialized(r["meta_ser_id"], r["meta_ser_manifest"] or "", bytes(r["meta_payload"] or b""))
    payload = r["event_payload"]
    return StoredEvent(
        r["persistence_id"], r["entity_type"], r["slice"], r["seq_nr"], r["db_timestamp"], r["event_ser_id"],
        r["event_ser_manifest"], None if payload is None else bytes(payload), r["writer"],
        tuple(r["tags"]) if r["tags"] else (), meta, r["deleted"],
    )  # fmt: skip


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


class ManifestCount(NamedTuple):
    """How many stored rows of one kind (``"event"`` or ``"snapshot"``) have this serializer id and
    stored manifest (``journal manifests``)."""

    kind: str
    ser_id: int
    manifest: str
    rows: int


class Found(Enum):
    """What the rows of an interrupted write say about it (:meth:`EventWrites.check_write`)."""

    WRITTEN = "written"
    """Every event is stored, by this writer, with these payloads."""
    NOT_WRITTEN = "not written"
    """No row at those sequence numbers: nothing of the call is stored."""
    CONFLICT = "conflict"
    """Another writer's rows are there."""


class WriteCheck(NamedTuple):
    outcome: Found
    db_timestamp: datetime | None = None
    """The written rows' timestamp (only when ``outcome`` is WRITTEN)."""


def check_rows(payloads: Sequence[bytes], writer_id: str, rows: Sequence[tuple[str, bytes, datetime]]) -> WriteCheck:
    """Classify the rows stored at a call's sequence numbers: (writer, payload, db_timestamp)
    of each, ascending; ``payloads`` are the call's. Shared by every backend's
    :meth:`EventWrites.check_write`."""
    if not rows:
        return WriteCheck(Found.NOT_WRITTEN)
    mine = [r for r in rows if r[0] == writer_id]
    if len(mine) == len(payloads) and all(bytes(r[1]) == p for r, p in zip(mine, payloads, strict=True)):
        return WriteCheck(Found.WRITTEN, mine[0][2])
    return WriteCheck(Found.CONFLICT)


@dataclass(frozen=True, slots=True)
class SliceRange:
    """The rows a slice query reads: one entity type, slices ``[min_slice, max_slice]``."""

    entity_type: str
    min_slice: int
    max_slice: int


@dataclass(frozen=True, slots=True)
class SliceHome:
    """A run of slices ``[min_slice, max_slice]`` and the database that serves it
    (:meth:`Backend.slice_homes`): ``dsn`` to connect there, ``name`` to say it (no password).
    ``dsn`` None: no database serves the run right now (a move is switching it)."""

    min_slice: int
    max_slice: int
    dsn: str | None
    name: str


@dataclass(frozen=True, slots=True)
class PageRequest:
    """One page of a slice range: ``[from_timestamp, to_timestamp)``, at most ``limit`` rows,
    skipping those at exactly ``from_timestamp`` that ``seen`` covers (pid -> highest seq_nr)."""

    from_timestamp: datetime
    seen: Mapping[str, int]
    to_timestamp: datetime
    limit: int


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


@dataclass(frozen=True, slots=True)
class PidFootprint:
    """What a persistence id holds, as the cleanup tool reports it (before and after, dry runs)."""

    persistence_id: str
    events: int
    """Stored events (not the tombstone row a Postgres delete keeps to hold the highest number)."""
    highest_seq_nr: int
    snapshot_seq_nr: int | None
    tag_rows: int
    """Rows of the pid in the tag view (events by tag)."""
    lowest_seq_nr: int | None = None
    """The lowest stored event's sequence number (None: no events)."""


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


TAG_PAGE_COLUMNS = (
    "persistence_id", "timestamp", "tag_pid_sequence_nr", "sequence_nr", "timebucket", "ser_id", "ser_manifest",
    "event", "writer_uuid", "tags", "meta_ser_id", "meta_ser_manifest", "meta_payload",
)  # fmt: skip
"""The columns of a tag page row, read by name: the pid, its TimeUUID (``timestamp``), its
number per (tag, pid), its seq_nr, its bucket, the event (id, manifest, payload), the writer,
``tags`` (a one-element sequence: the tag) and the metadata (id, manifest, payload)."""

TagPageRow = Mapping[str, Any]
"""One row of a tag page as the query reads it, by the names of :data:`TAG_PAGE_COLUMNS`: a store
hands over its driver's records (an asyncpg Record reads by name) without an object per row."""

PID, TIMEUUID, TAG_PID_SEQ_NR, SEQ_NR, TIMEBUCKET = TAG_PAGE_COLUMNS[:5]
"""Names of the columns of a :data:`TagPageRow` the tag query reads."""


def page_row(r: TagRow) -> dict[str, Any]:
    """A :class:`TagRow` as a :data:`TagPageRow` (for stores that build TagRows)."""
    m = r.meta
    return dict(zip(TAG_PAGE_COLUMNS, (
        r.persistence_id, r.timeuuid, r.tag_pid_seq_nr, r.seq_nr, r.timebucket, r.event.ser_id,
        r.event.manifest, r.event.payload, r.writer, (r.tag,),
        m.ser_id if m else None, m.manifest if m else None, m.payload if m else None,
    ), strict=True))  # fmt: skip


def row_of(p: TagPageRow) -> TagRow:
    """The :class:`TagRow` of a page row."""
    meta = None if p["meta_ser_id"] is None else Serialized(p["meta_ser_id"], p["meta_ser_manifest"] or "",
                                                             bytes(p["meta_payload"] or b""))  # fmt: skip
    return TagRow(
        p["tags"][0], p["timebucket"], p["timestamp"], p["persistence_id"], p["tag_pid_sequence_nr"],
        p["sequence_nr"], p["writer_uuid"], Serialized(p["ser_id"], p["ser_manifest"], bytes(p["event"])), meta,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class TagProgress:
    """How far the tag writer got for one (pid, tag): written after the tag rows (best effort)."""

    persistence_id: str
    tag: str
    seq_nr: int
    tag_pid_seq_nr: int
    offset: uuid.UUID


# -- the interfaces -------------------------------------------------------------------------


class EventWrites(Protocol):
    """Writes of events (every one a :class:`~journal.write_batch.WriteBatch`), and what is
    known about a write that was interrupted."""

    writer_id: str

    async def write_batch(self, batch: WriteBatch) -> BatchResult:
        """Write the batch's calls; each is atomic on its own, and fails alone."""
        ...

    async def write_chunks(self, chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        """A bulk write: each chunk's calls as :meth:`write_batch` writes them, a result per chunk.
        The iterator checks each chunk only when asked for (the next one is checked while the
        earlier ones are written); when it raises, nothing of any chunk is written and the error
        is raised."""
        ...

    async def write_on(self, conn: Any, batch: WriteBatch) -> BatchResult:
        """Write the batch on the caller's connection, inside its transaction (PostgreSQL;
        UnsupportedOperation elsewhere). A failed call raises: the transaction may be aborted."""
        ...

    async def check_write(self, batch: WriteBatch) -> list[WriteCheck]:
        """The outcome of an interrupted write of each call of ``batch`` (every one gave
        ``expected_seq_nr``), from the rows at its sequence numbers (:func:`check_rows`)."""
        ...

    async def highest_seq_nr(self, persistence_id: str) -> int: ...

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None: ...


class EventReads(Protocol):
    """Reads by persistence id."""

    async def read_events(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[StoredEvent]:
        """Non-deleted events of one pid in ``[from, to]``, ascending, at most ``limit``."""
        ...

    async def persistence_ids(self, entity_type: str | None, after: str | None, limit: int) -> list[str]: ...


class Snapshots(Protocol):
    """Snapshots per persistence id: the newest, and older ones when asked to keep several."""

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


class Listening(Protocol):
    """A running notification listener; ``close`` stops it."""

    async def close(self) -> None: ...


class Notifications(Protocol):
    """Journal notifications sent by the write path (live queries wake on them)."""

    async def listen(self, on_notify: Callable[[str], None], on_reconnect: Callable[[], None]) -> Listening:
        """Start one listener connection for journal notifications (payload
        ``"<slice // 64>:<entity_type>"``); reconnects with backoff and calls ``on_reconnect``
        after each (re)connection, since notifications sent meanwhile are lost."""
        ...


class SliceReads(Protocol):
    """Reads of the slice queries (by slice range and db_timestamp)."""

    async def read_slice_page(
        self, slices: SliceRange, page: PageRequest, *, with_payload: bool = True
    ) -> list[StoredEvent]:
        """Events of the range in the page's ``[from, to)`` ordered by (db_timestamp, seq_nr,
        pid), at most ``limit``, skipping those at exactly ``from`` that ``seen`` covers."""
        ...

    async def read_slice_rows(self, slices: SliceRange, page: PageRequest, *, with_payload: bool = True) -> list[Any]:
        """The same page as the driver's rows (the hot path of catch-up: no per-row object),
        with the columns of :data:`SLICE_ROW_COLUMNS`, read by name."""
        ...

    async def next_slice_timestamp(
        self, slices: SliceRange, from_timestamp: datetime, to_timestamp: datetime
    ) -> datetime | None:
        """The smallest db_timestamp of the range in ``[from, to)``, or None."""
        ...

    async def horizon_reading(self) -> HorizonReading: ...

    async def db_now(self) -> datetime: ...

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None: ...

    async def load_event(self, persistence_id: str, seq_nr: int) -> StoredEvent | None: ...


@runtime_checkable
class SliceQueryBackend(SliceReads, EventReads, Notifications, Protocol):
    """What the slice query algorithms (:mod:`journal.query`) run over."""


@dataclass(frozen=True, slots=True)
class SnapshotSlicePage:
    """A page of a slice query that starts from snapshots: ``request`` below ``bound``, the
    catch-up's bound fixed when it started (only snapshots whose event lies below it cover events);
    ``start`` and ``start_seen`` where the query started (None: from the beginning), ``saved_before``
    the catch-up's snapshot cutoff (:meth:`SnapshotSliceReads.snapshot_cutoff`)."""

    request: PageRequest
    bound: datetime
    start: datetime | None
    start_seen: Mapping[str, int]
    saved_before: datetime


SNAPSHOT_SLICE_COLUMNS = (
    "snap_kind", "snap_seq_nr", "snap_ser_id", "snap_ser_manifest", "snap_snapshot", "snap_tags",
    "snap_meta_ser_id", "snap_meta_ser_manifest", "snap_meta_payload",
)  # fmt: skip
"""What a row of a page from snapshots has besides :data:`SLICE_ROW_COLUMNS`: ``snap_kind`` is
None (the row is an event), ``'replace'`` (the row is its pid's snapshot, at the place of the
first event it covers at or after the query's start; ``event_payload`` is NULL) or ``'before'``
(the pid's snapshot comes before this event: the snapshot's own event is no longer stored); the
other columns are the snapshot's then."""


class SnapshotSliceReads(Protocol):
    """Reads of the slice query that starts from snapshots (:mod:`journal.query.from_snapshots`)."""

    async def read_snapshot_slice_rows(self, slices: SliceRange, page: SnapshotSlicePage) -> list[Any]:
        """The page as :meth:`SliceReads.read_slice_rows` reads it, but an event its pid's snapshot
        covers is left out when that snapshot was saved before ``page.saved_before`` and its own
        event is stored below ``page.bound``; the snapshot comes in the place of the first event it
        covers at or after the query's start: rows with :data:`SLICE_ROW_COLUMNS` and
        :data:`SNAPSHOT_SLICE_COLUMNS`, read by name. ``limit`` counts the rows returned."""
        ...

    async def snapshot_cutoff(self) -> datetime:
        """A time before which every snapshot saved (or deleted) is visible to any later read:
        the database clock, or the start of an earlier write to the snapshot table still running."""
        ...

    async def read_only_snapshots(self, slices: SliceRange, after: str, limit: int) -> list[SnapshotRow]:
        """Snapshots of the range whose pid has no stored event, by pid after ``after``."""
        ...


@runtime_checkable
class TagStore(Protocol):
    """Storage operations of the tag view (events by tag and the tag writers run over it)."""

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


class TagRowWriter(Protocol):
    """The tag writers as a backend that stores tag rows after its events sees them (Cassandra).

    The algorithm (:class:`journal.tags.writer.TagWriters`) is composed above the seam and handed
    to the backend by the factory, so no backend imports it.
    """

    async def ensure_recovered(self, pid: str, highest: int | None = None) -> None:
        """Before storing a pid's new tagged events: its earlier tag rows are all written, for
        every event up to ``highest`` (the stored highest the write starts from)."""
        ...

    async def write(self, events: Sequence[TaggedEvent]) -> None:
        """The tag rows of freshly stored events; waits (bounded) until they are written."""
        ...

    def forget(self, pid: str) -> None:
        """The pid's events may be stored without their tag rows: recover it again first."""
        ...

    async def close(self) -> None: ...


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


class ReplicationStore(Protocol):
    """The replicated logs of one location in one journal database (PostgreSQL)."""

    location: str

    async def ensure_log(self, log_name: str) -> None: ...

    async def version_vector(self, log_name: str) -> VectorTime: ...

    async def log_seq_nr(self, log_name: str) -> int: ...

    async def stamp(self, log_name: str, limit: int = 1000) -> int: ...

    async def read_log(self, log_name: str, after: int, limit: int) -> tuple[list[ReplicatedEvent], int]: ...

    async def read_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> list[ReplicatedEvent]: ...

    async def missing_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> list[tuple[str, int]]: ...

    async def progress(self, log_name: str, source_location: str) -> int: ...

    async def target_state(self, log_name: str, source_location: str) -> tuple[int, VectorTime]:
        """The progress reading ``source_location``'s log and this location's version vector."""
        ...

    async def all_progress(self, log_name: str) -> dict[str, int]: ...

    async def write_replicated(
        self, log_name: str, source_location: str, events: Sequence[ReplicatedEvent], last_scanned: int
    ) -> WriteOutcome: ...

    async def begin_recovery(self, log_names: Sequence[str]) -> None: ...

    async def end_recovery(self, log_names: Sequence[str]) -> None: ...

    async def recovering(self, log_names: Sequence[str]) -> bool: ...

    async def guard_installed(self) -> bool: ...

    async def record_target_progress(self, log_name: str, target_location: str, log_seq_nr: int) -> None: ...

    async def target_progress(self, log_name: str) -> dict[str, int]: ...

    async def reserve_positions(self, log_name: str, at_least: int) -> None: ...

    async def delete_logically(self, log_name: str, to_log_seq_nr: int) -> int: ...

    async def delete_physically(self, log_name: str, to_log_seq_nr: int, replicated_to: Sequence[str]) -> int: ...

    async def delete_invalid_snapshots(self, log_name: str) -> int: ...

    async def entity_events(self, persistence_id: str) -> list[tuple[Serialized, str, int, VectorTime]]: ...

    async def event_ids(self, log_name: str) -> dict[tuple[str, int], int]: ...


class SharedConnections(Protocol):
    """The journal's connection pool, lent to the projection workers and tools of its process
    (one pool per process): they take connections from ``pool`` and never close it."""

    dsn: str
    """The database (asyncpg form): a caller whose own DSN names another one keeps its own."""
    application_name: str
    """Set on every pooled connection and unique to the journal: a caller that lost a
    connection finds its server process by pid *and* this name (never another client's)."""
    transactions: TransactionSlots
    """Projection transactions on this pool go through it: fewer than half the pool at once, so a
    handler that reads the journal inside one always gets its second connection."""

    @property
    def pool(self) -> Any:
        """An asyncpg pool (``async with pool.acquire() as conn``)."""
        ...


class SliceLeases(Protocol):
    """One member of a named job whose live members share the slices through leases (projection
    workers, event routers), and the progress it records per slice (PostgreSQL)."""

    owner: str

    @property
    def held(self) -> Mapping[int, int]:
        """Slice -> lease epoch of what the member held after its last round."""
        ...

    async def join(self) -> None:
        """Count as a live member (until the ttl) and create the job's lease rows if they are missing."""
        ...

    async def rebalance(
        self, give_up: Callable[[set[int]], Awaitable[None]], *, events: int = 0, error: str | None = None
    ) -> Mapping[int, int]:
        """One round: heartbeat, renew, rebalance; ``give_up(slices)`` must stop the work on
        slices lost or to be given away before their leases go. Returns what is held now."""
        ...

    async def leave(self, *, state: str = "stopped", events: int = 0, error: str | None = None) -> None: ...

    async def save_progress(self, key: str, done: Mapping[int, datetime]) -> None:
        """Per slice: every event before the timestamp is done (for the stream named ``key``)."""
        ...

    async def load_progress(self, key: str, slices: Sequence[int]) -> dict[int, datetime]: ...


# -- durable state (issue 34) ----------------------------------------------------------------


class StateRow(NamedTuple):
    """One upsert or delete of the durable state store, validated and serialized: the row the
    pid gets at ``revision`` (``state`` None: a tombstone, the plugin's delete). A NamedTuple:
    an ``upsert_many`` builds a thousand of them a call, a column at a time, in C."""

    persistence_id: str
    entity_type: str
    slice: int
    revision: int
    state: Serialized | None
    tags: tuple[str, ...] = ()


class StoredState(NamedTuple):
    """The row of a pid in ``durable_state`` (``state`` None: a tombstone)."""

    persistence_id: str
    revision: int
    db_timestamp: datetime
    state: Serialized | None
    tags: tuple[str, ...]


StateOutcome = datetime | int | None | JournalUnavailable
"""Per row of an upsert: its db_timestamp (written), else the revision found instead of the one
before it (int; None: no row), and nothing of that row was written; or, for an upsert whose
answer was lost, a JournalUnavailable saying whether it is known not written."""


class StateColumn(NamedTuple):
    """An additional column of durable states: ``column`` of ``durable_state`` (``table`` None)
    or of a table of its own keyed by ``persistence_id``."""

    table: str | None
    column: str


StateTransaction = Callable[[Any, Sequence[StateRow], list[StateOutcome]], Awaitable[None]]
"""``(conn, rows, outcomes)``: what runs in an upsert's transaction after its statement."""


class DurableStateStore(Protocol):
    """The ``durable_state`` table (PostgreSQL; docs/durable-state.md)."""

    async def get_state(self, persistence_id: str) -> StoredState | None: ...

    async def upsert_states(
        self,
        rows: Sequence[StateRow],
        in_transaction: StateTransaction | None = None,
    ) -> list[StateOutcome]:
        """Each row in one statement: revision 1 inserts, revision n updates only a row at n - 1.
        ``in_transaction(conn, rows, outcomes)``: run after the statement in its transaction, on
        its connection, with the rows of that statement and their outcomes (what it raises rolls
        them back and propagates; a partitioned journal runs one statement per database). An upsert whose answer
        was lost is resolved from the rows read back (JournalUnavailable(outcome_unknown=True)
        when that cannot be done)."""
        ...

    async def delete_tombstones(self, before: datetime, *, dry_run: bool = False) -> int:
        """Delete the tombstones (deleted states) written before ``before``; how many."""
        ...

    async def check_columns(self, columns: Sequence[StateColumn]) -> None:
        """ConfigurationError naming the first column (or table) that the database lacks."""
        ...

    async def write_columns(self, conn: Any, persistence_id: str, values: Sequence[tuple[StateColumn, Any]]) -> None:
        """The pid's additional column values, on ``conn`` (in the upsert's transaction)."""
        ...

    async def hard_delete_state(self, persistence_id: str) -> bool:
        """Remove the pid's row (True: there was one)."""
        ...

    def changes(self) -> SliceQueryBackend:
        """The table's slice reads: each row in the layout of an event row (revision as seq_nr,
        a tombstone without payload and ``deleted``), for the slice query algorithm."""
        ...


@runtime_checkable
class Backend(EventWrites, EventReads, Snapshots, Protocol):
    """The whole interface of a backend: lifecycle, writes, reads by pid, snapshots, ``info``,
    and its stores by capability (each raises UnsupportedOperation where the backend has none)."""

    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def info(self) -> dict[str, Any]:
        """What the storage reports: at least ``events``, the event count per entity type."""
        ...

    async def manifests(self) -> list[ManifestCount]:
        """Every (serializer id, stored manifest) of the stored events and snapshots, with counts
        (a scan: a tool's call, not a hot path)."""
        ...

    def slice_queries(self) -> SliceQueryBackend:
        """The reads the slice queries run over (PostgreSQL)."""
        ...

    def snapshot_slice_reads(self) -> SnapshotSliceReads:
        """The reads of the slice query that starts from snapshots (one PostgreSQL database)."""
        ...

    def tag_store(self) -> TagStore: ...

    def cleanup_store(self) -> CleanupStore: ...

    def replication_store(self, location: str) -> ReplicationStore:
        """The replicated logs of ``location`` in this database (PostgreSQL)."""
        ...

    def slice_leases(self, name: str, owner: str, ttl: float) -> SliceLeases:
        """Membership ``owner`` of the job ``name``, its leases expiring ``ttl`` seconds after
        the last round (PostgreSQL)."""
        ...

    async def slice_homes(self, min_slice: int, max_slice: int, *, fresh: bool = False) -> list[SliceHome]:
        """Which database serves which slices of the range: runs in slice order covering it
        once (one database: one run, all slices here). ``fresh``: read the placement from the
        databases first, else as last loaded (PostgreSQL)."""
        ...

    def pool_for(self, persistence_id: str) -> Any:
        """The connection pool of the database serving the pid's slice now, for a transaction
        of the caller's that writes with ``persist_in`` (PostgreSQL)."""
        ...

    def shared_connections(self) -> SharedConnections:
        """The journal's pool in the database that keeps its projections' offsets (PostgreSQL;
        a partitioned journal's: the home database's)."""
        ...

    def key_store(self) -> KeyStore:
        """The default store of encryption keys: a table of this database (PostgreSQL)."""
        ...

    def durable_state_store(self) -> DurableStateStore:
        """The durable state table of this database (PostgreSQL, one database)."""
        ...
