"""The durable state store: one value per persistence id, written with a revision
(docs/durable-state.md). Get it from an open journal: ``journal.durable_state()``.

It validates and serializes above the backend seam (:class:`~journal.backend.DurableStateStore`),
as :class:`~journal.Journal` does for events: bad input is refused before anything is sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from itertools import repeat
from operator import attrgetter
from typing import Any, NamedTuple, cast

import msgspec

from .backend import DurableStateStore, StateColumn, StateRow, StoredState
from .backend import StateOutcome as RowOutcome
from .envelope import EventEnvelope
from .errors import InvalidArgument, JournalError, JournalUnavailable, RevisionConflict, SerializationError
from .ids import (
    MAX_SEQ_NR,
    entity_type_of,
    slice_for,
    validate_entity_type,
    validate_persistence_id,
    validate_seq_nr,
    validate_tags,
)
from .offsets import NoOffset, TimestampOffset
from .query.page_columns import DB_TIMESTAMP, ENTITY_TYPE, PAYLOAD, PID, SEQ_NR, SLICE, columns, offsets, payloads
from .query.slices import Page, SliceQueries
from .query.validation import check_slice_query
from .serialization import Serialized, SerializerRegistry
from .settings import JournalSettings, QueryMode
from .state_columns import AdditionalColumn, StateColumns
from .write_batch import BatchResult, WriteBatch
from .write_validation import WriteValidator, entity_types_of, plain_pids


class State(NamedTuple):
    """A pid's stored state: its ``value`` at ``revision`` (``deleted``: a tombstone, ``value``
    None; the next write of the pid is ``revision + 1``)."""

    persistence_id: str
    revision: int
    value: Any
    deleted: bool
    db_timestamp: datetime
    tags: tuple[str, ...]


class StateWrite(NamedTuple):
    """One part of :meth:`DurableState.upsert_many`: what one :meth:`~DurableState.upsert` takes."""

    persistence_id: str
    revision: int
    value: Any
    tags: Sequence[str] = ()


class StateWritten(msgspec.Struct, frozen=True, gc=False):
    """A state written: the pid is at ``revision`` since ``db_timestamp``. Read its fields by name
    (it is not a tuple), as :class:`journal.Written`'s."""

    persistence_id: str
    revision: int
    db_timestamp: datetime


StateOutcome = StateWritten | JournalError
"""Per part of :meth:`DurableState.upsert_many`: :class:`StateWritten`, or the error of that part
alone (:class:`RevisionConflict`; nothing of it was written)."""


class UpdatedState(NamedTuple):
    """A change by slices: the pid's state ``value`` at ``revision`` (the latest when read)."""

    persistence_id: str
    revision: int
    value: Any
    offset: TimestampOffset
    db_timestamp: datetime
    entity_type: str
    slice: int


class DeletedState(NamedTuple):
    """A change by slices: the pid's state was deleted at ``revision`` (its tombstone)."""

    persistence_id: str
    revision: int
    offset: TimestampOffset
    db_timestamp: datetime
    entity_type: str
    slice: int


StateChange = UpdatedState | DeletedState
"""What changes by slices deliver: the latest revision of every changed pid, a delete as its own kind."""

ChangeHandler = Callable[[Any, StateChange], Awaitable[None]]
"""``handler(conn, change)``: called in the upsert's transaction, on its connection (asyncpg)."""

WriteOn = Callable[[Any, WriteBatch], Awaitable[BatchResult]]


