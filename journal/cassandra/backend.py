"""Journal storage on Cassandra (DataStax cassandra-driver), composed, not derived from Postgres.

The driver is callback based: :func:`_run` bridges ``execute_async`` to asyncio futures. Every
statement is prepared once, reads with ``read_consistency`` and writes with ``write_consistency``
(settings). The events of one call go in one batch to one (persistence_id, partition_nr)
partition (:class:`~journal.cassandra.partitions.PartitionLayout` says which); with
``single_writer_check`` the batch is a lightweight transaction on that partition's static
``highest_sequence_nr``, so a second writer of the same numbers gets SequenceConflict and
nothing of its call is stored. Tag rows go through the tag writers (one per tag).
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from ..backend import (
    Backend,
    ReplicationStore,
    SliceQueryBackend,
    SnapshotRow,
    StoredEvent,
    TaggedEvent,
    TagRowWriter,
    TagStore,
    WriteCheck,
    WriteRequest,
    WriteResult,
    check_rows,
)
from ..buckets import bucket_of
from ..errors import (
    ConfigurationError,
    InvalidArgument,
    JournalUnavailable,
    SequenceConflict,
    StorageError,
    UnsupportedOperation,
)
from ..serialization import Serialized
from ..settings import JournalSettings
from ..timeuuid import datetime_of, new_timeuuid
from .cleanup import CassandraCleanup
from .cql import statements, validate_keyspace
from .partitions import PartitionCursor, PartitionLayout
from .session import build_cluster, consistency, is_read
from .tag_store import CassandraTagStore


def parse_target(target: str) -> tuple[list[str], int, str]:
    """``cassandra://host1,host2[:port]/keyspace`` -> (contact points, port, keyspace)."""
    parts = urlsplit(target)
    if parts.scheme != "cassandra" or not parts.netloc:
        raise ConfigurationError(f"expected cassandra://host1,host2/keyspace, got {target!r}")
    port = 9042
    hosts = []
    for h in parts.netloc.split(","):
        host, _, p = h.partition(":")
        if p:
            port = int(p)
        hosts.append(host)
    keyspace = validate_keyspace(parts.path.strip("/") or "akka")
    return hosts, port, keyspace


async def _run(session: Any, stmt: Any, params: Sequence[Any] | None = None) -> list[Any]:
    """execute_async -> asyncio, every page of the result.

    The driver calls ``add_callbacks``' callback on its own event thread with ONE page of rows
    (5000 by default); when ``has_more_pages`` is set, ``start_fetching_next_page()`` fetches the
    next one and the same callbacks run again. Results settle on our loop through
    ``call_soon_threadsafe`` (a loop closed meanwhile is ignored: nobody awaits any more).
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[Any]] = loop.create_future()
    rows: list[Any] = []
    rf = session.execute_async(stmt, params)

    def settle(exc: BaseException | None) -> None:
        if fut.done():  # cancelled by the awaiting side
            return
        if exc is not None:
            fut.set_exception(_map(exc))
        else:
            fut.set_result(rows)

    def to_loop(exc: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(settle, exc)
        except RuntimeError:  # the loop is closed
            pass

    def ok(page: Any) -> None:
        rows.extend(page or ())
        if rf.has_more_pages and not fut.done():
            rf.start_fetching_next_page()
        else:
            to_loop(None)

    def err(exc: BaseException) -> None:
        to_loop(exc)

    rf.add_callbacks(ok, err)
    return await fut


_SENT = {"WriteTimeout", "WriteFailure", "OperationTimedOut", "ConnectionShutdown", "ConnectionBusy"}
"""Driver errors after which a statement may have reached a replica: a write's outcome is unknown."""
_NOT_SENT = {"Unavailable", "ReadTimeout", "ReadFailure", "OverloadedErrorMessage", "IsBootstrappingErrorMessage"}
"""Coordinator refusals and read failures: nothing was written."""


