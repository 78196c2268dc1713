"""Writes on Cassandra: the events of one call in one batch to one (persistence_id, partition_nr)
partition (:class:`~.partitions.PartitionLayout` says which); with ``single_writer_check`` the
batch is a lightweight transaction on that partition's static ``highest_sequence_nr``, so a second
writer of the same numbers gets SequenceConflict and nothing of its call is stored. Tag rows go
through the tag writers, composed above the seam and handed in (:class:`~journal.backend.TagRowWriter`);
a tagged call is answered when its own tag rows are written: it comes back
:class:`~journal.write_batch.WriteLater`, so a slow tag holds up no other call of its batch.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from datetime import datetime
from functools import partial
from typing import Any, NamedTuple, NoReturn

from ..backend import TaggedEvent, TagRowWriter, WriteCheck, check_rows
from ..buckets import bucket_of
from ..errors import InvalidArgument, JournalUnavailable, SequenceConflict, UnsupportedOperation
from ..serialization import Serialized
from ..timeuuid import datetime_of, new_timeuuids
from ..write_batch import BatchResult, ResultBuilder, WriteBatch, WriteLater
from .connections import CassandraConnections, execute
from .reads import CassandraReads

LATE_WRITE_RETRIES = 3
"""Attempts of a call without ``expected_seq_nr`` whose conditional write found late rows of this
journal's own earlier calls (each such call lands at most once)."""

KNOWN_STATES = 10_000
"""Pids whose write state this journal remembers after writing them (least recently written
forgotten first): their next call needs no read. A stale state is safe with the single-writer
check (the lightweight transaction fails: SequenceConflict); without it one writer per pid is
assumed anyway."""


class WriteState(NamedTuple):
    """A pid's highest stored number, and the ``highest_sequence_nr`` static column of the
    partition its next call goes to (None: not set), as read before a write."""

    highest: int
    guard: int | None


class Call(NamedTuple):
    """One call of a batch, as this backend writes it (one Cassandra batch per call)."""

    persistence_id: str
    expected_seq_nr: int | None
    events: list[Serialized]
    tags: tuple[str, ...]
    metadata: Serialized | None

    @staticmethod
    def of(batch: WriteBatch) -> list[Call]:
        return list(
            map(Call, batch.persistence_ids, batch.expected_seq_nrs, batch.serialized(), batch.tags, batch.metadata)
        )


class Stored(NamedTuple):
    """A call whose events are stored: its first number and first event's timestamp, and the
    write of its tag rows under way (None: untagged)."""

    first_seq_nr: int
    db_timestamp: datetime
    tagging: asyncio.Task[None] | None