class DurableState:
    """The ``durable_state`` table of an open journal (PostgreSQL): get by id, upsert with a
    revision, delete (a tombstone) and hard delete.

    A write at revision 1 inserts; at revision n it updates only a row at n - 1; anything else is
    a :class:`RevisionConflict` naming the revision found, and nothing is written. So of two
    writers of one revision, exactly one wins.
    """

    def __init__(
        self, store: DurableStateStore, serializers: SerializerRegistry, settings: JournalSettings, write_on: WriteOn
    ) -> None:
        self._partitioned = bool(settings.partitions.databases)
        self._store = store
        self._serializers = serializers
        self._settings = settings
        self._max_bytes = settings.write.max_event_bytes
        self._queries: SliceQueries | None = None
        self._write_on = write_on
        self._validator = WriteValidator(serializers, settings.write.max_event_bytes)
        self._handlers: dict[str, list[ChangeHandler]] = {}
        self._events: dict[str, Callable[[StateChange], Any]] = {}
        self._columns = StateColumns()

    def add_change_handler(self, entity_type: str, handler: ChangeHandler) -> None:
        """Call ``await handler(conn, change)`` for every change of ``entity_type`` written from
        now on, in the upsert's transaction and on its connection (write a query model there: it
        commits with the state, or neither does). Called once per change written, in the order
        of the parts; never for a refused revision. What it raises rolls the upsert back and
        propagates (nothing written)."""
        validate_entity_type(entity_type)
        self._handlers.setdefault(entity_type, []).append(handler)

    def write_change_events(self, entity_type: str, to_event: Callable[[StateChange], Any]) -> None:
        """Write ``to_event(change)`` to the journal for every change of ``entity_type``, in the
        upsert's transaction, as the pid's event with the revision as its sequence number: every
        change is then a plain events-by-slices query. The pid's events must follow its revisions
        (a pid with other events, or hard deleted and written again, gets a SequenceConflict and
        nothing is written)."""
        validate_entity_type(entity_type)
        self._events[entity_type] = to_event

    async def add_columns(self, *columns: AdditionalColumn) -> None:
        """Write ``column.bind(change)`` to each additional column for every change of its
        entity type from now on, in the upsert's transaction (docs/durable-state.md, "Additional
        columns"). Checked here, before any write: a column or table that the database (every
        database of a partitioned journal) lacks, a table of its own without ``persistence_id``
        as its key, or a bad name raise ConfigurationError naming it, and none is added."""
        checked = self._columns.checked(columns, self._partitioned)
        await self._store.check_columns([StateColumn(c.table, c.column) for c in checked])
        self._columns.add(checked)

    async def close(self) -> None:
        """Stop the changes queries' listener (the journal does it when it closes)."""
        if self._queries is not None:
            await self._queries.close()

    async def get(self, persistence_id: str) -> State | None:
        """The pid's state and revision, or None when it has no row (never written, or hard deleted).
        The value of a forgotten subject's state is a :class:`~journal.codec.Forgotten`."""
        row = await self._store.get_state(validate_persistence_id(persistence_id))
        if row is None:
            return None
        if self._serializers.keyed and row.state is not None:
            _held = await self._serializers.load_keys([(row.persistence_id, row.state.ser_id)])
        return self._state(row)

    async def upsert(self, persistence_id: str, revision: int, value: Any, *, tags: Sequence[str] = ()) -> StateWritten:
        """Store ``value`` as the pid's state at ``revision``.

        Raises:
            InvalidArgument: a bad pid or tags, a revision below 1, a value over
                ``write.max_event_bytes`` serialized (nothing sent).
            SerializationError: the value cannot be serialized (nothing sent).
            SubjectForgotten: the journal encrypts and the pid's subject was forgotten (nothing sent).
            RevisionConflict: the pid is not at ``revision - 1`` (1: it has a row); nothing written.
            JournalUnavailable: the database could not be reached. An upsert whose answer was
                lost is read back: written (returned), a RevisionConflict, or known not written
                (``outcome_unknown`` False: upsert it again); ``outcome_unknown`` True only when
                that cannot be told (docs/durable-state.md).
        """
        if self._serializers.keyed:  # held until sealed (in _row)
            _held = await self._serializers.load_write_keys((validate_persistence_id(persistence_id),))
        return _raised(await self._write([self._row(persistence_id, revision, value, tags, "")], [value]))

    async def delete(self, persistence_id: str, revision: int) -> StateWritten:
        """Delete the pid's state at ``revision`` (the next one after the stored): a tombstone row
        keeps the revision, so the pid's next write is ``revision + 1`` and changes by slices
        deliver the delete. Raises as :meth:`upsert`."""
        pid = validate_persistence_id(persistence_id)
        if self._serializers.keyed and entity_type_of(pid) in self._events:  # the change event is sealed
            _held = await self._serializers.load_write_keys((pid,))
        return _raised(await self._write([self._row(pid, revision, None, (), "")], [None]))

    async def hard_delete(self, persistence_id: str) -> bool:
        """Remove the pid's row altogether (True: there was one). Its revisions start again at 1,
        and changes by slices never deliver it: prefer :meth:`delete` while projections follow."""
        return await self._store.hard_delete_state(validate_persistence_id(persistence_id))

    async def upsert_many(self, writes: Iterable[StateWrite | tuple[Any, ...]]) -> list[StateOutcome]:
        """Upsert many pids in one statement (one round trip, not the group commit: see
        docs/durable-state.md), each part checked on its own. Returns one outcome per part, in
        order: :class:`StateWritten` or its :class:`RevisionConflict`; the other parts are written
        regardless.

        Raises (before anything is sent): InvalidArgument for a bad part or a pid in two parts,
        SerializationError for a value that cannot be serialized; the message names the part.
        """
        given = list(writes)
        plain = self._plain_rows(given)
        if plain is not None:
            return await self._write(*plain)
        parts = [_part(i, part) for i, part in enumerate(given)]
        seen: set[str] = set()
        for i, write in enumerate(parts):
            try:
                pid = validate_persistence_id(write.persistence_id)
            except InvalidArgument as e:
                raise InvalidArgument(f"part {i}: {e}") from e
            if pid in seen:
                raise InvalidArgument(f"part {i}: {pid!r} is in two parts of one upsert_many")
            seen.add(pid)
        if self._serializers.keyed:  # held until sealed (in _row)
            _held = await self._serializers.load_write_keys(seen)
        rows = [self._row(w.persistence_id, w.revision, w.value, w.tags, f"part {i}: ") for i, w in enumerate(parts)]
        return await self._write(rows, [w.value for w in parts]) if rows else []

    async def delete_tombstones(self, before: datetime, *, dry_run: bool = False) -> int:
        """Delete the tombstones (deleted states) written before ``before``, timezone-aware; how
        many (``dry_run``: how many would be, deleting nothing). A pid whose tombstone is gone has
        no row: its revisions start again at 1, and changes by slices do not deliver its delete
        to a query that had not read it yet: pick ``before`` older than any follower's lag.
        ``journal cleanup delete-state-tombstones`` runs it."""
        if not isinstance(before, datetime) or before.tzinfo is None:
            raise InvalidArgument(f"before must be a timezone-aware datetime, got {before!r}")
        return await self._store.delete_tombstones(before, dry_run=dry_run)

    # -- changes by slices ----------------------------------------------------------------------

    def current_changes_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | NoOffset | None = None,
        *,
        mode: QueryMode | None = None,
    ) -> AsyncIterator[StateChange]:
        """The changed states of ``entity_type`` in slices ``[min_slice, max_slice]`` committed
        when the query started, in (db_timestamp, revision) order; ends when caught up.

        Guaranteed: the latest revision of every pid changed after ``offset`` (resume after a
        delivered change's ``offset``); intermediate revisions may be skipped, and a pid updated
        while the query runs may come again with its newer revision. A delete comes as a
        :class:`DeletedState`. ``mode``: "horizon" (default) or "backtracking", as the events'
        slice queries. Raises like :meth:`journal.Journal.current_events_by_slices`.
        """
        start, m = check_slice_query(entity_type, min_slice, max_slice, offset, mode, self._settings.query.mode)
        return self._current_changes(
            self._slice_queries().current_row_pages(entity_type, min_slice, max_slice, start, m)
        )

    def changes_by_slices(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        offset: TimestampOffset | NoOffset | None = None,
        *,
        mode: QueryMode | None = None,
    ) -> AsyncIterator[StateChange]:
        """The live version of :meth:`current_changes_by_slices`: never ends. It polls every
        ``query.refresh_interval`` (state writes send no notification)."""
        start, m = check_slice_query(entity_type, min_slice, max_slice, offset, mode, self._settings.query.mode)
        return self._changes(self._slice_queries().live_pages(entity_type, min_slice, max_slice, start, m, False))

    def change_envelopes(
        self, entity_type: str, min_slice: int, max_slice: int, offset: TimestampOffset | None, mode: QueryMode
    ) -> AsyncIterator[EventEnvelope]:
        """The live changes as the projection runner reads them: envelopes with the revision as
        their ``seq_nr`` (a delete without payload, :func:`state_change` makes each a change), and
        heartbeats (``source == "heartbeat"``) when the range is idle."""
        return self._slice_queries().live(entity_type, min_slice, max_slice, offset, mode, True)

    def _slice_queries(self) -> SliceQueries:
        if self._queries is None:
            self._queries = SliceQueries(self._store.changes(), self._settings, self._serializers)
        return self._queries

    async def _current_changes(self, pages: AsyncIterator[Page]) -> AsyncIterator[StateChange]:
        async for page in pages:
            for change in page_changes(page, self._serializers):
                yield change

    async def _changes(self, pages: AsyncIterator[list[EventEnvelope]]) -> AsyncIterator[StateChange]:
        async for page in pages:
            for change in map(state_change, page):
                yield change

    async def _write(self, rows: Sequence[StateRow], values: Sequence[Any]) -> list[StateOutcome]:
        types = set(map(_ENTITY_TYPE, rows))
        watched = any(t in self._handlers or t in self._events or t in self._columns for t in types)
        if not watched:
            return _outcomes(rows, await self._store.upsert_states(rows))

        # a partitioned store hands each database's rows on their own: find each row's value by its pid
        value_of = {r.persistence_id: v for r, v in zip(rows, values, strict=True)}  # a pid is in one part

        async def in_transaction(conn: Any, written: Sequence[StateRow], answers: list[RowOutcome]) -> None:
            for row, answer in zip(written, answers, strict=True):
                if isinstance(answer, datetime):
                    await self._changed(conn, _change(row, value_of[row.persistence_id], answer))

        return _outcomes(rows, await self._store.upsert_states(rows, in_transaction))

    async def _changed(self, conn: Any, change: StateChange) -> None:
        values = self._columns.values(change)
        if values:
            await self._store.write_columns(conn, change.persistence_id, values)
        to_event = self._events.get(change.entity_type)
        if to_event is not None:
            batch = self._validator.call(change.persistence_id, [to_event(change)], change.revision - 1)
            await self._write_on(conn, batch)
        for handler in self._handlers.get(change.entity_type, ()):
            await handler(conn, change)

    def _plain_rows(self, parts: Sequence[object]) -> tuple[list[StateRow], Sequence[Any]] | None:
        """The rows of the commonest bulk upsert, checked and serialized a column at a time:
        untagged values (no deletes) of distinct pids at revisions that pass their rules, given
        as ``(pid, revision, value)`` tuples or untagged :class:`StateWrite`, on a journal
        without a codec. None for anything else, or for any part that fails a rule: those are
        checked part by part (:meth:`_row`), which names the part that fails."""
        columns = _untagged_columns(parts) if parts and self._serializers.codec is None else None
        if columns is None:
            return None
        pids, revisions, values = columns
        kinds = set(map(type, revisions))
        if not plain_pids(pids) or len(set(pids)) != len(pids) or kinds != {int}:
            return None
        if min(revisions) < 1 or max(revisions) > MAX_SEQ_NR or None in values:
            return None
        try:
            ser_ids, manifests, payloads = self._serializers.serialize_events(values, pids)
        except SerializationError:
            return None
        if 0 in ser_ids or max(map(len, payloads)) > self._max_bytes:
            return None
        states = map(tuple.__new__, repeat(Serialized), zip(ser_ids, manifests, payloads, strict=True))
        # tuple.__new__ over zipped columns builds each NamedTuple in C (as page_changes does)
        fields = zip(pids, entity_types_of(pids), map(slice_for, pids), revisions, states, repeat(()))
        return cast(list[StateRow], list(map(tuple.__new__, repeat(StateRow), fields))), values

    def _row(self, pid: Any, revision: Any, value: Any, tags: Any, where: str) -> StateRow:
        try:
            pid = validate_persistence_id(pid)
            revision = validate_seq_nr("revision", revision, minimum=1)
            clean_tags = validate_tags(tags)
            ser = None
            if value is not None:
                ser = self._serializers.serialize(value, what=f"state of {pid!r}", pid=pid)  # sealed by a codec
                if ser.ser_id == 0:
                    raise SerializationError(f"serializer id 0 marks a deleted state: {pid!r} needs another")
                if len(ser.payload) > self._max_bytes:
                    raise InvalidArgument(
                        f"state of {pid!r} is {len(ser.payload):,} bytes serialized, above "
                        f"write.max_event_bytes ({self._max_bytes:,})"
                    )
        except InvalidArgument as e:
            if not where:
                raise
            raise InvalidArgument(f"{where}{e}") from e
        except SerializationError as e:
            if not where:
                raise
            raise SerializationError(f"{where}{e}") from e
        return StateRow(pid, entity_type_of(pid), slice_for(pid), revision, ser, clean_tags)

    def _state(self, row: StoredState) -> State:
        st = row.state
        value = (
            None
            if st is None
            else self._serializers.deserialize(st.ser_id, st.manifest, st.payload, what="state", pid=row.persistence_id)
        )
        return State(row.persistence_id, row.revision, value, st is None, row.db_timestamp, row.tags)