def _map(exc: BaseException) -> BaseException:
    """Driver errors into the library's tree (one place). ``outcome_unknown`` is set when the
    statement may have been applied: a timeout, or a connection lost while it was in flight
    (also when NoHostAvailable wraps one); a host that was down or refused the connection, or a
    coordinator that answered Unavailable, means it was not."""
    from cassandra import RequestValidationException
    from cassandra.cluster import NoHostAvailable
    from cassandra.connection import ConnectionException

    name = type(exc).__name__
    if isinstance(exc, NoHostAvailable):
        inner = list((exc.errors or {}).values())
        if inner and all(type(e).__name__ == "AuthenticationFailed" for e in inner):
            return ConfigurationError(f"cassandra: authentication failed: {exc}")
        sent = any(type(e).__name__ in _SENT for e in inner)
        return JournalUnavailable(f"cassandra: {name}: {exc}", outcome_unknown=sent)
    if name in _SENT:
        return JournalUnavailable(f"cassandra: {name}: {exc}", outcome_unknown=True)
    if name in _NOT_SENT or isinstance(exc, ConnectionException | OSError):
        return JournalUnavailable(f"cassandra: {name}: {exc}", outcome_unknown=False)
    if isinstance(exc, RequestValidationException):  # the server refused the statement: nothing applied
        return StorageError(f"cassandra: {name}: {exc}")
    return exc


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


