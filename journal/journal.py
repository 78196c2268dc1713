"""The facade a service imports: :func:`open_journal` and :class:`Journal`."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from itertools import chain
from typing import Any

from . import hooks, runtime, tracing
from .backend import Backend, Found, SnapshotRow, StoredEvent
from .backends import open_backend
from .bulk import Outcome, Write, outcomes
from .codec import KeyState, KeyStore, PayloadCodec, inner_manifest
from .durable_state import DurableState
from .envelope import EventEnvelope
from .errors import (
    ConfigurationError,
    InvalidArgument,
    JournalUnavailable,
    SequenceConflict,
    SerializationError,
    UnsupportedOperation,
)
from .group_commit import GroupCommit
from .ids import (
    MAX_SEQ_NR,
    entity_type_of,
    slice_for,
    validate_entity_type,
    validate_persistence_id,
    validate_seq_nr,
    validate_tags,
)
from .metrics import instrumented, instrumented_chunks
from .offsets import NoOffset, Offset, TimestampOffset
from .offsets import SequenceOffset as SeqOffset
from .query.from_snapshots import FromSnapshots
from .query.slices import SliceQueries, envelope_of
from .query.validation import check_slice_query
from .serialization import Serialized, SerializerRegistry
from .settings import JournalSettings, QueryMode
from .snapshots import Snapshot
from .upcasting import StoredManifest, split_version
from .write_batch import WriteBatch
from .write_tracing import carrying, carrying_chunks, trace_metadata, traced_batches
from .write_validation import WriteValidator

log = logging.getLogger("journal")


class Journal:
    """An open event journal. Use :func:`open_journal` to get one.

    All methods validate their input before any I/O and raise :class:`InvalidArgument` for bad
    input; storage outages surface as :class:`JournalUnavailable` after bounded retries.
    """

    def __init__(
        self, backend: Backend, settings: JournalSettings, serializers: SerializerRegistry | None = None, *,
        key_store: KeyStore | None = None, subject_of: Callable[[str], str] | None = None,
    ) -> None:  # fmt: skip
        self.backend = backend
        self.settings = settings
        self.serializers = serializers or SerializerRegistry()
        c = settings.codec
        if c.encrypt or c.compress_above:
            self.serializers.use_codec(
                PayloadCodec(
                    (key_store or backend.key_store()) if c.encrypt else None, compress_above=c.compress_above,
                    compression_level=c.compression_level, subject_of=subject_of, cache_ttl=c.key_cache_ttl,
                    cache_size=c.key_cache_size,
                )
            )  # fmt: skip
        self._validator = WriteValidator(self.serializers, settings.write.max_event_bytes)
        w = settings.write
        self._group_commit = GroupCommit(
            traced_batches(instrumented(backend.write_batch)),
            instrumented_chunks(backend.write_chunks),
            max_batch_events=w.max_batch_events,
            max_in_flight=w.max_in_flight,
            max_batch_wait=w.max_batch_wait,
            bulk_in_flight=w.bulk_in_flight,
        )
        self._slices: SliceQueries | None = None
        self._starting_from_snapshots: FromSnapshots | None = None
        self._durable_state: DurableState | None = None

    @property
    def writer_id(self) -> str:
        return self.backend.writer_id

    async def close(self) -> None:
        if self._slices is not None:
            await self._slices.close()
        if self._durable_state is not None:
            await self._durable_state.close()
        await self._group_commit.close()
        await self.backend.close()

    async def __aenter__(self) -> Journal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- writing -----------------------------------------------------------------------------

    async def persist(
        self,
        persistence_id: str,
        events: Sequence[Any],
        *,
        expected_seq_nr: int | None = None,
        tags: Sequence[str] = (),
        metadata: Any = None,
    ) -> list[EventEnvelope]:
        """Write ``events`` atomically with consecutive sequence numbers.

        Numbers start after ``expected_seq_nr`` (the highest the caller believes is stored), or
        after the current highest when it is None. Concurrent calls for different pids share one
        statement and commit (group commit); each call is still atomic on its own.

        Raises:
            InvalidArgument: bad pid, empty or non-list events, bad tags or seq_nr (no I/O done).
            SerializationError: an event or the metadata cannot be serialized (nothing written).
            SequenceConflict: another writer took those numbers, or ``expected_seq_nr`` is not
                the stored highest; nothing of this call was written.
            JournalUnavailable: the database could not be reached; ``outcome_unknown`` tells
                whether the write may have happened.
        """
        if tracing.ON:
            return await self._persist_traced(persistence_id, events, expected_seq_nr, tags, metadata)
        if self.serializers.keyed:
            _held = await self.serializers.load_write_keys((persistence_id,))
        batch = self._validator.call(persistence_id, events, expected_seq_nr, tags, metadata)
        first, db_timestamp = await self._group_commit.submit(batch)
        return self._written(batch, first, db_timestamp, events, metadata)

    async def _persist_traced(
        self, pid: str, events: Sequence[Any], expected: int | None, tags: Sequence[str], metadata: Any
    ) -> list[EventEnvelope]:
        """:meth:`persist` in a span whose context travels in the events' metadata columns when
        the call has no metadata of its own (docs/tracing.md)."""
        attributes = {"persistence_id": pid, "events": len(events)}
        with tracing.span("journal.persist", kind="PRODUCER", attributes=attributes):
            if self.serializers.keyed:
                _held = await self.serializers.load_write_keys((pid,))
            batch = carrying(self._validator.call(pid, events, expected, tags, metadata), trace_metadata())
            tracing.note(batch.persistence_ids[0])  # the batch that writes it links to this span
            try:
                first, db_timestamp = await self._group_commit.submit(batch)
            finally:
                tracing.forget(batch.persistence_ids[0])
            return self._written(batch, first, db_timestamp, events, metadata)

    async def persist_many(self, writes: Iterable[Write | tuple[Any, ...]]) -> list[Outcome]:
        """Write many persistence ids at once: each part atomic and conflict-checked on its own.

        ``writes``: :class:`Write` values (or plain tuples of its fields), one per pid. Parts go
        out in multi-row statements of up to ``write.max_batch_events`` events, sharing the
        group commit's connections and ordering with concurrent :meth:`persist` calls. Returns
        one outcome per part, in order: :class:`Written`, or the typed error of that part alone
        (``SequenceConflict``, ``StorageError``, ``JournalUnavailable``); the other parts are
        written regardless. See docs/bulk-writes.md.

        Raises (before anything is written): InvalidArgument for a bad part, or the same pid in
        two parts; SerializationError for an event that cannot be serialized. The message names
        the part's index.
        """
        parts = writes if type(writes) is list else list(writes)
        if not parts:
            return []
        if tracing.ON:
            with tracing.span("journal.persist_many", kind="PRODUCER", attributes={"parts": len(parts)}):
                return await self._persist_many(parts, trace_metadata())
        return await self._persist_many(parts, None)

    async def _persist_many(self, parts: list[Any], carried: Serialized | None) -> list[Outcome]:
        """:meth:`persist_many`; ``carried``: the trace context its parts without metadata carry."""
        if self.serializers.keyed:
            pids = (p[0] for p in parts if isinstance(p, tuple) and p and type(p[0]) is str)
            _held = await self.serializers.load_write_keys(pids)  # the validator raises for any other part
        chunks = self._validator.chunks(parts, self._group_commit.bulk_chunk_calls(len(parts)))
        noted: list[str] = []
        if carried is not None:
            chunks = carrying_chunks(chunks, carried, noted)
        try:
            batches, results = await self._group_commit.submit_chunks(chunks)
        finally:
            for pid in noted:
                tracing.forget(pid)
        return list(chain.from_iterable(map(outcomes, batches, results)))

    async def persist_in(
        self,
        conn: Any,
        persistence_id: str,
        events: Sequence[Any],
        *,
        expected_seq_nr: int | None = None,
        tags: Sequence[str] = (),
        metadata: Any = None,
    ) -> list[EventEnvelope]:
        """:meth:`persist` inside the caller's own transaction on ``conn`` (an asyncpg connection).

        The events commit or roll back with whatever else that transaction writes (an outbox, a
        read model), with the same statement and timestamp rule as :meth:`persist` but no group
        commit. While the transaction is open it holds back the slice queries' horizon, so keep
        it short. PostgreSQL backend only.

        Raises as :meth:`persist`; after a SequenceConflict caused by a concurrent writer the
        transaction is aborted and must be rolled back.
        """
        if not tracing.ON:
            return await self._persist_in(conn, persistence_id, events, expected_seq_nr, tags, metadata, None)
        attributes = {"persistence_id": persistence_id, "events": len(events)}
        with tracing.span("journal.persist_in", kind="PRODUCER", attributes=attributes):
            carried = trace_metadata()
            return await self._persist_in(conn, persistence_id, events, expected_seq_nr, tags, metadata, carried)

    async def _persist_in(
        self, conn: Any, pid: str, events: Sequence[Any], expected: int | None, tags: Sequence[str], metadata: Any,
        carried: Serialized | None,
    ) -> list[EventEnvelope]:  # fmt: skip
        if self.serializers.keyed:
            _held = await self.serializers.load_write_keys((pid,))
        batch = self._validator.call(pid, events, expected, tags, metadata)
        if carried is not None:
            batch = carrying(batch, carried)
        result = await self.backend.write_on(conn, batch)
        return self._written(batch, result.first_seq_nrs[0], result.db_timestamps[0], events, metadata)

    async def resolve_persist(
        self,
        persistence_id: str,
        events: Sequence[Any],
        *,
        expected_seq_nr: int,
        tags: Sequence[str] = (),
        metadata: Any = None,
    ) -> list[EventEnvelope]:
        """Was a :meth:`persist` that raised ``JournalUnavailable(outcome_unknown=True)`` written?

        Pass the same arguments (``expected_seq_nr`` is required: without it the rows cannot be
        told apart from another writer's). Reads only; call again while the database is away.

        Returns the call's envelopes when every event is stored by this journal's writer with
        these payloads.

        Raises:
            JournalUnavailable: with ``outcome_unknown=False`` when nothing of it is stored and
                the highest is still ``expected_seq_nr`` (it may be sent again); with
                ``outcome_unknown=True`` whenever the database cannot be reached (or does not
                answer) yet: only an answer proves that nothing was written.
            SequenceConflict: another writer's rows are there (or the pid moved on).
        """
        if expected_seq_nr is None:
            raise InvalidArgument("resolve_persist needs the expected_seq_nr the write was made with")
        if self.serializers.keyed:
            _held = await self.serializers.load_write_keys((persistence_id,))
        batch = self._validator.call(persistence_id, events, expected_seq_nr, tags, metadata)
        try:
            (got,) = await self.backend.check_write(batch)
            not_written = got.outcome is Found.NOT_WRITTEN
            highest = await self.backend.highest_seq_nr(persistence_id) if not_written else None
        except JournalUnavailable as e:  # the read itself found nothing out
            raise JournalUnavailable(
                f"outcome of the write of {persistence_id!r} still unknown: {e}", outcome_unknown=True
            ) from e
        if got.outcome is Found.WRITTEN:
            assert got.db_timestamp is not None
            return self._written(batch, expected_seq_nr + 1, got.db_timestamp, events, metadata)
        if highest == expected_seq_nr:
            raise JournalUnavailable(
                f"write of {persistence_id!r} failed: not stored (checked once the database answered)",
                outcome_unknown=False,
            )
        raise SequenceConflict(persistence_id, expected_seq_nr, "another writer stored these sequence numbers")

    def _written(
        self, batch: WriteBatch, first_seq_nr: int, db_timestamp: datetime, events: Sequence[Any], metadata: Any
    ) -> list[EventEnvelope]:
        """The envelopes of a written call (the one call of ``batch``)."""
        return EventEnvelope.written(
            batch.persistence_ids[0], batch.entity_types[0], batch.slices[0], first_seq_nr, db_timestamp, events,
            batch.tags[0], metadata, self.writer_id,
        )  # fmt: skip

    # -- reading by persistence id -----------------------------------------------------------

    async def highest_seq_nr(self, persistence_id: str) -> int:
        """The highest sequence number stored for a pid (0 when none; kept across deletes)."""
        return await self.backend.highest_seq_nr(validate_persistence_id(persistence_id))

    async def current_events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> AsyncIterator[EventEnvelope]:
        """The stored events of one pid in ``[from_seq_nr, to_seq_nr]``, paged, then end."""
        validate_persistence_id(persistence_id)
        validate_seq_nr("from_seq_nr", from_seq_nr)
        upper = MAX_SEQ_NR if to_seq_nr is None else validate_seq_nr("to_seq_nr", to_seq_nr)
        page = self.settings.query.buffer_size
        nxt = max(from_seq_nr, 1)
        while nxt <= upper:
            rows = await self.backend.read_events(persistence_id, nxt, upper, page)
            if self.serializers.keyed:
                _held = await self.serializers.load_keys((r.persistence_id, r.ser_id) for r in rows)
            for r in rows:
                yield self.envelope(r)
            if len(rows) < page:
                return
            nxt = rows[-1].seq_nr + 1

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None:
        """Hard-delete events up to ``to_seq_nr``; the highest sequence number is kept."""
        validate_persistence_id(persistence_id)
        validate_seq_nr("to_seq_nr", to_seq_nr)
        await self.backend.delete_events_to(persistence_id, to_seq_nr)

    async def current_persistence_ids(self, entity_type: str | None = None) -> AsyncIterator[str]:
        """Every persistence id with stored events (optionally of one entity type), sorted, paged."""
        if entity_type is not None:
            validate_entity_type(entity_type)
        after: str | None = None
        page = self.settings.query.buffer_size
        while True:
            ids = await self.backend.persistence_ids(entity_type, after, page)
            for pid in ids:
                yield pid
            if len(ids) < page:
                return
            after = ids[-1]

    async def stored_manifests(self) -> list[StoredManifest]:
        """Which manifests and versions the stored events and snapshots have, with counts, and
        which of them this journal's serializers upcast (a scan: a tool's call)."""
        steps = self.serializers.upcasters.steps
        out = []
        for c in await self.backend.manifests():
            flags, ser_id, manifest = inner_manifest(c.ser_id, c.manifest)
            name, version = split_version(manifest)
            out.append(StoredManifest(c.kind, ser_id, name, version, c.rows, manifest in steps, flags))
        return sorted(out)

    async def forget(self, subject: str) -> bool:
        """Crypto-shredding: delete ``subject``'s encryption key for good. Its encrypted event
        payloads and snapshots read as :class:`~journal.codec.Forgotten` from then on (in other
        processes within ``codec.key_cache_ttl``), and nothing more can be written for it
        (:class:`SubjectForgotten`). Returns whether it had a key.

        Raises:
            ConfigurationError: this journal does not encrypt.
        """
        return await self._codec_for(subject).forget(subject)

    async def key_state(self, subject: str) -> KeyState:
        """What the key store holds for ``subject``: ``"kept"`` (a key: its payloads read),
        ``"forgotten"``, or ``"none"`` (nothing of it was ever encrypted; :meth:`forget` would
        only mark it forgotten ahead). ``journal forget`` asks it first, so that a mistyped
        subject is not reported as forgotten.

        Raises:
            ConfigurationError: this journal does not encrypt.
        """
        return await self._codec_for(subject).key_state(subject)

    def _codec_for(self, subject: str) -> PayloadCodec:
        codec = self.serializers.codec
        if codec is None or not codec.encrypts:
            raise ConfigurationError("this journal does not encrypt (codec.encrypt): there is no key to forget")
        if not isinstance(subject, str) or not subject or len(subject) > 255:
            raise InvalidArgument(f"subject must be a non-empty string of at most 255 characters, got {subject!r}")
        return codec

    def envelope(self, r: StoredEvent) -> EventEnvelope:
        """Deserialize a stored row into an envelope (offset: the pid's sequence number)."""
        return envelope_of(r, self.serializers, SeqOffset(r.seq_nr))

    # -- events by tag -----------------------------------------------------------------------

    def current_events_by_tag(self, tag: str, offset: Offset | uuid.UUID | None = None) -> AsyncIterator[EventEnvelope]:
        """Events tagged ``tag`` after ``offset`` (a :class:`TimeUUIDOffset`, exclusive; None: from
        ``tags.first_time_bucket``) up to now minus ``tags.eventual_consistency_delay``, then end.

        Each pid's events come in order, exactly once; offsets are TimeUUIDs.

        Raises:
            InvalidArgument: empty or too long tag; OffsetError: an offset of another kind.
            TagEventsMissing: a pid's tag numbering has a gap that did not fill in ``gap_timeout``.
        """
        from .tags.api import envelopes, tag_query

        return envelopes(tag_query(self.backend, self.settings, tag, offset, live=False), self.serializers)

    def events_by_tag(self, tag: str, offset: Offset | uuid.UUID | None = None) -> AsyncIterator[EventEnvelope]:
        """Like :meth:`current_events_by_tag`, but live: never ends, polls every
        ``tags.query_refresh_interval`` and back-tracks for late rows."""
        from .tags.api import envelopes, tag_query

        return envelopes(tag_query(self.backend, self.settings, tag, offset, live=True), self.serializers)

    # -- slice queries (logic in journal.query) ------------------------------------------------

    def _slice_queries(self, what: str) -> SliceQueries:
        if self._slices is None:
            try:
                reads = self.backend.slice_queries()
            except UnsupportedOperation as e:
                raise UnsupportedOperation(f"{what} is not supported on this backend: use events_by_tag") from e
            self._slices = SliceQueries(reads, self.settings, self.serializers)
        return self._slices

    def current_events_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | NoOffset | None = None,
        *,
        mode: QueryMode | None = None,
    ) -> AsyncIterator[EventEnvelope]:
        """Events of ``entity_type`` in slices ``[min_slice, max_slice]`` committed when the query
        started, ordered by (db_timestamp, seq_nr), paged by ``buffer_size``; ends when caught up.

        ``offset``: resume after a delivered envelope's ``TimestampOffset`` (events at its exact
        timestamp listed in ``seen`` are skipped). Each envelope's ``offset`` is where to resume.
        ``mode``: "horizon" (default) or "backtracking" (see README, "Slice queries").

        Raises (at call time, before any I/O): InvalidArgument for a bad entity type, slice range
        or mode; OffsetError for an offset of another kind; UnsupportedOperation on backends
        without slice queries.
        """
        start, m = check_slice_query(entity_type, min_slice, max_slice, offset, mode, self.settings.query.mode)
        return self._slice_queries("current_events_by_slices").current(entity_type, min_slice, max_slice, start, m)

    def events_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | NoOffset | None = None,
        *,
        mode: QueryMode | None = None,
        heartbeats: bool = False,
    ) -> AsyncIterator[EventEnvelope]:
        """The live version of :meth:`current_events_by_slices`: never ends.

        Woken at once by the write path's notifications, polling as the safety net. With
        ``heartbeats=True``, a quiet range yields envelopes with ``source="heartbeat"``,
        ``persistence_id=""``, ``seq_nr=0``, ``event=None`` and ``offset=TimestampOffset(T)``:
        every event of the range below T has been delivered. Survives connection loss (resumes
        from the last delivered offset). Raises like :meth:`current_events_by_slices`.
        """
        start, m = check_slice_query(entity_type, min_slice, max_slice, offset, mode, self.settings.query.mode)
        return self._slice_queries("events_by_slices").live(entity_type, min_slice, max_slice, start, m, heartbeats)

    def event_pages_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | NoOffset | None = None,
        *,
        mode: QueryMode | None = None,
        heartbeats: bool = False,
    ) -> AsyncIterator[list[EventEnvelope]]:
        """:meth:`events_by_slices` a page at a time (what it is built on): each item is a
        non-empty list of envelopes in delivery order, the caller's to keep; a heartbeat comes
        alone in its list. For a consumer that handles envelopes in batches (the projection
        runner): no hand-over per envelope. Raises like :meth:`current_events_by_slices`."""
        start, m = check_slice_query(entity_type, min_slice, max_slice, offset, mode, self.settings.query.mode)
        return self._slice_queries("events_by_slices").live_pages(
            entity_type, min_slice, max_slice, start, m, heartbeats
        )

    def current_events_by_slices_starting_from_snapshots(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | NoOffset | None = None,
        *,
        mode: QueryMode | None = None,
    ) -> AsyncIterator[EventEnvelope]:
        """:meth:`current_events_by_slices`, but each pid's latest snapshot comes instead of the
        events it covers: an envelope with ``source="snapshot"`` (``event`` the state, ``seq_nr``
        the snapshot's, ``db_timestamp`` and ``offset`` those of the first event it covers since
        the query's start, where it comes), then only the pid's events after it; pids without a
        snapshot get all their events; a snapshot saved after the catch-up began is not used. Every offset is
        safe to store and resume from (docs/projections.md, "Starting from snapshots").
        PostgreSQL, one database (else UnsupportedOperation); raises like
        :meth:`current_events_by_slices`."""
        start, m = check_slice_query(entity_type, min_slice, max_slice, offset, mode, self.settings.query.mode)
        return self._from_snapshots().current(entity_type, min_slice, max_slice, start, m)

    def events_by_slices_starting_from_snapshots(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | NoOffset | None = None,
        *,
        mode: QueryMode | None = None,
        heartbeats: bool = False,
    ) -> AsyncIterator[EventEnvelope]:
        """:meth:`current_events_by_slices_starting_from_snapshots` up to the bound taken when
        it starts, then live exactly as :meth:`events_by_slices` (events, no snapshots)."""
        return _flat(self.event_pages_by_slices_starting_from_snapshots(
            entity_type, min_slice, max_slice, offset, mode=mode, heartbeats=heartbeats
        ))  # fmt: skip

    def event_pages_by_slices_starting_from_snapshots(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | NoOffset | None = None,
        *,
        mode: QueryMode | None = None,
        heartbeats: bool = False,
    ) -> AsyncIterator[list[EventEnvelope]]:
        """:meth:`events_by_slices_starting_from_snapshots` a page at a time (as
        :meth:`event_pages_by_slices`)."""
        start, m = check_slice_query(entity_type, min_slice, max_slice, offset, mode, self.settings.query.mode)
        return self._from_snapshots().live_pages(entity_type, min_slice, max_slice, start, m, heartbeats)

    def _from_snapshots(self) -> FromSnapshots:
        what = "starting from snapshots"
        if self._starting_from_snapshots is None:
            reads = self.backend.snapshot_slice_reads()
            self._starting_from_snapshots = FromSnapshots(self._slice_queries(what), reads)
        return self._starting_from_snapshots

    async def horizon(self, entity_type: str | None = None) -> datetime:
        """A database timestamp below which no uncommitted event can still land (any entity
        type: ``entity_type`` is accepted for symmetry and validated). Every event with a
        db_timestamp below it is committed and visible to any query started afterwards."""
        if entity_type is not None:
            validate_entity_type(entity_type)
        return await self._slice_queries("horizon").horizon.bound()

    def events_by_persistence_id(self, persistence_id: str, from_seq_nr: int = 1) -> AsyncIterator[EventEnvelope]:
        """Live events of one pid from ``from_seq_nr`` on (offset: ``SequenceOffset(seq_nr)``); never ends."""
        validate_persistence_id(persistence_id)
        validate_seq_nr("from_seq_nr", from_seq_nr, minimum=1)
        return self._slice_queries("events_by_persistence_id").events_by_persistence_id(
            self.backend.read_events, persistence_id, from_seq_nr
        )

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        """The db_timestamp of one event, or None when it is not stored."""
        validate_persistence_id(persistence_id)
        validate_seq_nr("seq_nr", seq_nr, minimum=1)
        return await self._slice_queries("timestamp_of").backend.timestamp_of(persistence_id, seq_nr)

    async def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope | None:
        """One event with its payload (offset: its own TimestampOffset), or None."""
        validate_persistence_id(persistence_id)
        validate_seq_nr("seq_nr", seq_nr, minimum=1)
        sq = self._slice_queries("load_envelope")
        r = await sq.backend.load_event(persistence_id, seq_nr)
        if r is None:
            return None
        if self.serializers.keyed:
            _held = await self.serializers.load_keys([(r.persistence_id, r.ser_id)])
        return sq.envelope(r, TimestampOffset(r.db_timestamp, {r.persistence_id: r.seq_nr}))

    # -- snapshots ---------------------------------------------------------------------------

    async def save_snapshot(
        self,
        persistence_id: str,
        seq_nr: int,
        state: Any,
        *,
        tags: Sequence[str] = (),
        metadata: Any = None,
        keep: int = 1,
    ) -> None:
        """Store ``state`` as of ``seq_nr`` as the pid's newest snapshot.

        ``keep``: how many snapshots of the pid to keep (1: replace the previous one; more: the
        older ones stay, newest first, for :meth:`load_snapshots`; the oldest beyond go).
        """
        validate_persistence_id(persistence_id)
        validate_seq_nr("seq_nr", seq_nr)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise InvalidArgument(f"keep must be an int >= 1, got {keep!r}")
        clean_tags = validate_tags(tags)
        if self.serializers.keyed:
            _held = await self.serializers.load_write_keys((persistence_id,))
        ser = self.serializers.serialize(state, what=f"snapshot of {persistence_id!r}", pid=persistence_id)
        meta: Serialized | None = (
            self.serializers.serialize(metadata, what="snapshot metadata") if metadata is not None else None
        )
        await self.backend.save_snapshot(
            SnapshotRow(
                persistence_id=persistence_id,
                entity_type=entity_type_of(persistence_id),
                slice=slice_for(persistence_id),
                seq_nr=seq_nr,
                write_timestamp=int(time.time() * 1000),
                state=ser,
                tags=clean_tags,
                meta=meta,
            ),
            keep,
        )

    async def load_snapshot(self, persistence_id: str) -> Snapshot | None:
        """The pid's newest snapshot, or None."""
        row = await self.backend.load_snapshot(validate_persistence_id(persistence_id))
        if row is None:
            return None
        if self.serializers.keyed:
            _held = await self.serializers.load_keys([(row.persistence_id, row.state.ser_id)])
        return self._snapshot(row)

    async def load_snapshots(self, persistence_id: str, limit: int = 16) -> list[Snapshot | SerializationError]:
        """Up to ``limit`` snapshots of the pid, newest first; one that does not deserialize is
        returned as its :class:`SerializationError` (so a caller can fall back to an older one)."""
        validate_persistence_id(persistence_id)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit must be an int >= 1, got {limit!r}")
        out: list[Snapshot | SerializationError] = []
        rows = await self.backend.load_snapshots(persistence_id, limit)
        if self.serializers.keyed:
            _held = await self.serializers.load_keys((r.persistence_id, r.state.ser_id) for r in rows)
        for row in rows:
            try:
                out.append(self._snapshot(row))
            except SerializationError as e:
                out.append(e)
        return out

    def _snapshot(self, row: SnapshotRow) -> Snapshot:
        st, pid = row.state, row.persistence_id
        state = self.serializers.deserialize(st.ser_id, st.manifest, st.payload, what="snapshot", pid=pid)
        meta = (
            self.serializers.deserialize(row.meta.ser_id, row.meta.manifest, row.meta.payload, what="snapshot metadata")
            if row.meta
            else None
        )
        return Snapshot(
            persistence_id=row.persistence_id,
            seq_nr=row.seq_nr,
            state=state,
            write_timestamp=datetime.fromtimestamp(row.write_timestamp / 1000, UTC),
            tags=row.tags,
            metadata=meta,
        )

    async def delete_snapshot(self, persistence_id: str) -> None:
        await self.backend.delete_snapshot(validate_persistence_id(persistence_id))

    # -- durable state -----------------------------------------------------------------------

    def durable_state(self) -> DurableState:
        """The durable state store of this journal's database, on its pool and serializers
        (docs/durable-state.md).

        Raises:
            UnsupportedOperation: on Cassandra, or a partitioned journal (durable state needs
                one PostgreSQL database).
        """
        store = self.backend.durable_state_store()
        if self._durable_state is None:
            self._durable_state = DurableState(store, self.serializers, self.settings, self.backend.write_on)
        return self._durable_state