def state_change(e: EventEnvelope) -> StateChange:
    """A change read by slices (an envelope of the ``durable_state`` query: the revision as its
    ``seq_nr``, a delete without payload) as the change it is."""
    offset = e.offset
    assert type(offset) is TimestampOffset
    pid, rev, ts, et, sl = e.persistence_id, e.seq_nr, e.db_timestamp, e.entity_type, e.slice
    if e.has_payload:
        return UpdatedState(pid, rev, e.event, offset, ts, et, sl)
    return DeletedState(pid, rev, offset, ts, et, sl)


def page_changes(page: Page, serializers: SerializerRegistry) -> list[StateChange]:
    """The changes of one page of ``durable_state`` rows (a pid's revision as its ``seq_nr``,
    a delete without payload), built a column at a time (:mod:`journal.query.page_columns`):
    what :func:`state_change` of each row's envelope gives, without the envelopes."""
    cols = columns(page.rows)
    pids, revisions, stamps, data = cols[PID], cols[SEQ_NR], cols[DB_TIMESTAMP], cols[PAYLOAD]
    at = offsets(page.base, stamps, pids, revisions)
    values = payloads(serializers, cols)
    # tuple.__new__ over zipped columns builds each NamedTuple in C (its own __new__ is a Python
    # call, twice the cost a change)
    fields = zip(pids, revisions, values, at, stamps, cols[ENTITY_TYPE], cols[SLICE], strict=True)
    changes = cast(list[StateChange], list(map(tuple.__new__, repeat(UpdatedState), fields)))
    if None in data:
        for i, payload in enumerate(data):
            if payload is None:
                changes[i] = DeletedState(pids[i], revisions[i], at[i], stamps[i], cols[ENTITY_TYPE][i], cols[SLICE][i])
    return changes