class CassandraWrites(CassandraReads):
    """Event writes and deletes; remembers the write state of the pids it wrote last."""

    tag_writers: TagRowWriter
    """Set by the backend (the factory makes them over its tag store)."""

    def __init__(self, conns: CassandraConnections) -> None:
        super().__init__(conns)
        self.writer_id = conns.settings.write.writer_id or str(uuid.uuid4())
        self.write_cl = conns.write_cl
        self._states: OrderedDict[str, WriteState] = OrderedDict()
        self._pid_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._unlisted: set[str] = set()  # pids whose all_persistence_ids row may be missing
        self._tagging: dict[str, asyncio.Task[None]] = {}
        """Per pid: the tag rows of its last call being written (its next call waits for them)."""

    def forget(self, persistence_id: str) -> None:
        """Drop what this journal remembers of the pid's write state (its events were removed
        behind the journal's back, by the cleanup tool): the next call reads it again."""
        self._states.pop(persistence_id, None)

    async def write_batch(self, batch: WriteBatch) -> BatchResult:
        """Every call at once, each in its own Cassandra batch. A tagged call comes back
        :class:`~journal.write_batch.WriteLater` (its own): it is answered once its tag rows are
        written (or with their failure), while the batch's other calls are answered at once."""
        calls = Call.of(batch)
        results = await asyncio.gather(*(self._write_one(c) for c in calls), return_exceptions=True)
        out = ResultBuilder(len(calls))
        for i, r in enumerate(results):
            if isinstance(r, Stored):
                out.written(i, r.first_seq_nr, r.db_timestamp)
                if r.tagging is not None:
                    out.failed(i, WriteLater([i], partial(_when_tagged, r)))
            else:
                out.failed(i, r if isinstance(r, Exception) else JournalUnavailable(str(r)))
        return out.result()

    async def write_chunks(self, chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        """Every chunk checked first (Cassandra has no transaction to roll back), then written."""
        return [await self.write_batch(c) for c in list(chunks)]

    async def _write_one(self, r: Call) -> Stored:
        """One call: the pid's calls one at a time (in this journal), each from the state the last
        one left (read from the table when unknown, or when ``expected_seq_nr`` disagrees).

        The state is read *before* the tag writers recover the pid, and the recovery must have
        read every event up to it: a previous call of the pid whose outcome was unknown may land
        late, and a recovery that missed it would number the next tag row in its place (its tag
        row lost for good). One that lands after the state was read makes this call's
        conditional write fail (:meth:`_store`); a call without ``expected_seq_nr`` then appends
        after it (:meth:`_late_own_write`), any other gets SequenceConflict. Its tag rows are
        written in a task of their own (the result's ``tagging``), which the pid's next call
        waits for first."""
        pid = r.persistence_id
        self._check_size(r)
        lock = self._pid_locks.setdefault(pid, asyncio.Lock())
        async with lock:
            previous = self._tagging.get(pid)
            if previous is not None:  # (its outcome is its own call's)
                await asyncio.wait([previous])
            state = self._states.pop(pid, None)
            if state is not None and r.expected_seq_nr is not None and r.expected_seq_nr != state.highest:
                state = None
            for _ in range(LATE_WRITE_RETRIES):
                state = await self._ready(r, state)
                try:
                    first, stamps = await self._store(r, state)  # on any error the state is forgotten
                    break
                except SequenceConflict:
                    state = await self._late_own_write(r, state)
                    if state is None:
                        raise
            else:
                raise SequenceConflict(pid, r.expected_seq_nr, "late writes kept landing before this call")
            await self._list(r, first)
            last = first + len(r.events) - 1
            same = self.layout.write_partition(last + 1) == self.layout.write_partition(first)
            self._states[pid] = WriteState(last, last if same else None)
            if len(self._states) > KNOWN_STATES:
                self._states.popitem(last=False)
            tagging = None
            if r.tags:
                tagging = asyncio.get_running_loop().create_task(self._tag(r, first, stamps))
                self._tagging[pid] = tagging
                tagging.add_done_callback(partial(self._tagged, pid))
            return Stored(first, datetime_of(stamps[0]), tagging)

    def _tagged(self, pid: str, task: asyncio.Task[None]) -> None:
        if self._tagging.get(pid) is task:
            del self._tagging[pid]
        if not task.cancelled():
            task.exception()  # retrieved: its call's finish raises it

    async def _ready(self, r: Call, state: WriteState | None) -> WriteState:
        """The state the call is written from (read when unknown), with the pid's tag rows recovered
        up to it. Nothing of the call was sent yet, so a failure here is a known "not written"."""
        try:
            if state is None:
                state = await self.write_state(r.persistence_id)
            if r.tags:
                await self.tag_writers.ensure_recovered(r.persistence_id, state.highest)
            return state
        except JournalUnavailable as e:
            raise JournalUnavailable(str(e), outcome_unknown=False) from e

    async def _late_own_write(self, r: Call, state: WriteState) -> WriteState | None:
        """After a refused conditional write: the state to append from when the rows stored beyond
        ``state`` are all this journal's own (an earlier call of the pid whose outcome was unknown,
        landed late) and the call asked for no ``expected_seq_nr``; None when it must fail
        (another writer's rows, or a call that expected the old highest)."""
        if r.expected_seq_nr is not None:
            return None
        try:
            now = await self.write_state(r.persistence_id)
            gap = now.highest - state.highest
            rows = await self.read_rows(r.persistence_id, state.highest + 1, now.highest, gap) if gap > 0 else []
        except JournalUnavailable as e:  # the refused write stored nothing
            raise JournalUnavailable(str(e), outcome_unknown=False) from e
        if gap <= 0 or len(rows) != gap or any(row.writer_uuid != self.writer_id for row in rows):
            return None
        return now

    async def write_on(self, conn: Any, batch: WriteBatch) -> BatchResult:
        raise UnsupportedOperation("persist_in is not supported on the cassandra backend")

    async def check_write(self, batch: WriteBatch) -> list[WriteCheck]:
        """The rows at each call's numbers (``expected_seq_nr`` + 1 on): :func:`check_rows`."""
        out = []
        for c in Call.of(batch):
            if c.expected_seq_nr is None:
                raise InvalidArgument("check_write needs calls with expected_seq_nr")
            first, n = c.expected_seq_nr + 1, len(c.events)
            rows = await self.read_rows(c.persistence_id, first, first + n - 1, n)
            found = [(r.writer_uuid, bytes(r.event), datetime_of(r.timestamp)) for r in rows]
            out.append(check_rows([e.payload for e in c.events], self.writer_id, found))
        return out

    async def write_state(self, persistence_id: str) -> WriteState:
        """What a write of ``persistence_id`` starts from (read before the write)."""
        return WriteState(*await self.highest_and_guard(persistence_id))

    async def store(self, r: Call, state: WriteState) -> tuple[int, datetime]:
        """Write ``r`` after ``state.highest`` (:meth:`_store`), then its listing and tag rows."""
        first, stamps = await self._store(r, state)
        await self._list(r, first)
        if r.tags:
            await self._tag(r, first, stamps)
        return first, datetime_of(stamps[0])

    async def _store(self, r: Call, state: WriteState) -> tuple[int, list[uuid.UUID]]:
        """Write ``r``'s events after ``state.highest``, in one batch to one partition; with the
        check, only if that partition's ``highest_sequence_nr`` is still ``state.guard`` (a
        lightweight transaction: SequenceConflict and nothing stored when another writer came
        first). Returns its first number and its events' TimeUUIDs."""
        pid = r.persistence_id
        if r.expected_seq_nr is not None and r.expected_seq_nr != state.highest:
            raise SequenceConflict(pid, r.expected_seq_nr, "expected_seq_nr is not the stored highest sequence number")
        first = state.highest + 1
        batch, stamps = self._statement(r, first, state.guard)
        try:
            rows = await execute(self.conns.session, batch)
        except BaseException:
            # the events may be stored (outcome unknown) without their tag rows or listing:
            # the pid's next write recovers its tag rows and lists it
            self.tag_writers.forget(pid)
            if first == 1:
                self._unlisted.add(pid)
            raise
        if self.settings.cassandra.single_writer_check and rows and not rows[0][0]:
            # events this journal did not number may be there (a late write of its own): recover first
            self.tag_writers.forget(pid)
            raise SequenceConflict(
                pid, r.expected_seq_nr, f"another writer stored sequence numbers from {first} on meanwhile"
            )
        return first, stamps

    def _statement(self, r: Call, first: int, guard: int | None) -> tuple[Any, list[uuid.UUID]]:
        """The call's batch (to the partition of its first event) and its events' TimeUUIDs."""
        from cassandra.query import BatchStatement, BatchType

        pid, m, prepared = r.persistence_id, r.metadata, self.conns.prepared
        part = self.layout.write_partition(first)
        last = first + len(r.events) - 1
        batch = BatchStatement(batch_type=BatchType.UNLOGGED, consistency_level=self.write_cl)
        if self.settings.cassandra.single_writer_check:
            batch.add(prepared["guard_partition"], (last, pid, part, guard))
        else:
            batch.add(prepared["mark_partition"], (last, pid, part))
        meta = (m.ser_id, m.manifest, m.payload) if m else (None, None, None)
        stamps = new_timeuuids(len(r.events))
        for seq, (u, ev) in enumerate(zip(stamps, r.events, strict=True), first):
            bucket = str(bucket_of(u, self.settings.tags.bucket_size))
            row = (pid, part, seq, u, bucket, self.writer_id, ev.ser_id, ev.manifest, ev.payload, *meta)
            batch.add(prepared["insert_message"], (*row, set(r.tags) or None))
        return batch, stamps

    async def _list(self, r: Call, first: int) -> None:
        """A stored call's listing (a new pid); the events are stored, so a failure here is never
        "nothing written"."""
        pid = r.persistence_id
        if first == 1 or pid in self._unlisted:
            try:
                await self.run("insert_persistence_id", pid)
            except Exception as e:
                if r.tags:
                    self.tag_writers.forget(pid)
                _stored_but(pid, e)
            self._unlisted.discard(pid)

    async def _tag(self, r: Call, first: int, stamps: list[uuid.UUID]) -> None:
        """A stored call's tag rows; the events are stored, so a failure here is never "nothing
        written" (the pid's next call recovers them)."""
        pid = r.persistence_id
        try:
            await self.tag_writers.write([
                TaggedEvent(pid, seq, u, r.tags, ev, self.writer_id, r.metadata)
                for seq, (u, ev) in enumerate(zip(stamps, r.events, strict=True), first)
            ])  # fmt: skip
        except Exception as e:
            self.tag_writers.forget(pid)
            _stored_but(pid, e)

    def _check_size(self, r: Call) -> None:
        """Refuse, before any I/O, a call the server would refuse (or that breaks the layout)."""
        self.layout.check_call(r.persistence_id, len(r.events))
        meta = len(r.metadata.payload) + len(r.metadata.manifest) if r.metadata else 0
        size = sum(len(e.payload) + len(e.manifest) + meta for e in r.events)
        limit = self.settings.cassandra.max_write_bytes
        if size > limit:
            raise InvalidArgument(
                f"persist({r.persistence_id!r}) of {size} bytes: one call is one Cassandra request and mutation, "
                f"at most max_write_bytes={limit} (the server refuses larger requests and mutations)"
            )

    # -- reads -------------------------------------------------------------------------------

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None:
        done = await self.deleted_to(persistence_id)
        upto = min(to_seq_nr, await self.highest_seq_nr(persistence_id))
        if upto <= done:
            return
        await self.run("write_deleted_to", upto, persistence_id)
        for p in self.layout.delete_partitions(done + 1, upto):
            await self.run("delete_messages", persistence_id, p, upto)


def _stored_but(pid: str, e: Exception) -> NoReturn:
    """Raise what a call whose events are stored gets when a step after them failed."""
    if isinstance(e, JournalUnavailable) and e.outcome_unknown:  # a TagWriteTimeout says so already
        raise e
    raise JournalUnavailable(f"the events of {pid!r} are stored, but {e}", outcome_unknown=True) from e


async def _when_tagged(stored: Stored) -> BatchResult:
    """A tagged call's result once its tag rows are written (or their failure)."""
    assert stored.tagging is not None
    try:
        await stored.tagging
    except Exception as e:
        return BatchResult.failed(1, e)
    return BatchResult([stored.first_seq_nr], [stored.db_timestamp])