def resolve_dsn(dsn: str | None, settings: JournalSettings) -> str | None:
    """Explicit DSN, else the settings' (``JOURNAL_DSN``), else None (embedded). An explicit DSN
    that is empty or blank (``--dsn "$UNSET_VARIABLE"``) is refused, never taken for "embedded"."""
    if dsn is not None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigurationError(
                f"the DSN given is empty ({dsn!r}): give postgresql://... or cassandra://..., "
                "or give none at all for the embedded PostgreSQL"
            )
        return dsn
    return settings.connection.dsn or os.environ.get("JOURNAL_DSN") or None


@asynccontextmanager
async def open_journal(
    dsn: str | None = None,
    *,
    settings: JournalSettings | None = None,
    serializers: SerializerRegistry | None = None,
    migrate: bool | None = None,
    key_store: KeyStore | None = None,
    subject_of: Callable[[str], str] | None = None,
    **overrides: Any,
) -> AsyncIterator[Journal]:
    """Open a journal; close it (flushing queued writes) on exit.

    ``dsn``: a PostgreSQL DSN; when None, ``JOURNAL_DSN``; when that is unset too, an embedded
    PostgreSQL under ``data_dir`` (created and migrated on first use). ``migrate``: run the
    migrations at open (default: only for the embedded server). Other keywords override settings
    (``schema="x"``, ``buffer_size=500``, ...). ``key_store`` and ``subject_of``: where the
    encryption keys live (default: the backend's table) and whose key encrypts a persistence id's
    payloads (default: the pid's own), when ``codec.encrypt`` is on (docs/encryption.md).
    ``serializers`` and ``subject_of`` not given are loaded from the ``hooks`` settings when set
    (``JOURNAL_SERIALIZERS``, ``JOURNAL_UPCASTERS``, ``JOURNAL_SUBJECT_OF``: journal/hooks.py).
    """
    if settings is not None and overrides:
        raise ConfigurationError("pass either settings=... or keyword overrides, not both")
    settings = settings or JournalSettings.load(**overrides)
    serializers, subject_of = hooks.resolve(settings.hooks, serializers, subject_of)
    tracing.configure(settings.tracing.tracing_mode)
    backend, settings = await open_backend(resolve_dsn(dsn, settings), settings, migrate=migrate)
    try:
        journal = Journal(backend, settings, serializers, key_store=key_store, subject_of=subject_of)
    except BaseException:
        await backend.close()
        raise
    if settings.write.freeze_heap:
        runtime.freeze_heap()
    try:
        yield journal
    finally:
        await journal.close()


async def _flat(pages: AsyncIterator[list[EventEnvelope]]) -> AsyncIterator[EventEnvelope]:
    """A query's pages, one envelope at a time."""
    async for page in pages:
        for env in page:
            yield env
