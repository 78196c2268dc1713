"""A bulk write on PostgreSQL: its chunks checked while the server writes the ones before, on a
few connections, each in one transaction committed once every chunk was checked.

The chunks come from an iterator that checks and serializes each one only when asked for
(:meth:`journal.write_validation.WriteValidator.chunks`), so the client prepares chunk ``k + 1``
while the server writes chunk ``k`` on another connection, instead of checking the whole call
before the first byte is sent. Nothing is committed until the iterator is exhausted: when it
raises (a bad part further on), every transaction is rolled back, so bad input still writes
nothing, and the error is raised as is.

A chunk whose statement wrote nothing (a call failed its ``expected_seq_nr`` check) leaves its
transaction usable; one the database refused (a racing writer, a trigger) or whose connection
broke takes its transaction's earlier chunks with it. Both kinds are written again once the
transactions committed, through :meth:`~.writes.PostgresWrites.write_batch`, which isolates the
calls that fail. A transaction whose COMMIT was interrupted is resolved from the rows like any
interrupted write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from ..errors import JournalUnavailable
from ..write_batch import BatchResult, WriteBatch
from .errors import connection_lost
from .write_statements import failed_calls
from .writes import PostgresWrites, written

log = logging.getLogger("journal.postgres")


@dataclass
class _Session:
    """One connection of a bulk write and the chunks its open transaction holds."""

    conn: asyncpg.Connection
    server_pid: int
    chunks: list[int] = field(default_factory=list)
    statement: asyncio.Task[Any] | None = None
    failed: bool = False


class BulkWrite:
    """One bulk write (see the module docstring); :meth:`run` returns a result per chunk."""

    def __init__(self, writes: PostgresWrites, connections: int) -> None:
        self._writes = writes
        self._connections = max(1, connections)
        self._sessions: list[_Session] = []
        self._chunks: list[WriteBatch] = []
        self._results: dict[int, BatchResult] = {}
        self._again: set[int] = set()

    async def run(self, chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        try:
            for k, chunk in enumerate(chunks):  # checks chunk k while the earlier ones are written
                self._chunks.append(chunk)
                session = await self._free_session(k)
                session.chunks.append(k)
                session.statement = asyncio.ensure_future(self._send(session, chunk))
                await asyncio.sleep(0)  # the statement goes out before the next chunk is checked
            for s in self._sessions:
                await self._settle_statement(s)
            await self._commit_all()
        except BaseException:
            await self._abandon()
            raise
        for k in sorted(self._again):  # what a refused or broken transaction took with it
            self._results[k] = await self._writes.write_batch(self._chunks[k])
        return [self._results[k] for k in range(len(self._chunks))]

    async def _free_session(self, k: int) -> _Session:
        """A connection for chunk ``k``: a new one while fewer than ``connections`` are open,
        else the one whose statement was sent longest ago, once that statement is done."""
        if len(self._sessions) < self._connections:
            conn = await self._writes.take_writer()
            session = _Session(conn, conn.get_server_pid())
            self._sessions.append(session)
            await self._begin(session)
            return session
        session = self._sessions[k % len(self._sessions)]
        await self._settle_statement(session)
        return session

    async def _begin(self, session: _Session) -> None:
        """BEGIN on the session's connection; one that broke before (ended by the server while
        idle in the free list, or while the chunk before was sent) is replaced: nothing of this
        transaction exists yet, so a new connection loses nothing."""
        lock_timeout = max(1, round(self._writes.settings.write.bulk_lock_timeout * 1000))
        for attempt in range(self._writes.settings.retry.attempts):
            try:
                # a statement waiting longer for a row lock fails alone (its chunk goes again
                # later): two bulk writes crossing on the same pids never wait on each other forever
                await session.conn.execute(f"BEGIN; SET LOCAL lock_timeout = {lock_timeout}")
                session.failed = False
                return
            except Exception as e:
                if not connection_lost(session.conn, e):
                    raise
                log.info("bulk write: connection lost before BEGIN (%s), on a new one (attempt %d)", e, attempt + 1)
                self._writes.release_writer(session.conn, broken=True)
                session.conn = await self._writes.take_writer()
                session.server_pid = session.conn.get_server_pid()
        raise JournalUnavailable(f"bulk write: {self._writes.settings.retry.attempts} connections broke at BEGIN")

    async def _send(self, session: _Session, chunk: WriteBatch) -> asyncpg.Record | None:
        stmt, params = self._writes.statements.statement(chunk, self._writes.writer_id, self._writes.conns.epoch)
        row: asyncpg.Record | None = await session.conn.fetchrow(stmt, *params)
        return row

    async def _settle_statement(self, s: _Session) -> None:
        """Wait for the session's statement and file its chunk's result."""
        task, s.statement = s.statement, None
        if task is None:
            return
        k = s.chunks[-1]
        try:
            row = await task
        except Exception as e:
            await self._lost(s, e)
            return
        if failed_calls(row):  # nothing of the chunk was written; the transaction is fine
            self._again.add(k)
        else:
            assert row is not None
            self._results[k] = written(self._chunks[k], row["ts"], row["appended_after"])

    async def _lost(self, s: _Session, error: Exception) -> None:
        """The session's transaction is lost (refused or broken): its chunks are written again
        later; the session goes on in a new transaction, on a new connection if it broke."""
        self._again.update(s.chunks)
        for k in s.chunks:
            self._results.pop(k, None)
        s.chunks = []
        if connection_lost(s.conn, error):
            self._writes.release_writer(s.conn, broken=True)
            s.conn = await self._writes.take_writer()
            s.server_pid = s.conn.get_server_pid()
        else:
            await s.conn.execute("ROLLBACK")
        await self._begin(s)

    async def _commit_all(self) -> None:
        sessions, self._sessions = self._sessions, []
        for s in sessions:
            try:
                await s.conn.execute("COMMIT")
            except Exception as e:
                lost = connection_lost(s.conn, e)
                self._writes.release_writer(s.conn, broken=True)
                if lost:
                    await self._resolve_commit(s, e)
                else:  # refused at commit: nothing of it was written
                    self._again.update(s.chunks)
            else:
                self._writes.release_writer(s.conn)

    async def _resolve_commit(self, s: _Session, error: Exception) -> None:
        """The connection broke during COMMIT: each chunk's outcome from the rows."""
        log.warning("bulk write interrupted at commit (%s), resolving its outcome", error)
        await self._writes.wait_until_settled(s.server_pid)
        for k in s.chunks:
            self._results[k] = await self._writes.resolve(self._chunks[k], self._writes.settings.retry.attempts)
            self._again.discard(k)

    async def _abandon(self) -> None:
        """The iterator raised (or the caller was cancelled): roll back everything."""
        for s in self._sessions:
            if s.statement is not None:
                s.statement.cancel()
                with contextlib.suppress(BaseException):
                    await s.statement
            try:
                await s.conn.execute("ROLLBACK")
                self._writes.release_writer(s.conn)
            except BaseException:
                self._writes.release_writer(s.conn, broken=True)
        self._sessions = []