class CassandraBackend:
    name = "cassandra"

    def __init__(
        self,
        contact_points: list[str],
        port: int,
        keyspace: str,
        settings: JournalSettings,
        tag_writers: Callable[[TagStore], TagRowWriter],
    ) -> None:
        """``tag_writers``: makes the tag writers over this backend's tag store (composed above the
        seam by :func:`journal.backends.open_backend`)."""
        self.contact_points, self.port, self.keyspace = contact_points, port, keyspace
        self.settings = settings
        self.writer_id = settings.write.writer_id or str(uuid.uuid4())
        self.layout = PartitionLayout(settings.cassandra.target_partition_size)
        self.write_cl = consistency(settings.cassandra.write_consistency)
        self.cql = statements(keyspace)
        self.session: Any = None
        self._cluster: Any = None
        self.prepared: dict[str, Any] = {}
        self._tag_store = CassandraTagStore(self)
        self._states: OrderedDict[str, WriteState] = OrderedDict()
        self._pid_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._unlisted: set[str] = set()  # pids whose all_persistence_ids row may be missing
        self.tag_writers = tag_writers(self._tag_store)

    async def start(self) -> None:
        s = self.settings.cassandra
        self._cluster = build_cluster(self.contact_points, self.port, s)
        read_cl = consistency(s.read_consistency)
        try:
            self.session = await asyncio.to_thread(self._cluster.connect)
            for name, text in self.cql.items():
                stmt = await asyncio.to_thread(self.session.prepare, text)
                stmt.consistency_level = read_cl if is_read(text) else self.write_cl
                self.prepared[name] = stmt
            self._check_datacenter(s.local_datacenter)
        except Exception as e:
            error = self._open_error(e)
            await self.close()
            raise error from e
        await self._tag_store.ensure_bucket_size(self.settings.tags.bucket_size)

    def _open_error(self, e: Exception) -> BaseException:
        """Why opening failed, in the library's terms."""
        if isinstance(e, ConfigurationError):
            return e
        try:  # a local datacenter with no node: the driver connects to nothing at all
            self._check_datacenter(self.settings.cassandra.local_datacenter)
        except ConfigurationError as bad:
            return bad
        if "highest_sequence_nr" in str(e):
            return ConfigurationError(
                f"{self.keyspace}.messages lacks the single-writer check's static column: run "
                f"ALTER TABLE {self.keyspace}.messages ADD highest_sequence_nr bigint static"
            )
        if type(e).__name__ == "InvalidRequest":  # "keyspace x does not exist", "unconfigured table"
            return ConfigurationError(
                f"keyspace {self.keyspace!r} or its tables are missing ({e}): create them (development: "
                f"journal cassandra-schema --create --keyspace {self.keyspace})"
            )
        return _map(e)

    def _check_datacenter(self, dc: str | None) -> None:
        """A local datacenter that no node belongs to would route nothing: refused at open."""
        known = {h.datacenter for h in self._cluster.metadata.all_hosts()}
        if dc is not None and dc not in known:
            raise ConfigurationError(f"cassandra local_datacenter {dc!r} is not one of the cluster's: {sorted(known)}")

    async def close(self) -> None:
        await self.tag_writers.close()
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.shutdown)
            self._cluster = None

    def tag_store(self) -> CassandraTagStore:
        return self._tag_store

    def slice_queries(self) -> SliceQueryBackend:
        raise UnsupportedOperation("slice queries are not supported on the cassandra backend: use events_by_tag")

    def replication_store(self, location: str) -> ReplicationStore:
        raise UnsupportedOperation("replicated logs are not supported on the cassandra backend")

    async def info(self) -> dict[str, Any]:
        """The server release, the keyspace, and the stored events per entity type (a scan of
        every persistence id: a tool's call, not a hot path)."""
        rows = await _run(self.session, "SELECT release_version FROM system.local")
        events: dict[str, int] = {}
        for pid in await self.persistence_ids(None, None, 2**31):
            if "|" not in pid:
                continue
            n = await self.highest_seq_nr(pid) - await self._deleted_to(pid)
            if n > 0:
                et = pid.split("|", 1)[0]
                events[et] = events.get(et, 0) + n
        return {
            "server_version": rows[0].release_version if rows else None,
            "keyspace": self.keyspace,
            "events": dict(sorted(events.items())),
        }

    def cleanup_store(self) -> CassandraCleanup:
        """The cleanup tool's deletions (:mod:`journal.cleanup`)."""
        return CassandraCleanup(self)

    def forget(self, persistence_id: str) -> None:
        """Drop what this journal remembers of the pid's write state (its events were removed
        behind the journal's back, by the cleanup tool): the next call reads it again."""
        self._states.pop(persistence_id, None)

    async def run(self, name: str, *params: Any) -> list[Any]:
        return await _run(self.session, self.prepared[name], params)

    # -- writes ------------------------------------------------------------------------------

    async def write_batch(self, requests: Sequence[WriteRequest]) -> list[WriteResult | Exception]:
        results = await asyncio.gather(*(self._write_one(r) for r in requests), return_exceptions=True)
        return [r if isinstance(r, WriteResult | Exception) else JournalUnavailable(str(r)) for r in results]

    async def _write_one(self, r: WriteRequest) -> WriteResult:
        """One call: the pid's calls one at a time (in this journal), each from the state the last
        one left (read from the table when unknown, or when ``expected_seq_nr`` disagrees)."""
        pid = r.persistence_id
        self._check_size(r)
        lock = self._pid_locks.setdefault(pid, asyncio.Lock())
        async with lock:
            state = self._states.pop(pid, None)
            try:
                if r.tags:
                    await self.tag_writers.ensure_recovered(pid)
                if state is None or (r.expected_seq_nr is not None and r.expected_seq_nr != state.highest):
                    state = await self.write_state(pid)
            except JournalUnavailable as e:  # nothing of this call was sent yet
                raise JournalUnavailable(str(e), outcome_unknown=False) from e
            result = await self.store(r, state)  # on any error the state is forgotten
            last = result.first_seq_nr + len(r.events) - 1
            same = self.layout.write_partition(last + 1) == self.layout.write_partition(result.first_seq_nr)
            self._states[pid] = WriteState(last, last if same else None)
            if len(self._states) > KNOWN_STATES:
                self._states.popitem(last=False)
            return result

    async def write_on(self, conn: Any, request: WriteRequest) -> WriteResult:
        raise UnsupportedOperation("persist_in is not supported on the cassandra backend")

    async def check_write(self, request: WriteRequest) -> WriteCheck:
        """The rows at the request's numbers (``expected_seq_nr`` + 1 on): :func:`check_rows`."""
        if request.expected_seq_nr is None:
            raise InvalidArgument("check_write needs a request with expected_seq_nr")
        first = request.expected_seq_nr + 1
        rows = await self.read_rows(request.persistence_id, first, first + len(request.events) - 1, len(request.events))
        return check_rows(
            request, self.writer_id, [(r.writer_uuid, bytes(r.event), datetime_of(r.timestamp)) for r in rows]
        )

    async def write_state(self, persistence_id: str) -> WriteState:
        """What a write of ``persistence_id`` starts from (read before the write)."""
        return WriteState(*await self._highest_and_guard(persistence_id))

    async def store(self, r: WriteRequest, state: WriteState) -> WriteResult:
        """Write ``r`` after ``state.highest``, in one batch to one partition; with the check, only
        if that partition's ``highest_sequence_nr`` is still ``state.guard`` (a lightweight
        transaction: SequenceConflict and nothing stored when another writer came first)."""
        from cassandra.query import BatchStatement, BatchType

        pid = r.persistence_id
        highest, guard = state
        if r.expected_seq_nr is not None and r.expected_seq_nr != highest:
            raise SequenceConflict(pid, r.expected_seq_nr, "expected_seq_nr is not the stored highest sequence number")
        first = highest + 1
        last = first + len(r.events) - 1
        part = self.layout.write_partition(first)
        check = self.settings.cassandra.single_writer_check
        batch = BatchStatement(batch_type=BatchType.UNLOGGED, consistency_level=self.write_cl)
        if check:
            batch.add(self.prepared["guard_partition"], (last, pid, part, guard))
        else:
            batch.add(self.prepared["mark_partition"], (last, pid, part))
        tagged: list[TaggedEvent] = []
        m = r.metadata
        stamps = []
        for i, ev in enumerate(r.events):
            u = new_timeuuid()
            stamps.append(u)
            seq = first + i
            batch.add(self.prepared["insert_message"], (
                pid, part, seq, u, str(bucket_of(u, self.settings.tags.bucket_size)), self.writer_id,
                ev.ser_id, ev.manifest, ev.payload, m.ser_id if m else None, m.manifest if m else None,
                m.payload if m else None, set(r.tags) or None,
            ))  # fmt: skip
            if r.tags:
                tagged.append(TaggedEvent(pid, seq, u, r.tags, ev, self.writer_id, m))
        try:
            rows = await _run(self.session, batch)
        except BaseException:
            # the events may be stored (outcome unknown) without their tag rows or listing:
            # the pid's next write recovers its tag rows and lists it
            self.tag_writers.forget(pid)
            if first == 1:
                self._unlisted.add(pid)
            raise
        if check and rows and not rows[0][0]:
            raise SequenceConflict(
                pid, r.expected_seq_nr, f"another writer stored sequence numbers from {first} on meanwhile"
            )
        try:
            if first == 1 or pid in self._unlisted:
                await self.run("insert_persistence_id", pid)
                self._unlisted.discard(pid)
            if tagged:
                await self.tag_writers.write(tagged)
        except Exception as e:  # the events are stored: never report "nothing written" now
            if r.tags:
                self.tag_writers.forget(pid)
            if isinstance(e, JournalUnavailable) and e.outcome_unknown:  # a TagWriteTimeout says so already
                raise
            raise JournalUnavailable(f"the events of {pid!r} are stored, but {e}", outcome_unknown=True) from e
        return WriteResult(first, datetime_of(stamps[0]))

    def _check_size(self, r: WriteRequest) -> None:
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

    async def _deleted_to(self, pid: str) -> int:
        rows = await self.run("read_deleted_to", pid)
        return int(rows[0].deleted_to or 0) if rows else 0

    async def highest_seq_nr(self, persistence_id: str) -> int:
        return (await self._highest_and_guard(persistence_id))[0]

    async def _highest_and_guard(self, persistence_id: str) -> tuple[int, int | None]:
        """The highest stored number, and the static ``highest_sequence_nr`` of the partition the
        next call goes to (what the single-writer check expects to find unchanged). Partitions
        before the one of ``deleted_to + 1`` may be empty (deleted); the scan ends past the last
        partition that may hold ``highest + 1`` (:meth:`PartitionLayout.may_hold`)."""
        cursor = PartitionCursor(self.layout, await self._deleted_to(persistence_id) + 1)
        guards: dict[int, int | None] = {}
        while cursor.more():
            rows = await self.run("highest_in_partition", persistence_id, cursor.partition)
            guards[cursor.partition] = rows[0].highest_sequence_nr if rows else None
            cursor.advance(rows[0].sequence_nr if rows else None)
        highest = cursor.next_seq_nr - 1
        return highest, guards.get(self.layout.write_partition(highest + 1))

    async def read_events(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[StoredEvent]:
        return [_event(x) for x in await self.read_rows(persistence_id, from_seq_nr, to_seq_nr, limit)]

    async def read_rows(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[Any]:
        """Raw messages rows (with their timeuuid), partition after partition, from the partition of
        ``from_seq_nr`` on while a partition may still hold the next number."""
        cursor = PartitionCursor(self.layout, max(from_seq_nr, await self._deleted_to(persistence_id) + 1))
        out: list[Any] = []
        while len(out) < limit and cursor.next_seq_nr <= to_seq_nr and cursor.more():
            rows = await self.run(
                "read_messages", persistence_id, cursor.partition, cursor.next_seq_nr, to_seq_nr, limit - len(out)
            )
            out.extend(rows)
            cursor.advance(int(rows[-1].sequence_nr) if rows else None)
        return out

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None:
        done = await self._deleted_to(persistence_id)
        upto = min(to_seq_nr, await self.highest_seq_nr(persistence_id))
        if upto <= done:
            return
        await self.run("write_deleted_to", upto, persistence_id)
        for p in self.layout.delete_partitions(done + 1, upto):
            await self.run("delete_messages", persistence_id, p, upto)

    async def persistence_ids(self, entity_type: str | None, after: str | None, limit: int) -> list[str]:
        """A full scan of all_persistence_ids, sorted here (fine for tools, not a hot path)."""
        rows = await self.run("all_persistence_ids")
        ids = sorted(
            r.persistence_id for r in rows
            if (after is None or r.persistence_id > after)
            and (entity_type is None or (r.persistence_id.split("|", 1)[0] == entity_type and "|" in r.persistence_id))
        )  # fmt: skip
        return ids[:limit]

    # -- snapshots ---------------------------------------------------------------------------

    async def save_snapshot(self, row: SnapshotRow, keep: int = 1) -> None:
        m = row.meta
        if keep > 1:  # the table keeps a row per snapshot: insert, then drop all but the newest
            await self._insert_snapshot(row, m)
            seqs = [r.sequence_nr for r in await self.run("snapshot_seq_nrs", row.persistence_id)]
            seqs = sorted((s for s in seqs if s <= row.seq_nr), reverse=True)
            if len(seqs) > keep:
                await self.run("delete_snapshots_below", row.persistence_id, seqs[keep - 1])
            return
        await self.run("delete_snapshots", row.persistence_id)
        await self._insert_snapshot(row, m)

    async def _insert_snapshot(self, row: SnapshotRow, m: Serialized | None) -> None:
        await self.run(
            "insert_snapshot", row.persistence_id, row.seq_nr, row.write_timestamp, row.state.ser_id,
            row.state.manifest, row.state.payload, m.ser_id if m else None, m.manifest if m else None,
            m.payload if m else None,
        )  # fmt: skip

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None:
        rows = await self.run("load_snapshot", persistence_id)
        return _snapshot_row(persistence_id, rows[0]) if rows else None

    async def load_snapshots(self, persistence_id: str, limit: int) -> list[SnapshotRow]:
        """The pid's snapshots, newest first."""
        rows = await self.run("load_snapshots", persistence_id)
        return [_snapshot_row(persistence_id, r) for r in list(rows)[:limit]]

    async def delete_snapshot(self, persistence_id: str) -> None:
        await self.run("delete_snapshots", persistence_id)


def _snapshot_row(persistence_id: str, r: Any) -> SnapshotRow:
    from ..ids import entity_type_of, slice_for

    meta = _meta(r)
    return SnapshotRow(
        persistence_id=persistence_id, entity_type=entity_type_of(persistence_id), slice=slice_for(persistence_id),
        seq_nr=r.sequence_nr, write_timestamp=r.timestamp or int(time.time() * 1000),
        state=Serialized(r.ser_id, r.ser_manifest, bytes(r.snapshot_data)), meta=meta,
    )  # fmt: skip


def _meta(x: Any) -> Serialized | None:
    if x.meta_ser_id is None:
        return None
    return Serialized(x.meta_ser_id, x.meta_ser_manifest or "", bytes(x.meta or b""))


def _event(x: Any) -> StoredEvent:
    from ..ids import entity_type_of, slice_for

    meta = _meta(x)
    return StoredEvent(
        persistence_id=x.persistence_id, entity_type=entity_type_of(x.persistence_id),
        slice=slice_for(x.persistence_id), seq_nr=x.sequence_nr, db_timestamp=datetime_of(x.timestamp),
        ser_id=x.ser_id, ser_manifest=x.ser_manifest, payload=bytes(x.event), writer=x.writer_uuid,
        tags=tuple(sorted(x.tags or ())), meta=meta,
    )  # fmt: skip


_check: type[Backend] = CassandraBackend
"""mypy checks here that the backend implements the whole seam."""
