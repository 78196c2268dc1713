"""Writes on PostgreSQL: the group commit's statement, conflict isolation, and the resolution
of a write whose connection broke mid-statement (its outcome found from the rows)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from datetime import datetime
from enum import Enum
from itertools import repeat
from typing import Any

import asyncpg

from ..backend import Found, WriteCheck, WriteRequest, WriteResult, check_rows, new_row
from ..buckets import bucket_millis
from ..columns import WriteColumns
from ..envelope import ROW_STEP, consecutive_stamps
from ..errors import InvalidArgument, JournalUnavailable, SequenceConflict
from ..ids import slice_for
from ..serialization import JSON_SERIALIZER_ID
from .connections import PostgresConnections, PostgresPart
from .errors import LOCAL_WRITES_REFUSED_SQLSTATE, backoff_delays, is_transient, partition_refusal, write_error
from .known_insert import KnownSeqInsert
from .statements import notify_groups
from .tag_statements import TagStatements
from .timestamp_rule import MARK_WRITER_LOCAL_SQL

log = logging.getLogger("journal.postgres")

DELETE_BATCH_SIZE = 10_000


class PostgresWrites(PostgresPart):
    """Event writes, highest sequence numbers and deletes (statements in :mod:`.statements`)."""

    def __init__(self, conns: PostgresConnections) -> None:
        super().__init__(conns)
        settings = conns.settings
        self.writer_id = conns.writer_id
        self._notify = settings.write.notify
        self._insert = self.sql.insert_events(on_conflict_do_nothing=False, notify=self._notify)
        self._insert_probe = self.sql.insert_events(on_conflict_do_nothing=True, notify=self._notify)
        self._insert_one = self.sql.insert_one(notify=self._notify)
        self._known = KnownSeqInsert(self.sql, notify=self._notify)
        tag_sql = TagStatements(settings.schema)
        bucket = self.sql.tag_bucket_param(self._notify)
        self._insert_tagged = self.sql.insert_events_tagged(
            on_conflict_do_nothing=False, notify=self._notify,
            tag_rows=tag_sql.insert_from_events("src", "$9", bucket, ""),
        )  # fmt: skip
        self._insert_tagged_probe = self.sql.insert_events_tagged(
            on_conflict_do_nothing=True, notify=self._notify,
            tag_rows=tag_sql.insert_from_events("src", "$9", bucket, "ON CONFLICT DO NOTHING"),
        )  # fmt: skip
        self._bucket_millis = bucket_millis(settings.tags.bucket_size)
        self._unsettled: set[int] = set()
        """Server processes of interrupted writes not yet seen idle (the database did not answer)."""

    def _statement(self, batch: Sequence[WriteRequest], *, probe: bool) -> tuple[str, tuple[Any, ...]]:
        """The untagged statement (fast path), the one that also writes tag rows, or a lone event's."""
        if not probe and len(batch) == 1 and len(batch[0].events) == 1 and not batch[0].tags:
            r, ev, m = batch[0], batch[0].events[0], batch[0].metadata
            return self._insert_one, (
                r.slice, r.entity_type, r.persistence_id, r.expected_seq_nr, ev.ser_id, ev.manifest, ev.payload,
                self.writer_id, m.ser_id if m else None, m.manifest if m else None, m.payload if m else None,
                self.conns.epoch,
            )  # fmt: skip
        params = self._params(batch)
        if any(r.tags for r in batch):
            return (self._insert_tagged_probe if probe else self._insert_tagged), (*params, self._bucket_millis)
        return (self._insert_probe if probe else self._insert), params

    def _params(self, requests: Sequence[WriteRequest]) -> tuple[Any, ...]:
        """Parallel per-event arrays for the insert statement.

        Arrays that would hold only NULLs, 1s or empty manifests (tags, metadata, ordinals of
        one-event calls, JSON serializer ids: the common case) are sent empty: a multi-argument unnest pads them with
        NULLs, the statement reads those as the default, and asyncpg skips encoding every element.
        Then the writer's partition map epoch; with notifications on, the last parameter is the
        distinct notification payloads.
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
            notify = (notify_groups([r.slice for r in requests], [r.entity_type for r in requests]),)
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
            self.conns.epoch,
            *notify,
        )

    async def write_batch(
        self, requests: Sequence[WriteRequest], *, interruptions: int = 0, interrupted: bool = False
    ) -> list[WriteResult | Exception]:
        """One multi-row statement for the whole batch; conflicts isolate the failing calls.

        Fast path: a single autocommit INSERT (atomic). If it hits a unique violation, a probe
        run in a rolled-back transaction (ON CONFLICT DO NOTHING) finds which calls conflict;
        those fail with SequenceConflict and the rest are written again. If the connection breaks
        mid-statement, the calls found not written are sent again (a bounded number of times).

        A batch whose every call names its expected_seq_nr is first sent as the optimistic
        insert (:mod:`.known_insert`); only if that writes nothing (a conflict) is the general
        statement run. ``interrupted``: the batch was sent once and its connection broke (and its
        server process has settled): resolve its outcome from the rows before sending anything.
        """
        if not interrupted and interruptions == 0 and len(requests) > 1 and self._known.accepts(requests):
            optimistic = await self._insert_known(requests)
            if isinstance(optimistic, datetime):
                return _known_results(requests, optimistic)
            interrupted = optimistic is _Unwritten.INTERRUPTED
        results: dict[int, WriteResult | Exception] = {}
        pending = list(range(len(requests)))
        for _ in range(8):
            if not pending:
                break
            batch = [requests[i] for i in pending]
            try:
                if interrupted:
                    interrupted = False
                    written, resend = await self._resolve_unknown(batch)
                else:
                    written, resend = await self._insert_batch(batch)
            except asyncpg.exceptions.PostgresError as e:
                moved = partition_refusal(e)
                if moved is not None:  # the calls of the refused range fail; the others go again
                    refused = [i for i in pending if moved.min_slice <= requests[i].slice <= moved.max_slice]
                    for i in refused or pending:
                        results[i] = moved
                    pending = [i for i in pending if i not in results]
                    continue
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
        except asyncpg.exceptions.PostgresError as e:  # the recovery guard's or owner check's refusal, typed
            if e.sqlstate == LOCAL_WRITES_REFUSED_SQLSTATE or partition_refusal(e) is not None:
                raise write_error(request.persistence_id, e) from e
            raise
        got = _by_pid(rows).get(request.persistence_id)
        if got is None or got[1] != len(request.events):
            raise _conflict(request, "expected_seq_nr is not the stored highest sequence number")
        return WriteResult(got[0], got[2])

    def _release(self, conn: asyncpg.Connection, *, broken: bool = False) -> None:
        """Give a write connection back; one in an unknown state is closed, never used again."""
        self.conns.writers.give_back(conn, broken=broken)

    async def _write_each(self, batch: Sequence[WriteRequest], cause: Exception) -> list[WriteResult | Exception]:
        if len(batch) == 1:
            return [write_error(batch[0].persistence_id, cause)]
        out: list[WriteResult | Exception] = []
        for r in batch:
            out.extend(await self.write_batch([r]))
        return out

    async def write_columns(self, columns: WriteColumns) -> datetime | list[WriteResult | Exception]:
        """Write calls given as columns (see :class:`~journal.columns.WriteColumns`): the
        optimistic insert, with no object per call; returns the first call's timestamp (each
        next call's is one :data:`~journal.envelope.ROW_STEP` later). If it
        wrote nothing (a conflict) or its outcome is unknown, the calls are built and go through
        :meth:`write_batch`, which isolates or resolves them; returns its per-call results."""
        got = await self._insert_known(columns)
        if isinstance(got, datetime):
            return got
        return await self.write_batch(columns.requests(), interrupted=got is _Unwritten.INTERRUPTED)

    async def _take_writer(self) -> asyncpg.Connection:
        """A write connection; failures to get one are retried with backoff (transient only)."""
        delays: Iterator[float] | None = None  # built on the first failure only (hot path)
        while True:
            try:
                return await self.conns.writers.take()
            except Exception as e:
                if delays is None:
                    delays = iter(backoff_delays(self.settings.retry))
                delay = next(delays, None)
                if not is_transient(e):
                    raise
                if delay is None:
                    raise _unavailable("write", e) from e
                await asyncio.sleep(delay)

    async def _insert_known(self, batch: Sequence[WriteRequest] | WriteColumns) -> datetime | _Unwritten:
        """The optimistic insert: its first row's timestamp when every call was written; NOTHING when nothing
        was written (the check failed, or the database refused a row); INTERRUPTED when the
        connection broke once the statement was sent (its server process has settled since)."""
        stmt, params = self._known.statement(batch, self.writer_id, self.conns.epoch)
        conn = await self._take_writer()
        server_pid = conn.get_server_pid()
        try:
            row = await conn.fetchrow(stmt, *params)
        except Exception as e:
            if not is_transient(e):
                self._release(conn)
                return _Unwritten.NOTHING
            self._release(conn, broken=True)
            log.warning("write interrupted (%s), resolving its outcome", e)
            await self._wait_until_settled(server_pid)
            return _Unwritten.INTERRUPTED
        except BaseException:  # cancelled mid-statement: the connection's state is unknown
            self._release(conn, broken=True)
            raise
        self._release(conn)
        assert row is not None
        ts: datetime = row[0]
        return ts if row[1] == 0 else _Unwritten.NOTHING

    async def _insert_batch(self, batch: Sequence[WriteRequest]) -> tuple[dict[str, _Written], list[WriteRequest]]:
        """The atomic autocommit insert, with the database's outcome made known.

        A failure before the statement was sent is retried. After a failure once it was sent, the
        server process is waited for (:meth:`_wait_until_settled`) and the rows are checked
        (:meth:`_resolve_unknown`): returns the calls written, and those known not to be written.
        """
        stmt, params = self._statement(batch, probe=False)
        conn = await self._take_writer()
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

        return await self.conns.retrying("write (conflict probe)", op)

    async def _wait_until_settled(self, server_pid: int, patience: float = 10.0) -> None:
        """Wait until the interrupted statement's server process is no longer running it.

        A client that lost its connection cannot tell whether the server is still executing the
        statement; reading the rows before that ends could see "not written" for a write that
        commits a moment later. Once the process is idle or gone its transaction is final. If it
        is still busy after ``patience`` seconds it is terminated (only a process of this journal's
        own write connections, found by application_name), which rolls the statement back; its row
        leaves pg_stat_activity only after the abort.
        """
        app = self.conns.writers.application_name

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
            await self.conns.retrying("settle an interrupted write", op)
        except JournalUnavailable as e:
            self._unsettled.add(server_pid)  # every later check_write settles it first
            raise JournalUnavailable(str(e), outcome_unknown=True) from e
        self._unsettled.discard(server_pid)

    async def _resolve_unknown(self, batch: Sequence[WriteRequest]) -> tuple[dict[str, _Written], list[WriteRequest]]:
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
            try:
                got = await self.check_write(r)
            except JournalUnavailable as e:
                raise JournalUnavailable(str(e), outcome_unknown=True) from e
            if got.outcome is Found.WRITTEN:
                assert got.db_timestamp is not None
                out[r.persistence_id] = (r.expected_seq_nr + 1, len(r.events), got.db_timestamp)
            elif got.outcome is Found.NOT_WRITTEN:
                resend.append(r)
            # else: another writer's rows are there: the call is reported as a conflict
        return out, resend

    async def check_write(self, request: WriteRequest) -> WriteCheck:
        """The rows at the request's numbers (``expected_seq_nr`` + 1 on): :func:`check_rows`.

        First, every interrupted write whose server process could not be seen idle is waited
        for (it may be the one asked about): rows read while it runs could say "not written"
        for a write that commits a moment later."""
        if request.expected_seq_nr is None:
            raise InvalidArgument("check_write needs a request with expected_seq_nr")
        for server_pid in list(self._unsettled):
            await self._wait_until_settled(server_pid)
        first = request.expected_seq_nr + 1
        rows = await self.conns.fetch(
            "resolve write", self.sql.written_check, request.persistence_id, first, first + len(request.events) - 1
        )
        return check_rows(request, self.writer_id, [(r[0], r[1], r[2]) for r in rows])

    async def highest_seq_nr(self, persistence_id: str) -> int:
        return int(await self.conns.fetchval("highest_seq_nr", self.sql.highest_seq_nr, persistence_id))

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None:
        """Hard delete in batches; the highest event stays as a tombstone (deleted=true)."""

        async def op() -> None:
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(self.sql.delete_check, self.conns.epoch, [slice_for(persistence_id)])
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

        await self.conns.retrying("delete events", op)


class _Unwritten(Enum):
    """Why the optimistic insert did not report every call written."""

    NOTHING = "nothing written"
    INTERRUPTED = "connection broke mid-statement: outcome to be resolved"


_Written = tuple[int, int, datetime]
"""Per written pid: first seq_nr, number of rows, db_timestamp."""


def _known_results(requests: Sequence[WriteRequest], first: datetime) -> list[WriteResult | Exception]:
    """Each call's result of an optimistic insert stamped from ``first``: its rows follow the
    previous calls' rows in the statement, one :data:`ROW_STEP` each."""
    if all([len(r.events) == 1 for r in requests]):  # the commonest batch: stamps in one C loop
        firsts = [r.expected_seq_nr + 1 for r in requests]  # type: ignore[operator]  # accepts()
        stamps = consecutive_stamps(first, len(requests))
        return list(map(new_row, repeat(WriteResult), zip(firsts, stamps, strict=True)))
    out: list[WriteResult | Exception] = []
    row = first
    for r in requests:
        out.append(new_row(WriteResult, (r.expected_seq_nr + 1, row)))  # type: ignore[operator]  # accepts()
        row += ROW_STEP * len(r.events)
    return out


def _by_pid(rows: Sequence[asyncpg.Record]) -> dict[str, _Written]:
    return {r["persistence_id"]: (r["first_seq_nr"], r["n"], r["db_timestamp"]) for r in rows}


def _unavailable(what: str, e: Exception) -> JournalUnavailable:
    return JournalUnavailable(f"{what}: database unavailable: {e}")


def _complete(r: WriteRequest, written: dict[str, _Written]) -> bool:
    got = written.get(r.persistence_id)
    return got is not None and got[1] == len(r.events)


def _conflict(r: WriteRequest, detail: str) -> SequenceConflict:
    return SequenceConflict(r.persistence_id, r.expected_seq_nr, detail)
