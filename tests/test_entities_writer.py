"""Writers on the projection runner: batching (events arriving during a write go into the next
one, batch sizes bounded) and resume from the writer's stored progress after a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import asyncpg
import pytest

from journal import EventEnvelope, Journal, JournalSettings
from journal.entities import Writer, WriterHandler
from journal.errors import ConfigurationError, HandlerFailed
from projections import Worker
from tests.support.waiting import wait_until


def fast(dsn: str, **more: Any) -> JournalSettings:
    return JournalSettings.load(
        env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.02, **more
    )  # fmt: skip


class CountingSource:
    """The journal as the runner's event source, counting the envelopes its reader has taken."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.delivered = 0

    async def events_by_slices(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Any = None, *, heartbeats: bool = False
    ) -> AsyncIterator[EventEnvelope]:
        async for e in self.journal.events_by_slices(entity_type, min_slice, max_slice, offset, heartbeats=heartbeats):
            if e.source != "heartbeat":
                self.delivered += 1
            yield e

    def current_events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> AsyncIterator[EventEnvelope]:
        return self.journal.current_events_by_persistence_id(persistence_id, from_seq_nr, to_seq_nr)


class TableWriter(Writer):
    """Writes (pid, seq) rows and per-pid progress to PostgreSQL in one transaction."""

    def __init__(self, dsn: str, batch_size: int) -> None:
        self.dsn = dsn
        self.batch_size = batch_size
        self.calls: list[list[tuple[str, int]]] = []
        self.gate: asyncio.Event | None = None  # when set: the first write waits for it
        self.in_write = asyncio.Event()
        self.fail_after_commit_on: int | None = None  # crash right after this write() committed

    async def read(self, persistence_ids: Sequence[str]) -> Mapping[str, int]:
        conn = await asyncpg.connect(self.dsn)
        try:
            rows = await conn.fetch("SELECT pid, seq FROM w_progress WHERE pid = ANY($1::text[])", [*persistence_ids])
        finally:
            await conn.close()
        return {r["pid"]: r["seq"] for r in rows}

    async def write(self, events: Sequence[EventEnvelope], progress: Mapping[str, int]) -> None:
        self.calls.append([(e.persistence_id, e.seq_nr) for e in events])
        self.in_write.set()
        if self.gate is not None and len(self.calls) == 1:
            await self.gate.wait()
        conn = await asyncpg.connect(self.dsn)
        try:
            async with conn.transaction():
                await conn.executemany("INSERT INTO w_rows VALUES ($1, $2)", self.calls[-1])  # PK: no duplicates
                await conn.executemany(
                    "INSERT INTO w_progress VALUES ($1, $2) ON CONFLICT (pid) DO UPDATE SET seq = EXCLUDED.seq",
                    list(progress.items()),
                )
        finally:
            await conn.close()
        if self.fail_after_commit_on == len(self.calls):
            raise RuntimeError("crash after the writer committed, before the runner stored offsets")


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute("CREATE TABLE IF NOT EXISTS w_rows (pid TEXT, seq BIGINT, PRIMARY KEY (pid, seq))")
    await c.execute("CREATE TABLE IF NOT EXISTS w_progress (pid TEXT PRIMARY KEY, seq BIGINT NOT NULL)")
    await c.execute("TRUNCATE w_rows, w_progress")
    yield c
    await c.close()


async def rows(conn: asyncpg.Connection) -> list[tuple[str, int]]:
    return [(r[0], r[1]) for r in await conn.fetch("SELECT pid, seq FROM w_rows ORDER BY pid, seq")]


async def test_events_arriving_during_a_write_go_into_the_next_bounded_batches(
    journal: Journal, dsn: str, conn: asyncpg.Connection
) -> None:
    await journal.persist("acct|a", [{"n": i} for i in range(3)])
    source = CountingSource(journal)
    writer = TableWriter(dsn, batch_size=7)
    writer.gate = asyncio.Event()
    worker = Worker(source, fast(dsn, group_size=50), "w-batch", "acct", WriterHandler(writer), "grouped")
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(writer.in_write.wait(), 20)
        assert writer.calls == [[("acct|a", 1), ("acct|a", 2), ("acct|a", 3)]]
        await journal.persist("acct|b", [{"n": i} for i in range(20)])  # arrives during the write

        async def arrived() -> bool:
            return source.delivered >= 23

        await wait_until(arrived, 20, "the runner's reader to take the new events")
        assert len(writer.calls) == 1  # still inside the first write
        writer.gate.set()

        async def all_written() -> bool:
            return len(await rows(conn)) == 23

        await wait_until(all_written, 20, "every event written")
    finally:
        worker.stop()
        await task
    later = writer.calls[1:]
    assert [len(c) for c in later] == [7, 7, 6]  # one runner batch, cut at the writer's batch_size
    assert [x for c in later for x in c] == [("acct|b", s) for s in range(1, 21)]
    assert await rows(conn) == [("acct|a", s) for s in range(1, 4)] + [("acct|b", s) for s in range(1, 21)]


async def test_writer_resumes_from_its_stored_progress_after_a_restart(
    journal: Journal, dsn: str, conn: asyncpg.Connection
) -> None:
    for p in "xyz":
        await journal.persist(f"acct|{p}", [{"n": i} for i in range(10)])
    everything = [(f"acct|{p}", s) for p in "xyz" for s in range(1, 11)]
    settings = fast(dsn, group_size=10, handler_attempts=1)
    first = TableWriter(dsn, batch_size=4)
    first.fail_after_commit_on = 2  # two writes stored, then the process "dies" before offsets
    worker = Worker(journal, settings, "w-resume", "acct", WriterHandler(first), "grouped")
    with pytest.raises(HandlerFailed):
        await asyncio.wait_for(worker.run(), 30)
    before = await rows(conn)
    assert len(before) == 8 and len(first.calls) == 2

    second = TableWriter(dsn, batch_size=4)
    handler = WriterHandler(second)
    worker = Worker(journal, settings, "w-resume", "acct", handler, "grouped")
    task = asyncio.create_task(worker.run())
    try:

        async def done() -> bool:
            return len(await rows(conn)) >= len(everything)

        await wait_until(done, 20, "the restarted writer to catch up")
    finally:
        worker.stop()
        await task
    assert await rows(conn) == sorted(everything)  # nothing skipped; the PK refuses any re-write
    assert handler.skipped == 8  # re-delivered (offsets were not stored) and dropped by progress
    assert sorted(x for c in second.calls for x in c) == sorted(set(everything) - set(before))
    assert all(len(c) <= 4 for c in second.calls)


def test_bad_batch_size_is_refused(dsn: str) -> None:
    w = TableWriter(dsn, batch_size=0)
    with pytest.raises(ConfigurationError):
        WriterHandler(w)
