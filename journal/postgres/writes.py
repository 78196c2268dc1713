"""Writes on PostgreSQL: a batch in one statement (:mod:`.write_statements`), the isolation of
the calls that fail, and the resolution of a write whose connection broke mid-statement (its
outcome found from the rows)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from datetime import datetime
from itertools import accumulate
from typing import Any

import asyncpg

from ..backend import Found, WriteCheck, check_rows
from ..buckets import bucket_millis
from ..envelope import ROW_STEP, consecutive_stamps
from ..errors import InvalidArgument, JournalUnavailable, SequenceConflict, SliceRangeMoved
from ..ids import slice_for
from ..write_batch import BatchResult, ResultBuilder, WriteBatch, WriteLater
from .connections import PostgresConnections, PostgresPart
from .errors import (
    LOCAL_WRITES_REFUSED_SQLSTATE,
    backoff_delays,
    connection_lost,
    is_transient,
    partition_refusal,
    write_error,
)
from .settling import settle
from .timestamp_rule import MARK_WRITER_LOCAL_SQL
from .write_statements import WriteStatements, failed_calls

log = logging.getLogger("journal.postgres")

DELETE_BATCH_SIZE = 10_000

STALE = "expected_seq_nr is not the stored highest sequence number"
TAKEN = "another writer took these sequence numbers"


class Interrupted(Exception):
    """The connection broke once the statement was sent: once its server process (``server_pid``)
    has settled, the rows tell whether it committed."""

    def __init__(self, message: str, server_pid: int) -> None:
        super().__init__(message)
        self.server_pid = server_pid


class PostgresWrites(PostgresPart):
    """Event writes, highest sequence numbers and deletes."""

    def __init__(self, conns: PostgresConnections) -> None:
        super().__init__(conns)
        settings = conns.settings
        self.writer_id = conns.writer_id
        self.statements = WriteStatements(
            self.sql, notify=settings.write.notify, bucket_millis=bucket_millis(settings.tags.bucket_size)
        )
        self._unsettled: set[int] = set()
        """Server processes of interrupted writes not yet seen idle (the database did not answer)."""

    async def write_batch(self, batch: WriteBatch) -> BatchResult:
        """The batch in one statement. Calls that fail the ``expected_seq_nr`` check are reported
        as SequenceConflict and the others sent again; a statement the database refuses (a
        racing writer took a number, a trigger refused a row) is split until the refused calls
        are alone; a statement whose connection broke is resolved from the rows, and what is
        known not to be written is sent again (a bounded number of times)."""
        return await self._write(batch, self.settings.retry.attempts)

    async def write_batch_resolving_apart(self, batch: WriteBatch) -> BatchResult:
        """As :meth:`write_batch`, except that a statement whose connection broke comes back
        :class:`~journal.write_batch.WriteLater` (every call of it): its resolution (waiting for
        its server process to settle, reading the rows, sending again what is not stored) is the
        deferred calls' ``finish``, so it holds up no one waiting on other databases' calls."""
        return await self._write(batch, self.settings.retry.attempts, resolve_apart=True)

    async def _write(self, batch: WriteBatch, attempts: int, *, resolve_apart: bool = False) -> BatchResult:
        stmt, params = self.statements.statement(batch, self.writer_id, self.conns.epoch)
        try:
            row = await self._send(stmt, params)
        except Interrupted as e:
            server_pid = e.server_pid

            async def resolution() -> BatchResult:
                await self.wait_until_settled(server_pid)
                return await self.resolve(batch, attempts)

            if resolve_apart:
                return BatchResult.failed(len(batch), WriteLater(range(len(batch)), resolution))
            return await resolution()
        except asyncpg.exceptions.PostgresError as e:  # nothing of the batch was written
            moved = partition_refusal(e)
            if moved is not None:
                return await self._refused(batch, moved, attempts)
            return await self._isolate(batch, e, attempts)
        return await self._answer(batch, row, attempts)

    async def _refused(self, batch: WriteBatch, moved: SliceRangeMoved, attempts: int) -> BatchResult:
        """The owner check refused a range: its calls fail with SliceRangeMoved (the caller
        routes them again), the others are sent again."""
        out = ResultBuilder(len(batch))
        inside = [i for i, s in enumerate(batch.slices) if moved.min_slice <= s <= moved.max_slice]
        refused = set(inside or range(len(batch)))
        for i in refused:
            out.failed(i, moved)
        rest = [i for i in range(len(batch)) if i not in refused]
        if rest:
            out.merge(rest, await self._write(batch.select(rest), attempts))
        return out.result()

    async def _send(self, stmt: str, params: tuple[Any, ...]) -> asyncpg.Record | None:
        """The statement on a write connection (autocommit): its answer row (none: the lone
        statement's call failed the check). Raises :class:`Interrupted` when the connection
        broke once it was sent."""
        conn = await self.take_writer()
        server_pid = conn.get_server_pid()
        try:
            row = await conn.fetchrow(stmt, *params)
        except Exception as e:
            if not connection_lost(conn, e):
                self.release_writer(conn)
                raise
            self.release_writer(conn, broken=True)
            log.warning("write interrupted (%s), resolving its outcome", e)
            raise Interrupted(str(e), server_pid) from e
        except BaseException:  # cancelled mid-statement: the connection's state is unknown
            self.release_writer(conn, broken=True)
            raise
        self.release_writer(conn)  # the write is done, whatever happens to the connection now
        return row

    async def _answer(self, batch: WriteBatch, row: asyncpg.Record | None, attempts: int) -> BatchResult:
        """The batch's result from the statement's row: written, or the calls that failed the
        check reported and the others sent again."""
        bad = set(failed_calls(row))
        if not bad:
            assert row is not None
            return written(batch, row["ts"], row["appended_after"])
        out = ResultBuilder(len(batch))
        for i in bad:
            out.failed(i, conflict(batch, i, STALE))
        rest = [i for i in range(len(batch)) if i not in bad]
        if rest:
            out.merge(rest, await self._write(batch.select(rest), attempts))
        return out.result()

    async def _isolate(self, batch: WriteBatch, error: Exception, attempts: int) -> BatchResult:
        """The database refused the statement: split it until the refused calls are alone."""
        if len(batch) == 1:
            if isinstance(error, asyncpg.exceptions.UniqueViolationError):
                return BatchResult.failed(1, conflict(batch, 0, TAKEN))
            return BatchResult.failed(1, write_error(batch.persistence_ids[0], error))
        half = len(batch) // 2
        first = await self._write(batch.chunk(0, half), attempts)
        return BatchResult.concat([first, await self._write(batch.chunk(half, len(batch)), attempts)])

    async def resolve(self, batch: WriteBatch, attempts: int) -> BatchResult:
        """The connection died mid-write: find out, for each call, whether it committed.

        A call that gave ``expected_seq_nr`` can be checked exactly: its rows are there with
        our writer id and the same payloads (it committed), or no row is there (it did not: it is
        sent again), or another writer's rows are there (a conflict). Calls without it cannot be
        told apart from another writer's, so they fail with ``JournalUnavailable(outcome_unknown=True)``.
        """
        out = ResultBuilder(len(batch))
        resend: list[int] = []
        try:
            checks = await self._checks(batch)
        except JournalUnavailable as e:
            raise JournalUnavailable(str(e), outcome_unknown=True) from e
        for i, got in enumerate(checks):
            expected = batch.expected_seq_nrs[i]
            if got is None or expected is None:
                out.failed(i, JournalUnavailable(
                    f"write of {batch.persistence_ids[i]!r} was interrupted and its outcome is unknown "
                    "(pass expected_seq_nr to let the journal resolve it)", outcome_unknown=True,
                ))  # fmt: skip
            elif got.outcome is Found.WRITTEN:
                assert got.db_timestamp is not None
                out.written(i, expected + 1, got.db_timestamp)
            elif got.outcome is Found.NOT_WRITTEN:
                resend.append(i)
            else:
                out.failed(i, conflict(batch, i, TAKEN))
        if resend:
            out.merge(resend, await self._send_again(batch.select(resend), attempts))
        return out.result()

    async def _send_again(self, batch: WriteBatch, attempts: int) -> BatchResult:
        if attempts > 1:
            return await self._write(batch, attempts - 1)
        interruptions = self.settings.retry.attempts
        return BatchResult(
            [0] * len(batch), [datetime.min] * len(batch),
            {i: JournalUnavailable(
                f"write of {pid!r} was interrupted {interruptions} times; it is known not to be stored"
            ) for i, pid in enumerate(batch.persistence_ids)},
        )  # fmt: skip

    async def write_on(self, conn: asyncpg.Connection, batch: WriteBatch) -> BatchResult:
        """Write a batch on the caller's connection (inside its transaction, if any); a call that
        conflicts raises SequenceConflict."""
        stmt, params = self.statements.statement(batch, self.writer_id, self.conns.epoch)
        if conn.is_in_transaction():  # the database's rule trigger (if installed) skips these rows
            await conn.execute(MARK_WRITER_LOCAL_SQL)
        try:
            row = await conn.fetchrow(stmt, *params)
        except asyncpg.exceptions.UniqueViolationError as e:
            raise conflict(batch, 0, TAKEN) from e
        except asyncpg.exceptions.PostgresError as e:  # the recovery guard's or owner check's refusal, typed
            if e.sqlstate == LOCAL_WRITES_REFUSED_SQLSTATE or partition_refusal(e) is not None:
                raise write_error(batch.persistence_ids[0], e) from e
            raise
        bad = failed_calls(row)
        if bad:
            raise conflict(batch, bad[0], STALE)
        assert row is not None
        return written(batch, row["ts"], row["appended_after"])

    def release_writer(self, conn: asyncpg.Connection, *, broken: bool = False) -> None:
        """Give a write connection back; one in an unknown state is closed, never used again."""
        self.conns.writers.give_back(conn, broken=broken)

    async def take_writer(self) -> asyncpg.Connection:
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
                    raise JournalUnavailable(f"write: database unavailable: {e}") from e
                await asyncio.sleep(delay)

    async def wait_until_settled(self, server_pid: int, patience: float = 10.0) -> None:
        """Wait until the interrupted statement's server process is no longer running it
        (:func:`.settling.settle`: terminated after ``patience`` seconds, only a process of this
        journal's own write connections, found by application_name)."""
        app = self.conns.writers.application_name

        async def op() -> None:
            async with self.pool.acquire() as c:
                await settle(c, server_pid, app, patience=patience, who="write: ")

        try:
            await self.conns.retrying("settle an interrupted write", op)
        except JournalUnavailable as e:
            raise JournalUnavailable(str(e), outcome_unknown=True) from e

    async def _checks(self, batch: WriteBatch) -> list[WriteCheck | None]:
        """:meth:`check_write` of each call that gave ``expected_seq_nr`` (None for the others).

        First, every interrupted write whose server process could not be seen idle is waited
        for (it may be the one asked about): rows read while it runs could say "not written"
        for a write that commits a moment later."""
        for server_pid in list(self._unsettled):
            await self.wait_until_settled(server_pid)
        firsts = batch.firsts()
        out: list[WriteCheck | None] = []
        for i, expected in enumerate(batch.expected_seq_nrs):
            n = batch.counts[i]
            if expected is None:
                out.append(None)
                continue
            rows = await self.conns.fetch(
                "resolve write", self.sql.written_check, batch.persistence_ids[i], expected + 1, expected + n
            )
            found = [(r["writer"], r["event_payload"], r["db_timestamp"]) for r in rows]
            out.append(check_rows(batch.payloads[firsts[i] : firsts[i] + n], self.writer_id, found))
        return out

    async def check_write(self, batch: WriteBatch) -> list[WriteCheck]:
        """The rows at each call's numbers (``expected_seq_nr`` + 1 on): :func:`check_rows`."""
        checks = await self._checks(batch)
        if None in checks:
            raise InvalidArgument("check_write needs calls with expected_seq_nr")
        return [c for c in checks if c is not None]

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


def written(batch: WriteBatch, first: datetime, appended_after: Sequence[int] | None) -> BatchResult:
    """The result of a batch written in full: each call's numbers follow its ``expected_seq_nr``,
    or for a call that appended, its pid's previous highest (``appended_after``, in call order);
    its first row is stamped one :data:`ROW_STEP` per row after the statement's first."""
    if appended_after is None:
        firsts = [e + 1 for e in batch.expected_seq_nrs]  # type: ignore[operator]  # none appended
    else:
        after = iter(appended_after)
        firsts = [(next(after) if e is None else e) + 1 for e in batch.expected_seq_nrs]
    if batch.one_event_each():
        return BatchResult(firsts, consecutive_stamps(first, len(batch)))
    return BatchResult(firsts, [first + ROW_STEP * k for k in accumulate(batch.counts[:-1], initial=0)])


def conflict(batch: WriteBatch, call: int, detail: str) -> SequenceConflict:
    return SequenceConflict(batch.persistence_ids[call], batch.expected_seq_nrs[call], detail)