def _untagged_columns(parts: Sequence[object]) -> tuple[tuple[Any, ...], ...] | None:
    """The pid, revision and value columns of parts that are all ``(pid, revision, value)``
    tuples or all untagged :class:`StateWrite`; None for any other mix."""
    shapes = set(map(type, parts))
    if shapes == {tuple} and set(map(len, cast(list[tuple[Any, ...]], parts))) == {3}:
        return tuple(zip(*cast(list[tuple[Any, ...]], parts), strict=True))
    if shapes == {StateWrite}:
        pids, revisions, values, tags = zip(*cast(list[StateWrite], parts), strict=True)
        return None if any(tags) else (pids, revisions, values)
    return None


def _part(i: int, part: object) -> StateWrite:
    if type(part) is StateWrite:
        return part
    if not isinstance(part, tuple) or not 3 <= len(part) <= 4:
        raise InvalidArgument(
            f"part {i}: a StateWrite or a (persistence_id, revision, value[, tags]) tuple, got {part!r}"
        )
    return StateWrite(*part)


_ENTITY_TYPE = attrgetter("entity_type")


def _outcomes(rows: Sequence[StateRow], answers: list[RowOutcome]) -> list[StateOutcome]:
    """Each row's outcome; when every row was written, built a column at a time in C."""
    if set(map(type, answers)) == {datetime}:
        pids, revisions = map(attrgetter("persistence_id"), rows), map(attrgetter("revision"), rows)
        return list(map(StateWritten, pids, revisions, cast(list[datetime], answers)))
    return [_outcome(r, a) for r, a in zip(rows, answers, strict=True)]


def _outcome(row: StateRow, answer: RowOutcome) -> StateOutcome:
    if isinstance(answer, datetime):
        return StateWritten(row.persistence_id, row.revision, answer)
    if isinstance(answer, JournalUnavailable):  # an answer lost, resolved as known not written
        return answer
    return RevisionConflict(row.persistence_id, row.revision, answer)


def _change(row: StateRow, value: Any, db_timestamp: datetime) -> StateChange:
    offset = TimestampOffset(db_timestamp, {row.persistence_id: row.revision})
    pid, rev, et, sl = row.persistence_id, row.revision, row.entity_type, row.slice
    if row.state is None:
        return DeletedState(pid, rev, offset, db_timestamp, et, sl)
    return UpdatedState(pid, rev, value, offset, db_timestamp, et, sl)


def _raised(outcomes: list[StateOutcome]) -> StateWritten:
    (outcome,) = outcomes
    if isinstance(outcome, JournalError):
        raise outcome
    return outcome
