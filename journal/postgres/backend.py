"""The PostgreSQL backend (asyncpg on every hot path)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from ..backend import SnapshotRow, StoredEvent, WriteRequest, WriteResult
from ..buckets import bucket_millis
from ..errors import ConfigurationError, JournalUnavailable, SequenceConflict, StorageError
from ..serialization import JSON_SERIALIZER_ID, Serialized
from ..settings import JournalSettings
from .cleanup import PostgresCleanup
from .dsn import asyncpg_dsn
from .errors import backoff_delays, is_transient, with_retries
from .slice_reader import PostgresSliceReader
from .statements import SLICE_GROUP_SIZE, Statements
from .tag_statements import TagStatements
from .tag_store import PostgresTagStore
from .timestamp_rule import MARK_WRITER_LOCAL_SQL
from .writer_connections import WriterConnections

log = logging.getLogger("journal.postgres")

DELETE_BATCH_SIZE = 10_000


def row_to_event(r: asyncpg.Record, *, with_payload: bool = True) -> StoredEvent:
    """One event_journal row (columns of ``Statements.event_columns``) as a StoredEvent."""
    meta = None
    if r["meta_ser_id"] is not None:
        meta = Serialized(r["meta_ser_id"], r["meta_ser_manifest"] or "", bytes(r["meta_payload"] or b""))
    return StoredEvent(
        persistence_id=r["persistence_id"],
        entity_type=r["entity_type"],
        slice=r["slice"],
        seq_nr=r["seq_nr"],
        db_timestamp=r["db_timestamp"],
        ser_id=r["event_ser_id"],
        ser_manifest=r["event_ser_manifest"],
        payload=bytes(r["event_payload"]) if with_payload else None,
        writer=r["writer"],
        tags=tuple(r["tags"] or ()),
        meta=meta,
        deleted=r["deleted"],
    )


class PostgresBackend:
    """Journal storage on PostgreSQL. SQL lives in :mod:`journal.postgres.statements`."""

    name = "postgres"

    def __init__(self, dsn: str, settings: JournalSettings) -> None:
        self.dsn = asyncpg_dsn(dsn)
        self.settings = settings
        self.sql = Statements(settings.schema)
        self.writer_id = settings.write.writer_id or str(uuid.uuid4())
        self._pool: asyncpg.Pool | None = None
        self._writers: WriterConnections | None = None
        self._insert = self.sql.insert_events(on_conflict_do_nothing=False, notify=settings.write.notify)
        self._insert_probe = self.sql.insert_events(on_conflict_do_nothing=True, notify=settings.write.notify)
        self._insert_one = self.sql.insert_one(notify=settings.write.notify)
        self.tag_sql = TagStatements(settings.schema)
        self._notify = settings.write.notify
        bucket = self.sql.tag_bucket_param(self._notify)
        self._insert_tagged = self.sql.insert_events_tagged(
            on_conflict_do_nothing=False, notify=self._notify,
            tag_rows=self.tag_sql.insert_from_events("src", "$9", bucket, ""),
        )  # fmt: skip
        self._insert_tagged_probe = self.sql.insert_events_tagged(
            on_conflict_do_nothing=True, notify=self._notify,
            tag_rows=self.tag_sql.insert_from_events("src", "$9", bucket, "ON CONFLICT DO NOTHING"),
        )  # fmt: skip
        self._bucket_millis = bucket_millis(settings.tags.bucket_size)
        self._tag_store: PostgresTagStore | None = None
        # Slice queries (SliceQueryBackend): composed, delegated below.
        self.slices = PostgresSliceReader(lambda: self.pool, self.dsn, settings, row_to_event)
        self.read_slice_page = self.slices.read_slice_page
        self.read_slice_rows = self.slices.read_slice_rows
        self.next_slice_timestamp = self.slices.next_slice_timestamp
        self.horizon_reading = self.slices.horizon_reading
        self.db_now = self.slices.db_now
        self.timestamp_of = self.slices.timestamp_of
        self.load_event = self.slices.load_event
        self.listen = self.slices.listen

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        c = self.settings.connection

        async def connect() -> asyncpg.Pool:
            return await asyncpg.create_pool(
                self.dsn,
                min_size=c.pool_min_size,
                max_size=c.pool_max_size,
                timeout=c.connect_timeout,
                command_timeout=None,
            )

        self._pool = await with_retries("connect", self.settings.retry, connect)
        self._writers = WriterConnections(self.dsn, c.connect_timeout, f"slice-journal writer {self.writer_id}"[:63])
        try:
            table = await self._fetchval("connect", "SELECT to_regclass($1)", f'"{self.settings.schema}".event_journal')
        except BaseException:
            await self.close()
            raise
        if table is None:
            await self.close()
            raise ConfigurationError(
                f"no event_journal table in schema {self.settings.schema!r}: run `journal migrate` "
                "(or `alembic upgrade head`) against this database first"
            )
        await self.tag_store().ensure_bucket_size(self.settings.tags.bucket_size)

    def tag_store(self) -> PostgresTagStore:
        """The tag view store (events by tag and the tag writer run over it)."""
        if self._tag_store is None:
            self._tag_store = PostgresTagStore(self)
        return self._tag_store

    def cleanup_store(self) -> PostgresCleanup:
        """The cleanup tool's deletions (:mod:`journal.cleanup`)."""
        return PostgresCleanup(self)

    def _statement(self, batch: Sequence[WriteRequest], *, probe: bool) -> tuple[str, tuple[Any, ...]]:
        """The untagged statement (fast path), the one that also writes tag rows, or a lone event's."""
        if not probe and len(batch) == 1 and len(batch[0].events) == 1 and not batch[0].tags:
            r, ev, m = batch[0], batch[0].events[0], batch[0].metadata
            return self._insert_one, (
                r.slice, r.entity_type, r.persistence_id, r.expected_seq_nr, ev.ser_id, ev.manifest, ev.payload,
                self.writer_id, m.ser_id if m else None, m.manifest if m else None, m.payload if m else None,
            )  # fmt: skip
        params = self._params(batch)
        if any(r.tags for r in batch):
            return (self._insert_tagged_probe if probe else self._insert_tagged), (*params, self._bucket_millis)
        return (self._insert_probe if probe else self._insert), params

    async def close(self) -> None:
        if self._writers is not None:
            await self._writers.close()
            self._writers = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise JournalUnavailable("the journal is not open")
        return self._pool

    @property
    def writers(self) -> WriterConnections:
        if self._writers is None:
            raise JournalUnavailable("the journal is not open")
        return self._writers

    async def _fetch(self, what: str, query: str, *args: Any) -> list[asyncpg.Record]:
        async def op() -> list[asyncpg.Record]:
            return await self.pool.fetch(query, *args)

        return await with_retries(what, self.settings.retry, op)

    async def _fetchval(self, what: str, query: str, *args: Any) -> Any:
        async def op() -> Any:
            return await self.pool.fetchval(query, *args)

        return await with_retries(what, self.settings.retry, op)

    # -- writes ------------------------------------------------------------------------------

    def _params(self, requests: Sequence[WriteRequest]) -> tuple[Any, ...]:
        """Parallel per-event arrays for the insert statement.

        Arrays that would hold only NULLs, 1s or empty manifests (tags, metadata, ordinals of
        one-event calls, JSON serializer ids: the common case) are sent empty: a multi-argument unnest pads them with
        NULLs, the statement reads those as the default, and asyncpg skips encoding every element.
        With notifications on, the last parameter is the distinct notification payloads.
        """
        if any(len(r.events) > 1 for r in requests):
            rr: Sequence[WriteRequest] = [r for r in requests for _ in r.events]
            evs = [ev for r in requests for ev in r.events]
            ordinals = [i for r in requests for i in range(1, len(r.events) + 1)]
        else:  # one event per call, the common case: no per-row tuples
            rr, evs, ordinals = requests, [r.events[0] for r in requests], []
        tags: list[str | None] = []
        meta_ids: list[int | None] = []
        meta_manifests: list[str | None] = []
        meta_payloads: list[bytes | None] = []
        if any(r.tags for r in requests):
            tag_json = {id(r): json.dumps(list(r.tags)) if r.tags else None for r in requests}
            tags = [tag_json[id(r)] for r in rr]
        if any(r.metadata is not None for r in requests):
            metas = [r.metadata for r in rr]
            meta_ids = [m.ser_id if m else None for m in metas]
            meta_manifests = [m.manifest if m else None for m in metas]
            meta_payloads = [m.payload if m else None for m in metas]
        ser_ids: list[int] = [ev.ser_id for ev in evs]
        if ser_ids.count(JSON_SERIALIZER_ID) == len(ser_ids):
            ser_ids = []
        notify: tuple[list[str], ...] = ()
        if self._notify:
            notify = (list({f"{r.slice // SLICE_GROUP_SIZE}:{r.entity_type}" for r in requests}),)
        return (
            [r.persistence_id for r in rr],
            [r.entity_type for r in rr],
            [r.slice for r in rr],
            ordinals,
            [r.expected_seq_nr for r in rr],
            ser_ids,
            [ev.manifest for ev in evs] if any(ev.manifest for ev in evs) else [],
            [ev.payload for ev in evs],
            self.writer_id,
            tags,
            meta_ids,
            meta_manifests,
            meta_payloads,
            *notify,
        )

    async def write_batch(
        self, requests: Sequence[WriteRequest], *, interruptions: int = 0
    ) -> list[WriteResult | Exception]:
        """One multi-row statement for the whole batch; conflicts isolate the failing calls.

        Fast path: a single autocommit INSERT (atomic). If it hits a unique violation, a probe
        run in a rolled-back transaction (ON CONFLICT DO NOTHING) finds which calls conflict;
        those fail with SequenceConflict and the rest are written again. If the connection breaks
        mid-statement, the calls found not written are sent again (a bounded number of times).
        """
        results: dict[int, WriteResult | Exception] = {}
        pending = list(range(len(requests)))
        for _ in range(8):
            if not pending:
                break
            batch = [requests[i] for i in pending]
            try:
                written, resend = await self._insert_batch(batch)
            except asyncpg.exceptions.PostgresError as e:
                if isinstance(e, asyncpg.exceptions.UniqueViolationError) and len(pending) == 1:
                    results[pending[0]] = _conflict(batch[0], "another writer took these sequence numbers")
                    pending = []
                    continue
                if not isinstance(e, asyncpg.exceptions.UniqueViolationError):
                    # Some call poisons the statement: write each call alone so only it fails.
                    for i, res in zip(pending, await self._write_each(batch, e), strict=True):
                        results[i] = res
                    pending = []
                    continue
                probed = await self._probe_batch(batch)
                failed = {i for i in pending if not _complete(requests[i], probed)}
                for i in failed:
                    results[i] = _conflict(requests[i], "another writer took these sequence numbers")
                pending = [i for i in pending if i not in failed]
                continue
            to_resend = {id(r) for r in resend}
            retry = [i for i in pending if id(requests[i]) in to_resend]
            for i in pending:
                r = requests[i]
                got = written.get(r.persistence_id)
                if id(r) in to_resend:
                    continue
                if got is not None and got[1] == len(r.events):
                    results[i] = WriteResult(got[0], got[2])
                else:
                    results[i] = _conflict(r, "expected_seq_nr is not the stored highest sequence number")
            if retry:
                if interruptions + 1 >= self.settings.retry.attempts:
                    for i in retry:
                        results[i] = JournalUnavailable(
                            f"write of {requests[i].persistence_id!r} was interrupted {interruptions + 1} times; "
                            "it is known not to be stored"
                        )
                else:
                    again = await self.write_batch([requests[i] for i in retry], interruptions=interruptions + 1)
                    results.update(zip(retry, again, strict=True))
            pending = []
        for i in pending:
            results[i] = _conflict(requests[i], "kept conflicting")
        return [results[i] for i in range(len(requests))]

    async def write_on(self, conn: asyncpg.Connection, request: WriteRequest) -> WriteResult:
        """Write one request on the caller's connection (inside its transaction, if any)."""
        stmt, params = self._statement([request], probe=False)
        if conn.is_in_transaction():  # the database's rule trigger (if installed) skips these rows
            await conn.execute(MARK_WRITER_LOCAL_SQL)
        try:
            rows = await conn.fetch(stmt, *params)
        except asyncpg.exceptions.UniqueViolationError as e:
            raise _conflict(request, "another writer took these sequence numbers") from e
        got = _by_pid(rows).get(request.persistence_id)
        if got is None or got[1] != len(request.events):
            raise _conflict(request, "expected_seq_nr is not the stored highest sequence number")
        return WriteResult(got[0], got[2])

    def _release(self, conn: asyncpg.Connection, *, broken: bool = False) -> None:
        """Give a write connection back; one in an unknown state is closed, never used again."""
        self.writers.give_back(conn, broken=broken)

    async def _write_each(self, batch: Sequence[WriteRequest], cause: Exception) -> list[WriteResult | Exception]:
        if len(batch) == 1:
            return [StorageError(f"write of {batch[0].persistence_id!r} failed: {cause}")]
        out: list[WriteResult | Exception] = []
        for r in batch:
            out.extend(await self.write_batch([r]))
        return out

    async def _insert_batch(self, batch: Sequence[WriteRequest]) -> tuple[dict[str, _Written], list[WriteRequest]]:
        """The atomic autocommit insert, with the database's outcome made known.

        A failure before the statement was sent is retried. After a failure once it was sent, the
        server process is waited for (:meth:`_wait_until_settled`) and the rows are checked
        (:meth:`_resolve_unknown`): returns the calls written, and those known not to be written.
        """
        stmt, params = self._statement(batch, probe=False)
        delays = iter(backoff_delays(self.settings.retry))
        while True:
            try:
                conn = await self.writers.take()
            except Exception as e:
                delay = next(delays, None)
                if not is_transient(e):
                    raise
                if delay is None:
                    raise _unavailable("write", e) from e
                await asyncio.sleep(delay)
                continue
            server_pid = conn.get_server_pid()
            try:
                rows = await conn.fetch(stmt, *params)
            except Exception as e:
                if not is_transient(e):
                    self._release(conn)
                    raise
                self._release(conn, broken=True)
                log.warning("write interrupted (%s), resolving its outcome", e)
                await self._wait_until_settled(server_pid)
                return await self._resolve_unknown(batch)
            except BaseException:  # cancelled mid-statement: the connection's state is unknown
                self._release(conn, broken=True)
                raise
            self._release(conn)  # the write is done, whatever happens to the connection now
            return _by_pid(rows), []

    async def _probe_batch(self, batch: Sequence[WriteRequest]) -> dict[str, _Written]:
        """Which calls would be written in full? (ON CONFLICT DO NOTHING, always rolled back.)"""

        async def op() -> dict[str, _Written]:
            async with self.pool.acquire() as conn:
                tr = conn.transaction()
                await tr.start()
                try:
                    stmt, params = self._statement(batch, probe=True)
                    return _by_pid(await conn.fetch(stmt, *params))
                finally:
                    await tr.rollback()

        return await with_retries("write (conflict probe)", self.settings.retry, op)

    async def _wait_until_settled(self, server_pid: int, patience: float = 10.0) -> None:
        """Wait until the interrupted statement's server process is no longer running it.

        A client that lost its connection cannot tell whether the server is still executing the
        statement; reading the rows before that ends could see "not written" for a write that
        commits a moment later. Once the process is idle or gone its transaction is final. If it
        is still busy after ``patience`` seconds it is terminated (only a process of this journal's
        own write connections, found by application_name), which rolls the statement back; its row
        leaves pg_stat_activity only after the abort.
        """
        app = self.writers.application_name

        async def op() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + patience
            async with self.pool.acquire() as c:
                while await c.fetchval(self.sql.writer_busy, server_pid, app):
                    if loop.time() > deadline:
                        await c.fetchval(self.sql.terminate_writer, server_pid, app)
                        deadline = loop.time() + patience
                    await asyncio.sleep(0.01)

        try:
            await with_retries("settle an interrupted write", self.settings.retry, op)
        except JournalUnavailable as e:
            raise JournalUnavailable(str(e), outcome_unknown=True) from e

    async def _resolve_unknown(
        self, batch: Sequence[WriteRequest]
    ) -> tuple[dict[str, _Written], list[WriteRequest]]:
        """The connection died mid-write. Find out, for each call, whether it committed.

        A call that gave ``expected_seq_nr`` can be checked exactly: its rows are there with
        our writer id and the same payloads (it committed), or no row is there (it did not: it is
        sent again), or another writer's rows are there (a conflict). Calls without it cannot be
        told apart from another writer's, so they fail with ``JournalUnavailable(outcome_unknown=True)``.
        Returns the calls found written and those to send again.
        """
        out: dict[str, _Written] = {}
        resend: list[WriteRequest] = []
        for r in batch:
            if r.expected_seq_nr is None:
                raise JournalUnavailable(
                    f"write of {r.persistence_id!r} was interrupted and its outcome is unknown "
                    "(pass expected_seq_nr to let the journal resolve it)",
                    outcome_unknown=True,
                )
            first, last = r.expected_seq_nr + 1, r.expected_seq_nr + len(r.events)
            try:
                rows = await self._fetch("resolve write", self.sql.written_check, r.persistence_id, first, last)
            except JournalUnavailable as e:
                raise JournalUnavailable(str(e), outcome_unknown=True) from e
            mine = [x for x in rows if x["writer"] == self.writer_id]
            if len(mine) == len(r.events) and all(
                bytes(x["event_payload"]) == ev.payload for x, ev in zip(mine, r.events, strict=True)
            ):
                out[r.persistence_id] = (first, len(r.events), mine[0]["db_timestamp"])
            elif not rows:
                resend.append(r)
            # else: another writer's rows are there: the call is reported as a conflict
        return out, resend

    # -- reads -------------------------------------------------------------------------------

    async def highest_seq_nr(self, persistence_id: str) -> int:
        return int(await self._fetchval("highest_seq_nr", self.sql.highest_seq_nr, persistence_id))

    async def read_events(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[StoredEvent]:
        rows = await self._fetch(
            "read events", self.sql.events_by_pid, persistence_id, from_seq_nr, to_seq_nr, limit
        )
        return [row_to_event(r) for r in rows]

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None:
        """Hard delete in batches; the highest event stays as a tombstone (deleted=true)."""

        async def op() -> None:
            async with self.pool.acquire() as conn, conn.transaction():
                highest = await conn.fetchval(self.sql.highest_seq_nr, persistence_id)
                upto = min(to_seq_nr, highest)
                if upto <= 0:
                    return
                keep_tombstone = upto == highest
                limit_to = upto - 1 if keep_tombstone else upto
                while True:
                    status = await conn.execute(self.sql.delete_batch, persistence_id, limit_to, DELETE_BATCH_SIZE)
                    if int(status.split()[-1]) < DELETE_BATCH_SIZE:
                        break
                if keep_tombstone:
                    await conn.execute(self.sql.tombstone, persistence_id, upto)

        await with_retries("delete events", self.settings.retry, op)

    async def persistence_ids(self, entity_type: str | None, after: str | None, limit: int) -> list[str]:
        if entity_type is None:
            rows = await self._fetch("persistence ids", self.sql.persistence_ids, after or "", limit)
        else:
            rows = await self._fetch(
                "persistence ids", self.sql.persistence_ids_by_type, after or "", limit, entity_type
            )
        return [r[0] for r in rows]

    # -- snapshots ---------------------------------------------------------------------------

    async def save_snapshot(self, row: SnapshotRow, keep: int = 1) -> None:
        m = row.meta
        args = (
            row.slice, row.entity_type, row.persistence_id, row.seq_nr, row.write_timestamp,
            row.state.ser_id, row.state.manifest, row.state.payload, list(row.tags) or None,
            m.ser_id if m else None, m.manifest if m else None, m.payload if m else None,
        )  # fmt: skip

        async def op() -> None:
            if keep <= 1:
                await self.pool.execute(self.sql.replace_snapshot, *args)
                return
            pid, seq = row.persistence_id, row.seq_nr
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(self.sql.keep_previous_snapshot, pid, seq)
                await conn.execute(self.sql.upsert_snapshot, *args)
                await conn.execute(self.sql.prune_older_snapshots, pid, seq, keep - 1)

        await with_retries("save snapshot", self.settings.retry, op)

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None:
        rows = await self._fetch("load snapshot", self.sql.load_snapshot, persistence_id)
        return _snapshot_row(rows[0]) if rows else None

    async def load_snapshots(self, persistence_id: str, limit: int) -> list[SnapshotRow]:
        """The pid's snapshots, newest first (the current one, then older ones kept)."""
        newest = await self.load_snapshot(persistence_id)
        if newest is None or limit <= 1:
            return [newest] if newest is not None else []
        rows = await self._fetch(
            "load older snapshots", self.sql.load_older_snapshots, persistence_id, limit - 1
        )
        return [newest, *(_snapshot_row(r) for r in rows if r["seq_nr"] < newest.seq_nr)]

    async def delete_snapshot(self, persistence_id: str) -> None:
        async def op() -> None:
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(self.sql.delete_snapshot, persistence_id)
                await conn.execute(self.sql.delete_older_snapshots, persistence_id)

        await with_retries("delete snapshot", self.settings.retry, op)

    # -- info --------------------------------------------------------------------------------

    async def info(self) -> dict[str, Any]:
        async with self.pool.acquire() as conn:
            version = await conn.fetchval("SHOW server_version")
            counts = await conn.fetch(self.sql.event_counts)
            try:
                rev = await conn.fetchval(
                    f'SELECT version_num FROM "{self.settings.schema}".slice_journal_alembic_version'
                )
            except asyncpg.exceptions.UndefinedTableError:
                rev = None
        return {"server_version": version, "schema_revision": rev, "events": {r[0]: r[1] for r in counts}}


def _snapshot_row(r: asyncpg.Record) -> SnapshotRow:
    meta = None
    if r["meta_ser_id"] is not None:
        meta = Serialized(r["meta_ser_id"], r["meta_ser_manifest"] or "", bytes(r["meta_payload"] or b""))
    return SnapshotRow(
        persistence_id=r["persistence_id"],
        entity_type=r["entity_type"],
        slice=r["slice"],
        seq_nr=r["seq_nr"],
        write_timestamp=r["write_timestamp"],
        state=Serialized(r["ser_id"], r["ser_manifest"], bytes(r["snapshot"])),
        tags=tuple(r["tags"] or ()),
        meta=meta,
        db_timestamp=r["db_timestamp"],
    )


_Written = tuple[int, int, datetime]
"""Per written pid: first seq_nr, number of rows, db_timestamp."""


def _by_pid(rows: Sequence[asyncpg.Record]) -> dict[str, _Written]:
    return {r["persistence_id"]: (r["first_seq_nr"], r["n"], r["db_timestamp"]) for r in rows}


def _unavailable(what: str, e: Exception) -> JournalUnavailable:
    return JournalUnavailable(f"{what}: database unavailable: {e}")


def _complete(r: WriteRequest, written: dict[str, _Written]) -> bool:
    got = written.get(r.persistence_id)
    return got is not None and got[1] == len(r.events)


def _conflict(r: WriteRequest, detail: str) -> SequenceConflict:
    return SequenceConflict(r.persistence_id, r.expected_seq_nr, detail)
